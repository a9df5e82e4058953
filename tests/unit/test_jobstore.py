"""Terminal jobs are kept small and not forever: evicted by count, age and size, oldest first."""

from __future__ import annotations

import os

from funke.common.states import JobStatus
from funke.jobmanager.jobstore import JobStore, archive
from funke.v1 import job_pb2


def ended(job_id: str, now: float, payload: int = 0) -> object:
    details = job_pb2.JobDetails(job_id=job_id, name="j", status=job_pb2.JOB_STATUS_FINISHED)
    if payload:  # incompressible, like tracebacks and names are not, but sizes must show
        details.exceptions.add().failure.traceback = os.urandom(payload).hex()
    summary = job_pb2.JobSummary(job_id=job_id, name="j")
    return archive(details, summary, JobStatus.FINISHED, 7, ("sink",), now)


def test_an_archived_job_keeps_its_details_summary_and_collect_sinks():
    entry = ended("a", 1.0, payload=100)
    assert entry.details().job_id == "a" and len(entry.details().exceptions[0].failure.traceback) == 200
    assert entry.summary.job_id == "a" and entry.collect_vertices == ("sink",) and entry.sequence == 7


def test_beyond_the_capacity_the_oldest_jobs_go_first():
    store = JobStore(max_capacity=3, expiration_s=1e9, max_bytes=1 << 30)
    evicted = []
    for i in range(5):
        evicted += store.put(ended(f"j{i}", float(i)), float(i))
    assert [e.job_id for e in evicted] == ["j0", "j1"]
    assert [e.job_id for e in store.jobs()] == ["j2", "j3", "j4"]


def test_jobs_older_than_the_expiration_time_go():
    store = JobStore(max_capacity=100, expiration_s=10.0, max_bytes=1 << 30)
    store.put(ended("old", 0.0), 0.0)
    store.put(ended("new", 8.0), 8.0)
    assert store.expire(9.0) == []
    assert [e.job_id for e in store.expire(10.5)] == ["old"]
    assert "new" in store and "old" not in store


def test_the_details_kept_stay_within_the_byte_budget():
    store = JobStore(max_capacity=100, expiration_s=1e9, max_bytes=50_000)
    for i in range(20):
        store.put(ended(f"j{i}", float(i), payload=10_000), float(i))
    assert store.size_bytes <= 50_000
    assert 1 <= len(store) < 20
    assert [e.job_id for e in store.jobs()][-1] == "j19"  # the newest stays


def test_the_newest_job_stays_even_when_it_alone_is_over_the_budget():
    store = JobStore(max_capacity=1, expiration_s=10.0, max_bytes=0)
    store.put(ended("a", 0.0, payload=1000), 0.0)
    evicted = store.put(ended("b", 1.0, payload=1000), 1.0)
    assert [e.job_id for e in evicted] == ["a"] and [e.job_id for e in store.jobs()] == ["b"]
    assert [e.job_id for e in store.expire(11.5)] == ["b"]  # but not past its expiration
