"""A simulated cluster for conformance scenarios: the real cores of both sides, wired together the
way the processes wire them, with a clock that only moves when told.

- the JobManager: the real `Scheduler` and `SlotManager`; their actions are carried out as the
  JobMaster and ResourceManager shells do, and what comes back (slots, TaskManager answers and
  reports, timers) enters through one mailbox, after the action list being carried out;
- each TaskManager: a real `TaskExecutorState`; its instructions are carried out as the
  TaskExecutor shell does, with "threads" for Spark tasks that move one step at a time when the
  test says so (INITIALIZING, RUNNING, then — once the core handed them their inputs — FINISHED or
  the script's failure; CANCELED once interrupted);
- the network: every message between the JobManager and a TaskManager travels through a channel
  per direction, in order. With `auto_deliver` (the default) they arrive at once; without it, a
  test delivers them itself, and can make a cancel overtake what was sent before it, or partition a
  TaskManager while messages are in flight (they arrive later, for a registration that is over).

Every job-status and execution-state change is recorded as a conformance Step.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.task import taskexecutorstate as core
from funke.common.graph.deployment import PartitionRef, ProducedPartition, TaskDeployment
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo, Incarnation
from funke.common.graph.jobgraph import FailoverStrategyKind, JobGraph
from funke.common.graph.restart import NoRestartBackoffTimeStrategy, RestartBackoffTimeStrategy
from funke.common.states import ExecutionState, JobStatus
from funke.common.task.taskexecutorstate import TaskExecutorState, TaskKey
from funke.common.conformance import Step, assert_event_stream

E = ExecutionState
JOB = "job-1"
SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'

# decides what a deployed attempt does when it runs: None = finish, a FailureInfo = fail with it
TaskScript = Callable[[ExecutionAttemptId], FailureInfo | None]
# builds the event a message becomes on arrival, given the registration it was sent to
MakeEvent = Callable[[str], core.Event]


@dataclass(eq=False)
class _Thread:
    """A Spark task's thread, as the simulated TaskManager runs it."""

    key: TaskKey
    deployment: TaskDeployment
    stage: int = 0  # 0: nothing reported yet, 1: INITIALIZING, 2: RUNNING
    inputs: bool = False
    interrupted: bool = False
    hung: bool = False  # it never reports again (a task that does not stop)


@dataclass(eq=False)
class _Message:
    registration_id: str  # the registration it was sent to
    make: MakeEvent
    kind: str  # "submit", "cancel", ...


@dataclass(eq=False)
class SimulatedTaskManager:
    """One TaskManager process: its real core, its task threads, and its two channels."""

    task_manager_id: str
    slots: int
    core: TaskExecutorState = field(init=False)
    registration_id: str = ""
    threads: dict[TaskKey, _Thread] = field(default_factory=dict)
    to_taskmanager: deque[_Message] = field(default_factory=deque)
    to_jobmanager: deque[tuple[int, core.SendReport]] = field(default_factory=deque)  # (generation, report)
    timers: list[tuple[float, int, core.Timer]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = TaskExecutorState(self.task_manager_id, self.slots, spark=True, data_dir="/data")


@dataclass
class SimulatedCluster:
    job: JobGraph
    task_managers: dict[str, int] = field(default_factory=lambda: {"tm-1": 3, "tm-2": 3})
    restart_strategy: RestartBackoffTimeStrategy = field(default_factory=NoRestartBackoffTimeStrategy)
    failover: FailoverStrategyKind = FailoverStrategyKind.REGION
    slot_request_timeout_s: float = 30.0
    cancellation_timeout_s: float = s.DEFAULT_CANCELLATION_TIMEOUT_S
    script: TaskScript = lambda attempt: None
    now: float = 1000.0
    commit_error: FailureInfo | None = None
    auto_deliver: bool = True
    incarnation: Incarnation = field(default_factory=Incarnation)  # a later run: a job a new leader recovered

    def __post_init__(self) -> None:
        self.graph = ExecutionGraph(self.job, JOB, self.now, self.incarnation)
        self.scheduler = s.Scheduler(
            self.graph,
            restart_strategy=self.restart_strategy,
            failover_strategy=self.failover,
            slot_request_timeout_s=self.slot_request_timeout_s,
            cancellation_timeout_s=self.cancellation_timeout_s,
        )
        self.slots = sm.SlotManager(heartbeat_timeout_s=1e9)
        self.job_steps: list[Step] = []
        self.execution_steps: list[Step] = []
        self.actions: list[object] = []
        self.running: dict[ExecutionAttemptId, TaskDeployment] = {}  # deployed, not terminal for the JobManager
        self.cancel_requested: set[ExecutionAttemptId] = set()
        self.partition_updates: list[s.UpdatePartitionInfo] = []
        self.waiting_messages: list[str] = []
        self.tms: dict[str, SimulatedTaskManager] = {}
        self._timers: list[tuple[float, int, s.Timer]] = []
        self._seq = itertools.count()
        self._mail: deque[Callable[[], None]] = deque()
        self._draining = False
        for tm, n in self.task_managers.items():
            if n > 0:  # a TaskManager of no slots: none at all (the job waits for resources)
                self.register_task_manager(tm, n)

    # ------------------------------------------------------------------ the JobManager

    def start(self) -> "SimulatedCluster":
        self.apply(self.scheduler.start(self.now))
        return self

    def apply(self, actions: list) -> None:
        """Carry out scheduler actions, then whatever came back through the mailbox."""
        for a in actions:
            self._carry_out(a)
        self._drain()

    def _post(self, letter: Callable[[], None]) -> None:
        self._mail.append(letter)

    def _drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        try:
            while self._mail:
                self._mail.popleft()()
        finally:
            self._draining = False

    def observe(self, action: object) -> None:
        """Sees every scheduler action and SlotManager action just before it is carried out.
        Does nothing here; a checking subclass keeps its own books with it."""

    def _carry_out(self, a: object) -> None:
        self.observe(a)
        self.actions.append(a)
        if isinstance(a, s.JobStatusChanged):
            t = a.transition
            self.job_steps.append(Step("job", t.from_state.value, t.to_state.value, t.timestamp))
        elif isinstance(a, s.ExecutionStateChanged):
            t = a.transition
            self.execution_steps.append(Step(str(a.attempt), t.from_state.value, t.to_state.value, t.timestamp))
            if t.to_state.is_terminal:
                self.running.pop(a.attempt, None)
        elif isinstance(a, s.RequestSlots):
            self._slot_actions(self.slots.request_slots(JOB, a.requests, a.timeout_s, self.now))
        elif isinstance(a, s.CancelSlotRequest):
            self._slot_actions(self.slots.cancel_request(JOB, a.request_id))
        elif isinstance(a, s.ReleaseSlot):
            self._slot_actions(self.slots.release_slot(a.slot, JOB, a.cause, self.now))
        elif isinstance(a, s.DeployTask):
            d = a.deployment
            self.running[d.attempt] = d
            if d.slot.task_manager_id not in self.tms:  # gone: the JobMaster fails it at once
                self._post(lambda: self.apply(self.scheduler.on_deploy_failed(
                    d.attempt, FailureInfo("DeploymentFailed", f"TaskManager {d.slot.task_manager_id} is gone"),
                    self.now)))
            else:
                self._send(d.slot.task_manager_id, "submit", lambda g, d=d: core.SubmitTask(d, g, d.stimulus_id))
        elif isinstance(a, s.CancelTask):
            self.cancel_requested.add(a.attempt)
            self._send(a.task_manager_id, "cancel",
                       lambda g, a=a: core.CancelTask(JOB, a.attempt, g, a.stimulus_id))
        elif isinstance(a, s.UpdatePartitionInfo):
            self.partition_updates.append(a)
            self._send(a.task_manager_id, "update", lambda g, a=a: core.PartitionsAvailable(JOB, (a.update,), g))
        elif isinstance(a, s.ReleasePartitions):
            self._send(a.task_manager_id, "release", lambda g, a=a: core.ReleasePartitions(JOB, a.partitions, False, g))
        elif isinstance(a, s.StartTimer):
            heapq.heappush(self._timers, (a.at, next(self._seq), a.timer))
        elif isinstance(a, s.CommitOutputs):
            self._post(lambda: self.apply(self.scheduler.on_outputs_committed(self.now, self.commit_error)))
        elif isinstance(a, s.JobCleanup):
            self._slot_actions(self.slots.release_job(JOB, "job ended", self.now))
            for tm in a.task_managers:
                self._send(tm, "release", lambda g: core.ReleasePartitions(JOB, (), True, g))

    def _slot_actions(self, actions: list) -> None:
        """The ResourceManager: SlotManager answers reach the job through the mailbox."""
        # Consecutive allocations reach the job as one event, where they stand among the other
        # letters, as the ResourceManager hands them over.
        allocations: list[tuple[int, tuple]] = []

        def flush() -> None:
            if allocations:
                served = list(allocations)
                allocations.clear()
                self._post(lambda: self.apply(self.scheduler.on_allocations(served, self.now)))

        for a in actions:
            self.observe(a)
            if isinstance(a, sm.SlotsAllocated):
                allocations.append((a.request_id, a.slots))
                continue
            flush()
            if isinstance(a, sm.SlotRequestFailed):
                self._post(lambda a=a: self.apply(self.scheduler.on_slot_request_failed(a.request_id, a.message, self.now)))
            elif isinstance(a, sm.WaitingForResources):
                self.waiting_messages.append(a.message)
            elif isinstance(a, sm.FreeSlot):
                self._send(a.task_manager_id, "free",
                           lambda g, a=a: core.FreeSlots(a.job_id, (a.slot_index,), a.cause, g))
            elif isinstance(a, sm.TaskManagerLost):
                self._post(lambda a=a: self.apply(self.scheduler.on_task_manager_lost(a.task_manager_id, a.cause,
                                                                                      self.now)))
        flush()

    # ------------------------------------------------------------------ the network

    def _send(self, task_manager_id: str, kind: str, make: MakeEvent) -> None:
        tm = self.tms.get(task_manager_id)
        if tm is None:
            return  # the JobMaster has no gateway for it any more
        tm.to_taskmanager.append(_Message(tm.registration_id, make, kind))
        if self.auto_deliver:
            self._post(lambda: self.deliver_to_taskmanager(task_manager_id))

    def deliver_to_taskmanager(self, task_manager_id: str, n: int = 1, *, overtake: bool = False) -> int:
        """Deliver the next `n` messages to the TaskManager; `overtake`: a cancel among them goes
        first (it overtook what was sent before it). Returns how many were delivered."""
        tm = self.tms.get(task_manager_id)
        if tm is None:
            return 0
        delivered = 0
        while delivered < n and tm.to_taskmanager:
            if overtake:
                cancel = next((m for m in tm.to_taskmanager if m.kind == "cancel"), None)
                message = cancel if cancel is not None else tm.to_taskmanager[0]
                tm.to_taskmanager.remove(message)
            else:
                message = tm.to_taskmanager.popleft()
            self._handle(tm, message.make(message.registration_id))
            delivered += 1
        self._drain()
        return delivered

    def deliver_reports(self, task_manager_id: str, n: int = 1) -> int:
        """Deliver the TaskManager's next `n` reports to the JobManager."""
        tm = self.tms.get(task_manager_id)
        delivered = 0
        reports = []
        while tm is not None and delivered < n and tm.to_jobmanager:
            generation, instruction = tm.to_jobmanager.popleft()
            delivered += 1
            if generation != tm.core.generation:
                continue  # for a registration the JobManager wrote off: the shell drops it
            reports.append(instruction.report)
        if reports:  # one call's reports reach the job as one event, as the JobMaster hands them over
            self._post(lambda: self.apply(self.scheduler.on_task_states(reports, self.now)))
            for r in reports:
                self._post(lambda tm=tm, r=r: self._handle(tm, core.ReportsDelivered((r,))))
        self._drain()
        return delivered

    def deliver_everything(self) -> None:
        """Until no message is in flight in either direction."""
        moved = True
        while moved:
            moved = False
            for tm_id in sorted(self.tms):
                moved |= bool(self.deliver_to_taskmanager(tm_id, 10**9))
                moved |= bool(self.deliver_reports(tm_id, 10**9))

    # ------------------------------------------------------------------ the TaskManagers

    def _handle(self, tm: SimulatedTaskManager, event: core.Event) -> None:
        """The TaskExecutor shell: the core decides, this carries out."""
        for i in tm.core.handle(event, self.now):
            if isinstance(i, core.TaskRejected):
                attempt, reason = i.key.attempt, i.reason
                self._post(lambda: self.apply(self.scheduler.on_deploy_failed(
                    attempt, FailureInfo("DeploymentFailed", f"TaskManager {tm.task_manager_id} rejected the task: "
                                                             f"{reason}"), self.now)))
            elif isinstance(i, core.StartTask):
                tm.threads[i.key] = _Thread(i.key, i.deployment)
            elif isinstance(i, core.InputsReady):
                thread = tm.threads.get(i.key)
                if thread is not None:
                    thread.inputs = True
            elif isinstance(i, core.InterruptTask):
                thread = tm.threads.get(i.key)
                if thread is not None:
                    thread.interrupted = True
            elif isinstance(i, core.SendReport):
                tm.to_jobmanager.append((i.generation, i))
                if self.auto_deliver:
                    self._post(lambda: self.deliver_reports(tm.task_manager_id))
            elif isinstance(i, core.DeletePartitions):
                tm.deleted.extend(i.paths())
            elif isinstance(i, core.StartTimer):
                heapq.heappush(tm.timers, (self.now + i.delay_s, next(self._seq), i.timer))
            elif isinstance(i, core.RegisterAgain):
                self._post(lambda: self._register(tm))

    def _register(self, tm: SimulatedTaskManager) -> None:
        registration_id, actions = self.slots.register(tm.task_manager_id, f"{tm.task_manager_id}:1", tm.slots, {},
                                                       self.now)
        tm.registration_id = registration_id
        self._handle(tm, core.JobManagerRegistered(registration_id, "/data"))
        self._slot_actions(actions)

    def register_task_manager(self, task_manager_id: str, slots: int) -> None:
        """A TaskManager process starts and registers; a known id registering again means its
        old process is gone (with its tasks and whatever was in flight to it)."""
        tm = self.tms[task_manager_id] = SimulatedTaskManager(task_manager_id, slots)
        self._register(tm)
        self._drain()

    def lose_task_manager(self, task_manager_id: str, cause: str = "heartbeat timeout") -> None:
        """The TaskManager's process dies: the JobManager notices, nothing it had reaches anyone."""
        self.tms.pop(task_manager_id, None)
        self._slot_actions(self.slots.lose(task_manager_id, cause, self.now))
        self._drain()

    def partition_task_manager(self, task_manager_id: str) -> None:
        """The link to a TaskManager breaks and heals: both sides give each other up (the
        JobManager fails its tasks, the TaskManager forgets them and registers again); messages
        in flight arrive later, for the registration that is over."""
        tm = self.tms.get(task_manager_id)
        if tm is None:
            return
        self._slot_actions(self.slots.lose(task_manager_id, "heartbeat stream broke", self.now))
        self._handle(tm, core.JobManagerLost("heartbeat stream broke"))
        self._drain()

    def hang(self, attempt: ExecutionAttemptId) -> None:
        """The attempt's thread never reports again: a task that does not stop."""
        for tm in self.tms.values():
            for thread in tm.threads.values():
                if thread.key.attempt == attempt:
                    thread.hung = True

    # ------------------------------------------------------------------ task threads

    def _thread_of(self, attempt: ExecutionAttemptId) -> tuple[SimulatedTaskManager, _Thread] | None:
        for tm_id in sorted(self.tms):
            tm = self.tms[tm_id]
            for thread in tm.threads.values():
                if thread.key.attempt == attempt:
                    return tm, thread
        return None

    def report(self, attempt: ExecutionAttemptId, state: ExecutionState, failure: FailureInfo | None = None) -> None:
        """The attempt's thread reports `state` now (FINISHED with its partitions); a terminal
        report ends the thread."""
        found = self._thread_of(attempt)
        if found is None:
            return
        tm, thread = found
        self._thread_reports(tm, thread, state, failure)
        self._drain()

    def _thread_reports(self, tm: SimulatedTaskManager, thread: _Thread, state: ExecutionState,
                        failure: FailureInfo | None = None) -> None:
        produced = tuple(ProducedPartition(o.data_set_id, o.partition_index, SCHEMA, 10)
                         for o in thread.deployment.outputs) if state is E.FINISHED else ()
        self._handle(tm, core.TaskReported(thread.key, state, failure, produced))
        if state.is_terminal:
            del tm.threads[thread.key]
            self._handle(tm, core.TaskThreadExited(thread.key))

    def step_tasks(self) -> bool:
        """Every thread makes one step (see `step_task`). True if anything moved."""
        moved = False
        for tm_id in sorted(self.tms):
            tm = self.tms.get(tm_id)
            for key in sorted(tm.threads) if tm is not None else ():
                if key in tm.threads:
                    moved |= self._step(tm, tm.threads[key])
        self._drain()
        return moved

    def step_task(self, attempt: ExecutionAttemptId) -> bool:
        """The attempt's thread makes one step: an interrupted one reports CANCELED, others move
        INITIALIZING -> RUNNING -> (once given their inputs) FINISHED or the script's failure.
        True if it moved."""
        found = self._thread_of(attempt)
        if found is None:
            return False
        moved = self._step(*found)
        self._drain()
        return moved

    def _step(self, tm: SimulatedTaskManager, thread: _Thread) -> bool:
        if thread.hung:
            return False
        if thread.interrupted:
            self._thread_reports(tm, thread, E.CANCELED)
        elif thread.stage == 0:
            thread.stage = 1
            self._thread_reports(tm, thread, E.INITIALIZING)
        elif thread.stage == 1:
            thread.stage = 2
            self._thread_reports(tm, thread, E.RUNNING)
        elif thread.inputs:
            failure = self.script(thread.key.attempt)
            self._thread_reports(tm, thread, E.FAILED if failure else E.FINISHED, failure)
        else:
            return False  # waiting for its inputs
        return True

    # ------------------------------------------------------------------ time

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while True:
            due = [(self._timers[0][0], "jm", None)] if self._timers and self._timers[0][0] <= target else []
            due += [(tm.timers[0][0], "tm", tm) for tm in self.tms.values() if tm.timers and tm.timers[0][0] <= target]
            if not due:
                break
            at, side, tm = min(due, key=lambda d: d[0])
            self.now = max(self.now, at)
            if side == "jm":
                _, _, timer = heapq.heappop(self._timers)
                self.apply(self.scheduler.on_timer(timer, self.now))
            else:
                _, _, tm_timer = heapq.heappop(tm.timers)
                self._handle(tm, core.TimerFired(tm_timer))
                self._drain()
        self.now = target
        self._slot_actions(self.slots.check(self.now))
        self._drain()

    def run(self, max_rounds: int = 10_000, tick: float = 0.1) -> JobStatus:
        """Run tasks and time until the job is terminal (or nothing can happen any more)."""
        for _ in range(max_rounds):
            if self.scheduler.status.is_terminal:
                break
            if not self.auto_deliver:
                self.deliver_everything()
            if not self.step_tasks():
                idle = not self._timers and not any(tm.timers for tm in self.tms.values())
                if idle and not self.slots.has_pending_requests(JOB):
                    break
            self.advance(tick)
        if not self.auto_deliver:
            self.deliver_everything()
        return self.scheduler.status

    def run_until(self, predicate: Callable[[], bool], max_rounds: int = 1000, tick: float = 0.1) -> None:
        for _ in range(max_rounds):
            if predicate():
                return
            self.step_tasks()
            if predicate():
                return
            self.advance(tick)
        raise AssertionError("condition never held")

    # ------------------------------------------------------------------ inspection

    def job_path(self) -> list[str]:
        return ["CREATED"] + [st.to_state for st in self.job_steps]

    def assert_conformant(self, require_terminal: bool = True) -> dict[str, list[str]]:
        return assert_event_stream(self.job_steps, self.execution_steps, require_terminal=require_terminal)

    def attempts(self, vertex_id: str) -> list[int]:
        return [ev.current_execution.attempt_number for ev in self.graph.vertices[vertex_id].task_vertices]

    def validate_cores(self) -> None:
        """The books of every core: the scheduler's and each TaskManager's."""
        self.scheduler.validate_state()
        for tm in self.tms.values():
            tm.core.validate_state()
            for key in tm.threads:  # a thread runs for a task its core still tracks, or forgot
                task = tm.core.tasks.get(key)
                assert task is None or not task.terminal, f"{key} ended {task.state.value} but its thread runs"

    def released(self) -> list[PartitionRef]:
        return [r for a in self.actions if isinstance(a, s.ReleasePartitions) for r in a.partitions]
