"""Redis Streams (a replayable broker, as Kafka is to Spark), pure planning: entries of one or
more stream keys, each with its id `<ms>-<seq>`. The offset is, per key, the id of the last entry
taken; a batch reads, per key, the entries after its start id up to its end id (XRANGE), so a
batch run again reads the same entries as long as the stream was not trimmed past them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin


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
        if start is None and self.starting == "latest":
            # the query's first batch takes nothing: it records where the query began (each key's
            # last id now), and what is added after it is the next batch's
            return SourceRange(None, begin, 0)
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
            return SourceRange(None, end, rows) if rows or any(v != "0-0" for v in end.values()) \
                else SourceRange(None, None, 0)
        return SourceRange(start, end, rows)

    def bounds(self, source_range: SourceRange) -> dict[str, tuple[str, str]]:
        """Per key, (after this id, up to this id) of a range. A first range (no start) holds every
        entry up to its end when the query starts at the earliest entries, and none when it starts
        at the latest (its end is where the query began)."""
        if source_range.end is None:
            return {}
        end = _redis_offset(source_range.end, self.keys)
        if source_range.start is not None:
            begin = _redis_offset(source_range.start, self.keys)
        else:
            begin = dict(end) if self.starting == "latest" else {k: "0-0" for k in self.keys}
        return {k: (begin[k], end[k]) for k in self.keys}


def _redis_offset(offset: Any, keys: tuple[str, ...]) -> dict[str, str]:
    if not isinstance(offset, dict) or set(offset) != set(keys):
        raise ValueError(f"not an offset of stream keys {list(keys)}: {offset!r}")
    for v in offset.values():
        stream_id(v)
    return {k: offset[k] for k in keys}


REDIS = "source.redis"


def _planning(config: Mapping[str, Any], parallelism: int) -> RedisStreamsSource:
    limit = config.get("max_entries_per_trigger")
    return RedisStreamsSource(tuple(config["keys"]), str(config.get("starting", "latest")),
                              int(limit) if limit is not None else None)


PLUGIN = SourcePlugin((REDIS,), _planning)
