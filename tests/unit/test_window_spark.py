"""Event-time windows' Spark side, in one process (Spark local[2]): the watermark operator's
observation, each row's windows as SQL assigns them (the same as eventtime.windows_of), window
aggregates in a bounded job and over a stream's batches in append and update mode (windows
emitted and closed by the batch's watermark, allowed lateness, late rows counted and routed to
late_rows, a batch run again), and the errors a bad window gets. The whole query (watermark
moved by the JobManager, restarts) is tests/integration/test_event_time.py's."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.streamingjob import OUTPUT_MODE
from funke.common.streaming import state
from funke.common.streaming.eventtime import WindowSpec, windows_of
from funke.common.streaming.sources import BatchInput
from funke.taskmanager.operators import OPERATORS
from funke.taskmanager.operators.context import InputMeter
from funke.taskmanager.operators.keyedstate import measure
from tests.unit import test_task_runtime

spark, ctx = test_task_runtime.spark, test_task_runtime.ctx  # the fixtures

AGGREGATIONS = ["count(1) AS n", "sum(v) AS s", "avg(v) AS m"]


def window_config(size_ms: int, slide_ms: int | None = None, lateness_ms: int = 0, **more) -> dict:
    return {"column": "ts", "size_ms": size_ms, "slide_ms": size_ms if slide_ms is None else slide_ms,
            "lateness_ms": lateness_ms, **more}


def aggregate_spec(size_ms: int, lateness_ms: int = 0) -> OperatorSpec:
    return OperatorSpec("window_aggregate", "w", window_config(size_ms, lateness_ms=lateness_ms, keys=["k"],
                                                                aggregations=AGGREGATIONS))


def streaming(ctx, checkpoint, batch_id: int, watermark_ms: int | None, mode: str = "append"):
    return dataclasses.replace(ctx, batch=BatchInput(batch_id, 0, watermark_ms=watermark_ms), meter=InputMeter(),
                               checkpoint=str(checkpoint), max_parallelism=8, options={OUTPUT_MODE: mode})


def events(spark, rows: list[tuple], schema: str = "k string, v int, ms bigint") -> DataFrame:
    """Rows with their event time given in epoch ms (None: no event time) as timestamp column ts."""
    df = spark.createDataFrame(rows, schema)
    return df.select(*[c for c in df.columns if c != "ms"], F.timestamp_millis("ms").alias("ts"))


def windows(out: DataFrame) -> dict[tuple, tuple]:
    """A window aggregate's output as (k, start ms, end ms) -> (n, s, m)."""
    assert out.columns == ["k", "window_start", "window_end", "n", "s", "m"]
    rows = out.select("k", F.unix_millis("window_start"), F.unix_millis("window_end"), "n", "s", "m").collect()
    result = {(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in rows}
    assert len(result) == len(rows), f"a window emitted twice in one batch: {rows}"
    return result


def late(out: DataFrame) -> list[tuple]:
    """late_rows' output as sorted (k, v, event ms, window start ms, window end ms, watermark ms)."""
    assert out.columns == ["k", "v", "ts", "window_start", "window_end", "watermark"]
    return sorted((tuple(r) for r in out.select(
        "k", "v", *[F.unix_millis(c) for c in ("ts", "window_start", "window_end", "watermark")]).collect()),
        key=repr)


# ---- the windows of a row -------------------------------------------------------------------

SPREAD_MS = [-157_766_400_000 + 7, -10_001, -10_000, -9_999, -3_001, -3_000, -1, 0, 1, 2_999, 3_000, 9_999,
             10_000, 10_001, 29_999, 30_000, 1_700_000_000_123]
SPECS = [WindowSpec(10_000, 10_000), WindowSpec(10_000, 3_000), WindowSpec(10_000, 5_000), WindowSpec(7, 1)]
FAR_WATERMARK = 2 ** 42  # year 2109: every window of SPREAD_MS is closed


def test_sql_windows_of_each_row_are_eventtimes_windows_of_tumbling_and_sliding(spark, ctx):
    rows = [(i, ms) for i, ms in enumerate(SPREAD_MS)]
    df = spark.createDataFrame(rows, "id int, ms bigint").select("id", F.timestamp_millis("ms").alias("ts"))
    # and one row a microsecond before the epoch: its millisecond is -1 (floor), as for Spark's window()
    sub_ms = len(rows)
    df = df.unionByName(spark.range(1).select(F.lit(sub_ms).alias("id"), F.timestamp_micros(F.lit(-1)).alias("ts")))
    expected_ms = dict(rows) | {sub_ms: -1}
    far = dataclasses.replace(ctx, batch=BatchInput(0, 0, watermark_ms=FAR_WATERMARK))
    parts = []
    for i, spec in enumerate(SPECS):
        config = window_config(spec.size_ms, spec.slide_ms)
        out = OPERATORS["late_rows"](far, OperatorSpec("late_rows", "late", config), [df])
        parts.append(out.select(F.lit(i).alias("spec"), "id", F.unix_millis("window_start").alias("start"),
                                F.unix_millis("window_end").alias("end"),
                                F.unix_millis("watermark").alias("watermark")))
        # the bounded job's window aggregate (every row on time) puts the rows in the same windows
        bounded = OPERATORS["window_aggregate"](ctx, OperatorSpec(
            "window_aggregate", "w", {**config, "keys": ["id"], "aggregations": ["count(1) AS n"]}), [df])
        parts.append(bounded.select(F.lit(100 + i).alias("spec"), "id", F.unix_millis("window_start").alias("start"),
                                    F.unix_millis("window_end").alias("end"), F.col("n").alias("watermark")))
    got = functools.reduce(DataFrame.unionByName, parts).collect()
    for i, spec in enumerate(SPECS):
        expected = sorted((id_, start, end) for id_, ms in expected_ms.items() for start, end in windows_of(ms, spec))
        assert len(expected) > len(expected_ms) or spec.slide_ms == spec.size_ms
        late_pairs = [r for r in got if r.spec == i]
        assert sorted((r.id, r.start, r.end) for r in late_pairs) == expected, spec
        assert {r.watermark for r in late_pairs} == {FAR_WATERMARK}
        bounded_pairs = [r for r in got if r.spec == 100 + i]
        assert sorted((r.id, r.start, r.end) for r in bounded_pairs) == expected, spec
        assert {r.watermark for r in bounded_pairs} == {1}  # each (id, window) once


def test_a_timestamp_ntz_event_time_lies_in_its_window_as_spark_window_puts_it_whatever_the_session_zone(spark, ctx):
    df = spark.range(1).select(F.lit("a").alias("k"), F.expr("TIMESTAMP_NTZ '2024-01-02 20:00:00'").alias("ts"))
    spec = OperatorSpec("window_aggregate", "w", {**window_config(86_400_000), "keys": ["k"],
                                                  "aggregations": ["count(1) AS n"]})
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        out = OPERATORS["window_aggregate"](ctx, spec, [df])
        got = out.crossJoin(df.select(F.col("ts").alias("row_ts"), F.window("ts", "1 day").alias("spark"))).select(
            F.col("window_start").cast("string"), F.col("window_end").cast("string"),
            F.col("spark.start").cast("string"), F.col("spark.end").cast("string"),
            (F.col("window_start") <= F.col("row_ts")) & (F.col("row_ts") < F.col("window_end"))).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    [(start, end, spark_start, spark_end, holds)] = got
    assert (start, end) == (spark_start, spark_end) == ("2024-01-02 00:00:00", "2024-01-03 00:00:00")
    assert holds


# ---- a bounded job --------------------------------------------------------------------------


def test_a_bounded_window_aggregate_computes_each_key_and_window_and_leaves_rows_without_event_time_out(spark, ctx):
    rows = [("a", 1, 0), ("a", 2, 9_999), ("a", 4, 10_000), ("b", 8, 5_000), ("b", 16, -1), ("a", 32, None),
            ("b", 64, None), ("b", 5, 25_000), ("b", 7, 29_999)]
    df = events(spark, rows)
    out = OPERATORS["window_aggregate"](ctx, aggregate_spec(10_000), [df])
    expected: dict[tuple, list[int]] = {}
    for k, v, ms in rows:
        if ms is not None:
            start = ms - ms % 10_000
            expected.setdefault((k, start, start + 10_000), []).append(v)
    assert windows(out) == {w: (len(vs), sum(vs), sum(vs) / len(vs)) for w, vs in expected.items()}
    assert windows(out) == {("a", 0, 10_000): (2, 3, 1.5), ("a", 10_000, 20_000): (1, 4, 4.0),
                            ("b", 0, 10_000): (1, 8, 8.0), ("b", -10_000, 0): (1, 16, 16.0),
                            ("b", 20_000, 30_000): (2, 12, 6.0)}
    # the rows without event time are the late ones, with no window and no watermark
    missed = OPERATORS["late_rows"](ctx, OperatorSpec("late_rows", "late", window_config(10_000)), [df])
    assert late(missed) == [("a", 32, None, None, None, None), ("b", 64, None, None, None, None)]


# ---- the watermark operator ----------------------------------------------------------------


def test_the_watermark_operator_passes_rows_and_observes_their_event_times_in_a_stream(spark, ctx, tmp_path):
    df = events(spark, [("a", 1, 5_000), ("b", 2, -1_000), ("c", 3, None), ("d", 4, 12_000)])
    spec = OperatorSpec("watermark", "wm", {"column": "ts", "delay_ms": 1_000})
    assert OPERATORS["watermark"](ctx, spec, [df]) is df  # a bounded job: nothing to observe
    batch = streaming(ctx, tmp_path / "checkpoint", 0, None)
    out = OPERATORS["watermark"](batch, spec, [df])
    assert sorted(r.v for r in out.collect()) == [1, 2, 3, 4]
    assert list(batch.meter.event_time) == ["v/0"]
    seen = batch.meter.event_time["v/0"].get
    assert (seen["min"], seen["max"], seen["sum"], seen["count"]) == (-1_000, 12_000, 16_000.0, 3)


# ---- a stream's batches ----------------------------------------------------------------------

# (rows (k, v, event ms), the batch's watermark)
FEED = [
    ([("a", 1, 1_000), ("a", 2, 5_000), ("b", 3, 12_000), ("a", 4, 15_000)], None),
    ([("a", 10, 3_000), ("a", 5, 19_000), ("b", 6, 25_000)], 10_000),  # a@3000: window [0, 10s) closed
    ([("b", 7, 21_000), ("a", 100, 15_500), ("a", 1000, None)], 20_000),  # a@15500: [10s, 20s) closed
    ([("c", 1, 45_000)], 40_000),
]


def test_a_stream_in_append_mode_emits_each_window_once_when_the_watermark_closes_it(spark, ctx, tmp_path):
    spec = aggregate_spec(10_000)
    late_spec = OperatorSpec("late_rows", "late", window_config(10_000))
    checkpoint = tmp_path / "checkpoint"
    emitted, late_counts, late_rows, outputs = [], [], [], []
    for batch_id, (rows, watermark) in enumerate(FEED):
        batch = streaming(ctx, checkpoint, batch_id, watermark)
        df = events(spark, rows)
        out = windows(OPERATORS["window_aggregate"](batch, spec, [df]))
        outputs.append(out)
        emitted += list(out)
        assert len(batch.meter.late) == 1
        late_counts.append(batch.meter.late[0].get["late"])
        late_rows.append(late(OPERATORS["late_rows"](batch, late_spec, [df])))
    assert outputs == [
        {},
        {("a", 0, 10_000): (2, 3, 1.5)},  # without the late a@3000
        {("a", 10_000, 20_000): (2, 9, 4.5), ("b", 10_000, 20_000): (1, 3, 3.0)},  # without a@15500
        {("b", 20_000, 30_000): (2, 13, 6.5)},  # c's [40s, 50s) stays open
    ]
    assert len(emitted) == len(set(emitted))  # once each
    assert late_counts == [0, 1, 2, 0]
    assert late_rows == [
        [],
        [("a", 10, 3_000, 0, 10_000, 10_000)],
        [("a", 100, 15_500, 10_000, 20_000, 20_000), ("a", 1000, None, None, None, 20_000)],
        [],
    ]
    # a batch run again (same id, same watermark: the offset log's) gives the same windows, its
    # state read from the files of the version before it
    for batch_id in (2, 3):
        rows, watermark = FEED[batch_id]
        again = OPERATORS["window_aggregate"](streaming(ctx, checkpoint, batch_id, watermark), spec,
                                              [events(spark, rows)])
        assert windows(again) == outputs[batch_id], f"batch {batch_id} again"


def test_a_stream_in_update_mode_emits_the_windows_each_batch_changed_and_closed_windows_leave_the_state(
        spark, ctx, tmp_path):
    spec = aggregate_spec(10_000)
    checkpoint = tmp_path / "checkpoint"
    outputs, late_counts, held = [], [], []
    for batch_id, (rows, watermark) in enumerate(FEED):
        batch = streaming(ctx, checkpoint, batch_id, watermark, mode="update")
        outputs.append(windows(OPERATORS["window_aggregate"](batch, spec, [events(spark, rows)])))
        late_counts.append(batch.meter.late[0].get["late"])
        metrics = measure(state.operator_dir(str(checkpoint), "v"), range(8), batch_id + 1)
        held.append((metrics.rows_total, metrics.rows_updated, metrics.rows_removed))
    assert outputs == [
        {("a", 0, 10_000): (2, 3, 1.5), ("a", 10_000, 20_000): (1, 4, 4.0), ("b", 10_000, 20_000): (1, 3, 3.0)},
        {("a", 10_000, 20_000): (2, 9, 4.5), ("b", 20_000, 30_000): (1, 6, 6.0)},  # a's [0, 10s) closed: a@3000 late
        {("b", 20_000, 30_000): (2, 13, 6.5)},
        {("c", 40_000, 50_000): (1, 1, 1.0)},
    ]
    assert late_counts == [0, 1, 2, 0]
    # windows held after each batch: the watermark's closed ones removed
    assert held == [(3, 3, 0), (3, 2, 1), (1, 1, 2), (1, 1, 1)]
    # funke state: each key's open windows with their totals so far, as the JobManager reads them
    from funke.common.graph.jobgraph import JobVertex
    from funke.jobmanager.streaming.state import keyed_state_table

    vertex = JobVertex("v", "windows", 1, (spec,), max_parallelism=8)
    table, matching = keyed_state_table(vertex, str(checkpoint), len(FEED), [], 10)
    assert table.column_names == ["k", "window_start", "window_end", "n", "s", "m"] and matching == 1
    [open_window] = table.to_pylist()
    assert (open_window["k"], open_window["window_start"].timestamp(), open_window["window_end"].timestamp(),
            open_window["n"], open_window["m"]) == ("c", 40.0, 50.0, 1, 1.0)


def test_allowed_lateness_keeps_a_window_open_until_its_end_plus_lateness_passes(spark, ctx, tmp_path):
    spec = aggregate_spec(10_000, lateness_ms=5_000)
    late_spec = OperatorSpec("late_rows", "late", window_config(10_000, lateness_ms=5_000))
    feed = [([("a", 1, 1_000)], None),
            ([("a", 2, 8_000), ("a", 40, 12_000)], 12_000),  # after [0, 10s)'s end, before end + 5s: counts
            ([("a", 4, 9_000), ("a", 8, 14_000)], 15_000),  # [0, 10s) closed now: a@9000 late
            ([], 25_000)]
    for mode, expected in (("append", [{}, {}, {("a", 0, 10_000): (2, 3, 1.5)},
                                       {("a", 10_000, 20_000): (2, 48, 24.0)}]),
                           ("update", [{("a", 0, 10_000): (1, 1, 1.0)},
                                       {("a", 0, 10_000): (2, 3, 1.5), ("a", 10_000, 20_000): (1, 40, 40.0)},
                                       {("a", 10_000, 20_000): (2, 48, 24.0)}, {}])):
        outputs, late_counts = [], []
        for batch_id, (rows, watermark) in enumerate(feed):
            batch = streaming(ctx, tmp_path / mode, batch_id, watermark, mode=mode)
            df = events(spark, rows)
            outputs.append(windows(OPERATORS["window_aggregate"](batch, spec, [df])))
            if rows:
                late_counts.append(batch.meter.late[0].get["late"])
            if batch_id == 2 and mode == "append":
                assert late(OPERATORS["late_rows"](batch, late_spec, [df])) == [("a", 4, 9_000, 0, 10_000, 15_000)]
        assert outputs == expected, mode
        assert late_counts == [0, 0, 1], mode


def test_a_sliding_window_row_late_for_its_earlier_window_still_counts_in_its_later_one(spark, ctx, tmp_path):
    spec = OperatorSpec("window_aggregate", "w", window_config(10_000, 5_000, keys=["k"], aggregations=AGGREGATIONS))
    late_spec = OperatorSpec("late_rows", "late", window_config(10_000, 5_000))
    checkpoint = tmp_path / "checkpoint"
    first = streaming(ctx, checkpoint, 0, None)
    assert windows(OPERATORS["window_aggregate"](first, spec, [events(spark, [("a", 1, 7_000)])])) == {}
    # watermark 15s: [5s, 15s) closes; a@12000 is late for it, on time for [10s, 20s)
    second = streaming(ctx, checkpoint, 1, 15_000)
    df = events(spark, [("a", 2, 12_000), ("a", 4, 21_000)])
    assert windows(OPERATORS["window_aggregate"](second, spec, [df])) == {
        ("a", 0, 10_000): (1, 1, 1.0), ("a", 5_000, 15_000): (1, 1, 1.0)}
    assert late(OPERATORS["late_rows"](second, late_spec, [df])) == [("a", 2, 12_000, 5_000, 15_000, 15_000)]
    assert second.meter.late[0].get["late"] == 1  # (row, window) pairs, as late_rows has them
    third = streaming(ctx, checkpoint, 2, 30_000)
    assert windows(OPERATORS["window_aggregate"](third, spec, [events(spark, [])])) == {
        ("a", 10_000, 20_000): (1, 2, 2.0), ("a", 15_000, 25_000): (1, 4, 4.0), ("a", 20_000, 30_000): (1, 4, 4.0)}


# ---- errors -----------------------------------------------------------------------------------


def test_a_bad_event_time_column_or_window_is_refused_naming_it(spark, ctx, tmp_path):
    df = spark.createDataFrame([("a", 1, 1_000)], "k string, v int, ms bigint")
    batch = streaming(ctx, tmp_path / "checkpoint", 0, None)
    for kind, config in (("watermark", {"column": "ms", "delay_ms": 0}),
                         ("window_aggregate", {**window_config(10), "column": "ms", "keys": ["k"],
                                               "aggregations": ["count(1) AS n"]}),
                         ("late_rows", {**window_config(10), "column": "ms"})):
        for context in (ctx, batch):
            with pytest.raises(ValueError, match=r"event time column 'ms' is bigint, not a timestamp"):
                OPERATORS[kind](context, OperatorSpec(kind, "op", config), [df])
        with pytest.raises(ValueError, match=r"no column 'when' for event time"):
            OPERATORS[kind](ctx, OperatorSpec(kind, "op", {**config, "column": "when"}), [df])
    timed = events(spark, [("a", 1, 1_000)])
    for kind, more in (("window_aggregate", {"keys": ["k"], "aggregations": ["count(1) AS n"]}), ("late_rows", {})):
        for context in (ctx, batch):
            with pytest.raises(ValueError, match=r"slide \(20 ms\) must not be longer than its size \(10 ms\)"):
                OPERATORS[kind](context, OperatorSpec(kind, "op", {**window_config(10, 20), **more}), [timed])
        with pytest.raises(ValueError, match="positive size"):
            OPERATORS[kind](ctx, OperatorSpec(kind, "op", {**window_config(0), **more}), [timed])


# ---- session windows --------------------------------------------------------------------------

SESSION = OperatorSpec("session_aggregate", "s", {"keys": ["k"], "aggregations": ["count(1) AS n", "sum(v) AS s"],
                                                  "column": "ts", "gap_ms": 1_000, "lateness_ms": 0})


def sessions(out: DataFrame) -> list[tuple]:
    assert out.columns == ["k", "window_start", "window_end", "n", "s"]
    return sorted(tuple(r) for r in out.select("k", F.unix_millis("window_start"), F.unix_millis("window_end"), "n",
                                                "s").collect())


def test_sessions_grow_and_merge_across_batches_and_close_once_when_the_watermark_passes_their_end(
        spark, ctx, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    feed = [([("a", 1, 1_000), ("a", 2, 1_500), ("b", 3, 1_000)], None),   # a [1000, 2500), b [1000, 2000)
            ([("a", 4, 2_800), ("a", 5, 2_400)], 1_200),                    # a's session grows to [1000, 3800)
            ([("b", 6, 5_000)], 3_000),                                     # b's first closes at 3000
            ([("a", 7, 100), ("c", 8, 9_500)], 9_000)]                      # a@100 late; a's closes
    got, late_counts = [], []
    for batch_id, (rows, watermark) in enumerate(feed):
        batch = streaming(ctx, checkpoint, batch_id, watermark)
        got.append(sessions(OPERATORS["session_aggregate"](batch, SESSION, [events(spark, rows)])))
        late_counts.append(batch.meter.late[0].get["late"])
    assert got == [[], [], [("b", 1_000, 2_000, 1, 3)], [("a", 1_000, 3_800, 4, 12), ("b", 5_000, 6_000, 1, 6)]]
    assert late_counts == [0, 0, 0, 1]
    # a bounded job: Spark's session_window over the whole input
    whole = events(spark, [r for rows, _ in feed for r in rows])
    assert sessions(OPERATORS["session_aggregate"](ctx, SESSION, [whole])) == [  # a@100 on time: it joins a's session
        ("a", 100, 3_800, 5, 19), ("b", 1_000, 2_000, 1, 3), ("b", 5_000, 6_000, 1, 6), ("c", 9_500, 10_500, 1, 8)]
