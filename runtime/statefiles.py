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

from funke.common.streaming.state import LEGACY, MissingState, OperatorLineage, group_dir_name, load_plan

__all__ = ["group_tables", "missing_text", "read_table", "write_table"]

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
