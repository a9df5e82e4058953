"""A deposed attempt's keyed state is never read (issue 50, item 5): a TaskManager paused with
SIGSTOP in the middle of a batch (its Python worker too), the batch run again on another
TaskManager and committed, then the paused one woken with SIGCONT: its worker goes on and writes
the batch's state files after the re-run wrote them. The input comes through user code that is
not deterministic (a random number per row before the keyed operator), so the two attempts'
state differ, and the next batch must go on from the state the committed output was computed
from: each key's `before` in batch 2 is its `after` in the committed batch 1."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.api.state import KeyedProcessFunction, ValueState
from funke.deploy import localcluster
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.conftest import wait_for
from tests.integration.test_streaming import committed_rows, wait_status

pytestmark = pytest.mark.cluster
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 4
HEARTBEAT_TIMEOUT_S = 6  # under load a TaskManager may miss a few heartbeats without being paused


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A JobManager that loses a silent TaskManager after 6 s; the TaskManagers are the test's."""
    root = tmp_path_factory.mktemp("fencing-cluster")
    info = localcluster.start(localcluster.ClusterSpec(root, 0, 2, dynamic=[
        f"heartbeat.timeout={HEARTBEAT_TIMEOUT_S} s", "heartbeat.interval=500 ms"]))
    client = info.client()
    yield info, client
    client.close()
    localcluster.stop(root)  # every process it recorded, the test's TaskManagers included, by pid


class Totals(KeyedProcessFunction):
    """Each key's running total of its rows' x; emits (key, total before, total after, batch).
    The first attempt of batch 1 to get here stops at a gate until the test opens it."""
    state = (ValueState("total", "double"),)

    def __init__(self, gate: str):
        self.gate = gate

    def process(self, key, rows, ctx):
        reached, release = os.path.join(self.gate, "reached"), os.path.join(self.gate, "release")
        if ctx.batch_id == 1 and not os.path.exists(reached):
            with open(reached + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(reached + ".tmp", reached)
            while not os.path.exists(release):
                time.sleep(0.02)
        before = ctx.state.total.value()
        after = (before or 0.0) + sum(r.x for r in rows)
        ctx.state.total.update(after)
        yield key, before, after, ctx.batch_id


def noisy(line):
    return int(line) % KEYS, random.random()  # a sample, a timestamp, a lookup: not the same twice


def query(incoming: Path, out: Path, checkpoint: Path, gate: Path) -> ExecutionEnvironment:
    env = ExecutionEnvironment("zombie attempt", parallelism=1)
    (env.read_stream.text(str(incoming))
        .map(noisy, schema="k bigint, x double")
        .key_by("k")
        .process(Totals(str(gate)), schema="k bigint, before double, after double, batch bigint")
        .write_parquet(str(out)))
    env.set_trigger("200 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=10, delay="500 ms")
    return env


def feed(incoming: Path, batch: int) -> None:
    tmp = incoming.parent / f".in-{batch}"
    tmp.write_text("".join(f"{i}\n" for i in range(40)))
    os.replace(tmp, incoming / f"part-{batch}.txt")


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except FileNotFoundError:
            return False
    return False


def test_a_paused_attempt_that_writes_its_state_after_the_batch_ran_again_elsewhere_is_never_read(
        cluster, tmp_path):
    info, client = cluster
    incoming, out, checkpoint, gate = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint", tmp_path / "gate"
    incoming.mkdir()
    gate.mkdir()
    first = localcluster.start_taskmanager(info.dir, "tm-first", 2)  # the query runs here ...
    job_id = client.submit(query(incoming, out, checkpoint, gate).build())
    store = CheckpointStore(str(checkpoint))
    feed(incoming, 0)
    wait_for("batch 0's commit", lambda: 0 in store.commit_ids(), timeout=180)
    localcluster.start_taskmanager(info.dir, "tm-second", 2)  # ... and goes on here
    feed(incoming, 1)
    worker = int(wait_for("batch 1's keyed operator at the gate", lambda: (gate / "reached").exists()
                          and (gate / "reached").read_text(), timeout=120))
    assert descends_from(worker, first.pid), (f"the Python worker at the gate (pid {worker}) is not the first "
                                              f"TaskManager's, or is gone: {client.get_job(job_id).exceptions}")
    # The machine pauses: the TaskManager's process group (its Spark JVM) and the Python workers'
    # (PySpark's daemon makes a group of its own), both started by the TaskManager this test started
    worker_group = os.getpgid(worker)
    os.killpg(worker_group, signal.SIGSTOP)
    localcluster.kill(info.dir, "tm-first", signal.SIGSTOP)
    paused_at = time.time()
    try:
        wait_for("batch 1 run again elsewhere and committed", lambda: 1 in store.commit_ids(), timeout=240)
        committed_at = time.time()
        (gate / "release").write_text("")
    finally:
        os.killpg(worker_group, signal.SIGCONT)
        localcluster.kill(info.dir, "tm-first", signal.SIGCONT)

    def zombie_wrote() -> list[str]:
        """State files of version 2 (batch 1's) written after the commit: the woken attempt's."""
        return sorted(p.name for p in checkpoint.glob("state/*/op-0/kg-*/2.*")
                      if p.stat().st_mtime > committed_at and not p.name.endswith(".tmp"))

    written = wait_for("the woken attempt's state files of batch 1", zombie_wrote, timeout=60)
    feed(incoming, 2)
    wait_for("batch 2's commit", lambda: 2 in store.commit_ids(), timeout=180)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"

    rows = committed_rows(out, lambda p: [(r["k"], r["before"], r["after"], r["batch"])
                                          for r in pq.read_table(p).to_pylist()])
    assert sorted(rows) == [0, 1, 2], sorted(rows)
    after = {b: {k: a for k, _, a, _ in rows[b]} for b in rows}
    before = {b: {k: x for k, x, _, _ in rows[b]} for b in rows}
    assert set(after[1]) == set(after[2]) == set(range(KEYS))
    wrong = {k: (before[2][k], after[1][k]) for k in range(KEYS) if before[2][k] != after[1][k]}
    assert not wrong, (f"batch 2 went on from state its committed batch 1 did not leave (key: (before in batch 2, "
                       f"after in batch 1)): {wrong}; the woken attempt wrote {written}")
    assert all(before[1][k] == after[0][k] for k in range(KEYS))
    print(f"paused {committed_at - paused_at:.1f} s until batch 1 committed elsewhere; the woken attempt then wrote "
          f"{len(written)} state file(s) of batch 1 ({written[:2]}...), none read: batch 2 went on from the "
          f"committed state for all {KEYS} keys")
