"""A task's exchanges: reading its input gates, routing each row to the subpartition of the
consumer that owns it, and writing its result partitions. For the Task (`task.py`), which decides
when to read and write; how a small exchange's files are kept and found is `batchexchange.py`'s.

Exchanges follow `common/graph/executiongraph.py` and the path scheme of `common/layout.py`: a producer
writes its partition of each output as Parquet under `partition_dir(.., attempt)` (in a streaming
query, the micro-batch's `batch_partition_dir`), split by subpartition when it feeds several
consumers: a small output (a bounded job's: Spark's estimate, at most the job's
`batch.exchange.in-memory.max-bytes`; a micro-batch's: what the batch read) collected as Arrow and
written as one `sub-<k>.parquet` file per subpartition (`batchexchange.py`), a larger one by
Spark's writer into `_sub=N/` directories; a consumer reads subpartition k of each partition in
its gate's range, whichever way it was written.

Which subpartition each row goes to is `routing.py`'s (`subpartition_column`): HASH by key group
into a keyed operator, so that a subtask receives exactly the keys whose state it owns, by the keys'
hash otherwise; REBALANCE and POINTWISE rescale round robin; BROADCAST whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from funke.common import layout
from funke.common.graph.deployment import ProducedPartition, ResultPartitionSpec, TaskDeployment
from funke.common.graph.jobgraph import exchange_in_memory_max_bytes
from funke.common.task.inputgates import GateSnapshot
from funke.taskmanager import batchexchange, iometrics
from funke.taskmanager.routing import subpartition_column
from funke.taskmanager.operators import classic
from funke.taskmanager.operators.context import RuntimeContext, arrow_compatible, column_ref, union_all

__all__ = ["TaskExchange", "partition_path"]


# ---- routing rows to the consumers' subpartitions (`routing.subpartition_column`) ----


def _routed(df: DataFrame, outputs: list[ResultPartitionSpec]) -> tuple[DataFrame, list[str | None]]:
    """`df` with a column per output that feeds several consumers: each row's subpartition
    of it (None for an output written unsplit), for one collect that serves every output."""
    routed, routing = df, []
    for i, out in enumerate(outputs):
        target = subpartition_column(out)
        column = f"__funke_sub_{i}" if target is not None else None
        if column is not None:
            routed = routed.withColumn(column, target)
        routing.append(column)
    return routed, routing


def _route(df: DataFrame, out: ResultPartitionSpec) -> tuple[DataFrame, bool]:
    """Adds the subpartition column for a partition that feeds several consumers."""
    target = subpartition_column(out)
    if target is None:
        return df, False
    return df.withColumn(layout.SUBPARTITION_COLUMN, target), True


# ---- where partitions are ----


def partition_path(ctx: RuntimeContext, data_set_id: str, partition_index: int, attempt: int) -> str:
    """A result partition's directory; in a streaming query, the current micro-batch's."""
    if ctx.batch is None:
        return layout.partition_dir(ctx.data_dir, ctx.job_id, data_set_id, partition_index, attempt)
    return layout.batch_partition_dir(ctx.data_dir, ctx.job_id, data_set_id, partition_index, attempt,
                                      ctx.batch.batch_id)


def _read_partitions(spark: SparkSession, schema: StructType, paths: list[str], subpartition: int | None) -> DataFrame:
    """Subpartition `subpartition` (None: all) of the partitions Spark's writer wrote at `paths`."""
    if not paths:
        return spark.createDataFrame([], schema)
    if subpartition is None:
        return spark.read.schema(schema).parquet(*paths)
    # One read per partition: Spark's partition discovery rejects several roots that each
    # hold `_sub=N` directories ("conflicting directory structures").
    # coalesce(_sub, 0): a producer that feeds a single consumer writes its partition unsplit
    # (no `_sub` directories), and that partition is subpartition 0 of itself.
    with_sub = StructType(schema.fields + [StructField(layout.SUBPARTITION_COLUMN, IntegerType())])
    sub = F.coalesce(column_ref(layout.SUBPARTITION_COLUMN), F.lit(0))
    parts = [
        spark.read.schema(with_sub).parquet(path).where(sub == subpartition).drop(layout.SUBPARTITION_COLUMN)
        for path in paths
    ]
    return union_all(parts)


# Operators that may return more rows than they read (flat_map's function, a keyed process
# function, a user's DataFrame function): Spark estimates their output at their input's size.
_MAY_MULTIPLY_ROWS = frozenset({"flat_map", "process", "transform"})
# Operators that make at most one row per key (a combiner, an aggregate): what comes before them
# in a chain does not make their output larger.
_ONE_ROW_PER_KEY = frozenset({"combine", "aggregate", "reduce", "count"})


def _may_multiply_rows(operators: Any) -> bool:
    """Whether a chain's output may hold rows that Spark's estimate does not foresee: an operator
    that may multiply its rows, not followed by one that makes a row per key (the word count's
    flat_map followed by its combiner has a row per distinct word, however many words)."""
    multiplied = False
    for op in operators:
        if op.kind in _MAY_MULTIPLY_ROWS:
            multiplied = True
        elif op.kind in _ONE_ROW_PER_KEY:
            multiplied = False
    return multiplied


# ---- one task's reads and writes ----


class TaskExchange:
    """One task attempt's reads of its input gates and writes of its result partitions, with,
    for a bounded task, the directories it read and wrote (measured once it finished:
    `measured`). It holds nothing of the task (no callback): a finished task is freed without
    the cycle collector."""

    def __init__(self, name: str, deployment: TaskDeployment):
        self._name = name
        self._deployment = deployment
        # partition directories (with the subpartition read) and the directories written
        self._read: list[tuple[str, int | None]] = []
        self._written: list[str] = []

    def measured(self) -> tuple[int, int, int]:
        """(records in, bytes in, bytes out) of the partitions read and written (`iometrics`)."""
        records_in, bytes_in = iometrics.records_and_bytes(self._read)
        _, bytes_out = iometrics.records_and_bytes((path, None) for path in self._written)
        return records_in, bytes_in, bytes_out

    def forget_written(self) -> None:
        """A query runs for long: keep no list of every batch's directories."""
        self._written.clear()

    # ---- reading ----

    def read_gate(self, ctx: RuntimeContext, gate: GateSnapshot) -> DataFrame:
        """Subpartition `gate.subpartition` of each partition of the gate: the exact files of one
        written in memory (`batchexchange.read_table`: from this TaskManager's memory when it wrote
        them all), Spark's read of one Spark's writer wrote."""
        schema = self._gate_schema(gate)
        paths = [partition_path(ctx, gate.data_set_id, p, a) for p, a in zip(gate.partitions, gate.attempts)]
        if ctx.batch is None:  # a bounded task's reads are measured once it finished (a query's never end)
            self._read += [(path, gate.subpartition) for path in paths]
        files: list[str] = []
        by_spark: list[str] = []
        for path in paths:
            found = batchexchange.in_memory_files(path, gate.subpartition)
            if found is None:
                by_spark.append(path)
            else:
                files += found
        if ctx.meter is not None:
            ctx.meter.bytes += batchexchange.file_bytes(files + by_spark)
        parts = []
        if files:  # from this TaskManager's memory when its tasks wrote them, else from the files
            table = batchexchange.read_table(files)
            parts.append(classic.frame_from_arrow(ctx, table, schema) if table is not None
                         else ctx.spark.read.schema(schema).parquet(*files))
            if ctx.meter is not None:  # the head's records in: a bounded task's are measured once it finished
                ctx.meter.partition_rows += table.num_rows if table is not None else iometrics.file_rows(files) or 0
        if by_spark or not parts:
            parts.append(_read_partitions(ctx.spark, schema, by_spark, gate.subpartition))
            if ctx.meter is not None and by_spark:
                ctx.meter.partition_rows += iometrics.records_and_bytes(
                    (path, gate.subpartition) for path in by_spark)[0]
        return union_all(parts)

    def _gate_schema(self, gate: GateSnapshot) -> StructType:
        if not gate.schema:
            raise ValueError(
                f"{self._name}: {gate.describe()} has no schema; its producers did not report one "
                "(a no-op chain's output cannot be read)"
            )
        return StructType.fromJson(json.loads(gate.schema))

    # ---- writing ----

    def write_outputs(self, ctx: RuntimeContext, df: DataFrame | None, check_cancelled: Callable[[], None]
                      ) -> tuple[ProducedPartition, ...]:
        """`df` written as the task's partition of each of its outputs, each row routed to its
        subpartition; `check_cancelled` raises when the task was cancelled (called between outputs)."""
        outputs = list(self._deployment.outputs)
        if not outputs or df is None:
            return ()
        if layout.SUBPARTITION_COLUMN in df.columns:
            raise ValueError(f"{self._name}: column {layout.SUBPARTITION_COLUMN!r} is reserved for routing rows to consumers")
        if arrow_compatible(df.schema):
            routed, routing = _routed(df, outputs)
            if self._small_output(ctx, routed):
                return self._write_in_memory(ctx, df.schema.json(), routed, routing, outputs, check_cancelled)
        return self._write_by_spark(ctx, df, outputs, check_cancelled)

    def _small_output(self, ctx: RuntimeContext, routed: DataFrame) -> bool:
        """Whether the output goes through memory (batchexchange). A micro-batch's when what the
        batch read is small. A bounded job's when Spark estimates it at most the job's
        EXCHANGE_IN_MEMORY_MAX_BYTES, and nothing in it may have made rows Spark cannot foresee
        (`_may_multiply_rows`; a generator such as explode, which Spark also estimates at its
        input's size): collecting such an output could exhaust the TaskManager, where Spark's
        writer streams it to files."""
        if ctx.batch is not None:
            assert ctx.meter is not None
            return ctx.meter.bytes <= batchexchange.IN_MEMORY_LIMIT_BYTES
        limit = exchange_in_memory_max_bytes(self._deployment.job_options)
        if limit == 0 or _may_multiply_rows(self._deployment.vertex.operators):
            return False
        estimate = batchexchange.estimated_bytes(routed, trust_generators=False)
        return estimate is not None and estimate <= limit

    def _write_in_memory(self, ctx: RuntimeContext, schema: str, routed: DataFrame, routing: list[str | None],
                         outputs: list[ResultPartitionSpec], check_cancelled: Callable[[], None]
                         ) -> tuple[ProducedPartition, ...]:
        """One collect as Arrow, however many outputs; each output's rows split by their
        subpartition column (`routing`) and written one Parquet file per subpartition."""
        table = classic.frame_to_arrow(ctx, routed)
        data = table.drop_columns([c for c in routing if c is not None])
        for out, column in zip(outputs, routing):
            check_cancelled()
            path = partition_path(ctx, out.data_set_id, out.partition_index, ctx.attempt_number)
            if ctx.batch is None:  # as `_read`
                self._written.append(path)
            if column is None:
                batchexchange.write_in_memory(path, data, None, 1)
            else:
                batchexchange.write_in_memory(path, data, table.column(column), out.num_subpartitions)
        return tuple(ProducedPartition(o.data_set_id, o.partition_index, schema, data.num_rows) for o in outputs)

    def _write_by_spark(self, ctx: RuntimeContext, df: DataFrame, outputs: list[ResultPartitionSpec],
                        check_cancelled: Callable[[], None]) -> tuple[ProducedPartition, ...]:
        schema = df.schema.json()
        # The row count rides along with the first write instead of costing a job of its own.
        rows = Observation()
        observed = df.observe(rows, F.count(F.lit(1)).alias("rows"))
        shared = len(outputs) > 1
        if shared:  # computed once, written once per consumer
            observed = observed.persist()
        try:
            for out in outputs:
                check_cancelled()
                path = partition_path(ctx, out.data_set_id, out.partition_index, ctx.attempt_number)
                self._written.append(path)
                routed, split = _route(observed, out)
                writer = routed.write.mode("overwrite")
                if split:
                    writer = writer.partitionBy(layout.SUBPARTITION_COLUMN)
                writer.parquet(path)
            row_count = int(rows.get["rows"])
        finally:
            if shared:
                observed.unpersist()
        return tuple(ProducedPartition(o.data_set_id, o.partition_index, schema, row_count) for o in outputs)
