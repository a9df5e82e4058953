"""Receiver sources (Spark Streaming's receiver input streams, e.g. socketTextStream), pure
planning: each of `receivers` long-running tasks stores what it receives as numbered blocks in
the checkpoint (its write-ahead log, `<seq>.block`) before it counts as received. The offset is,
per receiver, how many of its blocks were allocated to batches: a batch gets every block stored
when it is planned (Spark's ReceivedBlockTracker.allocateBlocksToBatch), and since the
allocation is its logged range, a batch run again reads the same blocks."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Collection, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin


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


SOCKET = "source.socket"


def _planning(config: Mapping[str, Any], parallelism: int) -> ReceiverSource:
    return ReceiverSource(parallelism)


PLUGIN = SourcePlugin((SOCKET,), _planning, receiver=True)
