"""The keyed state store's files, read and written (`funke.common.streaming.state` says which
files make a version): one Arrow IPC file per delta or snapshot of a key group. The Python
workers that run keyed operators write and read them (`funke.taskmanager.operators.keyedstate`,
which pickles this module by value into them: it needs pyarrow, not funke), and the JobManager
reads them to show a query's state (`funke state`).
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.ipc as ipc

from funke.common.streaming.state import DELTA, SNAPSHOT, group_dir_name, load_plan, state_file_name

__all__ = ["group_tables", "read_table", "write_table"]

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


def group_tables(root: str, key_group: int, version: int) -> list[pa.Table]:
    """The files that make the group's `version`, read, oldest first: a key's row in a later
    one replaces its row in an earlier one (MissingState when the files cannot make it; no
    tables for a group without files)."""
    directory = os.path.join(root, group_dir_name(key_group))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []
    plan = load_plan(names, version)
    paths = [os.path.join(directory, state_file_name(plan.snapshot, SNAPSHOT))] if plan.snapshot is not None else []
    paths += [os.path.join(directory, state_file_name(v, DELTA)) for v in plan.deltas]
    return [read_table(p) for p in paths]
