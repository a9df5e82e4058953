"""Keyed state handles for `KeyedStream.process`: what a keyed process function declares it
keeps per key (Flink's ValueStateDescriptor, ListStateDescriptor and MapStateDescriptor;
Structured Streaming's transformWithState state variables), and the base class such a
function may extend.

    class Sessions(KeyedProcessFunction):
        state = (ValueState("events", "bigint"), ValueState("started", "bigint"))

        def process(self, key, rows, ctx):
            ...                                   # ctx.state.events.value(), .update(n) ...
            ctx.timer_service().register_processing_time_timer(ctx.current_processing_time() + 30_000)
            yield (key, n)                        # rows of the operator's output schema

        def on_timer(self, key, timestamp, ctx):
            yield ...

    events.key_by("user").process(Sessions(), schema="user string, n bigint")

Types are Spark DDL type texts ("bigint", "string", "array<double>", "struct<a:int,b:string>");
a state with `ttl` reads as empty once that long has passed since it was last written
(Flink's OnCreateAndWrite update type, NeverReturnExpired visibility), in processing time: the
time of the batch, logged with it, so a batch run again sees the same time.

Pure, and pickled by value with a user's subclass (the Python workers that run it need not
have funke installed): it imports nothing of funke.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

__all__ = ["KeyedProcessFunction", "ListState", "MapState", "ValueState"]


class _StateDescriptor:
    __slots__ = ("name", "ttl")
    kind = ""

    def __init__(self, name: str, ttl: str | int | datetime.timedelta | None) -> None:
        self.name = name
        self.ttl = ttl

    def spec(self) -> dict[str, Any]:
        """As the operator's config holds it (checked there: names, types, TTL range)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        out.update(self._types())
        if self.ttl is not None:
            out["ttl_ms"] = _ttl_ms(self.ttl, self.name)
        return out

    def _types(self) -> dict[str, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()})"


class ValueState(_StateDescriptor):
    """One value per key: `value()` (None when empty), `update(v)`, `clear()`."""
    __slots__ = ("type",)
    kind = "value"

    def __init__(self, name: str, type: str, ttl: str | int | datetime.timedelta | None = None) -> None:
        super().__init__(name, ttl)
        self.type = type

    def _types(self) -> dict[str, Any]:
        return {"type": self.type}


class ListState(_StateDescriptor):
    """A list per key: `get()`, `add(v)`, `add_all(vs)`, `update(vs)`, `clear()`."""
    __slots__ = ("element_type",)
    kind = "list"

    def __init__(self, name: str, element_type: str, ttl: str | int | datetime.timedelta | None = None) -> None:
        super().__init__(name, ttl)
        self.element_type = element_type

    def _types(self) -> dict[str, Any]:
        return {"type": self.element_type}


class MapState(_StateDescriptor):
    """A map per key: `get(k)`, `put(k, v)`, `put_all(d)`, `remove(k)`, `contains(k)`, `keys()`,
    `values()`, `items()`, `is_empty()`, `clear()`."""
    __slots__ = ("key_type", "value_type")
    kind = "map"

    def __init__(self, name: str, key_type: str, value_type: str,
                 ttl: str | int | datetime.timedelta | None = None) -> None:
        super().__init__(name, ttl)
        self.key_type = key_type
        self.value_type = value_type

    def _types(self) -> dict[str, Any]:
        return {"key_type": self.key_type, "type": self.value_type}


class KeyedProcessFunction:
    """A keyed process function (Flink's KeyedProcessFunction, per key and micro-batch). Declare
    the state in `state`; funke calls, in the Python worker that owns the key's group:

    - `open(ctx)` once per batch and worker before any key (ctx.get_state("name") gives a handle
      that follows the key being processed, as in PyFlink);
    - `process(key, rows, ctx)` once per key with rows in the batch (`key`: the bare value for one
      key column, else a tuple; `rows`: the key's rows as `udf` passes records, in no particular
      order), returning or yielding output rows;
    - `on_timer(key, timestamp, ctx)` for each processing-time timer the batch's time reached,
      then each event-time timer its watermark reached, after the batch's rows, returning or
      yielding output rows (`ctx.time_domain()` says which kind: "PROCESSING_TIME" or
      "EVENT_TIME").

    `ctx.state.<name>` is the current key's handle, `ctx.timer_service()` registers and deletes
    timers (register_processing_time_timer, register_event_time_timer and their delete_...),
    `ctx.current_processing_time()` is the batch's time and `ctx.current_watermark()` its
    event-time watermark (epoch ms; None until the query has one: event-time timers need
    with_watermark upstream), `ctx.batch_id` the batch. A key whose states are all empty and
    which has no timer is removed from the state."""

    state: tuple[_StateDescriptor, ...] = ()

    def open(self, ctx: Any) -> None:
        pass

    def process(self, key: Any, rows: list[Any], ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError("a KeyedProcessFunction defines process(key, rows, ctx)")

    def on_timer(self, key: Any, timestamp: int, ctx: Any) -> Iterable[Any] | None:
        return None


def _ttl_ms(ttl: object, name: str) -> int:
    """A TTL as whole milliseconds: an int (ms), a timedelta, or Flink's duration text ("30 min");
    the range is checked with the job (funke.common.streaming.state)."""
    if isinstance(ttl, bool):
        raise TypeError(f"state {name!r}: ttl must be a duration, got {ttl!r}")
    if isinstance(ttl, int):
        return ttl
    if isinstance(ttl, datetime.timedelta):
        return round(ttl.total_seconds() * 1000)
    if isinstance(ttl, str):
        from funke.common.durations import parse_duration

        return round(parse_duration(ttl) * 1000)
    raise TypeError(f"state {name!r}: ttl must be milliseconds, a timedelta or a duration text like '30 min', "
                    f"got {type(ttl).__name__}")
