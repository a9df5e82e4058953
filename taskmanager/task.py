"""The Task: one deployed execution attempt of a subtask, run to a terminal state.

Owns the life of one TaskDeploymentDescriptor on a TaskManager, independent of gRPC: decoding the
chain, waiting for input partitions, reading the input gates, running the operators
(`operators.py`), writing the result partitions, and reporting the ExecutionState changes
(INITIALIZING, RUNNING, then exactly one of FINISHED / FAILED / CANCELED) through a callback;
a task cancelled before it reached a state does not report that state. Cancel wins: a task
cancelled while it fails or finishes reports CANCELED. The TaskExecutor owns the thread that
calls `run`, and forwards CancelTasks and UpdatePartitionInfo to `cancel` and `update_partition`
from its own threads.

Every Spark job of an attempt carries the attempt's tag, so cancel() can interrupt exactly those
jobs; it keeps re-sending the interrupt until `run` returns, which also catches a job submitted
just after the cancel.

Exchanges follow `common/executiongraph.py` and the path scheme of `common/layout.py`: a producer
writes its partition of each output as Parquet under `partition_dir(.., attempt)`, split into
`_sub=N/` directories when it feeds several consumers (HASH: by key hash, otherwise round robin);
a consumer reads subpartition k of each partition in its gate's range.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import cloudpickle
from pyspark import SparkContext
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from funke.common import layout
from funke.common.executiongraph import FailureInfo
from funke.common.jobgraph import JobVertex, OperatorSpec
from funke.common.operators import CATALOGUE, NOOP_KINDS, OperatorRole
from funke.common.states import ExecutionState
from funke.common.wire import vertex_from_proto
from funke.taskmanager import operators as operators_module
from funke.taskmanager.operators import OPERATORS, RuntimeContext, column_ref, union_all
from funke.v1 import cluster_pb2, jobgraph_pb2

__all__ = ["Task", "TaskCancelled", "Report"]

log = logging.getLogger(__name__)

# state, why it FAILED (None otherwise), the partitions it produced (with FINISHED)
Report = Callable[[ExecutionState, FailureInfo | None, list[cluster_pb2.ProducedPartition]], None]

UNAVAILABLE = -1  # a producer attempt that is not known yet (InputGateDeploymentDescriptor)

# How often a cancelled task re-sends the interrupt while it winds down: a Spark job started
# just after cancel() (between a check of the flag and the job's submission) is caught by the
# next one.
_REINTERRUPT_INTERVAL_S = 0.5
# How long a cancelled task waits for Spark to kill its tasks before reporting CANCELED anyway.
_SPARK_QUIET_TIMEOUT_S = 15.0


_WORKER_TRACEBACK = "Traceback (most recent call last):"
_OPERATORS_FILE = operators_module.__file__


def failure_of(exc: BaseException) -> FailureInfo:
    """A task's failure as the user needs it.

    An exception raised by user code inside a Spark Python worker reaches the task as Spark's
    PythonException, whose message carries the worker's traceback. The root cause the user must
    see is their own exception (`ValueError: record 7 is cursed`) with their own frames, not
    Spark's wrapper: unwrap it, and drop the frames of funke's operator runtime around the call.
    Anything else keeps its type, message and the TaskManager-side traceback."""
    text = str(exc)
    if type(exc).__name__ == "PythonException" and _WORKER_TRACEBACK in text:
        worker = text[text.rindex(_WORKER_TRACEBACK):].rstrip()
        last = worker.splitlines()[-1]
        exception_type, _, message = last.partition(": ")
        if re.fullmatch(r"[A-Za-z_][\w.]*", exception_type):
            return FailureInfo(exception_type, message, _without_runtime_frames(worker))
    return FailureInfo(type(exc).__name__, text, traceback.format_exc())


def _without_runtime_frames(worker_traceback: str) -> str:
    kept: list[str] = []
    skipping = False
    for line in worker_traceback.splitlines():
        if line.startswith('  File "'):
            skipping = line.startswith(f'  File "{_OPERATORS_FILE}"')
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"


class TaskCancelled(Exception):
    """Raised inside `run` when the task notices cancel() between two steps."""


@dataclass(slots=True)
class _InputGate:
    """One input's partitions and the producer attempt of each; mutated by update_partition."""

    input_index: int
    data_set_id: str
    partitions: range
    subpartition: int | None
    attempts: list[int]
    schema: str

    @classmethod
    def from_proto(cls, m: cluster_pb2.InputGateDeploymentDescriptor) -> _InputGate:
        partitions = range(m.partition_start, m.partition_end)
        if m.producer_attempts:
            if len(m.producer_attempts) != len(partitions):
                raise ValueError(
                    f"input {m.input_index} (data set {m.data_set_id!r}): {len(m.producer_attempts)} "
                    f"producer attempts for {len(partitions)} partitions"
                )
            attempts = list(m.producer_attempts)
        else:
            attempts = [m.uniform_attempt] * len(partitions)
        return cls(
            input_index=m.input_index,
            data_set_id=m.data_set_id,
            partitions=partitions,
            subpartition=m.subpartition if m.HasField("subpartition") else None,
            attempts=attempts,
            schema=m.schema,
        )

    @property
    def waiting_for(self) -> list[int]:
        return [p for p, a in zip(self.partitions, self.attempts) if a == UNAVAILABLE]

    def describe(self) -> str:
        return f"input {self.input_index} (data set {self.data_set_id!r})"


@dataclass(frozen=True, slots=True)
class _Chain:
    """A decoded operator chain, checked against the catalogue, functions unpickled."""

    vertex: JobVertex
    functions: tuple[object | None, ...]

    @classmethod
    def decode(cls, m: jobgraph_pb2.JobVertex) -> _Chain:
        vertex = vertex_from_proto(m)
        if not vertex.operators:
            raise ValueError(f"vertex {vertex.id!r} has no operators")
        functions = []
        for i, op in enumerate(vertex.operators):
            kind = CATALOGUE.get(op.kind)
            if kind is None or op.kind not in OPERATORS:
                raise ValueError(f"vertex {vertex.id!r}, operator {i} '{op.display_name}': unknown kind {op.kind!r}")
            if kind.role is OperatorRole.SOURCE and i != 0:
                raise ValueError(f"vertex {vertex.id!r}: source '{op.display_name}' is not the head of the chain")
            if kind.role is OperatorRole.SINK and i != len(vertex.operators) - 1:
                raise ValueError(f"vertex {vertex.id!r}: sink '{op.display_name}' is not the tail of the chain")
            if kind.needs_function and not op.function:
                raise ValueError(f"vertex {vertex.id!r}: '{op.display_name}' ({op.kind}) needs a function")
            functions.append(_unpickle(vertex, op) if op.function else None)
        return cls(vertex, tuple(functions))

    @property
    def is_noop(self) -> bool:
        return all(op.kind in NOOP_KINDS for op in self.vertex.operators)

    @property
    def ends_in_sink(self) -> bool:
        return CATALOGUE[self.vertex.operators[-1].kind].role is OperatorRole.SINK

    def run(self, ctx: RuntimeContext, inputs: list[DataFrame]) -> DataFrame | None:
        """Builds the chain on the inputs; runs the sink if there is one, else returns the tail's
        DataFrame (lazy)."""
        df: DataFrame | None = None
        for i, op in enumerate(self.vertex.operators):
            role = CATALOGUE[op.kind].role
            impl = OPERATORS[op.kind]
            if role is OperatorRole.SOURCE:
                df = impl(ctx, op)
            elif role is OperatorRole.TRANSFORM:
                df = impl(ctx, op, inputs if i == 0 else [df])
            else:
                if i == 0:  # a vertex that is only a sink
                    if len(inputs) != 1:
                        raise ValueError(f"sink '{op.display_name}' takes one input, got {len(inputs)}")
                    df = inputs[0]
                impl(ctx, op, df)
                return None
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
    if not callable(fn):
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


class Task:
    """Runs one TaskDeploymentDescriptor. `run` blocks (give it its own thread); `cancel` and
    `update_partition` may be called from any thread, at any time, also before `run`."""

    def __init__(
        self,
        descriptor: cluster_pb2.TaskDeploymentDescriptor,
        spark: SparkSession | None,
        report: Report,
    ):
        self.descriptor = descriptor
        self.spark = spark
        self._context = _classic_context(spark)
        self._report = report
        attempt = descriptor.attempt
        self.tag = _tag(descriptor.job_id, attempt.vertex_id, attempt.subtask_index, attempt.attempt_number)
        self._cond = threading.Condition()
        self._cancelled = False
        self._started = False
        self._done = threading.Event()
        self._reinterrupting = False
        # Gates are set up here, not in run(): an update_partition that arrives before the task
        # thread got going must not be lost.
        self._gates = [_InputGate.from_proto(g) for g in sorted(descriptor.inputs, key=lambda g: g.input_index)]

    @property
    def name(self) -> str:
        d = self.descriptor
        return d.task_name or f"{d.attempt.vertex_id} ({d.attempt.subtask_index + 1}/{d.parallelism})"

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # ---- control, from other threads ----

    def cancel(self) -> None:
        with self._cond:
            first = not self._cancelled
            self._cancelled = True
            self._cond.notify_all()
            start_reinterrupting = self._started and not self._done.is_set() and not self._reinterrupting
            self._reinterrupting = self._reinterrupting or start_reinterrupting
        if first:
            log.info("%s: cancelling", self.name)
        self._interrupt()
        if start_reinterrupting:
            threading.Thread(target=self._keep_interrupting, name=f"{self.tag}-cancel", daemon=True).start()

    def update_partition(self, data_set_id: str, partition_index: int, producer_attempt: int, schema: str) -> None:
        with self._cond:
            for gate in self._gates:
                if gate.data_set_id == data_set_id and partition_index in gate.partitions:
                    gate.attempts[partition_index - gate.partitions.start] = producer_attempt
                    if schema:
                        gate.schema = schema
            self._cond.notify_all()

    def _interrupt(self) -> None:
        if self.spark is None:
            return
        try:
            self.spark.interruptTag(self.tag)
            if self._context is not None:
                self._context.cancelJobsWithTag(self.tag)
        except Exception:  # a stopped session: nothing is running any more
            log.debug("%s: interrupting tag %s failed", self.name, self.tag, exc_info=True)

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
        while not self._done.wait(_REINTERRUPT_INTERVAL_S):
            self._interrupt()

    def _check_cancelled(self) -> None:
        if self._cancelled:
            raise TaskCancelled(self.name)

    # ---- the task thread ----

    def run(self) -> None:
        with self._cond:
            if self._started:
                raise RuntimeError(f"{self.name}: run() was already called")
            self._started = True
        tagged = False
        try:
            if self.spark is not None:
                # Tags are thread-local: every Spark job this thread starts carries them.
                self.spark.addTag(self.tag)
                if self._context is not None:
                    self._context.addJobTag(self.tag)
                tagged = True
            produced = self._run()
        except Exception as e:
            if self._cancelled:
                self._await_spark_tasks_gone()
                log.info("%s: canceled", self.name)
                self._report(ExecutionState.CANCELED, None, [])
            else:
                log.warning("%s: failed: %s: %s", self.name, type(e).__name__, e)
                failure = failure_of(e)
                self._report(ExecutionState.FAILED, failure, [])
        else:
            # Cancel wins over a task that finished anyway: the JobManager discards its output.
            if self._cancelled:
                self._report(ExecutionState.CANCELED, None, [])
            else:
                self._report(ExecutionState.FINISHED, None, produced)
        finally:
            self._done.set()
            if tagged:
                try:
                    self.spark.removeTag(self.tag)
                    if self._context is not None:
                        self._context.removeJobTag(self.tag)
                except Exception:  # a stopped session: the tags went with it
                    log.debug("%s: removing tag %s failed", self.name, self.tag, exc_info=True)

    def _run(self) -> list[cluster_pb2.ProducedPartition]:
        self._check_cancelled()
        self._report(ExecutionState.INITIALIZING, None, [])
        chain = _Chain.decode(self.descriptor.vertex)
        self._check_cancelled()
        self._report(ExecutionState.RUNNING, None, [])
        gates = self._await_inputs()
        if chain.is_noop:
            return [
                cluster_pb2.ProducedPartition(data_set_id=o.data_set_id, partition_index=o.partition_index, schema="")
                for o in self.descriptor.outputs
            ]
        if self.spark is None:
            raise RuntimeError(f"{self.name}: the chain needs Spark, but this task has no SparkSession")
        d = self.descriptor
        ctx = RuntimeContext(
            spark=self.spark,
            job_id=d.job_id,
            vertex_id=d.attempt.vertex_id,
            subtask_index=d.attempt.subtask_index,
            parallelism=d.parallelism,
            attempt_number=d.attempt.attempt_number,
            data_dir=d.data_dir,
        )
        inputs = [self._read_gate(ctx, gate) for gate in gates]
        self._check_cancelled()
        tail = chain.run(ctx, inputs)
        if chain.ends_in_sink:
            if d.outputs:
                raise ValueError(f"{self.name}: the chain ends in a sink but the task has {len(d.outputs)} output(s)")
            return []
        return self._write_outputs(ctx, tail)

    def _await_inputs(self) -> list[_InputGate]:
        """Blocks until every input partition has a producer attempt; returns the gates as they
        are then (copies: a late update_partition must not change what is being read)."""
        with self._cond:
            while True:
                self._check_cancelled()
                missing = [(g, g.waiting_for) for g in self._gates if g.waiting_for]
                if not missing:
                    return [dataclasses.replace(g, attempts=list(g.attempts)) for g in self._gates]
                log.debug("%s: waiting for %s", self.name,
                          "; ".join(f"{g.describe()} partitions {w}" for g, w in missing))
                self._cond.wait()

    def _read_gate(self, ctx: RuntimeContext, gate: _InputGate) -> DataFrame:
        if not gate.schema:
            raise ValueError(
                f"{self.name}: {gate.describe()} has no schema; its producers did not report one "
                "(a no-op chain's output cannot be read)"
            )
        schema = StructType.fromJson(json.loads(gate.schema))
        paths = [
            layout.partition_dir(ctx.data_dir, ctx.job_id, gate.data_set_id, p, a)
            for p, a in zip(gate.partitions, gate.attempts)
        ]
        spark = ctx.spark
        if not paths:
            return spark.createDataFrame([], schema)
        if gate.subpartition is None:
            return spark.read.schema(schema).parquet(*paths)
        # One read per partition: Spark's partition discovery rejects several roots that each
        # hold `_sub=N` directories ("conflicting directory structures").
        # coalesce(_sub, 0): a producer that feeds a single consumer writes its partition unsplit
        # (no `_sub` directories), and that partition is subpartition 0 of itself.
        with_sub = StructType(schema.fields + [StructField(layout.SUBPARTITION_COLUMN, IntegerType())])
        sub = F.coalesce(column_ref(layout.SUBPARTITION_COLUMN), F.lit(0))
        parts = [
            spark.read.schema(with_sub).parquet(path).where(sub == gate.subpartition).drop(layout.SUBPARTITION_COLUMN)
            for path in paths
        ]
        return union_all(parts)

    def _write_outputs(self, ctx: RuntimeContext, df: DataFrame | None) -> list[cluster_pb2.ProducedPartition]:
        outputs = list(self.descriptor.outputs)
        if not outputs or df is None:
            return []
        schema = df.schema.json()
        if layout.SUBPARTITION_COLUMN in df.columns:
            raise ValueError(f"{self.name}: column {layout.SUBPARTITION_COLUMN!r} is reserved for routing rows to consumers")
        # The row count rides along with the first write instead of costing a job of its own.
        rows = Observation()
        observed = df.observe(rows, F.count(F.lit(1)).alias("rows"))
        shared = len(outputs) > 1
        if shared:  # computed once, written once per consumer
            observed = observed.persist()
        try:
            for out in outputs:
                self._check_cancelled()
                path = layout.partition_dir(ctx.data_dir, ctx.job_id, out.data_set_id, out.partition_index, ctx.attempt_number)
                routed, split = _route(observed, out)
                writer = routed.write.mode("overwrite")
                if split:
                    writer = writer.partitionBy(layout.SUBPARTITION_COLUMN)
                writer.parquet(path)
            row_count = int(rows.get["rows"])
        finally:
            if shared:
                observed.unpersist()
        return [
            cluster_pb2.ProducedPartition(
                data_set_id=o.data_set_id, partition_index=o.partition_index, schema=schema, row_count=row_count
            )
            for o in outputs
        ]


def _route(df: DataFrame, out: cluster_pb2.ResultPartitionDeploymentDescriptor) -> tuple[DataFrame, bool]:
    """Adds the subpartition column for a partition that feeds several consumers."""
    n = out.num_subpartitions
    if n <= 1 or out.partitioner == jobgraph_pb2.PARTITIONER_BROADCAST:
        return df, False
    if out.partitioner == jobgraph_pb2.PARTITIONER_HASH:
        keys = list(out.partition_keys)
        if not keys:
            raise ValueError(f"data set {out.data_set_id!r}: HASH partitioning without keys")
        target = F.pmod(F.hash(*[column_ref(k) for k in keys]), F.lit(n))
    else:
        # REBALANCE, and POINTWISE rescale (one partition split among its consumers): round robin.
        target = F.pmod(F.monotonically_increasing_id(), F.lit(n))
    return df.withColumn(layout.SUBPARTITION_COLUMN, target.cast("int")), True
