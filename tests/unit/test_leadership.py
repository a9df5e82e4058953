"""Leader election on a lease (common/leadership.py): pure decisions, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funke.common.leadership import Contender, Granted, Lease, Revoked


def test_the_first_contender_takes_an_absent_lease_with_epoch_1():
    a = Contender("a", "host:1", duration_s=3)
    lease, changes = a.step(None, now=100.0)
    assert lease == Lease("a", 1, "host:1", 100.0, 3.0, since=100.0)
    assert changes == [Granted(1)]
    assert a.leads(100.0) and a.epoch == 1


def test_a_standby_waits_while_the_lease_is_valid_and_takes_it_with_the_next_epoch_when_it_expires():
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    lease, _ = a.step(None, 0.0)
    assert b.step(lease, 2.9) == (None, [])
    assert not b.leads(2.9)
    taken, changes = b.step(lease, 3.0)
    assert taken is not None and taken.holder == "b" and taken.epoch == 2 and taken.address == "B"
    assert changes == [Granted(2)]


def test_a_standby_takes_over_at_once_when_the_holder_is_known_to_be_gone():
    a, b = Contender("a", "A", 30), Contender("b", "B", 30)
    lease, _ = a.step(None, 0.0)
    taken, changes = b.step(lease, 0.5, holder_gone=True)
    assert taken is not None and taken.epoch == 2 and changes == [Granted(2)]


def test_the_leader_renews_and_keeps_its_epoch():
    a = Contender("a", "A", 3)
    lease, _ = a.step(None, 0.0)
    renewed, changes = a.step(lease, 1.0)
    assert renewed is not None and renewed.epoch == 1 and renewed.renewed_at == 1.0 and renewed.since == 0.0
    assert changes == []
    assert a.leads(3.9) and not a.leads(4.0)


def test_a_leader_that_finds_the_lease_taken_is_revoked_and_becomes_a_standby():
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    lease, _ = a.step(None, 0.0)
    taken, _ = b.step(lease, 5.0)
    after, changes = a.step(taken, 5.1)
    assert after is None
    assert changes == [Revoked(1, "the lease is held by epoch 2 now")]
    assert a.epoch is None and not a.leads(5.1)


def test_a_leader_whose_renewal_came_too_late_loses_even_if_nobody_took_the_lease():
    """A leader paused beyond its lease must not go on as if nothing happened: a standby may
    already have acted on the expiry. It loses, then contends again like anyone else."""
    a = Contender("a", "A", 3)
    lease, _ = a.step(None, 0.0)
    again, changes = a.step(lease, 10.0)
    assert isinstance(changes[0], Revoked) and "expired" in changes[0].reason
    assert changes[1:] == [Granted(2)] and again is not None and again.epoch == 2


def test_release_marks_the_lease_so_a_standby_takes_over_without_waiting():
    a, b = Contender("a", "A", 60), Contender("b", "B", 60)
    lease, _ = a.step(None, 0.0)
    released, changes = a.release(lease, 1.0)
    assert released is not None and released.released and changes == [Revoked(1, "the JobManager stepped down")]
    taken, changes = b.step(released, 1.1)
    assert taken is not None and taken.epoch == 2 and changes == [Granted(2)]


def test_release_by_a_contender_that_does_not_hold_the_lease_writes_nothing():
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    lease, _ = a.step(None, 0.0)
    assert b.release(lease, 1.0) == (None, [])


def test_a_standby_checks_again_at_the_expiry_and_a_leader_renews_three_times_per_lease():
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    lease, _ = a.step(None, 0.0)
    assert a.next_check(0.0, lease) == pytest.approx(1.0)
    assert b.next_check(2.5, lease) == pytest.approx(3.0)


def test_a_lease_duration_must_be_positive():
    with pytest.raises(ValueError):
        Contender("a", "A", 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 2.0), st.booleans()), min_size=1, max_size=60))
def test_at_no_time_do_two_contenders_both_lead_and_epochs_only_grow(rounds):
    """Random rounds of three contenders on one lease (each round is atomic, as under the
    backend's lock); `gone` means the holder looked dead. At every instant at most one contender
    may act as leader, and every grant has a larger epoch than any before."""
    contenders = [Contender(name, name.upper(), 3.0) for name in "abc"]
    lease: Lease | None = None
    now = 0.0
    highest = 0
    for who, advance, gone in rounds:
        now += advance
        c = contenders[who]
        holder_gone = gone and lease is not None and lease.holder != c.holder
        if holder_gone:
            # the holder really is gone: it can no longer act (a dead process does nothing)
            dead = next(x for x in contenders if x.holder == lease.holder)
            dead.epoch = None
        new, changes = c.step(lease, now, holder_gone)
        for change in changes:
            if isinstance(change, Granted):
                assert change.epoch > highest
                highest = change.epoch
        if new is not None:
            lease = new
        assert sum(x.leads(now) for x in contenders) <= 1


def test_a_leader_that_cannot_renew_stops_leading_when_its_lease_runs_out():
    c = Contender("a", "h:1", duration_s=3.0)
    _, changes = c.step(None, 100.0)
    assert changes == [Granted(1)] and c.valid_until == 103.0
    assert c.expire(102.9) == [] and c.leads(102.9)
    assert c.expire(103.0) == [Revoked(1, "the lease ran out before it could be renewed")]
    assert not c.leads(103.0) and c.valid_until == 0.0
    assert c.expire(200.0) == []  # a standby has nothing to lose


def test_a_store_that_picks_the_winner_grants_renews_and_takes_leadership_away():
    # ZooKeeper's latch decides who leads; the contender only keeps the time and the epoch.
    c = Contender("a", "A", duration_s=2)
    lease, changes = c.grant(last_epoch=6, now=100.0)
    assert changes == [Granted(7)] and lease.epoch == 7 and lease.since == 100.0 and c.leads(101.9)
    assert c.renew(101.0) == [] and c.leads(102.9) and not c.leads(103.0)
    late = c.renew(103.5)
    assert [type(x) for x in late] == [Revoked] and "expired 0.5 s before" in late[0].reason and c.epoch is None
    assert c.renew(104.0) == [] and c.lose("gone") == []  # nothing to lose any more
    c.grant(7, 110.0)
    assert c.lose("the leader node is held by epoch 9 now") == [Revoked(8, "the leader node is held by epoch 9 now")]
    assert not c.leads(110.1)
