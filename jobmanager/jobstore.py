"""Terminal jobs, kept small and not forever (Flink's ExecutionGraphInfoStore).

Owns what the JobManager remembers of a job once it reached a terminal status: its details
(histories, subtasks, exceptions) as one compressed protobuf, its summary, and what
`GetJobResult` needs. The JobGraph, its pickled functions and artifacts, the ExecutionGraph and
the scheduler are dropped with the JobMaster. Entries are evicted oldest first when there are more
than `jobstore.max-capacity` of them, when they are older than `jobstore.expiration-time`, or
when their compressed details together exceed `jobstore.cache-size` bytes (Flink's keys); the
caller deletes what an evicted job left in the data directory (its collected rows).

Sans-IO: time comes in as `now`.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from dataclasses import dataclass

from funke.common.states import JobStatus
from funke.v1 import job_pb2

DEFAULT_MAX_CAPACITY = 1000
DEFAULT_EXPIRATION_S = 3600.0  # Flink's jobstore.expiration-time
DEFAULT_CACHE_BYTES = 50 * 1024 * 1024  # Flink's jobstore.cache-size


@dataclass(frozen=True, slots=True)
class ArchivedJob:
    job_id: str
    status: JobStatus
    summary: job_pb2.JobSummary
    compressed_details: bytes
    sequence: int  # the last event sequence number the job published
    collect_vertices: tuple[str, ...]
    archived_at: float
    progress: tuple[str, ...] = ()  # a streaming query's recent progress records (JSON)

    def details(self) -> job_pb2.JobDetails:
        return job_pb2.JobDetails.FromString(zlib.decompress(self.compressed_details))

    @property
    def size(self) -> int:
        return len(self.compressed_details) + self.summary.ByteSize() + sum(len(p) for p in self.progress) + 200


def archive(details: job_pb2.JobDetails, summary: job_pb2.JobSummary, status: JobStatus, sequence: int,
            collect_vertices: tuple[str, ...], now: float, progress: tuple[str, ...] = ()) -> ArchivedJob:
    return ArchivedJob(details.job_id, status, summary, zlib.compress(details.SerializeToString(), 1),
                       sequence, collect_vertices, now, progress)


class JobStore:
    def __init__(self, max_capacity: int = DEFAULT_MAX_CAPACITY, expiration_s: float = DEFAULT_EXPIRATION_S,
                 max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_capacity = max_capacity
        self.expiration_s = expiration_s
        self.max_bytes = max_bytes
        self._jobs: OrderedDict[str, ArchivedJob] = OrderedDict()  # oldest first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, job_id: str) -> ArchivedJob | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[ArchivedJob]:
        return list(self._jobs.values())

    def put(self, job: ArchivedJob, now: float) -> list[ArchivedJob]:
        """Keep `job`; returns the jobs evicted to make room for it."""
        old = self._jobs.pop(job.job_id, None)
        if old is not None:
            self._bytes -= old.size
        self._jobs[job.job_id] = job
        self._bytes += job.size
        return self.expire(now)

    def expire(self, now: float) -> list[ArchivedJob]:
        """Evict, oldest first, what is too old, beyond the count, or beyond the byte budget. The
        newest job goes only when it expires: a client that just saw it end can still read it."""
        evicted: list[ArchivedJob] = []
        while self._jobs:
            oldest = next(iter(self._jobs.values()))
            expired = now - oldest.archived_at > self.expiration_s
            crowded = len(self._jobs) > self.max_capacity or self._bytes > self.max_bytes
            if not expired and not (crowded and len(self._jobs) > 1):
                break
            del self._jobs[oldest.job_id]
            self._bytes -= oldest.size
            evicted.append(oldest)
        return evicted
