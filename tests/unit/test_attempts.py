"""New attempts of ExecutionVertices: numbering, the attempts kept, and nothing half-done."""

from __future__ import annotations

import pytest

from funke.common.graph.executiongraph import ATTEMPTS_HISTORY_SIZE, Execution, ExecutionGraph, Incarnation, new_attempts
from funke.common.states import EXECUTION_STATE_TRANSITIONS, ExecutionState
from tests.conformance.graphs import PIPELINED, source_sink_all_to_all

E = ExecutionState


def _end(ex: Execution, state: ExecutionState = E.CANCELED) -> None:
    ex.transition(state, 1.0, "ended")


def test_an_attempt_is_its_own_state_machine():
    graph = ExecutionGraph(source_sink_all_to_all(2, PIPELINED), "job", 0.0)
    ex = graph.vertices["source"].task_vertices[1].current_execution
    assert ex.machine is ex and ex.table is EXECUTION_STATE_TRANSITIONS and ex.state is E.CREATED
    ex.transition(E.SCHEDULED, 2.0, "scheduled", "s-1")
    assert ex.path() == [E.CREATED, E.SCHEDULED] and ex.timestamp_of(E.SCHEDULED) == 2.0
    with pytest.raises(Exception, match=r"source \(2/2\) attempt #0"):
        ex.transition(E.FINISHED, 3.0, "not from SCHEDULED")


def test_new_attempts_are_numbered_on_and_keep_the_latest_ones():
    graph = ExecutionGraph(source_sink_all_to_all(3, PIPELINED), "job", 0.0)
    vertices = graph.execution_vertices()
    for round_ in range(ATTEMPTS_HISTORY_SIZE + 3):
        for ev in vertices:
            _end(ev.current_execution)
        new_attempts(vertices, float(round_))
    ev = vertices[4]
    assert ev.current_execution.attempt_number == ATTEMPTS_HISTORY_SIZE + 3
    assert ev.current_execution.state is E.CREATED and ev.current_execution.created_at == ATTEMPTS_HISTORY_SIZE + 2
    assert [ex.attempt_number for ex in ev.prior_executions] == list(range(3, ATTEMPTS_HISTORY_SIZE + 3))
    assert ev.execution(5) is ev.prior_executions[2] and ev.execution(0) is None


def test_a_recovered_job_numbers_its_attempts_from_the_runs_first():
    graph = ExecutionGraph(source_sink_all_to_all(1, PIPELINED), "job", 0.0, Incarnation(first_attempt_number=7))
    ev = graph.vertices["sink"].task_vertices[0]
    assert ev.current_execution.attempt_number == 7
    ev.current_execution = Execution(ev, 2, 0.0)  # taken over from an earlier run
    _end(ev.current_execution)
    assert ev.reset_for_new_execution(1.0).attempt_number == 7  # not 3: below the run's first


def test_no_new_attempt_while_any_current_one_is_live():
    graph = ExecutionGraph(source_sink_all_to_all(2, PIPELINED), "job", 0.0)
    vertices = graph.execution_vertices()
    _end(vertices[0].current_execution)
    vertices[1].current_execution.transition(E.SCHEDULED, 1.0, "scheduled")
    before = [ev.current_execution for ev in vertices]
    with pytest.raises(ValueError, match=r"source \(2/2\): cannot start a new attempt"):
        new_attempts(vertices, 2.0)
    assert [ev.current_execution for ev in vertices] == before  # the first one was not replaced either
