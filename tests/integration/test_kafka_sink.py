"""The Kafka sink (write_kafka) against a real broker process (the session's `kafka_broker`,
Tansu) and real consumers: each batch's rows visible to `read_committed` consumers exactly once,
also when a batch is committed again (a JobMaster that died between the sink's commit and the
commit log) or a query runs again on its checkpoint; a transaction left open by a producer
killed -9 is aborted by the next run's prepare, and the partitions' last stable offset reaches
their end (the seconds it takes are printed); at_least_once; a bounded job's rows at FINISHED and
none if it failed; hostile settings refused at submit with INVALID_ARGUMENT.

The first tests drive the JobManager's sink side directly (rows staged as the tasks stage them,
under the layout's directories); the others run queries on the shared streaming cluster.

What the checks trust: Tansu's `read_committed` consumer (it stops at the last stable offset;
the issue notes it may deliver aborted records to a consumer that starts below them, so where a
test says "none of the aborted rows", a raw log reader applying the transaction markers would be
the stronger check) and the marker group's committed offset.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import cloudpickle
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from funke.common import layout
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.streamingjob import sinks
from funke.common.streaming import kafkasink as rules
from funke.deploy.client import InvalidJobGraph
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streaming import SinkContext, sink_side
from funke.jobmanager.streamsinks import SinkCommitError
from tests.integration.test_streaming import Events, wait_status

cloudpickle.register_pickle_by_value(sys.modules[__name__])

JOB = "kafkajob"
SINK = "sink-vertex"


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------- reading the topic

@dataclasses.dataclass
class Read:
    records: list[tuple[int, int, bytes | None, bytes | None]]  # (partition, offset, key, value)
    ends: dict[int, int]  # per partition: where the consumer reached its end (read_committed: the LSO)

    @property
    def values(self) -> list[str]:
        return [v.decode() for _, _, _, v in self.records if v is not None]


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed", timeout: float = 30) -> Read:
    """Every record of every partition from the start, as a consumer with `isolation` gets them,
    until it reported the end of every partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"funke-test-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, ends = [], {}
        deadline = time.monotonic() + timeout
        while len(ends) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {set(partitions) - set(ends)} " \
                                                f"within {timeout} s ({isolation})"
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                ends[m.partition()] = m.offset()
                continue
            ends.pop(m.partition(), None)
            records.append((m.partition(), m.offset(), m.key(), m.value()))
        return Read(records, ends)
    finally:
        consumer.close()


def marker_offset(bootstrap: str, owner: str, vertex: str, topic: str) -> int | None:
    """The marker group's committed offset on (topic, 0); None if it has none."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": rules.marker_group(owner, vertex),
                         "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset if tp.offset >= 0 else None
    finally:
        consumer.close()


def assert_nothing_open(bootstrap: str, topic: str) -> None:
    """Every partition's last stable offset is its end: no transaction is open."""
    stable = read_topic(bootstrap, topic).ends
    end = read_topic(bootstrap, topic, "read_uncommitted").ends
    assert stable == end, f"{topic}: read_committed stops at {stable}, the partitions end at {end}"


# ---------------------------------------------------------------------------- the sink side alone

def stage(data_dir: Path, batch_id: int, rows: dict[int, list[tuple[str | None, str | None]]]) -> dict[int, int]:
    """Rows staged for a batch as the sink's subtasks stage them (attempt 0 of each subtask):
    {subtask: [(key, value), ...]}; returns the attempts."""
    target = layout.kafka_sink_dir(str(data_dir), JOB, SINK)
    for subtask, pairs in rows.items():
        directory = Path(layout.stream_sink_staging_dir(target, JOB, batch_id, subtask, 0))
        directory.mkdir(parents=True, exist_ok=True)
        table = pa.table({"key": pa.array([k for k, _ in pairs], pa.string()),
                          "value": pa.array([v for _, v in pairs], pa.string())})
        pq.write_table(table, directory / "part-00000.parquet")
    return {subtask: 0 for subtask in rows}


def side_of(data_dir: Path, bootstrap: str, topic: str, guarantee: str = "exactly_once"):
    config = {"bootstrap": bootstrap, "topic": topic, "value": "value", "key": "key", "guarantee": guarantee}
    return sink_side("sink.kafka", SinkContext(SINK, config, str(data_dir), JOB))


def batch_rows(batch_id: int, n: int = 10) -> dict[int, list[tuple[str, str]]]:
    return {s: [(f"k{i % 3}", f"b{batch_id}-s{s}-{i}") for i in range(n)] for s in (0, 1)}


def test_a_batch_committed_again_is_not_written_twice(kafka_broker, tmp_path):
    """The JobMaster died after a batch's sink commit and before its commit-log entry: the next
    run commits the batch again (its tasks staged it again); the marker says it is in."""
    topic, query = _topic("again"), str(uuid.uuid4())
    kafka_broker.create_topic(topic, 3)
    side = side_of(tmp_path, kafka_broker.bootstrap, topic)
    side.prepare(query)
    try:
        side.commit(0, stage(tmp_path, 0, batch_rows(0)), query)
        side.commit(0, stage(tmp_path, 0, batch_rows(0)), query)  # the same run again
        side.commit(1, stage(tmp_path, 1, batch_rows(1)), query)
    finally:
        side.close()
    assert marker_offset(kafka_broker.bootstrap, query, SINK, topic) == 2
    rerun = side_of(tmp_path, kafka_broker.bootstrap, topic)  # a new run of the query
    rerun.prepare(query)
    try:
        rerun.commit(1, stage(tmp_path, 1, batch_rows(1)), query)
        rerun.commit(2, stage(tmp_path, 2, batch_rows(2)), query)
    finally:
        rerun.close()
    got = read_topic(kafka_broker.bootstrap, topic)
    expected = [v for b in range(3) for s in batch_rows(b).values() for _, v in s]
    assert sorted(got.values) == sorted(expected), collections.Counter(got.values).most_common(3)
    assert {(k.decode(), v.decode()) for _, _, k, v in got.records} == {
        (k, v) for b in range(3) for s in batch_rows(b).values() for k, v in s}
    assert marker_offset(kafka_broker.bootstrap, query, SINK, topic) == 3
    assert_nothing_open(kafka_broker.bootstrap, topic)
    # the staging of every batch went, the re-committed ones' too
    assert not any(Path(layout.kafka_sink_dir(str(tmp_path), JOB, SINK)).rglob("*.parquet"))


def test_a_run_taken_over_commits_nothing_fenced_by_its_lease_or_by_the_broker(kafka_broker, tmp_path):
    topic, query = _topic("fenced"), str(uuid.uuid4())
    kafka_broker.create_topic(topic, 2)
    old = side_of(tmp_path, kafka_broker.bootstrap, topic)
    old.prepare(query)
    # its lease is lost between producing the rows and the commit point: the transaction aborts
    calls = []

    def lease():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("the checkpoint's lease was taken over")

    with pytest.raises(RuntimeError, match="taken over"):
        old.commit_fenced(0, stage(tmp_path, 0, batch_rows(0)), query, lease)
    assert len(calls) == 2, "checked before the marker and again before the commit point"
    # a newer run prepares: the older run's producer is fenced at the broker
    new = side_of(tmp_path, kafka_broker.bootstrap, topic)
    new.prepare(query)
    with pytest.raises(SinkCommitError, match="fenced"):
        old.commit(0, stage(tmp_path, 0, batch_rows(0)), query)
    old.close()
    new.commit(0, stage(tmp_path, 0, batch_rows(0)), query)
    new.close()
    got = read_topic(kafka_broker.bootstrap, topic)
    assert sorted(got.values) == sorted(v for s in batch_rows(0).values() for _, v in s)
    assert marker_offset(kafka_broker.bootstrap, query, SINK, topic) == 1
    assert_nothing_open(kafka_broker.bootstrap, topic)


KILLED_PRODUCER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Producer
    bootstrap, transactional_id, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, value=f"doomed-{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    print("open", flush=True)
    time.sleep(600)
""")


def test_a_transaction_left_open_by_a_killed_producer_is_aborted_by_the_next_runs_prepare(kafka_broker, tmp_path):
    topic, query = _topic("killed"), str(uuid.uuid4())
    kafka_broker.create_topic(topic, 2)
    bootstrap = kafka_broker.bootstrap
    side = side_of(tmp_path, bootstrap, topic)
    side.prepare(query)
    side.commit(0, stage(tmp_path, 0, batch_rows(0)), query)
    side.close()
    # a JobMaster dies (kill -9) with batch 1's transaction open
    dying = subprocess.Popen([sys.executable, "-c", KILLED_PRODUCER, bootstrap, rules.transactional_id(query, SINK),
                              topic, "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert dying.stdout.readline().strip() == "open"
    finally:
        os.kill(dying.pid, 9)
        dying.wait(10)
    stuck, end = read_topic(bootstrap, topic).ends, read_topic(bootstrap, topic, "read_uncommitted").ends
    assert all(stuck[p] < end[p] for p in (0, 1)), (stuck, end)  # the open transaction holds the LSO back
    began = time.monotonic()
    rerun = side_of(tmp_path, bootstrap, topic)
    rerun.prepare(query)
    prepared = time.monotonic() - began
    checks = 0
    while True:
        checks += 1
        stable, end = read_topic(bootstrap, topic).ends, read_topic(bootstrap, topic, "read_uncommitted").ends
        if stable == end:
            break
        assert time.monotonic() - began < 30, f"the last stable offset {stable} did not reach the end {end}"
        time.sleep(0.05)
    seconds = time.monotonic() - began
    print(f"\nKAFKA-LSO: the next run's prepare (init_transactions) took {prepared:.3f} s; check {checks} after it "
          f"found every partition's last stable offset at its end ({end}), {seconds:.3f} s after the prepare "
          "began (each check reads the topic twice)")
    rerun.commit(1, stage(tmp_path, 1, batch_rows(1)), query)
    rerun.close()
    got = read_topic(bootstrap, topic)
    # Batches 0 and 1 once each. Tansu's read_committed consumer, starting below the aborted
    # transaction, still delivers its records (the note): that they were aborted, not
    # committed, is what the last stable offset reaching the end without a commit says; a raw
    # log reader applying the ABORT marker is the stronger check.
    doomed = [v for v in got.values if v.startswith("doomed-")]
    print(f"KAFKA-LSO: Tansu's read_committed consumer delivered {len(doomed)} of the 20 aborted records")
    assert set(doomed) <= {f"doomed-{i}" for i in range(20)}
    assert sorted(v for v in got.values if not v.startswith("doomed-")) == sorted(
        v for b in (0, 1) for s in batch_rows(b).values() for _, v in s)
    assert marker_offset(bootstrap, query, SINK, topic) == 2
    assert_nothing_open(bootstrap, topic)


def test_at_least_once_writes_each_batch_and_a_batch_committed_again_again(kafka_broker, tmp_path):
    topic, query = _topic("alo"), str(uuid.uuid4())
    kafka_broker.create_topic(topic, 2)
    side = side_of(tmp_path, kafka_broker.bootstrap, topic, "at_least_once")
    side.prepare(query)
    try:
        side.commit(0, stage(tmp_path, 0, batch_rows(0)), query)
        side.commit(1, stage(tmp_path, 1, batch_rows(1)), query)
        side.commit(1, stage(tmp_path, 1, batch_rows(1)), query)  # as documented: written again
    finally:
        side.close()
    counts = collections.Counter(read_topic(kafka_broker.bootstrap, topic).values)
    assert {v for v, n in counts.items() if n == 1} == {v for s in batch_rows(0).values() for _, v in s}
    assert {v for v, n in counts.items() if n == 2} == {v for s in batch_rows(1).values() for _, v in s}
    assert marker_offset(kafka_broker.bootstrap, query, SINK, topic) is None  # no transactions, no marker


def test_a_missing_staging_directory_fails_the_commit_and_writes_nothing(kafka_broker, tmp_path):
    topic, query = _topic("missing"), str(uuid.uuid4())
    kafka_broker.create_topic(topic, 1)
    side = side_of(tmp_path, kafka_broker.bootstrap, topic)
    side.prepare(query)
    try:
        attempts = stage(tmp_path, 0, batch_rows(0))
        with pytest.raises(SinkCommitError, match="staged rows are not in"):
            side.commit(0, {**attempts, 2: 0}, query)
    finally:
        side.close()
    assert read_topic(kafka_broker.bootstrap, topic).records == []


# ---------------------------------------------------------------------------- on a cluster

@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def kafka_rate_job(name: str, bootstrap: str, topic: str, checkpoint: Path) -> ExecutionEnvironment:
    env = ExecutionEnvironment(name, parallelism=2)
    (env.read_stream.rate(40)
        .select("CAST(value AS STRING) AS value", "CAST(value % 7 AS STRING) AS k")
        .write_kafka(bootstrap, topic, key="k"))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=5, delay="500 ms")
    return env


@pytest.mark.cluster
def test_a_streaming_query_writes_each_batch_once_through_a_lost_commit_entry_a_restart_and_a_cancel(
        cluster, kafka_broker, tmp_path):
    topic, checkpoint = _topic("query"), tmp_path / "checkpoint"
    kafka_broker.create_topic(topic, 3)
    client = cluster.client
    env = kafka_rate_job("kafka sink query", kafka_broker.bootstrap, topic, checkpoint)
    (sink,) = sinks(env.build())
    first = client.submit(env.build())
    events = Events(client, first)
    events.wait("BatchCompleted", min_batch=3)
    query_id = client.progress(first)[0]["id"]
    client.stop(first, timeout_s=60)
    assert wait_status(client, first, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    last = CheckpointStore(str(checkpoint)).commit_ids()[-1]
    assert marker_offset(kafka_broker.bootstrap, query_id, sink.id, topic) == last + 1
    assert_nothing_open(kafka_broker.bootstrap, topic)  # stopped: no transaction left open
    # The JobMaster "died" after the last batch's sink commit, before its commit-log entry: the
    # query's next run runs that batch again, and its marker says it is in.
    os.remove(checkpoint / "commits" / str(last))
    second = client.submit(kafka_rate_job("kafka sink query", kafka_broker.bootstrap, topic, checkpoint).build())
    events = Events(client, second)
    events.wait("BatchCompleted", min_batch=last + 3)
    progress = client.progress(second)
    assert progress[0]["id"] == query_id and progress[0]["batchId"] == last, "the batch without its entry ran again"
    client.cancel(second)  # while batches run and commit
    assert wait_status(client, second, ("FINISHED", "FAILED", "CANCELED")) == "CANCELED"
    events.drain()
    assert_nothing_open(kafka_broker.bootstrap, topic)  # cancelled: no transaction left open either

    # Kafka holds the rows of exactly the batches its marker names: those of the commit log, and
    # at most one more (committed to Kafka, cancelled before its commit-log entry)
    store = CheckpointStore(str(checkpoint))
    commits = store.commit_ids()
    marker = marker_offset(kafka_broker.bootstrap, query_id, sink.id, topic)
    assert commits[-1] <= marker - 1 <= commits[-1] + 1, (commits[-1], marker)
    (end,) = [r.end for r in store.read_offsets(marker - 1).sources.values()]
    expected = int(end["rows"])
    got = read_topic(kafka_broker.bootstrap, topic)
    counts = collections.Counter(int(v) for v in got.values)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    lost = len(set(range(expected)) - set(counts))
    beyond_rows = set(counts) - set(range(expected))
    beyond = len(beyond_rows)
    if beyond_rows and marker in store.offset_ids():
        # The batch in flight at the cancel, its transaction aborted: Tansu's read_committed
        # consumer still delivers such records (see the module's note). They may only be that
        # batch's rows; a raw log reader applying the ABORT marker would show them aborted.
        (following,) = [r.end for r in store.read_offsets(marker).sources.values()]
        assert beyond_rows <= set(range(expected, int(following["rows"]))), sorted(beyond_rows)[:5]
        beyond = 0
    print(f"\nKAFKA-SINK-QUERY: {expected} rows in batches 0..{marker - 1} (batch {last} committed again, nothing "
          f"written twice; commit log to batch {commits[-1]}): {len(got.records)} records read_committed, "
          f"{duplicates} duplicates, {lost} lost, {beyond} beyond ({len(beyond_rows)} rows of an aborted batch delivered by Tansu)")
    assert (duplicates, lost, beyond) == (0, 0, 0)
    assert all(k.decode() == str(int(v) % 7) for _, _, k, v in got.records)
    log = (cluster.info.dir / "log" / "jobmanager.log").read_text(errors="replace")
    assert f"batch {last} is in {topic} already" in log


def boom_at(value):
    if value == "row-77":
        raise ValueError("row 77 is refused")
    return value


@pytest.mark.cluster
def test_a_bounded_job_writes_kafka_once_it_finished_and_nothing_if_it_failed(cluster, kafka_broker):
    client = cluster.client
    rows = [(f"row-{i}", f"k{i % 3}") for i in range(200)]
    written, failed = _topic("bounded"), _topic("bounded-failed")
    for topic in (written, failed):
        kafka_broker.create_topic(topic, 2)
    env = ExecutionEnvironment("bounded into kafka", parallelism=2)
    (env.from_collection(rows, "value string, k string")
        .select("value", "CAST(k AS BINARY) AS k")  # a binary key: its bytes as they are
        .write_kafka(kafka_broker.bootstrap, written, key="k"))
    job_graph = env.build()
    (sink,) = sinks(job_graph)
    job_id = client.submit(job_graph)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    got = read_topic(kafka_broker.bootstrap, written)
    assert sorted((v.decode(), k.decode()) for _, _, k, v in got.records) == sorted(rows)
    assert marker_offset(kafka_broker.bootstrap, job_id, sink.id, written) == 1
    assert_nothing_open(kafka_broker.bootstrap, written)

    env = ExecutionEnvironment("bounded into kafka, failing", parallelism=2)
    (env.from_collection(rows, "value string, k string")
        .map(lambda r: (boom_at(r[0]), r[1]), schema="value string, k string")
        .write_kafka(kafka_broker.bootstrap, failed, key="k"))
    env.set_restart_strategy("none")
    job_id = client.submit(env.build())
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FAILED"
    assert "row 77 is refused" in client.get_job(job_id).failure.message
    assert read_topic(kafka_broker.bootstrap, failed, "read_uncommitted").records == []


@pytest.mark.cluster
def test_hostile_kafka_sink_settings_are_invalid_argument_and_a_missing_column_fails_naming_it(cluster, kafka_broker):
    client = cluster.client
    env = ExecutionEnvironment("hostile kafka sink", parallelism=1)
    env.from_collection([("a",)], "value string").write_kafka(kafka_broker.bootstrap, _topic("hostile"))
    good = env.build()
    problems = {
        "bad host": {"bootstrap": "evil host!:9092"},
        "bad topic": {"topic": "../../etc"},
        "no value column": {"value": None},
    }
    for what, change in problems.items():
        vertices = []
        for v in good.vertices:
            ops = tuple(dataclasses.replace(op, config={k: c for k, c in {**op.config, **change}.items() if c is not None})
                        if op.kind == "sink.kafka" else op for op in v.operators)
            vertices.append(dataclasses.replace(v, operators=ops))
        with pytest.raises(InvalidJobGraph) as refused:
            client.submit(dataclasses.replace(good, vertices=tuple(vertices)))
        assert refused.value.code.name == "INVALID_ARGUMENT", what
        text = str(refused.value)
        assert {"bad host": "config 'bootstrap' must be a host name", "bad topic": "is not a Kafka topic name",
                "no value column": "is missing config value"}[what] in text, (what, text)
    # a value column the stream does not have: the job fails, naming it and the stream's columns
    env = ExecutionEnvironment("kafka sink without its column", parallelism=1)
    env.from_collection([("a",)], "word string").write_kafka(kafka_broker.bootstrap, _topic("nocolumn"))
    env.set_restart_strategy("none")
    job_id = client.submit(env.build())
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FAILED"
    message = client.get_job(job_id).failure.message
    assert "the value column 'value' is not a column of the stream (its columns: word)" in message, message
    # nor one of another type
    env = ExecutionEnvironment("kafka sink of a number", parallelism=1)
    env.from_collection([(1,)], "value bigint").write_kafka(kafka_broker.bootstrap, _topic("number"))
    env.set_restart_strategy("none")
    job_id = client.submit(env.build())
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FAILED"
    message = client.get_job(job_id).failure.message
    assert "the value column 'value' is bigint; a Kafka record's value is a string or binary column" in message, message
