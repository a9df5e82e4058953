"""Event time in a streaming query (common/streaming/eventtime.py and where it is carried): which
windows a row is in and when one is closed; how the query's watermark moves; the watermark in
the offset log; the micro-batch coordinator logging it with each batch, running a batch again
with exactly its logged watermark, and running a batch without new data when it moved; the
query run passing the tasks' event times on; the wire; and what the DSL and the graph's checks
refuse."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.executiongraph import ExecutionAttemptId, TaskIo
from funke.common.graph.streamingjob import event_time_settings
from funke.common.graph.validation import JobGraphInvalid
from funke.common.scheduling import queryrun as qr
from funke.common.streaming import microbatch as mb
from funke.common.streaming.checkpoint import (
    CommitEntry,
    OffsetEntry,
    SourceRange,
    commit_entry_bytes,
    offset_entry_bytes,
    parse_commit_entry,
    parse_offset_entry,
)
from funke.common.streaming.eventtime import (
    MAX_WINDOWS_PER_ROW,
    EventTimeStats,
    WatermarkTracker,
    WindowSpec,
    fold_stats,
    is_late,
    operator_id,
    window_problem,
    windows_of,
)
from funke.common.streaming.microbatch import (
    EventTimeObserved,
    ProcessingTime,
    QueryOffsets,
    StartBatch,
    Started,
    WriteOffsetLog,
)
from funke.common.streaming.progress import iso_ms
from funke.common.streaming.sources import BatchInput
from funke.common.wire.codec import batch_from_proto, io_from_proto, io_to_proto, run_batch_to_proto
from funke.v1 import job_pb2 as job_pb
from tests.unit.test_microbatch import World, coordinator
from tests.unit.test_queryrun import _graph, _of

# ------------------------------------------------------------------------------------ windows


@pytest.mark.parametrize("ts, expected", [
    (12_345, [(10_000, 20_000)]),
    (10_000, [(10_000, 20_000)]),  # on a boundary: the window it starts
    (19_999, [(10_000, 20_000)]),
    (0, [(0, 10_000)]),
    (-1, [(-10_000, 0)]),  # before the epoch: still aligned to it
    (-10_000, [(-10_000, 0)]),
    (-10_001, [(-20_000, -10_000)]),
])
def test_a_tumbling_window_holds_each_row_once_aligned_to_the_epoch(ts, expected):
    assert windows_of(ts, WindowSpec(10_000, 10_000)) == expected


@pytest.mark.parametrize("ts, size, slide, expected", [
    (5, 10, 5, [(0, 10), (5, 15)]),  # on a boundary: the window it starts is the last
    (4, 10, 5, [(-5, 5), (0, 10)]),
    (-5, 10, 5, [(-10, 0), (-5, 5)]),
    (9, 10, 4, [(0, 10), (4, 14), (8, 18)]),  # a size that is not a multiple of the slide
    (10, 10, 4, [(4, 14), (8, 18)]),
])
def test_a_sliding_window_holds_a_row_in_every_window_that_spans_it_earliest_first(ts, size, slide, expected):
    assert windows_of(ts, WindowSpec(size, slide)) == expected


@given(ts=st.integers(-10**7, 10**7), slide=st.integers(1, 60), times=st.integers(1, 12), extra=st.integers(0, 59))
def test_windows_of_are_exactly_the_epoch_aligned_windows_that_hold_the_row(ts, slide, times, extra):
    size = slide * times + min(extra, slide - 1)
    expected = [(k * slide, k * slide + size) for k in range((ts - size) // slide, ts // slide + 1)
                if k * slide <= ts < k * slide + size]
    assert windows_of(ts, WindowSpec(size, slide)) == expected


def test_a_window_is_closed_once_the_watermark_reaches_its_end_plus_the_allowed_lateness():
    assert is_late(10_000, 0, 10_000) and not is_late(10_000, 0, 9_999)
    assert not is_late(10_000, 500, 10_499) and is_late(10_000, 500, 10_500)
    assert not is_late(10_000, 0, None)  # no watermark yet: nothing is late
    assert is_late(-10_000, 0, -5_000)


@pytest.mark.parametrize("size, slide, lateness, message", [
    (10_000, 20_000, 0, "slide (20000 ms) must not be longer than its size (10000 ms)"),
    (0, 0, 0, "positive size and slide, got size 0 ms, slide 0 ms"),
    (10_000, 0, 0, "positive size and slide"),
    (MAX_WINDOWS_PER_ROW + 1, 1, 0, f"each row in {MAX_WINDOWS_PER_ROW + 1} windows; at most {MAX_WINDOWS_PER_ROW}"),
    (-1, 1, 0, "size must be between 0 and ten years, got -1 ms"),
    (10, 10, -1, "allowed lateness must be between 0 and ten years"),
    ("10 s", 10, 0, "size must be a whole number of milliseconds, got '10 s'"),
    (10, True, 0, "slide must be a whole number of milliseconds, got True"),
])
def test_window_problems_say_what_is_wrong(size, slide, lateness, message):
    problem = window_problem(size, slide, lateness)
    assert problem is not None and message in problem, problem
    with pytest.raises(ValueError, match="window"):
        WindowSpec(size, slide, lateness)


def test_windows_at_the_limits_have_no_problem():
    assert window_problem(MAX_WINDOWS_PER_ROW, 1) is None
    assert window_problem(10_000, 10_000, 0) is None
    assert WindowSpec(10, 5, 3).lateness_ms == 3


# ------------------------------------------------------------------------------------ the watermark


def test_the_watermark_is_the_smallest_of_the_operators_by_default_and_the_largest_with_max():
    for policy, expected in (("min", 4_900), ("max", 5_000)):
        tracker = WatermarkTracker({"a/0": 100, "b/0": 1_000}, policy)
        tracker.observe("a/0", EventTimeStats(1_000, 5_000, 6_000.0, 2))
        tracker.observe("b/0", EventTimeStats(2_000, 6_000, 8_000.0, 2))
        assert tracker.advance() == expected == tracker.watermark_ms, policy


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="min, max"):
        WatermarkTracker({"a/0": 0}, "median")


def test_the_watermark_never_goes_back():
    tracker = WatermarkTracker({"a/0": 100, "b/0": 100})
    tracker.observe("a/0", EventTimeStats(1_000, 5_000, 6_000.0, 2))
    assert tracker.advance() == 4_900
    tracker.observe("a/0", EventTimeStats(100, 2_000, 2_100.0, 2))  # older rows: the operator's max stays
    assert tracker.maxes == {"a/0": 5_000}
    # an operator seeing its first rows far behind lowers the minimum, not the watermark
    tracker.observe("b/0", EventTimeStats(100, 1_000, 1_100.0, 2))
    assert tracker.advance() == 4_900
    tracker.observe("b/0", EventTimeStats(7_000, 9_000, 16_000.0, 2))
    assert tracker.advance() == 4_900  # min(5000, 9000) - 100
    tracker.observe("a/0", EventTimeStats(7_000, 8_000, 15_000.0, 2))
    assert tracker.advance() == 7_900


def test_unknown_operators_and_operators_without_rows_do_not_move_or_hold_the_watermark():
    tracker = WatermarkTracker({"a/0": 0, "b/0": 0})
    assert tracker.advance() is None  # nothing seen
    tracker.observe("gone/3", EventTimeStats(1, 10**12, 1.0, 1))  # from a graph that has changed
    tracker.observe("b/0", EventTimeStats())  # rows without event time
    assert tracker.maxes == {} and tracker.advance() is None
    tracker.observe("a/0", EventTimeStats(100, 3_000, 3_100.0, 2))
    assert tracker.advance() == 3_000  # b has seen no row: it does not hold the minimum at nothing


def test_a_tracker_restored_from_the_log_goes_on_from_its_maxes_and_its_watermark():
    restored = WatermarkTracker({"a/0": 100}, "min", {"a/0": 5_000, "removed/0": 9_999}, 4_000)
    assert restored.maxes == {"a/0": 5_000}  # an operator no longer in the graph is forgotten
    assert restored.advance() == 4_900
    ahead = WatermarkTracker({"a/0": 100}, "min", {"a/0": 5_000}, 6_000)
    assert ahead.advance() == 6_000  # never below the logged one
    ahead.observe("a/0", EventTimeStats(6_000, 7_000, 13_000.0, 2))
    assert ahead.advance() == 6_900


def test_event_time_stats_add_up_over_subtasks_and_operators():
    a = EventTimeStats(1_000, 3_000, 4_000.0, 2)
    b = EventTimeStats(500, 2_000, 2_500.0, 2)
    assert a + b == EventTimeStats(500, 3_000, 6_500.0, 4) and (a + b).avg_ms == 1_625
    assert a + EventTimeStats() == a and EventTimeStats().avg_ms is None
    assert fold_stats([{"v/1": a}, {"v/1": b, "w/0": a}]) == {"v/1": a + b, "w/0": a}
    assert operator_id("v", 2) == "v/2"


# ------------------------------------------------------------------------------------ the offset log


def test_an_offset_entry_keeps_its_watermark_and_event_time_maxes_through_the_log():
    for watermark in (1_700_000_000_000, 0, -1_500):  # 0 and before the epoch are watermarks too
        entry = OffsetEntry(4, 1_000, {"rate": SourceRange(10, 20, 10)}, watermark, {"v/2": 1_700_000_001_000})
        data = offset_entry_bytes(entry)
        body = json.loads(data.decode().partition("\n")[2])
        assert body["watermarkMs"] == watermark and body["eventTimeMaxMs"] == {"v/2": 1_700_000_001_000}
        assert parse_offset_entry(data, 4) == entry


def test_an_offset_entry_without_a_watermark_stays_without_and_old_entries_still_read():
    entry = OffsetEntry(4, 1_000, {"rate": SourceRange(10, 20, 10)})
    data = offset_entry_bytes(entry)
    body = json.loads(data.decode().partition("\n")[2])
    assert "watermarkMs" not in body and "eventTimeMaxMs" not in body
    assert parse_offset_entry(data, 4) == entry
    old = b'v1\n{"batchId": 4, "batchTimestampMs": 1000, "sources": {"rate": {"start": 10, "end": 20, "rows": 10}}}'
    parsed = parse_offset_entry(old, 4)
    assert parsed == entry and parsed.watermark_ms is None and parsed.event_time_max == {}


# ------------------------------------------------------------------------------------ the coordinator

OP = "events/2"  # the query's watermark operator
DELAY = 300
BASE_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
STEP_MS = 100


def event_ms(offset: int) -> int:
    """The event time of the rate source's row at `offset`."""
    return BASE_MS + offset * STEP_MS


def stats_of(start: int, end: int) -> EventTimeStats:
    """The event times of the rows at offsets start .. end - 1."""
    times = [event_ms(i) for i in range(start, end)]
    return EventTimeStats(min(times), max(times), float(sum(times)), len(times)) if times else EventTimeStats()


def tracker(**kw) -> WatermarkTracker:
    return WatermarkTracker({OP: DELAY}, **kw)


@dataclass
class EventWorld(World):
    """A World whose batches' two subtasks each report the event times of half the batch's rows
    (from its offsets) when the batch runs; `late`: batch -> rows its windows found late."""
    late: dict[int, int] = field(default_factory=dict)

    def complete(self, index: int = 0) -> None:
        action = self.pending[index]
        if isinstance(action, StartBatch):
            b, r = action.entry.batch_id, action.entry.sources["rate"]
            start, end = r.start or 0, r.end or 0
            middle, late = (start + end) // 2, self.late.get(b, 0)
            for lo, hi, n in ((start, middle, late // 2), (middle, end, late - late // 2)):
                self.feed(EventTimeObserved(b, {OP: stats_of(lo, hi)}, n, self.now))
        super().complete(index)


def plan_and_log(w: World) -> None:
    """Complete the pending source queries and offset log writes (not runs or commits)."""
    while any(isinstance(a, (QueryOffsets, WriteOffsetLog)) for a in w.pending):
        w.complete(next(i for i, a in enumerate(w.pending) if isinstance(a, (QueryOffsets, WriteOffsetLog))))


def test_each_batch_logs_the_largest_event_time_seen_before_it_minus_the_delay():
    w = EventWorld(coordinator(ProcessingTime(1000), watermarks=tracker()), {"rate": 10})
    w.feed(Started(0))
    w.advance(1000)
    w.settle()
    assert w.offsets[0].watermark_ms is None and w.offsets[0].event_time_max == {}  # nothing seen before it
    w.available["rate"] = 25
    w.advance(1000)
    w.settle()
    assert w.offsets[1].watermark_ms == event_ms(9) - DELAY and w.offsets[1].event_time_max == {OP: event_ms(9)}
    w.available["rate"] = 30
    w.advance(1000)
    w.settle()
    assert w.offsets[2].watermark_ms == event_ms(24) - DELAY and w.offsets[2].event_time_max == {OP: event_ms(24)}
    assert w.commits == [0, 1, 2]


def test_a_coordinator_without_a_tracker_logs_no_watermark_even_when_told_of_event_times():
    w = EventWorld(coordinator(ProcessingTime(1000)), {"rate": 10})
    w.feed(Started(0))
    for _ in range(2):
        w.available["rate"] += 10
        w.advance(1000)
        w.settle()
    assert [w.offsets[b].watermark_ms for b in (0, 1)] == [None, None]
    assert all("eventTime" not in p and "numLateRows" not in p for p in w.coordinator.progress)


def test_batches_run_again_after_a_restart_run_with_exactly_their_logged_watermarks():
    first = EventWorld(coordinator(ProcessingTime(1000), watermarks=tracker()), {"rate": 10})
    first.feed(Started(0))
    first.advance(1000)
    first.settle()  # batch 0: rows 0-9, committed
    first.available["rate"] = 20
    first.advance(1000)
    plan_and_log(first)  # batch 1 logged and running: its tasks report their event times, then the run dies
    first.feed(EventTimeObserved(1, {OP: stats_of(10, 20)}, 0, first.now))
    first.available["rate"] = 30
    first.advance(1000)
    plan_and_log(first)  # batch 2 logged while batch 1 runs, with the watermark batch 1's rows moved
    assert sorted(first.offsets) == [0, 1, 2] and first.commits == [0]
    w1, w2 = first.offsets[1].watermark_ms, first.offsets[2].watermark_ms
    assert (w1, w2) == (event_ms(9) - DELAY, event_ms(19) - DELAY)

    # the next run reads the checkpoint: batches 1 and 2 again, the tracker from the last entry
    logged = [parse_offset_entry(offset_entry_bytes(first.offsets[b]), b) for b in (1, 2)]
    last = logged[-1]
    restored = tracker(maxes=dict(last.event_time_max), watermark_ms=last.watermark_ms)
    second = EventWorld(coordinator(ProcessingTime(1000), next_batch_id=3, logged=logged,
                                    last_ends={"rate": last.sources["rate"].end}, watermarks=restored),
                        {"rate": 30}, now=first.now + 5_000)
    second.offsets.update({e.batch_id: e for e in logged})
    second.feed(Started(second.now))
    second.settle()
    ran = [a.entry for a in second.log if isinstance(a, StartBatch)]
    assert [(e.batch_id, e.watermark_ms) for e in ran] == [(1, w1), (2, w2)]  # not the restored w2 for both
    assert second.commits == [1, 2]
    assert [p["eventTime"]["watermark"] for p in second.coordinator.progress] == [iso_ms(w1), iso_ms(w2)]
    second.available["rate"] = 35
    second.advance(1000)
    second.settle()
    assert second.offsets[3].watermark_ms == event_ms(29) - DELAY  # batch 2's rows, seen again, move it on


@pytest.mark.parametrize("no_data_batches", [True, False])
def test_a_watermark_that_moved_runs_a_batch_without_new_data_only_when_no_data_batches_are_on(no_data_batches):
    w = EventWorld(coordinator(ProcessingTime(1000), watermarks=tracker(), no_data_batches=no_data_batches),
                   {"rate": 10})
    w.feed(Started(0))
    w.advance(1000)
    w.settle()
    w.advance(1000)  # no new rows; batch 0's rows moved the watermark
    w.settle()
    if no_data_batches:
        assert sorted(w.offsets) == [0, 1] and w.commits == [0, 1]
        assert w.offsets[1].sources["rate"] == SourceRange(10, 10, 0)
        assert w.offsets[1].watermark_ms == event_ms(9) - DELAY
        record = w.coordinator.progress[-1]
        assert record["numInputRows"] == 0 and record["eventTime"] == {"watermark": iso_ms(event_ms(9) - DELAY)}
    else:
        assert sorted(w.offsets) == [0] and w.coordinator.next_batch_id == 1
    w.advance(1000)  # still nothing new, and the watermark where it was: no batch either way
    w.settle()
    assert len(w.offsets) == (2 if no_data_batches else 1)
    w.available["rate"] = 15
    w.advance(1000)
    w.settle()
    new = w.offsets[max(w.offsets)]
    assert new.sources["rate"] == SourceRange(10, 15, 5) and new.watermark_ms == event_ms(9) - DELAY


def test_no_data_batches_need_a_watermark_to_move():
    w = EventWorld(coordinator(ProcessingTime(1000), no_data_batches=True), {"rate": 10})
    w.feed(Started(0))
    for _ in range(3):
        w.advance(1000)
        w.settle()
    assert sorted(w.offsets) == [0]


def test_progress_records_carry_the_batchs_event_times_its_watermark_and_its_late_rows():
    w = EventWorld(coordinator(ProcessingTime(1000), watermarks=tracker()), {"rate": 10}, late={1: 5})
    w.feed(Started(0))
    w.advance(1000)
    w.settle()
    w.available["rate"] = 20
    w.advance(1000)
    w.settle()
    first, second = w.coordinator.progress
    # both subtasks' halves, added up; no watermark yet for the first batch
    assert first["eventTime"] == {"min": "2023-11-14T22:13:20.000Z", "max": "2023-11-14T22:13:20.900Z",
                                  "avg": "2023-11-14T22:13:20.450Z"}
    assert first["numLateRows"] == 0
    assert second["eventTime"] == {"min": iso_ms(event_ms(10)), "max": iso_ms(event_ms(19)),
                                   "avg": iso_ms(BASE_MS + 1_450), "watermark": "2023-11-14T22:13:20.600Z"}
    assert second["numLateRows"] == 5  # 2 + 3, from the two subtasks
    published = [e.info for e in w.events if e.kind == "QueryProgress"]
    assert [p["numLateRows"] for p in published] == [0, 5]


def test_event_times_of_a_batch_that_is_not_running_are_ignored():
    w = EventWorld(coordinator(ProcessingTime(1000), watermarks=tracker()), {"rate": 10})
    w.feed(Started(0))
    w.advance(1000)
    w.settle()
    w.feed(EventTimeObserved(0, {OP: EventTimeStats(0, 10**13, 1.0, 1)}, 9, w.now))  # batch 0 is done
    w.feed(EventTimeObserved(7, {OP: EventTimeStats(0, 10**13, 1.0, 1)}, 9, w.now))  # never planned
    w.available["rate"] = 20
    w.advance(1000)
    w.settle()
    assert w.offsets[1].watermark_ms == event_ms(9) - DELAY


# ------------------------------------------------------------------------------------ the query run

QR_OP = "src/1"


def event_run(**kw) -> qr.QueryRun:
    return qr.QueryRun(_graph(), mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-1",
                       watermark_delays={QR_OP: 1_000}, **kw)


def run_batch(run: qr.QueryRun, batch_id: int, now: int, span: SourceRange, reports: dict, extra=()):
    """Plan, log, run (the source subtasks reporting `reports`: subtask -> (event_time, late rows))
    and record one batch; `extra`: reports delivered before the real ones. Returns the logged
    entry, the source tasks' RunTasks and every action after them."""
    (write,) = _of(run.handle(qr.OffsetsAnswered(batch_id, {"src": span}, now, f"answered-{batch_id}")),
                   qr.WriteOffsetLog)
    run.handle(qr.OffsetsLogged(batch_id, now, f"logged-{batch_id}"))
    sent = run.handle(qr.BatchInputResolved(batch_id, {}, now, f"resolved-{batch_id}"))
    out: list = []
    for report in extra:
        out += run.handle(report)
    for action in sent:
        for task in action.tasks:
            event_time, late = reports[task.attempt.subtask_index]
            out += run.handle(qr.BatchWritten(task.attempt, batch_id, {}, 5, now + 100,
                                               f"report-{task.attempt}-{batch_id}", None, event_time, late))
    for action in list(out):
        if isinstance(action, qr.RunTasks) and action.vertex_id == "sink":
            (task,) = action.tasks
            out += run.handle(qr.BatchWritten(task.attempt, batch_id, {}, None, now + 200, f"report-sink-{batch_id}"))
    out += run.handle(qr.SinksCommitted(batch_id, now + 300, f"committed-{batch_id}"))
    out += run.handle(qr.CommitLogged(batch_id, now + 300, f"recorded-{batch_id}"))
    return write.entry, _of(sent, qr.RunTasks), out


def progress_of(actions) -> dict:
    (record,) = [a.info for a in _of(actions, qr.Publish) if a.kind == "QueryProgress"]
    return record


def test_a_query_run_moves_the_watermark_with_the_event_times_its_tasks_report():
    run = event_run()
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started"))
    run.handle(qr.Tick(1000, "tick-1000"))
    entry, sent, out = run_batch(run, 0, 1000, SourceRange(None, 10, 10), {
        0: ({QR_OP: EventTimeStats(5_000, 7_000, 24_000.0, 4)}, 1),
        1: ({QR_OP: EventTimeStats(4_000, 9_000, 39_000.0, 6)}, 2)})
    assert entry.watermark_ms is None and [a.batch.watermark_ms for a in sent] == [None, None]
    record = progress_of(out)
    assert record["numLateRows"] == 3
    assert record["eventTime"] == {"min": iso_ms(4_000), "max": iso_ms(9_000), "avg": iso_ms(6_300)}
    run.handle(qr.Tick(2000, "tick-2000"))
    entry, sent, out = run_batch(run, 1, 2000, SourceRange(10, 20, 10), {0: ({}, 0), 1: ({}, 0)})
    assert entry.watermark_ms == 8_000 and entry.event_time_max == {QR_OP: 9_000}
    assert [a.batch.watermark_ms for a in sent] == [8_000, 8_000]  # the tasks run the batch with it
    assert progress_of(out)["eventTime"] == {"watermark": iso_ms(8_000)} and progress_of(out)["numLateRows"] == 0


def test_a_query_run_goes_on_from_the_watermark_of_the_last_logged_entry():
    last = OffsetEntry(2, 3_000, {"src": SourceRange(20, 30, 10)}, 5_000, {QR_OP: 6_000})
    run = event_run()
    run.handle(qr.RunStarted("query-1", 3, (), {"src": 30}, 3_500, "run-started", last))
    run.handle(qr.Tick(4000, "tick-4000"))
    entry, sent, _ = run_batch(run, 3, 4000, SourceRange(30, 40, 10), {
        0: ({QR_OP: EventTimeStats(8_000, 9_500, 17_500.0, 2)}, 0), 1: ({}, 0)})
    assert (entry.watermark_ms, entry.event_time_max) == (5_000, {QR_OP: 6_000})
    assert [a.batch.watermark_ms for a in sent] == [5_000, 5_000]
    run.handle(qr.Tick(5000, "tick-5000"))
    entry, _, _ = run_batch(run, 4, 5000, SourceRange(40, 50, 10), {0: ({}, 0), 1: ({}, 0)})
    assert entry.watermark_ms == 8_500


def test_a_query_run_goes_on_from_the_event_times_its_last_committed_batch_saw():
    """The last offset entry holds the maxes seen before its batch; the batch's own rows moved
    them further, and its commit entry says how far: a run started after it goes on from there
    (its next batch closes what it would have closed without the restart)."""
    last = OffsetEntry(2, 3_000, {"src": SourceRange(20, 30, 10)}, 5_000, {QR_OP: 6_000})
    commit = CommitEntry(2, 3_400, {QR_OP: 9_000})
    assert parse_commit_entry(commit_entry_bytes(commit), 2) == commit
    assert b"eventTimeMaxMs" not in commit_entry_bytes(CommitEntry(2, 3_400))
    run = event_run(no_data_batches=True)
    run.handle(qr.RunStarted("query-1", 3, (), {"src": 30}, 3_500, "run-started", last, commit))
    run.handle(qr.Tick(4000, "tick-4000"))
    entry, _, _ = run_batch(run, 3, 4000, SourceRange(30, 30, 0), {0: ({}, 0), 1: ({}, 0)})
    assert (entry.watermark_ms, entry.event_time_max) == (8_000, {QR_OP: 9_000})  # a no-data batch: it moved


def test_a_query_run_without_watermark_operators_logs_no_watermark_and_no_event_time():
    run = qr.QueryRun(_graph(), mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-1")
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started"))
    run.handle(qr.Tick(1000, "tick-1000"))
    _, _, out = run_batch(run, 0, 1000, SourceRange(None, 10, 10), {
        0: ({QR_OP: EventTimeStats(5_000, 7_000, 12_000.0, 2)}, 1), 1: ({}, 0)})
    assert "eventTime" not in progress_of(out) and run.coordinator.watermarks is None
    run.handle(qr.Tick(2000, "tick-2000"))
    entry, _, _ = run_batch(run, 1, 2000, SourceRange(10, 20, 10), {0: ({}, 0), 1: ({}, 0)})
    assert entry.watermark_ms is None


def test_reports_the_batch_flow_ignores_change_neither_the_late_rows_nor_the_watermark():
    """A stale attempt's report is ignored by the batch's flow (as in test_queryrun: reports of
    stale attempts change nothing); its event times and late rows must be ignored with it."""
    run = event_run()
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started"))
    run.handle(qr.Tick(1000, "tick-1000"))
    wild = {QR_OP: EventTimeStats(1_000, 10**12, 2.0 * 10**12, 2)}
    stale = qr.BatchWritten(ExecutionAttemptId("src", 0, 5), 0, {}, 5, 1050, "report-stale", None, wild, 7)
    real = {0: ({QR_OP: EventTimeStats(4_000, 9_000, 13_000.0, 2)}, 1), 1: ({}, 1)}
    _, _, out = run_batch(run, 0, 1000, SourceRange(None, 10, 10), real, extra=[stale])
    run.handle(qr.Tick(2000, "tick-2000"))
    entry, _, _ = run_batch(run, 1, 2000, SourceRange(10, 20, 10), {0: ({}, 0), 1: ({}, 0)})
    assert progress_of(out)["numLateRows"] == 2
    assert entry.watermark_ms == 8_000


def test_a_report_of_a_batch_already_through_changes_nothing():
    run = event_run()
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started"))
    run.handle(qr.Tick(1000, "tick-1000"))
    run_batch(run, 0, 1000, SourceRange(None, 10, 10), {0: ({QR_OP: EventTimeStats(4_000, 9_000, 13_000.0, 2)}, 0),
                                                        1: ({}, 0)})
    late = qr.BatchWritten(ExecutionAttemptId("src", 0, 0), 0, {}, 5, 1500, "report-late", None,
                            {QR_OP: EventTimeStats(1_000, 10**12, 2.0 * 10**12, 2)}, 7)
    assert run.handle(late) == []
    run.handle(qr.Tick(2000, "tick-2000"))
    entry, _, _ = run_batch(run, 1, 2000, SourceRange(10, 20, 10), {0: ({}, 0), 1: ({}, 0)})
    assert entry.watermark_ms == 8_000


def test_a_repeated_report_of_a_subtask_counts_its_late_rows_once():
    run = event_run()
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started"))
    run.handle(qr.Tick(1000, "tick-1000"))
    qr_op_stats = {QR_OP: EventTimeStats(4_000, 9_000, 13_000.0, 2)}
    twice = qr.BatchWritten(ExecutionAttemptId("src", 1, 0), 0, {}, 5, 1050, "report-src[1]-first", None,
                             qr_op_stats, 3)
    _, _, out = run_batch(run, 0, 1000, SourceRange(None, 10, 10), {0: ({}, 0), 1: (qr_op_stats, 3)}, extra=[twice])
    assert progress_of(out)["numLateRows"] == 3


# ------------------------------------------------------------------------------------ the wire


def test_a_tasks_event_times_and_late_rows_survive_the_wire():
    io = TaskIo(1, 2, 3, 4, 0.5, None, {"v/1": EventTimeStats(-5_000, 9_000, 12_345.0, 3),
                                        "v/3": EventTimeStats(0, 0, 0.0, 1)}, 7)
    assert io_from_proto(io_to_proto(io)) == io
    plain = TaskIo(1, 2, 3, 4, 0.5)
    assert io_from_proto(io_to_proto(plain)) == plain and plain.event_time == {} and plain.late_rows == 0


def test_event_time_stats_that_cannot_be_are_dropped_on_the_way_in():
    message = io_to_proto(TaskIo(1, 2, 3, 4, 0.5, None, {"ok/0": EventTimeStats(1, 2, 3.0, 2)}, 1))
    message.event_time["inverted/0"].CopyFrom(job_pb.EventTimeStats(min_ms=10, max_ms=5, sum_ms=15.0, count=2))
    message.event_time["no-rows/0"].CopyFrom(job_pb.EventTimeStats(min_ms=1, max_ms=2, sum_ms=3.0, count=0))
    message.event_time["no-max/0"].CopyFrom(job_pb.EventTimeStats(min_ms=1, sum_ms=1.0, count=1))
    message.event_time["nan/0"].CopyFrom(job_pb.EventTimeStats(min_ms=1, max_ms=2, sum_ms=float("nan"), count=2))
    io = io_from_proto(message)
    assert io.event_time == {"ok/0": EventTimeStats(1, 2, 3.0, 2)} and io.late_rows == 1
    message.late_rows = -4
    assert io_from_proto(message).late_rows == 0


def test_a_batchs_watermark_survives_the_wire_and_none_stays_none():
    attempts = [(ExecutionAttemptId("v", 0, 0), [])]
    for watermark in (1_700_000_000_000, 0, -1_500):
        batch = BatchInput(3, 1_000, {"rate": SourceRange(10, 20, 10)}, watermark_ms=watermark)
        assert batch_from_proto(run_batch_to_proto("job-1", "tm#1", batch, attempts)).watermark_ms == watermark
    batch = BatchInput(3, 1_000, {"rate": SourceRange(10, 20, 10)})
    message = run_batch_to_proto("job-1", "tm#1", batch, attempts)
    assert not message.HasField("watermark_ms") and batch_from_proto(message) == batch
    assert batch_from_proto(message).watermark_ms is None


# ------------------------------------------------------------------------------------ the DSL and the graph's checks


def events(env: ExecutionEnvironment):
    return env.read_stream.rate(10).select("value % 3 AS k", "value", "timestamp_millis(value) AS ts",
                                           "timestamp_millis(value * 2) AS other")


def windowed_query(mode: str | None = None, watermark_column: str | None = "ts") -> ExecutionEnvironment:
    env = ExecutionEnvironment("windows", parallelism=2)
    stream = events(env)
    if watermark_column is not None:
        stream = stream.with_watermark(watermark_column, "2 s")
    result = stream.key_by("k").window("ts", "10 s", "5 s").allowed_lateness("1 s").count()
    result.discard()
    result.late_data().discard()
    if mode is not None:
        env.set_output_mode(mode)
    return env


def problems_of(env: ExecutionEnvironment) -> str:
    with pytest.raises(JobGraphInvalid) as caught:
        env.build()
    return str(caught.value)


def test_a_windowed_query_builds_with_its_watermark_window_and_late_rows_operators():
    for mode in (None, "append", "update"):
        job = windowed_query(mode).build()
        ops = {op.kind: (v.id, i, op.config) for v in job.vertices for i, op in enumerate(v.operators)}
        assert {"watermark", "window_aggregate", "late_rows"} <= set(ops)
        vertex, index, watermark = ops["watermark"]
        assert watermark == {"column": "ts", "delay_ms": 2_000}
        window = ops["window_aggregate"][2]
        assert {k: window[k] for k in ("keys", "column", "size_ms", "slide_ms", "lateness_ms")} == {
            "keys": ["k"], "column": "ts", "size_ms": 10_000, "slide_ms": 5_000, "lateness_ms": 1_000}
        assert window["aggregations"] == ["count(1) AS `count`"]
        assert ops["late_rows"][2] == {"column": "ts", "size_ms": 10_000, "slide_ms": 5_000, "lateness_ms": 1_000}
        assert ops["window_aggregate"][1] == 0  # a keyed operator heads its chain
        settings = event_time_settings(job)
        assert settings.delays == {operator_id(vertex, index): 2_000}
        assert settings.policy == "min" and settings.stateful


def test_the_watermark_policy_reaches_the_query_settings_and_a_bad_one_is_refused():
    env = windowed_query()
    env.set_watermark_policy(" MAX ")
    assert event_time_settings(env.build()).policy == "max"
    with pytest.raises(ValueError, match=r"set_watermark_policy\(\): expected one of min, max, got 'bogus'"):
        env.set_watermark_policy("bogus")
    env.set_option("streaming.watermark-policy", "bogus")  # around the DSL's check: the graph's check
    assert "option streaming.watermark-policy: expected one of min, max, got 'bogus'" in problems_of(env)


def test_a_watermark_without_a_window_makes_no_data_batches_unnecessary():
    env = ExecutionEnvironment("watermark only", parallelism=1)
    events(env).with_watermark("ts", 500).discard()
    settings = event_time_settings(env.build())
    assert list(settings.delays.values()) == [500] and not settings.stateful


@pytest.mark.parametrize("watermark_column", [None, "other"])
def test_a_window_without_a_watermark_on_its_column_upstream_is_refused(watermark_column):
    text = problems_of(windowed_query(watermark_column=watermark_column))
    assert "operator 'Window count' (window_aggregate)" in text, text
    assert "no watermark on its time column 'ts' upstream" in text and "with_watermark('ts', <delay>)" in text, text


def test_a_watermark_after_the_window_or_on_a_side_branch_does_not_count():
    after = ExecutionEnvironment("after", parallelism=1)
    events(after).key_by("k").window("ts", "10 s").count().with_watermark("ts", "1 s").discard()
    assert "no watermark on its time column 'ts'" in problems_of(after)
    side = ExecutionEnvironment("side", parallelism=1)
    stream = events(side)
    stream.with_watermark("ts", "1 s").discard()
    stream.key_by("k").window("ts", "10 s").count().discard()
    assert "no watermark on its time column 'ts'" in problems_of(side)


def test_a_window_in_complete_mode_is_refused():
    text = problems_of(windowed_query("complete"))
    assert "operator 'Window count' (window_aggregate)" in text
    assert "streaming.output-mode complete would keep every window for ever" in text, text


def test_a_running_aggregate_in_append_mode_is_refused_pointing_at_windows():
    env = ExecutionEnvironment("running", parallelism=1)
    events(env).key_by("k").count().discard()
    env.set_output_mode("append")
    text = problems_of(env)
    assert "operator 'Count' (running_aggregate)" in text and "keeps a total per key across batches" in text
    assert "with_watermark(...).key_by(...).window(...)" in text and "per_batch().count()" in text, text


@pytest.mark.parametrize("call, error, message", [
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "10 s", "20 s"), ValueError,
     r"window\(\): a window's slide \(20000 ms\) must not be longer than its size \(10000 ms\)"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "10 s", 0), ValueError,
     r"window\(\): a window needs a positive size and slide"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "1001 ms", 1), ValueError,
     r"window\(\): .* puts each row in 1001 windows"),
    (lambda s: s.with_watermark("ts", "soon"), ValueError, r"with_watermark\(\) delay: invalid duration 'soon'"),
    (lambda s: s.with_watermark("ts", -5), ValueError, r"with_watermark\(\) delay: must be between 0 and ten years"),
    (lambda s: s.with_watermark("ts", 1.5), TypeError, r"with_watermark\(\) delay: expected a duration"),
    (lambda s: s.with_watermark("", "1 s"), ValueError, r"with_watermark\(\): the column must be a non-empty name"),
    (lambda s: s.select("k AS window_start", "ts").with_watermark("ts", "1 s").key_by("window_start")
     .window("ts", "10 s").count(), ValueError, r"key column 'window_start' has the name of a window column"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").per_batch().window("ts", "10 s"), ValueError,
     r"call it on key_by\(\.\.\.\), not on per_batch\(\)"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "10 s").allowed_lateness("later"), ValueError,
     r"allowed_lateness\(\): invalid duration"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "10 s").aggregate(), TypeError,
     r"aggregate\(\) needs at least one SQL aggregate"),
    (lambda s: s.with_watermark("ts", "1 s").key_by("k").window("ts", "10 s").aggregate("percentile(value, 0.5) AS p"),
     ValueError, r"aggregate\(\) over windows: 'percentile\(value, 0.5\) AS p'"),
])
def test_window_and_watermark_mistakes_fail_at_the_call_that_made_them(call, error, message):
    env = ExecutionEnvironment("mistakes", parallelism=1)
    with pytest.raises(error, match=message):
        call(events(env))


# ---- a stream joined with a static data set --------------------------------------------------

def stream_static(how: str, stream_left: bool = True, extra=None) -> ExecutionEnvironment:
    env = ExecutionEnvironment("stream static", parallelism=2)
    stream = env.read_stream.rate(10).select("value % 4 AS k", "value")
    table = env.from_collection([(0, "zero")], "k bigint, name string")
    joined = stream.join(table, on="k", how=how) if stream_left else table.join(stream, on="k", how=how)
    joined.write_parquet("/tmp/out")
    if extra is not None:
        extra(env, stream, table)
    return env


@pytest.mark.parametrize("how,stream_left", [("inner", True), ("left", True), ("left_anti", True), ("semi", True),
                                             ("inner", False), ("right", False)])
def test_a_stream_may_join_a_static_data_set_when_each_stream_row_is_joined_once(how, stream_left):
    job = stream_static(how, stream_left).build()
    assert "join" in [op.kind for v in job.vertices for op in v.operators]


@pytest.mark.parametrize("how,stream_left", [("full", True), ("right", True), ("left", False), ("outer", False)])
def test_an_outer_join_on_the_static_side_is_refused_saying_why(how, stream_left):
    problems = problems_of(stream_static(how, stream_left))
    assert "with a static data set would emit the static side's unmatched rows again every batch" in problems


def test_a_static_branch_written_or_unioned_with_the_stream_is_refused():
    written = problems_of(stream_static("inner", extra=lambda env, s, t: t.write_parquet("/tmp/static")))
    assert "writes a static data set in a streaming query" in written
    unioned = problems_of(stream_static("inner", extra=lambda env, s, t: s.select("k", "value AS name")
                                        .union(t).write_parquet("/tmp/both")))
    assert "mixes the stream with a static data set: only a join may" in unioned


# ---- joins of two streams ---------------------------------------------------------------------

def two_streams(watermarks=("ts", "ts"), how="left", lower="-5 min", upper="5 min", plain=False):
    env = ExecutionEnvironment("two streams", parallelism=2)
    a = env.read_stream.rate(10).select("value % 4 AS k", "value AS a", "timestamp AS ts")
    b = env.read_stream.rate(10).select("value % 4 AS k", "value AS b", "timestamp AS ts")
    if watermarks[0]:
        a = a.with_watermark(watermarks[0], "10 s")
    if watermarks[1]:
        b = b.with_watermark(watermarks[1], "10 s")
    (a.join(b, on="k") if plain else a.interval_join(b, "k", lower, upper, how=how)).write_parquet("/tmp/out")
    return env


def test_an_interval_join_builds_with_its_bounds_and_both_watermarks():
    job = two_streams().build()
    [op] = [op for v in job.vertices for op in v.operators if op.kind == "interval_join"]
    assert op.config == {"keys": ["k"], "how": "left", "left_time": "ts", "right_time": "ts",
                         "lower_ms": -300_000, "upper_ms": 300_000}
    assert event_time_settings(job).stateful


@pytest.mark.parametrize("watermarks,side", [((None, "ts"), "left"), (("ts", None), "right")])
def test_an_interval_join_without_a_watermark_on_a_side_is_refused_naming_the_side(watermarks, side):
    assert f"its {side} stream has no watermark on 'ts'" in problems_of(two_streams(watermarks))


def test_a_plain_join_of_two_streams_is_refused_pointing_at_interval_join():
    assert "would join only rows that arrive in the same batch; use interval_join" in problems_of(two_streams(plain=True))


@pytest.mark.parametrize("kwargs,message", [({"how": "full"}, "how must be 'inner' or 'left'"),
                                            ({"lower": "5 min", "upper": "-5 min"}, "must not be after upper"),
                                            ({"lower": "soon"}, "interval_join() lower")])
def test_interval_join_mistakes_fail_at_the_call(kwargs, message):
    with pytest.raises(ValueError) as caught:
        two_streams(**kwargs)
    assert message in str(caught.value)


def test_window_numbers_that_cannot_be_are_refused_at_submit_in_a_hand_made_graph():
    """A job graph from any client (not only the DSL, which checks them at the call) is refused
    before it runs when a window's numbers cannot be."""
    import dataclasses

    job = windowed_query("append").build()
    bad = []
    for v in job.vertices:
        ops = tuple(dataclasses.replace(op, config={**op.config, "slide_ms": 120_000})
                    if op.kind in ("window_aggregate", "late_rows") else op for op in v.operators)
        bad.append(dataclasses.replace(v, operators=ops))
    from funke.common.graph.validation import validate

    with pytest.raises(JobGraphInvalid) as caught:
        validate(dataclasses.replace(job, vertices=tuple(bad)))
    assert str(caught.value).count("must not be longer than its size") == 2, str(caught.value)
