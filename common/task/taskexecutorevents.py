"""What the TaskManager's core (`taskexecutorstate.py`) takes and gives: the events it is fed
(what happened) and the instructions it returns (do this), with the names both speak of a task
(`TaskKey`), a timer and a slot. The shells build events (`taskmanager/taskexecutorservice.py`
from the JobManager's calls, `taskmanager/taskexecutor.py` from task threads and timers,
`taskmanager/reporter.py` from report deliveries) and carry out instructions; the conformance
simulator does both in tests. Plain frozen values: no behaviour beyond naming paths.

Events (what happened):  SubmitTask, CancelTask, PartitionsAvailable, FreeSlots, ReleasePartitions,
                         TaskReported and TaskThreadExited (from a task's thread), TimerFired,
                         JobManagerRegistered, JobManagerLost, ReportsDelivered, ReportsRefused,
                         ShutdownRequested;
                         for streaming tasks RunBatch, FinishTasks, BatchReported, SetRateLimits
Instructions (do this):  TaskAccepted / TaskRejected (the answer to SubmitTasks), StartTask (run a
                         Spark task in a thread), InputsReady (hand it what to read),
                         InterruptTask, SendReport, DeletePartitions, StartTimer, DropJob,
                         RegisterAgain; for streaming tasks GiveBatch, BatchRejected, FinishTask,
                         LimitRate
"""

from __future__ import annotations

from dataclasses import dataclass

from funke.common import layout
from funke.common.graph.deployment import BatchTask, PartitionRef, PartitionUpdate, ProducedPartition, TaskDeployment, TaskReport
from funke.common.graph.executiongraph import ExecutionAttemptId, FailureInfo, TaskIo
from funke.common.streaming.sources import BatchInput
from funke.common.task.inputgates import GateSnapshot


@dataclass(frozen=True, slots=True, order=True)
class TaskKey:
    """A task as the JobManager names it: its job and its execution attempt."""

    job_id: str
    attempt: ExecutionAttemptId

    def __str__(self) -> str:
        return f"{self.attempt} of job {self.job_id}"


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class SubmitTask:
    deployment: TaskDeployment
    registration_id: str  # the registration the JobManager sent it to ("": it does not say)
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class CancelTask:
    job_id: str
    attempt: ExecutionAttemptId
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class PartitionsAvailable:
    job_id: str
    updates: tuple[PartitionUpdate, ...]
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class FreeSlots:
    job_id: str  # "" : whichever job holds them
    slot_indexes: tuple[int, ...]
    cause: str
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class ReleasePartitions:
    job_id: str
    partitions: tuple[PartitionRef, ...]
    whole_job: bool
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class TaskReported:
    """A task's thread reports a new state (with FAILED its failure, with FINISHED its output)."""

    key: TaskKey
    state: ExecutionState
    failure: FailureInfo | None = None
    produced: tuple[ProducedPartition, ...] = ()
    stimulus_id: str = ""
    io: TaskIo | None = None  # with FINISHED: what it read and wrote


@dataclass(frozen=True, slots=True)
class RunBatch:
    """The JobManager: run micro-batch `batch` on these streaming tasks of a job."""

    job_id: str
    batch: BatchInput
    tasks: tuple[BatchTask, ...]
    registration_id: str
    stimulus_id: str = ""
    released: tuple[int, ...] = ()  # earlier batches that are through: their partitions here can go


@dataclass(frozen=True, slots=True)
class FinishTasks:
    """The JobManager: these streaming tasks end FINISHED once their batches given are done
    (a graceful stop of the query)."""

    job_id: str
    attempts: tuple[ExecutionAttemptId, ...]
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class SetRateLimits:
    """The JobManager (backpressure): these receivers take at most so many records a second
    from now on. `rates`: (attempt, records/s), each rate positive."""

    job_id: str
    rates: tuple[tuple[ExecutionAttemptId, float], ...]
    registration_id: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class BatchReported:
    """A streaming task's thread finished a micro-batch (with what it wrote)."""

    key: TaskKey
    batch_id: int
    produced: tuple[ProducedPartition, ...] = ()
    stimulus_id: str = ""
    input_rows: int | None = None  # what its stream source read (None: not counted)
    io: TaskIo | None = None  # what the batch read and wrote


@dataclass(frozen=True, slots=True)
class TaskThreadExited:
    key: TaskKey
    error: FailureInfo | None = None  # the thread raised past the task's own reporting (a bug)
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class Timer:
    kind: str  # "missing-terminal"
    key: TaskKey
    version: int


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: Timer
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class JobManagerRegistered:
    registration_id: str
    data_dir: str  # the data directory this TaskManager uses when a job names none
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class JobManagerLost:
    reason: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class ReportsDelivered:
    reports: tuple[TaskReport, ...]
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class ReportsRefused:
    """The JobManager refused these reports for good (an answer that is not "not now")."""

    reports: tuple[TaskReport, ...]
    reason: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class ShutdownRequested:
    cause: str
    stimulus_id: str = ""


Event = (SubmitTask | CancelTask | PartitionsAvailable | FreeSlots | ReleasePartitions | TaskReported
         | TaskThreadExited | TimerFired | JobManagerRegistered | JobManagerLost | ReportsDelivered | ReportsRefused
         | ShutdownRequested | RunBatch | FinishTasks | BatchReported | SetRateLimits)


# ---------------------------------------------------------------------------------- instructions


@dataclass(frozen=True, slots=True)
class TaskAccepted:
    key: TaskKey


@dataclass(frozen=True, slots=True)
class TaskRejected:
    key: TaskKey
    reason: str


@dataclass(frozen=True, slots=True)
class StartTask:
    """Run the task's chain in a thread of its own (it needs Spark)."""

    key: TaskKey
    deployment: TaskDeployment


@dataclass(frozen=True, slots=True)
class InputsReady:
    """Every input of the task is complete: it may read these."""

    key: TaskKey
    gates: tuple[GateSnapshot, ...]


@dataclass(frozen=True, slots=True)
class GiveBatch:
    """Hand a streaming task its next micro-batch, with what to read of each input."""

    key: TaskKey
    batch: BatchInput
    gates: tuple[GateSnapshot, ...]


@dataclass(frozen=True, slots=True)
class BatchRejected:
    """The answer to RunBatch for a task that cannot run it."""

    key: TaskKey
    reason: str


@dataclass(frozen=True, slots=True)
class FinishTask:
    """End a streaming task once its batches given are done."""

    key: TaskKey


@dataclass(frozen=True, slots=True)
class LimitRate:
    """A streaming task's receiver takes at most `records_per_second` from now on."""

    key: TaskKey
    records_per_second: float


@dataclass(frozen=True, slots=True)
class InterruptTask:
    """Stop the task's Spark work (its thread then reports CANCELED)."""

    key: TaskKey


@dataclass(frozen=True, slots=True)
class SendReport:
    report: TaskReport
    generation: int  # a report of an older generation is for a JobManager that wrote it off


@dataclass(frozen=True, slots=True)
class DeletePartitions:
    """Delete these result partitions of a job, (data dir, data set, index, producer attempt),
    and these directories. `paths()` builds the paths: the shell calls it off its loop, since a
    job's release names thousands."""

    job_id: str
    partitions: frozenset[tuple[str, str, int, int]]
    dirs: tuple[str, ...] = ()

    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({layout.partition_dir(d, self.job_id, ds, index, attempt)
                             for d, ds, index, attempt in self.partitions})) + self.dirs


@dataclass(frozen=True, slots=True)
class StartTimer:
    timer: Timer
    delay_s: float


@dataclass(frozen=True, slots=True)
class DropJob:
    """The job holds no slot here any more: forget what was kept for it (decoded vertices)."""

    job_id: str  # "" : every job


@dataclass(frozen=True, slots=True)
class RegisterAgain:
    reason: str


Instruction = (TaskAccepted | TaskRejected | StartTask | InputsReady | InterruptTask | SendReport
               | DeletePartitions | StartTimer | DropJob | RegisterAgain | GiveBatch | BatchRejected | FinishTask
               | LimitRate)


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the heartbeat's slot report shows it."""

    index: int
    job_id: str | None
    running: tuple[ExecutionAttemptId, ...]
