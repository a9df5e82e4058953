"""The streams of the DataStream DSL: `DataStream` (transformations, exchanges, sinks),
`KeyedStream` (after `key_by`: running aggregates, `reduce`, keyed process functions, windows),
`WindowedStream` and `WindowedDataStream` (window aggregates and their late data).

Each call records a `Transformation` in its `ExecutionEnvironment` (`environment.py`) and returns
the handle of the new operator; nothing runs here. The sink methods return the handles of
`handles.py`. `ExecutionEnvironment` in the annotations is environment.py's; it is not imported
here (environment.py imports this module).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from funke.common.api.arguments import (
    _column_name,
    _db,
    _keys,
    _location,
    _millis,
    _output_schema,
    _pickled,
    _port,
    _signed_millis,
    _spark_options,
    _sql,
)
from funke.common.api.handles import CollectSink, DataStreamSink, _OperatorHandle
from funke.common.api.translate import Exchange, ExchangeKind, Transformation
from funke.common.graph.operators import JOIN_TYPES, SINK_MODES
from funke.common.graph.streamingjob import STREAM_SOURCE_KINDS
from funke.common.streaming import kafkasink
from funke.common.streaming.sources.delta import DELTA_MODES


_JOIN_TYPES = JOIN_TYPES


_WRITE_MODES = frozenset(SINK_MODES)


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

    def write_kafka(self, bootstrap: str, topic: str, *, key: str | None = None, value: str = "value",
                    guarantee: str = "exactly_once") -> DataStreamSink:
        """Into Kafka topic `topic` at `bootstrap` ("host:port[,host:port...]"): each row one
        record, column `value` its value and column `key` (if given) its key, each a string
        (written as UTF-8) or binary column; a null value is a tombstone. Keyed records go to
        the partition Kafka's Java producer would choose (murmur2).

        `guarantee="exactly_once"` (the default): the JobMaster writes each batch of a streaming
        query in one Kafka transaction with a marker naming the batch (the transactional id
        `funke-<query id>-<sink>`), so `read_committed` consumers see every batch once, also
        when it ran again after a failure; each run of the query fences the one before and ends
        its open transaction. In a bounded job, one transaction when the job FINISHED (nothing
        if it fails). `"at_least_once"`: an idempotent producer without transactions, flushed per
        batch: a batch that runs again after a failure may be written again (see
        docs/streaming/kafka.md)."""
        try:
            kafkasink.bootstrap_servers(bootstrap)
        except ValueError as exc:
            raise ValueError(f"write_kafka: bootstrap {exc}") from None
        problem = kafkasink.topic_problem(topic)
        if problem is not None:
            raise ValueError(f"write_kafka: topic {problem}")
        if guarantee not in kafkasink.GUARANTEES:
            raise ValueError(f"write_kafka: guarantee must be one of {', '.join(kafkasink.GUARANTEES)}, "
                             f"got {guarantee!r}")
        config: dict[str, Any] = {"bootstrap": bootstrap, "topic": topic, "value": _column_name(value, "write_kafka"),
                                  "guarantee": guarantee}
        if key is not None:
            config["key"] = _column_name(key, "write_kafka")
        return self._sink(kafkasink.KAFKA_SINK, f"Sink: kafka {topic}"[:200], config, DataStreamSink)

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
