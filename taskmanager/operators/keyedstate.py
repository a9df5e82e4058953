"""Keyed state where the rows are: the state store's reads and writes inside Spark's Python
workers, and the operators that use them over a stream: the running aggregate, the running
reduce, drop_duplicates, the keyed process function, and the event-time operators — window and
session window aggregates, drop_duplicates_within_watermark and the interval join, whose state
the batch's watermark bounds (`funke.common.streaming.state` and `funke.common.streaming.eventtime`
have the rules).

A running aggregate's batch reaches `running_aggregate_batches` as one row per key with the
batch's partial aggregates (Spark computed them: count, sum, min, max, and avg as sum and
count), the key's group in KEY_GROUP_COLUMN, plus one marker row for every group the subtask
owns, so that every owned group writes its version even when the batch has no row of it. Per
group, the function loads the state at the batch's version, merges, writes the next version,
and emits the changed keys (update mode) or every key (complete mode) with their totals.

Each Python worker keeps the groups it loaded, by version and the run whose files made it
(`_loaded`): Spark reuses its workers (spark.python.worker.reuse), so a group is read from disk
again only when the worker is new, or when what it holds is not the version asked for, as the
batch's lineage says (a batch re-run after a failure asks for an older one, or for another run's
files). A version's in-memory state changes only after its files are written.

Every function takes the operator's `lineage` (`funke.common.streaming.state.OperatorLineage`:
which run's files make each version, and the token this batch writes with); without one, the
files are read and written as funke 0.3.0 did (unfenced).

Pickled by value into the workers, like `udf.py`, together with the pure rules module and the
store's file functions (`funke.runtime.statefiles`): a worker needs pyarrow and cloudpickle, not
funke.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import heapq
import itertools
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming import state as _rules
from funke.common.streaming.state import (
    DELTA,
    KEY_GROUP_COLUMN,
    LEGACY,
    REMOVED_COLUMN,
    SNAPSHOT,
    SNAPSHOT_EVERY,
    OperatorLineage,
    StateMetrics,
    files_to_delete,
    group_dir_name,
    state_file_name,
)
from funke.runtime import statefiles as _files
from funke.runtime.statefiles import group_tables, write_table
from funke.taskmanager.operators.udf import (
    ROWS_PER_BATCH,
    RUNTIME_FILES,
    RowReader,
    RowWriter,
    _arrow_is_atomic as _udf_atomic,
    _freeze,
    _from_arrow,
    _to_arrow,
)

_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
_spark_cloudpickle.register_pickle_by_value(_rules)
_spark_cloudpickle.register_pickle_by_value(_files)

__all__ = ["MARKER_COLUMN", "AggregateSpec", "StateValueError", "deduplicate_batches", "deduplicate_within_batches", "interval_join_batches", "measure",
           "process_batches", "running_aggregate_batches", "running_reduce_batches", "session_aggregate_batches", "window_aggregate_batches"]

RUNTIME_FILES.add(__file__)  # a process function's traceback starts at the user's code

MARKER_COLUMN = "__funke_group_marker"
_CACHE_MODULE = "_funke_keyed_state"  # where a worker keeps its loaded groups across tasks
# a delta file's metadata: the group's keys after the version, the keys it wrote, the time it took
_ROWS_TOTAL, _ROWS_UPDATED, _ROWS_REMOVED, _UPDATE_MS = ("funke.rows_total", "funke.rows_updated", "funke.rows_removed",
                                                         "funke.update_ms")
_MEMORY, _COMMIT_MS = "funke.memory_bytes", "funke.commit_ms"
_SAMPLED = 32  # entries of a group whose sizes estimate its memory

# One aggregate of a running aggregate: (function, its partial columns). function is one of
# count, sum, min, max, avg (avg has two partial columns: the sum as a double, and the count).
AggregateSpec = tuple[str, tuple[str, ...]]


class Group:
    """One key group's state at one version: frozen key -> (key values, partial values)."""

    __slots__ = ("version", "rows", "stamp", "timers", "event_timers", "index", "token")

    def __init__(self, version: int, rows: dict[Any, tuple[list, list]], stamp: tuple[int, int] | None,
                 timers: list | None = None, event_timers: list | None = None, index: dict | None = None,
                 token: str | None = None):
        self.version = version
        self.rows = rows
        self.stamp = stamp  # (inode, mtime) of the file that made this version: a wiped store is seen
        self.token = token  # the run whose files made this version (None: an empty version)
        # a process function's timers as a heap of (time, frozen key), built when first needed;
        # an entry whose key no longer has that timer is skipped when it comes up
        self.timers = timers
        self.event_timers = event_timers  # the same for event-time timers (a process function's)
        # an operator's lookup built when first needed (session windows: key -> its sessions)
        self.index = index


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
    """A version's rows into `into`; a delta's removed keys (REMOVED_COLUMN true) out of it."""
    removable = table.schema.names[-1] == REMOVED_COLUMN
    columns = [c.to_pylist() for c in (table.columns[:-1] if removable else table.columns)]
    atomic = all(_udf_atomic(f.type) for f in list(table.schema)[:n_keys])
    if not removable and atomic:  # the usual case, at C speed: a plain key's tuple is its frozen form
        keys = list(zip(*columns[:n_keys]))
        values = map(list, zip(*columns[n_keys:])) if len(columns) > n_keys else ([] for _ in keys)
        into.update(zip(keys, zip(map(list, keys), values)))
        return
    removed = table.column(REMOVED_COLUMN).to_pylist() if removable else [False] * table.num_rows
    for row, gone in zip(zip(*columns), removed):
        key = list(row[:n_keys])
        if gone:
            into.pop(_freeze(tuple(key)), None)
        else:
            into[_freeze(tuple(key))] = (key, list(row[n_keys:]))


def _write_rows(path: str, schema: pa.Schema, rows: list[tuple[list, list]], metadata: dict | None = None,
                removed: list[list] = ()) -> None:
    """`rows` (key, values), and when the schema ends in REMOVED_COLUMN the `removed` keys, as
    one Arrow file (`metadata` in its schema; a callable is called with the ms the table took to
    build, and gives it). A value Arrow cannot hold as its column's type is a StateValueError
    naming the column and the key."""
    began = time.perf_counter()
    removable = schema.names[-1] == REMOVED_COLUMN
    tail = [False] if removable else []
    columns: list[list] = [list(c) for c in zip(*[key + values + tail for key, values in rows])] if rows else [
        [] for _ in schema]
    width = len(schema) - len(removed[0]) - 1 if removed else 0
    for key in removed:
        for column, v in zip(columns, key + [None] * width + [True]):
            column.append(v)
    arrays = []
    for i, (column, f) in enumerate(zip(columns, schema)):
        try:
            arrays.append(pa.array(column, type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise _value_error(f, column, [key for key, _ in rows] + list(removed), e) from None
    if callable(metadata):
        metadata = metadata(round((time.perf_counter() - began) * 1000, 3))
    if metadata:
        schema = schema.with_metadata({k: str(v) for k, v in metadata.items()})
    write_table(path, pa.Table.from_arrays(arrays, schema=schema))


class StateValueError(TypeError):
    """A state value that cannot be stored as its declared type."""


def _value_error(f: pa.Field, column: list, keys: list[list], error: Exception) -> StateValueError:
    for value, key in zip(column, keys):  # the first value Arrow refuses on its own
        try:
            pa.array([value], type=f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            return StateValueError(f"state {f.name!r} of key {tuple(key)!r}: {value!r} "
                                   f"({type(value).__name__}) cannot be stored as {f.type}: {e}")
    return StateValueError(f"state {f.name!r}: cannot be stored as {f.type}: {error}")


def load_group(root: str, key_group: int, version: int, n_keys: int, lineage: OperatorLineage = LEGACY) -> Group:
    """The group's state at `version` as `lineage` says, from this worker's memory when it holds
    exactly that version made by the same run's files; when it holds an older one of the lineage
    (another worker ran the group's last batches), that one with the deltas after it applied;
    else from the files (MissingState when they cannot make it)."""
    directory = os.path.join(root, group_dir_name(key_group))
    empty = lineage.empty(version)
    token = None if empty else lineage.token(version)
    held = _loaded().get((root, key_group))
    if held is not None and held.version == version and held.token == token:
        if empty or held.stamp == _stamp(os.path.join(directory, state_file_name(version, DELTA, token or ""))):
            return held
    if held is not None and held.token is not None and 0 < held.version < version and not empty \
            and held.token == lineage.token(held.version) \
            and held.stamp == _stamp(os.path.join(directory, state_file_name(held.version, DELTA, held.token))):
        caught_up = _catch_up((root, key_group), directory, held, version, n_keys, lineage)
        if caught_up is not None:
            return caught_up
    rows: dict[Any, tuple[list, list]] = {}
    for table in group_tables(root, key_group, version, lineage):
        _read_rows(table, n_keys, rows)
    stamp = None if empty else _stamp(os.path.join(directory, state_file_name(version, DELTA, token or "")))
    return Group(version, rows, stamp, token=token)


def _catch_up(cached_as: tuple[str, int], directory: str, held: Group, version: int, n_keys: int,
              lineage: OperatorLineage) -> Group | None:
    """`held` brought to `version` by the lineage's deltas after it (None when one is missing, or
    the lineage does not name its run: the files make the version whole instead). The held dict is
    changed in place (it is this worker's only copy), so it leaves the cache until the version is
    made."""
    tokens = [lineage.token(v) for v in range(held.version + 1, version + 1)]
    if any(t is None for t in tokens):
        return None
    paths = [os.path.join(directory, state_file_name(v, DELTA, t or ""))
             for v, t in zip(range(held.version + 1, version + 1), tokens)]
    if not all(os.path.exists(p) for p in paths):
        return None
    _loaded().pop(cached_as, None)
    for path in paths:
        _read_rows(_files.read_table(path), n_keys, held.rows)
    # a process function's timers are found again
    return Group(version, held.rows, _stamp(paths[-1]), token=tokens[-1])


def commit_group(root: str, key_group: int, group: Group, changes: dict[Any, tuple[list, list]],
                 schema: pa.Schema, retain: int, began: float, removed: dict[Any, list] | None = None,
                 lineage: OperatorLineage = LEGACY) -> Group:
    """Writes version group.version + 1 under this run's token (the lineage's for that version:
    the changes and the `removed` keys, and every SNAPSHOT_EVERY versions the whole state),
    deletes what retention no longer needs, and only then makes the new version this worker's.
    The delta's metadata says what the version holds (`measure` reads it); `began`: when the
    group's work started (time.perf_counter())."""
    directory = os.path.join(root, group_dir_name(key_group))
    os.makedirs(directory, exist_ok=True)
    version = group.version + 1
    token = lineage.token(version)
    if token is None:
        raise ValueError(f"the batch's state lineage names no run for version {version}: nothing to write it as")
    delta_path = os.path.join(directory, state_file_name(version, DELTA, token))
    removed = {k: key for k, key in (removed or {}).items() if k in group.rows and k not in changes}
    rows = group.rows
    total = len(rows) + sum(1 for k in changes if k not in rows) - len(removed)
    update_ms = round((time.perf_counter() - began) * 1000, 3)
    memory = _memory_estimate(rows, changes, total)
    _write_rows(delta_path, schema, list(changes.values()), lambda commit_ms: {
        _ROWS_TOTAL: total, _ROWS_UPDATED: len(changes), _ROWS_REMOVED: len(removed), _UPDATE_MS: update_ms,
        _MEMORY: memory, _COMMIT_MS: commit_ms}, list(removed.values()))
    rows.update(changes)  # the old version's dict is not kept: it is this worker's only copy
    for k in removed:
        del rows[k]
    if version % SNAPSHOT_EVERY == 0:
        _write_rows(os.path.join(directory, state_file_name(version, SNAPSHOT, token)), schema, list(rows.values()))
        for name in files_to_delete(os.listdir(directory), version, retain, lineage):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    new = Group(version, rows, _stamp(delta_path), group.timers, group.event_timers, group.index, token)
    _loaded()[(root, key_group)] = new
    return new


def _memory_estimate(rows: dict, changes: dict, total: int) -> int:
    """The bytes a group of `total` keys takes in a worker's memory, estimated from the sizes of
    a few of its entries (Python objects, one level into keys and values) and the dict's own."""
    sample = list(itertools.islice(changes.items() if changes else rows.items(), _SAMPLED))
    if not sample:
        return sys.getsizeof(rows)
    each = 0
    for frozen, (key, values) in sample:
        each += sys.getsizeof(frozen) + sys.getsizeof(key) + sys.getsizeof(values) + 56  # the pair
        each += sum(sys.getsizeof(v) for v in key) + sum(sys.getsizeof(v) for v in values)
    return sys.getsizeof(rows) + each * total // len(sample)


def measure(root: str, owned: range, version: int, token: str = "") -> StateMetrics:
    """The state of groups `owned` at `version`, from the metadata of the version's delta files
    (those of run `token`, which the batch just wrote) and the sizes of the groups' files (on the
    task's side, once the batch's Spark work ran)."""
    total = StateMetrics()
    for key_group in owned:
        directory = os.path.join(root, group_dir_name(key_group))
        path = os.path.join(directory, state_file_name(version, DELTA, token))
        try:
            with pa.memory_map(path) as source:
                meta = ipc.open_file(source).schema.metadata or {}
            written = os.path.getsize(path)
            on_disk = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
        except FileNotFoundError:
            continue
        try:  # every SNAPSHOT_EVERY versions the group was written whole too
            written += os.path.getsize(os.path.join(directory, state_file_name(version, SNAPSHOT, token)))
        except FileNotFoundError:
            pass
        total = total + StateMetrics(int(meta.get(_ROWS_TOTAL.encode(), 0)), int(meta.get(_ROWS_UPDATED.encode(), 0)),
                                     int(meta.get(_ROWS_REMOVED.encode(), 0)), written, on_disk,
                                     float(meta.get(_UPDATE_MS.encode(), 0.0)), int(meta.get(_MEMORY.encode(), 0)),
                                     float(meta.get(_COMMIT_MS.encode(), 0.0)))
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
                              owned: range, lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a running aggregate (see the module docstring)."""
    n_keys = len(keys)
    spans = []  # (function, first partial index, count) per aggregate
    at = 0
    for function, columns in aggregates:
        spans.append((function, at, len(columns)))
        at += len(columns)
    state_columns = keys + [c for _, columns in aggregates for c in columns]

    def merge_each(old: list | None, new: tuple) -> list:
        if old is None:
            return list(new)
        merged: list = []
        for function, first, count in spans:
            merged += _merge(function, old[first:first + count], new[first:first + count])
        return merged

    def merge_adding(old: list | None, new: tuple) -> list:  # every partial adds (count, sum, avg): one loop
        if old is None:
            return list(new)
        return [n if o is None else o if n is None else o + n for o, n in zip(old, new)]

    merge_all = merge_adding if all(function in ("count", "sum", "avg") for function, _, _ in spans) else merge_each

    def finals(values: list) -> list:
        return [_final(function, values[first:first + count]) for function, first, count in spans]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with _no_gc():
            emitted = _fold(batches, state_columns, owned, list(range(n_keys)), root, version, retain, state_schema,
                            mode, lambda old, row: merge_all(old, row[n_keys:]), lineage)
            if any(function == "avg" for function, _, _ in spans):
                rows = [key + finals(values) for key, values in emitted]
            else:  # every total is its one partial as it is
                rows = [key + values for key, values in emitted]
        yield from _batches(rows, out_schema)

    return run


def _each_group(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range, root: str, version: int,
                key_width: int, handle: Callable[[int, Group, list[tuple], float], list[list]],
                lineage: OperatorLineage = LEGACY) -> list[list]:
    """An event-time operator's batch, group by group: load the group at `version`, and
    `handle(key group, group, its rows, when its work began)` merges, closes what the watermark
    passed, commits and returns the rows to emit. A failure drops the group's lookups (heaps of
    ends or timers, the index of keys), rebuilt from the state when it is next loaded."""
    out: list[list] = []
    with _no_gc():
        for key_group, rows in _by_group(batches, columns, owned):
            began = time.perf_counter()
            group = load_group(root, key_group, version, key_width, lineage)
            try:
                out += handle(key_group, group, rows, began)
            except BaseException:
                group.timers = group.event_timers = group.index = None
                raise
    return out


def _partials_of(aggregates: list[AggregateSpec]) -> tuple[Callable[[list, list], list], Callable[[list], list]]:
    """For a window's partial aggregates: how two lists of them merge into one, and the totals
    they stand for (an avg's sum over its count; every other total is its one partial)."""
    spans = []
    at = 0
    for function, columns in aggregates:
        spans.append((function, at, len(columns)))
        at += len(columns)
    has_avg = any(function == "avg" for function, _, _ in spans)

    def merge(old: list, new: list) -> list:
        merged: list = []
        for function, first, count in spans:
            merged += _merge(function, old[first:first + count], new[first:first + count])
        return merged

    def totals(values: list) -> list:
        if not has_avg:
            return values
        return [_final(function, values[first:first + count]) for function, first, count in spans]

    return merge, totals


def window_aggregate_batches(root: str, n_keys: int, aggregates: list[AggregateSpec], version: int, mode: str,
                             retain: int, state_schema: pa.Schema, out_schema: pa.Schema, owned: range,
                             watermark_ms: int | None, size_ms: int, lateness_ms: int,
                             lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a window aggregate: like a running aggregate's,
    with each window's start (epoch ms) the last part of the key. Its rows are the batch's
    partial aggregates per key and window, the windows already closed left out (they are late:
    counted and routed before). After merging, the windows the watermark closed (end + allowed
    lateness <= watermark) leave the state; append mode emits them, final; update mode emits
    the windows the batch changed. Each group keeps its windows by end in a heap (Flink's
    event-time timer at a window's end), rebuilt from the state when the group is loaded."""
    key_width = n_keys + 1
    state_columns = list(state_schema.names[:-1])  # without REMOVED_COLUMN
    merge_partials, totals = _partials_of(aggregates)

    def merge(old: list | None, new: list) -> list:
        return new if old is None else merge_partials(old, new)

    def out_row(key: list, values: list) -> list:
        return key + totals(values)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _batches(_each_group(batches, state_columns, owned, root, version, key_width, _window_group,
                                        lineage), out_schema)

    def _window_group(key_group: int, group: Group, rows: list[tuple], began: float) -> list[list]:
        held = group.rows
        if group.timers is None:
            group.timers = [(key[-1] + size_ms, frozen) for frozen, (key, _) in held.items()]
            heapq.heapify(group.timers)
        heap = group.timers
        changes: dict[Any, tuple[list, list]] = {}
        for row in rows:
            frozen = tuple([_freeze(v) for v in row[:key_width]])
            seen = changes.get(frozen) or held.get(frozen)
            if seen is None:
                heapq.heappush(heap, (row[n_keys] + size_ms, frozen))
            changes[frozen] = (list(row[:key_width]), merge(seen[1] if seen is not None else None,
                                                              list(row[key_width:])))
        closed: dict[Any, tuple[list, list]] = {}
        if watermark_ms is not None:
            while heap and heap[0][0] + lateness_ms <= watermark_ms:
                _, frozen = heapq.heappop(heap)
                entry = changes.pop(frozen, None) or held.get(frozen)
                if entry is not None:
                    closed[frozen] = entry
        out = [out_row(key, values) for key, values in (closed.values() if mode == "append" else changes.values())]
        removed = {frozen: key for frozen, (key, _) in closed.items() if frozen in held}
        commit_group(root, key_group, group, changes, state_schema, retain, began, removed, lineage)
        return out

    return run


def session_aggregate_batches(root: str, n_keys: int, aggregates: list[AggregateSpec], version: int, mode: str,
                              retain: int, state_schema: pa.Schema, out_schema: pa.Schema, owned: range,
                              watermark_ms: int | None, lateness_ms: int, lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a session window aggregate. Its rows are the
    batch's sessions per key as Spark made them within the batch (keys, start, end, partial
    aggregates; a session is its events' span plus the gap). Per key, they are merged with the
    key's open sessions in the state: sessions that overlap become one, their aggregates merged,
    the sessions it absorbed removed. A session whose end plus the allowed lateness the
    watermark passed is closed: emitted in append mode, then removed; update mode emits each
    session a batch created or changed. The state's key is the keys and the session's start; its
    value the end, then the partial aggregates."""
    key_width = n_keys + 1
    state_columns = list(state_schema.names[:-1])
    merge, totals = _partials_of(aggregates)

    def out_row(key: list, values: list) -> list:
        return key + [values[0]] + totals(values[1:])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _batches(_each_group(batches, state_columns, owned, root, version, key_width, _session_group,
                                        lineage), out_schema)

    def _session_group(key_group: int, group: Group, rows: list[tuple], began: float) -> list[list]:
        held = group.rows
        if group.timers is None or group.index is None:
            group.timers = [(values[0], frozen) for frozen, (_, values) in held.items()]
            heapq.heapify(group.timers)
            group.index = {}
            for frozen in held:
                group.index.setdefault(frozen[:n_keys], set()).add(frozen)
        heap, index = group.timers, group.index
        changes: dict[Any, tuple[list, list]] = {}
        removed: dict[Any, list] = {}
        per_key: dict[Any, list[tuple]] = {}
        for row in rows:
            per_key.setdefault(tuple([_freeze(v) for v in row[:n_keys]]), []).append(row)
        for user, batch_rows in per_key.items():
            # (start, end, partials, the stored session's frozen key or None)
            sessions = [(held[f][0][-1], held[f][1][0], held[f][1][1:], f) for f in index.get(user, ())]
            sessions += [(r[n_keys], r[key_width], list(r[key_width + 1:]), None) for r in batch_rows]
            sessions.sort(key=lambda s: s[0])
            merged: list[list] = []  # [start, end, partials, members]
            for start, end, parts, member in sessions:
                if merged and start < merged[-1][1]:
                    last = merged[-1]
                    last[1] = max(last[1], end)
                    last[2] = merge(last[2], parts)
                    last[3].append(member)
                else:
                    merged.append([start, end, parts, [member]])
            key = list(batch_rows[0][:n_keys])
            for start, end, parts, members in merged:
                if len(members) == 1 and members[0] is not None:
                    continue  # a stored session the batch did not touch
                frozen = user + (start,)
                for m in members:
                    if m is not None and m != frozen:
                        removed[m] = held[m][0]
                        index[user].discard(m)
                changes[frozen] = (key + [start], [end] + parts)
                index.setdefault(user, set()).add(frozen)
                heapq.heappush(heap, (end, frozen))
        closed: dict[Any, tuple[list, list]] = {}
        if watermark_ms is not None:
            while heap and heap[0][0] + lateness_ms <= watermark_ms:
                end, frozen = heapq.heappop(heap)
                entry = changes.get(frozen) or (None if frozen in removed else held.get(frozen))
                if entry is None or entry[1][0] != end:
                    continue  # merged away, or extended since
                changes.pop(frozen, None)
                closed[frozen] = entry
                index.get(frozen[:n_keys], set()).discard(frozen)
                if frozen in held:
                    removed[frozen] = entry[0]
        # a session the batch changed is open (its rows were on time), so the two never meet
        out = [out_row(key, values) for key, values in (closed.values() if mode == "append" else changes.values())]
        for user in [u for u, members in index.items() if not members]:
            del index[user]
        commit_group(root, key_group, group, changes, state_schema, retain, began, removed, lineage)
        return out

    return run


def interval_join_batches(root: str, n_keys: int, version: int, retain: int, state_schema: pa.Schema,
                          in_columns: list[str], n_left: int, out_schema: pa.Schema, owned: range,
                          watermark_ms: int | None, lower_ms: int, upper_ms: int, left_outer: bool,
                          lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of an interval join of two streams (Flink's interval
    join; Structured Streaming's stream-stream join with a time bound): a left row at time a
    joins each right row of its key at b with a + lower <= b <= a + upper. Each input row comes
    as (keys, side: 0 left 1 right, time ms, the left's columns, the right's columns); each
    row of the batch is joined with the other side's rows kept so far and of the batch, then
    kept itself, until the watermark says no row it could join can come any more (a left row
    once the watermark passes a + upper, a right row once it passes b - lower). A left row that
    leaves unmatched is emitted with nulls for the right's columns when `left_outer`: once, when
    its match can no longer arrive. The state's key is (keys, side, a row id), its value (time,
    matched, the side's columns)."""
    n_right = len(in_columns) - n_keys - 2 - n_left

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _batches(_each_group(batches, in_columns, owned, root, version, n_keys + 2, _join_group, lineage),
                            out_schema)

    def expires(side: int, at: int) -> int:
        """The first watermark at which a kept row can no longer be joined."""
        return at + upper_ms + 1 if side == 0 else at - lower_ms + 1

    def pair(key: list, left: list, right: list) -> list:
        """An output row from a left row's and a right row's kept values (time, matched, then
        the left's columns and the right's)."""
        return key + left[2:2 + n_left] + right[2 + n_left:]

    def _join_group(key_group: int, group: Group, rows: list[tuple], began: float) -> list[list]:
        held = group.rows
        if group.timers is None or group.index is None:
            group.timers = [(expires(f[n_keys], v[0]), f) for f, (_, v) in held.items()]
            heapq.heapify(group.timers)
            group.index = {}
            for f in held:
                group.index.setdefault(f[:n_keys], set()).add(f)
        heap, index = group.timers, group.index
        changes: dict[Any, tuple[list, list]] = {}
        out: list[list] = []
        seq = itertools.count()
        per_key: dict[Any, list[tuple]] = {}
        for row in rows:
            per_key.setdefault(tuple([_freeze(v) for v in row[:n_keys]]), []).append(row)
        for user, batch_rows in per_key.items():
            key = list(batch_rows[0][:n_keys])
            kept = [(f, held[f]) for f in index.get(user, ())]
            lefts = [(f, v) for f, (_, v) in kept if f[n_keys] == 0]
            rights = [(f, v) for f, (_, v) in kept if f[n_keys] == 1]
            new_lefts, new_rights = [], []
            for row in batch_rows:
                side, at = row[n_keys], row[n_keys + 1]
                frozen = user + (side, f"{version}-{next(seq)}")
                (new_lefts if side == 0 else new_rights).append((frozen, [at, False] + list(row[n_keys + 2:])))
            # the batch's left rows against every right row (kept and new), the batch's right rows
            # against the kept left rows
            for frozen, lv in new_lefts:
                for _, rv in rights + new_rights:
                    if lv[0] + lower_ms <= rv[0] <= lv[0] + upper_ms:
                        out.append(pair(key, lv, rv))
                        lv[1] = True
            for _, rv in new_rights:
                for f, lv in lefts:
                    if lv[0] + lower_ms <= rv[0] <= lv[0] + upper_ms:
                        out.append(pair(key, lv, rv))
                        if not lv[1] and f not in changes:  # now matched (the kept version stays as it was)
                            changes[f] = (list(held[f][0]), [lv[0], True] + lv[2:])
            for frozen, values in new_lefts + new_rights:
                changes[frozen] = (key + [frozen[n_keys], frozen[n_keys + 1]], values)
                index.setdefault(user, set()).add(frozen)
                heapq.heappush(heap, (expires(frozen[n_keys], values[0]), frozen))
        removed: dict[Any, list] = {}
        while watermark_ms is not None and heap and heap[0][0] <= watermark_ms:
            _, frozen = heapq.heappop(heap)
            entry = changes.pop(frozen, None) or held.get(frozen)
            if entry is None:
                continue
            if frozen in held:
                removed[frozen] = entry[0]
            index.get(frozen[:n_keys], set()).discard(frozen)
            values = entry[1]
            if left_outer and frozen[n_keys] == 0 and not values[1]:
                out.append(pair(list(entry[0][:n_keys]), values, [None] * (2 + n_left + n_right)))
        for user in [u for u, members in index.items() if not members]:
            del index[user]
        commit_group(root, key_group, group, changes, state_schema, retain, began, removed, lineage)
        return out

    return run


def deduplicate_within_batches(root: str, positions: list[int], version: int, retain: int, state_schema: pa.Schema,
                               out_schema: pa.Schema, owned: range, watermark_ms: int | None,
                               lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of drop_duplicates_within_watermark: a row whose key
    no live state has is emitted, and its key kept until the watermark passes the row's expiry
    (its event time plus the watermark's delay, in the row's last column); then the key leaves
    the state. Late rows were left out before (counted)."""
    n_keys = len(positions)
    width = len(out_schema)

    def first_rows(key_group: int, group: Group, rows: list[tuple], began: float) -> list[list]:
        held = group.rows
        if group.timers is None:
            group.timers = [(values[0], frozen) for frozen, (_, values) in held.items()]
            heapq.heapify(group.timers)
        firsts: list[list] = []
        changes: dict[Any, tuple[list, list]] = {}
        for row in rows:
            key = [row[p] for p in positions]
            frozen = tuple([_freeze(v) for v in key])
            if frozen in changes or frozen in held:
                continue  # seen within the watermark: a duplicate
            firsts.append(list(row[:width]))
            changes[frozen] = (key, [row[width]])
            heapq.heappush(group.timers, (row[width], frozen))
        removed: dict[Any, list] = {}
        heap = group.timers
        while watermark_ms is not None and heap and heap[0][0] <= watermark_ms:
            expires, frozen = heapq.heappop(heap)
            entry = changes.get(frozen) or held.get(frozen)
            if entry is not None and entry[1][0] == expires:
                changes.pop(frozen, None)
                removed[frozen] = entry[0]
        commit_group(root, key_group, group, changes, state_schema, retain, began, removed, lineage)
        return firsts

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        columns = list(out_schema.names) + ["__expires"]
        yield from _batches(_each_group(batches, columns, owned, root, version, n_keys, first_rows, lineage),
                            out_schema)

    return run


def deduplicate_batches(root: str, keys: list[str], version: int, retain: int, state_schema: pa.Schema,
                        out_schema: pa.Schema, owned: range, lineage: OperatorLineage = LEGACY):
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

        _fold(batches, out_schema.names, owned, positions, root, version, retain, state_schema, "update", first_only,
              lineage)
        yield from _batches(firsts, out_schema)

    return run


def running_reduce_batches(fn_bytes: bytes, root: str, keys: list[str], version: int, mode: str, retain: int,
                           state_schema: pa.Schema, out_schema: pa.Schema, owned: range, label: str,
                           lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a running reduce: each key's record folded with
    the user's fn(a, b) over every batch so far (Flink's keyed reduce). The state holds the
    record as Arrow gives it, converted to what fn receives (udf's convention) on every call, so
    a worker that loaded it from the files calls fn exactly as one that kept it in memory."""
    positions = [out_schema.names.index(k) for k in keys]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        reader, writer = RowReader(out_schema), RowWriter(out_schema, label)
        to_user = _records(reader)

        def from_user(result: Any, key: list) -> list:
            values = [convert(v) if convert else v for v, convert in zip(writer.values(result), writer.converters)]
            if [values[p] for p in positions] != key:
                raise ValueError(f"{label}: fn(a, b) returned {result!r}, whose key {[values[p] for p in positions]} "
                                 f"is not the key {key} of a and b; a keyed reduce keeps the key")
            return values

        def fold(old: list | None, row: tuple) -> list:
            return list(row) if old is None else from_user(fn(to_user(old), to_user(row)), [row[p] for p in positions])

        emitted = _fold(batches, out_schema.names, owned, positions, root, version, retain, state_schema, mode, fold,
                        lineage)
        yield from _batches([values for _, values in emitted], out_schema)

    return run


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while a batch folds into the state: a group's state is
    millions of small lists that every collection would walk again (it halves a running count's
    batch over 1M keys); freeing by reference counting goes on meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # The batch's own cyclic garbage (a user function's, say) is collected: what it
            # allocated is all in the youngest generation, so this walks the batch's objects, not
            # the state. What survives is then moved out of the collector's reach, so that later
            # collections do not walk the state either.
            gc.collect(0)
            gc.freeze()
            gc.enable()


def _records(reader: RowReader) -> Callable[[list], Any]:
    """A row's column values -> the record a user function receives (udf's convention)."""
    converters, make = reader.converters, reader.make
    if not any(converters):
        return (lambda values: values[0]) if len(converters) == 1 else (lambda values: make(*values))

    def to_user(values: list) -> Any:
        converted = [convert(v) if convert else v for v, convert in zip(values, converters)]
        return converted[0] if len(converted) == 1 else make(*converted)

    return to_user


def _fold(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range, positions: list[int], root: str,
          version: int, retain: int, state_schema: pa.Schema, mode: str,
          fold: Callable[[list | None, list], list | None],
          lineage: OperatorLineage = LEGACY) -> list[tuple[list, list]]:
    """Every keyed operator's batch, per key group: load the group at `version`, fold each row
    into its key's value (`fold(value so far or None, row)`: the new value, or None to leave the
    key as it is), commit the next version; what the batch emits: (key, value) of the keys it
    changed, or in complete mode of every key. `positions`: where the key is in a row."""
    with _no_gc():
        return _fold_groups(batches, columns, owned, positions, root, version, retain, state_schema, mode, fold,
                            lineage)


def _fold_groups(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range, positions: list[int],
                 root: str, version: int, retain: int, state_schema: pa.Schema, mode: str,
                 fold: Callable[[list | None, list], list | None],
                 lineage: OperatorLineage = LEGACY) -> list[tuple[list, list]]:
    emitted: list[tuple[list, list]] = []
    # keys of plain types are their own frozen form (arrays and structs need _freeze)
    atomic = all(_udf_atomic(state_schema.field(i).type) for i in range(len(positions)))
    prefix = positions == list(range(len(positions)))
    for key_group, rows in _by_group(batches, columns, owned):
        began = time.perf_counter()
        group = load_group(root, key_group, version, len(positions), lineage)
        changes: dict[Any, tuple[list, list]] = {}
        held = group.rows
        for row in rows:
            if atomic:
                frozen = row[:len(positions)] if prefix else tuple([row[p] for p in positions])
                key = list(frozen)
            else:
                key = [row[p] for p in positions]
                frozen = _freeze(tuple(key))
            seen = changes.get(frozen) or held.get(frozen)
            value = fold(seen[1] if seen is not None else None, row)
            if value is not None:
                changes[frozen] = (key, value)
        group = commit_group(root, key_group, group, changes, state_schema, retain, began, lineage=lineage)
        emitted += group.rows.values() if mode == "complete" else changes.values()
    return emitted


def _by_group(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range) -> list[tuple[int, list[tuple]]]:
    """The rows (tuples of `columns`' values) per key group, in group order; a group with only
    its marker row has no rows, and is there all the same. A row of a group the subtask does not
    own is an error: its state is another subtask's to write. Grouped by Arrow (a sort by group),
    so the only per-row Python work is making each row's tuple."""
    received = [b for b in batches if b.num_rows]
    if not received:
        return []
    table = pa.Table.from_batches(received)
    present = sorted(set(table.column(KEY_GROUP_COLUMN).to_pylist()))
    foreign = [g for g in present if g not in owned]
    if foreign:
        raise RuntimeError(f"rows of key group(s) {foreign[:5]} reached the subtask owning key groups "
                           f"{owned.start}..{owned.stop - 1}: the exchange did not route them by key group")
    data = table.filter(pc.invert(table.column(MARKER_COLUMN)))
    data = data.take(pc.sort_indices(data.column(KEY_GROUP_COLUMN)))
    groups = data.column(KEY_GROUP_COLUMN).to_pylist()
    rows = list(zip(*[data.column(c).to_pylist() for c in columns])) if columns else [()] * len(groups)
    out: list[tuple[int, list[tuple]]] = []
    start = 0
    for g in present:
        end = bisect.bisect_right(groups, g, start)
        out.append((g, rows[start:end]))
        start = end
    return out


def _batches(rows: list[list], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for start in range(0, len(rows), ROWS_PER_BATCH):
        chunk = rows[start:start + ROWS_PER_BATCH]
        yield pa.RecordBatch.from_arrays(
            [pa.array([row[i] for row in chunk], type=f.type) for i, f in enumerate(schema)], schema=schema)


# --- the keyed process function ------------------------------------------------------------

class _Runner:
    """The state of the key being processed, for the handles: `values` is the key's row of
    state in the store's layout (each state, each TTL state's expiry, the timers), a copy made
    when the key's turn starts, so a batch that fails leaves the loaded version untouched."""

    __slots__ = ("values", "frozen", "dirty", "now", "watermark", "timers_at", "pushed", "pushed_event",
                 "domain")

    def __init__(self, now: int, timers_at: int, watermark: int | None = None):
        self.values: list | None = None
        self.frozen: Any = None
        self.dirty = False
        self.now = now
        self.watermark = watermark  # the batch's event-time watermark (None: none yet)
        self.timers_at = timers_at  # where the timers are in `values` (the event-time ones next)
        self.pushed: list[tuple[int, Any]] = []  # timers registered during the key's turn
        self.pushed_event: list[tuple[int, Any]] = []  # event-time timers registered during it
        self.domain: str | None = None  # the time domain of the timer firing (on_timer)

    def row(self, what: str) -> list:
        if self.values is None:
            raise RuntimeError(f"{what}: there is no current key here (state is per key: use it in process() "
                               "and on_timer())")
        return self.values


class _Handle:
    __slots__ = ("_runner", "_index", "_expires", "_ttl", "name")

    def __init__(self, runner: _Runner, name: str, index: int, expires: int | None, ttl: int | None):
        self._runner, self.name, self._index, self._expires, self._ttl = runner, name, index, expires, ttl

    def _get(self) -> Any:
        values = self._runner.row(f"state {self.name!r}")
        if self._expires is not None:
            at = values[self._expires]
            if at is not None and at <= self._runner.now:
                return None  # expired: never returned (Flink's NeverReturnExpired)
        return values[self._index]

    def _set(self, value: Any) -> None:
        values = self._runner.row(f"state {self.name!r}")
        values[self._index] = value
        if self._expires is not None:
            values[self._expires] = None if value is None else self._runner.now + self._ttl
        self._runner.dirty = True

    def clear(self) -> None:
        self._set(None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueStateHandle(_Handle):
    __slots__ = ("_read", "_write")

    def __init__(self, runner: _Runner, name: str, index: int, expires: int | None, ttl: int | None,
                 arrow_type: pa.DataType):
        super().__init__(runner, name, index, expires, ttl)
        self._read, self._write = _from_arrow(arrow_type), _to_arrow(arrow_type)

    def value(self) -> Any:
        v = self._get()
        return self._read(v) if self._read and v is not None else v

    def update(self, value: Any) -> None:
        self._set(self._write(value) if self._write and value is not None else value)


class ListStateHandle(_Handle):
    __slots__ = ("_read", "_write")

    def __init__(self, runner: _Runner, name: str, index: int, expires: int | None, ttl: int | None,
                 element_type: pa.DataType):
        super().__init__(runner, name, index, expires, ttl)
        self._read, self._write = _from_arrow(element_type), _to_arrow(element_type)

    def get(self) -> list:
        items = self._get() or []
        return [self._read(x) for x in items] if self._read else list(items)

    def add(self, value: Any) -> None:
        self._set((self._get() or []) + [self._write(value) if self._write else value])

    def add_all(self, values: Any) -> None:
        self._set((self._get() or []) + [self._write(v) if self._write else v for v in values])

    def update(self, values: Any) -> None:
        items = [self._write(v) if self._write else v for v in values]
        self._set(items or None)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self._get() or [])


class MapStateHandle(_Handle):
    __slots__ = ("_key_read", "_key_write", "_read", "_write")

    def __init__(self, runner: _Runner, name: str, index: int, expires: int | None, ttl: int | None,
                 key_type: pa.DataType, value_type: pa.DataType):
        super().__init__(runner, name, index, expires, ttl)
        self._key_read, self._key_write = _from_arrow(key_type), _to_arrow(key_type)
        self._read, self._write = _from_arrow(value_type), _to_arrow(value_type)

    def _map(self) -> dict:
        held = self._get()
        if held is None:
            return {}
        return held if isinstance(held, dict) else dict(held)  # Arrow gives a map as (key, value) pairs

    def _k(self, key: Any) -> Any:
        return self._key_write(key) if self._key_write else key

    def _out(self, value: Any) -> Any:
        return self._read(value) if self._read and value is not None else value

    def get(self, key: Any, default: Any = None) -> Any:
        held = self._map()
        k = self._k(key)
        return self._out(held[k]) if k in held else default

    def put(self, key: Any, value: Any) -> None:
        held = dict(self._map())
        held[self._k(key)] = self._write(value) if self._write and value is not None else value
        self._set(held)

    def put_all(self, items: Any) -> None:
        held = dict(self._map())
        for key, value in (items.items() if isinstance(items, dict) else items):
            held[self._k(key)] = self._write(value) if self._write and value is not None else value
        self._set(held)

    def remove(self, key: Any) -> None:
        held = dict(self._map())
        held.pop(self._k(key), None)
        self._set(held or None)

    def contains(self, key: Any) -> bool:
        return self._k(key) in self._map()

    def keys(self) -> list:
        return [self._key_read(k) if self._key_read else k for k in self._map()]

    def values(self) -> list:
        return [self._out(v) for v in self._map().values()]

    def items(self) -> list:
        return [(self._key_read(k) if self._key_read else k, self._out(v)) for k, v in self._map().items()]

    def is_empty(self) -> bool:
        return not self._map()

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __len__(self) -> int:
        return len(self._map())


class TimerService:
    """Processing-time timers of the current key (epoch ms). A timer at t fires in the first
    batch whose time is t or later, after that batch's rows; one registered for a time already
    passed fires in the batch it was registered in (from on_timer: in the next one)."""

    __slots__ = ("_runner",)

    def __init__(self, runner: _Runner):
        self._runner = runner

    def current_processing_time(self) -> int:
        return self._runner.now

    def register_processing_time_timer(self, timestamp: int) -> None:
        timestamp = _timer_time(timestamp)
        values = self._runner.row("register_processing_time_timer")
        timers = values[self._runner.timers_at] or []
        if timestamp not in timers:
            values[self._runner.timers_at] = sorted(timers + [timestamp])
            self._runner.pushed.append((timestamp, self._runner.frozen))
            self._runner.dirty = True

    def delete_processing_time_timer(self, timestamp: int) -> None:
        timestamp = _timer_time(timestamp)
        values = self._runner.row("delete_processing_time_timer")
        timers = values[self._runner.timers_at] or []
        if timestamp in timers:
            values[self._runner.timers_at] = [t for t in timers if t != timestamp] or None
            self._runner.dirty = True

    def processing_time_timers(self) -> list[int]:
        """The current key's registered timers, ascending."""
        return list(self._runner.row("processing_time_timers")[self._runner.timers_at] or [])

    def current_watermark(self) -> int | None:
        """The batch's event-time watermark (epoch ms; None until the query has one)."""
        return self._runner.watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        """A timer that fires once the watermark reaches `timestamp` (Flink's event-time timer):
        in the first batch whose watermark is at or past it, after that batch's rows."""
        timestamp = _timer_time(timestamp)
        values = self._runner.row("register_event_time_timer")
        at = self._runner.timers_at + 1
        timers = values[at] or []
        if timestamp not in timers:
            values[at] = sorted(timers + [timestamp])
            self._runner.pushed_event.append((timestamp, self._runner.frozen))
            self._runner.dirty = True

    def delete_event_time_timer(self, timestamp: int) -> None:
        timestamp = _timer_time(timestamp)
        values = self._runner.row("delete_event_time_timer")
        at = self._runner.timers_at + 1
        timers = values[at] or []
        if timestamp in timers:
            values[at] = [t for t in timers if t != timestamp] or None
            self._runner.dirty = True

    def event_time_timers(self) -> list[int]:
        """The current key's registered event-time timers, ascending."""
        return list(self._runner.row("event_time_timers")[self._runner.timers_at + 1] or [])


def _timer_time(timestamp: Any) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or not 0 <= timestamp < 2**63:
        raise ValueError(f"a timer's time is epoch milliseconds (an int from 0), got {timestamp!r}")
    return timestamp


class _States:
    """`ctx.state.<name>`: the handles by name."""

    def __init__(self, handles: dict[str, _Handle]):
        self.__dict__.update(handles)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"no state named {name!r}; the function declares {sorted(self.__dict__)}")


class ProcessContext:
    """What a keyed process function is handed: the current key, its state handles, timers, the
    batch's id and time."""

    def __init__(self, runner: _Runner, handles: dict[str, _Handle], batch_id: int):
        self._runner = runner
        self._handles = handles
        self._timers = TimerService(runner)
        self.state = _States(handles)
        self.batch_id = batch_id
        self.key: Any = None

    def get_state(self, name: str) -> Any:
        """The handle of state `name` (PyFlink's runtime_context.get_state in open()): it always
        reads and writes the key being processed."""
        name = getattr(name, "name", name)  # a descriptor is taken for its name
        try:
            return self._handles[name]
        except KeyError:
            raise KeyError(f"no state named {name!r}; the function declares {sorted(self._handles)}") from None

    get_list_state = get_map_state = get_state

    def get_current_key(self) -> Any:
        return self.key

    def timer_service(self) -> TimerService:
        return self._timers

    def current_processing_time(self) -> int:
        return self._runner.now

    def current_watermark(self) -> int | None:
        """The batch's event-time watermark (epoch ms; None until the query has one)."""
        return self._runner.watermark

    def time_domain(self) -> str | None:
        """In on_timer: "EVENT_TIME" or "PROCESSING_TIME", the kind of timer firing (PyFlink's
        ctx.time_domain()); None in process()."""
        return self._runner.domain


# (name, kind, arrow type of the column, [key type, value type] for a map, ttl ms)
StateSpec = tuple[str, str, pa.DataType, tuple[pa.DataType, ...], int | None]


def process_batches(fn_bytes: bytes, root: str, keys: list[str], version: int, now_ms: int, retain: int,
                    specs: list[StateSpec], state_schema: pa.Schema, in_schema: pa.Schema, out_schema: pa.Schema,
                    owned: range, label: str, watermark_ms: int | None = None, lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a keyed process function: per key group, load
    the group at `version`; per key with rows, fn.process(key, rows, ctx); then, for each
    processing-time timer at or before the batch's time `now_ms`, and each event-time timer at
    or before its watermark `watermark_ms`, fn.on_timer(key, t, ctx); commit the next version
    (changed keys, and removed ones: no state left and no timer); emit what the calls returned.
    Every SNAPSHOT_EVERY versions, keys whose TTL states all expired are removed too."""
    positions = [in_schema.names.index(k) for k in keys]
    n_states = len(specs)
    expires_of = {}
    for i, (_, _, _, _, ttl) in enumerate(specs):
        if ttl is not None:
            expires_of[i] = n_states + len(expires_of)
    timers_at = n_states + len(expires_of)
    event_at = timers_at + 1
    width = timers_at + 2

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        runner = _Runner(now_ms, timers_at, watermark_ms)
        handles: dict[str, _Handle] = {}
        for i, (name, kind, arrow_type, inner, ttl) in enumerate(specs):
            exp = expires_of.get(i)
            if kind == "value":
                handles[name] = ValueStateHandle(runner, name, i, exp, ttl, arrow_type)
            elif kind == "list":
                handles[name] = ListStateHandle(runner, name, i, exp, ttl, inner[0])
            else:
                handles[name] = MapStateHandle(runner, name, i, exp, ttl, inner[0], inner[1])
        ctx = ProcessContext(runner, handles, version)
        to_user = _records(RowReader(in_schema))
        writer = RowWriter(out_schema, label)
        opened = getattr(fn, "open", None)
        if opened is not None:
            opened(ctx)
        results: list[Any] = []

        def alive(values: list) -> bool:
            """Whether the key keeps a row: a state not empty nor expired, or a timer."""
            if values[timers_at] or values[event_at]:
                return True
            for i in range(n_states):
                v = values[i]
                if v is None or (isinstance(v, (list, dict)) and not v):
                    continue
                exp = expires_of.get(i)
                if exp is not None and values[exp] is not None and values[exp] <= now_ms:
                    continue
                return True
            return False

        def turn(group: Group, changes: dict, removed: dict, frozen: Any, key: list, call: Callable[[], Any],
                 heap_now: bool) -> None:
            held = changes.get(frozen)
            if held is None and frozen not in removed:
                held = group.rows.get(frozen)
            runner.values = list(held[1]) if held is not None else [None] * width
            runner.frozen, runner.dirty, runner.pushed, runner.pushed_event = frozen, False, [], []
            ctx.key = key[0] if len(key) == 1 else tuple(key)
            try:
                out = call()
                if out is not None:
                    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
                        raise TypeError(f"{label}: returned {type(out).__name__}; process() and on_timer() "
                                        "return or yield rows (an iterable of rows), or None")
                    results.extend(out)
            finally:
                values, runner.values = runner.values, None
            if not runner.dirty:
                return
            if alive(values):
                changes[frozen] = (key, values)
                removed.pop(frozen, None)
            else:
                changes.pop(frozen, None)
                if frozen in group.rows:
                    removed[frozen] = key
            for heap, pushed, later in ((group.timers, runner.pushed, deferred),
                                        (group.event_timers, runner.pushed_event, deferred_event)):
                if heap is not None:
                    for entry in pushed:
                        if heap_now:
                            heapq.heappush(heap, entry)
                        else:
                            later.append(entry)

        def fire(group: Group, changes: dict, removed: dict, heap: list, due: int, at_index: int,
                 domain: str) -> None:
            """on_timer for each timer of `heap` at or before `due` (index `at_index` of a key's
            values holds that kind of timer)."""
            while heap and heap[0][0] <= due:
                at, frozen = heapq.heappop(heap)
                held = changes.get(frozen) or (None if frozen in removed else group.rows.get(frozen))
                if held is None or at not in (held[1][at_index] or ()):
                    continue  # deleted, or fired already
                fired = list(held[1])
                fired[at_index] = [t for t in fired[at_index] if t != at] or None
                changes[frozen] = (held[0], fired)  # a fired timer is gone, whatever on_timer does
                runner.domain = domain
                try:
                    turn(group, changes, removed, frozen, held[0], lambda: fn.on_timer(ctx.key, at, ctx),
                         heap_now=False)
                finally:
                    runner.domain = None
                if frozen in changes and not alive(changes[frozen][1]):
                    del changes[frozen]
                    if frozen in group.rows:
                        removed[frozen] = held[0]

        deferred: list[tuple[int, Any]] = []
        deferred_event: list[tuple[int, Any]] = []
        with _no_gc():
            for key_group, rows in _by_group(batches, in_schema.names, owned):
                began = time.perf_counter()
                group = load_group(root, key_group, version, len(positions), lineage)
                try:
                    if group.timers is None or group.event_timers is None:
                        for _, values in group.rows.values():
                            if len(values) < width:  # written before event-time timers: none
                                values.extend([None] * (width - len(values)))
                        group.timers = [(t, frozen) for frozen, (_, values) in group.rows.items()
                                        for t in (values[timers_at] or ())]
                        group.event_timers = [(t, frozen) for frozen, (_, values) in group.rows.items()
                                              for t in (values[event_at] or ())]
                        heapq.heapify(group.timers)
                        heapq.heapify(group.event_timers)
                    changes: dict[Any, tuple[list, list]] = {}
                    removed: dict[Any, list] = {}
                    per_key: dict[Any, tuple[list, list]] = {}
                    for row in rows:
                        key = [row[p] for p in positions]
                        per_key.setdefault(_freeze(tuple(key)), (key, []))[1].append(to_user(row))
                    for frozen, (key, key_rows) in per_key.items():
                        turn(group, changes, removed, frozen, key,
                             lambda: fn.process(ctx.key, key_rows, ctx), heap_now=True)
                    deferred.clear()
                    deferred_event.clear()
                    fire(group, changes, removed, group.timers, now_ms, timers_at, "PROCESSING_TIME")
                    if watermark_ms is not None:
                        fire(group, changes, removed, group.event_timers, watermark_ms, event_at, "EVENT_TIME")
                    for entry in deferred:
                        heapq.heappush(group.timers, entry)
                    for entry in deferred_event:
                        heapq.heappush(group.event_timers, entry)
                    if expires_of and (version + 1) % SNAPSHOT_EVERY == 0:
                        for frozen, (key, values) in group.rows.items():
                            if frozen not in changes and frozen not in removed and not alive(values):
                                removed[frozen] = key
                    commit_group(root, key_group, group, changes, state_schema, retain, began, removed, lineage)
                except BaseException:
                    _loaded().pop((root, key_group), None)  # what this worker holds may be half-changed
                    raise
        for start in range(0, len(results), ROWS_PER_BATCH):
            yield writer.batch_of_results(results[start:start + ROWS_PER_BATCH])

    return run
