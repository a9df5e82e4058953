"""The running folds over a stream, for the planner (`transforms`): each key's value folded with
every batch's rows — the running aggregate, the running reduce, and drop_duplicates — and the
rule of partial aggregates they share with the window operators.

A running aggregate's batch reaches `running_aggregate_batches` as one row per key with the
batch's partial aggregates (Spark computed them: count, sum, min, max, and avg as sum and
count), the key's group in KEY_GROUP_COLUMN, plus one marker row for every group the subtask
owns (`store.by_group`). Per group, the store loads the state at the batch's version, the rows
are merged into it, the next version is committed, and the batch emits the changed keys (update
mode) or every key (complete mode) with their totals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pyarrow as pa
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming.state import LEGACY, OperatorLineage
from funke.taskmanager.operators.keyedstate.store import StateStore, StateVersion, emit, no_gc
from funke.taskmanager.operators.udf import RUNTIME_FILES, RowReader, RowWriter

_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
RUNTIME_FILES.add(__file__)

__all__ = ["AggregateSpec", "deduplicate_batches", "partials_of", "running_aggregate_batches",
           "running_reduce_batches"]

# One aggregate of a running aggregate: (function, its partial columns). function is one of
# count, sum, min, max, avg (avg has two partial columns: the sum as a double, and the count).
AggregateSpec = tuple[str, tuple[str, ...]]

_ADDING = ("count", "sum", "avg")  # partials that merge by adding


def _merge(function: str, old: Any, new: Any) -> list:
    """Two partial aggregates of one key as one (SQL: nulls are ignored; a count is never null)."""
    if function in _ADDING:
        return [n if o is None else o if n is None else o + n for o, n in zip(old, new)]
    if function == "min":
        return [n if o is None else o if n is None else min(o, n) for o, n in zip(old, new)]
    return [n if o is None else o if n is None else max(o, n) for o, n in zip(old, new)]


def _final(function: str, partials: Any) -> Any:
    if function == "avg":
        total, count = partials
        return None if not count else total / count
    return partials[0]


def partials_of(aggregates: list[AggregateSpec]) -> tuple[Callable[[Any, Any], list], Callable[[list], list]]:
    """For partial aggregates: how two lists of them merge into one, and the totals they stand
    for (an avg's sum over its count; every other total is its one partial, as it is)."""
    spans = []  # (function, first partial index, count) per aggregate
    at = 0
    for function, columns in aggregates:
        spans.append((function, at, len(columns)))
        at += len(columns)
    has_avg = any(function == "avg" for function, _, _ in spans)

    def merge_each(old: Any, new: Any) -> list:
        merged: list = []
        for function, first, count in spans:
            merged += _merge(function, old[first:first + count], new[first:first + count])
        return merged

    def merge_adding(old: Any, new: Any) -> list:  # every partial adds (count, sum, avg): one loop
        return [n if o is None else o if n is None else o + n for o, n in zip(old, new)]

    def totals(values: list) -> list:
        if not has_avg:
            return values
        return [_final(function, values[first:first + count]) for function, first, count in spans]

    return (merge_adding if all(function in _ADDING for function, _, _ in spans) else merge_each), totals


def _folded(store: StateStore, batches: Iterator[pa.RecordBatch], columns: list[str], owned: range,
            positions: list[int], mode: str,
            fold: Callable[[list | None, tuple], list | None]) -> list[tuple[list, list]]:
    """The batch folded into the state (`StateVersion.fold`); what it emits: the (key, values)
    of the keys it changed, or in complete mode of every key."""
    def rule(version: StateVersion, rows: list[tuple]) -> Any:
        version.fold(rows, positions, fold)
        return () if mode == "complete" else version.changed()

    return store.each_group(batches, columns, owned, rule, StateVersion.entries if mode == "complete" else None)


def running_aggregate_batches(root: str, keys: list[str], aggregates: list[AggregateSpec], version: int,
                              mode: str, retain: int, state_schema: pa.Schema, out_schema: pa.Schema,
                              owned: range, lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a running aggregate (see the module docstring)."""
    n_keys = len(keys)
    merge, totals = partials_of(aggregates)
    has_avg = any(function == "avg" for function, _ in aggregates)
    state_columns = keys + [c for _, columns in aggregates for c in columns]
    store = StateStore(root, version, n_keys, state_schema, retain, lineage)

    def fold(old: list | None, row: tuple) -> list:
        return list(row[n_keys:]) if old is None else merge(old, row[n_keys:])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with no_gc():
            emitted = _folded(store, batches, state_columns, owned, list(range(n_keys)), mode, fold)
            # without an avg, every total is its one partial as it is
            if has_avg:
                rows = [key + totals(values) for key, values in emitted]
            else:
                rows = [key + values for key, values in emitted]
        yield from emit(rows, out_schema)

    return run


def deduplicate_batches(root: str, keys: list[str], version: int, retain: int, state_schema: pa.Schema,
                        out_schema: pa.Schema, owned: range, lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of drop_duplicates over a stream: the rows whose key
    no batch before had (the batch's own duplicates were dropped before), each key remembered in
    its group's state."""
    positions = [out_schema.names.index(k) for k in keys]
    store = StateStore(root, version, len(keys), state_schema, retain, lineage)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        firsts: list[list] = []

        def first_only(old: list | None, row: tuple) -> list | None:
            if old is not None:
                return None  # seen before: dropped, the state unchanged
            firsts.append(row)  # type: ignore[arg-type]
            return []

        _folded(store, batches, out_schema.names, owned, positions, "update", first_only)
        yield from emit(firsts, out_schema)

    return run


def running_reduce_batches(fn_bytes: bytes, root: str, keys: list[str], version: int, mode: str, retain: int,
                           state_schema: pa.Schema, out_schema: pa.Schema, owned: range, label: str,
                           lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a running reduce: each key's record folded with
    the user's fn(a, b) over every batch so far (Flink's keyed reduce). The state holds the
    record as Arrow gives it, converted to what fn receives (udf's convention) on every call, so
    a worker that loaded it from the files calls fn exactly as one that kept it in memory."""
    positions = [out_schema.names.index(k) for k in keys]
    store = StateStore(root, version, len(keys), state_schema, retain, lineage)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader, writer = RowReader(out_schema), RowWriter(out_schema, label)
        to_user = reader.record()

        def from_user(result: Any, key: list) -> list:
            values = [convert(v) if convert else v for v, convert in zip(writer.values(result), writer.converters)]
            if [values[p] for p in positions] != key:
                raise ValueError(f"{label}: fn(a, b) returned {result!r}, whose key {[values[p] for p in positions]} "
                                 f"is not the key {key} of a and b; a keyed reduce keeps the key")
            return values

        def fold(old: list | None, row: tuple) -> list:
            return list(row) if old is None else from_user(fn(to_user(old), to_user(row)), [row[p] for p in positions])

        emitted = _folded(store, batches, out_schema.names, owned, positions, mode, fold)
        yield from emit([values for _, values in emitted], out_schema)

    return run
