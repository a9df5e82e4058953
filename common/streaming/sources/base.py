"""The interface of a streaming source, in three parts on three floors, and what one batch gives
a task's sources.

A source is a plugin (Structured Streaming's `Source`, split as Flink's FLIP-27 splits a
`SplitEnumerator` from a `SourceReader`):

1. **Planning** (here, in `common/streaming/sources/`, pure): an object built from the source
   operator's config and parallelism whose `plan(start, <what the JobManager observed>, limited,
   cap)` returns the batch's `SourceRange` after the offset `start` (None: the query's first
   batch), within the per-trigger limit if `limited` and not past `cap`; and which says exactly
   which rows a logged range holds, so a batch run again after a failure reads the same rows.
   Offsets are JSON values: they go to the offset log as they are.
2. **The JobManager side** (`jobmanager/streaming/`): the IO planning needs (the time, a
   directory listing, a stream's end ids), recorded where replay needs it before the offset
   log names it; what a logged range resolves to for the tasks (`BatchInput.files`); what can
   be deleted once no retained batch reads it; what a progress record adds. Its interface is
   `funke.jobmanager.streaming.base.SourceSide`.
3. **The TaskManager side** (`taskmanager/streaming/`): reads exactly a batch's range for one
   subtask as a DataFrame, and for a receiver source runs the receiver beside the task.

Each floor has a registry by operator kind (`SOURCE_PLUGINS` in `funke.common.streaming.sources`,
`SOURCE_SIDES` in `funke.jobmanager.streaming`, `TASK_SOURCES` in `funke.taskmanager.streaming`;
the batch sources are `BATCH_SOURCES` in `funke.taskmanager.operators.sources`): the planner, the JobManager's
query shell and the TaskManager's task look a kind up there instead of switching on kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.state import StateLineage


class SourcePlanning(Protocol):
    """A source's pure planning (the arguments after `start` are what its JobManager side
    observed: the time, the files taken, the blocks stored, the entries there are)."""

    def plan(self, start: Any, *observed: Any, limited: bool = True, cap: Any = None) -> SourceRange: ...


@dataclass(frozen=True, slots=True)
class SourcePlugin:
    """A source's common part: the operator kinds it serves, how its planning is built from an
    operator's config (checked by validation first) and its parallelism, and what the rest of
    the runtime must know of it."""
    kinds: tuple[str, ...]
    planning: Callable[[Mapping[str, Any], int], Any]
    receiver: bool = False  # long-running receivers beside its tasks store blocks in the checkpoint
    watches_directory: bool = False  # its config 'path' is a directory that must exist at submit


@dataclass(frozen=True, slots=True)
class BatchInput:
    """What one micro-batch gives a task's stream sources: per source vertex, its range, and
    what the JobManager side resolved the range to (`files`: for a file source the files the
    range holds, relative to its directory; for a receiver source its blocks, `<receiver>/<block
    file>`); and per receiver source, the rate its receivers may take records at (backpressure,
    records/s per receiver); for a query with keyed state, which run's files hold the committed
    state and the token the batch writes its own with (`state`: the state store reads and writes
    by it; None: files as funke 0.3.0 named them, unfenced)."""
    batch_id: int
    batch_time_ms: int
    ranges: Mapping[str, SourceRange] = field(default_factory=dict)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rate_limits: Mapping[str, float] = field(default_factory=dict)
    watermark_ms: int | None = None  # the event-time watermark the batch runs with (None: none yet)
    state: StateLineage | None = None
