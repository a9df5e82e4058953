"""The JobManager's side of streaming sources and sinks: the interfaces a plugin implements on
this floor (the pure planning is `funke.common.streaming.sources`; the tasks' reading and
writing `funke.taskmanager.streaming` and `funke.taskmanager.operators`).

A `SourceSide` does a source's IO for planning (blocking: the query shell calls it from an
executor thread): it observes what the source holds now, records what replay needs before the
offset log names it, and hands the observation to the source's pure planning. A `SinkSide`
commits a batch the tasks wrote (idempotent: a batch run again after a failure between the
sink commit and the commit log entry must not be written twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from funke.common.streaming.checkpoint import SourceRange
from funke.jobmanager.checkpointstore import CheckpointStore


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source side is built from: its vertex, its operator's config (validated), the
    query's checkpoint (location and open store)."""
    vertex_id: str
    config: Mapping[str, Any]
    parallelism: int
    planning: Any  # the source's pure planning (`SourcePlugin.planning`)
    checkpoint_location: str
    checkpoint: CheckpointStore


class SourceSide:
    """One source of one run of a query, on the JobManager."""

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        """The next batch's range after `start` (within the per-trigger limit if `limited`, not
        past `cap`)."""
        raise NotImplementedError

    def latest(self, start: Any, now_ms: int) -> Any:
        """The offset to process up to (available-now, a draining stop)."""
        return self.plan(start, now_ms, False, None).end

    def batch_files(self, source_range: SourceRange) -> tuple[str, ...] | None:
        """What a logged range resolves to for the tasks (`BatchInput.files`); None: nothing,
        the range itself says what to read."""
        return None

    def forget_before(self, offset: Any) -> int:
        """Deletes what no retained batch reads (everything before `offset`); how many."""
        return 0

    def progress_details(self) -> dict[str, Any]:
        """What this side measured, for the source's entry of a progress record (`progress.add_source_details`)."""
        return {}

    def close(self) -> None:
        """Lets go of connections (idempotent)."""


@dataclass(frozen=True, slots=True)
class SinkContext:
    vertex_id: str
    config: Mapping[str, Any]
    data_dir: str
    job_id: str


class SinkSide:
    """One sink of a query, on the JobManager: nothing to prepare or commit unless a plugin says
    so (print, foreach_batch, discard, noop write nothing the JobManager commits)."""

    def __init__(self, context: SinkContext):
        self.context = context

    def prepare(self, query_id: str = "") -> None:
        """Before the first batch of each run of the query, once the run holds the query's
        checkpoint (blocking). `query_id`: the checkpoint's (the same in every run)."""

    def commit(self, batch_id: int, attempts: dict[int, int], query_id: str) -> None:
        """Commits the batch the chosen attempt of every subtask wrote (blocking, idempotent)."""

    def commit_fenced(self, batch_id: int, attempts: dict[int, int], query_id: str, fence: Callable[[], None]) -> None:
        """`commit`, by a run that may commit only while it holds the query's checkpoint: `fence`
        raises once another run took it over. A side whose commit has several steps overrides
        this to check again before its commit point."""
        fence()
        self.commit(batch_id, attempts, query_id)

    def close(self) -> None:
        """The run ended (stopped, failed, cancelled, taken over): let go of connections, end
        what is open (blocking, idempotent; the run's commits are over)."""
