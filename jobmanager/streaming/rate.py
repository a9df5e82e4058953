"""The rate source's JobManager side: its only observation is the time."""

from __future__ import annotations

from typing import Any

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import RateSource
from funke.jobmanager.streaming.base import SourceContext, SourceSide


class RatePlanner(SourceSide):
    def __init__(self, source: RateSource):
        self.source = source

    @classmethod
    def open(cls, context: SourceContext) -> "RatePlanner":
        return cls(context.planning)

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        return self.source.plan(start, now_ms, limited, cap)

    def latest(self, start: Any, now_ms: int) -> Any:
        return self.source.latest(start, now_ms)
