"""examples/kafka_wordcount.py end to end, on a real cluster and the session's Kafka-protocol broker:
lines produced into a 2-partition topic in three rounds, the example's running word count writes
each batch's new totals into another topic in one transaction per batch; once the query stopped,
the newest committed record of each word (read from the log, transaction markers applied) is that
word's count over every line produced."""

from __future__ import annotations

import collections
import time
import uuid

import pytest
from confluent_kafka import Producer

from funke.testing import COMMITTED, committed_records
from tests.integration.test_streaming import Events, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


ROUNDS = [["the quick brown fox", "jumps over the lazy dog"],
          ["The dog sleeps", "a fox, a dog: the end"],
          ["quick quick QUICK"]]


def test_the_kafka_word_count_example_keeps_each_words_total_in_the_output_topic(cluster, kafka_broker, tmp_path):
    from tests.unit.test_dsl import load_example

    lines, totals = f"lines-{uuid.uuid4().hex[:8]}", f"totals-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(lines, partitions=2)
    kafka_broker.create_topic(totals, partitions=2)
    module = load_example("kafka_wordcount")
    assert "funke submit examples/kafka_wordcount.py" in module.__doc__
    client = cluster.client
    job_id = client.submit(module.build(["--bootstrap", kafka_broker.bootstrap, "--input", lines, "--output", totals,
                                         "--end-offsets", "fetch", "--trigger", "500 ms",
                                         "--checkpoint", str(tmp_path / "checkpoint")]))
    events = Events(client, job_id)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    expected: collections.Counter = collections.Counter()
    batch = events.wait("BatchCompleted", min_batch=0)
    for i, round_ in enumerate(ROUNDS):
        for j, line in enumerate(round_):
            producer.produce(lines, value=line.encode(), partition=(i + j) % 2)
            expected.update(w for w in module.NON_LETTERS.split(line.lower()) if w)
        assert producer.flush(30) == 0
        batch = events.wait("BatchCompleted", min_batch=batch + 1)  # the round in a batch of its own, or more
    newest: dict[str, int] = {}
    deadline = time.time() + 60
    while True:
        records = [r for p in (0, 1) for r in committed_records(kafka_broker.bootstrap, totals, p)
                   if r.state == COMMITTED]  # in offset order per partition: a word's records share one
        newest = {r.key.decode(): int(r.value.decode()) for r in records}
        if newest == dict(expected) or time.time() > deadline:
            break
        time.sleep(0.5)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    assert newest == dict(expected)
    print(f"kafka word count example: {len(records)} committed total records, {len(newest)} words")
