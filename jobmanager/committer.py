"""Sink commits, collected results, and clean-up of what an ended job left behind.

Blocking file I/O through pyarrow.fs (local paths, file://, hdfs://, s3://...): the JobMaster calls
these from executor threads, never on its event loop.

A file sink's subtasks write into hidden staging directories beside the target (see
`funke.common.layout`). When every task FINISHED, `commit_outputs` assembles the files of the
finished attempts under deterministic names (`part-<subtask>-<n><ext>`, so a rerun after failures
produces the same file set) and renames the assembled directory onto the target. A failed or
cancelled job never reaches the rename, and `cleanup_job` removes its staging.

The staging root keeps a marker (`committed`, naming the job) from the moment a commit passed
its checks until the job's clean-up: a job recovered by a new leader after its commit but before
its end was recorded commits again, and the marker lets that second commit replace the job's own
output (same files, same names) instead of failing on a taken target. The target itself holds
only the part files.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import PurePosixPath
from typing import Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from funke.common import layout
from funke.common.graph.jobgraph import JobGraph
from funke.common.graph.operators import CATALOGUE
from funke.common.scheduling.scheduler import SinkCommit
from funke.common.streaming.sources.delta import DELTA_SINK
from funke.common.streaming.kafkasink import KAFKA_SINK
from funke.jobmanager import deltatables, kafkasink
from funke.runtime import datafs


COMMIT_MARKER = "committed"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    return datafs.filesystem(uri)


def exists(uri: str) -> bool:
    """Whether a directory or file is at `uri` (a path or any URI pyarrow knows)."""
    fs, path = filesystem(uri)
    return _exists(fs, path) is not pafs.FileType.NotFound


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


def sink_targets(data_dir: str, job_id: str, job: JobGraph) -> list[str]:
    """Where the job's committing sinks publish their output."""
    targets = []
    for v in job.vertices:
        tail = v.operators[-1] if v.operators else None
        entry = CATALOGUE.get(tail.kind) if tail is not None else None
        if tail is not None and entry is not None and entry.commits_output:
            targets.append(layout.sink_target(data_dir, job_id, v.id, tail.kind, dict(tail.config)))
    return targets


def commit_outputs(data_dir: str, job_id: str, sinks: Sequence[SinkCommit]) -> None:
    """Make every sink's output visible at its target, or raise having changed no target.

    Three phases, so that one sink's problem never leaves another's output half-applied:
    check every target (a taken one in mode 'error', or two sinks writing into the same place,
    refuse the commit before anything moves), assemble every sink's files inside its hidden
    staging directory, then publish each with a rename (mode 'overwrite' first renames the old
    output aside, so a reader sees the old output, then for a moment none, then the new one,
    never a mix). If a publishing rename fails, the sinks published so far are rolled back
    (old outputs renamed back) before the error is raised. Delta sinks are checked with the
    others and committed last, one Delta transaction each (`funke.jobmanager.deltatables`); a
    failed one rolls the published file sinks back too. Kafka sinks come after them, one Kafka
    transaction each (`funke.jobmanager.kafkasink`): a failed one rolls the file sinks back (a
    Delta or Kafka transaction that committed stays)."""
    deltas: dict[str, list[SinkCommit]] = defaultdict(list)
    kafkas: dict[str, list[SinkCommit]] = defaultdict(list)
    for sink in sinks:
        if sink.kind == DELTA_SINK:
            deltas[sink.vertex_id].append(sink)
        elif sink.kind == KAFKA_SINK:
            kafkas[sink.vertex_id].append(sink)
    sinks = [s for s in sinks if s.kind not in (DELTA_SINK, KAFKA_SINK)]
    by_vertex: dict[str, list[SinkCommit]] = defaultdict(list)
    for sink in sinks:
        by_vertex[sink.vertex_id].append(sink)
    commits = []
    for vertex_id, subtasks in sorted(by_vertex.items()):
        config = dict(subtasks[0].config)
        target = layout.sink_target(data_dir, job_id, vertex_id, subtasks[0].kind, config)
        commits.append(_SinkTarget(vertex_id, target, job_id, sorted(subtasks, key=lambda s: s.subtask_index),
                                   config.get("mode", "error")))
    problems = [f"sinks '{a.vertex_id}' and '{b.vertex_id}' both write into {a.target if a.path == b.path else b.target}"
                for i, a in enumerate(commits) for b in commits[i + 1:] if _overlap(a.path, b.path)]
    problems += [f"sink target {c.target} already exists (use mode='overwrite' to replace it, or write somewhere else)"
                 for c in commits if c.refused()]
    problems += [p for vertex_id, subtasks in sorted(deltas.items()) if (p := _delta_problem(vertex_id, subtasks))]
    if problems:
        raise FileExistsError("; ".join(problems) + "; no sink output was published")
    for c in commits:
        c.assemble()
    published: list[_SinkTarget] = []
    try:
        for c in commits:
            c.publish()
            published.append(c)
        for vertex_id, subtasks in sorted(deltas.items()):
            config = dict(subtasks[0].config)
            deltatables.commit_job(str(config["path"]), job_id, {s.subtask_index: s.attempt_number for s in subtasks},
                                   str(config.get("mode", "append")))
        for vertex_id, subtasks in sorted(kafkas.items()):
            kafkasink.commit_job(data_dir, job_id, vertex_id, dict(subtasks[0].config),
                                 {s.subtask_index: s.attempt_number for s in subtasks})
    except BaseException:
        for c in reversed(published):
            c.unpublish()
        raise
    for c in commits:
        try:  # all but the marker, which stays until the job's clean-up
            for info in c.fs.get_file_info(pafs.FileSelector(c.root)):
                if PurePosixPath(info.path).name != COMMIT_MARKER:
                    _remove(c.fs, info.path)
        except OSError:  # the output is in place; clean-up at the job's end tries again
            pass


def _delta_problem(vertex_id: str, subtasks: list[SinkCommit]) -> str | None:
    """What keeps a Delta sink from committing, checked before any sink output moves."""
    config = dict(subtasks[0].config)
    try:
        problem = deltatables.job_commit_problem(str(config["path"]), config.get("mode", "append"))
    except (ValueError, OSError) as exc:
        problem = str(exc)
    return None if problem is None else f"sink '{vertex_id}': {problem}"


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


class _SinkTarget:
    """One file sink's commit: its target, its staging root and the finished attempts' files."""

    def __init__(self, vertex_id: str, target: str, job_id: str, subtasks: list[SinkCommit], mode: str) -> None:
        self.vertex_id, self.target, self.job_id, self.subtasks, self.mode = vertex_id, target, job_id, subtasks, mode
        self.fs, self.path = filesystem(target)
        self.root = filesystem(layout.staging_root(target, job_id))[1]
        self.assembled = filesystem(layout.commit_dir(target, job_id))[1]
        self.replaced = f"{self.root}/replaced"
        self.had_old = False

    def refused(self) -> bool:
        """The target holds something and the mode does not allow replacing it."""
        existing = _exists(self.fs, self.path)
        if existing is pafs.FileType.NotFound or self.mode == "overwrite" or self._own_output():
            return False
        return not (existing is pafs.FileType.Directory and not self.fs.get_file_info(pafs.FileSelector(self.path)))

    def _own_output(self) -> bool:
        """The target is this job's own earlier commit (it was recovered after committing)."""
        try:
            with self.fs.open_input_stream(f"{self.root}/{COMMIT_MARKER}") as f:
                return f.read(1000).decode(errors="replace") == self.job_id
        except (OSError, FileNotFoundError):
            return False

    def assemble(self) -> None:
        """The finished attempts' files under deterministic names (`part-<subtask>-<n><ext>`), still hidden."""
        _remove(self.fs, self.assembled)  # left by a commit of the same job id that never ended
        _remove(self.fs, self.replaced)
        self.fs.create_dir(self.assembled)
        for sink in self.subtasks:
            staged = filesystem(layout.sink_staging_dir(self.target, self.job_id, sink.subtask_index,
                                                        sink.attempt_number))[1]
            if _exists(self.fs, staged) is not pafs.FileType.Directory:
                # A finished attempt always leaves its directory (Spark writes one even for no
                # rows). Missing means this process cannot see what the TaskManager wrote; an
                # empty output in its place would publish less than was produced.
                raise FileNotFoundError(
                    f"sink '{self.vertex_id}': subtask {sink.subtask_index} attempt #{sink.attempt_number} "
                    f"finished, but its output {staged} is not there; is the data directory shared by the "
                    "JobManager and every TaskManager (same path or URI)? Nothing was published")
            for n, path in enumerate(_data_files(self.fs, staged)):
                suffix = "".join(PurePosixPath(path).suffixes)
                self.fs.move(path, f"{self.assembled}/part-{sink.subtask_index:05d}-{n:03d}{suffix}")
        # Before anything is published: the checks passed, so whatever is at the target now
        # may be replaced by this job (again, should it be recovered).
        with self.fs.open_output_stream(f"{self.root}/{COMMIT_MARKER}") as f:
            f.write(self.job_id.encode())

    def publish(self) -> None:
        if _exists(self.fs, self.path) is not pafs.FileType.NotFound:  # overwrite, or an empty directory
            self.fs.move(self.path, self.replaced)  # removed with the staging root
            self.had_old = True
        self.fs.create_dir(str(PurePosixPath(self.path).parent), recursive=True)
        try:
            self.fs.move(self.assembled, self.path)
        except BaseException:
            self._restore_old()
            raise

    def unpublish(self) -> None:
        """Undo `publish`: the new output goes back to staging, the old one (if any) returns."""
        self.fs.move(self.path, self.assembled)
        self._restore_old()

    def _restore_old(self) -> None:
        if self.had_old:
            self.fs.move(self.replaced, self.path)
            self.had_old = False


def read_collected(data_dir: str, job_id: str, vertex_id: str, *, none_committed: bool = False) -> tuple[bytes, int]:
    """A collect sink's committed rows as one Arrow IPC stream, and their number. The committed
    directory exists for every FINISHED job (empty results included; a streaming query makes it
    when it starts, before its first batch); if it is gone, so are the rows, and that is an
    error, never an empty result. `none_committed`: the caller knows that no batch of this
    streaming query was committed yet (it has not started, or found nothing new): then a missing
    directory is zero rows. Zero rows have the schema of the files committed, none if none were."""
    fs, path = filesystem(layout.collect_dir(data_dir, job_id, vertex_id))
    if _exists(fs, path) is not pafs.FileType.Directory:
        if not none_committed:
            raise FileNotFoundError(f"the collected rows of job {job_id} ({vertex_id}) are no longer in the data "
                                    f"directory ({path})")
        path = ""
    files = _data_files(fs, path) if path else []
    tables = [pq.read_table(f, filesystem=fs) for f in files]
    tables = [t for t in tables if t.num_columns]
    table = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue(), table.num_rows


def read_collected_batches(data_dir: str, job_id: str, vertex_id: str, from_batch: int,
                           max_batches: int) -> list[tuple[int, bytes, int]]:
    """A streaming query's collect sink batch by batch: (batch id, its rows as an Arrow IPC
    stream, their number) for the committed batches with an id >= `from_batch`, at most
    `max_batches`, oldest first. Only what a manifest names is read (a batch being committed is
    not there yet); no directory yet is no batch yet."""
    from funke.common.graph.streamingjob import local_path
    from funke.jobmanager import streamsinks

    target = local_path(layout.collect_dir(data_dir, job_id, vertex_id))
    out = []
    for batch_id in [b for b in streamsinks.committed_batches(target) if b >= from_batch][:max_batches]:
        tables = [pq.read_table(f"{target}/{name}") for name in streamsinks.committed_files(target, batch_id)]
        tables = [t for t in tables if t.num_columns]
        table = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out.append((batch_id, sink.getvalue(), table.num_rows))
    return out


class CleanupIncomplete(OSError):
    """Some step of a job's clean-up failed (the others ran): the clean-up is to be run again."""


def cleanup_job(data_dir: str, job_id: str, sink_targets: Sequence[str], keep_collected: bool) -> None:
    """Remove what the job left: its sinks' staging beside their targets (the commit marker
    included) and, for a streaming query, inside them (`.funke-staging-<job>`: batches staged and
    not committed; the target keeps its committed files and their manifests), and under its
    directory in the data directory its result partitions, cancel markers and Redis staging; its
    collected rows stay only for a FINISHED job (the client fetches them), and an empty job
    directory goes too. Called once the job ended for good: a query that restarts after a
    failure runs its uncommitted batches again and commits from their staging, and a query
    submitted again on the same checkpoint is another job, staging into a directory of its own.

    Idempotent, so the caller runs it again until it raises nothing (and a new leader runs it for
    a job whose clean-up a dead one did not finish): every step tolerates what is already gone,
    the TaskManagers releasing the same partitions at the same moment included, and runs whatever
    happened to the steps before it. Raises CleanupIncomplete naming every step that failed.
    Every path removed is checked to be the job's own (`layout` refuses ids that are not plain
    path components; `_remove_under` refuses a path outside its root), so no id can make this
    delete anything else."""
    failed: list[str] = []

    def step(what: str, root: str, path: str) -> None:
        try:
            _remove_under(root, path)
        except OSError as exc:
            failed.append(f"{what} {path}: {exc}")

    for target in sink_targets:
        root = layout.staging_root(target, job_id)
        step("sink staging", root.rpartition("/")[0] or ".", root)
        step("streaming sink staging", target, layout.stream_staging_root(target, job_id))
    jobs, job_dir = layout.jobs_dir(data_dir), layout.job_dir(data_dir, job_id)
    if keep_collected:
        try:
            entries = _children(job_dir)
        except OSError as exc:
            failed.append(f"listing {job_dir}: {exc}")
            entries = []
        for name in entries:
            if name != layout.COLLECTED:
                step("job data", job_dir, f"{job_dir}/{name}")
        if layout.COLLECTED not in entries and not failed:
            step("job directory", jobs, job_dir)
    else:
        step("job data", jobs, job_dir)
    if failed:
        raise CleanupIncomplete(f"{len(failed)} step(s) of job {job_id}'s clean-up failed: " + "; ".join(failed))


def _children(directory: str) -> list[str]:
    fs, path = filesystem(directory)
    if _exists(fs, path) is not pafs.FileType.Directory:
        return []
    return sorted(PurePosixPath(i.path).name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def remove_job_data(data_dir: str, job_id: str) -> None:
    """Everything the job has left in the data directory (its collected rows): the job store
    evicted it."""
    _remove_under(layout.jobs_dir(data_dir), layout.job_dir(data_dir, job_id))


def _remove_under(root: str, path: str) -> None:
    """Remove `path`, which must lie strictly below `root` (ValueError otherwise)."""
    if not layout.is_within(root, path) or layout.is_within(path, root):
        raise ValueError(f"refusing to remove {path}: it is not inside {root}")
    datafs.remove(path)
