"""What a streaming source offers a micro-batch, and exactly which rows an offset range holds:
the rules a batch's planning (on the JobManager) and its reading (on the TaskManagers) share, so
that a batch run again after a failure reads the same rows.

Owns four sources (a source says how far its data goes, and reads exactly a logged range):

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
- **receivers** (Spark Streaming's receiver input streams, e.g. socketTextStream): each of
  `receivers` long-running tasks stores what it receives as numbered blocks in the checkpoint
  (its write-ahead log, `<seq>.block`) before it counts as received. The offset is,
  per receiver, how many of its blocks were allocated to batches: a batch gets every block
  stored when it is planned (Spark's ReceivedBlockTracker.allocateBlocksToBatch), and since the
  allocation is its logged range, a batch run again reads the same blocks.
- **Redis Streams** (a replayable broker, as Kafka is to Spark): entries of one or more stream
  keys, each with its id `<ms>-<seq>`. The offset is, per key, the id of the last entry taken;
  a batch reads, per key, the entries after its start id up to its end id (XRANGE), so a batch
  run again reads the same entries as long as the stream was not trimmed past them.

Pure: times and listings are passed in.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from funke.common.streaming.checkpoint import SourceRange


# ------------------------------------------------------------------------------------ a batch's input


@dataclass(frozen=True, slots=True)
class BatchInput:
    """What one micro-batch gives a task's stream sources: per source vertex, its range, and for
    a file source the files the range holds (resolved on the JobManager from the seen-files log,
    relative to the source's directory), for a receiver source its blocks (`<receiver>/<block
    file>`, relative to its blocks directory); and per receiver source, the rate its receivers
    may take records at (backpressure, records/s per receiver)."""
    batch_id: int
    batch_time_ms: int
    ranges: Mapping[str, SourceRange] = field(default_factory=dict)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rate_limits: Mapping[str, float] = field(default_factory=dict)


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


# ------------------------------------------------------------------------------------ receivers

BLOCK_SUFFIX = ".block"
_BLOCK_NAME = re.compile(r"(\d{12})\.block")


def receiver_blocks_dir(checkpoint: str, source: str, receiver: int | None = None) -> str:
    """Where a receiver source's receivers store their blocks: `<checkpoint>/sources/<source>/
    blocks/<receiver>` (the source's vertex id is a checked path id)."""
    base = posixpath.join(checkpoint, "sources", source, "blocks")
    return base if receiver is None else posixpath.join(base, str(receiver))


def block_file_name(seq: int) -> str:
    """A stored block's file name: its number in the receiver's log. The receiver creates it in
    one step (a hard link to the whole, synced data, which fails if the number is taken), so a
    number names a whole block or nothing."""
    if not 0 <= seq < 10**12:
        raise ValueError(f"block number {seq} is out of range")
    return f"{seq:012d}{BLOCK_SUFFIX}"


def parse_block_file_name(name: str) -> int | None:
    """The number of a block file's name; None for anything else (temporary files)."""
    m = _BLOCK_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def stored_blocks(names: list[str]) -> dict[int, str]:
    """A receiver's stored blocks from a listing of its directory: number -> file name. (Blocks
    no batch will read again are purged, so numbers need not start at 0.)"""
    return {seq: name for name in names if (seq := parse_block_file_name(name)) is not None}


@dataclass(frozen=True, slots=True)
class ReceiverSource:
    receivers: int

    def __post_init__(self) -> None:
        if self.receivers < 1:
            raise ValueError(f"a receiver source needs at least 1 receiver, got {self.receivers}")

    def plan(self, start: Any, stored: Mapping[int, Collection[int]], limited: bool = True,
             cap: Any = None) -> SourceRange:
        """The range after `start` over what is stored (`stored`: receiver -> the numbers of its
        blocks): per receiver, the blocks from its offset on, up to the first number missing (a
        block counts once it and its predecessors are stored), at most up to `cap`. There are no
        per-trigger limits: a receiver's rate is limited where it receives (max_rate), as in
        Spark. The rows are not known before the blocks are read (the tasks count them)."""
        begin = _receiver_offset(start, self.receivers)
        ceiling = _receiver_offset(cap, self.receivers) if cap is not None else None
        end: dict[str, int] = {}
        for r in range(self.receivers):
            blocks = stored.get(r, ())
            e = begin[r]
            while e in blocks and (ceiling is None or e < ceiling[r]):
                e += 1
            end[str(r)] = e
        if start is None and not any(end.values()):
            return SourceRange(None, None, 0)
        return SourceRange(start, end, 0)

    def latest(self, start: Any, stored: Mapping[int, Collection[int]]) -> Any:
        return self.plan(start, stored, limited=False).end

    def blocks(self, source_range: SourceRange, receiver: int) -> range:
        """The block numbers of `receiver` a range holds."""
        if not 0 <= receiver < self.receivers:
            raise ValueError(f"receiver {receiver} of a source with {self.receivers}")
        begin = _receiver_offset(source_range.start, self.receivers)[receiver]
        end = _receiver_offset(source_range.end, self.receivers)[receiver]
        return range(begin, max(begin, end))


def _receiver_offset(offset: Any, receivers: int) -> list[int]:
    if offset is None:
        return [0] * receivers
    try:
        counts = [int(offset.get(str(r), 0)) for r in range(receivers)]
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"not a receiver source offset: {offset!r}") from None
    if any(c < 0 for c in counts) or any(isinstance(v, bool) for v in offset.values()):
        raise ValueError(f"not a receiver source offset: {offset!r}")
    return counts


# ------------------------------------------------------------------------------------ Redis Streams

_STREAM_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
STARTINGS = ("earliest", "latest")


def stream_id(text: Any) -> tuple[int, int]:
    """A Redis stream entry id `<ms>-<seq>` as a comparable pair (ValueError otherwise)."""
    m = _STREAM_ID.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"not a stream entry id: {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True, slots=True)
class RedisStreamsSource:
    keys: tuple[str, ...]
    starting: str = "latest"  # where a query without offsets starts: the first entry, or after the last
    max_entries_per_trigger: int | None = None  # per key

    def __post_init__(self) -> None:
        if not self.keys or len(set(self.keys)) != len(self.keys):
            raise ValueError(f"a Redis Streams source needs distinct stream keys, got {list(self.keys)}")
        if self.starting not in STARTINGS:
            raise ValueError(f"starting must be one of {', '.join(STARTINGS)}, got {self.starting!r}")
        if self.max_entries_per_trigger is not None and self.max_entries_per_trigger < 1:
            raise ValueError(f"max_entries_per_trigger must be at least 1, got {self.max_entries_per_trigger}")

    def begin(self, start: Any, last_ids: Mapping[str, str | None]) -> dict[str, str]:
        """Per key, the id after which the next range starts: the start offset's; for a query
        without one, "0-0" (earliest) or the last id there is now (latest; "0-0" if empty)."""
        if start is not None:
            return _redis_offset(start, self.keys)
        if self.starting == "earliest":
            return {k: "0-0" for k in self.keys}
        return {k: last_ids.get(k) or "0-0" for k in self.keys}

    def plan(self, start: Any, after: Mapping[str, list[str]], last_ids: Mapping[str, str | None],
             limited: bool = True, cap: Any = None) -> SourceRange:
        """The range after `start`. `after`: per key, the ids of the entries after its begin id,
        in order (as many as the limit, or more); `last_ids`: per key, its last id now. The range
        ends per key at the last entry taken: within the per-trigger limit, and at most `cap`."""
        begin = self.begin(start, last_ids)
        ceiling = _redis_offset(cap, self.keys) if cap is not None else None
        end: dict[str, str] = {}
        rows = 0
        for k in self.keys:
            ids = [i for i in after.get(k, []) if stream_id(i) > stream_id(begin[k])]
            if ceiling is not None:
                ids = [i for i in ids if stream_id(i) <= stream_id(ceiling[k])]
            if limited and self.max_entries_per_trigger is not None:
                ids = ids[:self.max_entries_per_trigger]
            end[k] = ids[-1] if ids else begin[k]
            rows += len(ids)
        if start is None:  # the first batch records where the query began, even with nothing new
            return SourceRange(None, end, rows) if rows or self.starting == "latest" or any(
                v != "0-0" for v in end.values()) else SourceRange(None, None, 0)
        return SourceRange(start, end, rows)

    def bounds(self, source_range: SourceRange) -> dict[str, tuple[str, str]]:
        """Per key, (after this id, up to this id) of a range."""
        if source_range.end is None:
            return {}
        begin = _redis_offset(source_range.start, self.keys) if source_range.start is not None else \
            {k: "0-0" for k in self.keys}
        end = _redis_offset(source_range.end, self.keys)
        return {k: (begin[k], end[k]) for k in self.keys}


def _redis_offset(offset: Any, keys: tuple[str, ...]) -> dict[str, str]:
    if not isinstance(offset, dict) or set(offset) != set(keys):
        raise ValueError(f"not an offset of stream keys {list(keys)}: {offset!r}")
    for v in offset.values():
        stream_id(v)
    return {k: offset[k] for k in keys}
