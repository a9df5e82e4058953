"""What a task read and wrote, measured from the result partitions themselves: rows from the
Parquet footers of the files it consumed (its subpartition of each producer's partition) and
produced, bytes from their sizes. Nothing is read but footers and directory listings, so the
cost is a few milliseconds per task, on the task's own thread after it finished; a partition
that cannot be measured counts 0 rather than failing a task that succeeded. `file_rows` counts
the rows of given Parquet files the same way (a source's files, `recordcounts`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from funke.common import layout
from funke.runtime import datafs
from funke.taskmanager import batchexchange

log = logging.getLogger("funke.taskmanager")


def _parquet_files(root: str, subpartition: int | None) -> list[tuple[pafs.FileSystem, pafs.FileInfo]]:
    """The Parquet files of a partition directory; with `subpartition`, only that one's (a
    partition written unsplit is subpartition 0 of itself): under `_sub=<k>/` as Spark's writer
    splits a partition, or `sub-<k>.parquet` as one written in memory is."""
    fs, path = datafs.filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    prefix = f"{layout.SUBPARTITION_COLUMN}="
    found = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        parents = info.path[len(path):].strip("/").split("/")[:-1]
        sub = next((int(p[len(prefix):]) for p in parents if p.startswith(prefix) and p[len(prefix):].isdigit()), None)
        if sub is None and not parents:  # written in memory: one file per subpartition
            sub = batchexchange.subpartition_of_file(info.base_name)
        if subpartition is None or sub == subpartition or (sub is None and subpartition == 0):
            found.append((fs, info))
    return found


def records_and_bytes(partitions: Iterable[tuple[str, int | None]]) -> tuple[int, int]:
    """(rows, bytes) of the given partition directories (each with the subpartition read of it,
    None: all of it)."""
    rows = size = 0
    for root, subpartition in partitions:
        try:
            for fs, info in _parquet_files(root, subpartition):
                size += info.size or 0
                with fs.open_input_file(info.path) as f:
                    rows += pq.ParquetFile(f).metadata.num_rows
        except (OSError, ValueError) as exc:  # gone, unreadable, not Parquet: not worth a failure
            log.debug("could not measure %s: %s", root, exc)
    return rows, size


def file_rows(paths: Iterable[str]) -> int | None:
    """The rows of these Parquet files, from their footers; None when one cannot be read (gone,
    not Parquet, a filesystem pyarrow cannot reach): a count that would be wrong is not given."""
    rows = 0
    try:
        for path in paths:
            if path.startswith("file:"):  # Spark's file:/a%20b (Hadoop's form, escaped)
                path = unquote(urlparse(path).path)
            fs, inner = datafs.filesystem(path)
            with fs.open_input_file(inner) as f:
                rows += pq.ParquetFile(f).metadata.num_rows
    except (OSError, ValueError, NotImplementedError) as exc:
        log.debug("could not count the rows of %s: %s", path, exc)
        return None
    return rows
