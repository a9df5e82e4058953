"""Transforms: `(ctx, spec, inputs: list[DataFrame]) -> DataFrame`. A chain's head gets all of
the vertex's inputs in input order; a chained operator gets one.

map, flat_map, filter and reduce run the user's Python function per row (`udf`, which tells the
calling convention); transform calls fn(DataFrame) -> DataFrame once on the driver with the whole
subtask input; the others are Spark SQL (select, where, aggregate, count, join, union). combine
is a keyed aggregate's combiner (`funke.common.task.combine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, StructType

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.task import combine
from funke.taskmanager.operators.context import (
    RuntimeContext,
    Transform,
    arrow_schema,
    column_ref,
    config_schema,
    config_strings,
    config_value,
    label,
)
from funke.taskmanager.operators.udf import cancellable, filter_batches, map_batches, reduce_batches

__all__ = ["TRANSFORMS", "python_map", "union_all"]


def _single(spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if len(inputs) != 1:
        raise ValueError(f"{label(spec)} takes one input, got {len(inputs)}")
    return inputs[0]


def python_map(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, flat: bool) -> DataFrame:
    """The user's function per row of `df` (map, flat_map, a generating source.range), giving rows of
    config "schema"."""
    schema = config_schema(spec)
    fn = map_batches(spec.function, arrow_schema(ctx, schema), label(spec), flat)
    return df.mapInArrow(cancellable(fn, ctx.cancel_marker), schema)


def _map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return python_map(ctx, spec, _single(spec, inputs), flat=False)


def _flat_map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return python_map(ctx, spec, _single(spec, inputs), flat=True)


def _filter(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    df = _single(spec, inputs)
    return df.mapInArrow(cancellable(filter_batches(spec.function), ctx.cancel_marker), df.schema)


def _select(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).selectExpr(*config_strings(spec, "exprs"))


def _where(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).where(F.expr(str(config_value(spec, "condition"))))


def _local_partitions(ctx: RuntimeContext) -> int:
    if ctx.local_partitions is not None:
        return ctx.local_partitions
    return int(ctx.spark.conf.get("spark.sql.shuffle.partitions"))


def _reduce(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    df = _single(spec, inputs)
    keys = config_strings(spec, "keys")
    if not keys:
        raise ValueError(f"{label(spec)}: needs at least one key")
    # The task's input already holds only its keys (the edge is HASH-partitioned); this local
    # shuffle puts each key in one Spark partition so one Python dict can reduce it.
    keyed = df.repartition(_local_partitions(ctx), *[column_ref(k) for k in keys])
    fn = reduce_batches(spec.function, keys, arrow_schema(ctx, df.schema), label(spec))
    return keyed.mapInArrow(cancellable(fn, ctx.cancel_marker), df.schema)


def _aggregate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    aggregations = config_strings(spec, "aggregations")
    if not aggregations:
        raise ValueError(f"{label(spec)}: needs at least one aggregation")
    df = _single(spec, inputs)
    finals = _finals(df.schema)
    if finals:  # its input is what a combiner made: merge the partial aggregates
        if len(finals) != len(aggregations):
            raise ValueError(f"{label(spec)}: its input holds partial aggregates of {len(finals)} aggregation(s), "
                             f"not of its {len(aggregations)}")
        aggregations = finals
    grouped = df.groupBy(*[column_ref(k) for k in config_strings(spec, "keys")])
    return grouped.agg(*[F.expr(a) for a in aggregations])


def _finals(schema: StructType) -> list[str]:
    """The final aggregates a combiner left in its partial columns' metadata, in order."""
    found = {f.metadata[combine.INDEX_KEY]: f.metadata[combine.FINAL_KEY] for f in schema.fields
             if combine.FINAL_KEY in (f.metadata or {})}
    return [found[i] for i in sorted(found)]


# (input schema, keys, aggregations) -> the combiner's columns, or None: the aggregate does not split
_COMBINE_PLANS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[tuple[str, str, dict]] | None] = {}
_COMBINE_PLANS_KEPT = 256


def _combine(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate's combiner (`funke.common.task.combine`): per key, the partial aggregates, each
    column carrying in its metadata how the aggregate after the exchange merges it. When an
    aggregation does not split, the rows pass unchanged and that aggregate does all the work."""
    df = _single(spec, inputs)
    keys, aggregations = config_strings(spec, "keys"), config_strings(spec, "aggregations")
    cache_key = (df.schema.json(), tuple(keys), tuple(aggregations))
    if cache_key not in _COMBINE_PLANS:
        if len(_COMBINE_PLANS) >= _COMBINE_PLANS_KEPT:
            _COMBINE_PLANS.clear()
        _COMBINE_PLANS[cache_key] = _combine_plan(df, keys, aggregations)
    plan = _COMBINE_PLANS[cache_key]
    if plan is None:
        return df
    return df.groupBy(*[column_ref(k) for k in keys]).agg(
        *[F.expr(expr).alias(name, metadata=meta) for name, expr, meta in plan])


def _combine_plan(df: DataFrame, keys: list[str], aggregations: list[str]) -> list[tuple[str, str, dict]] | None:
    calls = [combine.parse_call(a) for a in aggregations]
    if any(c is None for c in calls):
        return None
    # The names and types the whole aggregate has (analysis only: no Spark job runs).
    whole = df.groupBy(*[column_ref(k) for k in keys]).agg(*[F.expr(a) for a in aggregations]).schema.fields
    outputs = whole[len(whole) - len(aggregations):]
    plan = []
    for i, (call, field_) in enumerate(zip(calls, outputs)):
        assert call is not None
        if call.function == "avg" and isinstance(field_.dataType, DecimalType):
            return None  # Spark averages decimals at a precision of their own
        final = combine.final(call, i, field_.name, field_.dataType.simpleString())
        for j, (name, expr) in enumerate(combine.partials(call, i)):
            meta = {combine.FINAL_KEY: final, combine.INDEX_KEY: i} if j == 0 else {}
            plan.append((name, expr, meta))
    return plan


def _count(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).groupBy(*[column_ref(k) for k in config_strings(spec, "keys")]).count()


def _join(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if len(inputs) != 2:
        raise ValueError(f"{label(spec)} takes two inputs (left, right), got {len(inputs)}")
    left, right = inputs
    return left.join(right, on=config_strings(spec, "on"), how=str(spec.config.get("how", "inner")))


def _union(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if not inputs:
        raise ValueError(f"{label(spec)} needs at least one input")
    return union_all(inputs)


def _transform(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    fn = cloudpickle.loads(spec.function)
    result = fn(_single(spec, inputs))
    if not isinstance(result, DataFrame):
        raise TypeError(f"{label(spec)}: the function returned {type(result).__name__}, not a DataFrame")
    return result


def _noop(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _union(ctx, spec, inputs)


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    # Pairwise, so that P inputs make a union tree of depth log P rather than a chain of P.
    level = list(frames)
    while len(level) > 1:
        level = [
            level[i].unionByName(level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0]


TRANSFORMS: dict[str, Transform] = {
    "map": _map,
    "flat_map": _flat_map,
    "filter": _filter,
    "select": _select,
    "where": _where,
    "reduce": _reduce,
    "aggregate": _aggregate,
    "combine": _combine,
    "count": _count,
    "join": _join,
    "union": _union,
    "transform": _transform,
    "noop": _noop,
}
