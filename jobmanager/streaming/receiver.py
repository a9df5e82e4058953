"""A receiver source's JobManager side: what its receivers stored, from a listing of their
block directories in the checkpoint; a logged range resolves to its block files; blocks no
retained batch reads are deleted."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import ReceiverSource, receiver_blocks_dir, stored_blocks
from funke.jobmanager.streaming.base import SourceContext, SourceSide


class ReceiverPlanner(SourceSide):
    """What a receiver source's receivers stored: per receiver, its blocks from a listing of
    its directory in the checkpoint (records counted in the names)."""

    def __init__(self, directory: str, source: ReceiverSource):
        self.directory, self.source = directory, source

    @classmethod
    def open(cls, context: SourceContext) -> "ReceiverPlanner":
        return cls(receiver_blocks_dir(context.checkpoint_location, context.vertex_id), context.planning)

    def stored(self) -> dict[int, dict[int, str]]:
        """receiver -> block number -> block file."""
        out = {}
        for r in range(self.source.receivers):
            try:
                names = os.listdir(os.path.join(self.directory, str(r)))
            except FileNotFoundError:
                names = []
            out[r] = stored_blocks(names)
        return out

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        return self.source.plan(start, self.stored(), limited, cap)

    def latest(self, start: Any, now_ms: int) -> Any:
        return self.source.latest(start, self.stored())

    def batch_files(self, source_range: SourceRange) -> tuple[str, ...]:
        """The blocks a range holds, as `<receiver>/<block file>`."""
        stored = self.stored()
        out = []
        for r in range(self.source.receivers):
            blocks = self.source.blocks(source_range, r)
            missing = [seq for seq in blocks if seq not in stored[r]]
            if missing:
                raise ValueError(f"receiver {r}: blocks {missing[:5]} of the batch's range are not in "
                                 f"{self.directory}/{r}")
            out += [f"{r}/{stored[r][seq]}" for seq in blocks]
        return tuple(out)

    def forget_before(self, offset: Any) -> int:
        """Deletes the blocks before `offset` (no retained batch reads them); returns how many.
        The newest of them stays, emptied, so that a receiver started again never numbers a block
        below what batches already read."""
        removed = 0
        for r, blocks in self.stored().items():
            keep_from = self.source.blocks(SourceRange(None, offset), r).stop
            old = sorted(seq for seq in blocks if seq < keep_from)
            for seq in old:
                path = os.path.join(self.directory, str(r), blocks[seq])
                with contextlib.suppress(FileNotFoundError):
                    if seq != old[-1]:
                        os.remove(path)
                        removed += 1
                    elif os.path.getsize(path):
                        os.truncate(path, 0)
                        removed += 1
        return removed
