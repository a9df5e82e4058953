"""Keyed state where the rows are: the state store's reads and writes inside Spark's Python
workers, and the operators that use them over a stream: the running aggregate, the running
reduce and drop_duplicates (`funke.common.streaming.state` has the rules).

A running aggregate's batch reaches `running_aggregate_batches` as one row per key with the
batch's partial aggregates (Spark computed them: count, sum, min, max, and avg as sum and
count), the key's group in KEY_GROUP_COLUMN, plus one marker row for every group the subtask
owns, so that every owned group writes its version even when the batch has no row of it. Per
group, the function loads the state at the batch's version, merges, writes the next version,
and emits the changed keys (update mode) or every key (complete mode) with their totals.

Each Python worker keeps the groups it loaded, by version (`_loaded`): Spark reuses its workers
(spark.python.worker.reuse), so a group is read from disk again only when the worker is new, or
when what it holds is not the version asked for (a batch re-run after a failure asks for an older
one). A version's in-memory state changes only after its files are written.

Pickled by value into the workers, like `udf.py`, together with the pure rules module and the
store's file functions (`funke.runtime.statefiles`): a worker needs pyarrow and cloudpickle, not
funke.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming import state as _rules
from funke.common.streaming.state import (
    DELTA,
    KEY_GROUP_COLUMN,
    SNAPSHOT,
    SNAPSHOT_EVERY,
    StateMetrics,
    files_to_delete,
    group_dir_name,
    state_file_name,
)
from funke.runtime import statefiles as _files
from funke.runtime.statefiles import group_tables, write_table
from funke.taskmanager.operators.udf import ROWS_PER_BATCH, RowReader, RowWriter, _freeze

_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
_spark_cloudpickle.register_pickle_by_value(_rules)
_spark_cloudpickle.register_pickle_by_value(_files)

__all__ = ["MARKER_COLUMN", "AggregateSpec", "deduplicate_batches", "measure", "running_aggregate_batches",
           "running_reduce_batches"]

MARKER_COLUMN = "__funke_group_marker"
_CACHE_MODULE = "_funke_keyed_state"  # where a worker keeps its loaded groups across tasks
# a delta file's metadata: the group's keys after the version, the keys it wrote, the time it took
_ROWS_TOTAL, _ROWS_UPDATED, _UPDATE_MS = "funke.rows_total", "funke.rows_updated", "funke.update_ms"

# One aggregate of a running aggregate: (function, its partial columns). function is one of
# count, sum, min, max, avg (avg has two partial columns: the sum as a double, and the count).
AggregateSpec = tuple[str, tuple[str, ...]]


class Group:
    """One key group's state at one version: frozen key -> (key values, partial values)."""

    __slots__ = ("version", "rows", "stamp")

    def __init__(self, version: int, rows: dict[Any, tuple[list, list]], stamp: tuple[int, int] | None):
        self.version = version
        self.rows = rows
        self.stamp = stamp  # (inode, mtime) of the file that made this version: a wiped store is seen


def _loaded() -> dict[tuple[str, int], Group]:
    holder = sys.modules.get(_CACHE_MODULE)
    if holder is None:
        holder = types.ModuleType(_CACHE_MODULE)
        holder.groups = {}  # type: ignore[attr-defined]
        sys.modules[_CACHE_MODULE] = holder
    return holder.groups  # type: ignore[attr-defined,no-any-return]


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _read_rows(table: pa.Table, n_keys: int, into: dict[Any, tuple[list, list]]) -> None:
    columns = [c.to_pylist() for c in table.columns]
    for row in zip(*columns):
        key = list(row[:n_keys])
        into[_freeze(tuple(key))] = (key, list(row[n_keys:]))


def _write_rows(path: str, schema: pa.Schema, rows: list[tuple[list, list]], metadata: dict | None = None) -> None:
    columns: list[list] = [[] for _ in schema]
    for key, values in rows:
        for column, v in zip(columns, key + values):
            column.append(v)
    if metadata:
        schema = schema.with_metadata({k: str(v) for k, v in metadata.items()})
    write_table(path, pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema))


def load_group(root: str, key_group: int, version: int, n_keys: int) -> Group:
    """The group's state at `version`, from this worker's memory when it holds exactly that
    version of this store, else from the files (MissingState when they cannot make it)."""
    directory = os.path.join(root, group_dir_name(key_group))
    held = _loaded().get((root, key_group))
    if held is not None and held.version == version:
        if version == 0 or held.stamp == _stamp(os.path.join(directory, state_file_name(version, DELTA))):
            return held
    rows: dict[Any, tuple[list, list]] = {}
    for table in group_tables(root, key_group, version):
        _read_rows(table, n_keys, rows)
    stamp = _stamp(os.path.join(directory, state_file_name(version, DELTA))) if version else None
    return Group(version, rows, stamp)


def commit_group(root: str, key_group: int, group: Group, changes: dict[Any, tuple[list, list]],
                 schema: pa.Schema, retain: int, began: float) -> Group:
    """Writes version group.version + 1 (the changes, and every SNAPSHOT_EVERY versions the
    whole state), deletes what retention no longer needs, and only then makes the new version
    this worker's. The delta's metadata says what the version holds (`measure` reads it);
    `began`: when the group's work started (time.perf_counter())."""
    directory = os.path.join(root, group_dir_name(key_group))
    os.makedirs(directory, exist_ok=True)
    version = group.version + 1
    delta_path = os.path.join(directory, state_file_name(version, DELTA))
    total = len(group.rows) + sum(1 for k in changes if k not in group.rows)
    _write_rows(delta_path, schema, list(changes.values()), {
        _ROWS_TOTAL: total, _ROWS_UPDATED: len(changes), _UPDATE_MS: round((time.perf_counter() - began) * 1000, 3)})
    rows = group.rows
    rows.update(changes)  # the old version's dict is not kept: it is this worker's only copy
    if version % SNAPSHOT_EVERY == 0:
        _write_rows(os.path.join(directory, state_file_name(version, SNAPSHOT)), schema, list(rows.values()))
        for name in files_to_delete(os.listdir(directory), version, retain):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    new = Group(version, rows, _stamp(delta_path))
    _loaded()[(root, key_group)] = new
    return new


def measure(root: str, owned: range, version: int) -> StateMetrics:
    """The state of groups `owned` at `version`, from the metadata of the version's delta files
    and the sizes of the groups' files (on the task's side, once the batch's Spark work ran)."""
    total = StateMetrics()
    for key_group in owned:
        directory = os.path.join(root, group_dir_name(key_group))
        path = os.path.join(directory, state_file_name(version, DELTA))
        try:
            with pa.memory_map(path) as source:
                meta = ipc.open_file(source).schema.metadata or {}
            written = os.path.getsize(path)
            on_disk = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
        except FileNotFoundError:
            continue
        try:  # every SNAPSHOT_EVERY versions the group was written whole too
            written += os.path.getsize(os.path.join(directory, state_file_name(version, SNAPSHOT)))
        except FileNotFoundError:
            pass
        total = total + StateMetrics(int(meta.get(_ROWS_TOTAL.encode(), 0)), int(meta.get(_ROWS_UPDATED.encode(), 0)), 0,
                                     written, on_disk, float(meta.get(_UPDATE_MS.encode(), 0.0)))
    return total


def _merge(function: str, old: list, new: list) -> list:
    """Two partial aggregates of one key as one (SQL: nulls are ignored; a count is never null)."""
    if function in ("count", "sum", "avg"):
        return [n if o is None else o if n is None else o + n for o, n in zip(old, new)]
    if function == "min":
        return [n if o is None else o if n is None else min(o, n) for o, n in zip(old, new)]
    return [n if o is None else o if n is None else max(o, n) for o, n in zip(old, new)]


def _final(function: str, partials: list) -> Any:
    if function == "avg":
        total, count = partials
        return None if not count else total / count
    return partials[0]


def running_aggregate_batches(root: str, keys: list[str], aggregates: list[AggregateSpec], version: int,
                              mode: str, retain: int, state_schema: pa.Schema, out_schema: pa.Schema,
                              owned: range):
    """The mapInArrow function of one batch of a running aggregate (see the module docstring)."""
    n_keys = len(keys)
    spans = []  # (function, first partial index, count) per aggregate
    at = 0
    for function, columns in aggregates:
        spans.append((function, at, len(columns)))
        at += len(columns)
    state_columns = keys + [c for _, columns in aggregates for c in columns]

    def merge_all(old: list | None, new: list) -> list:
        if old is None:
            return new
        merged: list = []
        for function, first, count in spans:
            merged += _merge(function, old[first:first + count], new[first:first + count])
        return merged

    def finals(values: list) -> list:
        return [_final(function, values[first:first + count]) for function, first, count in spans]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        emitted = _fold(batches, state_columns, owned, list(range(n_keys)), root, version, retain, state_schema,
                        mode, lambda old, row: merge_all(old, row[n_keys:]))
        yield from _batches([key + finals(values) for key, values in emitted], out_schema)

    return run


def deduplicate_batches(root: str, keys: list[str], version: int, retain: int, state_schema: pa.Schema,
                        out_schema: pa.Schema, owned: range):
    """The mapInArrow function of one batch of drop_duplicates over a stream: the rows whose key
    no batch before had (the batch's own duplicates were dropped before), each key remembered in
    its group's state."""
    positions = [out_schema.names.index(k) for k in keys]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        firsts: list[list] = []

        def first_only(old: list | None, row: list) -> list | None:
            if old is not None:
                return None  # seen before: dropped, the state unchanged
            firsts.append(row)
            return []

        _fold(batches, out_schema.names, owned, positions, root, version, retain, state_schema, "update", first_only)
        yield from _batches(firsts, out_schema)

    return run


def running_reduce_batches(fn_bytes: bytes, root: str, keys: list[str], version: int, mode: str, retain: int,
                           state_schema: pa.Schema, out_schema: pa.Schema, owned: range, label: str):
    """The mapInArrow function of one batch of a running reduce: each key's record folded with
    the user's fn(a, b) over every batch so far (Flink's keyed reduce). The state holds the
    record as Arrow gives it, converted to what fn receives (udf's convention) on every call, so
    a worker that loaded it from the files calls fn exactly as one that kept it in memory."""
    positions = [out_schema.names.index(k) for k in keys]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader, writer = RowReader(out_schema), RowWriter(out_schema, label)

        def to_user(values: list) -> Any:
            converted = [convert(v) if convert else v for v, convert in zip(values, reader.converters)]
            return converted[0] if len(converted) == 1 else reader.make(*converted)

        def from_user(result: Any, key: list) -> list:
            values = [convert(v) if convert else v for v, convert in zip(writer.values(result), writer.converters)]
            if [values[p] for p in positions] != key:
                raise ValueError(f"{label}: fn(a, b) returned {result!r}, whose key {[values[p] for p in positions]} "
                                 f"is not the key {key} of a and b; a keyed reduce keeps the key")
            return values

        def fold(old: list | None, row: list) -> list:
            return row if old is None else from_user(fn(to_user(old), to_user(row)), [row[p] for p in positions])

        emitted = _fold(batches, out_schema.names, owned, positions, root, version, retain, state_schema, mode, fold)
        yield from _batches([values for _, values in emitted], out_schema)

    return run


def _fold(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range, positions: list[int], root: str,
          version: int, retain: int, state_schema: pa.Schema, mode: str,
          fold: Callable[[list | None, list], list | None]) -> list[tuple[list, list]]:
    """Every keyed operator's batch, per key group: load the group at `version`, fold each row
    into its key's value (`fold(value so far or None, row)`: the new value, or None to leave the
    key as it is), commit the next version; what the batch emits: (key, value) of the keys it
    changed, or in complete mode of every key. `positions`: where the key is in a row."""
    emitted: list[tuple[list, list]] = []
    for key_group, rows in _by_group(batches, columns, owned):
        began = time.perf_counter()
        group = load_group(root, key_group, version, len(positions))
        changes: dict[Any, tuple[list, list]] = {}
        for row in rows:
            key = [row[p] for p in positions]
            frozen = _freeze(tuple(key))
            seen = changes.get(frozen) or group.rows.get(frozen)
            value = fold(seen[1] if seen is not None else None, row)
            if value is not None:
                changes[frozen] = (key, value)
        group = commit_group(root, key_group, group, changes, state_schema, retain, began)
        emitted += group.rows.values() if mode == "complete" else changes.values()
    return emitted


def _by_group(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range) -> list[tuple[int, list[list]]]:
    """The rows (values of `columns`) per key group, in group order; a group with only its
    marker row has no rows, and is there all the same. A row of a group the subtask does not own
    is an error: its state is another subtask's to write."""
    per_group: dict[int, list[list]] = {}
    for batch in batches:
        groups = batch.column(KEY_GROUP_COLUMN).to_pylist()
        markers = batch.column(MARKER_COLUMN).to_pylist()
        values = [batch.column(c).to_pylist() for c in columns]
        for i, (group, marker) in enumerate(zip(groups, markers)):
            rows = per_group.setdefault(group, [])
            if not marker:
                rows.append([v[i] for v in values])
    foreign = sorted(g for g in per_group if g not in owned)
    if foreign:
        raise RuntimeError(f"rows of key group(s) {foreign[:5]} reached the subtask owning key groups "
                           f"{owned.start}..{owned.stop - 1}: the exchange did not route them by key group")
    return sorted(per_group.items())


def _batches(rows: list[list], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for start in range(0, len(rows), ROWS_PER_BATCH):
        chunk = rows[start:start + ROWS_PER_BATCH]
        yield pa.RecordBatch.from_arrays(
            [pa.array([row[i] for row in chunk], type=f.type) for i, f in enumerate(schema)], schema=schema)
