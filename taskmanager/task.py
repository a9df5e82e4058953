"""The Task: one deployed execution attempt of a subtask that needs Spark, run in a thread of its own.

Owns running one `TaskDeployment` (`funke.common.graph.deployment`) to its end, independent of gRPC and
of the TaskManager's decisions: unpickling the chain's functions, waiting until the TaskManager's
core hands it its inputs (`give_inputs`, with the producer attempts to read), reading them, running
the operators (`operators/`), writing the result partitions, and telling what happened through a
callback: INITIALIZING, RUNNING, then exactly one of FINISHED (with the partitions written), FAILED
(with the failure, the user's own exception first) or CANCELED (it was interrupted). Whether a
cancelled task that still finished counts as CANCELED is the core's rule, not this module's.

Every Spark job of an attempt carries the attempt's tag, so cancel() can interrupt exactly those
jobs; it keeps re-sending the interrupt until `run` returns, which also catches a job submitted
just after the cancel.

Exchanges follow `common/graph/executiongraph.py` and the path scheme of `common/layout.py`: a producer
writes its partition of each output as Parquet under `partition_dir(.., attempt)`, split by
subpartition when it feeds several consumers (HASH: by key hash, otherwise round robin): a small
output (Spark's estimate, the job's `batch.exchange.in-memory.max-bytes`) collected as Arrow and
written as one `sub-<k>.parquet` file per subpartition (`batchexchange.py`), a larger one by
Spark's writer into `_sub=N/` directories; a consumer reads subpartition k of each partition in
its gate's range, whichever way it was written.

A streaming query's task is a `StreamTask`: it stays RUNNING and runs micro-batches as they are
given, each over its own batch-scoped partitions (`layout.batch_partition_dir`).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
from pyspark import SparkContext
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from funke.common import layout
from funke.common.graph.deployment import ProducedPartition, ResultPartitionSpec, TaskDeployment
from funke.common.graph.executiongraph import FailureInfo, OperatorIo, TaskIo
from funke.common.task.inputgates import GateSnapshot
from funke.common.graph.jobgraph import JobVertex, OperatorSpec, PartitionerKind, exchange_in_memory_max_bytes
from funke.common.graph.operators import CATALOGUE, OperatorRole
from funke.common.states import ExecutionState
from funke.common.streaming.sources import BatchInput
from funke.common.graph.streamingjob import CHECKPOINT, RUNNING_KINDS
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.state import StateMetrics, key_group_range, operator_dir
from funke.taskmanager import batchexchange, iometrics
from funke.taskmanager import streaming
from funke.taskmanager.receiver import SocketReceiver
from funke.taskmanager.operators import classic, udf
from funke.taskmanager.operators.keyedstate import measure
from funke.taskmanager.operators.context import InputMeter, RuntimeContext, SinkCount, arrow_compatible, column_ref
from funke.taskmanager.recordcounts import ChainCounter, writes_every_record
from funke.taskmanager.operators.transforms import union_all

__all__ = ["BatchReport", "StreamTask", "Task", "TaskCancelled", "Report", "check_vertex", "failure_of"]

log = logging.getLogger(__name__)

# state, why it FAILED (None otherwise), the partitions it produced (with FINISHED)
# (state, failure, produced, io): with FINISHED, the partitions produced and what the task read and wrote
Report = Callable[[ExecutionState, FailureInfo | None, tuple[ProducedPartition, ...], TaskIo | None], None]


# How often a cancelled task re-sends the interrupt while it winds down: a Spark job started
# just after cancel() (between a check of the flag and the job's submission) is caught by the
# next one.
_REINTERRUPT_INTERVAL_S = 0.5
# How long a cancelled task waits for Spark to kill its tasks before reporting CANCELED anyway.
_SPARK_QUIET_TIMEOUT_S = 15.0
# Off in a streaming task's own session (`_query_session`), as Structured Streaming has it.
ADAPTIVE_EXECUTION = "spark.sql.adaptive.enabled"


def failure_of(exc: BaseException) -> FailureInfo:
    """A task's failure as the user needs it.

    An exception raised by user code inside a Spark Python worker reaches the task as Spark's
    PythonException, whose message carries the worker's traceback. The root cause the user must
    see is their own exception (`ValueError: record 7 is cursed`) with their own frames, not
    Spark's wrapper: unwrap it, and drop the frames of funke's operator runtime around the call.
    Anything else keeps its type, message and the TaskManager-side traceback."""
    text = str(exc)
    if type(exc).__name__ == "PythonException":
        found = udf.user_exception(text)
        if found is not None:
            return FailureInfo(*found)
    return FailureInfo(type(exc).__name__, text, traceback.format_exc())


class TaskCancelled(Exception):
    """Raised inside `run` when the task notices cancel() between two steps."""


def check_vertex(vertex: JobVertex) -> JobVertex:
    """The vertex, checked against the catalogue and this TaskManager's operators (ValueError
    otherwise): what the JobManager validated, checked again where it runs."""
    if not vertex.operators:
        raise ValueError(f"vertex {vertex.id!r} has no operators")
    for i, op in enumerate(vertex.operators):
        kind = CATALOGUE.get(op.kind)
        if kind is None or streaming.operator(op.kind) is None:
            raise ValueError(f"vertex {vertex.id!r}, operator {i} '{op.display_name}': unknown kind {op.kind!r}")
        if kind.role is OperatorRole.SOURCE and i != 0:
            raise ValueError(f"vertex {vertex.id!r}: source '{op.display_name}' is not the head of the chain")
        if kind.role is OperatorRole.SINK and i != len(vertex.operators) - 1:
            raise ValueError(f"vertex {vertex.id!r}: sink '{op.display_name}' is not the tail of the chain")
        if kind.needs_function and not op.function:
            raise ValueError(f"vertex {vertex.id!r}: '{op.display_name}' ({op.kind}) needs a function")
    return vertex


@dataclass(frozen=True, slots=True)
class _Chain:
    """A decoded operator chain, checked against the catalogue, functions unpickled."""

    vertex: JobVertex
    functions: tuple[object | None, ...]

    @classmethod
    def of(cls, vertex: JobVertex) -> _Chain:
        # Unpickled per task, not cached with the vertex: each subtask gets its own function
        # objects.
        check_vertex(vertex)
        return cls(vertex, tuple(_unpickle(vertex, op) if op.function else None for op in vertex.operators))

    @property
    def ends_in_sink(self) -> bool:
        return CATALOGUE[self.vertex.operators[-1].kind].role is OperatorRole.SINK

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(op.kind for op in self.vertex.operators)

    def run(self, ctx: RuntimeContext, inputs: list[DataFrame], counter: ChainCounter | None = None
            ) -> DataFrame | None:
        """Builds the chain on the inputs (each operator's output handed to `counter`, which
        may observe it); runs the sink if there is one, else returns the tail's DataFrame (lazy)."""
        df: DataFrame | None = None
        if counter is not None:
            counter.reads(inputs)
        for i, op in enumerate(self.vertex.operators):
            role = CATALOGUE[op.kind].role
            impl = streaming.operator(op.kind)
            assert impl is not None
            if ctx.meter is not None:
                ctx.meter.at = i  # which operator of the chain observes what (event time)
            if role is OperatorRole.SOURCE:
                df = _small_batch(ctx, impl(ctx, op))
            elif role is OperatorRole.TRANSFORM:
                df = impl(ctx, op, inputs if i == 0 else [df])
            else:
                if i == 0:  # a vertex that is only a sink
                    if len(inputs) != 1:
                        raise ValueError(f"sink '{op.display_name}' takes one input, got {len(inputs)}")
                    df = inputs[0]
                # A sink with a function runs it here, on the TaskManager (foreach_batch): the
                # object unpickled at INITIALIZING, so that what it keeps lives across batches.
                if self.functions[i] is None:
                    impl(ctx, op, df)
                else:
                    impl(ctx, op, df, self.functions[i])
                return None
            if counter is not None:
                df = counter.emitted(i, df)
        return df


def _unpickle(vertex: JobVertex, op: OperatorSpec) -> object:
    # Done at INITIALIZING, on the TaskManager, so that a function that does not load here (a
    # module missing, a Python version mismatch) fails the task before any Spark job runs.
    try:
        fn = cloudpickle.loads(op.function)
    except Exception as e:
        raise RuntimeError(
            f"vertex {vertex.id!r}: the function of '{op.display_name}' ({op.kind}) cannot be "
            f"unpickled: {type(e).__name__}: {e}"
        ) from e
    if op.kind == "process":  # a keyed process function: an object with process(key, rows, ctx)
        if not callable(getattr(fn, "process", None)):
            raise TypeError(f"vertex {vertex.id!r}: the function of '{op.display_name}' is a {type(fn).__name__} "
                            "without a process(key, rows, ctx) method")
    elif not callable(fn):
        raise TypeError(f"vertex {vertex.id!r}: the function of '{op.display_name}' is a {type(fn).__name__}, not callable")
    return fn


def _classic_context(spark: SparkSession | None) -> SparkContext | None:
    """The SparkContext behind a classic session; None for Spark Connect, which has none.

    Why a task needs it at all: a classic session resolves `interruptTag` through a thread-local
    map (the real job tag embeds a per-thread id), so cancel(), called from another thread, would
    interrupt nothing. SparkContext job tags are matched globally and work from any thread. On
    Spark Connect the server matches session tags from any client thread, so `interruptTag`
    suffices there.
    """
    if spark is None:
        return None
    try:
        return spark.sparkContext
    except (PySparkNotImplementedError, AttributeError):
        return None


def _tag(job_id: str, vertex_id: str, subtask: int, attempt: int) -> str:
    # Spark rejects tags with ',' and empty ones; keep them readable in the Spark UI.
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"funke-{job_id}-{vertex_id}-{subtask}-{attempt}")


def _report_nothing(state: ExecutionState, failure: FailureInfo | None,
                    produced: tuple[ProducedPartition, ...], io: TaskIo | None = None) -> None:
    pass


class Task:
    """Runs one TaskDeployment in the calling thread (`run` blocks: give it a thread of its own).
    `give_inputs` and `cancel` may be called from any thread, at any time, also before `run`;
    `inputs` given to the constructor count as given at once (a task without inputs needs none)."""

    def __init__(self, deployment: TaskDeployment, spark: SparkSession | None, report: Report, *,
                 inputs: tuple[GateSnapshot, ...] | None = None):
        self.deployment = deployment
        self.spark = spark
        self._report = report
        self._lock = threading.Lock()
        self._inputs_ready = threading.Condition(self._lock)
        self._inputs = inputs if inputs is not None else (() if not deployment.inputs else None)
        self._cancelled = False
        self._started = False
        self._done = False
        self._done_event = threading.Event()  # ends the re-interrupting
        self._reinterrupting = False
        # What it read and wrote, measured once it finished (iometrics): partition directories
        # (with the subpartition read) and the directories written.
        self._read: list[tuple[str, int | None]] = []
        self._written: list[str] = []
        self._memo: dict[Any, Any] | None = None  # a StreamTask's (RuntimeContext.memo)
        self._counter: ChainCounter | None = None  # the records of the chain's latest run

    @property
    def name(self) -> str:
        d = self.deployment
        return d.task_name or f"{d.attempt.vertex_id} ({d.attempt.subtask_index + 1}/{d.parallelism})"

    # The tag and the SparkContext are looked up when Spark needs them.
    @functools.cached_property
    def tag(self) -> str:
        a = self.deployment.attempt
        return _tag(self.deployment.job_id, a.vertex_id, a.subtask_index, a.attempt_number)

    @functools.cached_property
    def _context(self) -> SparkContext | None:
        return _classic_context(self.spark)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # ---- control, from other threads ----

    def give_inputs(self, gates: tuple[GateSnapshot, ...]) -> None:
        """Every input is complete: what to read (per partition, the producer attempt)."""
        with self._lock:
            self._inputs = gates
            self._inputs_ready.notify_all()

    def cancel(self) -> None:
        with self._lock:
            first = not self._cancelled
            self._cancelled = True
            self._inputs_ready.notify_all()
            running = self._started and not self._done
            start_reinterrupting = running and not self._reinterrupting
            self._reinterrupting = self._reinterrupting or start_reinterrupting
        if first:
            log.info("%s: cancelling", self.name)
        self._interrupt()
        if first and running:
            self._mark_cancelled()
        if start_reinterrupting:
            threading.Thread(target=self._keep_interrupting, name=f"{self.tag}-cancel", daemon=True).start()

    def _interrupt(self) -> None:
        if self.spark is None:
            return
        try:
            self.spark.interruptTag(self.tag)
            if self._context is not None:
                self._context.cancelJobsWithTag(self.tag)
        except Exception:  # a stopped session: nothing is running any more
            log.debug("%s: interrupting tag %s failed", self.name, self.tag, exc_info=True)

    def _mark_cancelled(self) -> None:
        """Creates the attempt's cancel marker: its Python workers end themselves on seeing it
        (see `operators.udf.cancellable`), long before Spark's own monitor would kill them."""
        d = self.deployment
        marker = layout.cancel_marker(d.data_dir, d.job_id, d.attempt.vertex_id, d.attempt.subtask_index,
                                      d.attempt.attempt_number)
        if marker is None:
            return
        try:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w"):
                pass
        except OSError:  # Spark's own kill still comes, later
            log.debug("%s: could not create the cancel marker %s", self.name, marker, exc_info=True)

    def _await_spark_tasks_gone(self, timeout_s: float = _SPARK_QUIET_TIMEOUT_S) -> None:
        """A cancelled Spark job returns at once, but its tasks end only when the executor has
        killed them — for Python UDFs, when Spark has destroyed the Python worker running the
        user's function. CANCELED means the work has stopped, so wait for that (classic Spark:
        the status tracker's active tasks of this attempt's jobs; Spark Connect has no tracker
        and the server does its own clean-up)."""
        if self._context is None:
            return
        try:
            tracker = self._context.statusTracker()
            # PySpark's tracker cannot look jobs up by tag; the JVM's can.
            jvm_tracker = self._context._jsc.sc().statusTracker()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                active = 0
                for job_id in jvm_tracker.getJobIdsForTag(self.tag):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in (job.stageIds if job else ()):
                        stage = tracker.getStageInfo(stage_id)
                        active += stage.numActiveTasks if stage else 0
                if not active:
                    return
                time.sleep(0.05)
            log.warning("%s: Spark tasks still active %.0f s after cancellation", self.name, timeout_s)
        except Exception:  # never let the wait keep the task from reporting
            log.warning("%s: could not check that its Spark tasks ended", self.name, exc_info=True)

    def _keep_interrupting(self) -> None:
        while not self._done_event.wait(_REINTERRUPT_INTERVAL_S):
            self._interrupt()

    def _check_cancelled(self) -> None:
        if self._cancelled:
            raise TaskCancelled(self.name)

    # ---- the task thread ----

    def run(self) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError(f"{self.name}: run() was already called")
            self._started = True
        tagged = False
        started = time.monotonic()
        try:
            if self.spark is not None:
                # Tags are thread-local: every Spark job this thread starts carries them.
                self.spark.addTag(self.tag)
                if self._context is not None:
                    self._context.addJobTag(self.tag)
                tagged = True
            produced = self._run()
        except Exception as e:
            if self._cancelled:  # an interrupted Spark job raises: the interrupt is the cause
                self._await_spark_tasks_gone()
                log.info("%s: canceled", self.name)
                self._report(ExecutionState.CANCELED, None, ())
            else:
                log.warning("%s: failed: %s: %s", self.name, type(e).__name__, e)
                self._report(ExecutionState.FAILED, failure_of(e), ())
        else:
            self._report(ExecutionState.FINISHED, None, produced, self._io(produced, time.monotonic() - started))
        finally:
            with self._lock:
                self._done = True
            self._done_event.set()
            # Nothing is reported after the terminal state; letting go of the callback also frees
            # the task without the cycle collector.
            self._report = _report_nothing
            if tagged:
                try:
                    self.spark.removeTag(self.tag)
                    if self._context is not None:
                        self._context.removeJobTag(self.tag)
                except Exception:  # a stopped session: the tags went with it
                    log.debug("%s: removing tag %s failed", self.name, self.tag, exc_info=True)

    def _io(self, produced: tuple[ProducedPartition, ...], seconds: float) -> TaskIo:
        records_in, bytes_in = iometrics.measure(self._read)
        _, bytes_out = iometrics.measure((path, None) for path in self._written)
        # every output gets all the chain's rows: the rows out are one output's
        records_out = produced[0].row_count if produced else None
        operators = self._operator_io(records_in, records_out)
        return TaskIo(_first(operators[0].records_in if operators else None, records_in),
                      _first(operators[-1].records_out if operators else None, records_out, 0),
                      bytes_in, bytes_out, seconds, operators=operators)

    def _operator_io(self, head_in: int | None, produced: int | None) -> tuple[OperatorIo, ...]:
        """Each operator's records in the chain's latest run (`recordcounts`); none counted
        rather than failing a run that succeeded."""
        counter = self._counter
        if counter is None:
            return ()
        try:
            return counter.operators(head_in, produced)
        except Exception:
            log.warning("%s: could not count the records of its operators", self.name, exc_info=True)
            return ()

    def _start_chain(self) -> _Chain:
        """INITIALIZING while the chain's functions are unpickled, then RUNNING."""
        self._check_cancelled()
        self._report(ExecutionState.INITIALIZING, None, ())
        chain = _Chain.of(self.deployment.vertex)
        self._check_cancelled()
        self._report(ExecutionState.RUNNING, None, ())
        return chain

    def _run(self) -> tuple[ProducedPartition, ...]:
        chain = self._start_chain()
        gates = self._await_inputs()
        return self._run_chain(chain, self._runtime_context(), gates)

    def _runtime_context(self, batch: BatchInput | None = None) -> RuntimeContext:
        if self.spark is None:
            raise RuntimeError(f"{self.name}: the chain needs Spark, but this task has no SparkSession")
        d = self.deployment
        return RuntimeContext(
            spark=self.spark,
            job_id=d.job_id,
            vertex_id=d.attempt.vertex_id,
            subtask_index=d.attempt.subtask_index,
            parallelism=d.parallelism,
            attempt_number=d.attempt.attempt_number,
            data_dir=d.data_dir,
            batch=batch,
            meter=InputMeter() if batch is not None else None,
            checkpoint=d.job_options.get(CHECKPOINT, ""),
            max_parallelism=d.vertex.effective_max_parallelism,
            options=d.job_options,
            memo=self._memo,
            written=SinkCount(),
        )

    def _read_inputs(self, ctx: RuntimeContext, gates: tuple[GateSnapshot, ...]) -> list[DataFrame]:
        return [self._read_gate(ctx, gate) for gate in gates]

    def _run_chain(self, chain: _Chain, ctx: RuntimeContext, gates: tuple[GateSnapshot, ...]
                   ) -> tuple[ProducedPartition, ...]:
        inputs = self._read_inputs(ctx, gates)
        self._check_cancelled()
        self._counter = ChainCounter(ctx, chain.kinds, has_outputs=bool(self.deployment.outputs))
        tail = chain.run(ctx, inputs, self._counter)
        if chain.ends_in_sink:
            if self.deployment.outputs:
                raise ValueError(f"{self.name}: the chain ends in a sink but the task has "
                                 f"{len(self.deployment.outputs)} output(s)")
            return ()
        return self._write_outputs(ctx, tail)

    def _await_inputs(self) -> tuple[GateSnapshot, ...]:
        """Blocks until the TaskManager hands over the inputs (or the task is cancelled)."""
        with self._lock:
            while self._inputs is None:
                if self._cancelled:
                    raise TaskCancelled(self.name)
                log.debug("%s: waiting for its inputs", self.name)
                self._inputs_ready.wait()
            if self._cancelled:
                raise TaskCancelled(self.name)
            return self._inputs

    def _read_gate(self, ctx: RuntimeContext, gate: GateSnapshot) -> DataFrame:
        """Subpartition `gate.subpartition` of each partition of the gate: the exact files of one
        written in memory (`batchexchange.read_table`: from this TaskManager's memory when it wrote
        them all), Spark's read of one Spark's writer wrote."""
        schema = self._gate_schema(gate)
        paths = [_partition_path(ctx, gate.data_set_id, p, a) for p, a in zip(gate.partitions, gate.attempts)]
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
                ctx.meter.partition_rows += iometrics.measure((path, gate.subpartition) for path in by_spark)[0]
        return union_all(parts)

    def _gate_schema(self, gate: GateSnapshot) -> StructType:
        if not gate.schema:
            raise ValueError(
                f"{self.name}: {gate.describe()} has no schema; its producers did not report one "
                "(a no-op chain's output cannot be read)"
            )
        return StructType.fromJson(json.loads(gate.schema))

    def _write_outputs(self, ctx: RuntimeContext, df: DataFrame | None) -> tuple[ProducedPartition, ...]:
        outputs = list(self.deployment.outputs)
        if not outputs or df is None:
            return ()
        if layout.SUBPARTITION_COLUMN in df.columns:
            raise ValueError(f"{self.name}: column {layout.SUBPARTITION_COLUMN!r} is reserved for routing rows to consumers")
        if arrow_compatible(df.schema):
            routed, routing = _routed(df, outputs)
            if self._small_output(ctx, routed):
                return self._write_in_memory(ctx, df.schema.json(), routed, routing, outputs)
        return self._write_by_spark(ctx, df, outputs)



    def _small_output(self, ctx: RuntimeContext, routed: DataFrame) -> bool:
        """Whether the output goes through memory (batchexchange): a bounded job's when Spark
        estimates it at most the job's EXCHANGE_IN_MEMORY_MAX_BYTES, and nothing in it may have
        made rows Spark cannot foresee (`_may_multiply_rows`; a generator such as explode, which
        Spark also estimates at its input's size): collecting such an output could exhaust the
        TaskManager, where Spark's writer streams it to files."""
        limit = exchange_in_memory_max_bytes(self.deployment.job_options)
        if limit == 0 or _may_multiply_rows(self.deployment.vertex.operators):
            return False
        estimate = batchexchange.estimated_bytes(routed, trust_generators=False)
        return estimate is not None and estimate <= limit

    def _write_in_memory(self, ctx: RuntimeContext, schema: str, routed: DataFrame, routing: list[str | None],
                         outputs: list[ResultPartitionSpec]) -> tuple[ProducedPartition, ...]:
        """One collect as Arrow, however many outputs; each output's rows split by their
        subpartition column (`routing`) and written one Parquet file per subpartition."""
        table = classic.frame_to_arrow(ctx, routed)
        data = table.drop_columns([c for c in routing if c is not None])
        for out, column in zip(outputs, routing):
            self._check_cancelled()
            path = _partition_path(ctx, out.data_set_id, out.partition_index, ctx.attempt_number)
            if ctx.batch is None:  # as `_read`
                self._written.append(path)
            if column is None:
                batchexchange.write_in_memory(path, data, None, 1)
            else:
                batchexchange.write_in_memory(path, data, table.column(column), out.num_subpartitions)
        return tuple(ProducedPartition(o.data_set_id, o.partition_index, schema, data.num_rows) for o in outputs)

    def _write_by_spark(self, ctx: RuntimeContext, df: DataFrame, outputs: list[ResultPartitionSpec]
                        ) -> tuple[ProducedPartition, ...]:
        schema = df.schema.json()
        # The row count rides along with the first write instead of costing a job of its own.
        rows = Observation()
        observed = df.observe(rows, F.count(F.lit(1)).alias("rows"))
        shared = len(outputs) > 1
        if shared:  # computed once, written once per consumer
            observed = observed.persist()
        try:
            for out in outputs:
                self._check_cancelled()
                path = _partition_path(ctx, out.data_set_id, out.partition_index, ctx.attempt_number)
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


def _partition_path(ctx: RuntimeContext, data_set_id: str, partition_index: int, attempt: int) -> str:
    """A result partition's directory; in a streaming query, the current micro-batch's."""
    if ctx.batch is None:
        return layout.partition_dir(ctx.data_dir, ctx.job_id, data_set_id, partition_index, attempt)
    return layout.batch_partition_dir(ctx.data_dir, ctx.job_id, data_set_id, partition_index, attempt,
                                      ctx.batch.batch_id)


# batch id, the partitions written, the rows its stream source read (None: not a source, or not counted)
BatchReport = Callable[[int, tuple[ProducedPartition, ...], int | None, TaskIo | None], None]

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


class StreamTask(Task):
    """A streaming query's task, long-lived as in Flink: deployed once, RUNNING until the query
    stops, it runs the micro-batches it is given, one at a time, in the order given: for each,
    its chain over the batch's input (stream sources read the batch's ranges, inputs are the
    batch's partitions of the producers), its outputs written as the batch's partitions, its
    sinks staged for the batch; then `batch_report(batch_id, produced)`. `finish()` ends it
    FINISHED once the batches given are done; `cancel()` ends it CANCELED at once. A batch that
    fails fails the task (the job's failover restarts the query from its checkpoint)."""

    def __init__(self, deployment: TaskDeployment, spark: SparkSession | None, report: Report,
                 batch_report: BatchReport):
        super().__init__(deployment, spark, report, inputs=())
        self._batch_report = batch_report
        self._batches: collections.deque[tuple[BatchInput, tuple[GateSnapshot, ...]]] = collections.deque()
        self._finishing = False
        self._receiver: SocketReceiver | None = None  # a receiver source's, while the task runs
        self._rate_limit: float | None = None  # backpressure's latest, for the receiver
        self._memo = {}  # what its operators build once for all its batches

    def run(self) -> None:
        self.spark = _query_session(self.spark, self.name)  # a Py4J call: in the task's thread
        super().run()

    def give_batch(self, batch: BatchInput, gates: tuple[GateSnapshot, ...] = ()) -> None:
        """Run batch `batch` next (with `gates`: what to read of each input for this batch)."""
        with self._lock:
            self._batches.append((batch, gates))
            self._inputs_ready.notify_all()
        rate = batch.rate_limits.get(self.deployment.attempt.vertex_id)
        if rate is not None:
            self.set_rate_limit(rate)

    def set_rate_limit(self, records_per_second: float | None) -> None:
        """Backpressure: this task's receiver takes at most so many records a second from now
        on (None: no limit but its max_rate); kept for a receiver that has not started yet."""
        with self._lock:
            self._rate_limit = records_per_second
            receiver = self._receiver
        if receiver is not None:
            receiver.set_rate(records_per_second)

    def finish(self) -> None:
        """End FINISHED once every batch given so far has run (a graceful stop)."""
        with self._lock:
            self._finishing = True
            self._inputs_ready.notify_all()

    def _next_batch(self) -> tuple[BatchInput, tuple[GateSnapshot, ...]] | None:
        with self._lock:
            while not self._batches:
                if self._cancelled:
                    raise TaskCancelled(self.name)
                if self._finishing:
                    return None
                self._inputs_ready.wait()
            if self._cancelled:
                raise TaskCancelled(self.name)
            return self._batches.popleft()

    # ---- a batch's exchanges (funke.taskmanager.batchexchange) ----

    def _read_inputs(self, ctx: RuntimeContext, gates: tuple[GateSnapshot, ...]) -> list[DataFrame]:
        inputs = [self._read_gate(ctx, gate) for gate in gates]
        return [_small_batch(ctx, df) for df in inputs]  # once every gate's bytes are known

    def _small_output(self, ctx: RuntimeContext, routed: DataFrame) -> bool:
        """A micro-batch's output goes through memory when what the batch read is small."""
        assert ctx.meter is not None
        return ctx.meter.bytes <= batchexchange.IN_MEMORY_LIMIT_BYTES

    def _run(self) -> tuple[ProducedPartition, ...]:
        chain = self._start_chain()
        receiver = self._start_receiver(chain)
        try:
            while (item := self._next_batch()) is not None:
                batch, gates = item
                if receiver is not None and receiver.error is not None:
                    raise RuntimeError(f"{self.name}: its receiver stopped: {type(receiver.error).__name__}: "
                                       f"{receiver.error}") from receiver.error
                log.debug("%s: batch %d", self.name, batch.batch_id)
                ctx = self._runtime_context(batch)
                began = time.monotonic()
                produced = self._run_chain(chain, ctx, gates)
                input_rows = self._input_rows(chain, ctx)
                assert ctx.meter is not None
                # A batch's exchanges live in memory mostly: records in are its head's (a source:
                # the records it read), bytes in what it read of its inputs; bytes out are not
                # measured.
                event_time, late_rows = self._event_time(chain, ctx)
                head_reads = CATALOGUE[chain.vertex.operators[0].kind].role is not OperatorRole.SOURCE
                records_out = produced[0].row_count if produced else None
                operators = self._operator_io(ctx.meter.partition_rows if head_reads else None, records_out)
                io = TaskIo(_first(operators[0].records_in if operators else None, input_rows, 0),
                            _first(operators[-1].records_out if operators else None, records_out, 0),
                            ctx.meter.bytes, 0, time.monotonic() - began, self._state_after(chain, ctx), event_time,
                            late_rows, operators)
                self._written.clear()  # a query runs for long: keep no list of every batch's directories
                self._batch_report(batch.batch_id, produced, input_rows, io)
        finally:
            if receiver is not None:
                receiver.stop()
        return ()

    def _state_after(self, chain: _Chain, ctx: RuntimeContext) -> StateMetrics | None:
        """The chain's keyed operator's state after the batch that just ran (None: it has none)."""
        if chain.vertex.operators[0].kind not in RUNNING_KINDS or not ctx.checkpoint or ctx.batch is None:
            return None
        owned = key_group_range(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index)
        version = ctx.batch.batch_id + 1  # written by this batch, with the token its lineage gives this run
        token = ctx.batch.state.token(version) if ctx.batch.state is not None else None
        return measure(operator_dir(ctx.checkpoint, ctx.vertex_id), owned, version, token or "")

    def _start_receiver(self, chain: _Chain) -> SocketReceiver | None:
        """A receiver source's receiver, started once the task is RUNNING (taskmanager/receiver.py)."""
        head = chain.vertex.operators[0]
        source = streaming.TASK_SOURCES.get(head.kind)
        if source is None or source.receiver is None:
            return None
        checkpoint = self.deployment.job_options.get(CHECKPOINT, "")
        if not checkpoint:
            raise ValueError(f"{self.name}: a receiver needs the query's checkpoint location, and the task has none")
        d = self.deployment
        receiver = source.receiver(head.config, checkpoint, d.attempt.vertex_id, d.attempt.subtask_index, self.name)
        with self._lock:
            self._receiver = receiver
            receiver.set_rate(self._rate_limit)
        receiver.start()
        return receiver

    def _event_time(self, chain: _Chain, ctx: RuntimeContext) -> tuple[dict[str, EventTimeStats], int]:
        """What the chain's watermark operators saw of the batch's event times, and the rows its
        window operator found late (nothing when its rows were not all read: a sink that reads
        only some ends the chain)."""
        meter = ctx.meter
        assert meter is not None
        if not meter.event_time and not meter.late:
            return {}, 0
        if not _runs_every_row(chain):
            return {}, 0
        stats = {}
        for operator, observation in meter.event_time.items():
            seen = _observed(observation)
            if seen.get("count"):
                stats[operator] = EventTimeStats(int(seen["min"]), int(seen["max"]), float(seen["sum"] or 0.0),
                                                 int(seen["count"]))
        return stats, sum(int(_observed(o).get("late") or 0) for o in meter.late)

    def _input_rows(self, chain: _Chain, ctx: RuntimeContext) -> int | None:
        """The rows this task's stream source read in the batch (None: it has none, or its chain
        did not run every row)."""
        if CATALOGUE[chain.vertex.operators[0].kind].role is not OperatorRole.SOURCE:
            return None
        if not _runs_every_row(chain):
            return None
        assert ctx.meter is not None
        return ctx.meter.counted_rows()


def _runs_every_row(chain: _Chain) -> bool:
    """Whether a streaming chain's batch runs every row, so that its observations have their
    counts once it ran: it ends in its outputs, or in a sink that writes every row it receives
    (print shows the first rows only, and what foreach_batch's function reads is the user's)."""
    return not chain.ends_in_sink or writes_every_record(chain.vertex.operators[-1].kind, streaming=True)


def _first(*counts: int | None) -> int:
    """The first count that is measured (0: none is)."""
    return next((c for c in counts if c is not None), 0)


def _query_session(spark: SparkSession | None, name: str) -> SparkSession | None:
    """A streaming task's own session, as Structured Streaming runs each query in a session of its
    own: the TaskManager's Spark settings, with adaptive query execution off, as Structured
    Streaming has it. Adaptive execution re-plans a query's stages as they run: a micro-batch's
    partitions must stay as planned, and for a small batch it costs a second planning and a
    thread hand-off in the JVM, 10-15% of its CPU time. Spark Connect: the session as it is
    (the server's to configure)."""
    if spark is None or not hasattr(spark, "_jsparkSession"):
        return spark
    try:
        session = spark.newSession()
        session.conf.set(ADAPTIVE_EXECUTION, "false")
    except Exception as e:  # a stopped session: the task fails on its first batch, saying so
        log.warning("%s: runs in the TaskManager's session: a session of its own failed: %s", name, e)
        return spark
    return session


def _small_batch(ctx: RuntimeContext, df: DataFrame) -> DataFrame:
    """A micro-batch's input in one Spark partition when the batch is small
    (`batchexchange.ONE_PARTITION_LIMIT_BYTES`): an aggregate or join over a single partition
    plans no shuffle. A bounded job's input, and a large batch's, stay as Spark reads them."""
    if ctx.meter is None or ctx.meter.bytes > batchexchange.ONE_PARTITION_LIMIT_BYTES:
        return df
    return df.coalesce(1)


def _observed(observation: Observation) -> dict:
    """An observation's metrics once the batch's action ran; {} when Spark planned the observed
    rows away (an empty input: its optimizer drops what observes no rows, and the observation
    ends without metrics)."""
    try:
        return observation.get
    except Exception:  # Py4JJavaError: the metrics row is empty
        return {}


def _routed(df: DataFrame, outputs: list[ResultPartitionSpec]) -> tuple[DataFrame, list[str | None]]:
    """`df` with a column per output that feeds several consumers: each row's subpartition
    of it (None for an output written unsplit), for one collect that serves every output."""
    routed, routing = df, []
    for i, out in enumerate(outputs):
        target = _subpartition_of(out)
        column = f"__funke_sub_{i}" if target is not None else None
        if column is not None:
            routed = routed.withColumn(column, target)
        routing.append(column)
    return routed, routing


def _route(df: DataFrame, out: ResultPartitionSpec) -> tuple[DataFrame, bool]:
    """Adds the subpartition column for a partition that feeds several consumers."""
    target = _subpartition_of(out)
    if target is None:
        return df, False
    return df.withColumn(layout.SUBPARTITION_COLUMN, target), True


def _subpartition_of(out: ResultPartitionSpec) -> Column | None:
    """Each row's subpartition of a partition that feeds several consumers (None: unsplit)."""
    n = out.num_subpartitions
    if n <= 1 or out.partitioner is PartitionerKind.BROADCAST:
        return None
    if out.partitioner is PartitionerKind.HASH:
        keys = list(out.partition_keys)
        if not keys:
            raise ValueError(f"data set {out.data_set_id!r}: HASH partitioning without keys")
        hashed = F.hash(*[column_ref(k) for k in keys])
        if out.key_groups >= n:  # into a streaming query's vertex: the subtask owning the key group
            target = F.floor(F.pmod(hashed, F.lit(out.key_groups)) * F.lit(n) / F.lit(out.key_groups))
        else:
            target = F.pmod(hashed, F.lit(n))
    else:
        # REBALANCE, and POINTWISE rescale (one partition split among its consumers): round robin.
        target = F.pmod(F.monotonically_increasing_id(), F.lit(n))
    return target.cast("int")
