"""A real Spark standalone cluster (a Master and 2 Workers of 1 core and 1g each, on loopback)
started by funke.deploy.sparkstandalone, and a classic SparkSession in this process whose
executors run on it: the Workers register, a DataFrame job runs its Python on the Workers' executors
with our interpreter, the application leaves the Master when the session stops, and stop() ends
every process it started."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from funke.deploy.sparkstandalone import (
    StandaloneError,
    application_executors,
    master_state,
    start,
    stop,
    wait_for_executors,
    wait_for_workers,
)

pytestmark = pytest.mark.cluster

WORKERS = 2


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    info = start(tmp_path_factory.mktemp("spark-standalone"), workers=WORKERS, cores_per_worker=1, memory="1g")
    yield info
    outcome = stop(info)
    assert outcome == {p.name: "stopped" for p in info.processes}, outcome
    for p in info.processes:  # every process we started is gone, and so is everything it started
        assert not _group_members(p.pid), f"{p.name} (pid {p.pid}) left {_group_members(p.pid)} running"
    assert not list((info.dir / "pids").glob("*.pid"))


def _group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[2] == str(pgid) and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_both_workers_register_alive(standalone):
    state = master_state(standalone.web_url)
    assert state["status"] == "ALIVE"
    assert state["url"] == standalone.master_url
    workers = wait_for_workers(standalone.web_url, WORKERS, timeout=5)
    assert len(workers) == WORKERS
    assert len({w["id"] for w in workers}) == WORKERS
    for w in workers:
        assert (w["state"], w["host"], w["cores"], w["memory"]) == ("ALIVE", "127.0.0.1", 1, 1024), w
        assert w["webuiaddress"].startswith("http://127.0.0.1:"), w


def test_a_session_runs_python_on_executors_of_both_workers(standalone, tmp_path, monkeypatch):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    def double_with_origin(batches):
        """mapInArrow: each id doubled, with the interpreter and directory of the Python worker
        that did it (an executor's Python workers run in <worker work dir>/<app id>/<executor
        id>). Nested, so that it is pickled by value: executors cannot import this test module."""
        import os
        import sys

        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            ids = batch.column("id")
            n = batch.num_rows
            yield pa.RecordBatch.from_pydict({"twice": pc.multiply(ids, 2), "python": [sys.executable] * n,
                                              "cwd": [os.getcwd()] * n})

    # The driver decides which Python its executors run (it sends its PYSPARK_PYTHON with every
    # function); the default `python3` is an interpreter without pyarrow here.
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(standalone.master_url).appName("funke-standalone-test")
        .config("spark.cores.max", "2")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Executors connect back to the driver: keep that on loopback, like the cluster.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(tmp_path / "driver"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp_path}")
        .config("spark.executor.extraJavaOptions", f"-Djava.io.tmpdir={standalone.dir / 'tmp'}")
        .getOrCreate()
    )
    try:
        assert spark.sparkContext.master == standalone.master_url, "getOrCreate reused an earlier session"
        app_id = spark.sparkContext.applicationId
        workers = {w["id"] for w in wait_for_workers(standalone.web_url, WORKERS, timeout=5)}

        executors = wait_for_executors(standalone.web_url, app_id, 2, timeout=60)
        assert len(executors) == 2, executors
        assert {e.worker_id for e in executors} == workers  # one executor on each worker
        assert all((e.app_id, e.host, e.memory_mb) == (app_id, "127.0.0.1", 512) for e in executors), executors
        assert application_executors(standalone.web_url, "funke-standalone-test") == executors  # by name too
        state = master_state(standalone.web_url)
        (app,) = [a for a in state["activeapps"] if a["id"] == app_id]
        assert (app["name"], app["cores"], app["state"]) == ("funke-standalone-test", 2, "RUNNING"), app
        assert sorted(w["coresused"] for w in state["workers"] if w["id"] in workers) == [1, 1]

        doubled = spark.range(1000, numPartitions=4).mapInArrow(
            double_with_origin, "twice long, python string, cwd string")
        rows = (doubled.groupBy("python", "cwd")
                .agg(F.count("*").alias("n"), F.sum("twice").alias("total")).collect())
        assert sum(r["n"] for r in rows) == 1000
        assert sum(r["total"] for r in rows) == 2 * sum(range(1000))  # 999 000
        assert {r["python"] for r in rows} == {sys.executable}
        work = standalone.dir / "work"
        executor_dirs = {work / f"worker-{i}" / app_id / str(e) for i in (1, 2) for e in (0, 1)}
        assert {Path(r["cwd"]) for r in rows} <= executor_dirs, rows  # ran on our workers, not locally
    finally:
        spark.stop()

    deadline = time.monotonic() + 30
    while any(a["id"] == app_id for a in master_state(standalone.web_url)["activeapps"]):
        assert time.monotonic() < deadline, f"{app_id} still active 30 s after the session stopped"
        time.sleep(0.2)
    completed = {a["id"]: a["state"] for a in master_state(standalone.web_url)["completedapps"]}
    assert completed.get(app_id) == "FINISHED", completed
    assert application_executors(standalone.web_url, app_id) == []


def test_waiting_for_more_workers_than_exist_fails_saying_what_it_saw(standalone):
    started = time.monotonic()
    with pytest.raises(StandaloneError) as raised:
        wait_for_workers(standalone.web_url, WORKERS + 1, timeout=1)
    assert 1 <= time.monotonic() - started < 10
    message = str(raised.value)
    assert f"expected {WORKERS + 1} ALIVE worker(s) at {standalone.web_url} within 1 s" in message
    assert f"last saw {WORKERS} ALIVE" in message
    for w in master_state(standalone.web_url)["workers"]:
        assert w["id"] in message


def test_a_master_starts_while_another_holds_sparks_rest_submission_port(tmp_path):
    """Spark's Master serves REST submissions on 6066 unless told otherwise, and funke's Master
    may not move to another port (spark.port.maxRetries=0): a second cluster on the machine (another
    user's, a test's) must not keep ours from starting. funke submits no applications that way."""
    import socket

    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 6066))
        held.listen()
    except OSError:  # taken already, by someone else: the same situation
        held.close()
        held = None
    try:
        info = start(tmp_path / "spark", workers=0)
        try:
            assert master_state(info.web_url)["status"] == "ALIVE"
        finally:
            stop(info)
    finally:
        if held is not None:
            held.close()
