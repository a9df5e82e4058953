"""The Kafka source's TaskManager side: reads exactly this subtask's partitions of a batch's range.

The JobManager resolved the range to every partition's [begin, end) (`BatchInput.files`,
"topic/partition/begin/end"); the sorted (topic, partition) pairs are split over the subtasks, pair
i to subtask i % parallelism (`KafkaSource.share`). A read_committed consumer is assigned each
partition at its begin offset (assign + seek: no consumer group, nothing committed) and each
partition stops at its end: a record at or past the end, the last offset of the range read, or
the partition's end reported at or past it (control records of transactions take offsets too, so
the last record of a range need not be at end - 1). A partition that makes no progress towards
its end within the timeout (option funke.timeout.ms, 30 s: an open transaction that stays open, a
broker that went away) fails the batch naming the partition, the offset it reached and the end;
a begin offset that retention deleted fails it too, unless fail_on_data_loss=False (then the
partition is read from its earliest offset).

The rows have Structured Streaming's Kafka columns (`KAFKA_SCHEMA`); with value_format "json"
the value's fields (`value_schema`, a DDL string) take the place of `value` (a value that is not
JSON, or does not fit the schema, fails the batch naming its topic, partition and offset); with
"avro" and "confluent-avro" `funke.runtime.avrovalues.decode` decodes them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from funke.common import ids
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.sources import kafka as k
from funke.common.streaming.sources.kafka import KafkaSource, PartitionRange
from funke.taskmanager.operators.classic import frame_from_arrow
from funke.taskmanager.operators.context import (
    RuntimeContext,
    arrow_schema,
    batch_range,
    coerce_row,
    label,
    parse_schema,
)

__all__ = ["KAFKA_COLUMNS", "KAFKA_SCHEMA", "read"]

log = logging.getLogger(__name__)

KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
                "timestampType int, headers array<struct<key:string,value:binary>>")
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
CONSUME_AT_ONCE = 10_000  # records one consume() call may bring
POLL_S = 0.2
# Kafka's timestamp types as Structured Streaming numbers them (-1: none, 0: create, 1: log append)
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class KafkaReadTimeout(TimeoutError):
    """A partition did not reach its end in time (the message names it, where it got and its end)."""


class Records:
    """What a subtask read, column by column."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.types: list[int] = []
        self.headers: list[list[tuple[str, bytes | None]] | None] = []
        self.bytes = 0

    def add(self, message: Any) -> None:
        key, value = message.key(), message.value()
        self.keys.append(key)
        self.values.append(value)
        self.topics.append(message.topic())
        self.partitions.append(message.partition())
        self.offsets.append(message.offset())
        kind, ms = message.timestamp()
        self.timestamps.append(ms if kind else None)
        self.types.append(_TIMESTAMP_TYPES.get(kind, -1))
        headers = message.headers()
        self.headers.append(list(headers) if headers else None)  # Spark: null when a record has none
        self.bytes += (len(key) if key else 0) + (len(value) if value else 0) + 32

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> str:
        return f"topic {self.topics[i]!r} partition {self.partitions[i]} offset {self.offsets[i]}"

    def table(self) -> pa.Table:
        return pa.table({
            "key": pa.array(self.keys, pa.binary()), "value": pa.array(self.values, pa.binary()),
            "topic": pa.array(self.topics, pa.string()), "partition": pa.array(self.partitions, pa.int32()),
            "offset": pa.array(self.offsets, pa.int64()),
            "timestamp": pa.array(self.timestamps, pa.timestamp("ms", tz="UTC")),
            "timestampType": pa.array(self.types, pa.int32()), "headers": pa.array(self.headers, _HEADERS),
        })


def read_ranges(config: dict[str, Any], ranges: Sequence[PartitionRange], records: Records, client: str,
                where: str) -> None:
    """Read every range into `records` (assign + seek, read_committed), each partition up to its
    end; see the module for when a partition is done and when it fails."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition as KafkaTP

    pending = {(r.topic, r.partition): r for r in ranges if r.end > r.begin}
    if not pending:
        return
    fail_on_data_loss = bool(config.get("fail_on_data_loss", True))
    timeout_s = k.timeout_s(config)
    settings = k.consumer_settings(config, client, fail_on_data_loss=fail_on_data_loss)
    # librdkafka fetches ahead until 100,000 records are queued: a small range of a long partition
    # would fetch (and decode, and drop) that many; ahead by about the range's size instead, and
    # fetch again soon once the queue is below it
    ahead = min(100_000, max(1_000, sum(r.end - r.begin for r in pending.values())))
    settings.setdefault("queued.min.messages", ahead)
    settings.setdefault("fetch.queue.backoff.ms", 10)
    consumer = Consumer(settings, logger=log)
    reached = {tp: r.begin for tp, r in pending.items()}  # the offset each partition read up to
    errors: dict[tuple[str, int], str] = {}
    unknown = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC)
    try:
        consumer.assign([KafkaTP(t, p, r.begin) for (t, p), r in sorted(pending.items())])
        progress_at = time.monotonic()
        while pending:
            done: list[tuple[str, int]] = []
            for message in _ready(consumer):
                tp = (message.topic(), message.partition())
                r = pending.get(tp)
                if r is None:
                    continue  # a partition done already: what was fetched past its end
                error = message.error()
                if error is not None:
                    code = error.code()
                    if code == KafkaError._PARTITION_EOF:
                        if message.offset() >= r.end:
                            done.append(tp)
                        continue
                    if code == KafkaError._AUTO_OFFSET_RESET or code == KafkaError.OFFSET_OUT_OF_RANGE:
                        raise k.KafkaDataLoss(
                            f"{where}: topic {tp[0]!r} partition {tp[1]}: offset {reached[tp]} is no longer in the "
                            f"partition (deleted by retention?) and the batch reads offsets {r.begin} to {r.end - 1}. "
                            "Set fail_on_data_loss=False to skip what was lost")
                    if code in unknown:
                        raise ValueError(f"{where}: topic {tp[0]!r} partition {tp[1]} is unknown to the broker "
                                         f"({error.str()})")
                    errors[tp] = error.str()
                    continue
                offset = message.offset()
                progress_at = time.monotonic()
                if offset >= r.end:
                    done.append(tp)
                    continue
                if offset < r.begin:
                    continue
                records.add(message)
                reached[tp] = offset + 1
                if offset + 1 >= r.end:
                    done.append(tp)
            if done:
                for tp in done:
                    pending.pop(tp, None)
                consumer.pause([KafkaTP(t, p) for t, p in done])
                progress_at = time.monotonic()
            if pending and time.monotonic() - progress_at > timeout_s:
                stuck = "; ".join(f"topic {t!r} partition {p}: read up to offset {reached[(t, p)]}, the batch's range "
                                  f"ends at {r.end}" + (f" ({errors[(t, p)]})" if (t, p) in errors else "")
                                  for (t, p), r in sorted(pending.items())[:20])
                raise KafkaReadTimeout(f"{where}: no progress for {timeout_s:g} s: {stuck} (a transaction left open? "
                                       "the broker gone?)")
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def _ready(consumer: Any) -> list[Any]:
    """The messages and events the consumer has, once it has any (nothing after POLL_S):
    consume(n, timeout) would wait for n of them or the whole timeout."""
    first = consumer.poll(POLL_S)
    return [] if first is None else [first, *consumer.consume(num_messages=CONSUME_AT_ONCE, timeout=0)]


def read(ctx: RuntimeContext, spec: OperatorSpec) -> DataFrame:
    """This subtask's records of the batch's range, as Structured Streaming's columns (the value
    decoded as configured)."""
    batch, source_range = batch_range(ctx, spec)
    config = dict(spec.config)
    where = f"{label(spec)}: {k.description(config)}"
    ranges: list[PartitionRange] = []
    if source_range.end is not None:
        names = batch.files.get(ctx.vertex_id)
        if names is None:
            raise ValueError(f"{where}: batch {batch.batch_id} has no partition ranges resolved by the JobManager")
        ranges = [PartitionRange.decode(n) for n in names]
    mine = KafkaSource.share(ranges, ctx.subtask_index, ctx.parallelism)
    records = Records()
    read_ranges(config, mine, records, f"task-{ctx.vertex_id}-{ctx.subtask_index}"[:200], where)
    if ctx.meter is not None:
        ctx.meter.rows += len(records)
        ctx.meter.bytes += records.bytes
    table, schema = _decoded(ctx, config, records, where)
    if not len(records):
        return ctx.spark.createDataFrame([], schema)
    return frame_from_arrow(ctx, table, schema)


def _decoded(ctx: RuntimeContext, config: dict[str, Any], records: Records, where: str) -> tuple[pa.Table, StructType]:
    """The rows as the source gives them: raw, or with the value's decoded columns in place of
    `value`."""
    raw = records.table()
    fmt = config.get("value_format", "raw")
    base = parse_schema(KAFKA_SCHEMA, "the Kafka source's columns")
    if fmt == "raw":
        return raw, base
    if fmt == "json":
        value_schema = parse_schema(str(config["value_schema"]), f"{where}: config 'value_schema'")
        decoded = _json_values(ctx, records, value_schema, where)
    else:  # avro, confluent-avro: funke.runtime.avrovalues decodes, into the columns avro.spark_ddl says
        from funke.common.streaming.sources import avro
        from funke.runtime import avrovalues

        value_schema = parse_schema(avro.spark_ddl(avro.reader_schema(config)), f"{where}: the Avro value's columns")
        positions = list(zip(records.topics, records.partitions, records.offsets))
        decoded = avrovalues.decode(records.values, config, positions)
    clash = sorted(set(value_schema.fieldNames()) & (set(KAFKA_COLUMNS) - {"value"}))
    if clash:
        raise ValueError(f"{where}: the value's column(s) {', '.join(clash)} would hide the source's own (name them "
                         "otherwise in value_schema)")
    columns = [("key", raw.column("key"))] + list(zip(decoded.column_names, decoded.columns)) + \
        [(name, raw.column(name)) for name in KAFKA_COLUMNS[2:]]
    fields = [base["key"]] + list(value_schema.fields) + [base[name] for name in KAFKA_COLUMNS[2:]]
    return pa.table(dict(columns)), StructType(fields)


def _json_values(ctx: RuntimeContext, records: Records, schema: StructType, where: str) -> pa.Table:
    """Each value parsed as JSON into the schema's columns (a null value: nulls)."""
    rows: list[tuple[Any, ...]] = []
    width = len(schema.fields)
    for i, value in enumerate(records.values):
        if value is None:
            rows.append((None,) * width)
            continue
        try:
            rows.append(coerce_row(json.loads(value), schema))
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: {records.where(i)}: the value is not JSON of the schema "
                             f"{schema.simpleString()[:300]} ({ids.echo(str(exc), 200)[1:-1]}): "
                             f"{ids.echo(bytes(value[:200]))}") from None
    target = arrow_schema(ctx, schema)
    columns = []
    for j, field in enumerate(target):
        try:
            columns.append(pa.array([row[j] for row in rows], type=field.type))
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            bad = next((i for i, row in enumerate(rows) if not _fits(row[j], field.type)), None)
            at = records.where(bad) if bad is not None else "a record"
            raise ValueError(f"{where}: {at}: the value's field {field.name!r} does not fit {field.type} "
                             f"({ids.echo(str(exc), 200)[1:-1]})") from None
    return pa.Table.from_arrays(columns, schema=target)


def _fits(value: Any, arrow_type: pa.DataType) -> bool:
    try:
        pa.array([value], type=arrow_type)
        return True
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return False
