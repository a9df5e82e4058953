"""Redis Streams on a real cluster (a JobManager, three TaskManagers with PySpark, a real
redis-server on loopback): entries XADD'ed while a query runs go to a file sink and to a Redis
sink; a TaskManager is killed (-9) at every phase of a batch; afterwards each sink holds every
entry of the committed ranges exactly once."""

from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest
import redis

from funke.common.api.dsl import ExecutionEnvironment
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_streaming import PHASES, Events, StreamCluster, kills_in_every_phase

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = ("orders", "returns")


class Producer:
    """XADDs entries to the keys, `rate` a second in all, each with a unique `n`, until stopped."""

    def __init__(self, port: int, rate: float):
        self.client = redis.Redis(port=port)
        self.rate = rate
        self.added = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            key = KEYS[self.added % len(KEYS)]
            self.client.xadd(key, {"n": str(self.added), "item": f"item-{self.added % 13}"})
            self.added += 1
            time.sleep(1 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def to_row(fields):
    return (int(fields["n"]), fields["item"])


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def committed_ids(checkpoint: Path, source: str, port: int) -> list[int]:
    """Every entry's `n` in the ranges of the committed batches, read from Redis."""
    store = CheckpointStore(str(checkpoint))
    client = redis.Redis(port=port)
    out = []
    for batch in store.commit_ids():
        entry = store.read_offsets(batch).sources[source]
        for key in KEYS:
            begin = (entry.start or {}).get(key, "0-0")
            end = (entry.end or {}).get(key, "0-0")
            if begin != end:
                out += [int(f[b"n"]) for _, f in client.xrange(key, f"({begin}", end)]
    return sorted(out)


def redis_kill_run(cluster: StreamCluster, port: int, tmp_path: Path, rate: float = 50,
                   kills_per_phase: int = 1) -> dict:
    """Entries XADD'ed at `rate` a second to two keys, read by a query into a Parquet sink and a
    Redis sink; a TaskManager running the query's tasks is killed (-9) at every phase of a batch
    (`kills_per_phase` times each), a replacement started as a supervisor would; the producer
    stops, the query takes every entry, is stopped, and what the sinks hold is tallied against
    the entries of the committed batches' id ranges (read back from Redis)."""
    redis.Redis(port=port).delete(*KEYS, "copied")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = ExecutionEnvironment(f"redis streams {tmp_path.name}", parallelism=2)
    entries = env.read_stream.redis(list(KEYS), port=port, starting="earliest", max_entries_per_trigger=400)
    rows = entries.select("fields['n'] AS n", "fields['item'] AS item", "stream")
    rows.write_parquet(str(out))
    rows.write_redis("copied", port=port)
    env.set_trigger("2 s").set_checkpoint_location(str(checkpoint))  # a query that keeps up: recoveries rerun little
    env.set_option("streaming.min-batches-to-retain", "100000")  # every batch's range stays to check
    env.set_restart_strategy("fixed-delay", attempts=100, delay="500 ms")
    producer = Producer(port, rate=rate)
    client = cluster.client
    try:
        replacements: list[threading.Thread] = []
        job_id = client.submit(env.build())
        events = Events(client, job_id)
        kills = kills_in_every_phase(cluster, job_id, events, kills_per_phase, replacements)
        producer.stop()
        source = next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: redis"))
        deadline = time.time() + 120
        while time.time() < deadline and len(committed_ids(checkpoint, source, port)) < producer.added:
            time.sleep(0.5)  # until the committed batches took every entry added
        stopped = cluster.funke("stop", job_id, "--timeout", "60")
        assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
        events.drain()
        for t in replacements:
            t.join(120)
    finally:
        producer.stop()
    expected = committed_ids(checkpoint, source, port)
    in_files = collections.Counter(int(r["n"]) for b in streamsinks.committed_batches(str(out))
                                   for f in streamsinks.committed_files(str(out), b)
                                   for r in pq.read_table(out / f).to_pylist())
    copied = [{k.decode(): v.decode() for k, v in f.items()} for _, f in redis.Redis(port=port).xrange("copied")]
    in_redis = collections.Counter(int(c["n"]) for c in copied)
    want = set(expected)
    return {"kills": kills, "restarts": events.statuses.count("RESTARTING"), "added": producer.added,
            "committed": len(expected), "committed_distinct": len(want),
            "file_rows": sum(in_files.values()), "file_duplicates": sum(n - 1 for n in in_files.values() if n > 1),
            "file_lost": len(want - set(in_files)), "file_beyond": len(set(in_files) - want),
            "redis_rows": sum(in_redis.values()), "redis_duplicates": sum(n - 1 for n in in_redis.values() if n > 1),
            "redis_lost": len(want - set(in_redis)), "redis_beyond": len(set(in_redis) - want),
            "redis_fields_wrong": sum(1 for c in copied if c["item"] != f"item-{int(c['n']) % 13}"
                                      or c["stream"] not in KEYS),
            "lag_keys": sorted(client.progress(job_id)[-1]["sources"][0].get("lag", {}))}


def test_exactly_once_into_files_and_into_redis_through_kills_at_every_phase(cluster, redis_server, tmp_path):
    cluster.restore()
    figures = redis_kill_run(cluster, redis_server, tmp_path)
    assert figures["kills"] == len(PHASES) and figures["restarts"] >= len(PHASES), figures
    # the committed ranges hold every entry added, each once
    assert figures["committed"] == figures["committed_distinct"] == figures["added"], figures
    # the file sink: every entry of the committed ranges once
    assert figures["file_rows"] == figures["added"], figures
    assert figures["file_duplicates"] == figures["file_lost"] == figures["file_beyond"] == 0, figures
    # the Redis sink: every entry once, with its fields
    assert figures["redis_rows"] == figures["added"], figures
    assert figures["redis_duplicates"] == figures["redis_lost"] == figures["redis_beyond"] == 0, figures
    assert figures["redis_fields_wrong"] == 0, figures
    assert figures["lag_keys"] == sorted(KEYS), figures
