"""Exactly once from Kafka to Kafka on a real cluster and a real broker (the session's Tansu
`kafka_broker`): numbered records produced into a 4-partition topic while a query reads them into a
Parquet sink and into another topic (write_kafka, exactly_once); kill -9 of a TaskManager at every
phase of a batch (three TaskManagers, a replacement started after each recovery), and kill -9 of the
leading JobManager under high availability. Afterwards the records of the offset ranges the
committed batches logged (read back from the input topic) are what the file sink holds and what the
output topic holds as committed (read from the log with the transaction markers applied,
`funke.testing.committed_records`: Tansu's own read_committed consumer delivers aborted records),
each once; and no transaction of the sink is left open.

The seconds from a recovery to the output topic's last stable offset reaching its end (every
record that was in an open transaction then is committed or aborted) are printed."""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy import localcluster
from funke.testing import COMMITTED, OPEN, committed_records
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_streaming import PHASES, Events, StreamCluster

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PARTITIONS = 4


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class NumberedProducer:
    """Produces records numbered 0, 1, ... (key and value the number, partition n % 4) into
    `topic`, `rate` a second, until stopped; `added` counts the records the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: float):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.topic, self.rate = topic, rate
        self.sent = self.added = 0
        self.failed: list[str] = []
        self.burst = 0  # set: that many records at once, then on at `rate`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, error, message) -> None:
        if error is None:
            self.added += 1
        else:
            self.failed.append(str(error))

    def _run(self) -> None:
        while not self._stop.is_set():
            burst, self.burst = self.burst, 0
            for _ in range(max(1, burst)):
                n = str(self.sent).encode()
                self.producer.produce(self.topic, key=n, value=n, partition=self.sent % PARTITIONS,
                                      on_delivery=self._delivered)
                self.sent += 1
                self.producer.poll(0)
            time.sleep(1 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        assert self.producer.flush(30) == 0, f"{self.topic}: records not delivered within 30 s"
        assert not self.failed and self.added == self.sent, (self.failed[:3], self.added, self.sent)


def copy_query(name: str, bootstrap: str, source_options: dict, topic: str, out: Path, out_topic: str,
               checkpoint: Path, trigger: str = "1 s", max_offsets: int = 200) -> ExecutionEnvironment:
    """Kafka `topic` -> (n, partition, offset) -> Parquet at `out`, and -> `out_topic` (key and
    value n) exactly once."""
    env = ExecutionEnvironment(name, parallelism=2)
    records = env.read_stream.kafka(bootstrap, topic, starting="earliest", max_offsets_per_trigger=max_offsets,
                                    **source_options)
    rows = records.select("CAST(value AS STRING) AS value", "CAST(key AS STRING) AS k", "partition", "offset")
    rows.write_parquet(str(out))
    rows.write_kafka(bootstrap, out_topic, key="k", guarantee="exactly_once")
    env.set_trigger(trigger).set_checkpoint_location(str(checkpoint))
    env.set_option("streaming.min-batches-to-retain", "100000")  # every batch's range stays to check
    env.set_restart_strategy("fixed-delay", attempts=100, delay="500 ms")
    return env


def committed_ranges(checkpoint: Path, source: str) -> list[tuple[int, int, int]]:
    """(partition, begin, end) of every committed batch's logged range (end exclusive)."""
    store = CheckpointStore(str(checkpoint))
    out = []
    for batch in store.commit_ids():
        r = store.read_offsets(batch).sources[source]
        for topic, partitions in (r.end or {}).items():
            for p, end in partitions.items():
                begin = ((r.start or {}).get(topic) or {}).get(p, 0)  # a first batch begins at 0
                out.append((int(p), int(begin), int(end)))
    return out


def committed_numbers(bootstrap: str, topic: str, checkpoint: Path, source: str) -> list[int]:
    """Every record's n in the committed batches' ranges, read from the input topic's log."""
    logs = {p: {r.offset: int(r.value) for r in committed_records(bootstrap, topic, p)} for p in range(PARTITIONS)}
    return sorted(logs[p][o] for p, begin, end in committed_ranges(checkpoint, source) for o in range(begin, end))


def open_offsets(bootstrap: str, topic: str) -> set[tuple[int, int]]:
    """(partition, offset) of the output topic's records in a transaction still open."""
    return {(p, r.offset) for p in range(PARTITIONS) for r in committed_records(bootstrap, topic, p) if r.state == OPEN}


def seconds_to_stable(bootstrap: str, topic: str, timeout: float = 60) -> float:
    """From now until every record that is in an open transaction now is committed or aborted
    (the partitions' last stable offset passed them); batches opened since do not count."""
    started = time.monotonic()
    pending = open_offsets(bootstrap, topic)
    while pending:
        pending &= open_offsets(bootstrap, topic)
        assert time.monotonic() - started < timeout, f"{topic}: still open after {timeout} s: {sorted(pending)[:5]}"
        if pending:
            time.sleep(0.1)
    return time.monotonic() - started


def wait_all_committed(bootstrap: str, topic: str, checkpoint: Path, source: str, added: int,
                       timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while len(committed_numbers(bootstrap, topic, checkpoint, source)) < added:
        assert time.time() < deadline, f"the committed batches do not hold all {added} records after {timeout} s"
        time.sleep(0.5)


def tally(bootstrap: str, topic: str, out: Path, out_topic: str, checkpoint: Path, source: str, added: int) -> dict:
    expected = committed_numbers(bootstrap, topic, checkpoint, source)
    want = set(expected)
    in_files = collections.Counter(int(r["value"]) for b in streamsinks.committed_batches(str(out))
                                   for f in streamsinks.committed_files(str(out), b)
                                   for r in pq.read_table(out / f).to_pylist())
    log = [r for p in range(PARTITIONS) for r in committed_records(bootstrap, out_topic, p)]
    in_topic = collections.Counter(int(r.value) for r in log if r.state == COMMITTED)
    return {"added": added, "committed": len(expected), "committed_distinct": len(want),
            "file_rows": sum(in_files.values()), "file_duplicates": sum(n - 1 for n in in_files.values() if n > 1),
            "file_lost": len(want - set(in_files)), "file_beyond": len(set(in_files) - want),
            "topic_rows": sum(in_topic.values()), "topic_duplicates": sum(n - 1 for n in in_topic.values() if n > 1),
            "topic_lost": len(want - set(in_topic)), "topic_beyond": len(set(in_topic) - want),
            "topic_aborted": sum(1 for r in log if r.state not in (COMMITTED, OPEN)),
            "topic_open": sum(1 for r in log if r.state == OPEN),
            "topic_keys_wrong": sum(1 for r in log if r.state == COMMITTED and r.key != r.value)}


def source_of(client, job_id: str) -> str:
    return next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: kafka"))


# ---------------------------------------------------------------------------- kill -9 of TaskManagers

@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def kafka_kill_run(cluster: StreamCluster, broker, tmp_path: Path, rate: float = 50, kills_per_phase: int = 1) -> dict:
    """Records produced at `rate` a second into a 4-partition topic, read by a query into a Parquet
    sink and a Kafka topic (exactly once); a TaskManager running the query's tasks killed (-9) at
    every phase of a batch (`kills_per_phase` times each), a replacement started as a supervisor
    would; after each recovery, the seconds until the records then in an open transaction of the
    output topic are committed or aborted. The producer stops, the query takes every record and is
    stopped, and the sinks are tallied against the records of the committed batches' ranges."""
    topic, out_topic = unique("eos-in"), unique("eos-out")
    broker.create_topic(topic, PARTITIONS)
    broker.create_topic(out_topic, PARTITIONS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = copy_query(f"kafka exactly once {tmp_path.name}", broker.bootstrap, broker.source_options, topic, out,
                     out_topic, checkpoint)
    producer = NumberedProducer(broker.bootstrap, topic, rate)
    client = cluster.client
    stable: list[float] = []
    try:
        replacements: list[threading.Thread] = []
        job_id = client.submit(env.build())
        events = Events(client, job_id)
        batch = events.wait("BatchCompleted", timeout=180)
        kills = 0
        for _ in range(kills_per_phase):
            for kind, _ in PHASES:  # as kills_in_every_phase, with the output topic watched after each recovery
                batch = events.wait(kind, min_batch=batch + 1, timeout=180)
                victim = sorted({s.current.task_manager_id for v in client.get_job(job_id).vertices
                                 for s in v.subtasks if s.current.task_manager_id})[0]
                localcluster.kill(cluster.dir, victim)
                kills += 1
                batch = events.wait_recovered(timeout=300)
                stable.append(seconds_to_stable(broker.bootstrap, out_topic))
                replacements.append(threading.Thread(target=cluster.add_taskmanager))
                replacements[-1].start()
        producer.stop()
        source = source_of(client, job_id)
        wait_all_committed(broker.bootstrap, topic, checkpoint, source, producer.added)
        stopped = cluster.funke("stop", job_id, "--timeout", "60")
        assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
        events.drain()
        for t in replacements:
            t.join(120)
    finally:
        producer._stop.set()
    figures = tally(broker.bootstrap, topic, out, out_topic, checkpoint, source, producer.added)
    return {"kills": kills, "restarts": events.statuses.count("RESTARTING"), **figures,
            "stable_after_recovery_s": [round(s, 2) for s in stable]}


def test_kafka_to_files_and_kafka_exactly_once_through_taskmanager_kills_at_every_phase(
        cluster, kafka_broker, tmp_path):
    cluster.restore()
    f = kafka_kill_run(cluster, kafka_broker, tmp_path)
    print(f"\nKAFKA-EOS-TM-KILLS: {f['kills']} kills, {f['restarts']} restarts; {f['added']} records produced, "
          f"{f['committed']} in committed ranges; files {f['file_rows']} rows ({f['file_duplicates']} duplicates, "
          f"{f['file_lost']} lost); output topic {f['topic_rows']} committed records ({f['topic_duplicates']} "
          f"duplicates, {f['topic_lost']} lost, {f['topic_aborted']} aborted, {f['topic_open']} open); "
          f"last stable offset at the end after each recovery within {f['stable_after_recovery_s']} s")
    assert f["kills"] == len(PHASES) and f["restarts"] >= len(PHASES), f
    assert f["committed"] == f["committed_distinct"] == f["added"], f
    assert f["file_rows"] == f["added"], f
    assert f["file_duplicates"] == f["file_lost"] == f["file_beyond"] == 0, f
    assert f["topic_rows"] == f["added"], f
    assert f["topic_duplicates"] == f["topic_lost"] == f["topic_beyond"] == 0, f
    assert f["topic_open"] == 0 and f["topic_keys_wrong"] == 0, f
    assert max(f["stable_after_recovery_s"]) < 30, f


# ---------------------------------------------------------------------------- kill -9 of the leader (HA)

class LeaderEvents(Events):
    """Events through a client that follows the leader; a watch stream broken by the leader's
    death ends the events instead of raising in the thread."""

    def _pump(self, client, job_id: str) -> None:
        try:
            super()._pump(client, job_id)
        except Exception:  # noqa: BLE001 - the leader killed under the stream
            self._queue.put(("end", -1))


@pytest.fixture(scope="module")
def ha(tmp_path_factory):
    from tests.integration.test_high_availability import HaCluster

    c = HaCluster(tmp_path_factory.mktemp("kafka-ha-cluster"))
    yield c
    c.client.close()
    localcluster.stop(c.dir)


def kafka_leader_kill_run(ha, broker, tmp_path: Path, rate: float = 100, burst: int = 50_000,
                          timeout: float = 180) -> dict:
    """The same query on a cluster with two JobManagers; once three batches committed, kill -9 of
    the leader while its transaction of a batch is open in the output topic (a burst of `burst`
    records makes that batch large). The standby takes over; the seconds from the kill to the
    records then in an open transaction being committed or aborted (the new run's
    init_transactions aborts the dead producer's), and to the job RUNNING under the new leader."""
    from tests.integration.test_high_availability import _wait_running_under, _wait_status

    topic, out_topic = unique("eos-ha-in"), unique("eos-ha-out")
    broker.create_topic(topic, PARTITIONS)
    broker.create_topic(out_topic, PARTITIONS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = copy_query(f"kafka exactly once ha {tmp_path.name}", broker.bootstrap, broker.source_options, topic, out,
                     out_topic, checkpoint, trigger="500 ms", max_offsets=100_000)
    producer = NumberedProducer(broker.bootstrap, topic, rate)
    try:
        job_id = ha.client.submit(env.build())
        store = CheckpointStore(str(checkpoint))
        deadline = time.monotonic() + timeout
        while len(store.commit_ids() if (checkpoint / "commits").exists() else []) < 3:
            assert time.monotonic() < deadline, f"three batches did not commit within {timeout} s"
            time.sleep(0.1)
        # The kill: while the output topic holds records of an open transaction. A burst of records
        # makes one batch large; once its sinks have written (OutputOperationCompleted), the
        # JobMaster produces it in its transaction: the topic is polled until records of it show
        # open, and the leader killed then. Up to three bursts; then a kill with the batch in flight.
        watcher = ha.follower()
        events = LeaderEvents(watcher, job_id)
        source = source_of(ha.client, job_id)
        batch, seen_open = store.commit_ids()[-1], False
        for _ in range(3):
            producer.burst = burst
            while True:  # the batch that took (most of) the burst
                batch = events.wait("BatchSubmitted", min_batch=batch + 1, timeout=60)
                if store.read_offsets(batch).sources[source].rows >= burst // 2:
                    break
            events.wait("OutputOperationCompleted", min_batch=batch, timeout=60)
            aim = time.monotonic() + 5
            while time.monotonic() < aim and not (seen_open := any(  # one partition: a shorter look
                    r.state == OPEN for r in committed_records(broker.bootstrap, out_topic, 0))):
                if batch in store.commit_ids():
                    break
            if seen_open:
                break
        in_flight = batch
        name, epoch, killed_at = ha.kill_leader(signal.SIGKILL)
        killed = time.monotonic()
        was_open = len(open_offsets(broker.bootstrap, out_topic))
        seconds_to_stable(broker.bootstrap, out_topic, timeout=120)
        stable_at = time.monotonic() - killed
        lease, _ = ha.wait_for_new_leader(epoch)
        running = _wait_running_under(ha.client, job_id, lease.epoch, timeout=120) - killed_at
        before = store.commit_ids()[-1]
        while store.commit_ids()[-1] < max(before, in_flight) + 2:  # the query goes on under the new leader
            assert time.monotonic() < deadline + timeout, "the new leader did not commit two batches"
            time.sleep(0.2)
        producer.stop()
        source = source_of(ha.client, job_id)
        wait_all_committed(broker.bootstrap, topic, checkpoint, source, producer.added)
        ha.client.stop(job_id, timeout_s=60)
        assert _wait_status(ha.client, job_id, "FINISHED", 120)
        watcher.close()
    finally:
        producer._stop.set()
    figures = tally(broker.bootstrap, topic, out, out_topic, checkpoint, source, producer.added)
    return {**figures, "killed": name, "in_flight_batch": in_flight, "open_at_kill": was_open,
            "stable_after_kill_s": round(stable_at, 2), "running_after_kill_s": round(running, 2)}


def test_kafka_to_files_and_kafka_exactly_once_through_a_kill_9_of_the_leading_jobmanager(ha, kafka_broker, tmp_path):
    ha.restore()
    f = kafka_leader_kill_run(ha, kafka_broker, tmp_path)
    print(f"\nKAFKA-EOS-LEADER-KILL: {f['killed']} killed during batch {f['in_flight_batch']} "
          f"({f['open_at_kill']} records in an open transaction then); their transaction ended "
          f"{f['stable_after_kill_s']} s after the kill, the job RUNNING under the new leader after "
          f"{f['running_after_kill_s']} s; {f['added']} records produced, {f['committed']} in committed ranges; "
          f"files {f['file_rows']} ({f['file_duplicates']} duplicates, {f['file_lost']} lost); output topic "
          f"{f['topic_rows']} committed ({f['topic_duplicates']} duplicates, {f['topic_lost']} lost, "
          f"{f['topic_aborted']} aborted, {f['topic_open']} open)")
    assert f["committed"] == f["committed_distinct"] == f["added"], f
    assert f["file_rows"] == f["topic_rows"] == f["added"], f
    assert f["file_duplicates"] == f["file_lost"] == f["file_beyond"] == 0, f
    assert f["topic_duplicates"] == f["topic_lost"] == f["topic_beyond"] == 0, f
    assert f["topic_open"] == 0 and f["topic_keys_wrong"] == 0, f
    # the kill hit an open transaction (a batch's records written, not committed): the new
    # leader's run aborted it, within seconds
    assert f["open_at_kill"] > 0, f"no transaction was seen open in 20 s to kill the leader in: {f}"
    assert f["topic_aborted"] >= f["open_at_kill"] and f["stable_after_kill_s"] < 30, f
