"""The keyed process function's API and its operator, for the user's function and the planner
(`transforms._process`): the state handles (value, list, map: Flink's ValueState, ListState,
MapState, each with an optional TTL), the timer service (processing-time and event-time timers),
the context a function is handed, and `process_batches`, which runs the function per key and
batch over the key group's state version (`store.StateVersion`) and its two timer queues.

A key's state is one row whose layout `funke.common.streaming.processlayout.ProcessLayout`
declares; the kinds of state are `HANDLES` (a new kind is a handle class registered there, and
its name in `funke.common.streaming.state.STATE_KINDS`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pyarrow as pa
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming import processlayout as _layout
from funke.common.streaming.processlayout import ProcessLayout, StateDecl
from funke.common.streaming.state import LEGACY, SNAPSHOT_EVERY, OperatorLineage
from funke.common.streaming.timers import TimerQueue
from funke.runtime.statefiles import freeze
from funke.taskmanager.operators.keyedstate.store import StateStore, StateVersion
from funke.taskmanager.operators.udf import ROWS_PER_BATCH, RUNTIME_FILES, RowReader, RowWriter, _from_arrow, _to_arrow

for _module in (sys.modules[__name__], _layout):
    _spark_cloudpickle.register_pickle_by_value(_module)
RUNTIME_FILES.add(__file__)  # a process function's traceback starts at the user's code

__all__ = ["HANDLES", "ListStateHandle", "MapStateHandle", "ProcessContext", "StateSpec", "TimerService",
           "ValueStateHandle", "process_batches", "state_schema", "state_spec"]


class _CurrentKey:
    """The state of the key being processed, for the handles: `values` is the key's row of
    state in the store's layout (each state, each TTL state's expiry, the timers), a copy made
    when the key's turn starts, so a batch that fails leaves the loaded version untouched."""

    __slots__ = ("values", "frozen", "dirty", "now", "watermark", "timers_at", "queues", "domain")

    def __init__(self, now: int, timers_at: int, watermark: int | None = None):
        self.values: list | None = None
        self.frozen: Any = None
        self.dirty = False
        self.now = now
        self.watermark = watermark  # the batch's event-time watermark (None: none yet)
        self.timers_at = timers_at  # where the timers are in `values` (the event-time ones next)
        # the key group's timer queues: processing time, event time
        self.queues: tuple[TimerQueue, TimerQueue] | None = None
        self.domain: str | None = None  # the time domain of the timer firing (on_timer)

    def row(self, what: str) -> list:
        if self.values is None:
            raise RuntimeError(f"{what}: there is no current key here (state is per key: use it in process() "
                               "and on_timer())")
        return self.values


class _Handle:
    __slots__ = ("_runner", "_index", "_expires", "_ttl", "name")

    def __init__(self, runner: _CurrentKey, name: str, index: int, expires: int | None, ttl: int | None):
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
    """One value per key (Flink's ValueState); its column holds the value's type."""

    __slots__ = ("_read", "_write")
    kind = "value"

    def __init__(self, runner: _CurrentKey, name: str, index: int, expires: int | None, ttl: int | None,
                 column: pa.DataType, inner: tuple[pa.DataType, ...]):
        super().__init__(runner, name, index, expires, ttl)
        self._read, self._write = _from_arrow(column), _to_arrow(column)

    @staticmethod
    def inner(value_type: pa.DataType, key_type: pa.DataType | None) -> tuple[pa.DataType, ...]:
        return ()

    @staticmethod
    def column_type(value_type: pa.DataType, key_type: pa.DataType | None) -> pa.DataType:
        return value_type

    def value(self) -> Any:
        v = self._get()
        return self._read(v) if self._read and v is not None else v

    def update(self, value: Any) -> None:
        self._set(self._write(value) if self._write and value is not None else value)


class ListStateHandle(_Handle):
    """A list of values per key (Flink's ListState); its column is a list of the values' type."""

    __slots__ = ("_read", "_write")
    kind = "list"

    def __init__(self, runner: _CurrentKey, name: str, index: int, expires: int | None, ttl: int | None,
                 column: pa.DataType, inner: tuple[pa.DataType, ...]):
        super().__init__(runner, name, index, expires, ttl)
        (element_type,) = inner
        self._read, self._write = _from_arrow(element_type), _to_arrow(element_type)

    @staticmethod
    def inner(value_type: pa.DataType, key_type: pa.DataType | None) -> tuple[pa.DataType, ...]:
        return (value_type,)

    @staticmethod
    def column_type(value_type: pa.DataType, key_type: pa.DataType | None) -> pa.DataType:
        return pa.list_(value_type)

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
    """A map per key (Flink's MapState); its column is a map of the key type to the value type."""

    __slots__ = ("_key_read", "_key_write", "_read", "_write")
    kind = "map"

    def __init__(self, runner: _CurrentKey, name: str, index: int, expires: int | None, ttl: int | None,
                 column: pa.DataType, inner: tuple[pa.DataType, ...]):
        super().__init__(runner, name, index, expires, ttl)
        key_type, value_type = inner
        self._key_read, self._key_write = _from_arrow(key_type), _to_arrow(key_type)
        self._read, self._write = _from_arrow(value_type), _to_arrow(value_type)

    @staticmethod
    def inner(value_type: pa.DataType, key_type: pa.DataType | None) -> tuple[pa.DataType, ...]:
        assert key_type is not None
        return key_type, value_type

    @staticmethod
    def column_type(value_type: pa.DataType, key_type: pa.DataType | None) -> pa.DataType:
        assert key_type is not None
        return pa.map_(key_type, value_type)

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

    def __init__(self, runner: _CurrentKey):
        self._runner = runner

    def current_processing_time(self) -> int:
        return self._runner.now

    def register_processing_time_timer(self, timestamp: int) -> None:
        timestamp = _timer_time(timestamp)
        values = self._runner.row("register_processing_time_timer")
        timers = values[self._runner.timers_at] or []
        if timestamp not in timers:
            values[self._runner.timers_at] = sorted(timers + [timestamp])
            self._runner.queues[0].push(timestamp, self._runner.frozen)  # type: ignore[index]
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
            self._runner.queues[1].push(timestamp, self._runner.frozen)  # type: ignore[index]
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

    def __init__(self, runner: _CurrentKey, handles: dict[str, _Handle], batch_id: int):
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



# The kinds of state (`STATE_KINDS`): kind -> its handle class, which also says the Arrow type of
# its column and the types its handle converts.
HANDLES: dict[str, type[ValueStateHandle] | type[ListStateHandle] | type[MapStateHandle]] = {
    h.kind: h for h in (ValueStateHandle, ListStateHandle, MapStateHandle)}

# (name, kind, Arrow type of its column, the types its handle converts, TTL ms)
StateSpec = tuple[str, str, pa.DataType, tuple[pa.DataType, ...], int | None]


def state_spec(name: str, kind: str, value_type: pa.DataType, key_type: pa.DataType | None,
               ttl_ms: int | None) -> StateSpec:
    """A declared state as the worker takes it (`key_type`: a map's keys'; None for the others)."""
    handle = HANDLES[kind]
    return name, kind, handle.column_type(value_type, key_type), handle.inner(value_type, key_type), ttl_ms


def _layout_of(n_keys: int, specs: list[StateSpec]) -> ProcessLayout:
    return ProcessLayout(n_keys, tuple(StateDecl(name, kind, ttl) for name, kind, _, _, ttl in specs))


def state_schema(key_types: list[pa.DataType], specs: list[StateSpec]) -> pa.Schema:
    """The store's Arrow schema of a process function's state (its columns as `ProcessLayout`
    names them)."""
    types = list(key_types) + [column for _, _, column, _, _ in specs]
    types += [pa.int64() for *_, ttl in specs if ttl is not None]  # each TTL's expiry
    types += [pa.list_(pa.int64()), pa.list_(pa.int64()), pa.bool_()]  # the timers of each kind, REMOVED_COLUMN
    return pa.schema([pa.field(n, t) for n, t in zip(_layout_of(len(key_types), specs).columns(), types)])


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
    layout = _layout_of(len(keys), specs)
    n_states, expires_of = len(specs), layout.expires_at
    timers_at, event_at, width = layout.timers_at, layout.event_timers_at, layout.width
    store = StateStore(root, version, len(keys), state_schema, retain, lineage)
    sweeps = bool(expires_of) and (version + 1) % SNAPSHOT_EVERY == 0

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

    def queues(state: StateVersion) -> tuple[TimerQueue, TimerQueue]:
        def migrated(held: dict) -> bool:
            for _, values in held.values():
                layout.pad(values)
            return True

        state.lookup("layout", migrated)  # before the queues read the rows
        def timers_of(at: int) -> Callable[[dict], list[tuple[int, Any]]]:
            return lambda held: [(t, f) for f, (_, v) in held.items() for t in (v[at] or ())]

        return state.timers("processing", timers_of(timers_at)), state.timers("event", timers_of(event_at))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = cloudpickle.loads(fn_bytes)
        runner = _CurrentKey(now_ms, timers_at, watermark_ms)
        handles: dict[str, _Handle] = {name: HANDLES[kind](runner, name, i, expires_of.get(i), ttl, column, inner)
                                       for i, (name, kind, column, inner, ttl) in enumerate(specs)}
        ctx = ProcessContext(runner, handles, version)
        to_user = RowReader(in_schema).record()
        writer = RowWriter(out_schema, label)
        opened = getattr(fn, "open", None)
        if opened is not None:
            opened(ctx)
        results: list[Any] = []

        def turn(state: StateVersion, frozen: Any, key: list, call: Callable[[], Any]) -> None:
            """One call of the function with `key` current; its state row written back (or the
            key removed: nothing left) when the call changed it."""
            held = state.get(frozen)
            runner.values = list(held[1]) if held is not None else [None] * width
            runner.frozen, runner.dirty = frozen, False
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
                state.put(frozen, key, values)
            else:
                state.remove(frozen)

        def fire(state: StateVersion, queue: TimerQueue, due: int | None, at_index: int, domain: str) -> None:
            """on_timer for each timer of `queue` at or before `due` (index `at_index` of a key's
            values holds that kind of timer)."""
            for at, frozen in queue.due(due):
                held = state.get(frozen)
                if held is None or at not in (held[1][at_index] or ()):
                    continue  # deleted, or fired already
                fired = list(held[1])
                fired[at_index] = [t for t in fired[at_index] if t != at] or None
                state.put(frozen, held[0], fired)  # a fired timer is gone, whatever on_timer does
                runner.domain = domain
                try:
                    turn(state, frozen, held[0], lambda: fn.on_timer(ctx.key, at, ctx))
                finally:
                    runner.domain = None
                after = state.get(frozen)
                if after is not None and not alive(after[1]):
                    state.remove(frozen)

        def rule(state: StateVersion, rows: list[tuple]) -> list:
            processing, event = runner.queues = queues(state)
            per_key: dict[Any, tuple[list, list]] = {}
            for row in rows:
                key = [row[p] for p in positions]
                per_key.setdefault(freeze(tuple(key)), (key, []))[1].append(to_user(row))
            for frozen, (key, key_rows) in per_key.items():
                turn(state, frozen, key, lambda: fn.process(ctx.key, key_rows, ctx))
            # a timer registered while timers fire fires in a later batch
            processing.hold()
            event.hold()
            try:
                fire(state, processing, now_ms, timers_at, "PROCESSING_TIME")
                fire(state, event, watermark_ms, event_at, "EVENT_TIME")
            finally:
                processing.release()
                event.release()
            if sweeps:
                for frozen, (_, values) in state.unchanged():
                    if not alive(values):
                        state.remove(frozen)
            return ()

        store.each_group(batches, in_schema.names, owned, rule)
        for start in range(0, len(results), ROWS_PER_BATCH):
            yield writer.batch_of_results(results[start:start + ROWS_PER_BATCH])

    return run
