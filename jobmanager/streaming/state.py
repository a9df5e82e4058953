"""A streaming query's keyed state as rows (`funke state`, GetKeyedState): what each key's state
held after a committed batch, read from the state store's files in the checkpoint, the files of
the run the batch's commit log entry names (Spark's state data source): while the query runs (a
committed version's files never change), and from a stopped or finished query's checkpoint with
no cluster at all (`checkpoint_state`, `funke state --checkpoint PATH [--batch N]`), which the
operators' descriptions the JobManager writes there when a run starts make readable alone.

A running aggregate's state holds partial aggregates; they are shown as the totals the query
emits (an average as its sum over its count). A running reduce's holds the folded record; a
deduplicating operator's the keys it has seen; a keyed process function's its declared states and
timers; a window aggregate's each key's open windows (start and end) with their totals so far.
Blocking I/O, for an executor thread.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from funke.common import aggregates, ids
from funke.common.graph.jobgraph import JobGraph, JobVertex, OperatorSpec
from funke.common.graph.streamingjob import RUNNING_KINDS
from funke.common.streaming.checkpoint import CheckpointError
from funke.common.streaming.keygroups import key_group_range
from funke.common.streaming.processlayout import ProcessLayout
from funke.common.streaming.state import (
    LEGACY,
    METADATA,
    OPERATOR_DESCRIPTION,
    OperatorLineage,
    operator_dir,
    state_key_width,
)
from funke.runtime.hafilesystem import read_file, write_atomically
from funke.runtime.statefiles import version_rows

__all__ = ["DEFAULT_STATE_ROWS", "MAX_STATE_ROWS", "CheckpointState", "NoSuchState", "checkpoint_state",
           "describe_operators", "keyed_state_table", "keyed_vertices"]

_MAX_DESCRIPTION_BYTES = 1024 * 1024
DEFAULT_STATE_ROWS, MAX_STATE_ROWS = 1000, 1_000_000  # rows of state shown (GetKeyedState, funke state)


def keyed_vertices(job: JobGraph) -> list[JobVertex]:
    """The job's vertices whose chain a keyed operator heads (each has its state directory)."""
    return [v for v in job.vertices if v.operators and v.operators[0].kind in RUNNING_KINDS]


def describe_operators(checkpoint: str, job: JobGraph) -> None:
    """Write each keyed operator's description (OPERATOR_DESCRIPTION: its vertex, kind, name,
    configuration and key groups) into its state directory, replacing the last run's: what
    reading the state from the checkpoint alone needs to show it as the running query does.
    Called by the run that holds the checkpoint, when it starts."""
    for v in keyed_vertices(job):
        if not ids.is_path_id(v.id):
            continue  # submit refuses it; nothing is written under a name that is not a plain component
        op = v.operators[0]
        text = json.dumps({"vertex": v.id, "name": v.name, "kind": op.kind, "operator": op.name,
                           "config": dict(op.config), "key_groups": v.effective_max_parallelism}, sort_keys=True)
        directory = operator_dir(checkpoint, v.id)
        os.makedirs(directory, exist_ok=True)
        write_atomically(os.path.join(directory, OPERATOR_DESCRIPTION), text.encode())


class NoSuchState(ValueError):
    """What was asked for is not in the checkpoint: no checkpoint there, no such keyed operator,
    a batch it does not keep, an operator it cannot describe, more key values than the operator
    has key columns. The message says what there is."""


@dataclass(frozen=True, slots=True)
class CheckpointState:
    vertex_id: str
    batch_id: int  # -1: no batch committed yet (no state)
    table: pa.Table
    matching: int  # the keys matching the key asked for


def checkpoint_state(checkpoint: str, vertex_id: str = "", batch_id: int | None = None, key: tuple[str, ...] = (),
                     limit: int = 1000) -> CheckpointState:
    """A keyed operator's state after committed batch `batch_id` (None: the last one), read
    from a checkpoint location alone (no JobManager: the query may be stopped, finished or
    failed, or running). NoSuchState when the checkpoint does not have what is asked; the state
    store's MissingState (or an OSError) when the state is there but cannot be read."""
    from funke.jobmanager.checkpointstore import COMMITS, METADATA as QUERY_METADATA, CheckpointStore

    root = os.path.abspath(checkpoint)
    shown = ids.echo(checkpoint, 300)
    if not os.path.isdir(root):
        raise NoSuchState(f"{shown} is not a directory: give a streaming query's checkpoint location")
    if not os.path.isfile(os.path.join(root, QUERY_METADATA)) or not os.path.isdir(os.path.join(root, COMMITS)):
        raise NoSuchState(f"{shown} is not a streaming query's checkpoint location (it has no {QUERY_METADATA} "
                          f"file and {COMMITS}/ directory)")
    state_root = os.path.join(root, "state")
    try:
        present = sorted(n for n in os.listdir(state_root) if ids.is_path_id(n)
                         and os.path.isdir(operator_dir(root, n)))
    except FileNotFoundError:
        present = []
    if vertex_id:
        if not ids.is_path_id(vertex_id) or vertex_id not in present:
            raise NoSuchState(f"the checkpoint {shown} has no keyed operator {ids.echo(vertex_id)} "
                              f"(it has {', '.join(present) or 'none'})")
    elif len(present) != 1:
        raise NoSuchState(f"the checkpoint {shown} has {len(present)} keyed operators "
                          f"({', '.join(present) or 'none'}){'; name one with --operator' if present else ''}")
    vertex_id = vertex_id or present[0]
    store = CheckpointStore(root)
    commits = store.commit_ids()
    if batch_id is None:
        if not commits:
            return CheckpointState(vertex_id, -1, pa.table({}), 0)
        batch_id = commits[-1]
    elif batch_id not in commits:
        kept = f"it keeps batches {commits[0]}..{commits[-1]}" if commits else "no batch is committed"
        raise NoSuchState(f"batch {batch_id} is not a committed batch the checkpoint {shown} keeps ({kept}; "
                          f"streaming.min-batches-to-retain says how many are kept)")
    try:
        entry = store.read_commit(batch_id)
    except CheckpointError as exc:
        raise NoSuchState(f"the commit log entry of batch {batch_id} cannot be read: {exc}") from None
    lineage = entry.state.operator(vertex_id) if entry.state is not None else LEGACY
    vertex = _described(root, vertex_id)
    keys = vertex.operators[0].config["keys"]
    n_keys = 1 if isinstance(keys, str) else len(keys)  # type: ignore[arg-type]
    if len(key) > n_keys:
        raise NoSuchState(f"{len(key)} key values given, and operator {vertex_id!r} has {n_keys} key column(s)")
    table, matching = keyed_state_table(vertex, root, batch_id + 1, list(key), limit, lineage)
    return CheckpointState(vertex_id, batch_id, table, matching)


def _described(checkpoint: str, vertex_id: str) -> JobVertex:
    """The keyed operator as its description in the checkpoint says (NoSuchState without one)."""
    directory = operator_dir(checkpoint, vertex_id)
    data = read_file(os.path.join(directory, OPERATOR_DESCRIPTION))
    if data is None:
        raise NoSuchState(f"the keyed operator {vertex_id!r} has no description in the checkpoint "
                          f"({OPERATOR_DESCRIPTION}: a run of this funke writes it when it starts; a checkpoint "
                          f"last run by funke 0.3.0 has none): run the query once, or read its state while it runs "
                          f"(funke state JOB)")
    try:
        raw = json.loads(data[:_MAX_DESCRIPTION_BYTES])
        key_groups = int(raw["key_groups"])
        recorded = read_file(os.path.join(directory, METADATA))
        if recorded is not None:  # the number the state was written in, which the job had to keep
            key_groups = int(json.loads(recorded)["key_groups"])
        config = raw["config"]
        if not isinstance(config, dict) or not isinstance(raw["kind"], str) or raw["kind"] not in RUNNING_KINDS \
                or "keys" not in config or not 1 <= key_groups <= 1 << 15:
            raise ValueError("not a keyed operator's description")
        op = OperatorSpec(raw["kind"], str(raw.get("operator") or ""), config)
        return JobVertex(vertex_id, str(raw.get("name") or vertex_id), 1, (op,), max_parallelism=key_groups)
    except (ValueError, KeyError, TypeError) as exc:
        raise NoSuchState(f"the keyed operator {vertex_id!r}'s description in the checkpoint cannot be read "
                          f"({OPERATOR_DESCRIPTION}: {exc})") from None


def keyed_state_table(vertex: JobVertex, checkpoint: str, version: int, key_filter: list[str],
                      limit: int, lineage: OperatorLineage = LEGACY) -> tuple[pa.Table, int]:
    """(at most `limit` rows of the vertex's keyed state at `version`, read from the files of the
    runs `lineage` names, the number of keys matching `key_filter`: the leading key columns' values
    as text, none for every key)."""
    op = vertex.operators[0]
    keys = [op.config["keys"]] if isinstance(op.config["keys"], str) else list(op.config["keys"])
    root = operator_dir(checkpoint, vertex.id)
    latest: dict[Any, tuple[list, list]] = {}
    schema: pa.Schema | None = None
    for key_group in key_group_range(vertex.effective_max_parallelism, 1, 0):  # read as the workers read it
        _, newest = version_rows(root, key_group, version, state_key_width(op.kind, len(keys)), lineage, into=latest)
        schema = newest or schema
    if schema is None:  # no state yet
        return pa.table({k: pa.array([], pa.string()) for k in keys}), 0
    names = schema.names
    rows = [key + values + [None] * (len(names) - len(key) - len(values))  # a row older than the newest layout
            for key, values in latest.values() if all(str(key[i]) == k for i, k in enumerate(key_filter))]
    total = len(rows)
    shown = rows[:limit]
    table = pa.Table.from_arrays([pa.array([r[i] for r in shown], type=f.type) for i, f in enumerate(schema)],
                                 schema=schema)
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
        layout = ProcessLayout.of(len(keys), op.config.get("state"))
        table = pa.table({name: table.column(column) for name, column in layout.shown(keys, names)})
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
