"""Sources: `(ctx, spec) -> DataFrame`, the subtask's share of the input.

Bounded sources split their input among the subtasks of the vertex: files round robin over the
sorted file list (every subtask lists and infers the schema of the whole input, so an empty share
has the same schema), ranges and collections in contiguous chunks. source.csv reads a header by
default, since sink.csv writes one. Collection rows are JSON, coerced to the schema where JSON has
no type of its own (int -> double/decimal, ISO strings -> date/timestamp). source.noop only exists
for chains made of no-op kinds, which the task runs without Spark.

Stream sources run in a streaming query's micro-batches (`RuntimeContext.batch`) and read exactly
the batch's range: source.rate the rows due, by `RateSource`'s rule; source.stream.* the files
the JobManager resolved for the range, this subtask's share; source.socket the blocks its
receiver stored; source.redis the entries between the range's ids; source.kafka the records of
its partitions' offset ranges (`funke.taskmanager.operators.kafka`). Each adds what it read to the
batch's `InputMeter`. (source.stream.jsonlines is `funke.taskmanager.streaming.jsonlines`.)
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.sources import RateSource, RedisStreamsSource, receiver_blocks_dir
from funke.taskmanager import batchexchange
from funke.taskmanager.operators.classic import frame_from_arrow
from funke.taskmanager.operators.context import (
    RuntimeContext,
    Source,
    arrow_schema,
    batch_range,
    config_options,
    config_schema,
    config_strings,
    config_value,
    file_info,
    label,
    parse_schema,
    subtask_share,
)
from funke.taskmanager.operators.context import coerce_row as _coerce_row
from funke.taskmanager.operators.delta import read_table as _delta_table
from funke.taskmanager.operators.kafka import read as _kafka_source
from funke.taskmanager.operators.transforms import python_map

__all__ = ["BATCH_SOURCES", "batch_range", "redis_client"]


# ---------------------------------------------------------------------------------------------
# bounded sources: a share of the whole input
# ---------------------------------------------------------------------------------------------


def _is_directory(path: str) -> bool | None:
    """Whether `path` is a directory, without Hadoop; None when that cannot be told (a glob,
    a scheme pyarrow does not know such as s3a://)."""
    if any(c in path for c in "*?[{"):
        return None
    info = file_info(path)
    return None if info is None else info.type == pafs.FileType.Directory


def _file_source(fmt: str, defaults: dict[str, str] | None = None) -> Source:
    def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
        path = str(config_value(spec, "path"))
        options = config_options(spec, defaults)
        reader = ctx.spark.read.format(fmt).options(**options)
        ddl = spec.config.get("schema")
        if ddl:
            reader = reader.schema(parse_schema(ddl, f"{label(spec)}: config 'schema'"))
        # Every subtask lists (and, without a given schema, infers from) the whole input, so that
        # all of them agree on the files' order and on the schema, even one with no files at all.
        whole = reader.load(path)
        schema = whole.schema
        files = sorted(whole.inputFiles())[ctx.subtask_index::ctx.parallelism]
        if not files:
            return ctx.spark.createDataFrame([], schema)
        share = ctx.spark.read.format(fmt).options(**options).schema(schema)
        if "basePath" not in options and _is_directory(path):
            # Reading single files of a partitioned directory keeps its partition columns only
            # when Spark knows where the table starts.
            share = share.option("basePath", path)
        return share.load(files)

    return read


def _range(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    start = int(spec.config.get("start", 0))
    end = int(config_value(spec, "end"))
    step = int(spec.config.get("step", 1))
    if step == 0:
        raise ValueError(f"{label(spec)}: step must not be 0")
    lo, hi = subtask_share(len(range(start, end, step)), ctx.subtask_index, ctx.parallelism)
    ids = ctx.spark.range(start + lo * step, start + hi * step, step)
    if not spec.function:
        return ids
    # A generating source: fn(id) -> row of config "schema".
    return python_map(ctx, spec, ids, flat=False)


def _collection(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    rows = config_value(spec, "rows")
    if isinstance(rows, str):
        rows = json.loads(rows)
    if not isinstance(rows, list):
        raise ValueError(f"{label(spec)}: config 'rows' must be a JSON list, got {type(rows).__name__}")
    schema = config_schema(spec)
    lo, hi = subtask_share(len(rows), ctx.subtask_index, ctx.parallelism)
    try:
        share = [_coerce_row(r, schema) for r in rows[lo:hi]]
    except ValueError as e:
        raise ValueError(f"{label(spec)}: {e}") from None
    table = _plain_table(ctx, share, schema)
    if table is not None:
        return frame_from_arrow(ctx, table, schema)
    return ctx.spark.createDataFrame(share, schema)


# Types whose Python values Arrow and Spark's own conversion store alike (no time zones, no
# precision rules of their own), with the Python types Spark's verification accepts for each.
_PLAIN_TYPES: dict[type, tuple[type, ...]] = {
    BooleanType: (bool,), ByteType: (int,), ShortType: (int,), IntegerType: (int,), LongType: (int,),
    FloatType: (float,), DoubleType: (float,), StringType: (str,), BinaryType: (bytes, bytearray),
}


def _plain_table(ctx: RuntimeContext, rows: list[tuple[Any, ...]], schema: StructType) -> pa.Table | None:
    """The rows as one Arrow table when every column has a plain type and every value is one
    Spark takes for it, else None. Spark sizes rows handed over as Arrow (a local relation), so
    a small collection's exchange can go through memory (`TaskExchange._small_output`); rows handed over
    as Python objects are an RDD that Spark cannot size. What Spark would refuse (a value of
    another type, a null in a non-nullable column, a number out of its type's range, which
    Arrow refuses too) takes Spark's way, and gets its error."""
    fields = schema.fields
    accepted = [_PLAIN_TYPES.get(type(f.dataType)) for f in fields]
    if any(a is None for a in accepted) or len({f.name for f in fields}) < len(fields):
        return None
    for i, (f, types) in enumerate(zip(fields, accepted)):
        for row in rows:
            value = row[i]
            if value is None:
                if not f.nullable:
                    return None
            elif type(value) not in types:
                return None
    target = arrow_schema(ctx, schema)
    try:
        columns = [pa.array([row[i] for row in rows], type=target.field(i).type) for i in range(len(fields))]
        return pa.Table.from_arrays(columns, schema=target)
    except (pa.ArrowException, OverflowError):
        return None


def _source_noop(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    raise ValueError(
        f"{label(spec)} produces no rows; it can only be chained with other no-op kinds "
        "(noop, sink.noop), which the task runs without Spark"
    )


# ---------------------------------------------------------------------------------------------
# stream sources: a share of the micro-batch's range
# ---------------------------------------------------------------------------------------------


# What a range's rows are in Spark: neither column is ever null.
_RATE_SCHEMA = StructType([StructField("value", LongType(), False), StructField("timestamp", TimestampType(), False)])


def _rate(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """Rows `value` (bigint, from 0) and `timestamp` (when the row was due) of this subtask's share
    of the batch's range: value i goes to subtask i % parallelism (RateSource.rows)."""
    _, source_range = batch_range(ctx, spec)
    rate = RateSource(int(config_value(spec, "rows_per_second")), ctx.parallelism)
    schema = "value bigint, timestamp timestamp"
    if source_range.end is None or source_range.start == source_range.end:
        return ctx.spark.createDataFrame([], schema)
    base = int(source_range.end["baseMs"])
    begin = int(source_range.start["rows"]) if source_range.start is not None else 0
    end = int(source_range.end["rows"])
    first = begin + (ctx.subtask_index - begin) % ctx.parallelism
    rows = len(range(first, end, ctx.parallelism))
    if ctx.meter is not None:
        ctx.meter.rows += rows
        ctx.meter.bytes += rows * batchexchange.RATE_ROW_BYTES
    if ctx.meter is not None and rows * batchexchange.RATE_ROW_BYTES <= batchexchange.ONE_PARTITION_LIMIT_BYTES:
        # A small micro-batch's rows, built here as Arrow (RateSource's rule): a plan with the
        # batch's numbers in it (a range's bounds, its base time) makes Spark's code generator
        # compile new code for every batch, 15-25 ms; rows handed over as data leave the code
        # generated for the rest of the chain the same from batch to batch.
        values = pa.array(range(first, end, ctx.parallelism), pa.int64())
        millis = pc.add(pc.divide(pc.multiply(values, 1000), rate.rows_per_second), base)  # integer division
        stamps = pc.cast(pc.multiply(millis, 1000), pa.timestamp("us", tz="UTC"))
        # One Spark partition, as a small batch's inputs (task.py's `_small_batch`): its Python
        # functions run as one Spark task, one worker call, instead of one per core.
        return frame_from_arrow(ctx, pa.table({"value": values, "timestamp": stamps}), _RATE_SCHEMA).coalesce(1)
    ids_ = ctx.spark.range(first, max(first, end), ctx.parallelism)
    # One expression string, not a tree of Column calls: each call is a round trip to the JVM,
    # and this is planned for every batch. The integers are ours (checked above), not the user's.
    millis = f"{base} + CAST(FLOOR(id * 1000 / {rate.rows_per_second}) AS BIGINT)"
    return ids_.selectExpr("id AS value", f"timestamp_millis({millis}) AS timestamp")


def _socket(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """Lines in column `value`: the blocks of this subtask's receiver that the batch was
    allocated, read from the checkpoint (the receiver itself runs beside the task:
    taskmanager/receiver.py)."""
    batch, _ = batch_range(ctx, spec)
    if not ctx.checkpoint:
        raise ValueError(f"{label(spec)}: the task was not told where the query's checkpoint is")
    prefix = f"{ctx.subtask_index}/"
    names = [n[len(prefix):] for n in batch.files.get(ctx.vertex_id, ()) if n.startswith(prefix)]
    schema = "value string"
    if not names:
        return ctx.spark.createDataFrame([], schema)
    directory = receiver_blocks_dir(ctx.checkpoint, ctx.vertex_id, ctx.subtask_index)
    paths = [posixpath.join(directory, n) for n in names]
    if ctx.meter is not None:  # a block's records are its lines: counted here, blocks are small
        ctx.meter.rows += sum(_lines_in(p) for p in paths)
        ctx.meter.bytes += batchexchange.file_bytes(paths)
    return ctx.spark.read.schema(schema).text(paths)


REDIS_READ_CHUNK = 10_000  # entries an XRANGE call brings
REDIS_SCHEMA = "stream string, id string, fields map<string,string>, timestamp timestamp"


def redis_client(config: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(host=str(config.get("host", "127.0.0.1")), port=int(config.get("port", 6379)),
                       db=int(config.get("db", 0)), socket_timeout=30, socket_connect_timeout=10)


def _redis_source(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """The entries of the batch's range (per key, after its start id up to its end id), of the
    keys that are this subtask's (key i goes to subtask i % parallelism): `stream` (the key),
    `id`, `fields`, `timestamp` (the id's milliseconds)."""
    _, source_range = batch_range(ctx, spec)
    keys = tuple(config_strings(spec, "keys"))
    bounds = RedisStreamsSource(keys, str(spec.config.get("starting", "latest"))).bounds(source_range)
    mine = [k for i, k in enumerate(keys) if i % ctx.parallelism == ctx.subtask_index]
    client = redis_client(spec.config)
    streams, ids_, fields, millis = [], [], [], []
    try:
        for key in mine:
            after, end = bounds.get(key, ("0-0", "0-0"))
            while after != end:
                chunk = client.xrange(key, f"({after}", end, count=REDIS_READ_CHUNK)
                for entry_id, entry in chunk:
                    entry_id = entry_id.decode()
                    streams.append(key)
                    ids_.append(entry_id)
                    fields.append([(k.decode("utf-8", "replace"), v.decode("utf-8", "replace")) for k, v in entry.items()])
                    millis.append(int(entry_id.split("-")[0]))
                if len(chunk) < REDIS_READ_CHUNK:
                    break
                after = ids_[-1]
    finally:
        client.close()
    if ctx.meter is not None:
        ctx.meter.rows += len(ids_)
        ctx.meter.bytes += sum(len(k) + len(v) for f in fields for k, v in f) + 32 * len(ids_)
    if not ids_:
        return ctx.spark.createDataFrame([], REDIS_SCHEMA)
    table = pa.table({
        "stream": pa.array(streams, pa.string()), "id": pa.array(ids_, pa.string()),
        "fields": pa.array(fields, pa.map_(pa.string(), pa.string())),
        "timestamp": pa.array(millis, pa.timestamp("ms", tz="UTC")),
    })
    return frame_from_arrow(ctx, table, parse_schema(REDIS_SCHEMA, "source.redis"))


def _lines_in(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _stream_file_source(fmt: str, defaults: dict[str, str] | None = None) -> Source:
    def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
        batch, _ = batch_range(ctx, spec)
        directory = str(config_value(spec, "path")).rstrip("/")
        ddl = spec.config.get("schema") or ("value string" if fmt == "text" else None)
        if ddl is None:
            raise ValueError(f"{label(spec)}: a stream file source needs a schema")
        schema = parse_schema(ddl, f"{label(spec)}: config 'schema'")
        names = batch.files.get(ctx.vertex_id, ())[ctx.subtask_index::ctx.parallelism]
        if not names:
            return ctx.spark.createDataFrame([], schema)
        paths = [f"{directory}/{name}" for name in names]
        df = ctx.spark.read.format(fmt).options(**config_options(spec, defaults)).schema(schema).load(paths)
        if ctx.meter is None:
            return df
        ctx.meter.bytes += batchexchange.file_bytes(paths)
        # Counted while the batch's own work reads them, not by a pass of its own.
        rows = Observation()
        ctx.meter.observed.append(rows)
        return df.observe(rows, F.count(F.lit(1)).alias("rows"))

    return read


BATCH_SOURCES: dict[str, Source] = {
    "source.text": _file_source("text"),
    "source.parquet": _file_source("parquet"),
    # header=true: what sink.csv writes, source.csv reads back.
    "source.csv": _file_source("csv", {"header": "true"}),
    "source.json": _file_source("json"),
    "source.range": _range,
    "source.collection": _collection,
    "source.delta": _delta_table,
    "source.noop": _source_noop,
    "source.rate": _rate,
    "source.socket": _socket,
    "source.redis": _redis_source,
    "source.kafka": _kafka_source,
    "source.stream.text": _stream_file_source("text"),
    "source.stream.csv": _stream_file_source("csv", {"header": "true"}),
    "source.stream.json": _stream_file_source("json"),
    "source.stream.parquet": _stream_file_source("parquet"),
}
