"""A Redis Streams source's JobManager side: per key, the ids after a range's begin and the
last id there is (XRANGE, XREVRANGE), and each key's lag for progress records."""

from __future__ import annotations

import functools
from typing import Any, Callable

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import RedisStreamsSource
from funke.jobmanager import redissink
from funke.jobmanager.streaming.base import SourceContext, SourceSide


class RedisPlanner(SourceSide):
    """What a Redis Streams source offers: per key, the ids after the range's begin (XRANGE,
    as many as the per-trigger limit), and its last id (XREVRANGE ... COUNT 1). Also how many
    entries each key still holds after a range's end (the lag, counted up to LAG_COUNTED)."""

    LAG_COUNTED = 10_000

    def __init__(self, source: RedisStreamsSource, connect: Callable[[], Any]):
        self.source, self._connect = source, connect
        self._client: Any = None
        self.lag: dict[str, int] = {}  # per key, after the last planned range

    @classmethod
    def open(cls, context: SourceContext) -> "RedisPlanner":
        return cls(context.planning, functools.partial(redissink.connect, dict(context.config)))

    def progress_details(self) -> dict[str, Any]:
        return {"lag": dict(self.lag)}

    def _redis(self) -> Any:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _last_ids(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for key in self.source.keys:
            last = self._redis().xrevrange(key, "+", "-", count=1)
            out[key] = _text(last[0][0]) if last else None
        return out

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        last_ids = self._last_ids() if start is None or not limited else {}
        begin = self.source.begin(start, last_ids)
        count = self.source.max_entries_per_trigger if limited else None
        after: dict[str, list[str]] = {}
        for key in self.source.keys:
            if count is None:  # everything there is now: the last id is the end
                last = last_ids.get(key)
                after[key] = [last] if last is not None else []
            else:
                after[key] = [_text(i) for i, _ in self._redis().xrange(key, f"({begin[key]}", "+", count=count)]
        planned = self.source.plan(start, after, last_ids, limited, cap)
        self._measure_lag(planned)
        return planned

    def latest(self, start: Any, now_ms: int) -> Any:
        return self.plan(start, now_ms, limited=False, cap=None).end

    def _measure_lag(self, planned: SourceRange) -> None:
        for key, (_, end) in self.source.bounds(planned).items():
            self.lag[key] = len(self._redis().xrange(key, f"({end}", "+", count=self.LAG_COUNTED))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
