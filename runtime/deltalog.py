"""Reading Delta tables' logs through the `deltalake` package (delta-rs): a table at a version or
as of a time, its snapshot's data files, the commits of a range of versions. The JobManager
(planning, submit checks, commits) and the TaskManagers (reading a batch's files) both stand on
it; what the actions mean is `funke.common.streaming.sources.delta`'s (pure).

Blocking file I/O on local paths (and file:// URIs): callers on an event loop run it in an
executor. Every failure is a `DeltaTableError` (a ValueError) naming the table.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa

from funke.common.graph.streamingjob import local_path
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.delta import (
    Commit,
    DataFile,
    DeltaStreamSource,
    added_files,
    parse_commit,
    parse_timestamp,
    read_problem,
    relative_path,
    version_at,
)

LOG = "_delta_log"


class DeltaTableError(ValueError):
    """A Delta table cannot be read as asked."""


def table_dir(path: str) -> str:
    """The local directory of a table given as a path or a file:// URI."""
    return os.path.abspath(local_path(path))


def is_table(path: str) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(table_dir(path))


def open_table(path: str, version: int | None = None) -> Any:
    """The table at `version` (None: its newest)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    where = table_dir(path)
    if not os.path.isdir(os.path.join(where, LOG)):
        raise DeltaTableError(f"{path} is not a Delta table (it has no {LOG} directory)")
    try:
        return DeltaTable(where, version=version)
    except DeltaError as exc:
        at = f" at version {version}" if version is not None else ""
        raise DeltaTableError(f"the Delta table {path} cannot be read{at}: {str(exc).strip()[:500]}") from None


def latest_version(path: str) -> int | None:
    """The table's newest version (None: there is no table)."""
    if not is_table(path):
        return None
    return int(open_table(path).version())


def resolve_version(path: str, version: int | None, timestamp: str | None) -> int:
    """The version a read of the table means: `version`, or the newest committed at or before
    `timestamp`, or (neither) the newest now."""
    if version is not None:
        return int(version)
    table = open_table(path)
    if timestamp is None:
        return int(table.version())
    history = [(int(h["version"]), int(h["timestamp"])) for h in table.history() if "version" in h]
    try:
        return version_at(history, parse_timestamp(timestamp))
    except ValueError as exc:
        raise DeltaTableError(f"the Delta table {path}: {exc}") from None


def schema_json(table: Any) -> dict:
    """The table's schema in Delta's JSON form (Spark's StructType JSON), parsed."""
    return json.loads(table.schema().to_json())


def partition_columns(table: Any) -> list[str]:
    return list(table.metadata().partition_columns)


def problem(table: Any) -> str | None:
    """Why funke cannot read this version of the table (None: it can)."""
    features = table.protocol().reader_features or []
    dvs = 0
    if "deletionVectors" in features:
        dvs = pa.table(table.deletion_vectors()).num_rows
    return read_problem(features, table.metadata().configuration, dvs)


def check_readable(path: str, table: Any) -> None:
    found = problem(table)
    if found is not None:
        raise DeltaTableError(f"the Delta table {path} (version {table.version()}) cannot be read: {found}")


def snapshot_files(path: str, table: Any) -> list[DataFile]:
    """Every data file of the table's version, by path (refused if funke cannot read it)."""
    check_readable(path, table)
    actions = pa.table(table.get_add_actions(flatten=False))
    names = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    records = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * len(names)
    values = actions.column("partition").to_pylist() if "partition" in actions.column_names else [None] * len(names)
    try:
        files = [DataFile(relative_path(n), tuple(sorted((v or {}).items())), int(s or 0), r)
                 for n, s, r, v in zip(names, sizes, records, values)]
    except ValueError as exc:
        raise DeltaTableError(f"the Delta table {path}: {exc}") from None
    return sorted(files, key=lambda f: f.path)


def read_commit(path: str, version: int) -> Commit:
    """One version's commit, from its file in the log."""
    name = os.path.join(table_dir(path), LOG, f"{version:020d}.json")
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise DeltaTableError(f"the Delta table {path}: the commit of version {version} is not in its log (removed "
                              "by log retention, or the table was replaced); a stream cannot read it") from None
    try:
        return parse_commit(version, text)
    except ValueError as exc:
        raise DeltaTableError(f"the Delta table {path}: {exc}") from None


def range_files(path: str, source_range: SourceRange) -> tuple[list[DataFile], dict, list[str]]:
    """What a stream's range reads: its data files, the schema they are read with, and the
    table's partition columns. The query's first batch reads the snapshot at the range's end;
    a later one the files its commits add (refused if one of them cannot be streamed)."""
    if source_range.end is None:
        return [], {}, []
    versions = DeltaStreamSource.versions(source_range)
    if versions is None:
        table = open_table(path, int(source_range.end))
        return snapshot_files(path, table), schema_json(table), partition_columns(table)
    table = open_table(path, versions.start - 1)
    schema = schema_json(table)
    commits = [read_commit(path, v) for v in versions]
    try:
        files = added_files(commits, schema)
    except ValueError as exc:
        raise DeltaTableError(f"the Delta table {path}: {exc}") from None
    found = read_problem(table.protocol().reader_features, table.metadata().configuration, 0)
    if found is not None:
        raise DeltaTableError(f"the Delta table {path} cannot be read: {found}")
    return files, schema, partition_columns(table)
