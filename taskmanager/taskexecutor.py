"""The TaskExecutor: the asyncio/gRPC shell around one TaskManager's core.

Every decision is made by `TaskExecutorState` (`funke.common.task.taskexecutorstate`), a sans-IO core
fed with events; this module only translates, like the JobMaster does for the scheduler:

- RPCs of the TaskExecutor service (SubmitTasks, CancelTasks, UpdatePartitionInfo, FreeSlots,
  ReleasePartitions) are decoded (`funke.common.wire.codec`) into core events;
- the core's instructions are carried out: a Spark task gets a thread of its own (`task.py`) and
  its inputs when the core hands them over, an interrupt goes to Spark off the loop, reports are
  queued for the JobManager, partition directories are deleted in a thread, timers are set;
- what task threads tell (a new state, the thread's end) comes back to the loop through one
  thread-safe inbox, which wakes the loop once per burst, and becomes a core event;
- the connection to the JobManager: register (retrying until it answers), one long-lived
  heartbeat stream carrying the slot report, and when the stream breaks, the JobManager stops
  answering or asks us to register again, the `JobManagerLost` event (the core forgets every
  task) and a new registration. With high availability the JobManager is whoever holds the
  lease: each registration attempt looks the leader up there, a registration still waiting for
  its answer is given up the moment another leader is elected (a paused leader never answers: it
  must not hold us for the RPC timeout), and a lease taken by a new epoch ends the current
  registration at the next heartbeat (what the deposed leader still sends names a registration
  that is over, and is refused; a report still on its way to it is abandoned).

Everything runs on one asyncio loop (Flink's main-thread model); blocking work leaves it (task
threads, creating and stopping the SparkSession, deleting directories, talking to the JVM).
Bulk RPCs (a SubmitTasks of 500 deployments, an update that completes thousands of gates) are
fed to the core in slices, so heartbeats are never starved.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import importlib
import itertools
import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.common.wire import codec
from funke.common.task import registration as reg
from funke.common.task import taskexecutorstate as core
from funke.common.task.registration import Registration
from funke.common.configuration import ClusterConfiguration
from funke.common.graph.deployment import BatchGate, BatchTask, PartitionRef, ProducedPartition, TaskReport
from funke.common.graph.executiongraph import FailureInfo, TaskIo
from funke.taskmanager.metrics import TaskMetrics
from funke.common.graph.jobgraph import JobVertex
from funke.common.leadership import Lease
from funke.common.states import ExecutionState
from funke.common.task.taskexecutorstate import TaskExecutorState, TaskKey
from funke.common.security import TOKEN_BYTES, Realm
from funke.runtime import datafs, security
from funke.runtime.haservices import ha_services
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS, add_service, advertised_host, host_port
from funke.taskmanager import jvmarchive, sparksession
from funke.taskmanager.grpcgateway import GrpcJobManagerGateway
from funke.taskmanager.jobmanagergateway import GatewayError, JobManagerGateway, RegistrationRequest
from funke.v1 import cluster_pb2, cluster_pb2_grpc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from funke.runtime.metricsserver import MetricsServer
    from funke.taskmanager.task import Task

# Imported where first needed (the task runtime with PySpark and pyarrow, the metrics server with
# aiohttp): the TaskManager starts Spark's JVM before it imports them, and while it boots.

log = logging.getLogger("funke.taskmanager")

T = TypeVar("T")

_RPC_TIMEOUT_S = 10.0
# While a registration waits for its answer, how often the leader is looked up again (with high
# availability): a new epoch ends the wait at once instead of after the RPC timeout.
_LEADER_POLL_S = 0.2
# Shutdown: how long cancelled tasks get to end, and how long we try to tell the JobManager.
_TASK_CANCEL_GRACE_S = 5.0
_REPORT_FLUSH_S = 2.0
_SERVER_GRACE_S = 1.0
_SPARK_STOP_TIMEOUT_S = 10.0
# How often a TaskManager on Spark Connect asks the server whether it still knows our session.
_CONNECT_PING_S = 2.0
_REPORT_BATCH_MAX = 1000
# Bulk work is cut into slices per loop turn, each a few ms at most.
_DEPLOYS_PER_TURN = 64
_CANCELS_PER_TURN = 64
_UPDATES_PER_TURN = 1000
_INBOX_PER_TURN = 128
_HEALTH_SERVICES = ("", "funke.v1.TaskExecutor")


SCRATCH_PREFIX = "funke-taskmanager-"


def scratch_dir_of(root: str, pid: int) -> str:
    return os.path.join(root, f"{SCRATCH_PREFIX}{pid}")


def sweep_scratch_dirs(root: str) -> list[str]:
    """Remove the scratch directories under `root` of TaskManagers that are gone: named after a
    pid that no longer runs, owned by us, real directories (not links). Returns what it removed."""
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        pid_text = entry.name[len(SCRATCH_PREFIX):]
        if not entry.name.startswith(SCRATCH_PREFIX) or not pid_text.isdigit() or pid_text.startswith("0"):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid() or os.path.exists(f"/proc/{pid_text}"):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


class StartupError(Exception):
    """The TaskManager cannot start (a port in use, ...): a user's problem, not a bug."""


@dataclass(frozen=True, slots=True)
class TaskExecutorConfig:
    task_manager_id: str
    jobmanager_address: str = "127.0.0.1:6123"
    number_of_slots: int = 2
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # what the JobManager dials, when not `host` (NAT, containers)
    port: int = 0  # 0: any free port; the bound one is registered
    spark_master: str | None = None  # None: local[<slots>]
    spark_remote: str | None = None  # a Spark Connect URL instead of a local/cluster master
    spark_conf: tuple[tuple[str, str], ...] = ()
    # On a cluster master: how long to wait for the first executor before refusing to start.
    spark_executor_timeout_s: float = sparksession.DEFAULT_EXECUTOR_TIMEOUT_S
    data_dir: str | None = None  # overrides the JobManager's data dir for this TaskManager
    use_spark: bool = True  # False: no SparkSession, only no-op chains run
    warm_up: bool = True  # run Spark's first jobs right after start (taskmanager/warmup.py)
    # High availability: find the leader through the configured HA services (the lease file,
    # ZooKeeper's leader node) instead of `jobmanager_address`.
    ha: ClusterConfiguration | None = None
    # What it presents to the JobManager (the cluster token), and TLS for serving and calling.
    cluster_token: str = ""
    tls: security.Tls | None = None
    # Prometheus metrics: where to serve them (None: not at all), the first free port of the range
    metrics_host: str | None = None
    metrics_ports: tuple[int, int] = (9249, 9348)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def process_started_at() -> float:
    """When this process started (epoch seconds): from /proc, so the interpreter's own start and
    the imports count; the time of the call where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def delete_partition_dirs(paths: Iterable[str]) -> None:
    """Blocking: delete result partition directories, local paths or filesystem URIs."""
    for path in paths:
        try:
            datafs.remove(path)  # never written (a no-op task), or released already: fine
        except Exception:
            log.warning("could not delete result partition %s", path, exc_info=True)


def _in_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run blocking `fn` in a daemon thread; the future resolves on the calling loop.

    Not the default executor: its threads are joined at interpreter exit, and a hung
    SparkSession must not keep a signalled TaskManager alive."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def body() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting coroutine
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    threading.Thread(target=body, name=name, daemon=True).start()
    return future


@dataclass(frozen=True, slots=True)
class _Queued:
    report: TaskReport
    generation: int


class TaskExecutor:
    """One TaskManager process's runtime. Create it, then `await run()` on the loop that is to
    own it; `stop()` (any thread, or a signal handler) ends `run()` after a clean shutdown."""

    def __init__(self, config: TaskExecutorConfig,
                 on_registered: Callable[[TaskExecutor], None] | None = None,
                 gateway: JobManagerGateway | None = None):
        if config.number_of_slots < 1:
            raise ValueError(f"a TaskManager needs at least one slot, not {config.number_of_slots}")
        self.config = config
        self.id = config.task_manager_id
        self._on_registered = on_registered
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = asyncio.Event()
        self._stopping = False
        # Set while registered; cleared from losing the JobManager until registered again.
        self._registered = asyncio.Event()

        self.core = TaskExecutorState(self.id, config.number_of_slots, spark=config.use_spark,
                                      data_dir=config.data_dir or "")
        self._stimuli = itertools.count(1)
        self._tasks: dict[TaskKey, Task] = {}  # Spark tasks whose threads run
        # Decoded vertices per job: the P subtasks of a vertex carry the same JobVertex.
        self._vertices: dict[str, dict[str, JobVertex]] = {}
        self._threads_running = 0
        self._threads_idle = asyncio.Event()
        self._threads_idle.set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._deletions: list[asyncio.Future[None]] = []  # started by the event being handled
        self.metrics = TaskMetrics(self.id, self._slot_counts)
        self._metrics_server: MetricsServer | None = None
        self.metrics_url = ""

        # Callbacks for the loop, from task threads: a thread wakes the loop only if no drain is
        # pending yet.
        self._inbox: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_drain_pending = False
        self._loop_thread: int | None = None

        self._outbox: collections.deque[_Queued] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()

        self._jobmanager_data_dir = ""  # from the last registration; kept while re-registering
        self.address: str | None = None
        self._bound_port = 0
        self.spark: SparkSession | None = None
        # Start-up steps (epoch seconds), shown with the registration (resources): when the
        # process started and when its SparkSession was ready (0: no Spark).
        self.started_at = process_started_at()
        self.spark_ready_at = 0.0
        self._renewing_session = False
        self._connect_watch: asyncio.Task[None] | None = None
        self._warm_up_watch: asyncio.Task[None] | None = None
        self._warm_up_job: Any = None  # the warm-up (warmup.WarmUp) while it runs
        self._tasks_started = 0
        self._scratch: str | None = None  # this process's Spark scratch directory, removed at stop
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._ha = ha_services(config.ha) if config.ha is not None else None
        self._ha_io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="funke-ha")
        self.gateway = gateway  # the gRPC one, made by start(), unless one is given
        self.connection = reg.Connection(self.id, ha=self._ha is not None)
        self._connection_events: asyncio.Queue[reg.Event] = asyncio.Queue()
        self._connection_tasks: set[asyncio.Task[None]] = set()  # attempts, lookups, the heartbeat stream
        self._attempt: asyncio.Task[None] | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._heartbeat_due: asyncio.Event | None = None
        self._registration_token = ""  # sent with the latest registration; "" before the first
        self._background: list[asyncio.Task[None]] = []
        self.failure = ""  # why the TaskManager stopped on its own (empty: it was asked to)

    # ------------------------------------------------------------------ the core

    def _stimulus(self, kind: str) -> str:
        return f"{self.id}:{kind}-{next(self._stimuli)}"

    def _handle(self, event: core.Event) -> list[core.Instruction]:
        """Feed the core one event and carry out its instructions (those answering an RPC are
        also returned, for the caller to read)."""
        instructions = self.core.handle(event, time.time())
        for instruction in instructions:
            _INSTRUCTIONS[type(instruction)](self, instruction)
        return instructions

    def _start_task(self, i: core.StartTask) -> None:
        key = i.key
        self._tasks_started += 1
        self._stop_warm_up()

        name = i.deployment.task_name
        from funke.taskmanager.task import StreamTask, Task

        def report(state: ExecutionState, failure: FailureInfo | None, produced: tuple[ProducedPartition, ...],
                   io: TaskIo | None = None) -> None:
            # Called on the task's thread: hand over to the loop, never touch state here.
            self._to_loop(self._task_reported, key, state, failure, produced, io, name)

        if i.deployment.streaming:
            def batch_done(batch_id: int, produced: tuple[ProducedPartition, ...], input_rows: int | None,
                           io: TaskIo | None = None) -> None:
                self._to_loop(self._batch_reported, key, batch_id, produced, input_rows, io, name)

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
            self._handle(core.TaskReported(key, ExecutionState.FAILED, FailureInfo(
                "TaskManagerError", f"could not start a thread for the task: {e}"), (), self._stimulus("thread")))
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
        self._outbox.append(_Queued(report, i.generation))
        self._outbox_empty.clear()
        self._outbox_ready.set()

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
            self._handle(core.TimerFired(i.timer, self._stimulus("timer")))

        handle = self._loop.call_later(i.delay_s, fire)
        self._timers.add(handle)

    def _drop_job(self, i: core.DropJob) -> None:
        if i.job_id:
            self._vertices.pop(i.job_id, None)
        else:
            self._vertices.clear()

    def _answer(self, i: core.TaskAccepted | core.TaskRejected) -> None:
        pass  # read by submit_tasks from the instructions it gets back

    def _register_again(self, i: core.RegisterAgain) -> None:
        pass  # the connection loop registers again on its own once the stream ended

    # ------------------------------------------------------------------ lifecycle

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
        self._loop_thread = threading.get_ident()
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
            log.info("TaskManager %s: starting Spark (%s)", self.id, self._spark_target())
            asked = time.time()
            spark_starting = _in_daemon_thread(self._create_spark_and_task_runtime, "spark-start")
            # Registered only once the session is up: every task it is sent can run at once.
            self.spark = await spark_starting
            self.spark_ready_at = time.time()
            log.info("TaskManager %s: Spark session ready in %.1f s (%.1f s after the process started)", self.id,
                     self.spark_ready_at - asked, self.spark_ready_at - self.started_at)
        else:
            log.info("TaskManager %s runs without Spark: only no-op chains can run", self.id)
        await self._start_servers()
        if self.gateway is None:
            self.gateway = GrpcJobManagerGateway(self.id, self.core, cfg.jobmanager_address, cfg.cluster_token, cfg.tls)
        self._background = [
            asyncio.create_task(self._stay_connected(), name="jobmanager-connection"),
            asyncio.create_task(self._report_loop(), name="task-state-reporter"),
        ]
        for task in self._background:
            task.add_done_callback(self._background_ended)
        if self.spark is not None and cfg.spark_remote:
            # Not a background loop of the life-or-death kind: it only renews the session.
            self._connect_watch = asyncio.create_task(self._watch_connect_session(), name="spark-connect-watch")
        if self.spark is not None and cfg.warm_up and not cfg.spark_remote:  # a Connect server warms once, for all
            self._warm_up_watch = asyncio.create_task(self._warm_up_when_idle(), name="spark-warm-up")
        # What exists now (modules, PySpark, the SparkSession, the server) lives as long as the
        # process: out of the cycle collector's sight, a full collection no longer scans it all on
        # the loop (100-200 ms with thousands of tasks deployed, measured, for nothing to free).
        gc.freeze()

    async def _start_servers(self) -> None:
        """The TaskExecutor service (NOT_SERVING until registered) and the metrics endpoint."""
        cfg = self.config
        # No SO_REUSEPORT: a second process on the same --port must fail, not share the traffic.
        # Only the JobManager it is registered with now may call it: the token it sent with that
        # registration (`_register`) is the only one the TaskExecutor service takes.
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *MESSAGE_SIZE_OPTIONS],
                                       interceptors=[security.Authenticator(f"TaskManager {self.id}",
                                                                            self._accepted_tokens)])
        add_service(self._server, _TaskExecutorServicer(self), cluster_pb2.DESCRIPTOR.services_by_name["TaskExecutor"])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in _HEALTH_SERVICES:
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        where = host_port(cfg.host, cfg.port)
        try:
            bound = security.add_port(self._server, where, cfg.tls)
        except RuntimeError as e:
            raise StartupError(f"cannot bind the TaskExecutor service to {where}: {e}") from None
        if bound == 0:  # older grpcio reports a failed bind this way instead of raising
            raise StartupError(f"cannot bind the TaskExecutor service to {where}")
        await self._server.start()
        self._bound_port = bound
        self.address = host_port(advertised_host(cfg.host, cfg.advertise_host, cfg.jobmanager_address), bound)
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

    async def _warm_up_when_idle(self) -> None:
        """Spark's first jobs (taskmanager/warmup.py), in a daemon thread while the TaskManager
        serves, once it has run no task yet and the machine's CPUs are idle enough; the first
        task that comes meanwhile interrupts it (`_start_task`)."""
        from funke.taskmanager import warmup

        loop = asyncio.get_running_loop()
        before = await loop.run_in_executor(None, warmup.cpu_times)
        since = loop.time()
        said = False
        while True:
            await asyncio.sleep(warmup.CHECK_INTERVAL_S)
            if self._tasks_started or self._stopping or self.spark is None:
                return
            after = await loop.run_in_executor(None, warmup.cpu_times)
            idle, before = warmup.idle_fraction(before, after), after
            if warmup.due(session_ready=True, tasks_started=self._tasks_started, cpu_idle=idle,
                          waited_s=loop.time() - since, patience_s=warmup.PATIENCE_S):
                break
            if not said:
                said = True
                log.info("TaskManager %s: Spark warm-up waits for idle CPUs (%.0f%% idle), at most %g s", self.id,
                         100 * (idle or 0), warmup.PATIENCE_S)
        job = warmup.WarmUp(self.spark, self._scratch or self._scratch_dir())
        self._warm_up_job = job
        try:
            took = await _in_daemon_thread(job.run, "spark-warm-up")
        finally:
            self._warm_up_job = None
        if job.cancelled:
            log.info("TaskManager %s: Spark warm-up gave way to the first task after %.1f s", self.id, took)
        else:
            log.info("TaskManager %s: Spark warmed up in %.1f s", self.id, took)

    def _stop_warm_up(self) -> None:
        """A task is starting: the warm-up, if it runs, stops at once (its Spark jobs are
        interrupted off the loop), and if it has not started, it never will."""
        job = self._warm_up_job
        if job is not None and not job.cancelled and self._loop is not None:
            self._loop.run_in_executor(None, job.cancel)

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
        self._stopping = True
        log.info("TaskManager %s shutting down", self.id)
        if self._server is not None:
            await self._health.enter_graceful_shutdown()
        self._handle(core.ShutdownRequested(f"TaskManager {self.id} is shutting down", self._stimulus("shutdown")))
        try:
            await asyncio.wait_for(self._threads_idle.wait(), _TASK_CANCEL_GRACE_S)
        except TimeoutError:
            log.warning("%d task thread(s) still running after %g s; leaving them behind",
                        self._threads_running, _TASK_CANCEL_GRACE_S)
        if self.registration is not None and not self._outbox_empty.is_set():
            try:  # best effort: tell the JobManager how our tasks ended
                await asyncio.wait_for(self._outbox_empty.wait(), _REPORT_FLUSH_S)
            except TimeoutError:
                log.warning("could not report %d task state(s) before shutting down", len(self._outbox))

        for handle in self._timers:
            handle.cancel()
        if self._connect_watch is not None:
            self._connect_watch.cancel()
        if self._warm_up_watch is not None:
            self._warm_up_watch.cancel()
        self._stop_warm_up()
        # Closing the heartbeat stream tells the JobManager at once that we are gone.
        for background in self._background:
            background.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._ha is not None:
            await asyncio.get_running_loop().run_in_executor(self._ha_io, self._ha.close)
        self._ha_io.shutdown(wait=False)
        if self._server is not None:
            await self._server.stop(_SERVER_GRACE_S)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        if self.spark is not None:
            spark, self.spark = self.spark, None
            try:
                await asyncio.wait_for(_in_daemon_thread(spark.stop, "spark-stop"), _SPARK_STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("Spark did not stop within %g s", _SPARK_STOP_TIMEOUT_S)
            except Exception as exc:  # e.g. its JVM got the same SIGTERM and is gone already
                log.warning("stopping Spark failed: %s: %s", type(exc).__name__, exc)
                log.debug("stopping Spark failed", exc_info=True)
        if self.gateway is not None:
            await self.gateway.close()
        if self._scratch is not None:  # shuffle files can be many: off the loop
            scratch, self._scratch = self._scratch, None
            await _in_daemon_thread(lambda: shutil.rmtree(scratch, ignore_errors=True), "scratch-removal")
        log.info("TaskManager %s stopped", self.id)

    # ------------------------------------------------------------------ Spark

    def _scratch_dir(self) -> str:
        """`<temp dir>/funke-taskmanager-<pid>`, created now; the scratch directories of
        TaskManagers that died without removing theirs are removed first."""
        sweep_scratch_dirs(tempfile.gettempdir())
        path = scratch_dir_of(tempfile.gettempdir(), os.getpid())
        for sub in ("spark", "jvm"):
            os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)
        self._scratch = path
        return path

    def _spark_target(self) -> str:
        cfg = self.config
        return sparksession.target(cfg.spark_master, cfg.spark_remote, cfg.number_of_slots)

    def _spark_plan(self) -> sparksession.SparkPlan:
        cfg = self.config
        archive = None if cfg.spark_remote else jvmarchive.existing()
        if archive is None and not cfg.spark_remote:
            log.info("TaskManager %s: no class-data archive for this JVM and Spark yet: Spark starts slower "
                     "(python -m funke.taskmanager.jvmarchive makes one)", self.id)
        return sparksession.plan(
            master=cfg.spark_master, remote=cfg.spark_remote, slots=cfg.number_of_slots, cores=available_cores(),
            user_conf=cfg.spark_conf, scratch=None if cfg.spark_remote else self._scratch_dir(),
            environ=os.environ, python=sys.executable,
            host=advertised_host(cfg.host, cfg.advertise_host, cfg.jobmanager_address),
            jvm_archive=jvmarchive.java_option(archive) if archive is not None else None)

    def _create_spark_and_task_runtime(self) -> SparkSession:
        """Blocking: the session, then the task runtime (the operators; PySpark is loaded by then:
        importing it from two threads at once is not safe), off the loop, before the first task."""
        spark = self._create_spark()
        importlib.import_module("funke.taskmanager.task")
        return spark

    def _create_spark(self) -> SparkSession:
        """Blocking; runs in a thread. PySpark is imported here so --no-spark never loads it.
        Raises StartupError when Spark cannot run this TaskManager's tasks (see sparksession)."""
        plan = self._spark_plan()
        os.environ.update(plan.environ)
        for note in plan.notes:
            log.info("TaskManager %s: %s", self.id, note)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(f"funke-taskmanager-{self.id}")
        if plan.connect:
            # create(), not getOrCreate(): after a server restart the cached session is closed.
            spark = builder.remote(plan.target).create()
            from pyspark.sql.connect.client.retries import DefaultPolicy

            # While the server is away, calls wait for it as long as PySpark's default (about
            # 10 minutes), but look every 2 s instead of backing off to a minute: a restarted
            # server is noticed (and the session renewed) seconds after it is back.
            spark.client.set_retry_policies([DefaultPolicy(
                max_retries=sparksession.CONNECT_RETRIES, backoff_multiplier=2.0, initial_backoff=50,
                max_backoff=sparksession.CONNECT_RETRY_MAX_BACKOFF_MS)])
            try:
                sparksession.check_connect_conf(plan, spark.conf.isModifiable)
            except sparksession.SparkStartError as e:
                raise StartupError(str(e)) from None
            for key, value in plan.conf.items():
                spark.conf.set(key, value)
            for warning in sparksession.connect_warnings(spark.conf.get("spark.scheduler.mode", None)):
                log.warning("TaskManager %s: %s", self.id, warning)
            return spark
        builder = builder.master(plan.target)
        for key, value in plan.conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        if plan.cluster:
            jsc = spark.sparkContext._jsc.sc()
            try:
                count = sparksession.await_executors(plan, lambda: jsc.getExecutorIds().size(),
                                                     timeout_s=self.config.spark_executor_timeout_s)
            except sparksession.SparkStartError as e:
                spark.stop()  # gives the master its application back
                raise StartupError(str(e)) from None
            log.info("TaskManager %s: %d Spark executor(s) from %s", self.id, count, plan.target)
        return spark

    # ------------------------------------------------------------------ JobManager connection

    def _slot_counts(self) -> tuple[int, int, int]:
        """(slots, free slots, tasks running), for the metrics."""
        slots = self.core.slot_report()
        return len(slots), sum(1 for s in slots if not s.job_id), self.core.live_tasks()

    @property
    def registration(self) -> Registration | None:
        return self.connection.registration

    @property
    def jobmanager_address(self) -> str:
        """The JobManager's; with high availability the leader's, as last looked up."""
        return self.gateway.address if self.gateway is not None else self.config.jobmanager_address

    def _post(self, event: reg.Event) -> None:
        self._connection_events.put_nowait(event)

    def _spawn(self, coroutine: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine, name=name)
        self._connection_tasks.add(task)
        task.add_done_callback(self._connection_tasks.discard)
        return task

    async def _stay_connected(self) -> None:
        """Drives the registration core (common/task/registration.py): one event at a time, its
        instructions carried out before the next event is taken."""
        event: reg.Event = reg.Start()
        try:
            while True:
                for instruction in self.connection.handle(event, asyncio.get_running_loop().time()):
                    await _CONNECTION_INSTRUCTIONS[type(instruction)](self, instruction)
                event = await self._connection_events.get()
        finally:
            self.connection.handle(reg.Stop(), asyncio.get_running_loop().time())
            for task in list(self._connection_tasks):
                task.cancel()
            await asyncio.gather(*self._connection_tasks, return_exceptions=True)

    def _accepted_tokens(self, realm: Realm) -> tuple[str, ...]:
        return (self._registration_token,) if realm is Realm.REGISTRATION and self._registration_token else ()

    async def _current_leader(self) -> Lease | None:
        """With high availability: the lease if it names a live leader, else None. Looked up
        off the event loop (a ZooKeeper read may wait for its server)."""
        assert self._ha is not None
        lease = await asyncio.get_running_loop().run_in_executor(self._ha_io, self._ha.leader)
        return lease if lease is not None and lease.valid(time.time()) else None

    async def _look_up_leader(self, i: reg.LookUpLeader) -> None:
        async def look() -> None:
            lease = await self._current_leader()
            self._post(reg.NoLeader() if lease is None else reg.LeaderFound(lease.epoch, lease.address))

        self._spawn(look(), "leader-lookup")

    async def _send_registration(self, i: reg.SendRegistration) -> None:
        self._attempt = self._spawn(self._register(i.address, i.epoch), "registration")

    async def _register(self, address: str, epoch: int | None) -> None:
        """One registration attempt; while it waits with high availability, the lease is read
        every _LEADER_POLL_S (a new epoch makes the core abandon it: a paused leader never answers)."""
        assert self.gateway is not None and self.address is not None
        cfg = self.config
        if address:
            if self.gateway.address != address:
                log.info("TaskManager %s follows the leader to %s", self.id, address)
            self.gateway.connect(address)
        loop = asyncio.get_running_loop()
        # Off the loop: a JobManager given by name is resolved to find the route to it.
        host = await loop.run_in_executor(None, advertised_host, cfg.host, cfg.advertise_host, self.jobmanager_address)
        self.address = host_port(host, self._bound_port)
        # A new secret per attempt: from now on only the JobManager that receives it may call us
        # (the one registered with before, a deposed leader included, no longer can).
        self._registration_token = secrets.token_hex(TOKEN_BYTES)
        answer = asyncio.ensure_future(self.gateway.register(RegistrationRequest(
            self.id, self.address, len(self.core.slots), self._resources(), self._registration_token), _RPC_TIMEOUT_S))
        try:
            while epoch is not None and not answer.done():
                await asyncio.wait({answer}, timeout=_LEADER_POLL_S)
                if not answer.done():
                    lease = await self._current_leader()
                    self._post(reg.LeaseRead(lease.epoch if lease else None, lease.address if lease else ""))
            registration = await answer
        except GatewayError as e:
            self._post(reg.RegistrationFailed(e.code, e.detail, self.jobmanager_address))
            return
        finally:
            if not answer.done():
                answer.cancel()
                await asyncio.gather(answer, return_exceptions=True)
        if not cfg.data_dir:
            try:  # off the loop: an HDFS client starts a JVM
                await loop.run_in_executor(None, datafs.check, registration.data_dir)
            except datafs.DataDirError as e:  # Spark may still reach it; funke's own file work cannot
                log.error("TaskManager %s: the JobManager's data directory is out of reach here: %s", self.id, e)
        self._post(reg.RegistrationAccepted(registration, self.jobmanager_address))

    def _resources(self) -> dict[str, str]:
        cfg = self.config
        return {
            "cores": str(available_cores()),
            "spark_master": self._spark_target() if cfg.use_spark else "",
            "pid": str(os.getpid()),
            "metrics": self.metrics_url,
            "started_at": f"{self.started_at:.3f}",
            "spark_ready_at": f"{self.spark_ready_at:.3f}" if self.spark_ready_at else "",
        }

    async def _abandon_attempt(self, i: reg.AbandonAttempt) -> None:
        if self._attempt is not None:
            self._attempt.cancel()

    async def _start_connection_timer(self, i: reg.StartTimer) -> None:
        handle = asyncio.get_running_loop().call_later(i.delay_s, self._post, reg.TimerFired(i.timer))
        self._timers.add(handle)

    async def _now_registered(self, i: reg.Registered) -> None:
        registration = i.registration
        log.info("TaskManager %s registered with the JobManager at %s as %s (%d slots, address %s, "
                 "heartbeat every %g s, data dir %s)", self.id, self.jobmanager_address,
                 registration.registration_id, len(self.core.slots), self.address,
                 registration.heartbeat_interval_s, self.config.data_dir or registration.data_dir or "(default)")
        if registration.data_dir:
            self._jobmanager_data_dir = registration.data_dir
        self._handle(core.JobManagerRegistered(registration.registration_id, self.data_dir,
                                               self._stimulus("registered")))
        self._registered.set()
        await self._serving(health_pb2.HealthCheckResponse.SERVING)
        if i.first and self._on_registered is not None:
            self._on_registered(self)
        self._heartbeat_due = asyncio.Event()
        self._heartbeats = self._spawn(self._heartbeat(registration, self._heartbeat_due), "heartbeat")

    async def _serving(self, status: int) -> None:
        for service in _HEALTH_SERVICES:
            await self._health.set(service, status)

    async def _send_heartbeat(self, i: reg.SendHeartbeat) -> None:
        if self._heartbeat_due is not None:
            self._heartbeat_due.set()

    async def _heartbeat(self, registration: Registration, due: asyncio.Event) -> None:
        """One heartbeat stream: a heartbeat each time the core asks for one; answers, its end,
        the lease (with high availability) and the interval's passing go to the core."""
        assert self.gateway is not None
        stream = self.gateway.heartbeat()

        async def read_answers() -> None:
            while (reregister := await stream.read()) is not None:
                self._post(reg.HeartbeatAnswered(reregister))
            self._post(reg.HeartbeatEnded("the JobManager closed the heartbeat stream"))

        reader = asyncio.create_task(read_answers(), name="heartbeat-reader")
        try:
            while True:
                await due.wait()
                due.clear()
                await stream.send(registration.registration_id)
                done, _ = await asyncio.wait({reader}, timeout=registration.heartbeat_interval_s)
                if done:
                    reader.result()
                    return
                if self._ha is not None:
                    lease = await self._current_leader()
                    self._post(reg.LeaseRead(lease.epoch if lease else None, lease.address if lease else ""))
                self._post(reg.HeartbeatDue())
        except GatewayError as e:
            self._post(reg.HeartbeatEnded(f"heartbeat stream broke: {e}"))
        except asyncio.InvalidStateError:  # written to a stream that had ended cleanly
            self._post(reg.HeartbeatEnded("the heartbeat stream ended"))
        finally:
            reader.cancel()
            stream.close()
            await asyncio.gather(reader, return_exceptions=True)

    async def _lost(self, i: reg.Lost) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
            self._heartbeats = self._heartbeat_due = None
        self._registered.clear()
        await self._serving(health_pb2.HealthCheckResponse.NOT_SERVING)
        log.warning("TaskManager %s lost the JobManager (%s): cancelling and forgetting %d task(s), "
                    "registering again", self.id, i.reason, self.core.live_tasks())
        self._handle(core.JobManagerLost(i.reason, self._stimulus("jobmanager-lost")))
        self._drop_stale_reports()
        if self.gateway is not None:
            # Its reports are for the registration just lost: waiting out the RPC timeout of a
            # JobManager that does not answer would hold back the next registration's.
            self.gateway.cancel_reports()

    async def _log(self, i: reg.Log) -> None:
        log.log(i.level, "%s", i.message)

    async def _await_registration(self, i: reg.AwaitRegistration) -> None:
        pass  # see _registration_known

    async def _registration_known(self, registration_id: str) -> None:
        """A JobManager call naming a registration this TaskManager does not know yet may have
        overtaken the answer to our registration: the core says how long to wait for it."""
        for i in self.connection.handle(reg.CallArrived(registration_id), asyncio.get_running_loop().time()):
            if isinstance(i, reg.AwaitRegistration) and registration_id != self.core.registration_id:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._registered.wait(), i.timeout_s)

    # ------------------------------------------------------------------ TaskExecutor RPCs

    def _decode(self, m: cluster_pb2.TaskDeploymentDescriptor):
        """A descriptor as the core's deployment, its vertex decoded once per job; with --data-dir
        this TaskManager sees the shared data dir under its own path."""
        vertices = self._vertices.setdefault(m.job_id, {})
        vertex = vertices.get(m.vertex.id)
        if vertex is None:
            vertex = vertices[m.vertex.id] = codec.vertex_from_proto(m.vertex)
        return codec.deployment_from_proto(m, self.id, vertex,
                                           self.data_dir if self.config.data_dir or not m.data_dir else None)

    async def submit_tasks(self, request: cluster_pb2.SubmitTasksRequest) -> cluster_pb2.SubmitTasksResponse:
        await self._registration_known(request.registration_id)
        results = []
        for i, m in enumerate(request.tasks):
            if i and i % _DEPLOYS_PER_TURN == 0:
                await asyncio.sleep(0)  # let heartbeats and reports through
            try:
                deployment = self._decode(m)
            except (ValueError, TypeError) as e:  # WireError is a ValueError
                error = f"the task deployment does not decode: {e}"
            else:
                stimulus = m.stimulus_id or self._stimulus("submit")
                answers = self._handle(core.SubmitTask(deployment, request.registration_id, stimulus))
                error = next((a.reason for a in answers if isinstance(a, core.TaskRejected)), None)
            if error is not None:
                log.warning("rejected task %s (%s of job %s): %s", m.task_name, codec.attempt_from_proto(m.attempt),
                            m.job_id, error)
            results.append(cluster_pb2.TaskSubmissionResult(attempt=m.attempt, accepted=error is None,
                                                            error=error or ""))
        return cluster_pb2.SubmitTasksResponse(results=results)

    async def run_batches(self, request: cluster_pb2.RunBatchesRequest) -> cluster_pb2.RunBatchesResponse:
        """A micro-batch for some of a job's streaming tasks; each is told whether its task has it."""
        await self._registration_known(request.registration_id)
        try:
            batch = codec.batch_from_proto(request)
            tasks = tuple(BatchTask(codec.attempt_from_proto(t.attempt), tuple(
                BatchGate(g.input_index, tuple(g.producer_attempts), g.schema) for g in t.gates))
                for t in request.tasks)
        except ValueError as exc:
            return cluster_pb2.RunBatchesResponse(results=[cluster_pb2.TaskSubmissionResult(
                attempt=t.attempt, accepted=False, error=f"the batch does not decode: {exc}") for t in request.tasks])
        answers = self._handle(core.RunBatch(request.job_id, batch, tasks, request.registration_id,
                                             self._stimulus(f"batch-{batch.batch_id}"),
                                             tuple(request.released_batches)))
        refused = {a.key.attempt: a.reason for a in answers if isinstance(a, core.BatchRejected)}
        return cluster_pb2.RunBatchesResponse(results=[cluster_pb2.TaskSubmissionResult(
            attempt=codec.attempt_to_proto(t.attempt), accepted=t.attempt not in refused,
            error=refused.get(t.attempt, "")) for t in tasks])

    async def finish_tasks(self, request: cluster_pb2.FinishTasksRequest) -> None:
        await self._registration_known(request.registration_id)
        self._handle(core.FinishTasks(request.job_id, tuple(codec.attempt_from_proto(a) for a in request.attempts),
                                      request.registration_id, self._stimulus("finish")))

    async def set_rate_limits(self, request: cluster_pb2.SetRateLimitsRequest) -> None:
        await self._registration_known(request.registration_id)
        rates = tuple((codec.attempt_from_proto(t.attempt), t.records_per_second) for t in request.tasks)
        self._handle(core.SetRateLimits(request.job_id, rates, request.registration_id, self._stimulus("rate")))

    async def cancel_tasks(self, request: cluster_pb2.CancelTasksRequest) -> None:
        await self._registration_known(request.registration_id)
        stimulus = request.stimulus_id or self._stimulus("cancel")
        for i, a in enumerate(request.attempts):
            if i and i % _CANCELS_PER_TURN == 0:
                await asyncio.sleep(0)
            self._handle(core.CancelTask(request.job_id, codec.attempt_from_proto(a), request.registration_id, stimulus))

    async def update_partition_info(self, request: cluster_pb2.UpdatePartitionInfoRequest) -> None:
        # Recorded once for every local task reading these partitions; the gates they complete
        # hand their tasks the inputs (or finish no-op tasks) within the same event.
        await self._registration_known(request.registration_id)
        updates = [codec.partition_update_from_proto(u) for u in request.updates]
        for start in range(0, len(updates), _UPDATES_PER_TURN):
            if start:
                await asyncio.sleep(0)
            self._handle(core.PartitionsAvailable(request.job_id, tuple(updates[start:start + _UPDATES_PER_TURN]),
                                                  request.registration_id, self._stimulus("partitions")))

    async def free_slots(self, request: cluster_pb2.FreeSlotsRequest) -> None:
        await self._registration_known(request.registration_id)
        self._handle(core.FreeSlots(request.job_id, tuple(request.slot_indexes), request.cause,
                                    request.registration_id, self._stimulus("free-slots")))

    async def release_partitions(self, request: cluster_pb2.ReleasePartitionsRequest) -> None:
        """Answers once the partitions are deleted."""
        await self._registration_known(request.registration_id)
        refs = tuple(PartitionRef(p.data_set_id, p.partition_index, p.producer_attempt) for p in request.partitions)
        self._deletions = []
        self._handle(core.ReleasePartitions(request.job_id, refs, request.whole_job,
                                            request.registration_id, self._stimulus("release")))
        deletions, self._deletions = self._deletions, []
        await asyncio.gather(*deletions, return_exceptions=True)

    # ------------------------------------------------------------------ task threads and the inbox

    def _run_task(self, key: TaskKey, task: Task) -> None:
        """The body of a task's thread."""
        error: FailureInfo | None = None
        try:
            task.run()
        except BaseException as e:  # Task.run reports its failures itself; this is a bug there
            error = FailureInfo(type(e).__name__, str(e), traceback.format_exc())
        self._to_loop(self._thread_exited, key, error)

    def _task_reported(self, key: TaskKey, state: ExecutionState, failure: FailureInfo | None,
                       produced: tuple[ProducedPartition, ...], io: TaskIo | None = None, name: str = "") -> None:
        if io is not None:
            self.metrics.task_finished(key, name, io)
        self._handle(core.TaskReported(key, state, failure, produced, self._stimulus("report"), io))
        if state is ExecutionState.FAILED and self.config.spark_remote:
            self._renew_closed_connect_session()

    async def _watch_connect_session(self) -> None:
        """Ask the Connect server for a setting every _CONNECT_PING_S: after a restart the
        first answer says our session is gone (PySpark closes the client), and a new one is
        opened before the next task needs it, so a job submitted after the restart never meets
        the dead session; a job running across it fails those tasks once (restart strategy)."""
        while not self._stopping:
            await asyncio.sleep(_CONNECT_PING_S)
            spark = self.spark
            if spark is None or self._renewing_session:
                continue
            try:
                # A config read (about 2 ms): unlike the version (an AnalyzePlan), it is checked
                # against the server's session, so a restarted server says so.
                await asyncio.wait_for(_in_daemon_thread(lambda: spark.conf.get("spark.sql.session.timeZone"),
                                                         "spark-connect-ping"), _CONNECT_PING_S * 5)
            except Exception as e:  # the server is away (UNAVAILABLE), or it forgot us
                log.debug("TaskManager %s: Spark Connect ping: %s: %s", self.id, type(e).__name__, e)
                self._renew_closed_connect_session()

    def _renew_closed_connect_session(self) -> None:
        """A Spark Connect server that restarted has forgotten our session: PySpark's client
        closes itself on the first answer saying so, and every later call fails with
        NO_ACTIVE_SESSION. The task that met it failed (its restart strategy retries it); the
        tasks after it get a new session."""
        spark = self.spark
        client = getattr(spark, "client", None)
        if spark is None or self._renewing_session or not getattr(client, "is_closed", False):
            return
        self._renewing_session = True
        log.warning("TaskManager %s: the Spark Connect session at %s was closed (the server restarted?); "
                    "opening a new one", self.id, self.config.spark_remote)

        async def renew() -> None:
            try:
                # Stopped first: PySpark falls back to its default session where code asks for
                # the active one, and a closed default would hide the new one.
                with contextlib.suppress(Exception):
                    await _in_daemon_thread(spark.stop, "spark-stop")
                fresh = await _in_daemon_thread(self._create_spark, "spark-reconnect")
            except Exception as e:  # the server is still away: the next failed task tries again
                log.warning("TaskManager %s: no new Spark Connect session yet: %s: %s", self.id, type(e).__name__, e)
            else:
                if self.spark is spark and not self._stopping:
                    self.spark = fresh
                    log.info("TaskManager %s: new Spark Connect session %s", self.id, fresh.session_id)
                else:
                    await _in_daemon_thread(fresh.stop, "spark-stop")
            finally:
                self._renewing_session = False

        self._loop.create_task(renew(), name="spark-connect-renew")

    def _batch_reported(self, key: TaskKey, batch_id: int, produced: tuple[ProducedPartition, ...],
                        input_rows: int | None, io: TaskIo | None = None, name: str = "") -> None:
        if io is not None:
            self.metrics.batch_done(key, name, io)
        self._handle(core.BatchReported(key, batch_id, produced, self._stimulus("batch"), input_rows, io))

    def _thread_exited(self, key: TaskKey, error: FailureInfo | None) -> None:
        self._tasks.pop(key, None)
        self._threads_running -= 1
        if self._threads_running == 0:
            self._threads_idle.set()
        self._handle(core.TaskThreadExited(key, error, self._stimulus("thread-exit")))

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """From any thread: run `callback(*args)` on the loop, after everything posted before it."""
        if self._loop is None:
            return
        self._inbox.append((callback, args))
        self._wake_drain()

    def _wake_drain(self) -> None:
        assert self._loop is not None
        with self._inbox_lock:
            if self._inbox_drain_pending:
                return  # the pending drain takes this one too: one wake-up per burst
            self._inbox_drain_pending = True
        try:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._drain_inbox)
            else:
                self._loop.call_soon_threadsafe(self._drain_inbox)
        except RuntimeError:
            pass  # loop closed: the process is exiting and nobody is left to tell

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            # Cleared before draining: whatever is posted from now on wakes another drain, so
            # nothing is left behind (at worst a drain finds the inbox empty).
            self._inbox_drain_pending = False
        inbox = self._inbox
        for _ in range(min(len(inbox), _INBOX_PER_TURN)):
            callback, args = inbox.popleft()
            try:
                callback(*args)
            except Exception:  # one task's bug must not strand the callbacks behind it
                log.exception("callback %r failed", callback)
        if inbox:
            self._wake_drain()  # the rest on the next turn: heartbeats and RPCs go in between

    # ------------------------------------------------------------------ reporting

    def _drop_stale_reports(self) -> None:
        """Reports made for a registration the JobManager has written off go nowhere."""
        generation = self.core.generation
        self._outbox = collections.deque(q for q in self._outbox if q.generation == generation)
        if not self._outbox:
            self._outbox_empty.set()

    async def _report_loop(self) -> None:
        """The only sender of task states: in order, batched, retried while the JobManager is away."""
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                batch = [self._outbox.popleft() for _ in range(min(len(self._outbox), _REPORT_BATCH_MAX))]
                await self._send(batch)
            self._outbox_empty.set()

    async def _send(self, batch: list[_Queued]) -> None:
        assert self.gateway is not None
        retries = 0
        while True:
            generation = self.core.generation
            batch = [q for q in batch if q.generation == generation]
            if not batch:
                return
            try:
                sent = await self.gateway.update_task_states(
                    [q.report for q in batch], lambda: self.core.generation == generation, _RPC_TIMEOUT_S)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are shutting down
                # The call's channel was closed under it, or the JobManager it was for was lost
                # (we follow a new leader): not our end. Whatever is still current goes again.
                log.info("sending %d task state(s) was cut off; retrying", len(batch))
                continue
            except GatewayError as e:
                if e.code in reg.PERMANENT_REPORT_CODES:
                    log.error("the JobManager refused %d task state update(s) (%s); dropping them", len(batch), e)
                    self._handle(core.ReportsRefused(tuple(q.report for q in batch), str(e), self._stimulus("refused")))
                    return
                delay = reg.BACKOFF.delay(retries)
                retries += 1
                log.info("could not report %d task state(s) (%s); retrying in %.1f s", len(batch), e, delay)
                await asyncio.sleep(delay)
                continue
            if sent:
                self._delivered(batch)
                return

    def _delivered(self, batch: list[_Queued]) -> None:
        terminal = tuple(q.report for q in batch if q.report.state.is_terminal)
        if terminal:
            self._handle(core.ReportsDelivered(terminal, self._stimulus("delivered")))


_CONNECTION_INSTRUCTIONS: dict[type, Callable[[TaskExecutor, Any], Awaitable[None]]] = {
    reg.LookUpLeader: TaskExecutor._look_up_leader,
    reg.SendRegistration: TaskExecutor._send_registration,
    reg.AbandonAttempt: TaskExecutor._abandon_attempt,
    reg.StartTimer: TaskExecutor._start_connection_timer,
    reg.Registered: TaskExecutor._now_registered,
    reg.SendHeartbeat: TaskExecutor._send_heartbeat,
    reg.Lost: TaskExecutor._lost,
    reg.AwaitRegistration: TaskExecutor._await_registration,
    reg.Log: TaskExecutor._log,
}

_INSTRUCTIONS: dict[type, Callable[[TaskExecutor, Any], None]] = {
    core.TaskAccepted: TaskExecutor._answer,
    core.TaskRejected: TaskExecutor._answer,
    core.StartTask: TaskExecutor._start_task,
    core.InputsReady: TaskExecutor._inputs_ready,
    core.InterruptTask: TaskExecutor._interrupt,
    core.SendReport: TaskExecutor._send_report,
    core.DeletePartitions: TaskExecutor._delete_partitions,
    core.StartTimer: TaskExecutor._start_timer,
    core.DropJob: TaskExecutor._drop_job,
    core.RegisterAgain: TaskExecutor._register_again,
    core.GiveBatch: TaskExecutor._give_batch,
    core.BatchRejected: TaskExecutor._answer,
    core.FinishTask: TaskExecutor._finish_task,
    core.LimitRate: TaskExecutor._limit_rate,
}


class _TaskExecutorServicer(cluster_pb2_grpc.TaskExecutorServicer):
    """Translates the TaskExecutor service to TaskExecutor methods. Runs on the executor's loop."""

    def __init__(self, executor: TaskExecutor):
        self._executor = executor

    async def SubmitTasks(self, request: cluster_pb2.SubmitTasksRequest,
                          context: grpc.aio.ServicerContext) -> cluster_pb2.SubmitTasksResponse:
        return await self._executor.submit_tasks(request)

    async def CancelTasks(self, request: cluster_pb2.CancelTasksRequest,
                          context: grpc.aio.ServicerContext) -> cluster_pb2.CancelTasksResponse:
        await self._executor.cancel_tasks(request)
        return cluster_pb2.CancelTasksResponse()

    async def UpdatePartitionInfo(self, request: cluster_pb2.UpdatePartitionInfoRequest,
                                  context: grpc.aio.ServicerContext) -> cluster_pb2.UpdatePartitionInfoResponse:
        await self._executor.update_partition_info(request)
        return cluster_pb2.UpdatePartitionInfoResponse()

    async def FreeSlots(self, request: cluster_pb2.FreeSlotsRequest,
                        context: grpc.aio.ServicerContext) -> cluster_pb2.FreeSlotsResponse:
        await self._executor.free_slots(request)
        return cluster_pb2.FreeSlotsResponse()

    async def ReleasePartitions(self, request: cluster_pb2.ReleasePartitionsRequest,
                                context: grpc.aio.ServicerContext) -> cluster_pb2.ReleasePartitionsResponse:
        await self._executor.release_partitions(request)
        return cluster_pb2.ReleasePartitionsResponse()

    async def RunBatches(self, request: cluster_pb2.RunBatchesRequest,
                         context: grpc.aio.ServicerContext) -> cluster_pb2.RunBatchesResponse:
        return await self._executor.run_batches(request)

    async def FinishTasks(self, request: cluster_pb2.FinishTasksRequest,
                          context: grpc.aio.ServicerContext) -> cluster_pb2.FinishTasksResponse:
        await self._executor.finish_tasks(request)
        return cluster_pb2.FinishTasksResponse()

    async def SetRateLimits(self, request: cluster_pb2.SetRateLimitsRequest,
                            context: grpc.aio.ServicerContext) -> cluster_pb2.SetRateLimitsResponse:
        await self._executor.set_rate_limits(request)
        return cluster_pb2.SetRateLimitsResponse()
