"""Durations as Flink writes them ("1 s", "500 ms", "2 min"; a bare number is milliseconds): the one
syntax of every duration a job or the cluster configures (restart strategies, heartbeats,
triggers, receivers' block intervals).

Owns parsing such a text into float seconds, exactly (integer nanoseconds and one division), and
the inverse: the text a number of seconds is shown as, which parses back to it.
"""

from __future__ import annotations

import math
import re


class DurationError(ValueError):
    """Text that is not a duration Flink would read; the message quotes it."""


_NANOS_PER_UNIT: dict[str, int] = {}
for _labels, _nanos in (
    (("d", "day", "days"), 86_400 * 10**9),
    (("h", "hour", "hours"), 3_600 * 10**9),
    (("min", "m", "minute", "minutes"), 60 * 10**9),
    (("s", "sec", "secs", "second", "seconds"), 10**9),
    (("ms", "milli", "millis", "millisecond", "milliseconds"), 10**6),
    (("µs", "micro", "micros", "microsecond", "microseconds"), 10**3),
    (("ns", "nano", "nanos", "nanosecond", "nanoseconds"), 1),
):
    for _label in _labels:
        _NANOS_PER_UNIT[_label] = _nanos
del _labels, _nanos, _label

# Flink reads the number as a Java long: ASCII digits only, no sign, no fraction.
_DURATION_RE = re.compile(r"([0-9]+)(.*)", re.ASCII | re.DOTALL)
_LONG_MAX = 2**63 - 1


def parse_duration(text: str) -> float:
    """Parse Flink's duration syntax into seconds: an integer followed by an optional unit,
    with optional whitespace between ("1 s", "500ms", "1min", "2 h", "1 d"; units are
    case-insensitive). A bare number means milliseconds, as in Flink."""
    if not isinstance(text, str):
        raise DurationError(f"duration must be a string, got {type(text).__name__}")
    trimmed = text.strip()
    match = _DURATION_RE.fullmatch(trimmed)
    if match is None:
        raise DurationError(
            f"invalid duration {_shown(text)}: expected a non-negative integer and a unit, e.g. '1 s'"
        )
    value = int(match.group(1))
    if value > _LONG_MAX:
        raise DurationError(f"invalid duration {_shown(text)}: number does not fit in 64 bits")
    label = match.group(2).strip().lower()
    if label[:1] in (".", ","):
        raise DurationError(
            f"invalid duration {_shown(text)}: fractions are not supported, use a smaller unit "
            "(e.g. '1500 ms')"
        )
    if not label:
        return value * 10**6 / 10**9
    nanos = _NANOS_PER_UNIT.get(label)
    if nanos is None:
        raise DurationError(
            f"invalid duration {_shown(text)}: unknown time unit {label!r} "
            "(use d, h, min, s, ms, µs or ns)"
        )
    # Integer nanoseconds, then one correctly rounded division: "1 ms" is exactly 0.001.
    return value * nanos / 10**9


_FORMAT_UNITS = (
    ("d", 86_400 * 10**9),
    ("h", 3_600 * 10**9),
    ("min", 60 * 10**9),
    ("s", 10**9),
    ("ms", 10**6),
    ("µs", 10**3),
)


def format_duration(seconds: float) -> str:
    """The largest unit that shows `seconds` as a whole number, so the text parses back to
    (nearly, within float precision) the same value: 120.0 -> "2 min", 1.5 -> "1500 ms"."""
    if not math.isfinite(seconds):
        return repr(seconds)
    if seconds == 0:
        return "0 ms"
    for label, size in _FORMAT_UNITS:
        count = round(seconds * 10**9 / size)
        if count and math.isclose(count * size / 10**9, seconds, rel_tol=1e-12, abs_tol=0.0):
            return f"{count} {label}"
    return f"{round(seconds * 10**9)} ns"


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text):,} characters)"
