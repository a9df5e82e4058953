"""The receivers' rate estimator (common/streaming/backpressure.py): it measures first, then lowers the rate
when batches are processed slower than records arrive or wait to start, raises it when they
keep up, and never goes below the minimum."""

from __future__ import annotations

import pytest

from funke.common.streaming.backpressure import RateEstimator


def test_the_first_batch_only_measures_and_a_batch_that_keeps_up_sets_the_rate_it_was_processed_at():
    e = RateEstimator(1000)
    assert e.update(1000, 5000, 500, 0) is None  # 10 000 records/s processed: the starting point
    # processed at the same rate, on time: the rate stays
    assert e.update(2000, 5000, 500, 0) == pytest.approx(10_000)


def test_a_batch_processed_slower_than_the_rate_brings_it_down_and_waiting_brings_it_further_down():
    e = RateEstimator(1000)
    e.update(1000, 10_000, 1000, 0)  # 10 000/s
    on_time = e.update(2000, 10_000, 2000, 0)  # processed at 5 000/s
    assert on_time == pytest.approx(5_000)
    late = RateEstimator(1000)
    late.update(1000, 10_000, 1000, 0)
    waited = late.update(2000, 10_000, 2000, 3000)  # and it waited 3 s to start
    assert waited < on_time
    assert waited == pytest.approx(10_000 - 5_000 - 0.2 * 3000 * 5_000 / 1000)


def test_the_rate_never_goes_below_the_minimum_and_stale_or_empty_batches_change_nothing():
    e = RateEstimator(1000, min_rate=100)
    e.update(1000, 1000, 1000, 0)
    assert e.update(2000, 10, 10_000, 60_000) == 100
    assert e.update(2000, 10, 100, 0) is None  # not newer than the last
    assert e.update(3000, 0, 100, 0) is None  # no records
    assert e.update(3000, 10, 0, 0) is None  # no processing time
    with pytest.raises(ValueError):
        RateEstimator(0)
