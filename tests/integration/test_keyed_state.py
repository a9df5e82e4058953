"""Running aggregates of streaming queries on a real cluster: keyed state across batches, kept
in the query's checkpoint by key group, through a stop and a restart at another parallelism,
and through kill -9 of TaskManagers at every phase of a batch.

The input is the rate source (row i is value i), so what every committed batch must emit is
known from its offset log entry alone: the totals over values 0 .. end-1."""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy import localcluster
from funke.deploy.client import InvalidJobGraph
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_streaming import (
    PHASES,
    Events,
    _task_managers_of,
    assert_exactly_once,
    cluster,  # noqa: F401 (fixtures: the shared streaming cluster, restored for each test)
    committed_rows,
    kill_at_every_phase,
    rate_job,
    stream_cluster,  # noqa: F401
    wait_status,
)

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 7


def running_job(out: Path, checkpoint: Path, mode: str, *, keyed_parallelism: int, rows_per_second: int = 40,
                trigger: str = "500 ms", max_parallelism: int = 128) -> ExecutionEnvironment:
    env = ExecutionEnvironment("running totals", parallelism=2)
    (env.read_stream.rate(rows_per_second)
        .select(f"value % {KEYS} AS k", "value")
        .key_by("k")
        .aggregate("count(1) AS n", "sum(value) AS total", "max(value) AS top", "avg(value) AS mean")
        .set_parallelism(keyed_parallelism)
        .set_max_parallelism(max_parallelism)
        .write_parquet(str(out)))
    env.set_output_mode(mode).set_trigger(trigger).set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    return env


def expected_totals(end: int) -> dict[int, tuple]:
    """Per key, (n, total, top, mean) over values 0 .. end-1: what a direct computation says."""
    values: dict[int, list[int]] = collections.defaultdict(list)
    for v in range(end):
        values[v % KEYS].append(v)
    return {k: (len(vs), sum(vs), max(vs), sum(vs) / len(vs)) for k, vs in values.items()}


def read_totals(path: Path) -> list[tuple]:
    return [(r["k"], r["n"], r["total"], r["top"], r["mean"]) for r in pq.read_table(path).to_pylist()]


def batch_ends(checkpoint: Path) -> dict[int, int]:
    """Per committed batch, the rows the rate source had produced by its end."""
    store = CheckpointStore(str(checkpoint))
    return {b: int(next(iter(store.read_offsets(b).sources.values())).end["rows"]) for b in store.commit_ids()}


def check_every_batch(out: Path, checkpoint: Path, mode: str) -> int:
    """After every committed batch, the totals the query emitted so far equal the direct ones:
    in complete mode the batch's own output, in update mode the newest row per key of all
    batches so far (a key a batch did not change keeps its earlier total). Returns the
    number of batches checked."""
    ends = batch_ends(checkpoint)
    emitted = committed_rows(out, read_totals)
    assert sorted(emitted) == sorted(ends), f"batches with output {sorted(emitted)}, committed {sorted(ends)}"
    folded: dict[int, tuple] = {}
    for batch in sorted(ends):
        rows = emitted[batch]
        keys = [r[0] for r in rows]
        assert len(keys) == len(set(keys)), f"batch {batch}: a key emitted twice: {sorted(keys)}"
        if mode == "complete":
            folded = {}
        for k, n, total, top, mean in rows:
            folded[k] = (n, total, top, mean)
        expected = expected_totals(ends[batch])
        assert folded.keys() == expected.keys(), f"batch {batch}: keys {sorted(folded)} vs {sorted(expected)}"
        for k in expected:
            n, total, top, mean = folded[k]
            e = expected[k]
            assert (n, total, top) == e[:3] and abs(mean - e[3]) < 1e-9, f"batch {batch}, key {k}: {folded[k]} != {e}"
    return len(ends)


def test_a_running_aggregate_equals_a_direct_computation_after_every_batch_and_through_a_restart_at_another_parallelism(
        stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "totals", tmp_path / "checkpoint"
    client = stream_cluster.client
    first = client.submit(running_job(out, checkpoint, "update", keyed_parallelism=3).build())
    events = Events(client, first)
    events.wait("BatchCompleted", min_batch=3)
    client.stop(first, timeout_s=60)
    assert wait_status(client, first, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    before = len(batch_ends(checkpoint))
    check_every_batch(out, checkpoint, "update")
    state_dirs = list((checkpoint / "state").glob("*/op-0/kg-*"))
    assert len(state_dirs) == 128, f"one directory per key group of the default max parallelism: {len(state_dirs)}"

    # another max parallelism would put the keys in other groups: refused at submit, saying why
    with pytest.raises(InvalidJobGraph) as refused:
        client.submit(running_job(out, checkpoint, "update", keyed_parallelism=2, max_parallelism=64).build())
    assert any("128 key groups" in p for p in refused.value.problems), refused.value.problems

    # the same query restored at parallelism 2: the key groups move to other subtasks, the totals go on
    second = client.submit(running_job(out, checkpoint, "update", keyed_parallelism=2).build())
    events = Events(client, second)
    events.wait("BatchCompleted", min_batch=max(batch_ends(checkpoint)) + 3)
    # while it runs: funke state reads the keys' totals after the last committed batch
    shown = json.loads(stream_cluster.funke("state", second, "--json").stdout)
    expected = expected_totals(batch_ends(checkpoint)[shown["batch_id"]])
    assert {r["k"]: (r["n"], r["total"], r["top"]) for r in shown["rows"]} == {k: e[:3] for k, e in expected.items()}
    one = json.loads(stream_cluster.funke("state", second, "--key", "3", "--json").stdout)
    assert [r["k"] for r in one["rows"]] == [3] and one["matching_keys"] == 1
    wrong = stream_cluster.funke("state", second, "--operator", "no-such-vertex", check=False)
    assert wrong.returncode != 0 and "has no keyed operator" in wrong.stderr, wrong.stderr
    client.stop(second, timeout_s=60)
    assert wait_status(client, second, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    checked = check_every_batch(out, checkpoint, "update")
    assert checked >= before + 3
    # every progress record says what the state holds: the 7 keys, in 128 key groups
    records = [r for r in client.progress(second) if r.get("numInputRows")]
    assert records, client.progress(second)
    for record in records:
        (operator,) = record["stateOperators"]
        assert operator["numRowsTotal"] == KEYS and 1 <= operator["numRowsUpdated"] <= KEYS, operator
        assert operator["numKeyGroups"] == 128 and operator["stateOnDiskBytes"] > operator["checkpointBytesWritten"] > 0


def test_output_and_state_stay_exact_through_taskmanager_kills_at_every_phase_of_a_batch(stream_cluster, tmp_path):
    """One query, two outputs of one rate source: its rows as they are (a plain sink), and running
    totals per key (keyed state, complete mode); a TaskManager killed at each phase of a batch."""
    out, totals, checkpoint = tmp_path / "values", tmp_path / "totals", tmp_path / "checkpoint"
    client = stream_cluster.client
    slow = tmp_path / "slow"
    slow.write_text("0.01")  # 10 ms a row on the plain branch: a batch's tasks take about half a second
    job_id = client.submit(rate_job("kill at every phase", out, checkpoint, rows_per_second=100, slow_marker=slow,
                                    trigger="1 s", totals=(totals, KEYS)).build())
    kill_at_every_phase(stream_cluster, job_id, Events(client, job_id))
    rows, duplicates, lost = assert_exactly_once(out, checkpoint)
    assert rows > 0
    checked = check_every_batch(totals, checkpoint, "complete")
    assert checked >= len(PHASES) + 1
    print(f"kills at every phase: {rows} rows, {duplicates} duplicates, {lost} lost; the totals exact after each of "
          f"{checked} batches")


DISTINCT = 30


def test_drop_duplicates_over_batches_keeps_each_key_once_through_a_taskmanager_kill_and_replayed_batches(
        stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "firsts", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("first of each key", parallelism=2)
    (env.read_stream.rate(20)
        .select(f"value % {DISTINCT} AS k", "value")
        .drop_duplicates("k")
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    batch = events.wait("BatchCompleted")
    events.wait("OutputOperationStarted", min_batch=batch + 1)  # its sinks are writing: it runs again
    localcluster.kill(stream_cluster.dir, sorted(_task_managers_of(client, job_id))[0])
    events.wait_recovered()
    stream_cluster.add_taskmanager()
    events.wait("BatchCompleted", min_batch=max(batch_ends(checkpoint)) + 1)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    assert "RESTARTING" in events.statuses

    ends = batch_ends(checkpoint)
    emitted = committed_rows(out, lambda p: [(r["k"], r["value"]) for r in pq.read_table(p).to_pylist()])
    start = 0
    for b in sorted(ends):
        # the keys first met in this batch's rows, each once, with a value of this batch
        new = {v % DISTINCT for v in range(start, ends[b])} - {v % DISTINCT for v in range(start)}
        rows = emitted.get(b, [])
        assert sorted(k for k, _ in rows) == sorted(new), f"batch {b} [{start}, {ends[b]})"
        assert all(start <= v < ends[b] and v % DISTINCT == k for k, v in rows), f"batch {b}: {rows}"
        start = ends[b]
    assert sum(len(r) for r in emitted.values()) == min(DISTINCT, start)


def test_a_running_reduce_with_a_python_function_equals_a_direct_fold_after_every_batch(stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "folded", tmp_path / "checkpoint"
    client = stream_cluster.client

    def fold(a, b):  # count, sum and max of the values, as the running aggregate's first three
        return (a.k, a.n + b.n, a.total + b.total, max(a.top, b.top))

    env = ExecutionEnvironment("running fold", parallelism=2)
    (env.read_stream.rate(40)
        .select(f"value % {KEYS} AS k", "1L AS n", "value AS total", "value AS top")
        .key_by("k").reduce(fold)
        .write_parquet(str(out)))
    env.set_output_mode("update").set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=3)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    ends = batch_ends(checkpoint)
    emitted = committed_rows(out, lambda p: [(r["k"], r["n"], r["total"], r["top"]) for r in pq.read_table(p).to_pylist()])
    folded: dict[int, tuple] = {}
    for b in sorted(ends):
        folded.update({k: (n, total, top) for k, n, total, top in emitted[b]})
        assert folded == {k: e[:3] for k, e in expected_totals(ends[b]).items()}, f"batch {b}"
    assert len(ends) >= 4


SESSION_KEYS = 5
SESSION_GAP_MS = 1_200


class RateSessions:
    """Sessions per key of the rate source: a session opens with a key's first row, and closes
    (emitting its start, its close, its rows and their first and last value) in the first batch
    that runs SESSION_GAP_MS after the batch of its last row: a per-key state machine with a
    timeout, on processing-time timers."""
    from funke.common.api.state import ValueState
    state = (ValueState("started", "bigint"), ValueState("rows", "bigint"), ValueState("first", "bigint"),
             ValueState("last", "bigint"))
    del ValueState

    def process(self, k, rows, ctx):
        now = ctx.current_processing_time()
        s = ctx.state
        if s.started.value() is None:
            s.started.update(now)
            s.first.update(min(r.value for r in rows))
        s.rows.update((s.rows.value() or 0) + len(rows))
        s.last.update(max(r.value for r in rows))
        timers = ctx.timer_service()
        for t in timers.processing_time_timers():
            timers.delete_processing_time_timer(t)
        timers.register_processing_time_timer(now + SESSION_GAP_MS)

    def on_timer(self, k, timestamp, ctx):
        s = ctx.state
        yield (k, s.started.value(), timestamp, s.rows.value(), s.first.value(), s.last.value())
        for handle in (s.started, s.rows, s.first, s.last):
            handle.clear()


def direct_sessions(checkpoint: Path) -> tuple[dict[int, list[tuple]], dict[int, dict[int, tuple]]]:
    """Per committed batch, the sessions it closes and the ones open after it, computed directly
    from the offset log (each batch's time and rate rows) with the same rules."""
    store = CheckpointStore(str(checkpoint))
    start = 0
    open_: dict[int, list] = {}
    closed: dict[int, list[tuple]] = {}
    after: dict[int, dict[int, tuple]] = {}
    for b in store.commit_ids():
        entry = store.read_offsets(b)
        end = int(next(iter(entry.sources.values())).end["rows"])
        now = entry.batch_time_ms
        for v in range(start, end):
            k = v % SESSION_KEYS
            if (v // 40) % (k + 2) != 0:
                continue  # key k is quiet in this stretch of the input
            s = open_.setdefault(k, [now, 0, v, v, now])
            s[1] += 1
            s[3] = max(s[3], v)
            s[4] = now
        closed[b] = [(k, s[0], s[4] + SESSION_GAP_MS, s[1], s[2], s[3]) for k, s in sorted(open_.items())
                     if s[4] + SESSION_GAP_MS <= now]
        for k, *_ in closed[b]:
            del open_[k]
        after[b] = {k: (s[0], s[1], s[2], s[3]) for k, s in open_.items()}
        start = end
    return closed, after


def test_sessions_with_timeouts_in_a_keyed_process_function_equal_a_direct_computation_through_a_kill(
        stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "sessions", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("sessions", parallelism=2)
    (env.read_stream.rate(40)
        .select(f"value % {SESSION_KEYS} AS k", "value")
        .where("(value DIV 40) % (k + 2) = 0")
        .key_by("k")
        .process(RateSessions(), schema="k bigint, started bigint, closed bigint, rows bigint, first bigint, "
                                        "last bigint")
        .write_parquet(str(out)))
    env.set_trigger("400 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    batch = events.wait("BatchCompleted", min_batch=8)
    events.wait("OutputOperationStarted", min_batch=batch + 1)  # its sinks are writing: it runs again
    localcluster.kill(stream_cluster.dir, sorted(_task_managers_of(client, job_id))[0])
    events.wait_recovered()
    stream_cluster.add_taskmanager()
    events.wait("BatchCompleted", min_batch=max(batch_ends(checkpoint)) + 6)
    shown = json.loads(stream_cluster.funke("state", job_id, "--json").stdout)  # while it runs
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    assert "RESTARTING" in events.statuses

    closed, after = direct_sessions(checkpoint)
    emitted = committed_rows(out, lambda p: [tuple(r.values()) for r in pq.read_table(p).to_pylist()])
    for b in sorted(closed):
        assert sorted(emitted.get(b, [])) == closed[b], f"batch {b}"
    assert sum(len(c) for c in closed.values()) >= 3, closed  # sessions did close, more than once
    print(f"sessions: {sum(len(c) for c in closed.values())} closed over {len(closed)} batches, each as computed "
          f"directly; {len(shown['rows'])} open after batch {shown['batch_id']}")
    assert {r["k"]: (r["started"], r["rows"], r["first"], r["last"]) for r in shown["rows"]} == after[shown["batch_id"]]
    assert all(len(r["timers"]) == 1 for r in shown["rows"])


def wait_pause(client, job_id: str, last_batch_before: int) -> dict | None:
    """The rescale's pause (`rescale_pause`) once the new run committed a batch; None after 60 s."""
    from funke.deploy.client import rescale_pause

    for _ in range(600):
        pause = rescale_pause(client.progress(job_id), last_batch_before)
        if pause is not None:
            return pause
        time.sleep(0.1)
    return None


def test_a_running_aggregate_rescaled_live_2_4_1_keeps_exact_totals_under_one_job_id(stream_cluster, tmp_path):
    from funke.deploy.client import FunkeError

    out, checkpoint = tmp_path / "totals", tmp_path / "checkpoint"
    client = stream_cluster.client
    job_id = client.submit(running_job(out, checkpoint, "update", keyed_parallelism=2).build())
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=3)

    # 2 -> 4 with the CLI, which waits for the first batch at the new parallelism and tells the pause
    shown = json.loads(stream_cluster.funke("rescale", job_id, "--parallelism", "4", "--json").stdout)
    assert set(shown["parallelism"].values()) == {4}, shown
    assert shown["first_batch_after"] > shown["last_batch_before"] >= shown["last_batch_id"] >= 3
    assert 0 < shown["pause_ms"] < 60_000, shown
    details = client.get_job(job_id)
    assert {v.id: v.parallelism for v in details.vertices} == shown["parallelism"]
    events.wait("BatchCompleted", min_batch=shown["first_batch_after"] + 2)

    # refused, whole: beyond the key groups, an unknown vertex
    with pytest.raises(FunkeError, match="exceeds its max parallelism 128"):
        client.rescale(job_id, 200)
    with pytest.raises(FunkeError, match="no vertex 'nope'"):
        client.rescale(job_id, 2, ["nope"])
    # refused for the cluster's slots, once checked: FAILED in its story, the job goes on as it was
    with pytest.raises(FunkeError, match="at the new parallelism needs 64 slots"):
        client.rescale(job_id, 64)

    # 4 -> 1 through the client
    answer = client.rescale(job_id, 1)
    assert set(answer.parallelism.values()) == {1} and "rescaling" in answer.message
    pause = wait_pause(client, job_id, answer.last_batch_id)
    assert pause is not None and pause["pause_ms"] > 0, client.progress(job_id)
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=pause["first_batch_after"] + 2)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    history = [t.to_status for t in client.get_job(job_id).status_history]
    from funke.deploy.cli.render import rescale_state_name
    from funke.deploy.client import job_status_name

    assert [job_status_name(s) for s in history].count("SUSPENDED") == 2, history
    # each rescale's story, carried from run to run (the refused requests above changed nothing)
    status = stream_cluster.funke("status", job_id).stdout
    print(status[status.index("rescales ("):status.index("vertices:")])
    stories = client.get_job(job_id).rescales
    rescaled_path = ["STOPPING", "SUSPENDED", "STARTING", "RUNNING"]
    assert [[rescale_state_name(t.to_state) for t in r.history] for r in stories] == [
        rescaled_path, ["FAILED"], rescaled_path], stories
    assert stories[1].failure.startswith(f"refused: job {job_id} at the new parallelism needs 64 slots")
    assert [dict(r.parallelism) for r in stories[::2]] == [shown["parallelism"], dict(answer.parallelism)]
    assert "rescales (3):" in status and status.count("REQUESTED -> STOPPING -> SUSPENDED -> STARTING -> RUNNING") == 2
    assert "REQUESTED -> FAILED" in status and f"refused: job {job_id} at the new parallelism needs 64" in status
    # every committed batch of the three runs: the totals equal a direct count of every row so far
    checked = check_every_batch(out, checkpoint, "update")
    assert checked >= 9
    print(f"rescale 2 -> 4 -> 1: pauses {shown['pause_ms']} and {pause['pause_ms']} ms; the totals exact after each "
          f"of {checked} batches")
    with pytest.raises(FunkeError, match="rescale takes a running streaming query"):
        client.rescale(job_id, 2)


def test_a_per_batch_aggregate_chained_at_parallelism_1_is_exact_before_and_after_a_live_rescale_to_2(
        stream_cluster, tmp_path):
    """At parallelism 1 the per-batch aggregate runs in the source's chain (no exchange between
    single subtasks); rescaled to 2, it gets its HASH exchange back, and every batch of both runs
    still holds each key once, with the count and sum of exactly the rows of that batch."""
    out, checkpoint = tmp_path / "per-batch", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("per batch")
    (env.read_stream.rate(40)
        .select(f"value % {KEYS} AS k", "value")
        .key_by("k").per_batch().aggregate("count(1) AS n", "sum(value) AS total")
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    job = env.build()
    assert [v.id for v in job.vertices] == ["source-rate"] and job.edges == ()
    job_id = client.submit(job)
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=3)

    answer = client.rescale(job_id, 2)
    assert answer.parallelism == {"source-rate": 2, "aggregate": 2}, answer
    pause = wait_pause(client, job_id, answer.last_batch_id)
    assert pause is not None, client.progress(job_id)
    assert {v.id: v.parallelism for v in client.get_job(job_id).vertices} == {"source-rate": 2, "aggregate": 2}
    Events(client, job_id).wait("BatchCompleted", min_batch=pause["first_batch_after"] + 2)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"

    ends = batch_ends(checkpoint)
    emitted = committed_rows(out, lambda p: [(r["k"], r["n"], r["total"]) for r in pq.read_table(p).to_pylist()])
    start, after = 0, 0
    for batch in sorted(ends):
        values: dict[int, list[int]] = collections.defaultdict(list)
        for v in range(start, ends[batch]):
            values[v % KEYS].append(v)
        expected = sorted((k, len(vs), sum(vs)) for k, vs in values.items())
        assert sorted(emitted.get(batch, [])) == expected, f"batch {batch} (rows {start}..{ends[batch]})"
        after += batch >= pause["first_batch_after"] and bool(expected)
        start = ends[batch]
    assert after >= 2, (sorted(ends), pause)


def test_a_stopped_querys_state_is_read_from_its_checkpoint_with_no_cluster_at_any_committed_batch(
        stream_cluster, tmp_path):
    """Issue 50, item 7: `funke state --checkpoint PATH [--batch N]` reads the state a stopped
    query left, at its last committed batch or an earlier one it keeps, without a JobManager (the
    command is pointed at an address where none answers); exit codes as for every command: 2 when
    the checkpoint does not have what is asked, 1 when its state is there but cannot be read."""
    from tests.integration.conftest import funke

    out, checkpoint = tmp_path / "totals", tmp_path / "checkpoint"
    client = stream_cluster.client
    job_id = client.submit(running_job(out, checkpoint, "complete", keyed_parallelism=2).build())
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=4)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    ends = batch_ends(checkpoint)
    last = max(ends)
    ended = stream_cluster.funke("state", job_id, check=False)  # the JobManager reads only a running query's: a refusal
    assert ended.returncode == 2 and "funke state --checkpoint PATH" in ended.stderr, ended.stderr

    nowhere = tmp_path / "no-cluster"
    nowhere.mkdir()
    env = dict(os.environ, FUNKE_JOBMANAGER="127.0.0.1:9", FUNKE_CLUSTER_DIR=str(nowhere))  # nothing answers there

    def state(*args, check=True):
        return funke("state", *args, env=env, check=check)

    def totals(shown):
        return {r["k"]: (r["n"], r["total"], r["top"]) for r in shown["rows"]}

    shown = json.loads(state("--checkpoint", str(checkpoint), "--json").stdout)
    assert shown["batch_id"] == last and shown["checkpoint"] == str(checkpoint)
    assert totals(shown) == {k: e[:3] for k, e in expected_totals(ends[last]).items()}
    earlier = min(b for b in ends if ends[b] > 0)
    shown = json.loads(state("--checkpoint", str(checkpoint), "--batch", str(earlier), "--json").stdout)
    assert shown["batch_id"] == earlier
    assert totals(shown) == {k: e[:3] for k, e in expected_totals(ends[earlier]).items()}
    one = json.loads(state("--checkpoint", str(checkpoint), "--key", "3", "--json").stdout)
    assert [r["k"] for r in one["rows"]] == [3] and one["matching_keys"] == 1
    table = state("--checkpoint", str(checkpoint), "--limit", "2").stdout
    assert f"(2 of {KEYS} key(s) of " in table and f"after batch {last})" in table, table

    for args, says in [
        (("--checkpoint", str(tmp_path / "nope")), "is not a directory"),
        (("--checkpoint", str(out)), "is not a streaming query's checkpoint"),
        (("--checkpoint", str(checkpoint), "--batch", str(last + 100)), f"batch {last + 100} is not a committed batch"),
        (("--checkpoint", str(checkpoint), "--operator", "nope"), "has no keyed operator 'nope'"),
        (("--checkpoint", str(checkpoint), "--key", "1", "--key", "2"), "2 key values given"),
        ((), "give one of them"),
        ((job_id, "--checkpoint", str(checkpoint)), "give one of them"),
        ((job_id, "--batch", "1"), "give --checkpoint PATH"),
    ]:
        refused = state(*args, check=False)
        assert refused.returncode == 2 and says in refused.stderr, (args, refused.stderr)
    # the state is there, and a file it needs is gone: it cannot be read (never an empty state)
    gone = sorted(checkpoint.glob(f"state/*/op-0/kg-00000/{last + 1}.*"))  # its delta (and snapshot, if any)
    assert gone
    for path in gone:
        path.unlink()
    lost = state("--checkpoint", str(checkpoint), check=False)
    assert lost.returncode == 1 and "cannot be loaded" in lost.stderr and f"{last + 1}." in lost.stderr, lost.stderr
