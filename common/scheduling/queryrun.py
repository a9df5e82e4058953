"""One run of a streaming query on the JobManager, as one sans-IO state machine: the micro-batch
coordinator's decisions (`funke.common.streaming.microbatch`: when a batch is planned, logged,
run, committed and recorded), each batch's flow through the long-lived tasks
(`funke.common.scheduling.batchflow`), and what goes with them on the JobManager: the receivers'
rate estimates and rate limits (backpressure), what each receiver read per batch, the batches
each TaskManager may release, and the tasks' end.

Owns, for one run (one set of RUNNING attempts, fixed when the run starts: any failure restarts
every task and starts a new run): its coordinator (made when the run starts, from what the
checkpoint says), its batch flow, the per-TaskManager released batches, and — carried from the
query's previous run — the rate estimators, the rate limits and the receivers' counts.

Sans-IO: `handle(event)` takes what happened, with the time it happened and a `stimulus_id`
naming what caused it ("tick-<ms>", "report-<attempt>-<batch>", "offsets-answered-<batch>",
...), and returns actions the shell carries out without deciding anything: ask the sources,
write a log entry, resolve a batch's input, run tasks on a TaskManager (the batch, the rate
limits and the released batches filled in), commit the sinks (with the attempts whose output
counts), send rate limits, set the timer, publish, finish the tasks (not after a live rescale's
stop: the job is suspended instead), end. Each action records
the stimulus that produced it. No clock, no files, no threads inside.

Keyed state is fenced by run (`funke.common.streaming.state`): the run's token is made from its
run id; every batch carries the state lineage (the last commit's, with this run's entry, so its
state files are written under the run's token), and every commit entry of a query with keyed
state records the lineage as of its batch, which is what the next batch and the next run read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from funke.common.graph.deployment import BatchTask
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph
from funke.common.graph.streamingjob import DEFAULT_RETAIN, RUNNING_KINDS
from funke.common.scheduling.batchflow import BatchFlow, Dispatch, InputRead, SinkStarted, SinkWritten, Step
from funke.common.streaming import microbatch as mb
from funke.common.streaming import progress
from funke.common.streaming.progress import PROGRESS_KEPT, VertexTimes
from funke.common.streaming.backpressure import RateEstimator
from funke.common.streaming.checkpoint import CommitEntry, OffsetEntry
from funke.common.streaming.eventtime import EventTimeStats, WatermarkTracker
from funke.common.streaming.sources import BatchInput
from funke.common.streaming.state import StateLineage, StateMetrics, legacy_lineage, run_token

# The coordinator's events and actions that pass through unchanged (with their stimulus_id)
from funke.common.streaming.microbatch import (  # noqa: F401
    CaptureTargets, CommitLogged, OffsetsAnswered, OffsetsLogged, Publish, QueryOffsets, SetTimer,
    SinksCommitted, StopRequested, TargetsCaptured, Terminate, Tick, WriteCommitLog, WriteOffsetLog,
)

# ------------------------------------------------------------------------------------ events in


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The run holds the checkpoint: what it goes on from (`CheckpointStore.open`'s resumption)."""
    query_id: str
    next_batch_id: int
    logged: tuple[OffsetEntry, ...]
    last_ends: dict[str, Any]
    now_ms: int
    stimulus_id: str
    last: OffsetEntry | None = None  # the last logged entry: the watermark goes on from it
    last_commit: CommitEntry | None = None  # and the event times seen by the last committed batch


@dataclass(frozen=True, slots=True)
class BatchInputResolved:
    """The answer to `ResolveBatchInput`: per source, what its range resolves to for the tasks."""
    batch_id: int
    files: dict[str, tuple[str, ...]]
    now_ms: int
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class BatchWritten:
    """Subtask `attempt` wrote batch `batch_id`; `schemas`: data set -> schema of what it wrote;
    `input_rows`: the rows its stream sources read (None: not counted); `state`: its keyed
    operator's state after the batch (None: it has none); `event_time`: per watermark operator
    of its chain, the event times of the batch's rows; `late_rows`: what its window operator
    found late; `seconds`: how long the subtask ran the batch, as its TaskManager measured it
    (None: not said)."""
    attempt: ExecutionAttemptId
    batch_id: int
    schemas: dict[str, str]
    input_rows: int | None
    now_ms: int
    stimulus_id: str
    state: StateMetrics | None = None
    event_time: dict[str, EventTimeStats] = field(default_factory=dict)
    late_rows: int = 0
    seconds: float | None = None


Event = (RunStarted | Tick | OffsetsAnswered | TargetsCaptured | OffsetsLogged | BatchInputResolved | BatchWritten
         | SinksCommitted | CommitLogged | StopRequested)
_PASSED_ON = (Tick, OffsetsAnswered, TargetsCaptured, OffsetsLogged, SinksCommitted, CommitLogged, StopRequested)


# ------------------------------------------------------------------------------------ actions out


@dataclass(frozen=True, slots=True)
class ResolveBatchInput:
    """Resolve a logged batch's ranges for the tasks (`SourceSide.batch_files`), then answer
    `BatchInputResolved`."""
    entry: OffsetEntry
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class RunTasks:
    """Send `batch` (rate limits filled in) to these tasks of one vertex on one TaskManager,
    telling it the earlier batches it may release."""
    task_manager_id: str
    vertex_id: str
    batch: BatchInput
    tasks: tuple[BatchTask, ...]
    released: tuple[int, ...] = ()
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class CommitSinks:
    """Commit the batch on every sink: per sink, subtask -> the attempt whose output counts."""
    batch_id: int
    attempts: dict[str, dict[int, int]]
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class SendRateLimits:
    """Backpressure: the records a second each of these receivers may take from now on."""
    task_manager_id: str
    source: str
    rates: tuple[tuple[ExecutionAttemptId, float], ...]
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class SendFinish:
    """The query ended: these tasks on one TaskManager end FINISHED once their batches are done."""
    task_manager_id: str
    attempts: tuple[ExecutionAttemptId, ...]
    stimulus_id: str = ""


Action = (QueryOffsets | CaptureTargets | WriteOffsetLog | ResolveBatchInput | RunTasks | CommitSinks | WriteCommitLog
          | SetTimer | Publish | SendRateLimits | SendFinish | Terminate)


@dataclass
class Carried:
    """What a query keeps from one run to the next: the receivers' rate estimators, their rate
    limits, and what each receiver read of batches not recorded yet."""
    estimators: dict[str, RateEstimator] = field(default_factory=dict)
    rate_limits: dict[str, float] = field(default_factory=dict)
    received: dict[tuple[int, str], tuple[int | None, ...]] = field(default_factory=dict)


def stop_before_run(drain: bool, concurrent_jobs: int) -> str:
    """What a stop asked while no run is there (starting or recovering) does: the next run stops
    at once, as its start says."""
    if drain:
        return ("the batches logged and not committed run and commit, then what the sources hold then; "
                "then the query ends FINISHED")
    first = "the first batch logged and not committed (if any) runs and commits" if concurrent_jobs == 1 else (
        f"the first {concurrent_jobs} batches logged and not committed (if any) run and commit")
    return (f"{first}, later ones are not run (they stay in the offset log for the query's next run); "
            "then the query ends FINISHED")


# ------------------------------------------------------------------------------------ the run


class QueryRun:
    """One run of a streaming query over `graph`'s current attempts. `sources` and `sinks` name
    the stream source and sink vertices; `receivers`: receiver source -> its receivers;
    `backpressure`: estimate their rates (streaming.backpressure.enabled)."""

    def __init__(self, graph: ExecutionGraph, trigger: mb.Trigger, sources: Iterable[str], sinks: Iterable[str], *,
                 receivers: Mapping[str, int] | None = None, backpressure: bool = False, concurrent_jobs: int = 1,
                 run_id: str = "", name: str = "", carried: Carried | None = None,
                 watermark_delays: Mapping[str, int] | None = None, watermark_policy: str = "min",
                 watermark_partitioned: Mapping[str, int | None] | None = None, no_data_batches: bool = False, retain: int = DEFAULT_RETAIN):
        self.trigger, self.run_id, self.name = trigger, run_id, name
        # event time: watermark operator -> its delay (none: the query has no watermark)
        self.watermark_delays = dict(watermark_delays or {})
        self.watermark_policy = watermark_policy
        # per-partition watermark operators -> their idle timeout in ms (None: never idle)
        self.watermark_partitioned = dict(watermark_partitioned or {})
        self.no_data_batches = no_data_batches
        self.sources, self.sinks = tuple(sources), list(sinks)
        self.concurrent_jobs = concurrent_jobs
        self.flow = BatchFlow(graph, self.sinks)
        self.receivers = dict(receivers or {})
        self.carried = carried if carried is not None else Carried()
        if backpressure and not self.carried.estimators:
            interval = getattr(trigger, "interval_ms", 1000)
            self.carried.estimators.update({s: RateEstimator(interval) for s in self.receivers})
        self.coordinator: mb.MicroBatchCoordinator | None = None
        self.query_id = ""
        self.keep_tasks = False  # a live rescale's stop: the run ends without finishing its tasks
        self._entries: dict[int, OffsetEntry] = {}  # batches whose input is being resolved
        # Per TaskManager, the batches through since its last RunTasks: it deletes what its tasks
        # wrote for them when told with the next one (the job's end releases the rest).
        self.released: dict[str, set[int]] = {}
        # (batch, vertex) -> subtask -> its keyed operator's state after the batch, until the
        # batch's progress record takes them
        self.state_reported: dict[tuple[int, str], dict[int, StateMetrics]] = {}
        # batch -> vertex -> where its part of the batch's time went, until the batch's progress
        # record takes them
        self.vertex_times: dict[int, dict[str, VertexTimes]] = {}
        # Keyed state: the keyed vertices (a keyed operator heads its chain), and the lineage the
        # run's batches carry (set when the run starts; None: the query has no keyed state)
        self.keyed = tuple(v.id for v in graph.job_graph.vertices
                           if v.operators and v.operators[0].kind in RUNNING_KINDS)
        self.retain = retain
        self.lineage: StateLineage | None = None

    # ------------------------------------------------------------------ views

    @property
    def rate_limits(self) -> dict[str, float]:
        return self.carried.rate_limits

    @property
    def received(self) -> dict[tuple[int, str], tuple[int | None, ...]]:
        return self.carried.received

    @property
    def in_flight(self) -> list[int]:
        """The batches sent to the tasks and not through all of them yet."""
        return self.flow.in_flight

    @property
    def finished(self) -> bool:
        return self.coordinator is not None and self.coordinator.finished

    def stop_outlook(self, drain: bool) -> mb.StopOutlook | None:
        """What a stop asked for now does (None: the run has not started)."""
        if self.coordinator is None or self.coordinator.finished:
            return None
        return self.coordinator.stop_outlook(drain)

    def _task_manager(self, vertex: str, subtask: int) -> str:
        return self.flow.task_managers[(vertex, subtask)]

    # ------------------------------------------------------------------ events

    def handle(self, event: Event) -> list[Action]:
        if not event.stimulus_id:
            raise ValueError(f"{type(event).__name__} names no stimulus_id")
        if isinstance(event, RunStarted):
            if self.coordinator is not None:
                raise ValueError("the run has started already")
            self.query_id = event.query_id
            if self.keyed:
                last = event.last_commit
                if last is None:
                    base = StateLineage()  # no batch committed: no operator has state
                else:  # an entry without a lineage: funke 0.3.0 wrote it, files named as it named them
                    base = last.state if last.state is not None else legacy_lineage(self.keyed)
                first = event.logged[0].batch_id if event.logged else event.next_batch_id
                self.lineage = base.with_run(first, run_token(self.run_id))
            tracker = None
            if self.watermark_delays:
                last = event.last
                maxes = dict(last.event_time_max) if last is not None else {}
                active = dict(last.event_time_active) if last is not None else {}
                commit = event.last_commit
                pairs = [(commit.event_time_max, maxes), (commit.event_time_active, active)] if commit is not None else []
                for logged, merged in pairs:
                    for key, ms in logged.items():
                        merged[key] = max(ms, merged.get(key, ms))
                tracker = WatermarkTracker(self.watermark_delays, self.watermark_policy, maxes,
                                           last.watermark_ms if last is not None else None,
                                           self.watermark_partitioned, active)
            self.coordinator = mb.MicroBatchCoordinator(
                event.query_id, self.run_id, self.trigger, self.sources, self.sinks,
                next_batch_id=event.next_batch_id, logged=event.logged, last_ends=event.last_ends,
                concurrent_jobs=self.concurrent_jobs, name=self.name, watermarks=tracker,
                no_data_batches=self.no_data_batches)
            return self._coordinate(mb.Started(event.now_ms, event.stimulus_id))
        if self.coordinator is None or self.coordinator.finished:
            return []  # before the run started, or after it ended: nothing to do
        if isinstance(event, _PASSED_ON):
            if isinstance(event, StopRequested) and event.keep_tasks:
                self.keep_tasks = True  # a rescale's stop: the tasks go on until the job is suspended
            return self._coordinate(event)
        if isinstance(event, BatchInputResolved):
            entry = self._entries.pop(event.batch_id, None)
            if entry is None:
                return []
            batch = BatchInput(entry.batch_id, entry.batch_time_ms, dict(entry.sources), dict(event.files),
                               watermark_ms=entry.watermark_ms, state=self.lineage)
            return self._steps(event.batch_id, self.flow.start(batch), event.now_ms, event.stimulus_id)
        if isinstance(event, BatchWritten):
            if event.batch_id not in self.flow.in_flight:
                return []
            if not self.flow.accepts(event.attempt, event.batch_id):
                return []  # from before this run, or a repeat: it counts for nothing
            if event.state is not None:
                key = (event.batch_id, event.attempt.vertex_id)
                self.state_reported.setdefault(key, {})[event.attempt.subtask_index] = event.state
            times = self.vertex_times.get(event.batch_id, {}).get(event.attempt.vertex_id)
            if times is not None:
                times.reported_ms = max(times.reported_ms or event.now_ms, event.now_ms)
                times.task_ms = max(times.task_ms, (event.seconds or 0.0) * 1000)
            out: list[Action] = []
            if event.event_time or event.late_rows:
                out += self._coordinate(mb.EventTimeObserved(event.batch_id, dict(event.event_time), event.late_rows,
                                                             event.now_ms, event.stimulus_id))
            steps = self.flow.on_report(event.attempt, event.batch_id, event.schemas, event.input_rows)
            return out + self._steps(event.batch_id, steps, event.now_ms, event.stimulus_id)
        raise TypeError(f"not an event of a query run: {event!r}")

    def _coordinate(self, event: mb.Event) -> list[Action]:
        """The coordinator's actions, with what this run does for them instead."""
        assert self.coordinator is not None
        out: list[Action] = []
        for action in self.coordinator.handle(event):
            sid = action.stimulus_id
            match action:
                case mb.StartBatch(entry=entry):
                    self._entries[entry.batch_id] = entry
                    out.append(ResolveBatchInput(entry, sid))
                case mb.CommitBatch(batch_id=b):
                    out.append(CommitSinks(b, {s: self.flow.sink_attempts(s) for s in self.sinks}, sid))
                case mb.WriteCommitLog(entry=entry) if self.lineage is not None:
                    # the batch's state files are this run's: from now on its batches read them
                    self.lineage = self.lineage.committed(entry.batch_id, self.keyed, self.retain)
                    out.append(dataclasses.replace(action, entry=dataclasses.replace(entry, state=self.lineage)))
                case mb.Publish(kind="QueryProgress"):
                    self._add_to_progress(action.info)
                    out.append(action)
                    out.extend(self._estimate_rates(action.info, sid))
                case mb.Terminate():
                    if not self.keep_tasks:
                        out.extend(self._finish_tasks(sid))
                    out.append(action)
                case _:
                    out.append(action)
        return out

    def _steps(self, batch_id: int, steps: list[Step], now: int, sid: str) -> list[Action]:
        """What the batch's flow says to do: tasks to run, and the sinks' and sources' progress
        for the coordinator."""
        out: list[Action] = []
        for step in steps:
            match step:
                case Dispatch():
                    self.vertex_times.setdefault(batch_id, {}).setdefault(step.vertex_id, VertexTimes(now))
                    released = tuple(sorted(self.released.pop(step.task_manager_id, ())))
                    batch = dataclasses.replace(step.batch, rate_limits=dict(self.rate_limits))  # as they are now
                    out.append(RunTasks(step.task_manager_id, step.vertex_id, batch, step.tasks, released, sid))
                case SinkStarted(sink=sink):
                    out += self._coordinate(mb.OutputStarted(batch_id, sink, now, sid))
                case SinkWritten(sink=sink):
                    out += self._coordinate(mb.OutputCompleted(batch_id, sink, now, sid))
                case InputRead(source=source, rows=rows):
                    if source in self.receivers:
                        self.received[(batch_id, source)] = step.per_subtask
                    if rows is not None:
                        out += self._coordinate(mb.InputCounted(batch_id, source, rows, now, sid))
        if batch_id not in self.flow.in_flight:  # through every task: each TaskManager may release it
            for tm in set(self.flow.task_managers.values()) - {""}:
                self.released.setdefault(tm, set()).add(batch_id)
        return out

    def _finish_tasks(self, sid: str) -> list[Action]:
        by_tm: dict[str, list[ExecutionAttemptId]] = {}
        for a in self.flow.all_attempts():
            by_tm.setdefault(self._task_manager(a.vertex_id, a.subtask_index), []).append(a)
        return [SendFinish(tm, tuple(attempts), sid) for tm, attempts in by_tm.items()]

    # ------------------------------------------------------------------ receivers and backpressure

    def _add_to_progress(self, record: dict[str, Any]) -> None:
        """What this run knows of the batch's tasks, added to its progress record (`progress`):
        the receivers' blocks and records, the keyed operators' state, the vertices' times. What
        was kept for the record is let go then, and for batches that never got one, once they are
        PROGRESS_KEPT behind."""
        batch = int(record.get("batchId", -1))
        names = [s.get("description") for s in record.get("sources", ())]
        received = {n: self.received.pop((batch, n), ()) for n in names if n in self.receivers}
        progress.add_receivers(record, self.receivers, received, self.rate_limits)
        operators = []
        for key in sorted(k for k in self.state_reported if k[0] == batch):
            ejv = self.flow.graph.vertices.get(key[1])
            key_groups = ejv.job_vertex.effective_max_parallelism if ejv is not None else 0
            operators.append((key[1], sum(self.state_reported.pop(key).values(), StateMetrics()), key_groups))
        progress.add_state_operators(record, operators)
        progress.add_vertex_durations(record, self.vertex_times.pop(batch, None))
        for key in [k for k in self.received if k[0] < batch - PROGRESS_KEPT]:
            del self.received[key]
        for key in [k for k in self.state_reported if k[0] < batch - PROGRESS_KEPT]:
            del self.state_reported[key]
        for key in [k for k in self.vertex_times if k < batch - PROGRESS_KEPT]:
            del self.vertex_times[key]

    def _estimate_rates(self, record: dict[str, Any], sid: str) -> list[Action]:
        """A new backpressure rate goes to the source's receivers at once (as Spark's
        ReceiverTracker sends it), not with the next batch that runs: batches queued behind a
        slow one were planned already."""
        out: list[Action] = []
        for source in record.get("sources", ()):
            name = source.get("description")
            estimator = self.carried.estimators.get(name)
            if estimator is None or name not in self.receivers:
                continue
            rate = estimator.update(int(record.get("batchTime", 0)), int(source.get("numInputRows", 0)),
                                    int(record.get("processingDelayMs", 0)), int(record.get("schedulingDelayMs", 0)))
            if rate is None:
                continue
            self.rate_limits[name] = rate / self.receivers[name]
            by_tm: dict[str, list[tuple[ExecutionAttemptId, float]]] = {}
            for subtask in range(self.receivers[name]):
                attempt = ExecutionAttemptId(name, subtask, self.flow.attempts[(name, subtask)])
                by_tm.setdefault(self._task_manager(name, subtask), []).append((attempt, self.rate_limits[name]))
            out += [SendRateLimits(tm, name, tuple(rates), sid) for tm, rates in by_tm.items()]
        return out
