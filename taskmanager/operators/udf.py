"""The Arrow UDF runtime: how a user's Python function (map, flat_map, filter, reduce, a
generating source.range) runs per row inside `DataFrame.mapInArrow`, and how its failure is told.

The functions are cloudpickled by the client; batches come in as Spark cuts them
(spark.sql.execution.arrow.maxRecordsPerBatch, 10 000 by default) and go back with at most
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

`map_batches`, `filter_batches` and `reduce_batches` make the function mapInArrow runs;
`cancellable` wraps it so that a cancelled attempt's Python worker ends itself. Everything they
use is in this module, which is pickled *by value* (see the registration below the imports): a
Python worker needs pyspark, pyarrow and cloudpickle, but not funke itself, which is what lets a
Spark Connect server or a cluster's executors run funke tasks. So this module imports nothing of
funke.

A user function that raises reaches the task as Spark's PythonException, which carries the
worker's traceback; `user_exception` finds the user's own exception in it and drops this
module's frames around the call.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import cloudpickle
import pyarrow as pa
from pyspark import cloudpickle as _spark_cloudpickle
from pyspark.sql import Row

# The closures handed to mapInArrow reference this module's helpers; pickled by reference they
# would need funke importable in every Python worker. By value, they need only what they import.
_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

__all__ = ["CANCEL_POLL_S", "ROWS_PER_BATCH", "RowReader", "RowWriter", "cancellable", "filter_batches",
           "map_batches", "reduce_batches", "user_exception"]

ROWS_PER_BATCH = 10_000  # the most rows a Python operator hands back to Spark in one Arrow batch


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


class RowReader:
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

    def record(self) -> Callable[[list], Any]:
        """One row's column values -> the record a user function receives (as `read` gives it)."""
        converters, make = self.converters, self.make
        if not any(converters):
            return (lambda values: values[0]) if len(converters) == 1 else (lambda values: make(*values))

        def to_user(values: list) -> Any:
            converted = [convert(v) if convert else v for v, convert in zip(values, converters)]
            return converted[0] if len(converted) == 1 else make(*converted)

        return to_user


class RowWriter:
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


def _single_column_batches(fn: Callable[[Any], Any], batches: Iterator[pa.RecordBatch], writer: RowWriter,
                           flat: bool) -> Iterator[pa.RecordBatch]:
    """The fast path for a one-column output of an atomic type (a word count's words): results
    are collected as they come, at C speed, and only normalised one by one (1-tuples, dicts,
    Rows) if Arrow rejects them as they are."""
    field = writer.schema.field(0)
    reader: RowReader | None = None
    column: list[Any] = []

    def flush() -> pa.RecordBatch:
        nonlocal column
        values, column = column, []
        try:
            return pa.RecordBatch.from_arrays([pa.array(values, type=field.type)], schema=writer.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return writer.batch([writer.values(v) for v in values])

    for batch in batches:
        reader = reader or RowReader(batch.schema)
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


def map_batches(fn_bytes: bytes, out_schema: pa.Schema, label: str, flat: bool):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        writer = RowWriter(out_schema, label)
        if writer.single_atomic:
            yield from _single_column_batches(fn, batches, writer, flat)
            return
        reader: RowReader | None = None
        for batch in batches:
            reader = reader or RowReader(batch.schema)
            values = reader.read(batch)
            results = [r for v in values for r in fn(v)] if flat else [fn(v) for v in values]
            for start in range(0, len(results), ROWS_PER_BATCH):
                yield writer.batch_of_results(results[start:start + ROWS_PER_BATCH])

    return run


# How often a Python worker running user code looks for its attempt's cancel marker.
CANCEL_POLL_S = 0.1


def cancellable(run: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], marker: str | None):
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


def filter_batches(fn_bytes: bytes):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader: RowReader | None = None
        for batch in batches:
            reader = reader or RowReader(batch.schema)
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


def reduce_batches(fn_bytes: bytes, keys: list[str], schema: pa.Schema, label: str):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader = RowReader(schema)
        writer = RowWriter(schema, label)
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


_WORKER_TRACEBACK = "Traceback (most recent call last):"


def user_exception(text: str) -> tuple[str, str, str] | None:
    """(type, message, traceback) of the user's exception in the text of Spark's PythonException
    (`ValueError`, `record 7 is cursed`, the worker's traceback without this module's frames);
    None when the text holds no worker traceback that ends in an exception."""
    if _WORKER_TRACEBACK not in text:
        return None
    worker = text[text.rindex(_WORKER_TRACEBACK):].rstrip()
    last = worker.splitlines()[-1]
    exception_type, _, message = last.partition(": ")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", exception_type):
        return None
    return exception_type, message, _without_runtime_frames(worker)


# The files whose frames a user's traceback does not show (the runtime around the user's call);
# modules that call user code the same way add theirs.
RUNTIME_FILES = {__file__}


def _without_runtime_frames(worker_traceback: str) -> str:
    kept: list[str] = []
    skipping = False
    for line in worker_traceback.splitlines():
        if line.startswith('  File "'):
            skipping = any(line.startswith(f'  File "{f}"') for f in RUNTIME_FILES)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"
