"""Where a job's files live: result partitions, sink staging, collected results.

Owns the path scheme shared by TaskManagers (who write) and the JobManager (who names attempts to
read, commits and cleans up). Paths are strings joined with "/" so that any Spark-supported URI
works as the data directory (file:///, hdfs://, s3a://...).

    {data_dir}/jobs/{job}/partitions/{data set}/p{index}/a{attempt}/   one producer attempt's partition;
                                                                       subpartitions as `_sub=N/` dirs
    {data_dir}/jobs/{job}/collect/{sink vertex}                        a collect sink's committed rows
    {data_dir}/jobs/{job}/cancelled/{vertex}-s{subtask}-a{attempt}     marks a cancelled attempt for
                                                                       its Python workers
    {data_dir}/jobs/{job}/redis/{sink vertex}, .../kafka/{sink vertex}  a Redis or Kafka sink's staged
                                                                       rows (as a streaming sink's
                                                                       target, or a file sink's)
    {parent}/.{name}.funke-{job}/s{subtask}-a{attempt}/                a file sink's staged output,
                                                                       beside its target
    {parent}/.{name}.funke-{job}/commit/                               the target being assembled
    {target}/.funke-staging-{job}/{batch}/{subtask}-{attempt}/         a streaming sink's staged output
                                                                       of one micro-batch, inside its target

Staging beside the target keeps the final rename on one filesystem (atomic for local files and
HDFS), and the leading dot hides it from Spark and Hadoop readers of the parent directory.

Every id that becomes a path component is checked here against `ids.py`'s rule (ValueError
otherwise), whoever the caller is: a job id `..` can never name the data directory itself.
"""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import urlparse

from funke.common import ids

# The column a producer adds to route rows to consumer subtasks; consumers filter and drop it.
SUBPARTITION_COLUMN = "_sub"


def _join(*parts: str) -> str:
    head, *rest = parts
    return "/".join([head.rstrip("/")] + [p.strip("/") for p in rest])


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {ids.echo(value)}")
    return value


def jobs_dir(data_dir: str) -> str:
    return _join(data_dir, "jobs")


def job_dir(data_dir: str, job_id: str) -> str:
    return _join(data_dir, "jobs", ids.require_path_id(job_id, "job id", ids.MAX_JOB_ID_LENGTH))


def partitions_dir(data_dir: str, job_id: str) -> str:
    return _join(job_dir(data_dir, job_id), "partitions")


def partition_dir(data_dir: str, job_id: str, data_set_id: str, partition_index: int, attempt: int) -> str:
    ids.require_path_id(data_set_id, "data set id")
    _index(partition_index, "partition index")
    _index(attempt, "attempt number")
    return _join(partitions_dir(data_dir, job_id), data_set_id, f"p{partition_index}", f"a{attempt}")


def batch_partition_dir(data_dir: str, job_id: str, data_set_id: str, partition_index: int, attempt: int,
                        batch_id: int) -> str:
    """A streaming query's result partition for one micro-batch: inside the attempt's partition
    directory, one per batch."""
    _index(batch_id, "batch id")
    return _join(partition_dir(data_dir, job_id, data_set_id, partition_index, attempt), f"batch-{batch_id}")


def cancelled_dir(data_dir: str, job_id: str) -> str:
    return _join(job_dir(data_dir, job_id), "cancelled")


def cancel_marker(data_dir: str, job_id: str, vertex_id: str, subtask_index: int, attempt: int) -> str | None:
    """The file whose appearance tells an attempt's Python workers to stop at once, or None where
    workers cannot be assumed to see the TaskManager's files cheaply (a data dir that is not a
    local path)."""
    if "://" in data_dir and not data_dir.startswith("file://"):
        return None
    local = os.path.abspath(urlparse(data_dir).path if data_dir.startswith("file://") else data_dir)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", vertex_id).lstrip(".") or "_"
    _index(subtask_index, "subtask index")
    _index(attempt, "attempt number")
    return _join(cancelled_dir(local, job_id), f"{name}-s{subtask_index}-a{attempt}")


COLLECTED = "collect"  # the entry of a job's directory that outlives its clean-up (a FINISHED job's rows)


def collect_dir(data_dir: str, job_id: str, vertex_id: str) -> str:
    return _join(job_dir(data_dir, job_id), COLLECTED, ids.require_path_id(vertex_id, "vertex id"))


def redis_sink_dir(data_dir: str, job_id: str, vertex_id: str) -> str:
    """Where a Redis Streams sink's subtasks stage each batch's rows for the JobMaster's commit."""
    return _join(job_dir(data_dir, job_id), "redis", ids.require_path_id(vertex_id, "vertex id"))


def kafka_sink_dir(data_dir: str, job_id: str, vertex_id: str) -> str:
    """Where a Kafka sink's subtasks stage their rows (each batch's, or a bounded job's) for the
    JobMaster's commit (`funke.jobmanager.kafkasink`)."""
    return _join(job_dir(data_dir, job_id), "kafka", ids.require_path_id(vertex_id, "vertex id"))


def sink_target(data_dir: str, job_id: str, vertex_id: str, kind: str, config: dict) -> str:
    """The directory a sink's output ends up in once the job FINISHED (a Kafka sink's: where it
    is staged before the JobMaster produces it)."""
    if kind == "sink.collect":
        return collect_dir(data_dir, job_id, vertex_id)
    if kind == "sink.kafka":
        return kafka_sink_dir(data_dir, job_id, vertex_id)
    return str(config["path"])


def staging_root(target: str, job_id: str) -> str:
    ids.require_path_id(job_id, "job id", ids.MAX_JOB_ID_LENGTH)
    target = target.rstrip("/")
    parent, _, name = target.rpartition("/")
    if not name or name in (".", "..") or "\0" in target:
        raise ValueError(f"sink target {ids.echo(target)} has no directory name to stage beside")
    if not parent:  # a relative single-component path
        parent = "."
    return _join(parent, f".{name}.funke-{job_id}")


def sink_staging_dir(target: str, job_id: str, subtask_index: int, attempt: int) -> str:
    _index(subtask_index, "subtask index")
    _index(attempt, "attempt number")
    return _join(staging_root(target, job_id), f"s{subtask_index}-a{attempt}")


STREAM_STAGING = ".funke-staging"  # followed by "-{job}"
STREAM_SINK_LOG = "_funke_sink_log"


def stream_staging_root(target: str, job_id: str) -> str:
    """Where a streaming query's job stages its sink's batches, inside the target and hidden from
    readers. One per job: the job's clean-up removes its own (`committer.cleanup_job`) and never
    what another job on the same checkpoint, which runs the uncommitted batches again, stages."""
    ids.require_path_id(job_id, "job id", ids.MAX_JOB_ID_LENGTH)
    return _join(target.rstrip("/") or "/", f"{STREAM_STAGING}-{job_id}")


def stream_sink_staging_dir(target: str, job_id: str, batch_id: int, subtask_index: int, attempt: int) -> str:
    """Where a streaming sink subtask writes its output of one micro-batch (inside the target,
    hidden from readers; `funke.jobmanager.streamsinks` commits it)."""
    _index(batch_id, "batch id")
    _index(subtask_index, "subtask index")
    _index(attempt, "attempt number")
    return _join(stream_staging_root(target, job_id), str(batch_id), f"{subtask_index}-{attempt}")


def commit_dir(target: str, job_id: str) -> str:
    return _join(staging_root(target, job_id), "commit")


def is_within(root: str, path: str) -> bool:
    """Whether `path` is `root` itself or lies under it, comparing normalised forms (so
    `root/a/../..` is not within `root`). Both must be of the same kind (local paths, or URIs of
    one scheme and authority)."""
    root_n, path_n = _normal(root), _normal(path)
    return path_n == root_n or path_n.startswith(root_n.rstrip("/") + "/")


def _normal(path: str) -> str:
    if path.startswith("file://"):
        path = urlparse(path).path
    if "://" in path:
        scheme, _, rest = path.partition("://")
        authority, slash, inner = rest.partition("/")
        return f"{scheme.lower()}://{authority}" + posixpath.normpath(slash + inner if slash else "/")
    return posixpath.normpath(os.path.abspath(path))
