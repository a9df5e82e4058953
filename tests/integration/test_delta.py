"""Delta Lake on a real cluster (a JobManager, three TaskManagers with PySpark, tables written
and read back with `deltalake`, Polars and DuckDB): a bounded job reads a table version split
across subtasks and commits its output as one Delta transaction; a streaming query reads a
table's versions incrementally into another table; and through kill -9 of a TaskManager at
every phase of a batch, the sink table holds every row of the committed batches' version
ranges exactly once, each batch recorded under the query's transaction identifier."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import duckdb
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.checkpoint import parse_metadata
from funke.deploy.client import job_status_name
from funke.jobmanager import deltatables
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.runtime import deltalog
from tests.integration.conftest import wait_for_end
from tests.integration.test_streaming import PHASES, Events, StreamCluster, kills_in_every_phase, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(streaming_cluster):
    streaming_cluster.restore()
    yield streaming_cluster


def rows(path) -> list[tuple]:
    t = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)))


def append(path, ns: list[int], **kw) -> None:
    write_deltalake(str(path), pa.table({"n": pa.array(ns, pa.int64()),
                                         "kind": pa.array([f"k{n % 3}" for n in ns], pa.string())}),
                    mode="append", **kw)


def finished(client, job_id) -> None:
    _, details = wait_for_end(client, job_id)
    assert job_status_name(details.status) == "FINISHED", details


# ---------------------------------------------------------------------------- bounded jobs


def test_a_bounded_job_reads_a_version_split_across_subtasks_and_commits_once(cluster, tmp_path):
    source, out = tmp_path / "source", tmp_path / "out"
    for n in range(4):  # version n: 25 rows in 3 partitions
        append(source, list(range(n * 25, n * 25 + 25)), partition_by=["kind"])
        time.sleep(0.05)  # each version committed at a time of its own
    first_commit = DeltaTable(str(source)).history()[-1]["timestamp"]
    env = ExecutionEnvironment("delta bounded", parallelism=2)
    env.read_delta(str(source)).select("n", "kind", "n * 2 AS twice").write_delta(str(out))
    job_id = cluster.client.submit(env.build())
    finished(cluster.client, job_id)
    assert rows(out) == [(n, f"k{n % 3}", 2 * n) for n in range(100)]
    assert DeltaTable(str(out)).transaction_version(deltatables.job_app_id(job_id)) == 0
    # the read ran as 2 subtasks, each with its share of the version's 12 files
    details = cluster.client.get_job(job_id)
    (read,) = [v for v in details.vertices if v.name.startswith("Source: Delta")]
    assert read.parallelism == 2 and len(read.subtasks) == 2
    # as of the first version's commit time, overwriting: the table holds version 0's rows
    env = ExecutionEnvironment("delta as of", parallelism=3)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(first_commit // 1000)) + f".{first_commit % 1000:03d}Z"
    env.read_delta(str(source), timestamp=stamp).select("n", "kind", "n * 2 AS twice").write_delta(
        str(out), mode="overwrite")
    second = cluster.client.submit(env.build())
    finished(cluster.client, second)
    assert rows(out) == [(n, f"k{n % 3}", 2 * n) for n in range(25)]
    assert DeltaTable(str(out)).version() == 1
    # other engines read it; no staging is left beside it
    assert sorted(polars.read_delta(str(out))["n"].to_list()) == list(range(25))
    files = DeltaTable(str(out)).file_uris()
    assert duckdb.sql(f"SELECT count(*), sum(twice) FROM read_parquet({files!r})").fetchall() == [(25, 600)]
    deadline = time.time() + 30
    while sorted(p.name for p in tmp_path.iterdir()) != ["out", "source"] and time.time() < deadline:
        time.sleep(0.2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "source"]


DELTA_JOB = '''
from funke.common.api.dsl import ExecutionEnvironment


def build(args):
    source, target = args
    env = ExecutionEnvironment("delta problems", parallelism=2)
    env.read_delta(source, version=0).write_delta(target)
    return env
'''


def test_submit_lists_every_delta_problem_and_starts_nothing(cluster, tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rows.csv").write_text("1\n")
    job_file = tmp_path / "job.py"
    job_file.write_text(DELTA_JOB)
    before = len(cluster.client.list_jobs())
    result = cluster.funke("submit", str(job_file), "--", str(tmp_path / "nothing"), str(tmp_path / "plain"),
                           check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is not a Delta table" in result.stderr and "holds 1 file(s) ('rows.csv')" in result.stderr, result.stderr
    assert len(cluster.client.list_jobs()) == before


# ---------------------------------------------------------------------------- streaming queries


def stream_env(name: str, source: Path, out: Path, checkpoint: Path, parallelism: int = 2) -> ExecutionEnvironment:
    env = ExecutionEnvironment(name, parallelism=parallelism)
    env.read_stream.delta(str(source)).select("n", "kind").write_delta(str(out))
    env.set_checkpoint_location(str(checkpoint))
    return env


def test_a_stream_of_table_versions_is_read_incrementally_into_a_table(cluster, tmp_path):
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    append(source, [0, 1, 2])
    append(source, [3, 4])
    env = stream_env(f"delta stream {tmp_path.name}", source, out, checkpoint).set_trigger(available_now=True)
    finished(cluster.client, cluster.client.submit(env.build()))
    append(source, [5])
    DeltaTable(str(source)).optimize.compact()  # rewrites files without changing data: not read again
    append(source, [6, 7])
    finished(cluster.client, cluster.client.submit(env.build()))
    assert rows(out) == [(n, f"k{n % 3}") for n in range(8)]
    store = CheckpointStore(str(checkpoint))
    ranges = [next(iter(store.read_offsets(b).sources.values())) for b in store.commit_ids()]
    assert [(r.start, r.end) for r in ranges] == [(None, 1), (1, 4)]  # versions: the snapshot, then 2..4
    query_id = parse_metadata((checkpoint / "metadata").read_bytes())
    assert DeltaTable(str(out)).transaction_version(query_id) == 1


# ---------------------------------------------------------------------------- kill -9 at every phase


class Producer:
    """Appends a version of `rows` rows with unique `n` to a Delta table `rate` times a second."""

    def __init__(self, path: Path, rate: float, rows: int = 10):
        self.path, self.rate, self.rows = path, rate, rows
        self.added = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            append(self.path, list(range(self.added, self.added + self.rows)))
            self.added += self.rows
            time.sleep(1 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def committed_ns(source: Path, checkpoint: Path, vertex: str) -> list[int]:
    """Every `n` in the data files of the committed batches' version ranges, read from the table."""
    store = CheckpointStore(str(checkpoint))
    out = []
    for batch in store.commit_ids():
        files = deltalog.range_files(str(source), store.read_offsets(batch).sources[vertex])[0]
        for f in files:
            out += pq.read_table(source / f.path).column("n").to_pylist()
    return sorted(out)


def delta_kill_run(cluster: StreamCluster, tmp_path: Path, rate: float = 5, kills_per_phase: int = 1) -> dict:
    """Versions appended to a Delta table `rate` times a second, streamed into another Delta
    table (2 s batches); a TaskManager running the query's tasks is killed (-9) at every phase of
    a batch, a replacement started as a supervisor would; the producer stops, the query takes
    every version, is stopped, and the sink table is tallied against the rows of the committed
    batches' version ranges (read back from the source table's files)."""
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    append(source, [])  # the table exists before the query starts
    env = stream_env(f"delta kills {tmp_path.name}", source, out, checkpoint)
    env.set_trigger("2 s")
    env.set_option("streaming.min-batches-to-retain", "100000")  # every batch's range stays to check
    env.set_restart_strategy("fixed-delay", attempts=100, delay="500 ms")
    producer = Producer(source, rate)
    client = cluster.client
    replacements: list[threading.Thread] = []
    try:
        job_id = client.submit(env.build())
        events = Events(client, job_id)
        kills = kills_in_every_phase(cluster, job_id, events, kills_per_phase, replacements)
        producer.stop()
        vertex = next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: Delta"))
        deadline = time.time() + 120
        while time.time() < deadline and len(committed_ns(source, checkpoint, vertex)) < producer.added:
            time.sleep(0.5)  # until the committed batches took every version added
        stopped = cluster.funke("stop", job_id, "--timeout", "60")
        assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
        assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
        events.drain()
        for t in replacements:
            t.join(120)
    finally:
        producer.stop()
    expected = committed_ns(source, checkpoint, vertex)
    written = collections.Counter(n for n, _ in rows(out))
    want = set(expected)
    store = CheckpointStore(str(checkpoint))
    query_id = parse_metadata((checkpoint / "metadata").read_bytes())
    return {"kills": kills, "restarts": events.statuses.count("RESTARTING"), "added": producer.added,
            "committed": len(expected), "committed_distinct": len(want), "rows": sum(written.values()),
            "duplicates": sum(c - 1 for c in written.values() if c > 1), "lost": len(want - set(written)),
            "beyond": len(set(written) - want), "last_batch": max(store.commit_ids()),
            "recorded_batch": DeltaTable(str(out)).transaction_version(query_id)}


def test_exactly_once_into_a_delta_table_through_kills_at_every_phase(cluster, tmp_path):
    figures = delta_kill_run(cluster, tmp_path)
    assert figures["kills"] == len(PHASES) and figures["restarts"] >= len(PHASES), figures
    # the committed ranges hold every row added, each once
    assert figures["committed"] == figures["committed_distinct"] == figures["added"] > 0, figures
    # the sink table: every row of the committed ranges once, nothing else
    assert figures["rows"] == figures["added"], figures
    assert figures["duplicates"] == figures["lost"] == figures["beyond"] == 0, figures
    # the table recorded the query's last committed batch as its transaction version
    assert figures["recorded_batch"] == figures["last_batch"], figures
