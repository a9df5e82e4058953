"""Every (from, to) pair of both state tables, the report resolution, and random event sequences.

The expected tables come from `assertions.py` (written from the specification); a change to
`funke.common.states` that adds or removes a transition fails here.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funke.common.states import (
    EXECUTION_STATE_TRANSITIONS,
    JOB_STATUS_TRANSITIONS,
    ExecutionState,
    IllegalTransition,
    JobStatus,
    StateMachine,
    render_mermaid,
    QUERY_MODE_TRANSITIONS,
    QUERY_STATE_TRANSITIONS,
    BATCH_PHASE_TRANSITIONS,
    CONNECTION_STATE_TRANSITIONS,
    RESCALE_STATE_TRANSITIONS,
    resolve_report,
)
from funke.common.conformance import (
    EXPECTED_EXECUTION_TRANSITIONS,
    EXPECTED_JOB_TRANSITIONS,
    assert_execution_path,
    assert_job_path,
    steps_from_history,
)

J, E = JobStatus, ExecutionState

JOB_PAIRS = list(itertools.product(JobStatus, JobStatus))
EXECUTION_PAIRS = list(itertools.product(ExecutionState, ExecutionState))


def test_job_table_equals_the_specification():
    assert {s: set(t) for s, t in JOB_STATUS_TRANSITIONS.items()} == EXPECTED_JOB_TRANSITIONS


def test_execution_table_equals_the_specification():
    assert {s: set(t) for s, t in EXECUTION_STATE_TRANSITIONS.items()} == EXPECTED_EXECUTION_TRANSITIONS


def _machine(table, state, entity="entity"):
    m = StateMachine(entity, table, state, now=100.0)
    return m


@pytest.mark.parametrize("src,dst", JOB_PAIRS, ids=[f"{a.value}->{b.value}" for a, b in JOB_PAIRS])
def test_job_transition_pair(src, dst):
    m = _machine(JOB_STATUS_TRANSITIONS, src, "job 'wc' (42)")
    if dst in EXPECTED_JOB_TRANSITIONS[src]:
        t = m.transition(dst, 101.0, "because")
        assert m.state is dst
        assert (t.from_state, t.to_state, t.timestamp, t.cause) == (src, dst, 101.0, "because")
        assert m.history == [t]
    else:
        with pytest.raises(IllegalTransition) as err:
            m.transition(dst, 101.0, "because")
        assert m.state is src and m.history == []
        assert (err.value.from_state, err.value.to_state, err.value.entity) == (src, dst, "job 'wc' (42)")


@pytest.mark.parametrize("src,dst", EXECUTION_PAIRS, ids=[f"{a.value}->{b.value}" for a, b in EXECUTION_PAIRS])
def test_execution_transition_pair(src, dst):
    m = _machine(EXECUTION_STATE_TRANSITIONS, src, "map (1/4) attempt #0")
    if dst in EXPECTED_EXECUTION_TRANSITIONS[src]:
        m.transition(dst, 101.0)
        assert m.state is dst and len(m.history) == 1
    else:
        with pytest.raises(IllegalTransition):
            m.transition(dst, 101.0)
        assert m.state is src and m.history == []


def test_terminal_job_statuses_have_no_way_out_and_suspended_is_only_locally_terminal():
    for s in JobStatus:
        assert s.is_terminal == (not EXPECTED_JOB_TRANSITIONS[s])
    assert {s for s in JobStatus if s.is_globally_terminal} == {J.FINISHED, J.CANCELED, J.FAILED}
    assert J.SUSPENDED.is_terminal and not J.SUSPENDED.is_globally_terminal
    non_terminal = [s for s in JobStatus if not s.is_terminal]
    assert all(J.SUSPENDED in EXPECTED_JOB_TRANSITIONS[s] for s in non_terminal)


def test_terminal_execution_states():
    assert {s for s in ExecutionState if s.is_terminal} == {E.FINISHED, E.CANCELED, E.FAILED}
    assert all(E.FAILED in EXPECTED_EXECUTION_TRANSITIONS[s] for s in ExecutionState if not s.is_terminal)


@pytest.mark.parametrize("current", list(ExecutionState))
@pytest.mark.parametrize("reported", list(ExecutionState))
def test_report_resolution(current, reported):
    resolved = resolve_report(current, reported)
    if current is E.CANCELING and reported in (E.FINISHED, E.FAILED):
        assert resolved is E.CANCELED
    else:
        assert resolved is reported


def test_illegal_transition_names_entity_states_cause_and_story():
    m = StateMachine("map (2/4) attempt #1", EXECUTION_STATE_TRANSITIONS, E.CREATED, now=1.0)
    m.transition(E.SCHEDULED, 2.0, "scheduled")
    m.transition(E.DEPLOYING, 3.0, "to tm-1/slot-0")
    m.transition(E.FINISHED, 4.0, "done")
    with pytest.raises(IllegalTransition) as err:
        m.transition(E.RUNNING, 5.0, "late report")
    text = str(err.value)
    for needle in ("map (2/4) attempt #1", "FINISHED -> RUNNING", "late report",
                   "CREATED -> SCHEDULED", "DEPLOYING -> FINISHED", "to tm-1/slot-0"):
        assert needle in text
    assert len(err.value.history) == 3


def test_state_timestamps_and_path():
    m = StateMachine("x", EXECUTION_STATE_TRANSITIONS, E.CREATED, now=10.0)
    for i, s in enumerate([E.SCHEDULED, E.DEPLOYING, E.INITIALIZING, E.RUNNING, E.FINISHED]):
        m.transition(s, 11.0 + i)
    assert m.timestamp_of(E.CREATED) == 10.0
    assert m.timestamp_of(E.RUNNING) == 14.0
    assert m.timestamp_of(E.CANCELED) is None
    assert [s.value for s in m.path()] == ["CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "FINISHED"]


def test_a_recorded_transition_cannot_be_rewritten():
    m = StateMachine("x", EXECUTION_STATE_TRANSITIONS, E.CREATED, now=10.0)
    t = m.transition(E.SCHEDULED, 11.0, "scheduled", "jm:start-1")
    with pytest.raises(AttributeError):
        t.to_state = E.FAILED  # type: ignore[misc]
    assert (t.from_state, t.to_state, t.timestamp, t.cause, t.stimulus_id) == (
        E.CREATED, E.SCHEDULED, 11.0, "scheduled", "jm:start-1")
    assert str(t) == "CREATED -> SCHEDULED at 11.000 (scheduled) [jm:start-1]"
    assert m.history == [t]


def test_mermaid_diagram_is_generated_from_the_table():
    text = render_mermaid(JOB_STATUS_TRANSITIONS)
    edges = {line.strip() for line in text.splitlines() if "-->" in line and "[*]" not in line}
    expected = {f"{a.value} --> {b.value}" for a, targets in EXPECTED_JOB_TRANSITIONS.items() for b in targets}
    assert edges == expected


def test_the_docs_draw_every_table_from_the_code():
    # Each state table has a page that asks for its diagram, and the diagram the site is built
    # with is the one drawn from that very table (not from another, not from a stale copy).
    from pathlib import Path

    from funke.deploy import docs, sitedocs

    drawn = {
        "job-status-diagram": JOB_STATUS_TRANSITIONS,
        "execution-state-diagram": EXECUTION_STATE_TRANSITIONS,
        "connection-state-diagram": CONNECTION_STATE_TRANSITIONS,
        "query-mode-diagram": QUERY_MODE_TRANSITIONS,
        "query-state-diagram": QUERY_STATE_TRANSITIONS,
        "batch-phase-diagram": BATCH_PHASE_TRANSITIONS,
        "rescale-state-diagram": RESCALE_STATE_TRANSITIONS,
    }
    assert set(docs.SECTIONS) == set(drawn)
    lines = {line for page in (Path(__file__).resolve().parents[2] / "docs").rglob("*.md")
             for line in page.read_text().splitlines()}
    for section, table in drawn.items():
        assert f"<!-- generated: diagram:{section} -->" in lines, f"no page draws {section}"
        assert render_mermaid(table) in sitedocs.render(f"diagram:{section}"), section


# -- property-based: random event sequences --

@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(list(JobStatus)), max_size=40), st.sampled_from(list(JobStatus)))
def test_random_job_sequences_stay_on_the_table(targets, initial):
    _run_random_sequence(JOB_STATUS_TRANSITIONS, EXPECTED_JOB_TRANSITIONS, initial, targets, assert_job_path)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(list(ExecutionState)), max_size=40), st.sampled_from(list(ExecutionState)))
def test_random_execution_sequences_stay_on_the_table(targets, initial):
    _run_random_sequence(EXECUTION_STATE_TRANSITIONS, EXPECTED_EXECUTION_TRANSITIONS, initial, targets, assert_execution_path)


def _run_random_sequence(table, expected, initial, targets, assert_path):
    m = StateMachine("entity", table, initial, now=0.0)
    reached_terminal_at = None
    for i, target in enumerate(targets):
        before_state, before_len = m.state, len(m.history)
        legal = target in expected[before_state]
        try:
            m.transition(target, float(i + 1))
            assert legal, f"{before_state}->{target} accepted but not in the specification"
        except IllegalTransition:
            assert not legal, f"{before_state}->{target} rejected but legal"
            assert m.state is before_state and len(m.history) == before_len
        assert m.state in expected  # never an unknown state
        if not expected[m.state] and reached_terminal_at is None:
            reached_terminal_at = len(m.history)
    if reached_terminal_at is not None:  # terminal states absorb
        assert len(m.history) == reached_terminal_at
    assert_path(steps_from_history("entity", m.history), initial.value)
