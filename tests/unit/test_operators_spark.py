"""Each operator (funke.taskmanager.operators: sources, transforms, sinks and the Python UDF runtime)
on tiny data, on a real local SparkSession, run alone in an operator's context (the `ctx` fixture
of tests/unit/test_task_runtime.py)."""

from __future__ import annotations

import csv
import datetime
import io
import json
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from funke.common import layout
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.operators import CATALOGUE
from funke.taskmanager import streaming
from funke.taskmanager.operators import OPERATORS
from funke.taskmanager.operators.context import RuntimeContext
from tests.unit.test_task_runtime import op
from tests.unit.test_task_runtime import ctx, spark  # noqa: F401  (fixtures)

# The functions below are shipped to Python workers; by value, so workers need not import tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---- (g) each operator on tiny data ----


def rows_of(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def test_every_catalogue_kind_has_an_implementation():
    # stream sources are the streaming registry's, every other kind operators.OPERATORS'
    assert {k for k in CATALOGUE if streaming.operator(k) is not None} == set(CATALOGUE)
    assert set(OPERATORS) | set(streaming.TASK_SOURCES) == set(CATALOGUE)


def test_map_flat_map_filter_calling_convention(spark, ctx):
    people = spark.createDataFrame([(1, "ada"), (2, "bob"), (3, "cy")], "n int, name string")
    names = spark.createDataFrame([("ada",), ("bob",)], "name string")

    def apply(kind, df, fn, **config):
        return rows_of(OPERATORS[kind](ctx, op(kind, fn, **config), [df]))

    # several columns in: a Row; tuple, dict and Row results
    assert apply("map", people, lambda r: (r.n * 10, r.name.upper()), schema="n int, name string") == \
        [(10, "ADA"), (20, "BOB"), (30, "CY")]
    assert apply("map", people, lambda r: {"len": len(r.name), "n": r.n}, schema="n int, len int") == \
        [(1, 3), (2, 3), (3, 2)]
    assert apply("map", people, lambda r: Row(x=float(r.n)), schema="x double") == [(1.0,), (2.0,), (3.0,)]
    # one column in: the bare value; one atomic column out: the bare value
    assert apply("map", names, len, schema="n int") == [(3,), (3,)]
    # one array column out: a list is the value, not a row
    assert apply("map", names, list, schema="letters array<string>") == [(["a", "d", "a"],), (["b", "o", "b"],)]
    assert apply("flat_map", names, lambda s: [(s, i) for i in range(len(s) - 1)], schema="s string, i int") == \
        [("ada", 0), ("ada", 1), ("bob", 0), ("bob", 1)]
    assert apply("flat_map", people, lambda r: [] if r.n == 2 else [r.n], schema="n int") == [(1,), (3,)]
    filtered = OPERATORS["filter"](ctx, op("filter", lambda r: r.n != 2), [people])
    assert filtered.schema == people.schema and rows_of(filtered) == [(1, "ada"), (3, "cy")]


def test_python_workers_do_not_need_funke(tmp_path):
    # What mapInArrow ships must unpickle where only pyspark, pyarrow and cloudpickle exist
    # (a Spark Connect server, a cluster's executors).
    from pyspark import cloudpickle as spark_cloudpickle

    from funke.taskmanager.operators import udf

    schema = pa.schema([("n", pa.int64())])
    shipped = tmp_path / "fn.pkl"
    shipped.write_bytes(spark_cloudpickle.dumps(
        udf.map_batches(cloudpickle.dumps(lambda n: n * 2), schema, "double", flat=False)))
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    probe = (
        f"import sys; sys.path += {site_packages!r}\n"
        "import importlib.util, pickle, pyarrow as pa\n"
        "assert importlib.util.find_spec('funke') is None\n"
        f"fn = pickle.loads(open({str(shipped)!r}, 'rb').read())\n"
        "print(next(fn(iter([pa.record_batch([pa.array([1, 2])], names=['n'])]))).to_pydict())\n"
    )
    # -S: no site processing, so the editable install's path hook for funke is not there.
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'n': [2, 4]}"


def test_plain_tuple_results_take_the_fast_path_and_give_what_the_row_by_row_path_gives():
    from funke.taskmanager.operators.udf import RowWriter

    schema = pa.schema([("n", pa.int64()), ("bucket", pa.int32()), ("name", pa.string())])
    writer = RowWriter(schema, "widen")
    tuples = [(1, 2, "a"), (None, 3, None), (2**40, -1, "ü")]
    fast = writer.batch_of_results(tuples)
    assert fast.schema == schema and fast.to_pylist() == writer.batch([writer.values(r) for r in tuples]).to_pylist()
    # lists, dicts and Rows are normalised row by row, to the same rows
    mixed = [[1, 2, "a"], {"name": None, "n": None, "bucket": 3}, Row(n=2**40, bucket=-1, name="ü")]
    assert writer.batch_of_results(mixed).to_pylist() == fast.to_pylist()
    # what does not fit is named: the operator, and the column or the row
    with pytest.raises(TypeError, match="widen: column 'bucket' \\(int32\\)"):
        writer.batch_of_results([(1, 2**40, "a")])
    with pytest.raises(ValueError, match="widen: result \\(1, 2\\) has 2 value"):
        writer.batch_of_results([(1, 2, "a"), (1, 2)])
    assert writer.batch_of_results([]).num_rows == 0


def test_map_result_that_does_not_fit_the_schema_names_the_operator(spark, ctx):
    df = spark.createDataFrame([(1, "a")], "n int, s string")
    bad = OPERATORS["map"](ctx, op("map", lambda r: (1, 2, 3), name="widen", schema="n int, s string"), [df])
    with pytest.raises(Exception, match="widen"):
        bad.collect()


def test_select_where_aggregate_count(spark, ctx):
    df = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3), ("c", None)], "k string, v int")
    assert rows_of(OPERATORS["select"](ctx, op("select", exprs=["upper(k) as K", "v * 2 as d"]), [df])) == \
        sorted([("A", 2), ("B", 4), ("A", 6), ("C", None)], key=lambda t: (t[0], t[1] or 0))
    assert rows_of(OPERATORS["where"](ctx, op("where", condition="v >= 2"), [df])) == [("a", 3), ("b", 2)]
    aggregated = OPERATORS["aggregate"](ctx, op("aggregate", keys=["k"], aggregations=["sum(v) as total", "count(v) as n"]), [df])
    assert aggregated.columns == ["k", "total", "n"]
    assert rows_of(aggregated) == [("a", 4, 2), ("b", 2, 1), ("c", None, 0)]
    assert rows_of(OPERATORS["count"](ctx, op("count", keys=["k"]), [df])) == [("a", 2), ("b", 1), ("c", 1)]


def add_values(a, b):
    return Row(k=a.k, v=a.v + b.v)


def test_reduce_is_a_keyed_reduce(spark, ctx):
    df = spark.createDataFrame([(f"k{i % 4}", i) for i in range(40)], "k string, v bigint")
    reduced = OPERATORS["reduce"](ctx, op("reduce", add_values, keys=["k"]), [df])
    assert reduced.schema == df.schema
    assert rows_of(reduced) == [(f"k{j}", sum(i for i in range(40) if i % 4 == j)) for j in range(4)]
    # one column: bare values in and out
    words = spark.createDataFrame([("x",), ("y",), ("x",)], "w string")
    assert rows_of(OPERATORS["reduce"](ctx, op("reduce", lambda a, b: a, keys=["w"]), [words])) == [("x",), ("y",)]


def test_join_union_transform_noop(spark, ctx):
    left = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id int, l string")
    right = spark.createDataFrame([(2, "B"), (3, "C"), (4, "D")], "id int, r string")
    assert rows_of(OPERATORS["join"](ctx, op("join", on=["id"]), [left, right])) == [(2, "b", "B"), (3, "c", "C")]
    assert rows_of(OPERATORS["join"](ctx, op("join", on=["id"], how="left"), [left, right])) == \
        [(1, "a", None), (2, "b", "B"), (3, "c", "C")]
    flipped = spark.createDataFrame([("z", 9)], "l string, id int")
    unioned = OPERATORS["union"](ctx, op("union"), [left, flipped, left.limit(1)])
    assert unioned.columns == ["id", "l"] and rows_of(unioned) == [(1, "a"), (1, "a"), (2, "b"), (3, "c"), (9, "z")]
    transformed = OPERATORS["transform"](ctx, op("transform", lambda df: df.withColumn("x", F.col("id") + 1)), [left])
    assert rows_of(transformed) == [(1, "a", 2), (2, "b", 3), (3, "c", 4)]
    assert rows_of(OPERATORS["noop"](ctx, op("noop"), [left])) == rows_of(left)


def square(i):
    return (i, i * i, f"#{i}")


def test_range_shares_and_generator(spark, ctx):
    def share(subtask, parallelism, spec):
        sub = RuntimeContext(spark, "j", "v", subtask, parallelism, 0, ctx.data_dir)
        return rows_of(OPERATORS["source.range"](sub, spec))

    plain = op("source.range", start=3, end=20, step=3)
    shares = [share(i, 4, plain) for i in range(4)]
    assert [r for s in shares for r in s] == [(i,) for i in range(3, 20, 3)]
    assert [len(s) for s in shares] == [1, 2, 1, 2]
    generated = op("source.range", square, end=10, step=2, schema="id bigint, sq bigint, label string")
    assert share(1, 2, generated) == [(4, 16, "#4"), (6, 36, "#6"), (8, 64, "#8")]
    assert share(5, 6, op("source.range", start=10, end=0, step=-4)) == [(2,)]


def test_collection_shares_and_json_coercion(spark):
    rows = [{"x": 1, "d": "2024-01-02", "tags": ["a"]}, [2.5, None, []], {"x": 3}]
    spec = op("source.collection", rows=rows, schema="x double, d date, tags array<string>")
    shares = [OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", i, 2, 0, "/unused"), spec).collect()
              for i in range(2)]
    assert [tuple(r) for s in shares for r in s] == [(1.0, datetime.date(2024, 1, 2), ["a"]), (2.5, None, []), (3.0, None, None)]
    assert [len(s) for s in shares] == [1, 2]
    empty = OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 5, 0, "/unused"), spec)
    assert empty.count() == 0 and empty.schema.names == ["x", "d", "tags"]


@pytest.mark.parametrize("schema, rows", [
    ("n bigint", [[2.0]]),                  # a float for a bigint
    ("n bigint", [[True]]),                 # a bool for a bigint
    ("s string", [[1]]),                    # a number for a string
    ("b binary", [["x"]]),                  # a string for binary
    ("n tinyint", [[300]]),                 # out of the type's range
    ("n bigint", [[2**63]]),                # out of bigint's
    ("x float", [[1.1]]),                   # rounded to a float
    ("n bigint not null", [[1], [None]]),   # a null where none may be
    ("n int, s string", [[1, "a"], {"s": "b"}, [None, None]]),
])
def test_a_collection_gives_what_spark_gives_for_the_same_rows(spark, schema, rows):
    """Plain columns reach Spark as Arrow: the rows, or the failure, are those of Spark's own
    conversion of the same rows."""
    from funke.taskmanager.operators.sources import _coerce_row

    def outcome(make):
        try:
            return [tuple(r) for r in make().collect()]
        except Exception as e:  # PySparkTypeError, PySparkValueError, ...
            return f"fails: {type(e).__name__}"

    parsed = StructType.fromDDL(schema)
    ours = outcome(lambda: OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 1, 0, "/unused"),
                                                          op("source.collection", rows=rows, schema=schema)))
    sparks = outcome(lambda: spark.createDataFrame([_coerce_row(r, parsed) for r in rows], parsed))
    assert ours == sparks


def test_a_plain_collection_reaches_spark_as_data_spark_can_size(spark):
    from funke.taskmanager import batchexchange

    spec = op("source.collection", rows=[[1, "a", 0.5, True], {"n": None, "s": None}], schema="n int, s string, x double, b boolean")
    df = OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 1, 0, "/unused"), spec)
    assert [tuple(r) for r in df.collect()] == [(1, "a", 0.5, True), (None, None, None, None)]
    assert batchexchange.estimated_bytes(df) is not None


def test_file_sources_split_by_file_and_keep_the_schema_for_empty_shares(spark, tmp_path):
    frame = spark.createDataFrame([(i, f"s{i}") for i in range(6)], "n bigint, s string").repartition(3)
    for fmt in ("parquet", "csv", "json", "text"):
        directory = str(tmp_path / fmt)
        out = frame.selectExpr("concat(n, ':', s) as value") if fmt == "text" else frame
        writer = out.write.format(fmt)
        (writer.option("header", "true") if fmt == "csv" else writer).save(directory)
        config = {"path": directory}
        if fmt == "csv":
            config["schema"] = "n bigint, s string"
        spec = OperatorSpec(f"source.{fmt}", "", config)
        shares = [OPERATORS[spec.kind](RuntimeContext(spark, "j", "v", i, 4, 0, "/unused"), spec) for i in range(4)]
        files = sorted(spark.read.format("text").load(directory).inputFiles())
        assert len(files) == 3
        assert [len(s.inputFiles()) for s in shares] == [1, 1, 1, 0], fmt
        assert len({s.schema.simpleString() for s in shares}) == 1, fmt
        everything = sorted(tuple(r) for s in shares for r in s.collect())
        if fmt == "text":
            assert everything == sorted((f"{i}:s{i}",) for i in range(6))
        else:
            assert everything == [(i, f"s{i}") for i in range(6)], fmt


def test_file_sinks_stage_their_format_and_refuse_a_non_empty_target(spark, ctx, tmp_path):
    df = spark.createDataFrame([(1, "a"), (2, None)], "n int, s string").coalesce(1)

    def sink(kind, target, **config):
        OPERATORS[kind](ctx, op(kind, path=str(target), **config), df)
        staging = Path(layout.sink_staging_dir(str(target), ctx.job_id, 0, 0))
        return [p for p in sorted(staging.iterdir()) if not p.name.startswith((".", "_"))]

    (parquet,) = sink("sink.parquet", tmp_path / "out.parquet")
    assert pq.read_table(parquet).to_pylist() == [{"n": 1, "s": "a"}, {"n": 2, "s": None}]
    (csv_file,) = sink("sink.csv", tmp_path / "out.csv")
    assert list(csv.reader(io.StringIO(csv_file.read_text()))) == [["n", "s"], ["1", "a"], ["2", ""]]
    (json_file,) = sink("sink.json", tmp_path / "out.json")
    assert [json.loads(line) for line in json_file.read_text().splitlines()] == [{"n": 1, "s": "a"}, {"n": 2}]
    (text_file,) = sink("sink.text", tmp_path / "out.txt")
    assert text_file.read_text().splitlines() == ["1\ta", "2\t"]
    assert not (tmp_path / "out.txt").exists()  # only the commit puts it there

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "old.csv").write_text("x\n")
    with pytest.raises(FileExistsError, match="taken"):
        sink("sink.csv", taken)
    assert len(sink("sink.csv", taken, mode="overwrite")) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(sink("sink.text", empty)) == 1


def test_collect_print_and_discard_sinks(spark, ctx, capsys):
    df = spark.createDataFrame([(1, "a")], "n int, s string")
    OPERATORS["sink.collect"](ctx, op("sink.collect"), df)
    staged = layout.sink_staging_dir(layout.collect_dir(ctx.data_dir, "job-g", "v"), "job-g", 0, 0)
    assert pq.read_table(staged).to_pylist() == [{"n": 1, "s": "a"}]
    OPERATORS["sink.print"](RuntimeContext(spark, "j", "v", 2, 3, 0, ctx.data_dir), op("sink.print"), df)
    assert capsys.readouterr().out == "3> Row(n=1, s='a')\n"
    OPERATORS["sink.discard"](ctx, op("sink.discard"), df)
