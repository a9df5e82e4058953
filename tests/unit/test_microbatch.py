"""The micro-batch coordinator (common/streaming/microbatch.py), driven by a simulated world that carries
out its actions: sources with offsets that grow, an offset log, a commit log, sinks. Scripted
scenarios for each trigger, stop and recovery; and a property test over random orders in which
the world's I/O completes, checking the write-ahead rule, contiguous logs, batch order, and
that every offset is committed exactly once."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funke.common.streaming.checkpoint import OffsetEntry, SourceRange, plan_recovery
from funke.common.streaming.microbatch import (
    AvailableNow,
    CaptureTargets,
    CommitLogged,
    CommitBatch,
    InputCounted,
    MicroBatchCoordinator,
    OffsetsAnswered,
    OffsetsLogged,
    Once,
    OutputCompleted,
    OutputStarted,
    ProcessingTime,
    Publish,
    QueryOffsets,
    StartBatch,
    SetTimer,
    SinksCommitted,
    Started,
    StopRequested,
    TargetsCaptured,
    Terminate,
    Tick,
    WriteCommitLog,
    WriteOffsetLog,
    aligned_after,
)
from funke.common.states import BatchPhase, QueryMode, QueryState

SINKS = ("sink-a", "sink-b")


@dataclass
class World:
    """Carries out a coordinator's actions. Sources are row counters (offset = rows so far);
    `limit` rows per source per trigger."""
    coordinator: MicroBatchCoordinator
    available: dict[str, int]
    limit: int | None = None
    now: int = 0
    pending: list = field(default_factory=list)  # actions whose completion is still to come
    offsets: dict[int, OffsetEntry] = field(default_factory=dict)
    commits: list[int] = field(default_factory=list)
    committed_sinks: list[int] = field(default_factory=list)
    events: list[Publish] = field(default_factory=list)
    timer: int | None = None
    log: list = field(default_factory=list)  # every action, in order
    terminated: str = ""
    counts: dict[str, int] | None = None  # rows the sources' tasks count while running a batch

    def feed(self, event) -> None:
        for action in self.coordinator.handle(event):
            self.log.append(action)
            match action:
                case Publish():
                    self.events.append(action)
                case SetTimer(at_ms=at):
                    self.timer = at
                case Terminate(reason=reason):
                    self.terminated = reason
                case StartBatch(entry=entry):
                    assert entry.batch_id in self.offsets, f"batch {entry.batch_id} runs before its offsets are logged"
                    assert self.offsets[entry.batch_id] == entry
                    self.pending.append(action)
                case _:
                    self.pending.append(action)

    def range_for(self, source: str, start, limited: bool, cap) -> SourceRange:
        begin = start or 0
        end = self.available[source]
        if limited and self.limit is not None:
            end = min(end, begin + self.limit)
        if cap is not None:
            end = min(end, cap)
        end = max(end, begin)
        return SourceRange(start, end if end != begin or start is not None else start, end - begin)

    def complete(self, index: int = 0) -> None:
        action = self.pending.pop(index)
        now = self.now
        match action:
            case QueryOffsets(batch_id=b, starts=starts, limited=limited, caps=caps):
                ranges = {s: self.range_for(s, starts[s], limited, (caps or {}).get(s)) for s in starts}
                self.feed(OffsetsAnswered(b, ranges, now))
            case CaptureTargets(starts=starts):
                self.feed(TargetsCaptured({s: self.available[s] for s in starts}, now))
            case WriteOffsetLog(entry=entry):
                assert entry.batch_id not in self.offsets
                self.offsets[entry.batch_id] = entry
                self.feed(OffsetsLogged(entry.batch_id, now))
            case StartBatch(entry=entry):
                for source, rows in (self.counts or {}).items():
                    self.feed(InputCounted(entry.batch_id, source, rows, now))
                for sink in SINKS:
                    self.feed(OutputStarted(entry.batch_id, sink, now))
                for sink in SINKS:
                    self.feed(OutputCompleted(entry.batch_id, sink, now))
            case CommitBatch(batch_id=b):
                self.committed_sinks.append(b)
                self.feed(SinksCommitted(b, now))
            case WriteCommitLog(entry=entry):
                self.commits.append(entry.batch_id)
                self.feed(CommitLogged(entry.batch_id, now))

    def settle(self) -> None:
        while self.pending:
            self.complete()

    def advance(self, ms: int) -> None:
        self.now += ms
        if self.timer is not None and self.now >= self.timer:
            self.feed(Tick(self.now))


def coordinator(trigger, sources=("rate",), **kw) -> MicroBatchCoordinator:
    return MicroBatchCoordinator("query-1", "run-1", trigger, sources, SINKS, **kw)


def committed_rows(world: World, source: str) -> list[int]:
    """Every offset the committed batches read from `source`, in order."""
    rows = []
    for b in world.commits:
        r = world.offsets[b].sources[source]
        rows += list(range(r.start or 0, r.end or 0))
    return rows


def kinds(world: World, batch_id: int) -> list[str]:
    return [e.kind for e in world.events if e.batch_id == batch_id]


# ---------------------------------------------------------------------------------------- triggers


def test_processing_time_batches_start_on_aligned_times_and_log_before_they_run():
    w = World(coordinator(ProcessingTime(1000)), {"rate": 0}, now=12_345)
    w.feed(Started(w.now))
    assert w.timer == 13_000 == aligned_after(12_345, 1000)
    w.available["rate"] = 50
    w.advance(700)  # 13 045: the first batch, for time 13 000
    (query,) = w.pending
    assert isinstance(query, QueryOffsets) and query.batch_time_ms == 13_000 and query.starts == {"rate": None}
    w.settle()
    assert w.commits == [0] and w.offsets[0].sources["rate"] == SourceRange(None, 50, 50)
    order = [type(a).__name__ for a in w.log if not isinstance(a, (Publish, SetTimer))]
    assert order == ["QueryOffsets", "WriteOffsetLog", "StartBatch", "CommitBatch", "WriteCommitLog"]
    assert kinds(w, 0) == ["BatchSubmitted", "BatchStarted", "OutputOperationStarted", "OutputOperationStarted",
                           "OutputOperationCompleted", "OutputOperationCompleted", "BatchCompleted", "QueryProgress"]
    progress = w.coordinator.progress[-1]
    assert progress["batchId"] == 0 and progress["numInputRows"] == 50 and progress["id"] == "query-1"
    assert progress["runId"] == "run-1" and progress["schedulingDelayMs"] == 45
    assert set(progress["durationMs"]) == {"latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution"}
    (source,) = progress["sources"]
    assert source == {"description": "rate", "startOffset": None, "endOffset": 50, "numInputRows": 50,
                      "inputRowsPerSecond": 0.0,  # no trigger before the first
                      "processedRowsPerSecond": progress["processedRowsPerSecond"]}
    assert progress["timestamp"].endswith("Z")
    # nothing new: the next trigger is skipped, nothing logged, the id is not used up
    w.advance(1000)
    w.settle()
    assert sorted(w.offsets) == [0] and w.coordinator.next_batch_id == 1
    w.available["rate"] = 80
    w.advance(1000)
    w.settle()
    assert w.commits == [0, 1] and w.offsets[1].sources["rate"] == SourceRange(50, 80, 30)
    assert committed_rows(w, "rate") == list(range(80))
    second = w.coordinator.progress[-1]
    assert second["inputRowsPerSecond"] > 0  # a source's rates are the record's when it is the only one
    assert {k: second["sources"][0][k] for k in ("inputRowsPerSecond", "processedRowsPerSecond")} == \
        {k: second[k] for k in ("inputRowsPerSecond", "processedRowsPerSecond")}


def plan_and_log(w: World) -> None:
    """Complete the pending source queries and offset log writes (not runs or commits)."""
    while any(isinstance(a, (QueryOffsets, WriteOffsetLog)) for a in w.pending):
        w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, (QueryOffsets, WriteOffsetLog))))


def logged_ahead(w: World) -> int:
    """Batches whose offsets are logged and whose commit is not."""
    return len(set(w.offsets) - set(w.commits))


@pytest.mark.parametrize("concurrent", [1, 2])
def test_a_slow_batch_holds_the_queue_at_concurrent_jobs_plus_one_and_the_next_batch_takes_what_piled_up(concurrent):
    w = World(coordinator(ProcessingTime(100), concurrent_jobs=concurrent), {"rate": 0})
    w.feed(Started(0))
    for step in range(1, 9):  # eight triggers while the batches never finish running
        w.available["rate"] = step * 10
        w.advance(100)
        plan_and_log(w)
    phases = {b.batch_id: b.phase.state for b in w.coordinator.batches.values()}
    # concurrent_jobs running, one more logged and waiting: no batch per trigger piling up
    assert phases == {**{b: BatchPhase.RUNNING for b in range(concurrent)}, concurrent: BatchPhase.QUEUED}
    assert sorted(w.offsets) == list(range(concurrent + 1)) == sorted(set(w.offsets) - set(w.commits))
    ends = [w.offsets[b].sources["rate"].end for b in sorted(w.offsets)]
    assert ends == [10 * (b + 1) for b in range(concurrent + 1)]  # one interval's rows each, planned in time
    # Batch 0 is through: the next one is planned at once (its trigger is due since 200 ms), and
    # takes every row that piled up meanwhile, as Structured Streaming plans its next batch
    w.available["rate"] = 95
    w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, StartBatch) and a.entry.batch_id == 0))
    while not any(isinstance(a, QueryOffsets) for a in w.pending):
        w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, (CommitBatch, WriteCommitLog))))
    query = next(a for a in w.pending if isinstance(a, QueryOffsets))
    assert query.batch_id == concurrent + 1 and query.batch_time_ms == 800  # the last trigger missed
    plan_and_log(w)
    assert w.offsets[concurrent + 1].sources["rate"] == SourceRange(10 * (concurrent + 1), 95, 95 - 10 * (concurrent + 1))
    assert logged_ahead(w) == concurrent + 1
    w.settle()
    assert w.commits == list(range(concurrent + 2)) and committed_rows(w, "rate") == list(range(95))
    # the batch that waited in the queue shows it in its scheduling delay
    assert w.coordinator.progress[concurrent]["schedulingDelayMs"] == 800 - 100 * (concurrent + 1)


def test_a_batch_planned_after_a_slow_one_stays_within_the_per_trigger_limit():
    w = World(coordinator(ProcessingTime(100)), {"rate": 0}, limit=15)
    w.feed(Started(0))
    for step in range(1, 6):
        w.available["rate"] = step * 10
        w.advance(100)
        plan_and_log(w)
    assert sorted(w.offsets) == [0, 1]
    w.available["rate"] = 200
    w.settle()  # batch 0 through: batch 2 planned at once, within the limit
    assert w.offsets[2].sources["rate"] == SourceRange(20, 35, 15)
    assert sorted(w.offsets) == [0, 1, 2]  # no trigger since: nothing more until the next one
    while w.timer is not None and w.coordinator.next_batch_id < 6:
        w.advance(100)
        w.settle()
    assert [w.offsets[b].sources["rate"].rows for b in (3, 4, 5)] == [15, 15, 15]


def test_available_now_keeps_at_most_concurrent_jobs_plus_one_batches_logged_ahead():
    w = World(coordinator(AvailableNow()), {"rate": 10}, limit=1)
    w.feed(Started(0))
    ahead = []
    while w.pending:
        w.complete()  # first come, first done: the sources answer before the batches run
        ahead.append(logged_ahead(w))
    assert w.terminated.startswith("available-now") and w.commits == list(range(10))
    assert max(ahead) == 2, ahead


def test_ticks_missed_while_the_shell_was_busy_fold_into_one_batch():
    w = World(coordinator(ProcessingTime(100)), {"rate": 5})
    w.feed(Started(0))
    w.advance(450)  # ticks at 100, 200, 300, 400 were due
    queries = [a for a in w.pending if isinstance(a, QueryOffsets)]
    assert [q.batch_time_ms for q in queries] == [400] and w.timer == 500


def test_available_now_processes_what_was_there_at_the_start_within_the_limits_then_ends():
    w = World(coordinator(AvailableNow(), sources=("a", "b")), {"a": 25, "b": 7}, limit=10)
    w.feed(Started(0))
    assert isinstance(w.pending[0], CaptureTargets)
    w.complete()  # the targets: a up to 25, b up to 7
    w.available["a"] = 1000  # arrives after the start: not this run's
    w.settle()
    assert w.terminated.startswith("available-now") and w.coordinator.state.state is QueryState.TERMINATED
    assert [w.offsets[b].sources["a"].end for b in w.commits] == [10, 20, 25]
    assert committed_rows(w, "a") == list(range(25)) and committed_rows(w, "b") == list(range(7))


def test_once_runs_one_batch_of_everything_without_limits_and_an_empty_source_ends_at_once():
    w = World(coordinator(Once()), {"rate": 500}, limit=10)
    w.feed(Started(0))
    w.settle()
    assert w.commits == [0] and w.offsets[0].sources["rate"].end == 500 and w.terminated.startswith("once")
    empty = World(coordinator(Once()), {"rate": 0})
    empty.feed(Started(0))
    empty.settle()
    assert empty.commits == [] and empty.offsets == {} and empty.terminated


# ---------------------------------------------------------------------------------------- stop


def test_stop_finishes_the_running_batch_defers_the_queued_ones_and_plans_nothing_more():
    w = World(coordinator(ProcessingTime(100)), {"rate": 0})
    w.feed(Started(0))
    for step in (1, 2):
        w.available["rate"] = step * 10
        w.advance(100)
        while any(isinstance(a, (QueryOffsets, WriteOffsetLog)) for a in w.pending):
            w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, (QueryOffsets, WriteOffsetLog))))
    w.feed(StopRequested(drain=False, now_ms=w.now))
    assert w.coordinator.state.state is QueryState.STOPPING and not w.terminated
    w.available["rate"] = 999
    w.advance(1000)  # no trigger while stopping
    w.settle()
    assert w.commits == [0] and sorted(w.offsets) == [0, 1]  # batch 1 logged, not run: the next run runs it
    assert w.terminated == "stopped"
    assert plan_recovery(list(w.offsets), w.commits).rerun == (1,)


def test_a_stop_while_the_sources_are_asked_logs_nothing():
    w = World(coordinator(ProcessingTime(100)), {"rate": 10})
    w.feed(Started(0))
    w.advance(100)
    w.feed(StopRequested(drain=False, now_ms=w.now))
    w.settle()
    assert w.offsets == {} and w.terminated == "stopped"


def test_a_draining_stop_processes_everything_there_at_the_stop_then_ends():
    w = World(coordinator(ProcessingTime(100)), {"rate": 0}, limit=10)
    w.feed(Started(0))
    w.available["rate"] = 35
    w.advance(100)
    w.feed(StopRequested(drain=True, now_ms=w.now))
    w.settle()
    assert w.terminated == "stopped after draining"
    assert committed_rows(w, "rate") == list(range(35)) and w.commits == [0, 1, 2, 3]


def modes(w: World) -> list[QueryMode]:
    return [QueryMode.STARTING] + [t.to_state for t in w.coordinator.mode.history]


def test_the_trigger_picks_the_first_mode_and_stops_and_ends_follow_the_mode_table():
    cases = [(ProcessingTime(100), True, [QueryMode.TRIGGERED, QueryMode.DRAINING, QueryMode.ENDED]),
             (ProcessingTime(100), False, [QueryMode.TRIGGERED, QueryMode.STOPPING, QueryMode.ENDED]),
             (AvailableNow(), None, [QueryMode.CAPTURING, QueryMode.BOUNDED, QueryMode.ENDED]),
             (Once(), None, [QueryMode.BOUNDED, QueryMode.ENDED]),
             (AvailableNow(), True, [QueryMode.CAPTURING, QueryMode.STOPPING, QueryMode.ENDED])]  # no drain
    for trigger, drain, expected in cases:
        w = World(coordinator(trigger), {"rate": 30}, limit=10)
        w.feed(Started(0))
        if drain is not None:
            w.feed(StopRequested(drain=drain, now_ms=w.now))
        w.settle()
        assert w.terminated and modes(w) == [QueryMode.STARTING] + expected, (trigger, drain)


def test_a_draining_stop_under_a_backlog_runs_the_logged_batches_then_one_of_everything_left():
    w = World(coordinator(ProcessingTime(100)), {"rate": 0})
    w.feed(Started(0))
    for step in range(1, 9):  # batch 0 stuck while eight triggers pass
        w.available["rate"] = step * 10
        w.advance(100)
        plan_and_log(w)
    w.available["rate"] = 500
    w.feed(StopRequested(drain=True, now_ms=w.now))
    w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, CaptureTargets)))  # the stop's targets
    w.available["rate"] = 900  # after the stop: not this run's
    w.settle()
    assert w.terminated == "stopped after draining"
    assert w.commits == [0, 1, 2] and w.offsets[2].sources["rate"] == SourceRange(20, 500, 480)
    assert committed_rows(w, "rate") == list(range(500))


def test_what_a_stop_will_do_is_said_before_it_is_asked():
    w = World(coordinator(ProcessingTime(100)), {"rate": 0})
    w.feed(Started(0))
    assert w.coordinator.stop_outlook(drain=False).describe() == "no batch is in flight; then the query ends FINISHED"
    for step in range(1, 4):
        w.available["rate"] = step * 10
        w.advance(100)
        plan_and_log(w)
    outlook = w.coordinator.stop_outlook(drain=False)
    assert (outlook.finishing, outlook.logged, outlook.drain) == ((0,), (1,), False)
    assert outlook.describe() == ("batch 0 in flight finishes and commits; batch 1, logged and not started, is not "
                                  "run (it stays in the offset log: the query's next run runs it first); "
                                  "then the query ends FINISHED")
    assert w.coordinator.stop_outlook(drain=True).describe() == (
        "the 2 logged batches (0, 1) run and commit, then what the sources hold now, in batches within the "
        "per-trigger limits; then the query ends FINISHED")
    w.feed(StopRequested(drain=False, now_ms=w.now))
    w.settle()  # as it said
    assert w.commits == [0] and sorted(w.offsets) == [0, 1] and w.terminated == "stopped"
    wide = World(coordinator(ProcessingTime(100), concurrent_jobs=2), {"rate": 0})
    wide.feed(Started(0))
    for step in range(1, 5):
        wide.available["rate"] = step * 10
        wide.advance(100)
        plan_and_log(wide)
    assert wide.coordinator.stop_outlook(drain=False).describe().startswith(
        "batches 0, 1 in flight finish and commit; batch 2, logged and not started, is not run")
    once = World(coordinator(AvailableNow()), {"rate": 5}, limit=1)
    once.feed(Started(0))
    plan_and_log(once)
    assert once.coordinator.stop_outlook(drain=True).drain is False  # available-now does not drain on a stop
    assert "(draining does not apply to an available-now or once trigger)" in once.coordinator.stop_outlook(
        drain=True).describe()


# ---------------------------------------------------------------------------------------- recovery


def test_a_restarted_run_reruns_the_logged_batches_with_their_ranges_first_then_goes_on():
    logged = [OffsetEntry(5, 900, {"rate": SourceRange(40, 50, 10)}), OffsetEntry(6, 1000, {"rate": SourceRange(50, 55, 5)})]
    w = World(coordinator(ProcessingTime(100), next_batch_id=7, logged=logged, last_ends={"rate": 55}), {"rate": 70},
              now=2000)
    w.offsets.update({e.batch_id: e for e in logged})
    w.feed(Started(w.now))
    assert [a for a in w.pending if isinstance(a, StartBatch)] == [StartBatch(logged[0])]  # in order, one at a time
    submitted = [e for e in w.events if e.kind == "BatchSubmitted"]
    assert [e.batch_id for e in submitted] == [5, 6] and all(e.info["rerun"] for e in submitted)
    w.advance(100)
    w.settle()
    assert w.commits == [5, 6, 7] and w.offsets[7].sources["rate"] == SourceRange(55, 70, 15)
    assert [p["rerun"] for p in w.coordinator.progress] == [True, True, False]


def test_a_wrong_answer_from_the_sources_is_refused():
    w = World(coordinator(ProcessingTime(100)), {"rate": 10})
    w.feed(Started(0))
    w.advance(100)
    with pytest.raises(ValueError, match="other start"):
        w.coordinator.handle(OffsetsAnswered(0, {"rate": SourceRange(3, 10, 7)}, 100))


def test_a_query_needs_sources_and_sinks_and_a_positive_interval():
    with pytest.raises(ValueError):
        MicroBatchCoordinator("q", "r", ProcessingTime(100), (), SINKS)
    with pytest.raises(ValueError):
        ProcessingTime(0)
    with pytest.raises(ValueError):
        coordinator(ProcessingTime(10), concurrent_jobs=0)


# ---------------------------------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), concurrent=st.integers(1, 3), limit=st.one_of(st.none(), st.integers(1, 20)),
       stop_at=st.integers(5, 60), drain=st.booleans())
def test_any_order_of_io_completions_keeps_the_logs_contiguous_and_commits_every_offset_once(
        seed, concurrent, limit, stop_at, drain):
    rng = random.Random(seed)
    w = World(coordinator(ProcessingTime(100), sources=("a", "b"), concurrent_jobs=concurrent),
              {"a": 0, "b": 0}, limit=limit)
    w.feed(Started(0))
    for step in range(80):
        if rng.random() < 0.3:
            w.available[rng.choice("ab")] += rng.randint(0, 15)
        if step == stop_at:
            w.feed(StopRequested(drain=drain, now_ms=w.now))
        if w.pending and rng.random() < 0.7:
            w.complete(rng.randrange(len(w.pending)))
        else:
            w.advance(rng.randint(1, 150))
        assert logged_ahead(w) <= concurrent + 1, "more batches logged ahead than concurrentJobs + 1"
    w.settle()
    assert w.terminated and w.coordinator.finished
    # the write-ahead rule is checked in World.feed; the logs are contiguous and in order
    ids = sorted(w.offsets)
    assert ids == list(range(len(ids)))
    assert w.commits == list(range(len(w.commits))) and w.committed_sinks == w.commits
    for source in "ab":
        ends = [None] + [w.offsets[b].sources[source].end for b in ids]
        assert all(w.offsets[b].sources[source].start == ends[i] for i, b in enumerate(ids))
        rows = committed_rows(w, source)
        assert rows == list(range(len(rows)))  # every offset once, none skipped
        if limit is not None:
            assert all(w.offsets[b].sources[source].rows <= limit for b in ids)
    # what was logged and not committed is exactly what the next run would run again
    assert plan_recovery(ids, w.commits).rerun == tuple(b for b in ids if b not in w.commits)
    if drain:
        assert not [b for b in ids if b not in w.commits]
    for b in w.commits:
        order = kinds(w, b)
        assert order.index("BatchSubmitted") < order.index("BatchStarted") < order.index("OutputOperationStarted")
        assert order.index("OutputOperationCompleted") < order.index("BatchCompleted") < order.index("QueryProgress")


def test_rows_counted_while_a_batch_runs_are_its_progress_records_input_rows():
    # a file source's range holds files, not rows (rows=0): what its tasks counted is the figure
    w = World(coordinator(ProcessingTime(1000), sources=("files",)), {"files": 0}, counts={"files": 1234})
    w.feed(Started(0))
    w.available["files"] = 3
    w.advance(1000)
    w.settle()
    progress = w.coordinator.progress[-1]
    assert w.offsets[0].sources["files"].rows == 3  # this test's source counts offsets as rows
    assert progress["numInputRows"] == 1234 and progress["sources"][0]["numInputRows"] == 1234
    # a count for a source the query does not have, or a negative one, changes nothing
    w.counts = {"files": -5, "other": 99}
    w.available["files"] = 5
    w.advance(1000)
    w.settle()
    assert w.coordinator.progress[-1]["numInputRows"] == 2
