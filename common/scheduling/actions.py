"""What the scheduler asks its JobManager shell to do (its actions), and the records it hands over.

The scheduler (`scheduler.py`) and its slot allocator (`slotallocator.py`) return these; the
JobMaster carries them out, in order. A finished subtask's record (`FinishedSubtask`) is what the
shell keeps for a new leader to take over. Actions made per subtask (a deployment, a cancel, a state
change) are named tuples built with `tuple.__new__`: a restart makes one per subtask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from funke.common.graph.deployment import (
    GateState,
    PartitionRef,
    PartitionUpdate,
    TaskDeployment,
    VertexDeployment,
)
from funke.common.graph.executiongraph import ExecutionAttemptId, FailureInfo, SlotId, TaskIo
from funke.common.records import quick_init
from funke.common.scheduling.slotsharing import SlotRequest
from funke.common.states import ExecutionState, JobStatus, Transition

__all__ = [
    "Action", "CancelSlotRequest", "CancelTask", "CommitOutputs", "DeployTask", "ExecutionStateChanged",
    "FinishedSubtask", "JobCleanup", "JobStatusChanged", "ReleasePartitions", "ReleaseSlot", "RequestSlots",
    "SinkCommit", "StartTimer", "Timer", "UpdatePartitionInfo",
]


@quick_init
@dataclass(frozen=True, slots=True)
class RequestSlots:
    requests: tuple[SlotRequest, ...]
    timeout_s: float


@quick_init
@dataclass(frozen=True, slots=True)
class CancelSlotRequest:
    request_id: int


@quick_init
@dataclass(frozen=True, slots=True)
class ReleaseSlot:
    slot: SlotId
    cause: str


class DeployTask(NamedTuple):
    """Deploy an execution attempt into its slot. What it shares with its job vertex's other
    subtasks is one `VertexDeployment`; `gates` is what each of its inputs reads (shared too,
    per consumed partition group). `deployment` is the whole TaskDeployment. (A named tuple,
    built with `tuple.__new__`: a deployment of every subtask, at every restart.)"""

    vertex: VertexDeployment
    attempt: ExecutionAttemptId
    task_name: str
    slot: SlotId
    gates: tuple[GateState, ...]
    stimulus_id: str

    @property
    def deployment(self) -> TaskDeployment:
        return self.vertex.task(self.attempt, self.task_name, self.slot, self.gates, self.stimulus_id)


class CancelTask(NamedTuple):
    """Cancel an attempt on its TaskManager (a named tuple: a failover cancels every subtask)."""

    task_manager_id: str
    attempt: ExecutionAttemptId
    stimulus_id: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class UpdatePartitionInfo:
    """A partition that deployed consumers on `task_manager_id` were waiting for is ready."""

    task_manager_id: str
    update: PartitionUpdate


@quick_init
@dataclass(frozen=True, slots=True)
class ReleasePartitions:
    task_manager_id: str
    partitions: tuple[PartitionRef, ...]


@dataclass(frozen=True, slots=True)
class Timer:
    kind: str  # "restart" | "cancel-timeout"
    version: int


@dataclass(frozen=True, slots=True)
class StartTimer:
    timer: Timer
    at: float


@dataclass(frozen=True, slots=True)
class FinishedSubtask:
    """A subtask whose current attempt FINISHED, and the schemas of the partitions it produced:
    what a new leader needs to take its output over instead of running it again."""

    vertex_id: str
    subtask_index: int
    attempt_number: int
    schemas: tuple[tuple[str, int, str], ...]  # (data set id, partition index, schema)
    # Where and when it ran, so that the attempt a new leader takes over shows its TaskManager,
    # slot and timeline as they were, not a deployment at the recovery instant. Records of an
    # older JobManager lack them: such an attempt is shown with a timeline made at the takeover.
    slot: SlotId | None = None
    created_at: float | None = None
    history: tuple[Transition[ExecutionState], ...] = ()
    io: TaskIo | None = None


@dataclass(frozen=True, slots=True)
class SinkCommit:
    vertex_id: str
    subtask_index: int
    attempt_number: int
    kind: str
    config: tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)
class CommitOutputs:
    """Every task finished: make the staged sink output of the finished attempts visible."""

    sinks: tuple[SinkCommit, ...]


@dataclass(frozen=True, slots=True)
class JobCleanup:
    """The job reached a terminal status: release what it left on TaskManagers and disk."""

    status: JobStatus
    task_managers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobStatusChanged:
    transition: Transition


class ExecutionStateChanged(NamedTuple):
    """Made on every transition of every execution (a named tuple: a frozen dataclass takes four
    times as long to build)."""

    attempt: ExecutionAttemptId
    task_name: str
    transition: Transition
    task_manager_id: str | None
    failure: FailureInfo | None


Action = (
    RequestSlots | CancelSlotRequest | ReleaseSlot | DeployTask | CancelTask | UpdatePartitionInfo
    | ReleasePartitions | StartTimer | CommitOutputs | JobCleanup | JobStatusChanged | ExecutionStateChanged
)

