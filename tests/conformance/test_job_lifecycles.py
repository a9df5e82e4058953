"""Job lifecycles through the real scheduler: the job's status follows from its executions.

Each scenario runs on the simulated cluster and checks (a) the job's status path, (b) attempt
numbers, and (c) that the whole event stream is a legal path through both tables.
"""

from __future__ import annotations

import pytest

from funke.common.scheduling import scheduler as s
from funke.common.graph.executiongraph import ExecutionAttemptId, FailureInfo, Incarnation
from funke.common.graph.jobgraph import FailoverStrategyKind, ResultPartitionType
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy
from funke.common.states import ExecutionState, JobStatus
from tests.conformance.graphs import BLOCKING, PIPELINED, seed_example_job, source_sink_all_to_all
from tests.conformance.simulator import SimulatedCluster

J, E = JobStatus, ExecutionState
BOOM = FailureInfo("ZeroDivisionError", "division by zero", 'Traceback:\n  File "job.py", line 3, in divide\n')


def fail_once(vertex_id: str, subtask: int):
    return lambda a: BOOM if (a.vertex_id, a.subtask_index, a.attempt_number) == (vertex_id, subtask, 0) else None


@pytest.mark.parametrize("result_type", [BLOCKING, PIPELINED])
def test_success_all_executions_finished_then_job_finished(result_type):
    sim = SimulatedCluster(seed_example_job(result_type)).start()
    assert sim.run() is J.FINISHED
    assert sim.job_path() == ["CREATED", "RUNNING", "FINISHED"]
    paths = sim.assert_conformant()
    assert all(p[-1] == "FINISHED" for entity, p in paths.items() if entity != "job")
    assert sum(1 for e in paths if e != "job") == 4 + 4 + 3


def test_batch_regions_run_in_order_and_pipelined_jobs_deploy_eagerly():
    batch = SimulatedCluster(seed_example_job(BLOCKING)).start()
    deployed_first = {a.vertex_id for a in batch.running}
    assert deployed_first == {"source"}  # only source regions: the others wait for blocking inputs
    streaming = SimulatedCluster(seed_example_job(PIPELINED)).start()
    assert {a.vertex_id for a in streaming.running} == {"source", "map", "reduce"}
    streaming.run()
    # deployed consumers learned about partitions as producers finished, one update per TaskManager
    assert {(u.update.data_set_id.split(".to.")[0]) for u in streaming.partition_updates} == {"source", "map"}


def test_region_failover_restarts_only_the_failed_region():
    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=1.0),
        script=fail_once("map", 0),
    ).start()
    assert sim.run() is J.FINISHED
    assert sim.job_path() == ["CREATED", "RUNNING", "FINISHED"]  # region failover keeps the job RUNNING
    assert sim.attempts("source") == [0, 0, 0, 0]
    assert sim.attempts("map") == [1, 0, 0, 0]
    assert sim.attempts("reduce") == [0, 0, 0]  # not started yet when map (1/4) failed
    [entry] = sim.scheduler.exception_history
    assert entry.task_name == "map (1/4)" and entry.failure == BOOM
    sim.assert_conformant()


def test_full_failover_goes_through_failing_restarting_created():
    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=2.0),
        failover=FailoverStrategyKind.FULL,
        script=fail_once("map", 2),
    ).start()
    assert sim.run() is J.FINISHED
    assert sim.job_path() == ["CREATED", "RUNNING", "FAILING", "RESTARTING", "CREATED", "RUNNING", "FINISHED"]
    assert sim.attempts("source") == [1, 1, 1, 1] and sim.attempts("reduce") == [1, 1, 1]
    restarting = next(st for st in sim.job_steps if st.to_state == "RESTARTING")
    created = next(st for st in sim.job_steps if st.from_state == "RESTARTING")
    failing = next(st for st in sim.job_steps if st.to_state == "FAILING")
    assert created.timestamp - failing.timestamp >= 2.0  # the backoff was honoured
    assert restarting.timestamp <= created.timestamp
    sim.assert_conformant()


def test_restarts_exhausted_fails_with_root_cause_first():
    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=2, delay_s=0.5),
        script=lambda a: BOOM if (a.vertex_id, a.subtask_index) == ("map", 1) else None,
    ).start()
    assert sim.run() is J.FAILED
    assert sim.job_path()[-2:] == ["FAILING", "FAILED"]
    ev = sim.graph.vertices["map"].task_vertices[1]
    assert [ex.attempt_number for ex in ev.prior_executions] + [ev.current_execution.attempt_number] == [0, 1, 2]
    assert all(ex.state is E.FAILED for ex in ev.prior_executions + [ev.current_execution])
    failure = sim.scheduler.failure
    assert failure.exception_type == "ZeroDivisionError"
    assert failure.message.startswith("division by zero")
    assert "recovery is suppressed by FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=2" in failure.message
    assert "(restart strategy fixed-delay (2 attempts) gave up after 3 failures; recovery is suppressed" in failure.message
    assert failure.traceback == BOOM.traceback
    assert len(sim.scheduler.exception_history) == 3
    sim.assert_conformant()


def test_no_restart_strategy_fails_on_first_failure():
    sim = SimulatedCluster(seed_example_job(BLOCKING), script=fail_once("source", 0)).start()
    assert sim.run() is J.FAILED
    assert "recovery is suppressed by NoRestartBackoffTimeStrategy" in sim.scheduler.failure.message
    sim.assert_conformant()


# -- cancel and suspend from every non-terminal status --

def _drive_to(status: JobStatus) -> SimulatedCluster:
    """A job in `status`, with tasks still live where that status has them."""
    if status is J.CREATED:  # waiting for slots that do not exist
        return SimulatedCluster(seed_example_job(BLOCKING), task_managers={"tm-1": 0}).start()
    if status is J.RUNNING:
        sim = SimulatedCluster(seed_example_job(BLOCKING)).start()
        sim.step_tasks()
        sim.step_tasks()
        return sim
    # full failover with a slow cancellation: FAILING until the tasks report CANCELED
    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=3, delay_s=5.0),
        failover=FailoverStrategyKind.FULL,
    ).start()
    sim.step_tasks()
    sim.step_tasks()  # sources RUNNING
    sim.report(ExecutionAttemptId("source", 0, 0), E.FAILED, BOOM)
    if status is J.FAILING:
        return sim
    sim.step_tasks()  # the other sources report CANCELED
    assert sim.scheduler.status is J.RESTARTING
    if status is J.RESTARTING:
        return sim
    if status is J.CANCELLING:
        sim2 = SimulatedCluster(seed_example_job(BLOCKING)).start()
        sim2.step_tasks()
        sim2.apply(sim2.scheduler.cancel(sim2.now))
        return sim2
    raise AssertionError(status)


NON_TERMINAL = [J.CREATED, J.RUNNING, J.FAILING, J.RESTARTING, J.CANCELLING]


@pytest.mark.parametrize("status", NON_TERMINAL, ids=lambda s: s.value)
def test_cancel_from_every_non_terminal_status(status):
    sim = _drive_to(status)
    assert sim.scheduler.status is status
    sim.apply(sim.scheduler.cancel(sim.now))
    assert sim.run() is J.CANCELED
    path = sim.job_path()
    assert path[-2:] == ["CANCELLING", "CANCELED"]
    assert all(ev.state.is_terminal for ev in sim.graph.execution_vertices())
    assert sim.slots.free_slots == sim.slots.total_slots  # every slot went back
    sim.assert_conformant()


@pytest.mark.parametrize("status", NON_TERMINAL, ids=lambda s: s.value)
def test_suspend_from_every_non_terminal_status(status):
    sim = _drive_to(status)
    sim.apply(sim.scheduler.suspend(sim.now, "JobManager shutting down"))
    assert sim.scheduler.status is J.SUSPENDED
    assert sim.job_path()[-1] == "SUSPENDED"
    # Locally terminal at once: no execution waits for a TaskManager's answer, no slot is held.
    assert all(ev.state.is_terminal for ev in sim.graph.execution_vertices())
    sim.scheduler.validate_state()
    while sim.step_tasks():  # late reports of the cancelled tasks change nothing
        pass
    assert sim.scheduler.status is J.SUSPENDED
    assert all(ev.state.is_terminal for ev in sim.graph.execution_vertices())
    sim.assert_conformant(require_terminal=False)


def test_not_enough_slots_waits_then_fails_with_required_vs_available():
    sim = SimulatedCluster(seed_example_job(PIPELINED), task_managers={"tm-1": 3}, slot_request_timeout_s=10.0).start()
    assert sim.waiting_messages and "4 slots" in sim.waiting_messages[-1] and "3" in sim.waiting_messages[-1]
    sim.advance(9.0)
    assert sim.scheduler.status is J.CREATED  # still waiting for TaskManagers
    sim.advance(2.0)
    assert sim.run() is J.FAILED
    assert sim.job_path() == ["CREATED", "FAILING", "FAILED"]
    message = sim.scheduler.failure.message
    assert "slot-sharing group 'default': 4" in message and "3 slots in total" in message
    sim.assert_conformant()


def test_a_task_manager_arriving_in_time_lets_the_waiting_job_run():
    sim = SimulatedCluster(seed_example_job(PIPELINED), task_managers={"tm-1": 3}, slot_request_timeout_s=10.0).start()
    sim.advance(5.0)
    sim.register_task_manager("tm-2", 2)
    assert sim.run() is J.FINISHED
    sim.assert_conformant()


def test_task_manager_loss_fails_its_tasks_and_the_job_recovers():
    sim = SimulatedCluster(
        seed_example_job(PIPELINED),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=1.0),
    ).start()
    sim.step_tasks()
    lost = {a for a, d in sim.running.items() if d.slot.task_manager_id == "tm-1"}
    assert lost
    sim.lose_task_manager("tm-1", "connection broken")
    for attempt in lost:
        ex = sim.graph.find_execution(attempt)
        assert ex.state is E.FAILED and "TaskManager tm-1 lost" in ex.failure.message
    # the replacement TaskManager comes back with the same id
    sim.register_task_manager("tm-1", 3)
    assert sim.run() is J.FINISHED
    assert len(sim.scheduler.exception_history) == len(lost)
    sim.assert_conformant()


def test_failures_inside_a_pending_restart_do_not_count_again():
    sim = SimulatedCluster(
        seed_example_job(PIPELINED),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=1.0),
    ).start()
    sim.step_tasks()
    sim.step_tasks()
    sim.report(ExecutionAttemptId("source", 0, 0), E.FAILED, BOOM)
    # the whole pipelined job is one region; a second failure during cancellation is merged
    sim.report(ExecutionAttemptId("map", 1, 0), E.FAILED, BOOM)
    assert sim.run() is J.FINISHED
    sim.assert_conformant()


def test_reports_for_replaced_attempts_are_ignored():
    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=0.0),
        script=fail_once("source", 0),
    ).start()
    sim.run()
    before = len(sim.execution_steps)
    sim.report(ExecutionAttemptId("source", 0, 0), E.FINISHED)
    assert len(sim.execution_steps) == before


def test_commit_failure_fails_the_job():
    sim = SimulatedCluster(seed_example_job(BLOCKING), commit_error=FailureInfo("IOError", "disk full"))
    # make the reduce vertex a committing sink
    from funke.common.graph.jobgraph import OperatorSpec

    assert sim  # graph built; swap the sink kind on the job graph's vertex for this scenario
    reduce_vertex = sim.graph.vertices["reduce"]
    object.__setattr__(reduce_vertex.job_vertex, "operators", (OperatorSpec("sink.parquet", config={"path": "/tmp/x"}),))
    sim.start()
    assert sim.run() is J.FAILED
    assert sim.job_path()[-3:] == ["RUNNING", "FAILING", "FAILED"]
    assert "disk full" in sim.scheduler.failure.message


def test_all_to_all_at_scale_finishes_and_conforms():
    sim = SimulatedCluster(source_sink_all_to_all(50, ResultPartitionType.BLOCKING), task_managers={"tm-1": 8, "tm-2": 8}).start()
    assert sim.run() is J.FINISHED
    sim.assert_conformant()


def test_partitions_of_failed_attempts_are_released_at_once():
    from funke.common.scheduling import scheduler as s

    sim = SimulatedCluster(
        seed_example_job(BLOCKING),
        restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=1.0),
        script=fail_once("map", 0),
    ).start()
    assert sim.run() is J.FINISHED
    released = [r for a in sim.actions if isinstance(a, s.ReleasePartitions) for r in a.partitions]
    failed_map_output = [r for r in released if r.data_set_id.startswith("map.to.") and r.partition_index == 0 and r.producer_attempt == 0]
    assert failed_map_output, released


# -- regressions found by a review and a random-event fuzz of the scheduler --

def test_a_partition_lost_while_its_consumer_is_pending_restart_is_produced_again():
    """Two TaskManagers restart one after the other while the last stage runs: the second loss
    takes partitions whose consumers FINISHED but are part of the pending restart; their
    producers must run again, or the restarted region waits for them forever."""
    from tests.conformance.graphs import ALL_TO_ALL, connect, job_graph, operator, sink, source

    job = job_graph("two-shuffles", [source("source", 2), operator("map", 3), sink("reduce", 2)],
                    [connect("source", "map", ALL_TO_ALL, BLOCKING), connect("map", "reduce", ALL_TO_ALL, BLOCKING)])
    sim = SimulatedCluster(job, task_managers={"tm-1": 1, "tm-2": 4},
                           restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=10, delay_s=1.0)).start()
    sim.run_until(lambda: all(ev.state is E.DEPLOYING for ev in sim.graph.vertices["reduce"].task_vertices))
    for tm in ("tm-1", "tm-2"):  # each registers again with the same id: the old process is gone
        sim.register_task_manager(tm, 2)
    assert sim.run() is J.FINISHED
    sim.assert_conformant()


def test_a_lost_slot_that_a_waiting_batch_needs_is_requested_again():
    from tests.conformance.graphs import POINTWISE, connect, job_graph, sink, source

    job = job_graph("shared", [source("a", 1), source("x", 1, slot_sharing_group="x"), sink("b", 1)],
                    [connect("x", "b", POINTWISE, PIPELINED)])  # regions {a} and {x, b}; b shares a's slot
    sim = SimulatedCluster(job, task_managers={"tm-1": 1},
                           restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=5, delay_s=0.0)).start()
    sim.run_until(lambda: sim.graph.vertices["a"].task_vertices[0].state is E.FINISHED)
    sim.lose_task_manager("tm-1")
    sim.register_task_manager("tm-2", 4)
    assert sim.run() is J.FINISHED
    assert sim.slots.free_slots == sim.slots.total_slots
    sim.assert_conformant()


def test_a_region_restart_timer_decides_even_if_the_clock_says_it_is_early():
    from funke.common.scheduling import scheduler as s

    sim = SimulatedCluster(seed_example_job(BLOCKING),
                           restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=10.0),
                           script=fail_once("source", 0)).start()
    sim.step_tasks()
    sim.step_tasks()
    sim.step_tasks()  # source (1/4) fails; the restart is due in 10 s
    timer = next(a for a in reversed(sim.actions) if isinstance(a, s.StartTimer) and a.timer.kind == "restart")
    sim.apply(sim.scheduler.on_timer(timer.timer, timer.at - 0.001))  # a wall clock stepped back
    assert sim.graph.vertices["source"].task_vertices[0].current_execution.attempt_number == 1
    assert sim.run() is J.FINISHED


@pytest.mark.parametrize("failover", [FailoverStrategyKind.FULL, FailoverStrategyKind.REGION])
def test_a_task_that_never_stops_cannot_hold_a_failover_forever(failover):
    sim = SimulatedCluster(seed_example_job(PIPELINED), failover=failover,
                           restart_strategy=FixedDelayRestartBackoffTimeStrategy(attempts=3, delay_s=1.0)).start()
    sim.step_tasks()
    sim.step_tasks()
    sim.report(ExecutionAttemptId("source", 0, 0), E.FAILED, BOOM)
    stuck = ExecutionAttemptId("map", 2, 0)
    sim.hang(stuck)  # its thread never stops nor reports: the task keeps running
    sim.advance(sim.scheduler.cancellation_timeout_s + 1)
    assert sim.graph.find_execution(stuck).state is E.FAILED
    assert sim.run() is J.FINISHED
    assert any(e.failure.exception_type == "CancellationTimeout" for e in sim.scheduler.exception_history)
    sim.assert_conformant()


def test_a_cancellation_timeout_fails_a_cancelled_job_and_is_in_the_exception_history():
    sim = SimulatedCluster(seed_example_job(PIPELINED)).start()
    sim.step_tasks()
    sim.apply(sim.scheduler.cancel(sim.now))
    for attempt in list(sim.running):  # no TaskManager answers
        sim.hang(attempt)
    sim.advance(sim.scheduler.cancellation_timeout_s + 1)
    assert sim.scheduler.status is J.FAILED
    assert sim.scheduler.failure.exception_type == "CancellationTimeout"
    assert [e.failure.exception_type for e in sim.scheduler.exception_history] == ["CancellationTimeout"]
    # A terminal job has no execution left CANCELING: the ones that never answered gave up.
    stuck = [ev.current_execution for ev in sim.graph.execution_vertices() if not ev.state.is_terminal]
    assert stuck == []
    sim.scheduler.validate_state()
    sim.assert_conformant()


@pytest.mark.parametrize("status", [J.CREATED, J.RUNNING, J.FAILING, J.RESTARTING, J.CANCELLING], ids=lambda s: s.value)
def test_an_internal_error_fails_the_job_without_a_restart_from_every_live_status(status):
    """The JobManager raised between a decision and its effect: the same decision would meet the
    same error, so no restart; every slot is freed and nothing waits for a TaskManager."""
    sim = _drive_to(status)
    error = FailureInfo("JobManagerError", "the deployment descriptor could not be built")
    deploying = [a for a in sim.running if sim.graph.find_execution(a).state is E.DEPLOYING]
    sim.apply(sim.scheduler.on_internal_error(error, sim.now, deploying))
    assert all(sim.graph.find_execution(a).state is E.FAILED for a in deploying)
    final = sim.run()
    assert final is (J.CANCELED if status is J.CANCELLING else J.FAILED)
    assert any(e.failure.exception_type == "JobManagerError" for e in sim.scheduler.exception_history)
    if final is J.FAILED:
        assert "recovery is suppressed" in sim.scheduler.failure.message
    assert sim.slots.free_slots == sim.slots.total_slots
    sim.scheduler.validate_state()
    sim.assert_conformant()


# ---------------------------------------------------------------------------- recovery by a new leader


class _Deployments(SimulatedCluster):
    def observe(self, action: object) -> None:
        if isinstance(action, s.DeployTask):
            self.deployed = getattr(self, "deployed", []) + [action.deployment.attempt]


def test_a_recovered_batch_job_takes_over_the_finished_regions_and_runs_only_the_rest():
    job = seed_example_job(ResultPartitionType.BLOCKING)
    first = SimulatedCluster(job).start()
    sources = first.graph.vertices["source"].task_vertices
    first.run_until(lambda: all(ev.state is ExecutionState.FINISHED for ev in sources))
    finished = first.scheduler.finished_subtasks()
    assert {(f.vertex_id, f.subtask_index) for f in finished} >= {("source", i) for i in range(4)}
    # The leader died here. The next one recovers the job with attempts from 1000 up and takes
    # over what finished: those subtasks are never deployed again.
    second = _Deployments(job, incarnation=Incarnation(2, "h:2", (), 1000, None))
    second.apply(second.scheduler.restore_finished(finished, second.now, "finished under epoch 1"))
    second.scheduler.validate_state()
    assert second.start().run() is JobStatus.FINISHED
    redeployed = {(a.vertex_id, a.subtask_index) for a in getattr(second, "deployed", [])}
    taken_over = {(f.vertex_id, f.subtask_index) for f in finished}
    assert not redeployed & taken_over and redeployed | taken_over == {
        (v, i) for v, p in (("source", 4), ("map", 4), ("reduce", 3)) for i in range(p)}
    assert second.attempts("source") == first.attempts("source")
    assert all(n >= 1000 for v in ("map", "reduce") for n, ev in zip(second.attempts(v), second.graph.vertices[v].task_vertices)
               if (v, ev.subtask_index) not in taken_over)
    second.assert_conformant()
    second.validate_cores()


def test_a_job_whose_every_subtask_finished_before_recovery_only_commits():
    job = seed_example_job(ResultPartitionType.BLOCKING)
    first = SimulatedCluster(job).start()
    first.run_until(lambda: first.scheduler.state_counts.get(ExecutionState.FINISHED, 0) == 11)
    second = _Deployments(job, incarnation=Incarnation(2, "h:2", (), 1000, None))
    second.apply(second.scheduler.restore_finished(first.scheduler.finished_subtasks(), second.now, "taken over"))
    assert second.start().run() is JobStatus.FINISHED
    assert not getattr(second, "deployed", [])
    assert second.job_path() == ["CREATED", "RUNNING", "FINISHED"]


def test_a_taken_over_attempt_keeps_its_taskmanager_slot_and_timeline():
    """What `funke status` shows of a subtask a new leader took over is where and when it ran
    under the earlier one (through the HA store's progress records), not a deployment made up at
    the recovery instant with no TaskManager."""
    from funke.jobmanager.highavailability import progress_record, read_progress

    job = seed_example_job(ResultPartitionType.BLOCKING)
    first = SimulatedCluster(job).start()
    sources = first.graph.vertices["source"].task_vertices
    first.run_until(lambda: all(ev.state is ExecutionState.FINISHED for ev in sources))
    before = {ev.subtask_index: ev.current_execution for ev in sources}
    stored = read_progress([progress_record(f) for f in first.scheduler.finished_subtasks()])
    second = _Deployments(job, incarnation=Incarnation(2, "h:2", (), 1000, None))
    second.now = first.now + 30.0  # the recovery, well after the sources finished
    second.apply(second.scheduler.restore_finished(stored, second.now, "finished under epoch 1"))
    for ev in second.graph.vertices["source"].task_vertices:
        was, now = before[ev.subtask_index], ev.current_execution
        assert now.attempt_number == was.attempt_number
        assert now.slot == was.slot and now.task_manager_id is not None
        assert [(t.from_state, t.to_state, t.timestamp) for t in now.machine.history] == \
               [(t.from_state, t.to_state, t.timestamp) for t in was.machine.history]
        assert ExecutionState.RUNNING in now.machine.path()
        assert now.machine.timestamp_of(ExecutionState.FINISHED) < second.now
        assert "finished under epoch 1" in now.machine.history[-1].cause
        assert now.io == was.io
    assert second.start().run() is JobStatus.FINISHED
    second.assert_conformant()
    second.validate_cores()
