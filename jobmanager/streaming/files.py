"""The file stream source's JobManager side: a listing of its directory, whose new files are
recorded in the source's seen-files log (in the checkpoint) before any offset entry uses them;
a logged range resolves to the files it holds."""

from __future__ import annotations

import os
from typing import Any

from funke.common.graph.streamingjob import local_path
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import FilesSource, ListedFile
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streaming.base import SourceContext, SourceSide


class FilesPlanner(SourceSide):
    """A directory's new files, recorded in the source's seen-files log before they are offered."""

    def __init__(self, name: str, directory: str, source: FilesSource, checkpoint: CheckpointStore):
        self.name, self.directory, self.source, self.checkpoint = name, directory, source, checkpoint

    @classmethod
    def open(cls, context: SourceContext) -> "FilesPlanner":
        return cls(context.vertex_id, local_path(str(context.config["path"])), context.planning, context.checkpoint)

    def _discover(self) -> int:
        seen = self.checkpoint.seen_files(self.name)
        new = self.source.discover(seen, list_files(self.directory))
        self.checkpoint.add_seen_files(self.name, new)
        return len(seen) + len(new)

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        return self.source.plan(start, self._discover(), limited, cap)

    def latest(self, start: Any, now_ms: int) -> Any:
        return self.source.plan(start, self._discover(), limited=False).end

    def batch_files(self, source_range: SourceRange) -> tuple[str, ...]:
        return tuple(FilesSource.files(source_range, self.checkpoint.seen_files(self.name)))


def list_files(directory: str) -> list[ListedFile]:
    """The regular files of a directory, without hidden ones (`.x`, `_x`: files being written,
    Spark's markers) and without symbolic links."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    found = []
    for e in entries:
        if e.name.startswith((".", "_")) or not e.is_file(follow_symlinks=False):
            continue
        st = e.stat(follow_symlinks=False)
        found.append(ListedFile(e.name, st.st_mtime_ns, st.st_size))
    return found
