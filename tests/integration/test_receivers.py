"""Receiver sources on a real cluster (a JobManager and three TaskManagers with PySpark): the
seed's socket word count (`socketTextStream` → flatMap → map → reduceByKey, per batch) against a
line server the test runs, each batch's counts checked against the lines of the blocks it was
allocated; and kill -9 of the TaskManager running the receiver, then of one running the counting
tasks, while lines flow: every line stored before a kill is counted once, none twice.

Every check reads what the query left on disk — the receivers' blocks in the checkpoint, the
offset log that allocates them to batches, the sink's committed batches."""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.sources import ReceiverSource, receiver_blocks_dir, stored_blocks
from funke.deploy import localcluster
from funke.deploy.lineserver import LineServer
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_streaming import Events, StreamCluster, committed_rows, read_counts, wait_status

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])


VOCABULARY = ["spark", "flink", "stream", "batch", "slot", "vertex", "block", "receiver", "offset", "commit"]


def lines_to_send(n: int) -> list[str]:
    """n lines, each one unique (its number) and a few words of the vocabulary."""
    return [f"line{i} " + " ".join(VOCABULARY[(i * 7 + j) % len(VOCABULARY)] for j in range(1 + i % 4))
            for i in range(n)]


def split_words(line):
    return [(w,) for w in line.split()]


def line_number(i: int) -> str:
    return lines_to_send(i + 1)[i]


def word_count_job(port: int, out: Path, checkpoint: Path, trigger: str = "1 s") -> ExecutionEnvironment:
    env = ExecutionEnvironment("socket word count", parallelism=2)
    (env.read_stream.socket_text("127.0.0.1", port)
        .flat_map(split_words, schema="word string")
        .key_by("word").per_batch().count()
        .write_csv(str(out)))
    env.set_trigger(trigger).set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    return env


def allocated_lines(checkpoint: Path, source: str, batch: int, receivers: int = 1) -> list[str]:
    """The lines of the blocks batch `batch` was allocated (its offset entry's range)."""
    entry = CheckpointStore(str(checkpoint)).read_offsets(batch)
    lines = []
    for r in range(receivers):
        directory = receiver_blocks_dir(str(checkpoint), source, r)
        names = stored_blocks(os.listdir(directory)) if os.path.isdir(directory) else {}
        for seq in ReceiverSource(receivers).blocks(entry.sources[source], r):
            with open(os.path.join(directory, names[seq]), encoding="utf-8") as f:
                lines += f.read().splitlines()
    return lines


def wait_for_rows(client, job_id: str, rows: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        progress = client.progress(job_id)
        if sum(p["numInputRows"] for p in progress) >= rows:
            return
        time.sleep(0.5)
    raise AssertionError(f"the query did not read {rows} lines within {timeout} s: {client.progress(job_id)[-2:]}")


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def test_the_seeds_socket_word_count_counts_each_batch_exactly_as_the_lines_it_was_allocated(cluster, tmp_path):
    cluster.restore()
    lines = lines_to_send(400)
    server = LineServer(lines, rate=200)
    out, checkpoint = tmp_path / "counts", tmp_path / "checkpoint"
    client = cluster.client
    try:
        job_id = client.submit(word_count_job(server.port, out, checkpoint).build())
        events = Events(client, job_id)
        wait_status(client, job_id, ("RUNNING",))
        status = client.get_job(job_id)
        receiver = next(v for v in status.vertices if v.name.startswith("Source: socket"))
        assert receiver.parallelism == 1
        wait_for_rows(client, job_id, len(lines))
        stopped = cluster.funke("stop", job_id, "--timeout", "60")
        assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
        events.drain()
    finally:
        server.close()
    source = receiver.id
    counted = committed_rows(out, read_counts)
    assert len(counted) >= 2, f"400 lines at 200 a second make batches over 2 s at least, got {sorted(counted)}"
    total: collections.Counter = collections.Counter()
    received: list[str] = []
    for batch, rows in counted.items():
        allocated = allocated_lines(checkpoint, source, batch)
        received += allocated
        expected = collections.Counter(w for line in allocated for (w,) in split_words(line))
        assert dict(rows) == dict(expected), f"batch {batch}"
        total.update(dict(rows))
    assert received == lines  # every line received once, in order, in the batches' order
    assert total == collections.Counter(w for line in lines for (w,) in split_words(line))
    progress = client.progress(job_id)
    assert sum(p["numInputRows"] for p in progress) == len(lines)
    assert all(p["sources"][0]["numBlocks"] >= 1 for p in progress if p["numInputRows"])
    for p in progress:  # the one receiver's lines are the source's, at its rate
        (receiver_progress,) = p["sources"][0]["receivers"].values()
        assert receiver_progress["records"] == p["sources"][0]["numInputRows"], p
        assert receiver_progress["recordsPerSecond"] == p["sources"][0]["inputRowsPerSecond"], p
    shown = cluster.funke("progress", job_id).stdout
    assert f"sources of batch {progress[-1]['batchId']}:" in shown and "    receiver 0: " in shown, shown


def socket_kill_run(cluster: StreamCluster, tmp_path: Path, rate: float = 100) -> dict:
    """The seed's word count fed `rate` lines a second; kill -9 the TaskManager running the
    receiver, then one running the counting tasks, each once the query completed a batch, a
    replacement started as a supervisor would; then the lines stop, the query is stopped with
    --drain, and what it left is tallied:

    sent: lines the server wrote; stored: lines in the receiver's blocks; counted: lines of the
    blocks the committed batches were allocated (each batch's word counts checked against them);
    duplicates: lines counted more than once; stored_not_counted: stored lines no committed batch
    counted; lost_in_flight: lines sent and never stored (what a killed receiver had read, or the
    kernel held for it: a socket acknowledges nothing)."""
    server = LineServer(rate=rate, make_line=line_number)  # lines flow until the kills are over
    out, checkpoint = tmp_path / "counts", tmp_path / "checkpoint"
    client = cluster.client
    try:
        replacements: list[threading.Thread] = []
        job_id = client.submit(word_count_job(server.port, out, checkpoint, trigger="2 s").build())
        events = Events(client, job_id)
        events.wait("BatchCompleted", timeout=180)
        for victim_vertex in ("Source: socket", "Count"):
            status = client.get_job(job_id)
            vertex = next(v for v in status.vertices if v.name.startswith(victim_vertex))
            victim = vertex.subtasks[0].current.task_manager_id
            localcluster.kill(cluster.dir, victim)
            events.wait_recovered(timeout=300)
            replacements.append(threading.Thread(target=cluster.add_taskmanager))  # as a supervisor would,
            replacements[-1].start()  # while the query goes on
        time.sleep(3)  # lines flow into the recovered query
        server.finish()
        deadline = time.time() + 30
        while not server.done and time.time() < deadline:
            time.sleep(0.2)
        assert server.done and server.connections >= 3  # the receiver came back, twice, and connected again
        time.sleep(2)  # the last lines stored
        # --drain: every block stored at the stop is processed first
        stopped = cluster.funke("stop", job_id, "--drain", "--timeout", "180", timeout=240)
        assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
        events.drain()
        for t in replacements:
            t.join(120)
    finally:
        server.close()
    lines = server.lines
    source = next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: socket"))
    store = CheckpointStore(str(checkpoint))
    counted = committed_rows(out, read_counts)
    assert sorted(counted) == store.commit_ids()
    received: list[str] = []
    wrong_batches = []
    for batch, rows in counted.items():
        allocated = allocated_lines(checkpoint, source, batch)
        received += allocated
        if dict(rows) != dict(collections.Counter(w for line in allocated for (w,) in split_words(line))):
            wrong_batches.append(batch)
    directory = receiver_blocks_dir(str(checkpoint), source, 0)
    blocks = stored_blocks(os.listdir(directory))
    stored = [line for seq in sorted(blocks)
              for line in (Path(directory) / blocks[seq]).read_text(encoding="utf-8").splitlines()]
    sent_order = {line: i for i, line in enumerate(lines)}
    return {"restarts": events.statuses.count("RESTARTING"), "batches": len(counted), "sent": len(lines),
            "stored": len(stored), "counted": len(received),
            "duplicates": len(received) - len(set(received)),
            "stored_not_counted": len(set(stored) - set(received)),
            "counted_not_stored": len(set(received) - set(stored)),
            "lost_in_flight": len(set(lines) - set(stored)),
            "batches_miscounted": len(wrong_batches),
            "in_order": [sent_order[line] for line in received] == sorted(sent_order[line] for line in received)}


def test_no_line_stored_before_a_kill_is_lost_or_counted_twice(cluster, tmp_path):
    cluster.restore()
    figures = socket_kill_run(cluster, tmp_path)
    assert figures["restarts"] >= 2, figures
    assert figures["duplicates"] == 0 and figures["stored_not_counted"] == 0, figures
    assert figures["counted_not_stored"] == 0 and figures["batches_miscounted"] == 0, figures
    assert figures["in_order"], figures
    # a socket acknowledges nothing: what the receiver had read but not stored when it was killed
    # is gone (at most a block interval's worth, 0.2 s at 100 lines/s, plus what was in flight)
    assert 0 <= figures["lost_in_flight"] <= 100, figures
    assert figures["counted"] == figures["stored"] == figures["sent"] - figures["lost_in_flight"], figures



def test_with_backpressure_a_receiver_slows_to_the_rate_its_batches_are_processed_at(cluster, tmp_path):
    """Lines offered at 400 a second to a query that cannot process more than 200 a second (a map
    that waits 5 ms a line): Spark's PID estimator brings the rate below what is offered, the
    JobMaster sends it to the receiver at once, and from then on the receiver stores no more than
    that (TCP holds the sender back). Measured on the blocks the receiver wrote (their times),
    not on the batches, which were planned before the limit, queued behind the slow ones."""
    cluster.restore()
    server = LineServer(rate=400, make_line=line_number)
    env = ExecutionEnvironment("backpressure", parallelism=1)

    def slow(line):
        time.sleep(0.005)
        return (line,)

    checkpoint = tmp_path / "checkpoint"
    (env.read_stream.socket_text("127.0.0.1", server.port)
        .map(slow, schema="line string")
        .write_parquet(str(tmp_path / "out")))
    env.set_trigger("1 s").set_checkpoint_location(str(checkpoint))
    env.set_option("streaming.backpressure.enabled", "true")
    client = cluster.client
    try:
        job_id = client.submit(env.build())
        # The estimator measures the first batch and sets a rate when the second is through
        deadline = time.time() + 180
        while time.time() < deadline and len([p for p in client.progress(job_id) if p["numInputRows"]]) < 2:
            time.sleep(0.05)
        estimated_at = time.time()
        time.sleep(7)
        limits = [p["sources"][0]["rateLimitPerReceiver"] for p in client.progress(job_id)
                  if "rateLimitPerReceiver" in p["sources"][0]]
        source = next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: socket"))
        client.cancel(job_id)
        wait_status(client, job_id, ("CANCELED",))
    finally:
        server.close()
    assert all(100 <= limit < 300 for limit in limits), limits  # below the 400 offered, not below the minimum
    directory = Path(receiver_blocks_dir(str(checkpoint), source, 0))
    blocks = [(p.stat().st_mtime, len(p.read_text().splitlines())) for p in directory.iterdir()
              if p.name.endswith(".block")]

    def stored_per_second(begin: float, end: float) -> float:
        return sum(n for at, n in blocks if begin <= at < end) / (end - begin)

    assert limits, "no batch was planned under a rate limit"
    # the receiver ran unlimited for a while (from its first block, at most 3.5 s before the
    # estimate): at least 2 s of that are measured as "before"
    began = max(min(at for at, _ in blocks), estimated_at - 3.5)
    assert estimated_at - 0.5 - began >= 2.0, (began, estimated_at)
    before = stored_per_second(began, estimated_at - 0.5)
    after = stored_per_second(estimated_at + 1, estimated_at + 6)
    # limited: no more than the rate (and a block's slack), and far less than it took before
    # (all it could get of the 400 offered on two busy cores)
    assert after <= 1.5 * max(limits), (before, after, limits)
    assert before >= 1.6 * after, (before, after, limits)
