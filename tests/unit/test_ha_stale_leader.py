"""A JobManager whose view of the election is stale — it was paused (SIGSTOP, a hung host) while
another was elected — must not act on it: it confirms with the HA services that it still leads
before writing TaskManagers off for their silence, ignores heartbeat streams that broke once its
lease ran out, and as a standby names the leader the services name now, not the one it last saw.

In process, on the real filesystem HA services, with the real ResourceManager, LeaderElection
and JobManagerRole; the TaskManagers are only registrations (nothing listens at their address).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from grpc_health.v1 import health

from funke.common.configuration import ClusterConfiguration
from funke.common.leadership import Contender, Lease
from funke.runtime.hafilesystem import FileSystemHaServices
from funke.jobmanager.highavailability import LeaderElection
from funke.jobmanager.mailbox import Mailbox
from funke.jobmanager.main import JobManagerRole
from funke.jobmanager.resourcemanager import ResourceManager
from funke.jobmanager.services import _current
from funke.v1 import cluster_pb2

WAIT_S = 10.0


class Leadership:
    """What the ResourceManager asks of the HA services: whether its lease is still valid by its
    own clock (`leads`), and whether the services confirm it leads (`confirm`, counted)."""

    def __init__(self, leads: bool, confirmed: bool):
        self._leads, self.confirmed, self.asked = leads, confirmed, 0

    def leads(self) -> bool:
        return self._leads

    async def confirm(self) -> bool:
        self.asked += 1
        return self.confirmed


class JobMaster:
    def __init__(self) -> None:
        self.lost: list[str] = []

    def on_task_manager_lost(self, task_manager_id: str, cause: str) -> None:
        self.lost.append(task_manager_id)


def _resource_manager(leadership: Leadership, jm: JobMaster) -> ResourceManager:
    config = ClusterConfiguration(heartbeat_interval_s=0.05, heartbeat_timeout_s=0.2)
    return ResourceManager(config, Mailbox(), job_master=lambda job_id: None, running_job_masters=lambda: [jm],
                           session="e1.", leader_epoch=1, leadership=leadership)


def _register(rm: ResourceManager, tm_id: str) -> str:
    return rm.register(cluster_pb2.RegisterTaskManagerRequest(
        task_manager_id=tm_id, address="127.0.0.1:1", number_of_slots=1, registration_token="t")).registration_id


async def _until(what: str, predicate, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_silent_taskmanagers_are_written_off_only_once_the_ha_services_confirm_the_leadership():
    async def scenario() -> None:
        leadership, jm = Leadership(leads=True, confirmed=False), JobMaster()
        rm = _resource_manager(leadership, jm)
        rm.start()
        try:
            _register(rm, "tm-1")
            # silent past the heartbeat timeout, but the services do not confirm we lead
            await _until("the leadership to be asked about", lambda: leadership.asked >= 3)
            assert "tm-1" in rm.slots.task_managers and jm.lost == []
            leadership.confirmed = True
            await _until("tm-1 to be written off", lambda: jm.lost)
            assert jm.lost == ["tm-1"] and "tm-1" not in rm.slots.task_managers
        finally:
            await rm.stop()

    asyncio.run(scenario())


def test_a_heartbeat_stream_that_broke_after_the_lease_ran_out_writes_no_taskmanager_off():
    async def scenario() -> None:
        leadership, jm = Leadership(leads=False, confirmed=False), JobMaster()
        rm = _resource_manager(leadership, jm)
        try:
            registration = _register(rm, "tm-1")
            rm.connection_lost("tm-1", registration, "heartbeat connection broken (CancelledError)")
            assert "tm-1" in rm.slots.task_managers and jm.lost == []
            leadership._leads = True  # a leader's own broken stream: written off at once, as before
            rm.connection_lost("tm-1", registration, "heartbeat connection broken (CancelledError)")
            assert jm.lost == ["tm-1"]
        finally:
            await rm.stop()

    asyncio.run(scenario())


async def _noop(*_args) -> None:
    return None


def _steal(services: FileSystemHaServices, address: str, epoch: int) -> Lease:
    """Another JobManager leads with `epoch` now, as the lease file says."""
    lease = Lease("other:2:2", epoch, address, time.time(), 60.0, since=time.time())
    services.write_lease(lease)
    return lease


def test_a_leader_confirms_its_leadership_with_the_store_and_learns_it_was_replaced(tmp_path):
    services = FileSystemHaServices(str(tmp_path / "ha"), "c", 60.0)

    async def scenario() -> None:
        election = LeaderElection(services, "127.0.0.1:1", _noop, _noop)
        election.start()
        try:
            await _until("leadership", lambda: election.leading_epoch == 1)
            assert await election.context(1).confirm()
            _steal(services, "127.0.0.1:2", 2)  # by its own clock its lease still runs for a minute
            assert election.leads()
            assert not await election.context(1).confirm()
            await _until("stepping down", lambda: election.leading_epoch is None)
        finally:
            await election.stop()

    asyncio.run(scenario())


class _Context:
    """What `_current` aborts with, as a gRPC servicer context does."""

    def __init__(self) -> None:
        self.aborted: tuple | None = None

    async def abort(self, code, message):
        self.aborted = (code, message)
        raise RuntimeError("aborted")


def test_a_standby_whose_last_view_is_stale_names_the_leader_the_store_names_now(tmp_path):
    services = FileSystemHaServices(str(tmp_path / "ha"), "c", 3.0)
    services.create_dirs()

    async def scenario() -> None:
        election = LeaderElection(services, "127.0.0.1:1", _noop, _noop)  # not started: a paused process
        # what it saw last, before it was paused: itself leading epoch 1, long ago
        election.lease = Lease(election.contender.holder, 1, "127.0.0.1:1", time.time() - 60, 3.0, since=0.0)
        leader = Contender("other:2:2", "127.0.0.1:2", 3.0)
        services.contend(leader)
        role = JobManagerRole(ClusterConfiguration(), health.aio.HealthServicer())
        role.election = election
        context = _Context()
        with pytest.raises(RuntimeError, match="aborted"):
            await _current(role.current, context)
        code, message = context.aborted
        assert code.name == "UNAVAILABLE"
        assert message == "this JobManager is a standby (high availability); the leader is 127.0.0.1:2 (epoch 1)"

    asyncio.run(scenario())
