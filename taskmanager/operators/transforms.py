"""Transforms: `(ctx, spec, inputs: list[DataFrame]) -> DataFrame`. A chain's head gets all of
the vertex's inputs in input order; a chained operator gets one.

map, flat_map, filter and reduce run the user's Python function per row (`udf`, which tells the
calling convention); transform calls fn(DataFrame) -> DataFrame once on the driver with the whole
subtask input; the others are Spark SQL (select, where, aggregate, count, join, union). combine
is a keyed aggregate's combiner (`funke.common.aggregates`). running_aggregate keeps its totals,
and deduplicate the keys it saw, across a streaming query's batches in the keyed state store
(`keyedstate.folds`). The event-time operators (`funke.common.streaming.eventtime`): watermark observes
the batch's event times; window_aggregate, session_aggregate, deduplicate_within and
interval_join keep state the watermark closes, and count the rows it finds late; late_rows is
what a window operator left out.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator

import cloudpickle
import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.rdd import PythonEvalType
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import DecimalType, LongType, StructField, StructType, TimestampNTZType, TimestampType

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.streamingjob import DEFAULT_RETAIN, OUTPUT_MODE, RETAIN
from funke.common.streaming import eventtime, state
from funke.common.streaming.keygroups import key_group_range
from funke.common.streaming.state import OUTPUT_MODES
from funke.common import aggregates
from funke.taskmanager import batchexchange
from funke.taskmanager.routing import key_group_column
from funke.taskmanager.operators.classic import grouped_aggregate, select_exprs
from funke.taskmanager.operators.context import (
    RuntimeContext,
    Transform,
    arrow_schema,
    column_ref,
    config_schema,
    config_strings,
    config_value,
    label,
    parse_schema,
    union_all,
)
from funke.taskmanager.operators.keyedstate import (
    MARKER_COLUMN,
    deduplicate_batches,
    deduplicate_within_batches,
    interval_join_batches,
    session_aggregate_batches,
    process_batches,
    running_aggregate_batches,
    running_reduce_batches,
    window_aggregate_batches,
)
from funke.taskmanager.operators.keyedstate.process import state_schema as process_state_schema
from funke.taskmanager.operators.keyedstate.process import state_spec
from funke.taskmanager.operators.udf import cancellable, filter_batches, map_batches, reduce_batches

__all__ = ["TRANSFORMS", "python_map"]


def _single(spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if len(inputs) != 1:
        raise ValueError(f"{label(spec)} takes one input, got {len(inputs)}")
    return inputs[0]


def python_map(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, flat: bool) -> DataFrame:
    """The user's function per row of `df` (map, flat_map, a generating source.range), giving rows of
    config "schema"."""
    schema = config_schema(spec)
    return map_in_arrow(ctx, spec, df, schema, lambda: cancellable(
        map_batches(spec.function, arrow_schema(ctx, schema), label(spec), flat), ctx.cancel_marker))


def map_in_arrow(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, schema: StructType,
                 build: Callable[[], Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]]) -> DataFrame:
    """`df.mapInArrow(build(), schema)`; in a streaming task on classic Spark, with the UDF that
    wraps the function built once for the task (`ctx.memo`) rather than for every batch: pickling
    the function and registering it with the JVM costs 10-15 ms, a tenth of a small batch. Spark
    Connect, or a PySpark whose internals differ, builds it every time."""
    memo = ctx.memo
    if memo is None or not hasattr(df, "_jdf"):
        return df.mapInArrow(build(), schema)
    key = ("mapInArrow", id(spec))
    kept = memo.get(key)
    returns = schema.json()
    # The spec is kept too, so that its id stays its own; a schema that changed makes a new UDF.
    if kept is None or kept[0] is not spec or kept[1] != returns:
        udf = pandas_udf(build(), returnType=schema,  # type: ignore[call-overload]
                         functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        kept = memo[key] = (spec, returns, udf, {})
    udf, applied = kept[2], kept[3]
    if udf is None:
        return df.mapInArrow(build(), schema)
    try:
        # What DataFrame.mapInArrow does with the UDF it makes (pyspark/sql/pandas/map_ops.py),
        # applied to the columns by name (resolved against each batch's plan), so that the
        # applied UDF is built once per input columns, not per batch (10 round trips to the JVM).
        columns = tuple(df.columns)
        column = applied.get(columns)
        if column is None:
            column = applied[columns] = udf(*[column_ref(c) for c in columns])
        return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)
    except (AttributeError, TypeError, Py4JError):
        memo[key] = (spec, returns, None, {})
        return df.mapInArrow(build(), schema)


def _map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return python_map(ctx, spec, _single(spec, inputs), flat=False)


def _flat_map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return python_map(ctx, spec, _single(spec, inputs), flat=True)


def _filter(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    df = _single(spec, inputs)
    return map_in_arrow(ctx, spec, df, df.schema, lambda: cancellable(filter_batches(spec.function), ctx.cancel_marker))


def _select(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return select_exprs(ctx, _single(spec, inputs), config_strings(spec, "exprs"))


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
    return grouped_aggregate(ctx, df, config_strings(spec, "keys"), aggregations)


def _finals(schema: StructType) -> list[str]:
    """The final aggregates a combiner left in its partial columns' metadata, in order."""
    found = {f.metadata[aggregates.INDEX_KEY]: f.metadata[aggregates.FINAL_KEY] for f in schema.fields
             if aggregates.FINAL_KEY in (f.metadata or {})}
    return [found[i] for i in sorted(found)]


# (input schema, keys, aggregations) -> the combiner's columns, or None: the aggregate does not split
_COMBINE_PLANS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[tuple[str, str, dict]] | None] = {}
_COMBINE_PLANS_KEPT = 256


def _combine(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate's combiner (`funke.common.aggregates`): per key, the partial aggregates, each
    column carrying in its metadata how the aggregate after the exchange merges it. When an
    aggregation does not split, the rows pass unchanged and that aggregate does all the work."""
    df = _single(spec, inputs)
    if ctx.parallelism == 1 and ctx.meter is not None and ctx.meter.bytes <= batchexchange.ONE_PARTITION_LIMIT_BYTES:
        # A small micro-batch of the only producer subtask: combining would save the exchange a
        # few KiB and cost 10-20 ms of planning and a partial aggregate. Its rows pass as they
        # are, as for a call that does not split; each consumer's rows come from this subtask
        # alone, so no consumer mixes combined and uncombined rows.
        return df
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
    calls = [aggregates.parse_call(a) for a in aggregations]
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
        final = aggregates.final(call, i, field_.name, field_.dataType.simpleString())
        for j, (name, expr) in enumerate(aggregates.partials(call, i)):
            meta = {aggregates.FINAL_KEY: final, aggregates.INDEX_KEY: i} if j == 0 else {}
            plan.append((name, expr, meta))
    return plan


def _count(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).groupBy(*[column_ref(k) for k in config_strings(spec, "keys")]).count()


def _running_aggregate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate over every batch so far (`funke.common.streaming.state`): Spark computes
    the batch's partial aggregates per key, the state store in the Python workers merges them
    into the totals of the key's group, and the batch emits per the query's output mode."""
    df = _single(spec, inputs)
    keys, aggregations = config_strings(spec, "keys"), config_strings(spec, "aggregations")
    if ctx.batch is None or not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: a running aggregate runs in a streaming query, with its checkpoint")
    mode = _output_mode(ctx, spec)
    calls = [aggregates.parse_call(a) for a in aggregations]
    if any(c is None for c in calls):
        raise ValueError(f"{label(spec)}: {aggregates.RUNNING_ONLY}")
    # The names and types the totals have: those of the same aggregate over one batch.
    whole = df.groupBy(*[column_ref(k) for k in keys]).agg(*[F.expr(a) for a in aggregations]).schema
    partial_columns: list[tuple[str, str]] = []
    merged: list[tuple[str, tuple[str, ...]]] = []  # per call: its function and partial columns
    for i, (call, field_) in enumerate(zip(calls, whole.fields[len(keys):])):
        assert call is not None
        if call.function == "avg" and isinstance(field_.dataType, DecimalType):
            raise ValueError(f"{label(spec)}: a running avg() of a decimal column is not supported; "
                             f"cast it to double")
        parts = aggregates.partials(call, i)
        partial_columns += parts
        merged.append((call.function, tuple(name for name, _ in parts)))
    partial = df.groupBy(*[column_ref(k) for k in keys]).agg(
        *[F.expr(expr).alias(name) for name, expr in partial_columns])
    both, root, owned = _in_key_groups(ctx, partial, keys)
    state_schema = arrow_schema(ctx, partial.schema)
    out_schema = arrow_schema(ctx, whole)
    retain = int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN)
    assert ctx.batch is not None
    fn = running_aggregate_batches(root, keys, merged, ctx.batch.batch_id, mode, retain, state_schema, out_schema,
                                   owned, _lineage(ctx))
    return both.mapInArrow(cancellable(fn, ctx.cancel_marker), whole)


def _running_reduce(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed reduce over every batch so far: each key's record folded with the user's fn in the
    Python workers, the folded record kept in keyed state; emits per the query's output mode."""
    df = _single(spec, inputs)
    keys = config_strings(spec, "keys")
    if ctx.batch is None or not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: a running reduce runs in a streaming query, with its checkpoint")
    mode = _output_mode(ctx, spec)
    rows, root, owned = _in_key_groups(ctx, df, keys)
    record = arrow_schema(ctx, df.schema)
    state_schema = pa.schema([pa.field(f"__funke_key_{i}", record.field(k).type) for i, k in enumerate(keys)]
                             + list(record))
    fn = running_reduce_batches(spec.function, root, keys, ctx.batch.batch_id, mode,
                                int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN), state_schema, record, owned,
                                label(spec), _lineage(ctx))
    return rows.mapInArrow(cancellable(fn, ctx.cancel_marker), df.schema)


def _process(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed process function: the user's function per key and batch in the Python workers,
    with the key's typed state and timers from the keyed state store; emits what it returns."""
    df = _single(spec, inputs)
    keys = config_strings(spec, "keys")
    if ctx.batch is None or not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: a keyed process function runs in a streaming query, with its checkpoint")
    out = config_schema(spec)
    specs = []  # the row's layout: `funke.common.streaming.processlayout.ProcessLayout`
    for d in spec.config.get("state") or []:
        what = f"{label(spec)}: state {d['name']!r}"
        key_type = _state_type(ctx, d["key_type"], what + " (its key type)") if "key_type" in d else None
        specs.append(state_spec(d["name"], d["kind"], _state_type(ctx, d["type"], what), key_type, d.get("ttl_ms")))
    rows, root, owned = _in_key_groups(ctx, df, keys)
    record = arrow_schema(ctx, df.schema)
    state_schema = process_state_schema([record.field(k).type for k in keys], specs)
    fn = process_batches(spec.function, root, keys, ctx.batch.batch_id, ctx.batch.batch_time_ms,
                         int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN), specs, state_schema, record,
                         arrow_schema(ctx, out), owned, label(spec), ctx.batch.watermark_ms, _lineage(ctx))
    return rows.mapInArrow(cancellable(fn, ctx.cancel_marker), out)


def _state_type(ctx: RuntimeContext, text: str, what: str) -> pa.DataType:
    """A state's Spark type text as the Arrow type its column holds."""
    try:
        parsed = parse_schema(f"value {text}", what)
    except Exception as e:  # Spark's parse error names the text
        raise ValueError(f"{what}: {text!r} is not a Spark type ({str(e).splitlines()[0][:300]})") from None
    return arrow_schema(ctx, parsed).field(0).type


def _output_mode(ctx: RuntimeContext, spec: OperatorSpec) -> str:
    mode = ctx.options.get(OUTPUT_MODE, "").strip().lower()
    if mode not in OUTPUT_MODES:
        raise ValueError(f"{label(spec)}: the query's output mode ({OUTPUT_MODE}) is {mode!r}, "
                         f"expected one of {', '.join(OUTPUT_MODES)}")
    return mode


def _deduplicate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """drop_duplicates: in a bounded job, Spark's dropDuplicates (the input is HASH-partitioned on
    the keys, so each key's rows are all in this subtask); over a stream, also across batches: a
    key that any earlier batch had is dropped, the keys seen kept in keyed state."""
    df = _single(spec, inputs)
    keys = config_strings(spec, "keys")
    batch_unique = df.dropDuplicates(keys)
    if ctx.batch is None:
        return batch_unique
    if not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: drop_duplicates over a stream keeps its keys in the query's checkpoint, "
                         "and the task has none")
    rows, root, owned = _in_key_groups(ctx, batch_unique, keys)
    fn = deduplicate_batches(root, keys, ctx.batch.batch_id, int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN),
                             arrow_schema(ctx, StructType([df.schema[k] for k in keys])), arrow_schema(ctx, df.schema),
                             owned, _lineage(ctx))
    return rows.mapInArrow(cancellable(fn, ctx.cancel_marker), df.schema)


def _in_key_groups(ctx: RuntimeContext, df: DataFrame, keys: list[str]) -> tuple[DataFrame, str, range]:
    """`df` with each row's key group, plus a marker row for every group this subtask owns (so
    each writes its version even without rows this batch), in Spark partitions by group; and the
    operator's state directory, its key groups checked against the ones its state has; and the
    groups the subtask owns."""
    key_groups = ctx.max_parallelism
    owned = key_group_range(key_groups, ctx.parallelism, ctx.subtask_index)
    # The column the exchange into this vertex routed the rows by: the subtask has all their groups.
    rows = (df.withColumn(state.KEY_GROUP_COLUMN, key_group_column(keys, key_groups))
            .withColumn(MARKER_COLUMN, F.lit(False)))
    markers = ctx.spark.range(owned.start, owned.stop).select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields],
        F.col("id").cast("int").alias(state.KEY_GROUP_COLUMN), F.lit(True).alias(MARKER_COLUMN))
    both = rows.unionByName(markers).repartition(min(_local_partitions(ctx), len(owned)),
                                                 column_ref(state.KEY_GROUP_COLUMN))
    root = state.operator_dir(ctx.checkpoint, ctx.vertex_id)
    _check_key_groups(root, ctx.vertex_id, key_groups)
    return both, root, owned


def _lineage(ctx: RuntimeContext) -> state.OperatorLineage:
    """Which run's files make each version of the vertex's state, and the token this batch writes
    with (the batch's lineage; a batch without one reads and writes files as funke 0.3.0 did)."""
    assert ctx.batch is not None
    return ctx.batch.state.operator(ctx.vertex_id) if ctx.batch.state is not None else state.LEGACY


_KEY_GROUPS_CHECKED: set[tuple[str, int]] = set()


def _check_key_groups(root: str, vertex_id: str, key_groups: int) -> None:
    """Records the operator's number of key groups with its first state, and refuses to run with
    another (its keys would look for their state in other groups)."""
    if (root, key_groups) in _KEY_GROUPS_CHECKED:
        return
    path = os.path.join(root, state.METADATA)
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        # One name per writer: the subtasks of one TaskManager are threads of one process.
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(state.metadata_text(key_groups))
        try:
            os.link(tmp, path)  # the first writer's stays: two subtasks starting at once agree
        except FileExistsError:
            pass
        finally:
            os.remove(tmp)
    with open(path) as f:
        problem = state.key_groups_problem(f.read(), vertex_id, key_groups)
    if problem is not None:
        raise ValueError(problem)
    _KEY_GROUPS_CHECKED.add((root, key_groups))


# --- event time (funke.common.streaming.eventtime) -------------------------------------------

WINDOW_START_COLUMN = "__funke_window_start"  # a row's window, as its start in epoch ms


def _event_time_ms(spec: OperatorSpec, df: DataFrame, column: str) -> Column:
    """The event time column as epoch ms; a column that is not a timestamp is an error naming it."""
    if column not in df.columns:
        raise ValueError(f"{label(spec)}: no column {column!r} for event time (columns: {', '.join(df.columns)})")
    data_type = df.schema[column].dataType
    if not isinstance(data_type, (TimestampType, TimestampNTZType)):
        raise ValueError(f"{label(spec)}: event time column {column!r} is {data_type.simpleString()}, not a timestamp "
                         f"(cast it first, e.g. select(\"*\", \"timestamp_millis({column}) AS ts\"))")
    return _millis_of(column_ref(column), isinstance(data_type, TimestampNTZType))


def _millis_of(time: Column, ntz: bool) -> Column:
    """A timestamp as epoch ms; a timestamp_ntz (a wall-clock time) as if in UTC, whatever the
    session's zone."""
    if ntz:
        return F.timestamp_diff("MILLISECOND", F.expr("TIMESTAMP_NTZ '1970-01-01 00:00:00'"), time)
    return F.unix_millis(time)


def _as_event_time(spec: OperatorSpec, df: DataFrame) -> Callable[[Column], Column]:
    """Epoch ms back to the event time column's type: a timestamp, or for a timestamp_ntz (a
    wall-clock time, its ms read as if in UTC) a timestamp_ntz, as Spark's window() gives."""
    if isinstance(df.schema[str(config_value(spec, "column"))].dataType, TimestampNTZType):
        epoch = F.expr("TIMESTAMP_NTZ '1970-01-01 00:00:00'")
        return lambda ms: F.timestamp_add("MILLISECOND", ms, epoch)
    return F.timestamp_millis


def _watermark(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """with_watermark: the rows pass unchanged; in a streaming query the smallest, largest and
    average event time of the batch's rows are observed for the JobManager, which moves the
    query's watermark with them."""
    df = _single(spec, inputs)
    ms = _event_time_ms(spec, df, str(config_value(spec, "column")))
    if ctx.batch is None or ctx.meter is None:
        return df
    operator = eventtime.operator_id(ctx.vertex_id, ctx.meter.at)
    if spec.config.get("per_partition") is True:
        _observe_per_partition(ctx, spec, df, ms, operator)
        return df
    observation = Observation()
    ctx.meter.event_time[operator] = observation
    return df.observe(observation, F.min(ms).alias("min"), F.max(ms).alias("max"),
                      F.sum(ms.cast("double")).alias("sum"), F.count(ms).alias("count"))


def _observe_per_partition(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, ms: Column, operator: str) -> None:
    """A per-partition watermark: the batch's event times per (topic, partition), each under its
    partition key. Observation has no grouping, so this is an action of its own, on the rows the
    Kafka source holds already (a local relation: no second read)."""
    missing = [c for c in ("topic", "partition") if c not in df.columns]
    if missing:
        raise ValueError(f"{label(spec)}: a per-partition watermark needs the Kafka source's topic and partition "
                         f"columns, and its rows have no {', '.join(missing)}")
    assert ctx.meter is not None
    rows = (df.groupBy("topic", "partition")
            .agg(F.min(ms).alias("min"), F.max(ms).alias("max"), F.sum(ms.cast("double")).alias("sum"),
                 F.count(ms).alias("count"))
            .collect())
    for row in rows:
        if row["topic"] is None or row["partition"] is None:
            continue
        ctx.meter.event_time[eventtime.partition_key(operator, row["topic"], row["partition"])] = row.asDict()


def _windowed(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> tuple[DataFrame, Column, int, int]:
    """`df` with each row's window start (a row of a sliding window once per window; a row
    without event time once, with a null start), the condition that the row is late for that
    window, and the window's size and allowed lateness in ms."""
    lateness = int(spec.config.get("lateness_ms") or 0)
    if spec.config.get("gap_ms") is not None:  # a session window: a row's own is [its time, + gap)
        size = slide = int(config_value(spec, "gap_ms"))
    else:
        size, slide = int(config_value(spec, "size_ms")), int(config_value(spec, "slide_ms"))
    problem = eventtime.window_problem(size, slide, lateness)
    if problem:
        raise ValueError(f"{label(spec)}: {problem}")
    ms = _event_time_ms(spec, df, str(config_value(spec, "column")))
    last = ms - F.pmod(ms, F.lit(slide))
    if spec.config.get("gap_ms") is not None:
        windowed = df.withColumn(WINDOW_START_COLUMN, ms)
    elif slide == size:
        start = last
        windowed = df.withColumn(WINDOW_START_COLUMN, start)
    else:  # the windows whose span holds the row, earliest first (eventtime.windows_of)
        n = -(-size // slide)
        starts = F.filter(F.sequence(last - F.lit((n - 1) * slide), last, F.lit(slide)), lambda s: s > ms - F.lit(size))
        windowed = df.select("*", F.explode_outer(starts).alias(WINDOW_START_COLUMN))
    start_col = F.col(WINDOW_START_COLUMN)
    watermark = ctx.batch.watermark_ms if ctx.batch is not None else None
    late = start_col.isNull()
    if watermark is not None:
        late = late | (start_col + F.lit(size + lateness) <= F.lit(watermark))
    return windowed, late, size, lateness


def _windows_over_a_stream(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, windowed: DataFrame,
                           late: Column, keys: list[str], aggregations: list[str], what: str
                           ) -> tuple[str, DataFrame, list[StructField], list[tuple[str, str]], list]:
    """What every window operator over a stream does first: its output mode, its on-time rows
    (the late ones counted for the progress records), the fields of its totals (as the same
    aggregates over the input would have them), their partial columns, and per aggregate its
    function and partial columns (`keyedstate.folds.AggregateSpec`)."""
    if not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: a window aggregate over a stream keeps its {what} in the query's "
                         "checkpoint, and the task has none")
    mode = ctx.options.get(OUTPUT_MODE, "append").strip().lower() or "append"
    if mode not in ("append", "update"):
        raise ValueError(f"{label(spec)}: a window aggregate emits in append or update mode, not {mode!r}")
    calls = [aggregates.parse_call(a) for a in aggregations]
    if any(c is None for c in calls):
        raise ValueError(f"{label(spec)}: {aggregates.RUNNING_ONLY}")
    assert ctx.meter is not None
    counted = Observation()
    ctx.meter.late.append(counted)
    on_time = windowed.observe(counted, F.sum(late.cast("long")).alias("late")).where(~late)
    totals = df.groupBy(*[column_ref(k) for k in keys]).agg(*[F.expr(a) for a in aggregations]).schema.fields[len(keys):]
    partial_columns: list[tuple[str, str]] = []
    merged: list[tuple[str, tuple[str, ...]]] = []
    for i, (call, field_) in enumerate(zip(calls, totals)):
        assert call is not None
        if call.function == "avg" and isinstance(field_.dataType, DecimalType):
            raise ValueError(f"{label(spec)}: avg() of a decimal column is not supported in a window; cast it to double")
        parts = aggregates.partials(call, i)
        partial_columns += parts
        merged.append((call.function, tuple(name for name, _ in parts)))
    return mode, on_time, list(totals), partial_columns, merged


def _window_aggregate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate per window of event time. In a bounded job, over the whole input. In a
    streaming query, the rows late for their window are counted and left out (the query's
    late-data stream has them), Spark computes the batch's partial aggregates per key and
    window, and the state store merges them into each window's totals, emits and closes windows
    per the watermark (`keyedstate.eventtime.window_aggregate_batches`). The output: the keys,
    window_start and window_end (timestamps), then the aggregates."""
    df = _single(spec, inputs)
    keys, aggregations = config_strings(spec, "keys"), config_strings(spec, "aggregations")
    windowed, late, size, lateness = _windowed(ctx, spec, df)
    group = [column_ref(k) for k in keys] + [F.col(WINDOW_START_COLUMN)]
    as_time = _as_event_time(spec, df)

    def finish(result: DataFrame) -> DataFrame:
        start = F.col(WINDOW_START_COLUMN)
        return result.select(*[column_ref(k) for k in keys],
                             as_time(start).alias("window_start"),
                             as_time(start + F.lit(size)).alias("window_end"),
                             *[column_ref(c) for c in result.columns[len(keys) + 1:]])

    if ctx.batch is None:  # a bounded job: every row is on time
        return finish(windowed.where(~late).groupBy(*group).agg(*[F.expr(a) for a in aggregations]))
    mode, on_time, totals, partial_columns, merged = _windows_over_a_stream(ctx, spec, df, windowed, late, keys,
                                                                             aggregations, "windows")
    whole = StructType([df.schema[k] for k in keys] + [StructField(WINDOW_START_COLUMN, LongType())] + totals)
    # One exchange: the rows (and each owned group's marker) go to their key group's Spark
    # partition first, and the partial aggregation then needs no exchange of its own (grouping by
    # the key group first, it is already clustered by it)
    both, root, owned = _in_key_groups(ctx, on_time, keys)
    partial = both.groupBy(F.col(state.KEY_GROUP_COLUMN), F.col(MARKER_COLUMN), *group).agg(
        *[F.expr(expr).alias(name) for name, expr in partial_columns])
    state_fields = [partial.schema[k] for k in keys] + [partial.schema[WINDOW_START_COLUMN]] + [
        partial.schema[name] for name, _ in partial_columns]
    state_schema = pa.schema(list(arrow_schema(ctx, StructType(state_fields)))
                             + [pa.field(state.REMOVED_COLUMN, pa.bool_())])
    fn = window_aggregate_batches(root, len(keys), merged, ctx.batch.batch_id, mode,
                                  int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN), state_schema,
                                  arrow_schema(ctx, whole), owned, ctx.batch.watermark_ms, size, lateness,
                                  _lineage(ctx))
    return finish(partial.mapInArrow(cancellable(fn, ctx.cancel_marker), whole))


def _deduplicate_within(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """drop_duplicates_within_watermark: one row per key while the key's first row is within the
    watermark's delay (Structured Streaming's dropDuplicatesWithinWatermark): each key is kept
    in keyed state until the watermark passes its first row's event time plus the delay, so the
    state stays bounded. A row older than the watermark, or without event time, is late: counted
    (numLateRows) and left out, since its key's state may be gone already."""
    df = _single(spec, inputs)
    keys = config_strings(spec, "keys")
    column, delay = str(config_value(spec, "column")), int(config_value(spec, "delay_ms"))
    ms = _event_time_ms(spec, df, column)
    if ctx.batch is None:
        return df.dropDuplicates(keys)
    if not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: drop_duplicates_within_watermark keeps its keys in the query's checkpoint, "
                         "and the task has none")
    watermark = ctx.batch.watermark_ms
    late = ms.isNull() if watermark is None else (ms.isNull() | (ms < F.lit(watermark)))
    assert ctx.meter is not None
    counted = Observation()
    ctx.meter.late.append(counted)
    on_time = df.observe(counted, F.sum(late.cast("long")).alias("late")).where(~late)
    expiring = on_time.dropDuplicates(keys).withColumn("__expires", ms + F.lit(delay))
    rows, root, owned = _in_key_groups(ctx, expiring, keys)
    state_schema = pa.schema(list(arrow_schema(ctx, StructType([df.schema[k] for k in keys])))
                             + [pa.field("__expires", pa.int64()), pa.field(state.REMOVED_COLUMN, pa.bool_())])
    fn = deduplicate_within_batches(root, [df.columns.index(k) for k in keys], ctx.batch.batch_id,
                                    int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN), state_schema,
                                    arrow_schema(ctx, df.schema), owned, watermark, _lineage(ctx))
    return rows.mapInArrow(cancellable(fn, ctx.cancel_marker), df.schema)


def _session_aggregate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate per session window of event time (a key's events no more than the gap
    apart; Spark's session_window): Spark makes the batch's own sessions per key with their
    partial aggregates, and the state store merges them with the key's open sessions
    (`keyedstate.eventtime.session_aggregate_batches`). A row is late when its own session [its time,
    + gap) is closed. The output: the keys, window_start, window_end, then the aggregates."""
    df = _single(spec, inputs)
    keys, aggregations = config_strings(spec, "keys"), config_strings(spec, "aggregations")
    column = str(config_value(spec, "column"))
    windowed, late, gap, lateness = _windowed(ctx, spec, df)
    as_time = _as_event_time(spec, df)
    session = F.session_window(column_ref(column), f"{gap} milliseconds").alias("__funke_session")
    by = [column_ref(k) for k in keys]

    ntz = isinstance(df.schema[column].dataType, TimestampNTZType)

    def bounds(frame: DataFrame) -> list[Column]:
        return [_millis_of(F.col("__funke_session.start"), ntz).alias(WINDOW_START_COLUMN),
                _millis_of(F.col("__funke_session.end"), ntz).alias("__funke_window_end")]

    def finish(result: DataFrame) -> DataFrame:
        return result.select(*by, as_time(F.col(WINDOW_START_COLUMN)).alias("window_start"),
                             as_time(F.col("__funke_window_end")).alias("window_end"),
                             *[column_ref(c) for c in result.columns[len(keys) + 2:]])

    if ctx.batch is None:
        grouped = windowed.where(~late).groupBy(*by, session).agg(*[F.expr(a).alias(f"__a{i}")
                                                                     for i, a in enumerate(aggregations)])
        named = df.groupBy(*by).agg(*[F.expr(a) for a in aggregations]).columns[len(keys):]
        return finish(grouped.select(*by, *bounds(grouped),
                                     *[F.col(f"__a{i}").alias(n) for i, n in enumerate(named)]))
    mode, on_time, totals, partial_columns, merged = _windows_over_a_stream(ctx, spec, df, windowed, late, keys,
                                                                             aggregations, "sessions")
    grouped = on_time.groupBy(*by, session).agg(*[F.expr(expr).alias(name) for name, expr in partial_columns])
    partial = grouped.select(*by, *bounds(grouped), *[F.col(name) for name, _ in partial_columns])
    both, root, owned = _in_key_groups(ctx, partial, keys)
    state_schema = pa.schema(list(arrow_schema(ctx, partial.schema)) + [pa.field(state.REMOVED_COLUMN, pa.bool_())])
    out = StructType(partial.schema.fields[:len(keys) + 2] + totals)
    fn = session_aggregate_batches(root, len(keys), merged, ctx.batch.batch_id, mode,
                                   int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN), state_schema,
                                   arrow_schema(ctx, out), owned, ctx.batch.watermark_ms, lateness, _lineage(ctx))
    return finish(both.mapInArrow(cancellable(fn, ctx.cancel_marker), out))


def _interval_join(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """An interval join of two streams on equal keys (Flink's intervalJoin): a left row at time a
    joins the right rows at b with a + lower <= b <= a + upper. Over a stream each side's rows
    are kept in keyed state until the watermark says nothing they could join can come any more
    (`keyedstate.eventtime.interval_join_batches`); a left outer join emits a left row without a match
    then, once. A row older than the watermark is late: counted and left out. In a bounded job,
    Spark's join with the same condition. The output: the keys, the left's other columns, the
    right's (one named as a left column gets `_right` appended)."""
    if len(inputs) != 2:
        raise ValueError(f"{label(spec)} takes two inputs, got {len(inputs)}")
    left, right = inputs
    keys = config_strings(spec, "keys")
    how = str(spec.config.get("how", "inner")).lower()
    lower, upper = int(config_value(spec, "lower_ms")), int(config_value(spec, "upper_ms"))
    left_ms = _event_time_ms(spec, left, str(config_value(spec, "left_time")))
    right_ms = _event_time_ms(spec, right, str(config_value(spec, "right_time")))
    for k in keys:
        if k not in left.columns or k not in right.columns:
            raise ValueError(f"{label(spec)}: key {k!r} is not a column of both inputs (left: {', '.join(left.columns)}; "
                             f"right: {', '.join(right.columns)})")
    left_cols = [c for c in left.columns if c not in keys]
    right_cols = [c for c in right.columns if c not in keys]
    right_names = [f"{c}_right" if c in left_cols else c for c in right_cols]
    if ctx.batch is None:  # a bounded job: Spark's join with the time condition
        l, r = left.alias("__left"), right.alias("__right")
        condition = [F.col(f"__left.`{k}`") == F.col(f"__right.`{k}`") for k in keys]
        l_ms = _millis_of(F.col(f"__left.`{config_value(spec, 'left_time')}`"),
                          isinstance(left.schema[str(config_value(spec, "left_time"))].dataType, TimestampNTZType))
        r_ms = _millis_of(F.col(f"__right.`{config_value(spec, 'right_time')}`"),
                          isinstance(right.schema[str(config_value(spec, "right_time"))].dataType, TimestampNTZType))
        condition += [r_ms >= l_ms + F.lit(lower), r_ms <= l_ms + F.lit(upper)]
        joined = l.join(r, on=functools.reduce(lambda a, b: a & b, condition), how="left" if how == "left" else "inner")
        return joined.select(*[F.col(f"__left.`{k}`").alias(k) for k in keys],
                             *[F.col(f"__left.`{c}`").alias(c) for c in left_cols],
                             *[F.col(f"__right.`{c}`").alias(n) for c, n in zip(right_cols, right_names)])
    if not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: an interval join of streams keeps its rows in the query's checkpoint, and "
                         "the task has none")
    left_tagged = [F.col(f"`{c}`").alias(f"__l{i}") for i, c in enumerate(left_cols)]
    right_tagged = [F.col(f"`{c}`").alias(f"__r{i}") for i, c in enumerate(right_cols)]
    left_nulls = [F.lit(None).cast(left.schema[c].dataType).alias(f"__l{i}") for i, c in enumerate(left_cols)]
    right_nulls = [F.lit(None).cast(right.schema[c].dataType).alias(f"__r{i}") for i, c in enumerate(right_cols)]
    key_types = {k: left.schema[k].dataType for k in keys}
    both = left.select(*[column_ref(k) for k in keys], F.lit(0).cast("tinyint").alias("__side"),
                       left_ms.alias("__ts"), *left_tagged, *right_nulls).unionByName(
        right.select(*[column_ref(k).cast(key_types[k]).alias(k) for k in keys], F.lit(1).cast("tinyint").alias("__side"),
                     right_ms.alias("__ts"), *left_nulls, *right_tagged))
    watermark = ctx.batch.watermark_ms
    late = F.col("__ts").isNull()
    if watermark is not None:
        late = late | (F.col("__ts") < F.lit(watermark))
    assert ctx.meter is not None
    counted = Observation()
    ctx.meter.late.append(counted)
    on_time = both.observe(counted, F.sum(late.cast("long")).alias("late")).where(~late)
    rows, root, owned = _in_key_groups(ctx, on_time, keys)
    arrow = arrow_schema(ctx, on_time.schema)
    n_keys = len(keys)
    state_schema = pa.schema(list(arrow)[:n_keys] + [pa.field("__side", pa.int8()), pa.field("__row", pa.string()),
                                                     pa.field("__ts", pa.int64()), pa.field("__matched", pa.bool_())]
                             + list(arrow)[n_keys + 2:] + [pa.field(state.REMOVED_COLUMN, pa.bool_())])
    out = StructType([on_time.schema[k] for k in keys] + [f for f in on_time.schema.fields[n_keys + 2:]])
    fn = interval_join_batches(root, n_keys, ctx.batch.batch_id, int(ctx.options.get(RETAIN, "") or DEFAULT_RETAIN),
                               state_schema, on_time.columns, len(left_cols), arrow_schema(ctx, out), owned,
                               watermark, lower, upper, how == "left", _lineage(ctx))
    joined = rows.mapInArrow(cancellable(fn, ctx.cancel_marker), out)
    return joined.select(*[column_ref(k) for k in keys],
                         *[F.col(f"__l{i}").alias(c) for i, c in enumerate(left_cols)],
                         *[F.col(f"__r{i}").alias(n) for i, n in enumerate(right_names)])


def _late_rows(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """The rows a window operator finds late, once per window they missed: the row's columns,
    then window_start and window_end (null for a row without event time) and the watermark the
    batch ran with. The same rule as the window operator's (`_windowed`), so that every row
    and window is in exactly one of the two."""
    df = _single(spec, inputs)
    windowed, late, size, _ = _windowed(ctx, spec, df)
    as_time = _as_event_time(spec, df)
    start = F.col(WINDOW_START_COLUMN)
    watermark = ctx.batch.watermark_ms if ctx.batch is not None else None
    missed = as_time(F.lit(watermark)) if watermark is not None else as_time(F.lit(None).cast("bigint"))
    return windowed.where(late).select(
        *[column_ref(c) for c in df.columns], as_time(start).alias("window_start"),
        as_time(start + F.lit(size)).alias("window_end"), missed.alias("watermark"))


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
    "running_aggregate": _running_aggregate,
    "running_reduce": _running_reduce,
    "deduplicate": _deduplicate,
    "process": _process,
    "watermark": _watermark,
    "window_aggregate": _window_aggregate,
    "late_rows": _late_rows,
    "session_aggregate": _session_aggregate,
    "interval_join": _interval_join,
    "deduplicate_within": _deduplicate_within,
    "join": _join,
    "union": _union,
    "transform": _transform,
    "noop": _noop,
}
