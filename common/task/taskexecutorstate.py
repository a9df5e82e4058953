"""The TaskManager's core: its task slots, the tasks deployed into them, the partitions it knows
are available, and every decision the TaskManager makes about them.

Sans-IO, like the JobManager's scheduler and dask's WorkerState: `handle(event)` takes one event
and returns the instructions the asyncio/gRPC shell (`taskmanager/taskexecutor.py`) carries out.
Nothing here touches a socket, a thread, Spark, a file or a clock; it works on the typed deployment
contract (`graph/deployment.py`), never on protobuf.

The events it takes and the instructions it gives are `taskexecutorevents.py`'s (imported
here: `taskexecutorstate.SubmitTask` and `taskexecutorevents.SubmitTask` are one class).

Every task's state goes through the ExecutionState table of `states.py`, starting at DEPLOYING
when the deployment is accepted; a stop the JobManager asked for moves it to CANCELING, and what
the task then reports is resolved by `TASK_REPORT_RESOLUTION` (cancel wins). Each transition
records the stimulus id of the event that caused it, and reports carry it to the JobManager.

A streaming query's task (`TaskDeployment.streaming`) is long-lived: it waits for no input at
deployment; the JobManager names what each micro-batch reads (RunBatch), the task reports each
batch done while it stays RUNNING (a report with `batch_id`), and FinishTasks ends it FINISHED.

A chain made only of no-op kinds needs neither Spark nor a thread: the core runs it itself
(INITIALIZING, RUNNING, then FINISHED as soon as its inputs are complete).

Registrations: every event from the JobManager names the registration it was sent to. When the
JobManager is lost every task is forgotten and the registration is over; until the TaskManager
registered again, and for any other registration than the current one, such events are refused
or ignored (a bulk SubmitTasks worked through while the TaskManager registers again, a call that
was in flight when the link broke). An event that names no registration comes from a JobManager
that does not say: it counts as current. Reports carry the generation (the count of
registrations lost) they were made in, so the shell drops those of a registration that is over.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from funke.common import ids, layout
from funke.common.graph.deployment import ProducedPartition, TaskDeployment, TaskReport
from funke.common.graph.executiongraph import FailureInfo, TaskIo
from funke.common.task.taskexecutorevents import (
    BatchRejected,
    BatchReported,
    CancelTask,
    DeletePartitions,
    DropJob,
    Event,
    FinishTask,
    FinishTasks,
    FreeSlots,
    GiveBatch,
    InputsReady,
    Instruction,
    InterruptTask,
    JobManagerLost,
    JobManagerRegistered,
    LimitRate,
    PartitionsAvailable,
    RegisterAgain,
    ReleasePartitions,
    ReportsDelivered,
    ReportsRefused,
    RunBatch,
    SendReport,
    SetRateLimits,
    ShutdownRequested,
    SlotView,
    StartTask,
    StartTimer,
    SubmitTask,
    TaskAccepted,
    TaskKey,
    TaskRejected,
    TaskReported,
    TaskThreadExited,
    Timer,
    TimerFired,
)
from funke.common.task.inputgates import GateSnapshot, InputGate, PartitionAvailability
from funke.common.graph.operators import NOOP_KINDS
from funke.common.states import (
    DEPLOYED_EXECUTION_STATES,
    EXECUTION_STATE_TRANSITIONS,
    ExecutionState,
    StateMachine,
    StopRequest,
    resolve_task_report,
)

E = ExecutionState

# A task thread that returns without a terminal report may still have one on its way from a
# thread that was cancelling it; wait this long before calling it a failure.
MISSING_TERMINAL_GRACE_S = 1.0
# Attempts cancelled before their SubmitTasks arrived; bounded so a long-lived TaskManager
# does not grow without end (such races involve only the most recent cancellations).
EARLY_CANCELS_MAX = 10_000
VALID_IDS_KEPT = 4_096  # ids (job, vertex, data set) already found valid, before the memo starts over
# Batches a RunBatches may release at once (the JobManager names the few that went through since
# its last batch here), and the highest batch id taken for one.
MAX_RELEASED_BATCHES = 1_000
MAX_BATCH_ID = 2**63 - 1


# ---------------------------------------------------------------------------------- the core


@dataclass(slots=True)
class _Slot:
    index: int
    job_id: str | None = None  # None: free
    tasks: dict[TaskKey, None] = field(default_factory=dict)  # insertion-ordered set
    version: int = 0  # the core's slot_version when this slot last changed


@dataclass(eq=False, slots=True)
class _Task:
    key: TaskKey
    deployment: TaskDeployment
    machine: StateMachine[ExecutionState]
    noop: bool  # run by the core itself, no thread
    gates: list[InputGate] = field(default_factory=list)
    pending_inputs: int = 0
    stop: StopRequest = StopRequest.NONE
    stop_cause: str = ""
    stop_failure: str = "TaskManagerShutdown"  # the failure a stop of the TaskManager's own reports
    inputs_given: bool = False

    @property
    def state(self) -> ExecutionState:
        return self.machine.state

    @property
    def terminal(self) -> bool:
        return self.machine.state.is_terminal

    @property
    def name(self) -> str:
        return f"{self.deployment.task_name or self.key.attempt} attempt #{self.key.attempt.attempt_number}"


class TaskExecutorState:
    """One TaskManager's decisions. See the module docstring."""

    def __init__(self, task_manager_id: str, number_of_slots: int, *, spark: bool = True, data_dir: str = ""):
        if number_of_slots < 1:
            raise ValueError(f"a TaskManager needs at least one slot, not {number_of_slots}")
        self.task_manager_id = task_manager_id
        self.spark = spark
        self.data_dir = data_dir  # used for a job that named none (release of unknown jobs)
        self.generation = 0  # how many registrations were lost
        self.registration_id: str | None = None  # None: not registered (any more)
        self.stopping = False
        self.slots = [_Slot(i) for i in range(number_of_slots)]
        self.slot_version = 0  # bumped on every change of the slot report
        self.tasks: dict[TaskKey, _Task] = {}
        self.partitions = PartitionAvailability()
        self._held: dict[str, int] = {}  # job -> how many slots it holds
        self._early_cancels: collections.OrderedDict[TaskKey, None] = collections.OrderedDict()
        self._valid_ids: set[str] = set()
        # Partitions this TaskManager wrote, per job: (data dir, data set, index, producer attempt).
        self._produced: dict[str, set[tuple[str, str, int, int]]] = {}
        self._job_data_dirs: dict[str, str] = {}
        self._timer_seq = 0
        self._timers: dict[TaskKey, Timer] = {}
        self._exit_errors: dict[TaskKey, FailureInfo] = {}  # a thread's own error, until its timer fires
        self._stimulus = ""
        self._now = 0.0
        self._out: list[Instruction] = []

    # ------------------------------------------------------------------ the entry point

    def handle(self, event: Event, now: float = 0.0) -> list[Instruction]:
        """Apply one event (at time `now`, as the shell's clock reads it) and return what to do."""
        self._out = []
        self._now = now
        self._stimulus = event.stimulus_id or f"{self.task_manager_id}:{type(event).__name__}"
        try:
            _HANDLERS[type(event)](self, event)
        except BaseException:
            self._out = []
            raise
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ views

    def holds_slots(self, job_id: str) -> bool:
        return self._held.get(job_id, 0) > 0

    def slot_report(self) -> list[SlotView]:
        return [SlotView(s.index, s.job_id, tuple(k.attempt for k in s.tasks)) for s in self.slots]

    def slots_changed(self, since: int) -> list[SlotView]:
        """The slots that changed after `slot_version` was `since`: a heartbeat's slot report is
        kept up to date by rewriting those alone (a TaskManager may have thousands of slots)."""
        return [SlotView(s.index, s.job_id, tuple(k.attempt for k in s.tasks)) for s in self.slots if s.version > since]

    def live_tasks(self) -> int:
        return sum(1 for t in self.tasks.values() if not t.terminal)

    def validate_state(self) -> None:
        """Check the slot table, the tasks and the gates against each other; AssertionError
        naming the first disagreement. For tests and fuzzing."""
        held: dict[str, int] = {}
        in_slots: dict[TaskKey, int] = {}
        for slot in self.slots:
            assert slot.version <= self.slot_version, f"slot {slot.index} changed after the slot table did"
            if slot.job_id is None:
                assert not slot.tasks, f"free slot {slot.index} runs {sorted(map(str, slot.tasks))}"
                continue
            held[slot.job_id] = held.get(slot.job_id, 0) + 1
            for key in slot.tasks:
                assert key.job_id == slot.job_id, f"slot {slot.index} of job {slot.job_id} runs {key}"
                assert key not in in_slots, f"{key} is in slots {in_slots[key]} and {slot.index}"
                in_slots[key] = slot.index
        assert held == self._held, f"slots held per job {held}, the books say {self._held}"
        for key, task in self.tasks.items():
            assert task.key == key
            if task.terminal:
                assert key not in in_slots, f"{key} ended {task.state.value} but still sits in slot {in_slots[key]}"
                assert key not in self._timers, f"{key} ended but a timer waits for it"
            else:
                # A task being stopped may have lost its slot already (FreeSlot); any other runs in it.
                assert in_slots.get(key) in ((task.deployment.slot.slot_index,) if task.stop is StopRequest.NONE
                                             else (task.deployment.slot.slot_index, None)), (
                    f"{key} ({task.state.value}) runs in slot {task.deployment.slot.slot_index}, the table says "
                    f"{in_slots.get(key)}")
                waiting = sum(1 for g in task.gates if not g.complete)
                assert task.pending_inputs == waiting, f"{key}: {task.pending_inputs} pending, {waiting} gates wait"
                if task.stop is not StopRequest.NONE:
                    assert task.state is E.CANCELING, f"{key} was asked to stop but is {task.state.value}"
                if task.noop and task.deployment.streaming:  # the core runs its batches until told to finish
                    assert task.state is E.RUNNING, f"streaming no-op {key} is {task.state.value}"
                elif task.noop:  # the core runs it: alive only while it waits for inputs
                    assert task.state is E.RUNNING and task.pending_inputs > 0, (
                        f"no-op {key} is {task.state.value} with {task.pending_inputs} inputs pending")
                if task.inputs_given:
                    assert task.pending_inputs == 0, f"{key} was given its inputs with {task.pending_inputs} pending"
        assert set(in_slots) <= set(self.tasks), f"slots run unknown tasks {sorted(map(str, set(in_slots) - set(self.tasks)))}"
        for key in self._early_cancels:
            assert key not in self.tasks, f"{key} is deployed and remembered as cancelled before deployment"
        assert len(self._early_cancels) <= EARLY_CANCELS_MAX

    # ------------------------------------------------------------------ deployment

    def _on_submit(self, e: SubmitTask) -> None:
        d = e.deployment
        key = TaskKey(d.job_id, d.attempt)
        reason = self._why_not_deployable(key, d, e.registration_id)
        if reason is not None:
            self._out.append(TaskRejected(key, reason))
            return
        noop = all(op.kind in NOOP_KINDS for op in d.vertex.operators)
        if not self.spark and not noop:
            kinds = ", ".join(op.kind for op in d.vertex.operators)
            self._out.append(TaskRejected(key, (
                f"TaskManager {self.task_manager_id} runs without Spark (--no-spark) and can only run chains of "
                f"{', '.join(sorted(NOOP_KINDS))}; this chain is {kinds or '(empty)'}")))
            return
        task = _Task(key, d, StateMachine(f"task {d.task_name or key.attempt} of job {d.job_id}",
                                          EXECUTION_STATE_TRANSITIONS, E.DEPLOYING, self._now), noop)
        try:
            # A streaming task's inputs are named batch by batch (RunBatch), not awaited now.
            for gate in sorted(d.inputs, key=lambda g: g.input_index) if not d.streaming else ():
                opened, waits = self.partitions.open_gate(d.job_id, gate, lambda t=task: self._gate_complete(t))
                task.gates.append(opened)
                task.pending_inputs += waits
        except (ValueError, TypeError) as exc:
            self.partitions.close(task.gates)
            self._out.append(TaskRejected(key, f"could not create the task: {type(exc).__name__}: {exc}"))
            return
        self._job_data_dirs[d.job_id] = d.data_dir
        if d.attempt.attempt_number > 0:
            # A new attempt of a producer: the JobManager reset its partitions, so what an older
            # attempt announced must not satisfy a consumer deployed from now on.
            for out in d.outputs:
                self.partitions.supersede(d.job_id, out.data_set_id, out.partition_index, d.attempt.attempt_number)
        self.tasks[key] = task
        self._slot_add(d.slot.slot_index, key)
        self._out.append(TaskAccepted(key))
        if noop:
            self._report(task, E.INITIALIZING)
            self._report(task, E.RUNNING)
            if task.pending_inputs == 0 and not d.streaming:
                self._finish_noop(task)
        else:
            self._out.append(StartTask(key, d))
            if task.pending_inputs == 0 and not d.streaming:
                self._give_inputs(task)

    def _id_problem(self, value: str, what: str, max_length: int = ids.MAX_PATH_ID_LENGTH) -> str | None:
        """`ids.path_id_problem`, remembering (a bounded number of) ids found valid: every
        deployment of a job names the same few."""
        if value in self._valid_ids and len(value) <= max_length:
            return None
        problem = ids.path_id_problem(value, what, max_length)
        if problem is None:
            if len(self._valid_ids) >= VALID_IDS_KEPT:
                self._valid_ids.clear()
            self._valid_ids.add(value)
        return problem

    def _current(self, registration_id: str) -> bool:
        """Whether an event from the JobManager belongs to the current registration."""
        return not registration_id or registration_id == self.registration_id

    def _why_not_deployable(self, key: TaskKey, d: TaskDeployment, registration_id: str) -> str | None:
        if not self._current(registration_id):
            return (f"TaskManager {self.task_manager_id} lost the JobManager since it was sent (it was for "
                    f"registration {registration_id}, which is over)")
        if self.stopping:
            return f"TaskManager {self.task_manager_id} is shutting down"
        if not d.job_id:
            return "the task deployment has no job id"
        problem = (self._id_problem(d.job_id, "job id", ids.MAX_JOB_ID_LENGTH)
                   or self._id_problem(d.attempt.vertex_id, "vertex id")
                   or next((p for g in d.inputs if (p := self._id_problem(g.data_set_id, "data set id"))), None)
                   or next((p for o in d.outputs if (p := self._id_problem(o.data_set_id, "data set id"))), None))
        if problem is not None:
            return problem
        if d.attempt.subtask_index < 0 or d.attempt.attempt_number < 0:
            return "negative subtask index or attempt number"
        if key in self.tasks:
            return f"task {key} is already deployed on TaskManager {self.task_manager_id}"
        if key in self._early_cancels:
            del self._early_cancels[key]
            return f"task {key} was cancelled before it was deployed"
        index = d.slot.slot_index
        if not 0 <= index < len(self.slots):
            return (f"slot index {index} is out of range: this TaskManager has {len(self.slots)} "
                    f"slot(s) (0..{len(self.slots) - 1})")
        holder = self.slots[index].job_id
        if holder is not None and holder != d.job_id:
            return f"slot {index} is held by job {holder}"
        return None

    # ------------------------------------------------------------------ inputs

    def _gate_complete(self, task: _Task) -> None:
        task.pending_inputs -= 1
        if task.pending_inputs or task.terminal or task.state is E.CANCELING:
            return
        if task.noop:
            self._finish_noop(task)
        else:
            self._give_inputs(task)

    def _snapshots(self, task: _Task) -> tuple[GateSnapshot, ...] | None:
        """What the task reads; None (and the task failed) if a partition its gates counted was
        released before they all completed."""
        snapshots = tuple(self.partitions.snapshot(task.key.job_id, g) for g in task.gates)
        lost = [(s.data_set_id, p) for s in snapshots for p in s.unavailable]
        if lost:
            self._report(task, E.FAILED, FailureInfo(
                "PartitionUnavailable", f"partition(s) {lost[:10]} of job {task.key.job_id} became unavailable "
                                        "before they were read"))
            return None
        return snapshots

    def _give_inputs(self, task: _Task) -> None:
        snapshots = self._snapshots(task)
        if snapshots is not None:
            task.inputs_given = True
            self._out.append(InputsReady(task.key, snapshots))

    def _finish_noop(self, task: _Task) -> None:
        if self._snapshots(task) is None:
            return
        self._report(task, E.FINISHED, produced=tuple(
            ProducedPartition(o.data_set_id, o.partition_index, "") for o in task.deployment.outputs))

    def _on_partitions_available(self, e: PartitionsAvailable) -> None:
        if not self._current(e.registration_id):
            return  # the JobManager that sent it is no longer ours
        for callback in self.partitions.update(e.job_id, e.updates):
            callback()

    # ------------------------------------------------------------------ stopping tasks

    def _on_cancel(self, e: CancelTask) -> None:
        if not self._current(e.registration_id):
            return
        key = TaskKey(e.job_id, e.attempt)
        task = self.tasks.get(key)
        if task is None:
            # The cancel overtook the deployment (or the task is long gone): make sure a late
            # SubmitTasks does not start what the JobManager already gave up on.
            self._early_cancels[key] = None
            while len(self._early_cancels) > EARLY_CANCELS_MAX:
                self._early_cancels.popitem(last=False)
            return
        self._stop(task, StopRequest.JOBMANAGER, "cancelled by the JobManager")

    def _stop(self, task: _Task, who: StopRequest, cause: str) -> None:
        if task.terminal:
            return
        if task.stop is StopRequest.NONE or who is StopRequest.JOBMANAGER:
            task.stop, task.stop_cause = who, cause  # the JobManager's request wins: it expects CANCELED
        if task.state in DEPLOYED_EXECUTION_STATES:
            task.machine.transition(E.CANCELING, self._now, cause, self._stimulus)
        if task.noop:
            # Nothing to interrupt: a no-op task that waits for its inputs ends now.
            self._report(task, E.CANCELED)
        else:
            self._out.append(InterruptTask(task.key))

    def _on_free_slots(self, e: FreeSlots) -> None:
        if not self._current(e.registration_id):
            return  # about slots of a registration that is over: they are no longer its to free
        holders: set[str] = set()
        for index in e.slot_indexes:
            if not 0 <= index < len(self.slots):
                continue
            slot = self.slots[index]
            holder = slot.job_id
            if e.job_id and holder is not None and holder != e.job_id:
                continue  # the slot has moved on to another job since
            for key in list(slot.tasks):
                task = self.tasks.get(key)
                if task is not None:
                    self._stop(task, StopRequest.JOBMANAGER, f"its slot {index} was freed")
            self._slot_free(index)
            if holder is not None:
                holders.add(holder)
        for job_id in sorted(holders):
            if not self.holds_slots(job_id):
                self._drop_job(job_id)

    def _drop_job(self, job_id: str) -> None:
        """The job holds no slot here any more (or is over): forget what was kept for its tasks.
        Whatever it deploys here later is described from the JobManager's state of that time."""
        self.partitions.drop_job(job_id)
        self._out.append(DropJob(job_id))

    def _on_release(self, e: ReleasePartitions) -> None:
        job = e.job_id
        if not self._current(e.registration_id) or ids.job_id_problem(job) is not None:
            return
        if any(not ids.is_path_id(p.data_set_id) or p.partition_index < 0 or p.producer_attempt < 0
               for p in e.partitions):
            return
        data_dir = self._job_data_dirs.get(job, self.data_dir)
        produced = self._produced.get(job, set())
        targets = {(data_dir, p.data_set_id, p.partition_index, p.producer_attempt) for p in e.partitions}
        extra: list[str] = []
        if e.whole_job:
            targets |= produced
            self._produced.pop(job, None)
            self._job_data_dirs.pop(job, None)
            self._drop_job(job)
            marker = layout.cancel_marker(data_dir, job, "_", 0, 0)
            if marker is not None:  # the job's cancel markers, written by this TaskManager's tasks
                extra.append(marker.rpartition("/")[0])
        else:
            for p in e.partitions:
                self.partitions.release(job, p.data_set_id, p.partition_index, p.producer_attempt)
            # A ref names a partition; whichever data dir it was written under is the one to clean.
            named = {(p.data_set_id, p.partition_index, p.producer_attempt) for p in e.partitions}
            written = {t for t in produced if t[1:] in named}
            targets |= written
            produced -= written
        if targets or extra:
            self._out.append(DeletePartitions(job, frozenset(targets), tuple(extra)))

    # ------------------------------------------------------------------ what tasks tell

    # ------------------------------------------------------------------ micro-batches

    def _on_run_batch(self, e: RunBatch) -> None:
        current = self._current(e.registration_id)
        for t in e.tasks:
            key = TaskKey(e.job_id, t.attempt)
            task = self.tasks.get(key)
            reason = self._why_no_batch(task, key, current)
            gates: list[GateSnapshot] = []
            if reason is None:
                assert task is not None
                given = {g.input_index: g for g in t.gates}
                for g in sorted(task.deployment.inputs, key=lambda g: g.input_index):
                    b = given.get(g.input_index)
                    if b is None or len(b.attempts) != len(g.partitions):
                        reason = (f"batch {e.batch.batch_id} names no producer attempts for input {g.input_index} "
                                  f"({len(g.partitions)} partition(s))")
                        break
                    gates.append(GateSnapshot(g.input_index, g.data_set_id, g.partitions, g.subpartition,
                                              b.attempts, b.schema))
            if reason is not None:
                self._out.append(BatchRejected(key, reason))
            elif task.noop:
                self._batch_done(task, e.batch.batch_id, tuple(
                    ProducedPartition(o.data_set_id, o.partition_index, "") for o in task.deployment.outputs))
            else:
                self._out.append(GiveBatch(key, e.batch, tuple(gates)))
        if current and e.released:
            self._release_batches(e.job_id, e.released)

    def _release_batches(self, job_id: str, batch_ids: tuple[int, ...]) -> None:
        """Delete what this TaskManager's streaming tasks of the job wrote for batches that are
        through (a long-running query would otherwise keep every batch's partitions)."""
        wanted = sorted({b for b in batch_ids if 0 <= b < MAX_BATCH_ID})[:MAX_RELEASED_BATCHES]
        dirs = tuple(layout.batch_partition_dir(t.deployment.data_dir, job_id, o.data_set_id, o.partition_index,
                                                t.key.attempt.attempt_number, b)
                     for t in self.tasks.values() if t.key.job_id == job_id and t.deployment.streaming
                     for o in t.deployment.outputs for b in wanted)
        if dirs:
            self._out.append(DeletePartitions(job_id, frozenset(), dirs))

    def _why_no_batch(self, task: _Task | None, key: TaskKey, current: bool) -> str | None:
        if not current:
            return f"TaskManager {self.task_manager_id} lost the JobManager since the batch was sent"
        if task is None:
            return f"task {key} is not deployed on TaskManager {self.task_manager_id}"
        if not task.deployment.streaming:
            return f"task {key} is not a streaming task: it runs no micro-batches"
        if task.terminal or task.stop is not StopRequest.NONE:
            return f"task {key} is {task.state.value}{' and stopping' if task.stop is not StopRequest.NONE else ''}"
        return None

    def _on_finish_tasks(self, e: FinishTasks) -> None:
        if not self._current(e.registration_id):
            return
        for attempt in e.attempts:
            task = self.tasks.get(TaskKey(e.job_id, attempt))
            if task is None or task.terminal or not task.deployment.streaming or task.stop is not StopRequest.NONE:
                continue
            if task.noop:
                self._report(task, E.FINISHED)
            else:
                self._out.append(FinishTask(task.key))

    def _on_set_rate_limits(self, e: SetRateLimits) -> None:
        """Only for tasks of the current registration that run micro-batches and are not
        ending; a rate that is not a positive number is not passed on."""
        if not self._current(e.registration_id):
            return
        for attempt, rate in e.rates:
            task = self.tasks.get(TaskKey(e.job_id, attempt))
            if task is None or task.terminal or not task.deployment.streaming or task.stop is not StopRequest.NONE:
                continue
            if task.noop or not (rate > 0 and rate != float("inf")):
                continue
            self._out.append(LimitRate(task.key, rate))

    def _on_batch_reported(self, e: BatchReported) -> None:
        task = self.tasks.get(e.key)
        if task is not None and not task.terminal and task.stop is StopRequest.NONE:
            self._batch_done(task, e.batch_id, e.produced, e.input_rows, e.io)

    def _batch_done(self, task: _Task, batch_id: int, produced: tuple[ProducedPartition, ...],
                    input_rows: int | None = None, io: TaskIo | None = None) -> None:
        """A micro-batch done: reported with the task's state (RUNNING), the batch and its output."""
        self._out.append(SendReport(TaskReport(task.key.job_id, task.key.attempt, task.state, None, produced,
                                               self.task_manager_id, self._stimulus, batch_id, input_rows, io),
                                    self.generation))

    def _on_task_reported(self, e: TaskReported) -> None:
        task = self.tasks.get(e.key)
        if task is None or task.terminal:
            return  # forgotten (the JobManager was lost), or a report after its end
        self._report(task, e.state, e.failure, e.produced, e.io)

    def _report(self, task: _Task, state: ExecutionState, failure: FailureInfo | None = None,
                produced: tuple[ProducedPartition, ...] = (), io: TaskIo | None = None) -> None:
        """A task's state as the JobManager is to see it: resolved against a stop that was asked
        for, through the table, then reported. Progress the table does not allow (RUNNING after a
        cancel) is dropped."""
        if state.is_terminal:
            target = resolve_task_report(task.stop, state)
            if target is E.FAILED and task.stop is StopRequest.TASKMANAGER and state is not E.FAILED:
                failure = FailureInfo(task.stop_failure, task.stop_cause)
            if target is not E.FAILED:
                failure = None
            if target is not E.FINISHED:
                produced, io = (), None
        else:
            target = state
        if not task.machine.can_transition(target):
            return
        cause = str(failure) if failure is not None else ""
        task.machine.transition(target, self._now, cause, self._stimulus)
        if target.is_terminal:
            self._ended(task, target, produced)
        self._out.append(SendReport(TaskReport(task.key.job_id, task.key.attempt, target, failure, produced,
                                               self.task_manager_id, self._stimulus, io=io), self.generation))

    def _ended(self, task: _Task, state: ExecutionState, produced: tuple[ProducedPartition, ...]) -> None:
        self._slot_remove(task.deployment.slot.slot_index, task.key)
        self.partitions.close(task.gates)
        task.pending_inputs = 0
        self._timers.pop(task.key, None)
        if state is E.FINISHED:
            written = self._produced.setdefault(task.key.job_id, set())
            for p in produced:
                written.add((task.deployment.data_dir, p.data_set_id, p.partition_index,
                             task.key.attempt.attempt_number))

    def _on_thread_exited(self, e: TaskThreadExited) -> None:
        task = self.tasks.get(e.key)
        if task is None or task.terminal:
            return
        self._timer_seq += 1
        timer = self._timers[e.key] = Timer("missing-terminal", e.key, self._timer_seq)
        self._out.append(StartTimer(timer, MISSING_TERMINAL_GRACE_S))
        if e.error is not None:
            self._exit_errors[e.key] = e.error

    def _on_timer(self, e: TimerFired) -> None:
        if self._timers.get(e.timer.key) != e.timer:
            return  # the task ended meanwhile (its timer went with it)
        del self._timers[e.timer.key]
        task = self.tasks.get(e.timer.key)
        if task is None or task.terminal:
            return
        error = self._exit_errors.pop(e.timer.key, None) or FailureInfo(
            "TaskManagerError", f"task {task.name} ended without reporting FINISHED, FAILED or CANCELED")
        self._report(task, E.FAILED, error)

    def _on_delivered(self, e: ReportsDelivered) -> None:
        for report in e.reports:
            if report.state.is_terminal:
                key = TaskKey(report.job_id, report.attempt)
                task = self.tasks.get(key)
                if task is not None and task.terminal:
                    del self.tasks[key]
                    self._exit_errors.pop(key, None)

    def _on_refused(self, e: ReportsRefused) -> None:
        """Flink's TaskExecutor fails a task whose state update the JobMaster did not take, and the
        JobMaster reconciles what runs where through the slot report. So: a task whose progress
        was refused is stopped here and ends FAILED (that report goes out too); a task whose end
        was refused is over and out of its slot already, and is let go (the slot report, which no
        longer shows it, is how the JobManager learns of it)."""
        cause = f"the JobManager refused its state update ({e.reason})"
        for report in e.reports:
            key = TaskKey(report.job_id, report.attempt)
            task = self.tasks.get(key)
            if task is None:
                continue
            if task.terminal:
                if report.state.is_terminal:
                    del self.tasks[key]
                    self._exit_errors.pop(key, None)
            elif task.stop is StopRequest.NONE:
                task.stop_failure = "ReportRefused"
                self._stop(task, StopRequest.TASKMANAGER, cause)

    # ------------------------------------------------------------------ the JobManager

    def _on_registered(self, e: JobManagerRegistered) -> None:
        self.registration_id = e.registration_id
        self.data_dir = e.data_dir

    def _on_jobmanager_lost(self, e: JobManagerLost) -> None:
        """For the JobManager this TaskManager was lost: it has failed every task here. They are
        cancelled and forgotten; a new registration may come with a new JobManager whose attempts
        start over."""
        for task in self.tasks.values():
            if not task.terminal and not task.noop:
                self._out.append(InterruptTask(task.key))
            self.partitions.close(task.gates)
        self.tasks.clear()
        for slot in self.slots:
            if slot.job_id is not None:
                self._slot_free(slot.index)
        self._early_cancels.clear()
        self.partitions.clear()
        self._timers.clear()
        self._exit_errors.clear()
        self.generation += 1
        self.registration_id = None
        self._out.append(DropJob(""))
        self._out.append(RegisterAgain(e.reason))

    def _on_shutdown(self, e: ShutdownRequested) -> None:
        self.stopping = True
        for task in list(self.tasks.values()):
            self._stop(task, StopRequest.TASKMANAGER, e.cause)

    # ------------------------------------------------------------------ the slot table

    def _slot_add(self, index: int, key: TaskKey) -> None:
        slot = self.slots[index]
        if slot.job_id is None:
            self._held[key.job_id] = self._held.get(key.job_id, 0) + 1
            slot.job_id = key.job_id
        slot.tasks[key] = None
        self.slot_version += 1
        slot.version = self.slot_version

    def _slot_remove(self, index: int, key: TaskKey) -> None:
        if 0 <= index < len(self.slots) and self.slots[index].tasks.pop(key, 0) is None:
            self.slot_version += 1
            self.slots[index].version = self.slot_version

    def _slot_free(self, index: int) -> None:
        slot = self.slots[index]
        if slot.job_id is not None:
            held = self._held[slot.job_id] - 1
            if held:
                self._held[slot.job_id] = held
            else:
                del self._held[slot.job_id]
        slot.job_id = None
        slot.tasks.clear()
        self.slot_version += 1
        slot.version = self.slot_version


_HANDLERS = {
    SubmitTask: TaskExecutorState._on_submit,
    RunBatch: TaskExecutorState._on_run_batch,
    FinishTasks: TaskExecutorState._on_finish_tasks,
    SetRateLimits: TaskExecutorState._on_set_rate_limits,
    BatchReported: TaskExecutorState._on_batch_reported,
    CancelTask: TaskExecutorState._on_cancel,
    PartitionsAvailable: TaskExecutorState._on_partitions_available,
    FreeSlots: TaskExecutorState._on_free_slots,
    ReleasePartitions: TaskExecutorState._on_release,
    TaskReported: TaskExecutorState._on_task_reported,
    TaskThreadExited: TaskExecutorState._on_thread_exited,
    TimerFired: TaskExecutorState._on_timer,
    JobManagerRegistered: TaskExecutorState._on_registered,
    JobManagerLost: TaskExecutorState._on_jobmanager_lost,
    ReportsDelivered: TaskExecutorState._on_delivered,
    ReportsRefused: TaskExecutorState._on_refused,
    ShutdownRequested: TaskExecutorState._on_shutdown,
}
