"""Sink commits, collected results, and clean-up of what an ended job left behind.

Blocking file I/O through pyarrow.fs (local paths, file://, hdfs://, s3://...): the JobMaster calls
these from executor threads, never on its event loop.

A file sink's subtasks write into hidden staging directories beside the target (see
`funke.common.layout`). When every task FINISHED, `commit_outputs` assembles the files of the
finished attempts under deterministic names (`part-<subtask>-<n><ext>`, so a rerun after failures
produces the same file set) and renames the assembled directory onto the target. A failed or
cancelled job never reaches the rename, and `cleanup_job` removes its staging.
"""

from __future__ import annotations

import io
import os
from collections import defaultdict
from pathlib import PurePosixPath
from typing import Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from funke.common import layout
from funke.common.scheduler import SinkCommit


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        uri = os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def _exists(fs: pafs.FileSystem, path: str) -> pafs.FileType:
    return fs.get_file_info(path).type


def _data_files(fs: pafs.FileSystem, directory: str) -> list[str]:
    """Files a reader would see: Spark's markers (_SUCCESS), checksums and hidden files excluded."""
    if _exists(fs, directory) is not pafs.FileType.Directory:
        return []
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=False))
    names = [i.path for i in infos if i.type is pafs.FileType.File]
    return sorted(p for p in names if not PurePosixPath(p).name.startswith(("_", ".")))


def _remove(fs: pafs.FileSystem, path: str) -> None:
    kind = _exists(fs, path)
    if kind is pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind is pafs.FileType.File:
        fs.delete_file(path)


def commit_outputs(data_dir: str, job_id: str, sinks: Sequence[SinkCommit]) -> None:
    """Make each sink's output visible at its target, or raise without touching the target."""
    by_vertex: dict[str, list[SinkCommit]] = defaultdict(list)
    for sink in sinks:
        by_vertex[sink.vertex_id].append(sink)
    for vertex_id, subtasks in sorted(by_vertex.items()):
        first = subtasks[0]
        config = dict(first.config)
        target = layout.sink_target(data_dir, job_id, vertex_id, first.kind, config)
        _commit_one(target, job_id, sorted(subtasks, key=lambda s: s.subtask_index), config.get("mode", "error"))


def _commit_one(target: str, job_id: str, subtasks: list[SinkCommit], mode: str) -> None:
    fs, target_path = filesystem(target)
    root = filesystem(layout.staging_root(target, job_id))[1]
    assembled = filesystem(layout.commit_dir(target, job_id))[1]
    _remove(fs, assembled)  # a previous commit attempt that did not finish
    fs.create_dir(assembled)
    for sink in subtasks:
        staged = filesystem(layout.sink_staging_dir(target, job_id, sink.subtask_index, sink.attempt_number))[1]
        for n, path in enumerate(_data_files(fs, staged)):
            suffix = "".join(PurePosixPath(path).suffixes)
            fs.move(path, f"{assembled}/part-{sink.subtask_index:05d}-{n:03d}{suffix}")
    existing = _exists(fs, target_path)
    if existing is not pafs.FileType.NotFound:
        if mode == "overwrite":
            _remove(fs, target_path)
        elif existing is pafs.FileType.Directory and not fs.get_file_info(pafs.FileSelector(target_path)):
            fs.delete_dir(target_path)  # an empty directory is not output worth protecting
        else:
            raise FileExistsError(f"sink target {target} already exists (use mode='overwrite' to replace it)")
    parent = str(PurePosixPath(target_path).parent)
    fs.create_dir(parent, recursive=True)
    fs.move(assembled, target_path)
    _remove(fs, root)


def read_collected(data_dir: str, job_id: str, vertex_id: str) -> tuple[bytes, int]:
    """A collect sink's committed rows as one Arrow IPC stream, and their number."""
    fs, path = filesystem(layout.collect_dir(data_dir, job_id, vertex_id))
    files = _data_files(fs, path)
    tables = [pq.read_table(f, filesystem=fs) for f in files]
    tables = [t for t in tables if t.num_columns]
    table = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue(), table.num_rows


def cleanup_job(data_dir: str, job_id: str, sink_targets: Sequence[str], keep_collected: bool) -> None:
    """Remove the job's result partitions and any sink staging; collected rows stay only for a
    FINISHED job (the client fetches them)."""
    fs, partitions = filesystem(layout.partitions_dir(data_dir, job_id))
    _remove(fs, partitions)
    for target in sink_targets:
        sfs, root = filesystem(layout.staging_root(target, job_id))
        _remove(sfs, root)
    if not keep_collected:
        cfs, job_root = filesystem(layout.job_dir(data_dir, job_id))
        _remove(cfs, job_root)
