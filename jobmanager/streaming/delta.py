"""The Delta stream source's JobManager side: the table's newest version (its log), and before a
range is offered, a look at what its commits do, so that a commit the stream cannot read (one
that deletes or rewrites data, changes the schema, or needs a feature funke does not read)
fails the query naming it before its offsets are logged."""

from __future__ import annotations

from typing import Any

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.delta import DeltaStreamSource
from funke.jobmanager.streaming.base import SourceContext, SourceSide
from funke.runtime import deltalog


class DeltaPlanner(SourceSide):
    def __init__(self, path: str, source: DeltaStreamSource):
        self.path, self.source = path, source

    @classmethod
    def open(cls, context: SourceContext) -> "DeltaPlanner":
        return cls(str(context.config["path"]), context.planning)

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        planned = self.source.plan(start, deltalog.latest_version(self.path), limited, cap)
        if planned.end is not None and planned.end != planned.start:
            deltalog.range_files(self.path, planned)  # raises for a commit the stream cannot read
        return planned

    def latest(self, start: Any, now_ms: int) -> Any:
        return self.source.latest(start, deltalog.latest_version(self.path))
