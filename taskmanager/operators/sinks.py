"""Sinks: `(ctx, spec, df) -> None`, run the pipeline and stage the output.

File sinks stage the subtask's output beside the target (`layout.sink_staging_dir`); the
JobManager commits it when the job FINISHED. Mode "error" (the default) fails before running
anything when the target already holds data; "overwrite" lets the commit replace it. sink.text
writes one string column as is, several as tab-separated text (null: an empty field). sink.noop
plans the pipeline but runs nothing.

In a streaming query (`RuntimeContext.batch`) file, collect, redis and kafka sinks stage the batch
inside the target (`layout.stream_sink_staging_dir`) for the JobMaster's commit (a bounded job's
kafka sink stages as a file sink does, and is produced when the job FINISHED); print shows the first
rows of each batch; foreach_batch hands the batch to the user's function.

Each sink counts the records it writes into `RuntimeContext.written` (its numRecordsOut): the
rows it staged in memory or printed, or an observation of Spark's write (`_counted`), never a
pass of its own. foreach_batch and noop count nothing (what runs is the user's, or nothing).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType

from funke.common import layout
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.graph.operators import SINK_MODES
from funke.common.streaming import kafkasink
from funke.runtime import datafs
from funke.taskmanager import batchexchange
from funke.taskmanager.operators.classic import frame_to_arrow, observe_rows
from funke.taskmanager.operators.delta import write as _delta_sink
from funke.taskmanager.operators.context import (
    RuntimeContext,
    Sink,
    arrow_compatible,
    column_ref,
    config_options,
    config_value,
    file_info,
    label,
)

__all__ = ["SINKS"]

PRINT_ROWS_PER_BATCH = 10  # a streaming query's print sink: rows shown per batch (Spark Streaming's print())


def _check_target(spec: OperatorSpec, target: str) -> None:
    """Mode "error": fail before running anything if the target already holds data. Best
    effort: a filesystem pyarrow cannot reach is left to the commit, which checks again."""
    info = file_info(target)
    if info is None or info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.Directory:
        parsed = urlparse(target)
        if parsed.scheme in ("", "file"):
            local = os.path.abspath(parsed.path if parsed.scheme == "file" else target)
            with os.scandir(local) as entries:
                empty = next(entries, None) is None
        else:
            fs, inner = datafs.filesystem(target)
            empty = not fs.get_file_info(pafs.FileSelector(inner, recursive=False))
        if empty:
            return
    raise FileExistsError(
        f"{label(spec)}: target {target} already exists and is not empty; "
        "set mode 'overwrite' to replace it, or write somewhere else"
    )


def _file_sink(fmt: str, defaults: dict[str, str] | None = None,
               prepare: Callable[[DataFrame], DataFrame] | None = None) -> Sink:
    def write(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
        target = str(config_value(spec, "path"))
        out = prepare(df) if prepare else df
        options = config_options(spec, defaults)
        if ctx.batch is not None:
            # A streaming query: the target collects batch after batch; each batch is staged inside
            # it and committed once by the JobMaster (funke.jobmanager.streamsinks).
            staging = layout.stream_sink_staging_dir(target, ctx.job_id, ctx.batch.batch_id, ctx.subtask_index,
                                                     ctx.attempt_number)
            if fmt != "parquet" or not _staged_in_memory(ctx, out, staging, options):
                _counted(ctx, out).write.format(fmt).options(**options).mode("overwrite").save(staging)
            return
        writer = _counted(ctx, out).write.format(fmt).options(**options).mode("overwrite")
        mode = str(spec.config.get("mode", "error"))
        if mode not in SINK_MODES:
            raise ValueError(f"{label(spec)}: mode {mode!r} is not one of {', '.join(SINK_MODES)}")
        if mode == "error":
            _check_target(spec, target)
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
        # overwrite: the staging directory belongs to this attempt alone; the target is only
        # touched by the commit once the job FINISHED.
        writer.save(staging)

    return write


def _staged_in_memory(ctx: RuntimeContext, df: DataFrame, staging: str, options: dict[str, Any]) -> bool:
    """A small micro-batch's Parquet output, collected as Arrow on the TaskManager and written as
    one file into `staging` (Spark's writer, its job and commit protocol, costs 50-100 ms however
    few rows); False, having written nothing, when the batch is not small
    (`batchexchange.ONE_PARTITION_LIMIT_BYTES` read) or Spark's writer is needed: options other
    than the compression, a codec pyarrow lacks, Spark's legacy (Hive) layout, columns Arrow
    cannot carry or that pyarrow would store otherwise than Spark (timestamps without a time
    zone). The file is what Spark's writer would store: timestamps as
    `spark.sql.parquet.outputTimestampType` says (INT96 or TIMESTAMP_MICROS), no Arrow schema of
    its own."""
    if ctx.meter is None or ctx.meter.bytes > batchexchange.ONE_PARTITION_LIMIT_BYTES:
        return False
    if set(options) - {"compression"}:
        return False
    conf = _writer_conf(ctx)
    codec = str(options.get("compression") or conf["codec"]).strip().lower()
    compression = _ARROW_CODECS.get(codec)
    timestamps = conf["timestamps"].strip().upper()
    if compression is None or timestamps not in ("INT96", "TIMESTAMP_MICROS") or conf["legacy"].strip().lower() == "true":
        return False
    if "timestamp_ntz" in df.schema.simpleString() or not arrow_compatible(df.schema):
        return False
    int96 = timestamps == "INT96"
    name = f"part-00000-{uuid.uuid4()}{'' if compression == 'none' else '.' + codec}.parquet"  # as Spark names it
    table = frame_to_arrow(ctx, df)
    batchexchange.write_table_file(staging, table, name,
                                   compression=compression, store_schema=False,
                                   use_deprecated_int96_timestamps=int96, coerce_timestamps=None if int96 else "us")
    if ctx.written is not None:
        ctx.written.rows = table.num_rows
    return True


def _counted(ctx: RuntimeContext, df: DataFrame) -> DataFrame:
    """`df`, its rows counted into `ctx.written` while Spark's writer writes them."""
    if ctx.written is None:
        return df
    df, ctx.written.observed = observe_rows(ctx, df)
    return df


def _writer_conf(ctx: RuntimeContext) -> dict[str, str]:
    """The session's Parquet writer settings the in-memory write follows (read once per task)."""
    memo = ctx.memo if ctx.memo is not None else {}
    conf = memo.get("parquet writer conf")
    if conf is None:
        get = ctx.spark.conf.get
        conf = memo["parquet writer conf"] = {
            "codec": str(get("spark.sql.parquet.compression.codec", "snappy")),
            "timestamps": str(get("spark.sql.parquet.outputTimestampType", "INT96")),
            "legacy": str(get("spark.sql.parquet.writeLegacyFormat", "false")),  # Hive's layout: Spark writes it
        }
    return conf


# Spark's Parquet codec names -> pyarrow's (lzo has no pyarrow writer: Spark's writer gets it).
_ARROW_CODECS = {"none": "none", "uncompressed": "none", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd",
                 "brotli": "brotli", "lz4": "lz4", "lz4_raw": "lz4"}


def _as_text(df: DataFrame) -> DataFrame:
    fields = df.schema.fields
    if len(fields) == 1 and isinstance(fields[0].dataType, StringType):
        return df
    # A null becomes an empty field, so that columns stay aligned (concat_ws would drop it).
    columns = [F.coalesce(column_ref(f.name).cast("string"), F.lit("")) for f in fields]
    return df.select(F.concat_ws("\t", *columns).alias("value"))


def _collect(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    target = layout.collect_dir(ctx.data_dir, ctx.job_id, ctx.vertex_id)
    if ctx.batch is not None:  # a streaming query: a memory sink of committed batches
        staging = layout.stream_sink_staging_dir(target, ctx.job_id, ctx.batch.batch_id, ctx.subtask_index,
                                                 ctx.attempt_number)
    else:
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
    if not _staged_in_memory(ctx, df, staging, {}):  # a bounded job's (no meter) goes to Spark's writer
        _counted(ctx, df).write.mode("overwrite").parquet(staging)


def _print(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    prefix = f"{ctx.subtask_index + 1}> "  # Flink's print sink: "subtask> record"
    if ctx.batch is not None:
        # A streaming query: Spark Streaming's print(), per batch and subtask: the batch time and
        # the first rows.
        rows = df.take(PRINT_ROWS_PER_BATCH + 1)
        rule = "-------------------------------------------\n"
        lines = [rule, f"{prefix}Time: {ctx.batch.batch_time_ms} ms (batch {ctx.batch.batch_id})\n", rule]
        lines += [f"{prefix}{row}\n" for row in rows[:PRINT_ROWS_PER_BATCH]]
        lines += [f"{prefix}...\n"] if len(rows) > PRINT_ROWS_PER_BATCH else []
        sys.stdout.write("".join(lines) + "\n")
        sys.stdout.flush()
        if ctx.written is not None:
            ctx.written.rows = min(len(rows), PRINT_ROWS_PER_BATCH)
        return
    collected = df.collect()
    lines = [f"{prefix}{row}\n" for row in collected]
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
    if ctx.written is not None:
        ctx.written.rows = len(collected)


def _redis_sink(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    """Stages the batch's rows; the JobMaster appends them to the stream key in one transaction
    (funke.jobmanager.redissink)."""
    if ctx.batch is None:
        raise ValueError(f"{label(spec)} is a sink of streaming queries: it runs in their micro-batches")
    target = layout.redis_sink_dir(ctx.data_dir, ctx.job_id, ctx.vertex_id)
    staging = layout.stream_sink_staging_dir(target, ctx.job_id, ctx.batch.batch_id, ctx.subtask_index,
                                             ctx.attempt_number)
    if not _staged_in_memory(ctx, df, staging, {}):
        _counted(ctx, df).write.mode("overwrite").parquet(staging)


def _kafka_sink(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    """Stages the rows' value (and key) columns, as `value` (and `key`); the JobMaster produces
    them into the topic: per batch of a streaming query, or once a bounded job FINISHED
    (funke.jobmanager.kafkasink). A column that is missing, or neither string nor binary, fails
    the task before anything is staged, naming it and the stream's columns."""
    types = {f.name: f.dataType for f in df.schema.fields}
    wanted = [(kafkasink.VALUE_COLUMN, str(config_value(spec, "value")))]
    if spec.config.get("key") is not None:
        wanted.append((kafkasink.KEY_COLUMN, str(spec.config["key"])))
    problems = []
    for role, name in wanted:
        if name not in types:
            problems.append(f"the {role} column {name!r} is not a column of the stream "
                            f"(its columns: {', '.join(types) or 'none'})")
        elif not isinstance(types[name], (StringType, BinaryType)):
            problems.append(f"the {role} column {name!r} is {types[name].simpleString()}; a Kafka record's "
                            f"{role} is a string or binary column (cast it, or encode it with to_json(...))")
    if problems:
        raise ValueError(f"{label(spec)}: {'; '.join(problems)}")
    out = df.select(*[column_ref(name).alias(role) for role, name in wanted])
    target = layout.kafka_sink_dir(ctx.data_dir, ctx.job_id, ctx.vertex_id)
    if ctx.batch is not None:
        staging = layout.stream_sink_staging_dir(target, ctx.job_id, ctx.batch.batch_id, ctx.subtask_index,
                                                 ctx.attempt_number)
    else:  # a bounded job's: committed when it FINISHED (funke.jobmanager.committer)
        staging = layout.sink_staging_dir(target, ctx.job_id, ctx.subtask_index, ctx.attempt_number)
    if not _staged_in_memory(ctx, out, staging, {}):
        _counted(ctx, out).write.mode("overwrite").parquet(staging)


def _foreach_batch(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame, fn: Callable[[DataFrame, int], Any]) -> None:
    """The user's fn(df, batch_id), here on the TaskManager (Structured Streaming's foreachBatch)."""
    if ctx.batch is None:
        raise ValueError(f"{label(spec)} is a sink of streaming queries: it runs in their micro-batches")
    fn(df, ctx.batch.batch_id)


def _discard(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    _counted(ctx, df).write.format("noop").mode("overwrite").save()


def _sink_noop(ctx: RuntimeContext, spec: OperatorSpec, df: DataFrame) -> None:
    # Unlike sink.discard, nothing runs: the pipeline is only planned.
    return None


SINKS: dict[str, Callable[..., None]] = {
    "sink.parquet": _file_sink("parquet"),
    "sink.csv": _file_sink("csv", {"header": "true"}),
    "sink.json": _file_sink("json"),
    "sink.text": _file_sink("text", prepare=_as_text),
    "sink.collect": _collect,
    "sink.print": _print,
    "sink.redis": _redis_sink,
    "sink.kafka": _kafka_sink,
    "sink.delta": _delta_sink,
    # Called with the user's function as well: (ctx, spec, df, fn).
    "sink.foreach_batch": _foreach_batch,
    "sink.discard": _discard,
    "sink.noop": _sink_noop,
}
