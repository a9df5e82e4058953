"""The keyed-state operators' Spark side, in one process (Spark local[2]): key groups computed
as the exchange routes, a marker row per owned group, the state store in the Python workers, and
the errors a bad running aggregate gets. The cluster-wide behaviour (restarts, kills, another
parallelism) is tests/integration/test_keyed_state.py's."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import os

import pytest
from pyspark.sql import functions as F

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.streamingjob import OUTPUT_MODE
from funke.common.streaming import keygroups, state
from funke.common.streaming.sources import BatchInput
from funke.taskmanager.operators import OPERATORS
from tests.unit.test_task_runtime import ctx, spark  # noqa: F401  (fixtures)

RUNNING = OperatorSpec("running_aggregate", "totals",
                       {"keys": ["k"], "aggregations": ["count(1) AS n", "sum(v) AS s", "avg(v) AS m", "min(w) AS lo"]})
DEDUP = OperatorSpec("deduplicate", "dedup", {"keys": ["k"]})


def streaming(ctx, tmp_path, batch_id: int, mode: str = "update", subtask: int = 0, parallelism: int = 1):
    return dataclasses.replace(ctx, batch=BatchInput(batch_id, 0), checkpoint=str(tmp_path / "checkpoint"),
                               max_parallelism=8, options={OUTPUT_MODE: mode}, subtask_index=subtask,
                               parallelism=parallelism)


def test_a_running_aggregate_in_spark_keeps_totals_across_batches_and_writes_every_owned_group(spark, ctx, tmp_path):
    feed = [[("a", 1, "x"), ("b", 2, "y"), ("a", 3, "b")], [("c", 4, "q")], [("a", 5, "a")]]
    seen: list[tuple] = []
    for batch_id, rows in enumerate(feed):
        df = spark.createDataFrame(rows, "k string, v int, w string")
        out = OPERATORS["running_aggregate"](streaming(ctx, tmp_path, batch_id, "complete"), RUNNING, [df])
        assert out.columns == ["k", "n", "s", "m", "lo"]
        seen += rows
        values = collections.defaultdict(list)
        for k, v, w in seen:
            values[k].append((v, w))
        expected = {k: (len(vw), sum(v for v, _ in vw), sum(v for v, _ in vw) / len(vw), min(w for _, w in vw))
                    for k, vw in values.items()}
        assert {r.k: (r.n, r.s, r.m, r.lo) for r in out.collect()} == expected, f"batch {batch_id}"
    root = tmp_path / "checkpoint" / "state" / "v" / "op-0"
    groups = sorted(p.name for p in root.iterdir() if p.name.startswith("kg-"))
    assert groups == [state.group_dir_name(g) for g in range(8)]  # every owned group, even ones without keys
    assert all((root / g / "3.delta").exists() for g in groups)
    assert (root / state.METADATA).read_text() == state.metadata_text(8)


def test_a_subtask_owns_only_its_key_groups_and_the_state_has_its_key_groups_for_good(spark, ctx, tmp_path):
    owned = keygroups.key_group_range(8, 2, 1)
    every = spark.createDataFrame([(chr(c), 1, "x") for c in range(97, 123)], "k string, v int, w string")
    subtask_1 = streaming(ctx, tmp_path, 0, subtask=1, parallelism=2)
    with pytest.raises(Exception, match="the exchange did not route them by key group"):
        OPERATORS["running_aggregate"](subtask_1, RUNNING, [every]).collect()
    # what the exchange sends subtask 1: the keys whose group * 2 // 8 is 1
    df = every.where(F.floor(F.pmod(F.hash("k"), F.lit(8)) * 2 / 8) == 1)
    out = OPERATORS["running_aggregate"](subtask_1, RUNNING, [df]).collect()
    assert 0 < len(out) == df.count()
    root = tmp_path / "checkpoint" / "state" / "v" / "op-0"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("kg-")) == [state.group_dir_name(g) for g in owned]
    other = dataclasses.replace(streaming(ctx, tmp_path, 1), max_parallelism=16)
    with pytest.raises(ValueError, match="8 key groups"):
        OPERATORS["running_aggregate"](other, RUNNING, [df])


def test_bad_running_aggregates_are_told_plainly(spark, ctx, tmp_path):
    df = spark.createDataFrame([("a", decimal.Decimal("1.5"))], "k string, v decimal(5,1)")
    with pytest.raises(ValueError, match="cast it to double"):
        OPERATORS["running_aggregate"](streaming(ctx, tmp_path, 0), OperatorSpec(
            "running_aggregate", "t", {"keys": ["k"], "aggregations": ["avg(v) AS m"]}), [df])
    with pytest.raises(ValueError, match="count, sum, min, max and avg"):
        OPERATORS["running_aggregate"](streaming(ctx, tmp_path, 0), OperatorSpec(
            "running_aggregate", "t", {"keys": ["k"], "aggregations": ["count(DISTINCT v) AS d"]}), [df])
    with pytest.raises(ValueError, match="output mode"):
        OPERATORS["running_aggregate"](streaming(ctx, tmp_path, 0, mode=""), RUNNING, [df])
    with pytest.raises(ValueError, match="streaming query"):
        OPERATORS["running_aggregate"](ctx, RUNNING, [df])


def test_drop_duplicates_in_spark_across_batches_and_in_a_bounded_job(spark, ctx, tmp_path):
    first = spark.createDataFrame([(1, "a"), (2, "b"), (1, "a")], "k int, p string")
    assert sorted(OPERATORS["deduplicate"](ctx, DEDUP, [first]).collect()) == [(1, "a"), (2, "b")]  # bounded
    out0 = OPERATORS["deduplicate"](streaming(ctx, tmp_path, 0), DEDUP, [first])
    assert sorted(tuple(r) for r in out0.collect()) == [(1, "a"), (2, "b")]
    second = spark.createDataFrame([(2, "b"), (3, "c"), (3, "c")], "k int, p string")
    out1 = OPERATORS["deduplicate"](streaming(ctx, tmp_path, 1), DEDUP, [second])
    assert [tuple(r) for r in out1.collect()] == [(3, "c")]
    assert os.path.exists(tmp_path / "checkpoint" / "state" / "v" / "op-0" / state.METADATA)


def test_a_running_reduce_in_spark_folds_across_batches_with_the_users_function(spark, ctx, tmp_path):
    import cloudpickle

    def add(a, b):
        return (a.k, a.v + b.v, max(a.w, b.w))

    spec = OperatorSpec("running_reduce", "sum", {"keys": ["k"]}, cloudpickle.dumps(add))
    first = spark.createDataFrame([("a", 1, "x"), ("b", 2, "y"), ("a", 3, "b")], "k string, v int, w string")
    out = OPERATORS["running_reduce"](streaming(ctx, tmp_path, 0), spec, [first])
    assert out.columns == ["k", "v", "w"]
    assert sorted(tuple(r) for r in out.collect()) == [("a", 4, "x"), ("b", 2, "y")]
    second = spark.createDataFrame([("a", 10, "z")], "k string, v int, w string")
    out = OPERATORS["running_reduce"](streaming(ctx, tmp_path, 1, "complete"), spec, [second])
    assert sorted(tuple(r) for r in out.collect()) == [("a", 14, "z"), ("b", 2, "y")]


def test_a_keyed_process_function_in_spark_keeps_typed_state_and_fires_timers_at_the_batchs_time(spark, ctx, tmp_path):
    import cloudpickle

    from funke.common.api.state import KeyedProcessFunction, ListState, MapState, ValueState

    class Tally(KeyedProcessFunction):
        state = (ValueState("total", "bigint"), ListState("seen", "string"),
                 MapState("by_tag", "string", "struct<n:int,last:string>"))

        def process(self, key, rows, ctx):
            ctx.state.total.update((ctx.state.total.value() or 0) + sum(r.v for r in rows))
            for r in sorted(rows, key=lambda r: r.w):
                ctx.state.seen.add(r.w)
                old = ctx.state.by_tag.get(r.w)
                ctx.state.by_tag.put(r.w, {"n": (old.n if old else 0) + 1, "last": key})
            ctx.timer_service().register_processing_time_timer(ctx.current_processing_time() + 100)
            yield (key, "rows", ctx.state.total.value(), len(ctx.state.seen))

        def on_timer(self, key, timestamp, ctx):
            yield (key, f"timer {timestamp}", ctx.state.total.value(), ctx.state.by_tag.get("x").n)

    spec = OperatorSpec("process", "tally", {"keys": ["k"], "schema": "k string, what string, total bigint, n int",
                                             "state": [s.spec() for s in Tally.state]}, cloudpickle.dumps(Tally()))

    def run(batch_id, now, rows):
        c = dataclasses.replace(streaming(ctx, tmp_path, batch_id), batch=BatchInput(batch_id, now))
        df = spark.createDataFrame(rows, "k string, v int, w string")
        return sorted(tuple(r) for r in OPERATORS["process"](c, spec, [df]).collect())

    assert run(0, 1_000, [("a", 1, "x"), ("b", 2, "x"), ("a", 3, "y")]) == [("a", "rows", 4, 2), ("b", "rows", 2, 1)]
    assert run(1, 1_050, [("a", 5, "x")]) == [("a", "rows", 9, 3)]
    assert run(2, 1_100, []) == [("a", "timer 1100", 9, 2), ("b", "timer 1100", 2, 1)]
    assert run(3, 1_200, []) == [("a", "timer 1150", 9, 2)]

    bad = OperatorSpec("process", "tally", {**spec.config, "state": [{"name": "t", "kind": "value", "type": "bigintt"}]},
                       spec.function)
    with pytest.raises(ValueError, match="state 't': 'bigintt' is not a Spark type"):
        OPERATORS["process"](streaming(ctx, tmp_path, 4), bad, [spark.createDataFrame([("a", 1, "x")],
                                                                                        "k string, v int, w string")])


def test_a_process_function_that_raises_fails_the_batch_with_the_users_traceback(spark, ctx, tmp_path):
    import cloudpickle

    from funke.taskmanager.operators.udf import user_exception

    def explode(key, rows, ctx):
        if key == "b":
            raise ZeroDivisionError(f"key {key} has {len(rows)} rows")
        return []

    spec = OperatorSpec("process", "p", {"keys": ["k"], "schema": "k string", "state": []}, cloudpickle.dumps(
        type("F", (), {"process": staticmethod(explode)})()))
    df = spark.createDataFrame([("a", 1, "x"), ("b", 2, "y")], "k string, v int, w string")
    with pytest.raises(Exception) as raised:
        OPERATORS["process"](streaming(ctx, tmp_path, 0), spec, [df]).collect()
    found = user_exception(str(raised.value))
    assert found is not None and found[:2] == ("ZeroDivisionError", "key b has 1 rows")
    assert "in explode" in found[2] and "keyedstate/" not in found[2] and "keyedstate.py" not in found[2]
