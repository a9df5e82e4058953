"""WatchJob costs the JobManager bounded memory: a watcher that stops reading holds at most
WATCH_QUEUE_LIMIT queued events and then gets a fresh snapshot instead of the backlog, and open
streams are counted per client and in all. The service and the JobMaster's publishing are the
real ones; the job behind them is a stand-in that publishes through JobMaster._publish."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from funke.common.security import StreamQuota
from funke.jobmanager.jobmaster import WATCH_QUEUE_LIMIT, JobMaster
from funke.jobmanager.services import JobManagerService
from funke.v1 import job_pb2, jobmanager_pb2


class Job:
    def __init__(self) -> None:
        self._watchers: set[asyncio.Queue] = set()
        self._sequence = 0
        self.longest_queue = 0

    def publish(self, n: int) -> None:
        for _ in range(n):
            self._sequence += 1
            JobMaster._publish(self, jobmanager_pb2.JobEvent(sequence=self._sequence,  # type: ignore[arg-type]
                                                             waiting_for_resources=f"event {self._sequence}"))
            self.longest_queue = max([self.longest_queue, *(q.qsize() for q in self._watchers)])

    def snapshot(self) -> jobmanager_pb2.JobEvent:
        return jobmanager_pb2.JobEvent(sequence=self._sequence, snapshot=job_pb2.JobDetails(job_id="j"))

    def subscribe(self):
        queue: asyncio.Queue = asyncio.Queue()
        self._watchers.add(queue)
        return self.snapshot(), queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._watchers.discard(queue)


class Dispatcher:
    def __init__(self, job: Job) -> None:
        self._job = job

    def job(self, job_id: str) -> Job:
        return self._job


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def test_a_watcher_that_stops_reading_holds_a_bounded_queue_and_then_sees_the_job_as_it_is():
    async def scenario() -> None:
        job = Job()
        service = JobManagerService(lambda: Dispatcher(job), StreamQuota(per_client=4, total=10))  # type: ignore[arg-type]
        stream = service.WatchJob(jobmanager_pb2.WatchJobRequest(job_id="j"), Context("ipv4:10.0.0.7:5000"))
        first = await stream.__anext__()
        assert first.WhichOneof("event") == "snapshot" and first.sequence == 0
        job.publish(5 * WATCH_QUEUE_LIMIT + 17)  # the client reads nothing meanwhile
        assert job.longest_queue <= WATCH_QUEUE_LIMIT
        caught_up = await stream.__anext__()
        # RESYNC: a snapshot of now, and none of the events it already holds follow it
        assert caught_up.WhichOneof("event") == "snapshot" and caught_up.sequence == job._sequence
        job.publish(1)
        after = await stream.__anext__()
        assert after.WhichOneof("event") == "waiting_for_resources" and after.sequence == job._sequence
        await stream.aclose()
        assert not job._watchers and service._watches.open_streams() == 0

    asyncio.run(scenario())


def test_a_reading_watcher_gets_every_event_in_order():
    async def scenario() -> None:
        job = Job()
        service = JobManagerService(lambda: Dispatcher(job), StreamQuota(per_client=4, total=10))  # type: ignore[arg-type]
        stream = service.WatchJob(jobmanager_pb2.WatchJobRequest(job_id="j"), Context("ipv4:10.0.0.7:5000"))
        await stream.__anext__()
        seen = []
        for _ in range(3):
            job.publish(WATCH_QUEUE_LIMIT - 1)  # just under the limit: nothing is dropped
            seen += [(await stream.__anext__()).sequence for _ in range(WATCH_QUEUE_LIMIT - 1)]
        assert seen == list(range(1, 3 * (WATCH_QUEUE_LIMIT - 1) + 1))
        await stream.aclose()

    asyncio.run(scenario())


def test_streams_beyond_a_clients_quota_are_refused_and_a_closed_one_frees_its_place():
    async def scenario() -> None:
        job = Job()
        service = JobManagerService(lambda: Dispatcher(job), StreamQuota(per_client=2, total=3))  # type: ignore[arg-type]
        request = jobmanager_pb2.WatchJobRequest(job_id="j")

        async def open_stream(peer: str):
            stream = service.WatchJob(request, Context(peer))
            await stream.__anext__()
            return stream

        a1, a2 = await open_stream("ipv4:10.0.0.7:1"), await open_stream("ipv4:10.0.0.7:2")
        with pytest.raises(Aborted) as info:
            await open_stream("ipv4:10.0.0.7:3")
        assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "10.0.0.7 already holds 2" in info.value.details
        b1 = await open_stream("ipv6:[::1]:4")  # another client has its own share...
        with pytest.raises(Aborted) as info:  # ... of a total that is bounded too
            await open_stream("ipv4:10.0.0.8:5")
        assert "its limit (jobmanager.watch.max-streams)" in info.value.details
        await a1.aclose()
        a3 = await open_stream("ipv4:10.0.0.7:6")
        for stream in (a2, a3, b1):
            await stream.aclose()
        assert service._watches.open_streams() == 0 and not job._watchers

    asyncio.run(scenario())

