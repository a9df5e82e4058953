"""JSON-lines files in a directory, read incrementally, pure planning: lines appended to the
files there and new files are both taken. The offset is, per file (its name in the directory),
the byte offset up to which its lines were taken: `{"a.jsonl": 1024, "b.jsonl": 17}`. A batch's
range is, per file, the bytes from its start offset to its end offset, which always ends a line,
so a batch run again reads exactly the same lines (as long as the files are only appended to).

The JobManager side observes, per file, where its last complete line ends; a line still being
written (no newline yet) waits for a later batch. Files are read in the order of their names;
subtask i of n reads the i-th, (i+n)-th, ... file of the range that has new bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin

JSON_LINES = "source.stream.jsonlines"


@dataclass(frozen=True, slots=True)
class FileSlice:
    name: str  # relative to the source directory
    begin: int  # byte offsets: [begin, end), whole lines
    end: int


@dataclass(frozen=True, slots=True)
class JsonLinesSource:
    max_files_per_trigger: int | None = None  # files with new lines taken per batch, at most

    def __post_init__(self) -> None:
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ValueError(f"max_files_per_trigger must be at least 1, got {self.max_files_per_trigger}")

    def plan(self, start: Any, complete: Mapping[str, int], limited: bool = True, cap: Any = None) -> SourceRange:
        """The range after `start`; `complete`: per file listed now, where its last complete
        line ends. A file that shrank or vanished keeps its offset (its lines are not taken
        twice); within the limit, the files with new lines earliest by name are taken."""
        begin = jsonlines_offset(start)
        ceiling = jsonlines_offset(cap) if cap is not None else None
        end = dict(begin)
        grown = 0
        for name in sorted(complete):
            at = begin.get(name, 0)
            e = max(at, int(complete[name]))
            if ceiling is not None:
                e = max(at, min(e, ceiling.get(name, at)))
            if e == at:
                continue
            if limited and self.max_files_per_trigger is not None and grown >= self.max_files_per_trigger:
                break
            end[name] = e
            grown += 1
        if start is None and not end:
            return SourceRange(None, None, 0)
        return SourceRange(start, end, 0)

    def latest(self, start: Any, complete: Mapping[str, int]) -> Any:
        return self.plan(start, complete, limited=False).end

    @staticmethod
    def slices(source_range: SourceRange) -> list[FileSlice]:
        """The bytes a range holds, per file with new bytes, in the order of the names."""
        begin, end = jsonlines_offset(source_range.start), jsonlines_offset(source_range.end)
        return [FileSlice(name, begin.get(name, 0), e) for name, e in sorted(end.items()) if e > begin.get(name, 0)]

    @classmethod
    def slices_of(cls, source_range: SourceRange, subtask: int, parallelism: int) -> list[FileSlice]:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} of a source with parallelism {parallelism}")
        return cls.slices(source_range)[subtask::parallelism]


def jsonlines_offset(offset: Any) -> dict[str, int]:
    """A JSON-lines offset as {file name: byte offset} (ValueError if it is not one)."""
    if offset is None:
        return {}
    if not isinstance(offset, dict):
        raise ValueError(f"not a JSON-lines source offset: {offset!r}")
    for name, at in offset.items():
        if (not isinstance(name, str) or not name or "/" in name or name in (".", "..")
                or isinstance(at, bool) or not isinstance(at, int) or at < 0):
            raise ValueError(f"not a JSON-lines source offset: {offset!r}")
    return dict(offset)


def _planning(config: Mapping[str, Any], parallelism: int) -> JsonLinesSource:
    limit = config.get("max_files_per_trigger")
    return JsonLinesSource(int(limit) if limit is not None else None)


PLUGIN = SourcePlugin((JSON_LINES,), _planning, watches_directory=True)
