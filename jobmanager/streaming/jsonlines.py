"""The JSON-lines source's JobManager side: per file of its directory, where its last complete
line ends (the bytes after the last newline are a line still being written)."""

from __future__ import annotations

import os
from typing import Any

from funke.common.graph.streamingjob import local_path
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.jsonlines import JsonLinesSource, jsonlines_offset
from funke.jobmanager.streaming.base import SourceContext, SourceSide

TAIL_CHUNK = 1 << 16


class JsonLinesPlanner(SourceSide):
    def __init__(self, directory: str, source: JsonLinesSource):
        self.directory, self.source = directory, source

    @classmethod
    def open(cls, context: SourceContext) -> "JsonLinesPlanner":
        return cls(local_path(str(context.config["path"])), context.planning)

    def complete(self, start: Any) -> dict[str, int]:
        """Per regular, visible file: the end of its last complete line (at least its start)."""
        begin = jsonlines_offset(start)
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return {}
        out = {}
        for e in entries:
            if e.name.startswith((".", "_")) or not e.is_file(follow_symlinks=False):
                continue
            at = begin.get(e.name, 0)
            try:
                out[e.name] = last_line_end(os.path.join(self.directory, e.name), at)
            except FileNotFoundError:
                continue
        return out

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        return self.source.plan(start, self.complete(start), limited, cap)


def last_line_end(path: str, after: int) -> int:
    """The offset after the last newline of a file at or after `after` (`after` if none)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        while end > after:
            begin = max(after, end - TAIL_CHUNK)
            f.seek(begin)
            chunk = f.read(end - begin)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return begin + i + 1
            end = begin
    return after
