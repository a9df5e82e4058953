"""The live rescale's sans-IO core (`funke.common.scheduling.rescale`): every row of its table taken
with the actions it gives, every event a state has no row for refused with nothing changed, the
story `funke status` prints, and the query run's side of a rescale's stop (its tasks are kept).
No clock, no cluster: the time is passed in."""

from __future__ import annotations

import pytest

from funke.common.scheduling import rescale as rs
from funke.common.states import (
    RESCALE_STATE_TRANSITIONS,
    IllegalTransition,
    JobStatus,
    RescaleState,
    StateMachine,
    is_legal_path,
)

R = RescaleState
GRAPH = object()  # the job graph at the new parallelism: carried, never read


def fresh(now: float = 100.0) -> rs.Rescale:
    return rs.Rescale("job-1", "rescaled: agg 2 -> 4", {"agg": 4, "src": 2}, GRAPH, 30.0, now, last_batch_id=7)


# One event of each kind, at time `now`.
def event(kind: type, now: float) -> rs.Event:
    sid = f"{kind.__name__}-{now:g}"
    match kind:
        case rs.Refused:
            return rs.Refused("needs 8 slots; the cluster has 2 free", now, sid)
        case rs.QueryStopped:
            return rs.QueryStopped("stopped", now, sid)
        case rs.JobSuspended:
            return rs.JobSuspended("rescaled: agg 2 -> 4", now, sid)
        case rs.JobEnded:
            return rs.JobEnded(JobStatus.CANCELED, "cancelled by the user", now, sid)
        case rs.StartFailed:
            return rs.StartFailed("the store cannot be reached", now, sid)
    return kind(now, sid)


# How to bring a fresh rescale into each state.
ROUTE = {
    R.REQUESTED: [],
    R.STOPPING: [rs.Accepted],
    R.SUSPENDED: [rs.Accepted, rs.QueryStopped],
    R.STARTING: [rs.Accepted, rs.QueryStopped, rs.JobSuspended],
    R.RUNNING: [rs.Accepted, rs.QueryStopped, rs.JobSuspended, rs.NextRunRunning],
    R.FAILED: [rs.Refused],
}
EVENTS = [rs.Accepted, rs.Refused, rs.QueryStopped, rs.StopTimedOut, rs.JobSuspended, rs.JobEnded,
          rs.NextRunRunning, rs.StartFailed]


def rescale_in(state: RescaleState) -> rs.Rescale:
    r = fresh()
    for n, kind in enumerate(ROUTE[state]):
        r.handle(event(kind, 101.0 + n))
    assert r.state is state
    return r


# What each row gives the shells to do: by the event, and the state it ends in.
EXPECTED_ACTIONS = {
    (rs.Accepted, R.REQUESTED): [rs.StopQuery],
    (rs.Refused, R.REQUESTED): [],
    (rs.JobSuspended, R.REQUESTED): [rs.ArchiveJob],
    (rs.JobEnded, R.REQUESTED): [rs.ArchiveJob],
    (rs.QueryStopped, R.STOPPING): [rs.SuspendJob],
    (rs.StopTimedOut, R.STOPPING): [rs.SuspendJob],
    (rs.JobSuspended, R.STOPPING): [rs.StartNextRun],
    (rs.JobEnded, R.STOPPING): [rs.ArchiveJob],
    (rs.JobSuspended, R.SUSPENDED): [rs.StartNextRun],
    (rs.NextRunRunning, R.STARTING): [],
    (rs.StartFailed, R.STARTING): [rs.ArchiveJob],
    (rs.JobSuspended, R.STARTING): [rs.ArchiveJob],
    (rs.JobEnded, R.STARTING): [rs.ArchiveJob],
}


def test_the_rows_take_every_transition_of_the_table_and_only_those():
    assert set(rs.ROWS) == set(EXPECTED_ACTIONS)
    taken = set()
    for (kind, state), path in rs.ROWS.items():
        assert is_legal_path(RESCALE_STATE_TRANSITIONS, [state, *path]), (kind, state, path)
        taken |= set(zip([state, *path], path))
    assert taken == {(a, b) for a, targets in RESCALE_STATE_TRANSITIONS.items() for b in targets}
    # RUNNING and FAILED end it; every other state can still fail but SUSPENDED (its next run starts)
    assert [s for s in RescaleState if not RESCALE_STATE_TRANSITIONS[s]] == [R.RUNNING, R.FAILED]
    assert [s for s in RescaleState if R.FAILED not in RESCALE_STATE_TRANSITIONS[s]] == [
        R.SUSPENDED, R.RUNNING, R.FAILED]


@pytest.mark.parametrize(("kind", "state"), list(rs.ROWS), ids=lambda v: getattr(v, "__name__", getattr(v, "value", v)))
def test_every_row_enters_its_states_with_the_event_s_time_and_stimulus_and_gives_its_actions(kind, state):
    r = rescale_in(state)
    before = len(r.history)
    e = event(kind, 200.0)
    actions = r.handle(e)
    path = rs.ROWS[(kind, state)]
    assert r.state is path[-1]
    taken = r.history[before:]
    assert [(t.from_state, t.to_state) for t in taken] == list(zip([state, *path], path))
    assert all(t.timestamp == 200.0 and t.stimulus_id == e.stimulus_id and t.cause for t in taken)
    assert [type(a) for a in actions] == EXPECTED_ACTIONS[(kind, state)]
    assert all(a.stimulus_id == e.stimulus_id for a in actions)
    assert r.active == (r.state not in (R.RUNNING, R.FAILED))
    assert bool(r.failure) == (r.state is R.FAILED)


@pytest.mark.parametrize(("kind", "state"), [(k, s) for k in EVENTS for s in RescaleState if (k, s) not in rs.ROWS],
                         ids=lambda v: getattr(v, "__name__", getattr(v, "value", v)))
def test_an_event_its_state_has_no_row_for_is_refused_and_changes_nothing(kind, state):
    r = rescale_in(state)
    story = list(r.history)
    with pytest.raises(IllegalTransition) as refused:
        r.handle(event(kind, 300.0))
    assert r.state is state and r.history == story
    assert refused.value.from_state is state and "rescale of job job-1" in str(refused.value)
    assert kind.__name__ in refused.value.cause


@pytest.mark.parametrize(("src", "dst"), [(a, b) for a in RescaleState for b in RescaleState
                                          if b not in RESCALE_STATE_TRANSITIONS[a]])
def test_the_table_refuses_every_transition_it_does_not_list(src, dst):
    m = StateMachine("rescale of job j", RESCALE_STATE_TRANSITIONS, src, 0.0)
    with pytest.raises(IllegalTransition):
        m.transition(dst, 1.0)
    assert m.state is src and m.history == []


def test_a_rescale_s_story_from_the_request_to_its_next_run():
    r = fresh(now=10.0)
    assert (r.state, r.requested_at, r.active, r.history) == (R.REQUESTED, 10.0, True, [])
    assert r.handle(rs.Accepted(10.5, "rescale-accepted")) == [rs.StopQuery(30.0, "rescale-accepted")]
    assert r.handle(rs.QueryStopped("stopped", 12.0, "query-stopped")) == [
        rs.SuspendJob("rescaled: agg 2 -> 4", "query-stopped")]
    assert r.handle(rs.JobSuspended("rescaled: agg 2 -> 4", 12.0, "jm:suspend")) == [
        rs.StartNextRun(GRAPH, "jm:suspend")]
    assert r.handle(rs.NextRunRunning(14.5, "run-1-started")) == []
    assert [(t.to_state, t.timestamp, t.stimulus_id) for t in r.history] == [
        (R.STOPPING, 10.5, "rescale-accepted"), (R.SUSPENDED, 12.0, "query-stopped"),
        (R.STARTING, 12.0, "jm:suspend"), (R.RUNNING, 14.5, "run-1-started")]
    assert [t.cause for t in r.history] == [
        "the query stops at a batch boundary: the batches in flight commit, its tasks are kept",
        "the query stopped: every batch it ran is committed",
        "the next run of the job starts at the new parallelism, from its checkpoint",
        "every task of the next run is RUNNING; the query goes on from its checkpoint"]
    assert not r.active and r.failure == ""


def test_a_stop_that_times_out_suspends_the_job_all_the_same_and_the_next_run_runs_the_batch_again():
    r = rescale_in(R.STOPPING)
    (suspend,) = r.handle(rs.StopTimedOut(140.0, "stop-timed-out"))
    assert suspend.cause == "rescaled: agg 2 -> 4 (its batch in flight did not commit in time; the new run runs it again)"
    assert r.state is R.SUSPENDED and "did not commit within 30 s" in r.history[-1].cause


def test_the_jobmanager_suspending_the_job_while_it_stops_goes_on_to_the_next_run():
    r = rescale_in(R.STOPPING)
    assert [type(a) for a in r.handle(rs.JobSuspended("JobManager shut down", 150.0, "jm-stop"))] == [rs.StartNextRun]
    assert [t.to_state for t in r.history[-2:]] == [R.SUSPENDED, R.STARTING]
    assert r.history[-2].cause == "the job was suspended: JobManager shut down"


@pytest.mark.parametrize(("state", "happening", "why"), [
    (R.REQUESTED, rs.Refused("needs 8 slots", 1.0, "refused"), "refused: needs 8 slots"),
    (R.REQUESTED, rs.JobSuspended("JobManager shut down", 1.0, "s"),
     "the job was SUSPENDED while it was checked: JobManager shut down"),
    (R.STOPPING, rs.JobEnded(JobStatus.FAILED, "a task failed", 1.0, "f"),
     "the job ended FAILED while its query was stopping: a task failed"),
    (R.STARTING, rs.StartFailed("the store cannot be reached", 1.0, "n"),
     "the next run could not start (the store cannot be reached); the job stays SUSPENDED"),
    (R.STARTING, rs.JobEnded(JobStatus.CANCELED, "cancelled", 1.0, "c"),
     "the job ended CANCELED before its next run ran: cancelled"),
])
def test_a_failed_rescale_says_why(state, happening, why):
    r = rescale_in(state)
    r.handle(happening)
    assert r.state is R.FAILED and r.failure == why and r.history[-1].cause == why


def test_events_without_a_stimulus_or_with_a_status_that_is_not_an_end_are_refused():
    r = fresh()
    with pytest.raises(ValueError, match="names no stimulus_id"):
        r.handle(rs.Accepted(1.0, ""))
    assert r.history == []
    with pytest.raises(ValueError, match="JobSuspended"):
        rs.JobEnded(JobStatus.SUSPENDED, "", 1.0, "s")
    with pytest.raises(ValueError, match="globally terminal"):
        rs.JobEnded(JobStatus.RUNNING, "", 1.0, "s")


def test_funke_status_tells_each_rescale_s_story_from_its_wire_form():
    from funke.common.wire import codec
    from funke.deploy.cli.render import render_job_details
    from funke.v1 import job_pb2

    done = rescale_in(R.RUNNING)
    refused = fresh(now=400.0)
    refused.handle(rs.Refused("needs 8 slots; the cluster has 2 free", 401.0, "rescale-refused"))
    details = job_pb2.JobDetails(job_id="job-1", name="q")
    details.rescales.extend([codec.rescale_to_proto(done), codec.rescale_to_proto(refused)])
    wire = details.rescales[0]
    assert job_pb2.RescaleState.Name(wire.state) == "RESCALE_STATE_RUNNING" and wire.last_batch_id == 7
    assert dict(wire.parallelism) == {"agg": 4, "src": 2} and len(wire.history) == 4
    assert wire.history[0].stimulus_id == "Accepted-101" and wire.requested_at.seconds == 100
    text = render_job_details(details)
    assert "rescales (2):" in text
    assert "rescaled: agg 2 -> 4 after batch 7: REQUESTED -> STOPPING -> SUSPENDED -> STARTING -> RUNNING" in text
    assert "rescaled: agg 2 -> 4 after batch 7: REQUESTED -> FAILED" in text
    (failed,) = [line.split(None, 3)[2:] for line in text.splitlines() if line.split()[2:3] == ["FAILED"]]
    assert failed == ["FAILED", "refused: needs 8 slots; the cluster has 2 free"]  # its cause says why
    from funke.jobmanager import restviews

    shown = restviews.job(details, now=500_000, stoppable=True)["rescales"]
    assert [(r["state"], r["failure"], [h["to"] for h in r["history"]]) for r in shown] == [
        ("RUNNING", None, ["STOPPING", "SUSPENDED", "STARTING", "RUNNING"]),
        ("FAILED", "refused: needs 8 slots; the cluster has 2 free", ["FAILED"])]
    assert shown[0]["requested-at"] == 100_000 and shown[0]["parallelism"] == {"agg": 4, "src": 2}
