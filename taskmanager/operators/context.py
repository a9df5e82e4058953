"""What every operator works with: the subtask it runs in (`RuntimeContext`), what a micro-batch
reads (`InputMeter`), what a sink wrote (`SinkCount`), the signatures of sources, transforms and
sinks, and the helpers all three share to read an operator's config, name its columns and
schemas, and look at files.

Only the DataFrame API is used (no RDD, no SparkContext), so every operator also runs against
Spark Connect.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    MapType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from funke.common import layout
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import BatchInput
from funke.runtime import datafs

__all__ = ["InputMeter", "RuntimeContext", "Sink", "SinkCount", "Source", "Transform", "arrow_compatible", "arrow_schema",
           "batch_range", "coerce_row", "coerce_value", "column_ref", "config_options", "config_schema", "config_strings", "config_value", "file_info", "label",
           "parse_schema", "subtask_share", "union_all"]


@dataclass(slots=True)
class InputMeter:
    """What one micro-batch of a task reads: an estimate of the bytes (the rate source's rows
    weighed, files and partitions by size), which decides how its output is exchanged, the
    rows its stream source read: known before running (the rate source's range) or observed
    while running (files: read only once the batch's work has run every row), and the rows
    its inputs' result partitions brought."""

    bytes: int = 0
    rows: int = 0
    observed: list[Observation] = dataclass_field(default_factory=list)
    # event time: the operator of the chain being built (its index), each watermark operator's
    # observation of its rows' event times (by operator id), and the window operators' of the
    # rows they found late
    at: int = 0
    event_time: dict[str, Observation | dict] = dataclass_field(default_factory=dict)  # dict: per partition
    late: list[Observation] = dataclass_field(default_factory=list)
    # the rows the batch's result partitions brought the chain's head (its records in)
    partition_rows: int = 0

    def counted_rows(self) -> int:
        """Blocks until every observation has its count: call once the chain ran every row."""
        return self.rows + sum(int(o.get["rows"]) for o in self.observed)


@dataclass(slots=True)
class SinkCount:
    """What a sink wrote in one run of its chain (Flink's numRecordsOut of a sink, the records it
    wrote): `rows` when it knows them (it staged them in memory, or printed them), else the
    count an observation of its write makes (`classic.observe_rows`); neither: not counted."""

    rows: int | None = None
    observed: Any = None  # classic.RowsObserved


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """What an operator knows about the subtask it runs in (Flink's RuntimeContext)."""

    spark: SparkSession
    job_id: str
    vertex_id: str
    subtask_index: int
    parallelism: int
    attempt_number: int
    data_dir: str
    # Spark partitions a keyed operator uses inside the task; None: spark.sql.shuffle.partitions.
    local_partitions: int | None = None
    # A streaming query's task: the micro-batch it runs now (what its stream sources read, where
    # its sinks stage); None in a bounded job.
    batch: BatchInput | None = None
    # A streaming query's task: what this batch's sources and inputs bring in.
    meter: InputMeter | None = None
    # A streaming query's checkpoint location (receivers' blocks and keyed state are stored in it).
    checkpoint: str = ""
    # The vertex's key groups (its max parallelism) and the job's options.
    max_parallelism: int = 0
    options: Mapping[str, str] = dataclass_field(default_factory=dict)
    # A streaming task's memo, the same dict for all its batches: what its operators build the
    # same way batch after batch (their Python UDFs); None: everything is built afresh.
    memo: dict[Any, Any] | None = None
    # What the chain's sink wrote in this run (`funke.taskmanager.recordcounts`); None: not counted.
    written: SinkCount | None = None

    @property
    def cancel_marker(self) -> str | None:
        return layout.cancel_marker(self.data_dir, self.job_id, self.vertex_id, self.subtask_index,
                                    self.attempt_number)


Source = Callable[[RuntimeContext, OperatorSpec], DataFrame]
Transform = Callable[[RuntimeContext, OperatorSpec, list[DataFrame]], DataFrame]
Sink = Callable[[RuntimeContext, OperatorSpec, DataFrame], None]


def label(spec: OperatorSpec) -> str:
    """How errors name the operator."""
    return f"operator '{spec.display_name}' ({spec.kind})"


def batch_range(ctx: RuntimeContext, spec: OperatorSpec) -> tuple[BatchInput, SourceRange]:
    if ctx.batch is None:
        raise ValueError(f"{label(spec)} is a stream source: it runs in a streaming query's micro-batches")
    source_range = ctx.batch.ranges.get(ctx.vertex_id)
    if source_range is None:
        raise ValueError(f"{label(spec)}: batch {ctx.batch.batch_id} names no range for vertex {ctx.vertex_id!r}")
    return ctx.batch, source_range


def coerce_value(value: Any, dt: DataType) -> Any:
    """A JSON value as the Python value Spark's type verification accepts for `dt`."""
    if value is None:
        return None
    if isinstance(dt, (FloatType, DoubleType)) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(dt, DecimalType) and isinstance(value, (int, float, str)):
        return decimal.Decimal(str(value))
    if isinstance(dt, DateType) and isinstance(value, str):
        return _dt.date.fromisoformat(value)
    if isinstance(dt, (TimestampType, TimestampNTZType)) and isinstance(value, str):
        return _dt.datetime.fromisoformat(value)
    if isinstance(dt, ArrayType) and isinstance(value, list):
        return [coerce_value(v, dt.elementType) for v in value]
    if isinstance(dt, MapType) and isinstance(value, dict):
        return {k: coerce_value(v, dt.valueType) for k, v in value.items()}
    if isinstance(dt, StructType) and isinstance(value, (dict, list)):
        return coerce_row(value, dt)
    return value


def coerce_row(row: Any, schema: StructType) -> tuple[Any, ...]:
    if isinstance(row, dict):
        values = [row.get(f.name) for f in schema.fields]
    elif isinstance(row, (list, tuple)):
        if len(row) != len(schema.fields):
            raise ValueError(f"row {row!r} has {len(row)} value(s), the schema {len(schema.fields)} column(s)")
        values = list(row)
    elif len(schema.fields) == 1:  # a bare value for a one-column schema
        values = [row]
    else:
        raise ValueError(f"row {row!r} is neither a list nor an object")
    return tuple(coerce_value(v, f.dataType) for v, f in zip(values, schema.fields))


def config_value(spec: OperatorSpec, key: str) -> Any:
    try:
        return spec.config[key]
    except KeyError:
        raise ValueError(f"{label(spec)}: missing config {key!r}") from None


def config_strings(spec: OperatorSpec, key: str) -> list[str]:
    value = config_value(spec, key)
    return [value] if isinstance(value, str) else [str(v) for v in value]


def config_options(spec: OperatorSpec, defaults: dict[str, str] | None = None) -> dict[str, Any]:
    given = spec.config.get("options") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{label(spec)}: config 'options' must be an object, got {type(given).__name__}")
    return {**(defaults or {}), **given}


def column_ref(name: str) -> Column:
    # Backticks: a column named "a.b" is that column, not field b of struct a.
    return F.col("`" + name.replace("`", "``") + "`")


def parse_schema(ddl: str, what: str = "schema") -> StructType:
    """A DDL string as a StructType; a bare type ("string") becomes one column named "value"."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise ValueError(f"{what} must be a non-empty DDL string, got {ddl!r}")
    return StructType.fromJson(json.loads(_schema_json(ddl)))


@functools.lru_cache(maxsize=512)
def _schema_json(ddl: str) -> str:
    # Spark's parser runs in the JVM (a round trip, 3-4 ms); a micro-batch plans the same schemas
    # batch after batch. Kept as JSON, so that every caller gets a StructType of its own.
    parsed = DataType.fromDDL(ddl)
    if not isinstance(parsed, StructType):
        parsed = StructType([StructField("value", parsed)])
    return parsed.json()


def config_schema(spec: OperatorSpec) -> StructType:
    return parse_schema(config_value(spec, "schema"), f"{label(spec)}: config 'schema'")


def arrow_schema(ctx: RuntimeContext, schema: StructType) -> pa.Schema:
    # Internal PySpark API, but the only converter that matches what Spark expects back from
    # mapInArrow (decimal precision, map entry names, large string types when configured).
    from pyspark.sql.pandas.types import to_arrow_schema

    conf = ctx.spark.conf
    return to_arrow_schema(
        schema,
        timezone=conf.get("spark.sql.session.timeZone"),
        prefers_large_types=conf.get("spark.sql.execution.arrow.useLargeVarTypes") == "true",
    )


def arrow_compatible(schema: StructType) -> bool:
    """Whether Spark hands these columns over as Arrow (user-defined types do not)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        to_arrow_schema(schema, timezone="UTC")  # the zone only matters for the types, not the check
    except Exception:
        return False
    return True


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames' rows together, by column name (the union operator's, and a gate's partitions')."""
    # Pairwise, so that P inputs make a union tree of depth log P rather than a chain of P.
    level = list(frames)
    while len(level) > 1:
        level = [
            level[i].unionByName(level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0]


def subtask_share(n: int, subtask: int, parallelism: int) -> tuple[int, int]:
    """The contiguous [lo, hi) of n items that subtask `subtask` of `parallelism` owns."""
    return subtask * n // parallelism, (subtask + 1) * n // parallelism


def file_info(path: str) -> pafs.FileInfo | None:
    """What pyarrow knows of `path` (None: a filesystem it cannot reach)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else path
        return pafs.LocalFileSystem().get_file_info(os.path.abspath(local))
    try:
        fs, inner = datafs.filesystem(path)
        return fs.get_file_info(inner)
    except (ValueError, OSError, NotImplementedError):
        return None
