"""Restart strategies: whether a failed job may restart, and after how long.

Owns the four restart strategies (none, fixed-delay, failure-rate, exponential-delay), the
`decide` step the scheduler takes on every failure, and the parsing of a job's
`RestartStrategyConfig` (Flink's strategy names, option keys, defaults, range checks and duration
syntax, `durations.py`'s). It owns nothing else: which tasks restart is the failover strategy's business, and the
scheduler owns the timers.

Everything here is sans-IO and deterministic: time comes in as `now` (seconds on whatever
monotonic clock the caller uses) and the only randomness, exponential-delay's jitter, comes from an
injected `random.Random`.

Semantics follow Flink 1.19+ (`RestartBackoffTimeStrategy` and its implementations). Where we
differ, on purpose:
- durations are float seconds with sub-millisecond precision kept (Flink truncates to whole ms,
  also inside the exponential backoff computation);
- exponential-delay's jitter is a uniform float in [-b*jitter, +b*jitter] (Flink draws a long);
- "no limit" for attempts-before-reset-backoff is `None` (Flink uses Integer.MAX_VALUE);
- the failure-rate `describe()` names the class once (Flink's toString repeats it).
"""

from __future__ import annotations

import math
import random
import re
import sys
from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Protocol, runtime_checkable

from funke.common.durations import DurationError, format_duration, parse_duration
from funke.common.graph.jobgraph import RestartStrategyConfig

__all__ = [
    "DEFAULTS",
    "ExponentialDelayRestartBackoffTimeStrategy",
    "FailureRateRestartBackoffTimeStrategy",
    "FixedDelayRestartBackoffTimeStrategy",
    "NoRestartBackoffTimeStrategy",
    "RestartBackoffTimeStrategy",
    "RestartDecision",
    "RestartStrategyError",
    "decide",
    "describe_config",
    "restart_strategy_from_config",
]

KEY_PREFIX = "restart-strategy."
TYPE_KEY = "restart-strategy.type"
# Exponential backoff bases above this are treated as infinite (see `_backoff_for`): a quarter
# of the largest float leaves room for base + jitter with a jitter factor up to 1.
_HUGE = sys.float_info.max / 4


class RestartStrategyError(ValueError):
    """A restart strategy configuration that Flink would reject; the message names the offending
    key and value."""


# --------------------------------------------------------------------------------------------
# The strategies
# --------------------------------------------------------------------------------------------


@runtime_checkable
class RestartBackoffTimeStrategy(Protocol):
    """What the scheduler asks on every failure, in this order (see `decide`):
    `notify_failure`, then `can_restart`, then (only if restartable) `backoff_time`."""

    def notify_failure(self, now: float) -> bool:
        """Record a failure at `now`. True if it starts a new restart attempt; False if it was
        merged into the restart that is already pending."""
        ...

    def can_restart(self, now: float) -> bool: ...

    def backoff_time(self, now: float) -> float:
        """Seconds to wait before restarting; never negative."""
        ...

    def describe(self) -> str:
        """Flink-style one-line description, used in "Recovery is suppressed by ..."."""
        ...

    def gave_up(self) -> str:
        """Once `can_restart` said no: which strategy gave up, with its limit and what reached it,
        in words ("restart strategy fixed-delay (1 attempt) gave up after 2 failures")."""
        ...


class NoRestartBackoffTimeStrategy:
    """Never restarts: the first failure fails the job."""

    __slots__ = ()

    def notify_failure(self, now: float) -> bool:
        return True

    def can_restart(self, now: float) -> bool:
        return False

    def backoff_time(self, now: float) -> float:
        return 0.0

    def describe(self) -> str:
        return "NoRestartBackoffTimeStrategy"

    def gave_up(self) -> str:
        return "restart strategy none: the job restarts on no failure"

    __str__ = describe

    def __repr__(self) -> str:
        return self.describe()


class FixedDelayRestartBackoffTimeStrategy:
    """At most `attempts` restarts over the job's lifetime, each after `delay_s`.

    Every notified failure counts, even several at the same instant: Flink does not merge
    concurrent failures for this strategy, so region failovers that overlap each use an attempt.
    """

    __slots__ = ("_attempts", "_delay_s", "_current_attempt")

    def __init__(self, attempts: int = 1, delay_s: float = 1.0) -> None:
        _check_int(attempts, "restart-strategy.fixed-delay.attempts", minimum=0)
        _check_duration(delay_s, "restart-strategy.fixed-delay.delay", minimum=0.0)
        self._attempts = attempts
        self._delay_s = float(delay_s)
        self._current_attempt = 0

    @property
    def current_attempt(self) -> int:
        return self._current_attempt

    def notify_failure(self, now: float) -> bool:
        self._current_attempt += 1
        return True

    def can_restart(self, now: float) -> bool:
        # `<=`: with N attempts, failures 1..N restart and failure N+1 is suppressed.
        return self._current_attempt <= self._attempts

    def backoff_time(self, now: float) -> float:
        return self._delay_s

    def describe(self) -> str:
        return (
            f"FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts={self._attempts}, "
            f"backoffTimeMS={_ms(self._delay_s)})"
        )

    def gave_up(self) -> str:
        return (f"restart strategy fixed-delay ({_count(self._attempts, 'attempt')}) gave up after "
                f"{_count(self._current_attempt, 'failure')}")

    __str__ = describe

    def __repr__(self) -> str:
        return self.describe()


class FailureRateRestartBackoffTimeStrategy:
    """Restarts after `delay_s` unless more than `max_failures_per_interval` failures fall within
    `interval_s`: the job fails when the (max+1)th most recent failure is at most `interval_s`
    old (inclusive)."""

    __slots__ = ("_max_failures", "_interval_s", "_delay_s", "_failures")

    def __init__(
        self, max_failures_per_interval: int = 1, interval_s: float = 60.0, delay_s: float = 1.0
    ) -> None:
        _check_int(
            max_failures_per_interval,
            "restart-strategy.failure-rate.max-failures-per-interval",
            minimum=1,
        )
        _check_duration(
            interval_s, "restart-strategy.failure-rate.failure-rate-interval", minimum=0.0, strict=True
        )
        _check_duration(delay_s, "restart-strategy.failure-rate.delay", minimum=0.0)
        self._max_failures = max_failures_per_interval
        self._interval_s = float(interval_s)
        self._delay_s = float(delay_s)
        # Only the last max+1 failure times matter for the rate check, so the memory is bounded
        # however long the job runs.
        self._failures: deque[float] = deque()

    def notify_failure(self, now: float) -> bool:
        if len(self._failures) > self._max_failures:
            self._failures.popleft()
        self._failures.append(now)
        return True

    def can_restart(self, now: float) -> bool:
        if len(self._failures) > self._max_failures:
            # Strict `>`: a failure exactly `interval` after the oldest one still counts as
            # inside the window (Flink's comparison).
            return now - self._failures[0] > self._interval_s
        return True

    def backoff_time(self, now: float) -> float:
        return self._delay_s

    def describe(self) -> str:
        return (
            f"FailureRateRestartBackoffTimeStrategy(failuresIntervalMS={_ms(self._interval_s)}, "
            f"backoffTimeMS={_ms(self._delay_s)}, maxFailuresPerInterval={self._max_failures})"
        )

    def gave_up(self) -> str:
        span = self._failures[-1] - self._failures[0] if self._failures else 0.0
        return (f"restart strategy failure-rate (at most {_count(self._max_failures, 'failure')} per "
                f"{format_duration(self._interval_s)}) gave up after {_count(len(self._failures), 'failure')} "
                f"within {format_duration(span)}")

    __str__ = describe

    def __repr__(self) -> str:
        return self.describe()


class ExponentialDelayRestartBackoffTimeStrategy:
    """Backoff that grows by `backoff_multiplier` per restart attempt, from `initial_backoff_s`
    up to `max_backoff_s`, with jitter; it resets to the initial backoff once the job has run
    `reset_backoff_threshold_s` past its last scheduled restart.

    Failures that arrive while a restart is pending (at or before the scheduled restart time)
    are merged into that restart: no new attempt, no growth, and they wait only for the
    remaining time. With `attempts_before_reset_backoff = N`, the (N+1)th attempt without an
    intervening reset fails the job; `None` means no limit.
    """

    __slots__ = (
        "_initial_s",
        "_max_s",
        "_multiplier",
        "_reset_threshold_s",
        "_jitter",
        "_attempts",
        "_rng",
        "_current_attempt",
        "_next_restart",
        "_scheduled_backoff",
    )

    def __init__(
        self,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        backoff_multiplier: float = 1.5,
        reset_backoff_threshold_s: float = 3600.0,
        jitter_factor: float = 0.1,
        attempts_before_reset_backoff: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        prefix = "restart-strategy.exponential-delay."
        # Flink requires at least 1 ms for every duration of this strategy.
        _check_duration(initial_backoff_s, prefix + "initial-backoff", minimum=0.001)
        _check_duration(max_backoff_s, prefix + "max-backoff", minimum=0.001)
        if initial_backoff_s > max_backoff_s:
            raise RestartStrategyError(
                f"{prefix}initial-backoff ({format_duration(initial_backoff_s)}) must not exceed "
                f"{prefix}max-backoff ({format_duration(max_backoff_s)})"
            )
        _check_float(backoff_multiplier, prefix + "backoff-multiplier")
        if not backoff_multiplier > 1.0:
            raise RestartStrategyError(
                f"{prefix}backoff-multiplier must be greater than 1, got {backoff_multiplier!r}"
            )
        _check_duration(reset_backoff_threshold_s, prefix + "reset-backoff-threshold", minimum=0.001)
        _check_float(jitter_factor, prefix + "jitter-factor")
        if not 0.0 <= jitter_factor <= 1.0:
            raise RestartStrategyError(
                f"{prefix}jitter-factor must be between 0 and 1, got {jitter_factor!r}"
            )
        if attempts_before_reset_backoff is not None:
            _check_int(attempts_before_reset_backoff, prefix + "attempts-before-reset-backoff", minimum=1)
        self._initial_s = float(initial_backoff_s)
        self._max_s = float(max_backoff_s)
        self._multiplier = float(backoff_multiplier)
        self._reset_threshold_s = float(reset_backoff_threshold_s)
        self._jitter = float(jitter_factor)
        self._attempts = attempts_before_reset_backoff
        # Created lazily, so that building a strategy (e.g. only to validate a config) never
        # touches OS entropy; an injected rng makes the jitter reproducible.
        self._rng = rng
        self._current_attempt = 0
        # None until the first failure. Flink uses a far-past sentinel timestamp instead; with a
        # caller-chosen clock origin no timestamp is safely "far past".
        self._next_restart: float | None = None
        self._scheduled_backoff = 0.0

    @property
    def current_attempt(self) -> int:
        return self._current_attempt

    @property
    def next_restart_time(self) -> float | None:
        return self._next_restart

    def notify_failure(self, now: float) -> bool:
        if self._next_restart is not None and now <= self._next_restart:
            # A restart is already pending (e.g. another region of the same outage failed):
            # fold this failure into it rather than growing the backoff per failed task.
            return False
        # Measured from the scheduled restart, not from the previous failure: the job must have
        # run for the threshold after it was (supposed to be) back up.
        if self._next_restart is None or now - self._next_restart >= self._reset_threshold_s:
            self._current_attempt = 0
        self._scheduled_backoff = self._backoff_for(self._current_attempt)
        self._next_restart = now + self._scheduled_backoff
        self._current_attempt += 1
        return True

    def can_restart(self, now: float) -> bool:
        return self._attempts is None or self._current_attempt <= self._attempts

    def backoff_time(self, now: float) -> float:
        if self._next_restart is None:
            raise RuntimeError("backoff_time() called before any notify_failure()")
        # The remaining time to the pending restart, so merged failures do not push it back.
        # Capped by the backoff that scheduled it: float rounding in (t + b) - t, or a caller
        # whose clock stepped back, must not yield more than the computed backoff.
        return min(max(0.0, self._next_restart - now), self._scheduled_backoff)

    def _backoff_for(self, attempt: int) -> float:
        try:
            base = self._initial_s * self._multiplier**attempt
        except OverflowError:
            base = math.inf
        if not base < _HUGE:
            # Without a limit on attempts the exponent is unbounded. Past this point the jitter
            # range itself would overflow (inf - inf = nan), and the backoff is the maximum
            # whatever the draw (except with odds below max/base).
            return self._max_s
        jitter = 0.0
        if self._jitter > 0.0:
            if self._rng is None:
                self._rng = random.Random()
            spread = base * self._jitter
            jitter = self._rng.uniform(-spread, spread)
        # Jitter is applied to the uncapped backoff and before clamping, so the result always
        # lies in [initial, max] (Flink 1.19).
        return max(self._initial_s, min(base + jitter, self._max_s))

    def describe(self) -> str:
        attempts = "unlimited" if self._attempts is None else str(self._attempts)
        next_restart = "none" if self._next_restart is None else _ms(self._next_restart)
        return (
            "ExponentialDelayRestartBackoffTimeStrategy("
            f"initialBackoffMS={_ms(self._initial_s)}, "
            f"maxBackoffMS={_ms(self._max_s)}, "
            f"backoffMultiplier={self._multiplier!r}, "
            f"resetBackoffThresholdMS={_ms(self._reset_threshold_s)}, "
            f"jitterFactor={self._jitter!r}, "
            f"attemptsBeforeResetBackoff={attempts}, "
            f"currentRestartAttempt={self._current_attempt}, "
            f"nextRestartTimestamp={next_restart})"
        )

    def gave_up(self) -> str:
        return (f"restart strategy exponential-delay ({_count(self._attempts or 0, 'attempt')} before the backoff "
                f"resets) gave up after {_count(self._current_attempt, 'failure')} without a reset")

    __str__ = describe

    def __repr__(self) -> str:
        return self.describe()


# --------------------------------------------------------------------------------------------
# The decision step
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """The outcome of one failure. `delay_s` is 0 when `restart` is False; `strategy` is the
    strategy's description after the failure was recorded (for "Recovery is suppressed by");
    `gave_up`, when `restart` is False, says in words which limit the failure reached."""

    restart: bool
    delay_s: float
    new_attempt: bool
    strategy: str
    gave_up: str = ""


def decide(strategy: RestartBackoffTimeStrategy, now: float) -> RestartDecision:
    """Record a failure at `now` and decide. Flink's order: the failure is notified before
    `can_restart`, so the failure being handled counts against the limits; the backoff is only
    asked for when a restart will happen."""
    new_attempt = strategy.notify_failure(now)
    if strategy.can_restart(now):
        return RestartDecision(True, strategy.backoff_time(now), new_attempt, strategy.describe())
    return RestartDecision(False, 0.0, new_attempt, strategy.describe(), strategy.gave_up())


# --------------------------------------------------------------------------------------------
# Numbers as Flink reads and prints them
# --------------------------------------------------------------------------------------------

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(seconds: float) -> str:
    """Milliseconds as Flink prints them (an integer), unless sub-millisecond precision would be
    lost."""
    ms = seconds * 1000.0
    if math.isfinite(ms) and abs(ms - round(ms)) <= 1e-9 * max(1.0, abs(ms)):
        return str(int(round(ms)))
    return repr(ms)


# --------------------------------------------------------------------------------------------
# Argument checks shared by the constructors (so direct construction and config parsing reject
# the same things with the same messages)
# --------------------------------------------------------------------------------------------


def _check_int(value: object, key: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RestartStrategyError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise RestartStrategyError(f"{key} must be at least {minimum}, got {value}")


def _check_float(value: object, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RestartStrategyError(f"{key} must be a finite number, got {value!r}")


def _check_duration(value: object, key: str, *, minimum: float, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RestartStrategyError(f"{key} must be a finite duration in seconds, got {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = "greater than" if strict else "at least"
        raise RestartStrategyError(
            f"{key} must be {relation} {format_duration(minimum)}, got {format_duration(value)}"
        )


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def _parse_int_option(key: str, text: str) -> int:
    # Java's Integer.parseInt: optional sign, ASCII digits, a 32-bit value. Python's int() would
    # also take underscores, non-ASCII digits and any size, which Flink rejects.
    if len(text) > 40 or re.fullmatch(r"[+-]?[0-9]+", text.strip(), re.ASCII) is None:
        raise RestartStrategyError(f"{key}: {_shown(text)} is not an integer")
    value = int(text.strip())
    if not _INT_MIN <= value <= _INT_MAX:
        raise RestartStrategyError(f"{key}: {_shown(text)} does not fit in 32 bits (at most {_INT_MAX})")
    return value


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text):,} characters)"


_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _parse_float_option(key: str, text: str) -> float:
    if len(text) > 400 or _FLOAT_RE.fullmatch(text.strip()) is None:
        raise RestartStrategyError(f"{key}: {_shown(text)} is not a number")
    value = float(text.strip())
    if not math.isfinite(value):
        raise RestartStrategyError(f"{key}: {_shown(text)} is out of range")
    return value


def _parse_duration_option(key: str, text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise RestartStrategyError(f"{key}: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Option:
    suffix: str
    parse: Callable[[str, str], object]
    default: object
    param: str  # the strategy constructor's keyword


@dataclass(frozen=True, slots=True)
class _StrategySpec:
    name: str  # canonical Flink name, also the middle part of the option keys
    aliases: tuple[str, ...]
    options: tuple[_Option, ...]
    build: Callable[..., RestartBackoffTimeStrategy]

    def key(self, suffix: str) -> str:
        return f"{KEY_PREFIX}{self.name}.{suffix}"


_SPECS: tuple[_StrategySpec, ...] = (
    _StrategySpec("none", ("none", "off", "disable"), (), lambda **_: NoRestartBackoffTimeStrategy()),
    _StrategySpec(
        "fixed-delay",
        ("fixed-delay", "fixeddelay"),
        (
            _Option("attempts", _parse_int_option, 1, "attempts"),
            _Option("delay", _parse_duration_option, 1.0, "delay_s"),
        ),
        lambda rng=None, **kw: FixedDelayRestartBackoffTimeStrategy(**kw),
    ),
    _StrategySpec(
        "failure-rate",
        ("failure-rate", "failurerate"),
        (
            _Option("max-failures-per-interval", _parse_int_option, 1, "max_failures_per_interval"),
            _Option("failure-rate-interval", _parse_duration_option, 60.0, "interval_s"),
            _Option("delay", _parse_duration_option, 1.0, "delay_s"),
        ),
        lambda rng=None, **kw: FailureRateRestartBackoffTimeStrategy(**kw),
    ),
    _StrategySpec(
        "exponential-delay",
        ("exponential-delay", "exponentialdelay"),
        (
            _Option("initial-backoff", _parse_duration_option, 1.0, "initial_backoff_s"),
            _Option("max-backoff", _parse_duration_option, 60.0, "max_backoff_s"),
            _Option("backoff-multiplier", _parse_float_option, 1.5, "backoff_multiplier"),
            _Option("reset-backoff-threshold", _parse_duration_option, 3600.0, "reset_backoff_threshold_s"),
            _Option("jitter-factor", _parse_float_option, 0.1, "jitter_factor"),
            _Option("attempts-before-reset-backoff", _parse_int_option, None, "attempts_before_reset_backoff"),
        ),
        lambda **kw: ExponentialDelayRestartBackoffTimeStrategy(**kw),
    ),
)

_SPEC_BY_ALIAS: dict[str, _StrategySpec] = {alias: s for s in _SPECS for alias in s.aliases}

#: Flink's default for every option, by full key (None: no limit).
DEFAULTS: Mapping[str, object] = MappingProxyType(
    {s.key(o.suffix): o.default for s in _SPECS for o in s.options}
)


def _parse_config(cfg: RestartStrategyConfig) -> tuple[_StrategySpec, dict[str, object]]:
    """Resolve the strategy and every option value (given or default), keyed by option suffix."""
    kind = cfg.kind
    if not isinstance(kind, str):
        raise RestartStrategyError(f"{TYPE_KEY}: expected a strategy name, got {type(kind).__name__}")
    spec = _SPEC_BY_ALIAS.get(kind.strip().lower())
    if spec is None:
        accepted = ", ".join(a for s in _SPECS for a in s.aliases)
        raise RestartStrategyError(
            f"{TYPE_KEY}: unknown restart strategy {_shown(kind)} (accepted: {accepted})"
        )

    options = cfg.options if cfg.options is not None else {}
    if not isinstance(options, Mapping):
        raise RestartStrategyError(f"restart strategy options must be a mapping, got {options!r}")

    by_suffix = {o.suffix: o for o in spec.options}
    given: dict[str, tuple[str, object]] = {}  # suffix -> (key as written, value)
    unknown: list[str] = []
    for key, value in options.items():
        suffix = key if isinstance(key, str) and key in by_suffix else None
        full_prefix = f"{KEY_PREFIX}{spec.name}."
        if suffix is None and isinstance(key, str) and key.startswith(full_prefix):
            rest = key[len(full_prefix) :]
            suffix = rest if rest in by_suffix else None
        if suffix is None:
            unknown.append(_shown(key) if isinstance(key, str) else repr(key)[:60])
            continue
        if suffix in given:
            raise RestartStrategyError(
                f"{spec.key(suffix)} is given twice, as {given[suffix][0]!r} and {key!r}"
            )
        given[suffix] = (key, value)
    if unknown:
        if by_suffix:
            accepted = (
                f"accepted: {', '.join(by_suffix)}, "
                f"optionally prefixed with '{KEY_PREFIX}{spec.name}.'"
            )
        else:
            accepted = "it takes no options"
        raise RestartStrategyError(
            f"unknown option{'s' if len(unknown) > 1 else ''} for restart strategy "
            f"{spec.name!r}: {', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''} ({accepted})"
        )

    values: dict[str, object] = {}
    for option in spec.options:
        if option.suffix in given:
            raw = given[option.suffix][1]
            # Non-string values are read through their text form, as Flink's Configuration
            # does: an int 1000 for a duration means 1000 ms.
            text = raw if isinstance(raw, str) else str(raw)
            values[option.suffix] = option.parse(spec.key(option.suffix), text)
        else:
            values[option.suffix] = option.default
    return spec, values


def restart_strategy_from_config(
    cfg: RestartStrategyConfig | None, *, rng: random.Random | None = None
) -> RestartBackoffTimeStrategy:
    """A fresh strategy for one job run. `None` means no restarts; choosing a cluster-wide
    default (Flink: exponential-delay when checkpointing is on) is the caller's business.
    Raises `RestartStrategyError` for anything Flink would reject."""
    if cfg is None:
        return NoRestartBackoffTimeStrategy()
    spec, values = _parse_config(cfg)
    return _build(spec, values, rng)


def _build(
    spec: _StrategySpec, values: Mapping[str, object], rng: random.Random | None
) -> RestartBackoffTimeStrategy:
    kwargs = {o.param: values[o.suffix] for o in spec.options}
    return spec.build(rng=rng, **kwargs)


def describe_config(cfg: RestartStrategyConfig | None) -> str:
    """Short human form of the effective configuration (defaults filled in), e.g.
    "fixed-delay(attempts=2, delay=1 s)". Raises `RestartStrategyError` like
    `restart_strategy_from_config`."""
    if cfg is None:
        return "none"
    spec, values = _parse_config(cfg)
    _build(spec, values, None)  # for the range checks; the rng is lazy, so no side effects
    if not spec.options:
        return spec.name
    parts = []
    for option in spec.options:
        value = values[option.suffix]
        if value is None:
            shown = "unlimited"
        elif option.parse is _parse_duration_option:
            shown = format_duration(value)  # type: ignore[arg-type]
        else:
            shown = repr(value) if isinstance(value, float) else str(value)
        parts.append(f"{option.suffix}={shown}")
    return f"{spec.name}({', '.join(parts)})"
