"""gRPC services of the JobManager process: translate requests into Dispatcher and
ResourceManager calls on the main thread, and their errors into status codes.

Every request is untrusted: ids are checked before they are used or echoed (a message quotes at
most a shortened form of what the client sent), and what a TaskManager registers with is checked
before the ResourceManager allocates anything for it.

The services reach the Dispatcher through `current()`: with high availability a standby has none
(every call gets UNAVAILABLE naming the leader, so clients and TaskManagers go there), and a new
leader gets a new one each time it is granted leadership."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re

import grpc

from typing import Callable

from funke.common import ids
from funke.common.security import StreamQuota, client_of, token_problem
from funke.common.states import JobStatus
from funke.common.graph.jobgraph import MAX_PARALLELISM_LIMIT
from funke.common.graph.streamingjob import RUNNING_KINDS
from funke.common.streaming.state import LEGACY
from funke.jobmanager.streaming.state import DEFAULT_STATE_ROWS, MAX_STATE_ROWS
from funke.jobmanager import committer, reachability
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.common.wire.codec import job_status_to_proto
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError
from funke.jobmanager.jobmaster import END_OF_STREAM, RESYNC, JobMaster
from funke.jobmanager.jobstore import ArchivedJob
from funke.v1 import cluster_pb2, cluster_pb2_grpc, jobgraph_pb2, jobmanager_pb2, jobmanager_pb2_grpc

log = logging.getLogger("funke.jobmanager")

# What one TaskManager may offer: enough for any machine, too few to exhaust the JobManager.
MAX_SLOTS_PER_TASK_MANAGER = 4096
DEFAULT_STOP_TIMEOUT_S = 60.0
MAX_STOP_TIMEOUT_S = 86_400.0
MAX_ADDRESS_LENGTH = 300
DEFAULT_RESULT_BATCHES = 100  # a streaming collect sink's batches per GetJobResult(from_batch)
MAX_RESULT_BATCHES = 10_000
MAX_RESOURCES = 100
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*")


async def _abort(context: grpc.aio.ServicerContext, error: DispatcherError):
    await _refuse(context, getattr(grpc.StatusCode, error.code), str(error))


async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str):
    """End the call with `code`; the message is cut to what gRPC's trailing metadata carries."""
    await context.abort(code, ids.status_message(message))


Current = Callable[[], Dispatcher]  # the leading Dispatcher, or DispatcherError("UNAVAILABLE", ...)


async def _current(current: Current, context: grpc.aio.ServicerContext) -> Dispatcher:
    try:
        return current()
    except DispatcherError as exc:
        looked_up = getattr(exc, "looked_up", None)  # a standby: who leads, as the HA services say now
        await _abort(context, await looked_up() if looked_up is not None else exc)
        raise  # not reached: abort raises


async def _job(d: Dispatcher, job_id: str, context: grpc.aio.ServicerContext) -> JobMaster | ArchivedJob:
    try:
        return d.job(job_id)
    except DispatcherError as exc:
        await _abort(context, exc)
        raise  # not reached: abort raises


class JobManagerService(jobmanager_pb2_grpc.JobManagerServicer):
    def __init__(self, current: Current, watch_quota: StreamQuota | None = None):
        self._current = current
        # Each open WatchJob stream holds a queue of the job's events: bounded per client and in all.
        self._watches = watch_quota or StreamQuota(per_client=64, total=1024)

    async def SubmitJob(self, request, context):
        d = await _current(self._current, context)
        try:
            job_id = await d.submit(request.job_graph)
        except DispatcherError as exc:
            await _abort(context, exc)
        return jobmanager_pb2.SubmitJobResponse(job_id=job_id)

    async def ListJobs(self, request, context):
        d = await _current(self._current, context)
        return jobmanager_pb2.ListJobsResponse(jobs=d.summaries())

    async def GetJob(self, request, context):
        d = await _current(self._current, context)
        job = await _job(d, request.job_id, context)
        return job.details()

    async def CancelJob(self, request, context):
        d = await _current(self._current, context)
        try:
            status = d.cancel(request.job_id)
        except DispatcherError as exc:
            await _abort(context, exc)
        return jobmanager_pb2.CancelJobResponse(status=job_status_to_proto(status))

    async def StopJob(self, request, context):
        d = await _current(self._current, context)
        timeout = request.timeout_seconds or DEFAULT_STOP_TIMEOUT_S
        if not math.isfinite(timeout) or not 0 < timeout <= MAX_STOP_TIMEOUT_S:
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                          f"timeout_seconds must be in (0, {MAX_STOP_TIMEOUT_S:g}], got {request.timeout_seconds!r}")
        try:
            status, message = d.stop_query(request.job_id, request.drain, timeout)
        except DispatcherError as exc:
            await _abort(context, exc)
        return jobmanager_pb2.StopJobResponse(status=job_status_to_proto(status), message=message)

    async def RescaleJob(self, request, context):
        d = await _current(self._current, context)
        timeout = request.timeout_seconds or DEFAULT_STOP_TIMEOUT_S
        problems = []
        if not math.isfinite(timeout) or not 0 < timeout <= MAX_STOP_TIMEOUT_S:
            problems.append(f"timeout_seconds must be in (0, {MAX_STOP_TIMEOUT_S:g}], got {request.timeout_seconds!r}")
        if not 1 <= request.parallelism <= MAX_PARALLELISM_LIMIT:
            problems.append(f"parallelism must be from 1 to {MAX_PARALLELISM_LIMIT}, got {request.parallelism}")
        if len(request.vertex_id) > 1000 or any(not v or len(v) > 256 for v in request.vertex_id):
            problems.append("vertex_id: at most 1000 vertex ids of 1 to 256 characters")
        if problems:
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        try:
            return await d.rescale(request.job_id, request.parallelism, list(request.vertex_id), timeout)
        except DispatcherError as exc:
            await _abort(context, exc)

    async def GetQueryProgress(self, request, context):
        d = await _current(self._current, context)
        try:
            return d.query_progress(request.job_id)
        except DispatcherError as exc:
            await _abort(context, exc)

    async def GetKeyedState(self, request, context):
        d = await _current(self._current, context)
        job = await _job(d, request.job_id, context)
        query = getattr(job, "query", None)
        if query is None:
            what = "has ended" if isinstance(job, ArchivedJob) else "is not a streaming query"
            await _refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                          f"job {request.job_id} {what}; the JobManager reads a running query's keyed state (a stopped "
                          f"or finished query's is read from its checkpoint: funke state --checkpoint PATH)")
        keyed = [v for v in job.graph.job_graph.vertices if v.operators and v.operators[0].kind in RUNNING_KINDS]
        if request.vertex_id:
            chosen = [v for v in keyed if v.id == request.vertex_id]
            if not chosen:
                await _refuse(context, grpc.StatusCode.NOT_FOUND, f"job {request.job_id} has no keyed operator "
                              f"{ids.echo(request.vertex_id)} (it has {', '.join(v.id for v in keyed) or 'none'})")
        elif len(keyed) != 1:
            await _refuse(context, grpc.StatusCode.NOT_FOUND if not keyed else grpc.StatusCode.INVALID_ARGUMENT,
                          f"job {request.job_id} has {len(keyed)} keyed operators "
                          f"({', '.join(v.id for v in keyed) or 'none'}); name one")
        vertex = chosen[0] if request.vertex_id else keyed[0]
        op = vertex.operators[0]
        n_keys = 1 if isinstance(op.config.get("keys"), str) else len(op.config.get("keys") or ())
        problems = []
        if len(request.key) > n_keys:
            problems.append(f"{len(request.key)} key values given, and operator {vertex.id!r} has {n_keys} key column(s)")
        if any(len(k) > 4096 for k in request.key):
            problems.append("a key value is longer than 4096 characters")
        if not 0 <= request.limit <= MAX_STATE_ROWS:
            problems.append(f"limit {request.limit} is outside [0, {MAX_STATE_ROWS}] (0: {DEFAULT_STATE_ROWS})")
        if problems:
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        limit = request.limit or DEFAULT_STATE_ROWS

        def read() -> tuple[int, bytes, int, int]:
            import pyarrow as pa  # only this call needs Arrow: the JobManager starts without it

            from funke.jobmanager.streaming.state import keyed_state_table

            store = CheckpointStore(query.checkpoint_location)
            commits = store.commit_ids()
            if not commits:
                return -1, b"", 0, 0
            lineage = store.read_commit(commits[-1]).state  # whose files hold the state it left
            table, matching = keyed_state_table(vertex, query.checkpoint_location, commits[-1] + 1,
                                                list(request.key), limit,
                                                lineage.operator(vertex.id) if lineage is not None else LEGACY)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            return commits[-1], sink.getvalue().to_pybytes(), table.num_rows, matching

        try:
            batch, data, rows, matching = await asyncio.get_running_loop().run_in_executor(None, read)
        except Exception as exc:  # a file gone or unreadable: the state is there but lost to us
            log.warning("reading the keyed state of job %s failed", request.job_id, exc_info=True)
            await _refuse(context, grpc.StatusCode.DATA_LOSS, f"the keyed state of job {request.job_id} "
                          f"cannot be read: {type(exc).__name__}: {exc}")
        return jobmanager_pb2.KeyedState(vertex_id=vertex.id, batch_id=batch, arrow_ipc_stream=data, row_count=rows,
                                         matching_keys=matching)

    async def WatchJob(self, request, context):
        d = await _current(self._current, context)
        job = await _job(d, request.job_id, context)
        if isinstance(job, ArchivedJob):
            yield jobmanager_pb2.JobEvent(sequence=job.sequence, snapshot=job.details())
            return
        client = client_of(context.peer())
        refused = self._watches.acquire(client)
        if refused is not None:
            await _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        try:
            snapshot, queue = job.subscribe()
            try:
                yield snapshot
                seen = snapshot.sequence
                while True:
                    event = await queue.get()
                    if event is END_OF_STREAM:
                        return
                    if event is RESYNC:  # this client fell behind: the job as it is now instead
                        event = job.snapshot()
                    elif event.sequence <= seen:
                        continue  # in the snapshot already
                    seen = event.sequence
                    yield event
            finally:
                job.unsubscribe(queue)
        finally:
            self._watches.release(client)

    async def GetClusterOverview(self, request, context):
        d = await _current(self._current, context)
        return d.cluster_overview()

    async def GetJobResult(self, request, context):
        d = await _current(self._current, context)
        job = await _job(d, request.job_id, context)
        collects = job.collect_vertices
        if request.vertex_id:
            if request.vertex_id not in collects:
                await _refuse(context, grpc.StatusCode.NOT_FOUND,
                                    f"job {request.job_id} has no collect sink {ids.echo(request.vertex_id)}")
            vertex_id = request.vertex_id
        elif len(collects) == 1:
            vertex_id = collects[0]
        else:
            listed = ", ".join(collects[:10]) + (f" and {len(collects) - 10} more" if len(collects) > 10 else "")
            await _refuse(context, grpc.StatusCode.NOT_FOUND if not collects else grpc.StatusCode.INVALID_ARGUMENT,
                          f"job {request.job_id} has {len(collects)} collect sinks ({listed}); name one")
        query = getattr(job, "query", None)
        if request.HasField("from_batch"):
            return await self._result_batches(d, job, request, vertex_id, context)
        # A streaming query's committed batches can be read while it runs.
        if job.status is not JobStatus.FINISHED and query is None:
            await _refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                                f"job {request.job_id} is {job.status.value}; results exist once it FINISHED")
        # A streaming query that has not ended and has no batch committed yet: its collect
        # directory may not be made yet, and that is zero rows, not rows gone.
        none_committed = query is not None and not query.progress
        try:
            data, rows = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(committer.read_collected, d.config.data_dir, request.job_id, vertex_id,
                                        none_committed=none_committed))
        except FileNotFoundError as exc:
            await _refuse(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:  # unreadable (corrupt, no permission): the rows are there but lost to us
            log.warning("reading the collected rows of job %s failed", request.job_id, exc_info=True)
            await _refuse(context, grpc.StatusCode.DATA_LOSS, f"the collected rows of job {request.job_id} "
                          f"cannot be read: {type(exc).__name__}: {exc}")
        return jobmanager_pb2.JobResult(vertex_id=vertex_id, arrow_ipc_stream=data, row_count=rows)

    async def _result_batches(self, d, job, request, vertex_id: str, context) -> jobmanager_pb2.JobResult:
        """A streaming query's collect sink from batch `from_batch` on (GetJobResultRequest)."""
        problems = []
        if not _is_streaming(job):
            problems.append(f"job {request.job_id} is a batch job: from_batch is for a streaming query's batches")
        if request.from_batch < 0:
            problems.append(f"from_batch must be >= 0, got {request.from_batch}")
        if not 0 <= request.max_batches <= MAX_RESULT_BATCHES:
            problems.append(f"max_batches must be 0 (the default, {DEFAULT_RESULT_BATCHES}) to "
                            f"{MAX_RESULT_BATCHES}, got {request.max_batches}")
        if problems:
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        try:
            batches = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(committer.read_collected_batches, d.config.data_dir, request.job_id, vertex_id,
                                        request.from_batch, request.max_batches or DEFAULT_RESULT_BATCHES))
        except Exception as exc:  # unreadable (corrupt, no permission): the rows are there but lost to us
            log.warning("reading the collected batches of job %s failed", request.job_id, exc_info=True)
            await _refuse(context, grpc.StatusCode.DATA_LOSS, f"the collected rows of job {request.job_id} "
                          f"cannot be read: {type(exc).__name__}: {exc}")
        return jobmanager_pb2.JobResult(vertex_id=vertex_id, batches=[
            jobmanager_pb2.BatchRows(batch_id=b, arrow_ipc_stream=data, row_count=n) for b, data, n in batches])


def _is_streaming(job: JobMaster | ArchivedJob) -> bool:
    """A streaming job (a running query, or one in the job history)."""
    if isinstance(job, JobMaster):
        return job.query is not None
    return bool(job.progress) or job.summary.job_type == jobgraph_pb2.JOB_TYPE_STREAMING


def registration_problem(request: cluster_pb2.RegisterTaskManagerRequest) -> str | None:
    """Why a TaskManager's registration cannot be accepted, or None."""
    problem = ids.path_id_problem(request.task_manager_id, "task_manager_id")
    if problem is not None:
        return problem
    if not 1 <= request.number_of_slots <= MAX_SLOTS_PER_TASK_MANAGER:
        return f"number_of_slots {request.number_of_slots} is outside [1, {MAX_SLOTS_PER_TASK_MANAGER}]"
    address = request.address
    host, sep, port = address.rpartition(":")
    if (len(address) > MAX_ADDRESS_LENGTH or not address.isprintable() or not sep or not host
            or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.fullmatch(host)):
        # The JobManager dials it: a name, an IPv4 address or a bracketed IPv6 one, never a
        # gRPC target of another kind ("unix:/path", "dns://...").
        return f"address {ids.echo(address)} is not HOST:PORT"
    problem = token_problem(request.registration_token, "registration_token")
    if problem is not None:
        return problem
    if len(request.resources) > MAX_RESOURCES or any(
            len(k) > 200 or len(v) > 1000 for k, v in request.resources.items()):
        return f"resources: at most {MAX_RESOURCES} entries of at most 200 / 1000 characters"
    return None


class ResourceManagerService(cluster_pb2_grpc.ResourceManagerServicer):
    def __init__(self, current: Current):
        self._current = current

    async def RegisterTaskManager(self, request, context):
        d = await _current(self._current, context)
        problem = registration_problem(request)
        if problem is not None:
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"registration refused: {problem}")
        problem = await reachability.registration_problem(
            request.task_manager_id, request.address, context.peer(), d.config.registration_probe_timeout_s, d.tls)
        if problem is not None:
            log.warning("registration of TaskManager %s refused: %s", ids.echo(request.task_manager_id), problem)
            await _refuse(context, grpc.StatusCode.FAILED_PRECONDITION, f"registration refused: {problem}")
        d = await _current(self._current, context)  # the probe took time: leadership may have moved
        return d.mailbox.call(lambda: d.rm.register(request))

    async def Heartbeat(self, request_iterator, context):
        tm_id = registration_id = ""
        cause = "heartbeat connection closed"
        d: Dispatcher | None = None  # the Dispatcher the stream began with
        try:
            async for beat in request_iterator:
                now = await _current(self._current, context)
                if d is not None and now is not d:
                    # This JobManager lost leadership (and maybe won it again) since: whatever
                    # the TaskManager registered with is over.
                    await _refuse(context, grpc.StatusCode.UNAVAILABLE,
                                  "the JobManager's leadership changed: register again")
                d = now
                if tm_id and beat.task_manager_id != tm_id:
                    # One stream is one TaskManager's: a stream that changes its id is not one.
                    await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                                        f"a heartbeat stream belongs to one TaskManager ({ids.echo(tm_id)}), not "
                                        f"{ids.echo(beat.task_manager_id)}")
                tm_id, registration_id = beat.task_manager_id, beat.registration_id
                known = d.mailbox.call(lambda: d.rm.heartbeat(tm_id, registration_id))
                yield cluster_pb2.HeartbeatResponse(reregister=not known)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            cause = f"heartbeat connection broken ({type(exc).__name__})"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if tm_id and d is not None:
                # A TaskManager that dies takes its stream with it: noticed at once, not after
                # the heartbeat timeout.
                d.mailbox.run(lambda: d.rm.connection_lost(tm_id, registration_id, cause))


class JobMasterService(cluster_pb2_grpc.JobMasterServicer):
    def __init__(self, current: Current):
        self._current = current

    async def UpdateTaskExecutionState(self, request, context):
        d = await _current(self._current, context)
        d.on_task_states(list(request.updates))
        return cluster_pb2.UpdateTaskExecutionStateResponse()
