"""A keyed SQL aggregate split into a combiner and a final aggregate (common/aggregates.py and the
TaskManager's `combine` / `aggregate` operators): which calls split, and — on real PySpark — that
combining per producer then merging after the exchange gives exactly the rows, names and types
the aggregate alone gives."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from funke.common import aggregates
from funke.common.aggregates import AggregateCall, parse_call
from funke.common.graph.jobgraph import OperatorSpec
from funke.taskmanager.operators import OPERATORS
from tests.unit.test_task_runtime import ctx, spark  # noqa: F401  (fixtures)


@pytest.mark.parametrize("text, call", [
    ("sum(n) as total", AggregateCall("sum", "n", "total")),
    ("COUNT(*)", AggregateCall("count", "*", None)),
    ("count(1) AS `the count`", AggregateCall("count", "1", "`the count`")),
    ("avg(price * qty) mean_value", AggregateCall("avg", "price * qty", "mean_value")),
    ("mean(x)", AggregateCall("avg", "x", None)),
    ("max(coalesce(a, ')')) as top", AggregateCall("max", "coalesce(a, ')')", "top")),
    ("min(name)", AggregateCall("min", "name", None)),
])
def test_calls_that_split(text, call):
    assert parse_call(text) == call


@pytest.mark.parametrize("text", [
    "sum(a) / 2", "sum(a) + max(b)", "count(DISTINCT a)", "percentile(a, 0.5)", "max_by(a, b)",
    "sum(a", "collect_list(a)", "sum()", "first(a)", "sum(a) as x y", "'sum(a)'",
])
def test_calls_that_do_not_split(text):
    assert parse_call(text) is None


def test_a_final_aggregate_merges_the_partials_into_the_whole_aggregates_name_and_type():
    assert aggregates.final(AggregateCall("count", "*", None), 0, "count(1)", "bigint") == \
        "CAST(sum(`__funke_partial_0`) AS bigint) AS `count(1)`"
    assert aggregates.final(AggregateCall("avg", "x", "m"), 2, "m", "double") == \
        "CAST(sum(`__funke_partial_2_sum`) / sum(`__funke_partial_2_count`) AS double) AS `m`"
    assert aggregates.partials(AggregateCall("avg", "x", "m"), 2) == [
        ("__funke_partial_2_sum", "sum(CAST((x) AS DOUBLE))"), ("__funke_partial_2_count", "count(x)")]


def by_key(df) -> dict:
    return {r[0]: tuple(r) for r in df.collect()}


AGGREGATIONS = [
    ["count(*) as n", "sum(amount) as total", "min(name) as first_name", "max(price)", "avg(qty) as mean_qty",
     "sum(price) as money", "count(note)", "mean(price * qty) AS `weird ``name`"],
]


@pytest.mark.parametrize("aggregations", AGGREGATIONS)
def test_combining_each_producers_rows_then_merging_equals_aggregating_them_all(spark, ctx, aggregations):
    schema = "k string, amount int, name string, price decimal(10,2), qty double, note string"
    rows = [("a", 1, "x", "1.50", 2.0, None), ("a", 2, "b", "2.25", None, "n"), ("b", None, "z", None, 1.5, None),
            (None, 7, "q", "0.10", 4.0, "m"), ("b", 3, None, "9.99", 2.5, "o"), ("a", 4, "c", "3.00", 1.0, None)]
    df = spark.createDataFrame([(k, a, n, None if p is None else __import__("decimal").Decimal(p), q, o)
                                for k, a, n, p, q, o in rows], schema)
    spec = OperatorSpec("aggregate", "agg", {"keys": ["k"], "aggregations": aggregations})
    whole = OPERATORS["aggregate"](ctx, spec, [df])
    combine_spec = OperatorSpec("combine", "combine", {"keys": ["k"], "aggregations": aggregations})
    # two producers, each combining its share; the exchange unions them
    halves = [df.where(F.col("amount") % 2 == 0), df.where((F.col("amount") % 2 != 0) | F.col("amount").isNull())]
    combined = [OPERATORS["combine"](ctx, combine_spec, [h]) for h in halves]
    assert all(c.columns[1].startswith(aggregates.PARTIAL_PREFIX) for c in combined)  # it did combine
    merged = OPERATORS["aggregate"](ctx, spec, [combined[0].unionByName(combined[1])])
    assert merged.schema.simpleString() == whole.schema.simpleString()
    assert merged.columns == whole.columns
    assert by_key(merged) == by_key(whole) and len(by_key(whole)) == 3  # the null key is a group too


def test_an_aggregate_that_does_not_split_passes_the_rows_through_to_the_whole_aggregate(spark, ctx):
    df = spark.createDataFrame([("a", 1), ("a", 1), ("b", 2)], "k string, v int")
    for aggregations in (["count(DISTINCT v) as d", "sum(v) as s"], ["avg(CAST(v AS DECIMAL(5,1))) as m"]):
        combine_spec = OperatorSpec("combine", "combine", {"keys": ["k"], "aggregations": aggregations})
        passed = OPERATORS["combine"](ctx, combine_spec, [df])
        assert passed.columns == ["k", "v"] and passed.count() == 3
        spec = OperatorSpec("aggregate", "agg", {"keys": ["k"], "aggregations": aggregations})
        assert by_key(OPERATORS["aggregate"](ctx, spec, [passed])) == by_key(OPERATORS["aggregate"](ctx, spec, [df]))


def test_the_only_producer_subtask_passes_a_small_micro_batch_uncombined_and_the_aggregate_is_the_same(spark, ctx):
    import dataclasses

    from funke.taskmanager import batchexchange
    from funke.taskmanager.operators.context import InputMeter

    df = spark.createDataFrame([("a", 1), ("a", 2), ("b", 5)], "k string, v int")
    aggregations = ["count(*) as n", "sum(v) as s"]
    combine_spec = OperatorSpec("combine", "combine", {"keys": ["k"], "aggregations": aggregations})
    spec = OperatorSpec("aggregate", "agg", {"keys": ["k"], "aggregations": aggregations})
    small = InputMeter(bytes=batchexchange.ONE_PARTITION_LIMIT_BYTES)
    large = InputMeter(bytes=batchexchange.ONE_PARTITION_LIMIT_BYTES + 1)
    cases = [  # (parallelism, meter, whether it combines)
        (1, small, False),  # a micro-batch of the only producer: its rows pass
        (1, large, True),
        (2, small, True),  # two producers: a consumer must not get combined and uncombined rows
        (1, None, True),  # a bounded job
    ]
    for parallelism, meter, combines in cases:
        run = dataclasses.replace(ctx, parallelism=parallelism, meter=meter)
        out = OPERATORS["combine"](run, combine_spec, [df])
        assert out.columns[1].startswith(aggregates.PARTIAL_PREFIX) is combines, (parallelism, meter)
        assert by_key(OPERATORS["aggregate"](ctx, spec, [out])) == {"a": ("a", 2, 3), "b": ("b", 1, 5)}
