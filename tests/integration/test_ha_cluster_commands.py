"""The `funke cluster` commands on a high-availability cluster, with real processes (filesystem
backend, TaskManagers without Spark: the jobs are no-ops): bringing JobManagers back after all of
them died (`add-jobmanager`), the address file that never names a standby, a JobManager started by
hand that `status` shows and `stop` stops, what a standby answers the CLI, and the log of a
TaskManager started again under a dead one's name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from funke.common.graph.jobgraph import (IntermediateDataSet, JobEdge, JobGraph, JobVertex, OperatorSpec,
                                   ResultPartitionType)
from funke.deploy import localcluster
from funke.deploy.client import JobManagerClient
from funke.v1 import job_pb2
from tests.integration.conftest import REPO, _alive, funke

pytestmark = pytest.mark.cluster


def noop_job(parallelism: int, exchange: ResultPartitionType = ResultPartitionType.BLOCKING) -> JobGraph:
    """Source -> sink of no-ops; PIPELINED: one region of `parallelism` slots, all at once."""
    return JobGraph("noop", (JobVertex("src", "S", parallelism, (OperatorSpec("source.noop"),)),
                             JobVertex("sink", "K", parallelism, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
                    (IntermediateDataSet("src.out0", "src"),),
                    (JobEdge("e", "src.out0", "sink", result_partition_type=exchange),))


def follower(d: Path) -> JobManagerClient:
    return JobManagerClient(localcluster.read_address(d) or "127.0.0.1:1", timeout=10, failover_timeout=60,
                            credentials=localcluster.credentials(d), leader=lambda: localcluster.read_address(d))


def wait_status(client: JobManagerClient, job_id: str, wanted: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = job_pb2.JobStatus.Name(client.get_job(job_id).status).removeprefix("JOB_STATUS_")
        if status == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is {status}, not {wanted}")


def wait_registered(client: JobManagerClient, names: set[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    registered: set[str] = set()
    while time.monotonic() < deadline:
        try:
            registered = {tm.id for tm in client.cluster_overview().task_managers}
        except Exception:
            registered = set()
        if registered >= names:
            return
        time.sleep(0.1)
    raise AssertionError(f"registered: {registered}, expected {names}")


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"pid {pid} still runs"


@pytest.fixture
def cluster(tmp_path):
    """Two JobManagers (filesystem HA) and two TaskManagers without Spark, stopped afterwards; the
    test asserts nothing it started survives."""
    d = tmp_path / "cluster"
    funke("cluster", "start", "--ha", "filesystem", "--jobmanagers", "2", "--taskmanagers", "2", "--slots", "1",
          "--no-spark", "--dir", str(d), timeout=180)
    yield d
    pids = {p.stem: int(p.read_text()) for p in (d / "pids").glob("*.pid")}
    funke("cluster", "stop", "--dir", str(d), timeout=120)
    for name, pid in pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) survived `funke cluster stop`"


def new_leader(d: Path, after_epoch: int, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = localcluster.leader(d)
        if lease is not None and lease.epoch > after_epoch and lease.valid(time.time()):
            return lease
        time.sleep(0.05)
    raise AssertionError(f"no leader after epoch {after_epoch}")


def test_the_address_file_never_names_a_standby(cluster):
    d = cluster
    if localcluster.leader_name(d) == "jobmanager":  # make `jobmanager` the standby
        epoch = localcluster.leader(d).epoch
        localcluster.kill(d, "jobmanager")
        new_leader(d, epoch)
        localcluster.start_jobmanager(d, "jobmanager")
    assert localcluster.leader_name(d) == "jobmanager-2"
    # Whatever reads <dir>/jobmanager.address must not reach the standby: with HA there is none,
    # and whatever asks for the cluster's address gets the leader's, from the HA services.
    leader_address = localcluster.leader(d).address
    address_file = d / localcluster.ADDRESS_FILE
    if address_file.exists():
        assert address_file.read_text().strip() == leader_address, "the address file names the standby"
    assert not address_file.exists()
    assert localcluster.read_address(d) == leader_address
    status = funke("cluster", "status", "--dir", str(d), "--json")
    assert f'"address": "{leader_address}"' in status.stdout
    # each JobManager's own address, where the launcher waits for it
    own = {n: (d / "jobmanagers" / f"{n}.address").read_text().strip() for n in ("jobmanager", "jobmanager-2")}
    assert own["jobmanager-2"] == leader_address and own["jobmanager"] != leader_address


def test_after_every_jobmanager_died_add_jobmanager_brings_the_cluster_back_with_its_jobs(cluster):
    d = cluster
    client = follower(d)
    try:
        # 8 slots at once, the cluster has 2: it waits for TaskManagers, stored in the job graph store
        waiting = client.submit(noop_job(8, ResultPartitionType.PIPELINED))
        for name in ("jobmanager", "jobmanager-2"):
            localcluster.kill(d, name)
        refused = funke("cluster", "start", "--dir", str(d), "--ha", "filesystem", check=False)
        assert refused.returncode == 2  # a refusal before anything starts
        assert f"funke cluster add-jobmanager --dir {d}" in refused.stderr, refused.stderr
        down = funke("cluster", "status", "--dir", str(d), check=False)
        assert "no JobManager is running; start one again with `funke cluster add-jobmanager`" in down.stdout

        first = funke("cluster", "add-jobmanager", "--dir", str(d))
        assert first.stdout.startswith("jobmanager (pid ") and "it leads (epoch " in first.stdout, first.stdout
        second = funke("cluster", "add-jobmanager", "--dir", str(d))
        assert second.stdout.startswith("jobmanager-2 (pid ") and "standby; the leader is " in second.stdout
        log = (d / "log" / "jobmanager.log").read_text()
        assert "started again (funke cluster add-jobmanager)" in log

        wait_registered(client, {"tm-1", "tm-2"})
        assert job_pb2.JobStatus.Name(client.get_job(waiting).status) == "JOB_STATUS_CREATED"  # recovered
        client.cancel(waiting)
        done = client.submit(noop_job(parallelism=2))
        wait_status(client, done, "FINISHED")
        shown = funke("cluster", "status", "--dir", str(d))
        rows = {line.split()[0]: line for line in shown.stdout.splitlines()
                if line.strip().startswith(("jobmanager", "tm-"))}
        assert "leader, epoch" in rows["jobmanager"] and "standby" in rows["jobmanager-2"], shown.stdout
        assert "alive" in rows["tm-1"] and "alive" in rows["tm-2"]
        again = funke("cluster", "add-jobmanager", "jobmanager-2", "--dir", str(d), check=False)
        assert again.returncode == 2 and "jobmanager-2 (pid" in again.stderr and "still running" in again.stderr
        bad = funke("cluster", "add-jobmanager", "tm-9", "--dir", str(d), check=False)
        assert bad.returncode == 2 and "is no JobManager name" in bad.stderr
    finally:
        client.close()


def test_a_jobmanager_started_by_hand_is_shown_by_status_and_stopped_by_stop(cluster, tmp_path):
    d = cluster
    log = open(tmp_path / "by-hand.log", "wb")
    # As docs/operations/high-availability.md says to join one by hand: the cluster's ha.conf and its tokens.
    by_hand = subprocess.Popen(
        [sys.executable, "-m", "funke.jobmanager.main", "--port", "0", "--data-dir", str(d / "data"),
         "--config", str(d / "ha.conf"), *localcluster.security_options(d)],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        deadline = time.monotonic() + 60
        while "JobManager listening on" not in (tmp_path / "by-hand.log").read_text():
            assert by_hand.poll() is None and time.monotonic() < deadline, (tmp_path / "by-hand.log").read_text()
            time.sleep(0.1)
        name = f"jobmanager-pid{by_hand.pid}"
        deadline = time.monotonic() + 30
        while name not in {p.name for p in localcluster.status(d).processes}:
            assert time.monotonic() < deadline, "the JobManager started by hand is not shown"
            time.sleep(0.2)
        [shown] = [p for p in localcluster.status(d).processes if p.name == name]
        assert shown.alive and not shown.recorded and shown.pid == by_hand.pid
        assert shown.log == tmp_path / "by-hand.log"
        text = funke("cluster", "status", "--dir", str(d)).stdout
        assert f"{name}" in text and "joined by hand" in text, text
        # It leads once the others are gone; stop must stop it all the same.
        for jm in ("jobmanager", "jobmanager-2"):
            localcluster.kill(d, jm)
        localcluster.wait_for_leader(d, 30)
        deadline = time.monotonic() + 30
        while localcluster.leader(d) is None or str(by_hand.pid) not in localcluster.leader(d).holder:
            assert time.monotonic() < deadline, "the JobManager started by hand did not take over"
            time.sleep(0.1)
        stopped = funke("cluster", "stop", "--dir", str(d))
        assert f"{name} (pid {by_hand.pid}, joined by hand): stopped" in stopped.stdout, stopped.stdout
        by_hand.wait(30)
        assert by_hand.returncode == 0  # a graceful stop (SIGTERM), its jobs suspended for the next leader
    finally:
        if by_hand.poll() is None:
            os.kill(by_hand.pid, signal.SIGKILL)  # ours, by its pid
            by_hand.wait(10)
        log.close()


def test_a_standby_tells_the_cli_who_leads_instead_of_asking_to_start_a_cluster(cluster):
    d = cluster
    lease = localcluster.leader(d)
    standby = next(n for n in ("jobmanager", "jobmanager-2") if n != localcluster.leader_name(d))
    address = (d / "jobmanagers" / f"{standby}.address").read_text().strip()
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(d))
    answer = funke("list", "--jobmanager", address, check=False, env=env)
    assert answer.returncode == 2
    assert answer.stderr.strip() == (f"funke: the JobManager at {address} is a standby (high availability): "
                                     f"the leader is {lease.address} (epoch {lease.epoch})"), answer.stderr
    assert "funke cluster start" not in answer.stderr


def test_a_taskmanager_started_again_under_a_dead_ones_name_keeps_its_log(cluster):
    d = cluster
    log = d / "log" / "tm-2.log"
    before = log.read_text()
    assert "registered with the JobManager" in before
    pid = localcluster.kill(d, "tm-2")
    wait_gone(pid)
    funke("cluster", "add-taskmanager", "tm-2", "--slots", "1", "--dir", str(d))
    after = log.read_text()
    assert after.startswith(before), "the dead TaskManager's log was cut"
    separator = after[len(before):].lstrip("\n").splitlines()[0]
    assert separator.startswith("=====") and "tm-2 started again (funke cluster add-taskmanager)" in separator
    assert "registered with the JobManager" in after[len(before):]
