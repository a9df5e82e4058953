"""Operator implementations: every kind of the catalogue (`funke.common.graph.operators`) mapped onto
the Spark DataFrame API.

Owns what each operator does to the rows of one subtask, and nothing about deployment, inputs
or outputs (that is `task.py`). `OPERATORS` maps a kind to its function:

    sources     (ctx, spec) -> DataFrame                         the subtask's share of the input
    transforms  (ctx, spec, inputs: list[DataFrame]) -> DataFrame   a chain's head gets all of the
                                                                 vertex's inputs in input order;
                                                                 a chained operator gets one
    sinks       (ctx, spec, df) -> None                          run the pipeline, stage the output

Only the DataFrame API is used (no RDD, no SparkContext), so every operator also runs against
Spark Connect.

Python functions (map, flat_map, filter, reduce, a generating source.range) are cloudpickled by
the client and executed per row inside `DataFrame.mapInArrow`: batches come in as Spark cuts
them (spark.sql.execution.arrow.maxRecordsPerBatch, 10 000 by default) and go back with at most
`ROWS_PER_BATCH` rows, however many a flat_map makes. The calling convention:

- argument: if the input has exactly one column the function receives the bare value (a `str`,
  an `int`, a `list` ...), otherwise a `pyspark.sql.Row` with the input's column names. Nested
  structs arrive as Rows, maps as dicts, timestamps as timezone-aware datetimes.
- result (map, flat_map's items, reduce): a row of the output schema (config "schema", a DDL
  string such as "word string, n bigint"; reduce keeps its input schema). A row is a tuple or
  list (by position), or a dict or Row (by name). With exactly one output column the function
  may return the bare value instead; a one-element tuple/list/dict/Row is unwrapped only when
  that column is atomic (for an array, map or struct column the result is always the value).
- filter: the truth value of the result keeps or drops the row; the schema is unchanged.
- reduce: fn(a, b) -> row, both arguments and the result in the convention above; like Flink's
  keyed reduce, a and b always have the same key.
- transform: fn(DataFrame) -> DataFrame, called once on the driver with the whole subtask input.

Sources split their input among the subtasks of the vertex: files round robin over the sorted
file list (every subtask lists and infers the schema of the whole input, so an empty share has the
same schema), ranges and collections in contiguous chunks. source.csv reads a header by default,
since sink.csv writes one. Collection rows are JSON, coerced to the schema where JSON has no type
of its own (int -> double/decimal, ISO strings -> date/timestamp).

File sinks stage the subtask's output beside the target (`layout.sink_staging_dir`); the
JobManager commits it when the job FINISHED. Mode "error" (the default) fails before running
anything when the target already holds data; "overwrite" lets the commit replace it. sink.text
writes one string column as is, several as tab-separated text (null: an empty field). sink.noop
plans the pipeline but runs nothing; source.noop only exists for chains made of no-op kinds, which
the task runs without Spark.

In a streaming query a task runs micro-batches (`RuntimeContext.batch`): stream sources read
exactly the batch's range (source.rate: the rows due, by `RateSource`'s rule; source.stream.*:
the files the JobManager resolved for the range, this subtask's share), and file sinks stage the
batch inside the target (`layout.stream_sink_staging_dir`) for the JobMaster's commit.

The worker-side half of this module is pickled *by value* (see the registration at the end of the
imports), so Python workers need pyspark, pyarrow and cloudpickle, but not funke itself: that is
what lets a Spark Connect server or a cluster's executors run funke tasks.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import os
import posixpath
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any
from urllib.parse import urlparse

import cloudpickle
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark import cloudpickle as _spark_cloudpickle
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from funke.common.task import combine
from funke.common import layout
from funke.common.streaming.checkpoint import SourceRange
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.operators import SINK_MODES
from funke.common.streaming.sources import (
    BatchInput,
    RateSource,
    RedisStreamsSource,
    receiver_blocks_dir,
)
from funke.runtime import datafs
from funke.taskmanager import batchexchange

# The closures handed to mapInArrow reference this module's helpers; pickled by reference they
# would need funke importable in every Python worker. By value, they need only what they import.
_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

__all__ = ["OPERATORS", "ROWS_PER_BATCH", "InputMeter", "RuntimeContext", "batch_range", "column_ref", "parse_schema",
           "union_all"]

PRINT_ROWS_PER_BATCH = 10  # a streaming query's print sink: rows shown per batch (Spark Streaming's print())
ROWS_PER_BATCH = 10_000  # the most rows a Python operator hands back to Spark in one Arrow batch


@dataclass(slots=True)
class InputMeter:
    """What one micro-batch of a task reads: an estimate of the bytes (the rate source's rows
    weighed, files and partitions by size), which decides how its output is exchanged, and the
    rows its stream source read: known before running (the rate source's range) or observed
    while running (files: read only once the batch's work has run every row)."""

    bytes: int = 0
    rows: int = 0
    observed: list[Observation] = dataclass_field(default_factory=list)

    def counted_rows(self) -> int:
        """Blocks until every observation has its count: call once the chain ran every row."""
        return self.rows + sum(int(o.get["rows"]) for o in self.observed)


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """What an operator knows about the subtask it runs in (Flink's RuntimeContext)."""

    spark: SparkSession
    job_id: str
    vertex_id: str
    subtask_index: int
    parallelism: int
    attempt_number: int
    data_dir: str
    # Spark partitions a keyed operator uses inside the task; None: spark.sql.shuffle.partitions.
    local_partitions: int | None = None
    # A streaming query's task: the micro-batch it runs now (what its stream sources read, where
    # its sinks stage); None in a bounded job.
    batch: BatchInput | None = None
    # A streaming query's task: what this batch's sources and inputs bring in.
    meter: InputMeter | None = None
    # A streaming query's checkpoint location (receivers' blocks are stored in it).
    checkpoint: str = ""

    @property
    def cancel_marker(self) -> str | None:
        return layout.cancel_marker(self.data_dir, self.job_id, self.vertex_id, self.subtask_index,
                                    self.attempt_number)


Source = Callable[[RuntimeContext, OperatorSpec], DataFrame]
Transform = Callable[[RuntimeContext, OperatorSpec, list[DataFrame]], DataFrame]
Sink = Callable[[RuntimeContext, OperatorSpec, DataFrame], None]

OPERATORS: dict[str, Callable[..., Any]] = {}


def _operator(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        OPERATORS[kind] = fn
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# driver-side helpers
# ---------------------------------------------------------------------------------------------


def _label(spec: OperatorSpec) -> str:
    return f"operator '{spec.display_name}' ({spec.kind})"


def _config(spec: OperatorSpec, key: str) -> Any:
    try:
        return spec.config[key]
    except KeyError:
        raise ValueError(f"{_label(spec)}: missing config {key!r}") from None


def _strings(spec: OperatorSpec, key: str) -> list[str]:
    value = _config(spec, key)
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _options(spec: OperatorSpec, defaults: dict[str, str] | None = None) -> dict[str, Any]:
    given = spec.config.get("options") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{_label(spec)}: config 'options' must be an object, got {type(given).__name__}")
    return {**(defaults or {}), **given}


def column_ref(name: str) -> Column:
    # Backticks: a column named "a.b" is that column, not field b of struct a.
    return F.col("`" + name.replace("`", "``") + "`")


def parse_schema(ddl: str, what: str = "schema") -> StructType:
    """A DDL string as a StructType; a bare type ("string") becomes one column named "value"."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise ValueError(f"{what} must be a non-empty DDL string, got {ddl!r}")
    parsed = DataType.fromDDL(ddl)
    if isinstance(parsed, StructType):
        return parsed
    return StructType([StructField("value", parsed)])


def _config_schema(spec: OperatorSpec) -> StructType:
    return parse_schema(_config(spec, "schema"), f"{_label(spec)}: config 'schema'")


def _arrow_schema(ctx: RuntimeContext, schema: StructType) -> pa.Schema:
    # Internal PySpark API, but the only converter that matches what Spark expects back from
    # mapInArrow (decimal precision, map entry names, large string types when configured).
    from pyspark.sql.pandas.types import to_arrow_schema

    conf = ctx.spark.conf
    return to_arrow_schema(
        schema,
        timezone=conf.get("spark.sql.session.timeZone"),
        prefers_large_types=conf.get("spark.sql.execution.arrow.useLargeVarTypes") == "true",
    )


def _share(n: int, subtask: int, parallelism: int) -> tuple[int, int]:
    """The contiguous [lo, hi) of n items that subtask `subtask` of `parallelism` owns."""
    return subtask * n // parallelism, (subtask + 1) * n // parallelism


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    # Pairwise, so that P inputs make a union tree of depth log P rather than a chain of P.
    level = list(frames)
    while len(level) > 1:
        level = [
            level[i].unionByName(level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0]


# ---------------------------------------------------------------------------------------------
# worker-side helpers: run inside mapInArrow, pickled by value
# ---------------------------------------------------------------------------------------------


def _from_arrow(t: pa.DataType) -> Callable[[Any], Any] | None:
    """Turns `to_pylist` values into what PySpark hands a Python UDF (None: already are)."""
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        inner = [_from_arrow(t.field(i).type) for i in range(t.num_fields)]
        make = Row(*names)

        def struct(v: Any) -> Any:
            if v is None:
                return None
            values = list(v.values())
            return make(*[c(x) if c else x for c, x in zip(inner, values)])

        return struct
    if pa.types.is_map(t):
        key, item = _from_arrow(t.key_type), _from_arrow(t.item_type)

        def mapping(v: Any) -> Any:
            if v is None:
                return None
            return {(key(k) if key else k): (item(x) if item else x) for k, x in v}

        return mapping
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _from_arrow(t.value_type)
        if element is None:
            return None
        return lambda v: None if v is None else [element(x) for x in v]
    return None


def _to_arrow(t: pa.DataType) -> Callable[[Any], Any] | None:
    """Turns a Python value of a nested type into what `pa.array` accepts (None: as is)."""
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        inner = [_to_arrow(t.field(i).type) for i in range(t.num_fields)]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, Row) and hasattr(v, "__fields__"):
                v = v.asDict()
            if isinstance(v, dict):
                values = [v.get(n) for n in names]
            else:
                values = list(v)
            return {n: (c(x) if c else x) for n, c, x in zip(names, inner, values)}

        return struct
    if pa.types.is_map(t):
        key, item = _to_arrow(t.key_type), _to_arrow(t.item_type)

        def mapping(v: Any) -> Any:
            if v is None:
                return None
            pairs = v.items() if isinstance(v, dict) else v
            return [((key(k) if key else k), (item(x) if item else x)) for k, x in pairs]

        return mapping
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _to_arrow(t.value_type)
        if element is None:
            return None
        return lambda v: None if v is None else [element(x) for x in v]
    return None


def _arrow_is_atomic(t: pa.DataType) -> bool:
    return not (
        pa.types.is_struct(t)
        or pa.types.is_map(t)
        or pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
    )


class _RowReader:
    """Arrow batches -> the values a user function receives (bare values or Rows)."""

    def __init__(self, schema: pa.Schema):
        self.names = schema.names
        self.converters = [_from_arrow(f.type) for f in schema]
        self.make = Row(*self.names)

    def read(self, batch: pa.RecordBatch) -> list[Any]:
        columns = []
        for column, convert in zip(batch.columns, self.converters):
            values = column.to_pylist()
            columns.append([convert(v) for v in values] if convert else values)
        if len(columns) == 1:
            return columns[0]
        if not columns:
            return [self.make() for _ in range(batch.num_rows)]
        return [self.make(*values) for values in zip(*columns)]


class _RowWriter:
    """Results of a user function -> Arrow batches of the output schema."""

    def __init__(self, schema: pa.Schema, label: str):
        self.schema = schema
        self.label = label
        self.names = schema.names
        self.converters = [_to_arrow(f.type) for f in schema]
        self.single_atomic = len(self.names) == 1 and _arrow_is_atomic(schema.field(0).type)
        # Rows that need no conversion become a struct array in one call into Arrow.
        self._struct = pa.struct(list(schema)) if not any(self.converters) else None

    def values(self, result: Any) -> tuple[Any, ...]:
        """The column values of one result row."""
        names = self.names
        if len(names) == 1:
            if self.single_atomic and isinstance(result, (tuple, list, dict)) and len(result) == 1:
                return tuple(result.values()) if isinstance(result, dict) else (result[0],)
            return (result,)
        if isinstance(result, Row) and hasattr(result, "__fields__"):
            result = dict(zip(result.__fields__, result))
        if isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                raise ValueError(f"{self.label}: result {result!r} lacks column(s) {missing} of the output schema")
            return tuple(result[n] for n in names)
        if isinstance(result, (tuple, list)):
            if len(result) != len(names):
                raise ValueError(
                    f"{self.label}: result {result!r} has {len(result)} value(s); the output schema "
                    f"has {len(names)} column(s) {names}"
                )
            return tuple(result)
        raise TypeError(
            f"{self.label}: result {result!r} of type {type(result).__name__} is not a row of "
            f"{len(names)} columns {names}; return a tuple, list, dict or Row"
        )

    def batch_of_results(self, results: list[Any]) -> pa.RecordBatch:
        """A user function's results as one batch. Plain tuples of the right length (the usual
        case) are taken column by column at C speed; anything else (lists, dicts, Rows, a wrong
        length) is normalised row by row, with its error."""
        if set(map(type, results)) == {tuple} and set(map(len, results)) == {len(self.names)}:
            if self._struct is not None:
                try:
                    rows = pa.array(results, type=self._struct)
                    return pa.RecordBatch.from_arrays(rows.flatten(), schema=self.schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                    pass  # the column by column path names the column at fault
            return self.batch(results)
        return self.batch([self.values(r) for r in results])

    def batch(self, rows: Sequence[tuple[Any, ...]]) -> pa.RecordBatch:
        # lists, not zip's tuples: Arrow converts a list of Python values three times faster
        columns: Iterable[Sequence[Any]] = map(list, zip(*rows)) if rows else [[] for _ in self.names]
        arrays = []
        for field, convert, values in zip(self.schema, self.converters, columns):
            if convert:
                values = [convert(v) for v in values]
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise TypeError(f"{self.label}: column {field.name!r} ({field.type}): {e}") from e
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _single_column_batches(fn: Callable[[Any], Any], batches: Iterator[pa.RecordBatch], writer: _RowWriter,
                           flat: bool) -> Iterator[pa.RecordBatch]:
    """The fast path for a one-column output of an atomic type (a word count's words): results
    are collected as they come, at C speed, and only normalised one by one (1-tuples, dicts,
    Rows) if Arrow rejects them as they are."""
    field = writer.schema.field(0)
    reader: _RowReader | None = None
    column: list[Any] = []

    def flush() -> pa.RecordBatch:
        nonlocal column
        values, column = column, []
        try:
            return pa.RecordBatch.from_arrays([pa.array(values, type=field.type)], schema=writer.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return writer.batch([writer.values(v) for v in values])

    for batch in batches:
        reader = reader or _RowReader(batch.schema)
        if flat:
            for value in reader.read(batch):
                column.extend(fn(value))
                if len(column) >= ROWS_PER_BATCH:
                    yield flush()
        else:
            column.extend(fn(v) for v in reader.read(batch))
            while len(column) >= ROWS_PER_BATCH:
                rest = column[ROWS_PER_BATCH:]
                del column[ROWS_PER_BATCH:]
                yield flush()
                column = rest
    if column:
        yield flush()


def _map_batches(fn_bytes: bytes, out_schema: pa.Schema, label: str, flat: bool):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        writer = _RowWriter(out_schema, label)
        if writer.single_atomic:
            yield from _single_column_batches(fn, batches, writer, flat)
            return
        reader: _RowReader | None = None
        for batch in batches:
            reader = reader or _RowReader(batch.schema)
            values = reader.read(batch)
            results = [r for v in values for r in fn(v)] if flat else [fn(v) for v in values]
            for start in range(0, len(results), ROWS_PER_BATCH):
                yield writer.batch_of_results(results[start:start + ROWS_PER_BATCH])

    return run


# How often a Python worker running user code looks for its attempt's cancel marker.
CANCEL_POLL_S = 0.1


def _cancellable(run: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], marker: str | None):
    """`run`, in a Python worker that ends itself once its attempt is cancelled.

    Spark kills a cancelled task's Python worker only when its monitor thread, which looks every
    2 s, sees the task interrupted (plus spark.python.task.killTimeout): a user function that is
    slow per row keeps running that long. The TaskManager creates `marker` when it cancels the
    attempt; a watcher thread in the worker sees it within CANCEL_POLL_S and SIGKILLs its own
    process, as Spark would (the JVM reports the killed task; the worker is not reused). Never
    in the process that built the plan (a unit test calling `run` directly)."""
    if marker is None:
        return run
    planner = os.getpid()

    def watched(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        stop = threading.Event()
        # Held across the look and the kill, and to stop: once `run` is over (the worker may go
        # back to Spark's pool and serve another task), the watcher can no longer kill.
        deciding = threading.Lock()
        if os.getpid() != planner:
            def watch() -> None:
                while not stop.wait(CANCEL_POLL_S):
                    with deciding:
                        if not stop.is_set() and os.path.exists(marker):
                            os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=watch, name="funke-cancel-watch", daemon=True).start()
        try:
            yield from run(batches)
        finally:
            with deciding:
                stop.set()

    return watched


def _filter_batches(fn_bytes: bytes):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader: _RowReader | None = None
        for batch in batches:
            reader = reader or _RowReader(batch.schema)
            mask = pa.array([bool(fn(v)) for v in reader.read(batch)], type=pa.bool_())
            kept = batch.filter(mask)
            if kept.num_rows:
                yield kept

    return run


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a key value (array and struct keys come as lists and dicts)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


def _reduce_batches(fn_bytes: bytes, keys: list[str], schema: pa.Schema, label: str):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader = _RowReader(schema)
        writer = _RowWriter(schema, label)
        # key -> (column values, the value the function sees); both kept so the result of fn is
        # normalised once and handed back to fn in the same form as an input row.
        accumulated: dict[Any, tuple[tuple[Any, ...], Any]] = {}
        for batch in batches:
            key_columns = [batch.column(k).to_pylist() for k in keys]
            for key, value in zip(zip(*key_columns), reader.read(batch)):
                key = _freeze(key)
                seen = accumulated.get(key)
                if seen is None:
                    accumulated[key] = (writer.values(value), value)
                    continue
                columns = writer.values(fn(seen[1], value))
                as_input = columns[0] if len(columns) == 1 else reader.make(*columns)
                accumulated[key] = (columns, as_input)
        rows = [columns for columns, _ in accumulated.values()]
        for start in range(0, len(rows), ROWS_PER_BATCH):
            yield writer.batch(rows[start:start + ROWS_PER_BATCH])

    return run


# ---------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------


def _is_directory(path: str) -> bool | None:
    """Whether `path` is a directory, without Hadoop; None when that cannot be told (a glob,
    a scheme pyarrow does not know such as s3a://)."""
    if any(c in path for c in "*?[{"):
        return None
    info = _file_info(path)
    return None if info is None else info.type == pafs.FileType.Directory


def _file_info(path: str) -> pafs.FileInfo | None:
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else path
        return pafs.LocalFileSystem().get_file_info(os.path.abspath(local))
    try:
        fs, inner = datafs.filesystem(path)
        return fs.get_file_info(inner)
    except (ValueError, OSError, NotImplementedError):
        return None


def _file_source(fmt: str, defaults: dict[str, str] | None = None) -> Source:
    def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
        path = str(_config(spec, "path"))
        options = _options(spec, defaults)
        reader = ctx.spark.read.format(fmt).options(**options)
        ddl = spec.config.get("schema")
        if ddl:
            reader = reader.schema(parse_schema(ddl, f"{_label(spec)}: config 'schema'"))
        # Every subtask lists (and, without a given schema, infers from) the whole input, so that
        # all of them agree on the files' order and on the schema, even one with no files at all.
        whole = reader.load(path)
        schema = whole.schema
        files = sorted(whole.inputFiles())[ctx.subtask_index::ctx.parallelism]
        if not files:
            return ctx.spark.createDataFrame([], schema)
        share = ctx.spark.read.format(fmt).options(**options).schema(schema)
        if "basePath" not in options and _is_directory(path):
            # Reading single files of a partitioned directory keeps its partition columns only
            # when Spark knows where the table starts.
            share = share.option("basePath", path)
        return share.load(files)

    return read


OPERATORS["source.text"] = _file_source("text")
OPERATORS["source.parquet"] = _file_source("parquet")
# header=true: what sink.csv writes, source.csv reads back.
OPERATORS["source.csv"] = _file_source("csv", {"header": "true"})
OPERATORS["source.json"] = _file_source("json")


def batch_range(ctx: RuntimeContext, spec: OperatorSpec) -> tuple[BatchInput, SourceRange]:
    if ctx.batch is None:
        raise ValueError(f"{_label(spec)} is a stream source: it runs in a streaming query's micro-batches")
    source_range = ctx.batch.ranges.get(ctx.vertex_id)
    if source_range is None:
        raise ValueError(f"{_label(spec)}: batch {ctx.batch.batch_id} names no range for vertex {ctx.vertex_id!r}")
    return ctx.batch, source_range


@_operator("source.rate")
def _rate(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """Rows `value` (bigint, from 0) and `timestamp` (when the row was due) of this subtask's share
    of the batch's range: value i goes to subtask i % parallelism (RateSource.rows)."""
    _, source_range = batch_range(ctx, spec)
    rate = RateSource(int(_config(spec, "rows_per_second")), ctx.parallelism)
    schema = "value bigint, timestamp timestamp"
    if source_range.end is None or source_range.start == source_range.end:
        return ctx.spark.createDataFrame([], schema)
    base = int(source_range.end["baseMs"])
    begin = int(source_range.start["rows"]) if source_range.start is not None else 0
    end = int(source_range.end["rows"])
    first = begin + (ctx.subtask_index - begin) % ctx.parallelism
    if ctx.meter is not None:
        rows = len(range(first, end, ctx.parallelism))
        ctx.meter.rows += rows
        ctx.meter.bytes += rows * batchexchange.RATE_ROW_BYTES
    ids_ = ctx.spark.range(first, max(first, end), ctx.parallelism)
    # One expression string, not a tree of Column calls: each call is a round trip to the JVM,
    # and this is planned for every batch. The integers are ours (checked above), not the user's.
    millis = f"{base} + CAST(FLOOR(id * 1000 / {rate.rows_per_second}) AS BIGINT)"
    return ids_.selectExpr("id AS value", f"timestamp_millis({millis}) AS timestamp")


@_operator("source.socket")
def _socket(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """Lines in column `value`: the blocks of this subtask's receiver that the batch was
    allocated, read from the checkpoint (the receiver itself runs beside the task:
    taskmanager/receiver.py)."""
    batch, _ = batch_range(ctx, spec)
    if not ctx.checkpoint:
        raise ValueError(f"{_label(spec)}: the task was not told where the query's checkpoint is")
    prefix = f"{ctx.subtask_index}/"
    names = [n[len(prefix):] for n in batch.files.get(ctx.vertex_id, ()) if n.startswith(prefix)]
    schema = "value string"
    if not names:
        return ctx.spark.createDataFrame([], schema)
    directory = receiver_blocks_dir(ctx.checkpoint, ctx.vertex_id, ctx.subtask_index)
    paths = [posixpath.join(directory, n) for n in names]
    if ctx.meter is not None:  # a block's records are its lines: counted here, blocks are small
        ctx.meter.rows += sum(_lines_in(p) for p in paths)
        ctx.meter.bytes += batchexchange.file_bytes(paths)
    return ctx.spark.read.schema(schema).text(paths)


REDIS_READ_CHUNK = 10_000  # entries an XRANGE call brings
REDIS_SCHEMA = "stream string, id string, fields map<string,string>, timestamp timestamp"


def redis_client(config: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(host=str(config.get("host", "127.0.0.1")), port=int(config.get("port", 6379)),
                       db=int(config.get("db", 0)), socket_timeout=30, socket_connect_timeout=10)


@_operator("source.redis")
def _redis_source(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """The entries of the batch's range (per key, after its start id up to its end id), of the
    keys that are this subtask's (key i goes to subtask i % parallelism): `stream` (the key),
    `id`, `fields`, `timestamp` (the id's milliseconds)."""
    _, source_range = batch_range(ctx, spec)
    keys = tuple(_strings(spec, "keys"))
    bounds = RedisStreamsSource(keys).bounds(source_range)
    mine = [k for i, k in enumerate(keys) if i % ctx.parallelism == ctx.subtask_index]
    client = redis_client(spec.config)
    streams, ids_, fields, millis = [], [], [], []
    try:
        for key in mine:
            after, end = bounds.get(key, ("0-0", "0-0"))
            while after != end:
                chunk = client.xrange(key, f"({after}", end, count=REDIS_READ_CHUNK)
                for entry_id, entry in chunk:
                    entry_id = entry_id.decode()
                    streams.append(key)
                    ids_.append(entry_id)
                    fields.append([(k.decode("utf-8", "replace"), v.decode("utf-8", "replace")) for k, v in entry.items()])
                    millis.append(int(entry_id.split("-")[0]))
                if len(chunk) < REDIS_READ_CHUNK:
                    break
                after = ids_[-1]
    finally:
        client.close()
    if ctx.meter is not None:
        ctx.meter.rows += len(ids_)
        ctx.meter.bytes += sum(len(k) + len(v) for f in fields for k, v in f) + 32 * len(ids_)
    if not ids_:
        return ctx.spark.createDataFrame([], REDIS_SCHEMA)
    table = pa.table({
        "stream": pa.array(streams, pa.string()), "id": pa.array(ids_, pa.string()),
        "fields": pa.array(fields, pa.map_(pa.string(), pa.string())),
        "timestamp": pa.array(millis, pa.timestamp("ms", tz="UTC")),
    })
    return ctx.spark.createDataFrame(table, schema=parse_schema(REDIS_SCHEMA, "source.redis"))


def _lines_in(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _stream_file_source(fmt: str, defaults: dict[str, str] | None = None) -> Source:
    def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
        batch, _ = batch_range(ctx, spec)
        directory = str(_config(spec, "path")).rstrip("/")
        ddl = spec.config.get("schema") or ("value string" if fmt == "text" else None)
        if ddl is None:
            raise ValueError(f"{_label(spec)}: a stream file source needs a schema")
        schema = parse_schema(ddl, f"{_label(spec)}: config 'schema'")
        names = batch.files.get(ctx.vertex_id, ())[ctx.subtask_index::ctx.parallelism]
        if not names:
            return ctx.spark.createDataFrame([], schema)
        paths = [f"{directory}/{name}" for name in names]
        df = ctx.spark.read.format(fmt).options(**_options(spec, defaults)).schema(schema).load(paths)
        if ctx.meter is None:
            return df
        ctx.meter.bytes += batchexchange.file_bytes(paths)
        # Counted while the batch's own work reads them, not by a pass of its own.
        rows = Observation()
        ctx.meter.observed.append(rows)
        return df.observe(rows, F.count(F.lit(1)).alias("rows"))

    return read


OPERATORS["source.stream.text"] = _stream_file_source("text")
OPERATORS["source.stream.csv"] = _stream_file_source("csv", {"header": "true"})
OPERATORS["source.stream.json"] = _stream_file_source("json")
OPERATORS["source.stream.parquet"] = _stream_file_source("parquet")


@_operator("source.range")
def _range(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    start = int(spec.config.get("start", 0))
    end = int(_config(spec, "end"))
    step = int(spec.config.get("step", 1))
    if step == 0:
        raise ValueError(f"{_label(spec)}: step must not be 0")
    lo, hi = _share(len(range(start, end, step)), ctx.subtask_index, ctx.parallelism)
    ids = ctx.spark.range(start + lo * step, start + hi * step, step)
    if not spec.function:
        return ids
    # A generating source: fn(id) -> row of config "schema".
    return _python_map(ctx, spec, ids, flat=False)


def _coerce(value: Any, dt: DataType) -> Any:
    """A JSON value as the Python value Spark's type verification accepts for `dt`."""
    if value is None:
        return None
    if isinstance(dt, (FloatType, DoubleType)) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(dt, DecimalType) and isinstance(value, (int, float, str)):
        return decimal.Decimal(str(value))
    if isinstance(dt, DateType) and isinstance(value, str):
        return _dt.date.fromisoformat(value)
    if isinstance(dt, (TimestampType, TimestampNTZType)) and isinstance(value, str):
        return _dt.datetime.fromisoformat(value)
    if isinstance(dt, ArrayType) and isinstance(value, list):
        return [_coerce(v, dt.elementType) for v in value]
    if isinstance(dt, MapType) and isinstance(value, dict):
        return {k: _coerce(v, dt.valueType) for k, v in value.items()}
    if isinstance(dt, StructType) and isinstance(value, (dict, list)):
        return _coerce_row(value, dt)
    return value


def _coerce_row(row: Any, schema: StructType) -> tuple[Any, ...]:
    if isinstance(row, dict):
        values = [row.get(f.name) for f in schema.fields]
    elif isinstance(row, (list, tuple)):
        if len(row) != len(schema.fields):
            raise ValueError(f"row {row!r} has {len(row)} value(s), the schema {len(schema.fields)} column(s)")
        values = list(row)
    elif len(schema.fields) == 1:  # a bare value for a one-column schema
        values = [row]
    else:
        raise ValueError(f"row {row!r} is neither a list nor an object")
    return tuple(_coerce(v, f.dataType) for v, f in zip(values, schema.fields))


@_operator("source.collection")
def _collection(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    rows = _config(spec, "rows")
    if isinstance(rows, str):
        rows = json.loads(rows)
    if not isinstance(rows, list):
        raise ValueError(f"{_label(spec)}: config 'rows' must be a JSON list, got {type(rows).__name__}")
    schema = _config_schema(spec)
    lo, hi = _share(len(rows), ctx.subtask_index, ctx.parallelism)
    try:
        share = [_coerce_row(r, schema) for r in rows[lo:hi]]
    except ValueError as e:
        raise ValueError(f"{_label(spec)}: {e}") from None
    return ctx.spark.createDataFrame(share, schema)


@_operator("source.noop")
def _source_noop(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    raise ValueError(
        f"{_label(spec)} produces no rows; it can only be chained with other no-op kinds "
        "(noop, sink.noop), which the task runs without Spark"
    )


# ---------------------------------------------------------------------------------------------
# transforms
# ---------------------------------------------------------------------------------------------


def _single(spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if len(inputs) != 1:
        raise ValueError(f"{_label(spec)} takes one input, got {len(inputs)}")
    return inputs[0]


def _python_map(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, flat: bool) -> DataFrame:
    schema = _config_schema(spec)
    fn = _map_batches(spec.function, _arrow_schema(ctx, schema), _label(spec), flat)
    return df.mapInArrow(_cancellable(fn, ctx.cancel_marker), schema)


@_operator("map")
def _map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _python_map(ctx, spec, _single(spec, inputs), flat=False)


@_operator("flat_map")
def _flat_map(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _python_map(ctx, spec, _single(spec, inputs), flat=True)


@_operator("filter")
def _filter(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    df = _single(spec, inputs)
    return df.mapInArrow(_cancellable(_filter_batches(spec.function), ctx.cancel_marker), df.schema)


@_operator("select")
def _select(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).selectExpr(*_strings(spec, "exprs"))


@_operator("where")
def _where(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).where(F.expr(str(_config(spec, "condition"))))


def _local_partitions(ctx: RuntimeContext) -> int:
    if ctx.local_partitions is not None:
        return ctx.local_partitions
    return int(ctx.spark.conf.get("spark.sql.shuffle.partitions"))


@_operator("reduce")
def _reduce(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    df = _single(spec, inputs)
    keys = _strings(spec, "keys")
    if not keys:
        raise ValueError(f"{_label(spec)}: needs at least one key")
    # The task's input already holds only its keys (the edge is HASH-partitioned); this local
    # shuffle puts each key in one Spark partition so one Python dict can reduce it.
    keyed = df.repartition(_local_partitions(ctx), *[column_ref(k) for k in keys])
    fn = _reduce_batches(spec.function, keys, _arrow_schema(ctx, df.schema), _label(spec))
    return keyed.mapInArrow(_cancellable(fn, ctx.cancel_marker), df.schema)


@_operator("aggregate")
def _aggregate(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    aggregations = _strings(spec, "aggregations")
    if not aggregations:
        raise ValueError(f"{_label(spec)}: needs at least one aggregation")
    df = _single(spec, inputs)
    finals = _finals(df.schema)
    if finals:  # its input is what a combiner made: merge the partial aggregates
        if len(finals) != len(aggregations):
            raise ValueError(f"{_label(spec)}: its input holds partial aggregates of {len(finals)} aggregation(s), "
                             f"not of its {len(aggregations)}")
        aggregations = finals
    grouped = df.groupBy(*[column_ref(k) for k in _strings(spec, "keys")])
    return grouped.agg(*[F.expr(a) for a in aggregations])


def _finals(schema: StructType) -> list[str]:
    """The final aggregates a combiner left in its partial columns' metadata, in order."""
    found = {f.metadata[combine.INDEX_KEY]: f.metadata[combine.FINAL_KEY] for f in schema.fields
             if combine.FINAL_KEY in (f.metadata or {})}
    return [found[i] for i in sorted(found)]


# (input schema, keys, aggregations) -> the combiner's columns, or None: the aggregate does not split
_COMBINE_PLANS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[tuple[str, str, dict]] | None] = {}
_COMBINE_PLANS_KEPT = 256


@_operator("combine")
def _combine(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    """A keyed aggregate's combiner (`funke.common.task.combine`): per key, the partial aggregates, each
    column carrying in its metadata how the aggregate after the exchange merges it. When an
    aggregation does not split, the rows pass unchanged and that aggregate does all the work."""
    df = _single(spec, inputs)
    keys, aggregations = _strings(spec, "keys"), _strings(spec, "aggregations")
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


@_operator("count")
def _count(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _single(spec, inputs).groupBy(*[column_ref(k) for k in _strings(spec, "keys")]).count()


@_operator("join")
def _join(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if len(inputs) != 2:
        raise ValueError(f"{_label(spec)} takes two inputs (left, right), got {len(inputs)}")
    left, right = inputs
    return left.join(right, on=_strings(spec, "on"), how=str(spec.config.get("how", "inner")))


@_operator("union")
def _union(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    if not inputs:
        raise ValueError(f"{_label(spec)} needs at least one input")
    return union_all(inputs)


@_operator("transform")
def _transform(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    fn = cloudpickle.loads(spec.function)
    result = fn(_single(spec, inputs))
    if not isinstance(result, DataFrame):
        raise TypeError(f"{_label(spec)}: the function returned {type(result).__name__}, not a DataFrame")
    return result


@_operator("noop")
def _noop(ctx: RuntimeContext, spec: OperatorSpec, inputs: list[DataFrame]) -> DataFrame:
    return _union(ctx, spec, inputs)


# ---------------------------------------------------------------------------------------------
# sinks
# ---------------------------------------------------------------------------------------------

_SINK_MODES = SINK_MODES


def _check_target(spec: OperatorSpec, target: str) -> None:
    """Mode "error": fail before running anything if the target already holds data. Best
    effort: a filesystem pyarrow cannot reach is left to the commit, which checks again."""
    info = _file_info(target)
    if info is None or info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.Directory:
        parsed = urlparse(target)
        if parsed.scheme in ("", "file"):
            local = os.path.abspath(parsed.path if parsed.scheme == "file" else target)
            with os.scandir(local) as entries:
                empty = next(entries, None) is None
        else:
            fs, inner = datafs.filesystem(target)
            empty = not fs.get_file_info(pafs.FileSelector(inner, recursive=False))
        if empty:
            return
    raise FileExistsError(
        f"{_label(spec)}: target {target} already exists and is not empty; "
        "set mode 'overwrite' to replace it, or write somewhere else"
    )


def _file_sink(fmt: str, defaults: dict[str, str] | None = None,
               prepare: Callable[[DataFrame], DataFrame] | None = None) -> Sink:
    def write(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
        target = str(_config(spec, "path"))
        out = prepare(df) if prepare else df
        writer = out.write.format(fmt).options(**_options(spec, defaults)).mode("overwrite")
        if ctx.batch is not None:
            # A streaming query: the target collects batch after batch; each batch is staged inside
            # it and committed once by the JobMaster (funke.jobmanager.streamsinks).
            writer.save(layout.stream_sink_staging_dir(target, ctx.batch.batch_id, ctx.subtask_index,
                                                       ctx.attempt_number))
            return
        mode = str(spec.config.get("mode", "error"))
        if mode not in _SINK_MODES:
            raise ValueError(f"{_label(spec)}: mode {mode!r} is not one of {', '.join(_SINK_MODES)}")
        if mode == "error":
            _check_target(spec, target)
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
        # overwrite: the staging directory belongs to this attempt alone; the target is only
        # touched by the commit once the job FINISHED.
        writer.save(staging)

    return write


def _as_text(df: DataFrame) -> DataFrame:
    fields = df.schema.fields
    if len(fields) == 1 and isinstance(fields[0].dataType, StringType):
        return df
    # A null becomes an empty field, so that columns stay aligned (concat_ws would drop it).
    columns = [F.coalesce(column_ref(f.name).cast("string"), F.lit("")) for f in fields]
    return df.select(F.concat_ws("\t", *columns).alias("value"))


OPERATORS["sink.parquet"] = _file_sink("parquet")
OPERATORS["sink.csv"] = _file_sink("csv", {"header": "true"})
OPERATORS["sink.json"] = _file_sink("json")
OPERATORS["sink.text"] = _file_sink("text", prepare=_as_text)


@_operator("sink.collect")
def _collect(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    target = layout.collect_dir(ctx.data_dir, ctx.job_id, ctx.vertex_id)
    if ctx.batch is not None:  # a streaming query: a memory sink of committed batches
        staging = layout.stream_sink_staging_dir(target, ctx.batch.batch_id, ctx.subtask_index, ctx.attempt_number)
    else:
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
    df.write.mode("overwrite").parquet(staging)


@_operator("sink.print")
def _print(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    prefix = f"{ctx.subtask_index + 1}> "  # Flink's print sink: "subtask> record"
    if ctx.batch is not None:
        # A streaming query: Spark Streaming's print(), per batch and subtask: the batch time and
        # the first rows.
        rows = df.take(PRINT_ROWS_PER_BATCH + 1)
        rule = "-------------------------------------------\n"
        lines = [rule, f"{prefix}Time: {ctx.batch.batch_time_ms} ms (batch {ctx.batch.batch_id})\n", rule]
        lines += [f"{prefix}{row}\n" for row in rows[:PRINT_ROWS_PER_BATCH]]
        lines += [f"{prefix}...\n"] if len(rows) > PRINT_ROWS_PER_BATCH else []
        sys.stdout.write("".join(lines) + "\n")
        sys.stdout.flush()
        return
    lines = [f"{prefix}{row}\n" for row in df.collect()]
    sys.stdout.write("".join(lines))
    sys.stdout.flush()


@_operator("sink.redis")
def _redis_sink(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    """Stages the batch's rows; the JobMaster appends them to the stream key in one transaction
    (funke.jobmanager.redissink)."""
    if ctx.batch is None:
        raise ValueError(f"{_label(spec)} is a sink of streaming queries: it runs in their micro-batches")
    target = layout.redis_sink_dir(ctx.data_dir, ctx.job_id, ctx.vertex_id)
    df.write.mode("overwrite").parquet(layout.stream_sink_staging_dir(target, ctx.batch.batch_id, ctx.subtask_index,
                                                                      ctx.attempt_number))


@_operator("sink.foreach_batch")
def _foreach_batch(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, fn: Callable[[DataFrame, int], Any]) -> None:
    """The user's fn(df, batch_id), here on the TaskManager (Structured Streaming's foreachBatch)."""
    if ctx.batch is None:
        raise ValueError(f"{_label(spec)} is a sink of streaming queries: it runs in their micro-batches")
    fn(df, ctx.batch.batch_id)


@_operator("sink.discard")
def _discard(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


@_operator("sink.noop")
def _sink_noop(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    # Unlike sink.discard, nothing runs: the pipeline is only planned.
    return None
