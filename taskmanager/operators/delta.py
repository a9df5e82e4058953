"""Delta tables on a TaskManager: a bounded read of a table version (source.delta) and the Delta
sink's staging (sink.delta); the stream source reads through `read_files` too
(`funke.taskmanager.streaming.delta`).

source.delta: every subtask opens the table at the same version (the JobManager pins a read
that names none to the version at submit) and reads its share of the data files (file i of the
snapshot, by path, goes to subtask i % parallelism) with Spark's Parquet reader and the table's
schema; partition values come from the log, not from the files.

sink.delta: the subtask's rows as Parquet files (timestamps as microseconds, which every Delta
reader takes) in its staging directory; the JobManager commits them in one Delta transaction
(`funke.jobmanager.deltatables`): beside the table once a bounded job FINISHED, inside it per
batch of a streaming query.
"""

from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from funke.common import layout
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.sources.delta import DELTA_MODES, DataFile, share
from funke.runtime import deltalog
from funke.taskmanager.operators.classic import observe_rows
from funke.taskmanager.operators.context import RuntimeContext, column_ref, config_value, label

# What Delta (without column mapping) does not take in a column name.
_BAD_NAME_CHARACTERS = " ,;{}()\n\t="


def spark_schema(schema: dict) -> StructType:
    """A Delta schema (its JSON form: Spark's own StructType JSON) as Spark's type."""
    return StructType.fromJson(schema)


def read_files(ctx: RuntimeContext, table: str, files: Sequence[DataFile], schema: dict,
               partition_columns: Sequence[str]) -> DataFrame:
    """The rows of some data files of a table, in the columns of its schema: the Parquet files
    read with the data columns, each file's partition values added from the log."""
    from pyspark.sql import functions as F

    whole = spark_schema(schema)
    if not files:
        return ctx.spark.createDataFrame([], whole)
    partitioned = set(partition_columns)
    data = StructType([f for f in whole.fields if f.name not in partitioned])
    groups: dict[tuple, list[str]] = defaultdict(list)
    for f in files:
        groups[f.partition_values].append(os.path.join(table, f.path))
    parts = []
    for values, paths in groups.items():
        df = ctx.spark.read.schema(data).parquet(*paths)
        given = dict(values)
        columns = [F.lit(given.get(c.name)).cast(c.dataType).alias(c.name) if c.name in partitioned
                   else column_ref(c.name) for c in whole.fields]
        parts.append(df.select(*columns))
    return functools.reduce(DataFrame.unionAll, parts)


def read_table(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """source.delta: this subtask's share of the table version's data files."""
    path = str(config_value(spec, "path"))
    config: dict = dict(spec.config)
    version = deltalog.resolve_version(path, config.get("version"), config.get("timestamp"))
    table = deltalog.open_table(path, version)
    files = deltalog.snapshot_files(path, table)
    return read_files(ctx, deltalog.table_dir(path), share(files, ctx.subtask_index, ctx.parallelism),
                      deltalog.schema_json(table), deltalog.partition_columns(table))


def write(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    """sink.delta: stage the subtask's rows for the JobManager's Delta commit."""
    target = deltalog.table_dir(str(config_value(spec, "path")))
    mode = str(spec.config.get("mode", "append"))
    if mode not in DELTA_MODES:
        raise ValueError(f"{label(spec)}: mode {mode!r} is not one of {', '.join(DELTA_MODES)}")
    bad = [f.name for f in df.schema.fields if any(c in f.name for c in _BAD_NAME_CHARACTERS) or not f.name]
    if bad:
        raise ValueError(f"{label(spec)}: column names {json.dumps(bad[:10])} hold characters a Delta table's "
                         f"columns may not ({_BAD_NAME_CHARACTERS!r}); rename them with select(...)")
    if ctx.batch is not None:
        staging = layout.stream_sink_staging_dir(target, ctx.job_id, ctx.batch.batch_id, ctx.subtask_index,
                                                 ctx.attempt_number)
    else:
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
    if ctx.written is not None:  # the records it writes, counted as Spark writes them
        df, ctx.written.observed = observe_rows(ctx, df)
    (df.write.mode("overwrite")
        .option("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # not Spark's INT96
        .parquet(staging))
