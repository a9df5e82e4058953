"""The progress record's builders (`funke.common.streaming.progress`): each part, on its own."""

from __future__ import annotations

from funke.common.states import BATCH_PHASE_TRANSITIONS, BatchPhase, StateMachine
from funke.common.streaming import progress
from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.microbatch import Batch
from funke.common.streaming.state import StateMetrics


def recorded_batch(**times) -> Batch:
    entry = OffsetEntry(3, 10_000, {"src": SourceRange(0, 40, 40), "other": SourceRange(5, 5, 0)}, watermark_ms=9_000)
    batch = Batch(3, 10_000, StateMachine("batch 3", BATCH_PHASE_TRANSITIONS, BatchPhase.PLANNING, 10.0), entry)
    defaults = dict(planned_at_ms=10_000, previous_trigger_ms=8_000, answered_at_ms=10_100, logged_at_ms=10_300,
                    started_at_ms=10_500, written_at_ms=11_500, recorded_at_ms=11_700)
    for name, value in {**defaults, **times}.items():
        setattr(batch, name, value)
    return batch


def test_iso_ms_prints_utc_with_milliseconds_as_structured_streaming():
    assert progress.iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert progress.iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


def test_a_batch_record_has_its_durations_delays_and_rates():
    record = progress.query_progress(recorded_batch(), query_id="q", run_id="r", name="n", sinks={"b", "a"},
                                     event_time=False)
    assert record["durationMs"] == {"latestOffset": 100, "walCommit": 200, "addBatch": 1000, "commitOffsets": 200,
                                    "triggerExecution": 100 + 200 + 1200}
    assert (record["schedulingDelayMs"], record["processingDelayMs"], record["totalDelayMs"]) == (500, 1200, 1700)
    assert record["numInputRows"] == 40 and record["inputRowsPerSecond"] == 20.0  # 40 rows in 2 s since the last
    assert record["processedRowsPerSecond"] == round(40 / 1.5, 3)
    assert record["timestamp"] == progress.iso_ms(10_000) and record["sink"] == {"description": "a, b"}
    assert [s["description"] for s in record["sources"]] == ["src", "other"]
    assert record["sources"][0] == {"description": "src", "startOffset": 0, "endOffset": 40, "numInputRows": 40,
                                    "inputRowsPerSecond": 20.0, "processedRowsPerSecond": round(40 / 1.5, 3)}
    assert "eventTime" not in record and "numLateRows" not in record


def test_a_rerun_batch_has_no_planning_durations_and_no_rate_without_a_previous_trigger():
    record = progress.query_progress(recorded_batch(planned_at_ms=None, answered_at_ms=None, previous_trigger_ms=None,
                                                    rerun=True), query_id="q", run_id="r", name="", sinks=(),
                                     event_time=False)
    assert record["durationMs"]["latestOffset"] == record["durationMs"]["walCommit"] == 0
    assert record["inputRowsPerSecond"] == 0.0 and record["rerun"] is True
    assert record["timestamp"] == progress.iso_ms(10_300)  # from when it was logged


def test_with_a_watermark_the_record_has_the_event_times_and_late_rows():
    batch = recorded_batch(event_time=EventTimeStats(4_000, 9_000, 12_600.0, 2), late_rows=3)
    record = progress.query_progress(batch, query_id="q", run_id="r", name="", sinks=(), event_time=True)
    assert record["eventTime"] == {"min": progress.iso_ms(4_000), "max": progress.iso_ms(9_000),
                                   "avg": progress.iso_ms(6_300), "watermark": progress.iso_ms(9_000)}
    assert record["numLateRows"] == 3


def test_receivers_get_their_blocks_records_rate_and_limit():
    record = {"sources": [{"description": "rx", "startOffset": {"0": 1, "1": 0}, "endOffset": {"0": 3, "1": 1},
                           "numInputRows": 30, "inputRowsPerSecond": 15.0},
                          {"description": "plain", "numInputRows": 1}]}
    progress.add_receivers(record, {"rx": 2}, {"rx": (20, None)}, {"rx": 7.25})
    rx, plain = record["sources"]
    assert rx["receivers"] == {"0": {"blocks": 2, "records": 20, "recordsPerSecond": 10.0},
                               "1": {"blocks": 1, "records": None, "recordsPerSecond": 0.0}}
    assert rx["numBlocks"] == 3 and rx["rateLimitPerReceiver"] == 7.2
    assert plain == {"description": "plain", "numInputRows": 1}


def test_state_operators_are_added_only_when_there_are_some():
    record: dict = {}
    progress.add_state_operators(record, [])
    assert record == {}
    progress.add_state_operators(record, [("agg", StateMetrics(rows_total=5), 128)])
    assert [(e["operatorName"], e["numRowsTotal"], e["numKeyGroups"]) for e in record["stateOperators"]] == [
        ("agg", 5, 128)]


def test_vertex_durations_count_from_the_first_dispatch():
    record: dict = {}
    progress.add_vertex_durations(record, None)
    assert record == {}
    times = {"src": progress.VertexTimes(1_000, 1_400, 250.0), "sink": progress.VertexTimes(1_100)}
    progress.add_vertex_durations(record, times)
    assert record["vertexDurationsMs"] == {
        "src": {"dispatchedMs": 0, "taskMs": 250.0, "reportedMs": 400, "overheadMs": 150.0},
        "sink": {"dispatchedMs": 100, "taskMs": 0.0}}


def test_source_details_go_to_the_sources_they_name():
    record = {"sources": [{"description": "redis"}, {"description": "rate"}]}
    progress.add_source_details(record, {"redis": {"lag": {"k": 3}}, "rate": {}, "gone": {"lag": {}}})
    assert record["sources"] == [{"description": "redis", "lag": {"k": 3}}, {"description": "rate"}]


def test_source_lags_flattens_kafka_partitions_and_redis_keys_for_the_metrics():
    from funke.common.streaming.progress import source_lags

    record = {"sources": [
        {"description": "Source: kafka orders", "lag": {"orders": {"0": 12, "1": 0}, "returns": {"3": 7}}},
        {"description": "Source: redis a, b", "lag": {"a": 5, "b": 0}},
        {"description": "Source: rate"},                                   # no lag: left out
        {"description": "odd", "lag": {"x": "many", "y": {"0": True}}},    # not counts: left out
    ]}
    assert source_lags(record) == [
        ("Source: kafka orders", "orders", "0", 12), ("Source: kafka orders", "orders", "1", 0),
        ("Source: kafka orders", "returns", "3", 7),
        ("Source: redis a, b", "a", "", 5), ("Source: redis a, b", "b", "", 0)]
    assert source_lags({}) == [] and source_lags({"sources": None}) == []
