"""Delta tables on a TaskManager's real PySpark (taskmanager/operators/delta.py,
taskmanager/streaming/delta.py): a bounded read splits a version's files across subtasks and
takes partition values from the log; a stream batch reads exactly its range's files; the sink
stages Parquet that the JobManager's commit makes a table other engines read, timestamps as
timestamps."""

from __future__ import annotations

import datetime as dt
import os
import sys

import polars
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import BatchInput
from funke.jobmanager import deltatables
from funke.taskmanager.operators import OPERATORS
from funke.taskmanager.operators.context import RuntimeContext
from funke.taskmanager.streaming import operator


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("funke-test-delta")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def ctx(spark, tmp_path, subtask=0, parallelism=1, batch=None, attempt=0) -> RuntimeContext:
    return RuntimeContext(spark=spark, job_id="job-1", vertex_id="v", subtask_index=subtask, parallelism=parallelism,
                          attempt_number=attempt, data_dir=str(tmp_path / "data"), batch=batch)


def test_a_bounded_read_splits_the_versions_files_and_adds_partition_values(spark, tmp_path):
    path = str(tmp_path / "t")
    day = dt.date(2024, 5, 1)
    write_deltalake(path, pa.table({"n": pa.array([1, 2, 3], pa.int64()), "p": ["a b", "c/d", "a b"],
                                    "d": [day, day, None]}), partition_by=["p", "d"])
    write_deltalake(path, pa.table({"n": pa.array([4], pa.int64()), "p": ["e"], "d": [day]}), mode="append",
                    partition_by=["p", "d"])
    spec = OperatorSpec("source.delta", "delta", {"path": path, "version": 0})
    shares = [OPERATORS["source.delta"](ctx(spark, tmp_path, s, 2), spec).collect() for s in range(2)]
    assert all(shares)  # both subtasks read some of version 0's files
    rows = sorted((r.n, r.p, r.d) for share in shares for r in share)
    assert rows == [(1, "a b", day), (2, "c/d", day), (3, "a b", None)]  # version 0 only, values from the log
    assert [f.name for f in OPERATORS["source.delta"](ctx(spark, tmp_path), spec).schema.fields] == ["n", "p", "d"]
    latest = OPERATORS["source.delta"](ctx(spark, tmp_path), OperatorSpec("source.delta", "delta", {"path": path}))
    latest = latest.collect()
    assert sorted(r.n for r in latest) == [1, 2, 3, 4]


def test_a_table_with_column_mapping_is_refused_at_read(spark, tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"n": [1]}), configuration={
        "delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"})
    with pytest.raises(ValueError, match="column mapping"):
        OPERATORS["source.delta"](ctx(spark, tmp_path), OperatorSpec("source.delta", "delta", {"path": path}))


def test_a_stream_batch_reads_exactly_its_ranges_files(spark, tmp_path):
    path = str(tmp_path / "t")
    for rows in ([1, 2], [3], [4, 5]):
        write_deltalake(path, pa.table({"n": pa.array(rows, pa.int64())}), mode="append")
    read = operator("source.stream.delta")
    spec = OperatorSpec("source.stream.delta", "delta", {"path": path})

    def batch(start, end, subtask=0, parallelism=1):
        b = BatchInput(0, 0, {"v": SourceRange(start, end, 0)})
        return sorted(r.n for r in read(ctx(spark, tmp_path, subtask, parallelism, b), spec).collect())

    assert batch(None, 0) == [1, 2]  # the first batch: the snapshot at its end
    assert batch(None, 2) == [1, 2, 3, 4, 5]
    assert batch(0, 2) == [3, 4, 5]  # the versions after the start
    assert batch(1, 1) == []
    assert sorted(batch(0, 2, 0, 2) + batch(0, 2, 1, 2)) == [3, 4, 5] and batch(0, 2, 1, 2) == [4, 5]


def test_the_sink_stages_what_the_commit_makes_a_table_other_engines_read(spark, tmp_path):
    target = str(tmp_path / "out")
    spec = OperatorSpec("sink.delta", "delta", {"path": target, "mode": "append"})
    df = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string").selectExpr(
        "n", "s", "timestamp_millis(n * 1000) AS ts", "CAST(n AS DECIMAL(10, 2)) AS amount")
    for subtask in range(2):
        OPERATORS["sink.delta"](ctx(spark, tmp_path, subtask, 2), spec, df.where(f"n % 2 = {subtask}"))
    assert deltatables.commit_job(target, "job-1", {0: 0, 1: 0}, "append") == 2
    table = DeltaTable(target)
    assert [f.type.type for f in table.schema().fields] == ["integer", "string", "timestamp", "decimal(10,2)"]
    got = polars.read_delta(target).sort("n")
    assert got["n"].to_list() == [1, 2] and got["s"].to_list() == ["a", "b"]
    assert got["ts"].to_list()[1].replace(tzinfo=None) == dt.datetime(1970, 1, 1, 0, 0, 2)
    assert deltatables.commit_job(target, "job-1", {0: 0, 1: 0}, "append") is None  # committed once
    bad = spark.createDataFrame([(1,)], "`a b` int")
    with pytest.raises(ValueError, match="column names"):
        OPERATORS["sink.delta"](ctx(spark, tmp_path), spec, bad)
