"""TaskManagers on hosts of their own: each in a network namespace with its own address, the
JobManager in the root namespace (`tests/netns.py`). A TaskManager that registers an address the
JobManager cannot dial is refused and says why; a wildcard bind advertises the host's address; a
link cut longer than the heartbeat timeout loses that TaskManager, its tasks run again on the
other host, the job's output is exact, and the TaskManager registers again once the link is back;
a keyed query whose checkpoint path is a different disk on each host fails its batch after a
failover (the state is not there) instead of committing totals from an empty state."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
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
    processes = [start_taskmanager(net, i, info, f"tm-{i}", tmp_path / f"tm-{i}.log", *spark_flags) for i in range(2)]
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
    for process in processes:  # the cluster as the test found it: no TaskManager of this test takes later jobs
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def start_taskmanager_on_disk(net, i: int, info, name: str, log: Path, disk: Path, path: Path, *flags: str):
    """A TaskManager on host i that sees `disk` at `path`: its own disk under a name every host
    has (`ip netns exec` gives the host a mount namespace of its own; the bind is made there)."""
    argv = ["sh", "-c", 'mount --bind "$0" "$1" && shift && exec "$@"', str(disk), str(path),
            sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", info.address, "--id", name,
            "--slots", "2", *flags, *localcluster.security_options(info.dir)]
    return net.popen(i, argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO,
                     env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_a_keyed_query_whose_checkpoint_is_not_shared_fails_its_batch_instead_of_committing_wrong_totals(
        net, jobmanager, tmp_path):
    """Issue 50, item 11: a running count with its checkpoint at a path each host has on its own
    disk (the JobManager's logs on a third); kill -9 of the TaskManager that holds the state; the
    query restarts on the other host, which does not see it. The batch fails, saying why, and no
    batch commits a total that is not the count of every row so far."""
    info, client = jobmanager
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "counts"
    checkpoint.mkdir()
    spark_flags = ["--host", "0.0.0.0", "--no-warm-up",
                   "--spark-conf", "spark.driver.host=127.0.0.1", "--spark-conf", "spark.driver.bindAddress=127.0.0.1"]
    processes = {}
    for i in range(2):
        disk = tmp_path / f"disk-h{i}"
        disk.mkdir()
        processes[f"tm-disk-{i}"] = start_taskmanager_on_disk(net, i, info, f"tm-disk-{i}", tmp_path / f"tm-{i}.log",
                                                              disk, checkpoint, *spark_flags)
    for name in processes:
        wait_for(f"{name} to register", lambda name=name: registered(client, name), timeout=120)
    wait_for("no other TaskManager", lambda: {t.id for t in client.cluster_overview().task_managers} == set(processes),
             timeout=60)

    env = ExecutionEnvironment("running count on local disks", parallelism=1)
    (env.read_stream.rate(20)
        .select("value % 10 AS k", "value")
        .key_by("k").count()
        .write_parquet(str(out)))
    env.set_output_mode("complete").set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    job_id = client.submit(env.build())
    logs = checkpoint / "commits"  # the JobManager's, on its own disk

    def committed() -> list[int]:
        return sorted(int(n) for n in os.listdir(logs) if n.isdigit()) if logs.is_dir() else []

    wait_for("three committed batches", lambda: len(committed()) >= 3, timeout=180)
    (holder,) = {s.current.task_manager_id for v in client.get_job(job_id).vertices for s in v.subtasks}
    assert any((tmp_path / f"disk-h{holder[-1]}").glob("state/*/op-0/kg-*/*.delta")), "the state is on its host's disk"
    os.killpg(processes[holder].pid, signal.SIGKILL)  # the TaskManager (and its Spark JVM), by its pid
    killed_after = max(committed())

    def wrong_batches() -> dict[int, tuple]:
        """Committed batches whose counts are not those of every row up to the batch's end."""
        from funke.jobmanager.checkpointstore import CheckpointStore
        from tests.integration.test_streaming import committed_rows

        store = CheckpointStore(str(checkpoint))
        emitted = committed_rows(out, lambda p: [(r["k"], r["count"]) for r in pq.read_table(p).to_pylist()])
        wrong = {}
        for batch, rows in emitted.items():
            end = int(next(iter(store.read_offsets(batch).sources.values())).end["rows"])
            want = sorted(collections.Counter(v % 10 for v in range(end)).items())
            if sorted(rows) != want:
                wrong[batch] = (sorted(rows)[:3], want[:3])
        return wrong

    def outcome():
        wrong = wrong_batches()
        if wrong:
            return "committed wrong totals", wrong
        refused = [e.failure for e in client.get_job(job_id).exceptions if "cannot be loaded" in e.failure.message]
        return ("failed the batch", refused[0]) if refused else None

    what, failure = wait_for("the query to go on without the state", outcome, timeout=240)
    assert what == "failed the batch", f"{what} (batch: (got, want)): {failure}"
    detail = f"{failure.exception_type}: {failure.message}"
    assert "(the state after batch" in detail and "committed)" in detail and "same path" in detail, detail
    client.cancel(job_id)
    wait_for("the job's end", lambda: job_pb2.JobStatus.Name(client.get_job(job_id).status) in (
        "JOB_STATUS_CANCELED", "JOB_STATUS_FAILED"), timeout=120)
    assert wrong_batches() == {}
    assert max(committed()) == killed_after, "a batch committed after the kill, without the state"
    first_line = next(line for line in detail.splitlines() if "cannot be loaded" in line)
    print(f"killed {holder} after batch {killed_after}; the next batch failed on the other host: {first_line[:300]}")
