"""The exit codes of `funke` commands a real JobManager (and a real cluster directory) refuses,
on one cluster: 2 for a refusal (nothing was done), 1 for a failure at what was asked, as the
table of docs/getting-started.md (from `funke.deploy.cli.exitcodes`) says. The commands run as
a user runs them, in their own processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from funke.common import layout
from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy.client import job_status_name
from tests.integration.conftest import Cluster, funke, wait_for, wait_for_end

pytestmark = pytest.mark.cluster


def two_keyed_operators(checkpoint: Path) -> ExecutionEnvironment:
    """A streaming query with two keyed operators, both at most 4 subtasks."""
    env = ExecutionEnvironment("two keyed operators", parallelism=1)
    (env.read_stream.rate(10)
        .select("value % 5 AS k", "value")
        .drop_duplicates("value").set_max_parallelism(4)
        .key_by("k").count().set_max_parallelism(4)
        .discard())
    env.set_output_mode("update").set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    return env


def refused(cluster: Cluster, *args: str, says: str, exit_code: int = 2) -> None:
    run = funke(*args, check=False) if args[0] == "cluster" else cluster.funke(*args, check=False)
    assert run.returncode == exit_code, f"funke {' '.join(args)} exited {run.returncode}: {run.stderr}"
    assert run.stderr.startswith("funke: ") and says in run.stderr, run.stderr


def test_what_a_jobmanager_refuses_exits_2_and_what_it_fails_at_exits_1(spark_cluster: Cluster, tmp_path: Path):
    client = spark_cluster.client
    query = client.submit(two_keyed_operators(tmp_path / "checkpoint").build())
    wait_for("the query running", lambda: job_status_name(client.get_job(query).status) == "RUNNING", timeout=120)
    keyed = [v.id for v in client.get_job(query).vertices if v.name.startswith(("Deduplicate", "Count"))]
    assert len(keyed) == 2, keyed

    # INVALID_ARGUMENT
    refused(spark_cluster, "state", query, says=f"has 2 keyed operators ({', '.join(sorted(keyed))}); name one")
    refused(spark_cluster, "state", query, "--operator", keyed[0], "--limit", "-1", says="limit -1 is outside")
    refused(spark_cluster, "rescale", query, "-p", "5", says="parallelism 5 exceeds its max parallelism 4")
    refused(spark_cluster, "stop", query, "--timeout", "100000", says="timeout_seconds must be in (0, 86400]")
    # NOT_FOUND
    refused(spark_cluster, "state", query, "--operator", "no-such-vertex", says="has no keyed operator")
    refused(spark_cluster, "result", query, says="has 0 collect sinks")
    for command in ("status", "watch", "cancel", "progress", "result", "state"):
        refused(spark_cluster, command, "no-such-job", says="no job with id 'no-such-job'")
    # nothing was done: the query runs on, and stops when asked
    assert job_status_name(client.get_job(query).status) == "RUNNING"
    assert spark_cluster.funke("stop", query).returncode == 0

    bounded = ExecutionEnvironment("two collect sinks", parallelism=1)
    numbers = bounded.from_range(10)
    numbers.collect()
    numbers.select("id * 2 AS twice").collect()
    job = client.submit(bounded.build())
    assert job_status_name(wait_for_end(client, job)[1].status) == "FINISHED"
    # FAILED_PRECONDITION
    refused(spark_cluster, "rescale", job, "-p", "2", says="rescale takes a running streaming query")
    refused(spark_cluster, "state", job, says="has ended; the JobManager reads a running query's keyed state")
    # INVALID_ARGUMENT, NOT_FOUND
    refused(spark_cluster, "result", job, says="has 2 collect sinks")
    refused(spark_cluster, "result", job, "--vertex", "no-such-sink", says="has no collect sink")
    sinks = [v.id for v in client.get_job(job).vertices if "Collect" in v.name]
    assert spark_cluster.funke("result", job, "--vertex", sinks[0]).returncode == 0
    # DATA_LOSS: the rows are there but cannot be read: the JobManager failed at it, exit 1
    collected = Path(layout.collect_dir(str(spark_cluster.dir / "data"), job, sinks[0]))
    for f in collected.rglob("*.parquet"):
        f.write_bytes(b"not parquet")
    refused(spark_cluster, "result", job, "--vertex", sinks[0], says="cannot be read", exit_code=1)

    # the cluster directory refuses too: a cluster runs there, its TaskManagers are alive
    d = str(spark_cluster.dir)
    refused(spark_cluster, "cluster", "start", "--dir", d, says="is still running")
    refused(spark_cluster, "cluster", "add-taskmanager", "tm-1", "--dir", d, says="tm-1 (pid")
    refused(spark_cluster, "cluster", "kill", "no-such-process", "--dir", d, says="no running process named")
