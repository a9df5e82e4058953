"""What a streaming source offers a micro-batch, and exactly which rows an offset range holds:
the rules a batch's planning (on the JobManager) and its reading (on the TaskManagers) share, so
that a batch run again after a failure reads the same rows.

Owns two sources (the interface stays open for receivers and brokers: a source says how far its
data goes, and reads exactly a logged range):

- **rate** (Spark's rate source): `rows_per_second` rows a second, numbered from 0, each with the
  time it was due. Its offset is `{"rows": n, "baseMs": t}`: n rows are due by now, counted from
  the base time the query first asked at, which every later offset carries on, so a replay
  computes the same timestamps. Row i is due at `baseMs + i * 1000 / rows_per_second`; it goes to
  partition `i % partitions`.
- **files** appearing in a directory (Spark's file stream source): each file is taken once, in
  the order of (modification time, name), at most `max_files_per_trigger` per batch. Its offset
  is the number of files taken so far; which files those are is the source's seen-files log (an
  ordered list the JobManager keeps in the checkpoint, written before the offset log entry
  that uses it).

Pure: times and listings are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from funke.common.checkpoint import SourceRange


# ------------------------------------------------------------------------------------ a batch's input


@dataclass(frozen=True, slots=True)
class BatchInput:
    """What one micro-batch gives a task's stream sources: per source vertex, its range, and for
    a file source the files the range holds (resolved on the JobManager from the seen-files log,
    relative to the source's directory)."""
    batch_id: int
    batch_time_ms: int
    ranges: Mapping[str, SourceRange] = field(default_factory=dict)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ rate


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


# ------------------------------------------------------------------------------------ files


@dataclass(frozen=True, slots=True)
class ListedFile:
    name: str  # relative to the source directory
    modified_ns: int
    size: int


@dataclass(frozen=True, slots=True)
class FilesSource:
    max_files_per_trigger: int | None = None

    def __post_init__(self) -> None:
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ValueError(f"max_files_per_trigger must be at least 1, got {self.max_files_per_trigger}")

    def discover(self, seen: list[str], listing: list[ListedFile]) -> list[str]:
        """The files of `listing` not taken yet, in the order they will be taken: oldest
        modification first, then by name. Files still being written should not be listed
        (write elsewhere and rename into the directory, as with Spark)."""
        taken = set(seen)
        new = sorted((f for f in listing if f.name not in taken), key=lambda f: (f.modified_ns, f.name))
        return [f.name for f in new]

    def plan(self, start: Any, seen_count: int, limited: bool = True, cap: Any = None) -> SourceRange:
        """The range after `start` (files taken by earlier batches) over the `seen_count` files
        the seen-files log holds, within the limit and `cap`."""
        begin = _files_offset(start)
        if begin > seen_count:
            raise ValueError(f"the offset {begin} is past the {seen_count} files the seen-files log holds")
        end = seen_count
        if limited and self.max_files_per_trigger is not None:
            end = min(end, begin + self.max_files_per_trigger)
        if cap is not None:
            end = min(end, _files_offset(cap))
        end = max(end, begin)
        if start is None and end == 0:
            return SourceRange(None, None, 0)
        return SourceRange(start, end, 0)

    @staticmethod
    def files(source_range: SourceRange, seen: list[str]) -> list[str]:
        """The files a range holds (the seen-files log must reach its end)."""
        begin, end = _files_offset(source_range.start), _files_offset(source_range.end)
        if end > len(seen):
            raise ValueError(f"the range ends at file {end} but the seen-files log holds {len(seen)}")
        return seen[begin:end]


def _files_offset(offset: Any) -> int:
    if offset is None:
        return 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"not a file source offset: {offset!r}")
    return offset
