"""The Task: one deployed execution attempt of a subtask, run to a terminal state.

Owns the life of one TaskDeploymentDescriptor on a TaskManager, independent of gRPC: decoding the
chain, waiting for input partitions, reading the input gates, running the operators
(`operators.py`), writing the result partitions, and reporting the ExecutionState changes
(INITIALIZING, RUNNING, then exactly one of FINISHED / FAILED / CANCELED) through a callback;
a task cancelled before it reached a state does not report that state. Cancel wins: a task
cancelled while it fails or finishes reports CANCELED.

Two ways to run. `run` blocks (the TaskExecutor gives it a thread: it waits on Spark). A chain of
no-op kinds needs neither Spark nor a thread: `run_inline` reports on the calling thread and, if
its inputs are not all available yet, finishes later on the thread that completes its last gate
(the TaskExecutor's loop), or reports CANCELED at once from `cancel`.

Input gates are `inputgates.py`'s: the TaskManager's one record of partition availability, which
calls a task back when a gate is complete; a standalone Task (tests) has a record of its own, fed by
`update_partition`. Decoded vertices come from a `VertexCache` shared by the TaskManager's tasks.

Every Spark job of an attempt carries the attempt's tag, so cancel() can interrupt exactly those
jobs; it keeps re-sending the interrupt until `run` returns, which also catches a job submitted
just after the cancel.

Exchanges follow `common/executiongraph.py` and the path scheme of `common/layout.py`: a producer
writes its partition of each output as Parquet under `partition_dir(.., attempt)`, split into
`_sub=N/` directories when it feeds several consumers (HASH: by key hash, otherwise round robin);
a consumer reads subpartition k of each partition in its gate's range.
"""

from __future__ import annotations

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
from funke.common.codec import vertex_from_proto
from funke.taskmanager import operators as operators_module
from funke.taskmanager.inputgates import UNAVAILABLE, GateSnapshot, InputGate, PartitionAvailability
from funke.taskmanager.operators import OPERATORS, RuntimeContext, column_ref, union_all
from funke.v1 import cluster_pb2, jobgraph_pb2

__all__ = ["Task", "TaskCancelled", "Report", "VertexCache", "UNAVAILABLE", "decode_vertex", "is_noop_chain"]

log = logging.getLogger(__name__)

# state, why it FAILED (None otherwise), the partitions it produced (with FINISHED)
Report = Callable[[ExecutionState, FailureInfo | None, list[cluster_pb2.ProducedPartition]], None]


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


def decode_vertex(m: jobgraph_pb2.JobVertex) -> JobVertex:
    """The vertex of a descriptor, decoded and checked against the catalogue; functions stay
    pickled (unpickling is each task's own, see `_Chain.of`)."""
    vertex = vertex_from_proto(m)
    if not vertex.operators:
        raise ValueError(f"vertex {vertex.id!r} has no operators")
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
    return vertex


def is_noop_chain(vertex: JobVertex) -> bool:
    return all(op.kind in NOOP_KINDS for op in vertex.operators)


class VertexCache:
    """Decoded vertices per (job, vertex id), shared by a TaskManager's tasks: the P subtasks of a
    vertex carry the same JobVertex, and decoding it for each was a measurable share of deploying
    no-op tasks. Thread-safe (task threads decode on first use); failures are not cached, every
    task of a broken vertex fails with its own exception."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, JobVertex]] = {}

    def get(self, job_id: str, m: jobgraph_pb2.JobVertex) -> JobVertex:
        with self._lock:
            vertex = self._jobs.get(job_id, {}).get(m.id)
        if vertex is None:
            vertex = decode_vertex(m)  # outside the lock: a big vertex must not stall the others
            with self._lock:
                vertex = self._jobs.setdefault(job_id, {}).setdefault(m.id, vertex)
        return vertex

    def drop_job(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def clear(self) -> None:
        with self._lock:
            self._jobs.clear()

    def __contains__(self, key: tuple[str, str]) -> bool:
        job_id, vertex_id = key
        with self._lock:
            return vertex_id in self._jobs.get(job_id, {})


@dataclass(frozen=True, slots=True)
class _Chain:
    """A decoded operator chain, checked against the catalogue, functions unpickled."""

    vertex: JobVertex
    functions: tuple[object | None, ...]

    @classmethod
    def of(cls, vertex: JobVertex) -> _Chain:
        # Unpickled per task, not cached with the vertex: each subtask gets its own function
        # objects, as it did when every task decoded its descriptor.
        return cls(vertex, tuple(_unpickle(vertex, op) if op.function else None for op in vertex.operators))

    @classmethod
    def decode(cls, m: jobgraph_pb2.JobVertex) -> _Chain:
        return cls.of(decode_vertex(m))

    @property
    def is_noop(self) -> bool:
        return is_noop_chain(self.vertex)

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


def _report_nothing(state: ExecutionState, failure: FailureInfo | None,
                    produced: list[cluster_pb2.ProducedPartition]) -> None:
    pass


class Task:
    """Runs one TaskDeploymentDescriptor. `run` blocks (give it its own thread); `run_inline`
    (no-op chains only) does not. `cancel` and `update_partition` may be called from any thread,
    at any time, also before `run`."""

    def __init__(
        self,
        descriptor: cluster_pb2.TaskDeploymentDescriptor,
        spark: SparkSession | None,
        report: Report,
        *,
        partitions: PartitionAvailability | None = None,
        vertices: VertexCache | None = None,
    ):
        self.descriptor = descriptor
        self.spark = spark
        self._report = report
        self._partitions = partitions if partitions is not None else PartitionAvailability()
        self._vertices = vertices
        # A TaskManager deploys no-op tasks by the thousand: a task makes its condition and event
        # only if a thread waits on them (`run`), not in every task.
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None  # on _lock, made by the first waiter
        self._cancelled = False
        self._started = False
        self._inline = False
        self._waiting_inline = False  # run_inline returned; the last gate or cancel() ends it
        self._done = False
        self._done_event: threading.Event | None = None  # made by run(): ends the re-interrupting
        self._reinterrupting = False
        # Gates are opened here, not in run(): a partition that becomes available before the task
        # thread got going must not be lost. Under the lock, so that a gate completing on another
        # thread meanwhile waits for the count it decrements.
        self._gates: list[InputGate] = []
        self._pending_inputs = 0
        with self._lock:
            try:
                for m in sorted(descriptor.inputs, key=lambda g: g.input_index):
                    gate, waits = self._partitions.open_gate(descriptor.job_id, m, self._on_gate_complete)
                    self._gates.append(gate)
                    self._pending_inputs += waits
            except BaseException:
                self._partitions.close(self._gates)
                raise

    @property
    def name(self) -> str:
        d = self.descriptor
        return d.task_name or f"{d.attempt.vertex_id} ({d.attempt.subtask_index + 1}/{d.parallelism})"

    # The tag and the SparkContext are looked up when Spark needs them: no-op tasks never do,
    # and they are deployed by the thousand.
    @functools.cached_property
    def tag(self) -> str:
        d = self.descriptor
        return _tag(d.job_id, d.attempt.vertex_id, d.attempt.subtask_index, d.attempt.attempt_number)

    @functools.cached_property
    def _context(self) -> SparkContext | None:
        return _classic_context(self.spark)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def inline(self) -> bool:
        return self._inline

    @property
    def waiting_for_inputs(self) -> bool:
        with self._lock:
            return self._pending_inputs > 0

    def _notify(self) -> None:
        # With _lock held.
        if self._cond is not None:
            self._cond.notify_all()

    # ---- control, from other threads ----

    def cancel(self) -> None:
        with self._lock:
            first = not self._cancelled
            self._cancelled = True
            self._notify()
            end_inline = self._waiting_inline
            self._waiting_inline = False
            start_reinterrupting = (not self._inline and self._started and not self._done
                                    and not self._reinterrupting)
            self._reinterrupting = self._reinterrupting or start_reinterrupting
            mark = first and not self._inline and self._started and not self._done
        if self._inline:
            # The TaskExecutor logs the cancellation of the tasks it runs inline (in bulk).
            if end_inline:  # waiting for inputs without a thread: nothing else will end it
                self._end_inline(ExecutionState.CANCELED, None, [])
            return  # no Spark job to interrupt
        if first:
            log.info("%s: cancelling", self.name)
        self._interrupt()
        if mark:
            self._mark_cancelled()
        if start_reinterrupting:
            threading.Thread(target=self._keep_interrupting, name=f"{self.tag}-cancel", daemon=True).start()

    def update_partition(self, data_set_id: str, partition_index: int, producer_attempt: int, schema: str) -> None:
        """Partition `partition_index` of `data_set_id` is available from `producer_attempt`:
        recorded in this task's record of availability (shared with the other tasks of its
        TaskManager, if it was given one)."""
        self._partitions.update_one(self.descriptor.job_id, data_set_id, partition_index, producer_attempt, schema)

    def _on_gate_complete(self) -> None:
        # Called by the availability record, once per gate that had to wait.
        with self._lock:
            self._pending_inputs -= 1
            self._notify()
            finish = self._waiting_inline and self._pending_inputs == 0
            if finish:
                self._waiting_inline = False
        if finish:
            self._finish_inline()

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
        (see `operators._cancellable`), long before Spark's own monitor would kill them."""
        d = self.descriptor
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
        assert self._done_event is not None  # run() made it before it started
        while not self._done_event.wait(_REINTERRUPT_INTERVAL_S):
            self._interrupt()

    def _check_cancelled(self) -> None:
        if self._cancelled:
            raise TaskCancelled(self.name)

    def _vertex(self) -> JobVertex:
        if self._vertices is not None:
            return self._vertices.get(self.descriptor.job_id, self.descriptor.vertex)
        return decode_vertex(self.descriptor.vertex)

    def _noop_outputs(self) -> list[cluster_pb2.ProducedPartition]:
        return [
            cluster_pb2.ProducedPartition(data_set_id=o.data_set_id, partition_index=o.partition_index, schema="")
            for o in self.descriptor.outputs
        ]

    def discard(self) -> None:
        """The task will never run (its thread could not start): its gates are closed."""
        with self._lock:
            self._done = True
        self._partitions.close(self._gates)

    # ---- a no-op chain, without a thread ----

    def run_inline(self) -> None:
        """Run a chain of no-op kinds on the calling thread, without blocking. Reports
        INITIALIZING and RUNNING, then FINISHED at once if every input is available; otherwise
        the gate that completes last (on the thread recording the update) or cancel() reports the
        end. A chain that is not all no-op fails."""
        with self._lock:
            if self._started:
                raise RuntimeError(f"{self.name}: run() was already called")
            self._started = True
            self._inline = True
        if self._cancelled:
            self._end_inline(ExecutionState.CANCELED, None, [])
            return
        self._report(ExecutionState.INITIALIZING, None, [])
        try:
            vertex = self._vertex()
            if not is_noop_chain(vertex):
                raise RuntimeError(f"{self.name}: only a chain of no-op kinds runs without a thread")
        except Exception as e:
            if self._cancelled:
                self._end_inline(ExecutionState.CANCELED, None, [])
            else:
                log.warning("%s: failed: %s: %s", self.name, type(e).__name__, e)
                self._end_inline(ExecutionState.FAILED, failure_of(e), [])
            return
        if self._cancelled:
            self._end_inline(ExecutionState.CANCELED, None, [])
            return
        self._report(ExecutionState.RUNNING, None, [])
        with self._lock:
            if self._cancelled:
                ready = True  # _finish_inline reports CANCELED
            else:
                ready = self._pending_inputs == 0
                self._waiting_inline = not ready
        if ready:
            self._finish_inline()

    def _finish_inline(self) -> None:
        if self._cancelled:
            self._end_inline(ExecutionState.CANCELED, None, [])
        else:
            self._end_inline(ExecutionState.FINISHED, None, self._noop_outputs())

    def _end_inline(self, state: ExecutionState, failure: FailureInfo | None,
                    produced: list[cluster_pb2.ProducedPartition]) -> None:
        with self._lock:
            self._done = True
        self._partitions.close(self._gates)
        report, self._report = self._report, _report_nothing
        report(state, failure, produced)

    # ---- the task thread ----

    def run(self) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError(f"{self.name}: run() was already called")
            self._done_event = threading.Event()
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
            with self._lock:
                self._done = True
            self._done_event.set()
            self._partitions.close(self._gates)
            # Nothing is reported after the terminal state; letting go of the callback also frees
            # the task without the cycle collector (the TaskExecutor's callback holds its entry).
            self._report = _report_nothing
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
        chain = _Chain.of(self._vertex())
        self._check_cancelled()
        self._report(ExecutionState.RUNNING, None, [])
        gates = self._await_inputs()
        if chain.is_noop:
            return self._noop_outputs()
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

    def _await_inputs(self) -> list[GateSnapshot]:
        """Blocks until every input gate is complete; returns what each then reads (snapshots:
        a later update must not change what is being read)."""
        with self._lock:
            while True:
                self._check_cancelled()
                if self._pending_inputs == 0:
                    break
                log.debug("%s: waiting for %d of %d input(s)", self.name, self._pending_inputs, len(self._gates))
                if self._cond is None:
                    self._cond = threading.Condition(self._lock)
                self._cond.wait()
        return [self._partitions.snapshot(self.descriptor.job_id, gate) for gate in self._gates]

    def _read_gate(self, ctx: RuntimeContext, gate: GateSnapshot) -> DataFrame:
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
