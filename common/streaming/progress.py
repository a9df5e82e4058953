"""A streaming query's progress record, built here and nowhere else: Structured Streaming's
StreamingQueryProgress (its keys and meaning), with funke's additions. Each part is added by the
one who knows it, through this module:

- the micro-batch coordinator (`microbatch.py`), once a batch is recorded: `query_progress` (the
  ids, the batch's durations and delays, its rows and rates, each source's `SourceProgress`, the
  sinks, and with a watermark its `eventTime` and late rows);
- the query run (`funke.common.scheduling.queryrun`), with what it knows of the tasks:
  `add_receivers` (a receiver source's blocks, records and rate per receiver, and its rate limit),
  `add_state_operators` (`stateOperators`: the keyed operators' state after the batch) and
  `add_vertex_durations` (`vertexDurationsMs`: where the batch's addBatch went, from `VertexTimes`);
- the query shell (`funke.jobmanager.streamquery`), with what the sources' JobManager sides
  measured: `add_source_details` (a broker's lag).

Pure: a record is a JSON-able dict; nothing here keeps state between batches.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.sources import ReceiverSource

if TYPE_CHECKING:
    from funke.common.streaming.state import StateMetrics

PROGRESS_KEPT = 100  # Structured Streaming's spark.sql.streaming.numRecentProgressUpdates


def iso_ms(ms: int) -> str:
    """UTC ISO-8601 with milliseconds, as Structured Streaming prints progress timestamps."""
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


class RecordedBatch(Protocol):
    """What a batch's record is made of: the coordinator's `microbatch.Batch` once recorded."""

    batch_id: int
    batch_time_ms: int
    entry: OffsetEntry | None
    rerun: bool
    planned_at_ms: int | None
    previous_trigger_ms: int | None
    answered_at_ms: int | None
    logged_at_ms: int | None
    started_at_ms: int | None
    written_at_ms: int | None
    recorded_at_ms: int | None
    event_time: EventTimeStats
    late_rows: int

    @property
    def rows(self) -> int: ...

    def source_rows(self, source: str) -> int: ...


def _per_second(rows: int, seconds: float) -> float:
    return round(rows / seconds, 3) if seconds > 0 else 0.0


# ------------------------------------------------------------------------------------ the batch's record


def query_progress(batch: RecordedBatch, *, query_id: str, run_id: str, name: str, sinks: Iterable[str],
                   event_time: bool) -> dict[str, Any]:
    """A recorded batch's StreamingQueryProgress record, with Structured Streaming's keys;
    `event_time`: the query has a watermark (adds `eventTime` and `numLateRows`)."""
    assert batch.entry is not None and batch.logged_at_ms is not None and batch.started_at_ms is not None
    assert batch.written_at_ms is not None and batch.recorded_at_ms is not None
    rows = batch.rows
    planned = batch.planned_at_ms is not None and batch.answered_at_ms is not None  # not a rerun
    trigger_start = batch.planned_at_ms if batch.planned_at_ms is not None else batch.logged_at_ms
    duration = {
        "latestOffset": batch.answered_at_ms - batch.planned_at_ms if planned else 0,  # type: ignore[operator]
        "walCommit": batch.logged_at_ms - batch.answered_at_ms if planned else 0,  # type: ignore[operator]
        "addBatch": batch.written_at_ms - batch.started_at_ms,
        "commitOffsets": batch.recorded_at_ms - batch.written_at_ms,
    }
    # The trigger's own work: planning and logging, then running to recorded — without the
    # time a batch waited in the queue behind slower ones (that is its scheduling delay).
    duration["triggerExecution"] = (duration["latestOffset"] + duration["walCommit"]
                                    + batch.recorded_at_ms - batch.started_at_ms)
    previous = batch.previous_trigger_ms
    since_previous = (trigger_start - previous) / 1000 if previous is not None else 0.0
    took = duration["triggerExecution"] / 1000
    return {
        "id": query_id, "runId": run_id, "name": name, "batchId": batch.batch_id,
        "timestamp": iso_ms(trigger_start), "batchTime": batch.batch_time_ms,
        "numInputRows": rows,
        "inputRowsPerSecond": _per_second(rows, since_previous),
        "processedRowsPerSecond": _per_second(rows, took),
        "durationMs": duration,
        "schedulingDelayMs": batch.started_at_ms - batch.batch_time_ms,
        "processingDelayMs": batch.recorded_at_ms - batch.started_at_ms,
        "totalDelayMs": batch.recorded_at_ms - batch.batch_time_ms,
        "rerun": batch.rerun,
        "sources": [source_progress(s, r, batch.source_rows(s), since_previous, took)
                    for s, r in batch.entry.sources.items()],
        "sink": {"description": ", ".join(sorted(sinks))},
        **(_event_time(batch) if event_time else {}),
    }


def source_progress(source: str, source_range: SourceRange, rows: int, since_previous: float,
                    took: float) -> dict[str, Any]:
    """A source's part of a progress record, with Structured Streaming's SourceProgress keys."""
    return {"description": source, "startOffset": source_range.start, "endOffset": source_range.end,
            "numInputRows": rows,
            "inputRowsPerSecond": _per_second(rows, since_previous),
            "processedRowsPerSecond": _per_second(rows, took)}


def _event_time(batch: RecordedBatch) -> dict[str, Any]:
    """Structured Streaming's `eventTime` of a progress record (min, max, avg of the batch's
    event times, the watermark it ran with), and the rows its windows found late."""
    assert batch.entry is not None
    seen = batch.event_time
    times = {"min": seen.min_ms, "max": seen.max_ms, "avg": seen.avg_ms, "watermark": batch.entry.watermark_ms}
    return {"eventTime": {k: iso_ms(v) for k, v in times.items() if v is not None}, "numLateRows": batch.late_rows}


# ------------------------------------------------------------------------------------ the run's additions


def add_receivers(record: dict[str, Any], receivers: Mapping[str, int],
                  received: Mapping[str, Sequence[int | None]], rate_limits: Mapping[str, float]) -> None:
    """A receiver source's entry: per receiver, the blocks the batch was allocated, the lines
    they held (`received`: per source, per receiver; None: not counted) and their rate (lines a
    second since the previous trigger, as the source's inputRowsPerSecond), and the rate each
    may take (backpressure). `receivers`: receiver source -> its receivers."""
    for source in record.get("sources", ()):
        name = source.get("description")
        if name not in receivers:
            continue
        blocks = ReceiverSource(receivers[name])
        span = SourceRange(source.get("startOffset"), source.get("endOffset"))
        lines = received.get(name, ())
        rows, per_second = source.get("numInputRows") or 0, source.get("inputRowsPerSecond") or 0.0
        entries = {}
        for r in range(receivers[name]):
            n = lines[r] if r < len(lines) else None
            entries[str(r)] = {"blocks": len(blocks.blocks(span, r)), "records": n,
                               # over the same time as the source's rate: since the last trigger
                               "recordsPerSecond": round(n * per_second / rows, 3) if n and rows else 0.0}
        source["numBlocks"] = sum(e["blocks"] for e in entries.values())
        source["receivers"] = entries
        if name in rate_limits:
            source["rateLimitPerReceiver"] = round(rate_limits[name], 1)


def add_state_operators(record: dict[str, Any], operators: Sequence[tuple[str, StateMetrics, int]]) -> None:
    """The keyed operators' state after the batch (Structured Streaming's `stateOperators`):
    one entry per (vertex, its subtasks' metrics added up, its key groups)."""
    if operators:
        record["stateOperators"] = [metrics.progress(vertex, key_groups) for vertex, metrics, key_groups in operators]


@dataclass
class VertexTimes:
    """One vertex's part of a batch, in ms of the run's clock: when its tasks were sent the
    batch, when the last of its subtasks' reports arrived, and the longest any subtask said it
    ran the batch (the rest of dispatched..reported is the hops there and back and the wait
    for a Spark task thread)."""
    dispatched_ms: int
    reported_ms: int | None = None
    task_ms: float = 0.0


def vertex_durations(times: VertexTimes, first_dispatch_ms: int) -> dict[str, float]:
    """One vertex's entry of `vertexDurationsMs`, in ms from the batch's first dispatch."""
    out = {"dispatchedMs": times.dispatched_ms - first_dispatch_ms, "taskMs": round(times.task_ms, 1)}
    if times.reported_ms is not None:
        out["reportedMs"] = times.reported_ms - first_dispatch_ms
        out["overheadMs"] = round(max(0.0, times.reported_ms - times.dispatched_ms - times.task_ms), 1)
    return out


def add_vertex_durations(record: dict[str, Any], times: Mapping[str, VertexTimes] | None) -> None:
    """Where the batch's addBatch went, vertex by vertex (`vertexDurationsMs`): when each
    vertex's tasks were sent the batch and when its last report arrived (both in ms from the
    batch's first dispatch), how long its slowest subtask ran it, and the rest (hops, waits)."""
    if times:
        first = min(t.dispatched_ms for t in times.values())
        record["vertexDurationsMs"] = {v: vertex_durations(t, first) for v, t in times.items()}


# ------------------------------------------------------------------------------------ the shell's additions


def add_source_details(record: dict[str, Any], details: Mapping[str, Mapping[str, Any]]) -> None:
    """What a source's JobManager side measured (a broker's lag), added to its entry."""
    for source in record.get("sources", ()):
        extra = details.get(source.get("description"))
        if extra:
            source.update(extra)


def source_lags(record: Mapping[str, Any]) -> list[tuple[str, str, str, int]]:
    """A progress record's consumer lag, flat: (source description, stream, partition, records
    behind) for each partition of a Kafka source (`lag` {topic: {partition: n}}) and each key of a
    Redis Streams source (`lag` {key: n}, partition ""), in the record's order. For the metrics
    and the dashboard (which flattens the same way, jobmanager/web/streaming.js)."""
    out: list[tuple[str, str, str, int]] = []
    for source in record.get("sources", ()) or ():
        lag = source.get("lag") if isinstance(source, Mapping) else None
        if not isinstance(lag, Mapping):
            continue
        description = str(source.get("description", ""))
        for stream, value in lag.items():
            if isinstance(value, Mapping):
                out.extend((description, str(stream), str(p), int(n)) for p, n in value.items()
                           if isinstance(n, int) and not isinstance(n, bool))
            elif isinstance(value, int) and not isinstance(value, bool):
                out.append((description, str(stream), "", value))
    return out
