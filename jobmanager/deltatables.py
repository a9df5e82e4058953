"""Delta tables on the JobManager: what a job's Delta sources and sinks need checked at submit,
the version a bounded read is pinned to, and the commit of what a Delta sink's subtasks staged.

A Delta sink's subtasks write Parquet files (Spark, timestamps as microseconds) into staging
directories: beside the table for a bounded job (`layout.sink_staging_dir`, committed once the
job FINISHED), inside it for a streaming query (`layout.stream_sink_staging_dir`, one commit
per batch). The commit is one Delta transaction that adds the files and records a transaction
identifier (Delta's SetTransaction: application id and version; a streaming query's id and the
batch id, a bounded job `funke-job-<job id>` and 0):

1. If the table's recorded version for the application id is the version or later, the commit
   was made: nothing to do (a batch run again after a failure between the Delta commit and the
   query's commit log entry adds nothing).
2. The staged files with rows get deterministic names in the table's directory
   (`part-<version>-<application digest>-<subtask>-<n>.parquet`): a hard link each (a copy where
   links are not possible), after removing what an interrupted commit of the same transaction
   left under those names; the staged files stay until the commit is made, so an interrupted
   commit can be made again from them.
3. One transaction adds them with the transaction identifier (mode overwrite: and removes every
   file the table had), creating the table if there is none. The Delta log's commit is the
   commit point.
4. The staging goes.

The rows written must have the table's column names and types (nullability aside); the table
must be unpartitioned and without column mapping. Blocking file I/O: called from executor
threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from funke.common import ids, layout
from funke.common.graph.jobgraph import JobGraph
from funke.common.graph.validation import MAX_VERTICES, Problem, ValidationContext, path_problem, q
from funke.common.streaming.sources.delta import (
    DELTA_MODES,
    DELTA_SINK,
    DELTA_SOURCE,
    DELTA_STREAM,
    config_problems,
    parse_timestamp,
    schema_difference,
    write_problem,
)
from funke.jobmanager.streamsinks import SinkCommitError
from funke.runtime import deltalog


def uses_delta(job: JobGraph) -> bool:
    return any(op.kind in (DELTA_SOURCE, DELTA_STREAM, DELTA_SINK) for v in job.vertices[:MAX_VERTICES]
               for op in v.operators)


def _delta_operators(job: JobGraph):
    for v in job.vertices[:MAX_VERTICES]:
        for i, op in enumerate(v.operators):
            if op.kind in (DELTA_SOURCE, DELTA_STREAM, DELTA_SINK) and isinstance(op.config, Mapping):
                yield v, i, op


def submit_problems(job: JobGraph, context: ValidationContext | None) -> list[Problem]:
    """What only the tables show, for a graph that passed validation: a source whose path is not
    a Delta table, or one funke cannot read (column mapping, deletion vectors, unknown reader
    features), at a version or timestamp the table does not have; a sink whose target is a
    file, a directory holding other files, or a table funke cannot write into. Paths that
    validation refused are not looked at."""
    problems = []
    for v, i, op in _delta_operators(job):
        path = op.config.get("path")
        sink = op.kind == DELTA_SINK
        if (not isinstance(path, str) or path_problem(path, sink=sink, context=context) is not None
                or config_problems(op.kind, op.config) or not _valid(op.config)):
            continue  # validation said why
        where = f"operator {i} {q(op.display_name)} ({op.kind}): config 'path' {ids.echo(path, 300)}"
        try:
            problem = _sink_problem(path, str(op.config.get("mode", "append"))) if sink else _source_problem(
                path, op.config.get("version"), op.config.get("timestamp"))
        except (deltalog.DeltaTableError, OSError) as exc:
            problem = str(exc)
        except Exception as exc:  # what deltalake says of a table it cannot read is the user's to see
            problem = f"cannot be read as a Delta table: {ids.echo(str(exc), 500)}"
        if problem is not None:
            problems.append(Problem(f"vertex {q(v.id)}", f"{where}: {problem}"))
    return problems


def _valid(config: Mapping[str, Any]) -> bool:
    """The keys a table is looked at with hold what validation allows."""
    version, timestamp, mode = config.get("version"), config.get("timestamp"), config.get("mode", "append")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        return False
    if timestamp is not None:
        try:
            parse_timestamp(timestamp)
        except ValueError:
            return False
    return mode in DELTA_MODES


def _source_problem(path: str, version: Any, timestamp: Any) -> str | None:
    if not deltalog.is_table(path):
        return "is not a Delta table (no _delta_log directory there)"
    at = deltalog.resolve_version(path, version, timestamp)
    deltalog.check_readable(path, deltalog.open_table(path, at))
    return None


def _sink_problem(path: str, mode: str) -> str | None:
    where = deltalog.table_dir(path)
    if not os.path.lexists(where):
        return None
    if not os.path.isdir(where):
        return "is not a directory; a Delta table is one"
    if deltalog.is_table(path):
        table = deltalog.open_table(path)
        problem = write_problem(table.metadata().configuration, deltalog.partition_columns(table), mode)
        return None if problem is None else f"is a Delta table funke cannot write into: {problem}"
    visible = sorted(n for n in os.listdir(where) if not n.startswith((".", "_")))
    if visible:
        return (f"holds {len(visible)} file(s) ({', '.join(repr(n) for n in visible[:3])}) and is not a Delta table; "
                "write into a Delta table, an empty directory or a new one")
    return None


def job_commit_problem(path: str, mode: str) -> str | None:
    """What keeps a bounded job's Delta sink from committing now (its target checked again: the
    table may have changed since the job was submitted)."""
    problem = _sink_problem(path, mode)
    return None if problem is None else f"the Delta sink's target {path} {problem}"


def pin_versions(job: JobGraph) -> JobGraph:
    """The graph with each bounded Delta read that names no version or timestamp pinned to the
    table's version now, so that every subtask, and every attempt after a failure, reads the
    same files (Flink's bounded source does so in its enumerator). The same graph when none."""
    changed = False
    vertices = []
    for v in job.vertices:
        ops = list(v.operators)
        for i, op in enumerate(ops):
            if op.kind == DELTA_SOURCE and op.config.get("version") is None and op.config.get("timestamp") is None:
                try:
                    version = deltalog.latest_version(str(op.config["path"]))
                except Exception as exc:  # deltalake's own errors too
                    raise ValueError(f"the Delta table {op.config['path']} cannot be read: {exc}") from None
                if version is not None:
                    ops[i] = dataclasses.replace(op, config={**op.config, "version": version})
                    changed = True
        vertices.append(dataclasses.replace(v, operators=tuple(ops)))
    return dataclasses.replace(job, vertices=tuple(vertices)) if changed else job


# ---------------------------------------------------------------------------- commits


def job_app_id(job_id: str) -> str:
    """A bounded job's transaction identifier (its version is 0: it commits once)."""
    return f"funke-job-{job_id}"


def commit_job(target: str, job_id: str, subtasks: Mapping[int, int], mode: str) -> int | None:
    """A bounded job's Delta sink: its finished attempts' staged files (`subtasks`: subtask ->
    attempt) in one transaction. Returns the files added (None: committed before)."""
    where = deltalog.table_dir(target)  # where the TaskManagers staged (a file:// URI as a path)
    staged = {s: layout.sink_staging_dir(where, job_id, s, a) for s, a in subtasks.items()}
    return commit(target, job_app_id(job_id), 0, staged, mode)


def commit_stream_batch(target: str, query_id: str, job_id: str, batch_id: int, attempts: Mapping[int, int],
                        mode: str) -> int | None:
    """A streaming query's batch into a Delta sink (idempotent by the query's id and the batch
    id), from what job `job_id`'s attempts staged. Returns the files added (None: committed
    before)."""
    where = deltalog.table_dir(target)
    staged = {s: layout.stream_sink_staging_dir(where, job_id, batch_id, s, a) for s, a in attempts.items()}
    added = commit(target, query_id, batch_id, staged, mode)
    shutil.rmtree(os.path.join(layout.stream_staging_root(where, job_id), str(batch_id)), ignore_errors=True)
    return added


def commit(target: str, app_id: str, version: int, staged: Mapping[int, str], mode: str) -> int | None:
    """Steps 1-3 of the module's commit: the staged files (subtask -> its directory) into the
    table in one transaction recording (`app_id`, `version`). None: the table had recorded it."""
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.transaction import AddAction, create_table_with_add_actions

    if mode not in ("append", "overwrite"):
        raise ValueError(f"a Delta sink's mode is append or overwrite, got {mode!r}")
    where = deltalog.table_dir(target)
    table = deltalog.open_table(target) if deltalog.is_table(target) else None
    if table is not None:
        done = table.transaction_version(app_id)
        if done is not None and int(done) >= version:
            return None
    files = _staged_files(staged)
    schema = _schema_of(files, table, target)
    if table is not None:
        problem = write_problem(table.metadata().configuration, deltalog.partition_columns(table), mode)
        if problem is not None:
            raise SinkCommitError(f"the Delta table {target} cannot be written: {problem}")
        difference = schema_difference(deltalog.schema_json(table), json.loads(Schema.from_arrow(schema).to_json()))
        if difference is not None:
            raise SinkCommitError(f"the rows to write into the Delta table {target} do not fit its schema: "
                                  f"{difference}; nothing was written")
    prefix = f"part-{version:05d}-{hashlib.sha256(app_id.encode()).hexdigest()[:16]}-"
    os.makedirs(where, exist_ok=True)
    for stale in [n for n in os.listdir(where) if n.startswith(prefix)]:  # an interrupted commit's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(where, stale))
    adds = []
    for subtask, n, source, rows in files:
        if not rows:
            continue
        name = f"{prefix}{subtask:05d}-{n:03d}.parquet"
        _place(source, os.path.join(where, name))
        st = os.stat(os.path.join(where, name))
        adds.append(AddAction(name, st.st_size, {}, st.st_mtime_ns // 1_000_000, True,
                              json.dumps({"numRecords": rows})))
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)])
    if table is None:
        create_table_with_add_actions(where, Schema.from_arrow(schema), adds, mode="append",
                                      commit_properties=properties)
    else:
        table.create_write_transaction(adds, mode, table.schema(), commit_properties=properties)
    return len(adds)


def _staged_files(staged: Mapping[int, str]) -> list[tuple[int, int, str, int]]:
    """(subtask, n, file, rows) of every staged data file, in subtask order."""
    out = []
    for subtask, directory in sorted(staged.items()):
        if not os.path.isdir(directory):
            raise SinkCommitError(f"subtask {subtask} staged nothing in {directory}")
        names = sorted(n for n in os.listdir(directory) if not n.startswith((".", "_")))
        for n, name in enumerate(names):
            path = os.path.join(directory, name)
            out.append((subtask, n, path, pq.read_metadata(path).num_rows))
    return out


def _schema_of(files: list[tuple[int, int, str, int]], table: Any, target: str) -> pa.Schema:
    """The schema of the staged files (every column nullable, as tables made by Spark's Delta
    writer have), or the table's when nothing was staged."""
    schemas = {pa.schema([f.with_nullable(True) for f in pq.read_schema(path).remove_metadata()])
               for _, _, path, _ in files}
    if len(schemas) > 1:
        raise SinkCommitError(f"the files staged for the Delta table {target} differ in schema")
    if not schemas:
        if table is None:
            raise SinkCommitError(f"nothing was staged for the Delta table {target}: its schema is unknown")
        return pa.schema(table.schema().to_arrow())
    (schema,) = schemas
    return schema


def _place(source: str, final: str) -> None:
    """`final` as another name of `source` (a copy where hard links are not possible)."""
    try:
        os.link(source, final)
    except OSError:
        shutil.copyfile(source, final)
