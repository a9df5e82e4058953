"""The TaskExecutor: the asyncio shell around one TaskManager's two cores.

Every decision is made by a sans-IO core fed with events; this module only carries out their
instructions, like the JobMaster does for the scheduler:

- the task core (`common/task/taskexecutorstate.py`) gets the TaskExecutor service's RPCs
  (`taskexecutorservice.py` decodes them) and what task threads tell; its instructions are
  carried out here: a Spark task gets a thread of its own (`task.py`) and its inputs when the
  core hands them over, an interrupt goes to Spark off the loop, reports are queued for the
  JobManager, partition directories are deleted in a thread, timers are set. Task threads
  come back to the loop through one thread-safe inbox, which wakes the loop once per burst;
- the registration core (`common/task/registration.py`) decides about the connection to the
  JobManager (when to register, back off, give an attempt up for a new leader, when the
  registration is lost); its instructions are carried out here through the JobManager
  gateway (`jobmanagergateway.py`, over gRPC in `grpcgateway.py`): look the leader up, register,
  keep one heartbeat stream open, and when the registration is lost, the task core's
  `JobManagerLost` (it forgets every task);
- the SparkSession, its warm-up, its renewal on Spark Connect and the scratch directory are
  `sparkruntime.py`'s.

Its peers reach it through one narrow seam, as dask's BaseWorker is reached around its
WorkerState: `handle(event)` feeds the task core (with `stimulus(kind)` for a stimulus id the
call does not bring), `release_partitions(event)` feeds a release and waits for its deletions,
`vertices` is the service's cache of decoded job vertices (emptied by the core's DropJob),
`registration_id` and `resources()` are what the JobManager connection registers with, and
`jobmanager_registered` / `registered_first_time` / `jobmanager_lost` are what it tells back.
The service's and the connection's Protocols (`Served`, `Registrant`) name exactly that; nothing
else of the TaskExecutor is theirs to touch.

Everything runs on one asyncio loop (Flink's main-thread model); blocking work leaves it (task
threads, creating and stopping the SparkSession, deleting directories, talking to the JVM).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import importlib
import itertools
import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from grpc_health.v1 import health

from funke.common.graph.deployment import ProducedPartition
from funke.common.graph.executiongraph import FailureInfo, TaskIo
from funke.common.states import ExecutionState
from funke.common.task import taskexecutorstate as core
from funke.common.task.registration import Registration
from funke.common.task.taskexecutorstate import TaskExecutorState, TaskKey
from funke.runtime import datafs
from funke.runtime.rpc import advertised_host, host_port
from funke.taskmanager import sparksession, taskexecutorservice
from funke.taskmanager.taskexecutorservice import DecodedVertices
from funke.taskmanager.grpcgateway import GrpcJobManagerGateway
from funke.taskmanager.jobmanagerconnection import JobManagerConnection
from funke.taskmanager.jobmanagergateway import JobManagerGateway
from funke.taskmanager.loopinbox import LoopInbox
from funke.taskmanager.metrics import TaskMetrics
from funke.taskmanager.reporter import TaskStateReporter
from funke.taskmanager.sparkruntime import SparkRuntime, StartupError, available_cores
from funke.taskmanager.taskexecutorconfig import TaskExecutorConfig, process_started_at

if TYPE_CHECKING:
    import grpc
    from pyspark.sql import SparkSession

    from funke.runtime.metricsserver import MetricsServer
    from funke.taskmanager.task import Task

# Imported where first needed (the task runtime with PySpark and pyarrow, the metrics server with
# aiohttp): the TaskManager starts Spark's JVM before it imports them, and while it boots.

log = logging.getLogger("funke.taskmanager")
__all__ = ["StartupError", "TaskExecutor", "TaskExecutorConfig"]

# Shutdown: how long cancelled tasks get to end, and how long we try to tell the JobManager.
_TASK_CANCEL_GRACE_S = 5.0
_REPORT_FLUSH_S = 2.0
_SERVER_GRACE_S = 1.0
# How often a task waiting for its Spark Connect session looks whether it was cancelled.
_SESSION_CHECK_POLL_S = 0.2


def delete_partition_dirs(paths: Iterable[str]) -> None:
    """Blocking: delete result partition directories, local paths or filesystem URIs."""
    for path in paths:
        try:
            datafs.remove(path)  # never written (a no-op task), or released already: fine
        except Exception:
            log.warning("could not delete result partition %s", path, exc_info=True)


class TaskExecutor:
    """One TaskManager process's runtime. Create it, then `await run()` on the loop that is to
    own it; `stop()` (any thread, or a signal handler) ends `run()` after a clean shutdown."""

    def __init__(self, config: TaskExecutorConfig,
                 on_registered: Callable[[TaskExecutor], None] | None = None,
                 gateway: JobManagerGateway | None = None, ha: Any = None):
        if config.number_of_slots < 1:
            raise ValueError(f"a TaskManager needs at least one slot, not {config.number_of_slots}")
        self.config = config
        self.id = config.task_manager_id
        self._on_registered = on_registered
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = asyncio.Event()
        self._stopping = False

        self.core = TaskExecutorState(self.id, config.number_of_slots, spark=config.use_spark,
                                      data_dir=config.data_dir or "")
        self._stimuli = itertools.count(1)
        self._tasks: dict[TaskKey, Task] = {}  # Spark tasks whose threads run
        self.vertices = DecodedVertices()  # filled by the service, emptied by the core's DropJob
        self._threads_running = 0
        self._threads_idle = asyncio.Event()
        self._threads_idle.set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._deletions: list[asyncio.Future[None]] = []  # started by the event being handled (a release)
        self.metrics = TaskMetrics(self.id, self._slot_counts)
        self._metrics_server: MetricsServer | None = None
        self.metrics_url = ""

        self._inbox = LoopInbox()  # what task threads tell the loop
        self._to_loop = self._inbox.post

        self.reporter = TaskStateReporter(self.core, self.handle, self.stimulus,
                                          lambda: self.connection.gateway)

        self._jobmanager_data_dir = ""  # from the last registration; kept while re-registering
        self.address: str | None = None
        self.bound_port = 0
        self.spark_runtime = SparkRuntime(config)
        # Start-up steps (epoch seconds), shown with the registration (resources): when the
        # process started and when its SparkSession was ready (0: no Spark).
        self.started_at = process_started_at()
        self.spark_ready_at = 0.0
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        # The JobManager gateway and HA services: made from the configuration unless given.
        self.connection = JobManagerConnection(self, gateway, self._health, ha)
        self._background: list[asyncio.Task[None]] = []
        self.failure = ""  # why the TaskManager stopped on its own (empty: it was asked to)

    # ------------------------------------------------------------------ the core

    def stimulus(self, kind: str) -> str:
        """A new stimulus id for an event this TaskManager makes up itself."""
        return f"{self.id}:{kind}-{next(self._stimuli)}"

    def handle(self, event: core.Event) -> list[core.Instruction]:
        """Feed the core one event and carry out its instructions (those answering an RPC are
        also returned, for the caller to read)."""
        instructions = self.core.handle(event, time.time())
        for instruction in instructions:
            _INSTRUCTIONS[type(instruction)](self, instruction)
        return instructions

    async def release_partitions(self, event: core.ReleasePartitions) -> None:
        """Feed the core a ReleasePartitions and wait until the partition directories it says to
        delete are deleted (the ReleasePartitions call answers then)."""
        self._deletions = []
        try:
            self.handle(event)
        finally:
            deletions, self._deletions = self._deletions, []
        await asyncio.gather(*deletions, return_exceptions=True)

    def _start_task(self, i: core.StartTask) -> None:
        key = i.key
        self.spark_runtime.task_starting()

        name = i.deployment.task_name
        operators = tuple(op.display_name for op in i.deployment.vertex.operators)
        from funke.taskmanager.task import StreamTask, Task

        def report(state: ExecutionState, failure: FailureInfo | None, produced: tuple[ProducedPartition, ...],
                   io: TaskIo | None = None) -> None:
            # Called on the task's thread: hand over to the loop, never touch state here.
            if state is ExecutionState.FAILED and failure is not None and self.config.spark_remote \
                    and self._server_stopping(task, failure):
                self._await_connect_server(task)
            self._to_loop(self._task_reported, key, state, failure, produced, io, name, operators)

        if i.deployment.streaming:
            def batch_done(batch_id: int, produced: tuple[ProducedPartition, ...], input_rows: int | None,
                           io: TaskIo | None = None) -> None:
                self._to_loop(self._batch_reported, key, batch_id, produced, input_rows, io, name, operators)

            task: Task = StreamTask(i.deployment, self.spark, report, batch_done)
        else:
            task = Task(i.deployment, self.spark, report)
        thread = threading.Thread(target=self._run_task, args=(key, task), daemon=True,
                                  name=f"task {i.deployment.task_name or key.attempt}")
        self._tasks[key] = task
        try:
            thread.start()
        except RuntimeError as e:  # out of threads
            del self._tasks[key]
            self.handle(core.TaskReported(key, ExecutionState.FAILED, FailureInfo(
                "TaskManagerError", f"could not start a thread for the task: {e}"), (), self.stimulus("thread")))
            return
        self._threads_running += 1
        self._threads_idle.clear()

    def _inputs_ready(self, i: core.InputsReady) -> None:
        task = self._tasks.get(i.key)
        if task is not None:
            task.give_inputs(i.gates)

    def _stream_task(self, key: TaskKey):
        task = self._tasks.get(key)
        if task is None:
            return None
        from funke.taskmanager.task import StreamTask  # loaded: a task exists

        return task if isinstance(task, StreamTask) else None

    def _give_batch(self, i: core.GiveBatch) -> None:
        task = self._stream_task(i.key)
        if task is not None:
            task.give_batch(i.batch, i.gates)

    def _finish_task(self, i: core.FinishTask) -> None:
        task = self._stream_task(i.key)
        if task is not None:
            task.finish()

    def _limit_rate(self, i: core.LimitRate) -> None:
        task = self._stream_task(i.key)
        if task is not None:
            task.set_rate_limit(i.records_per_second)

    def _interrupt(self, i: core.InterruptTask) -> None:
        task = self._tasks.get(i.key)
        if task is None or self._loop is None:
            return
        log.info("cancelling task %s", i.key)
        # Off the loop: cancelling a Spark task talks to the JVM.
        future = self._loop.run_in_executor(None, task.cancel)

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("cancelling task %s failed: %r", i.key, f.exception())

        future.add_done_callback(done)

    def _send_report(self, i: core.SendReport) -> None:
        report = i.report
        if report.state.is_terminal and (report.failure is not None or report.state is not ExecutionState.FINISHED):
            log.log(logging.WARNING if report.failure else logging.INFO, "task %s of job %s %s%s", report.attempt,
                    report.job_id, report.state.value, f": {report.failure}" if report.failure else "")
        self.reporter.queue(report, i.generation)

    def _delete_partitions(self, i: core.DeletePartitions) -> None:
        def delete() -> None:  # paths are built here too: thousands of them are loop time
            delete_partition_dirs(i.paths())

        if self._loop is None:
            delete()
            return
        future = self._loop.run_in_executor(None, delete)
        # Cancelled: the ReleasePartitions call that waited for it went away (the thread goes on).
        future.add_done_callback(lambda f: not f.cancelled() and f.exception() and log.warning(
            "deleting partitions: %s", f.exception()))
        self._deletions.append(future)

    def _start_timer(self, i: core.StartTimer) -> None:
        assert self._loop is not None

        def fire() -> None:
            self._timers.discard(handle)
            self.handle(core.TimerFired(i.timer, self.stimulus("timer")))

        handle = self._loop.call_later(i.delay_s, fire)
        self._timers.add(handle)

    def _drop_job(self, i: core.DropJob) -> None:
        self.vertices.drop(i.job_id)

    def _nothing(self, i: core.Instruction) -> None:
        """Answers are read by the RPC that gets them back; when to register again is the
        registration core's to decide (common/task/registration.py)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def spark(self) -> SparkSession | None:
        return self.spark_runtime.session

    @property
    def data_dir(self) -> str:
        if self.config.data_dir:
            return self.config.data_dir
        if self._jobmanager_data_dir:
            return self._jobmanager_data_dir
        return os.path.join(tempfile.gettempdir(), "funke")

    async def run(self) -> None:
        """Start, serve until `stop()`, shut down."""
        try:
            await self.start()
            await self._stop_requested.wait()
        finally:
            await self.shutdown()

    def stop(self) -> None:
        """Ask `run()` to shut down. Safe from any thread and from signal handlers."""
        loop = self._loop
        if loop is None:
            self._stop_requested.set()
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._stop_requested.set()
        else:
            try:
                loop.call_soon_threadsafe(self._stop_requested.set)
            except RuntimeError:
                pass  # loop already closed: nothing left to stop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox.bind(self._loop)
        cfg = self.config
        if cfg.metrics_host is not None:
            # Before Spark's thread starts importing PySpark: two threads importing at once can meet
            # each other's modules half-initialised.
            importlib.import_module("funke.runtime.metricsserver")
        if cfg.use_spark:
            # First, before the task runtime is loaded (in the same thread, once the session is
            # up). Not beside the gRPC servers being set up: PySpark forks spark-submit with a
            # preexec_fn, and a fork while other threads call into gRPC skips gRPC's fork handlers
            # (seen: the launch failing, the TaskManager's epoll set broken).
            log.info("TaskManager %s: starting Spark (%s)", self.id, self.spark_runtime.target())
            asked = time.time()
            # Registered only once the session is up: every task it is sent can run at once.
            await self.spark_runtime.start()
            self.spark_ready_at = time.time()
            log.info("TaskManager %s: Spark session ready in %.1f s (%.1f s after the process started)", self.id,
                     self.spark_ready_at - asked, self.spark_ready_at - self.started_at)
        else:
            log.info("TaskManager %s runs without Spark: only no-op chains can run", self.id)
        await self._start_servers()
        if self.connection.gateway is None:
            self.connection.gateway = GrpcJobManagerGateway(self.id, self.core, cfg.jobmanager_address,
                                                            cfg.cluster_token, cfg.tls)
        self._background = [
            asyncio.create_task(self.connection.run(), name="jobmanager-connection"),
            asyncio.create_task(self._report_loop(), name="task-state-reporter"),
        ]
        for task in self._background:
            task.add_done_callback(self._background_ended)
        self.spark_runtime.watch()
        # What exists now (modules, PySpark, the SparkSession, the server) lives as long as the
        # process: out of the cycle collector's sight, a full collection no longer scans it all on
        # the loop (100-200 ms with thousands of tasks deployed, measured, for nothing to free).
        gc.freeze()

    async def _start_servers(self) -> None:
        """The TaskExecutor service (NOT_SERVING until registered) and the metrics endpoint."""
        cfg = self.config
        self._server, self.bound_port = await taskexecutorservice.serve(self, self._health)
        self.address = host_port(advertised_host(cfg.host, cfg.advertise_host, cfg.jobmanager_address),
                                 self.bound_port)
        log.info("TaskManager %s: TaskExecutor service on %s, %d slot(s)", self.id, self.address,
                 cfg.number_of_slots)

        if cfg.metrics_host is not None:
            from funke.runtime.metricsserver import MetricsServer, registry_with

            self._metrics_server = MetricsServer(registry_with(self.metrics), cfg.tls)
            first, last = cfg.metrics_ports
            try:
                port = await self._metrics_server.start(cfg.metrics_host, range(first, last + 1))
            except OSError as e:
                raise StartupError(f"Prometheus metrics: {e} (metrics.reporter.prom.port)") from None
            host = advertised_host(cfg.metrics_host, cfg.advertise_host, cfg.jobmanager_address)
            self.metrics_url = f"{self._metrics_server.scheme}://{host_port(host, port)}/metrics"
            log.info("TaskManager %s: Prometheus metrics at %s", self.id, self.metrics_url)

    def _background_ended(self, task: asyncio.Task[None]) -> None:
        """The connection and report loops run for the life of the process: one that ends on
        its own is a bug that would leave this TaskManager registered and silent. Say so loudly
        and stop (exit 1), so the failure is seen and the tasks are recovered elsewhere."""
        if self._stopping or task.cancelled():
            return
        exc = task.exception()
        log.critical("TaskManager %s: its %s loop ended on its own%s; stopping rather than running without it",
                     self.id, task.get_name(), f" with {type(exc).__name__}: {exc}" if exc else "", exc_info=exc)
        self.failure = f"the {task.get_name()} loop ended: {exc!r}"
        self.stop()

    async def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = self.spark_runtime.closing = True  # no Spark Connect session is renewed from now on
        log.info("TaskManager %s shutting down", self.id)
        if self._server is not None:
            await self._health.enter_graceful_shutdown()
        self.handle(core.ShutdownRequested(f"TaskManager {self.id} is shutting down", self.stimulus("shutdown")))
        try:
            await asyncio.wait_for(self._threads_idle.wait(), _TASK_CANCEL_GRACE_S)
        except TimeoutError:
            log.warning("%d task thread(s) still running after %g s; leaving them behind",
                        self._threads_running, _TASK_CANCEL_GRACE_S)
        if self.registration is not None and not self.reporter.empty.is_set():
            try:  # best effort: tell the JobManager how our tasks ended
                await asyncio.wait_for(self.reporter.empty.wait(), _REPORT_FLUSH_S)
            except TimeoutError:
                log.warning("could not report %d task state(s) before shutting down", len(self.reporter.outbox))

        for handle in self._timers:
            handle.cancel()
        self.spark_runtime.close()
        # Closing the heartbeat stream tells the JobManager at once that we are gone.
        for background in self._background:
            background.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(_SERVER_GRACE_S)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        await self.spark_runtime.stop()
        await self.connection.close()
        log.info("TaskManager %s stopped", self.id)

    # ------------------------------------------------------------------ JobManager connection

    @property
    def registration(self) -> Registration | None:
        return self.connection.registration

    @property
    def jobmanager_address(self) -> str:
        return self.connection.address

    @property
    def registration_id(self) -> str:
        """The registration the task core knows ("" before the first)."""
        return self.core.registration_id

    def resources(self) -> dict[str, str]:
        """What this TaskManager tells the JobManager of itself with each registration."""
        return {
            "cores": str(available_cores()),
            "spark_master": self.spark_runtime.target() if self.config.use_spark else "",
            "pid": str(os.getpid()),
            "metrics": self.metrics_url,
            "started_at": f"{self.started_at:.3f}",
            "spark_ready_at": f"{self.spark_ready_at:.3f}" if self.spark_ready_at else "",
        }

    def _slot_counts(self) -> tuple[int, int, int]:
        """(slots, free slots, tasks running), for the metrics."""
        slots = self.core.slot_report()
        return len(slots), sum(1 for s in slots if not s.job_id), self.core.live_tasks()

    def jobmanager_registered(self, registration: Registration) -> None:
        if registration.data_dir:
            self._jobmanager_data_dir = registration.data_dir
        self.handle(core.JobManagerRegistered(registration.registration_id, self.data_dir,
                                               self.stimulus("registered")))

    def registered_first_time(self) -> None:
        if self._on_registered is not None:
            self._on_registered(self)

    def jobmanager_lost(self, reason: str) -> None:
        log.warning("TaskManager %s lost the JobManager (%s): cancelling and forgetting %d task(s), "
                    "registering again", self.id, reason, self.core.live_tasks())
        self.handle(core.JobManagerLost(reason, self.stimulus("jobmanager-lost")))
        self.reporter.drop_stale()

    # ------------------------------------------------------------------ task threads and the inbox

    def _run_task(self, key: TaskKey, task: Task) -> None:
        """The body of a task's thread."""
        error: FailureInfo | None = None
        try:
            if self.config.spark_remote and task.spark is not None:
                task.spark = self._session_for(task)
            task.run()
        except BaseException as e:  # Task.run reports its failures itself; this is a bug there
            error = FailureInfo(type(e).__name__, str(e), traceback.format_exc())
        self._to_loop(self._thread_exited, key, error)

    def _wait_on_loop(self, task: Task, coro: Any, given_up: Any) -> Any:
        """In a task's thread: the result of `coro`, run on the loop. Cancelling the task or
        stopping this TaskExecutor ends the wait, as does the loop closing: then `given_up`."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            try:
                return future.result(timeout=_SESSION_CHECK_POLL_S)
            except concurrent.futures.TimeoutError:
                if task.cancelled or self._stopping:
                    future.cancel()
                    return given_up
            except (Exception, concurrent.futures.CancelledError):  # the loop is closing: the task meets it
                return given_up

    def _session_for(self, task: Task) -> SparkSession | None:
        """In a task's thread, before it runs (Spark Connect): the session the server knows now,
        a new one if it restarted (`SparkRuntime.session_for_attempt`). A task cancelled while
        it waits stops waiting (its run ends CANCELED at once)."""
        return self._wait_on_loop(task, self.spark_runtime.session_for_attempt(), task.spark)

    def _server_stopping(self, task: Task, failure: FailureInfo) -> bool:
        """In the thread of a task that failed on Spark Connect: whether its server is shutting
        down, as its failure says, or else as the server answers a tiny query
        (`SparkRuntime.server_stopping`)."""
        if sparksession.server_stopped(failure.message):
            return True
        if task.spark is None or task.cancelled or self._stopping:
            return False
        return self._wait_on_loop(task, self.spark_runtime.server_stopping(task.spark), False)

    def _await_connect_server(self, task: Task) -> None:
        """In the thread of a task that failed because its Spark Connect server is shutting down
        (a restart): its FAILED is reported once this TaskManager has a session on the server
        that came back (at most SERVER_RESTART_WAIT_S), so that the restart of the task runs
        there instead of meeting the dying server or the closed session, and one restart of the
        job's budget is spent on one server restart. Cancelling the task ends the wait."""
        log.warning("%s: the Spark Connect server stopped under it; its failure is reported once the server is "
                    "back (at most %g s)", task.name, sparksession.SERVER_RESTART_WAIT_S)
        back = self._wait_on_loop(
            task, self.spark_runtime.server_back(task.spark, sparksession.SERVER_RESTART_WAIT_S), None)
        if back is False:
            log.warning("%s: the Spark Connect server did not come back within %g s", task.name,
                        sparksession.SERVER_RESTART_WAIT_S)

    def _task_reported(self, key: TaskKey, state: ExecutionState, failure: FailureInfo | None,
                       produced: tuple[ProducedPartition, ...], io: TaskIo | None = None, name: str = "",
                       operators: tuple[str, ...] = ()) -> None:
        if io is not None:
            self.metrics.task_finished(key, name, io, operators)
        self.handle(core.TaskReported(key, state, failure, produced, self.stimulus("report"), io))
        if state is ExecutionState.FAILED and self.config.spark_remote:
            self.spark_runtime.renew_closed_connect_session()

    def _batch_reported(self, key: TaskKey, batch_id: int, produced: tuple[ProducedPartition, ...],
                        input_rows: int | None, io: TaskIo | None = None, name: str = "",
                        operators: tuple[str, ...] = ()) -> None:
        if io is not None:
            self.metrics.batch_done(key, name, io, operators)
        self.handle(core.BatchReported(key, batch_id, produced, self.stimulus("batch"), input_rows, io))

    def _thread_exited(self, key: TaskKey, error: FailureInfo | None) -> None:
        self._tasks.pop(key, None)
        self._threads_running -= 1
        if self._threads_running == 0:
            self._threads_idle.set()
        self.handle(core.TaskThreadExited(key, error, self.stimulus("thread-exit")))

    async def _report_loop(self) -> None:
        await self.reporter.run()


_INSTRUCTIONS: dict[type, Callable[[TaskExecutor, Any], None]] = {
    core.TaskAccepted: TaskExecutor._nothing,
    core.TaskRejected: TaskExecutor._nothing,
    core.StartTask: TaskExecutor._start_task,
    core.InputsReady: TaskExecutor._inputs_ready,
    core.InterruptTask: TaskExecutor._interrupt,
    core.SendReport: TaskExecutor._send_report,
    core.DeletePartitions: TaskExecutor._delete_partitions,
    core.StartTimer: TaskExecutor._start_timer,
    core.DropJob: TaskExecutor._drop_job,
    core.RegisterAgain: TaskExecutor._nothing,
    core.GiveBatch: TaskExecutor._give_batch,
    core.BatchRejected: TaskExecutor._nothing,
    core.FinishTask: TaskExecutor._finish_task,
    core.LimitRate: TaskExecutor._limit_rate,
}
