"""env.execute() and execute_async() for real: a script run alone starts an embedded mini
cluster (and takes it along when it ends, or when it is killed -9); on a running cluster a
JobClient follows the job, its rows come back as Rows, Arrow and pandas, a failure raises with
its traceback; a streaming query's committed batches are read as they come, then it is stopped."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import psutil
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy.client import FunkeError, job_status_name
from funke.deploy.execution import JobClient, JobFailed
from tests.integration.conftest import REPO, _alive, wait_for

pytestmark = pytest.mark.cluster


def alone_env(tmp_path: Path) -> dict[str, str]:
    """A shell with no cluster anywhere: no $FUNKE_JOBMANAGER, an empty cluster directory."""
    env = {k: v for k, v in os.environ.items() if k != "FUNKE_JOBMANAGER"}
    env["FUNKE_CLUSTER_DIR"] = str(tmp_path / "no-cluster")
    return env


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reference_counts() -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for f in sorted((REPO / "examples" / "data").glob("*.txt")):
        for line in f.read_text().splitlines():
            counts.update(w for w in re.split(r"[\W\d_]+", line.lower()) if w)
    return counts


def processes_in(directory: str) -> list[int]:
    """Live processes that run in `directory` or name it on their command line: a mini cluster's
    JobManager and TaskManager run in its directory, and so do their children (Spark's JVM)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status", "cwd"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if (p.info["cwd"] or "").startswith(directory) or any(directory in a for a in p.info["cmdline"] or ()):
            found.append(p.info["pid"])
    return found


def test_examples_wordcount_runs_alone_on_a_mini_cluster_that_ends_with_it(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "examples" / "wordcount.py")], cwd=tmp_path,
                         env=alone_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    started = re.search(r"started an embedded mini cluster .* logs: (\S+)/log\)", run.stderr)
    assert started is not None, run.stderr
    # atexit stopped it: its processes are gone (once the exited ones are reaped), its directory too
    mini = started.group(1)
    wait_for("the mini cluster's processes to be gone", lambda: not processes_in(mini), timeout=15)
    assert not Path(mini).exists()
    printed = dict(re.findall(r"^\s*([a-z]+)\s+(\d+)$", run.stdout, re.M))
    expected = reference_counts()
    assert len(printed) == 20 and all(int(n) == expected[w] for w, n in printed.items()), printed
    assert sorted(expected.values(), reverse=True)[:20] == sorted(map(int, printed.values()), reverse=True)
    assert re.search(r"^FINISHED in [\d.]+ s", run.stdout, re.M)


SCRIPT = """
import json, os, sys, time
from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy.execution import MiniCluster

env = ExecutionEnvironment("squares", parallelism=2)
env.from_range(100).map(lambda x: x * x, schema="sq bigint").collect()
result = env.execute()
mini = MiniCluster._current
processes = [mini.info.jobmanager.pid, *(tm.pid for tm in mini.info.taskmanagers)]
print(json.dumps({{"sum": int(result.to_pandas()["sq"].sum()), "rows": len(result.collect()),
                  "pids": processes, "dir": str(mini.dir)}}), flush=True)
{then}
"""


def test_a_killed_script_takes_its_mini_cluster_along(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(SCRIPT.format(then="time.sleep(600)")))
    owner = subprocess.Popen([sys.executable, str(script)], env=alone_env(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        out = json.loads(owner.stdout.readline())
    finally:
        owner.kill()  # -9: no atexit, no clean-up of its own
        owner.wait()
    killed_at = time.monotonic()
    wait_for("the mini cluster's processes and their groups to stop after their owner was killed",
             lambda: not any(_alive(p) or group_alive(p) for p in out["pids"]), timeout=60)
    print(f"mini cluster gone {time.monotonic() - killed_at:.1f} s after its owner's kill -9")


@pytest.fixture
def local_cluster(spark_cluster, monkeypatch):
    """The shell of a user who ran `funke cluster start`: execute() finds it by itself."""
    monkeypatch.delenv("FUNKE_JOBMANAGER", raising=False)
    monkeypatch.setenv("FUNKE_CLUSTER_DIR", str(spark_cluster.dir))
    return spark_cluster


def test_execute_async_returns_a_job_client_and_the_rows(local_cluster):
    env = ExecutionEnvironment("async squares", parallelism=2)
    sink = env.from_range(50).rebalance().map(lambda x: x * x, schema="sq bigint").collect()
    with env.execute_async() as client:
        assert isinstance(client, JobClient) and client.client.address == local_cluster.address
        assert client.get_job_status() in ("CREATED", "RUNNING", "FINISHED")
        result = client.get_job_execution_result(timeout=120)
        assert result.get_job_id() == client.get_job_id() and result.status == "FINISHED"
        assert sorted(r.sq for r in result.collect(sink)) == [x * x for x in range(50)]
        assert result.to_arrow().num_rows == 50 and result.to_pandas()["sq"].sum() == sum(x * x for x in range(50))
        source, squares = (result.metrics[v] for v in ("source-range", "map"))  # 50 rows over the exchange
        assert (source.records_out, squares.records_in, squares.parallelism) == (50, 50, 2), result.metrics
        assert client.to_pandas()["sq"].sum() == result.to_pandas()["sq"].sum()
        with pytest.raises(FunkeError, match="is a batch job: from_batch is for a streaming query") as refused:
            client.client.result_batches(client.job_id, from_batch=0)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_the_results_metrics_count_the_records_of_every_operator_of_a_chained_vertex(local_cluster):
    # One vertex, no exchange: the vertex's records in are its source's (what it read), its
    # records out its sink's (what it wrote), and each operator has its own.
    env = ExecutionEnvironment("chained counts", parallelism=1)
    env.from_range(1000).map(lambda x: x * 3, schema="n bigint").filter(lambda n: n % 2 == 0).collect()
    result = env.execute()
    [vertex] = result.metrics.values()
    assert (vertex.records_in, vertex.records_out) == (1000, 500), vertex
    assert [(o.name, o.records_in, o.records_out) for o in vertex.operators] == [
        ("Source: range", 1000, 1000), ("Map", 1000, 1000), ("Filter", 1000, 500), ("Sink: Collect", 500, 500)]
    assert result.to_arrow().num_rows == 500


def test_a_failing_job_raises_with_the_users_traceback(local_cluster):
    def broken(x):
        return x // (x - x)  # ZeroDivisionError in the user's own line

    env = ExecutionEnvironment("broken", parallelism=1)
    env.set_restart_strategy("none")
    env.from_range(5).map(broken, schema="y bigint").collect()
    with pytest.raises(JobFailed) as failed:
        env.execute()
    assert failed.value.result.status == "FAILED"
    # the user's file, line and source line, as the traceback would read on this machine
    line = broken.__code__.co_firstlineno + 1
    assert f'File "{__file__}", line {line}, in broken\n    return x // (x - x)' in str(failed.value)
    assert "ZeroDivisionError" in str(failed.value)


def test_a_cancelled_job_raises_cancelled(local_cluster):
    def slow(x):
        time.sleep(2)
        return x

    env = ExecutionEnvironment("cancel me", parallelism=1)
    env.from_range(100).map(slow, schema="id bigint").discard()
    with env.execute_async() as client:
        wait_for("the job to run", lambda: client.get_job_status() == "RUNNING", timeout=60)
        client.cancel()
        with pytest.raises(JobFailed) as cancelled:
            client.get_job_execution_result(timeout=60)
    assert cancelled.value.result.status == "CANCELED"


def test_a_streaming_querys_batches_are_read_as_they_commit_then_it_stops(local_cluster, tmp_path):
    env = ExecutionEnvironment("rate to python", job_type="streaming", parallelism=1)
    env.read_stream.rate(50).select("value").map(lambda v: v * 10, schema="tens bigint").collect()
    env.set_trigger("300 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    with env.execute_async() as client:
        seen = []
        for batch in client.batches():
            seen.append(batch)
            if len(seen) == 3:
                break
        assert [b.batch_id for b in seen] == sorted(b.batch_id for b in seen)
        assert len({b.batch_id for b in seen}) == 3
        assert all(v % 10 == 0 for b in seen for v in b.to_pandas()["tens"])
        assert client.progress(), "progress records of the running query"
        for bad, problem in ((dict(from_batch=-1), "from_batch must be >= 0"),
                             (dict(max_batches=-5), "max_batches must be 0"),
                             (dict(max_batches=10**6), "max_batches must be 0")):
            with pytest.raises(FunkeError, match=problem) as refused:
                client.client.result_batches(client.job_id, **bad)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        client.stop()
        result = client.get_job_execution_result(timeout=120)
        assert result.status == "FINISHED"
        every = list(client.batches(follow=False))
        rows = [v for b in every for v in b.to_arrow().column("tens").to_pylist()]
        assert sorted(rows) == sorted(result.to_arrow().column("tens").to_pylist())
        assert len(rows) == len(set(rows)), "a row in two batches"
        assert [b.batch_id for b in every][:3] == [b.batch_id for b in seen]


def test_interrupting_execute_cancels_the_job(local_cluster, tmp_path):
    """Ctrl-C while execute() waits (a notebook's interrupt) cancels the job, as PySpark does."""
    import signal
    import uuid

    name = f"interrupted {uuid.uuid4().hex[:8]}"
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from funke.common.api.dsl import ExecutionEnvironment
        def slow(x):
            time.sleep(5)
            return x
        env = ExecutionEnvironment({name!r}, parallelism=1)
        env.from_range(100).map(slow, schema="id bigint").discard()
        env.execute()
    """))
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(local_cluster.dir))
    env.pop("FUNKE_JOBMANAGER", None)
    run = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        client = local_cluster.client
        job = wait_for("the job to run", lambda: next((j for j in client.list_jobs() if j.name == name
                                                       and job_status_name(j.status) == "RUNNING"), None), timeout=120)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0 and "KeyboardInterrupt" in err and f"job {job.job_id} cancelled" in err, err
    wait_for("the job to be CANCELED", lambda: job_status_name(client.get_job(job.job_id).status) == "CANCELED",
             timeout=60)
