"""The micro-batch coordinator of a STREAMING job: when a batch is generated, which offsets it
reads, and the order in which it is logged, run, committed to the sinks and recorded — Spark
Streaming's JobGenerator (a recurring timer) and JobScheduler (JobSets by batch time,
`concurrentJobs`), with Structured Streaming's offset log (written before a batch runs) and
commit log (written once the sinks committed it).

Owns, for one run of one streaming query: the query's state (`QueryState`), every batch's phase
(`BatchPhase`, tables in `funke.common.states`), the ranges planned so far, the trigger's timer,
a graceful stop, and the events and progress records a user watches.

Sans-IO: `handle(event)` takes what happened (the timer fired, the sources answered, a log entry
was written, a sink finished a batch, ...) with the time it happened, and returns the actions
the shell must carry out (ask the sources, write a log entry, run or commit a batch, set the
timer, publish an event, end the query). No clock, no files, no threads inside. Every event
may carry a `stimulus_id` (what caused it: "tick-<ms>", "offsets-answered-<batch>", ...), and
every action it produces records it. `funke.common.scheduling.queryrun.QueryRun` owns one
coordinator per run, with the batches' flow through the tasks.

The rules:
- Processing-time trigger: a batch per interval, at times aligned to the interval (Spark's
  RecurringTimer); ticks missed while the shell was busy fold into one. A batch whose sources
  have nothing new is skipped: nothing logged, nothing run.
- One batch is planned and logged at a time, so each batch's ranges start where the previous
  one's ended, and offset log entries are contiguous. Logged batches run in batch order, at most
  `concurrent_jobs` at once.
- A bounded queue: at most `concurrent_jobs` + 1 batches are planned or logged and not yet
  committed (those running, and one ready to start the moment a slot frees). A trigger that
  finds the queue full makes no batch of its own: once a batch is recorded, the next one is
  planned at once, for the last trigger missed, and takes everything the sources hold by then
  within the per-trigger limits. So a query that falls behind makes fewer, larger batches, as
  Structured Streaming plans its next batch only when the previous one is done, instead of one
  batch per trigger piling up in the offset log (Spark Streaming's queue of JobSets); and a
  graceful stop has at most that many logged batches to finish or leave behind. The scheduling
  delay of a batch that waited still shows it.
- A batch commits to its sinks only after every sink wrote it and every earlier batch is
  recorded, so the commit log is contiguous too.
- Available-now (and a draining stop): the sources' offsets at that moment are the target;
  batches follow each other back to back (within the same bound), each within the per-trigger
  limits, until the target is reached, then the query ends. Once: one batch of everything
  available, without limits.
- Stop without draining: no new batch starts; the ones running finish and commit, the logged
  ones that have not started stay in the offset log for the next run (DEFERRED). Cancel is not
  this module's: the job is cancelled, and its next run recovers from the logs. `stop_outlook`
  says beforehand which batches a stop finishes and which it leaves.
- Recovery: a run starts with what `funke.common.streaming.checkpoint.plan_recovery` found: the logged,
  uncommitted batches run again first, with exactly their logged ranges.
- Event time (`funke.common.streaming.eventtime`): the subtasks' event times (`EventTimeObserved`)
  move the watermark tracker; each batch's offset entry logs the watermark computed when it was
  planned (a re-run batch runs with it again), each commit entry the event times seen by then.
  With `no_data_batches`, a watermark that moved past the last logged one makes a batch even
  without new data, so that windows it passes close.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from funke.common.streaming.checkpoint import CommitEntry, OffsetEntry, SourceRange
from funke.common.streaming.eventtime import EventTimeStats, WatermarkTracker
from funke.common.streaming.progress import PROGRESS_KEPT, query_progress
from funke.common.states import (
    BATCH_PHASE_TRANSITIONS,
    QUERY_MODE_TRANSITIONS,
    QUERY_STATE_TRANSITIONS,
    BatchPhase,
    QueryMode,
    QueryState,
    StateMachine,
)



# ------------------------------------------------------------------------------------ triggers


class TriggerPolicy:
    """What a trigger decides for the coordinator (a policy, asked instead of testing the
    trigger's class): how the query starts, when a tick makes a batch due, whether batches stay
    within the per-trigger limits, whether a stop can drain, and why the query ends by itself."""
    limited = True  # batches within the sources' per-trigger limits
    drains = False  # a stop with drain processes what the sources hold first
    single_batch = False  # the first batch with data is the whole query
    end_reason = ""  # why a query ends once its target is reached

    def start(self, now_ms: int) -> "TriggerStart":
        raise NotImplementedError

    def due(self, next_tick_ms: int | None, now_ms: int) -> tuple[int, int] | None:
        """(the trigger time due, the next tick) when a timer fired at `now_ms`; None: nothing due."""
        return None


@dataclass(frozen=True, slots=True)
class TriggerStart:
    timer_at_ms: int | None = None  # the first tick
    capture_targets: bool = False  # process up to the sources' offsets now, then end
    due_now: bool = False  # a batch is due at once


@dataclass(frozen=True, slots=True)
class ProcessingTime(TriggerPolicy):
    """A batch per interval, at times aligned to the interval (Spark's RecurringTimer); ticks
    missed while the shell was busy fold into one."""
    interval_ms: int
    drains = True

    def __post_init__(self) -> None:
        if self.interval_ms <= 0:
            raise ValueError(f"a processing-time trigger needs a positive interval, got {self.interval_ms} ms")

    def start(self, now_ms: int) -> TriggerStart:
        return TriggerStart(timer_at_ms=aligned_after(now_ms, self.interval_ms))

    def due(self, next_tick_ms: int | None, now_ms: int) -> tuple[int, int] | None:
        if next_tick_ms is None or now_ms < next_tick_ms:
            return None
        due = next_tick_ms + (now_ms - next_tick_ms) // self.interval_ms * self.interval_ms
        return due, due + self.interval_ms


@dataclass(frozen=True, slots=True)
class AvailableNow(TriggerPolicy):
    """Process what the sources hold at the start, in batches within the per-trigger limits,
    then finish."""
    end_reason = "available-now: every source processed up to its offsets at the start"

    def start(self, now_ms: int) -> TriggerStart:
        return TriggerStart(capture_targets=True)


@dataclass(frozen=True, slots=True)
class Once(TriggerPolicy):
    """One batch of everything available, then finish."""
    limited = False
    single_batch = True
    end_reason = "once: its one batch is done"

    def start(self, now_ms: int) -> TriggerStart:
        return TriggerStart(due_now=True)


Trigger = ProcessingTime | AvailableNow | Once


# ------------------------------------------------------------------------------------ events in


@dataclass(frozen=True, slots=True)
class Started:
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class Tick:
    """The timer set by `SetTimer` fired (or any wake-up: early ones change nothing)."""
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class OffsetsAnswered:
    """The sources' answer to `QueryOffsets(batch_id)`: per source, the range after the start
    asked for (start == end: nothing new)."""
    batch_id: int
    ranges: dict[str, SourceRange]
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class TargetsCaptured:
    """The answer to `CaptureTargets`: per source, the offset to process up to."""
    targets: dict[str, Any]
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class OffsetsLogged:
    batch_id: int
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class OutputStarted:
    """A sink (an output operation) began writing the batch."""
    batch_id: int
    sink: str
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class OutputCompleted:
    """A sink wrote the batch entirely (every subtask of it)."""
    batch_id: int
    sink: str
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class InputCounted:
    """Every subtask of a source read the batch: `rows` is what they counted (a file source's
    rows are only known once read; a rate source's are its range's)."""
    batch_id: int
    source: str
    rows: int
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class EventTimeObserved:
    """A subtask ran the batch: per watermark operator, the event times its rows had, and the
    rows its window operators found late."""
    batch_id: int
    stats: dict[str, EventTimeStats]
    late_rows: int
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class SinksCommitted:
    batch_id: int
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class CommitLogged:
    batch_id: int
    now_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class StopRequested:
    """A graceful stop: finish the batches running; with `drain`, first process everything the
    sources hold now. `keep_tasks`: a live rescale's stop: the tasks are not finished at the end
    (the job is suspended instead, and its next run takes over; `funke.common.scheduling.rescale`)."""
    drain: bool
    now_ms: int
    stimulus_id: str = ""
    keep_tasks: bool = False


Event = (Started | Tick | OffsetsAnswered | TargetsCaptured | OffsetsLogged | OutputStarted | OutputCompleted
         | InputCounted | EventTimeObserved | SinksCommitted | CommitLogged | StopRequested)


# ------------------------------------------------------------------------------------ actions out


@dataclass(frozen=True, slots=True)
class QueryOffsets:
    """Ask every source for its range after `starts[source]` (None: from its beginning), within
    its per-trigger limit if `limited`, and not past `caps[source]` when caps are given."""
    batch_id: int
    batch_time_ms: int
    starts: dict[str, Any]
    limited: bool = True
    caps: dict[str, Any] | None = None
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class CaptureTargets:
    """Ask every source for its latest offset (no limit): what available-now or a draining stop
    processes up to."""
    starts: dict[str, Any]
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class WriteOffsetLog:
    entry: OffsetEntry
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class StartBatch:
    """Start the logged batch `entry` (the query run resolves its input and sends it to the tasks)."""
    entry: OffsetEntry
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Every sink has written the batch: commit it (the query run names each sink's attempts)."""
    batch_id: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class WriteCommitLog:
    entry: CommitEntry
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class SetTimer:
    at_ms: int
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class Publish:
    """A listener event: kind is BatchSubmitted, BatchStarted, OutputOperationStarted,
    OutputOperationCompleted, BatchCompleted or QueryProgress (Spark's names)."""
    kind: str
    batch_id: int
    at_ms: int
    info: dict[str, Any] = field(default_factory=dict)
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class Terminate:
    reason: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class StopOutlook:
    """What a graceful stop asked for now does with the query's batches: `finishing` are
    running or committing, and finish and commit; `logged` are logged and not started: with
    `drain` they run and commit too (then batches of what the sources hold at the stop),
    without it they are not run and stay in the offset log for the next run.
    `drain_ignored`: a drain was asked of a trigger that does not drain (available-now, once)."""
    drain: bool
    finishing: tuple[int, ...]
    logged: tuple[int, ...]
    drain_ignored: bool = False

    def describe(self) -> str:
        if self.drain:
            batches = self.finishing + self.logged
            if not batches:
                text = "what the sources hold now is processed"
            elif len(batches) == 1:
                text = f"batch {batches[0]}, logged, runs and commits, then what the sources hold now"
            else:
                text = f"the {len(batches)} logged batches ({_listed(batches)}) run and commit, then what the sources hold now"
            text += ", in batches within the per-trigger limits"
        else:
            if not self.finishing:
                text = "no batch is in flight"
            elif len(self.finishing) == 1:
                text = f"batch {self.finishing[0]} in flight finishes and commits"
            else:
                text = f"batches {_listed(self.finishing)} in flight finish and commit"
            if len(self.logged) == 1:
                text += (f"; batch {self.logged[0]}, logged and not started, is not run (it stays in the offset "
                         "log: the query's next run runs it first)")
            elif self.logged:
                text += (f"; batches {_listed(self.logged)}, logged and not started, are not run (they stay in the "
                         "offset log: the query's next run runs them first)")
            if self.drain_ignored:
                text += " (draining does not apply to an available-now or once trigger)"
        return text + "; then the query ends FINISHED"


def _listed(batch_ids: tuple[int, ...], shown: int = 10) -> str:
    more = f" and {len(batch_ids) - shown} more" if len(batch_ids) > shown else ""
    return ", ".join(str(b) for b in batch_ids[:shown]) + more


Action = QueryOffsets | CaptureTargets | WriteOffsetLog | StartBatch | CommitBatch | WriteCommitLog | SetTimer | Publish | Terminate


# ------------------------------------------------------------------------------------ batches


@dataclass
class Batch:
    """One batch: Spark Streaming's JobSet (batch time, submission, processing start and end)
    with Structured Streaming's phase durations."""
    batch_id: int
    batch_time_ms: int
    phase: StateMachine[BatchPhase]
    entry: OffsetEntry | None = None
    rerun: bool = False  # logged by an earlier run of the job
    # When each step happened (None: not yet; a rerun was planned and logged by an earlier run)
    planned_at_ms: int | None = None  # QueryOffsets sent
    previous_trigger_ms: int | None = None  # when the trigger before this one was planned
    answered_at_ms: int | None = None
    logged_at_ms: int | None = None  # BatchSubmitted
    started_at_ms: int | None = None  # StartBatch sent: processing starts
    written_at_ms: int | None = None  # every sink wrote it
    committed_at_ms: int | None = None
    recorded_at_ms: int | None = None
    outputs_done: set[str] = field(default_factory=set)
    counted: dict[str, int] = field(default_factory=dict)  # source -> rows its subtasks read
    event_time: EventTimeStats = field(default_factory=EventTimeStats)  # every watermark operator's rows
    late_rows: int = 0  # rows its window operators found late

    def source_rows(self, source: str) -> int:
        """A source's rows in this batch: as counted when its subtasks read it, else as its
        range says."""
        if source in self.counted:
            return self.counted[source]
        return self.entry.sources[source].rows if self.entry is not None and source in self.entry.sources else 0

    @property
    def rows(self) -> int:
        return sum(self.source_rows(s) for s in self.entry.sources) if self.entry is not None else 0

    def info(self) -> dict[str, Any]:
        """BatchInfo: the batch time, its rows, and the delays as Spark Streaming measures them."""
        out: dict[str, Any] = {"batchTime": self.batch_time_ms, "numRecords": self.rows,
                               "submissionTime": self.logged_at_ms}
        if self.started_at_ms is not None:
            out["processingStartTime"] = self.started_at_ms
            out["schedulingDelayMs"] = self.started_at_ms - self.batch_time_ms
        if self.recorded_at_ms is not None and self.started_at_ms is not None:
            out["processingEndTime"] = self.recorded_at_ms
            out["processingDelayMs"] = self.recorded_at_ms - self.started_at_ms
            out["totalDelayMs"] = self.recorded_at_ms - self.batch_time_ms
        return out


def _has_data(ranges: dict[str, SourceRange]) -> bool:
    return any(r.start != r.end for r in ranges.values())


def aligned_after(now_ms: int, interval_ms: int) -> int:
    """The first multiple of the interval after `now_ms` (Spark's RecurringTimer start)."""
    return (now_ms // interval_ms + 1) * interval_ms


# ------------------------------------------------------------------------------------ the coordinator


class MicroBatchCoordinator:
    """One run of a streaming query. `sources` and `sinks` name the job's source and sink
    vertices; `logged` holds the offset entries of the batches recovery says to run again (in
    order), `last_ends` where the last logged batch left each source (None: nothing logged)."""

    def __init__(self, query_id: str, run_id: str, trigger: Trigger, sources: Iterable[str], sinks: Iterable[str],
                 *, next_batch_id: int = 0, logged: Iterable[OffsetEntry] = (), last_ends: dict[str, Any] | None = None,
                 concurrent_jobs: int = 1, name: str = "", watermarks: WatermarkTracker | None = None,
                 no_data_batches: bool = False):
        if concurrent_jobs < 1:
            raise ValueError(f"concurrentJobs must be at least 1, got {concurrent_jobs}")
        self.query_id, self.run_id, self.name = query_id, run_id, name
        self.trigger = trigger
        self.sources = tuple(sources)
        self.sinks = frozenset(sinks)
        if not self.sources or not self.sinks:
            raise ValueError("a streaming query needs at least one source and one sink")
        self.concurrent_jobs = concurrent_jobs
        self.max_ahead = concurrent_jobs + 1  # batches planned or logged and not committed, at most
        self.state = StateMachine(f"query {query_id}", QUERY_STATE_TRANSITIONS, QueryState.INITIALIZING, 0.0)
        self.batches: dict[int, Batch] = {}
        self.next_batch_id = next_batch_id
        self._ends: dict[str, Any] = {s: (last_ends or {}).get(s) for s in self.sources}
        self._rerun = list(logged)
        self._next_tick: int | None = None
        self._due_ms: int | None = None  # a trigger time waiting for the planner
        self._targets: dict[str, Any] | None = None  # available-now / draining stop: process up to these
        self._capturing = False  # a CaptureTargets is unanswered
        # where the next batches come from (table: funke.common.states.QUERY_MODE_TRANSITIONS)
        self.mode = StateMachine(f"query {query_id} mode", QUERY_MODE_TRANSITIONS, QueryMode.STARTING, 0.0)
        self._last_trigger_ms: int | None = None
        self.progress: list[dict[str, Any]] = []  # the last PROGRESS_KEPT QueryProgress records
        # Event time (funke.common.streaming.eventtime): the query's watermark, and whether a
        # watermark that moved makes a batch without new data (its windows close, its state goes)
        self.watermarks = watermarks
        self.no_data_batches = no_data_batches and watermarks is not None
        self._logged_watermark = watermarks.watermark_ms if watermarks is not None else None

    # -------------------------------------------------------------- queries

    @property
    def finished(self) -> bool:
        return self.state.state is QueryState.TERMINATED

    def in_flight(self) -> list[Batch]:
        return [b for b in self.batches.values() if b.phase.state not in
                (BatchPhase.COMPLETED, BatchPhase.SKIPPED, BatchPhase.DEFERRED)]

    def _in(self, *phases: BatchPhase) -> list[Batch]:
        return sorted((b for b in self.batches.values() if b.phase.state in phases), key=lambda b: b.batch_id)

    def stop_outlook(self, drain: bool) -> StopOutlook:
        """What `StopRequested(drain)` would do now with the batches there are."""
        draining = drain and self.trigger.drains
        return StopOutlook(draining,
                           tuple(b.batch_id for b in self._in(BatchPhase.RUNNING, BatchPhase.COMMITTING,
                                                              BatchPhase.RECORDING)),
                           tuple(b.batch_id for b in self._in(BatchPhase.LOGGING, BatchPhase.QUEUED)),
                           drain_ignored=drain and not draining)

    # -------------------------------------------------------------- events

    def handle(self, event: Event) -> list[Action]:
        if self.finished:
            return []
        actions: list[Action] = []
        match event:
            case Started(now_ms=now):
                self._start(now, actions)
            case Tick(now_ms=now):
                self._tick(now, actions)
            case OffsetsAnswered():
                self._answered(event, actions)
            case TargetsCaptured(targets=targets, now_ms=now):
                self._capturing = False
                if self.mode.state is QueryMode.CAPTURING:
                    self.mode.transition(QueryMode.BOUNDED, now / 1000, "targets captured")
                self._targets = dict(targets)
                self._plan(now, actions)
            case OffsetsLogged(batch_id=b, now_ms=now):
                batch = self.batches[b]
                batch.logged_at_ms = now
                batch.phase.transition(BatchPhase.QUEUED, now / 1000)
                actions.append(Publish("BatchSubmitted", b, now, batch.info()))
                self._plan(now, actions)
            case OutputStarted(batch_id=b, sink=sink, now_ms=now):
                if self._running(b):
                    actions.append(Publish("OutputOperationStarted", b, now, {"sink": sink}))
            case OutputCompleted(batch_id=b, sink=sink, now_ms=now):
                batch = self._running(b)
                if batch is not None and sink in self.sinks and sink not in batch.outputs_done:
                    batch.outputs_done.add(sink)
                    actions.append(Publish("OutputOperationCompleted", b, now, {"sink": sink}))
                    if batch.outputs_done == self.sinks:
                        batch.written_at_ms = now
            case InputCounted(batch_id=b, source=source, rows=rows):
                batch = self._running(b)
                if batch is not None and source in self.sources and rows >= 0:
                    batch.counted[source] = rows
            case EventTimeObserved(batch_id=b, stats=stats, late_rows=late):
                batch = self._running(b)
                if batch is not None:
                    for operator, seen in stats.items():
                        batch.event_time = batch.event_time + seen
                        if self.watermarks is not None:
                            self.watermarks.observe(operator, seen, batch.batch_time_ms)
                    batch.late_rows += max(0, late)
            case SinksCommitted(batch_id=b, now_ms=now):
                batch = self.batches[b]
                batch.committed_at_ms = now
                batch.phase.transition(BatchPhase.RECORDING, now / 1000)
                maxes = dict(self.watermarks.maxes) if self.watermarks is not None else {}
                active = {}
                if self.watermarks is not None:
                    self.watermarks.committed(batch.batch_time_ms)  # its reports are all in
                    active = self.watermarks.logged_active()
                actions.append(WriteCommitLog(CommitEntry(b, now, maxes, event_time_active=active)))
            case CommitLogged(batch_id=b, now_ms=now):
                self._recorded(self.batches[b], now, actions)
            case StopRequested(drain=drain, now_ms=now):
                self._stop(drain, now, actions)
        now = event.now_ms
        self._commit_next(now, actions)
        self._run_queued(now, actions)
        self._maybe_terminate(now, actions)
        # every action names what caused it (the shell's log says why it happened)
        return [replace(a, stimulus_id=event.stimulus_id) for a in actions] if event.stimulus_id else actions

    def _running(self, batch_id: int) -> Batch | None:
        batch = self.batches.get(batch_id)
        return batch if batch is not None and batch.phase.state is BatchPhase.RUNNING else None

    def _start(self, now: int, actions: list[Action]) -> None:
        self.state.transition(QueryState.ACTIVE, now / 1000, "started")
        for entry in self._rerun:  # logged by an earlier run: queued as they were logged
            batch = self._new_batch(entry.batch_id, entry.batch_time_ms, now, rerun=True)
            batch.entry = entry
            batch.phase.transition(BatchPhase.LOGGING, now / 1000, "logged by an earlier run")
            batch.phase.transition(BatchPhase.QUEUED, now / 1000)
            batch.logged_at_ms = now
            actions.append(Publish("BatchSubmitted", entry.batch_id, now, {**batch.info(), "rerun": True}))
        self._rerun = []
        start = self.trigger.start(now)
        self.mode.transition(QueryMode.TRIGGERED if start.timer_at_ms is not None else
                             QueryMode.CAPTURING if start.capture_targets else QueryMode.BOUNDED, now / 1000, "started")
        if start.timer_at_ms is not None:
            self._next_tick = start.timer_at_ms
            actions.append(SetTimer(self._next_tick))
        if start.capture_targets:
            self._capturing = True
            actions.append(CaptureTargets(dict(self._ends)))
        if start.due_now:
            self._due_ms = now
            self._plan(now, actions)

    def _tick(self, now: int, actions: list[Action]) -> None:
        due_and_next = self.trigger.due(self._next_tick, now)  # missed ticks fold into one
        if due_and_next is None:
            return
        due, self._next_tick = due_and_next
        if self.state.state is QueryState.ACTIVE:  # a stopping query sets no timer
            actions.append(SetTimer(self._next_tick))
            self._due_ms = due
            self._plan(now, actions)

    def _plan(self, now: int, actions: list[Action]) -> None:
        """Ask the sources for the next batch's ranges, if one is due, none is being planned or
        logged (one at a time: each batch starts where the previous one ended), and fewer than
        `max_ahead` are not committed (else the due trigger waits for a batch to be recorded)."""
        if self._in(BatchPhase.PLANNING, BatchPhase.LOGGING) or self._capturing:
            return
        if len(self.in_flight()) >= self.max_ahead:
            return
        if self._targets is not None:
            if self._targets_reached():
                return
            due = now
        elif self._due_ms is None or self.state.state is not QueryState.ACTIVE:
            return
        else:
            due = self._due_ms
        self._due_ms = None
        batch = self._new_batch(self.next_batch_id, due, now)
        self.next_batch_id += 1
        batch.planned_at_ms = now
        batch.previous_trigger_ms, self._last_trigger_ms = self._last_trigger_ms, now
        actions.append(QueryOffsets(batch.batch_id, due, dict(self._ends), limited=self.trigger.limited,
                                    caps=dict(self._targets) if self._targets is not None else None))

    def _targets_reached(self) -> bool:
        assert self._targets is not None
        return all(self._targets.get(s) is None or self._ends.get(s) == self._targets.get(s) for s in self.sources)

    def _answered(self, event: OffsetsAnswered, actions: list[Action]) -> None:
        batch = self.batches[event.batch_id]
        now = event.now_ms
        batch.answered_at_ms = now
        ranges = {s: event.ranges[s] for s in self.sources if s in event.ranges}
        missing = [s for s in self.sources if s not in event.ranges]
        wrong = [s for s, r in ranges.items() if r.start != self._ends.get(s)]
        if missing or wrong:
            raise ValueError(f"batch {batch.batch_id}: the sources answered for other starts than asked "
                             f"(missing {missing}, other start {wrong})")
        stopping_now = self.state.state is not QueryState.ACTIVE and not self._draining()
        watermark = self.watermarks.advance() if self.watermarks is not None else None
        # A watermark that moved runs a batch even without new data (Structured Streaming's
        # no-data batch): the windows it closes are emitted, their state goes.
        moved = self.no_data_batches and watermark is not None and (
            self._logged_watermark is None or watermark > self._logged_watermark)
        if (not _has_data(ranges) and not moved) or stopping_now:
            batch.phase.transition(BatchPhase.SKIPPED, now / 1000, "a stop came first" if stopping_now else "no new data")
            del self.batches[batch.batch_id]
            self.next_batch_id = batch.batch_id  # the id is not used: ids stay contiguous
            if self._targets is not None and not stopping_now:
                # nothing more below the target: it is reached (a source may have lost data)
                self._targets = {s: self._ends.get(s) for s in self.sources}
            if self.trigger.single_batch:
                self._targets = {s: self._ends.get(s) for s in self.sources}
            return
        batch.entry = OffsetEntry(batch.batch_id, batch.batch_time_ms, ranges, watermark,
                                  dict(self.watermarks.maxes) if self.watermarks is not None else {},
                                  self.watermarks.logged_active() if self.watermarks is not None else {})
        self._logged_watermark = watermark
        for s, r in ranges.items():
            self._ends[s] = r.end
        if self.trigger.single_batch:
            self._targets = dict(self._ends)  # this one batch is all
        batch.phase.transition(BatchPhase.LOGGING, now / 1000)
        actions.append(WriteOffsetLog(batch.entry))

    def _run_queued(self, now: int, actions: list[Action]) -> None:
        if self.state.state is QueryState.TERMINATED:
            return
        stopping = self.state.state is QueryState.STOPPING and not self._draining()
        for batch in self._in(BatchPhase.QUEUED):
            if stopping:
                batch.phase.transition(BatchPhase.DEFERRED, now / 1000, "stopped before it ran; the next run runs it")
                continue
            if len(self._in(BatchPhase.RUNNING, BatchPhase.COMMITTING, BatchPhase.RECORDING)) >= self.concurrent_jobs:
                return
            batch.phase.transition(BatchPhase.RUNNING, now / 1000)
            batch.started_at_ms = now
            assert batch.entry is not None
            actions.append(StartBatch(batch.entry))
            actions.append(Publish("BatchStarted", batch.batch_id, now, batch.info()))

    def _commit_next(self, now: int, actions: list[Action]) -> None:
        """The oldest batch not recorded yet commits once every sink wrote it."""
        unrecorded = self._in(BatchPhase.RUNNING, BatchPhase.COMMITTING, BatchPhase.RECORDING)
        if unrecorded and unrecorded[0].phase.state is BatchPhase.RUNNING and unrecorded[0].written_at_ms is not None:
            batch = unrecorded[0]
            if any(b.batch_id < batch.batch_id for b in self._in(BatchPhase.QUEUED, BatchPhase.LOGGING)):
                return  # an earlier batch has not run yet (cannot happen with batch-order runs)
            batch.phase.transition(BatchPhase.COMMITTING, now / 1000)
            actions.append(CommitBatch(batch.batch_id))

    def _recorded(self, batch: Batch, now: int, actions: list[Action]) -> None:
        batch.recorded_at_ms = now
        batch.phase.transition(BatchPhase.COMPLETED, now / 1000)
        actions.append(Publish("BatchCompleted", batch.batch_id, now, batch.info()))
        record = query_progress(batch, query_id=self.query_id, run_id=self.run_id, name=self.name, sinks=self.sinks,
                                event_time=self.watermarks is not None)
        self.progress.append(record)
        del self.progress[:-PROGRESS_KEPT]
        actions.append(Publish("QueryProgress", batch.batch_id, now, record))
        del self.batches[batch.batch_id]  # done: its record is what is kept
        # Room in the queue: a trigger missed while it was full (or the next batch towards a
        # target) is planned now, with everything the sources hold by now.
        self._plan(now, actions)

    def _stop(self, drain: bool, now: int, actions: list[Action]) -> None:
        if self.state.state is QueryState.STOPPING:
            return
        self.state.transition(QueryState.STOPPING, now / 1000, "drain" if drain else "stop")
        self._due_ms = None
        if drain and self.trigger.drains:
            self.mode.transition(QueryMode.DRAINING, now / 1000, "drain")
            self._capturing = True
            actions.append(CaptureTargets(dict(self._ends)))
        else:
            self.mode.transition(QueryMode.STOPPING, now / 1000, "stop")

    def _draining(self) -> bool:
        return self.mode.state is QueryMode.DRAINING

    def _maybe_terminate(self, now: int, actions: list[Action]) -> None:
        state = self.state.state
        if state is QueryState.TERMINATED or self._capturing:
            return
        bounded = self._targets is not None
        if state is QueryState.ACTIVE and not bounded:
            return
        if bounded and not self._targets_reached() and (state is QueryState.ACTIVE or self._draining()):
            return
        if self.in_flight():
            return
        if state is QueryState.ACTIVE:
            reason = self.trigger.end_reason
        else:
            reason = "stopped" + (" after draining" if self._draining() else "")
        self.state.transition(QueryState.TERMINATED, now / 1000, reason)
        self.mode.transition(QueryMode.ENDED, now / 1000, reason)
        actions.append(Terminate(reason))

    # -------------------------------------------------------------- records

    def _new_batch(self, batch_id: int, batch_time_ms: int, now: int, rerun: bool = False) -> Batch:
        machine = StateMachine(f"batch {batch_id}", BATCH_PHASE_TRANSITIONS, BatchPhase.PLANNING, now / 1000)
        batch = Batch(batch_id, batch_time_ms, machine, rerun=rerun)
        self.batches[batch_id] = batch
        return batch
