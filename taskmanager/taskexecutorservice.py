"""The TaskExecutor gRPC service of a TaskManager (with its health service): each RPC is decoded
(`common/wire/codec.py`, which also builds the answers) into events for the TaskManager's core
(`common/task/taskexecutorevents.py`), fed through the TaskExecutor (`taskexecutor.py`, through its
seam: `Served`), whose loop it runs on. A job's vertices are decoded once (`DecodedVertices`).
Bulk RPCs (a SubmitTasks of 500 deployments, an update that completes thousands of gates) are fed
in slices, so heartbeats are never starved. A call that names a registration not known yet first
waits for it (the registration core says how long: the JobManager's calls can overtake its answer
to us)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.common.task import taskexecutorevents as core
from funke.common.wire import codec
from funke.runtime import security
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS, add_service, host_port
from funke.taskmanager.sparkruntime import StartupError
from funke.v1 import cluster_pb2, cluster_pb2_grpc

from funke.common.graph.jobgraph import JobVertex
from funke.taskmanager.jobmanagerconnection import HEALTH_SERVICES, JobManagerConnection
from funke.taskmanager.taskexecutorconfig import TaskExecutorConfig

if TYPE_CHECKING:
    from funke.v1 import jobgraph_pb2

log = logging.getLogger("funke.taskmanager")

_DEPLOYS_PER_TURN = 64
_CANCELS_PER_TURN = 64
_UPDATES_PER_TURN = 1000


class DecodedVertices:
    """Each job's vertices as its deployments brought them, decoded once per job: the P subtasks
    of a vertex carry the same JobVertex. Filled by the service; a job's are dropped when the
    task core says so (`DropJob`: the job has nothing left on this TaskManager)."""

    def __init__(self) -> None:
        self._by_job: dict[str, dict[str, JobVertex]] = {}

    def get(self, job_id: str, m: jobgraph_pb2.JobVertex) -> JobVertex:
        vertices = self._by_job.setdefault(job_id, {})
        vertex = vertices.get(m.id)
        if vertex is None:
            vertex = vertices[m.id] = codec.vertex_from_proto(m)
        return vertex

    def drop(self, job_id: str = "") -> None:
        """Forget a job's vertices; every job's when `job_id` is empty."""
        if job_id:
            self._by_job.pop(job_id, None)
        else:
            self._by_job.clear()


class Served(Protocol):
    """What the service needs of the TaskExecutor (its whole seam): the core's events go through
    `handle`, with a stimulus id from `stimulus` when the call names none."""

    id: str
    config: TaskExecutorConfig
    connection: JobManagerConnection
    data_dir: str
    vertices: DecodedVertices

    def handle(self, event: core.Event) -> list[core.Instruction]: ...

    def stimulus(self, kind: str) -> str: ...

    async def release_partitions(self, event: core.ReleasePartitions) -> None: ...


async def serve(executor: Served, health_servicer: health.aio.HealthServicer) -> tuple[grpc.aio.Server, int]:
    """The TaskExecutor service (NOT_SERVING until registered), started; and the port it is bound to."""
    cfg = executor.config
    # No SO_REUSEPORT: a second process on the same --port must fail, not share the traffic.
    # Only the JobManager it is registered with now may call it: the token it sent with that
    # registration is the only one the TaskExecutor service takes.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *MESSAGE_SIZE_OPTIONS],
                             interceptors=[security.Authenticator(f"TaskManager {executor.id}",
                                                                  executor.connection.accepted_tokens)])
    add_service(server, TaskExecutorService(executor), cluster_pb2.DESCRIPTOR.services_by_name["TaskExecutor"])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in HEALTH_SERVICES:
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    where = host_port(cfg.host, cfg.port)
    try:
        bound = security.add_port(server, where, cfg.tls)
    except RuntimeError as e:
        raise StartupError(f"cannot bind the TaskExecutor service to {where}: {e}") from None
    if bound == 0:  # older grpcio reports a failed bind this way instead of raising
        raise StartupError(f"cannot bind the TaskExecutor service to {where}")
    await server.start()
    return server, bound


class TaskExecutorService(cluster_pb2_grpc.TaskExecutorServicer):
    def __init__(self, executor: Served):
        self._executor = executor

    def _decode(self, m: cluster_pb2.TaskDeploymentDescriptor):
        """A descriptor as the core's deployment, its vertex decoded once per job; with --data-dir
        this TaskManager sees the shared data dir under its own path."""
        x = self._executor
        return codec.deployment_from_proto(m, x.id, x.vertices.get(m.job_id, m.vertex),
                                           x.data_dir if x.config.data_dir or not m.data_dir else None)

    async def SubmitTasks(self, request: cluster_pb2.SubmitTasksRequest, context: Any) -> cluster_pb2.SubmitTasksResponse:
        await self._executor.connection.registration_known(request.registration_id)
        results = []
        for i, m in enumerate(request.tasks):
            if i and i % _DEPLOYS_PER_TURN == 0:
                await asyncio.sleep(0)  # let heartbeats and reports through
            try:
                deployment = self._decode(m)
            except (ValueError, TypeError) as e:  # WireError is a ValueError
                error = f"the task deployment does not decode: {e}"
            else:
                stimulus = m.stimulus_id or self._executor.stimulus("submit")
                answers = self._executor.handle(core.SubmitTask(deployment, request.registration_id, stimulus))
                error = next((a.reason for a in answers if isinstance(a, core.TaskRejected)), None)
            if error is not None:
                log.warning("rejected task %s (%s of job %s): %s", m.task_name, codec.attempt_from_proto(m.attempt),
                            m.job_id, error)
            results.append(codec.task_result_to_proto(m.attempt, error))
        return cluster_pb2.SubmitTasksResponse(results=results)

    async def RunBatches(self, request: cluster_pb2.RunBatchesRequest, context: Any) -> cluster_pb2.RunBatchesResponse:
        """A micro-batch for some of a job's streaming tasks; each is told whether its task has it."""
        await self._executor.connection.registration_known(request.registration_id)
        try:
            batch = codec.batch_from_proto(request)
            tasks = codec.batch_tasks_from_proto(request)
        except ValueError as exc:
            return cluster_pb2.RunBatchesResponse(results=[
                codec.task_result_to_proto(t.attempt, f"the batch does not decode: {exc}") for t in request.tasks])
        answers = self._executor.handle(core.RunBatch(request.job_id, batch, tasks, request.registration_id,
                                                      self._executor.stimulus(f"batch-{batch.batch_id}"),
                                                      tuple(request.released_batches)))
        refused = {a.key.attempt: a.reason for a in answers if isinstance(a, core.BatchRejected)}
        return cluster_pb2.RunBatchesResponse(results=[codec.task_result_to_proto(m.attempt, refused.get(t.attempt))
                                                       for t, m in zip(tasks, request.tasks)])

    async def FinishTasks(self, request: cluster_pb2.FinishTasksRequest, context: Any) -> cluster_pb2.FinishTasksResponse:
        await self._executor.connection.registration_known(request.registration_id)
        attempts = tuple(codec.attempt_from_proto(a) for a in request.attempts)
        self._executor.handle(core.FinishTasks(request.job_id, attempts, request.registration_id,
                                               self._executor.stimulus("finish")))
        return cluster_pb2.FinishTasksResponse()

    async def SetRateLimits(self, request: cluster_pb2.SetRateLimitsRequest,
                            context: Any) -> cluster_pb2.SetRateLimitsResponse:
        await self._executor.connection.registration_known(request.registration_id)
        rates = tuple((codec.attempt_from_proto(t.attempt), t.records_per_second) for t in request.tasks)
        self._executor.handle(core.SetRateLimits(request.job_id, rates, request.registration_id,
                                                 self._executor.stimulus("rate")))
        return cluster_pb2.SetRateLimitsResponse()

    async def CancelTasks(self, request: cluster_pb2.CancelTasksRequest, context: Any) -> cluster_pb2.CancelTasksResponse:
        await self._executor.connection.registration_known(request.registration_id)
        stimulus = request.stimulus_id or self._executor.stimulus("cancel")
        for i, a in enumerate(request.attempts):
            if i and i % _CANCELS_PER_TURN == 0:
                await asyncio.sleep(0)
            self._executor.handle(core.CancelTask(request.job_id, codec.attempt_from_proto(a), request.registration_id,
                                                  stimulus))
        return cluster_pb2.CancelTasksResponse()

    async def UpdatePartitionInfo(self, request: cluster_pb2.UpdatePartitionInfoRequest,
                                  context: Any) -> cluster_pb2.UpdatePartitionInfoResponse:
        # Recorded once for every local task reading these partitions; the gates they complete
        # hand their tasks the inputs (or finish no-op tasks) within the same event.
        await self._executor.connection.registration_known(request.registration_id)
        updates = [codec.partition_update_from_proto(u) for u in request.updates]
        for start in range(0, len(updates), _UPDATES_PER_TURN):
            if start:
                await asyncio.sleep(0)
            self._executor.handle(core.PartitionsAvailable(
                request.job_id, tuple(updates[start:start + _UPDATES_PER_TURN]), request.registration_id,
                self._executor.stimulus("partitions")))
        return cluster_pb2.UpdatePartitionInfoResponse()

    async def FreeSlots(self, request: cluster_pb2.FreeSlotsRequest, context: Any) -> cluster_pb2.FreeSlotsResponse:
        await self._executor.connection.registration_known(request.registration_id)
        self._executor.handle(core.FreeSlots(request.job_id, tuple(request.slot_indexes), request.cause,
                                             request.registration_id, self._executor.stimulus("free-slots")))
        return cluster_pb2.FreeSlotsResponse()

    async def ReleasePartitions(self, request: cluster_pb2.ReleasePartitionsRequest,
                                context: Any) -> cluster_pb2.ReleasePartitionsResponse:
        """Answers once the partitions are deleted."""
        await self._executor.connection.registration_known(request.registration_id)
        refs = tuple(codec.partition_ref_from_proto(p) for p in request.partitions)
        await self._executor.release_partitions(core.ReleasePartitions(
            request.job_id, refs, request.whole_job, request.registration_id, self._executor.stimulus("release")))
        return cluster_pb2.ReleasePartitionsResponse()

