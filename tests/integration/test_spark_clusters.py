"""funke's Spark stages on a real distributed data plane, from pip's PySpark: (a) a Spark
standalone master with two workers started by `funke cluster start --spark standalone`, the
TaskManagers' executors on those workers; (b) a Spark Connect server, TaskManagers with
--spark-remote, surviving a restart of the server. The word count and the join give exact
results on both."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from funke.common.states import JobStatus
from funke.deploy import localcluster, sparkstandalone
from funke.deploy.client import JobManagerClient
from funke.deploy.jobfile import load_job_file
from funke.jobmanager import restviews
from tests.integration.conftest import client_of, funke, wait_for_end
from tests.integration.test_wordcount import join_example_is_exact
from tests.sparkconnectserver import ConnectServer

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SEPARATORS = re.compile(r"[\W\d_]+")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, collections.Counter]:
    d = tmp_path_factory.mktemp("corpus")
    expected: collections.Counter = collections.Counter()
    for n in range(4):
        lines = [" ".join(f"w{(i * 31 + j * 7 + n) % 97}x" for j in range(i % 11)) for i in range(500)]
        (d / f"part-{n}.txt").write_text("\n".join(lines) + "\n")
        expected.update(w for line in lines for w in SEPARATORS.split(line.lower()) if w)
    return str(d / "*.txt"), expected


def word_count_is_exact(client: JobManagerClient, corpus, parallelism: int = 4) -> set[str]:
    pattern, expected = corpus
    job_id = client.submit(load_job_file(REPO / "examples" / "wordcount.py",
                                         ["--input", pattern, "--parallelism", str(parallelism)]))
    _, details = wait_for_end(client, job_id)
    assert JobStatus[details_status(details)] is JobStatus.FINISHED, details.failure
    rows = client.result(job_id)
    assert collections.Counter({r["word"]: r["count"] for r in rows}) == expected
    assert len(rows) == len(expected)
    # each operator's records, counted where the Spark work ran (an executor, a Connect server)
    counts = [(o["name"], o["metrics"]["read-records"], o["metrics"]["write-records"]) for v in details.vertices
              for o in restviews.operators(v, [s.current.io for s in v.subtasks])]
    lines = sum(len(Path(f).read_text().splitlines()) for f in glob.glob(pattern))
    words, exchanged = sum(expected.values()), counts[2][2]
    assert counts == [("Source: text", lines, lines), ("FlatMap", lines, words), ("Combine (Count)", words, exchanged),
                      ("Count", exchanged, len(expected)), ("Sink: Collect", len(expected), len(expected))], counts
    return {s.current.task_manager_id for v in details.vertices for s in v.subtasks}


def details_status(details) -> str:
    from funke.v1 import job_pb2

    return job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")


# ---------------------------------------------------------------------------- (a) standalone

@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    d = tmp_path_factory.mktemp("standalone-cluster")
    started = funke("cluster", "start", "--dir", str(d), "--taskmanagers", "2", "--slots", "2",
                    "--spark", "standalone", "--workers", "2", "--spark-conf", "spark.executor.memory=480m",
                    timeout=300)
    assert "spark standalone (2 worker(s))" in started.stdout
    address = (d / "jobmanager.address").read_text().strip()
    client = client_of(d, address)
    yield d, client
    client.close()
    stopped = funke("cluster", "stop", "--dir", str(d), timeout=120)
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        assert re.search(rf"^{name} \(pid \d+\): stopped", stopped.stdout, re.M), stopped.stdout


def test_word_count_and_join_on_a_standalone_cluster(standalone, corpus):
    d, client = standalone
    assert word_count_is_exact(client, corpus) == {"tm-1", "tm-2"}
    join_example_is_exact(client)


def test_the_taskmanagers_executors_run_on_the_standalone_workers(standalone):
    d, client = standalone
    master_url, web_url = localcluster.standalone_urls(d)
    workers = {w["id"] for w in sparkstandalone.wait_for_workers(web_url, 2)}
    state = sparkstandalone.master_state(web_url)
    apps = {a["name"]: a for a in state["activeapps"]}
    for tm in ("tm-1", "tm-2"):
        app = apps[f"funke-taskmanager-{tm}"]
        assert app["cores"] == 2  # spark.cores.max = its 2 slots, not every core of the cluster
        assert app["memoryperexecutor"] == 480  # --spark-conf of funke cluster start reached it
        executors = sparkstandalone.application_executors(web_url, app["id"])
        assert executors and {e.worker_id for e in executors} <= workers
    # both TaskManagers got executors, on both workers between them
    assert {e.worker_id for a in apps.values() for e in sparkstandalone.application_executors(web_url, a["id"])} == workers
    for tm in ("tm-1", "tm-2"):
        log = (d / "log" / f"{tm}.log").read_text()
        assert f"Spark executor(s) from {master_url}" in log


def test_a_taskmanager_a_full_standalone_cluster_cannot_serve_refuses_to_start(standalone, tmp_path):
    d, client = standalone
    master_url, _ = localcluster.standalone_urls(d)
    address = (d / "jobmanager.address").read_text().strip()
    # every core of the workers is taken by tm-1 and tm-2: a third application gets none
    result = subprocess.run(
        [sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", address, "--id", "tm-starved",
         "--slots", "2", "--spark-master", master_url, "--spark-executor-timeout", "8",
         "--spark-conf", "spark.executor.memory=512m", "--spark-conf", "spark.driver.host=127.0.0.1",
         *localcluster.security_options(d)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert f"the Spark master {master_url} gave this TaskManager no executor within 8 s" in result.stderr
    assert "tm-starved" not in {tm.id for tm in client.cluster_overview().task_managers}


def test_cluster_status_lists_the_spark_master_and_workers_and_a_killed_worker_dead(tmp_path):
    d = tmp_path / "cluster"
    funke("cluster", "start", "--dir", str(d), "--taskmanagers", "0", "--spark", "standalone", "--workers", "2",
          timeout=300)
    try:
        shown = funke("cluster", "status", "--dir", str(d))
        rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines() if line.lstrip().startswith("spark-")}
        assert set(rows) == {"spark-master", "spark-worker-1", "spark-worker-2"}, shown.stdout
        assert all(row[2] == "alive" for row in rows.values()), shown.stdout
        master_url, web_url = localcluster.standalone_urls(d)
        assert f"{master_url}, web UI {web_url}; 2/2 worker(s) ALIVE" in shown.stdout
        assert "ALIVE at the master, 0/1 core(s) used" in " ".join(rows["spark-worker-2"])
        pid = int((d / "spark-standalone" / "pids" / "worker-2.pid").read_text())
        assert int(rows["spark-worker-2"][1]) == pid
        os.kill(pid, signal.SIGKILL)  # the Worker we started, by its pid: as if it crashed
        deadline = time.monotonic() + 30
        while (status := funke("cluster", "status", "--dir", str(d), check=False)).returncode == 0:
            assert time.monotonic() < deadline, status.stdout
            time.sleep(0.2)
        assert "cluster in" in status.stdout and "NOT running" in status.stdout
        assert re.search(rf"^ *spark-worker-2 +{pid} +dead ", status.stdout, re.M), status.stdout
        assert re.search(r"^ *spark-worker-1 +\d+ +alive +ALIVE at the master", status.stdout, re.M), status.stdout
        listed = json.loads(funke("cluster", "status", "--dir", str(d), "--json", check=False).stdout)
        processes = {p["name"]: p for p in listed["processes"]}
        assert processes["spark-worker-2"]["alive"] is False and processes["spark-worker-1"]["alive"] is True
        assert listed["spark_standalone"]["master_url"] == master_url
        assert set(listed["spark_standalone"]["workers"]) == {"spark-worker-1", "spark-worker-2"}
    finally:
        stopped = funke("cluster", "stop", "--dir", str(d), timeout=120)
    assert re.search(r"^spark-worker-2 \(pid \d+\): not running", stopped.stdout, re.M), stopped.stdout


# ---------------------------------------------------------------------------- (b) Spark Connect

@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    d = tmp_path_factory.mktemp("connect-cluster")
    server = ConnectServer(d / "connect")
    server.start()
    try:
        funke("cluster", "start", "--dir", str(d / "cluster"), "--taskmanagers", "2", "--slots", "2",
              "--spark-remote", server.url, timeout=300)
        client = client_of(d / "cluster")
        yield d / "cluster", client, server
        client.close()
        funke("cluster", "stop", "--dir", str(d / "cluster"), timeout=120)
    finally:
        server.stop()


def test_word_count_and_join_on_spark_connect(connect, corpus):
    d, client, server = connect
    assert word_count_is_exact(client, corpus) == {"tm-1", "tm-2"}
    join_example_is_exact(client)
    for tm in ("tm-1", "tm-2"):
        assert "CANNOT_MODIFY_CONFIG" not in (d / "log" / f"{tm}.log").read_text()


def test_a_restarted_connect_server_is_survived(connect, corpus):
    d, client, server = connect
    renewed = "new Spark Connect session"
    before = {tm: (d / "log" / f"{tm}.log").read_text().count(renewed) for tm in ("tm-1", "tm-2")}
    server.restart()
    deadline = time.monotonic() + 30
    while any((d / "log" / f"{tm}.log").read_text().count(renewed) == before[tm] for tm in before):
        assert time.monotonic() < deadline, "the TaskManagers did not open new sessions after the restart"
        time.sleep(0.2)
    assert {tm.id for tm in client.cluster_overview().task_managers} == {"tm-1", "tm-2"}
    assert word_count_is_exact(client, corpus) == {"tm-1", "tm-2"}


def stalled_until_released(started: Path, release: Path, *, fail: bool = False):
    """One subtask whose function, on the Connect server's Python workers, says it runs (`started`)
    and waits for `release` (the server restarting under it meanwhile); or fails every time.
    Restart strategy fixed-delay with a budget of one restart."""
    from funke.common.api.dsl import ExecutionEnvironment

    def wait(value):
        if fail:
            raise RuntimeError(f"row {value} failed on purpose")
        started.touch()
        while not release.exists():
            time.sleep(0.05)
        return value

    env = ExecutionEnvironment("across a restart" if not fail else "fails every time", parallelism=1)
    env.set_restart_strategy("fixed-delay", attempts=1, delay="200 ms")
    env.from_range(3).map(wait, schema="id bigint").collect()
    return env.build()


def test_a_task_running_across_a_connect_server_restart_fails_once_and_its_restart_succeeds(connect, tmp_path):
    d, client, server = connect
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = client.submit(stalled_until_released(started, release))
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline, "the first attempt's function never ran"
        time.sleep(0.1)
    server.stop()  # under the running Spark job: the first attempt fails
    release.touch()  # the next attempt's function returns at once
    server.start()
    _, details = wait_for_end(client, job_id)
    failures = [f"#{e.attempt.attempt_number}: {e.failure.message[:200]}" for e in details.exceptions if e.task_name]
    # One restart was enough: the attempt after the first failure ran on a new session.
    assert details_status(details) == "FINISHED", (details.failure.message, failures)
    assert len(failures) == 1, failures
    assert sorted(r["id"] for r in client.result(job_id)) == [0, 1, 2]


def test_a_job_whose_restart_budget_is_spent_names_the_restart_strategy(connect, tmp_path):
    d, client, server = connect
    job_id = client.submit(stalled_until_released(tmp_path / "started", tmp_path / "release", fail=True))
    _, details = wait_for_end(client, job_id)
    assert details_status(details) == "FAILED"
    message = details.failure.message
    # the root cause first, then who gave up
    assert 0 <= message.find(" failed on purpose") < message.find(
        "(restart strategy fixed-delay (1 attempt) gave up after 2 failures; recovery is suppressed by "), message
    status = funke("status", job_id, "--jobmanager", (d / "jobmanager.address").read_text().strip(),
                   env={**os.environ, "FUNKE_CLUSTER_DIR": str(d)}, check=False)
    assert "restart strategy fixed-delay (1 attempt) gave up after 2 failures" in status.stdout, status.stdout


def test_a_setting_the_connect_server_cannot_take_stops_the_taskmanager(connect):
    d, client, server = connect
    address = (d / "jobmanager.address").read_text().strip()
    result = subprocess.run(
        [sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", address, "--id", "tm-static",
         "--spark-remote", server.url, "--spark-conf", "spark.executor.memory=4g", *localcluster.security_options(d)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert "cannot change spark.executor.memory for one session" in result.stderr
