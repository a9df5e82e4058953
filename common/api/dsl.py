"""The DataStream DSL: how users write funke jobs, the way they would in Flink or PySpark.

Owns the job-building API (`ExecutionEnvironment`, `DataStream`, `KeyedStream`, `DataStreamSink`,
`CollectSink`, `StreamReader`) and the checks of what users pass to it; `build()` hands the
operators it recorded to `translate.py`, which makes the `JobGraph` (chains, vertex ids, edges).
It owns nothing about running a job: the operator kinds and their configuration keys come from
`graph/operators.py`, the rules a graph must satisfy from `graph/validation.py`, and what each
kind does from the TaskManager.

This module is pure (no I/O, no Spark): the client imports it to build a job before anything
else, so it must import fast. cloudpickle and the validator (networkx) are imported only when
they are first needed.

    env = ExecutionEnvironment("word count", parallelism=2)
    words = env.read_text("data/*.txt").flat_map(str.split, schema="word string")
    words.key_by("word").count().collect()
    job = env.build()

Calling convention of the Python functions given to `map`, `flat_map`, `filter`, `reduce` and
`generate` (implemented by the TaskManager): a record whose schema has a single column is passed
as the bare value (a line of text is a `str`); a record with several columns is passed as a
`pyspark.sql.Row`. Results follow the same rule against the declared output schema: a bare value
for a single-column schema, otherwise a `Row`, a tuple in schema order or a dict keyed by column
name. `flat_map` returns an iterable of such results, `filter` a truth value, `reduce(a, b)` one
record of the input's schema, and `generate`'s function receives the row number (an int).
`transform` functions take a whole `pyspark.sql.DataFrame` and return one.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Callable, Iterable, Mapping, Self, Sequence, TypeVar

from funke.common import ids
from funke.common.api.translate import (
    BATCH_SHUFFLE_MODE,
    OPERATOR_CHAINING,
    RECEIVERS_GROUP,
    Chaining,
    Exchange,
    ExchangeKind,
    Plan,
    Transformation,
    translate,
)
from funke.common.graph.jobgraph import (
    Artifact,
    FailoverStrategyKind,
    JobGraph,
    JobType,
    RestartStrategyConfig,
)
from funke.common.graph.operators import JOIN_TYPES, SINK_MODES
from funke.common.graph.streamingjob import ALL_OUTPUT_MODES, OUTPUT_MODE, REDIS, SOCKET, STREAM_SOURCE_KINDS
from funke.common.streaming.sources.delta import DELTA_MODES

__all__ = [
    "BATCH_SHUFFLE_MODE",
    "OPERATOR_CHAINING",
    "CollectSink",
    "DataStream",
    "DataStreamSink",
    "ExecutionEnvironment",
    "KeyedStream",
    "StreamReader",
    "WindowedDataStream",
    "WindowedStream",
]

UID_MAX_LENGTH = 128


_JOIN_TYPES = JOIN_TYPES


_WRITE_MODES = frozenset(SINK_MODES)


class _OperatorHandle:
    """Per-operator settings, shared by streams and sinks. Each applies to the last operator
    the handle stands for and returns the handle, so settings chain after the call that
    created the operator."""

    __slots__ = ("_env", "_t")

    def __init__(self, env: ExecutionEnvironment, t: Transformation) -> None:
        self._env = env
        self._t = t

    def set_parallelism(self, parallelism: int) -> Self:
        self._t.parallelism = _positive_int(parallelism, "parallelism")
        return self

    def set_max_parallelism(self, max_parallelism: int) -> Self:
        """The number of key groups of keyed operators, and the upper bound for rescaling."""
        self._t.max_parallelism = _positive_int(max_parallelism, "max parallelism")
        return self

    def name(self, name: str) -> Self:
        """The name shown in the vertex name, the dashboard and `funke status`."""
        self._t.name = _non_empty_str(name, "name")
        return self

    def uid(self, uid: str) -> Self:
        """A stable id, unique within the job; it becomes the JobVertex id when this operator
        heads a chain (otherwise vertex ids are generated from the head operator's kind)."""
        # At most 128 characters, so that the ids derived from it (data sets "<uid>.out0", edges
        # "<uid>-><uid>") stay within the id limits.
        self._env._register_uid(self._t, ids.require_path_id(_non_empty_str(uid, "uid"), "uid", UID_MAX_LENGTH))
        return self

    def slot_sharing_group(self, group: str) -> Self:
        """Operators in different groups never share a slot (and so never chain). Without a
        group an operator inherits its inputs' group when they all agree, else "default"."""
        self._t.slot_sharing_group = _label(group, "slot-sharing group")
        return self

    def co_location_group(self, group: str) -> Self:
        """Subtask i of every operator in the group runs in the same slot."""
        self._t.co_location_group = _label(group, "co-location group")
        return self

    def disable_chaining(self) -> Self:
        """Chain this operator to neither its predecessor nor its successor."""
        self._t.chaining = Chaining.NEVER
        return self

    def start_new_chain(self) -> Self:
        """Begin a new chain at this operator; its successors may still chain to it."""
        if self._t.chaining is not Chaining.NEVER:
            self._t.chaining = Chaining.HEAD
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._t.name!r}>"


_SinkT = TypeVar("_SinkT", bound="DataStreamSink")


class DataStream(_OperatorHandle):
    """A stream of records produced by one operator. Transformations return new streams;
    settings (`set_parallelism`, `name`, ...) apply to the operator that produced this one."""

    __slots__ = ("_exchange",)

    def __init__(self, env: ExecutionEnvironment, t: Transformation, exchange: Exchange | None = None) -> None:
        super().__init__(env, t)
        self._exchange = exchange

    # ---- record-at-a-time transformations ----

    def map(self, fn: Callable[[Any], Any], schema: str | None = None) -> DataStream:
        """One output record per input record. `schema` (a Spark DDL string such as
        "word string, n int") is required: the output of a Python function cannot be inferred."""
        return self._one_input("map", "Map", {"schema": _output_schema(schema, "map")}, _pickled(fn, "map"))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], schema: str | None = None) -> DataStream:
        """Zero or more output records per input record; `fn` returns an iterable of them."""
        return self._one_input("flat_map", "FlatMap", {"schema": _output_schema(schema, "flat_map")},
                               _pickled(fn, "flat_map"))

    def filter(self, fn: Callable[[Any], Any]) -> DataStream:
        """Keeps the records for which `fn` is truthy; the schema is unchanged."""
        return self._one_input("filter", "Filter", {}, _pickled(fn, "filter"))

    # ---- SQL-expression transformations (run as Spark expressions, no Python per record) ----

    def select(self, *exprs: str) -> DataStream:
        """Like DataFrame.selectExpr: `select("word", "length(word) as n")`."""
        if not exprs:
            raise TypeError("select() needs at least one SQL expression, e.g. select(\"word\", \"n * 2 as twice\")")
        return self._one_input("select", "Select", {"exprs": [_sql(e, "select() expression") for e in exprs]})

    def where(self, condition: str) -> DataStream:
        """Like DataFrame.where with a SQL condition: `where("n > 3 and word <> 'the'")`."""
        return self._one_input("where", "Where", {"condition": _sql(condition, "where() condition")})

    def transform(self, fn: Callable[[Any], Any]) -> DataStream:
        """Applies a DataFrame -> DataFrame function to each subtask's share of the data."""
        return self._one_input("transform", "Transform", {}, _pickled(fn, "transform"))

    # ---- multi-input operators ----

    def join(self, other: DataStream, on: str | Sequence[str], how: str = "inner") -> DataStream:
        """Joins with `other` on equally named key columns (like DataFrame.join). Both inputs are
        hash-partitioned on the keys, which supersedes any partitioning set on them."""
        self._env._check_same_env(other, "join")
        keys = _keys(on, "join")
        if not isinstance(how, str) or how.lower() not in _JOIN_TYPES:
            raise ValueError(f"join(): unknown join type {how!r} (accepted: {', '.join(sorted(_JOIN_TYPES))})")
        hashed = Exchange(ExchangeKind.HASH, keys)
        t = self._env._add("join", "Join", {"on": list(keys), "how": how.lower()},
                           inputs=((self._t, hashed), (other._t, hashed)))
        return DataStream(self._env, t)

    def interval_join(self, other: DataStream, on: str | Sequence[str], lower: str | int, upper: str | int, *,
                      time: str | tuple[str, str] = "ts", how: str = "inner") -> DataStream:
        """Joins two streams on equal keys within a time bound (Flink's intervalJoin; Structured
        Streaming's stream-stream join with a time condition): each row a of this stream joins
        the rows b of `other` whose event time lies in [a.time + lower, a.time + upper]
        (`lower`/`upper`: durations such as "-5 min" and "5 min", or ms). `time`: the event time
        column of both streams, or (this one's, other's). Both need with_watermark on it: the
        watermark says when a row can no longer find a match, and leaves the state.

        `how`: "inner", or "left": a row of this stream that found no match is emitted once,
        with nulls for `other`'s columns, when its match can no longer arrive. The output has
        the keys, this stream's other columns, then `other`'s (a name both have gets `_right`
        on `other`'s side)."""
        self._env._check_same_env(other, "interval_join")
        keys = _keys(on, "interval_join")
        left_time, right_time = (time, time) if isinstance(time, str) else tuple(time)
        if not isinstance(how, str) or how.lower() not in ("inner", "left", "leftouter", "left_outer"):
            raise ValueError(f"interval_join(): how must be 'inner' or 'left', got {how!r}")
        lower_ms, upper_ms = _signed_millis(lower, "interval_join() lower"), _signed_millis(upper, "interval_join() upper")
        if lower_ms > upper_ms:
            raise ValueError(f"interval_join(): lower ({lower!r}) must not be after upper ({upper!r})")
        hashed = Exchange(ExchangeKind.HASH, keys)
        t = self._env._add("interval_join", "Interval join",
                           {"keys": list(keys), "how": how.lower(), "left_time": _column_name(left_time, "interval_join"),
                            "right_time": _column_name(right_time, "interval_join"), "lower_ms": lower_ms,
                            "upper_ms": upper_ms},
                           inputs=((self._t, hashed), (other._t, hashed)))
        return DataStream(self._env, t)

    def union(self, *others: DataStream) -> DataStream:
        """All records of this stream and of `others` (which must have the same schema). The
        union's inputs are numbered in call order: this stream first."""
        for o in others:
            self._env._check_same_env(o, "union")
        inputs = tuple((s._t, s._exchange) for s in (self, *others))
        return DataStream(self._env, self._env._add("union", "Union", {}, inputs=inputs))

    # ---- partitioning (applies to the edge into the next operator) ----

    def key_by(self, *keys: str | Sequence[str]) -> KeyedStream:
        """Hash-partitions on the key columns; the keyed operators follow on the KeyedStream."""
        flat: list[str] = []
        for k in keys:
            flat.extend([k] if isinstance(k, str) else k)
        return KeyedStream(self._env, self._t, _keys(flat, "key_by"))

    def drop_duplicates(self, *columns: str | Sequence[str]) -> DataStream:
        """One record per distinct value of `columns` (Spark's dropDuplicates(cols)): in a bounded
        job, of the whole input; over a stream, of everything so far: a record whose key any
        earlier batch had is dropped, the keys seen kept in keyed state (which grows with the
        distinct keys: there is no watermark to bound it yet). Which record of a key a batch
        keeps when it has several is not defined, as in Spark."""
        if not columns:
            raise ValueError("drop_duplicates() needs the columns that make two records duplicates, "
                             "e.g. drop_duplicates(\"id\")")
        keyed = self.key_by(*columns)
        return keyed._one_input("deduplicate", "Deduplicate", {"keys": list(keyed._keys)})

    def drop_duplicates_within_watermark(self, *columns: str | Sequence[str]) -> DataStream:
        """One record per distinct value of `columns` among records whose event times lie within
        the watermark's delay of each other (Structured Streaming's
        dropDuplicatesWithinWatermark): a key is remembered until the watermark passes its first
        record's event time plus the delay of the stream's with_watermark, so the state stays
        bounded, unlike drop_duplicates(). A record older than the watermark is late: counted in
        the progress records' numLateRows and left out."""
        if not columns:
            raise ValueError("drop_duplicates_within_watermark() needs the columns that make two records "
                             "duplicates, e.g. drop_duplicates_within_watermark(\"id\")")
        watermark = self._upstream_watermark()
        if watermark is None:
            raise ValueError("drop_duplicates_within_watermark() needs with_watermark(column, delay) upstream: the "
                             "watermark says when a key can be forgotten")
        keyed = self.key_by(*columns)
        return keyed._one_input("deduplicate_within", "Deduplicate within watermark",
                                {"keys": list(keyed._keys), "column": watermark.config["column"],
                                 "delay_ms": watermark.config["delay_ms"]})

    def _upstream_watermark(self) -> Transformation | None:
        """The nearest with_watermark this stream comes from (None: none)."""
        queue, seen = [self._t], set()
        while queue:
            t = queue.pop(0)
            if t.kind == "watermark":
                return t
            if t.seq not in seen:
                seen.add(t.seq)
                queue.extend(i for i, _ in t.inputs)
        return None

    def with_watermark(self, column: str, delay: str | int) -> DataStream:
        """Declares `column` (a timestamp) this stream's event time, and a watermark that trails
        the largest event time seen by `delay` ("10 s", "1 min"; a bare number is ms), as
        Structured Streaming's withWatermark: a window closes once the watermark passes its end,
        and a row for a closed window is late (counted, and in the window's `late_data()`).
        Over several inputs the query's watermark is the smallest of theirs
        (`env.set_watermark_policy("max")`: the largest). The rows pass unchanged."""
        column = _column_name(column, "with_watermark")
        return self._one_input("watermark", f"Watermark {column}"[:200],
                               {"column": column, "delay_ms": _millis(delay, "with_watermark() delay")})

    def rebalance(self) -> DataStream:
        """Round-robin to all downstream subtasks."""
        return DataStream(self._env, self._t, Exchange(ExchangeKind.REBALANCE))

    def rescale(self) -> DataStream:
        """Round-robin to a local subset of downstream subtasks (POINTWISE): cheaper than
        rebalance when parallelisms are multiples of each other."""
        return DataStream(self._env, self._t, Exchange(ExchangeKind.RESCALE))

    def broadcast(self) -> DataStream:
        """Every record to every downstream subtask."""
        return DataStream(self._env, self._t, Exchange(ExchangeKind.BROADCAST))

    def forward(self) -> DataStream:
        """Subtask i feeds subtask i; both sides must have the same parallelism (checked by
        build()). Such an edge still chains when the other chaining rules allow."""
        return DataStream(self._env, self._t, Exchange(ExchangeKind.FORWARD))

    # ---- sinks ----

    def write_parquet(self, path: str, mode: str = "error", **options: Any) -> DataStreamSink:
        return self._write("sink.parquet", "Sink: Parquet", path, mode, options)

    def write_csv(self, path: str, mode: str = "error", header: bool = True, **options: Any) -> DataStreamSink:
        """CSV files under the directory `path`; `header` defaults to True like read_csv."""
        return self._write("sink.csv", "Sink: CSV", path, mode, {"header": header, **options})

    def write_json(self, path: str, mode: str = "error", **options: Any) -> DataStreamSink:
        return self._write("sink.json", "Sink: JSON", path, mode, options)

    def write_text(self, path: str, mode: str = "error", **options: Any) -> DataStreamSink:
        """Text files, one line per record; the stream must have a single string column."""
        return self._write("sink.text", "Sink: Text", path, mode, options)

    def write_delta(self, path: str, mode: str = "append") -> DataStreamSink:
        """Into the Delta table at `path` (created when there is none; a local path or file://
        URI), as one Delta transaction: in a bounded job once it FINISHED, in a streaming query
        once per batch, recording the query's id and the batch id so that a batch run again is
        not written twice. `mode`: "append" or "overwrite" (replace the table's rows: in a
        streaming query each batch does, as complete output mode emits every key)."""
        if mode not in DELTA_MODES:
            raise ValueError(f"write_delta: unknown mode {mode!r} (accepted: {', '.join(DELTA_MODES)})")
        return self._sink("sink.delta", "Sink: Delta", {"path": _location(path), "mode": mode}, DataStreamSink)

    def print(self) -> DataStreamSink:
        """Prints the records to the TaskManagers' standard output."""
        return self._sink("sink.print", "Sink: Print", {}, DataStreamSink)

    def collect(self) -> CollectSink:
        """Keeps the records for the client; the returned handle names the vertex whose results
        the client fetches once the job has FINISHED."""
        return self._sink("sink.collect", "Sink: Collect", {}, CollectSink)

    def discard(self) -> DataStreamSink:
        """Computes the stream and drops the records (for measurements and side effects)."""
        return self._sink("sink.discard", "Sink: Discard", {}, DataStreamSink)

    def write_redis(self, key: str, *, host: str = "127.0.0.1", port: int = 6379, db: int = 0) -> DataStreamSink:
        """A streaming query's sink into Redis stream `key`: each row one entry (one field per
        column, its value as text; nulls left out), each batch appended once, in one
        transaction with a marker key, so a batch run again after a failure is not appended
        twice (see docs/streaming/sources-sinks.md)."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"write_redis: key must be a non-empty string, got {key!r}")
        return self._sink("sink.redis", f"Sink: redis {key}"[:200],
                          {"key": key, "host": host, "port": _port(port, "write_redis"), "db": _db(db)}, DataStreamSink)

    def foreach_batch(self, fn: Callable[[Any, int], None]) -> DataStreamSink:
        """A streaming query's sink that calls `fn(df, batch_id)` on a TaskManager for every
        micro-batch, as Structured Streaming's foreachBatch does: `df` is the batch's rows as a
        PySpark DataFrame, to write anywhere Spark writes. Its parallelism is 1, so that one call
        sees the whole batch (`set_parallelism(n)`: each of n subtasks gets its share, and calls
        `fn` with it). A batch that runs again after a failure calls `fn` again with the same
        batch id and the same rows: write idempotently, keyed by the batch id, for exactly-once
        output."""
        t = self._env._add("sink.foreach_batch", "Sink: ForeachBatch", {}, _pickled(fn, "foreach_batch"),
                           inputs=((self._t, self._exchange),))
        t.parallelism = 1
        self._env._sinks.append(t)
        return DataStreamSink(self._env, t)

    # ---- helpers ----

    def _one_input(self, kind: str, name: str, config: dict[str, Any], function: bytes = b"") -> DataStream:
        t = self._env._add(kind, name, config, function, inputs=((self._t, self._exchange),))
        return DataStream(self._env, t)

    def _write(self, kind: str, name: str, path: str, mode: str, options: Mapping[str, Any]) -> DataStreamSink:
        if mode not in _WRITE_MODES:
            raise ValueError(f"{kind}: unknown write mode {mode!r} (accepted: {', '.join(sorted(_WRITE_MODES))})")
        config: dict[str, Any] = {"path": _location(path), "mode": mode}
        if spark_options := _spark_options(options, kind):
            config["options"] = spark_options
        return self._sink(kind, name, config, DataStreamSink)

    def _sink(self, kind: str, name: str, config: dict[str, Any], handle: type[_SinkT]) -> _SinkT:
        t = self._env._add(kind, name, config, inputs=((self._t, self._exchange),))
        self._env._sinks.append(t)
        return handle(self._env, t)


class KeyedStream(DataStream):
    """A stream hash-partitioned on key columns (from `key_by`). Keyed operators group by the
    keys; any other operator applied to a KeyedStream simply receives hash-partitioned input.

    Over a stream (a streaming query), `count()` and `aggregate()` are *running*: each key's
    totals cover every batch so far, kept in keyed state (Flink's keyed sum, Structured
    Streaming's streaming aggregation), and the query's output mode (`env.set_output_mode`)
    says what each batch emits. `per_batch()` aggregates each batch on its own instead."""

    __slots__ = ("_keys", "_per_batch")

    def __init__(self, env: ExecutionEnvironment, t: Transformation, keys: tuple[str, ...],
                 per_batch: bool = False) -> None:
        super().__init__(env, t, Exchange(ExchangeKind.HASH, keys))
        self._keys = keys
        self._per_batch = per_batch

    def per_batch(self) -> KeyedStream:
        """The same keyed stream whose count/reduce/aggregate cover each micro-batch on its own
        (Spark Streaming's reduceByKey per batch; funke's streaming aggregates before running
        totals). In a bounded job there is one batch: the same as without it."""
        return KeyedStream(self._env, self._t, self._keys, per_batch=True)

    def count(self) -> DataStream:
        """One record per key: the key columns and `count` (bigint), like groupBy().count()."""
        if self._running():
            return self._one_input("running_aggregate", "Count",
                                   {"keys": list(self._keys), "aggregations": ["count(1) AS `count`"]})
        return self._one_input("count", "Count", {"keys": list(self._keys)})

    def reduce(self, fn: Callable[[Any, Any], Any]) -> DataStream:
        """Folds each key's records pairwise with `fn(a, b)`, which returns one record of the
        same schema (see the module docstring for how records are passed)."""
        if self._running():
            return self._one_input("running_reduce", "Reduce", {"keys": list(self._keys)}, _pickled(fn, "reduce"))
        return self._one_input("reduce", "Reduce", {"keys": list(self._keys)}, _pickled(fn, "reduce"))

    def aggregate(self, *aggregations: str) -> DataStream:
        """SQL aggregate expressions per key: `aggregate("sum(n) as total", "max(n) as top")`;
        the output has the key columns followed by one column per expression. Running totals
        over a stream take count, sum, min, max and avg (mean)."""
        if not aggregations:
            raise TypeError("aggregate() needs at least one SQL aggregate, e.g. aggregate(\"sum(n) as total\")")
        exprs = [_sql(a, "aggregate() expression") for a in aggregations]
        if self._running():
            from funke.common.aggregates import RUNNING_ONLY, parse_call

            bad = [e for e in exprs if parse_call(e) is None]
            if bad:
                raise ValueError(f"aggregate() over a stream: {', '.join(repr(b) for b in bad)}: {RUNNING_ONLY}; "
                                 "per_batch().aggregate(...) takes any SQL aggregate")
            return self._one_input("running_aggregate", "Aggregate", {"keys": list(self._keys), "aggregations": exprs})
        return self._one_input("aggregate", "Aggregate", {"keys": list(self._keys), "aggregations": exprs})

    def process(self, fn: Any, schema: str | None = None, *, state: Sequence[Any] | None = None,
                on_timer: Callable[[Any, int, Any], Any] | None = None) -> DataStream:
        """A keyed process function over a stream (Flink's KeyedStream.process, Structured
        Streaming's transformWithState): per key and micro-batch, `fn` gets the key, the key's
        rows of the batch and a context with the key's typed state (`state`: ValueState,
        ListState, MapState of `funke.common.api.state`, each with an optional TTL) and
        processing-time timers, and returns or yields rows of `schema` (a Spark DDL string).
        The state lives in the query's checkpoint, per key group, so the query restores and
        rescales with it.

        `fn` is a `KeyedProcessFunction` (or any object with process(key, rows, ctx), and
        optionally open(ctx) and on_timer(key, timestamp, ctx), and its state in `state`), or a
        plain function process(key, rows, ctx) with `on_timer` and `state` given here."""
        from funke.common.api import state as state_api

        if self._per_batch:
            raise ValueError("process() keeps keyed state across batches, which per_batch() says this keyed stream "
                             "does not have: call process() on key_by(...) itself")
        if not self._running():
            raise ValueError("process() keeps keyed state across a streaming query's batches; this stream is "
                             "bounded (read_stream... makes a streaming query)")
        out = _output_schema(schema, "process")
        declared = list(state if state is not None else getattr(fn, "state", ()))
        bad = [d for d in declared if not isinstance(d, state_api._StateDescriptor)]
        if bad:
            raise TypeError(f"process(): state takes ValueState, ListState and MapState handles, got {bad[0]!r}")
        if hasattr(fn, "process") and callable(fn.process):
            if on_timer is not None:
                raise TypeError("process(): on_timer= is for a plain function; define on_timer on the object")
            function: Any = fn
        elif callable(fn):
            function = state_api.KeyedProcessFunction()
            function.process = fn  # type: ignore[method-assign]
            if on_timer is not None:
                if not callable(on_timer):
                    raise TypeError(f"process(): on_timer must be a function, got {type(on_timer).__name__}")
                function.on_timer = on_timer  # type: ignore[method-assign]
        else:
            raise TypeError(f"process() needs a KeyedProcessFunction or a function, got {type(fn).__name__}")
        import cloudpickle

        cloudpickle.register_pickle_by_value(state_api)  # the workers need not have funke
        config = {"keys": list(self._keys), "schema": out, "state": [d.spec() for d in declared]}
        return self._one_input("process", "Process", config, _pickled(function, "process", need_callable=False))

    def window(self, column: str, size: str | int, slide: str | int | None = None) -> WindowedStream:
        """Windows over event time `column` (a timestamp), per key: tumbling windows of `size`
        ("1 min"), or with `slide` ("10 s") sliding ones, each row in every window that holds it
        (Spark's window(column, size, slide); windows aligned to the epoch). Aggregate them with
        count() or aggregate(...): one row per key and window, with window_start and window_end.

        Over a stream the windows are kept in keyed state until the watermark (with_watermark
        on `column`, upstream) passes their end; append mode emits each window once, then, and
        update mode each batch it changed. A row for a window already closed is late: counted in
        the progress records, and in `late_data()` of the result."""
        if self._per_batch:
            raise ValueError("window() keeps each window across batches until the watermark closes it; call it on "
                             "key_by(...), not on per_batch()")
        column = _column_name(column, "window")
        size_ms = _millis(size, "window() size")
        slide_ms = size_ms if slide is None else _millis(slide, "window() slide")
        from funke.common.streaming.eventtime import window_problem

        problem = window_problem(size_ms, slide_ms)
        if problem:
            raise ValueError(f"window(): {problem}")
        return WindowedStream(self, column, size_ms, slide_ms, 0)

    def session_window(self, column: str, gap: str | int) -> WindowedStream:
        """Session windows over event time `column`, per key: a key's events no more than `gap`
        apart ("30 s") make one session, from its first event to its last plus the gap (Spark's
        session_window, Flink's EventTimeSessionWindows). Sessions grow and merge as rows come,
        across batches; the watermark closes them. A row is late when the session it would
        open on its own, [its time, + gap), is already closed."""
        if self._per_batch:
            raise ValueError("session_window() keeps each session across batches until the watermark closes it; "
                             "call it on key_by(...), not on per_batch()")
        column = _column_name(column, "session_window")
        gap_ms = _millis(gap, "session_window() gap")
        if gap_ms <= 0:
            raise ValueError(f"session_window(): the gap must be positive, got {gap!r}")
        return WindowedStream(self, column, gap_ms, gap_ms, 0, session=True)

    def _running(self) -> bool:
        """Whether this keyed stream's aggregates keep totals across batches: it reads a stream
        and per_batch() was not asked for."""
        if self._per_batch:
            return False
        stack, seen = [self._t], set()
        while stack:
            t = stack.pop()
            if t.kind in STREAM_SOURCE_KINDS:
                return True
            if t.seq not in seen:
                seen.add(t.seq)
                stack.extend(i for i, _ in t.inputs)
        return False


class WindowedStream:
    """A keyed stream cut into windows of event time (`KeyedStream.window`): aggregate it with
    count() or aggregate(...)."""

    __slots__ = ("_keyed", "_column", "_size_ms", "_slide_ms", "_lateness_ms", "_session")

    def __init__(self, keyed: KeyedStream, column: str, size_ms: int, slide_ms: int, lateness_ms: int,
                 session: bool = False) -> None:
        self._keyed, self._column = keyed, column
        self._size_ms, self._slide_ms, self._lateness_ms = size_ms, slide_ms, lateness_ms
        self._session = session  # a session window: size is the gap

    def allowed_lateness(self, delay: str | int) -> WindowedStream:
        """Keeps each window open `delay` past the watermark passing its end (Flink's
        allowedLateness): a row that comes meanwhile still counts; update mode emits the window
        again, append mode emits it once, when it finally closes."""
        return WindowedStream(self._keyed, self._column, self._size_ms, self._slide_ms,
                              _millis(delay, "allowed_lateness()"), self._session)

    def count(self) -> WindowedDataStream:
        """Per key and window: the keys, window_start, window_end and `count` (bigint)."""
        return self._aggregate(["count(1) AS `count`"], "Window count")

    def aggregate(self, *aggregations: str) -> WindowedDataStream:
        """Per key and window: the keys, window_start, window_end, then one column per SQL
        aggregate (count, sum, min, max, avg): aggregate("sum(amount) AS total")."""
        if not aggregations:
            raise TypeError("aggregate() needs at least one SQL aggregate, e.g. aggregate(\"sum(n) as total\")")
        from funke.common.aggregates import RUNNING_ONLY, parse_call

        exprs = [_sql(a, "aggregate() expression") for a in aggregations]
        bad = [e for e in exprs if parse_call(e) is None]
        if bad:
            raise ValueError(f"aggregate() over windows: {', '.join(repr(b) for b in bad)}: {RUNNING_ONLY}")
        return self._aggregate(exprs, "Window aggregate")

    def _config(self) -> dict[str, Any]:
        if self._session:
            return {"column": self._column, "gap_ms": self._size_ms, "lateness_ms": self._lateness_ms}
        return {"column": self._column, "size_ms": self._size_ms, "slide_ms": self._slide_ms,
                "lateness_ms": self._lateness_ms}

    def _aggregate(self, exprs: list[str], name: str) -> WindowedDataStream:
        keyed = self._keyed
        clash = [k for k in keyed._keys if k in ("window_start", "window_end")]
        if clash:
            raise ValueError(f"window(): key column {clash[0]!r} has the name of a window column; rename it first")
        kind = "session_aggregate" if self._session else "window_aggregate"
        t = keyed._env._add(kind, name, {"keys": list(keyed._keys), "aggregations": exprs, **self._config()},
                            inputs=((keyed._t, keyed._exchange),))
        return WindowedDataStream(keyed._env, t, self)


class WindowedDataStream(DataStream):
    """The result of a window aggregate; `late_data()` is the stream of what its windows missed."""

    __slots__ = ("_windows",)

    def __init__(self, env: ExecutionEnvironment, t: Transformation, windows: WindowedStream) -> None:
        super().__init__(env, t)
        self._windows = windows

    def late_data(self) -> DataStream:
        """The rows that came after their window closed (Flink's side output of late data),
        once per window they missed: the row's columns, then window_start, window_end and the
        watermark the batch ran with (window_start and window_end are null for a row without an
        event time). Write it to any sink; without it late rows are counted (the progress
        records' numLateRows), never silently dropped from that count."""
        w = self._windows
        keyed = w._keyed
        t = self._env._add("late_rows", "Late data", w._config(), inputs=((keyed._t, keyed._exchange),))
        return DataStream(self._env, t)


class DataStreamSink(_OperatorHandle):
    """The end of a pipeline; takes the same per-operator settings as a stream."""

    __slots__ = ()


class CollectSink(DataStreamSink):
    """The handle `collect()` returns: the client fetches the rows committed for `vertex_id`."""

    __slots__ = ()

    @property
    def vertex_id(self) -> str:
        """The id of the JobVertex this sink runs in, in the graph the last `build()` returned
        (or would return now, before the first build). The sink is often chained behind other
        operators, so this is the chain's id, not necessarily one derived from the sink."""
        return self._env._vertex_id_of(self._t)


class ExecutionEnvironment:
    """Collects the operators and the job configuration, and builds the JobGraph.

    `job_type` is "batch" (every exchange BLOCKING) or "streaming" (PIPELINED); `parallelism`
    is the default for operators that do not set their own."""

    def __init__(self, name: str, job_type: str | JobType = "batch", parallelism: int = 1) -> None:
        self.name = _non_empty_str(name, "job name")
        self.job_type = _job_type(job_type)
        self.parallelism = _positive_int(parallelism, "parallelism")
        self._transformations: list[Transformation] = []
        self._sinks: list[Transformation] = []
        self._uids: dict[str, Transformation] = {}
        self._restart_strategy: RestartStrategyConfig | None = None
        self._failover_strategy: FailoverStrategyKind | None = None
        self._slot_request_timeout_s: float | None = None
        self._options: dict[str, str] = {}
        self._artifacts: dict[str, Artifact] = {}
        self._built_vertex_ids: dict[int, str] | None = None

    # ---- job configuration ----

    def set_parallelism(self, parallelism: int) -> Self:
        self.parallelism = _positive_int(parallelism, "parallelism")
        return self

    def set_restart_strategy(self, kind: str, **options: Any) -> Self:
        """Flink's strategy name and option suffixes as keywords, underscores for dashes:
        `set_restart_strategy("fixed-delay", attempts=3, delay="10 s")`. Durations are Flink
        duration strings ("10 s", "500 ms"; a bare number means milliseconds) or timedeltas."""
        from funke.common.graph.restart import RestartStrategyError, restart_strategy_from_config

        config = RestartStrategyConfig(
            _non_empty_str(kind, "restart strategy"),
            {key.replace("_", "-"): _option_text(value) for key, value in options.items()},
        )
        try:  # fail here, at the line that set it, rather than at build()
            restart_strategy_from_config(config)
        except RestartStrategyError as exc:
            raise ValueError(f"set_restart_strategy(): {exc}") from None
        self._restart_strategy = config
        return self

    def set_failover_strategy(self, kind: str | FailoverStrategyKind) -> Self:
        """Either "region" (restart only the failed pipelined region) or "full" (every task)."""
        try:
            self._failover_strategy = FailoverStrategyKind(kind.lower() if isinstance(kind, str) else kind)
        except ValueError:
            accepted = ", ".join(k.value for k in FailoverStrategyKind)
            raise ValueError(f"unknown failover strategy {kind!r} (accepted: {accepted})") from None
        return self

    def set_slot_request_timeout(self, seconds: float) -> Self:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"slot request timeout must be a positive number of seconds, got {seconds!r}")
        self._slot_request_timeout_s = float(seconds)
        return self

    def set_option(self, key: str, value: Any) -> Self:
        """A Flink-style configuration option, stored as text (booleans as "true"/"false")."""
        self._options[_non_empty_str(key, "option key")] = _option_text(value)
        return self

    def set_output_mode(self, mode: str) -> Self:
        """What each batch of a streaming query emits (Structured Streaming's output modes):
        "append" (the default: each row once; queries without running aggregates), "update"
        (the keys a batch changed, with their new totals) or "complete" (every key's total, every
        batch). A query with a running count/aggregate must say update or complete."""
        if not isinstance(mode, str) or mode.strip().lower() not in ALL_OUTPUT_MODES:
            raise ValueError(f"output mode must be one of {', '.join(ALL_OUTPUT_MODES)}, got {mode!r}")
        return self.set_option(OUTPUT_MODE, mode.strip().lower())

    def set_watermark_policy(self, policy: str) -> Self:
        """How the query's watermark follows several watermarked inputs: "min" (default: the
        slowest input, so no input's rows are late because another ran ahead) or "max" (the
        fastest; Structured Streaming's spark.sql.streaming.multipleWatermarkPolicy)."""
        from funke.common.streaming.eventtime import POLICIES, WATERMARK_POLICY

        if not isinstance(policy, str) or policy.strip().lower() not in POLICIES:
            raise ValueError(f"set_watermark_policy(): expected one of {', '.join(POLICIES)}, got {policy!r}")
        self._options[WATERMARK_POLICY] = policy.strip().lower()
        return self

    def disable_operator_chaining(self) -> Self:
        """Every operator becomes its own JobVertex (Flink's pipeline.operator-chaining.enabled)."""
        return self.set_option(OPERATOR_CHAINING, False)

    def add_artifact(self, name: str, content: bytes) -> Self:
        """A file the job's code needs on the TaskManagers (a module, a zip, a lookup table)."""
        name = ids.require_path_id(_non_empty_str(name, "artifact name"), "artifact name")
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError(f"artifact {name!r}: content must be bytes, got {type(content).__name__}")
        if name in self._artifacts:
            raise ValueError(f"artifact {name!r} is added twice")
        self._artifacts[name] = Artifact(name, bytes(content))
        return self

    # ---- sources ----

    def read_text(self, path: str, **options: Any) -> DataStream:
        """One record per line, in a single string column `value` (Spark's text source)."""
        return self._file_source("source.text", "Source: text", path, None, options)

    def read_parquet(self, path: str, **options: Any) -> DataStream:
        return self._file_source("source.parquet", "Source: parquet", path, None, options)

    def read_csv(self, path: str, schema: str | None = None, header: bool = True, **options: Any) -> DataStream:
        """CSV files; without a schema, columns are read as strings named from the header."""
        return self._file_source("source.csv", "Source: CSV", path, schema, {"header": header, **options})

    def read_json(self, path: str, schema: str | None = None, **options: Any) -> DataStream:
        """JSON Lines files; without a schema Spark infers one."""
        return self._file_source("source.json", "Source: JSON", path, schema, options)

    def read_delta(self, path: str, version: int | None = None,
                   timestamp: str | datetime.datetime | None = None) -> DataStream:
        """A Delta table (a local path or file:// URI) at `version`, or as of `timestamp` (the
        newest version committed at or before it; ISO 8601, UTC when it names no offset), or as
        it is when the job is submitted; its data files are split across the subtasks."""
        config: dict[str, Any] = {"path": _location(path)}
        if version is not None and timestamp is not None:
            raise ValueError("read_delta: give version or timestamp, not both")
        if version is not None:
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise ValueError(f"read_delta: version must be an integer from 0, got {version!r}")
            config["version"] = version
        if timestamp is not None:
            config["timestamp"] = timestamp.isoformat() if isinstance(timestamp, datetime.datetime) else \
                _non_empty_str(timestamp, "read_delta: timestamp")
        return self._source("source.delta", "Source: Delta", config)

    def from_range(self, start: int, end: int | None = None, step: int = 1) -> DataStream:
        """The numbers [start, end) by `step` in a bigint column `id`; `from_range(n)` is 0..n-1."""
        if end is None:
            start, end = 0, start
        return self._source("source.range", "Source: range", _range_config(start, end, step))

    def generate(self, n: int, fn: Callable[[int], Any], schema: str) -> DataStream:
        """`n` records, record i being `fn(i)` in the given schema (a Spark DDL string)."""
        config = {**_range_config(0, n, 1), "schema": _output_schema(schema, "generate")}
        return self._source("source.range", "Source: generate", config, _pickled(fn, "generate"))

    def from_collection(self, rows: Iterable[Any], schema: str) -> DataStream:
        """A small in-memory data set that travels inside the job graph. Rows are tuples or
        lists in schema order, dicts keyed by column name, or bare values for a single column;
        values must be JSON types (str, int, float, bool, None, lists, dicts)."""
        schema = _output_schema(schema, "from_collection")
        columns = _ddl_column_names(schema)
        normalised = [_collection_row(row, columns, i) for i, row in enumerate(rows)]
        return self._source("source.collection", "Source: collection", {"rows": normalised, "schema": schema})

    # ---- streaming queries ----

    @property
    def read_stream(self) -> StreamReader:
        """Unbounded sources: reading one makes this a streaming query, run as micro-batches
        (`env.read_stream.rate(100)`, `env.read_stream.csv("incoming/", "user string, n int")`)."""
        return StreamReader(self)

    def set_trigger(self, processing_time: str | None = None, *, available_now: bool = False,
                    once: bool = False) -> Self:
        """When micro-batches run: every `processing_time` ("1 s", "500 ms"; the default, 1 s),
        `available_now` (what the sources hold at the start, in batches within their limits,
        then the job FINISHES) or `once` (one batch of everything, then FINISHED)."""
        from funke.common.graph import streamingjob as sj

        chosen = [name for name, on in (("processing_time", processing_time is not None),
                                        ("available_now", available_now), ("once", once)) if on]
        if len(chosen) != 1:
            raise ValueError(f"set_trigger(): give exactly one of processing_time, available_now, once; got {chosen or 'none'}")
        self._options.pop(sj.INTERVAL, None)
        if processing_time is not None:
            self._options[sj.TRIGGER] = "processing-time"
            self._options[sj.INTERVAL] = _option_text(processing_time)
        else:
            self._options[sj.TRIGGER] = "available-now" if available_now else "once"
        return self

    def set_checkpoint_location(self, path: str) -> Self:
        """Where the query keeps its offset and commit logs; a query started again on it goes on
        where it stopped (default: under the JobManager's data directory, by job name)."""
        from funke.common.graph import streamingjob as sj

        self._options[sj.CHECKPOINT] = _location(path)
        return self

    # ---- building ----

    def build(self) -> JobGraph:
        """The JobGraph for every operator that leads to a sink, validated. Operators whose
        results reach no sink are left out, as Spark leaves out what no action needs."""
        from funke.common.graph.validation import validate

        job, vertex_ids = translate(self.logical_plan())
        validate(job)
        self._built_vertex_ids = vertex_ids
        return job

    def execute(self, job_name: str | None = None, **options: Any) -> Any:
        """Build the job, run it and wait until it ends (PyFlink's `env.execute()`). Returns a
        JobExecutionResult (status, duration, metrics, and the rows of `collect()` sinks through
        `.collect()`, `.to_arrow()`, `.to_pandas()`); raises JobFailed if the job did not finish.

        Where it runs: `jobmanager="HOST:PORT"`, else $FUNKE_JOBMANAGER, else the local cluster
        (`funke cluster start`), else an embedded mini cluster that this process starts on first
        use and that ends with it. Under `funke submit`, the cluster that command names."""
        from funke.common.api.execution import current_executor

        if job_name is not None:
            self.name = _non_empty_str(job_name, "job name")
        return current_executor().execute(self.build(), wait=True, **options)

    def execute_async(self, job_name: str | None = None, **options: Any) -> Any:
        """Submit the job and return at once with a JobClient (PyFlink's shape: `get_job_id()`,
        `get_job_status()`, `cancel()`, `get_job_execution_result()`; for a streaming query also
        `stop(drain=...)`, `progress()` and `batches()`). Runs where `execute` would."""
        from funke.common.api.execution import current_executor

        if job_name is not None:
            self.name = _non_empty_str(job_name, "job name")
        return current_executor().execute(self.build(), wait=False, **options)

    def logical_plan(self) -> Plan:
        """The operators and the configuration as they stand: what `build` translates."""
        return Plan(self.name, self.job_type, self.parallelism, tuple(self._transformations), tuple(self._sinks),
                    frozenset(self._uids), dict(self._options), self._restart_strategy, self._failover_strategy,
                    self._slot_request_timeout_s, tuple(self._artifacts.values()))

    # ---- internals used by the handles ----

    def _add(self, kind: str, name: str, config: dict[str, Any], function: bytes = b"", *,
             inputs: tuple[tuple[Transformation, Exchange | None], ...] = ()) -> Transformation:
        try:  # configs travel as JSON; fail at the call that made one that is not
            json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name}: configuration is not JSON-serialisable: {exc}") from None
        t = Transformation(len(self._transformations), kind, name, config, function, inputs)
        self._transformations.append(t)
        return t

    def _source(self, kind: str, name: str, config: dict[str, Any], function: bytes = b"") -> DataStream:
        return DataStream(self, self._add(kind, name, config, function))

    def _file_source(self, kind: str, name: str, path: str, schema: str | None,
                     options: Mapping[str, Any]) -> DataStream:
        config: dict[str, Any] = {"path": _location(path)}
        if schema is not None:
            config["schema"] = _output_schema(schema, kind)
        if spark_options := _spark_options(options, kind):
            config["options"] = spark_options
        return self._source(kind, name, config)

    def _register_uid(self, t: Transformation, uid: str) -> None:
        owner = self._uids.get(uid)
        if owner is not None and owner is not t:
            raise ValueError(f"uid {uid!r} is already used by operator {owner.name!r}; uids must be unique in a job")
        if t.uid is not None:
            del self._uids[t.uid]
        t.uid = uid
        self._uids[uid] = t

    def _check_same_env(self, other: object, operation: str) -> None:
        if not isinstance(other, DataStream):
            raise TypeError(f"{operation}() takes DataStreams, got {type(other).__name__}")
        if other._env is not self:
            raise ValueError(f"{operation}(): the streams belong to different ExecutionEnvironments")

    def _vertex_id_of(self, t: Transformation) -> str:
        if self._built_vertex_ids is not None and t.seq in self._built_vertex_ids:
            return self._built_vertex_ids[t.seq]
        return translate(self.logical_plan())[1][t.seq]


class StreamReader:
    """The unbounded sources of an ExecutionEnvironment (`env.read_stream`). Each micro-batch
    reads exactly the offset range its write-ahead log entry names, so a batch run again after a
    failure reads the same rows."""

    def __init__(self, env: ExecutionEnvironment):
        self._env = env

    def _stream(self, kind: str, name: str, config: dict[str, Any]) -> DataStream:
        self._env.job_type = JobType.STREAMING
        return self._env._source(kind, name, config)

    def rate(self, rows_per_second: int, max_rows_per_trigger: int | None = None) -> DataStream:
        """Rows `value` (bigint, 0, 1, 2, ...) and `timestamp` (when each row was due),
        `rows_per_second` of them (Spark's rate source); value i is read by subtask
        i % parallelism."""
        config: dict[str, Any] = {"rows_per_second": _positive_int(rows_per_second, "rows_per_second")}
        if max_rows_per_trigger is not None:
            config["max_rows_per_trigger"] = _positive_int(max_rows_per_trigger, "max_rows_per_trigger")
        return self._stream("source.rate", "Source: rate", config)

    def _files(self, fmt: str, path: str, schema: str | None, max_files_per_trigger: int | None,
               options: Mapping[str, Any]) -> DataStream:
        kind = f"source.stream.{fmt}"
        config: dict[str, Any] = {"path": _location(path)}
        if schema is not None:
            config["schema"] = _output_schema(schema, kind)
        if max_files_per_trigger is not None:
            config["max_files_per_trigger"] = _positive_int(max_files_per_trigger, "max_files_per_trigger")
        if spark_options := _spark_options(options, kind):
            config["options"] = spark_options
        return self._stream(kind, f"Source: {fmt} files", config)

    def text(self, path: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        """Each new file in directory `path`, once, one record per line in column `value`. Write
        files elsewhere and rename them in: a file is taken as soon as it is listed."""
        return self._files("text", path, None, max_files_per_trigger, options)

    def csv(self, path: str, schema: str, header: bool = True, max_files_per_trigger: int | None = None,
            **options: Any) -> DataStream:
        return self._files("csv", path, schema, max_files_per_trigger, {"header": header, **options})

    def json(self, path: str, schema: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        return self._files("json", path, schema, max_files_per_trigger, options)

    def parquet(self, path: str, schema: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        return self._files("parquet", path, schema, max_files_per_trigger, options)

    def json_lines(self, path: str, schema: str, max_files_per_trigger: int | None = None) -> DataStream:
        """The lines of the JSON-lines files in directory `path`, read incrementally: lines
        appended to a file and new files are both taken (a line counts once its newline is
        written), each parsed into the columns of `schema`. Offsets are byte offsets per file, so
        a batch run again reads the same lines; write by appending. File i of a batch (by name)
        is read by subtask i % parallelism."""
        kind = "source.stream.jsonlines"
        config: dict[str, Any] = {"path": _location(path), "schema": _output_schema(schema, kind)}
        if max_files_per_trigger is not None:
            config["max_files_per_trigger"] = _positive_int(max_files_per_trigger, "max_files_per_trigger")
        return self._stream(kind, "Source: JSON lines", config)

    def delta(self, path: str, max_versions_per_trigger: int | None = None) -> DataStream:
        """A Delta table's versions as a stream (a local path or file:// URI): the first batch
        reads the table as it is, each later one the files the commits since the last batch
        added (at most `max_versions_per_trigger` versions a batch). Offsets are table versions,
        so a batch run again reads the same files. Appends only: a commit that deletes or
        rewrites data, or changes the schema, fails the query naming its version."""
        config: dict[str, Any] = {"path": _location(path)}
        if max_versions_per_trigger is not None:
            config["max_versions_per_trigger"] = _positive_int(max_versions_per_trigger, "max_versions_per_trigger")
        return self._stream("source.stream.delta", "Source: Delta stream", config)

    def redis(self, keys: str | Sequence[str], *, host: str = "127.0.0.1", port: int = 6379, db: int = 0,
              starting: str = "latest", max_entries_per_trigger: int | None = None) -> DataStream:
        """The entries of Redis stream keys (XADD'ed by anyone), as a broker source: columns
        `stream` (the key), `id`, `fields` (map<string,string>) and `timestamp` (the id's time).
        Offsets are entry ids per key; each batch reads exactly its logged id range (XRANGE), so
        a batch run again reads the same entries, as long as the stream was not trimmed past
        them. `starting`: "latest" (entries added from the query's start on; Spark's Kafka
        default) or "earliest"; `max_entries_per_trigger` per key. Key i is read by subtask
        i % parallelism."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys or not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"redis: keys must be distinct non-empty strings, got {keys!r}")
        if starting not in ("earliest", "latest"):
            raise ValueError(f"redis: starting must be 'earliest' or 'latest', got {starting!r}")
        config: dict[str, Any] = {"keys": keys, "host": host, "port": _port(port, "redis"), "db": _db(db),
                                  "starting": starting}
        if max_entries_per_trigger is not None:
            config["max_entries_per_trigger"] = _positive_int(max_entries_per_trigger, "max_entries_per_trigger")
        return self._stream(REDIS, f"Source: redis {', '.join(keys)}"[:200], config)

    def socket_text(self, host: str, port: int, *, receivers: int = 1, block_interval: str = "200 ms",
                    max_rate: int | None = None) -> DataStream:
        """Lines read from a TCP server, one record per line in column `value` (Spark Streaming's
        socketTextStream). Each of `receivers` long-running tasks (in slots of their own) holds a
        connection and stores what it reads every `block_interval` as a block in the checkpoint
        before it counts as received; each batch reads the blocks stored when it is planned.
        `max_rate`: at most this many lines a second per receiver (spark.streaming.receiver.maxRate);
        with the option streaming.backpressure.enabled, less when batches fall behind."""
        from funke.common.durations import DurationError, parse_duration

        if not isinstance(host, str) or not host:
            raise TypeError(f"socket_text: host must be a non-empty string, got {host!r}")
        port = _port(port, "socket_text")
        try:
            interval_ms = round(parse_duration(block_interval) * 1000)
        except DurationError as exc:
            raise ValueError(f"socket_text: block_interval: {exc}") from None
        if interval_ms < 10:
            raise ValueError(f"socket_text: block_interval must be at least 10 ms, got {block_interval!r}")
        config: dict[str, Any] = {"host": host, "port": port, "block_interval_ms": interval_ms}
        if max_rate is not None:
            config["max_rate"] = _positive_int(max_rate, "max_rate")
        stream = self._stream(SOCKET, f"Source: socket {host}:{port}", config)
        stream._t.parallelism = _positive_int(receivers, "receivers")
        stream._t.slot_sharing_group = RECEIVERS_GROUP
        return stream


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _location(path: object) -> str:
    """A file location as the cluster must see it: the JobManager and TaskManagers do not share
    the client's working directory, so a relative local path is made absolute here. URIs with a
    scheme (hdfs://, s3a://, file://) and globs are kept as written."""
    text = _non_empty_str(path, "path")
    return text if "://" in text else os.path.abspath(text)


def _label(value: object, what: str) -> str:
    problem = ids.label_problem(value, what)
    if problem is not None:
        raise ValueError(problem)
    return value  # type: ignore[return-value]


def _non_empty_str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _column_name(value: object, operation: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{operation}(): the column must be a non-empty name, got {value!r}")
    return value


def _millis(value: object, what: str) -> int:
    """A duration in whole milliseconds: Flink's syntax ("10 s", "1 min") or an int of ms."""
    from funke.common.durations import DurationError, parse_duration
    from funke.common.streaming.eventtime import MAX_DELAY_MS

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what}: expected a duration such as \"10 s\" or a number of ms, got {value!r}")
    if isinstance(value, int):
        ms = value
    else:
        try:
            ms = round(parse_duration(value) * 1000)
        except DurationError as e:
            raise ValueError(f"{what}: {e}") from None
    if not 0 <= ms <= MAX_DELAY_MS:
        raise ValueError(f"{what}: must be between 0 and ten years, got {value!r}")
    return ms


def _signed_millis(value: object, what: str) -> int:
    """A duration that may be negative ("-5 min", or an int of ms)."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -_millis(value.strip()[1:], what)
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return -_millis(-value, what)
    return _millis(value, what)


def _job_type(value: str | JobType) -> JobType:
    if isinstance(value, JobType):
        return value
    if isinstance(value, str) and value.upper() in JobType.__members__:
        return JobType[value.upper()]
    raise ValueError(f"job_type must be \"batch\" or \"streaming\", got {value!r}")


def _output_schema(schema: object, operation: str) -> str:
    if schema is None:
        raise TypeError(
            f"{operation}() needs the schema of its output as a Spark DDL string, e.g. "
            f"{operation}(fn, schema=\"word string, n int\"): funke cannot infer what a Python "
            "function returns"
        )
    if not isinstance(schema, str) or not schema.strip():
        raise TypeError(f"{operation}(): schema must be a Spark DDL string such as \"word string\", got {schema!r}")
    return schema


def _sql(text: object, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"{what} must be a non-empty SQL string, got {text!r}")
    return text


def _keys(on: str | Sequence[str], operation: str) -> tuple[str, ...]:
    keys = (on,) if isinstance(on, str) else tuple(on)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{operation}() needs one or more column names, got {on!r}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{operation}(): a key column is repeated in {list(keys)}")
    return keys


def _port(port: object, what: str) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what}: port must be from 1 to 65535, got {port!r}")
    return port


def _db(db: object) -> int:
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ValueError(f"redis: db must be a database number from 0, got {db!r}")
    return db


def _pickled(fn: object, operation: str, need_callable: bool = True) -> bytes:
    if need_callable and not callable(fn):
        raise TypeError(f"{operation}() needs a function, got {type(fn).__name__}")
    from funke.common.api import sourcemap

    try:
        return sourcemap.dumps(fn)  # cloudpickle's payload; tracebacks keep the user's files and lines
    except Exception as exc:  # anything the function captures may refuse to pickle
        raise TypeError(
            f"{operation}(): the function cannot be serialised for the TaskManagers ({exc}); "
            "check what it captures (open files, locks, Spark sessions...)"
        ) from exc


def _option_text(value: object) -> str:
    """Option values as Flink's Configuration holds them: text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.timedelta):
        # Whole milliseconds when exact, else microseconds: Flink durations take no fractions.
        micros = round(value.total_seconds() * 1_000_000)
        return f"{micros // 1000} ms" if micros % 1000 == 0 else f"{micros} µs"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise TypeError(f"option value must be a string, number, bool or timedelta, got {value!r}")


def _spark_options(options: Mapping[str, Any], where: str) -> dict[str, str]:
    """Spark reader/writer options as text (Spark turns them into strings anyway); None drops
    the option, so callers can pass optional settings through."""
    result: dict[str, str] = {}
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            result[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            result[key] = str(value)
        else:
            raise TypeError(f"{where}: option {key!r} must be a string, number or bool, got {value!r}")
    return result


def _range_config(start: object, end: object, step: object) -> dict[str, int]:
    for what, value in (("start", start), ("end", end), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"range {what} must be an integer, got {value!r}")
    if step == 0:
        raise ValueError("range step must not be 0")
    return {"start": start, "end": end, "step": step}  # type: ignore[dict-item]


def _ddl_column_names(ddl: str) -> list[str]:
    """Top-level column names of a Spark DDL schema ("a int, b map<string,int>",
    "struct<a:int>", "`my col` string"): enough to order dict rows, not a full parser."""
    text = ddl.strip()
    if text.lower().startswith("struct<") and text.endswith(">"):
        text = text[len("struct<"):-1]
    fields: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<(":
            depth += 1
        elif not quoted and ch in ">)":
            depth -= 1
        elif not quoted and ch == "," and depth == 0:
            fields.append(text[start:i])
            start = i + 1
    fields.append(text[start:])
    names: list[str] = []
    for f in fields:
        f = f.strip()
        if f.startswith("`"):
            names.append(f[1:f.index("`", 1)] if "`" in f[1:] else f[1:])
        else:
            names.append(f.replace(":", " ").split()[0] if f else "")
    if not all(names):
        raise ValueError(f"cannot read the column names of schema {ddl!r}")
    return names


def _collection_row(row: object, columns: list[str], index: int) -> list[Any]:
    if isinstance(row, Mapping):
        unknown = [k for k in row if k not in columns]
        if unknown:
            raise ValueError(f"from_collection(): row {index} has columns {unknown} not in the schema {columns}")
        values = [row.get(c) for c in columns]
    elif isinstance(row, (tuple, list)):  # includes pyspark Rows, which are tuples
        values = list(row)
    else:
        values = [row]
    if len(values) != len(columns):
        raise ValueError(
            f"from_collection(): row {index} has {len(values)} value(s) but the schema has "
            f"{len(columns)} column(s) {columns}"
        )
    try:
        json.dumps(values, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"from_collection(): row {index} is not JSON-serialisable ({exc}); use JSON types, "
            "or generate()/read_* for other values"
        ) from None
    return values
