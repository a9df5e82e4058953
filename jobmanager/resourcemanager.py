"""The ResourceManager: TaskManager registrations, heartbeats, and slots, on the main thread.

A thin shell around the sans-IO `SlotManager`: it feeds it registrations, heartbeats, broken
heartbeat streams and clock ticks, and routes what comes out — slots to the JobMaster that asked,
FreeSlot calls to TaskManagers, and a lost TaskManager to every running job (their tasks there
fail; partitions that lived there are gone).

With high availability only a leader writes TaskManagers off, and it makes sure it still is one
first: a JobManager that was paused or cut off sees every TaskManager silent and every heartbeat
stream broken when it resumes, while another leader may have their registrations now. A broken
stream is acted on only while its lease is still valid by its own clock; TaskManagers silent past
the heartbeat timeout only once the HA services confirmed, in a round of the election, that it
still leads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable, Iterable

from funke.common.scheduling import slotmanager as sm
from funke.common.configuration import ClusterConfiguration
from funke.common.graph.executiongraph import SlotId
from funke.common.scheduling.slotsharing import SlotRequest
from funke.common.wire.codec import timestamp
from funke.runtime.security import Tls
from funke.jobmanager.gateway import TaskManagerGateway
from funke.jobmanager.mailbox import Mailbox
from funke.v1 import cluster_pb2, jobmanager_pb2

if TYPE_CHECKING:
    from funke.jobmanager.highavailability import HaContext

log = logging.getLogger("funke.jobmanager")


class ResourceManager:
    def __init__(
        self,
        config: ClusterConfiguration,
        mailbox: Mailbox,
        *,
        job_master: Callable[[str], object | None],
        running_job_masters: Callable[[], Iterable[object]],
        session: str = "",
        leader_epoch: int = 0,
        tls: Tls | None = None,
        leadership: HaContext | None = None,
    ):
        self.config = config
        self.tls = tls
        self.mailbox = mailbox
        self.slots = sm.SlotManager(heartbeat_timeout_s=config.heartbeat_timeout_s,
                                    evenly_spread=config.evenly_spread_out_slots, session=session)
        self.leader_epoch = leader_epoch
        self.leadership = leadership  # with high availability: whether (and that) we still lead
        self._job_master = job_master
        self._running = running_job_masters
        self._gateways: dict[str, TaskManagerGateway] = {}
        self._check_task: asyncio.Task | None = None

    def start(self) -> None:
        self._check_task = asyncio.get_running_loop().create_task(self._check_forever(), name="resource-manager-check")

    async def stop(self) -> None:
        if self._check_task:
            self._check_task.cancel()
        for gateway in list(self._gateways.values()):
            await gateway.close()
        self._gateways.clear()

    # ------------------------------------------------------------------ TaskManagers

    def register(self, request: cluster_pb2.RegisterTaskManagerRequest) -> cluster_pb2.RegisterTaskManagerResponse:
        tm_id = request.task_manager_id
        registration_id, actions = self.slots.register(
            tm_id, request.address, request.number_of_slots, dict(request.resources), time.time())
        # the loss of an earlier incarnation is handled before the new one's gateway exists
        self._apply(a for a in actions if isinstance(a, sm.TaskManagerLost))
        self._gateways[tm_id] = TaskManagerGateway(tm_id, request.address, self._deploy_failed, registration_id,
                                                   on_unreachable=self._unreachable,
                                                   token=request.registration_token, tls=self.tls)
        log.info("TaskManager %s registered from %s with %d slots", tm_id, request.address, request.number_of_slots)
        self._apply(a for a in actions if not isinstance(a, sm.TaskManagerLost))
        return cluster_pb2.RegisterTaskManagerResponse(
            registration_id=registration_id,
            heartbeat_interval_seconds=self.config.heartbeat_interval_s,
            heartbeat_timeout_seconds=self.config.heartbeat_timeout_s,
            data_dir=self.config.data_dir,
            leader_epoch=self.leader_epoch,
        )

    def heartbeat(self, task_manager_id: str, registration_id: str) -> bool:
        return self.slots.heartbeat(task_manager_id, registration_id, time.time())

    def connection_lost(self, task_manager_id: str, registration_id: str, cause: str) -> None:
        if self.leadership is not None and not self.leadership.leads():
            # Our lease ran out (paused, cut off): the stream broke because the TaskManager
            # left for another leader, or ours is about to step down. Not ours to act on.
            log.info("TaskManager %s: %s; not acted on: this JobManager's lease ran out", task_manager_id, cause)
            return
        self._apply(self.slots.lose(task_manager_id, cause, time.time(), registration_id=registration_id))

    def gateway(self, task_manager_id: str) -> TaskManagerGateway | None:
        return self._gateways.get(task_manager_id)

    # ------------------------------------------------------------------ slots (from JobMasters)

    def request_slots(self, job_id: str, requests: tuple[SlotRequest, ...], timeout_s: float) -> None:
        self._apply(self.slots.request_slots(job_id, requests, timeout_s, time.time()))

    def cancel_request(self, job_id: str, request_id: int) -> None:
        self._apply(self.slots.cancel_request(job_id, request_id))

    def release_slot(self, slot: SlotId, job_id: str, cause: str) -> None:
        self._apply(self.slots.release_slot(slot, job_id, cause, time.time()))

    def release_job(self, job_id: str, cause: str) -> None:
        self._apply(self.slots.release_job(job_id, cause, time.time()))

    # ------------------------------------------------------------------ views

    def overview(self) -> jobmanager_pb2.ClusterOverview:
        msg = jobmanager_pb2.ClusterOverview(
            slots_total=self.slots.total_slots, slots_free=self.slots.free_slots, data_dir=self.config.data_dir)
        for tm in sorted(self.slots.task_managers.values(), key=lambda t: t.registered_at):
            info = msg.task_managers.add(
                id=tm.task_manager_id, address=tm.address, slots_total=len(tm.slots), slots_free=tm.free,
                registered_at=timestamp(tm.registered_at), last_heartbeat=timestamp(tm.last_heartbeat))
            info.resources.update(tm.resources)
            for i, holder in enumerate(tm.slots):
                info.slots.add(index=i, job_id=holder or "")
        return msg

    # ------------------------------------------------------------------ internals

    async def _check_forever(self) -> None:
        interval = max(0.05, self.config.heartbeat_interval_s / 2)
        while True:
            await asyncio.sleep(interval)
            silent = self.slots.overdue(time.time())
            if silent and self.leadership is not None and not await self.leadership.confirm():
                log.warning("TaskManager(s) %s silent past the heartbeat timeout; not written off: this "
                            "JobManager could not confirm that it still leads", ", ".join(silent))
                continue
            self.mailbox.run(lambda: self._apply(self.slots.check(time.time())))

    def _apply(self, actions: Iterable[sm.SlotManagerAction]) -> None:
        # Consecutive allocations (one pass of the SlotManager serves many requests) reach each
        # job as one event, where they stand among the other letters.
        served: dict[str, list[tuple[int, tuple]]] = {}

        def flush() -> None:
            for job_id, allocations in served.items():
                jm = self._job_master(job_id)
                if jm is None:  # the job is gone: give the slots back
                    for _, slots in allocations:
                        for slot in slots:
                            self.mailbox.run(lambda slot=slot, job_id=job_id: self.release_slot(slot, job_id, "job is gone"))
                else:
                    self.mailbox.run(lambda jm=jm, allocations=allocations: jm.on_allocations(allocations))
            served.clear()

        for a in list(actions):
            if isinstance(a, sm.SlotsAllocated):
                served.setdefault(a.job_id, []).append((a.request_id, a.slots))
                continue
            flush()
            if isinstance(a, sm.SlotRequestFailed):
                jm = self._job_master(a.job_id)
                if jm is not None:
                    self.mailbox.run(lambda jm=jm, a=a: jm.on_slot_request_failed(a.request_id, a.message))
            elif isinstance(a, sm.WaitingForResources):
                jm = self._job_master(a.job_id)
                if jm is not None:
                    self.mailbox.run(lambda jm=jm, a=a: jm.on_waiting_for_resources(a.message))
            elif isinstance(a, sm.FreeSlot):
                gateway = self._gateways.get(a.task_manager_id)
                if gateway is not None:
                    gateway.free_slot(a.job_id, a.slot_index, a.cause)
            elif isinstance(a, sm.TaskManagerLost):
                log.warning("TaskManager %s lost: %s", a.task_manager_id, a.cause)
                gateway = self._gateways.pop(a.task_manager_id, None)
                if gateway is not None:
                    asyncio.get_running_loop().create_task(gateway.close())
                # every running job: its tasks there fail, its partitions there are gone
                for jm in list(self._running()):
                    self.mailbox.run(lambda jm=jm, a=a: jm.on_task_manager_lost(a.task_manager_id, a.cause))
        flush()

    def _unreachable(self, task_manager_id: str, registration_id: str, cause: str) -> None:
        self.mailbox.run(lambda: self.connection_lost(task_manager_id, registration_id, cause))

    def _deploy_failed(self, job_id: str, attempt, failure) -> None:
        jm = self._job_master(job_id)
        if jm is not None:
            self.mailbox.run(lambda: jm.on_deploy_failed(attempt, failure))
