"""funke's Schema Registry client (funke.runtime.avrovalues) over real HTTP, with values that went
through a real Kafka-protocol broker: Confluent-framed Avro values produced to the session's Tansu
broker, read back with assign + seek as the Kafka source reads them, decoded with writer schemas
fetched by id. The schemas are files served by Python's http.server in Confluent's REST paths
(tests/schemaregistry.py says why that, and that it is not a Schema Registry): what is tested
is the client's HTTP side, its cache, its timeout and its errors, each naming the record."""

from __future__ import annotations

import io
import json
import socket
import threading
import uuid

import fastavro
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from funke.runtime import avrovalues
from funke.runtime.avrovalues import RegistryError, RegistryUnavailable
from tests.schemaregistry import SchemaFileServer

ORDER = {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
ORDER_READER = {"type": "record", "name": "Order", "namespace": "shop",
                "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"},
                           {"name": "channel", "type": "string", "default": "web"}]}


def framed(schema_id: int, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def produce_and_read(bootstrap: str, values: list[bytes]) -> tuple[list[bytes | None], list[tuple[str, int, int]]]:
    """Produces `values` to a new one-partition topic and reads them back with assign + seek."""
    topic = f"avro-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list = []
        for _ in range(200):
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                got.append(m)
            if len(got) == len(values):
                break
    finally:
        consumer.close()
    assert len(got) == len(values), f"read {len(got)} of {len(values)} records back"
    return [m.value() for m in got], [(m.topic(), m.partition(), m.offset()) for m in got]


@pytest.fixture
def schema_files(tmp_path):
    server = SchemaFileServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_writer_schemas_are_fetched_by_id_once_and_values_resolve_into_the_reader_schema(kafka_broker, schema_files):
    schema_files.add_schema(21, json.dumps(ORDER))
    values, where = produce_and_read(kafka_broker.bootstrap, [framed(21, {"id": i, "item": f"i{i}"}) for i in range(3)])
    config = {"value_format": "confluent-avro", "schema_registry": schema_files.url,
              "value_schema": json.dumps(ORDER_READER)}

    table = avrovalues.decode(values, config, where)

    assert table.to_pylist() == [{"id": i, "item": f"i{i}", "channel": "web"} for i in range(3)]
    schema_files.stop()  # the id is cached: the next batch needs no server
    assert avrovalues.decode(values, config, where).num_rows == 3
    assert schema_files.requests("/schemas/ids/21") == 1


def test_an_id_the_server_has_no_schema_for_is_an_error_naming_the_record(kafka_broker, schema_files):
    schema_files.add_schema(1, json.dumps(ORDER))
    values, where = produce_and_read(kafka_broker.bootstrap, [framed(1, {"id": 1, "item": "a"}),
                                                              framed(404, {"id": 2, "item": "b"})])
    config = {"value_format": "confluent-avro", "schema_registry": schema_files.url}
    topic = where[1][0]
    with pytest.raises(RegistryError) as err:
        avrovalues.decode(values, {**config, "value_schema": json.dumps(ORDER)}, where)
    assert str(err.value) == (
        f"the Schema Registry at {schema_files.url} answered GET /schemas/ids/404 with HTTP 404 (without "
        f"Confluent's error code: is {schema_files.url} a Schema Registry's URL?) (the writer schema id 404 "
        f"of the value at offset 1 of topic {topic!r} partition 0)")


def test_a_schema_with_references_is_read_with_the_types_of_the_subjects_it_refers_to(schema_files):
    address = {"type": "record", "name": "Address", "namespace": "com.acme",
               "fields": [{"name": "city", "type": "string"}]}
    customer = {"type": "record", "name": "Customer", "namespace": "com.acme",
                "fields": [{"name": "name", "type": "string"}, {"name": "home", "type": "Address"}]}
    order = {"type": "record", "name": "Order", "namespace": "com.acme",
             "fields": [{"name": "ship_to", "type": "Address"}, {"name": "buyer", "type": "com.acme.Customer"}]}
    schema_files.add_version("address-value", 1, 41, json.dumps(address))
    schema_files.add_version("customer-value", 2, 42, json.dumps(customer),
                             references=[{"name": "com.acme.Address", "subject": "address-value", "version": 1}])
    # Customer holds Address too: the two references meet (a diamond)
    schema_files.add_schema(43, json.dumps(order), references=[
        {"name": "com.acme.Address", "subject": "address-value", "version": 1},
        {"name": "com.acme.Customer", "subject": "customer-value", "version": 2}])
    whole = dict(order, fields=[{"name": "ship_to", "type": address},
                                {"name": "buyer", "type": dict(customer, fields=[customer["fields"][0],
                                                                                 {"name": "home", "type": "Address"}])}])
    record = {"ship_to": {"city": "Oslo"}, "buyer": {"name": "Ada", "home": {"city": "Bergen"}}}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(whole), record)
    value = b"\x00" + (43).to_bytes(4, "big") + out.getvalue()

    table = avrovalues.decode([value], {"value_format": "confluent-avro", "schema_registry": schema_files.url,
                                        "value_schema": json.dumps(whole)}, [("orders", 0, 5)])

    assert table.to_pylist() == [record]
    missing = {"name": "com.acme.Gone", "subject": "gone-value", "version": 3}
    schema_files.add_schema(44, json.dumps(order), references=[missing])
    with pytest.raises(RegistryError, match=r"GET /subjects/gone-value/versions/3 with HTTP 404 .* schema id 44 of "
                                            r"the value at offset 5 of topic 'orders' partition 0"):
        avrovalues.decode([b"\x00" + (44).to_bytes(4, "big")], {
            "value_format": "confluent-avro", "schema_registry": schema_files.url,
            "value_schema": json.dumps(whole)}, [("orders", 0, 5)])


def test_a_redirect_is_an_error_not_followed(schema_files):
    # http.server redirects a directory's path to the same path with a slash
    (schema_files.root / "schemas" / "ids" / "8").mkdir(parents=True)
    with pytest.raises(RegistryError, match=r"answered GET /schemas/ids/8 with a redirect \(HTTP 301\), which "
                                            r"funke does not follow"):
        avrovalues.SchemaRegistry(schema_files.url).schema(8)


def test_a_server_that_is_gone_is_unavailable_saying_where(schema_files):
    url = schema_files.url
    schema_files.stop()
    with pytest.raises(RegistryUnavailable, match=f"the Schema Registry at {url} could not be reached"):
        avrovalues.SchemaRegistry(url, timeout=5).schema(3)


def test_a_server_that_never_answers_fails_within_the_timeout():
    """A listener that accepts and says nothing: the request ends with a clear error, never hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    continue
        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            with pytest.raises(RegistryUnavailable, match=f"the Schema Registry at {url} did not answer "
                                                          f"GET /schemas/ids/5 within 0.5 s"):
                avrovalues.SchemaRegistry(url, timeout=0.5).schema(5)
        finally:
            stop.set()
            acceptor.join(5)
            for conn in held:
                conn.close()


def test_at_submit_the_latest_schema_of_the_topics_subject_is_pinned(schema_files):
    schema_files.add_latest("orders-value", 31, json.dumps(ORDER_READER), version=4)
    config = {"value_format": "confluent-avro", "schema_registry": schema_files.url}

    pinned = avrovalues.resolve_value_schema(config, ["orders"])

    assert json.loads(pinned["value_schema"]) == ORDER_READER
    assert "value_schema" not in config
    with pytest.raises(RegistryError, match="answered GET /subjects/payments-value/versions/latest with HTTP 404"):
        avrovalues.resolve_value_schema(config, ["payments"])
