"""A TaskManager's first Spark work, done before any task needs it.

A fresh SparkSession's first job is slow: the JVM loads and compiles the classes of each kind of
plan, and the first Python UDF starts Spark's Python worker daemon and its first workers, which
import pyarrow and unpickle funke's operator runtime. On this project's 2-core machines that first
job takes about 9 s where the same job warm takes 0.5 s. Nobody waits for a bounded job's first
task as for a streaming query's batches: a TaskManager that takes over a query after a failure
would run its first batch that much later. So once its session is up, the TaskManager runs one
small job of each kind its tasks run (a range, a Python map over Arrow batches, a keyed
aggregate, a Parquet write and read, a collect as Arrow), in its own scratch directory, off its
event loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from funke.taskmanager import operators

log = logging.getLogger("funke.taskmanager")


def _identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def run(spark: SparkSession, scratch: str) -> float:
    """Runs the warm-up jobs; returns how long they took (s). Failures are logged, never raised:
    a TaskManager whose warm-up fails still runs tasks, only its first ones are slower."""
    started = time.monotonic()
    path = os.path.join(scratch, "warmup")
    try:
        df = spark.range(0, 1000, 1, 2).selectExpr("id AS value", "id % 7 AS key")
        mapped = df.mapInArrow(operators._cancellable(_identity, None), df.schema)
        counted = mapped.groupBy("key").agg({"value": "sum"})
        counted.write.mode("overwrite").parquet(path)
        spark.read.parquet(path).toArrow()
    except Exception as exc:  # e.g. the TaskManager stopped meanwhile
        log.info("Spark warm-up did not finish (%s: %s); the first tasks start cold", type(exc).__name__,
                 str(exc).splitlines()[0] if str(exc) else "")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return time.monotonic() - started
