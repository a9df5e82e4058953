"""Restart strategies (funke.common.graph.restart): Flink 1.19 semantics, config parsing, descriptions.

Every test is deterministic: time is passed in explicitly and jitter draws from a seeded rng.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funke.common.durations import DurationError, parse_duration
from funke.common.graph.jobgraph import JobConfiguration, JobGraph, RestartStrategyConfig
from funke.common.graph.restart import (
    DEFAULTS,
    ExponentialDelayRestartBackoffTimeStrategy,
    FailureRateRestartBackoffTimeStrategy,
    FixedDelayRestartBackoffTimeStrategy,
    NoRestartBackoffTimeStrategy,
    RestartBackoffTimeStrategy,
    RestartDecision,
    RestartStrategyError,
    decide,
    describe_config,
    restart_strategy_from_config,
)

C = RestartStrategyConfig


def exp(**kw) -> ExponentialDelayRestartBackoffTimeStrategy:
    """An exponential-delay strategy without jitter unless asked for."""
    kw.setdefault("jitter_factor", 0.0)
    return ExponentialDelayRestartBackoffTimeStrategy(**kw)


# ------------------------------------------------------------------------------------------
# parse_duration
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1 s", 1.0),
        ("500 ms", 0.5),
        ("1min", 60.0),
        ("1 m", 60.0),
        ("2 h", 7200.0),
        ("10s", 10.0),
        ("1 d", 86400.0),
        ("3 days", 3 * 86400.0),
        ("5 seconds", 5.0),
        ("5 sec", 5.0),
        ("2 minutes", 120.0),
        ("1 hour", 3600.0),
        ("250 millis", 0.25),
        ("7 µs", 7e-6),
        ("7 micros", 7e-6),
        ("9 ns", 9e-9),
        ("1000000 ns", 0.001),
        ("  3 MIN  ", 180.0),
        ("1 S", 1.0),
        ("1000", 1.0),  # a bare number is milliseconds (Flink)
        ("0", 0.0),
        ("0 s", 0.0),
        ("007 ms", 0.007),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=0)


def test_parse_duration_is_exact_for_milliseconds():
    # Integer nanoseconds and one division: "1 ms" is the same float as 0.001.
    assert parse_duration("1 ms") == 0.001
    assert parse_duration("100 ms") == 0.1


@pytest.mark.parametrize(
    "junk",
    ["", "   ", "s", "ms 5", "1.5 s", "-1 s", "+1 s", "1 parsec", "1 s s", "abc", "1e3", "1_000",
     "١ s", "99999999999999999999 s"],
)
def test_parse_duration_rejects_junk(junk):
    with pytest.raises(DurationError) as info:
        parse_duration(junk)
    assert repr(junk) in str(info.value)


def test_parse_duration_rejects_non_strings():
    with pytest.raises(DurationError):
        parse_duration(5)  # type: ignore[arg-type]


def test_fraction_error_suggests_a_smaller_unit():
    with pytest.raises(DurationError, match="1500 ms"):
        parse_duration("1.5 s")


# ------------------------------------------------------------------------------------------
# NoRestart
# ------------------------------------------------------------------------------------------


def test_no_restart_suppresses_the_first_failure():
    s = NoRestartBackoffTimeStrategy()
    d = decide(s, 0.0)
    assert d == RestartDecision(False, 0.0, True, "NoRestartBackoffTimeStrategy",
                                "restart strategy none: the job restarts on no failure")
    assert f"Recovery is suppressed by {s}" == "Recovery is suppressed by NoRestartBackoffTimeStrategy"


# ------------------------------------------------------------------------------------------
# FixedDelay
# ------------------------------------------------------------------------------------------


def test_fixed_delay_allows_n_attempts_then_suppresses():
    s = FixedDelayRestartBackoffTimeStrategy(attempts=2, delay_s=1.0)
    d1 = decide(s, 0.0)
    d2 = decide(s, 5.0)
    d3 = decide(s, 100.0)
    assert (d1.restart, d1.delay_s, d1.new_attempt) == (True, 1.0, True)
    assert (d2.restart, d2.delay_s, d2.new_attempt) == (True, 1.0, True)
    assert (d3.restart, d3.delay_s, d3.new_attempt) == (False, 0.0, True)
    assert d3.strategy == "FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=2, backoffTimeMS=1000)"


def test_fixed_delay_counts_every_failure_even_at_the_same_instant():
    # Flink does not merge concurrent failures for fixed-delay: each one uses an attempt.
    s = FixedDelayRestartBackoffTimeStrategy(attempts=2, delay_s=1.0)
    assert [decide(s, 7.0).restart for _ in range(3)] == [True, True, False]
    assert s.current_attempt == 3


def test_fixed_delay_zero_attempts_suppresses_the_first_failure():
    s = FixedDelayRestartBackoffTimeStrategy(attempts=0, delay_s=0.0)
    assert decide(s, 0.0).restart is False


def test_fixed_delay_defaults_and_describe():
    s = FixedDelayRestartBackoffTimeStrategy()
    assert s.describe() == "FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=1, backoffTimeMS=1000)"
    assert str(s) == repr(s) == s.describe()
    assert FixedDelayRestartBackoffTimeStrategy(3, 0.25).describe().endswith("backoffTimeMS=250)")
    # Sub-millisecond precision is kept rather than silently truncated.
    assert FixedDelayRestartBackoffTimeStrategy(1, 0.0005).describe().endswith("backoffTimeMS=0.5)")


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"attempts": -1}, "restart-strategy.fixed-delay.attempts"),
        ({"attempts": 1.5}, "restart-strategy.fixed-delay.attempts"),
        ({"attempts": True}, "restart-strategy.fixed-delay.attempts"),
        ({"delay_s": -0.001}, "restart-strategy.fixed-delay.delay"),
        ({"delay_s": float("inf")}, "restart-strategy.fixed-delay.delay"),
        ({"delay_s": float("nan")}, "restart-strategy.fixed-delay.delay"),
    ],
)
def test_fixed_delay_constructor_checks(kwargs, key):
    with pytest.raises(RestartStrategyError, match=key):
        FixedDelayRestartBackoffTimeStrategy(**kwargs)


# ------------------------------------------------------------------------------------------
# FailureRate
# ------------------------------------------------------------------------------------------


def test_failure_rate_max_one_boundary_is_inclusive():
    # Two failures exactly `interval` apart are "within the interval": strict `>` in Flink.
    s = FailureRateRestartBackoffTimeStrategy(max_failures_per_interval=1, interval_s=60.0, delay_s=2.0)
    assert decide(s, 0.0) == RestartDecision(True, 2.0, True, s.describe())
    assert decide(s, 60.0).restart is False


def test_failure_rate_max_one_just_past_the_boundary_restarts():
    s = FailureRateRestartBackoffTimeStrategy(1, 60.0, 2.0)
    assert decide(s, 0.0).restart
    assert decide(s, 60.001).restart


def test_failure_rate_window_slides():
    s = FailureRateRestartBackoffTimeStrategy(max_failures_per_interval=2, interval_s=10.0, delay_s=1.0)
    assert decide(s, 0.0).restart
    assert decide(s, 5.0).restart
    assert decide(s, 10.5).restart  # 3 failures, oldest (0) is 10.5 old: > 10
    assert decide(s, 15.5).restart  # last three: 5, 10.5, 15.5 -> 10.5 > 10
    assert decide(s, 20.5).restart is False  # last three: 10.5, 15.5, 20.5 -> exactly 10


def test_failure_rate_exactly_at_boundary_with_more_failures():
    s = FailureRateRestartBackoffTimeStrategy(2, 10.0, 1.0)
    assert decide(s, 0.0).restart
    assert decide(s, 5.0).restart
    assert decide(s, 10.0).restart is False


def test_failure_rate_allows_max_failures_in_a_burst():
    s = FailureRateRestartBackoffTimeStrategy(3, 60.0, 1.0)
    assert [decide(s, 1.0).restart for _ in range(4)] == [True, True, True, False]


def test_failure_rate_can_restart_is_evaluated_at_the_given_time():
    s = FailureRateRestartBackoffTimeStrategy(1, 60.0, 1.0)
    s.notify_failure(0.0)
    s.notify_failure(30.0)
    assert s.can_restart(30.0) is False
    assert s.can_restart(60.0) is False
    assert s.can_restart(60.5) is True


def test_failure_rate_describe_and_defaults():
    assert FailureRateRestartBackoffTimeStrategy().describe() == (
        "FailureRateRestartBackoffTimeStrategy(failuresIntervalMS=60000, backoffTimeMS=1000, "
        "maxFailuresPerInterval=1)"
    )


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"max_failures_per_interval": 0}, "max-failures-per-interval"),
        ({"interval_s": 0.0}, "failure-rate-interval"),
        ({"delay_s": -1.0}, "restart-strategy.failure-rate.delay"),
    ],
)
def test_failure_rate_constructor_checks(kwargs, key):
    with pytest.raises(RestartStrategyError, match=key):
        FailureRateRestartBackoffTimeStrategy(**kwargs)


# ------------------------------------------------------------------------------------------
# ExponentialDelay
# ------------------------------------------------------------------------------------------


def test_exponential_growth_sequence_without_jitter_is_capped_at_max():
    s = exp(initial_backoff_s=1.0, max_backoff_s=10.0, backoff_multiplier=1.5)
    now, delays = 0.0, []
    for _ in range(9):
        d = decide(s, now)
        assert d.restart and d.new_attempt
        delays.append(d.delay_s)
        now = s.next_restart_time + 0.5  # fails again shortly after each restart
    assert delays == pytest.approx([1.0, 1.5, 2.25, 3.375, 5.0625, 7.59375, 10.0, 10.0, 10.0])
    assert s.current_attempt == 9


def test_exponential_failure_before_scheduled_restart_is_merged():
    s = exp(initial_backoff_s=1.0, max_backoff_s=60.0, backoff_multiplier=2.0)
    assert decide(s, 0.0) == RestartDecision(True, 1.0, True, s.describe())
    merged = decide(s, 0.4)
    assert (merged.restart, merged.new_attempt) == (True, False)
    assert merged.delay_s == pytest.approx(0.6)  # only the remaining time
    assert s.current_attempt == 1 and s.next_restart_time == 1.0  # no growth, not pushed back
    # Exactly at the scheduled time still merges (`<=`) and waits 0.
    assert decide(s, 1.0) == RestartDecision(True, 0.0, False, s.describe())
    nxt = decide(s, 1.2)
    assert nxt.new_attempt and nxt.delay_s == pytest.approx(2.0)
    assert s.current_attempt == 2


def test_exponential_merged_failures_do_not_use_attempts():
    s = exp(attempts_before_reset_backoff=1)
    assert decide(s, 0.0).restart
    assert decide(s, 0.5).restart  # merged into the pending restart
    assert decide(s, 0.9).restart
    d = decide(s, 2.0)  # a new attempt: the second
    assert (d.restart, d.new_attempt) == (False, True)


def test_exponential_resets_after_threshold_measured_from_scheduled_restart():
    s = exp(initial_backoff_s=1.0, max_backoff_s=100.0, backoff_multiplier=2.0, reset_backoff_threshold_s=10.0)
    assert decide(s, 0.0).delay_s == 1.0  # restart at 1
    assert decide(s, 2.0).delay_s == 2.0  # restart at 4
    assert decide(s, 5.0).delay_s == 4.0  # restart at 9
    # Exactly the threshold after the scheduled restart: reset (`>=`).
    d = decide(s, 19.0)
    assert d.delay_s == 1.0 and s.current_attempt == 1


def test_exponential_no_reset_just_before_threshold():
    s = exp(initial_backoff_s=1.0, max_backoff_s=100.0, backoff_multiplier=2.0, reset_backoff_threshold_s=10.0)
    decide(s, 0.0)
    decide(s, 2.0)
    decide(s, 5.0)  # restart scheduled at 9
    assert decide(s, 18.999).delay_s == pytest.approx(8.0)
    assert s.current_attempt == 4


def test_exponential_reset_is_not_measured_from_the_last_failure():
    s = exp(initial_backoff_s=1.0, max_backoff_s=100.0, backoff_multiplier=2.0, reset_backoff_threshold_s=10.0)
    for t in (0.0, 2.0, 5.0):  # last failure at 5, restart scheduled at 9 (backoff 4)
        decide(s, t)
    decide(s, 10.0)  # backoff 8, restart at 18
    # 17 s after the last failure, but only 9 s after the scheduled restart: no reset.
    assert decide(s, 27.0).delay_s == pytest.approx(16.0)


def test_exponential_first_failure_at_time_zero_is_a_new_attempt():
    s = exp()
    assert s.notify_failure(0.0) is True
    assert s.backoff_time(0.0) == 1.0


def test_exponential_backoff_time_requires_a_failure_first():
    with pytest.raises(RuntimeError, match="notify_failure"):
        exp().backoff_time(0.0)


def test_exponential_attempts_before_reset_backoff():
    s = exp(initial_backoff_s=1.0, max_backoff_s=10.0, backoff_multiplier=2.0,
            reset_backoff_threshold_s=30.0, attempts_before_reset_backoff=2)
    assert decide(s, 0.0).restart   # attempt 1, restart at 1
    assert decide(s, 2.0).restart   # attempt 2, restart at 4
    assert decide(s, 5.0).restart is False  # attempt 3 > 2


def test_exponential_attempts_counter_resets_with_the_backoff():
    s = exp(initial_backoff_s=1.0, max_backoff_s=10.0, backoff_multiplier=2.0,
            reset_backoff_threshold_s=30.0, attempts_before_reset_backoff=2)
    assert decide(s, 0.0).restart
    assert decide(s, 2.0).restart   # restart at 4
    d = decide(s, 34.0)             # 30 s after the scheduled restart: reset
    assert d.restart and d.delay_s == 1.0 and s.current_attempt == 1
    assert decide(s, 36.0).restart
    assert decide(s, 40.0).restart is False


def test_exponential_unlimited_attempts_never_suppress_and_never_overflow():
    s = exp(initial_backoff_s=0.001, max_backoff_s=1.0, backoff_multiplier=10.0, jitter_factor=0.5,
            rng=random.Random(3))
    now = 0.0
    for _ in range(2000):  # 10**2000 overflows a float: the backoff must stay at max
        d = decide(s, now)
        assert d.restart and 0.001 <= d.delay_s <= 1.0
        now = s.next_restart_time + 0.001
    assert d.delay_s == 1.0


def test_exponential_huge_backoff_with_full_jitter_is_the_maximum():
    # base 1e308: the jitter range [-1e308, 1e308] would overflow; the result must be max.
    s = ExponentialDelayRestartBackoffTimeStrategy(
        initial_backoff_s=10.0, max_backoff_s=100.0, backoff_multiplier=1e307, jitter_factor=1.0,
        rng=random.Random(0),
    )
    decide(s, 0.0)
    assert decide(s, s.next_restart_time + 1.0).delay_s == 100.0


def test_exponential_jitter_stays_within_bounds_over_many_draws():
    initial, mult, jitter, maximum, threshold = 1.0, 2.0, 0.25, 1000.0, 100.0
    s = ExponentialDelayRestartBackoffTimeStrategy(
        initial_backoff_s=initial, max_backoff_s=maximum, backoff_multiplier=mult,
        reset_backoff_threshold_s=threshold, jitter_factor=jitter, rng=random.Random(1234),
    )
    ratios = []
    now = 0.0
    for _ in range(400):
        for k in range(8):  # 8 attempts, then a pause long enough to reset the backoff
            d = decide(s, now)
            assert d.new_attempt
            base = initial * mult**k
            assert max(initial, base * (1 - jitter)) <= d.delay_s <= min(maximum, base * (1 + jitter))
            if k > 0:  # attempt 0 is clamped at initial from below
                ratios.append(d.delay_s / base - 1.0)
            now = s.next_restart_time + 1.0
        now = s.next_restart_time + threshold + 1.0  # clear of float rounding at the boundary
    # The jitter really spreads over (nearly) the whole allowed range, around zero.
    assert min(ratios) < -0.24 and max(ratios) > 0.24
    assert abs(sum(ratios) / len(ratios)) < 0.02


def test_exponential_jitter_is_clamped_to_initial_and_max():
    s = ExponentialDelayRestartBackoffTimeStrategy(
        initial_backoff_s=1.0, max_backoff_s=2.0, backoff_multiplier=2.0,
        reset_backoff_threshold_s=1.0, jitter_factor=1.0, rng=random.Random(5),
    )
    firsts, seconds_ = [], []
    now = 0.0
    for _ in range(500):
        firsts.append(decide(s, now).delay_s)  # base 1, jitter in [-1, 1]: clamped below at 1
        now = s.next_restart_time + 0.1
        seconds_.append(decide(s, now).delay_s)  # base 2, jitter in [-2, 2]: clamped to [1, 2]
        now = s.next_restart_time + 2.0  # past the 1 s threshold: reset
    assert all(1.0 <= d <= 2.0 for d in firsts + seconds_)
    assert firsts.count(1.0) > 100 and seconds_.count(2.0) > 100 and seconds_.count(1.0) > 50


def test_exponential_jitter_is_reproducible_with_a_seeded_rng():
    def run(seed: int) -> list[float]:
        s = ExponentialDelayRestartBackoffTimeStrategy(jitter_factor=0.5, rng=random.Random(seed))
        out, now = [], 0.0
        for _ in range(20):
            out.append(decide(s, now).delay_s)
            now = s.next_restart_time + 0.1
        return out

    assert run(9) == run(9)
    assert run(9) != run(10)


def test_exponential_without_jitter_does_not_consume_randomness():
    rng = random.Random(11)
    state = rng.getstate()
    s = ExponentialDelayRestartBackoffTimeStrategy(jitter_factor=0.0, rng=rng)
    for t in (0.0, 5.0, 50.0):
        decide(s, t)
    assert rng.getstate() == state


def test_exponential_describe():
    s = ExponentialDelayRestartBackoffTimeStrategy()
    assert s.describe() == (
        "ExponentialDelayRestartBackoffTimeStrategy(initialBackoffMS=1000, maxBackoffMS=60000, "
        "backoffMultiplier=1.5, resetBackoffThresholdMS=3600000, jitterFactor=0.1, "
        "attemptsBeforeResetBackoff=unlimited, currentRestartAttempt=0, nextRestartTimestamp=none)"
    )
    s = exp(initial_backoff_s=0.5, max_backoff_s=4.0, backoff_multiplier=2.0, attempts_before_reset_backoff=1)
    decide(s, 10.0)
    d = decide(s, 11.0)
    assert d.strategy == (
        "ExponentialDelayRestartBackoffTimeStrategy(initialBackoffMS=500, maxBackoffMS=4000, "
        "backoffMultiplier=2.0, resetBackoffThresholdMS=3600000, jitterFactor=0.0, "
        "attemptsBeforeResetBackoff=1, currentRestartAttempt=2, nextRestartTimestamp=12000)"
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"initial_backoff_s": 0.0}, "initial-backoff must be at least 1 ms"),
        ({"max_backoff_s": 0.0005}, "max-backoff must be at least 1 ms"),
        ({"initial_backoff_s": 120.0}, r"initial-backoff \(2 min\) must not exceed .*max-backoff \(1 min\)"),
        ({"backoff_multiplier": 1.0}, "backoff-multiplier must be greater than 1, got 1.0"),
        ({"backoff_multiplier": float("nan")}, "backoff-multiplier"),
        ({"reset_backoff_threshold_s": 0.0}, "reset-backoff-threshold"),
        ({"jitter_factor": -0.1}, "jitter-factor must be between 0 and 1"),
        ({"jitter_factor": 1.5}, "jitter-factor must be between 0 and 1, got 1.5"),
        ({"attempts_before_reset_backoff": 0}, "attempts-before-reset-backoff must be at least 1, got 0"),
    ],
)
def test_exponential_constructor_checks(kwargs, match):
    with pytest.raises(RestartStrategyError, match=match):
        ExponentialDelayRestartBackoffTimeStrategy(**kwargs)


def test_exponential_edge_values_are_accepted():
    ExponentialDelayRestartBackoffTimeStrategy(
        initial_backoff_s=0.001, max_backoff_s=0.001, backoff_multiplier=1.0001,
        reset_backoff_threshold_s=0.001, jitter_factor=1.0, attempts_before_reset_backoff=1,
    )
    ExponentialDelayRestartBackoffTimeStrategy(jitter_factor=0.0)


# ------------------------------------------------------------------------------------------
# decide
# ------------------------------------------------------------------------------------------


class _Recording:
    def __init__(self, restartable: bool) -> None:
        self.calls: list[tuple[str, float]] = []
        self.restartable = restartable

    def notify_failure(self, now: float) -> bool:
        self.calls.append(("notify_failure", now))
        return False

    def can_restart(self, now: float) -> bool:
        self.calls.append(("can_restart", now))
        return self.restartable

    def backoff_time(self, now: float) -> float:
        self.calls.append(("backoff_time", now))
        return 3.0

    def describe(self) -> str:
        return "Recording"

    def gave_up(self) -> str:
        return "Recording gave up"


def test_decide_calls_in_flinks_order():
    r = _Recording(restartable=True)
    assert decide(r, 4.0) == RestartDecision(True, 3.0, False, "Recording")
    assert r.calls == [("notify_failure", 4.0), ("can_restart", 4.0), ("backoff_time", 4.0)]


def test_decide_does_not_ask_for_a_backoff_when_suppressed():
    r = _Recording(restartable=False)
    assert decide(r, 4.0) == RestartDecision(False, 0.0, False, "Recording", "Recording gave up")
    assert [c for c, _ in r.calls] == ["notify_failure", "can_restart"]


def test_a_suppressed_decision_says_in_words_which_limit_was_reached():
    fixed = FixedDelayRestartBackoffTimeStrategy(attempts=1, delay_s=1.0)
    assert decide(fixed, 0.0).gave_up == ""  # restarts: nobody gave up
    assert decide(fixed, 1.0).gave_up == "restart strategy fixed-delay (1 attempt) gave up after 2 failures"
    fixed = FixedDelayRestartBackoffTimeStrategy(attempts=3, delay_s=1.0)
    assert [decide(fixed, t).gave_up for t in range(4)][-1] == \
        "restart strategy fixed-delay (3 attempts) gave up after 4 failures"
    rate = FailureRateRestartBackoffTimeStrategy(max_failures_per_interval=2, interval_s=60.0, delay_s=1.0)
    assert [decide(rate, t).gave_up for t in (0.0, 10.0, 30.0)][-1] == \
        "restart strategy failure-rate (at most 2 failures per 1 min) gave up after 3 failures within 30 s"
    exponential = ExponentialDelayRestartBackoffTimeStrategy(attempts_before_reset_backoff=1, jitter_factor=0.0)
    assert decide(exponential, 0.0).restart
    assert decide(exponential, 5.0).gave_up == \
        "restart strategy exponential-delay (1 attempt before the backoff resets) gave up after 2 failures without a reset"
    assert decide(NoRestartBackoffTimeStrategy(), 0.0).gave_up == "restart strategy none: the job restarts on no failure"


def test_strategies_satisfy_the_protocol():
    for s in (NoRestartBackoffTimeStrategy(), FixedDelayRestartBackoffTimeStrategy(),
              FailureRateRestartBackoffTimeStrategy(), ExponentialDelayRestartBackoffTimeStrategy()):
        assert isinstance(s, RestartBackoffTimeStrategy)


def test_restart_decision_is_frozen():
    d = RestartDecision(True, 1.0, True, "x")
    with pytest.raises(AttributeError):
        d.restart = False  # type: ignore[misc]


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------


def test_no_config_means_no_restart():
    assert isinstance(restart_strategy_from_config(None), NoRestartBackoffTimeStrategy)
    assert isinstance(restart_strategy_from_config(C()), NoRestartBackoffTimeStrategy)


@pytest.mark.parametrize(
    "kind, cls",
    [
        ("none", NoRestartBackoffTimeStrategy),
        ("off", NoRestartBackoffTimeStrategy),
        ("disable", NoRestartBackoffTimeStrategy),
        ("  OFF ", NoRestartBackoffTimeStrategy),
        ("fixed-delay", FixedDelayRestartBackoffTimeStrategy),
        ("fixeddelay", FixedDelayRestartBackoffTimeStrategy),
        ("Fixed-Delay", FixedDelayRestartBackoffTimeStrategy),
        ("failure-rate", FailureRateRestartBackoffTimeStrategy),
        ("FailureRate", FailureRateRestartBackoffTimeStrategy),
        ("exponential-delay", ExponentialDelayRestartBackoffTimeStrategy),
        ("EXPONENTIALDELAY", ExponentialDelayRestartBackoffTimeStrategy),
    ],
)
def test_strategy_names_and_aliases(kind, cls):
    assert type(restart_strategy_from_config(C(kind))) is cls


@pytest.mark.parametrize("kind", ["fixed_delay", "exponential", "", "restart", None])
def test_unknown_strategy_names_the_key_and_value(kind):
    with pytest.raises(RestartStrategyError) as info:
        restart_strategy_from_config(C(kind))  # type: ignore[arg-type]
    assert "restart-strategy.type" in str(info.value)
    assert repr(kind) in str(info.value)


def test_defaults_table():
    assert dict(DEFAULTS) == {
        "restart-strategy.fixed-delay.attempts": 1,
        "restart-strategy.fixed-delay.delay": 1.0,
        "restart-strategy.failure-rate.max-failures-per-interval": 1,
        "restart-strategy.failure-rate.failure-rate-interval": 60.0,
        "restart-strategy.failure-rate.delay": 1.0,
        "restart-strategy.exponential-delay.initial-backoff": 1.0,
        "restart-strategy.exponential-delay.max-backoff": 60.0,
        "restart-strategy.exponential-delay.backoff-multiplier": 1.5,
        "restart-strategy.exponential-delay.reset-backoff-threshold": 3600.0,
        "restart-strategy.exponential-delay.jitter-factor": 0.1,
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": None,
    }


def test_missing_keys_take_flinks_defaults():
    assert restart_strategy_from_config(C("fixed-delay")).describe() == FixedDelayRestartBackoffTimeStrategy().describe()
    assert restart_strategy_from_config(C("failure-rate")).describe() == FailureRateRestartBackoffTimeStrategy().describe()
    assert (restart_strategy_from_config(C("exponential-delay")).describe()
            == ExponentialDelayRestartBackoffTimeStrategy().describe())
    # Only some keys given: the rest default.
    s = restart_strategy_from_config(C("fixed-delay", {"attempts": "4"}))
    assert s.describe() == "FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=4, backoffTimeMS=1000)"


def test_fixed_delay_from_suffix_keys():
    s = restart_strategy_from_config(C("fixed-delay", {"attempts": "2", "delay": "1 s"}))
    assert [decide(s, float(t)).restart for t in range(3)] == [True, True, False]


def test_full_flink_keys_and_mixed_keys():
    s = restart_strategy_from_config(C("fixed-delay", {
        "restart-strategy.fixed-delay.attempts": "3",
        "delay": "250ms",
    }))
    assert s.describe() == "FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=3, backoffTimeMS=250)"
    s = restart_strategy_from_config(C("failurerate", {
        "restart-strategy.failure-rate.max-failures-per-interval": "2",
        "restart-strategy.failure-rate.failure-rate-interval": "5 min",
        "restart-strategy.failure-rate.delay": "10 s",
    }))
    assert s.describe() == (
        "FailureRateRestartBackoffTimeStrategy(failuresIntervalMS=300000, backoffTimeMS=10000, "
        "maxFailuresPerInterval=2)"
    )


def test_full_keys_use_the_canonical_name_even_with_an_alias_kind():
    s = restart_strategy_from_config(C("exponentialdelay", {
        "restart-strategy.exponential-delay.initial-backoff": "2 s",
        "max-backoff": "1 min",
        "backoff-multiplier": "2",
        "reset-backoff-threshold": "2 h",
        "jitter-factor": "0",
        "attempts-before-reset-backoff": "5",
    }))
    assert s.describe() == (
        "ExponentialDelayRestartBackoffTimeStrategy(initialBackoffMS=2000, maxBackoffMS=60000, "
        "backoffMultiplier=2.0, resetBackoffThresholdMS=7200000, jitterFactor=0.0, "
        "attemptsBeforeResetBackoff=5, currentRestartAttempt=0, nextRestartTimestamp=none)"
    )
    with pytest.raises(RestartStrategyError, match="restart-strategy.exponentialdelay.initial-backoff"):
        restart_strategy_from_config(C("exponentialdelay", {"restart-strategy.exponentialdelay.initial-backoff": "2 s"}))


def test_durations_in_config_use_flink_syntax():
    s = restart_strategy_from_config(C("fixed-delay", {"delay": "1500"}))  # bare number: ms
    assert s.backoff_time(0.0) == 1.5
    s = restart_strategy_from_config(C("fixed-delay", {"delay": "2 min"}))
    assert s.backoff_time(0.0) == 120.0
    s = restart_strategy_from_config(C("fixed-delay", {"delay": 500}))  # type: ignore[dict-item]
    assert s.backoff_time(0.0) == 0.5  # non-strings are read as text, as Flink does


def test_unknown_keys_are_all_listed_in_one_message():
    with pytest.raises(RestartStrategyError) as info:
        restart_strategy_from_config(C("fixed-delay", {
            "attempts": "2",
            "atempts": "3",
            "restart-strategy.failure-rate.delay": "1 s",
            "max-backoff": "1 min",
        }))
    msg = str(info.value)
    assert msg.startswith("unknown options for restart strategy 'fixed-delay': ")
    for key in ("'atempts'", "'restart-strategy.failure-rate.delay'", "'max-backoff'"):
        assert key in msg
    assert "'attempts'," not in msg.split("(")[0]  # the valid key is not reported
    assert "accepted: attempts, delay" in msg


def test_options_for_none_are_unknown():
    with pytest.raises(RestartStrategyError, match="'attempts'.*takes no options"):
        restart_strategy_from_config(C("none", {"attempts": "3"}))


def test_same_option_given_twice_is_an_error():
    with pytest.raises(RestartStrategyError, match="given twice"):
        restart_strategy_from_config(C("fixed-delay", {"delay": "1 s", "restart-strategy.fixed-delay.delay": "2 s"}))


@pytest.mark.parametrize(
    "kind, options, key, value",
    [
        ("fixed-delay", {"attempts": "-1"}, "restart-strategy.fixed-delay.attempts", "-1"),
        ("fixed-delay", {"attempts": "two"}, "restart-strategy.fixed-delay.attempts", "'two'"),
        ("fixed-delay", {"attempts": "1.0"}, "restart-strategy.fixed-delay.attempts", "'1.0'"),
        ("fixed-delay", {"attempts": "1_0"}, "restart-strategy.fixed-delay.attempts", "'1_0'"),
        ("fixed-delay", {"delay": "soon"}, "restart-strategy.fixed-delay.delay", "'soon'"),
        ("fixed-delay", {"delay": "-1 s"}, "restart-strategy.fixed-delay.delay", "'-1 s'"),
        ("failure-rate", {"max-failures-per-interval": "0"},
         "restart-strategy.failure-rate.max-failures-per-interval", "0"),
        ("failure-rate", {"failure-rate-interval": "0 s"},
         "restart-strategy.failure-rate.failure-rate-interval", "0 ms"),
        ("exponential-delay", {"backoff-multiplier": "1"},
         "restart-strategy.exponential-delay.backoff-multiplier", "1.0"),
        ("exponential-delay", {"backoff-multiplier": "x2"},
         "restart-strategy.exponential-delay.backoff-multiplier", "'x2'"),
        ("exponential-delay", {"backoff-multiplier": "1e999"},
         "restart-strategy.exponential-delay.backoff-multiplier", "'1e999'"),
        ("exponential-delay", {"backoff-multiplier": "nan"},
         "restart-strategy.exponential-delay.backoff-multiplier", "'nan'"),
        ("exponential-delay", {"jitter-factor": "1.5"}, "restart-strategy.exponential-delay.jitter-factor", "1.5"),
        ("exponential-delay", {"jitter-factor": "-0.5"}, "restart-strategy.exponential-delay.jitter-factor", "-0.5"),
        ("exponential-delay", {"initial-backoff": "0 ms"}, "restart-strategy.exponential-delay.initial-backoff", "0 ms"),
        ("exponential-delay", {"initial-backoff": "2 min"}, "restart-strategy.exponential-delay.initial-backoff", "2 min"),
        ("exponential-delay", {"max-backoff": "500 ms"}, "restart-strategy.exponential-delay.max-backoff", "500 ms"),
        ("exponential-delay", {"reset-backoff-threshold": "0"},
         "restart-strategy.exponential-delay.reset-backoff-threshold", "0 ms"),
        ("exponential-delay", {"attempts-before-reset-backoff": "0"},
         "restart-strategy.exponential-delay.attempts-before-reset-backoff", "0"),
    ],
)
def test_bad_values_name_the_key_and_the_value(kind, options, key, value):
    with pytest.raises(RestartStrategyError) as info:
        restart_strategy_from_config(C(kind, options))
    assert key in str(info.value)
    assert value in str(info.value)
    assert isinstance(info.value, ValueError)


def test_numeric_option_syntax():
    s = restart_strategy_from_config(C("exponential-delay", {
        "backoff-multiplier": " 2.5e0 ", "jitter-factor": ".25", "attempts-before-reset-backoff": "+3",
    }))
    assert "backoffMultiplier=2.5" in s.describe()
    assert "jitterFactor=0.25" in s.describe()
    assert "attemptsBeforeResetBackoff=3" in s.describe()


def test_injected_rng_is_used_for_jitter():
    cfg = C("exponential-delay", {"jitter-factor": "0.5"})

    def delays(seed: int) -> list[float]:
        s = restart_strategy_from_config(cfg, rng=random.Random(seed))
        out, now = [], 0.0
        for _ in range(10):
            out.append(decide(s, now).delay_s)
            now = s.next_restart_time + 0.1
        return out

    assert delays(1) == delays(1)
    assert delays(1) != delays(2)


def test_each_call_builds_a_fresh_strategy():
    cfg = C("fixed-delay", {"attempts": "1"})
    a = restart_strategy_from_config(cfg)
    decide(a, 0.0)
    assert decide(a, 1.0).restart is False
    assert decide(restart_strategy_from_config(cfg), 2.0).restart is True


def test_options_must_be_a_mapping():
    with pytest.raises(RestartStrategyError, match="mapping"):
        restart_strategy_from_config(C("fixed-delay", ["attempts"]))  # type: ignore[arg-type]


def test_job_validation_reports_a_bad_restart_strategy():
    from funke.common.graph.validation import find_problems

    job = JobGraph(name="j", vertices=(), configuration=JobConfiguration(
        restart_strategy=C("fixed-delay", {"attempts": "-1"})))
    problems = [p for p in find_problems(job) if p.subject == "job configuration"]
    assert len(problems) == 1 and "restart-strategy.fixed-delay.attempts" in problems[0].message


# ------------------------------------------------------------------------------------------
# describe_config
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, text",
    [
        (None, "none"),
        (C(), "none"),
        (C("Off"), "none"),
        (C("fixed-delay", {"attempts": "2", "delay": "1 s"}), "fixed-delay(attempts=2, delay=1 s)"),
        (C("fixeddelay", {"delay": "1500"}), "fixed-delay(attempts=1, delay=1500 ms)"),
        (C("fixed-delay", {"delay": "0"}), "fixed-delay(attempts=1, delay=0 ms)"),
        (C("fixed-delay", {"delay": "90 s"}), "fixed-delay(attempts=1, delay=90 s)"),
        (C("fixed-delay", {"delay": "120 s"}), "fixed-delay(attempts=1, delay=2 min)"),
        (C("failure-rate"), "failure-rate(max-failures-per-interval=1, failure-rate-interval=1 min, delay=1 s)"),
        (C("exponential-delay"),
         "exponential-delay(initial-backoff=1 s, max-backoff=1 min, backoff-multiplier=1.5, "
         "reset-backoff-threshold=1 h, jitter-factor=0.1, attempts-before-reset-backoff=unlimited)"),
        (C("exponential-delay", {"restart-strategy.exponential-delay.attempts-before-reset-backoff": "3",
                                 "reset-backoff-threshold": "1 d"}),
         "exponential-delay(initial-backoff=1 s, max-backoff=1 min, backoff-multiplier=1.5, "
         "reset-backoff-threshold=1 d, jitter-factor=0.1, attempts-before-reset-backoff=3)"),
    ],
)
def test_describe_config(cfg, text):
    assert describe_config(cfg) == text


def test_describe_config_rejects_bad_configs():
    with pytest.raises(RestartStrategyError, match="jitter-factor"):
        describe_config(C("exponential-delay", {"jitter-factor": "2"}))


@settings(derandomize=True)
@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["ns", "µs", "ms", "s", "min", "h", "d"]))
def test_described_durations_parse_back(n, unit):
    seconds = parse_duration(f"{n} {unit}")
    shown = describe_config(C("fixed-delay", {"delay": f"{n} {unit}"}))
    delay_text = shown.split("delay=")[1].rstrip(")")
    assert parse_duration(delay_text) == pytest.approx(seconds, rel=1e-12, abs=1e-12)


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------

_gaps = st.lists(
    st.one_of(
        st.just(0.0),
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False),
        st.floats(min_value=0.0, max_value=10_000.0, allow_nan=False, allow_infinity=False),
    ),
    min_size=1,
    max_size=60,
)


@st.composite
def _exponential(draw):
    initial = draw(st.floats(min_value=0.001, max_value=100.0))
    maximum = draw(st.floats(min_value=initial, max_value=1000.0))
    return ExponentialDelayRestartBackoffTimeStrategy(
        initial_backoff_s=initial,
        max_backoff_s=maximum,
        backoff_multiplier=draw(st.floats(min_value=1.0001, max_value=20.0)),
        reset_backoff_threshold_s=draw(st.floats(min_value=0.001, max_value=5000.0)),
        jitter_factor=draw(st.floats(min_value=0.0, max_value=1.0)),
        attempts_before_reset_backoff=draw(st.none() | st.integers(min_value=1, max_value=50)),
        rng=random.Random(draw(st.integers(min_value=0, max_value=2**32))),
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_exponential(), st.floats(min_value=-1e6, max_value=1e6), _gaps)
def test_exponential_backoff_is_always_within_zero_and_max(s, start, gaps):
    now = start
    attempts = 0
    for gap in gaps:
        now += gap
        new = s.notify_failure(now)
        attempts = s.current_attempt
        delay = s.backoff_time(now)
        assert 0.0 <= delay <= s._max_s
        if new:
            assert delay >= min(s._initial_s, s._max_s) - 1e-9 * max(1.0, abs(now))
        # The pending restart is never in the past relative to a failure merged into it.
        assert s.next_restart_time is not None
        # Asking again later never goes negative either.
        assert 0.0 <= s.backoff_time(now + gap) <= s._max_s
        assert attempts >= 1


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.sampled_from(["fixed", "rate", "none"]),
    st.integers(min_value=1, max_value=5),
    st.floats(min_value=0.0, max_value=100.0),
    _gaps,
)
def test_other_strategies_backoff_is_never_negative(kind, n, delay, gaps):
    s = {
        "fixed": lambda: FixedDelayRestartBackoffTimeStrategy(n, delay),
        "rate": lambda: FailureRateRestartBackoffTimeStrategy(n, 10.0, delay),
        "none": lambda: NoRestartBackoffTimeStrategy(),
    }[kind]()
    now = 0.0
    for gap in gaps:
        now += gap
        d = decide(s, now)
        assert d.delay_s >= 0.0
        assert d.delay_s == (delay if d.restart else 0.0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(min_value=1, max_value=4), st.floats(min_value=0.5, max_value=50.0), _gaps)
def test_failure_rate_matches_a_brute_force_window(n, interval, gaps):
    s = FailureRateRestartBackoffTimeStrategy(n, interval, 0.0)
    times: list[float] = []
    now = 0.0
    for gap in gaps:
        now += gap
        times.append(now)
        # The job fails iff the last n+1 failures all lie within `interval` (inclusive).
        expected = len(times) <= n or now - times[-(n + 1)] > interval
        assert decide(s, now).restart == expected
