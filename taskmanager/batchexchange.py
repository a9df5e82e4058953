"""A streaming query's exchanges: how a micro-batch's result partitions are written and found.

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

A partition counts as written only once its producer reported it; a file of it that is not
there is an error, never an empty input.
"""

from __future__ import annotations

import posixpath
import uuid

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
        temporary = posixpath.join(inner, f".{uuid.uuid4().hex}.tmp")
        with fs.open_output_stream(temporary) as out:
            pq.write_table(part, out)
        fs.move(temporary, final)


def in_memory_files(directory: str, subpartition: int | None) -> list[str] | None:
    """The files of one subpartition (None: every subpartition) of a partition written in memory,
    or None if the partition was written by Spark's writer. Raises if the directory is missing,
    or if it was written in memory but lacks the subpartition asked for."""
    fs, inner = _filesystem(directory)
    try:
        names = [posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(inner, recursive=False))]
    except FileNotFoundError:
        raise FileNotFoundError(f"batch partition {directory} is missing (its producer reported it written)") from None
    written = sorted(n for n in names if n.startswith(_PREFIX) and n.endswith(_SUFFIX))
    if not written:
        return None
    base = directory.rstrip("/")
    if subpartition is None:
        return [posixpath.join(base, n) for n in written]
    wanted = f"{_PREFIX}{subpartition}{_SUFFIX}"
    if wanted not in written:
        raise FileNotFoundError(f"batch partition {directory} has no subpartition {subpartition} "
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
