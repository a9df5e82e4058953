"""A streaming query's keyed state as rows (`funke state`, GetKeyedState): what each key's state
held after the last committed batch, read from the state store's files in the checkpoint (Spark's
state data source, but also while the query runs: a committed version's files never change).

A running aggregate's state holds partial aggregates; they are shown as the totals the query
emits (an average as its sum over its count). A running reduce's holds the folded record; a
deduplicating operator's the keys it has seen; a keyed process function's its declared states and
timers; a window aggregate's each key's open windows (start and end) with their totals so far.
Blocking I/O, for an executor thread.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from funke.common import aggregates
from funke.common.graph.jobgraph import JobVertex
from funke.common.streaming.state import (
    EVENT_TIMERS_COLUMN,
    REMOVED_COLUMN,
    TIMERS_COLUMN,
    key_group_range,
    operator_dir,
)
from funke.runtime.statefiles import group_tables

__all__ = ["keyed_state_table"]


def keyed_state_table(vertex: JobVertex, checkpoint: str, version: int, key: list[str],
                      limit: int) -> tuple[pa.Table, int]:
    """(at most `limit` rows of the vertex's keyed state at `version`, the number of keys
    matching `key`: the leading key columns' values as text, none for every key)."""
    op = vertex.operators[0]
    keys = [op.config["keys"]] if isinstance(op.config["keys"], str) else list(op.config["keys"])
    root = operator_dir(checkpoint, vertex.id)
    latest: dict[Any, dict[str, Any]] = {}
    schema: pa.Schema | None = None
    for key_group in key_group_range(vertex.effective_max_parallelism, 1, 0):
        for table in group_tables(root, key_group, version):
            schema = table.schema.remove_metadata()
            for row in table.to_pylist():
                at = tuple(repr(row[n]) for n in schema.names[:len(keys)])
                if row.get(REMOVED_COLUMN):
                    latest.pop(at, None)  # a process function's key with nothing left
                else:
                    latest[at] = row
    if schema is None:  # no state yet
        return pa.table({k: pa.array([], pa.string()) for k in keys}), 0
    names = schema.names
    rows = [r for r in latest.values() if all(str(r[names[i]]) == k for i, k in enumerate(key))]
    total = len(rows)
    table = pa.Table.from_pylist(rows[:limit], schema=schema)
    if op.kind == "running_aggregate":
        table = _totals(table, keys, op.config["aggregations"])
    elif op.kind in ("window_aggregate", "session_aggregate"):  # the window's start (epoch ms) after the keys
        start = table.column(len(keys))
        if op.kind == "session_aggregate":  # then the session's end
            end = table.column(len(keys) + 1)
        else:
            end = pc.add(start, pa.scalar(int(op.config.get("size_ms") or 0), pa.int64()))
        totals = _totals(table, keys, op.config["aggregations"])
        columns = {k: totals.column(k) for k in keys}
        columns["window_start"] = pc.cast(start, pa.timestamp("ms", tz="UTC"))
        columns["window_end"] = pc.cast(end, pa.timestamp("ms", tz="UTC"))
        columns.update({n: totals.column(n) for n in totals.column_names[len(keys):]})
        table = pa.table(columns)
    elif op.kind == "running_reduce":
        table = table.drop_columns(names[:len(keys)])  # the key rides twice: as the key and in the record
    elif op.kind == "deduplicate_within":  # each key kept, and when the watermark lets it go
        columns = {k: table.column(i) for i, k in enumerate(keys)}
        columns["expires"] = pc.cast(table.column(len(keys)), pa.timestamp("ms", tz="UTC"))
        table = pa.table(columns)
    elif op.kind == "interval_join":  # each row kept: its side, event time, whether it matched, its columns
        columns = {k: table.column(i) for i, k in enumerate(keys)}
        columns["side"] = pc.if_else(pc.equal(table.column("__side"), 0), "left", "right")
        columns["time"] = pc.cast(table.column("__ts"), pa.timestamp("ms", tz="UTC"))
        columns["matched"] = table.column("__matched")
        # each side's other columns by position (the state holds no names for them)
        columns.update({("left_" if n.startswith("__l") else "right_") + n[3:]: table.column(n) for n in names
                        if n[:3] in ("__l", "__r") and n[3:].isdigit()})
        table = pa.table(columns)
    elif op.kind == "process":  # the key, each state, the timers (not the TTLs' expiry times)
        columns = {k: table.column(i) for i, k in enumerate(keys)}
        columns.update({d["name"]: table.column(d["name"]) for d in op.config.get("state") or []})
        columns["timers"] = table.column(TIMERS_COLUMN)
        if EVENT_TIMERS_COLUMN in names:  # a state written before event-time timers has none
            columns["event_timers"] = table.column(EVENT_TIMERS_COLUMN)
        table = pa.table(columns)
    return table, total


def _totals(table: pa.Table, keys: list[str], aggregations: list[str] | str) -> pa.Table:
    """The partial aggregates as the totals the query emits, named as its aggregations say."""
    columns = {k: table.column(k) for k in keys}
    for i, text in enumerate([aggregations] if isinstance(aggregations, str) else aggregations):
        call = aggregates.parse_call(text)
        if call is None:
            continue
        name = call.alias.strip("`").replace("``", "`") if call.alias else text.strip()
        partial = f"{aggregates.PARTIAL_PREFIX}{i}"
        if call.function == "avg":
            total, count = table.column(f"{partial}_sum"), table.column(f"{partial}_count")
            columns[name] = pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()),
                                       pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64())))
        else:
            columns[name] = table.column(partial)
    return pa.table(columns)
