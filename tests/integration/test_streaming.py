"""Streaming queries on a real cluster (a JobManager and three TaskManagers with PySpark):
micro-batches over files dropped into a directory and over the rate source, the offset and
commit logs, exactly-once file sinks through TaskManager kills, restart from a checkpoint,
graceful stop, cancel, a stuck sink, the listener events' order, and what a sink's folder holds
once its query ended (stopped, finished, cancelled, failed).

Every check reads what the query left on disk — the checkpoint's logs and the sinks' manifests
— and compares it with what the input was."""

from __future__ import annotations

import collections
import csv
import json
import os
import queue
import re
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.sources import FilesSource
from funke.deploy import localcluster
from funke.deploy.client import JobManagerClient, job_status_name
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.conftest import StreamCluster, funke, listing  # noqa: F401 (StreamCluster: for the modules importing it from here)

pytestmark = pytest.mark.cluster

# The TaskManagers cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ORDER = ("BatchSubmitted", "BatchStarted", "OutputOperationStarted", "OutputOperationCompleted", "BatchCompleted")


# ---------------------------------------------------------------------------- the cluster

@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


@pytest.fixture
def stream_cluster(cluster):
    cluster.restore()
    yield cluster


class Events:
    """A job's streaming events as WatchJob delivers them, gathered by a thread."""

    def __init__(self, client: JobManagerClient, job_id: str):
        self.seen: list[tuple[str, int]] = []
        self.statuses: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(client, job_id), daemon=True)
        self._thread.start()

    def _pump(self, client: JobManagerClient, job_id: str) -> None:
        for event in client.watch(job_id):
            kind = event.WhichOneof("event")
            if kind == "streaming":
                self._queue.put((event.streaming.kind, event.streaming.batch_id))
            elif kind == "job_status":
                self._queue.put(("status", job_status_name(event.job_status.to_status)))
        self._queue.put(("end", -1))

    def _events(self, timeout: float):
        """The events as they come (job statuses are recorded and yielded too), until the stream
        ends or `timeout` passes."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                item = self._queue.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                return
            if item[0] == "status":
                self.statuses.append(item[1])
            else:
                self.seen.append(item)
            yield item
            if item[0] == "end":
                return

    def wait(self, kind: str, min_batch: int = 0, timeout: float = 120) -> int:
        """Until an event `kind` of a batch >= min_batch (returns its batch id)."""
        for what, batch in self._events(timeout):
            if what == kind and batch >= min_batch:
                return batch
        raise AssertionError(f"no {kind} of a batch >= {min_batch} within {timeout} s; saw {self.seen[-12:]}")

    def wait_recovered(self, timeout: float = 180) -> int:
        """After a failure: until the job RESTARTING, RUNNING again, and the first batch completed
        after that (returns its id)."""
        restarting = running = False
        for what, value in self._events(timeout):
            if what == "status":
                restarting = restarting or value == "RESTARTING"
                running = running or (restarting and value == "RUNNING")
            elif running and what == "BatchCompleted":
                return value
        raise AssertionError(f"no recovery within {timeout} s; saw {self.statuses[-6:]} {self.seen[-6:]}")

    def drain(self, timeout: float = 120) -> None:
        try:
            self.wait("end", timeout=timeout)
        except AssertionError:
            pass


def wait_status(client: JobManagerClient, job_id: str, statuses: tuple[str, ...], timeout: float = 180) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = job_status_name(client.get_job(job_id).status)
        if status in statuses:
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} is {status}, not {statuses}, after {timeout} s")


def words(line):
    return [(w,) for w in line.lower().split() if w]


def committed_rows(target: Path, reader) -> dict[int, list]:
    """Per committed batch (its manifest), the rows of its files."""
    out = {}
    for b in streamsinks.committed_batches(str(target)):
        rows = []
        for name in streamsinks.committed_files(str(target), b):
            rows += reader(target / name)
        out[b] = rows
    return out


def read_counts(path: Path) -> list[tuple[str, int]]:
    with open(path, newline="") as f:
        return [(r["word"], int(r["count"])) for r in csv.DictReader(f)]


def read_values(path: Path) -> list[int]:
    return pq.read_table(path).column("value").to_pylist()


def assert_listener_order(seen: list[tuple[str, int]]) -> None:
    """Per batch, the seeds' order: submitted, started, output operations, completed."""
    by_batch: dict[int, list[str]] = collections.defaultdict(list)
    for kind, batch in seen:
        if kind in ORDER:
            by_batch[batch].append(kind)
    assert by_batch, "no batch events"
    for batch, kinds in by_batch.items():
        if "BatchCompleted" not in kinds:
            continue
        firsts = [kinds.index(k) for k in ORDER]
        assert firsts == sorted(firsts), f"batch {batch}: events out of order: {kinds}"


# ---------------------------------------------------------------------------- word count over files

def test_a_streaming_word_count_counts_each_batch_exactly_as_its_files(stream_cluster, tmp_path):
    incoming, out, checkpoint = tmp_path / "incoming", tmp_path / "counts", tmp_path / "checkpoint"
    incoming.mkdir()
    env = ExecutionEnvironment("streaming word count", parallelism=2)
    (env.read_stream.text(str(incoming), max_files_per_trigger=2)
        .flat_map(words, schema="word string")
        .key_by("word").per_batch().count()
        .write_csv(str(out)))
    env.set_trigger("300 ms").set_checkpoint_location(str(checkpoint))
    client = stream_cluster.client
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    wait_status(client, job_id, ("RUNNING",))
    texts = {}
    vocabulary = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    for i in range(7):  # dropped while the job runs, written aside and renamed in (as with Spark)
        text = " ".join(vocabulary[(i + j) % 7] for j in range(3 + 2 * i)) + "\n" + vocabulary[i] + "\n"
        aside = incoming / f".part-{i}.txt"
        aside.write_text(text)
        aside.rename(incoming / f"part-{i}.txt")
        texts[f"part-{i}.txt"] = text
        time.sleep(0.4)
    deadline = time.time() + 180
    while time.time() < deadline:  # until a batch committed the 7th file
        progress = client.progress(job_id)
        if progress and progress[-1]["sources"][0]["endOffset"] == 7:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the 7 files were not all processed: {client.progress(job_id)[-1:]}")
    status = job_status_name(client.get_job(job_id).status)
    shown = stream_cluster.funke("status", job_id).stdout
    assert status == "RUNNING" and "latest micro-batch:" in shown, shown
    # a batch that is through has its partitions deleted with the next batch: a running query
    # keeps the last ones only, not one directory per batch it ever ran
    partitions = Path(stream_cluster.info.data_dir) / "jobs" / job_id / "partitions"
    kept = [p for p in partitions.glob("*/p*/a*/batch-*")]
    batches_kept = {p.name for p in kept}
    assert 1 <= len(batches_kept) <= 2 < client.progress(job_id)[-1]["batchId"], sorted(batches_kept)
    table = stream_cluster.funke("progress", job_id).stdout
    assert "BATCH" in table and "ROWS" in table, table
    stopped = stream_cluster.funke("stop", job_id, "--timeout", "60")
    assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
    events.drain()

    store = CheckpointStore(str(checkpoint))
    seen = store.seen_files(store_source(store))
    assert sorted(seen) == sorted(texts)
    counted = committed_rows(out, read_counts)
    assert len(counted) >= 4, f"7 files at most 2 per trigger make at least 4 batches, got {sorted(counted)}"
    assert sorted(counted) == store.commit_ids()
    total: collections.Counter = collections.Counter()
    for batch, rows in counted.items():
        entry = store.read_offsets(batch)
        (source_range,) = entry.sources.values()
        files = FilesSource.files(source_range, seen)
        assert 1 <= len(files) <= 2
        expected = collections.Counter(w for f in files for (w,) in words(texts[f]))
        assert dict(rows) == dict(expected), f"batch {batch} ({files})"
        assert len(rows) == len(expected), f"batch {batch}: a word counted twice: {rows}"
        total.update(dict(rows))
    assert total == collections.Counter(w for t in texts.values() for (w,) in words(t))
    assert_listener_order(events.seen)
    progress = json.loads(stream_cluster.funke("progress", job_id, "--json").stdout)
    assert progress and progress[-1]["batchId"] == max(counted)
    for record in progress:  # the rows a file source read: counted while its batch ran
        files = FilesSource.files(store.read_offsets(record["batchId"]).sources[store_source(store)], seen)
        assert record["numInputRows"] == sum(texts[f].count("\n") for f in files), record


def store_source(store: CheckpointStore) -> str:
    (source,) = os.listdir(os.path.join(store.root, "sources"))
    return source


# ---------------------------------------------------------------------------- rate source jobs

def rate_job(name: str, out: Path, checkpoint: Path, *, rows_per_second: int = 40, parallelism: int = 2,
             slow_marker: Path | None = None, trigger: str = "500 ms",
             totals: tuple[Path, int] | None = None) -> ExecutionEnvironment:
    """Rate rows -> (slowed by the marker's seconds a row) -> Parquet at `out`. With `totals`
    (a directory, a number of keys k): also, from the same source, running totals per value % k
    (count n, sum total, max top, avg mean) in complete mode to that directory."""
    marker = str(slow_marker) if slow_marker else ""

    def through(value):
        # With a marker file, each row waits as long as it says (a slow or stuck sink).
        if marker and os.path.exists(marker):
            with open(marker) as f:
                time.sleep(float(f.read() or 0))
        return value

    env = ExecutionEnvironment(name, parallelism=parallelism)
    source = env.read_stream.rate(rows_per_second)
    source.select("value").map(through, schema="value bigint").write_parquet(str(out))
    if totals is not None:
        target, keys = totals
        (source.select(f"value % {keys} AS k", "value").key_by("k")
            .aggregate("count(1) AS n", "sum(value) AS total", "max(value) AS top", "avg(value) AS mean")
            .write_parquet(str(target)))
        env.set_output_mode("complete")
    env.set_trigger(trigger).set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    return env


def assert_exactly_once(out: Path, checkpoint: Path) -> tuple[int, int, int]:
    """Every row the committed batches' offsets hold is in the sink once: (rows, duplicates, lost)."""
    store = CheckpointStore(str(checkpoint))
    commits = store.commit_ids()
    assert commits == list(range(commits[0], commits[-1] + 1))
    last = store.read_offsets(commits[-1])
    (end,) = [r.end for r in last.sources.values()]
    expected = int(end["rows"])
    values = [v for rows in committed_rows(out, read_values).values() for v in rows]
    counts = collections.Counter(values)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    lost = len(set(range(expected)) - set(counts))
    assert (duplicates, lost) == (0, 0), f"{duplicates} duplicate(s), {lost} lost of {expected} rows"
    assert set(counts) == set(range(expected)), "rows beyond the committed offsets"
    return expected, duplicates, lost


def test_restart_from_the_checkpoint_keeps_the_query_id_and_continues_at_the_next_batch(stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "values", tmp_path / "checkpoint"
    client = stream_cluster.client
    first = client.submit(rate_job("rate restart", out, checkpoint).build())
    events = Events(client, first)
    events.wait("BatchCompleted", min_batch=2)
    before = client.progress(first)
    client.cancel(first)
    wait_status(client, first, ("CANCELED",))
    events.drain()
    store = CheckpointStore(str(checkpoint))
    commits = store.commit_ids()
    # cancel commits nothing more: every manifest is a committed batch's
    assert set(streamsinks.committed_batches(str(out))) <= set(commits) | {max(commits) + 1}

    second = client.submit(rate_job("rate restart", out, checkpoint).build())
    events = Events(client, second)
    events.wait("BatchCompleted", min_batch=max(commits) + 2)
    after = client.progress(second)
    assert after[0]["id"] == before[0]["id"], "the query id is the checkpoint's"
    assert after[0]["runId"] != before[-1]["runId"], "a new run id per start"
    assert after[0]["batchId"] == max(commits) + 1, f"continues after the last commit {max(commits)}: {after[0]}"
    client.stop(second, timeout_s=60)
    wait_status(client, second, ("FINISHED",))
    events.drain()
    assert_exactly_once(out, checkpoint)


def test_graceful_stop_finishes_the_batch_in_flight_and_cancel_does_not_commit_it(stream_cluster, tmp_path):
    client = stream_cluster.client
    slow = tmp_path / "slow"
    slow.write_text("0.6")
    outcomes = {}
    for how in ("stop", "cancel"):
        out, checkpoint = tmp_path / f"{how}-values", tmp_path / f"{how}-checkpoint"
        job_id = client.submit(rate_job(f"slow {how}", out, checkpoint, rows_per_second=4, parallelism=1,
                                        slow_marker=slow).build())
        events = Events(client, job_id)
        batch = events.wait("BatchStarted", min_batch=1)
        if how == "stop":
            status, message = client.stop(job_id, timeout_s=120)
            assert status == "RUNNING" and "finishes and commits" in message
            outcomes[how] = wait_status(client, job_id, ("FINISHED", "CANCELED", "FAILED"))
        else:
            client.cancel(job_id)
            outcomes[how] = wait_status(client, job_id, ("CANCELED", "FAILED"))
        events.drain()
        store = CheckpointStore(str(checkpoint))
        committed = store.commit_ids()
        if how == "stop":
            assert batch in committed and batch in streamsinks.committed_batches(str(out))
            assert_exactly_once(out, checkpoint)
            assert_listener_order(events.seen)
        else:
            assert batch not in committed and batch not in streamsinks.committed_batches(str(out))
            assert batch in store.offset_ids(), "the batch stays in the offset log, to run again"
    assert outcomes == {"stop": "FINISHED", "cancel": "CANCELED"}


def test_a_stuck_sink_makes_stop_time_out_and_cancel_instead_of_hanging(stream_cluster, tmp_path):
    client = stream_cluster.client
    stuck = tmp_path / "stuck"
    out, checkpoint = tmp_path / "values", tmp_path / "checkpoint"
    stuck.write_text("600")
    job_id = client.submit(rate_job("stuck sink", out, checkpoint, rows_per_second=4, parallelism=1,
                                    slow_marker=stuck).build())
    events = Events(client, job_id)
    batch = events.wait("BatchStarted")
    began = time.time()
    stopped = stream_cluster.funke("stop", job_id, "--timeout", "3", check=False, timeout=120)
    took = time.time() - began
    assert stopped.returncode == 1 and f"job {job_id} is CANCELED" in stopped.stdout, stopped.stdout + stopped.stderr
    # it said what would happen: the batch in flight was to finish, and the stop to time out
    said = stopped.stdout.splitlines()[0]
    assert said.startswith(f"job {job_id}: stopping: batch {batch} in flight finishes and commits"), said
    assert said.endswith("if it has not ended within 3 s, the job is cancelled (CANCELED)"), said
    assert "1 if it is cancelled (CANCELED)" in stopped.stdout
    assert took < 90, f"stop took {took:.1f} s"
    history = stream_cluster.funke("status", job_id).stdout
    assert "CANCELLING" in history
    events.drain()


# ---------------------------------------------------------------------------- exactly once through kills

PHASES = (
    # (the event a TaskManager is killed at, what has happened to that batch by then)
    ("BatchCompleted", "between batches: the next one's offsets are not logged yet"),
    ("BatchSubmitted", "its offsets are logged (WAL), its tasks not run"),
    ("OutputOperationStarted", "its sinks are writing"),
    ("OutputOperationCompleted", "its sinks have written; its commit and commit entry follow"),
)


def _task_managers_of(client: JobManagerClient, job_id: str) -> set[str]:
    return {s.current.task_manager_id for v in client.get_job(job_id).vertices for s in v.subtasks
            if s.current.task_manager_id}


# Exactly once through kills at every phase of a batch, for a plain sink and for keyed state at
# once: tests/integration/test_keyed_state.py::test_output_and_state_stay_exact_through_...


def kills_in_every_phase(cluster, job_id: str, events: Events, rounds: int,
                         replacements: list[threading.Thread]) -> int:
    """`rounds` times, kill -9 one of the query's TaskManagers at each of PHASES of a batch and
    wait for the query to recover; after each kill a replacement TaskManager starts in the
    background (appended to `replacements`), as a supervisor would, while the query goes on.
    Returns the number of kills. (`cluster`: a StreamCluster.)"""
    client = cluster.client
    kills = 0
    batch = events.wait("BatchCompleted", timeout=180)
    for _ in range(rounds):
        for kind, _ in PHASES:
            batch = events.wait(kind, min_batch=batch + 1, timeout=180)
            localcluster.kill(cluster.dir, sorted(_task_managers_of(client, job_id))[0])
            kills += 1
            batch = events.wait_recovered(timeout=300)
            replacements.append(threading.Thread(target=cluster.add_taskmanager))
            replacements[-1].start()
    return kills


def kill_at_every_phase(stream_cluster, job_id: str, events: Events) -> None:
    """kill -9 of one of the query's TaskManagers at each of PHASES of a batch (a replacement
    started after each recovery), then a graceful stop: FINISHED, after a restart per kill."""
    client = stream_cluster.client
    batch = events.wait("BatchCompleted")
    for kind, _ in PHASES:
        batch = events.wait(kind, min_batch=batch + 1)
        victim = sorted(_task_managers_of(client, job_id))[0]
        localcluster.kill(stream_cluster.dir, victim)
        batch = events.wait_recovered()
        stream_cluster.add_taskmanager()
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    assert events.statuses.count("RESTARTING") >= len(PHASES), events.statuses


# ---------------------------------------------------------------------------- collect() without a batch

COLLECT_LINES = '''
from funke.common.api.dsl import ExecutionEnvironment


def build(args):
    incoming, checkpoint, trigger = args
    env = ExecutionEnvironment("collect lines " + trigger.replace(" ", ""), parallelism=1)
    env.read_stream.text(incoming).collect()
    if trigger == "available-now":
        env.set_trigger(available_now=True)
    else:
        env.set_trigger(trigger)
    env.set_checkpoint_location(checkpoint)
    return env
'''


def test_a_collect_that_committed_no_batch_has_zero_rows_and_submit_result_and_stop_say_so(stream_cluster, tmp_path):
    incoming, job_file = tmp_path / "incoming", tmp_path / "collect_lines.py"
    incoming.mkdir()
    job_file.write_text(COLLECT_LINES)
    (incoming / "a.txt").write_text("one\ntwo\n")
    args = ("--", str(incoming), str(tmp_path / "ck-now"), "available-now")
    first = stream_cluster.funke("submit", str(job_file), *args, check=False)
    assert first.returncode == 0 and "collected 2 row(s)" in first.stdout, first.stdout + first.stderr
    # the second run on the same checkpoint finds no new file: no batch, FINISHED, zero rows
    second = stream_cluster.funke("submit", str(job_file), *args, check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "collected 0 row(s)" in second.stdout and "no longer in the data directory" not in second.stderr
    job_id = second.stdout.split()[2]  # "submitted job <id> ..."
    result = stream_cluster.funke("result", job_id, check=False)
    assert result.returncode == 0 and "(0 row(s) from" in result.stdout, result.stdout + result.stderr

    # a processing-time query on an empty directory: while it runs, and once stopped
    empty = tmp_path / "empty"
    empty.mkdir()
    job_id = stream_cluster.funke("submit", "--detach", str(job_file), "--", str(empty), str(tmp_path / "ck-pt"),
                                  "300 ms").stdout.strip()
    running = stream_cluster.funke("result", job_id, check=False)  # at once, maybe before its first run
    assert running.returncode == 0 and "(0 row(s) from" in running.stdout, running.stdout + running.stderr
    wait_status(stream_cluster.client, job_id, ("RUNNING",))
    running = stream_cluster.funke("result", job_id, check=False)
    assert running.returncode == 0 and "(0 row(s) from" in running.stdout, running.stdout + running.stderr
    stopped = stream_cluster.funke("stop", job_id, "--timeout", "120", check=False)
    assert stopped.returncode == 0 and f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout + stopped.stderr
    after = stream_cluster.funke("result", job_id, check=False)
    assert after.returncode == 0 and "(0 row(s) from" in after.stdout, after.stdout + after.stderr


# ---------------------------------------------------------------------------- a sink's folder once its query ended

def settled_sink_folder(target: Path, timeout: float = 60) -> list[str]:
    """After a query's job ended (its clean-up runs a moment later): the sink folder's listing,
    once it holds no staging. It must then hold what a reader needs and nothing else: the
    manifests, and exactly the files they name."""
    deadline = time.monotonic() + timeout
    while any(name.startswith(".") for name in os.listdir(target)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{target} still holds staging {timeout:g} s after its job ended: {listing(target)}")
        time.sleep(0.2)
    entries = listing(target)
    batches = streamsinks.committed_batches(str(target))
    named = [name for b in batches for name in streamsinks.committed_files(str(target), b)]
    assert batches and all(re.fullmatch(r"batch-\d+-\d+-part-.+", n) for n in named), named
    assert entries == sorted(["_funke_sink_log", *(f"_funke_sink_log/{b}" for b in batches), *named]), entries
    return entries


def failing_rate_job(name: str, fast: Path, out: Path, checkpoint: Path, marker: Path,
                     slow: Path) -> ExecutionEnvironment:
    """Rate rows -> Parquet at `fast`, and the same rows -> Parquet at `out`, each of these slowed
    by the seconds in `slow` (the sinks are separate tasks: `fast` stages a batch while `out`
    takes its time); once `marker` exists, every row to `out` fails, and the job has no restart
    left."""
    fail, wait = str(marker), str(slow)

    def through(value):
        if os.path.exists(fail):
            raise RuntimeError("a planted failure")
        if os.path.exists(wait):
            with open(wait) as f:
                time.sleep(float(f.read() or 0))
        return value

    env = ExecutionEnvironment(name, parallelism=1)
    rows = env.read_stream.rate(4).select("value")
    rows.write_parquet(str(fast))
    rows.map(through, schema="value bigint").write_parquet(str(out))
    env.set_trigger("300 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("none")
    return env


def test_once_a_query_ended_its_sink_folder_holds_the_committed_files_and_manifests_only(stream_cluster, tmp_path,
                                                                                        capsys):
    """Stopped; cancelled with a batch in flight, one sink's output of it staged, the other's not
    yet (that staged output goes); submitted again on the same checkpoint (it runs that batch
    again and commits it exactly once) and failed with no restart left; a bounded query
    (available-now) that finished, its collect sink's rows too: each time the sinks' folders end
    up with the committed files and their manifests, nothing staged (before: an empty
    `.funke-staging/` at least, and the cancelled batch's staged files)."""
    client = stream_cluster.client
    fast, out, checkpoint = tmp_path / "fast", tmp_path / "values", tmp_path / "checkpoint"
    slow, fail = tmp_path / "slow", tmp_path / "fail"
    folders: dict[str, list[str]] = {}
    cancelled = -1  # the batch in flight when the query was cancelled

    def run(how: str) -> str:
        nonlocal cancelled
        job_id = client.submit(failing_rate_job(f"sink folder {how}", fast, out, checkpoint, fail, slow).build())
        events = Events(client, job_id)
        # the second job on the checkpoint fails once it ran the cancelled batch again
        batch = events.wait("BatchCompleted", min_batch={"stop": 1, "cancel": 0, "fail": cancelled}[how])
        if how == "stop":
            client.stop(job_id, timeout_s=120)
            status = wait_status(client, job_id, ("FINISHED", "CANCELED", "FAILED"))
        elif how == "cancel":
            slow.write_text("2")  # the next batch's slow sink runs for seconds
            cancelled = events.wait("OutputOperationCompleted", min_batch=batch + 1)  # the fast sink staged it
            client.cancel(job_id)
            status = wait_status(client, job_id, ("CANCELED", "FAILED"))
            slow.unlink()
        else:
            fail.touch()
            status = wait_status(client, job_id, ("FAILED", "CANCELED", "FINISHED"))
            fail.unlink()
        events.drain()
        folders[how] = settled_sink_folder(out)
        folders[f"{how}, fast sink"] = settled_sink_folder(fast)
        return status

    assert run("stop") == "FINISHED"
    assert run("cancel") == "CANCELED"
    for target in (out, fast):
        assert cancelled not in streamsinks.committed_batches(str(target)), "the cancelled batch was committed"
    assert run("fail") == "FAILED"
    for target in (out, fast):
        assert cancelled in streamsinks.committed_batches(str(target))
        assert_exactly_once(target, checkpoint)

    incoming, counted = tmp_path / "incoming", tmp_path / "counts"
    incoming.mkdir()
    for i in range(3):
        (incoming / f"part-{i}.txt").write_text(f"alpha beta\nline {i}\n")
    env = ExecutionEnvironment("sink folder bounded", parallelism=1)
    lines = env.read_stream.text(str(incoming), max_files_per_trigger=1)
    lines.flat_map(words, schema="word string").write_csv(str(counted))
    lines.collect()
    env.set_trigger(available_now=True).set_checkpoint_location(str(tmp_path / "checkpoint-bounded"))
    job_id = client.submit(env.build())
    assert wait_status(client, job_id, ("FINISHED", "CANCELED", "FAILED")) == "FINISHED"
    folders["finished"] = settled_sink_folder(counted)
    assert len(streamsinks.committed_batches(str(counted))) == 3
    (collected,) = (Path(stream_cluster.info.data_dir) / "jobs" / job_id / "collect").iterdir()
    folders["finished, collected rows"] = settled_sink_folder(collected)
    with capsys.disabled():
        for how, entries in folders.items():
            print(f"\n{how}: {entries}")
