"""The JobManager gateway over gRPC: the ResourceManager service (register, heartbeat stream) and
the JobMaster service (task states) of the JobManager the TaskManager follows, one channel each
time it follows a new one. Translation only: what to do about an answer is decided by the
registration core and the task core."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from funke.common.graph.deployment import TaskReport
from funke.common.scheduling.slotmanager import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from funke.common.task.registration import Registration
from funke.common.task.taskexecutorstate import TaskExecutorState
from funke.common.wire import codec
from funke.runtime import security
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS
from funke.taskmanager.jobmanagergateway import GatewayError, RegistrationRequest
from funke.v1 import cluster_pb2, cluster_pb2_grpc

# gRPC's own reconnect backoff defaults to 1 s growing to 120 s; a restarted JobManager must be
# found within our 2 s backoff, so the channel may not sleep longer than that.
CHANNEL_OPTIONS = (
    *MESSAGE_SIZE_OPTIONS,  # bounded both ways, as on every funke channel and server
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
_STATES_PER_TURN = 250
# A channel left for a new leader's is closed once what is in flight on it has timed out.
_OLD_CHANNEL_GRACE_S = 20.0


def _error(e: grpc.aio.AioRpcError) -> GatewayError:
    return GatewayError(e.code().name, e.details() or "")


class _GrpcHeartbeat:
    def __init__(self, stub: cluster_pb2_grpc.ResourceManagerStub, task_manager_id: str,
                 slot_report: Callable[[], cluster_pb2.SlotReport]):
        self._call = stub.Heartbeat()
        self._id = task_manager_id
        self._slot_report = slot_report

    async def send(self, registration_id: str) -> None:
        try:
            await self._call.write(cluster_pb2.HeartbeatRequest(
                task_manager_id=self._id, registration_id=registration_id, slot_report=self._slot_report()))
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None

    async def read(self) -> bool | None:
        try:
            answer = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        return None if answer is grpc.aio.EOF else bool(answer.reregister)

    def close(self) -> None:
        self._call.cancel()


class GrpcJobManagerGateway:
    def __init__(self, task_manager_id: str, core: TaskExecutorState, address: str, cluster_token: str,
                 tls: security.Tls | None):
        self._id = task_manager_id
        self._core = core
        self._token = cluster_token or None
        self._tls = tls
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._resource_manager: cluster_pb2_grpc.ResourceManagerStub | None = None
        self._job_master: cluster_pb2_grpc.JobMasterStub | None = None
        self._report_call: Any = None
        self._slot_report: tuple[int, cluster_pb2.SlotReport] | None = None
        self.connect(address)

    def connect(self, address: str) -> None:
        if self._channel is not None and address == self.address:
            return
        if self._channel is not None:
            # Not closed now: that would cancel a report being sent (it is sent again either way).
            old = self._channel
            loop = asyncio.get_running_loop()
            loop.call_later(_OLD_CHANNEL_GRACE_S, lambda: loop.create_task(old.close(), name="close-old-channel"))
        self.address = address
        self._channel = security.aio_channel(address, self._token, self._tls, CHANNEL_OPTIONS)
        self._resource_manager = cluster_pb2_grpc.ResourceManagerStub(self._channel)
        self._job_master = cluster_pb2_grpc.JobMasterStub(self._channel)

    def slot_report(self) -> cluster_pb2.SlotReport:
        """The slot report, kept as one message: only the slots that changed since the last
        heartbeat are rewritten."""
        core = self._core
        version = core.slot_version
        if self._slot_report is None:
            self._slot_report = (-1, cluster_pb2.SlotReport(
                slots=[cluster_pb2.SlotStatus(index=i) for i in range(len(core.slots))]))
        known, report = self._slot_report
        if known != version:
            for view in core.slots_changed(known):
                status = report.slots[view.index]
                status.job_id = view.job_id or ""
                del status.running[:]
                status.running.extend(codec.attempt_to_proto(a) for a in view.running)
            self._slot_report = (version, report)
        return report

    async def register(self, request: RegistrationRequest, timeout_s: float) -> Registration:
        assert self._resource_manager is not None
        call = self._resource_manager.RegisterTaskManager(cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id=request.task_manager_id, address=request.address, number_of_slots=request.number_of_slots,
            resources=dict(request.resources), slot_report=self.slot_report(), registration_token=request.token),
            timeout=timeout_s)
        try:
            response = await call
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        finally:
            if not call.done():  # given up (a new leader): the call goes too
                call.cancel()
        return Registration(
            registration_id=response.registration_id,
            heartbeat_interval_s=response.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_INTERVAL_S,
            heartbeat_timeout_s=response.heartbeat_timeout_seconds or DEFAULT_HEARTBEAT_TIMEOUT_S,
            data_dir=response.data_dir,
            leader_epoch=response.leader_epoch,
        )

    def heartbeat(self) -> _GrpcHeartbeat:
        assert self._resource_manager is not None
        return _GrpcHeartbeat(self._resource_manager, self._id, self.slot_report)

    async def update_task_states(self, reports: Sequence[TaskReport], current: Callable[[], bool],
                                 timeout_s: float) -> bool:
        assert self._job_master is not None
        request = cluster_pb2.UpdateTaskExecutionStateRequest()
        for i, report in enumerate(reports):
            if i and i % _STATES_PER_TURN == 0:
                await asyncio.sleep(0)  # a batch of 1 000 is several ms to build
            request.updates.append(codec.report_to_proto(report))
        if not current():
            return False  # the JobManager was lost while we built it
        self._report_call = call = self._job_master.UpdateTaskExecutionState(request, timeout=timeout_s)
        try:
            await call
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        finally:
            self._report_call = None
        return True

    def cancel_reports(self) -> None:
        if self._report_call is not None:
            self._report_call.cancel()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
