"""The JobMaster's scheduler: one job's ExecutionGraph driven by events, returning actions.

Owns the job's bookkeeping and the mechanics of carrying out decisions: which executions are
scheduled together and wait for which slots, which slot each ExecutionSlotSharingGroup runs in,
moving executions and the job through the tables of `states.py`, cancelling, resetting and
restarting tasks, committing outputs, suspension. The decisions it asks for are made elsewhere,
one concern per module:

- `schedulingstrategy.py`: which regions to schedule when (eager or pipelined region);
- `failover.py`: what a failure restarts, whether and when (failover and restart strategies);
- `deploymentfactory.py`: what a deployment and a partition update say;
- `states.py`: which transitions are legal and how the job follows from its executions.

It is sans-IO, like dask's WorkerState: every public method takes an event (with `now` passed in,
and the id of the stimulus that caused it) and returns a list of actions (dataclasses below) for
the JobManager shell to carry out. Nothing here touches a socket, a thread or a clock. Every
transition records the stimulus id, so an execution's story says which event moved it.

Events:   start, on_slots_allocated (on_allocations: several), on_slot_request_failed, on_task_state
          (on_task_states: several), on_deploy_failed,
          on_task_manager_lost, on_timer, on_outputs_committed, on_internal_error, cancel, suspend
Actions:  RequestSlots, CancelSlotRequest, ReleaseSlot, DeployTask, CancelTask,
          UpdatePartitionInfo, ReleasePartitions, StartTimer, CommitOutputs, JobCleanup,
          JobStatusChanged, ExecutionStateChanged
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence, TypeVar

from funke.common.records import quick_init
from funke.common.graph.deployment import (
    GateState,
    PartitionRef,
    PartitionUpdate,
    TaskDeployment,
    TaskReport,
    VertexDeployment,
)
from funke.common.scheduling.deploymentfactory import TaskDeploymentFactory
from funke.common.graph.executiongraph import (
    Execution,
    ExecutionAttemptId,
    ExecutionGraph,
    ExecutionVertex,
    FailureInfo,
    IntermediateResultPartition,
    PartitionLocation,
    SlotId,
    TaskIo,
    add_operator_io,
    new_attempts,
)
from funke.common.scheduling.failover import (
    EXCEPTION_HISTORY_SIZE,
    ExceptionHistoryEntry,
    ExecutionFailureHandler,
    FailureHandling,
    vertices_of,
)
from funke.common.graph.jobgraph import FailoverStrategyKind
from funke.common.graph.operators import CATALOGUE
from funke.common.scheduling.regions import PipelinedRegion, compute_pipelined_regions
from funke.common.graph.restart import RestartBackoffTimeStrategy
from funke.common.scheduling.schedulingstrategy import scheduling_strategy
from funke.common.scheduling.slotsharing import ExecutionSlotSharingGroup, SlotRequest, build_slot_sharing_plan
from funke.common.states import (
    DEPLOYED_EXECUTION_STATES,
    EXECUTION_STATE_TRANSITIONS,
    JOB_STATUS_WHEN_EXECUTIONS_END,
    LIVE_EXECUTION_STATES,
    SCHEDULING_JOB_STATUSES,
    SKIP_INITIALIZING,
    SKIP_INITIALIZING_EXECUTION_TRANSITIONS,
    ExecutionsOutcome,
    ExecutionState,
    JobStatus,
    Transition,
    is_legal_path,
    resolve_report,
)
from funke.common.graph.streamingjob import is_streaming_query

__all__ = [
    "Action", "CancelSlotRequest", "CancelTask", "CommitOutputs", "DeployTask", "ExceptionHistoryEntry",
    "ExecutionStateChanged", "JobCleanup", "JobStatusChanged", "ReleasePartitions", "ReleaseSlot",
    "RequestSlots", "Scheduler", "SinkCommit", "StartTimer", "Timer", "UpdatePartitionInfo",
]

E = ExecutionState
J = JobStatus
_LIVE = LIVE_EXECUTION_STATES
_DEPLOYED = DEPLOYED_EXECUTION_STATES
_DEPLOYED_OR_CANCELING = DEPLOYED_EXECUTION_STATES | {E.CANCELING}
_TERMINAL = frozenset(state for state in E if state.is_terminal)


class _Effects(NamedTuple):
    """What an execution's move from one state to another changes besides its state, worked out
    once per pair of states: `_transition` runs six times per subtask and attempt."""

    deployed: int  # +1 it now runs on its TaskManager (consumers there are told of partitions), -1 no longer
    live: int  # +1 it now needs its slot-sharing group's slot, -1 no longer
    terminal: bool
    finished: bool
    garbage: bool  # it ended without finishing after it could have written partitions: release them


def _effects(before: ExecutionState, to: ExecutionState) -> _Effects:
    step = lambda a, b: (b and not a) - (a and not b)  # noqa: E731
    terminal = to in _TERMINAL
    return _Effects(step(before in _DEPLOYED, to in _DEPLOYED), step(before in _LIVE, to in _LIVE), terminal,
                    to is E.FINISHED, terminal and to is not E.FINISHED and before in _DEPLOYED_OR_CANCELING)


_EFFECTS = {(a, b): _effects(a, b) for a in E for b in E}
_new_tuple = tuple.__new__

# Flink's task.cancellation.timeout: after this, a job stuck in CANCELLING goes FAILED.
DEFAULT_CANCELLATION_TIMEOUT_S = 180.0
# How long a slot no task of the job runs in stays the job's, for the regions it schedules next,
# before it goes back to the SlotManager (the cluster's `slot.idle.timeout`; Flink: 50 s).
DEFAULT_SLOT_IDLE_TIMEOUT_S = 10.0

_F = TypeVar("_F", bound=Callable[..., list])


def _event(method: _F) -> _F:
    """An event handler: it starts from an empty action list, so that what an earlier event left
    behind when it raised is never carried out as this event's doing; and every transition it
    makes records its stimulus (`stimulus_id=`, else one is made up: "jm:<event>-<n>")."""
    name = method.__name__.removeprefix("on_")

    @functools.wraps(method)
    def handle(self: "Scheduler", *args, stimulus_id: str = "", **kwargs):  # type: ignore[no-untyped-def]
        self._out = []
        self._garbage = {}
        self._stimulus = stimulus_id or f"jm:{name}-{next(self._stimuli)}"
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._out = []
            self._garbage = {}
            raise

    return handle  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Actions
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Internal bookkeeping
# ----------------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Batch:
    """Executions scheduled together; deployed once every one of their groups has a slot. An
    execution that is no longer its vertex's current one, or no longer SCHEDULED, is ignored."""

    executions: list[Execution]
    groups: list[ExecutionSlotSharingGroup]

    def waiting(self) -> list[Execution]:
        return [ex for ex in self.executions if ex.vertex.current_execution is ex and ex.machine.state is E.SCHEDULED]


@dataclass(eq=False, slots=True)
class _Asked:
    """A slot request sent for `groups`: all at once, or (independent) in parts, in order, of
    which the first `served` have their slots."""

    groups: list[ExecutionSlotSharingGroup]
    independent: bool = False
    served: int = 0

    def unserved(self) -> list[ExecutionSlotSharingGroup]:
        return self.groups[self.served:]


@dataclass(eq=False, slots=True)
class _PendingRestart:
    """Vertices of a region failover: cancelled, then reset and rescheduled at `restart_at`."""

    vertices: set[ExecutionVertex]
    restart_at: float
    timer: Timer


@dataclass(slots=True)
class _GlobalFailure:
    root: FailureInfo
    restart: bool
    restart_at: float
    suppressed_by: str


class Scheduler:
    """One job's scheduling state. See the module docstring."""

    def __init__(
        self,
        graph: ExecutionGraph,
        *,
        restart_strategy: RestartBackoffTimeStrategy,
        failover_strategy: FailoverStrategyKind = FailoverStrategyKind.REGION,
        slot_request_timeout_s: float = 300.0,
        cancellation_timeout_s: float = DEFAULT_CANCELLATION_TIMEOUT_S,
        slot_idle_timeout_s: float = DEFAULT_SLOT_IDLE_TIMEOUT_S,
        testing_mutant: str = "",
    ):
        self.graph = graph
        self.testing_mutant = testing_mutant
        # A streaming query's tasks are long-lived and run micro-batches: one failure restarts
        # them all (the query's next run recovers from its checkpoint), and their sinks commit
        # batch by batch, not when the tasks finish.
        self.streaming = is_streaming_query(graph.job_graph)
        if self.streaming:
            failover_strategy = FailoverStrategyKind.FULL
        self.plan = build_slot_sharing_plan(graph)
        self.regions = compute_pipelined_regions(graph)
        self.restart_strategy = restart_strategy
        self.failover_strategy = failover_strategy
        self.slot_request_timeout_s = slot_request_timeout_s
        self.cancellation_timeout_s = cancellation_timeout_s
        self.slot_idle_timeout_s = slot_idle_timeout_s
        self.strategy = scheduling_strategy(graph.job_graph.job_type, self.regions)
        self.failures = ExecutionFailureHandler(failover_strategy, restart_strategy, self.regions)
        self.deployments = TaskDeploymentFactory(graph, streaming=self.streaming)
        self.exception_history: list[ExceptionHistoryEntry] = []
        self.failure: FailureInfo | None = None  # why the job FAILED
        self.num_restarts = 0  # failovers carried out (regions or the whole job restarted: Flink's numRestarts)

        self._total = total = graph.number_of_vertices()  # the graph's shape never changes
        self.state_counts: dict[ExecutionState, int] = {E.CREATED: total}  # of current executions
        self._non_terminal = total  # current executions not in a terminal state
        self._finished = 0  # current executions FINISHED
        self._usage: dict[ExecutionSlotSharingGroup, int] = {}  # live executions per group
        self._slot_of: dict[ExecutionSlotSharingGroup, SlotId] = {}
        # The job's slots no group runs in (its slot pool): taken by the groups scheduled next,
        # handed back after the idle timeout. Empty whenever a slot request is pending.
        self._idle: deque[SlotId] = deque()
        self._requested: dict[ExecutionSlotSharingGroup, int] = {}  # group -> pending request id
        self._requests: dict[int, _Asked] = {}  # pending slot requests by id
        self._batches: dict[_Batch, None] = {}  # waiting batches, in order (an ordered set)
        self._batches_with_group: dict[ExecutionSlotSharingGroup, list[_Batch]] = {}  # deployed batches leave at once, others lazily
        self._next_request_id = 1
        self._scheduled_regions: set[PipelinedRegion] = set()
        self._pending_restart: _PendingRestart | None = None
        self._global_failure: _GlobalFailure | None = None
        self._timer_seq = 0
        self._timers: dict[str, Timer] = {}  # the one live timer of each kind
        self._committing = False
        self._restoring = False  # taking finished subtasks over: start() schedules what they unblock
        self._task_managers_used: set[str] = set()
        self._stimuli = itertools.count(1)
        self._stimulus = ""  # the id of the event being handled
        self._out: list[Action] = []
        self._garbage: dict[str, list[PartitionRef]] = {}  # TaskManager -> partitions this event made garbage

    # ------------------------------------------------------------------ public view

    @property
    def status(self) -> JobStatus:
        return self.graph.status

    @property
    def committing(self) -> bool:
        return self._committing

    @property
    def eager(self) -> bool:
        return self.strategy.one_batch

    def slot_of_group(self, group: ExecutionSlotSharingGroup) -> SlotId | None:
        return self._slot_of.get(group)

    def validate_state(self) -> None:
        """Check the scheduler's books against the ExecutionGraph; AssertionError naming the first
        disagreement. O(tasks): for tests and fuzzing, not for every event in production."""
        vertices = self.graph.execution_vertices()
        states: dict[ExecutionState, int] = {}
        for ev in vertices:
            states[ev.state] = states.get(ev.state, 0) + 1
        kept = {state: n for state, n in self.state_counts.items() if n}
        assert kept == states, f"state counts {kept} disagree with the graph {states}"
        finished = states.get(E.FINISHED, 0)
        assert self._finished == finished, f"_finished={self._finished}, the graph has {finished} FINISHED"
        non_terminal = sum(n for state, n in states.items() if not state.is_terminal)
        assert self._non_terminal == non_terminal, f"_non_terminal={self._non_terminal}, the graph has {non_terminal}"
        live: dict[ExecutionSlotSharingGroup, int] = {}
        for ev in vertices:
            if ev.state in _LIVE:
                group = self.plan.group_of(ev)
                live[group] = live.get(group, 0) + 1
        for group in set(live) | set(self._usage):
            assert self._usage.get(group, 0) == live.get(group, 0), (
                f"slot-sharing group {group.index}: _usage={self._usage.get(group, 0)}, "
                f"{live.get(group, 0)} live executions")
        slots = list(self._slot_of.values())
        assert len(slots) == len(set(slots)), f"two groups in one slot: {sorted(map(str, slots))}"
        idle = set(self._idle)
        assert len(idle) == len(self._idle) and not idle & set(slots), (
            f"an idle slot twice, or also a group's: {sorted(map(str, self._idle))}")
        assert not (idle and self._requests), f"idle slots {sorted(map(str, idle))} while requests {sorted(self._requests)} wait"
        assert not idle or "slot-idle" in self._timers, "idle slots without a timer to hand them back"
        if self.status.is_terminal:
            alive = [repr(ev.current_execution) for ev in vertices if not ev.state.is_terminal]
            assert not alive, f"the job is {self.status.value} but executions are not terminal: {alive[:10]}"
            assert not self._slot_of and not idle, (
                f"the job is {self.status.value} but holds slots {sorted(map(str, slots + list(idle)))}")
            assert not self._requests, f"the job is {self.status.value} but slot requests are pending: {sorted(self._requests)}"
            assert not self._batches, f"the job is {self.status.value} but {len(self._batches)} batches wait"
        else:
            for ev in vertices:
                ex = ev.current_execution
                if ex.state in _DEPLOYED or ex.state is E.CANCELING:
                    slot = self._slot_of.get(self.plan.group_of(ev))
                    assert slot == ex.slot, f"{ex!r} runs in {ex.slot}, its group holds {slot}"
        for result in self.graph.results.values():
            for partition in result.partitions:
                if partition.location is not None:
                    producer = partition.producer.current_execution
                    assert (producer.state is E.FINISHED
                            and producer.attempt_number == partition.location.producer_attempt), (
                        f"{result.id}[{partition.partition_index}] is located at attempt "
                        f"{partition.location.producer_attempt}, its producer is {producer!r}")

    # ------------------------------------------------------------------ events

    @_event
    def start(self, now: float) -> list[Action]:
        if self.status is not J.CREATED:
            raise ValueError(f"cannot start a job in {self.status.value}")
        self._schedule_regions(self.strategy.initial_regions(), now)
        if self.status is J.CREATED and self._finished == self._total:
            # Every subtask finished under an earlier leader: only the commit is left.
            self._job_transition(J.RUNNING, now, "every task finished before the job was recovered")
            self._check_progress(now)
        return self._drain()

    def finished_subtasks(self) -> list[FinishedSubtask]:
        """The subtasks whose current attempt FINISHED with every partition it produced still
        available (what `restore_finished` takes over after a change of leader)."""
        done = []
        for ev in self.graph.execution_vertices():
            ex = ev.current_execution
            if ex.state is not E.FINISHED or any(p.location is None for p in ev.produced_partitions):
                continue
            schemas = tuple((p.result.id, p.partition_index, p.location.schema)  # type: ignore[union-attr]
                            for p in ev.produced_partitions)
            done.append(FinishedSubtask(ev.job_vertex.id, ev.subtask_index, ex.attempt_number, schemas, ex.slot,
                                        ex.machine.created_at, tuple(ex.machine.history), ex.io))
        return done

    @_event
    def restore_finished(self, finished: Iterable[FinishedSubtask], now: float, cause: str) -> list[Action]:
        """Before `start`, for a job a new leader recovered: the subtasks that FINISHED under an
        earlier leader (and whose output is still there: the caller checked) are FINISHED again
        with their old attempts and their partitions available, so `start` schedules only the
        rest. Only whole pipelined regions are taken over (a region's subtasks run together);
        returns the actions (state changes) and restores nothing twice."""
        if self.status is not J.CREATED:
            raise ValueError(f"cannot restore finished subtasks of a job in {self.status.value}")
        by_subtask = {(f.vertex_id, f.subtask_index): f for f in finished}
        self._restoring = True
        try:
            self._restore_regions(by_subtask, now, cause)
        finally:
            self._restoring = False
        return self._drain()

    def _restore_regions(self, by_subtask: dict[tuple[str, int], FinishedSubtask], now: float, cause: str) -> None:
        for region in self.regions.regions:
            records = [by_subtask.get((ev.job_vertex.id, ev.subtask_index)) for ev in region.vertices]
            if not records or any(r is None for r in records) or any(ev.state is not E.CREATED for ev in region.vertices):
                continue
            for ev, record in zip(region.vertices, records):
                assert record is not None
                self._restore_execution(ev, record, now, cause)
                self._on_finished(ev.current_execution, {(d, i): schema for d, i, schema in record.schemas}, now)
            self._scheduled_regions.add(region)

    def _restore_execution(self, ev: ExecutionVertex, record: FinishedSubtask, now: float, cause: str) -> None:
        """The finished attempt as it ran: its TaskManager and slot, and its recorded transitions
        with their own times and causes (the last one also saying it was taken over). A record
        without them (or whose path the table does not allow) gets the shortest legal path to
        FINISHED, stamped now."""
        steps = [(t.to_state, t.timestamp, t.cause) for t in record.history]
        path = [E.CREATED] + [state for state, _, _ in steps]
        if not steps or path[-1] is not E.FINISHED or not is_legal_path(EXECUTION_STATE_TRANSITIONS, path):
            steps = [(state, now, "") for state in (E.SCHEDULED, E.DEPLOYING, E.FINISHED)]
        execution = Execution(ev, record.attempt_number, record.created_at if record.history else now)
        ev.current_execution = execution
        execution.slot = record.slot if record.history else None
        execution.io = record.io
        for i, (state, at, was) in enumerate(steps):
            last = i == len(steps) - 1
            self._transition(execution, state, at, f"{was}; {cause}" if last and was else cause if last else was)

    @_event
    def on_slots_allocated(self, request_id: int, slots: Sequence[SlotId], now: float) -> list[Action]:
        self._allocated(((request_id, slots),), now)
        return self._drain()

    @_event
    def on_allocations(self, allocations: Sequence[tuple[int, Sequence[SlotId]]], now: float) -> list[Action]:
        """Several slot requests served at once (the SlotManager serves its queue in one pass): as
        `on_slots_allocated` for each in turn, with the batches they complete deployed in one pass."""
        self._allocated(allocations, now)
        return self._drain()

    def _allocated(self, allocations: Sequence[tuple[int, Sequence[SlotId]]], now: float) -> None:
        expected: dict[int, int] = {}
        for request_id, slots in allocations:  # checked before anything changes
            asked = self._requests.get(request_id)
            if asked is not None:
                left = expected.get(request_id, len(asked.groups) - asked.served)
                if len(slots) > left or (len(slots) < left and not asked.independent):
                    raise ValueError(f"request {request_id}: got {len(slots)} slots for {left} groups")
                expected[request_id] = left - len(slots)
        scheduling = self.status in SCHEDULING_JOB_STATUSES
        served: list[ExecutionSlotSharingGroup] = []
        requests, requested, slot_of = self._requests, self._requested, self._slot_of
        for request_id, slots in allocations:
            asked = requests.get(request_id)
            if asked is None or not scheduling:
                for slot in slots:
                    self._out.append(ReleaseSlot(slot, "slot request no longer needed"))
                if asked is not None:
                    del requests[request_id]
                    for g in asked.unserved():
                        requested.pop(g, None)
                    if asked.served + len(slots) < len(asked.groups):  # an independent one: the rest too
                        self._out.append(CancelSlotRequest(request_id))
                continue
            start = asked.served
            groups = asked.groups[start:start + len(slots)]
            asked.served = start + len(slots)
            if asked.served == len(asked.groups):
                del requests[request_id]
            for group, slot in zip(groups, slots):
                requested.pop(group, None)
                slot_of[group] = slot
            served.extend(groups)
        if not served:
            return
        self._deploy_ready_batches(now, self._batches_needing(served))
        # groups whose vertices were cancelled while the request was pending
        usage = self._usage
        for group in served:
            if usage.get(group, 0) == 0 and group in slot_of:
                self._release_group_slot(group, "no task needs the slot any more")

    @_event
    def on_slot_request_failed(self, request_id: int, message: str, now: float) -> list[Action]:
        asked = self._requests.pop(request_id, None)
        if asked is None:
            return []
        groups = asked.unserved()
        for g in groups:
            self._requested.pop(g, None)
        starved = self._batches_needing(groups)
        for batch in starved:
            del self._batches[batch]
        failure = FailureInfo("NoResourceAvailableException", message)
        failed = []
        for batch in starved:
            for ex in batch.waiting():
                self._transition(ex, E.FAILED, now, str(failure), failure)
                failed.append(ex.vertex)
        if failed:
            self._handle_failure(failed, failure, now, task_manager_id=None)
        return self._drain()

    @_event
    def on_task_state(
        self,
        attempt: ExecutionAttemptId,
        reported: ExecutionState,
        now: float,
        *,
        failure: FailureInfo | None = None,
        produced_schemas: dict[tuple[str, int], str] | None = None,
        io: TaskIo | None = None,
    ) -> list[Action]:
        """A TaskManager reports what one of its tasks did (with FINISHED: the schemas of the
        partitions it produced and what it read and wrote). Reports about attempts that are not
        current (a restart replaced them) and reports the table does not allow from the current
        state (e.g. RUNNING after cancellation was requested) change nothing."""
        self._task_state(attempt, reported, now, failure, produced_schemas, io)
        return self._drain()

    @_event
    def on_task_states(self, reports: Sequence[TaskReport], now: float) -> list[Action]:
        """Several reports at once, as a TaskManager sends what its tasks did since its last call:
        each as `on_task_state`, in order, under its own stimulus id (else its TaskManager's
        "<tm>:report", else one made up for the call). Micro-batch reports (`batch_id`) are not
        state changes: the JobMaster hands those to its streaming query."""
        shared = self._stimulus
        for r in reports:
            self._stimulus = r.stimulus_id or (f"{r.task_manager_id}:report" if r.task_manager_id else shared)
            schemas = {(p.data_set_id, p.partition_index): p.schema for p in r.produced} if r.produced else None
            self._task_state(r.attempt, r.state, now, r.failure, schemas, r.io)
        return self._drain()

    def _task_state(self, attempt: ExecutionAttemptId, reported: ExecutionState, now: float,
                    failure: FailureInfo | None, produced_schemas: dict[tuple[str, int], str] | None,
                    io: TaskIo | None) -> None:
        execution = self._current(attempt)
        if execution is None:
            return
        machine = execution.machine
        state = machine.state
        if state in _TERMINAL:
            return
        target = resolve_report(state, reported)
        if self.testing_mutant == SKIP_INITIALIZING:
            if target is E.INITIALIZING:
                return  # the defect: INITIALIZING is dropped ...
            if target is E.RUNNING and state is E.DEPLOYING:
                machine.table = SKIP_INITIALIZING_EXECUTION_TRANSITIONS  # ... and DEPLOYING -> RUNNING taken
        if target is state or target not in machine.table[state]:
            return
        if target is E.FINISHED:
            execution.io = io
            self._transition(execution, E.FINISHED, now, "task finished")
            self._on_finished(execution, produced_schemas or {}, now)
        elif target is E.FAILED:
            failure = failure or FailureInfo("TaskFailure", "task failed without a cause")
            # whether its slot stays with the job is for the failure handling to say
            self._transition(execution, E.FAILED, now, str(failure), failure, keep_slot=True)
            self._handle_failure([execution.vertex], failure, now, task_manager_id=execution.task_manager_id)
            self._free_if_unused(execution.vertex, now)
        elif target is E.CANCELED:
            cause = "cancelled" if reported is E.CANCELED else f"{reported.value} reported after cancellation"
            self._transition(execution, E.CANCELED, now, cause)
        else:  # on the way (INITIALIZING, RUNNING, CANCELING): nothing the job's progress waits for
            self._transition(execution, target, now, f"reported by {execution.task_manager_id}")
            return
        self._check_progress(now)

    def on_deploy_failed(self, attempt: ExecutionAttemptId, failure: FailureInfo, now: float, *,
                         stimulus_id: str = "") -> list[Action]:
        return self.on_task_state(attempt, E.FAILED, now, failure=failure,
                                  stimulus_id=stimulus_id or f"jm:deploy-failed-{next(self._stimuli)}")

    @_event
    def on_task_manager_lost(self, task_manager_id: str, cause: str, now: float) -> list[Action]:
        """Every task on the TaskManager fails; partitions that lived only there are gone.
        One lost TaskManager is one failure for the restart strategy."""
        self._slot_of = {g: s for g, s in self._slot_of.items() if s.task_manager_id != task_manager_id}
        self._idle = deque(s for s in self._idle if s.task_manager_id != task_manager_id)
        failure = FailureInfo("TaskManagerLost", f"TaskManager {task_manager_id} lost: {cause}")
        failed: list[ExecutionVertex] = []
        for ev in self.graph.execution_vertices():
            ex = ev.current_execution
            if ex.task_manager_id == task_manager_id and not ex.state.is_terminal:
                if ex.state is E.CANCELING:
                    self._transition(ex, E.CANCELED, now, str(failure))
                else:
                    self._transition(ex, E.FAILED, now, str(failure), failure)
                    failed.append(ev)
        lost_needed: list[ExecutionVertex] = []
        needed_by_group: dict[int, bool] = {}
        for result in self.graph.results.values():
            for partition in result.partitions:
                loc = partition.location
                if loc is not None and loc.task_manager_id == task_manager_id:
                    self.graph.mark_partition_unavailable(partition)
                    if self._partition_still_needed(partition, needed_by_group):
                        lost_needed.append(partition.producer)
        if failed or lost_needed:
            self._handle_failure(failed, failure, now, task_manager_id=task_manager_id, also_restart=lost_needed)
        if self.status in SCHEDULING_JOB_STATUSES:
            self._request_missing_slots(now)
        self._check_progress(now)
        return self._drain()

    @_event
    def on_timer(self, timer: Timer, now: float) -> list[Action]:
        if self._timers.get(timer.kind) != timer:
            return []  # replaced or cancelled since
        del self._timers[timer.kind]
        if timer.kind == "restart":
            pending = self._pending_restart
            if pending is not None:
                # The timer decides, not a comparison with a clock that may have been stepped.
                pending.restart_at = min(pending.restart_at, now)
                self._maybe_restart_regions(now)
            elif self._global_failure is not None and self.status is J.RESTARTING:
                self._restart_globally(now)
        elif timer.kind == "cancel-timeout":
            self._cancellation_timed_out(now)
        elif timer.kind == "slot-idle":
            self._release_idle_slots(f"idle for {self.slot_idle_timeout_s:g} s")
        return self._drain()

    @_event
    def on_outputs_committed(self, now: float, error: FailureInfo | None = None) -> list[Action]:
        if not self._committing:
            return []
        self._committing = False
        if self.status is not J.RUNNING:
            return self._drain()
        if error is None:
            self._job_transition(JOB_STATUS_WHEN_EXECUTIONS_END[(J.RUNNING, ExecutionsOutcome.ALL_FINISHED)], now,
                                 "all tasks finished and outputs committed")
            self._terminate(now)
        else:
            self._record_exception(ExceptionHistoryEntry(now, "", None, None, error))
            self.failure = error
            self._job_transition(J.FAILING, now, f"committing outputs failed: {error}")
            self._job_transition(J.FAILED, now, str(error))
            self._terminate(now)
        return self._drain()

    @_event
    def on_global_failure(self, failure: FailureInfo, now: float) -> list[Action]:
        """The job as a whole failed (Flink's handleGlobalFailure: a streaming query's batch
        could not run or commit): every task restarts if the restart strategy allows."""
        self._record_exception(ExceptionHistoryEntry(now, "", None, None, failure))
        if self.status in SCHEDULING_JOB_STATUSES:
            self._fail_globally(failure, now, self.failures.on_global_failure(now))
        return self._drain()

    @_event
    def cancel(self, now: float) -> list[Action]:
        if self.status.is_terminal or self.status is J.CANCELLING:
            return []
        if self._committing:
            # Every task finished and the commit is under way: it decides the outcome, as a
            # cancel arriving after the last task finished does in Flink.
            return []
        self._job_transition(J.CANCELLING, now, "cancellation requested")
        self._pending_restart = None
        self._global_failure = None
        self._cancel_everything(now, "job cancelled")
        self._check_progress(now)
        return self._drain()

    @_event
    def suspend(self, now: float, cause: str) -> list[Action]:
        """Stop the job on this JobManager; another one may recover it (locally terminal)."""
        if self.status.is_terminal:
            return []
        self._job_transition(J.SUSPENDED, now, cause)
        self._pending_restart = None
        self._global_failure = None
        self._committing = False
        self._cancel_everything(now, f"job suspended: {cause}")
        # This JobManager stops caring about the job: it does not wait for the TaskManagers to
        # confirm (Flink's Execution.suspend), so the suspended job has no live execution left.
        for ev in self.graph.execution_vertices():
            if ev.state is E.CANCELING:
                self._transition(ev.current_execution, E.CANCELED, now, "job suspended; cancellation not awaited")
        self._terminate(now)
        return self._drain()

    @_event
    def on_internal_error(self, failure: FailureInfo, now: float,
                          undelivered: Sequence[ExecutionAttemptId] = (), *, record: bool = True) -> list[Action]:
        """The JobManager could not carry out this job's decisions (a deployment that would not
        build, a call that raised before it left the process). The job fails at once and is not
        restarted — the same actions would fail again — with the cause in its exception history;
        `undelivered` deployments never reached a TaskManager, so they fail first instead of
        waiting for a report that cannot come (also when the job already asked them to cancel).
        `record`: add the failure to the exception history (once per error, not per round)."""
        for attempt in undelivered:
            ex = self._current(attempt)
            if ex is not None and (ex.state in _DEPLOYED or ex.state is E.CANCELING):
                self._transition(ex, E.FAILED, now, str(failure), failure)
        if record:
            self._record_exception(ExceptionHistoryEntry(now, "", None, None, failure))
        status = self.status
        suppressed = "an error in the JobManager, which a restart would meet again"
        if status in SCHEDULING_JOB_STATUSES:
            self._committing = False
            self._fail_globally(failure, now, ExecutionFailureHandler.without_restart(suppressed))
        elif status is J.FAILING:
            gf = self._global_failure
            if gf is not None and gf.restart:
                gf.restart = False
                self.failure = _suppressed(gf.root, suppressed)
            self._check_progress(now)
        elif status is J.RESTARTING:
            self.failure = _suppressed(failure, suppressed)
            self._job_transition(J.FAILED, now, str(failure))
            self._terminate(now)
        else:  # CANCELLING goes on; a terminal job has nothing left to fail
            self._check_progress(now)
        return self._drain()

    # ------------------------------------------------------------------ scheduling

    def _schedule_regions(self, regions: list[PipelinedRegion], now: float) -> None:
        """Schedule `regions` (those not scheduled yet): one batch of executions per region, or one
        for all of them if the strategy schedules in bulk; each batch asks for the slots its
        groups lack and is deployed once they all have one."""
        regions = [r for r in regions if r not in self._scheduled_regions]
        if not regions:
            return
        regions.sort(key=_region_index)
        one_batch = self.strategy.one_batch
        batches: list[list[ExecutionVertex]] = []
        merged = False  # a region's vertices are in _vertex_order already; several regions' are not
        for region in regions:
            self._scheduled_regions.add(region)
            vertices = [ev for ev in region.vertices if ev.current_execution.machine.state is E.CREATED]
            if not vertices:
                continue
            if one_batch and batches:
                batches[0].extend(vertices)
                merged = True
            else:
                batches.append(vertices)
        requests: list[SlotRequest] = []
        # batches that lack one slot each (regions in one slot-sharing group, as a batch job's
        # one-subtask regions): one independent request for all of them
        lacking_one: list[ExecutionSlotSharingGroup] = []
        lacking: set[ExecutionSlotSharingGroup] = set()
        lacking_at = 0
        new_batches: list[_Batch] = []
        group_of, slot_of, requested = self.plan.group_of, self._slot_of, self._requested
        waiting, with_group = self._batches, self._batches_with_group
        ready: list[Execution] = []
        direct = self.status in SCHEDULING_JOB_STATUSES
        if merged:
            batches[0].sort(key=_vertex_order)
        self._transition_all([ev.current_execution for vertices in batches for ev in vertices], E.SCHEDULED, now,
                             "scheduled")
        idle = self._idle if direct else None
        for vertices in batches:
            if len(vertices) == 1:  # a batch job's one-subtask regions: thousands at once
                group = group_of(vertices[0])
                if idle and group not in slot_of:
                    slot_of[group] = idle.popleft()  # a slot the job holds, idle
                if direct and group in slot_of:
                    ready.append(vertices[0].current_execution)  # its group's slot: kept, or idle
                    continue
                groups = [group]
                missing = [] if group in slot_of or group in requested or group in lacking else [group]
            else:
                groups = list(dict.fromkeys([group_of(ev) for ev in vertices]))
                if idle:
                    self._take_idle(groups)
                if direct and all(g in slot_of for g in groups):
                    # its groups' slots are held (kept through a global failover, or idle): deployed below, in order
                    ready.extend(ev.current_execution for ev in vertices)
                    continue
                missing = [g for g in groups if g not in slot_of and g not in requested and g not in lacking]
            if len(missing) == 1 and not one_batch:
                if not lacking_one:
                    lacking_at = len(requests)  # asked for in the order of the regions
                lacking_one.append(missing[0])
                lacking.add(missing[0])
            elif missing:
                requests.append(self._new_request(missing))
            batch = _Batch([ev.current_execution for ev in vertices], groups)
            waiting[batch] = None
            for g in groups:
                listed = with_group.get(g)
                if listed is None:
                    with_group[g] = [batch]
                else:
                    listed.append(batch)
            new_batches.append(batch)
        if lacking_one:
            requests.insert(lacking_at, self._new_request(lacking_one, independent=True))
        if requests:
            self._out.append(RequestSlots(tuple(requests), self.slot_request_timeout_s))
        if ready:
            self._deploy_all(ready, now)
        self._deploy_ready_batches(now, new_batches)

    def _new_request(self, groups: list[ExecutionSlotSharingGroup], independent: bool = False) -> SlotRequest:
        """A slot request for `groups`: all at once, or (`independent`) each as a slot is free."""
        request_id = self._next_request_id
        self._next_request_id += 1
        self._requests[request_id] = _Asked(groups, independent)
        requested = self._requested
        if len(groups) == 1:
            group = groups[0]
            requested[group] = request_id
            return SlotRequest(request_id, 1, ((group.slot_sharing_group, 1),))
        per_group: dict[str, int] = {}
        for g in groups:
            requested[g] = request_id
            per_group[g.slot_sharing_group] = per_group.get(g.slot_sharing_group, 0) + 1
        return SlotRequest(request_id, len(groups), tuple(sorted(per_group.items())), independent)

    def _take_idle(self, groups: Iterable[ExecutionSlotSharingGroup]) -> None:
        """Groups without a slot take the job's idle ones, in order, while there are."""
        idle, slot_of = self._idle, self._slot_of
        for g in groups:
            if not idle:
                return
            if g not in slot_of:
                slot_of[g] = idle.popleft()

    def _request_missing_slots(self, now: float) -> None:
        """Waiting batches whose groups have neither a slot nor a pending request (their slot
        was on a TaskManager that is gone) take idle slots, else ask again."""
        missing: list[ExecutionSlotSharingGroup] = []
        for batch in self._batches:
            for g in batch.groups:
                if g not in self._slot_of and g not in self._requested and g not in missing:
                    missing.append(g)
        if self._idle and missing:
            self._take_idle(missing)
            self._deploy_ready_batches(now, self._batches_needing(missing))
            missing = [g for g in missing if g not in self._slot_of]
        if missing:
            self._out.append(RequestSlots((self._new_request(missing),), self.slot_request_timeout_s))

    def _batches_needing(self, groups: Iterable[ExecutionSlotSharingGroup]) -> list[_Batch]:
        """Waiting batches that contain any of `groups`, in the order they were made. An index,
        not a scan: a batch job at P = 10 000 has thousands of batches waiting for slots."""
        found: dict[_Batch, None] = {}
        waiting, index = self._batches, self._batches_with_group
        for g in groups:
            listed = index.get(g)
            if listed:
                if len(listed) == 1:  # most groups: one batch waits for them
                    if listed[0] in waiting:
                        found[listed[0]] = None
                    else:
                        del index[g]
                    continue
                listed[:] = [b for b in listed if b in waiting]
                for b in listed:
                    found[b] = None
        return list(found)

    def _deploy_ready_batches(self, now: float, batches: Iterable[_Batch]) -> None:
        if self.status not in SCHEDULING_JOB_STATUSES:
            return
        waiting, slot_of = self._batches, self._slot_of
        ready: list[Execution] = []
        for batch in batches:
            if batch in waiting:
                groups = batch.groups
                if len(groups) == 1:
                    if groups[0] not in slot_of:
                        continue
                elif not all(g in slot_of for g in groups):
                    continue
                del waiting[batch]
                self._unindex(batch)
                executions = batch.executions
                if len(executions) == 1:
                    ex = executions[0]
                    if ex.vertex.current_execution is ex and ex.machine.state is E.SCHEDULED:
                        ready.append(ex)
                else:
                    ready.extend(batch.waiting())
        if ready:
            self._deploy_all(ready, now)

    def _unindex(self, batch: _Batch) -> None:
        """Forget a deployed batch in `_batches_with_group` at once: a batch job at P = 100 000
        would otherwise keep P deployed batches (and their lists) until their groups are next
        looked up."""
        index = self._batches_with_group
        for g in batch.groups:
            listed = index.get(g)
            if listed is not None:
                if len(listed) == 1 and listed[0] is batch:
                    del index[g]
                else:
                    listed[:] = [b for b in listed if b is not batch]
                    if not listed:
                        del index[g]

    def _deploy_all(self, executions: list[Execution], now: float) -> None:
        """Deploy `executions` (current, SCHEDULED, their groups hold slots), in order: each
        moves to DEPLOYING in its group's slot and gets its deployment."""
        if self.status is J.CREATED:
            self._job_transition(J.RUNNING, now, "tasks deploying")
        deployed, live, terminal, _, _ = _EFFECTS[E.SCHEDULED, E.DEPLOYING]
        assert deployed == 1 and not live and not terminal
        slot_of, by_vertex = self._slot_of, self.plan.by_job_vertex
        used = self._task_managers_used
        out = self._out.append
        moved, vertex_deployment, gates = (self.deployments.consumer_moved, self.deployments.vertex_deployment,
                                           self.deployments.gates)
        stimulus = self._stimulus
        scheduled, deploying = E.SCHEDULED, E.DEPLOYING
        last_vertex, plan = None, None  # executions of one job vertex come together
        done = 0
        try:
            for ex in executions:
                ev = ex.vertex
                ejv = ev.job_vertex
                slot = slot_of[by_vertex[ejv.id][ev.subtask_index]]
                tm = slot.task_manager_id
                machine = ex.machine
                if machine.state is not scheduled or deploying not in machine.table[scheduled]:
                    machine.transition(deploying, now, "", stimulus)  # raises IllegalTransition with the story
                ex.slot = slot
                used.add(tm)
                t = _new_tuple(Transition, (scheduled, deploying, now,
                                            f"deploying to {tm}/slot-{slot.slot_index}", stimulus))  # str(slot)
                machine.history.append(t)
                machine.state = deploying
                done += 1
                if ejv is not last_vertex:
                    last_vertex, plan = ejv, vertex_deployment(ejv)
                name = ev.name
                out(_new_tuple(ExecutionStateChanged, (ex.attempt_id, name, t, tm, None)))
                if ev.consumed_partition_groups:
                    moved(ex, tm, 1)
                    out(_new_tuple(DeployTask, (plan, ex.attempt_id, name, slot, gates(ev), stimulus)))
                else:
                    out(_new_tuple(DeployTask, (plan, ex.attempt_id, name, slot, (), stimulus)))
        finally:
            counts = self.state_counts
            counts[E.SCHEDULED] -= done
            counts[E.DEPLOYING] = counts.get(E.DEPLOYING, 0) + done

    # ------------------------------------------------------------------ progress

    def _on_finished(self, execution: Execution, schemas: dict[tuple[str, int], str], now: float) -> None:
        ev = execution.vertex
        tm = execution.task_manager_id or ""
        completed_groups = []
        for partition in ev.produced_partitions:
            schema = schemas.get((partition.result.id, partition.partition_index), "") if schemas else ""
            location = PartitionLocation(execution.attempt_number, tm, schema)
            completed_groups.extend(self.graph.mark_partition_finished(partition, location))
            for task_manager_id, update in self.deployments.partition_updates(partition, location):
                self._out.append(UpdatePartitionInfo(task_manager_id, update))
        if completed_groups and self.status in SCHEDULING_JOB_STATUSES and not self._restoring:
            ready = [r for r in self.strategy.regions_ready_after(completed_groups) if r not in self._scheduled_regions]
            if ready and self._pending_restart_excludes(ready):
                self._schedule_regions(ready, now)

    def _pending_restart_excludes(self, regions: list[PipelinedRegion]) -> bool:
        pending = self._pending_restart
        return pending is None or not any(ev in pending.vertices for r in regions for ev in r.vertices)

    def _check_progress(self, now: float) -> None:
        """Move the job on once its executions say so (`JOB_STATUS_WHEN_EXECUTIONS_END`)."""
        status = self.graph.status_machine.state
        if status is J.RUNNING and self._finished == self._total and not self._committing:
            self._finish(now)
        elif status in (J.FAILING, J.CANCELLING) and self._non_terminal == 0:
            gf = self._global_failure
            outcome = (ExecutionsOutcome.ENDED_TO_RESTART if status is J.FAILING and gf is not None and gf.restart
                       else ExecutionsOutcome.ENDED)
            target = JOB_STATUS_WHEN_EXECUTIONS_END[(status, outcome)]
            if target is J.RESTARTING:
                assert gf is not None
                self._job_transition(J.RESTARTING, now, f"restarting after: {gf.root}")
                self._start_timer("restart", max(now, gf.restart_at))
            elif target is J.FAILED:
                self._job_transition(J.FAILED, now, str(self.failure) if self.failure else "failed")
                self._terminate(now)
            else:
                self._job_transition(target, now, "all tasks cancelled")
                self._terminate(now)
        elif self._pending_restart is not None:
            self._maybe_restart_regions(now)

    def _finish(self, now: float) -> None:
        sinks = []
        for ejv in self.graph.vertices.values() if not self.streaming else ():
            tail = ejv.job_vertex.operators[-1] if ejv.job_vertex.operators else None
            kind = CATALOGUE.get(tail.kind) if tail else None
            if kind is not None and kind.commits_output:
                for ev in ejv.task_vertices:
                    sinks.append(SinkCommit(ejv.id, ev.subtask_index, ev.current_execution.attempt_number,
                                            tail.kind, tuple(sorted(tail.config.items()))))
        if sinks:
            self._committing = True
            self._out.append(CommitOutputs(tuple(sinks)))
        else:
            self._job_transition(JOB_STATUS_WHEN_EXECUTIONS_END[(J.RUNNING, ExecutionsOutcome.ALL_FINISHED)], now,
                                 "all tasks finished")
            self._terminate(now)

    # ------------------------------------------------------------------ failures

    def _handle_failure(
        self,
        failed: list[ExecutionVertex],
        failure: FailureInfo,
        now: float,
        *,
        task_manager_id: str | None,
        also_restart: Sequence[ExecutionVertex] = (),
    ) -> None:
        """`failed` tasks failed with `failure`; `also_restart` are finished producers whose
        partitions were lost while still needed."""
        for ev in failed:
            ex = ev.current_execution
            self._record_exception(ExceptionHistoryEntry(
                now, ev.name, ex.attempt_id, ex.task_manager_id or task_manager_id, ex.failure or failure))
        if not failed:
            self._record_exception(ExceptionHistoryEntry(now, "", None, task_manager_id, failure))
        if self.status not in SCHEDULING_JOB_STATUSES:
            return  # already failing, cancelling or restarting: the failure changes nothing
        failed = list(failed) + list(also_restart)
        pending = self._pending_restart
        if pending is not None and all(ev in pending.vertices for ev in failed):
            return  # part of a restart already under way: not a new failure
        handling = self.failures.on_task_failure(failed, now)
        if handling.is_global:
            self._fail_globally(failure, now, handling)
            return
        assert handling.regions is not None
        vertices = vertices_of(handling.regions)
        for region in handling.regions:
            self._scheduled_regions.discard(region)
        restart_at = now + handling.delay_s
        if pending is not None:
            vertices |= pending.vertices
            restart_at = max(restart_at, pending.restart_at)
        timer = self._start_timer("restart", restart_at)
        self._pending_restart = _PendingRestart(vertices, restart_at, timer)
        self._cancel_vertices(sorted(vertices, key=_vertex_order), now, f"restarting after failure of {failed[0].name}")
        self._invalidate_partitions(vertices)

    def _fail_globally(self, failure: FailureInfo, now: float, handling: FailureHandling) -> None:
        if not handling.restart:
            self.failure = _suppressed(failure, handling.suppressed_by, handling.gave_up)
        self._global_failure = _GlobalFailure(failure, handling.restart, now + handling.delay_s, handling.suppressed_by)
        self._pending_restart = None
        self._job_transition(J.FAILING, now, str(failure))
        self._cancel_everything(now, f"job failing: {failure}")
        self._check_progress(now)

    def _maybe_restart_regions(self, now: float) -> None:
        pending = self._pending_restart
        if pending is None or now < pending.restart_at:
            return
        if any(not ev.state.is_terminal and ev.state is not E.CREATED for ev in pending.vertices):
            return
        self._pending_restart = None
        if self.status not in SCHEDULING_JOB_STATUSES:
            return
        self.num_restarts += 1
        self._reset_all([ev for ev in sorted(pending.vertices, key=_vertex_order) if ev.state is not E.CREATED], now)
        regions = [self.regions.region_of(ev) for ev in pending.vertices]
        self._schedule_regions(self.strategy.regions_to_restart(regions), now)

    def _restart_globally(self, now: float) -> None:
        self._global_failure = None
        self.num_restarts += 1
        self._job_transition(J.CREATED, now, "restarted")
        self._scheduled_regions.clear()
        vertices = self.graph.execution_vertices()
        self._reset_all(vertices, now)
        self._invalidate_partitions(vertices)
        self._schedule_regions(self.strategy.initial_regions(), now)
        # kept slots the first regions did not take go back: the next ones ask when they are ready
        usage, waiting, index = self._usage, self._batches, self._batches_with_group
        for group in [g for g in self._slot_of
                      if not usage.get(g) and not any(b in waiting for b in index.get(g, ()))]:
            self._free_group_slot(group, "not needed by the restarted job yet", now)

    def _reset_all(self, vertices: list[ExecutionVertex], now: float) -> None:
        """A new attempt for each of `vertices` (their current ones all ended), in order."""
        counts: dict[ExecutionState, int] = {}
        for ev in vertices:
            state = ev.current_execution.state
            counts[state] = counts.get(state, 0) + 1
        new_attempts(vertices, now)
        for ev in vertices:
            for partition in ev.produced_partitions:  # the attempt consumers wait for changed
                for group in partition.consumed_partition_groups:
                    group.version += 1
        state_counts = self.state_counts
        for state, n in counts.items():
            state_counts[state] -= n
        state_counts[E.CREATED] = state_counts.get(E.CREATED, 0) + len(vertices)
        self._non_terminal += len(vertices)
        self._finished -= counts.get(E.FINISHED, 0)

    def _invalidate_partitions(self, vertices: Iterable[ExecutionVertex]) -> None:
        by_tm: dict[str, list[PartitionRef]] = {}
        for ev in vertices:
            for partition in ev.produced_partitions:
                loc = partition.location
                if loc is not None:
                    self.graph.mark_partition_unavailable(partition)
                    if loc.task_manager_id:
                        by_tm.setdefault(loc.task_manager_id, []).append(
                            PartitionRef(partition.result.id, partition.partition_index, loc.producer_attempt))
        for tm, refs in sorted(by_tm.items()):
            self._out.append(ReleasePartitions(tm, tuple(refs)))

    def _partition_still_needed(self, partition: IntermediateResultPartition, memo: dict[int, bool]) -> bool:
        """Some consumer has yet to read it: it did not finish, or it will run again (pending
        restart). Memoised per consumer group, so an ALL_TO_ALL result costs O(P), not O(P²)."""
        pending = self._pending_restart.vertices if self._pending_restart is not None else ()
        for group in partition.consumer_vertex_groups:
            needed = memo.get(id(group))
            if needed is None:
                needed = memo[id(group)] = any(
                    consumer.state is not E.FINISHED or consumer in pending for consumer in group.vertices)
            if needed:
                return True
        return False

    def _record_exception(self, entry: ExceptionHistoryEntry) -> None:
        history = self.exception_history
        history.append(entry)
        if len(history) > EXCEPTION_HISTORY_SIZE:
            del history[0]

    # ------------------------------------------------------------------ timers

    def _start_timer(self, kind: str, at: float) -> Timer:
        self._timer_seq += 1
        timer = self._timers[kind] = Timer(kind, self._timer_seq)
        self._out.append(StartTimer(timer, at))
        return timer

    def _cancellation_timed_out(self, now: float) -> None:
        """Executions still CANCELING after the cancellation timeout: the job cannot wait for
        them forever. A cancelled job ends FAILED (Flink: CANCELLING -> FAILED); during a
        failover they are marked FAILED, so the restart or the job's failure can go on."""
        stuck = [ev for ev in self.graph.execution_vertices() if ev.state is E.CANCELING]
        if not stuck:
            return
        names = ", ".join(ev.name for ev in stuck[:10]) + (" ..." if len(stuck) > 10 else "")
        failure = FailureInfo("CancellationTimeout",
                              f"tasks could not be cancelled within {self.cancellation_timeout_s:g} s: {names}")
        self._record_exception(ExceptionHistoryEntry(now, "", None, None, failure))
        # The executions give up first: a terminal job never has a live execution.
        for ev in stuck:
            self._transition(ev.current_execution, E.FAILED, now, str(failure), failure)
        if self.status is J.CANCELLING:
            self.failure = failure
            self._job_transition(J.FAILED, now, str(failure))
            self._terminate(now)
            return
        self._check_progress(now)

    # ------------------------------------------------------------------ cancellation

    def _cancel_everything(self, now: float, cause: str) -> None:
        for request_id in list(self._requests):
            self._out.append(CancelSlotRequest(request_id))
        self._requests.clear()
        self._requested.clear()
        self._batches.clear()
        self._batches_with_group.clear()
        self._cancel_vertices(self.graph.execution_vertices(), now, cause)

    def _cancel_vertices(self, vertices: list[ExecutionVertex], now: float, cause: str) -> None:
        out, stimulus = self._out.append, self._stimulus
        cancel_created = self.status in (J.CANCELLING, J.FAILING, J.SUSPENDED)

        def cancel_task(ex: Execution) -> None:
            slot = ex.slot
            out(_new_tuple(CancelTask, (slot.task_manager_id if slot is not None else "", ex.attempt_id, stimulus)))

        deployed: list[Execution] = []  # a run of deployed ones, cancelled in bulk (in order)
        canceling = False
        for ev in vertices:
            ex = ev.current_execution
            state = ex.machine.state
            if state in _DEPLOYED:
                deployed.append(ex)
                canceling = True
                continue
            if deployed:
                self._transition_all(deployed, E.CANCELING, now, cause, then=cancel_task)
                deployed = []
            if state is E.SCHEDULED or (state is E.CREATED and cancel_created):
                self._transition(ex, E.CANCELED, now, cause)
        if deployed:
            self._transition_all(deployed, E.CANCELING, now, cause, then=cancel_task)
        if canceling and not self.status.is_terminal:
            # Nothing may wait forever for a task that does not stop (Flink's task.cancellation.timeout).
            self._start_timer("cancel-timeout", now + self.cancellation_timeout_s)
        self._drop_dead_batches(now)

    def _drop_dead_batches(self, now: float) -> None:
        """Forget batches with nothing left to deploy, the slots only they held, and slot
        requests nobody waits for."""
        dead = [b for b in self._batches if not b.waiting()]
        for batch in dead:
            del self._batches[batch]
        needed = {g for b in self._batches for g in b.groups}
        if dead and not self._keeps_slots():
            usage = self._usage
            for g in dict.fromkeys(g for b in dead for g in b.groups):
                if g in self._slot_of and not usage.get(g) and g not in needed:
                    self._free_group_slot(g, "no task needs the slot any more", now)
        for request_id, asked in list(self._requests.items()):
            groups = asked.unserved()
            if not any(g in needed for g in groups):
                del self._requests[request_id]
                for g in groups:
                    self._requested.pop(g, None)
                self._out.append(CancelSlotRequest(request_id))

    def _terminate(self, now: float) -> None:
        self._timers.clear()  # outstanding timers become stale
        for group in list(self._slot_of):
            self._release_group_slot(group, f"job {self.status.value}")
        self._release_idle_slots(f"job {self.status.value}")
        for request_id in list(self._requests):
            self._out.append(CancelSlotRequest(request_id))
        self._requests.clear()
        self._requested.clear()
        self._batches.clear()
        self._batches_with_group.clear()
        self._release_garbage()
        self._out.append(JobCleanup(self.status, tuple(sorted(self._task_managers_used))))

    # ------------------------------------------------------------------ transitions

    def _transition(
        self, execution: Execution, to: ExecutionState, now: float, cause: str, failure: FailureInfo | None = None,
        keep_slot: bool = False,
    ) -> None:
        # The hot path of every schedule, deployment, report and failover (six calls per subtask
        # and attempt): what the move changes is looked up once (`_EFFECTS`), the slot-sharing
        # group only when needed.
        machine = execution.machine
        before = machine.state
        if to not in machine.table[before]:
            machine.transition(to, now, cause, self._stimulus)  # raises IllegalTransition with the story
        t = _new_tuple(Transition, (before, to, now, cause, self._stimulus))  # StateMachine.transition, inline
        machine.history.append(t)
        machine.state = to
        vertex = execution.vertex
        if vertex.current_execution is execution:
            counts = self.state_counts
            counts[before] -= 1
            counts[to] = counts.get(to, 0) + 1
        if failure is not None:
            execution.failure = failure
        slot = execution.slot
        tm = slot.task_manager_id if slot is not None else None
        deployed, live, terminal, finished, garbage = _EFFECTS[before, to]
        if deployed and tm and vertex.consumed_partition_groups:
            self.deployments.consumer_moved(execution, tm, deployed)
        group = None
        if live:
            group = self.plan.by_job_vertex[vertex.job_vertex.id][vertex.subtask_index]
            usage = self._usage
            usage[group] = usage.get(group, 0) + live
        if terminal:
            self._non_terminal -= 1
            if finished:
                self._finished += 1
        # tuple.__new__: the named tuple's own constructor is a Python function, a third of the cost
        self._out.append(_new_tuple(ExecutionStateChanged, (
            execution.attempt_id, vertex.name, t, tm, execution.failure if to is E.FAILED else None)))
        if garbage and tm and vertex.produced_partitions:
            # whatever this attempt wrote is garbage: nobody will ever be told to read it (one
            # ReleasePartitions per TaskManager and event, at its end: `_release_garbage`)
            number = execution.attempt_number
            refs = self._garbage.get(tm)
            if refs is None:
                refs = self._garbage[tm] = []
            refs += [PartitionRef(p.result.id, p.partition_index, number) for p in vertex.produced_partitions]
        if live < 0 and self._usage[group] == 0 and group in self._slot_of and not keep_slot and not self._keeps_slots():
            self._free_group_slot(group, f"{vertex.name} {to.value}", now)

    def _transition_all(self, executions: Iterable[Execution], to: ExecutionState, now: float, cause: str,
                        then: Callable[[Execution], None] | None = None) -> None:
        """`_transition(ex, to, now, cause)` of each of `executions` (current attempts) in
        order, then `then(ex)`: what scheduling a region or cancelling a job does to thousands at
        once. Those leaving the same state share one transition record and its effects, looked
        up once; the state counts change once. A move that ends an execution goes through
        `_transition` (it may release partitions and the slot)."""
        shared: dict[ExecutionState, tuple[Transition, int, int, bool]] = {}
        left: dict[ExecutionState, int] = {}
        out = self._out.append
        by_vertex = self.plan.by_job_vertex
        usage = self._usage
        moved = self.deployments.consumer_moved
        stimulus = self._stimulus
        try:
            for ex in executions:
                machine = ex.machine
                before = machine.state
                move = shared.get(before)
                if move is None:
                    deployed, live, terminal, _, _ = _EFFECTS[before, to]
                    move = shared[before] = (_new_tuple(Transition, (before, to, now, cause, stimulus)), deployed, live,
                                             terminal)
                t, deployed, live, terminal = move
                if terminal:
                    self._transition(ex, to, now, cause)
                else:
                    if to not in machine.table[before]:
                        machine.transition(to, now, cause, stimulus)  # raises IllegalTransition with the story
                    machine.history.append(t)
                    machine.state = to
                    left[before] = left.get(before, 0) + 1
                    slot = ex.slot
                    tm = slot.task_manager_id if slot is not None else None
                    if deployed and tm and ex.vertex.consumed_partition_groups:
                        moved(ex, tm, deployed)
                    if live:
                        vertex = ex.vertex
                        group = by_vertex[vertex.job_vertex.id][vertex.subtask_index]
                        usage[group] = usage.get(group, 0) + live
                    out(_new_tuple(ExecutionStateChanged, (ex.attempt_id, ex.vertex.name, t, tm, None)))
                if then is not None:
                    then(ex)
        finally:
            counts = self.state_counts
            for before, n in left.items():
                counts[before] -= n
                counts[to] = counts.get(to, 0) + n

    def _keeps_slots(self) -> bool:
        """A global failover that will restart keeps the job's slots, as Flink's slot pool keeps
        them for the job: the restart deploys into them at once, without asking again."""
        gf = self._global_failure
        return gf is not None and gf.restart

    def _free_if_unused(self, vertex: ExecutionVertex, now: float) -> None:
        group = self.plan.group_of(vertex)
        if not self._usage.get(group) and group in self._slot_of and not self._keeps_slots():
            self._free_group_slot(group, f"{vertex.name} {vertex.state.value}", now)

    def _free_group_slot(self, group: ExecutionSlotSharingGroup, cause: str, now: float) -> None:
        """No task of `group` runs in its slot any more. The slot stays the job's, idle, for the
        groups scheduled next (Flink's slot pool: a batch job's consumers take the slots of the
        producers that finished before them), unless the job waits for slots (the SlotManager
        serves the waiting requests in their order) or schedules nothing any more."""
        if self._requests or self.status not in SCHEDULING_JOB_STATUSES or self.slot_idle_timeout_s <= 0:
            self._release_group_slot(group, cause)
            return
        if not self._idle:
            self._start_timer("slot-idle", now + self.slot_idle_timeout_s)
        self._idle.append(self._slot_of.pop(group))

    def _release_idle_slots(self, cause: str) -> None:
        while self._idle:
            self._out.append(ReleaseSlot(self._idle.popleft(), cause))

    def _release_group_slot(self, group: ExecutionSlotSharingGroup, cause: str) -> None:
        slot = self._slot_of.pop(group)
        self._out.append(ReleaseSlot(slot, cause))

    def _job_transition(self, to: JobStatus, now: float, cause: str) -> None:
        t = self.graph.status_machine.transition(to, now, cause, self._stimulus)
        self._out.append(JobStatusChanged(t))

    def add_batch_io(self, attempt: ExecutionAttemptId, io: TaskIo) -> None:
        """A streaming task's micro-batch read and wrote `io`: added to what its attempt did
        so far (a task that is not current any more is not counted)."""
        execution = self._current(attempt)
        if execution is None or execution.state.is_terminal:
            return
        before = execution.io or TaskIo()
        execution.io = TaskIo(before.records_in + io.records_in, before.records_out + io.records_out,
                              before.bytes_in + io.bytes_in, before.bytes_out + io.bytes_out,
                              before.seconds + io.seconds, operators=add_operator_io(before.operators, io.operators))

    def _current(self, attempt: ExecutionAttemptId) -> Execution | None:
        ejv = self.graph.vertices.get(attempt.vertex_id)
        if ejv is None:
            return None
        vertices, index = ejv.task_vertices, attempt.subtask_index
        if not 0 <= index < len(vertices):
            return None
        ex = vertices[index].current_execution
        return ex if ex.attempt_number == attempt.attempt_number else None

    def _release_garbage(self) -> None:
        """Tell each TaskManager which partitions of ended attempts it may delete (made garbage
        by this event's transitions), in one action per TaskManager."""
        for tm, refs in self._garbage.items():
            self._out.append(ReleasePartitions(tm, tuple(refs)))
        self._garbage = {}

    def _drain(self) -> list[Action]:
        if self._garbage:
            self._release_garbage()
        out, self._out = self._out, []
        return out


def _suppressed(failure: FailureInfo, by: str, gave_up: str = "") -> FailureInfo:
    """The job's cause: the root failure, then who said no to a restart: in words (`gave_up`,
    "restart strategy fixed-delay (1 attempt) gave up after 2 failures") and as Flink says it."""
    why = f"{gave_up}; recovery is suppressed by {by}" if gave_up else f"recovery is suppressed by {by}"
    return FailureInfo(failure.exception_type, f"{failure.message}\n({why})", failure.traceback)


_region_index = operator.attrgetter("index")


def _vertex_order(ev: ExecutionVertex) -> tuple[int, int]:
    return (ev.job_vertex.topological_index, ev.subtask_index)
