"""Keyed state's storage, for the keyed operators of this package: a key group's state at a
version, updated into the next one and committed (Spark's StateStore: get, put, remove, items,
commit, abort, with its states updating -> committed | aborted), the worker's cache of the
versions it holds, catching a held version up by the deltas after it, the timer queues and
lookups an operator derives from a version (Flink's HeapKeyedStateBackend holds the named states
and the timer queues), and the metrics of a commit.

An operator's batch runs per key group (`StateStore.each_group`): the group's version is loaded
(`StateStore.load`), the operator's rule reads and changes it, the version is committed; when
anything fails, it is aborted: the worker forgets the group (what it holds may be half-changed)
and the next batch loads it from the files. That is the only way a keyed operator fails.

Each Python worker keeps the groups it loaded, by version and the run whose files made it
(`_loaded`): Spark reuses its workers (spark.python.worker.reuse), so a group is read from disk
again only when the worker is new, or when what it holds is not the version asked for, as the
batch's lineage says (a batch re-run after a failure asks for an older one, or for another run's
files). A version's in-memory state changes only after its files are written.

Every load takes the operator's `lineage` (`funke.common.streaming.state.OperatorLineage`: which
run's files make each version, and the token this batch writes with); without one, the files are
read and written as funke 0.3.0 did (unfenced).

Pickled by value into the workers, like `udf.py`, together with the pure rules modules and the
store's file functions (`funke.runtime.statefiles`): a worker needs pyarrow and cloudpickle, not
funke.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import itertools
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming import state as _rules
from funke.common.streaming import timers as _timers
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
from funke.common.streaming.timers import TimerQueue
from funke.runtime import statefiles as _files
from funke.runtime.statefiles import freeze, is_atomic, read_rows, version_rows, write_table
from funke.taskmanager.operators.udf import ROWS_PER_BATCH, RUNTIME_FILES

for _module in (sys.modules[__name__], _rules, _timers, _files):
    _spark_cloudpickle.register_pickle_by_value(_module)

__all__ = ["MARKER_COLUMN", "StateStore", "StateValueError", "StateVersion", "emit", "measure"]

RUNTIME_FILES.add(__file__)  # a user function's traceback starts at the user's code

MARKER_COLUMN = "__funke_group_marker"
_CACHE_MODULE = "_funke_keyed_state"  # where a worker keeps its loaded groups across tasks
# a delta file's metadata: the group's keys after the version, the keys it wrote, the time it took
_ROWS_TOTAL, _ROWS_UPDATED, _ROWS_REMOVED, _UPDATE_MS = ("funke.rows_total", "funke.rows_updated", "funke.rows_removed",
                                                         "funke.update_ms")
_MEMORY, _COMMIT_MS = "funke.memory_bytes", "funke.commit_ms"
_SAMPLED = 32  # entries of a group whose sizes estimate its memory

Entry = tuple[list, list]  # a key's row: (its key values, its other values)


class StateValueError(TypeError):
    """A state value that cannot be stored as its declared type."""


class HeldVersion:
    """A committed version of one key group as a worker holds it: frozen key -> (key values,
    values), and what the operators derived from it (timer queues, lookups) to keep across
    batches."""

    __slots__ = ("version", "rows", "stamp", "token", "derived")

    def __init__(self, version: int, rows: dict[Any, Entry], stamp: tuple[int, int] | None, token: str | None,
                 derived: dict[str, Any] | None = None):
        self.version = version
        self.rows = rows
        self.stamp = stamp  # (inode, mtime) of the file that made this version: a wiped store is seen
        self.token = token  # the run whose files made this version (None: an empty version)
        self.derived = {} if derived is None else derived  # built when first asked for (`StateVersion.timers`)


def _loaded() -> dict[tuple[str, int], HeldVersion]:
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


@dataclass(frozen=True, slots=True)
class StateStore:
    """A keyed operator's state store in one batch: where its files are, the version the batch
    reads (`version`; it writes version + 1), the width of its key, its Arrow schema, how many
    versions it retains, and the lineage of its files."""

    root: str
    version: int
    key_width: int
    schema: pa.Schema
    retain: int
    lineage: OperatorLineage = LEGACY

    def load(self, key_group: int) -> StateVersion:
        began = time.perf_counter()  # the group's work starts with its load
        held = load_held(self.root, key_group, self.version, self.key_width, self.lineage)
        return StateVersion(self, key_group, held, began)

    def each_group(self, batches: Iterator[pa.RecordBatch], columns: list[str], owned: range,
                   rule: Callable[[StateVersion, list[tuple]], list],
                   after: Callable[[StateVersion], Iterable] | None = None) -> list:
        """A batch, group by group (`by_group`): load the group's version, `rule(version, its
        rows)` reads and changes it and gives what to emit, commit (then `after(the committed
        version)` adds to it); abort on any failure."""
        out: list = []
        with no_gc():
            for key_group, rows in by_group(batches, columns, owned):
                version = self.load(key_group)
                try:
                    out += rule(version, rows)
                    version.commit()
                    if after is not None:
                        out += after(version)
                except BaseException:
                    version.abort()
                    raise
        return out


class StateVersion:
    """One key group's state, loaded at the batch's version and updated into the next: reads see
    the batch's changes over the loaded version, never a removed key; `commit` writes the next
    version and makes it the worker's, `abort` forgets the group."""

    UPDATING, COMMITTED, ABORTED = "updating", "committed", "aborted"
    __slots__ = ("store", "key_group", "_held", "_changes", "_removed", "_began", "status", "metrics")

    def __init__(self, store: StateStore, key_group: int, held: HeldVersion, began: float | None = None):
        self.store, self.key_group, self._held = store, key_group, held
        self._changes: dict[Any, Entry] = {}
        self._removed: dict[Any, list] = {}
        self._began = time.perf_counter() if began is None else began
        self.status = self.UPDATING
        self.metrics: StateMetrics | None = None  # once committed

    # --- reads ------------------------------------------------------------------------------
    def get(self, frozen: Any) -> Entry | None:
        entry = self._changes.get(frozen)
        if entry is None:
            removed = self._removed
            if not (removed and frozen in removed):
                entry = self._held.rows.get(frozen)
        return entry

    def items(self) -> Iterator[tuple[Any, Entry]]:
        """(frozen key, entry) of every key the version has: once committed the new version's,
        before the loaded one's with the batch's changes over it."""
        if self.status == self.COMMITTED:
            yield from self._held.rows.items()
            return
        changes, removed = self._changes, self._removed
        for frozen, entry in self._held.rows.items():
            if frozen not in removed:
                yield frozen, changes.get(frozen, entry)
        for frozen, entry in changes.items():
            if frozen not in self._held.rows:
                yield frozen, entry

    def entries(self) -> Iterable[Entry]:
        """The committed version's entries (complete mode emits them all)."""
        self._check(self.COMMITTED)
        return self._held.rows.values()

    def unchanged(self) -> list[tuple[Any, Entry]]:
        """The loaded keys the batch neither changed nor removed."""
        changes, removed = self._changes, self._removed
        return [(f, e) for f, e in self._held.rows.items() if f not in changes and f not in removed]

    def changed(self) -> Iterable[Entry]:
        """The entries the batch wrote (update mode emits them)."""
        return self._changes.values()

    # --- writes -----------------------------------------------------------------------------
    def put(self, frozen: Any, key: list, values: list) -> None:
        if self.status is not self.UPDATING:
            self._check(self.UPDATING)
        self._changes[frozen] = (key, values)
        if self._removed:  # per key of a batch: skip the lookup while nothing was removed
            self._removed.pop(frozen, None)

    def update(self, entries: dict[Any, Entry]) -> None:
        """Many puts at once."""
        self._check(self.UPDATING)
        self._changes.update(entries)
        removed = self._removed
        if removed:
            for frozen in entries:
                removed.pop(frozen, None)

    def remove(self, frozen: Any) -> None:
        self._check(self.UPDATING)
        self._changes.pop(frozen, None)
        held = self._held.rows.get(frozen)
        if held is not None:
            self._removed[frozen] = held[0]

    def fold(self, rows: list[tuple], positions: list[int], fold: Callable[[list | None, tuple], list | None]) -> None:
        """Each row into its key's values (`positions`: where the key is in a row): `fold(the
        values so far or None, row)` gives the new values, or None to leave the key as it is. The
        running folds' and windows' inner loop, so written for speed: one pass, the dicts bound."""
        self._check(self.UPDATING)
        changes, held, removed = self._changes, self._held.rows, self._removed
        # keys of plain types are their own frozen form (arrays and structs need freeze)
        atomic = all(is_atomic(self.store.schema.field(i).type) for i in range(len(positions)))
        prefix = positions == list(range(len(positions)))
        n = len(positions)
        for row in rows:
            if atomic:
                frozen = row[:n] if prefix else tuple([row[p] for p in positions])
                key = list(frozen)
            else:
                key = [row[p] for p in positions]
                frozen = freeze(tuple(key))
            seen = changes.get(frozen)
            if seen is None and not (removed and frozen in removed):
                seen = held.get(frozen)
            value = fold(seen[1] if seen is not None else None, row)
            if value is not None:
                changes[frozen] = (key, value)
                if removed:
                    removed.pop(frozen, None)

    # --- what operators derive from the version ----------------------------------------------
    def timers(self, name: str, build: Callable[[dict[Any, Entry]], Iterable[tuple[int, Any]]]) -> TimerQueue:
        """The group's timer queue `name`, kept across batches; built by `build(the loaded rows)`
        when the worker has none (a version loaded from the files, or caught up)."""
        derived = self._held.derived
        queue = derived.get(name)
        if queue is None:
            queue = derived[name] = TimerQueue(build(self._held.rows))
        return queue

    def lookup(self, name: str, build: Callable[[dict[Any, Entry]], Any]) -> Any:
        """Any other structure derived from the loaded rows and kept across batches (the same
        way as `timers`): a key's sessions, a key's kept rows."""
        derived = self._held.derived
        if name not in derived:
            derived[name] = build(self._held.rows)
        return derived[name]

    @property
    def loaded_rows(self) -> dict[Any, Entry]:
        """The loaded version's rows, to migrate in place before anything derives from them."""
        return self._held.rows

    # --- the end ----------------------------------------------------------------------------
    def commit(self) -> StateMetrics:
        """Writes the next version under this run's token (the lineage's for it: the changes and
        the removed keys, and every SNAPSHOT_EVERY versions the whole state), deletes what
        retention no longer needs, and only then makes the new version this worker's. The
        delta's metadata says what the version holds (`measure` reads it)."""
        self._check(self.UPDATING)
        store, held = self.store, self._held
        directory = os.path.join(store.root, group_dir_name(self.key_group))
        os.makedirs(directory, exist_ok=True)
        version = held.version + 1
        token = store.lineage.token(version)
        if token is None:
            raise ValueError(f"the batch's state lineage names no run for version {version}: nothing to write it as")
        delta_path = os.path.join(directory, state_file_name(version, DELTA, token))
        changes, rows = self._changes, held.rows
        removed = {k: key for k, key in self._removed.items() if k in rows and k not in changes}
        total = len(rows) + sum(1 for k in changes if k not in rows) - len(removed)
        update_ms = round((time.perf_counter() - self._began) * 1000, 3)
        memory = _memory_estimate(rows, changes, total)
        commit_ms = _write_rows(delta_path, store.schema, list(changes.values()), lambda commit_ms: {
            _ROWS_TOTAL: total, _ROWS_UPDATED: len(changes), _ROWS_REMOVED: len(removed), _UPDATE_MS: update_ms,
            _MEMORY: memory, _COMMIT_MS: commit_ms}, list(removed.values()))
        rows.update(changes)  # the old version's dict is not kept: it is this worker's only copy
        for k in removed:
            del rows[k]
        if version % SNAPSHOT_EVERY == 0:
            _write_rows(os.path.join(directory, state_file_name(version, SNAPSHOT, token)), store.schema,
                        list(rows.values()))
            for name in files_to_delete(os.listdir(directory), version, store.retain, store.lineage):
                try:
                    os.remove(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
        self._held = HeldVersion(version, rows, _stamp(delta_path), token, held.derived)
        _loaded()[(store.root, self.key_group)] = self._held
        self.status = self.COMMITTED
        self.metrics = StateMetrics(total, len(changes), len(removed), 0, 0, update_ms, memory, commit_ms)
        return self.metrics

    def abort(self) -> None:
        """The worker forgets the group: what it holds may be half-changed (a timer queue popped,
        a row migrated, the rows updated before a snapshot failed); the next batch loads it from
        the files."""
        self.status = self.ABORTED
        self._held.derived.clear()
        _loaded().pop((self.store.root, self.key_group), None)

    def _check(self, status: str) -> None:
        if self.status != status:
            raise RuntimeError(f"key group {self.key_group}'s state version is {self.status}, not {status}")


def load_held(root: str, key_group: int, version: int, n_keys: int, lineage: OperatorLineage = LEGACY) -> HeldVersion:
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
    rows, _ = version_rows(root, key_group, version, n_keys, lineage)
    stamp = None if empty else _stamp(os.path.join(directory, state_file_name(version, DELTA, token or "")))
    return HeldVersion(version, rows, stamp, token)


def _catch_up(cached_as: tuple[str, int], directory: str, held: HeldVersion, version: int, n_keys: int,
              lineage: OperatorLineage) -> HeldVersion | None:
    """`held` brought to `version` by the lineage's deltas after it (None when one is missing, or
    the lineage does not name its run: the files make the version whole instead). The held dict is
    changed in place (it is this worker's only copy), so it leaves the cache until the version is
    made; what was derived from it is built again."""
    tokens = [lineage.token(v) for v in range(held.version + 1, version + 1)]
    if any(t is None for t in tokens):
        return None
    paths = [os.path.join(directory, state_file_name(v, DELTA, t or ""))
             for v, t in zip(range(held.version + 1, version + 1), tokens)]
    if not all(os.path.exists(p) for p in paths):
        return None
    _loaded().pop(cached_as, None)
    for path in paths:
        read_rows(_files.read_table(path), n_keys, held.rows)
    return HeldVersion(version, held.rows, _stamp(paths[-1]), tokens[-1])


def _write_rows(path: str, schema: pa.Schema, rows: list[Entry], metadata: dict | Callable | None = None,
                removed: list[list] = ()) -> float:
    """`rows` (key, values), and when the schema ends in REMOVED_COLUMN the `removed` keys, as
    one Arrow file (`metadata` in its schema; a callable is called with the ms the table took to
    build, and gives it); the ms the table took. A value Arrow cannot hold as its column's type
    is a StateValueError naming the column and the key."""
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
    for column, f in zip(columns, schema):
        try:
            arrays.append(pa.array(column, type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise _value_error(f, column, [key for key, _ in rows] + list(removed), e) from None
    took = round((time.perf_counter() - began) * 1000, 3)
    if callable(metadata):
        metadata = metadata(took)
    if metadata:
        schema = schema.with_metadata({k: str(v) for k, v in metadata.items()})
    write_table(path, pa.Table.from_arrays(arrays, schema=schema))
    return took


def _value_error(f: pa.Field, column: list, keys: list[list], error: Exception) -> StateValueError:
    for value, key in zip(column, keys):  # the first value Arrow refuses on its own
        try:
            pa.array([value], type=f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            return StateValueError(f"state {f.name!r} of key {tuple(key)!r}: {value!r} "
                                   f"({type(value).__name__}) cannot be stored as {f.type}: {e}")
    return StateValueError(f"state {f.name!r}: cannot be stored as {f.type}: {error}")


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


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
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


def by_group(batches: Iterator[pa.RecordBatch], columns: list[str], owned: range) -> list[tuple[int, list[tuple]]]:
    """The rows (tuples of `columns`' values) per key group, in group order; a group with only
    its marker row has no rows, and is there all the same (so that every owned group writes its
    version even when the batch has no row of it). A row of a group the subtask does not own is
    an error: its state is another subtask's to write. Grouped by Arrow (a sort by group), so the
    only per-row Python work is making each row's tuple."""
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


def emit(rows: list[list], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """What a batch emits, as Arrow batches of `schema`."""
    for start in range(0, len(rows), ROWS_PER_BATCH):
        chunk = rows[start:start + ROWS_PER_BATCH]
        yield pa.RecordBatch.from_arrays(
            [pa.array([row[i] for row in chunk], type=f.type) for i, f in enumerate(schema)], schema=schema)
