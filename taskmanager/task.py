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

What it reads and writes, and how rows are routed to the consumers' subtasks, is
`exchange.py`'s (`TaskExchange`).

A streaming query's task is a `StreamTask`: it stays RUNNING and runs micro-batches as they are
given, each over its own batch-scoped partitions (`layout.batch_partition_dir`).
"""

from __future__ import annotations

import collections
import functools
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
from pyspark.sql import DataFrame, Observation, SparkSession

from funke.common import layout
from funke.common.graph.deployment import ProducedPartition, TaskDeployment
from funke.common.graph.executiongraph import FailureInfo, OperatorIo, TaskIo
from funke.common.task.inputgates import GateSnapshot
from funke.common.graph.jobgraph import JobVertex, OperatorSpec
from funke.common.graph.operators import CATALOGUE, OperatorRole
from funke.common.states import ExecutionState
from funke.common.streaming.sources import BatchInput
from funke.common.graph.streamingjob import CHECKPOINT, RUNNING_KINDS
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.keygroups import key_group_range
from funke.common.streaming.state import StateMetrics, operator_dir
from funke.taskmanager import batchexchange
from funke.taskmanager.exchange import TaskExchange
from funke.taskmanager import streaming
from funke.taskmanager.receiver import SocketReceiver
from funke.taskmanager.operators import udf
from funke.taskmanager.operators.keyedstate import measure
from funke.taskmanager.operators.context import InputMeter, RuntimeContext, SinkCount
from funke.taskmanager.recordcounts import ChainCounter, writes_every_record

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
        self._exchange = TaskExchange(self.name, deployment)
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
        records_in, bytes_in, bytes_out = self._exchange.measured()
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
        return [self._exchange.read_gate(ctx, gate) for gate in gates]

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
        return self._exchange.write_outputs(ctx, tail, self._check_cancelled)

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

# batch id, the partitions written, the rows its stream source read (None: not a source, or not counted)
BatchReport = Callable[[int, tuple[ProducedPartition, ...], int | None, TaskIo | None], None]

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

    # ---- a batch's inputs: one Spark partition when the batch is small (`_small_batch`) ----

    def _read_inputs(self, ctx: RuntimeContext, gates: tuple[GateSnapshot, ...]) -> list[DataFrame]:
        inputs = [self._exchange.read_gate(ctx, gate) for gate in gates]
        return [_small_batch(ctx, df) for df in inputs]  # once every gate's bytes are known

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
                self._exchange.forget_written()
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
    ends without metrics); a per-partition watermark's metrics are a dict already."""
    if isinstance(observation, dict):
        return observation
    try:
        return observation.get
    except Exception:  # Py4JJavaError: the metrics row is empty
        return {}
