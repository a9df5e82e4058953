"""Avro values of a Kafka source (common/streaming/sources/avro.py, runtime/avrovalues.py): the
columns a schema maps to, plain Avro and Confluent's wire format decoded into Arrow, schema
resolution from a writer schema into the reader schema, and the errors of values that are not
what the settings say (each naming the topic, partition and offset of its record). The registry
client against servers that answer is tests/integration/test_schema_registry.py."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest

from funke.common.streaming.sources import avro
from funke.runtime import avrovalues
from funke.runtime.avrovalues import UnknownSchemaId, ValueDecodeError

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "qty", "type": "int"},
    ],
}
# v2, as a producer evolved it: a field removed (qty), a field added with a default, id widened
ORDER_V2_READER = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "channel", "type": "string", "default": "web"},
    ],
}

EVERYTHING = {
    "type": "record", "name": "Event", "namespace": "t",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "flag", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "raw", "type": "bytes"},
        {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 2}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "where", "type": {"type": "record", "name": "Place", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}},
        {"name": "home", "type": ["null", "Place"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "visits", "type": {"type": "array", "items": "Place"}},
        {"name": "maybe_color", "type": ["null", "Color"]},
        {"name": "n", "type": ["int", "long"]},
        {"name": "either", "type": ["null", "int", "string", "Place"]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "fprice", "type": {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal",
                                    "precision": 12, "scale": 3}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tod_us", "type": {"type": "long", "logicalType": "time-micros"}},
    ],
}
EVERYTHING_DDL = (
    "`id` BIGINT, `flag` BOOLEAN, `f` FLOAT, `d` DOUBLE, `raw` BINARY, `tag` BINARY, `color` STRING, "
    "`where` STRUCT<`city`: STRING NOT NULL, `zip`: INT>, `home` STRUCT<`city`: STRING NOT NULL, `zip`: INT>, "
    "`tags` ARRAY<STRING>, `scores` MAP<STRING, DOUBLE>, `visits` ARRAY<STRUCT<`city`: STRING NOT NULL, `zip`: INT>>, "
    "`maybe_color` STRING, `n` BIGINT, "
    "`either` STRUCT<`member0`: INT, `member1`: STRING, `member2`: STRUCT<`city`: STRING NOT NULL, `zip`: INT>>, "
    "`day` DATE, `at_ms` TIMESTAMP, `at_us` TIMESTAMP, `local` TIMESTAMP_NTZ, `price` DECIMAL(9,2), "
    "`fprice` DECIMAL(12,3), `uid` STRING, `tod` INT, `tod_us` BIGINT")

UTC = dt.timezone.utc
AN_EVENT = {
    "id": 7, "flag": True, "f": 1.5, "d": 2.25, "raw": b"\x00\xff", "tag": b"ab", "color": "GREEN",
    "where": {"city": "Oslo", "zip": None}, "home": {"city": "Bergen", "zip": 5003},
    "tags": ["a", "b"], "scores": {"x": 1.0, "y": None}, "visits": [{"city": "Rome", "zip": 1}],
    "maybe_color": "RED", "n": 2**40, "either": "text",
    "day": dt.date(2026, 12, 8), "at_ms": dt.datetime(2026, 12, 8, 1, 2, 3, 4000, tzinfo=UTC),
    "at_us": dt.datetime(2026, 12, 8, 1, 2, 3, 456789, tzinfo=UTC),
    "local": dt.datetime(2026, 12, 8, 9, 0, 0), "price": Decimal("12.34"), "fprice": Decimal("-5.125"),
    "uid": "0b7cc1b6-8a57-4a4b-8f0b-6a3c1d2e9f10", "tod": 3_600_000, "tod_us": 1_000_001,
}


def avro_bytes(schema, record) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def confluent(schema_id: int, schema, record) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + avro_bytes(schema, record)


def at(n: int, topic: str = "orders", partition: int = 3, first: int = 100) -> list[tuple[str, int, int]]:
    return [(topic, partition, first + i) for i in range(n)]


# -- the columns a schema maps to ---------------------------------------------------------------


def test_a_schema_maps_to_the_columns_spark_from_avro_gives():
    assert avro.spark_ddl(json.dumps(EVERYTHING)) == EVERYTHING_DDL


def test_a_value_that_is_not_a_record_is_one_column_named_value():
    assert avro.spark_ddl('"string"') == "`value` STRING"
    assert avro.spark_ddl(json.dumps(["null", "long"])) == "`value` BIGINT"
    assert avro.spark_ddl(json.dumps({"type": "array", "items": "int"})) == "`value` ARRAY<INT>"


def test_the_arrow_schema_has_the_same_columns_and_top_level_columns_are_nullable():
    schema = avrovalues.arrow_schema(json.dumps(EVERYTHING))
    assert schema.names == [f["name"] for f in EVERYTHING["fields"]]
    assert all(f.nullable for f in schema)  # a tombstone has no value: every column null
    assert schema.field("where").type == pa.struct([pa.field("city", pa.string(), False), pa.field("zip", pa.int32())])
    assert schema.field("at_ms").type == pa.timestamp("us", tz="UTC")
    assert schema.field("local").type == pa.timestamp("us")
    assert schema.field("price").type == pa.decimal128(9, 2)
    assert schema.field("scores").type == pa.map_(pa.string(), pa.float64())


@pytest.mark.parametrize("schema, says", [
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "contains itself"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "1 to 38 digits"),
    ({"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]}, "not a valid Avro schema"),
    ("{not json", "is not JSON"),
    ({"type": "array", "items": {"type": "record", "name": "E", "fields": []}}, "items that take no bytes"),
    (["null", "int", "long", "string"], "more than one branch read as 'number'"),
    (["string", {"type": "long", "logicalType": "timestamp-millis"}, "int"], "more than one branch read as 'number'"),
])
def test_a_schema_without_columns_is_refused_saying_why(schema, says):
    with pytest.raises(avro.AvroSchemaError, match=says):
        avro.spark_ddl(schema if isinstance(schema, str) else json.dumps(schema))


# -- plain Avro ----------------------------------------------------------------------------------


def test_plain_avro_values_decode_into_their_columns():
    values = [avro_bytes(ORDER_V1, {"id": i, "item": f"i{i}", "qty": i * 2}) for i in range(3)]
    table = avrovalues.decode(values, {"value_format": "avro", "value_schema": json.dumps(ORDER_V1)}, at(3))
    assert table.to_pylist() == [{"id": i, "item": f"i{i}", "qty": i * 2} for i in range(3)]
    assert table.schema == avrovalues.arrow_schema(json.dumps(ORDER_V1))


def test_every_mapped_type_decodes_to_its_column_value():
    table = avrovalues.decode([avro_bytes(EVERYTHING, AN_EVENT)],
                              {"value_format": "avro", "value_schema": json.dumps(EVERYTHING)}, at(1))
    row = table.to_pylist()[0]
    expected = dict(AN_EVENT, scores=[("x", 1.0), ("y", None)],
                    either={"member0": None, "member1": "text", "member2": None})
    assert row == expected


def test_a_union_value_lands_in_the_member_of_its_branch():
    rows = [dict(AN_EVENT, either=e) for e in (5, "s", {"city": "Pisa", "zip": None}, None)]
    table = avrovalues.decode([avro_bytes(EVERYTHING, r) for r in rows],
                              {"value_format": "avro", "value_schema": json.dumps(EVERYTHING)}, at(4))
    assert table.column("either").to_pylist() == [
        {"member0": 5, "member1": None, "member2": None},
        {"member0": None, "member1": "s", "member2": None},
        {"member0": None, "member1": None, "member2": {"city": "Pisa", "zip": None}},
        None,
    ]


def test_a_record_without_a_value_is_a_row_of_nulls():
    table = avrovalues.decode([None, avro_bytes(ORDER_V1, {"id": 1, "item": "x", "qty": 1})],
                              {"value_format": "avro", "value_schema": json.dumps(ORDER_V1)}, at(2))
    assert table.to_pylist() == [{"id": None, "item": None, "qty": None}, {"id": 1, "item": "x", "qty": 1}]


# -- Confluent's wire format and schema resolution ------------------------------------------------


def test_confluent_framed_values_decode_with_the_writer_schema_of_their_id():
    values = [confluent(7, ORDER_V1, {"id": 1, "item": "tea", "qty": 2})]
    config = {"value_format": "confluent-avro", "schemas": {"7": json.dumps(ORDER_V1)}}
    assert avrovalues.decode(values, config, at(1)).to_pylist() == [{"id": 1, "item": "tea", "qty": 2}]


def test_values_of_several_writer_schemas_resolve_into_the_reader_schema():
    writer_v2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
        {"name": "note", "type": ["null", "string"]}, {"name": "channel", "type": "string"}]}
    values = [confluent(1, ORDER_V1, {"id": 1, "item": "tea", "qty": 2}),
              confluent(2, writer_v2, {"id": 2, "item": "jam", "note": "gift", "channel": "app"}),
              None]
    config = {"value_format": "confluent-avro", "value_schema": json.dumps(ORDER_V2_READER),
              "schemas": {"1": json.dumps(ORDER_V1), "2": json.dumps(writer_v2)}}
    assert avrovalues.decode(values, config, at(3)).to_pylist() == [
        {"id": 1, "item": "tea", "note": None, "channel": "web"},  # defaults fill what v1 lacks
        {"id": 2, "item": "jam", "note": "gift", "channel": "app"},
        {"id": None, "item": None, "note": None, "channel": None},
    ]


def test_a_writer_schema_the_reader_cannot_resolve_is_an_error_naming_the_record():
    other = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "qty", "type": "int"}]}
    config = {"value_format": "confluent-avro", "value_schema": json.dumps(ORDER_V1),
              "schemas": {"9": json.dumps(other)}}
    with pytest.raises(ValueDecodeError, match=r"offset 100 of topic 'orders' partition 3 .*schema id 9") as err:
        avrovalues.decode([confluent(9, other, {"qty": 1})], config, at(1))
    assert (err.value.topic, err.value.partition, err.value.offset) == ("orders", 3, 100)


# -- values that are not what the settings say ----------------------------------------------------


def test_a_value_that_cannot_be_decoded_names_its_topic_partition_and_offset():
    good = avro_bytes(ORDER_V1, {"id": 1, "item": "tea", "qty": 2})
    config = {"value_format": "avro", "value_schema": json.dumps(ORDER_V1)}
    with pytest.raises(ValueDecodeError) as err:
        avrovalues.decode([good, good[:3]], config, at(2, topic="payments", partition=1, first=41))
    assert "offset 42 of topic 'payments' partition 1 as avro" in str(err.value)
    assert (err.value.topic, err.value.partition, err.value.offset) == ("payments", 1, 42)


def test_bytes_left_after_a_value_mean_it_was_written_with_another_schema():
    config = {"value_format": "avro", "value_schema": json.dumps(ORDER_V1)}
    value = avro_bytes(ORDER_V1, {"id": 1, "item": "tea", "qty": 2}) + b"\x02\x04"
    with pytest.raises(ValueDecodeError, match="2 byte\\(s\\) are left after the Avro value"):
        avrovalues.decode([value], config, at(1))


def test_a_value_without_confluents_framing_is_an_error_naming_the_record():
    config = {"value_format": "confluent-avro", "schemas": {"1": json.dumps(ORDER_V1)}}
    with pytest.raises(ValueDecodeError, match="offset 100 of topic 'orders' partition 3 .*Confluent's wire format"):
        avrovalues.decode([avro_bytes(ORDER_V1, {"id": 1, "item": "tea", "qty": 2})], config, at(1))
    with pytest.raises(ValueDecodeError, match="Confluent's wire format"):
        avrovalues.decode([b"\x00\x00"], config, at(1))


def test_a_schema_id_not_given_is_a_clear_error_naming_the_id_and_the_record():
    config = {"value_format": "confluent-avro", "value_schema": json.dumps(ORDER_V1),
              "schemas": {"1": json.dumps(ORDER_V1), "2": json.dumps(ORDER_V1)}}
    with pytest.raises(UnknownSchemaId) as err:
        avrovalues.decode([confluent(5, ORDER_V1, {"id": 1, "item": "t", "qty": 1})], config, at(1))
    assert err.value.schema_id == 5
    assert str(err.value) == ("cannot decode the value of the record at offset 100 of topic 'orders' partition 3 "
                              "as confluent-avro: its schema id 5 is not known to the source's 'schemas' (ids 1, 2)")


def test_a_decimal_wider_than_its_column_is_an_error_naming_the_record():
    schema = {"type": "record", "name": "P", "fields": [
        {"name": "p", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}]}
    wide = {"type": "record", "name": "P", "fields": [
        {"name": "p", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    values = [avro_bytes(schema, {"p": Decimal("1.50")}), avro_bytes(wide, {"p": Decimal("1234567.89")})]
    with pytest.raises(ValueDecodeError, match="offset 101 of topic 'orders' partition 3 .*does not fit"):
        avrovalues.decode(values, {"value_format": "avro", "value_schema": json.dumps(schema)}, at(2))


# -- the checks at submit -------------------------------------------------------------------------


def test_value_settings_are_checked_at_submit_listing_every_problem():
    problems = avro.config_problems({"value_format": "confluent-avro", "value_schema": "{",
                                     "schema_registry": "ftp://registry:8081", "schemas": {"x": "{}"}})
    assert problems == [
        "config 'value_schema' is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "config 'schema_registry' must be an http or https URL, got 'ftp://registry:8081'",
        "config 'schemas' has the key 'x'; keys are schema ids from 0 to 2147483647",
    ]
    assert avro.config_problems({"value_format": "avro"}) == [
        "config 'value_schema' is needed for value_format 'avro': the values' Avro schema, as JSON text"]
    assert avro.config_problems({"value_format": "confluent-avro"}) == [
        "value_format 'confluent-avro' needs config 'schema_registry' (the registry's URL) or 'schemas' "
        "(the writer schemas by id)"]
    assert avro.config_problems({"value_format": "json", "schemas": {"1": "{}"}}) == [
        "config 'schemas' is for value_format 'confluent-avro' (the value_format is 'json')"]
    assert avro.config_problems({"value_format": "avro", "value_schema": json.dumps(ORDER_V1)}) == []


@pytest.mark.parametrize("url, allowed, says", [
    ("http://registry.internal:8081", ("localhost",), "'registry.internal' is not a host jobs may connect to here"),
    ("http://user:secret@localhost:8081", (), "must not hold credentials"),
    ("http://localhost:8081/?x=1", (), "without a query or fragment"),
    ("http://:8081", (), "has no valid host"),
    ("http://localhost:99999", (), "not a URL"),
    ("localhost:8081", (), "must be an http or https URL"),
])
def test_a_registry_url_is_checked_against_the_allowed_hosts(url, allowed, says):
    problem = avro.registry_url_problem(url, allowed)
    assert problem is not None and says in problem
    assert "secret" not in problem


def test_an_allowed_registry_url_passes():
    assert avro.registry_url_problem("http://LOCALHOST:8081/registry/", ("localhost",)) is None
    assert avro.registry_url_problem("https://127.0.0.1:8081", ()) is None


def test_the_reader_schema_is_the_given_one_or_the_only_schema_given_by_id():
    assert avro.reader_schema({"value_format": "avro", "value_schema": "x"}) == "x"
    assert avro.reader_schema({"value_format": "confluent-avro", "schemas": {"3": "s"}}) == "s"
    assert avro.reader_schema({"value_format": "confluent-avro", "schemas": {"3": "s", "4": "t"}}) is None
    with pytest.raises(ValueError, match="'value_schema' is needed"):
        avrovalues.resolve_value_schema({"value_format": "confluent-avro", "schemas": {"3": "s", "4": "t"}}, ["a"])


def test_a_value_that_is_a_union_decodes_into_the_one_column_of_its_members():
    schema = ["null", "string", {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}]
    values = [avro_bytes(schema, "x"), avro_bytes(schema, {"a": 3}), avro_bytes(schema, None), None]
    table = avrovalues.decode(values, {"value_format": "avro", "value_schema": json.dumps(schema)}, at(4))
    assert table.column_names == ["value"]
    assert table.column("value").to_pylist() == [{"member0": "x", "member1": None},
                                                 {"member0": None, "member1": {"a": 3}}, None, None]


def test_dates_and_timestamps_nested_in_maps_arrays_and_unions_become_their_column_types():
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "seen", "type": {"type": "map", "values": {"type": "long", "logicalType": "timestamp-millis"}}},
        {"name": "days", "type": {"type": "array", "items": ["null", {"type": "int", "logicalType": "date"}]}},
        {"name": "either", "type": ["null", "string", {"type": "long", "logicalType": "timestamp-micros"}]}]}
    at_ms = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    at_us = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    record = {"seen": {"a": at_ms}, "days": [dt.date(2026, 12, 8), None], "either": at_us}
    table = avrovalues.decode([avro_bytes(schema, record)], {"value_format": "avro", "value_schema": json.dumps(schema)},
                              at(1))
    assert table.schema == avrovalues.arrow_schema(json.dumps(schema))
    assert table.to_pylist() == [{"seen": [("a", at_ms)], "days": [dt.date(2026, 12, 8), None],
                                  "either": {"member0": None, "member1": at_us}}]
