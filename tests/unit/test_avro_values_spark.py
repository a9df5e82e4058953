"""Avro values in real PySpark: the table `funke.runtime.avrovalues.decode` makes becomes a
DataFrame with the Spark DDL `funke.common.streaming.sources.avro.spark_ddl` gave at submit as its
schema, with the values Spark users expect (timestamps in UTC, decimals, maps, the
members of a union)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import _parse_datatype_string

from funke.common.streaming.sources import avro
from funke.runtime import avrovalues
from tests.unit.test_avro_values import AN_EVENT, EVERYTHING, avro_bytes


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[1]").appName("funke-test-avro")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_the_decoded_table_has_the_schema_spark_ddl_gave_at_submit(spark):
    schema = json.dumps(EVERYTHING)
    table = avrovalues.decode([avro_bytes(EVERYTHING, AN_EVENT), None],
                              {"value_format": "avro", "value_schema": schema}, [("t", 0, 0), ("t", 0, 1)])

    # with the DDL as its schema: Spark reads an Arrow timestamp without a zone as TIMESTAMP otherwise
    frame = spark.createDataFrame(table, schema=avro.spark_ddl(schema))

    assert frame.schema == _parse_datatype_string(avro.spark_ddl(schema))
    row, tombstone = frame.collect()
    assert row["at_ms"] == dt.datetime(2026, 12, 8, 1, 2, 3, 4000)  # UTC, as the session's zone shows it
    assert row["local"] == dt.datetime(2026, 12, 8, 9, 0, 0)
    assert row["day"] == dt.date(2026, 12, 8)
    assert (row["price"], row["fprice"]) == (Decimal("12.34"), Decimal("-5.125"))
    assert row["scores"] == {"x": 1.0, "y": None}
    assert row["either"].asDict() == {"member0": None, "member1": "text", "member2": None}
    assert row["home"].asDict() == {"city": "Bergen", "zip": 5003}
    assert all(v is None for v in tombstone.asDict().values())
