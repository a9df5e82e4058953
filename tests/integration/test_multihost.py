"""What a TaskManager on another machine needs from the JobManager, on this machine: the
JobManager dials back the address a TaskManager registers before taking its slots, and a
wildcard bind advertises a real address (not a host name resolving to 127.0.1.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from funke.deploy import localcluster
from funke.deploy.client import JobManagerClient

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jobmanager(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    info = localcluster.start(root, 0, 1, no_spark=True, dynamic=["cluster.registration.probe-timeout=2 s"])
    client = JobManagerClient(info.address)
    yield info, client
    client.close()
    localcluster.stop(root)


def taskmanager(info, tm_id: str, log: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", info.address,
         "--slots", "1", "--id", tm_id, *flags],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)  # the process we started, by its pid
        process.wait(10)


def wait_for(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_taskmanager_the_jobmanager_cannot_dial_is_refused_and_says_so(jobmanager, tmp_path):
    info, client = jobmanager
    log = tmp_path / "tm.log"
    # It binds 127.0.0.1 but tells the JobManager to dial 127.0.0.2, where nothing listens: the
    # heartbeat would work (the TaskManager dials out), every deployment would fail.
    process = taskmanager(info, "tm-unreachable", log, "--advertise-host", "127.0.0.2")
    try:
        wait_for("the refusal in the TaskManager's log", lambda: "refused the registration" in log.read_text())
        text = log.read_text()
        assert "cannot reach TaskManager 'tm-unreachable' at '127.0.0.2:" in text
        assert "--advertise-host" in text
        assert "tm-unreachable" not in {tm.id for tm in client.cluster_overview().task_managers}
        assert process.poll() is None  # it keeps trying: the operator may fix the network meanwhile
    finally:
        stop(process)


def test_a_wildcard_bind_advertises_the_address_the_jobmanager_sees(jobmanager, tmp_path):
    info, client = jobmanager
    process = taskmanager(info, "tm-wildcard", tmp_path / "tm.log", "--host", "0.0.0.0")
    try:
        tm = wait_for("the registration", lambda: next(
            (t for t in client.cluster_overview().task_managers if t.id == "tm-wildcard"), None))
        # the JobManager is on 127.0.0.1: the route there starts at 127.0.0.1, and the probe
        # reached it there
        assert tm.address.rpartition(":")[0] == "127.0.0.1"
    finally:
        stop(process)
