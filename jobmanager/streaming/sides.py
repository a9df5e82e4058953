"""A query's sources and sinks on the JobManager, as the query shell (`funke.jobmanager.streamquery`)
uses them: every source side of one run, and every sink side of the query, built from the
registries by the job graph. Each method blocks (a side may connect, list directories, read the
checkpoint, commit files): the shell calls it from an executor thread.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

from funke.common.graph.jobgraph import JobGraph
from funke.common.graph.streamingjob import sinks, stream_sources
from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.common.streaming.sources import SOURCE_PLUGINS
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streaming import SOURCE_SIDES, sink_side
from funke.jobmanager.streaming.base import SinkContext, SinkSide, SourceContext, SourceSide

log = logging.getLogger("funke.jobmanager")


class SourceSides:
    """Every stream source's side for one run of a query, by source vertex."""

    def __init__(self, sides: dict[str, SourceSide]):
        self.sides = sides

    @classmethod
    def open(cls, job_graph: JobGraph, checkpoint_location: str, checkpoint: CheckpointStore) -> "SourceSides":
        sides: dict[str, SourceSide] = {}
        for v in stream_sources(job_graph):
            op = v.operators[0]
            planning = SOURCE_PLUGINS[op.kind].planning(op.config, v.parallelism)
            sides[v.id] = SOURCE_SIDES[op.kind](SourceContext(
                v.id, op.config, v.parallelism, planning, checkpoint_location, checkpoint))
        return cls(sides)

    def plan(self, starts: dict[str, Any], now_ms: int, limited: bool, caps: dict[str, Any] | None
             ) -> dict[str, SourceRange]:
        """The next batch's range of every source."""
        return {name: side.plan(starts.get(name), now_ms, limited, (caps or {}).get(name))
                for name, side in self.sides.items()}

    def latest(self, starts: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """What every source holds now: the offsets to process up to."""
        return {name: side.latest(starts.get(name), now_ms) for name, side in self.sides.items()}

    def batch_files(self, entry: OffsetEntry) -> dict[str, tuple[str, ...]]:
        """What a logged batch's ranges resolve to for the tasks, for the sources that resolve."""
        resolved = {n: side.batch_files(entry.sources[n]) for n, side in self.sides.items() if n in entry.sources}
        return {n: files for n, files in resolved.items() if files is not None}

    def progress_details(self) -> dict[str, dict[str, Any]]:
        """What each source's side measured for its entry of a progress record (a broker's lag)."""
        return {name: side.progress_details() for name, side in self.sides.items()}

    def purge(self, checkpoint: CheckpointStore, retain: int) -> int:
        """Old log entries, and what the sources kept that no retained batch reads; how many."""
        purged = checkpoint.purge(retain)  # fenced: a run taken over deletes nothing
        forgetting = [s for s in self.sides.values() if type(s).forget_before is not SourceSide.forget_before]
        oldest = checkpoint.offset_ids() if forgetting else []
        if oldest:
            entry = checkpoint.read_offsets(oldest[0])
            checkpoint.check()
            for name, side in self.sides.items():
                if name in entry.sources:
                    purged += side.forget_before(entry.sources[name].start)
        return purged

    def close(self) -> None:
        """Every side lets go of its connections, whatever the others do."""
        for side in self.sides.values():
            with contextlib.suppress(Exception):
                side.close()


class SinkSides:
    """Every sink's side of a query, by sink vertex (in the job graph's order)."""

    def __init__(self, job_graph: JobGraph, data_dir: str, job_id: str):
        self.sides: dict[str, SinkSide] = {v.id: sink_side(v.operators[-1].kind, SinkContext(
            v.id, v.operators[-1].config, data_dir, job_id)) for v in sinks(job_graph)}

    def prepare(self, query_id: str = "") -> None:
        """Before the run's first batch, once the run holds the checkpoint of query `query_id`."""
        for side in self.sides.values():
            side.prepare(query_id)

    def close(self) -> None:
        """The run ended: every side lets go (and ends what it has open), whatever the others do."""
        for side in self.sides.values():
            try:
                side.close()
            except Exception as exc:  # noqa: BLE001 - the others still close
                log.warning("closing the sink side of %s failed: %s: %s", side.context.vertex_id, type(exc).__name__, exc)

    def commit(self, batch_id: int, attempts: dict[str, dict[int, int]], query_id: str,
               fence: Callable[[], None] = lambda: None) -> None:
        """Commit the batch on every sink: `attempts`, per sink, the attempt of each subtask
        whose output counts (idempotent). `fence` (the run's hold on the checkpoint) raises once
        another run of the query took it over: such a run commits nothing more."""
        for sink, side in self.sides.items():
            side.commit_fenced(batch_id, attempts[sink], query_id, fence)
