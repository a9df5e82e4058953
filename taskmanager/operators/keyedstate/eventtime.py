"""The event-time operators over a stream, for the planner (`transforms`): window and session
window aggregates, the interval join and drop_duplicates_within_watermark, whose state the
batch's watermark bounds (`funke.common.streaming.eventtime` has the rules of lateness). Each is
its rule alone: the store (`store.StateStore`) loads, commits and aborts each key group's version,
and each keeps what it waits for in the version's timer queue (`funke.common.streaming.timers`):
windows and sessions by end, kept rows by expiry. An entry whose key no longer waits for that
time (merged away, extended, expired already) is skipped when it comes up.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle as _spark_cloudpickle

from funke.common.streaming.state import LEGACY, OperatorLineage
from funke.runtime.statefiles import freeze
from funke.taskmanager.operators.keyedstate.folds import AggregateSpec, partials_of
from funke.taskmanager.operators.keyedstate.store import Entry, StateStore, StateVersion, emit
from funke.taskmanager.operators.udf import RUNTIME_FILES

_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
RUNTIME_FILES.add(__file__)

__all__ = ["deduplicate_within_batches", "interval_join_batches", "session_aggregate_batches",
           "window_aggregate_batches"]


def _until(watermark_ms: int | None, lateness_ms: int = 0) -> int | None:
    """The last time whose entries the watermark closes (time + lateness <= watermark)."""
    return None if watermark_ms is None else watermark_ms - lateness_ms


def _by_user_key(held: dict[Any, Entry], n_keys: int) -> dict[Any, set]:
    """The stored keys of each user key (a state key is the user's key and more)."""
    index: dict[Any, set] = {}
    for frozen in held:
        index.setdefault(frozen[:n_keys], set()).add(frozen)
    return index


def _per_user_key(rows: list[tuple], n_keys: int) -> dict[Any, list[tuple]]:
    per_key: dict[Any, list[tuple]] = {}
    for row in rows:
        per_key.setdefault(tuple([freeze(v) for v in row[:n_keys]]), []).append(row)
    return per_key


def _forget_empty(index: dict[Any, set]) -> None:
    for user in [u for u, members in index.items() if not members]:
        del index[user]


def window_aggregate_batches(root: str, n_keys: int, aggregates: list[AggregateSpec], version: int, mode: str,
                             retain: int, state_schema: pa.Schema, out_schema: pa.Schema, owned: range,
                             watermark_ms: int | None, size_ms: int, lateness_ms: int,
                             lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of a window aggregate: like a running aggregate's,
    with each window's start (epoch ms) the last part of the key. Its rows are the batch's
    partial aggregates per key and window, the windows already closed left out (they are late:
    counted and routed before). After merging, the windows the watermark closed (end + allowed
    lateness <= watermark) leave the state; append mode emits them, final; update mode emits
    the windows the batch changed. Each group's windows wait in a timer queue by end (Flink's
    event-time timer at a window's end)."""
    key_width = n_keys + 1
    state_columns = list(state_schema.names[:-1])  # without REMOVED_COLUMN
    merge, totals = partials_of(aggregates)
    store = StateStore(root, version, key_width, state_schema, retain, lineage)
    positions = list(range(key_width))

    def rule(state: StateVersion, rows: list[tuple]) -> list[list]:
        ends = state.timers("ends", lambda held: [(key[-1] + size_ms, frozen) for frozen, (key, _) in held.items()])

        def fold(old: list | None, row: tuple) -> list:
            if old is None:
                ends.push(row[n_keys] + size_ms, freeze(tuple(row[:key_width])))
                return list(row[key_width:])
            return merge(old, row[key_width:])

        state.fold(rows, positions, fold)
        closed = []
        for _, frozen in ends.due(_until(watermark_ms, lateness_ms)):
            entry = state.get(frozen)
            if entry is not None:
                closed.append(entry)
                state.remove(frozen)
        return [key + totals(values) for key, values in (closed if mode == "append" else state.changed())]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from emit(store.each_group(batches, state_columns, owned, rule), out_schema)

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
    merge, totals = partials_of(aggregates)
    store = StateStore(root, version, key_width, state_schema, retain, lineage)

    def rule(state: StateVersion, rows: list[tuple]) -> list[list]:
        ends = state.timers("ends", lambda held: [(values[0], frozen) for frozen, (_, values) in held.items()])
        sessions_of = state.lookup("sessions", lambda held: _by_user_key(held, n_keys))
        for user, batch_rows in _per_user_key(rows, n_keys).items():
            # (start, end, partials, the stored session's frozen key or None)
            sessions = []
            for f in sessions_of.get(user, ()):
                key, values = state.get(f)  # type: ignore[misc]
                sessions.append((key[-1], values[0], values[1:], f))
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
                        state.remove(m)
                        sessions_of[user].discard(m)
                state.put(frozen, key + [start], [end] + parts)
                sessions_of.setdefault(user, set()).add(frozen)
                ends.push(end, frozen)
        closed = []
        for end, frozen in ends.due(_until(watermark_ms, lateness_ms)):
            entry = state.get(frozen)
            if entry is None or entry[1][0] != end:
                continue  # merged away, or extended since
            closed.append(entry)
            state.remove(frozen)
            sessions_of.get(frozen[:n_keys], set()).discard(frozen)
        _forget_empty(sessions_of)
        # a session the batch changed is open (its rows were on time), so the two never meet
        return [key + [values[0]] + totals(values[1:])
                for key, values in (closed if mode == "append" else state.changed())]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from emit(store.each_group(batches, state_columns, owned, rule), out_schema)

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
    store = StateStore(root, version, n_keys + 2, state_schema, retain, lineage)

    def expires(side: int, at: int) -> int:
        """The first watermark at which a kept row can no longer be joined."""
        return at + upper_ms + 1 if side == 0 else at - lower_ms + 1

    def pair(key: list, left: list, right: list) -> list:
        """An output row from a left row's and a right row's kept values (time, matched, then
        the left's columns and the right's)."""
        return key + left[2:2 + n_left] + right[2 + n_left:]

    def rule(state: StateVersion, rows: list[tuple]) -> list[list]:
        expiries = state.timers("expiries",
                                lambda held: [(expires(f[n_keys], v[0]), f) for f, (_, v) in held.items()])
        kept_of = state.lookup("rows", lambda held: _by_user_key(held, n_keys))
        out: list[list] = []
        seq = itertools.count()
        for user, batch_rows in _per_user_key(rows, n_keys).items():
            key = list(batch_rows[0][:n_keys])
            kept = [(f, state.get(f)) for f in kept_of.get(user, ())]
            lefts = [(f, e) for f, e in kept if f[n_keys] == 0]
            rights = [(f, e[1]) for f, e in kept if f[n_keys] == 1]  # type: ignore[index]
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
            matched: dict[Any, Entry] = {}
            for _, rv in new_rights:
                for f, (left_key, lv) in lefts:  # type: ignore[misc]
                    if lv[0] + lower_ms <= rv[0] <= lv[0] + upper_ms:
                        out.append(pair(key, lv, rv))
                        if not lv[1]:  # now matched (the kept version stays as it was)
                            matched.setdefault(f, (left_key, lv))
            for f, (left_key, lv) in matched.items():
                state.put(f, list(left_key), [lv[0], True] + lv[2:])
            for frozen, values in new_lefts + new_rights:
                state.put(frozen, key + [frozen[n_keys], frozen[n_keys + 1]], values)
                kept_of.setdefault(user, set()).add(frozen)
                expiries.push(expires(frozen[n_keys], values[0]), frozen)
        for _, frozen in expiries.due(watermark_ms):
            entry = state.get(frozen)
            if entry is None:
                continue
            state.remove(frozen)
            kept_of.get(frozen[:n_keys], set()).discard(frozen)
            values = entry[1]
            if left_outer and frozen[n_keys] == 0 and not values[1]:
                out.append(pair(list(entry[0][:n_keys]), values, [None] * (2 + n_left + n_right)))
        _forget_empty(kept_of)
        return out

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from emit(store.each_group(batches, in_columns, owned, rule), out_schema)

    return run


def deduplicate_within_batches(root: str, positions: list[int], version: int, retain: int, state_schema: pa.Schema,
                               out_schema: pa.Schema, owned: range, watermark_ms: int | None,
                               lineage: OperatorLineage = LEGACY):
    """The mapInArrow function of one batch of drop_duplicates_within_watermark: a row whose key
    no live state has is emitted, and its key kept until the watermark passes the row's expiry
    (its event time plus the watermark's delay, in the row's last column); then the key leaves
    the state. Late rows were left out before (counted)."""
    width = len(out_schema)
    store = StateStore(root, version, len(positions), state_schema, retain, lineage)

    def rule(state: StateVersion, rows: list[tuple]) -> list[list]:
        expiries = state.timers("expiries", lambda held: [(values[0], frozen) for frozen, (_, values) in held.items()])
        firsts: list[list] = []

        def first(old: list | None, row: tuple) -> list | None:
            if old is not None:
                return None  # seen within the watermark: a duplicate
            firsts.append(list(row[:width]))
            expiries.push(row[width], freeze(tuple([row[p] for p in positions])))
            return [row[width]]

        state.fold(rows, positions, first)
        for expires, frozen in expiries.due(watermark_ms):
            entry = state.get(frozen)
            if entry is not None and entry[1][0] == expires:
                state.remove(frozen)
        return firsts

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        columns = list(out_schema.names) + ["__expires"]
        yield from emit(store.each_group(batches, columns, owned, rule), out_schema)

    return run
