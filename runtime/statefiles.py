"""The keyed state store's files, read and written (`funke.common.streaming.state` says which
files make a version): one Arrow IPC file per delta or snapshot of a key group. The Python
workers that run keyed operators write and read them (`funke.taskmanager.operators.keyedstate`,
which pickles this module by value into them: it needs pyarrow, not funke), and the JobManager
reads them to show a query's state (`funke state`). Reading a version into rows (`read_rows`,
`version_rows`) is one rule for both: a later file's row replaces a key's row, a delta's removed
key (REMOVED_COLUMN true) leaves the version.
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.ipc as ipc

from typing import Any

from funke.common.streaming.state import (
    LEGACY,
    REMOVED_COLUMN,
    MissingState,
    OperatorLineage,
    group_dir_name,
    load_plan,
)

__all__ = ["freeze", "group_tables", "is_atomic", "missing_text", "read_rows", "read_table", "version_rows",
           "write_table"]

# LZ4 frames: half the bytes of a count's state on disk for a few per cent more time
# (bench_state.py); made per call: this module is pickled by value, and options do not pickle.
_COMPRESSION = "lz4"


def read_table(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return ipc.open_file(source).read_all()


def write_table(path: str, table: pa.Table) -> None:
    """Whole or not at all: written under a temporary name, then renamed over `path`."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # one name per writer thread
    with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression=_COMPRESSION)) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def group_tables(root: str, key_group: int, version: int,
                 lineage: OperatorLineage = LEGACY) -> list[pa.Table]:
    """The files that make the group's `version` by `lineage`, read, oldest first: a key's row in
    a later one replaces its row in an earlier one (MissingState, naming the group and its
    directory, when the files cannot make it; no tables for an empty version)."""
    directory = os.path.join(root, group_dir_name(key_group))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []
    try:
        plan = load_plan(names, version, lineage)
    except MissingState as e:
        raise MissingState(missing_text(key_group, directory, str(e))) from None
    return [read_table(os.path.join(directory, name)) for name in plan.files]


def missing_text(key_group: int, directory: str, why: str) -> str:
    """A MissingState's message: which group, where, why, and what to look at. Never an empty
    state instead: a batch that read one would commit wrong results."""
    return (f"the keyed state of key group {key_group} cannot be loaded from {directory}: {why}. Committed state is "
            f"never replaced by an empty one: the batch fails. Every TaskManager must reach the query's checkpoint "
            f"location at the same path (storage all hosts share: a local directory of the same name on each host is "
            f"not the same checkpoint); or the files were deleted")


def freeze(value: Any) -> Any:
    """A hashable stand-in for a key value (array and struct keys come as lists and dicts): how
    the store files a key's row (a row of plain values is its own tuple)."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, freeze(v)) for k, v in value.items())
    return value


def is_atomic(t: pa.DataType) -> bool:
    """Whether a column's values are plain (hashable as Arrow gives them: no lists, maps, structs)."""
    return not (pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def read_rows(table: pa.Table, n_keys: int, into: dict[Any, tuple[list, list]]) -> None:
    """One file's rows into `into` (frozen key -> (key values, the other values)); a delta's
    removed keys (REMOVED_COLUMN true) out of it."""
    removable = table.schema.names[-1] == REMOVED_COLUMN
    columns = [c.to_pylist() for c in (table.columns[:-1] if removable else table.columns)]
    atomic = all(is_atomic(f.type) for f in list(table.schema)[:n_keys])
    if not removable and atomic:  # the usual case, at C speed: a plain key's tuple is its frozen form
        keys = list(zip(*columns[:n_keys]))
        values = map(list, zip(*columns[n_keys:])) if len(columns) > n_keys else ([] for _ in keys)
        into.update(zip(keys, zip(map(list, keys), values)))
        return
    removed = table.column(REMOVED_COLUMN).to_pylist() if removable else [False] * table.num_rows
    for row, gone in zip(zip(*columns), removed):
        key = list(row[:n_keys])
        if gone:
            into.pop(freeze(tuple(key)), None)
        else:
            into[freeze(tuple(key))] = (key, list(row[n_keys:]))


def version_rows(root: str, key_group: int, version: int, n_keys: int, lineage: OperatorLineage = LEGACY,
                 into: dict[Any, tuple[list, list]] | None = None
                 ) -> tuple[dict[Any, tuple[list, list]], pa.Schema | None]:
    """The group's `version` as rows (`read_rows`, into `into` when given), and the schema of its
    newest file without metadata or REMOVED_COLUMN (None: an empty version)."""
    rows: dict[Any, tuple[list, list]] = {} if into is None else into
    schema = None
    for table in group_tables(root, key_group, version, lineage):
        read_rows(table, n_keys, rows)
        schema = table.schema.remove_metadata()
    if schema is not None and schema.names[-1] == REMOVED_COLUMN:
        schema = schema.remove(len(schema) - 1)
    return rows, schema
