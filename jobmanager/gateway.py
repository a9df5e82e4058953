"""Calls from the JobManager to one TaskManager: ordered, batched, off the caller's path.

Each TaskManager gets one queue and one sender coroutine. Order matters (a CancelTasks must not
overtake the SubmitTasks it cancels; a partition update must follow the deployment it updates),
so calls leave in the order they were made; consecutive calls of one kind for one job travel as
one RPC, which is what makes deploying thousands of tasks cheap.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import grpc

from funke.common.backoff import Backoff
from funke.common.graph.executiongraph import FailureInfo
from funke.runtime import security
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS
from funke.jobmanager import reachability
from funke.v1 import cluster_pb2, cluster_pb2_grpc, job_pb2

log = logging.getLogger("funke.jobmanager")

CHANNEL_OPTIONS = MESSAGE_SIZE_OPTIONS
RPC_TIMEOUT_S = 60.0
MAX_BATCH = 2000
# Deployment descriptors are larger: a TaskManager parses a SubmitTasks in one go on its loop.
MAX_SUBMIT_BATCH = 500
# ... and each carries its vertex's functions: a batch also stops at this many bytes, well
# within the message limit.
MAX_SUBMIT_BYTES = 32 * 1024 * 1024
PROBE_TIMEOUT_S = 2.0  # after a deployment found the TaskManager unreachable
MAX_RETRIES = 5  # for calls other than deployments, which fail the task instead
RETRY_BACKOFF = Backoff(0.4, 0.4 * 2 ** (MAX_RETRIES - 1))  # retry 1 waits 0.4 s, ... retry 5 6.4 s
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)

DeployFailed = Callable[[str, job_pb2.ExecutionAttemptId, FailureInfo], None]
# A TaskManager that deployments cannot reach, nor a probe: (its id, its registration, why)
Unreachable = Callable[[str, str, str], None]
# A micro-batch a task did not take: (job, the task's attempt, why)
BatchRefused = Callable[[str, job_pb2.ExecutionAttemptId, str], None]


@dataclass(slots=True)
class _Call:
    kind: str  # submit | cancel | update | free | release | batch | finish
    job_id: str
    items: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    retries: int = 0
    size: int = 0  # bytes of the items, as far as the caller told


class TaskManagerGateway:
    def __init__(self, task_manager_id: str, address: str, on_deploy_failed: DeployFailed, registration_id: str = "",
                 on_unreachable: Unreachable | None = None, token: str = "", tls: security.Tls | None = None):
        self.task_manager_id = task_manager_id
        self.address = address
        # Every call names the registration it is for: a TaskManager that registered again since
        # ignores it (fencing of a registration that is over).
        self.registration_id = registration_id
        self._on_deploy_failed = on_deploy_failed
        self._on_unreachable = on_unreachable
        self._probing = False
        # `token`: the one the TaskManager sent with this registration; it obeys no other caller.
        self._tls = tls
        self._channel = security.aio_channel(address, token or None, tls, CHANNEL_OPTIONS)
        self._stub = cluster_pb2_grpc.TaskExecutorStub(self._channel)
        self._queue: deque[_Call] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._sender = asyncio.get_running_loop().create_task(self._send_forever(), name=f"gateway-{task_manager_id}")

    # -- calls (return at once; the sender delivers them in order) --

    def submit(self, descriptor: cluster_pb2.TaskDeploymentDescriptor, size: int = 0) -> None:
        """`size`: about how many bytes the descriptor has (its vertex's functions and config)."""
        self._enqueue("submit", descriptor.job_id, descriptor, size=size)

    def cancel(self, job_id: str, attempt: job_pb2.ExecutionAttemptId, stimulus_id: str = "") -> None:
        self._enqueue("cancel", job_id, attempt, stimulus_id=stimulus_id)

    def update_partition(self, job_id: str, update: cluster_pb2.PartitionInfoUpdate) -> None:
        self._enqueue("update", job_id, update)

    def free_slot(self, job_id: str, slot_index: int, cause: str) -> None:
        # Batched per job; the per-slot cause is the JobManager's to log, not worth an RPC each.
        log.debug("freeing slot %d of TaskManager %s for job %s: %s", slot_index, self.task_manager_id, job_id, cause)
        self._enqueue("free", job_id, slot_index)

    def release_partitions(self, job_id: str, refs: list[cluster_pb2.ResultPartitionRef], whole_job: bool = False) -> None:
        self._queue.append(_Call("release", job_id, list(refs), {"whole_job": whole_job}))
        self._wakeup.set()

    def run_batch(self, request: cluster_pb2.RunBatchesRequest, refused: BatchRefused) -> None:
        """A micro-batch for some of a job's streaming tasks. Each task that does not take it
        (refused, or the call failed) is handed to `refused`: the batch cannot complete."""
        if self._closed:
            for t in request.tasks:
                refused(request.job_id, t.attempt, f"TaskManager {self.task_manager_id} is gone")
            return
        self._queue.append(_Call("batch", request.job_id, [request], {"refused": refused}))
        self._wakeup.set()

    def finish_tasks(self, job_id: str, attempts: list[job_pb2.ExecutionAttemptId]) -> None:
        """End these streaming tasks once their batches given are done (a graceful stop)."""
        for attempt in attempts:
            self._enqueue("finish", job_id, attempt)

    def set_rate_limits(self, job_id: str, rates: list[tuple[job_pb2.ExecutionAttemptId, float]]) -> None:
        """Backpressure: the records a second these receivers may take from now on (sent in
        order with the job's batches, so a batch sent later never carries an older rate)."""
        for attempt, rate in rates:
            self._enqueue("rates", job_id, cluster_pb2.TaskRateLimit(attempt=attempt, records_per_second=rate))

    def _enqueue(self, kind: str, job_id: str, item, size: int = 0, **extra) -> None:
        if self._closed:
            if kind == "submit":
                self._fail_deployments([item], f"TaskManager {self.task_manager_id} is gone")
            return
        last = self._queue[-1] if self._queue else None
        limit = MAX_SUBMIT_BATCH if kind == "submit" else MAX_BATCH
        if (last is not None and last.kind == kind and last.job_id == job_id and last.extra == extra
                and len(last.items) < limit and last.size + size <= MAX_SUBMIT_BYTES):
            last.items.append(item)
            last.size += size
        else:
            self._queue.append(_Call(kind, job_id, [item], extra, size=size))
        self._wakeup.set()

    async def close(self) -> None:
        """The TaskManager is gone: fail what was not delivered, stop sending."""
        self._closed = True
        pending = [d for call in self._queue if call.kind == "submit" for d in call.items]
        self._queue.clear()
        self._sender.cancel()
        if pending:
            self._fail_deployments(pending, f"TaskManager {self.task_manager_id} is gone")
        await self._channel.close()

    # -- sending --

    async def _send_forever(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            call = self._queue.popleft()
            try:
                await self._send(call)
            except grpc.aio.AioRpcError as exc:
                detail = f"{exc.code().name}: {exc.details()}"
                if call.kind in ("submit", "batch") and exc.code() is grpc.StatusCode.UNAVAILABLE:
                    self._probe_reachability(detail)
                if call.kind == "submit":
                    self._fail_deployments(call.items, f"could not deploy to TaskManager {self.task_manager_id}: {detail}")
                elif call.kind == "batch":  # a batch half given cannot complete: the run fails
                    for request in call.items:
                        for t in request.tasks:
                            call.extra["refused"](request.job_id, t.attempt,
                                                  f"TaskManager {self.task_manager_id} did not take the batch: {detail}")
                elif call.retries < MAX_RETRIES and exc.code() in _TRANSIENT:
                    # A cancel that does not arrive leaves a task running: try again, in order.
                    call.retries += 1
                    log.warning("%s to TaskManager %s failed (%s); retry %d", call.kind, self.task_manager_id,
                                detail, call.retries)
                    await asyncio.sleep(RETRY_BACKOFF.delay(call.retries - 1))
                    self._queue.appendleft(call)
                else:
                    log.warning("%s to TaskManager %s failed: %s", call.kind, self.task_manager_id, detail)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the sender for every later call
                log.exception("sending %s to TaskManager %s", call.kind, self.task_manager_id)

    async def _send(self, call: _Call) -> None:
        registration = self.registration_id
        if call.kind == "submit":
            response = await self._stub.SubmitTasks(cluster_pb2.SubmitTasksRequest(
                tasks=call.items, registration_id=registration), timeout=RPC_TIMEOUT_S)
            by_attempt = {(r.attempt.vertex_id, r.attempt.subtask_index, r.attempt.attempt_number): r for r in response.results}
            for d in call.items:
                r = by_attempt.get((d.attempt.vertex_id, d.attempt.subtask_index, d.attempt.attempt_number))
                if r is None or not r.accepted:
                    self._fail_deployments([d], f"TaskManager {self.task_manager_id} rejected the task: "
                                                f"{r.error if r else 'no answer for it'}")
        elif call.kind == "cancel":
            await self._stub.CancelTasks(cluster_pb2.CancelTasksRequest(
                job_id=call.job_id, attempts=call.items, stimulus_id=call.extra.get("stimulus_id", ""),
                registration_id=registration), timeout=RPC_TIMEOUT_S)
        elif call.kind == "update":
            await self._stub.UpdatePartitionInfo(cluster_pb2.UpdatePartitionInfoRequest(
                job_id=call.job_id, updates=call.items, registration_id=registration), timeout=RPC_TIMEOUT_S)
        elif call.kind == "free":
            await self._stub.FreeSlots(cluster_pb2.FreeSlotsRequest(
                slot_indexes=call.items, job_id=call.job_id, cause="released by the job",
                registration_id=registration), timeout=RPC_TIMEOUT_S)
        elif call.kind == "batch":
            for request in call.items:
                request.registration_id = registration
                response = await self._stub.RunBatches(request, timeout=RPC_TIMEOUT_S)
                answered = {(r.attempt.vertex_id, r.attempt.subtask_index, r.attempt.attempt_number): r
                            for r in response.results}
                for t in request.tasks:
                    r = answered.get((t.attempt.vertex_id, t.attempt.subtask_index, t.attempt.attempt_number))
                    if r is None or not r.accepted:
                        call.extra["refused"](request.job_id, t.attempt, r.error if r else "no answer for it")
        elif call.kind == "finish":
            await self._stub.FinishTasks(cluster_pb2.FinishTasksRequest(
                job_id=call.job_id, attempts=call.items, registration_id=registration),
                timeout=RPC_TIMEOUT_S)
        elif call.kind == "rates":
            await self._stub.SetRateLimits(cluster_pb2.SetRateLimitsRequest(
                job_id=call.job_id, tasks=call.items, registration_id=registration), timeout=RPC_TIMEOUT_S)
        elif call.kind == "release":
            await self._stub.ReleasePartitions(cluster_pb2.ReleasePartitionsRequest(
                job_id=call.job_id, partitions=call.items, whole_job=call.extra["whole_job"],
                registration_id=registration), timeout=RPC_TIMEOUT_S)

    def _probe_reachability(self, detail: str) -> None:
        """A deployment found no connection: if a probe finds none either, the TaskManager is lost
        now (its slots are not offered again; it registers anew, and registration checks its
        address), instead of every job failing deployments there until its heartbeat times out."""
        if self._on_unreachable is None or self._probing or self._closed:
            return
        self._probing = True

        async def probe() -> None:
            try:
                why = await reachability.unreachable(self.address, PROBE_TIMEOUT_S, self._tls)
                if why is not None and not self._closed:
                    self._on_unreachable(self.task_manager_id, self.registration_id,
                                         f"unreachable at {self.address}: deployments failed ({detail}), "
                                         f"and so did a probe ({why})")
            finally:
                self._probing = False

        asyncio.get_running_loop().create_task(probe(), name=f"probe-{self.task_manager_id}")

    def _fail_deployments(self, descriptors, message: str) -> None:
        for d in descriptors:
            self._on_deploy_failed(d.job_id, d.attempt, FailureInfo("DeploymentFailed", message))
