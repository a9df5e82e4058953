"""funke.testing.committed_records (deploy/kafkalog.py) against the session's Kafka-protocol
broker: records written in a committed, an aborted and a still open transaction, and without a
transaction, each come back with the state of its transaction, whatever the broker's
read_committed consumer delivers."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from funke.testing import COMMITTED, OPEN, ABORTED, committed_records


def transactional(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(20)
    return producer


def test_each_record_comes_back_with_the_state_of_its_transaction(kafka_broker):
    topic = f"log-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 1)
    plain = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    committing, aborting, lingering = (transactional(kafka_broker.bootstrap) for _ in range(3))
    try:
        plain.produce(topic, b"p0", partition=0)
        assert plain.flush(20) == 0
        for producer in (committing, aborting, lingering):
            producer.begin_transaction()
        # interleaved in the log: c1 a1 l1 c2 a2, then the markers
        for name, producer in (("c1", committing), ("a1", aborting), ("l1", lingering), ("c2", committing),
                               ("a2", aborting)):
            producer.produce(topic, name.encode(), key=name.encode(), partition=0, headers=[("h", b"v")])
            assert producer.flush(20) == 0  # in the log before the next one
        committing.commit_transaction(20)
        aborting.abort_transaction(20)
        plain.produce(topic, b"p1", partition=0)
        assert plain.flush(20) == 0

        records = committed_records(kafka_broker.bootstrap, topic, 0, timeout=30)

        assert [(r.value, r.state) for r in records] == [
            (b"p0", COMMITTED), (b"c1", COMMITTED), (b"a1", ABORTED), (b"l1", OPEN), (b"c2", COMMITTED),
            (b"a2", ABORTED), (b"p1", COMMITTED)]
        assert [r.offset for r in records] == sorted(r.offset for r in records)
        c1 = records[1]
        assert (c1.key, c1.headers, c1.transactional) == (b"c1", (("h", b"v"),), True)
        assert not records[0].transactional and records[0].key is None
        assert len({r.producer_id for r in records[1:6]}) == 3

        lingering.abort_transaction(20)  # its marker arrives: the open records become aborted
        assert [r.state for r in committed_records(kafka_broker.bootstrap, topic, 0) if r.value == b"l1"] == [ABORTED]
    finally:
        for producer in (committing, aborting, lingering, plain):
            producer.flush(5)
        del committing, aborting, lingering, plain  # closed now, not when the session's broker is gone


def test_a_topic_without_records_is_an_empty_log(kafka_broker):
    topic = f"log-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 2)
    assert committed_records(kafka_broker.bootstrap, topic, 1) == []
