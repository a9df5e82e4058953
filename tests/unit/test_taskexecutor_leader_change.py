"""A TaskManager with high availability follows a leadership change while a call to the old
leader is still waiting for its answer: the old leader hangs (paused, as a leader on a host that
hangs), so the call would otherwise hold the TaskManager until its RPC timeout.

The TaskManager is the real process (`--no-spark`), finding its leader through real HA services:
the lease file, or the leader node of a real ZooKeeper server. The leaders are two fake
JobManagers of the test (as in test_taskexecutor.py); the one that hangs records each call it
never answers and how much of the call's deadline was left when the TaskManager gave it up.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from funke.common.leadership import Contender
from funke.common.security import Realm
from funke.runtime import security
from funke.runtime.hafilesystem import FileSystemHaServices
from funke.v1 import cluster_pb2, cluster_pb2_grpc
from tests.unit.test_taskexecutor import (REPO, WAIT_S, FakeJobManager, TaskManagerProcess, _JobMaster,
                                          _ResourceManager, attempt)

_clusters = itertools.count(1)


class Leader(FakeJobManager):
    """A fake JobManager that answers as the leader of `epoch`, or (`hang`) takes calls and never
    answers them, as a paused process does."""

    def __init__(self, data_dir: str, epoch: int):
        self.epoch = epoch
        self.hang_registrations = False
        self.hang_updates = False
        self.given_up: list[tuple[str, float]] = []  # (method, seconds of its deadline left) per call given up
        self.hanging: list[str] = []  # calls received and never answered
        super().__init__(data_dir)  # the token: <data_dir>/cluster.token, the same for both leaders

    async def _start(self, port: int) -> int:
        tokens = lambda realm: (self.cluster_token,) if realm is Realm.CLUSTER else ()  # noqa: E731
        server = grpc.aio.server(interceptors=[security.Authenticator("fake leader", tokens)])
        cluster_pb2_grpc.add_ResourceManagerServicer_to_server(_LeaderResourceManager(self), server)
        cluster_pb2_grpc.add_JobMasterServicer_to_server(_LeaderJobMaster(self), server)
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return bound

    async def hang(self, method: str, context: grpc.aio.ServicerContext) -> None:
        with self._cond:
            self.hanging.append(method)
            self._cond.notify_all()
        try:
            await asyncio.Event().wait()
        finally:  # cancelled: the caller gave up, or its deadline passed
            with self._cond:
                self.given_up.append((method, context.time_remaining() or 0.0))
                self._cond.notify_all()


class _LeaderResourceManager(_ResourceManager):
    async def RegisterTaskManager(self, request, context):
        if self.jm.hang_registrations:
            await self.jm.hang("RegisterTaskManager", context)
        response = await super().RegisterTaskManager(request, context)
        response.leader_epoch = self.jm.epoch
        return response


class _LeaderJobMaster(_JobMaster):
    async def UpdateTaskExecutionState(self, request, context):
        if self.jm.hang_updates:
            await self.jm.hang("UpdateTaskExecutionState", context)
        return await super().UpdateTaskExecutionState(request, context)


class Election:
    """Who leads, as the HA services of one backend say: `elect(leader)` makes `leader` the
    leader of its epoch, the one before stepping down first."""

    def __init__(self, backend: str, storage: Path, zookeeper: str | None):
        self.cluster = f"leader-change-{os.getpid()}-{next(_clusters)}"
        self.conf = {"high-availability.type": backend, "high-availability.storageDir": str(storage),
                     "high-availability.cluster-id": self.cluster}
        if backend == "zookeeper":
            from funke.runtime.hazookeeper import ZooKeeperHaServices

            assert zookeeper is not None
            self.conf["high-availability.zookeeper.quorum"] = zookeeper
            self.conf["high-availability.zookeeper.path.root"] = "/funke-test"
            self._make = lambda: ZooKeeperHaServices(zookeeper, str(storage), self.cluster, "/funke-test", 60.0)
        else:
            self._make = lambda: FileSystemHaServices(str(storage), self.cluster, 60.0)
        self._current: tuple[Contender, object] | None = None
        self._services: list = []

    def elect(self, leader: Leader) -> None:
        if self._current is not None:
            contender, services = self._current
            services.release(contender)
        services = self._make()
        self._services.append(services)
        services.create_dirs()
        contender = Contender(f"fake-{leader.port}", leader.address, 60.0)
        _, changes = services.contend(contender)
        assert contender.epoch == leader.epoch, (changes, leader.epoch)
        self._current = (contender, services)

    def write_conf(self, path: Path) -> Path:
        path.write_text("".join(f"{k}: {v}\n" for k, v in self.conf.items()))
        return path

    def close(self) -> None:
        for services in self._services:
            services.close()


class HaTaskManager(TaskManagerProcess):
    """The real TaskManager, finding its leader through the HA services of `conf`."""

    def __init__(self, jm: FakeJobManager, log_path: Path, tm_id: str, conf: Path):  # noqa: super-init-not-called
        self.id = tm_id
        self.jm = jm
        self.log_path = log_path
        self._log = open(log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", "127.0.0.1:1",
             "--slots", "2", "--id", tm_id, "--log-level", "DEBUG", "--config", str(conf),
             "-D", f"security.auth.cluster-token-file={jm.cluster_token_file}"],
            stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=REPO, env=env)
        self.stdout: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._channel = None
        self._channel_token = ""


@pytest.fixture(params=["filesystem", "zookeeper"])
def cluster(request, tmp_path: Path) -> Iterator[tuple[Election, Leader, Leader]]:
    """An election on one backend and two fake leaders: `old` (epoch 1) and `new` (epoch 2)."""
    zookeeper = request.getfixturevalue("zookeeper") if request.param == "zookeeper" else None
    election = Election(request.param, tmp_path / "ha", zookeeper)
    (tmp_path / "data").mkdir()
    old, new = Leader(str(tmp_path / "data"), 1), Leader(str(tmp_path / "data"), 2)
    yield election, old, new
    old.close()
    new.close()
    election.close()


def _start(election: Election, leader: Leader, tmp_path: Path) -> HaTaskManager:
    return HaTaskManager(leader, tmp_path / "tm.log", "tm-ha", election.write_conf(tmp_path / "ha.conf"))


def test_a_registration_waiting_on_a_hung_leader_is_given_up_for_the_new_leader(cluster, tmp_path: Path) -> None:
    election, old, new = cluster
    old.hang_registrations = True
    election.elect(old)
    tm = _start(election, old, tmp_path)
    try:
        old.wait_for("the registration that the hung leader never answers", lambda: "RegisterTaskManager" in old.hanging)
        election.elect(new)
        registration = new.wait_for("the registration with the new leader", lambda: new.registrations, 3 * WAIT_S)[0]
        assert registration.task_manager_id == "tm-ha"
        # Given up for the new leader, not waited out: the call to the hung leader ended with most
        # of its deadline (10 s) still to go.
        method, left = old.wait_for("the hung registration to end", lambda: old.given_up)[0]
        assert method == "RegisterTaskManager" and left > 2.0, (method, left, tm.log_tail())
        log = tm.log_path.read_text()
        assert f"a new leader was elected (epoch 2, at {new.address}) while registering with {old.address}" in log
        assert "does not answer yet" not in log  # no RPC timeout was waited out first
    finally:
        tm.kill()


def test_a_report_waiting_on_a_hung_leader_is_given_up_when_the_taskmanager_follows_the_new_leader(
        cluster, tmp_path: Path) -> None:
    election, old, new = cluster
    election.elect(old)
    tm = _start(election, old, tmp_path)
    try:
        tm.registration()
        old.hang_updates = True  # paused from now on: the task's reports never get an answer
        task = cluster_pb2.TaskDeploymentDescriptor(
            job_id="job-1", job_name="test job", attempt=attempt("source"), task_name="Source (1/1)",
            parallelism=1, slot_index=0)
        task.vertex.id, task.vertex.name, task.vertex.parallelism = "source", "Source", 1
        task.vertex.operators.add(kind="source.noop", name="Source", config_json="{}")
        response = tm.executor.SubmitTasks(cluster_pb2.SubmitTasksRequest(
            tasks=[task], registration_id=tm.registration_id()), timeout=WAIT_S)
        assert response.results[0].accepted, response.results[0].error
        old.wait_for("a report the hung leader never answers", lambda: "UpdateTaskExecutionState" in old.hanging)
        election.elect(new)
        new.wait_for("the registration with the new leader", lambda: new.registrations, 3 * WAIT_S)
        # The report was for the registration with the old leader: abandoned when the TaskManager
        # left it, not waited out for its RPC timeout (which would hold back the reports of
        # whatever the new leader deploys).
        method, left = old.wait_for("the hung report to end", lambda: old.given_up)[0]
        assert method == "UpdateTaskExecutionState" and left > 2.0, (method, left, tm.log_tail())
    finally:
        tm.kill()

