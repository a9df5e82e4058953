"""The rate source (Spark's rate source), pure planning: `rows_per_second` rows a second,
numbered from 0, each with the time it was due. Its offset is `{"rows": n, "baseMs": t}`: n rows
are due by now, counted from the base time the query first asked at, which every later offset
carries on, so a replay computes the same timestamps. Row i is due at
`baseMs + i * 1000 / rows_per_second`; it goes to partition `i % partitions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin


@dataclass(frozen=True, slots=True)
class RateSource:
    rows_per_second: int
    partitions: int = 1
    max_rows_per_trigger: int | None = None

    def __post_init__(self) -> None:
        if self.rows_per_second < 1:
            raise ValueError(f"rows_per_second must be at least 1, got {self.rows_per_second}")
        if self.partitions < 1:
            raise ValueError(f"a rate source needs at least 1 partition, got {self.partitions}")
        if self.max_rows_per_trigger is not None and self.max_rows_per_trigger < 1:
            raise ValueError(f"max_rows_per_trigger must be at least 1, got {self.max_rows_per_trigger}")

    def due(self, base_ms: int, now_ms: int) -> int:
        """How many rows are due at `now_ms` (row i is due at base + i/rate s, i counted from 0)."""
        if now_ms < base_ms:
            return 0
        return (now_ms - base_ms) * self.rows_per_second // 1000 + 1

    def plan(self, start: Any, now_ms: int, limited: bool = True, cap: Any = None) -> SourceRange:
        """The range after `start` (None: the query's first batch, whose base time is now)."""
        base, begin = _rate_offset(start, now_ms)
        end = self.due(base, now_ms)
        if limited and self.max_rows_per_trigger is not None:
            end = min(end, begin + self.max_rows_per_trigger)
        if cap is not None:
            end = min(end, _rate_offset(cap, now_ms)[1])
        end = max(end, begin)
        if start is None and end == 0:
            return SourceRange(None, None, 0)
        return SourceRange(start, {"rows": end, "baseMs": base}, end - begin)

    def latest(self, start: Any, now_ms: int) -> Any:
        """The offset to process up to (available-now, a draining stop): every row due now."""
        return self.plan(start, now_ms, limited=False).end

    def timestamp_ms(self, base_ms: int, value: int) -> int:
        return base_ms + value * 1000 // self.rows_per_second

    def rows(self, source_range: SourceRange, partition: int) -> list[tuple[int, int]]:
        """The (value, timestamp ms) rows of one partition of a range, in order. (The task reads
        the same rows as a Spark range; this is their definition.)"""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} of a rate source with {self.partitions}")
        if source_range.end is None:
            return []
        base, end = _rate_offset(source_range.end, 0)
        begin = _rate_offset(source_range.start, base)[1]
        first = begin + (partition - begin) % self.partitions
        return [(i, self.timestamp_ms(base, i)) for i in range(first, end, self.partitions)]


def _rate_offset(offset: Any, now_ms: int) -> tuple[int, int]:
    """(base ms, rows) of a rate offset; None is the start, based now."""
    if offset is None:
        return now_ms, 0
    try:
        rows, base = int(offset["rows"]), int(offset["baseMs"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not a rate source offset: {offset!r}") from None
    if rows < 0:
        raise ValueError(f"not a rate source offset: {offset!r}")
    return base, rows


def _planning(config: Mapping[str, Any], parallelism: int) -> RateSource:
    limit = config.get("max_rows_per_trigger")
    return RateSource(int(config["rows_per_second"]), parallelism, int(limit) if limit is not None else None)


RATE = "source.rate"


PLUGIN = SourcePlugin((RATE,), _planning)
