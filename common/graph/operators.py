"""The operator catalogue: every operator kind a JobVertex chain may contain.

Owns the names, roles and arities of operators and the configuration each kind takes (its keys
and what type of value each holds). The DSL builds OperatorSpecs from it, validation checks
chains and configurations against it, and the TaskManager maps each kind to its DataFrame
implementation (`funke.taskmanager.operators`). Adding an operator means one line here and one
function there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


class Value(enum.Enum):
    """What a configuration key of an operator holds (checked by `validation.py`)."""

    SOURCE_PATH = "a file path or URI to read (globs allowed)"
    SINK_PATH = "a directory path or URI to write"
    SINK_MODE = "a write mode"
    DDL = "a Spark DDL schema string"
    SQL = "a SQL expression string"
    SQL_LIST = "a SQL expression string or a list of them"
    COLUMNS = "a list of column names"
    INT64 = "a 64-bit integer"
    POSITIVE_INT = "a positive integer"
    OPTIONS = "an object of Spark options (string, number or boolean values)"
    ROWS = "a list of rows"
    JOIN_TYPE = "a join type"
    HOST = "a host name or IP address"
    PORT = "a TCP port (1 to 65535)"
    STREAM_KEYS = "a non-empty list of distinct Redis stream keys"
    STREAM_KEY = "a Redis stream key"
    STARTING = "where a query starts reading: earliest or latest"
    REDIS_DB = "a Redis database number (0 or more)"
    STATE_SPECS = "a list of state handles (name, kind, type, key_type, ttl_ms)"
    COLUMN = "a column name"
    MILLIS = "a duration in milliseconds (0 to ten years)"
    DELTA_MODE = "a Delta write mode: append or overwrite"
    VERSION = "a table version (0 or more)"
    TIMESTAMP = "an ISO 8601 date and time"
    TRUE = "true (or the key left out)"
    BOOLEAN = "true or false"
    BOOTSTRAP = "Kafka bootstrap servers: host:port[,host:port...]"
    TOPICS = "a non-empty list of distinct Kafka topic names"
    TOPIC_PATTERN = "a regular expression over Kafka topic names"
    KAFKA_STARTING = "where a Kafka query starts: earliest, latest, {topic: {partition: offset}} or {\"timestamp\": ms}"
    KAFKA_END_OFFSETS = "how a Kafka source learns a partition's end: list (ListOffsets) or fetch"
    VALUE_FORMAT = "how Kafka record values are decoded: raw, json, avro or confluent-avro"
    VALUE_SCHEMA = "a schema of Kafka record values (a DDL string, or Avro schemas)"
    URL = "an http:// or https:// URL"
    KAFKA_OPTIONS = "an object of librdkafka consumer settings (an allow-list)"
    TOPIC = "a Kafka topic name"
    GUARANTEE = "a delivery guarantee: exactly_once or at_least_once"


class FunctionUse(enum.Enum):
    REQUIRED = "required"
    OPTIONAL = "optional"  # source.range: a function makes it a generating source
    NONE = "none"


class OperatorRole(enum.Enum):
    SOURCE = "source"
    TRANSFORM = "transform"
    SINK = "sink"


VARIADIC = -1  # arity of operators taking any number (>= 1) of inputs

# A keyed per-batch operator (count, reduce, aggregate) chained behind its producer: the HASH
# exchange on its keys was left out because both sides run as one subtask, where it moves
# nothing (as Spark plans no shuffle for a single partition). Holds only at parallelism 1:
# validation keeps it there, and `streamingjob.rescaled` puts the exchange back.
ELIDED_EXCHANGE = "elided_hash_exchange"
ELIDABLE_KINDS = frozenset({"count", "reduce", "aggregate"})


@dataclass(frozen=True, slots=True)
class OperatorKind:
    kind: str
    role: OperatorRole
    arity: int  # number of inputs of the head operator; 0 for sources
    required: tuple[str, ...] = ()  # config keys that must be present
    needs_function: bool = False
    commits_output: bool = False  # sinks whose output is committed when the job finishes
    keys: Mapping[str, Value] = field(default_factory=dict)  # every key the kind accepts
    function: FunctionUse = FunctionUse.NONE


def _k(kind: str, role: OperatorRole, arity: int, *required: str, fn: bool = False, commit: bool = False,
       keys: Mapping[str, Value] | None = None, function: FunctionUse | None = None):
    use = function or (FunctionUse.REQUIRED if fn else FunctionUse.NONE)
    return OperatorKind(kind, role, arity, tuple(required), fn, commit, dict(keys or {}), use)


S, T, K = OperatorRole.SOURCE, OperatorRole.TRANSFORM, OperatorRole.SINK
V = Value

# Sinks stage their output and commit it when the job finishes; appending to or silently
# skipping an existing target does not fit that protocol, so only these two modes exist
# (spelled exactly so: the TaskManager compares them as written).
SINK_MODES = ("error", "overwrite")
# Spark's join types (DataFrame.join's `how`), all spellings; "cross" is left out because a
# cross join has no keys to partition on.
JOIN_TYPES = frozenset({
    "inner", "outer", "full", "fullouter", "full_outer", "left", "leftouter", "left_outer",
    "right", "rightouter", "right_outer", "semi", "leftsemi", "left_semi", "anti", "leftanti",
    "left_anti",
})

_FILE_SOURCE = {"path": V.SOURCE_PATH, "schema": V.DDL, "options": V.OPTIONS}
_STREAM_FILE_SOURCE = {"path": V.SOURCE_PATH, "schema": V.DDL, "options": V.OPTIONS,
                       "max_files_per_trigger": V.POSITIVE_INT}
_FILE_SINK = {"path": V.SINK_PATH, "mode": V.SINK_MODE, "options": V.OPTIONS}

CATALOGUE: dict[str, OperatorKind] = {
    o.kind: o
    for o in (
        # sources: subtask i of n reads its share of the input
        _k("source.text", S, 0, "path", keys=_FILE_SOURCE),
        _k("source.parquet", S, 0, "path", keys=_FILE_SOURCE),
        _k("source.csv", S, 0, "path", keys=_FILE_SOURCE),
        _k("source.json", S, 0, "path", keys=_FILE_SOURCE),
        _k("source.range", S, 0, "end", keys={"start": V.INT64, "end": V.INT64, "step": V.INT64, "schema": V.DDL},
           function=FunctionUse.OPTIONAL),
        _k("source.collection", S, 0, "rows", "schema", keys={"rows": V.ROWS, "schema": V.DDL}),
        # a Delta table at a version (or as of a time): its data files split across the subtasks
        _k("source.delta", S, 0, "path", keys={"path": V.SOURCE_PATH, "version": V.VERSION, "timestamp": V.TIMESTAMP}),
        # stream sources (streaming queries, `funke.common.graph.streamingjob`): each micro-batch reads
        # exactly the offset range its offset log entry names
        _k("source.rate", S, 0, "rows_per_second",
           keys={"rows_per_second": V.POSITIVE_INT, "max_rows_per_trigger": V.POSITIVE_INT}),
        _k("source.stream.text", S, 0, "path", keys=_STREAM_FILE_SOURCE),
        _k("source.stream.csv", S, 0, "path", "schema", keys=_STREAM_FILE_SOURCE),
        _k("source.stream.json", S, 0, "path", "schema", keys=_STREAM_FILE_SOURCE),
        _k("source.stream.parquet", S, 0, "path", "schema", keys=_STREAM_FILE_SOURCE),
        _k("source.stream.jsonlines", S, 0, "path", "schema",
           keys={"path": V.SOURCE_PATH, "schema": V.DDL, "max_files_per_trigger": V.POSITIVE_INT}),
        # a Delta table's versions: each batch reads the files the commits after its start version add
        _k("source.stream.delta", S, 0, "path",
           keys={"path": V.SOURCE_PATH, "max_versions_per_trigger": V.POSITIVE_INT}),
        # receiver sources: long-running receivers store blocks in the checkpoint; each batch reads
        # the blocks allocated to it (Spark Streaming's socketTextStream)
        _k("source.socket", S, 0, "host", "port",
           keys={"host": V.HOST, "port": V.PORT, "block_interval_ms": V.POSITIVE_INT, "max_rate": V.POSITIVE_INT}),
        # a broker: Redis Streams, read by entry id ranges (XRANGE)
        _k("source.redis", S, 0, "keys",
           keys={"keys": V.STREAM_KEYS, "host": V.HOST, "port": V.PORT, "db": V.REDIS_DB, "starting": V.STARTING,
                 "max_entries_per_trigger": V.POSITIVE_INT}),
        # a broker: Kafka topics, read by offset ranges per partition (assign + seek, read_committed)
        _k("source.kafka", S, 0, "bootstrap",
           keys={"bootstrap": V.BOOTSTRAP, "topics": V.TOPICS, "pattern": V.TOPIC_PATTERN, "starting": V.KAFKA_STARTING,
                 "max_offsets_per_trigger": V.POSITIVE_INT, "fail_on_data_loss": V.BOOLEAN,
                 "end_offsets": V.KAFKA_END_OFFSETS, "value_format": V.VALUE_FORMAT, "value_schema": V.VALUE_SCHEMA,
                 "schemas": V.VALUE_SCHEMA, "schema_registry": V.URL, "options": V.KAFKA_OPTIONS}),
        # no-op kinds: a chain made only of these finishes without touching Spark (used to
        # measure scheduling and deployment alone)
        _k("source.noop", S, 0),
        # transforms
        _k("map", T, 1, "schema", fn=True, keys={"schema": V.DDL}),
        _k("flat_map", T, 1, "schema", fn=True, keys={"schema": V.DDL}),
        _k("filter", T, 1, fn=True),
        _k("select", T, 1, "exprs", keys={"exprs": V.SQL_LIST}),
        _k("where", T, 1, "condition", keys={"condition": V.SQL}),
        _k("reduce", T, 1, "keys", fn=True, keys={"keys": V.COLUMNS, ELIDED_EXCHANGE: V.TRUE}),
        _k("aggregate", T, 1, "keys", "aggregations",
           keys={"keys": V.COLUMNS, "aggregations": V.SQL_LIST, ELIDED_EXCHANGE: V.TRUE}),
        # a keyed aggregate's combiner, before its exchange (funke.common.aggregates)
        _k("combine", T, 1, "keys", "aggregations", keys={"keys": V.COLUMNS, "aggregations": V.SQL_LIST}),
        _k("count", T, 1, "keys", keys={"keys": V.COLUMNS, ELIDED_EXCHANGE: V.TRUE}),
        # a streaming query's keyed aggregate over every batch so far, its totals in keyed state
        # (funke.common.streaming.state); emits per the query's output mode
        _k("running_aggregate", T, 1, "keys", "aggregations",
           keys={"keys": V.COLUMNS, "aggregations": V.SQL_LIST}),
        _k("running_reduce", T, 1, "keys", fn=True, keys={"keys": V.COLUMNS}),
        # one record per distinct key: per subtask in a bounded job (its input is HASH-partitioned on
        # the keys), and in a streaming query across every batch so far (keyed state)
        _k("deduplicate", T, 1, "keys", keys={"keys": V.COLUMNS}),
        # a streaming query's keyed process function: the user's function per key and batch with
        # typed state handles (value, list, map; optional TTL) and processing-time timers
        _k("process", T, 1, "keys", "schema", fn=True,
           keys={"keys": V.COLUMNS, "schema": V.DDL, "state": V.STATE_SPECS}),
        # event time (funke.common.streaming.eventtime): a watermark on a timestamp column, each
        # window's keyed aggregate (its state in keyed state), and the rows its windows found late
        _k("watermark", T, 1, "column", "delay_ms", keys={"column": V.COLUMN, "delay_ms": V.MILLIS}),
        _k("window_aggregate", T, 1, "keys", "aggregations", "column", "size_ms", "slide_ms",
           keys={"keys": V.COLUMNS, "aggregations": V.SQL_LIST, "column": V.COLUMN, "size_ms": V.MILLIS,
                 "slide_ms": V.MILLIS, "lateness_ms": V.MILLIS}),
        _k("deduplicate_within", T, 1, "keys", "column", "delay_ms",
           keys={"keys": V.COLUMNS, "column": V.COLUMN, "delay_ms": V.MILLIS}),
        _k("session_aggregate", T, 1, "keys", "aggregations", "column", "gap_ms",
           keys={"keys": V.COLUMNS, "aggregations": V.SQL_LIST, "column": V.COLUMN, "gap_ms": V.MILLIS,
                 "lateness_ms": V.MILLIS}),
        # an interval join of two streams: a left row at a joins right rows at b in [a + lower, a + upper]
        _k("interval_join", T, 2, "keys", "left_time", "right_time", "lower_ms", "upper_ms",
           keys={"keys": V.COLUMNS, "how": V.JOIN_TYPE, "left_time": V.COLUMN, "right_time": V.COLUMN,
                 "lower_ms": V.INT64, "upper_ms": V.INT64}),
        # a window operator's late rows: its windows (size_ms and slide_ms, or a session's gap_ms)
        _k("late_rows", T, 1, "column",
           keys={"column": V.COLUMN, "size_ms": V.MILLIS, "slide_ms": V.MILLIS, "gap_ms": V.MILLIS,
                 "lateness_ms": V.MILLIS}),
        _k("join", T, 2, "on", keys={"on": V.COLUMNS, "how": V.JOIN_TYPE}),
        _k("union", T, VARIADIC),
        _k("transform", T, 1, fn=True),
        _k("noop", T, VARIADIC),
        # sinks
        _k("sink.parquet", K, 1, "path", commit=True, keys=_FILE_SINK),
        _k("sink.csv", K, 1, "path", commit=True, keys=_FILE_SINK),
        _k("sink.json", K, 1, "path", commit=True, keys=_FILE_SINK),
        _k("sink.text", K, 1, "path", commit=True, keys=_FILE_SINK),
        _k("sink.print", K, 1),
        _k("sink.collect", K, 1, commit=True),
        _k("sink.discard", K, 1),
        _k("sink.noop", K, 1),
        # a streaming query's per-batch sink: the user's fn(df, batch_id) (Structured Streaming's
        # foreachBatch)
        _k("sink.foreach_batch", K, 1, fn=True),
        # a Delta table: one transaction when the job finishes; in a streaming query one per batch
        _k("sink.delta", K, 1, "path", commit=True, keys={"path": V.SINK_PATH, "mode": V.DELTA_MODE}),
        # a streaming query's Redis Streams sink: each batch appended once, in one transaction
        _k("sink.redis", K, 1, "key", keys={"key": V.STREAM_KEY, "host": V.HOST, "port": V.PORT, "db": V.REDIS_DB}),
        # a Kafka topic: in a streaming query one transaction per batch, in a bounded job one when
        # it finishes (funke.common.streaming.kafkasink)
        _k("sink.kafka", K, 1, "bootstrap", "topic", "value", commit=True,
           keys={"bootstrap": V.BOOTSTRAP, "topic": V.TOPIC, "key": V.COLUMN, "value": V.COLUMN,
                 "guarantee": V.GUARANTEE}),
    )
}


def operator_role(kind: str) -> OperatorRole | None:
    op = CATALOGUE.get(kind)
    return op.role if op else None


NOOP_KINDS = frozenset({"source.noop", "noop", "sink.noop"})
