"""The JobMaster shell: a failure between the scheduler's decision and its RPC fails that job at
once, frees its slots and leaves no execution waiting. Real Dispatcher, ResourceManager,
JobMaster and scheduler on an event loop; the TaskManager is registered but never reached,
since the failure comes before any RPC."""

from __future__ import annotations

import asyncio

from funke.common.configuration import ClusterConfiguration
from funke.common.graph.jobgraph import IntermediateDataSet, JobEdge, JobGraph, JobVertex, OperatorSpec
from funke.common.states import JobStatus
from funke.jobmanager.dispatcher import Dispatcher
from funke.jobmanager.jobstore import ArchivedJob
from funke.v1 import cluster_pb2, job_pb2


def unbuildable_job() -> JobGraph:
    """What validation refuses (a non-finite number has no JSON form, so no deployment descriptor
    can carry it): planted here past validation, to exercise the path a bug would take."""
    source = JobVertex("src", "Source", 2, (OperatorSpec("source.range", config={"end": float("inf")}),))
    sink = JobVertex("sink", "Sink", 2, (OperatorSpec("sink.discard"),))
    return JobGraph("unbuildable", (source, sink), (IntermediateDataSet("src.out0", "src"),),
                    (JobEdge("e", "src.out0", "sink"),), job_id="unbuildable")


def test_a_deployment_that_cannot_be_built_fails_its_job_at_once_and_frees_the_slots(tmp_path):
    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path)))
        dispatcher.mailbox.call(lambda: dispatcher.rm.register(cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id="tm-1", address="127.0.0.1:9", number_of_slots=4)))
        try:
            job_id = await dispatcher.start_job(unbuildable_job())
            for _ in range(100):
                if isinstance(dispatcher.job(job_id), ArchivedJob):
                    break
                await asyncio.sleep(0.01)
            job = dispatcher.job(job_id)
            assert isinstance(job, ArchivedJob) and job.status is JobStatus.FAILED
            details = job.details()
            assert [e.failure.exception_type for e in details.exceptions if not e.task_name] == ["JobManagerError"]
            assert "could not carry out a decision" in details.failure.message
            assert "recovery is suppressed" in details.failure.message
            states = {sub.current.state for v in details.vertices for sub in v.subtasks}
            assert states <= {job_pb2.EXECUTION_STATE_FAILED, job_pb2.EXECUTION_STATE_CANCELED}, states
            assert dispatcher.rm.slots.free_slots == dispatcher.rm.slots.total_slots == 4
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())


def noop_job(job_id: str) -> JobGraph:
    return JobGraph("noop", (JobVertex("src", "S", 2, (OperatorSpec("source.noop"),)),
                             JobVertex("sink", "K", 2, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
                    (IntermediateDataSet("src.out0", "src"),), (JobEdge("e", "src.out0", "sink"),), job_id=job_id)


def _raise(*args, **kwargs):
    raise RuntimeError("a bug in the scheduler")


def test_a_scheduler_that_raises_fails_its_job_and_frees_the_slots(tmp_path, monkeypatch):
    """A bug inside the core (here: on_allocations raising) is an internal error like any
    other: the job fails at once, the slots it was given go back."""
    from funke.common.scheduling import scheduler

    monkeypatch.setattr(scheduler.Scheduler, "on_allocations", scheduler._event(_raise))

    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path)))
        dispatcher.mailbox.call(lambda: dispatcher.rm.register(cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id="tm-1", address="127.0.0.1:9", number_of_slots=4)))
        try:
            job_id = await dispatcher.start_job(noop_job("raises"))
            for _ in range(100):
                if isinstance(dispatcher.job(job_id), ArchivedJob):
                    break
                await asyncio.sleep(0.01)
            job = dispatcher.job(job_id)
            assert isinstance(job, ArchivedJob) and job.status is JobStatus.FAILED
            assert "a bug in the scheduler" in job.details().failure.message
            assert dispatcher.rm.slots.free_slots == 4
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())


def test_a_scheduler_that_cannot_even_fail_its_job_does_not_take_the_jobmanager_down(tmp_path, monkeypatch):
    """If failing the job raises too, the JobManager does not retry forever: it gives the slots
    back, leaves that job, and serves the next one."""
    from funke.common.scheduling import scheduler

    real_allocated, real_internal = scheduler.Scheduler.on_allocations, scheduler.Scheduler.on_internal_error
    calls = {"on_internal_error": 0}

    def allocated(self, *args, **kwargs):
        if self.graph.job_id == "broken":
            raise RuntimeError("a bug in the scheduler")
        return real_allocated(self, *args, **kwargs)

    def internal_error(self, *args, **kwargs):
        if self.graph.job_id == "broken":
            calls["on_internal_error"] += 1
            raise RuntimeError("and another one")
        return real_internal(self, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "on_allocations", allocated)
    monkeypatch.setattr(scheduler.Scheduler, "on_internal_error", internal_error)

    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path)))
        dispatcher.mailbox.call(lambda: dispatcher.rm.register(cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id="tm-1", address="127.0.0.1:9", number_of_slots=4)))
        try:
            await dispatcher.start_job(noop_job("broken"))
            await asyncio.sleep(0.2)
            assert calls["on_internal_error"] == 1  # tried once, not forever
            assert dispatcher.rm.slots.free_slots == 4
            # the JobManager goes on: the next job gets slots and deploys
            await dispatcher.start_job(noop_job("next"))
            assert dispatcher.job("next").status is JobStatus.RUNNING
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())


def test_the_clusters_slot_idle_timeout_reaches_each_jobs_scheduler(tmp_path):
    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path), slot_idle_timeout_s=42.0))
        try:
            _, scheduler, _ = dispatcher._build(noop_job("idle"), "idle", 0.0)
            assert scheduler.slots.idle_timeout_s == 42.0
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())
