"""gRPC services of the JobManager process: translate requests into Dispatcher and
ResourceManager calls on the main thread, and their errors into status codes."""

from __future__ import annotations

import asyncio
import logging

import grpc

from funke.common.states import JobStatus
from funke.jobmanager import committer
from funke.jobmanager.conversions import job_details, job_status_pb, job_summary
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError
from funke.jobmanager.jobmaster import END_OF_STREAM
from funke.v1 import cluster_pb2, cluster_pb2_grpc, jobmanager_pb2, jobmanager_pb2_grpc

log = logging.getLogger("funke.jobmanager")


async def _abort(context: grpc.aio.ServicerContext, error: DispatcherError):
    await context.abort(getattr(grpc.StatusCode, error.code), str(error))


class JobManagerService(jobmanager_pb2_grpc.JobManagerServicer):
    def __init__(self, dispatcher: Dispatcher):
        self.d = dispatcher

    async def SubmitJob(self, request, context):
        try:
            job_id = await self.d.submit(request.job_graph)
        except DispatcherError as exc:
            await _abort(context, exc)
        return jobmanager_pb2.SubmitJobResponse(job_id=job_id)

    async def ListJobs(self, request, context):
        return jobmanager_pb2.ListJobsResponse(jobs=[job_summary(jm) for jm in self.d.jobs.values()])

    async def GetJob(self, request, context):
        try:
            return job_details(self.d.job(request.job_id))
        except DispatcherError as exc:
            await _abort(context, exc)

    async def CancelJob(self, request, context):
        try:
            status = self.d.cancel(request.job_id)
        except DispatcherError as exc:
            await _abort(context, exc)
        return jobmanager_pb2.CancelJobResponse(status=job_status_pb(status))

    async def WatchJob(self, request, context):
        try:
            jm = self.d.job(request.job_id)
        except DispatcherError as exc:
            await _abort(context, exc)
        snapshot, queue = jm.subscribe()
        try:
            yield snapshot
            while True:
                event = await queue.get()
                if event is END_OF_STREAM:
                    return
                yield event
        finally:
            jm.unsubscribe(queue)

    async def GetClusterOverview(self, request, context):
        overview = self.d.rm.overview()
        counts: dict[str, int] = {}
        for jm in self.d.jobs.values():
            counts[jm.status.value] = counts.get(jm.status.value, 0) + 1
        overview.jobs_by_status.update(counts)
        return overview

    async def GetJobResult(self, request, context):
        try:
            jm = self.d.job(request.job_id)
        except DispatcherError as exc:
            await _abort(context, exc)
        collects = [v.id for v in jm.graph.job_graph.vertices if v.operators and v.operators[-1].kind == "sink.collect"]
        if request.vertex_id:
            if request.vertex_id not in collects:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id} has no collect sink {request.vertex_id!r}")
            vertex_id = request.vertex_id
        elif len(collects) == 1:
            vertex_id = collects[0]
        else:
            await context.abort(grpc.StatusCode.NOT_FOUND if not collects else grpc.StatusCode.INVALID_ARGUMENT,
                                f"job {request.job_id} has {len(collects)} collect sinks ({', '.join(collects)}); name one")
        if jm.status is not JobStatus.FINISHED:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"job {request.job_id} is {jm.status.value}; results exist once it FINISHED")
        data, rows = await asyncio.get_running_loop().run_in_executor(
            None, committer.read_collected, jm.data_dir, jm.job_id, vertex_id)
        return jobmanager_pb2.JobResult(vertex_id=vertex_id, arrow_ipc_stream=data, row_count=rows)


class ResourceManagerService(cluster_pb2_grpc.ResourceManagerServicer):
    def __init__(self, dispatcher: Dispatcher):
        self.d = dispatcher

    async def RegisterTaskManager(self, request, context):
        return self.d.mailbox.call(lambda: self.d.rm.register(request))

    async def Heartbeat(self, request_iterator, context):
        tm_id = registration_id = ""
        cause = "heartbeat connection closed"
        try:
            async for beat in request_iterator:
                tm_id, registration_id = beat.task_manager_id, beat.registration_id
                known = self.d.mailbox.call(lambda: self.d.rm.heartbeat(tm_id, registration_id))
                yield cluster_pb2.HeartbeatResponse(reregister=not known)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            cause = f"heartbeat connection broken ({type(exc).__name__})"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if tm_id:
                # A TaskManager that dies takes its stream with it: noticed at once, not after
                # the heartbeat timeout.
                self.d.mailbox.run(lambda: self.d.rm.connection_lost(tm_id, registration_id, cause))


class JobMasterService(cluster_pb2_grpc.JobMasterServicer):
    def __init__(self, dispatcher: Dispatcher):
        self.d = dispatcher

    async def UpdateTaskExecutionState(self, request, context):
        self.d.on_task_states(list(request.updates))
        return cluster_pb2.UpdateTaskExecutionStateResponse()
