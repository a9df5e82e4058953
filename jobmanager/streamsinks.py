"""Exactly-once file sinks for streaming jobs: each batch's output is staged by the sink's
subtasks and committed once, by the JobMaster, with a manifest that says which files the batch
made (Structured Streaming's file sink and its `_spark_metadata` log).

Owns, under a sink's target directory:

    <target>/.funke-staging-<job>/<batch>/<subtask>-<attempt>/part-*    what a subtask wrote for a batch
    <target>/batch-<batch>-<subtask>-<part name>                        a committed file
    <target>/_funke_sink_log/<batch>                                    the manifest: the batch's files

Names starting with `.` or `_` are hidden from Spark's and Hadoop's file listing, so a plain
`spark.read` of the target sees committed files and, at worst during a commit, files of the batch
being committed; a reader that wants exactly the committed batches reads the manifests
(`committed_files`).

Commit of batch N, idempotent:
1. If the manifest of N exists, N is committed: nothing to do (a batch run again after a failure
   between the sink commit and the commit log entry is not written twice).
2. Files of N left in the target by an interrupted commit are removed (they are not in any
   manifest), then the chosen attempt of every subtask has its files moved in (one rename each),
   then the manifest is written atomically. The manifest is the commit point.
   Finding such files lists the target, which holds every batch's files: a query at a 100 ms
   trigger adds 864 000 a day, and a listing per commit would make each batch slower than the
   last. So the caller says whether an interrupted commit may have left some (`leftovers`): a
   query's sink side asks for the first commit of each run and for the commit after one that
   failed (a JobManager that died mid-commit is a new run of the query).
3. The batch's staging directory goes.

A commit is fenced (`fence`, the query's hold on its checkpoint: it raises once another run of
the query took the checkpoint over) before the files move and again before the manifest, and
the manifest is created with link(), never replacing one: a JobManager woken from a pause after
its successor took the query over commits nothing. What remains is a commit paused between its
last check and its renames, which its successor's commit of the same batch (the same logged
range) may meet; see `funke.jobmanager.checkpointstore`.

The staging directory is the job's (a query stopped and submitted again on its checkpoint is
another job, which runs the uncommitted batches again into its own): a batch not committed keeps
its staged output while the job may still run it again (after a failure, its restart does), and
the job's clean-up removes the job's staging directory once the job ended for good (stopped,
finished, cancelled or failed: `committer.cleanup_job`, retried until it succeeds, and by the next
leader if this one dies first). Once nothing writes any more, the target holds only the
committed files and the manifests.

Blocking file I/O, local file systems (and file://): the JobMaster calls it from a thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Callable

from funke.common import ids, layout
from funke.runtime.hafilesystem import create_once, read_file

SINK_LOG = layout.STREAM_SINK_LOG


class SinkCommitError(Exception):
    """A batch cannot be committed as asked (missing staged output, a stranger's manifest)."""


def staging_dir(target: str, job_id: str, batch_id: int, subtask: int, attempt: int) -> str:
    """Where subtask `subtask` (attempt `attempt`) of job `job_id` writes its output of a batch."""
    _check(batch_id, subtask, attempt)
    return layout.stream_sink_staging_dir(target, job_id, batch_id, subtask, attempt)


def batch_staging(target: str, job_id: str, batch_id: int) -> str:
    """The staging directory of one batch of job `job_id` (every subtask's and attempt's)."""
    _check(batch_id, 0, 0)
    return os.path.join(layout.stream_staging_root(target, job_id), str(batch_id))


def manifest_path(target: str, batch_id: int) -> str:
    return os.path.join(target, SINK_LOG, str(batch_id))


def is_committed(target: str, batch_id: int) -> bool:
    return os.path.exists(manifest_path(target, batch_id))


def no_fence() -> None:
    """No fence: a commit outside a query's run (tests, tools)."""


def commit_batch(target: str, job_id: str, batch_id: int, attempts: dict[int, int], *, leftovers: bool = True,
                 fence: Callable[[], None] = no_fence) -> list[str]:
    """Commit batch `batch_id` of a sink with the staged output of `attempts` (subtask → the
    attempt of job `job_id` whose output counts). Returns the committed files' names (those already committed,
    if it was). `leftovers` False: no commit of this target was interrupted since the caller's
    last successful one, so the target is not listed for an interrupted commit's files. `fence`
    raises if the caller may not commit any more (its run was taken over)."""
    for subtask, attempt in attempts.items():
        _check(batch_id, subtask, attempt)
    fence()
    if is_committed(target, batch_id):  # what a run of it again staged is not needed
        shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)
        return committed_files(target, batch_id)
    prefix = f"batch-{batch_id}-"
    for stale in [n for n in _names(target) if n.startswith(prefix)] if leftovers else ():  # an interrupted commit's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(target, stale))
    staged: list[tuple[str, str]] = []
    for subtask, attempt in sorted(attempts.items()):
        directory = staging_dir(target, job_id, batch_id, subtask, attempt)
        if not os.path.isdir(directory):
            raise SinkCommitError(f"batch {batch_id}: subtask {subtask} attempt {attempt} staged nothing in {directory}")
        for name in sorted(_names(directory)):
            if name.startswith((".", "_")):  # Spark's _SUCCESS and checksum files
                continue
            staged.append((os.path.join(directory, name), f"{prefix}{subtask}-{name}"))
    fence()
    for source, final in staged:
        os.replace(source, os.path.join(target, final))
    names = [final for _, final in staged]
    os.makedirs(os.path.join(target, SINK_LOG), exist_ok=True)
    fence()
    if not create_once(manifest_path(target, batch_id), json.dumps({"batchId": batch_id, "files": names}).encode()):
        return committed_files(target, batch_id)  # committed meanwhile by another run: its manifest stands
    shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)
    return names


def committed_files(target: str, batch_id: int) -> list[str]:
    data = read_file(manifest_path(target, batch_id))
    if data is None:
        return []
    try:
        raw = json.loads(data)
        files = [str(f) for f in raw["files"]]
        if int(raw["batchId"]) != batch_id:
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise SinkCommitError(f"{manifest_path(target, batch_id)} is not a funke sink manifest") from None
    return files


def committed_batches(target: str) -> list[int]:
    return sorted(int(n) for n in _names(os.path.join(target, SINK_LOG)) if n.isascii() and n.isdigit())


def discard_batch(target: str, job_id: str, batch_id: int) -> None:
    """Drop a batch's staged output (a batch cancelled before its commit)."""
    shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)


def _check(batch_id: int, subtask: int, attempt: int) -> None:
    for value, what in ((batch_id, "batch id"), (subtask, "subtask index"), (attempt, "attempt number")):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
            raise ValueError(f"{what} must be a non-negative integer, got {ids.echo(value)}")


def _names(directory: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
