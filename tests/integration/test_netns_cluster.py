"""TaskManagers on hosts of their own: each in a network namespace with its own address, the
JobManager in the root namespace (`tests/netns.py`). A TaskManager that registers an address the
JobManager cannot dial is refused and says why; a wildcard bind advertises the host's address; a
link cut longer than the heartbeat timeout loses that TaskManager, its tasks run again on the
other host, the job's output is exact, and the TaskManager registers again once the link is back."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy import localcluster
from tests.integration.conftest import wait_for
from funke.v1 import job_pb2
from tests import netns

pytestmark = pytest.mark.cluster
cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_TIMEOUT_S = 3.0
WORDS = re.compile(r"[a-z]+")


@pytest.fixture(scope="module")
def net():
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"network namespaces are not available here: {reason}")
    with netns.Network(hosts=2) as network:
        yield network


@pytest.fixture(scope="module")
def jobmanager(net, tmp_path_factory):
    root = tmp_path_factory.mktemp("netns-cluster")
    # Several hosts: mutual TLS, the processes' certificate valid on every host's address.
    info = localcluster.start(localcluster.ClusterSpec(
        root, 0, 2, host=net.root_address, tls="mtls", tls_hosts=[h.address for h in net.hosts],
        dynamic=[f"heartbeat.timeout={HEARTBEAT_TIMEOUT_S:g} s", "heartbeat.interval=500 ms",
                 "restart-strategy.type=fixed-delay", "restart-strategy.fixed-delay.attempts=20",
                 "restart-strategy.fixed-delay.delay=500 ms"]))
    assert info.address.startswith(f"{net.root_address}:")
    client = info.client()
    yield info, client
    client.close()
    localcluster.stop(root)


def start_taskmanager(net, i: int, info, name: str, log: Path, *flags: str):
    argv = [sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", info.address, "--id", name,
            "--slots", "2", *flags, *localcluster.security_options(info.dir)]
    return net.popen(i, argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO,
                     env=dict(os.environ, PYTHONUNBUFFERED="1"))




def registered(client, name: str):
    return next((t for t in client.cluster_overview().task_managers if t.id == name), None)


def test_a_loopback_address_from_another_host_is_refused(net, jobmanager, tmp_path):
    info, client = jobmanager
    log = tmp_path / "tm.log"
    # The default --host 127.0.0.1 on another host: the JobManager would dial itself.
    process = start_taskmanager(net, 0, info, "tm-loopback", log, "--no-spark")
    wait_for("the refusal", lambda: "refused the registration" in log.read_text())
    assert "registered the loopback address '127.0.0.1:" in log.read_text()
    assert f"connects from {net.hosts[0].address}" in log.read_text()
    assert registered(client, "tm-loopback") is None
    process.kill()


def test_a_wildcard_bind_advertises_the_hosts_own_address(net, jobmanager, tmp_path):
    info, client = jobmanager
    process = start_taskmanager(net, 1, info, "tm-wildcard", tmp_path / "tm.log", "--no-spark", "--host", "0.0.0.0")
    tm = wait_for("the registration", lambda: registered(client, "tm-wildcard"))
    assert tm.address.rpartition(":")[0] == net.hosts[1].address
    process.kill()
    wait_for("the TaskManager to be gone", lambda: registered(client, "tm-wildcard") is None, timeout=30)


def slow_word_count(corpus: Path, out: Path, seconds: float):
    delay = seconds / 200

    def words(line):
        time.sleep(delay)
        return WORDS.findall(line)

    env = ExecutionEnvironment("word count across hosts", parallelism=2)
    (env.read_text(str(corpus))
        .flat_map(words, schema="word string")
        .key_by("word").count()
        .write_csv(str(out), mode="overwrite"))
    return env.build()


def test_a_link_cut_longer_than_the_heartbeat_timeout_loses_nothing(net, jobmanager, tmp_path):
    info, client = jobmanager
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [" ".join(f"w{(i * 7 + j) % 53}".replace("w", "word") for j in range(i % 9 + 1)) for i in range(400)]
    for n in range(2):
        (corpus / f"part-{n}.txt").write_text("\n".join(lines[n::2]) + "\n")
    expected = collections.Counter(w for line in lines for w in WORDS.findall(line))
    spark_flags = ["--host", "0.0.0.0", "--no-warm-up",
                   # Spark's driver and its Python workers talk over the host's own loopback
                   "--spark-conf", "spark.driver.host=127.0.0.1", "--spark-conf", "spark.driver.bindAddress=127.0.0.1"]
    for i in range(2):
        start_taskmanager(net, i, info, f"tm-{i}", tmp_path / f"tm-{i}.log", *spark_flags)
    for i in range(2):
        wait_for(f"tm-{i} to register", lambda i=i: registered(client, f"tm-{i}"), timeout=120)

    out = tmp_path / "counts"
    job_id = client.submit(slow_word_count(corpus, out, seconds=12))

    def running_on():
        details = client.get_job(job_id)
        hosts = {s.current.task_manager_id for v in details.vertices for s in v.subtasks
                 if job_pb2.ExecutionState.Name(s.current.state).endswith("RUNNING")}
        return sorted(hosts)

    victim = wait_for("a running task", running_on, timeout=120)[0]
    index = int(victim.rpartition("-")[2])
    net.cut(index)
    cut_at = time.monotonic()
    wait_for(f"{victim} to be lost", lambda: registered(client, victim) is None, timeout=HEARTBEAT_TIMEOUT_S + 10)
    lost_after = time.monotonic() - cut_at
    time.sleep(max(0.0, 2 * HEARTBEAT_TIMEOUT_S - lost_after))  # the cut lasts twice the timeout
    net.restore(index)

    final = wait_for("the job's end", lambda: (d := client.get_job(job_id)) and
                     job_pb2.JobStatus.Name(d.status) in ("JOB_STATUS_FINISHED", "JOB_STATUS_FAILED") and d,
                     timeout=180)
    assert job_pb2.JobStatus.Name(final.status) == "JOB_STATUS_FINISHED", final.failure.message
    assert any(victim in e.failure.message or e.task_manager_id == victim for e in final.exceptions)
    counts = collections.Counter()
    for f in sorted(out.iterdir()):
        for row in f.read_text().splitlines()[1:]:
            word, n = row.split(",")
            counts[word] += int(n)  # a word twice would double its count
    assert counts == expected
    # the TaskManager behind the cut comes back by itself
    wait_for(f"{victim} to register again", lambda: registered(client, victim), timeout=60)
    assert lost_after >= HEARTBEAT_TIMEOUT_S - 0.5
