"""The Kafka source and sink against a real Kafka broker, where one is at hand: set
FUNKE_TEST_KAFKA_BOOTSTRAP to its "host:port" (a broker the tests may create topics on and add
partitions to). Without it these tests are skipped, saying so: the test broker every other Kafka
test runs (Tansu, funke.testing) cannot add partitions to a topic and answers ListOffsets wrongly,
which is what these tests need.

- partitions added to a running query's topic are read from their start;
- the default end_offsets="list" (ListOffsets under read_committed: the last stable offset) plans
  batches that hold exactly the records produced, also past a sink's transactions;
- the exactly-once sink's output holds every record once for a read_committed consumer.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.integration.test_kafka_source import (committed_ranges, pass_through, produce, source_of, stop, unique,
                                                 wait_committed, written)
from tests.integration.test_streaming import Events

BOOTSTRAP = os.environ.get("FUNKE_TEST_KAFKA_BOOTSTRAP", "")

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not BOOTSTRAP, reason="no real Kafka broker: set FUNKE_TEST_KAFKA_BOOTSTRAP=host:port "
                                                       "to run these (the test broker cannot add partitions)")]


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def _create(topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def test_partitions_added_to_a_running_querys_topic_are_read_from_their_start(cluster, tmp_path):
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = unique("grow")
    _create(topic, 2)
    produce(BOOTSTRAP, topic, [(i % 2, None, f"before-{i}".encode()) for i in range(10)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = pass_through(f"kafka grow {tmp_path.name}", BOOTSTRAP, {"topics": [topic], "starting": "earliest"},
                       out, checkpoint)
    client = cluster.client
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    vertex = source_of(client, job_id)
    wait_committed(checkpoint, lambda: vertex, 10)
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    time.sleep(1)  # the producer's metadata learns of the new partitions
    produce(BOOTSTRAP, topic, [(i % 4, None, f"after-{i}".encode()) for i in range(40)])
    wait_committed(checkpoint, lambda: vertex, 50)
    stop(cluster, job_id, events)
    got = written(out)
    assert sorted(got) == sorted([f"before-{i}" for i in range(10)] + [f"after-{i}" for i in range(40)])
    assert max(got.values()) == 1
    # the new partitions entered a range from offset 0
    ranges = committed_ranges(checkpoint, vertex)
    assert any(str(p) in (r.end or {}).get(topic, {}) and str(p) not in (r.start or {}).get(topic, {})
               for r in ranges.values() for p in (2, 3))


def test_ranges_planned_by_list_offsets_hold_exactly_what_was_produced_past_a_sinks_transactions(cluster, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    source, copied = unique("lso-in"), unique("lso-out")
    _create(source, 3)
    _create(copied, 3)
    produce(BOOTSTRAP, source, [(i % 3, str(i).encode(), str(i).encode()) for i in range(300)])
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"kafka lso {tmp_path.name}", parallelism=2)
    (env.read_stream.kafka(BOOTSTRAP, source, starting="earliest", max_offsets_per_trigger=50)
        .select("key", "value").write_kafka(BOOTSTRAP, copied, key="key"))
    env.set_trigger("200 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    client = cluster.client
    job_id = client.submit(env.build())
    events = Events(client, job_id)
    vertex = source_of(client, job_id)
    wait_committed(tmp_path / "checkpoint", lambda: vertex, 300)
    stop(cluster, job_id, events)
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("check"), "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(copied, p, 0) for p in range(3)])
    seen, ended, deadline = [], set(), time.time() + 60
    while len(ended) < 3 and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            ended.add(message.partition())
            continue
        seen.append(int(message.value()))
    consumer.close()
    assert sorted(seen) == list(range(300))
