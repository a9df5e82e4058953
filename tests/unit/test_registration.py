"""The TaskManager's connection to the JobManager (common/task/registration.py), driven with events:
no sockets, threads or sleeps. Every transition of CONNECTION_STATE_TRANSITIONS is taken here."""

from __future__ import annotations

import logging

import pytest

from funke.common.states import CONNECTION_STATE_TRANSITIONS, ConnectionState, IllegalTransition, StateMachine
from funke.common.task import registration as r

C = ConnectionState
TAKEN: set[tuple[ConnectionState, ConnectionState]] = set()


def reg(epoch: int = 0, timeout: float = 10.0) -> r.Registration:
    return r.Registration("reg-1", 1.0, timeout, "/data", epoch)


class Driver:
    """A Connection, the clock, and every transition it took (collected for the coverage test)."""

    def __init__(self, ha: bool = False):
        self.conn = r.Connection("tm-1", ha=ha)
        self.now = 0.0

    def __call__(self, event: r.Event, at: float | None = None) -> list[r.Instruction]:
        if at is not None:
            self.now = at
        out = self.conn.handle(event, self.now)
        TAKEN.update((t.from_state, t.to_state) for t in self.conn.machine.history)
        return out

    @property
    def state(self) -> ConnectionState:
        return self.conn.state

    def timer(self, out: list[r.Instruction]) -> r.StartTimer:
        (t,) = [i for i in out if isinstance(i, r.StartTimer)]
        return t

    def registered(self, at: float = 0.0, epoch: int = 0, timeout: float = 10.0) -> None:
        self(r.Start(), at)
        if self.conn.ha:
            self(r.LeaderFound(epoch, "jm:1"))
        self(r.RegistrationAccepted(reg(epoch, timeout), "jm:1"))
        assert self.state is C.REGISTERED


def kinds(out: list[r.Instruction]) -> list[type]:
    return [type(i) for i in out if not isinstance(i, r.Log)]


def test_backoff_doubles_from_its_start_up_to_its_cap():
    assert [r.BACKOFF.delay(n) for n in range(6)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert [r.HA_BACKOFF.delay(n) for n in range(4)] == [0.2, 0.4, 0.5, 0.5]
    assert r.BACKOFF.delay(10_000) == 2.0


def test_start_sends_a_registration_and_its_answer_registers_and_starts_heartbeats():
    d = Driver()
    assert d(r.Start()) == [r.SendRegistration("", None)]
    out = d(r.RegistrationAccepted(reg(), "jm:1"))
    assert out == [r.Registered(reg(), first=True), r.SendHeartbeat(reg())]
    assert d.state is C.REGISTERED and d.conn.registration == reg()


def test_an_unanswered_attempt_is_retried_after_a_growing_wait_and_only_the_first_miss_is_loud():
    d = Driver()
    d(r.Start())
    delays, levels = [], []
    for _ in range(6):
        out = d(r.RegistrationFailed("UNAVAILABLE", "connection refused", "jm:1"))
        assert d.state is C.REGISTERING
        levels += [i.level for i in out if isinstance(i, r.Log)]
        timer = d.timer(out)
        delays.append(timer.delay_s)
        assert d(r.TimerFired(timer.timer)) == [r.SendRegistration("", None)]
    assert delays == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert levels == [logging.INFO] + [logging.DEBUG] * 5


def test_a_refusal_is_said_every_time_and_asked_again_after_the_backoff():
    d = Driver()
    d(r.Start())
    for delay in (0.2, 0.4):
        out = d(r.RegistrationFailed("FAILED_PRECONDITION", "cannot reach 10.0.0.1:1", "jm:1"))
        assert d.state is C.REFUSED
        assert [i.level for i in out if isinstance(i, r.Log)] == [logging.ERROR]
        assert "refused the registration: cannot reach 10.0.0.1:1" in out[0].message
        timer = d.timer(out)
        assert timer.delay_s == delay
        assert d(r.TimerFired(timer.timer)) == [r.SendRegistration("", None)]
        assert d.state is C.REGISTERING
    d(r.RegistrationAccepted(reg(), "jm:1"))
    assert d.state is C.REGISTERED


@pytest.mark.parametrize("code", sorted(r.REFUSAL_CODES))
def test_every_refusal_code_is_a_refusal(code: str):
    d = Driver()
    d(r.Start())
    d(r.RegistrationFailed(code, "no", "jm:1"))
    assert d.state is C.REFUSED


def test_a_lost_registration_forgets_the_tasks_and_registers_again_at_once():
    d = Driver()
    d.registered(at=0.0)
    out = d(r.HeartbeatEnded("the JobManager closed the heartbeat stream"), at=30.0)
    assert out == [r.Lost("the JobManager closed the heartbeat stream"), r.SendRegistration("", None)]
    assert d.state is C.REREGISTERING
    assert [t.to_state for t in d.conn.machine.history[-2:]] == [C.LOST, C.REREGISTERING]
    out = d(r.RegistrationAccepted(reg(), "jm:1"))
    assert out[0] == r.Registered(reg(), first=False)


def test_a_registration_lost_right_after_it_was_made_waits_longer_each_time():
    d = Driver()
    d.registered(at=0.0)
    delays = []
    for n in range(5):
        out = d(r.HeartbeatEnded("refused"), at=d.now + 0.1)
        assert d.state is C.LOST and kinds(out) == [r.Lost, r.StartTimer]
        timer = d.timer(out)
        delays.append(timer.delay_s)
        assert d(r.TimerFired(timer.timer)) == [r.SendRegistration("", None)]
        assert d.state is C.REREGISTERING
        d(r.RegistrationAccepted(reg(), "jm:1"))
    assert delays == [0.2, 0.4, 0.8, 1.6, 2.0]
    out = d(r.HeartbeatEnded("stream broke"), at=d.now + 5.0)  # it lasted: the next one follows at once
    assert kinds(out) == [r.Lost, r.SendRegistration]


def test_a_refusal_after_a_loss_asks_again_as_a_reregistration():
    d = Driver()
    d.registered()
    d(r.HeartbeatEnded("gone"), at=20.0)
    d(r.RegistrationFailed("UNAVAILABLE", "down", "jm:1"))
    assert d.state is C.REREGISTERING
    out = d(r.TimerFired(d.conn._timer))
    out = d(r.RegistrationFailed("PERMISSION_DENIED", "bad token", "jm:1"))
    assert d.state is C.REFUSED
    d(r.TimerFired(d.timer(out).timer))
    assert d.state is C.REREGISTERING


def test_heartbeat_silence_longer_than_the_timeout_loses_the_registration():
    d = Driver()
    d.registered(at=100.0, timeout=5.0)
    assert d(r.HeartbeatDue(), at=104.0) == [r.SendHeartbeat(reg(timeout=5.0))]
    d(r.HeartbeatAnswered(), at=104.5)
    assert d(r.HeartbeatDue(), at=109.0) == [r.SendHeartbeat(reg(timeout=5.0))]
    out = d(r.HeartbeatDue(), at=109.6)
    assert out[0] == r.Lost("no heartbeat answer for 5.1 s (timeout 5 s)")
    assert d.state is C.REREGISTERING


def test_a_heartbeat_answer_asking_to_register_again_loses_the_registration():
    d = Driver()
    d.registered()
    out = d(r.HeartbeatAnswered(reregister=True), at=5.0)
    assert out[0] == r.Lost("the JobManager does not know this registration")


def test_with_ha_each_attempt_looks_the_leader_up_and_waits_while_there_is_none():
    d = Driver(ha=True)
    assert d(r.Start()) == [r.LookUpLeader()]
    delays = []
    for _ in range(4):
        timer = d.timer(d(r.NoLeader()))
        delays.append(timer.delay_s)
        assert d(r.TimerFired(timer.timer)) == [r.LookUpLeader()]
    assert delays == [0.2, 0.4, 0.5, 0.5]
    assert d(r.LeaderFound(3, "jm:3")) == [r.SendRegistration("jm:3", 3)]


def test_a_registration_waiting_on_a_deposed_leader_is_abandoned_for_the_new_one():
    d = Driver(ha=True)
    d(r.Start())
    d(r.NoLeader())
    d(r.TimerFired(d.conn._timer))
    d(r.LeaderFound(1, "jm:1"))
    assert d(r.LeaseRead(1, "jm:1")) == []  # the same leader: keep waiting
    out = d(r.LeaseRead(2, "jm:2"))
    assert kinds(out) == [r.AbandonAttempt, r.LookUpLeader]
    assert d.conn.retries == 0  # a new leader is asked at once, backoff starts over
    assert d(r.RegistrationAccepted(reg(1), "jm:1")) == []  # the abandoned attempt's late answer
    d(r.LeaderFound(2, "jm:2"))
    d(r.RegistrationAccepted(reg(2), "jm:2"))
    assert d.conn.registration == reg(2)


def test_a_lease_naming_a_new_epoch_ends_the_registration():
    d = Driver(ha=True)
    d.registered(epoch=4)
    assert d(r.LeaseRead(4, "jm:4"), at=5.0) == []
    assert d(r.LeaseRead(None), at=5.0) == []  # no live leader named: nothing is known yet
    out = d(r.LeaseRead(5, "jm:5"), at=6.0)
    assert kinds(out) == [r.Lost, r.LookUpLeader]
    assert out[0] == r.Lost("a new leader was elected (epoch 5, at jm:5)")


def test_a_call_naming_a_registration_waits_for_it_only_while_not_registered():
    d = Driver()
    d(r.Start())
    assert d(r.CallArrived("reg-1")) == [r.AwaitRegistration(r.REGISTRATION_OVERTAKEN_S)]
    assert d(r.CallArrived("")) == []  # names none: the JobManager does not say
    d(r.RegistrationAccepted(reg(), "jm:1"))
    assert d(r.CallArrived("reg-1")) == []
    assert d(r.CallArrived("reg-0")) == []  # registered: the task core refuses what is stale


def test_stale_events_change_nothing():
    d = Driver()
    d(r.Start())
    stale_timer = r.Timer("retry", 99)
    for event in (r.HeartbeatEnded("x"), r.HeartbeatDue(), r.HeartbeatAnswered(True), r.TimerFired(stale_timer),
                  r.LeaderFound(1, "jm:1"), r.NoLeader(), r.Start()):
        assert d(event) == [] and d.state is C.REGISTERING
    d(r.RegistrationAccepted(reg(), "jm:1"))
    for event in (r.RegistrationAccepted(reg(), "jm:1"), r.RegistrationFailed("UNAVAILABLE", "", "jm:1"),
                  r.NoLeader(), r.TimerFired(stale_timer)):
        assert d(event) == [] and d.state is C.REGISTERED


def test_a_retry_timer_superseded_by_a_stop_does_nothing():
    d = Driver()
    d(r.Start())
    timer = d.timer(d(r.RegistrationFailed("UNAVAILABLE", "", "jm:1")))
    d(r.Stop())
    assert d(r.TimerFired(timer.timer)) == [] and d.state is C.STOPPED


@pytest.mark.parametrize("reach", ["registering", "registered", "refused", "lost", "reregistering"])
def test_stop_ends_the_connection_from_every_state(reach: str):
    d = Driver()
    d(r.Start())
    if reach == "registered":
        d(r.RegistrationAccepted(reg(), "jm:1"))
    elif reach == "refused":
        d(r.RegistrationFailed("INVALID_ARGUMENT", "", "jm:1"))
    elif reach in ("lost", "reregistering"):
        d(r.RegistrationAccepted(reg(), "jm:1"))
        d(r.HeartbeatEnded("gone"), at=0.1 if reach == "lost" else 10.0)
    assert d.state.value == reach.upper()
    out = d(r.Stop())
    assert d.state is C.STOPPED
    assert kinds(out) == ([r.AbandonAttempt] if reach in ("registering", "reregistering") else [])
    assert d(r.Stop()) == []


def test_every_transition_of_the_table_is_taken_by_these_tests():
    TAKEN.clear()
    test_an_unanswered_attempt_is_retried_after_a_growing_wait_and_only_the_first_miss_is_loud()
    test_a_refusal_is_said_every_time_and_asked_again_after_the_backoff()
    test_a_registration_lost_right_after_it_was_made_waits_longer_each_time()
    test_a_refusal_after_a_loss_asks_again_as_a_reregistration()
    test_a_registration_waiting_on_a_deposed_leader_is_abandoned_for_the_new_one()
    for reach in ("registering", "registered", "refused", "lost", "reregistering"):
        test_stop_ends_the_connection_from_every_state(reach)
    table = {(a, b) for a, targets in CONNECTION_STATE_TRANSITIONS.items() for b in targets}
    assert TAKEN == table


@pytest.mark.parametrize("from_state,to_state", [
    (a, b) for a in ConnectionState for b in ConnectionState if b not in CONNECTION_STATE_TRANSITIONS[a]])
def test_a_transition_the_table_does_not_hold_is_refused_with_the_story(from_state, to_state):
    m = StateMachine("TaskManager tm-1's connection", CONNECTION_STATE_TRANSITIONS, from_state, 0.0)
    with pytest.raises(IllegalTransition) as caught:
        m.transition(to_state, 1.0, "because")
    assert caught.value.from_state is from_state and caught.value.to_state is to_state
    assert f"{from_state.value} -> {to_state.value}" in str(caught.value)
    assert m.state is from_state


def test_the_docs_draw_the_connection_table():
    from pathlib import Path

    from funke.common.states import render_mermaid
    from funke.deploy import sitedocs

    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "state-machines.md").read_text()
    assert "<!-- generated: diagram:connection-state-diagram -->" in page.splitlines()
    assert render_mermaid(CONNECTION_STATE_TRANSITIONS) in sitedocs.render("diagram:connection-state-diagram")
