"""Small exchanges: how a micro-batch's (or a small bounded job's) result partitions are written and found.

A micro-batch is small next to a bounded job's data (one trigger's worth, bounded by the
sources' per-trigger limits), and its exchanges are on the batch's critical path: Spark's
distributed Parquet writer (a job, its commit protocol, `_sub=N` directories) and a reader's
partition discovery cost 300–600 ms per exchange however few rows pass. So a producer whose
batch input is small (`IN_MEMORY_LIMIT_BYTES`) collects its output once as Arrow on the
TaskManager, splits it by subpartition with pyarrow and writes one Parquet file per
subpartition, `sub-<k>.parquet` (every subpartition, empty ones too, each written under a
temporary name and renamed); a larger batch goes through Spark's writer as bounded jobs do
(`_sub=<k>/` directories). Consumers read with Spark either way: the exact files of their
subpartition, or the directory filtered by subpartition.

A bounded job's producer does the same when Spark estimates its output at most the job's
`batch.exchange.in-memory.max-bytes` (8 MiB unless set; `estimated_bytes`): a small job's
exchanges then cost what its rows cost, not a distributed write and a partition discovery each.

A partition counts as written only once its producer reported it; a file of it that is not
there is an error, never an empty input.
"""

from __future__ import annotations

import collections
import os
import posixpath
import re
import threading
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from funke.runtime import datafs

# A producer whose batch input (what its sources and gates read) is at most this collects its
# output in memory; above it, Spark's distributed writer.
IN_MEMORY_LIMIT_BYTES = 64 * 1024 * 1024
# What the rate source's rows weigh in that estimate (a bigint and a timestamp).
RATE_ROW_BYTES = 16
# A batch whose input is at most this runs in one Spark partition inside its task: its keyed
# operators then need no shuffle (a stage, its files and a second round of Spark tasks: 50-100 ms
# however few rows), its Python functions one worker call. Above it, the task's Spark work
# spreads over the session's cores as a bounded job's does.
ONE_PARTITION_LIMIT_BYTES = 1024 * 1024

_PREFIX, _SUFFIX = "sub-", ".parquet"


def subpartition_file(directory: str, subpartition: int) -> str:
    return posixpath.join(directory, f"{_PREFIX}{subpartition}{_SUFFIX}")


def subpartition_of_file(name: str) -> int | None:
    """The subpartition a file written in memory holds (`sub-<k>.parquet`), None for another name."""
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    number = name[len(_PREFIX):-len(_SUFFIX)]
    return int(number) if number.isdigit() and number.isascii() else None


def estimated_bytes(df: Any, *, trust_generators: bool = True) -> int | None:
    """Spark's own estimate of a DataFrame's size (its optimizer's statistics: files by their
    size, a range by its rows, an unknown source as huge), None where Spark cannot be asked (Spark
    Connect), and with `trust_generators` False also when the plan has a generator (explode,
    inline, stack...), whose rows Spark estimates at its input's size however many it makes.
    The plan optimized here is the one the DataFrame's next action runs."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        if not trust_generators and _GENERATE.search(plan.toString()):
            return None
        size = plan.stats().sizeInBytes()
        return size if isinstance(size, int) else int(size.toString())  # Py4J hands a BigInt over as int
    except Exception:  # Spark Connect has no _jdf; a plan that does not analyse fails its action anyway
        return None


# A Generate node in a plan's text: one per line, after the tree's drawing characters.
_GENERATE = re.compile(r"^[\s:+|-]*Generate ", re.MULTILINE)


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    return datafs.filesystem(path)


def write_in_memory(directory: str, table: pa.Table, subpartitions: pa.ChunkedArray | None, count: int) -> None:
    """Write `table` as `count` subpartition files (`subpartitions`: each row's subpartition;
    None: the table is subpartition 0 of 1)."""
    if count < 1:
        raise ValueError(f"a partition has at least 1 subpartition, got {count}")
    fs, inner = _filesystem(directory)
    fs.create_dir(inner, recursive=True)
    for k in range(count):
        part = table if subpartitions is None else table.filter(pc.equal(subpartitions, k))
        final = subpartition_file(inner, k)
        _write_file(fs, final, part)
        if isinstance(fs, pafs.LocalFileSystem):
            _LOCAL.keep(final, part)


class _LocalPartitions:
    """The subpartitions this process wrote in memory lately, kept as Arrow tables for a consumer
    in the same TaskManager (Flink's local input channel): it reads them from here instead of
    the file. An entry counts only while its file is the very file written (same inode, mtime
    and size: a file written again is a new inode); the file stays the truth. Least recently
    used entries go beyond LOCAL_BYTES in all; a table larger than LOCAL_TABLE_BYTES is not kept.
    Thread-safe: a TaskManager's tasks run in threads of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: collections.OrderedDict[str, tuple[tuple[int, int, int], pa.Table]] = collections.OrderedDict()
        self._bytes = 0

    def keep(self, path: str, table: pa.Table) -> None:
        if table.nbytes > LOCAL_TABLE_BYTES:
            return
        try:
            signature = _signature(path)
        except OSError:
            return
        with self._lock:
            self._drop(path)
            self._tables[path] = (signature, table)
            self._bytes += table.nbytes
            while self._bytes > LOCAL_BYTES:
                self._drop(next(iter(self._tables)))

    def tables(self, paths: list[str]) -> list[pa.Table] | None:
        """The tables of these files (local paths), or None unless every one is kept and current."""
        with self._lock:
            found = [self._tables.get(p) for p in paths]
        if any(f is None for f in found):
            return None
        for path, (signature, _) in zip(paths, found):  # type: ignore[misc]
            try:
                if _signature(path) != signature:
                    return None
            except OSError:
                return None
        with self._lock:
            for path in paths:
                if path in self._tables:
                    self._tables.move_to_end(path)
        return [table for _, table in found]  # type: ignore[misc]

    def _drop(self, path: str) -> None:
        gone = self._tables.pop(path, None)
        if gone is not None:
            self._bytes -= gone[1].nbytes


def _signature(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


# What a TaskManager keeps of the partitions it wrote in memory, for its own consumers.
LOCAL_BYTES = 64 * 1024 * 1024
LOCAL_TABLE_BYTES = 8 * 1024 * 1024
_LOCAL = _LocalPartitions()


def local_table(files: list[str]) -> pa.Table | None:
    """The rows of subpartition files (`in_memory_files`' paths) as one Arrow table, when this
    process wrote every one and still keeps it unchanged; None otherwise (read the files then)."""
    inner = []
    for path in files:
        fs, p = _filesystem(path)
        if not isinstance(fs, pafs.LocalFileSystem):
            return None
        inner.append(p)
    tables = _LOCAL.tables(inner)
    if tables is None:
        return None
    try:
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    except pa.ArrowInvalid:  # producers whose Arrow schemas differ: Spark's reader reconciles them
        return None


def read_table(files: list[str]) -> pa.Table | None:
    """The rows of subpartition files (`in_memory_files`' paths) as one Arrow table of one chunk,
    in the files' order: from this process's memory when it wrote them all (`local_table`), else
    read with pyarrow. A consumer thus gets the same rows in the same order whether its producer
    ran beside it or not, and a restarted consumer the order the first one got (Spark's reader
    orders files by size). One chunk: PySpark's createDataFrame drops the rows that follow an
    empty record batch, and the subpartition of a producer that had none for it is one. None when
    pyarrow cannot read the files or they do not concatenate (producers whose Arrow schemas
    differ): Spark's reader takes them then."""
    table = local_table(files)
    if table is None:
        tables = []
        try:
            for path in files:
                fs, inner = _filesystem(path)
                with fs.open_input_file(inner) as f:
                    tables.append(pq.read_table(f))
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        except (pa.ArrowInvalid, NotImplementedError):
            return None
    return table.combine_chunks()


def write_table_file(directory: str, table: pa.Table, name: str, **parquet: Any) -> None:
    """`table` as the one Parquet file `name` of `directory` (`parquet`: pq.write_table's options),
    whatever the directory held before (written under a hidden temporary name, then renamed)."""
    fs, inner = _filesystem(directory)
    fs.create_dir(inner, recursive=True)
    fs.delete_dir_contents(inner, missing_dir_ok=True)
    _write_file(fs, posixpath.join(inner, name), table, **parquet)


def _write_file(fs: pafs.FileSystem, final: str, table: pa.Table, **parquet: Any) -> None:
    """`table` as the Parquet file `final`, written under a hidden temporary name beside it and
    renamed, so that a reader never sees half a file."""
    temporary = posixpath.join(posixpath.dirname(final), f".{uuid.uuid4().hex}.tmp")
    with fs.open_output_stream(temporary) as out:
        pq.write_table(table, out, **parquet)
    fs.move(temporary, final)


def in_memory_files(directory: str, subpartition: int | None) -> list[str] | None:
    """The files of one subpartition (None: every subpartition) of a partition written in memory,
    or None if the partition was written by Spark's writer. Raises if the directory is missing,
    or if it was written in memory but lacks the subpartition asked for."""
    fs, inner = _filesystem(directory)
    try:
        names = [posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(inner, recursive=False))]
    except FileNotFoundError:
        raise FileNotFoundError(f"result partition {directory} is missing (its producer reported it written)") from None
    written = sorted(n for n in names if n.startswith(_PREFIX) and n.endswith(_SUFFIX))
    if not written:
        return None
    base = directory.rstrip("/")
    if subpartition is None:
        return [posixpath.join(base, n) for n in written]
    wanted = f"{_PREFIX}{subpartition}{_SUFFIX}"
    if wanted not in written:
        raise FileNotFoundError(f"result partition {directory} has no subpartition {subpartition} "
                                f"(it holds {', '.join(written)})")
    return [posixpath.join(base, wanted)]


def file_bytes(paths: list[str]) -> int:
    """The total size of these files and of the files directly inside these directories (an
    estimate of what reading them brings in); what cannot be found counts 0."""
    total = 0
    for path in paths:
        try:
            fs, inner = _filesystem(path)
            info = fs.get_file_info(inner)
            if info.type == pafs.FileType.Directory:
                total += sum(i.size or 0 for i in fs.get_file_info(pafs.FileSelector(inner, recursive=True))
                             if i.type == pafs.FileType.File)
            elif info.type == pafs.FileType.File:
                total += info.size or 0
        except (OSError, ValueError):
            continue
    return total
