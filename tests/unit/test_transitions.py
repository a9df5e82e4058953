"""The transition bookkeeping (`transitions.py`): one implementation behind the single and the bulk
entry, the effects of each move, an illegal move, and the execution table a scheduler is given
(the specification's, or a test's deliberately defective one)."""

from __future__ import annotations

import pytest

from funke.common.graph.deployment import TaskReport
from funke.common.graph.executiongraph import ExecutionGraph, SlotId
from funke.common.graph.jobgraph import ResultPartitionType
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy
from funke.common.scheduling import scheduler as s
from funke.common.scheduling.transitions import EFFECTS
from funke.common.states import (
    EXECUTION_STATE_TRANSITIONS,
    SKIP_INITIALIZING,
    SKIP_INITIALIZING_EXECUTION_TRANSITIONS,
    TESTING_MUTANTS,
    ExecutionState,
    IllegalTransition,
    is_legal_path,
)
from tests.conformance.graphs import source_sink_all_to_all

E = ExecutionState
P = 4


def _deployed(table=EXECUTION_STATE_TRANSITIONS) -> tuple[s.Scheduler, list[s.DeployTask]]:
    """A PIPELINED source -> sink job, every subtask DEPLOYING in a slot of its own."""
    graph = ExecutionGraph(source_sink_all_to_all(P, ResultPartitionType.PIPELINED), "job", 0.0)
    scheduler = s.Scheduler(graph, restart_strategy=FixedDelayRestartBackoffTimeStrategy(3, 0.0),
                            execution_transitions=table)
    (request,) = [r for a in scheduler.start(0.0) if isinstance(a, s.RequestSlots) for r in a.requests]
    actions = scheduler.on_slots_allocated(request.request_id, [SlotId("tm-1", i) for i in range(request.count)], 0.0)
    return scheduler, [a for a in actions if isinstance(a, s.DeployTask)]


def _plain(actions: list) -> list:
    return [a._replace(transition=a.transition._replace(stimulus_id="")) if isinstance(a, s.ExecutionStateChanged)
            else a for a in actions]


@pytest.mark.parametrize("to", [E.CANCELING, E.FAILED])
def test_the_bulk_entry_does_what_the_single_one_does_one_execution_at_a_time(to):
    one, _ = _deployed()
    bulk, _ = _deployed()
    one._out, bulk._out = [], []
    for ex in [ev.current_execution for ev in one.graph.execution_vertices()]:
        one._transition(ex, to, 1.0, "moved")
    bulk._transition_all([ev.current_execution for ev in bulk.graph.execution_vertices()], to, 1.0, "moved")
    assert _plain(bulk._out) == _plain(one._out) and len(bulk._out) >= 2 * P
    assert bulk.state_counts == one.state_counts == {E.CREATED: 0, E.SCHEDULED: 0, E.DEPLOYING: 0, to: 2 * P}
    assert (bulk._non_terminal, bulk._garbage) == (one._non_terminal, one._garbage)
    if to is E.FAILED:  # each group's last execution ended: its slot goes to the job's pool, whose timer starts
        assert len(bulk.slots.idle) == P and not bulk.slots.slot_of
        assert [a.timer.kind for a in bulk._out if isinstance(a, s.StartTimer)] == ["slot-idle"]
        assert set(bulk._garbage) == {"tm-1"} and len(bulk._garbage["tm-1"]) == P  # the sources' partitions
    # executions leaving one state share its transition record
    histories = [ev.current_execution.history[-1] for ev in bulk.graph.execution_vertices()]
    assert all(t is histories[0] for t in histories)


def test_a_deployment_moves_each_execution_into_its_groups_slot_with_its_own_cause():
    scheduler, deployed = _deployed()
    assert len(deployed) == 2 * P and scheduler.state_counts[E.DEPLOYING] == 2 * P
    for d in deployed:
        ex = scheduler.graph.find_execution(d.attempt)
        assert ex.slot == d.slot == scheduler.slots.slot_of[scheduler.plan.group_of(ex.vertex)]
        assert ex.history[-1].cause == f"deploying to tm-1/slot-{d.slot.slot_index}"
    assert scheduler._task_managers_used == {"tm-1"}
    scheduler.validate_state()


def test_an_illegal_move_raises_with_the_story_and_the_moves_before_it_count():
    scheduler, _ = _deployed()
    executions = [ev.current_execution for ev in scheduler.graph.execution_vertices()]
    scheduler._transition(executions[1], E.CANCELING, 1.0, "cancelled")
    scheduler._out = []
    with pytest.raises(IllegalTransition) as raised:
        scheduler._transition_all(executions[:3], E.INITIALIZING, 1.0, "reported")
    assert "CANCELING" in str(raised.value) and "INITIALIZING" in str(raised.value)
    assert [ex.state for ex in executions[:3]] == [E.INITIALIZING, E.CANCELING, E.DEPLOYING]
    scheduler.validate_state()  # the counts include the one move made before the illegal one


def test_effects_of_a_move():
    assert EFFECTS[E.SCHEDULED, E.DEPLOYING][:3] == (1, 0, False)  # runs on a TaskManager now
    assert EFFECTS[E.CREATED, E.SCHEDULED][:3] == (0, 1, False)  # needs its group's slot now
    deployed, live, terminal, finished, garbage = EFFECTS[E.RUNNING, E.FAILED]
    assert (deployed, live, terminal, finished, garbage) == (-1, -1, True, False, True)
    assert EFFECTS[E.RUNNING, E.FINISHED][2:] == (True, True, False)  # its partitions are the job's output
    assert EFFECTS[E.SCHEDULED, E.CANCELED][4] is False  # it never ran: nothing to release


def test_the_skip_initializing_mutant_is_a_table_the_specification_forbids():
    assert TESTING_MUTANTS[SKIP_INITIALIZING] is SKIP_INITIALIZING_EXECUTION_TRANSITIONS
    path = [E.CREATED, E.SCHEDULED, E.DEPLOYING, E.RUNNING, E.FINISHED]
    assert is_legal_path(SKIP_INITIALIZING_EXECUTION_TRANSITIONS, path)
    assert not is_legal_path(EXECUTION_STATE_TRANSITIONS, path)


@pytest.mark.parametrize("table", [EXECUTION_STATE_TRANSITIONS, SKIP_INITIALIZING_EXECUTION_TRANSITIONS])
def test_a_scheduler_follows_the_table_it_is_given(table):
    scheduler, deployed = _deployed(table)
    attempt = deployed[0].attempt
    scheduler.on_task_states([TaskReport("job", attempt, E.INITIALIZING), TaskReport("job", attempt, E.RUNNING)], 1.0)
    path = scheduler.graph.find_execution(attempt).path()
    if table is EXECUTION_STATE_TRANSITIONS:
        assert path == [E.CREATED, E.SCHEDULED, E.DEPLOYING, E.INITIALIZING, E.RUNNING]
    else:  # the defect: INITIALIZING is dropped, DEPLOYING -> RUNNING taken
        assert path == [E.CREATED, E.SCHEDULED, E.DEPLOYING, E.RUNNING]
    scheduler.validate_state()


def test_the_cluster_option_gives_each_jobs_scheduler_the_mutant_table(tmp_path):
    import asyncio

    from funke.common.configuration import ClusterConfiguration
    from funke.jobmanager.dispatcher import Dispatcher
    from tests.unit.test_jobmaster import noop_job

    async def scenario() -> None:
        for mutant, table in (("", EXECUTION_STATE_TRANSITIONS), (SKIP_INITIALIZING, SKIP_INITIALIZING_EXECUTION_TRANSITIONS)):
            dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path / (mutant or "spec")), testing_mutant=mutant))
            try:
                _, scheduler, _ = dispatcher._build(noop_job("job"), "job", 0.0)
                assert scheduler.execution_transitions is table
            finally:
                await dispatcher.stop()

    asyncio.run(scenario())
