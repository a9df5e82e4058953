"""The Kafka source against a real Kafka-protocol broker (Tansu, a process on loopback: the session
fixture `kafka_broker`) and a real cluster (a JobManager, three TaskManagers with PySpark):

- a running word count over a 4-partition topic: each committed batch's counts equal a direct
  count of the records of the offsets its offset log entry names (read back with a plain consumer);
- a stopped query restarted after more records arrived reads exactly the rest;
- a topic created while the query runs that matches its pattern is read from its start;
- hostile input: a value that is not JSON fails the query naming its topic, partition and offset;
  a topic that does not exist fails it naming the topic;
- the JobManager side (ends as a fetch reports them, the initial offsets kept in the checkpoint,
  the lag, a start by timestamp, a broker that is gone: a timeout naming the partitions) and the
  TaskManager's reader (exactly [begin, end) per partition, transactions' control records, a
  range that does not reach its end: a timeout naming the partition) on their own.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import uuid
from pathlib import Path

import cloudpickle
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.kafka import KafkaSource, PartitionRange
from funke.deploy.client import job_status_name
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streaming.base import SourceContext
from funke.jobmanager.streaming.kafka import KafkaPlanner, KafkaUnavailable
from funke.taskmanager.operators.kafka import KafkaReadTimeout, Records, read_ranges
from funke.testing import KafkaBroker
from tests.integration.test_streaming import Events, wait_status

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

VOCABULARY = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
    """(partition, key, value) records, sent and flushed."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, key, value in records:
        producer.produce(topic, value=value, key=key, partition=partition)
        producer.poll(0)
    assert producer.flush(30) == 0, "records not delivered within 30 s"


def direct(bootstrap: str, topic: str, partition: int, begin: int, end: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the records in [begin, end) of a partition, with a plain consumer."""
    if end <= begin:
        return []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-direct", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, partition, begin)])
    out: list[tuple[int, bytes]] = []
    deadline = time.time() + 30
    try:
        while time.time() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF and message.offset() >= end:
                    return out
                continue
            if message.offset() >= end:
                return out
            out.append((message.offset(), message.value()))
            if message.offset() == end - 1:
                return out
    finally:
        consumer.close()
    raise AssertionError(f"{topic}/{partition}: [{begin}, {end}) not read within 30 s (got {len(out)})")


def source_of(client, job_id: str) -> str:
    return next(v.id for v in client.get_job(job_id).vertices if v.name.startswith("Source: kafka"))


def committed_ranges(checkpoint: Path, source: str) -> dict[int, SourceRange]:
    store = CheckpointStore(str(checkpoint))
    return {b: store.read_offsets(b).sources[source] for b in store.commit_ids()}


def bounds(r: SourceRange) -> dict[tuple[str, int], tuple[int, int]]:
    """Per partition, [begin, end) of a logged range, read off the entry itself (a first batch of
    a query that starts at the earliest offsets of a new topic begins at 0)."""
    out = {}
    for topic, partitions in (r.end or {}).items():
        for p, end in partitions.items():
            out[(topic, int(p))] = (int(((r.start or {}).get(topic) or {}).get(p, 0)), int(end))
    return out


def wait_committed(checkpoint: Path, source_of_job, total: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    rows = 0
    while time.time() < deadline:
        try:
            ranges = committed_ranges(checkpoint, source_of_job())
        except Exception:  # noqa: BLE001 - no checkpoint yet
            ranges = {}
        rows = sum(max(0, e - b) for r in ranges.values() for b, e in bounds(r).values())
        if rows >= total:
            return
        time.sleep(0.5)
    raise AssertionError(f"the committed batches hold {rows} records, not {total}, after {timeout} s")


def stop(cluster, job_id: str, events: Events) -> None:
    stopped = cluster.funke("stop", job_id, "--timeout", "60")
    assert f"job {job_id} is FINISHED" in stopped.stdout, stopped.stdout
    events.drain()


def words(line):
    return [(w,) for w in line.split() if w]


# ---------------------------------------------------------------------------- a running word count

def test_a_word_count_over_four_partitions_counts_each_batch_exactly_as_the_offsets_it_logged(
        cluster, kafka_broker, tmp_path):
    topic = unique("wc")
    kafka_broker.create_topic(topic, 4)
    out, checkpoint = tmp_path / "counts", tmp_path / "checkpoint"
    env = ExecutionEnvironment(f"kafka word count {tmp_path.name}", parallelism=2)
    (env.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", max_offsets_per_trigger=150,
                           **kafka_broker.source_options)
        .select("CAST(value AS STRING) AS line")
        .flat_map(words, schema="word string")
        .key_by("word").per_batch().count()
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_option("streaming.min-batches-to-retain", "100000")
    client = cluster.client
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    wait_status(client, job_id, ("RUNNING",))
    lines = [" ".join(VOCABULARY[(i * 3 + j) % len(VOCABULARY)] for j in range(1 + i % 5)) for i in range(900)]

    def producing() -> None:  # while the query runs, into every partition
        for chunk in range(0, len(lines), 100):
            produce(kafka_broker.bootstrap, topic, [(i % 4, str(i).encode(), lines[i].encode())
                                                    for i in range(chunk, min(chunk + 100, len(lines)))])
            time.sleep(0.3)

    producer = threading.Thread(target=producing)
    producer.start()
    producer.join(120)
    source = source_of(client, job_id)
    wait_committed(checkpoint, lambda: source, len(lines))
    progress = client.progress(job_id)
    stop(cluster, job_id, events)

    ranges = committed_ranges(checkpoint, source)
    counted = {b: dict((r["word"], r["count"]) for name in streamsinks.committed_files(str(out), b)
                       for r in pq.read_table(out / name).to_pylist())
               for b in streamsinks.committed_batches(str(out))}
    assert len([r for r in ranges.values() if r.rows]) >= 6, "900 records at most ~150 a batch: six batches or more"
    seen: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    for batch, r in sorted(ranges.items()):
        assert r.rows <= 150 + 4, f"batch {batch} takes {r.rows} records, past the limit"
        expected: collections.Counter = collections.Counter()
        for (t, p), (b, e) in bounds(r).items():
            records = direct(kafka_broker.bootstrap, t, p, b, e)
            assert [o for o, _ in records] == list(range(b, e)), f"batch {batch}: {t}/{p} [{b}, {e})"
            seen.update((p, o) for o, _ in records)
            for _, value in records:
                expected.update(w for (w,) in words(value.decode()))
        assert counted.get(batch, {}) == dict(expected), f"batch {batch}: {bounds(r)}"
        total.update(expected)
    # every record of the topic in exactly one committed batch
    assert sorted(seen) == sorted((i % 4, i // 4) for i in range(len(lines)))
    assert max(seen.values()) == 1
    assert total == collections.Counter(w for line in lines for (w,) in words(line))
    # the records each batch read, counted by its tasks; the lag per partition
    for record in progress:
        r = ranges.get(record["batchId"])
        if r is not None:
            assert record["numInputRows"] == r.rows, record
    assert sorted(progress[-1]["sources"][0]["lag"][topic]) == ["0", "1", "2", "3"], progress[-1]


# ---------------------------------------------------------------------------- stop, more records, restart

def pass_through(name: str, bootstrap: str, source: dict, out: Path, checkpoint: Path) -> ExecutionEnvironment:
    env = ExecutionEnvironment(name, parallelism=2)
    (env.read_stream.kafka(bootstrap, **source)
        .select("CAST(value AS STRING) AS value", "topic", "partition", "offset")
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_option("streaming.min-batches-to-retain", "100000")
    return env


def written(out: Path) -> collections.Counter:
    return collections.Counter(r["value"] for b in streamsinks.committed_batches(str(out))
                               for name in streamsinks.committed_files(str(out), b)
                               for r in pq.read_table(out / name).to_pylist())


def test_a_stopped_query_restarted_after_more_records_arrived_reads_exactly_the_rest(cluster, kafka_broker, tmp_path):
    topic = unique("restart")
    kafka_broker.create_topic(topic, 3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    source = {"topics": [topic], "starting": "earliest", "max_offsets_per_trigger": 100, **kafka_broker.source_options}
    produce(kafka_broker.bootstrap, topic, [(i % 3, None, f"first-{i}".encode()) for i in range(300)])
    client = cluster.client
    runs = []
    for run, more in enumerate((0, 250)):
        if more:  # while the query is stopped
            produce(kafka_broker.bootstrap, topic, [(i % 3, None, f"second-{i}".encode()) for i in range(more)])
        job_id = client.submit(pass_through(f"kafka restart {tmp_path.name}", kafka_broker.bootstrap, source, out,
                                            checkpoint).build())
        events = Events(client, job_id)
        vertex = source_of(client, job_id)
        wait_committed(checkpoint, lambda: vertex, 300 + more)
        stop(cluster, job_id, events)
        runs.append(CheckpointStore(str(checkpoint)).commit_ids())
    assert runs[1][0] == 0 and len(runs[1]) > len(runs[0]), runs  # the second run went on after the first
    got = written(out)
    expected = [f"first-{i}" for i in range(300)] + [f"second-{i}" for i in range(250)]
    assert sorted(got) == sorted(expected) and max(got.values()) == 1, sorted(got.items())[:5]
    # each batch starts where the one before it ended
    ranges = committed_ranges(checkpoint, vertex)
    ids = sorted(ranges)
    for a, b in zip(ids, ids[1:]):
        assert ranges[b].start == ranges[a].end, (a, b)


# ---------------------------------------------------------------------------- a pattern's new topic

def test_a_topic_created_while_the_query_runs_that_matches_its_pattern_is_read_from_its_start(
        cluster, kafka_broker, tmp_path):
    prefix = unique("pat")
    first, later = f"{prefix}-a", f"{prefix}-b"
    kafka_broker.create_topic(first, 2)
    produce(kafka_broker.bootstrap, first, [(i % 2, None, f"before-{i}".encode()) for i in range(10)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = pass_through(f"kafka pattern {tmp_path.name}", kafka_broker.bootstrap,
                       {"pattern": rf"{prefix}-[a-z]", "starting": "latest", **kafka_broker.source_options},
                       out, checkpoint)
    client = cluster.client
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    events.wait("BatchCompleted")  # the query began (at the latest offsets of the first topic)
    produce(kafka_broker.bootstrap, first, [(i % 2, None, f"after-{i}".encode()) for i in range(20)])
    kafka_broker.create_topic(later, 3)
    produce(kafka_broker.bootstrap, later, [(i % 3, None, f"new-{i}".encode()) for i in range(30)])
    vertex = source_of(client, job_id)
    wait_committed(checkpoint, lambda: vertex, 50)
    stop(cluster, job_id, events)
    got = written(out)
    assert sorted(got) == sorted([f"after-{i}" for i in range(20)] + [f"new-{i}" for i in range(30)]), sorted(got)
    assert max(got.values()) == 1
    ranges = committed_ranges(checkpoint, vertex)
    assert any(later in (r.end or {}) and later not in (r.start or {}) for r in ranges.values())


# ---------------------------------------------------------------------------- the columns

def test_the_columns_are_structured_streamings_and_json_values_become_columns_once_triggered(
        cluster, kafka_broker, tmp_path):
    topic = unique("columns")
    kafka_broker.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    producer.produce(topic, key=b"k1", value=b'{"id": 1, "name": "one", "at": "2026-12-08T01:02:03"}', partition=0,
                     headers=[("trace", b"abc"), ("empty", None)], timestamp=1_765_000_000_000)
    producer.produce(topic, value=b'{"id": 2}', partition=1)
    producer.produce(topic, key=b"gone", value=None, partition=1)  # a tombstone: null columns
    assert producer.flush(30) == 0
    raw_out, json_out = tmp_path / "raw", tmp_path / "json"
    for fmt, out in (("raw", raw_out), ("json", json_out)):
        env = ExecutionEnvironment(f"kafka columns {fmt} {tmp_path.name}", parallelism=2)
        schema = {"value_schema": "id bigint, name string, at timestamp"} if fmt == "json" else {}
        env.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", value_format=fmt, **schema,
                              **kafka_broker.source_options).write_parquet(str(out))
        env.set_trigger(once=True).set_checkpoint_location(str(tmp_path / f"checkpoint-{fmt}"))
        job_id = cluster.client.submit(env.build())
        assert wait_status(cluster.client, job_id, ("FINISHED", "FAILED")) == "FINISHED", \
            cluster.client.get_job(job_id).failure.message

    def rows(out: Path) -> list[dict]:
        tables = [pq.read_table(out / name) for b in streamsinks.committed_batches(str(out))
                  for name in streamsinks.committed_files(str(out), b)]
        return sorted((r for t in tables for r in t.to_pylist()), key=lambda r: (r["partition"], r["offset"]))

    raw = rows(raw_out)
    assert list(raw[0]) == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert [(r["key"], r["partition"], r["offset"]) for r in raw] == [(b"k1", 0, 0), (None, 1, 0), (b"gone", 1, 1)]
    assert raw[0]["topic"] == topic and raw[0]["timestampType"] == 0
    assert int(raw[0]["timestamp"].timestamp() * 1000) == 1_765_000_000_000
    assert raw[0]["headers"] == [{"key": "trace", "value": b"abc"}, {"key": "empty", "value": None}]
    assert raw[1]["headers"] is None and raw[2]["value"] is None
    decoded = rows(json_out)
    assert list(decoded[0]) == ["key", "id", "name", "at", "topic", "partition", "offset", "timestamp",
                                "timestampType", "headers"]
    assert [(r["id"], r["name"]) for r in decoded] == [(1, "one"), (2, None), (None, None)]
    assert decoded[0]["at"].replace(tzinfo=None) == __import__("datetime").datetime(2026, 12, 8, 1, 2, 3)


def test_avro_values_become_their_schemas_columns_and_a_bad_one_names_its_record(cluster, kafka_broker, tmp_path):
    import io
    import json

    import fastavro

    schema = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                           {"name": "item", "type": ["null", "string"]}]}
    parsed = fastavro.parse_schema(schema)

    def encoded(record) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record)
        return out.getvalue()

    topic = unique("avro")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap, topic, [(0, None, encoded({"id": 1, "item": "tea"})),
                                            (1, None, encoded({"id": 2, "item": None}))])
    out = tmp_path / "out"
    env = ExecutionEnvironment(f"kafka avro {tmp_path.name}", parallelism=2)
    env.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", value_format="avro",
                          value_schema=json.dumps(schema), **kafka_broker.source_options).write_parquet(str(out))
    env.set_trigger(once=True).set_checkpoint_location(str(tmp_path / "checkpoint"))
    job_id = cluster.client.submit(env.build())
    assert wait_status(cluster.client, job_id, ("FINISHED", "FAILED")) == "FINISHED", \
        cluster.client.get_job(job_id).failure.message
    rows = sorted((r for b in streamsinks.committed_batches(str(out)) for name in streamsinks.committed_files(str(out), b)
                   for r in pq.read_table(out / name).to_pylist()), key=lambda r: r["id"])
    assert list(rows[0])[:4] == ["key", "id", "item", "topic"]
    assert [(r["id"], r["item"], r["partition"]) for r in rows] == [(1, "tea", 0), (2, None, 1)]
    # a value that is not Avro of the schema fails the batch naming its record
    produce(kafka_broker.bootstrap, topic, [(1, None, b"\xff")])
    bad = ExecutionEnvironment(f"kafka bad avro {tmp_path.name}", parallelism=2)
    bad.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", value_format="avro",
                          value_schema=json.dumps(schema), **kafka_broker.source_options).write_parquet(
        str(tmp_path / "bad-out"))
    bad.set_trigger("500 ms").set_checkpoint_location(str(tmp_path / "bad-checkpoint"))
    said = failed_job(cluster, bad)
    assert f"offset 1 of topic '{topic}' partition 1" in said, said


# ---------------------------------------------------------------------------- hostile input

def failed_job(cluster, env: ExecutionEnvironment, timeout: float = 120) -> str:
    """Submits a query that must fail; what its failure says (the job's and its tasks')."""
    env.set_restart_strategy("none")
    client = cluster.client
    job_id = client.submit(env.build())
    deadline = time.time() + timeout
    while time.time() < deadline:
        details = client.get_job(job_id)
        if job_status_name(details.status) in ("FAILED", "FINISHED", "CANCELED"):
            break
        time.sleep(0.3)
    assert job_status_name(details.status) == "FAILED", job_status_name(details.status)
    return "\n".join([details.failure.message] + [e.failure.message for e in details.exceptions])


def test_a_value_that_is_not_json_fails_the_batch_naming_its_topic_partition_and_offset(
        cluster, kafka_broker, tmp_path):
    topic = unique("badjson")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap, topic, [(0, None, b'{"id": 1, "name": "a"}'), (1, None, b'{"id": 2}'),
                                            (1, None, b"{not json"), (0, None, b'{"id": 4}')])
    env = ExecutionEnvironment(f"kafka bad json {tmp_path.name}", parallelism=2)
    (env.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", value_format="json",
                           value_schema="id bigint, name string", **kafka_broker.source_options)
        .write_parquet(str(tmp_path / "out")))
    env.set_trigger("500 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    said = failed_job(cluster, env)
    assert f"topic '{topic}' partition 1 offset 1: the value is not JSON" in said, said


def test_a_topic_that_does_not_exist_fails_the_query_naming_it(cluster, kafka_broker, tmp_path):
    topic = unique("missing")
    env = ExecutionEnvironment(f"kafka missing {tmp_path.name}", parallelism=1)
    env.read_stream.kafka(kafka_broker.bootstrap, topic, **kafka_broker.source_options).write_parquet(
        str(tmp_path / "out"))
    env.set_trigger("500 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    said = failed_job(cluster, env)
    assert f"topic(s) {topic} do not exist" in said, said


# ---------------------------------------------------------------------------- the two sides on their own

def planner(bootstrap: str, checkpoint: Path, vertex: str = "src", **config) -> KafkaPlanner:
    store = CheckpointStore(str(checkpoint))
    store.open("test")
    config = {"bootstrap": bootstrap, "end_offsets": "fetch", **config}
    source = KafkaSource(tuple(config.get("topics", ())), config.get("pattern"), config.get("starting", "latest"),
                         config.get("max_offsets_per_trigger"), config.get("fail_on_data_loss", True))
    return KafkaPlanner(SourceContext(vertex, config, 1, source, str(checkpoint), store), source)


def test_the_planner_takes_the_ends_a_fetch_reports_keeps_the_initial_offsets_and_measures_the_lag(
        kafka_broker, tmp_path):
    topic = unique("plan")
    kafka_broker.create_topic(topic, 3)
    produce(kafka_broker.bootstrap, topic, [(p, None, b"x") for p in (0, 0, 0, 1, 1)])
    side = planner(kafka_broker.bootstrap, tmp_path / "ck", topics=[topic], starting="earliest",
                   max_offsets_per_trigger=3)
    try:
        first = side.plan(None, 0, True, None)
        # Spark's split of 3 over 3 and 2 offsets: floor(1.8), floor(1.2)
        assert first == SourceRange(None, {topic: {"0": 1, "1": 1, "2": 0}}, 2)
        assert side.batch_files(first) == tuple(
            PartitionRange(topic, p, 0, int(first.end[topic][str(p)])).encode() for p in range(3))
        assert side.progress_details()["lag"][topic] == {"0": 3 - first.end[topic]["0"],
                                                         "1": 2 - first.end[topic]["1"], "2": 0}
        # the initial offsets are kept: a first batch run again, and a new run, begin there
        again = planner(kafka_broker.bootstrap, tmp_path / "ck2", topics=[topic], starting="latest")
        latest = again.plan(None, 0, True, None)
        assert latest.end == {topic: {"0": 3, "1": 2, "2": 0}} and latest.rows == 0
        produce(kafka_broker.bootstrap, topic, [(2, None, b"y")])
        assert again.plan(None, 0, True, None).end == {topic: {"0": 3, "1": 2, "2": 1}}  # from the kept start
        assert again.batch_files(latest) == (f"{topic}/0/3/3", f"{topic}/1/2/2", f"{topic}/2/0/0")
        rest = side.plan(first.end, 0, False, None)
        assert rest.end == {topic: {"0": 3, "1": 2, "2": 1}} and rest.rows == 6 - 2
        assert side.progress_details()["lag"][topic] == {"0": 0, "1": 0, "2": 0}
        with pytest.raises(KafkaUnavailable, match=f"topic\\(s\\) {topic}-nope do not exist"):
            planner(kafka_broker.bootstrap, tmp_path / "ck3", topics=[f"{topic}-nope"]).plan(None, 0, True, None)
    finally:
        side.close()


def test_a_start_by_timestamp_begins_at_the_first_record_at_or_after_it(kafka_broker, tmp_path):
    topic = unique("bytime")
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.bootstrap, topic, [(0, None, b"old")] * 3)
    time.sleep(0.3)
    middle = int(time.time() * 1000)
    time.sleep(0.3)
    produce(kafka_broker.bootstrap, topic, [(0, None, b"new")] * 2)
    side = planner(kafka_broker.bootstrap, tmp_path / "ck", topics=[topic], starting={"timestamp": middle})
    try:
        first = side.plan(None, 0, True, None)
        assert side.batch_files(first) == (f"{topic}/0/3/5",)
    finally:
        side.close()


def test_a_topic_deleted_and_created_again_is_data_loss_an_error_or_a_skip_counted_in_the_progress(
        kafka_broker, tmp_path):
    from confluent_kafka.admin import AdminClient

    from funke.common.streaming.sources.kafka import KafkaDataLoss

    topic = unique("lost")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap, topic, [(p, None, b"x") for p in (0, 0, 0, 1)])
    strict = planner(kafka_broker.bootstrap, tmp_path / "strict", topics=[topic], starting="earliest")
    lenient = planner(kafka_broker.bootstrap, tmp_path / "lenient", topics=[topic], starting="earliest",
                      fail_on_data_loss=False)
    try:
        read = strict.plan(None, 0, True, None)
        assert read.end == {topic: {"0": 3, "1": 1}} == lenient.plan(None, 0, True, None).end
        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
        admin.delete_topics([topic], request_timeout=10)[topic].result(10)
        kafka_broker.create_topic(topic, 1)  # created again: one partition, empty
        produce(kafka_broker.bootstrap, topic, [(0, None, b"y")])
        with pytest.raises(KafkaDataLoss) as info:
            strict.plan(read.end, 0, True, None)
        said = str(info.value)
        assert f"topic '{topic}' partition 1 is gone" in said and "its end offset 1 is before offset 3" in said, said
        assert "fail_on_data_loss=False" in said
        skipped = lenient.plan(read.end, 0, True, None)
        assert skipped.end == {topic: {"0": 1}} and skipped.rows == 0  # goes on from the new end
        loss = lenient.progress_details()["dataLoss"]
        assert loss["losses"] == 2 and "is before offset 3" in loss["last"], loss
        produce(kafka_broker.bootstrap, topic, [(0, None, b"z")])
        assert lenient.plan(skipped.end, 0, True, None) == SourceRange(skipped.end, {topic: {"0": 2}}, 1)
    finally:
        strict.close()
        lenient.close()


def test_a_broker_that_is_gone_is_a_timeout_naming_what_did_not_answer(tmp_path):
    broker = KafkaBroker(tmp_path / "broker")
    topic = unique("gone")
    try:
        broker.create_topic(topic, 2)
        side = planner(broker.bootstrap, tmp_path / "ck", topics=[topic], options={"funke.timeout.ms": 2000})
        side.plan(None, 0, True, None)
        broker.kill()
        began = time.monotonic()
        with pytest.raises(KafkaUnavailable, match="within 2 s"):
            side.plan({topic: {"0": 0, "1": 0}}, 0, True, None)
        assert time.monotonic() - began < 15
        side.close()
    finally:
        broker.stop()


def test_the_reader_takes_exactly_each_range_past_transaction_markers_and_times_out_naming_a_partition(
        kafka_broker, tmp_path):
    topic = unique("read")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap, topic, [(0, b"k", f"v{i}".encode()) for i in range(5)])
    transactional = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": unique("tx")})
    transactional.init_transactions(10)
    transactional.begin_transaction()
    for i in range(3):
        transactional.produce(topic, value=f"t{i}".encode(), partition=1)
    transactional.commit_transaction(10)  # offsets 0-2 and the commit marker at 3
    config = {"bootstrap": kafka_broker.bootstrap, "options": {"funke.timeout.ms": 2000}}
    records = Records()
    read_ranges(config, [PartitionRange(topic, 0, 1, 4), PartitionRange(topic, 1, 0, 4)], records, "t", "test")
    table = records.table()
    assert sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())) == \
        [(0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    keys = dict(zip(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist()),
                    table.column("key").to_pylist()))
    assert keys[(0, 1)] == b"k" and keys[(1, 0)] is None
    assert table.column("value").to_pylist().count(b"t0") == 1
    assert set(table.column("timestampType").to_pylist()) <= {0, 1}
    began = time.monotonic()
    with pytest.raises(KafkaReadTimeout, match=f"topic '{topic}' partition 0: read up to offset 5, the batch's "
                                               "range ends at 9"):
        read_ranges(config, [PartitionRange(topic, 0, 3, 9)], Records(), "t", "test")
    assert time.monotonic() - began < 10
