"""The one retry policy (`funke.common.backoff`): doubling from its start up to its cap, no jitter."""

from __future__ import annotations

import itertools

import pytest

from funke.common.backoff import Backoff


def test_the_first_wait_is_the_start_and_each_next_one_doubles_up_to_the_cap():
    backoff = Backoff(0.1, 2.0)
    assert [backoff.delay(n) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_delays_gives_the_same_waits_one_after_the_other_without_end():
    backoff = Backoff(0.2, 30.0)
    assert list(itertools.islice(backoff.delays(), 10)) == [backoff.delay(n) for n in range(10)]
    assert list(itertools.islice(backoff.delays(), 1000))[-1] == 30.0


def test_no_jitter_every_run_waits_the_same():
    backoff = Backoff(0.2, 0.5)
    assert list(itertools.islice(backoff.delays(), 5)) == list(itertools.islice(backoff.delays(), 5))
    assert list(itertools.islice(backoff.delays(), 5)) == [0.2, 0.4, 0.5, 0.5, 0.5]


def test_a_huge_retry_count_is_the_cap_not_an_overflow():
    assert Backoff(0.2, 2.0).delay(10**9) == 2.0


def test_a_cap_equal_to_the_start_waits_the_same_every_time():
    assert list(itertools.islice(Backoff(1.0, 1.0).delays(), 3)) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("start", "cap"), [(0.0, 1.0), (-0.1, 1.0), (2.0, 1.0)])
def test_a_backoff_that_cannot_wait_is_refused(start, cap):
    with pytest.raises(ValueError, match="a backoff starts above 0"):
        Backoff(start, cap)
