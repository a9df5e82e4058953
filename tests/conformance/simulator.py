"""A simulated cluster for conformance scenarios: the real Scheduler and SlotManager, with
TaskManagers that are just bookkeeping and a clock that only moves when told.

It carries out the scheduler's actions the way the JobManager shell does (slot requests go to the
SlotManager, deployments become "running" tasks, timers fire when time passes them) and records
every job-status and execution-state change as conformance Steps.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from funke.common import scheduler as s
from funke.common import slotmanager as sm
from funke.common.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo
from funke.common.jobgraph import FailoverStrategyKind, JobGraph
from funke.common.restart import NoRestartBackoffTimeStrategy, RestartBackoffTimeStrategy
from funke.common.states import ExecutionState, JobStatus
from tests.conformance.assertions import Step, assert_event_stream

E = ExecutionState

# decides what a deployed attempt does when it runs: None = finish, a FailureInfo = fail with it
TaskScript = Callable[[ExecutionAttemptId], FailureInfo | None]


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

    def __post_init__(self) -> None:
        self.graph = ExecutionGraph(self.job, "job-1", self.now)
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
        self.running: dict[ExecutionAttemptId, s.TaskDeployment] = {}  # deployed, not yet reported terminal
        self.cancel_requested: set[ExecutionAttemptId] = set()
        self.partition_updates: list[s.UpdatePartitionInfo] = []
        self.waiting_messages: list[str] = []
        self._timers: list[tuple[float, int, s.Timer]] = []
        self._seq = 0
        for tm, n in self.task_managers.items():
            _, actions = self.slots.register(tm, f"{tm}:1", n, {}, self.now)
            self._slot_actions(actions)

    # ------------------------------------------------------------------ driving

    def start(self) -> "SimulatedCluster":
        self.apply(self.scheduler.start(self.now))
        return self

    def apply(self, actions: list) -> None:
        queue = list(actions)
        while queue:
            a = queue.pop(0)
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
                self._slot_actions(self.slots.request_slots("job-1", a.requests, a.timeout_s, self.now))
            elif isinstance(a, s.CancelSlotRequest):
                self._slot_actions(self.slots.cancel_request("job-1", a.request_id))
            elif isinstance(a, s.ReleaseSlot):
                self._slot_actions(self.slots.release_slot(a.slot, "job-1", a.cause, self.now))
            elif isinstance(a, s.DeployTask):
                self.running[a.deployment.attempt] = a.deployment
            elif isinstance(a, s.CancelTask):
                self.cancel_requested.add(a.attempt)
            elif isinstance(a, s.UpdatePartitionInfo):
                self.partition_updates.append(a)
            elif isinstance(a, s.StartTimer):
                self._seq += 1
                heapq.heappush(self._timers, (a.at, self._seq, a.timer))
            elif isinstance(a, s.CommitOutputs):
                queue.extend(self.scheduler.on_outputs_committed(self.now, self.commit_error))
            elif isinstance(a, s.JobCleanup):
                self._slot_actions(self.slots.release_job("job-1", "job ended", self.now))

    def observe(self, action: object) -> None:
        """Sees every scheduler action and SlotManager action just before it is carried out.
        Does nothing here; a checking subclass keeps its own books with it."""

    def _slot_actions(self, actions: list) -> None:
        for a in actions:
            self.observe(a)
            if isinstance(a, sm.SlotsAllocated):
                self.apply(self.scheduler.on_slots_allocated(a.request_id, a.slots, self.now))
            elif isinstance(a, sm.SlotRequestFailed):
                self.apply(self.scheduler.on_slot_request_failed(a.request_id, a.message, self.now))
            elif isinstance(a, sm.WaitingForResources):
                self.waiting_messages.append(a.message)
            elif isinstance(a, sm.TaskManagerLost):
                self.apply(self.scheduler.on_task_manager_lost(a.task_manager_id, a.cause, self.now))

    def register_task_manager(self, task_manager_id: str, slots: int) -> None:
        """A TaskManager registers; a known id registering again means its old process is gone."""
        _, actions = self.slots.register(task_manager_id, f"{task_manager_id}:1", slots, {}, self.now)
        self._slot_actions(actions)

    def lose_task_manager(self, task_manager_id: str, cause: str = "heartbeat timeout") -> None:
        self._slot_actions(self.slots.lose(task_manager_id, cause, self.now))

    def report(self, attempt: ExecutionAttemptId, state: ExecutionState, failure: FailureInfo | None = None) -> None:
        self.apply(self.scheduler.on_task_state(attempt, state, self.now, failure=failure))

    def step_tasks(self) -> bool:
        """Every deployed task makes one step (see `step_task`). True if anything moved."""
        moved = False
        for attempt in sorted(self.running):
            if attempt in self.running:
                moved |= self.step_task(attempt)
        return moved

    def step_task(self, attempt: ExecutionAttemptId) -> bool:
        """One deployed task makes one step: a cancelled one reports CANCELED, others advance
        DEPLOYING -> INITIALIZING -> RUNNING -> FINISHED/FAILED per the script. True if it moved."""
        ex = self.graph.find_execution(attempt)
        if attempt in self.cancel_requested:
            self.report(attempt, E.CANCELED)
        elif ex.state is E.DEPLOYING:
            self.report(attempt, E.INITIALIZING)
        elif ex.state is E.INITIALIZING:
            self.report(attempt, E.RUNNING)
        elif ex.state is E.RUNNING:
            if not all(g.all_finished for g in ex.vertex.consumed_partition_groups):
                return False  # a consumer reads its inputs before it can finish
            failure = self.script(attempt)
            self.report(attempt, E.FAILED if failure else E.FINISHED, failure)
        else:
            return False
        return True

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            at, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, at)
            self.apply(self.scheduler.on_timer(timer, self.now))
        self.now = target
        self._slot_actions(self.slots.check(self.now))

    def run(self, max_rounds: int = 10_000, tick: float = 0.1) -> JobStatus:
        """Run tasks and time until the job is terminal (or nothing can happen any more)."""
        for _ in range(max_rounds):
            if self.scheduler.status.is_terminal:
                break
            if not self.step_tasks():
                if not self._timers and not self.slots.has_pending_requests("job-1"):
                    break
            self.advance(tick)
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
