"""Real clusters for integration tests: a JobManager and TaskManager processes on loopback, started
through the `funke` CLI, torn down by the PIDs they recorded (never by name).

`spark_cluster`: 2 TaskManagers x 2 slots with PySpark, shared by the session (Spark start-up is
the expensive part). `streaming_cluster`: 3 TaskManagers x 2 slots with PySpark, shared by the
streaming modules, whose tests kill TaskManagers and start replacements. `noop_cluster`: 2 TaskManagers x 2 slots without Spark, for scheduling and
placement tests whose tasks are no-ops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from funke.deploy import localcluster
from funke.runtime import security
from funke.deploy.client import JobManagerClient
from funke.taskmanager.sparkruntime import scratch_dir_of

REPO = Path(__file__).resolve().parents[2]


def artifacts_dir(name: str) -> Path:
    """Where a test leaves what a person looks at afterwards (screenshots, the fuzzing and the
    security summaries): `$FUNKE_TEST_ARTIFACTS/<name>`, else `funke-test-artifacts/<name>` in
    the system's temporary directory; never the checkout, which a test run leaves as it found it."""
    base = os.environ.get("FUNKE_TEST_ARTIFACTS")
    return (Path(base) if base else Path(tempfile.gettempdir()) / "funke-test-artifacts") / name


def funke(*args: str, timeout: float = 180, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the funke CLI as a user would, in a separate process."""
    result = subprocess.run(
        [sys.executable, "-m", "funke.deploy.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env or dict(os.environ),
    )
    if check and result.returncode != 0:
        raise AssertionError(f"funke {' '.join(args)} exited {result.returncode}\n"
                             f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


@dataclass
class Cluster:
    dir: Path
    address: str
    client: JobManagerClient

    def funke(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """A job command against this cluster, finding its tokens as a user's shell would
        (FUNKE_CLUSTER_DIR naming the cluster's directory)."""
        command, *rest = args
        env = kw.pop("env", None) or dict(os.environ)
        env["FUNKE_CLUSTER_DIR"] = str(self.dir)
        return funke(command, "--jobmanager", self.address, *rest, env=env, **kw)

    def channel(self, realm: str = "client", address: str | None = None, options=()) -> grpc.Channel:
        """A raw gRPC channel to this cluster's JobManager (or `address`) that presents the
        client token (`realm="client"`) or the TaskManagers' (`"cluster"`)."""
        return secured_channel(self.dir, address or self.address, realm, options)

    def pids(self) -> dict[str, int]:
        return {p.stem: int(p.read_text()) for p in (self.dir / "pids").glob("*.pid")}


def _start(tmp_path_factory, name: str, *extra: str) -> Cluster:
    d = tmp_path_factory.mktemp(name)
    funke("cluster", "start", "--taskmanagers", "2", "--slots", "2", "--dir", str(d), *extra, timeout=300)
    address = (d / "jobmanager.address").read_text().strip()
    return Cluster(d, address, client_of(d))


def secured_channel(cluster_dir: Path, address: str, realm: str = "client", options=()) -> grpc.Channel:
    token_file = cluster_dir / security.SECURITY_DIR / (security.CLIENT_TOKEN if realm == "client" else security.CLUSTER_TOKEN)
    return security.channel(address, security.read_token(token_file), localcluster.credentials(cluster_dir).tls,
                            options)


def client_of(cluster_dir: Path, address: str | None = None, **kw) -> JobManagerClient:
    """A client of the cluster recorded in `cluster_dir`, with its tokens (and TLS, if any)."""
    address = address or (cluster_dir / "jobmanager.address").read_text().strip()
    return JobManagerClient(address, credentials=localcluster.credentials(cluster_dir), **kw)


def _stop(cluster: Cluster) -> None:
    cluster.client.close()
    pids = cluster.pids()
    funke("cluster", "stop", "--dir", str(cluster.dir), timeout=60)
    for name, pid in pids.items():  # every process we started is gone
        assert not _alive(pid), f"{name} (pid {pid}) survived `funke cluster stop`"
    for name, pid in pids.items():  # and took its Spark scratch directory with it
        scratch = scratch_dir_of(tempfile.gettempdir(), pid)
        assert not os.path.exists(scratch), f"{name} (pid {pid}) left {scratch} behind"
    for log in sorted((cluster.dir / "log").glob("tm-*.log")):  # a plain stop warns of nothing
        warned = [line for line in log.read_text(errors="replace").splitlines() if "stopping Spark failed" in line]
        assert not warned, f"{log.name}: {warned}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    cluster = _start(tmp_path_factory, "spark-cluster")
    yield cluster
    _stop(cluster)


class StreamCluster:
    """Three TaskManagers x 2 slots with PySpark, for streaming queries; tests kill some of them
    and start replacements (`tm-spare-<n>`)."""

    TASKMANAGERS = 3

    def __init__(self, dir: Path):
        self.dir = dir
        self.info = localcluster.start(localcluster.ClusterSpec(dir, self.TASKMANAGERS, 2))
        self.client = self.info.client()
        self.spare = 0

    def restore(self) -> None:
        """Three TaskManagers registered."""
        registered = {tm.id for tm in self.client.cluster_overview().task_managers}
        for _ in range(self.TASKMANAGERS - len(registered)):
            self.add_taskmanager()

    def add_taskmanager(self) -> str:
        self.spare += 1
        name = f"tm-spare-{self.spare}"
        localcluster.start_taskmanager(self.dir, name, 2)
        return name

    def funke(self, *args: str, **kw):
        command, *rest = args
        env = dict(kw.pop("env", None) or os.environ, FUNKE_CLUSTER_DIR=str(self.info.dir))
        return funke(command, "--jobmanager", self.info.address, *rest, env=env, **kw)


@pytest.fixture(scope="session")
def streaming_cluster(tmp_path_factory):
    """Shared by the streaming, receiver and Redis Streams modules (each restores it first)."""
    c = StreamCluster(tmp_path_factory.mktemp("stream-cluster"))
    yield c
    c.client.close()
    localcluster.stop(c.dir)


@pytest.fixture(scope="session")
def noop_cluster(tmp_path_factory):
    cluster = _start(tmp_path_factory, "noop-cluster", "--no-spark", "-D", "slot.request.timeout=4 s",
                     "-D", "heartbeat.timeout=2 s")
    yield cluster
    _stop(cluster)


def wait_for(what: str, check, timeout: float = 30.0):
    """Poll `check` until it returns something true, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_for_end(client: JobManagerClient, job_id: str):
    """Follow the job's WatchJob stream to its end; return (events, final details)."""
    events = list(client.watch(job_id))
    return events, client.get_job(job_id)


def as_json(result: subprocess.CompletedProcess):
    return json.loads(result.stdout)


def listing(folder: Path) -> list[str]:
    """Every entry below `folder`, hidden ones included, as relative paths."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def wait_cleaned_up(target: Path, data_dir: Path, job_id: str, collected: bool = False, timeout: float = 30) -> None:
    """After a job ended (its clean-up runs off the JobManager's loop, a moment later): the folder
    holding the sink `target` holds the target and nothing else (no staging, no commit marker), and
    the job's directory in the data directory is gone, or holds only its collected rows."""
    def clean() -> bool:
        beside = sorted(p.name for p in target.parent.iterdir())
        job_dir = data_dir / "jobs" / job_id
        kept = sorted(p.name for p in job_dir.iterdir()) if job_dir.exists() else None
        return beside == [target.name] and kept == (["collect"] if collected else None)

    deadline = time.monotonic() + timeout
    while not clean():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} was not cleaned up within {timeout:g} s: beside the target "
                                 f"{listing(target.parent)}, in the data directory "
                                 f"{listing(data_dir / 'jobs' / job_id)}")
        time.sleep(0.1)
