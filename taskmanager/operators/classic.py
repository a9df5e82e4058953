"""A streaming task's DataFrame calls on classic Spark, with few round trips to the JVM.

PySpark's Python side talks to the JVM over Py4J, one round trip per call, and several of its
calls make many: `createDataFrame` from Arrow asks for eight settings as a Java list (38 round
trips in all), `toArrow` for two (22), `functions.col` looks up the `functions` class by
reflection every time (13), and a list of columns or strings goes over element by element. A
round trip costs 0.05 ms on an idle JVM and up to 1 ms on one busy with the batch's own work; a
micro-batch of a source and an aggregate made about 170 of them, 10-20% of its time.

Here the same calls, made as PySpark makes them, with what does not change from batch to batch
built once for the task (`RuntimeContext.memo`): the JVM classes and settings looked up once, the
column lists of a group-by, a projection or a UDF's arguments built once, and the parts of an
observation that counts rows (`observe_rows`, how records are counted where nothing else knows
them: `funke.taskmanager.recordcounts`). The settings a result depends on (the session's time
zone, large Arrow types) are still read for every call.

Only a streaming task keeps a memo; a bounded task, Spark Connect (no `_jdf`), encrypted Spark
I/O (PySpark then sends Arrow through a socket server, not a file) or a PySpark whose internals
differ take the public API, which gives the same DataFrames and tables.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from funke.taskmanager.operators.context import RuntimeContext, column_ref

log = logging.getLogger(__name__)

__all__ = ["RowsObserved", "frame_from_arrow", "frame_to_arrow", "grouped_aggregate", "is_projection", "observe_rows",
           "select_exprs"]

_KEY = "classic spark"


class _Classic:
    """What one task looks up once in a classic session's JVM."""

    def __init__(self, spark: Any) -> None:
        from pyspark.errors.exceptions.captured import unwrap_spark_exception
        from pyspark.serializers import CPickleSerializer
        from pyspark.sql.classic.column import _to_seq
        from pyspark.sql.pandas.serializers import ArrowCollectSerializer, ArrowStreamSerializer
        from pyspark.sql.pandas.types import _check_arrow_table_timestamps_localize, to_arrow_schema
        from pyspark.util import _load_from_socket

        sc = spark.sparkContext
        if sc._encryption_enabled:
            raise AttributeError("encrypted I/O: PySpark sends Arrow to the JVM through a socket server")
        self.spark = spark
        self.jsession = spark._jsparkSession
        self.jconf = self.jsession.sessionState().conf()
        self.sql_utils = spark._jvm.org.apache.spark.sql.api.python.PythonSQLUtils
        self.temp_dir = sc._temp_dir
        self.max_records_per_batch = int(self.jconf.arrowMaxRecordsPerBatch())
        self.seq = lambda values: _to_seq(sc, values)
        self.localize = _check_arrow_table_timestamps_localize
        self.to_arrow_schema = to_arrow_schema
        self.load_from_socket = _load_from_socket
        self.collect_serializer = ArrowCollectSerializer
        self.stream_serializer = ArrowStreamSerializer
        self.unwrap = unwrap_spark_exception
        self.kept: dict[Any, Any] = {}  # the column lists built once
        # DataFrame.observe's parts (pyspark/sql/observation.py): the JVM's Observation class, a
        # count of the rows, and how an observed row comes back
        self.observation = getattr(spark._jvm, "org.apache.spark.sql.Observation")
        self.count_rows = (F.count(F.lit(1)).alias("rows")._jc, _to_seq(sc, []))
        self.row_serializer = CPickleSerializer()


def _classic(ctx: RuntimeContext) -> _Classic | None:
    memo = ctx.memo
    if memo is None:
        return None
    if _KEY not in memo:
        try:
            memo[_KEY] = _Classic(ctx.spark) if hasattr(ctx.spark, "_jsparkSession") else None
        except (AttributeError, ImportError, TypeError) as e:
            log.info("the tasks' DataFrame calls take PySpark's public API: %s", e)
            memo[_KEY] = None
    return memo[_KEY]


def _arrow_schema(classic: _Classic, schema: StructType) -> pa.Schema:
    return classic.to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                                   prefers_large_types=bool(classic.jconf.arrowUseLargeVarTypes()))


def frame_from_arrow(ctx: RuntimeContext, table: pa.Table, schema: StructType) -> DataFrame:
    """`spark.createDataFrame(table, schema=schema)`: the table's timestamps localized and its
    columns cast to the schema's Arrow types, written to a file in the session's temporary
    directory as an Arrow stream of record batches, which the JVM reads into a local relation."""
    classic = _classic(ctx)
    if classic is None:
        return ctx.spark.createDataFrame(table, schema=schema)
    if schema.fields:  # a table without columns keeps its row count uncast
        table = classic.localize(table, schema, True, classic.jconf.sessionLocalTimeZone()).cast(
            _arrow_schema(classic, schema))
    fd, path = tempfile.mkstemp(dir=classic.temp_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            classic.stream_serializer().dump_stream(table.to_batches(max_chunksize=classic.max_records_per_batch), out)
        batches = classic.sql_utils.readArrowStreamFromFile(path)
    finally:
        os.unlink(path)
    return DataFrame(classic.sql_utils.toDataFrame(batches, schema.json(), classic.jsession), classic.spark)


def frame_to_arrow(ctx: RuntimeContext, df: DataFrame) -> pa.Table:
    """`df.toArrow()`: Spark runs the DataFrame and serves its rows as Arrow record batches on a
    local socket; an error of the job (a user function's, with its traceback) is raised as
    PySpark raises it."""
    classic = _classic(ctx)
    if classic is None or not hasattr(df, "_jdf"):
        return df.toArrow()
    schema = _arrow_schema(classic, df.schema)
    served = df._jdf.collectAsArrowToPython()  # a Java array: one round trip per element read
    port, secret, server = served[0], served[1], served[2]
    try:
        with classic.load_from_socket((port, secret), classic.collect_serializer()) as stream:
            batches = list(stream)
    finally:
        with classic.unwrap():
            server.getResult()  # the serving thread's end, and the job's error if it failed
    return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()


def grouped_aggregate(ctx: RuntimeContext, df: DataFrame, keys: Sequence[str], aggregations: Sequence[str]) -> DataFrame:
    """`df.groupBy(*keys).agg(*aggregations)` (the keys column names, the aggregations SQL
    expressions such as "sum(x) AS total")."""
    classic = _classic(ctx)
    if classic is None or not hasattr(df, "_jdf") or not aggregations:
        return df.groupBy(*[column_ref(k) for k in keys]).agg(*[F.expr(a) for a in aggregations])
    memo_key = ("groupBy.agg", tuple(keys), tuple(aggregations))
    built = classic.kept.get(memo_key)
    if built is None:
        columns = [F.expr(a)._jc for a in aggregations]
        built = classic.kept[memo_key] = (classic.seq([column_ref(k)._jc for k in keys]), columns[0],
                                          classic.seq(columns[1:]))
    by, first, rest = built
    return DataFrame(df._jdf.groupBy(by).agg(first, rest), classic.spark)


def select_exprs(ctx: RuntimeContext, df: DataFrame, exprs: Sequence[str]) -> DataFrame:
    """`df.selectExpr(*exprs)`."""
    classic = _classic(ctx)
    if classic is None or not hasattr(df, "_jdf"):
        return df.selectExpr(*exprs)
    memo_key = ("selectExpr", tuple(exprs))
    seq = classic.kept.get(memo_key)
    if seq is None:
        seq = classic.kept[memo_key] = classic.seq(list(exprs))
    return DataFrame(df._jdf.selectExpr(seq), classic.spark)


class RowsObserved:
    """The rows an observation counted (`observe_rows`), once the action that ran them ended."""

    __slots__ = ("_observation", "_jobservation", "_classic")

    def __init__(self, observation: Observation | None = None, jobservation: Any = None,
                 classic: _Classic | None = None) -> None:
        self._observation = observation
        self._jobservation = jobservation
        self._classic = classic

    def rows(self) -> int | None:
        """The count, once the action that runs the observed rows has ended: call only then.
        None when Spark planned the rows away (an input it knew empty, a join with an empty
        side: the observation then ends without a count), or when no action ran them at all
        (classic Spark fills an observation as its action ends: one not filled a moment after
        never is, and waiting for it would never end)."""
        try:
            jobservation = self._jobservation
            if jobservation is None:
                jobservation = getattr(self._observation, "_jo", None)  # None on Spark Connect: filled with its action
            if jobservation is not None and not _filled(jobservation):
                log.warning("an observation of the rows was not filled by the action that ended: not counted")
                return None
            if self._observation is not None:
                return int(self._observation.get["rows"])
            classic = self._classic
            assert classic is not None
            row = classic.row_serializer.loads(classic.sql_utils.toPyRow(jobservation.getRow()))
            return int(row[0])
        except Exception:  # Py4JJavaError: the metrics row is empty
            return None


OBSERVATION_WAIT_S = 2.0


def _filled(jobservation: Any) -> bool:
    """Whether the JVM's observation has its metrics (waiting up to OBSERVATION_WAIT_S for a
    Spark that fills it after its action returned)."""
    deadline = time.monotonic() + OBSERVATION_WAIT_S
    while not jobservation.future().isCompleted():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def observe_rows(ctx: RuntimeContext, df: DataFrame) -> tuple[DataFrame, RowsObserved]:
    """`df.observe(Observation(), count(1))`: `df` with its rows counted while the action that
    runs them runs, not by a Spark job of its own. In a streaming task on classic Spark with the
    JVM's parts looked up once for the task: two round trips to observe, two to read the count
    (PySpark's own way takes a dozen)."""
    classic = _classic(ctx)
    if classic is None or not hasattr(df, "_jdf"):
        observation = Observation()
        return df.observe(observation, F.count(F.lit(1)).alias("rows")), RowsObserved(observation)
    jobservation = classic.observation()
    count, rest = classic.count_rows
    observed = DataFrame(df._jdf.observe(jobservation, count, rest), classic.spark)
    return observed, RowsObserved(None, jobservation, classic)


def is_projection(df: DataFrame, of: DataFrame) -> bool:
    """Whether Spark's analyzed plan of `df` is a projection of `of`'s, which makes one row of
    each row (a select of columns and expressions; not one with a generator such as explode,
    whose projection stands on a Generate, nor an aggregate). False when that cannot be told
    (Spark Connect has no plan here)."""
    if not hasattr(df, "_jdf") or not hasattr(of, "_jdf"):
        return False
    try:
        plan = df._jdf.queryExecution().analyzed()
        return str(plan.nodeName()) == "Project" and bool(plan.child().sameResult(of._jdf.queryExecution().analyzed()))
    except Exception:  # a PySpark whose internals differ
        return False
