"""Random interleavings of progress, faults and message timing against both real cores together.

A hypothesis state machine drives the simulated cluster (`simulator.py`): the JobManager's
scheduler and SlotManager wired to a real `TaskExecutorState` per TaskManager, messages in
channels that the test delivers when it likes. Tasks make progress, attempts fail, TaskManagers
crash and come back (a new process) or are cut off and register again (the same process, with
messages for its old registration still in flight), a cancel overtakes the deployment it cancels,
reports arrive late, tasks never stop, the job is cancelled, time jumps past restart delays,
slot-request and cancellation timeouts, and the JobManager fails to carry out deployments. After
every step the books of every core must hold (`validate_state()`), the event stream must be legal
and the job's slot ledger must agree with the SlotManager. At the end, once faults stop, every
message is delivered and a big TaskManager arrives: the job must end, every slot on both sides
must be free, and no TaskManager may still run a task the JobManager gave up on (except the
threads that never stop).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.graph.executiongraph import FailureInfo, SlotId
from funke.common.graph.jobgraph import FailoverStrategyKind, JobGraph, JobType
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy, NoRestartBackoffTimeStrategy
from funke.common.states import ExecutionState, JobStatus
from funke.common.conformance import GLOBALLY_TERMINAL_JOB, assert_event_stream
from tests.conformance.graphs import ALL_TO_ALL, BLOCKING, PIPELINED, POINTWISE, connect, job_graph, operator, sink, source
from tests.conformance.simulator import JOB, SimulatedCluster

J, E = JobStatus, ExecutionState
BOOM = FailureInfo("RuntimeError", "injected by the cluster fuzz")

RESTART_DELAY_S = 2.0
SLOT_REQUEST_TIMEOUT_S = 5.0
CANCELLATION_TIMEOUT_S = 10.0
# just past each timeout the scheduler, the SlotManager or a TaskManager keeps, and small steps
TIME_STEPS_S = (0.1, 1.5, RESTART_DELAY_S + 0.5, SLOT_REQUEST_TIMEOUT_S + 1, CANCELLATION_TIMEOUT_S + 1)
TASK_MANAGERS = ("tm-1", "tm-2", "tm-3")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A job and the TaskManagers it starts with; few slots, so batches wait for each other."""

    name: str
    job: JobGraph
    task_managers: tuple[tuple[str, int], ...]


SCENARIOS = {scenario.name: scenario for scenario in (
    # Two shuffles: three regions one after the other; lost partitions must be produced again.
    Scenario("batch-two-shuffles", job_graph(
        "two-shuffles", [source("source", 2), operator("map", 3), sink("reduce", 2)],
        [connect("source", "map", ALL_TO_ALL, BLOCKING), connect("map", "reduce", ALL_TO_ALL, BLOCKING)]),
        (("tm-1", 1), ("tm-2", 2))),
    # One pipelined region, deployed eagerly; consumers learn where partitions are as they finish.
    Scenario("streaming-pipeline", job_graph(
        "pipeline", [source("source", 2), operator("map", 2), sink("sink", 2)],
        [connect("source", "map", POINTWISE, PIPELINED), connect("map", "sink", ALL_TO_ALL, PIPELINED)],
        JobType.STREAMING),
        (("tm-1", 1), ("tm-2", 1))),
    # Regions {a} and {x, b}; b shares a's slot, so {x, b} waits for a slot a holds.
    Scenario("batch-shared-slot", job_graph(
        "shared", [source("a", 1), source("x", 1, slot_sharing_group="x"), sink("b", 1)],
        [connect("x", "b", POINTWISE, PIPELINED)]),
        (("tm-1", 1),)),
    # Two slot-sharing groups taking turns on three slots.
    Scenario("batch-two-slot-sharing-groups", job_graph(
        "groups", [source("src", 2, slot_sharing_group="a"), operator("map", 3, slot_sharing_group="b"),
                   sink("snk", 2, slot_sharing_group="a")],
        [connect("src", "map", ALL_TO_ALL, BLOCKING), connect("map", "snk", POINTWISE, BLOCKING)]),
        (("tm-1", 2), ("tm-2", 1))),
)}


class CheckedCluster(SimulatedCluster):
    """The simulated cluster, keeping a ledger of the slots the job holds: granted by the
    SlotManager, handed back by ReleaseSlot, gone with their TaskManager; and able to make the
    JobManager fail to carry out deployments, as a bug between decision and RPC would."""

    def __post_init__(self) -> None:
        self.held: set[SlotId] = set()
        self.in_flight: set[SlotId] = set()  # granted, the answer not read by the scheduler yet
        self.given_back: set[SlotId] = set()  # granted as the job ended, taken back by release_job
        self._checked = (0, 0)  # job steps, execution steps
        self._last_states: dict[str, str] = {"job": "CREATED"}
        self.deployments_to_break = 0
        self._broken: list = []
        super().__post_init__()

    def apply(self, actions: list) -> None:
        super().apply(actions)

    def _carry_out(self, a: object) -> None:
        if isinstance(a, s.DeployTask) and self.deployments_to_break:
            # As the JobMaster does: the action that raised is not carried out, the others are,
            # and the job learns of the error through the mailbox, after the action list.
            self.deployments_to_break -= 1
            self.observe(a)
            self.actions.append(a)
            self.running[a.deployment.attempt] = a.deployment
            attempt = a.deployment.attempt
            self._post(lambda: self._internal_error(attempt))
            return
        super()._carry_out(a)

    def _internal_error(self, attempt) -> None:
        if self.scheduler.status.is_terminal:
            return
        failure = FailureInfo("JobManagerError", "injected: the deployment could not be built")
        self.apply(self.scheduler.on_internal_error(failure, self.now, [attempt]))
        assert self.scheduler.status not in (J.CREATED, J.RUNNING, J.RESTARTING), self.scheduler.status
        execution = self.graph.find_execution(attempt)
        assert execution.state is E.FAILED, f"{execution!r} waits for a report no TaskManager can send"

    def observe(self, action: object) -> None:
        if isinstance(action, sm.SlotsAllocated):
            twice = self.held.intersection(action.slots)
            assert not twice, f"the SlotManager gave the job slots it already holds: {sorted(map(str, twice))}"
            self.held.update(action.slots)
            self.in_flight.update(action.slots)  # until the scheduler reads the answer
            self._post(lambda slots=action.slots: self.in_flight.difference_update(slots))
        elif isinstance(action, s.ReleaseSlot):
            if self.scheduler.status.is_terminal and action.slot in self.given_back:
                self.given_back.discard(action.slot)  # granted as the job ended: release_job took it back
                return
            assert action.slot in self.held, (
                f"ReleaseSlot({action.slot}, {action.cause!r}) for a slot the job does not hold "
                f"(released twice, or lost with its TaskManager)")
            self.held.discard(action.slot)
        elif isinstance(action, sm.TaskManagerLost):
            self.held = {slot for slot in self.held if slot.task_manager_id != action.task_manager_id}
        elif isinstance(action, s.JobCleanup):
            # What the scheduler does not know of yet (an answer still in the mailbox) is all it
            # may still hold; the ResourceManager's release_job takes that back.
            assert self.held <= self.in_flight, (
                f"the job ended {action.status.value} still holding {sorted(map(str, self.held - self.in_flight))}")
            self.given_back |= self.held
            self.held = set()

    def assert_stream_so_far_is_legal(self) -> None:
        """Only the steps since the last check, continuing from where each entity was."""
        job_from, executions_from = self._checked
        paths = assert_event_stream(
            self.job_steps[job_from:], self.execution_steps[executions_from:],
            initial_job=self._last_states["job"], initial_executions=self._last_states, require_terminal=False)
        self._last_states.update((entity, path[-1]) for entity, path in paths.items())
        self._checked = (len(self.job_steps), len(self.execution_steps))

    def slots_of_the_job(self) -> set[SlotId]:
        """What the SlotManager says the job holds."""
        return {SlotId(tm.task_manager_id, i) for tm in self.slots.task_managers.values()
                for i, holder in enumerate(tm.slots) if holder == JOB}

    def assert_books_agree(self) -> None:
        self.assert_stream_so_far_is_legal()
        self.validate_cores()
        known = set(self.scheduler.slots.slot_of.values()) | set(self.scheduler.slots.idle)  # in use, and its idle pool
        assert known == self.held - self.in_flight and self.held == self.slots_of_the_job(), (
            f"slots: the scheduler knows {sorted(map(str, known))}, the ledger says {sorted(map(str, self.held))}, "
            f"the SlotManager says {sorted(map(str, self.slots_of_the_job()))}")


def _pick(items, index: int):
    items = sorted(items)
    return items[index % len(items)] if items else None


INDEX = st.integers(0, 5)
TM = st.sampled_from(TASK_MANAGERS)


class ClusterFuzz(RuleBasedStateMachine):
    sim: CheckedCluster | None = None

    @initialize(
        scenario=st.sampled_from(list(SCENARIOS)),
        failover=st.sampled_from([FailoverStrategyKind.REGION, FailoverStrategyKind.FULL]),
        restarts=st.sampled_from([1000, 3, 0]),
        delay=st.sampled_from([RESTART_DELAY_S, 0.0]),
        auto_deliver=st.sampled_from([False, False, True]),
        undisturbed_rounds=st.integers(0, 12),
    )
    def start(self, scenario: str, failover: FailoverStrategyKind, restarts: int, delay: float,
              auto_deliver: bool, undisturbed_rounds: int) -> None:
        strategy = (FixedDelayRestartBackoffTimeStrategy(attempts=restarts, delay_s=delay) if restarts
                    else NoRestartBackoffTimeStrategy())
        self.sim = CheckedCluster(
            SCENARIOS[scenario].job, task_managers=dict(SCENARIOS[scenario].task_managers),
            restart_strategy=strategy, failover=failover, auto_deliver=auto_deliver,
            slot_request_timeout_s=SLOT_REQUEST_TIMEOUT_S, cancellation_timeout_s=CANCELLATION_TIMEOUT_S,
        ).start()
        for _ in range(undisturbed_rounds):  # so that faults hit late stages as often as early ones
            if not auto_deliver:
                self.sim.deliver_everything()
            self.sim.step_tasks()

    def job_is_live(self) -> bool:
        return self.sim is not None and not self.sim.scheduler.status.is_terminal

    # -- progress

    @rule(rounds=st.integers(1, 8))
    def tasks_make_progress(self, rounds: int) -> None:
        for _ in range(rounds):
            self.sim.step_tasks()

    @precondition(job_is_live)
    @rule(index=INDEX)
    def one_task_makes_progress(self, index: int) -> None:
        attempt = _pick(self.sim.running, index)
        if attempt is not None:
            self.sim.step_task(attempt)

    @rule(seconds=st.sampled_from(TIME_STEPS_S))
    def time_passes(self, seconds: float) -> None:
        self.sim.advance(seconds)

    # -- the network

    @rule(task_manager=TM, n=st.integers(1, 4))
    def messages_reach_a_task_manager(self, task_manager: str, n: int) -> None:
        self.sim.deliver_to_taskmanager(task_manager, n)

    @rule(task_manager=TM, n=st.integers(1, 4))
    def reports_reach_the_jobmanager(self, task_manager: str, n: int) -> None:
        self.sim.deliver_reports(task_manager, n)

    @rule(task_manager=TM)
    def a_cancel_overtakes_what_was_sent_before_it(self, task_manager: str) -> None:
        self.sim.deliver_to_taskmanager(task_manager, 1, overtake=True)

    @rule()
    def everything_in_flight_arrives(self) -> None:
        self.sim.deliver_everything()

    # -- faults

    @precondition(job_is_live)
    @rule(index=INDEX)
    def an_attempt_fails(self, index: int) -> None:
        attempt = _pick(self.sim.running, index)  # cancelled ones too: they may fail instead
        if attempt is not None:
            self.sim.report(attempt, E.FAILED, BOOM)

    @precondition(job_is_live)
    @rule(index=INDEX)
    def a_cancelled_task_never_stops(self, index: int) -> None:
        attempt = _pick(self.sim.cancel_requested & self.sim.running.keys(), index)
        if attempt is not None:  # its thread keeps running and never reports again
            self.sim.hang(attempt)

    @precondition(job_is_live)
    @rule(index=INDEX, how_many=st.integers(1, 2))
    def task_managers_crash(self, index: int, how_many: int) -> None:
        for task_manager in sorted(self.sim.tms)[index:][:how_many]:  # one after the other
            self.sim.lose_task_manager(task_manager)

    @precondition(job_is_live)
    @rule(task_manager=TM)
    def a_task_manager_is_cut_off_and_registers_again(self, task_manager: str) -> None:
        self.sim.partition_task_manager(task_manager)

    @precondition(job_is_live)
    @rule(task_manager=TM, slots=st.integers(1, 3))
    def a_task_manager_process_starts(self, task_manager: str, slots: int) -> None:
        self.sim.register_task_manager(task_manager, slots)  # a known id: its old process is gone

    @precondition(job_is_live)
    @rule()
    def the_job_is_cancelled(self) -> None:
        self.sim.apply(self.sim.scheduler.cancel(self.sim.now))

    @precondition(job_is_live)
    @rule(how_many=st.sampled_from([1, 1000]))
    def the_next_deployments_cannot_be_carried_out(self, how_many: int) -> None:
        """The JobManager will raise between the scheduler's decision and the RPC of the next
        deployment(s) (see `CheckedCluster._carry_out`)."""
        self.sim.deployments_to_break = how_many

    # -- checks

    @invariant()
    def books_agree(self) -> None:
        if self.sim is not None:
            self.sim.assert_books_agree()

    def teardown(self) -> None:
        # Hypothesis tears down in a `finally`: after a failed step, report that failure alone.
        if self.sim is None or sys.exc_info()[1] is not None:
            return
        sim = self.sim
        sim.script = lambda attempt: None
        sim.deployments_to_break = 0
        sim.register_task_manager("tm-big", sim.scheduler.plan.required_slots())
        status = sim.run()
        sched = sim.scheduler
        assert status in GLOBALLY_TERMINAL_JOB, (
            f"the job hangs in {status.value}: pending restart {sched._pending_restart is not None}, "
            f"{len(sched.slots.bulks)} waiting bulks, requests {sorted(sched.slots.requests)}, live executions "
            f"{[repr(ev.current_execution) for ev in sim.graph.execution_vertices() if not ev.state.is_terminal]}")
        # Whatever is still in flight arrives; threads that can still end do.
        for _ in range(50):
            sim.deliver_everything()
            if not sim.step_tasks():
                sim.advance(2.0)
        sim.deliver_everything()
        sim.assert_books_agree()
        assert sim.slots.free_slots == sim.slots.total_slots, "slots still taken after the job ended"
        for tm in sim.tms.values():
            held = [(v.index, v.job_id) for v in tm.core.slot_report() if v.job_id is not None]
            assert not held, f"{tm.task_manager_id} still gives slots to the ended job: {held}"
            hung = {key for key, thread in tm.threads.items() if thread.hung}
            live = [str(key) for key, task in tm.core.tasks.items() if not task.terminal and key not in hung]
            assert not live, f"{tm.task_manager_id} still runs tasks of the ended job: {live}"
        if status is J.FINISHED:
            unfinished = [repr(ev.current_execution) for ev in sim.graph.execution_vertices()
                          if ev.current_execution.state is not E.FINISHED]
            assert not unfinished, f"the job FINISHED but these did not: {unfinished}"
        sim.assert_conformant()


def test_any_interleaving_of_progress_faults_and_messages_keeps_the_books_of_both_cores_and_ends_the_job():
    run_state_machine_as_test(ClusterFuzz, settings=settings(
        max_examples=250, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))


def test_a_taskmanager_back_under_its_id_gets_its_new_slot_used_after_its_old_process_is_written_off():
    """Found by the fuzz: a TaskManager process that starts again under a known id is written off
    and its new slot served in one SlotManager pass. Handed over out of order (the allocations
    first, as one event), the job took the new slot, then forgot it with the old process's, and
    the slot stayed held for a job that no longer knew it."""
    for cannot_deploy in (False, True):
        state = ClusterFuzz()
        state.start(scenario="batch-shared-slot", failover=FailoverStrategyKind.REGION, restarts=1000, delay=2.0,
                    auto_deliver=False, undisturbed_rounds=0)
        state.books_agree()
        if cannot_deploy:
            state.the_next_deployments_cannot_be_carried_out(how_many=1)
            state.books_agree()
        state.a_task_manager_process_starts(slots=1, task_manager="tm-1")
        state.books_agree()
        state.teardown()
