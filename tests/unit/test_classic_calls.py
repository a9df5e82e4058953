"""A streaming task's DataFrame calls with few JVM round trips (taskmanager/operators/classic.py),
on real PySpark: each gives what PySpark's public call gives (the same schema, rows and Arrow
table, the same error with the user's traceback), in a fraction of the round trips, and builds
what does not change from batch to batch once per task."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import sys
import threading

import pyarrow as pa
import pytest
from py4j import clientserver
from pyspark.errors import PythonException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from funke.common.graph.jobgraph import OperatorSpec
from funke.taskmanager.operators import classic
from funke.taskmanager.operators.context import RuntimeContext, parse_schema
from funke.taskmanager.operators.transforms import TRANSFORMS


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("funke-test-classic-calls")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "Europe/Berlin")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def task_context(spark, tmp_path, memo: dict | None) -> RuntimeContext:
    return RuntimeContext(spark=spark, job_id="job-1", vertex_id="v", subtask_index=0, parallelism=1,
                          attempt_number=0, data_dir=str(tmp_path), memo=memo)


class RoundTrips:
    """Counts this thread's Py4J commands while active."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> RoundTrips:
        self._original = clientserver.ClientServerConnection.send_command
        me, counter, original = threading.get_ident(), self, self._original

        def send_command(connection, command, *args, **kwargs):
            if threading.get_ident() == me:
                counter.count += 1
            return original(connection, command, *args, **kwargs)

        clientserver.ClientServerConnection.send_command = send_command
        return self

    def __exit__(self, *exc) -> None:
        clientserver.ClientServerConnection.send_command = self._original


BERLIN = dt.timezone(dt.timedelta(hours=1))
TABLES = {
    "numbers and text": ("id bigint, n int, x double, price decimal(10,2), ok boolean, name string",
                         pa.table({"id": pa.array([1, 2, None], pa.int64()), "n": pa.array([7, None, 9], pa.int32()),
                                   "x": [0.5, None, 2.25],
                                   "price": pa.array([decimal.Decimal("1.10"), None, decimal.Decimal("-3.00")],
                                                     pa.decimal128(10, 2)),
                                   "ok": [True, False, None], "name": ["a", None, "ü"]})),
    "times": ("at timestamp, day date",
              pa.table({"at": pa.array([dt.datetime(2026, 1, 1, 12, tzinfo=BERLIN), None], pa.timestamp("us", tz="+01:00")),
                        "day": pa.array([dt.date(2026, 2, 3), None], pa.date32())})),
    "nested": ("fields map<string,string>, tags array<int>, point struct<x: bigint, y: bigint>, raw binary",
               pa.table({"fields": pa.array([[("k", "v")], None], pa.map_(pa.string(), pa.string())),
                         "tags": pa.array([[1, 2], []], pa.list_(pa.int32())),
                         "point": pa.array([{"x": 1, "y": 2}, None], pa.struct([("x", pa.int64()), ("y", pa.int64())])),
                         "raw": pa.array([b"\x00\x01", None], pa.binary())})),
    "no rows": ("value bigint, timestamp timestamp",
                pa.table({"value": pa.array([], pa.int64()), "timestamp": pa.array([], pa.timestamp("us", tz="UTC"))})),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_frame_from_arrow_and_back_is_what_the_public_api_gives(spark, tmp_path, name):
    ddl, table = TABLES[name]
    schema = parse_schema(ddl)
    ctx = task_context(spark, tmp_path, {})
    public = spark.createDataFrame(table, schema=schema)
    fast = classic.frame_from_arrow(ctx, table, schema)
    assert fast.schema == public.schema == schema
    assert fast.collect() == public.collect()
    want = public.toArrow()
    got = classic.frame_to_arrow(ctx, fast)
    assert got.schema == want.schema and got.equals(want)
    assert got.num_rows == table.num_rows


def test_without_a_task_memo_the_public_api_runs(spark, tmp_path):
    ddl, table = TABLES["numbers and text"]
    ctx = task_context(spark, tmp_path, None)
    with RoundTrips() as trips:
        df = classic.frame_from_arrow(ctx, table, parse_schema(ddl))
    assert trips.count >= 30  # PySpark's own createDataFrame, setting by setting
    assert classic.frame_to_arrow(ctx, df).equals(df.toArrow())


def test_the_calls_make_a_fraction_of_the_round_trips(spark, tmp_path):
    ddl, table = TABLES["numbers and text"]
    schema = parse_schema(ddl)
    ctx = task_context(spark, tmp_path, {})
    classic.frame_from_arrow(ctx, table, schema)  # the task's first call looks the JVM's classes up
    with RoundTrips() as public:
        df = spark.createDataFrame(table, schema=schema)
        df.toArrow()
    with RoundTrips() as fast:
        df = classic.frame_from_arrow(ctx, table, schema)
        classic.frame_to_arrow(ctx, df)
    assert fast.count * 3 <= public.count, (fast.count, public.count)


def test_a_user_functions_error_is_raised_as_pyspark_raises_it(spark, tmp_path):
    def broken(batches):
        for batch in batches:
            raise ZeroDivisionError("the user's own error")
            yield batch

    ctx = task_context(spark, tmp_path, {})
    df = spark.range(3).mapInArrow(broken, "id long")
    with pytest.raises(PythonException) as public:
        df.toArrow()
    with pytest.raises(PythonException) as fast:
        classic.frame_to_arrow(ctx, df)
    assert "ZeroDivisionError: the user's own error" in str(fast.value)
    assert type(fast.value) is type(public.value)


def test_a_grouped_aggregate_and_a_projection_are_built_once_per_task(spark, tmp_path):
    ctx = task_context(spark, tmp_path, {})
    spec = OperatorSpec("aggregate", "agg", {"keys": ["k.e y"], "aggregations": ["count(1) AS n", "sum(v) AS total"]})
    select = OperatorSpec("select", "sel", {"exprs": ["`k.e y`", "v * 2 AS v"]})
    for batch in range(3):
        df = spark.createDataFrame([(f"k{i % 2}", i + batch) for i in range(5)], "`k.e y` string, v bigint")
        projected = TRANSFORMS["select"](ctx, select, [df])
        got = sorted(TRANSFORMS["aggregate"](ctx, spec, [projected]).collect())
        want = sorted(projected.groupBy("`k.e y`").agg(F.count(F.lit(1)), F.sum("v")).collect())
        assert [tuple(r) for r in got] == [tuple(r) for r in want]
        if batch == 0:
            kept = dict(ctx.memo[classic._KEY].kept)
        else:
            assert ctx.memo[classic._KEY].kept == kept  # the same JVM objects, nothing new
    assert len(kept) == 2


def test_a_global_aggregate_has_no_keys(spark, tmp_path):
    ctx = task_context(spark, tmp_path, {})
    df = spark.createDataFrame([(1,), (2,), (4,)], "v bigint")
    assert classic.grouped_aggregate(ctx, df, [], ["sum(v) AS total", "max(v) AS top"]).collect()[0].asDict() == {
        "total": 7, "top": 4}


def test_a_map_applies_its_udf_by_column_name_once_per_input_columns(spark, tmp_path):
    ctx = task_context(spark, tmp_path, {})
    spec = OperatorSpec("map", "m", {"schema": "a bigint, b string"}, function=_pickled(lambda row: (row[0] * 10, row[1])))
    for batch in range(2):
        df = spark.createDataFrame([(batch, "x"), (batch + 1, "y")], "`a.b` bigint, `c` string")
        assert [tuple(r) for r in TRANSFORMS["map"](ctx, spec, [df]).collect()] == [(batch * 10, "x"),
                                                                                   ((batch + 1) * 10, "y")]
    (kept,) = [v for k, v in ctx.memo.items() if isinstance(k, tuple) and k[0] == "mapInArrow"]
    assert list(kept[3]) == [("a.b", "c")]


def _pickled(fn):
    import cloudpickle

    return cloudpickle.dumps(fn)


def test_a_frame_from_arrow_follows_the_session_time_zone_of_the_call(spark, tmp_path):
    ctx = task_context(spark, tmp_path, {})
    table = pa.table({"at": pa.array([dt.datetime(2026, 1, 1, 12)], pa.timestamp("us"))})  # no time zone
    schema = StructType.fromJson(parse_schema("at timestamp").jsonValue())
    try:
        for zone in ("Europe/Berlin", "America/New_York"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            assert classic.frame_from_arrow(ctx, table, schema).collect() == spark.createDataFrame(
                table, schema=schema).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")


def test_an_observed_count_of_rows_takes_a_fraction_of_the_round_trips(spark, tmp_path):
    """What counts an operator's records where nothing else knows them (recordcounts): the same
    count as PySpark's Observation, in a streaming task in a fraction of its round trips. Both
    ways observe once first (the task's lookups; the JVM classes PySpark's own way looks up),
    so that the count does not depend on what ran in this process before."""
    fast, public = task_context(spark, tmp_path, {}), task_context(spark, tmp_path, None)
    for ctx in (fast, public):
        warm, count = classic.observe_rows(ctx, spark.range(3))
        warm.write.format("noop").mode("overwrite").save()
        assert count.rows() == 3
    trips = {}
    for name, ctx in (("task", fast), ("public", public)):
        df = spark.range(7).where("id % 2 = 0")
        with RoundTrips() as observing:
            observed, count = classic.observe_rows(ctx, df)
        observed.write.format("noop").mode("overwrite").save()
        with RoundTrips() as reading:
            assert count.rows() == 4
        trips[name] = observing.count + reading.count
    # 7 against 30 in a process that ran nothing else, 20 after other modules' sessions (PySpark
    # caches some of its lookups per JVM)
    assert trips["task"] <= 8 and trips["task"] * 2 < trips["public"], trips
