"""A streaming query's Redis Streams sink: each batch's rows appended to a stream key once, or
not at all.

Owns the commit of one batch: the sink's subtasks staged their rows as Parquet (like a file
sink, under `layout.redis_sink_dir`, `.funke-staging-<job>/<batch>/` inside); the JobMaster then
appends them in one Redis transaction (MULTI … EXEC) together with a marker key
`funke:sink:<query id>:<sink>:<batch>`, watched (WATCH) beforehand:

- the transaction is atomic: after a crash, either every entry of the batch and the marker are
  in Redis, or none of them;
- a batch run again (a failure after the sink's commit and before the commit log entry) finds
  its marker and appends nothing: exactly once per batch, as long as the marker lives
  (`MARKER_TTL_S`, a week: far longer than a batch waits to be run again).

Each row becomes one entry with an id Redis assigns (`*`): one field per column, its value as
text; a null column is left out. The guarantee is exactly once for the rows of each batch, in
batch order; entry ids are Redis's, so a batch run again after a crash gets the ids of its one
successful transaction, not new ones.

Blocking I/O (files and Redis): the JobMaster calls it from a thread.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

import pyarrow.parquet as pq

from funke.jobmanager.streamsinks import SinkCommitError, batch_staging, staging_dir

MARKER_TTL_S = 7 * 24 * 3600


def connect(config: dict[str, Any]) -> Any:
    """A Redis client for an operator's host, port and db (the JobManager's side)."""
    import redis

    return redis.Redis(host=str(config.get("host", "127.0.0.1")), port=int(config.get("port", 6379)),
                       db=int(config.get("db", 0)), socket_timeout=30, socket_connect_timeout=10)


def marker_key(query_id: str, sink: str, batch_id: int) -> str:
    return f"funke:sink:{query_id}:{sink}:{batch_id}"


def staged_rows(target: str, job_id: str, batch_id: int, attempts: dict[int, int]) -> list[dict[str, str]]:
    """The rows the chosen attempts staged for a batch, as entry fields, in subtask order."""
    rows: list[dict[str, str]] = []
    for subtask, attempt in sorted(attempts.items()):
        directory = staging_dir(target, job_id, batch_id, subtask, attempt)
        if not os.path.isdir(directory):
            raise SinkCommitError(f"batch {batch_id}: subtask {subtask} attempt {attempt} staged nothing in {directory}")
        files = sorted(n for n in os.listdir(directory) if n.endswith(".parquet") and not n.startswith((".", "_")))
        for name in files:
            for row in pq.read_table(os.path.join(directory, name)).to_pylist():
                rows.append({str(k): _text(v) for k, v in row.items() if v is not None})
    return rows


def commit_batch(connect: Callable[[], Any], key: str, query_id: str, sink: str, target: str, job_id: str,
                 batch_id: int, attempts: dict[int, int]) -> int:
    """Appends the batch's rows to stream `key` unless its marker says it was; returns how many
    entries this call appended (0: committed before)."""
    import redis

    client = connect()
    marker = marker_key(query_id, sink, batch_id)
    if client.exists(marker):
        shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)
        return 0
    rows = staged_rows(target, job_id, batch_id, attempts)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(marker)
                if pipe.exists(marker):  # another commit of the batch won meanwhile
                    pipe.unwatch()
                    rows = []
                    break
                pipe.multi()
                for fields in rows:
                    if fields:  # Redis takes no entry without a field
                        pipe.xadd(key, fields)
                pipe.set(marker, str(len(rows)), ex=MARKER_TTL_S)
                pipe.execute()
                break
            except redis.WatchError:
                continue
    shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)
    return len(rows)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)
