"""Files appearing in a directory (Spark's file stream source), pure planning: each file is
taken once, in the order of (modification time, name), at most `max_files_per_trigger` per
batch. Its offset is the number of files taken so far; which files those are is the source's
seen-files log (an ordered list the JobManager keeps in the checkpoint, written before the
offset log entry that uses it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin


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


STREAM_FILE_KINDS = ("source.stream.text", "source.stream.csv", "source.stream.json", "source.stream.parquet")


def _planning(config: Mapping[str, Any], parallelism: int) -> FilesSource:
    limit = config.get("max_files_per_trigger")
    return FilesSource(int(limit) if limit is not None else None)


PLUGIN = SourcePlugin(STREAM_FILE_KINDS, _planning, watches_directory=True)
