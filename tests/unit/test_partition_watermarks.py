"""Per-partition watermarks (funke.common.streaming.eventtime): the smallest over the partitions,
idle partitions left out by batch time, the keys, the logged state, and the submit checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funke.common.streaming.checkpoint import (CommitEntry, OffsetEntry, commit_entry_bytes, offset_entry_bytes,
                                              parse_commit_entry, parse_offset_entry)
from funke.common.streaming.eventtime import (EventTimeStats, WatermarkTracker, partition_idle, partition_key,
                                              split_partition_key)

OP = "v1/1"


def seen(ms: int, count: int = 1) -> EventTimeStats:
    return EventTimeStats(ms, ms, float(ms * count), count)


def tracker(idle: int | None = None, delay: int = 0) -> WatermarkTracker:
    return WatermarkTracker({OP: delay}, partitioned={OP: idle})


def at(t: WatermarkTracker, committed_ms: int) -> int | None:
    """The watermark once the batch at `committed_ms` committed."""
    t.committed(committed_ms)
    return t.advance()


def key(p: int, topic: str = "t") -> str:
    return partition_key(OP, topic, p)


def test_partition_keys_round_trip_and_plain_ids_are_not_keys():
    assert split_partition_key(partition_key("a@b/3", "my.topic-1", 7)) == ("a@b/3", "my.topic-1", 7)
    assert split_partition_key("v1/1") is None
    assert split_partition_key("v1/1@t:x") is None


def test_the_smallest_partition_holds_the_watermark_back():
    t = tracker(delay=100)
    t.observe(key(0), seen(10_000), 1000)
    t.observe(key(1), seen(2_000), 1000)
    assert at(t, 2000) == 1_900
    t.observe(key(1), seen(50_000), 2000)
    assert at(t, 3000) == 9_900  # partition 0 now the slow one


def test_an_idle_partition_stops_holding_it_back_by_batch_time_only():
    t = tracker(idle=5_000)
    t.observe(key(0), seen(1_000), 1_000)
    t.observe(key(1), seen(1_000), 1_000)
    t.observe(key(0), seen(60_000), 3_000)
    assert at(t, 5_999) == 1_000  # partition 1 last active at 1000: not idle before 6000
    assert at(t, 6_000) == 60_000
    t.observe(key(1), seen(2_000), 7_000)  # back: it holds again, but the watermark never goes back
    assert at(t, 8_000) == 60_000


def test_only_committed_batches_move_the_idleness_clock():
    t = tracker(idle=1_000)
    t.observe(key(0), seen(1_000), 0)
    t.observe(key(1), seen(1_000), 0)
    assert at(t, 0) == 1_000
    t.observe(key(0), seen(9_000), 5_000)  # batch 5000 runs: partition 1's report is not in yet
    assert t.advance() == 1_000
    t.committed(5_000)  # committed: partition 1 had nothing in it
    assert t.advance() == 9_000


def test_all_idle_the_largest_counts_and_without_a_timeout_never_idle():
    t = tracker(idle=1_000)
    t.observe(key(0), seen(5_000), 0)
    t.observe(key(1), seen(9_000), 0)
    assert at(t, 500) == 5_000
    assert at(t, 10_000) == 9_000
    u = tracker(idle=None)
    u.observe(key(0), seen(5_000), 0)
    u.observe(key(1), seen(9_000), 0)
    assert at(u, 10**9) == 5_000


def test_reports_of_plain_operators_and_other_graphs_are_kept_apart():
    t = WatermarkTracker({OP: 0, "v2/0": 0}, partitioned={OP: None})
    t.observe(OP, seen(99_000), 0)  # a plain report for a per-partition operator: ignored
    t.observe(partition_key("v9/0", "t", 0), seen(99_000), 0)  # an operator the graph no longer has
    t.observe("v2/0", seen(4_000), 0)
    t.observe(key(0), seen(7_000), 0)
    assert at(t, 0) == 4_000
    assert set(t.maxes) == {"v2/0", key(0)} and set(t.active) == {key(0)}


def test_restored_from_the_log_it_decides_the_same():
    t = tracker(idle=2_000)
    t.observe(key(0), seen(10_000), 1_000)
    t.observe(key(1), seen(3_000), 1_000)
    t.observe(key(0), seen(20_000), 2_500)
    entry = OffsetEntry(5, 3_000, {}, at(t, 3_000), dict(t.maxes), t.logged_active())
    back = parse_offset_entry(offset_entry_bytes(entry), 5)
    assert back.event_time_active == entry.event_time_active and back.event_time_max == entry.event_time_max
    again = WatermarkTracker({OP: 0}, "min", back.event_time_max, back.watermark_ms, {OP: 2_000},
                             back.event_time_active)
    assert again.clock_ms == 3_000 and again.advance() == t.advance() == 20_000
    commit = parse_commit_entry(commit_entry_bytes(CommitEntry(5, 9, dict(t.maxes), event_time_active={key(0): 1})), 5)
    assert commit.event_time_active == {key(0): 1}


def test_a_per_partition_watermark_with_one_partition_is_the_plain_one():
    plain, per = WatermarkTracker({OP: 50}), tracker(delay=50)
    for i, ms in enumerate([100, 7_000, 3_000, 9_000]):
        plain.observe(OP, seen(ms), i)
        per.observe(key(0), seen(ms), i)
        assert at(plain, i) == at(per, i)


batches = st.lists(st.dictionaries(st.integers(0, 3), st.integers(0, 10**6), max_size=4), max_size=12)


@given(batches, st.one_of(st.none(), st.integers(1, 5)))
def test_never_back_never_above_the_largest_and_at_least_the_live_minimum(rounds, idle_batches):
    idle = None if idle_batches is None else idle_batches * 1000
    t = tracker(idle=idle)
    last = None
    for i, batch in enumerate(rounds):
        now = i * 1000
        for p, ms in batch.items():
            t.observe(key(p), seen(ms), now)
        wm = at(t, now)
        if last is not None:
            assert wm is not None and wm >= last
        if t.maxes:
            assert wm is not None and wm <= max(t.maxes.values())
            live = [t.maxes[k] for k in t.maxes if not partition_idle(t.active.get(k), t.clock_ms, idle)]
            assert wm >= (min(live) if live else max(t.maxes.values()))
        last = wm


def test_partition_idle_needs_a_timeout_and_both_times():
    assert not partition_idle(None, 10, 1)
    assert not partition_idle(0, None, 1)
    assert not partition_idle(0, 10**9, None)
    assert partition_idle(0, 5, 5) and not partition_idle(1, 5, 5)


# ------------------------------------------------------------------------------ the API and submit

def _problems(build) -> list[str]:
    from funke.common.api.dsl import ExecutionEnvironment
    from funke.common.api.translate import translate
    from funke.common.graph.streamingjob import query_problems

    env = ExecutionEnvironment("wm", parallelism=1)
    build(env).write_parquet("/tmp/out-wm")
    env.set_checkpoint_location("/tmp/cp-wm")
    return query_problems(translate(env.logical_plan())[0])


def _kafka(env):
    return env.read_stream.kafka("127.0.0.1:9092", "t", end_offsets="fetch")


def test_per_partition_is_accepted_right_after_kafka_or_where_topic_and_partition_are_kept():
    ok = [lambda e: _kafka(e).select("topic", "partition", "timestamp AS ts").with_watermark("ts", "1 s",
                                                                                          per_partition=True),
          lambda e: _kafka(e).with_watermark("timestamp", "1 s", per_partition=True, idle_timeout="5 s"),
          lambda e: _kafka(e).where("partition > 0").select("*").with_watermark("timestamp", 0, per_partition=True)]
    for build in ok:
        assert not [p for p in _problems(build) if "per-partition" in p]


def test_per_partition_is_refused_at_submit_without_the_kafka_columns_naming_why():
    rate = _problems(lambda e: e.read_stream.rate(5).select("timestamp AS ts", "value AS partition", "'x' AS topic")
                     .with_watermark("ts", "1 s", per_partition=True))
    assert any("per-partition watermark" in p and "(source.rate) is not a Kafka source" in p for p in rate), rate
    dropped = _problems(lambda e: _kafka(e).select("timestamp AS ts").with_watermark("ts", "1 s", per_partition=True))
    assert any("(select) does not select topic and partition" in p for p in dropped), dropped


def test_the_api_checks_its_arguments():
    from funke.common.api.dsl import ExecutionEnvironment

    stream = _kafka(ExecutionEnvironment("wm", parallelism=1))
    with pytest.raises(ValueError, match="idle_timeout needs per_partition=True"):
        stream.with_watermark("timestamp", "1 s", idle_timeout="5 s")
    with pytest.raises(TypeError, match="per_partition must be True or False"):
        stream.with_watermark("timestamp", "1 s", per_partition="yes")
    with pytest.raises((TypeError, ValueError)):
        stream.with_watermark("timestamp", "1 s", per_partition=True, idle_timeout=-5)
