"""What a TaskManager on another machine needs from the JobManager, on this machine: the
JobManager dials back the address a TaskManager registers before taking its slots, and a
wildcard bind advertises a real address (not a host name resolving to 127.0.1.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from funke.deploy import localcluster
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jobmanager(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    info = localcluster.start(localcluster.ClusterSpec(root, 0, 1, no_spark=True,
                                                       dynamic=["cluster.registration.probe-timeout=2 s"]))
    client = info.client()
    yield info, client
    client.close()
    localcluster.stop(root)


def taskmanager(info, tm_id: str, log: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", info.address,
         "--slots", "1", "--id", tm_id, *flags, *localcluster.security_options(info.dir)],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)  # the process we started, by its pid
        process.wait(10)




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
    process = taskmanager(info, "tm-wildcard", tmp_path / "tm.log", "--host", "0.0.0.0", "--insecure")
    try:
        tm = wait_for("the registration", lambda: next(
            (t for t in client.cluster_overview().task_managers if t.id == "tm-wildcard"), None))
        # the JobManager is on 127.0.0.1: the route there starts at 127.0.0.1, and the probe
        # reached it there
        assert tm.address.rpartition(":")[0] == "127.0.0.1"
    finally:
        stop(process)


def test_the_users_python_for_spark_workers_is_the_one_they_run(jobmanager, tmp_path):
    """PYSPARK_PYTHON set by the user (here a wrapper that leaves a mark, then runs our Python)
    is what Spark's Python workers run; the TaskManager used to overwrite it with its own."""
    from funke.common.api.dsl import ExecutionEnvironment

    info, client = jobmanager
    mark = tmp_path / "ran"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\ntouch {mark}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    log = tmp_path / "tm.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", info.address, "--slots", "1",
         "--id", "tm-own-python", "--no-warm-up", *localcluster.security_options(info.dir)],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=str(wrapper)))
    try:
        wait_for("the registration", lambda: any(t.id == "tm-own-python" for t in client.cluster_overview().task_managers),
                 timeout=120)
        env = ExecutionEnvironment("python check", parallelism=1)
        env.from_collection([(1, 0), (2, 0)], "x bigint, k bigint").map(lambda r: (r.x * 10,), schema="y bigint").collect()
        job_id = client.submit(env.build())
        rows = wait_for("the result", lambda: _result(client, job_id), timeout=120)
        assert sorted(r["y"] for r in rows) == [10, 20]
        assert mark.exists(), "Spark's Python workers did not run the user's PYSPARK_PYTHON"
        assert f"Spark's Python workers run {wrapper} (PYSPARK_PYTHON)" in log.read_text()
    finally:
        stop(process)


def _result(client, job_id):
    from funke.v1 import job_pb2

    status = job_pb2.JobStatus.Name(client.get_job(job_id).status)
    if status in ("JOB_STATUS_FAILED", "JOB_STATUS_CANCELED"):
        raise AssertionError(f"the job ended {status}: {client.get_job(job_id).failure.message}")
    return client.result(job_id) if status == "JOB_STATUS_FINISHED" else None


def test_the_dashboard_rest_api_and_metrics_follow_the_host_the_cluster_serves_on_with_tls(tmp_path):
    """`--host 127.0.0.2` (an address of this machine other than 127.0.0.1) with TLS: the
    dashboard, the REST API and every process's metrics bind it, serve HTTPS, and say so."""
    import json
    import ssl
    import urllib.request

    import psutil

    root = tmp_path / "cluster"
    info = localcluster.start(localcluster.ClusterSpec(root, 1, 1, no_spark=True, host="127.0.0.2", tls="tls"))
    try:
        assert info.address.startswith("127.0.0.2:")
        assert info.dashboard_url.startswith("https://127.0.0.2:"), info.dashboard_url
        context = ssl.create_default_context(cafile=str(root / "security" / "tls" / "ca.pem"))
        token = (root / "security" / "client.token").read_text().strip()

        def get(url: str, path: str = ""):
            request = urllib.request.Request(url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.read().decode()

        overview = json.loads(get(info.dashboard_url, "/overview"))
        assert overview["metrics"].startswith("https://127.0.0.2:"), overview
        assert "funke_" in get(overview["metrics"])
        [tm] = wait_for("the TaskManager", lambda: json.loads(get(info.dashboard_url, "/taskmanagers"))["taskmanagers"])
        tm_metrics = tm["resources"]["metrics"]
        assert tm_metrics.startswith("https://127.0.0.2:"), tm
        assert "funke_" in get(tm_metrics)
        # nothing of the JobManager's listens on 127.0.0.1 (or every address)
        listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)  # gRPC listens IPv6-mapped
                     for c in psutil.Process(info.jobmanager.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        ports = {int(u.rsplit(":", 1)[1].split("/")[0]) for u in (info.dashboard_url, overview["metrics"], info.address)}
        assert {(ip, port) for ip, port in listening if port in ports} == {("127.0.0.2", port) for port in ports}
    finally:
        localcluster.stop(root)
