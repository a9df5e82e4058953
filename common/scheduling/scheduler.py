"""The JobMaster's scheduler: one job's ExecutionGraph driven by events, returning actions.

Owns the job's bookkeeping and the mechanics of carrying out decisions: which executions are
scheduled and deployed together, moving executions and the job through the tables of `states.py`
(in one place, its base class `transitions.ExecutionTransitions`), cancelling, resetting and
restarting tasks, committing outputs, suspension. The decisions it asks for are made elsewhere,
one concern per module:

- `schedulingstrategy.py`: which regions to schedule when (eager or pipelined region);
- `slotallocator.py`: which slot each ExecutionSlotSharingGroup runs in, the job's slot pool and
  its slot requests, which deployment bulks wait for which slots;
- `failover.py`: what a failure restarts, whether and when (failover and restart strategies);
- `deploymentfactory.py`: what a deployment and a partition update say;
- `states.py`: which transitions are legal and how the job follows from its executions.

It is sans-IO, like dask's WorkerState: every public method takes an event (with `now` passed in,
and the id of the stimulus that caused it) and returns a list of actions (`actions.py`) for the
JobManager shell to carry out. Nothing here touches a socket, a thread or a clock. Every
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
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from funke.common.graph.deployment import PartitionRef, TaskReport
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
)
from funke.common.graph.jobgraph import FailoverStrategyKind
from funke.common.graph.operators import CATALOGUE
from funke.common.graph.restart import RestartBackoffTimeStrategy
from funke.common.graph.streamingjob import is_streaming_query
from funke.common.scheduling.actions import (
    Action,
    CancelSlotRequest,
    CancelTask,
    CommitOutputs,
    DeployTask,
    ExecutionStateChanged,
    FinishedSubtask,
    JobCleanup,
    JobStatusChanged,
    ReleasePartitions,
    ReleaseSlot,
    RequestSlots,
    SinkCommit,
    StartTimer,
    Timer,
    UpdatePartitionInfo,
)
from funke.common.scheduling.deploymentfactory import TaskDeploymentFactory
from funke.common.scheduling.failover import (
    EXCEPTION_HISTORY_SIZE,
    ExceptionHistoryEntry,
    ExecutionFailureHandler,
    FailureHandling,
    vertices_of,
)
from funke.common.scheduling.regions import PipelinedRegion, compute_pipelined_regions
from funke.common.scheduling.schedulingstrategy import scheduling_strategy
from funke.common.scheduling.slotallocator import DeploymentBulk, ExecutionSlotAllocator
from funke.common.scheduling.slotsharing import build_slot_sharing_plan
from funke.common.scheduling.transitions import ExecutionTransitions
from funke.common.states import (
    DEPLOYED_EXECUTION_STATES,
    EXECUTION_STATE_TRANSITIONS,
    JOB_STATUS_WHEN_EXECUTIONS_END,
    SCHEDULING_JOB_STATUSES,
    ExecutionsOutcome,
    ExecutionState,
    JobStatus,
    is_legal_path,
    resolve_report,
)

# The actions are re-exported: the JobMaster, the HA store and the tests name them `scheduler.X`.
__all__ = [
    "Action", "CancelSlotRequest", "CancelTask", "CommitOutputs", "DeployTask", "ExceptionHistoryEntry",
    "ExecutionStateChanged", "FinishedSubtask", "JobCleanup", "JobStatusChanged", "ReleasePartitions", "ReleaseSlot",
    "RequestSlots", "Scheduler", "SinkCommit", "StartTimer", "Timer", "UpdatePartitionInfo",
]

E = ExecutionState
J = JobStatus
_DEPLOYED = DEPLOYED_EXECUTION_STATES
_TERMINAL = frozenset(state for state in E if state.is_terminal)
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


class Scheduler(ExecutionTransitions):
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
        execution_transitions: Mapping[ExecutionState, frozenset[ExecutionState]] = EXECUTION_STATE_TRANSITIONS,
    ):
        self.graph = graph
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
        self.cancellation_timeout_s = cancellation_timeout_s
        self.slots = ExecutionSlotAllocator(self.plan, request_timeout_s=slot_request_timeout_s,
                                            idle_timeout_s=slot_idle_timeout_s)
        self.strategy = scheduling_strategy(graph.job_graph.job_type, self.regions)
        self.failures = ExecutionFailureHandler(failover_strategy, restart_strategy, self.regions)
        self.deployments = TaskDeploymentFactory(graph, streaming=self.streaming)
        self._init_transitions(execution_transitions)
        self.exception_history: list[ExceptionHistoryEntry] = []
        self.failure: FailureInfo | None = None  # why the job FAILED
        self.num_restarts = 0  # failovers carried out (regions or the whole job restarted: Flink's numRestarts)

        self._scheduled_regions: set[PipelinedRegion] = set()
        self._pending_restart: _PendingRestart | None = None
        self._global_failure: _GlobalFailure | None = None
        self._timer_seq = 0
        self._timers: dict[str, Timer] = {}  # the one live timer of each kind
        self._committing = False
        self._restoring = False  # taking finished subtasks over: start() schedules what they unblock
        self._stimuli = itertools.count(1)
        self._stimulus = ""  # the id of the event being handled
        self._out: list[Action] = []

    # ------------------------------------------------------------------ public view

    @property
    def committing(self) -> bool:
        return self._committing

    def validate_state(self) -> None:
        """Check the scheduler's books against the ExecutionGraph; AssertionError naming the first
        disagreement. O(tasks): for tests and fuzzing, not for every event in production."""
        vertices = self.graph.execution_vertices()
        self._validate_counts(vertices)
        if self.status.is_terminal:
            alive = [repr(ev.current_execution) for ev in vertices if not ev.state.is_terminal]
            assert not alive, f"the job is {self.status.value} but executions are not terminal: {alive[:10]}"
        self.slots.validate(vertices, terminal=self.status.is_terminal, idle_timer="slot-idle" in self._timers)
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
        if not steps or path[-1] is not E.FINISHED or not is_legal_path(self.execution_transitions, path):
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
        slots = self.slots
        served = slots.allocated(allocations, accept=self.status in SCHEDULING_JOB_STATUSES, out=self._out)
        if served:
            self._deploy_ready(slots.bulks_needing(served), now)
            # groups whose vertices were cancelled while the request was pending
            slots.release_unused(served, "no task needs the slot any more", self._out)

    @_event
    def on_slot_request_failed(self, request_id: int, message: str, now: float) -> list[Action]:
        starved = self.slots.request_failed(request_id)
        if starved is None:
            return []
        failure = FailureInfo("NoResourceAvailableException", message)
        failed = []
        for bulk in starved:
            for ex in bulk.waiting():
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
        state = execution.state
        if state in _TERMINAL:
            return
        target = resolve_report(state, reported)
        if target is state or target not in self.execution_transitions[state]:
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
        self.slots.task_manager_lost(task_manager_id)
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
            self.slots.release_idle(f"idle for {self.slots.idle_timeout_s:g} s", self._out)
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
        """Schedule `regions` (those not scheduled yet): one deployment bulk per region, or one for
        all of them if the strategy schedules in one bulk; each bulk asks for the slots its
        groups lack and is deployed once they all have one."""
        regions = [r for r in regions if r not in self._scheduled_regions]
        if not regions:
            return
        regions.sort(key=_region_index)
        one_bulk = self.strategy.one_bulk
        bulks: list[list[ExecutionVertex]] = []
        merged = False  # a region's vertices are in _vertex_order already; several regions' are not
        for region in regions:
            self._scheduled_regions.add(region)
            vertices = [ev for ev in region.vertices if ev.current_execution.machine.state is E.CREATED]
            if not vertices:
                continue
            if one_bulk and bulks:
                bulks[0].extend(vertices)
                merged = True
            else:
                bulks.append(vertices)
        if merged:
            bulks[0].sort(key=_vertex_order)
        direct = self.status in SCHEDULING_JOB_STATUSES
        self._transition_all([ev.current_execution for vertices in bulks for ev in vertices], E.SCHEDULED, now,
                             "scheduled")
        ready, new_bulks = self.slots.schedule(bulks, deploy_now=direct, independent_requests=not one_bulk,
                                               out=self._out)
        if ready:
            self._deploy_all(ready, now)
        self._deploy_ready(new_bulks, now)

    def _request_missing_slots(self, now: float) -> None:
        """Waiting bulks whose groups have neither a slot nor a pending request (their slot was
        on a TaskManager that is gone) take idle slots, else ask again."""
        slots = self.slots
        missing = slots.missing_groups()
        if slots.idle and missing:
            slots.take_idle(missing)
            self._deploy_ready(slots.bulks_needing(missing), now)
            missing = [g for g in missing if g not in slots.slot_of]
        if missing:
            slots.request(missing, self._out)

    def _deploy_ready(self, bulks: Iterable[DeploymentBulk], now: float) -> None:
        """Deploy those of `bulks` whose groups all hold slots now (while the job schedules)."""
        if self.status not in SCHEDULING_JOB_STATUSES:
            return
        ready = self.slots.take_ready(bulks)
        if ready:
            self._deploy_all(ready, now)

    def _deploy_all(self, executions: list[Execution], now: float) -> None:
        """Deploy `executions` (current, SCHEDULED, their groups hold slots), in order: each
        moves to DEPLOYING in its group's slot and gets its deployment."""
        if self.status is J.CREATED:
            self._job_transition(J.RUNNING, now, "tasks deploying")
        self._transition_all(executions, E.DEPLOYING, now, "", deploy=True)

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
        for group in self.slots.unused_groups():
            self._free_group_slot(group, "not needed by the restarted job yet", now)

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
        self.slots.cancel_requests(self._out)
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
        # bulks with nothing left to deploy are forgotten, the slots only they held freed, the
        # slot requests nobody waits for cancelled
        free = None if self._keeps_slots() else (
            lambda group: self._free_group_slot(group, "no task needs the slot any more", now))
        self.slots.drop_dead_bulks(free, self._out)

    def _terminate(self, now: float) -> None:
        self._timers.clear()  # outstanding timers become stale
        self.slots.release_all(f"job {self.status.value}", self._out)
        self._release_garbage()
        self._out.append(JobCleanup(self.status, tuple(sorted(self._task_managers_used))))

    def _keeps_slots(self) -> bool:
        """A global failover that will restart keeps the job's slots, as Flink's slot pool keeps
        them for the job: the restart deploys into them at once, without asking again."""
        gf = self._global_failure
        return gf is not None and gf.restart

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
