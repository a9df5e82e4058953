"""The rules of a streaming checkpoint's lease (common/streaming/checkpointlease.py): who may take
it (absent, released, expired, a dead holder, a newer leader of the same cluster), which epoch
wins, and that a run whose lease is over may neither write nor renew it back."""

from __future__ import annotations

import pytest

from funke.common.streaming import checkpointlease as cl

SCOPE = "filesystem:/ha/default"


def held(epoch: int = 1, leader_epoch: int = 0, scope: str = "", renewed_at: float = 100.0, duration_s: float = 10.0,
         holder: str = "host:1:5/aa", released: bool = False) -> cl.CheckpointLease:
    return cl.CheckpointLease(epoch, holder, "job j on JobManager a (pid 1)", scope, leader_epoch, renewed_at,
                              duration_s, released)


def claim(leader_epoch: int = 0, scope: str = "", holder: str = "host:2:6/bb") -> cl.Claim:
    return cl.Claim(holder, "job j on JobManager b (pid 2)", scope, leader_epoch, 10.0)


def test_a_new_checkpoint_is_taken_with_epoch_1_and_the_next_epoch_follows_the_highest_seen():
    taken = cl.claim(None, claim(), now=5.0)
    assert isinstance(taken, cl.Taken) and taken.over == ""
    assert taken.lease == cl.CheckpointLease(1, "host:2:6/bb", "job j on JobManager b (pid 2)", "", 0, 5.0, 10.0)
    # an unreadable lease of epoch 7 still spent its epoch
    assert cl.claim(None, claim(), 5.0, last_epoch=7).lease.epoch == 8


def test_a_valid_lease_is_refused_to_another_run_naming_its_holder():
    refused = cl.claim(held(renewed_at=100.0), claim(), now=104.0)
    assert isinstance(refused, cl.Refused)
    assert refused.reason == "in use by job j on JobManager a (pid 1) (its lease (epoch 1) runs 6.0 s more unless renewed)"


@pytest.mark.parametrize("current, gone, now, over", [
    (held(released=True), False, 101.0, ""),
    (held(renewed_at=100.0), False, 110.0, "whose lease expired 0.0 s ago (not renewed)"),
    (held(renewed_at=100.0), True, 101.0, "whose process is gone"),
])
def test_a_released_expired_or_dead_holders_lease_is_taken_with_the_next_epoch(current, gone, now, over):
    taken = cl.claim(current, claim(), now, holder_gone=gone, last_epoch=1)
    assert isinstance(taken, cl.Taken) and taken.lease.epoch == 2 and taken.lease.renewed_at == now
    assert over in taken.over


def test_a_newer_leader_of_the_same_cluster_takes_a_valid_lease_over_at_once():
    current = held(leader_epoch=3, scope=SCOPE, renewed_at=100.0)
    taken = cl.claim(current, claim(leader_epoch=4, scope=SCOPE), now=100.5)
    assert isinstance(taken, cl.Taken) and taken.lease.epoch == 2 and taken.lease.leader_epoch == 4
    assert "leader epoch 3, deposed by leader epoch 4" in taken.over


@pytest.mark.parametrize("current, c", [
    (held(leader_epoch=3, scope=SCOPE), claim(leader_epoch=3, scope=SCOPE)),  # the same leader: two runs
    (held(leader_epoch=3, scope=SCOPE), claim(leader_epoch=2, scope=SCOPE)),  # a deposed leader
    (held(leader_epoch=3, scope=SCOPE), claim(leader_epoch=9, scope="filesystem:/other/default")),  # other cluster
    (held(leader_epoch=0, scope=""), claim(leader_epoch=9, scope=SCOPE)),  # a run without HA holds it
    (held(leader_epoch=3, scope=SCOPE), claim()),  # a run without HA
])
def test_leader_epochs_count_only_higher_and_within_one_cluster(current, c):
    assert isinstance(cl.claim(current, c, now=101.0), cl.Refused)


def test_a_deposed_leaders_claim_is_refused_saying_so():
    refused = cl.claim(held(leader_epoch=3, scope=SCOPE), claim(leader_epoch=2, scope=SCOPE), now=101.0)
    assert "runs under leader epoch 3, and this run's leader (epoch 2) was deposed" in refused.reason


def test_only_the_holder_of_the_newest_epoch_may_write():
    lease = held(epoch=4)
    assert cl.may_write(lease, "host:1:5/aa", 4) is None
    assert "taken over by job j on JobManager a (pid 1) (lease epoch 4); this run's lease of epoch 3 is over" \
        in cl.may_write(lease, "host:1:5/aa", 3)
    assert "taken over" in cl.may_write(lease, "host:9:9/zz", 4)  # same epoch, another run: not its own
    assert "released" in cl.may_write(held(epoch=4, released=True), "host:1:5/aa", 4)
    assert "no lease can be read" in cl.may_write(None, "host:1:5/aa", 4)
    assert cl.newest([3, 5, 4]) == 5 and cl.newest([]) is None


def test_a_holder_renews_even_an_expired_lease_nobody_took_but_never_one_taken_over():
    lease = held(epoch=2, renewed_at=100.0)
    assert cl.renew(lease, "host:1:5/aa", 2, now=200.0) == held(epoch=2, renewed_at=200.0)
    newer = cl.claim(lease, claim(), now=200.0).lease
    assert "taken over" in cl.renew(newer, "host:1:5/aa", 2, now=201.0)


def test_a_release_marks_only_the_holders_own_lease():
    lease = held(epoch=2)
    assert cl.release(lease, "host:1:5/aa", 2, now=150.0) == held(epoch=2, renewed_at=150.0, released=True)
    assert cl.release(lease, "host:9:9/zz", 2, now=150.0) is None
    assert cl.release(lease, "host:1:5/aa", 1, now=150.0) is None


def test_the_lease_round_trips_and_a_strangers_file_is_no_lease():
    lease = held(epoch=3, leader_epoch=2, scope=SCOPE, released=True)
    assert cl.parse_lease(cl.lease_bytes(lease)) == lease
    for junk in (b"", b"not json", b"[]", b'{"epoch": 1}', cl.lease_bytes(held(epoch=0)), b" " * (cl.MAX_LEASE_BYTES + 1)):
        assert cl.parse_lease(junk) is None


def test_a_lease_duration_must_be_positive():
    with pytest.raises(ValueError, match="must be positive"):
        cl.claim(None, cl.Claim("h", "d", duration_s=0), now=1.0)
