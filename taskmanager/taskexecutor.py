"""The TaskExecutor: one TaskManager's task slots, the tasks running in them, and its connection
to the JobManager (registration, the heartbeat stream, task execution state reports).

Everything here is owned by one asyncio event loop (Flink's main-thread model): the slot table,
the task registry, the record of available partitions (`inputgates.py`), the decoded vertices, the
report queue, the registration. Blocking work leaves the loop: each task's `Task.run()` gets its
own thread (it blocks on Spark), creating and stopping the SparkSession and deleting partition
directories run in threads too, and whatever those threads learn comes back to the loop through
one thread-safe inbox, which wakes the loop once per burst, not once per message. The loop never
waits on a task.

A chain of no-op kinds needs no thread: it runs inline on the loop (`Task.run_inline`), and if
its inputs are not all available yet it finishes when its gates complete. Nothing on the loop is
O(P x consumers): a partition update is recorded once for all the tasks that read it, and work
that comes in bulk (a SubmitTasks of 2 000 tasks, a partition update that completes the gates of
thousands of waiting tasks, a cancellation of all of them) is spread over loop turns so that the
heartbeat is never starved.

The JobManager side of the protocol is `proto/funke/v1/cluster.proto`: we call ResourceManager
(register, heartbeat) and JobMaster (state updates), and serve TaskExecutor.

Connection lifecycle: register (retrying until the JobManager answers) -> one long-lived
heartbeat stream -> if the stream breaks, the JobManager stops answering, or it asks us to
reregister, every task is cancelled and forgotten (the JobManager has already failed them: for it
this TaskManager was lost) and we register again on a fresh stream.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.common import ids, layout
from funke.common.executiongraph import ExecutionAttemptId, FailureInfo
from funke.common.operators import NOOP_KINDS
from funke.common.slotmanager import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from funke.common.states import ExecutionState
from funke.deploy.rpc import MESSAGE_SIZE_OPTIONS, add_service
from funke.taskmanager.inputgates import PartitionAvailability
from funke.taskmanager.task import Task, VertexCache
from funke.v1 import cluster_pb2, cluster_pb2_grpc, job_pb2

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("funke.taskmanager")

T = TypeVar("T")

# Registration retries: quick at first (the JobManager is usually just starting), capped so a
# restarted JobManager finds us again within a couple of seconds.
_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 2.0
_RPC_TIMEOUT_S = 10.0
# Shutdown: how long cancelled tasks get to end, and how long we try to tell the JobManager.
_TASK_CANCEL_GRACE_S = 5.0
_REPORT_FLUSH_S = 2.0
_SERVER_GRACE_S = 1.0
_SPARK_STOP_TIMEOUT_S = 10.0
# A task thread that returns without a terminal report may still have one on its way from a
# thread that was cancelling it; wait this long before calling it a failure.
_MISSING_TERMINAL_GRACE_S = 1.0
_REPORT_BATCH_MAX = 1000
# Bulk work is cut into slices per loop turn, each a few ms at most, so that a SubmitTasks of
# thousands of tasks or an update that completes thousands of gates never holds the loop long
# enough to delay a heartbeat.
_DEPLOYS_PER_TURN = 64
_CANCELS_PER_TURN = 64
_UPDATES_PER_TURN = 1000
_INBOX_PER_TURN = 128
_STATES_PER_TURN = 250
# Attempts cancelled before their SubmitTasks arrived; bounded so a long-lived TaskManager
# does not grow without end (such races involve only the most recent cancellations).
_EARLY_CANCELS_MAX = 10_000
# Codes that mean "the JobManager will never accept this batch": retrying would stall every later
# report behind it. Everything else (UNAVAILABLE, DEADLINE_EXCEEDED, ...) is a JobManager that is
# restarting or busy, and is retried.
_PERMANENT_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
})
# gRPC's own reconnect backoff defaults to 1 s growing to 120 s; a restarted JobManager must be
# found within our 2 s backoff, so the channel may not sleep longer than that.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
_HEALTH_SERVICES = ("", "funke.v1.TaskExecutor")


class StartupError(Exception):
    """The TaskManager cannot start (a port in use, ...): a user's problem, not a bug."""


@dataclass(frozen=True, slots=True)
class TaskExecutorConfig:
    task_manager_id: str
    jobmanager_address: str = "127.0.0.1:6123"
    number_of_slots: int = 2
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port; the bound one is registered
    spark_master: str | None = None  # None: local[<slots>]
    spark_remote: str | None = None  # a Spark Connect URL instead of a local/cluster master
    spark_conf: tuple[tuple[str, str], ...] = ()
    data_dir: str | None = None  # overrides the JobManager's data dir for this TaskManager
    use_spark: bool = True  # False: no SparkSession, only no-op chains run


@dataclass(frozen=True, slots=True, order=True)
class TaskKey:
    """A task as the JobManager names it: its job and its execution attempt."""

    job_id: str
    attempt: ExecutionAttemptId

    def __str__(self) -> str:
        return f"{self.attempt} of job {self.job_id}"


# ---------------------------------------------------------------------------- slot table


@dataclass(slots=True)
class TaskSlot:
    index: int
    job_id: str | None = None  # None: free
    tasks: dict[TaskKey, None] = field(default_factory=dict)  # insertion-ordered set


class TaskSlotTable:
    """Which job holds each slot and which of its tasks run there. Pure bookkeeping, no I/O.

    A slot is allocated to a job by the first task the JobManager deploys into it and stays
    with that job, empty or not, until FreeSlot (the JobManager's slot manager owns the
    allocation; we only mirror it). Slot sharing: any number of that job's tasks run in it.

    The slot report is kept up to date with every change rather than built per heartbeat:
    building it took 12 ms of loop time with 2 500 slots and 5 000 running tasks."""

    def __init__(self, number_of_slots: int):
        self.slots = [TaskSlot(i) for i in range(number_of_slots)]
        self._held: dict[str, int] = {}  # job -> how many slots it holds
        self._report = cluster_pb2.SlotReport(
            slots=[cluster_pb2.SlotStatus(index=i) for i in range(number_of_slots)])

    def __len__(self) -> int:
        return len(self.slots)

    def valid(self, index: int) -> bool:
        return 0 <= index < len(self.slots)

    def why_not_deployable(self, index: int, job_id: str) -> str | None:
        """None if a task of `job_id` may run in slot `index`, else the reason it may not."""
        if not self.valid(index):
            return (f"slot index {index} is out of range: this TaskManager has {len(self.slots)} "
                    f"slot(s) (0..{len(self.slots) - 1})")
        holder = self.slots[index].job_id
        if holder is not None and holder != job_id:
            return f"slot {index} is held by job {holder}"
        return None

    def holds_slots(self, job_id: str) -> bool:
        return self._held.get(job_id, 0) > 0

    def add(self, index: int, key: TaskKey) -> None:
        slot = self.slots[index]
        if slot.job_id is None:
            self._held[key.job_id] = self._held.get(key.job_id, 0) + 1
        slot.job_id = key.job_id
        slot.tasks[key] = None
        status = self._report.slots[index]
        status.job_id = key.job_id
        status.running.append(attempt_to_proto(key.attempt))

    def remove(self, index: int, key: TaskKey) -> None:
        if not self.valid(index):
            return
        tasks = self.slots[index].tasks
        if key not in tasks:
            return
        position = list(tasks).index(key)  # a slot runs a handful of tasks at most
        del tasks[key]
        del self._report.slots[index].running[position]

    def free(self, index: int) -> list[TaskKey]:
        """Free the slot; returns the tasks that were still in it."""
        slot = self.slots[index]
        still = list(slot.tasks)
        if slot.job_id is not None:
            held = self._held[slot.job_id] - 1
            if held:
                self._held[slot.job_id] = held
            else:
                del self._held[slot.job_id]
        slot.job_id = None
        slot.tasks.clear()
        status = self._report.slots[index]
        status.job_id = ""
        del status.running[:]
        return still

    def clear(self) -> None:
        for slot in self.slots:
            if slot.job_id is not None:
                self.free(slot.index)

    def report(self) -> cluster_pb2.SlotReport:
        """The current report; callers copy it into their request and must not change it."""
        return self._report


# ---------------------------------------------------------------------------- wire helpers


def attempt_from_proto(a: job_pb2.ExecutionAttemptId) -> ExecutionAttemptId:
    return ExecutionAttemptId(a.vertex_id, a.subtask_index, a.attempt_number)


def attempt_to_proto(a: ExecutionAttemptId) -> job_pb2.ExecutionAttemptId:
    return job_pb2.ExecutionAttemptId(vertex_id=a.vertex_id, subtask_index=a.subtask_index,
                                      attempt_number=a.attempt_number)


_STATE_VALUES = {state: job_pb2.ExecutionState.Value(f"EXECUTION_STATE_{state.name}") for state in ExecutionState}


def state_to_proto(state: ExecutionState) -> int:
    return _STATE_VALUES[state]


def failure_to_proto(failure: FailureInfo) -> job_pb2.Failure:
    return job_pb2.Failure(exception_type=failure.exception_type, message=failure.message,
                           traceback=failure.traceback)


def _host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):  # IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}"


def _advertised_host(host: str) -> str:
    # A wildcard bind is reachable, but "0.0.0.0" is no address a JobManager can dial.
    return socket.gethostname() if host in ("", "0.0.0.0", "::", "[::]") else host


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _is_noop_chain(descriptor: cluster_pb2.TaskDeploymentDescriptor) -> bool:
    return all(op.kind in NOOP_KINDS for op in descriptor.vertex.operators)


def _descriptor_problem(d: cluster_pb2.TaskDeploymentDescriptor) -> str | None:
    """Why a descriptor's ids cannot be used (they become path components), or None."""
    a = d.attempt
    problem = (ids.job_id_problem(d.job_id) or ids.path_id_problem(a.vertex_id, "vertex id")
               or next((p for g in d.inputs if (p := ids.path_id_problem(g.data_set_id, "data set id"))), None)
               or next((p for o in d.outputs if (p := ids.path_id_problem(o.data_set_id, "data set id"))), None))
    if problem is None and (a.subtask_index < 0 or a.attempt_number < 0 or d.slot_index < 0):
        problem = "negative subtask index, attempt number or slot index"
    return problem


def _rpc_error(e: grpc.aio.AioRpcError) -> str:
    return f"{e.code().name}: {e.details()}"


def delete_partition_dirs(paths: Iterable[str]) -> None:
    """Blocking: delete result partition directories, local paths or filesystem URIs."""
    for path in paths:
        try:
            if "://" in path:
                from pyarrow import fs as pafs  # only URIs need it

                filesystem, inner = pafs.FileSystem.from_uri(path)
                info = filesystem.get_file_info(inner)
                if info.type == pafs.FileType.Directory:
                    filesystem.delete_dir(inner)
                elif info.type == pafs.FileType.File:
                    filesystem.delete_file(inner)
            else:
                shutil.rmtree(path, ignore_errors=False)
        except FileNotFoundError:
            pass  # never written (a no-op task) or already released
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


# ---------------------------------------------------------------------------- tasks


@dataclass(eq=False, slots=True)
class _TaskEntry:
    """A deployed task as the loop sees it. Touched only on the loop."""

    key: TaskKey
    descriptor: cluster_pb2.TaskDeploymentDescriptor
    task: Task
    inline: bool = False  # a no-op chain run on the loop, without a thread
    state: ExecutionState | None = None  # last state the task reported
    cancel_requested: bool = False  # by the JobManager (CancelTasks, FreeSlot)
    # Set when this TaskManager cancels the task on its own (shutdown): the task then ends
    # FAILED with this cause, since the JobManager never asked for a cancellation.
    fail_cause: str | None = None
    forgotten: bool = False  # dropped after losing the JobManager: its reports go nowhere

    @property
    def name(self) -> str:
        return f"{self.descriptor.task_name or self.key.attempt} attempt #{self.key.attempt.attempt_number}"

    @property
    def terminal(self) -> bool:
        return self.state is not None and self.state.is_terminal


@dataclass(frozen=True, slots=True)
class _Report:
    entry: _TaskEntry
    state: ExecutionState
    failure: FailureInfo | None
    produced: tuple[cluster_pb2.ProducedPartition, ...]


@dataclass(frozen=True, slots=True)
class Registration:
    registration_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    data_dir: str


class TaskExecutor:
    """One TaskManager process's runtime. Create it, then `await run()` on the loop that is to
    own it; `stop()` (any thread, or a signal handler) ends `run()` after a clean shutdown."""

    def __init__(self, config: TaskExecutorConfig,
                 on_registered: Callable[[TaskExecutor], None] | None = None):
        if config.number_of_slots < 1:
            raise ValueError(f"a TaskManager needs at least one slot, not {config.number_of_slots}")
        self.config = config
        self.id = config.task_manager_id
        self._on_registered = on_registered
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = asyncio.Event()
        self._stopping = False

        self.slots = TaskSlotTable(config.number_of_slots)
        self._tasks: dict[TaskKey, _TaskEntry] = {}
        # Which partitions are available, per job and data set, for every local task reading them;
        # gates it completes are called back through the inbox, a slice per loop turn.
        self.partitions = PartitionAvailability(dispatch=self._post_callbacks)
        self.vertices = VertexCache()
        # Bumped when every task is forgotten (the JobManager was lost): a bulk RPC that yielded
        # the loop in between must not go on deploying or recording for the old registration.
        self._generation = 0
        self._early_cancels: collections.OrderedDict[TaskKey, None] = collections.OrderedDict()
        # Partitions this TaskManager wrote, per job: (data dir, data set, index, producer attempt).
        self._produced: dict[str, set[tuple[str, str, int, int]]] = {}
        self._job_data_dirs: dict[str, str] = {}
        self._threads_running = 0
        self._threads_idle = asyncio.Event()
        self._threads_idle.set()

        # Callbacks for the loop, from task threads (reports, thread exits) and from the loop
        # itself (gates completed): a thread wakes the loop only if no drain is pending yet.
        self._inbox: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_drain_pending = False
        self._loop_thread: int | None = None

        self._outbox: collections.deque[_Report] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()

        self.registration: Registration | None = None
        self._jobmanager_data_dir = ""  # from the last registration; kept while re-registering
        self.address: str | None = None
        self.spark: SparkSession | None = None
        self._registered_once = False
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._channel: grpc.aio.Channel | None = None
        self._resource_manager: cluster_pb2_grpc.ResourceManagerStub | None = None
        self._job_master: cluster_pb2_grpc.JobMasterStub | None = None
        self._background: list[asyncio.Task[None]] = []

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
        if cfg.use_spark:
            log.info("TaskManager %s: starting Spark (%s)", self.id, self._spark_target())
            self.spark = await _in_daemon_thread(self._create_spark, "spark-start")
        else:
            log.info("TaskManager %s runs without Spark: only no-op chains can run", self.id)

        # No SO_REUSEPORT: a second process on the same --port must fail, not share the traffic.
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *MESSAGE_SIZE_OPTIONS])
        add_service(self._server, _TaskExecutorServicer(self), cluster_pb2.DESCRIPTOR.services_by_name["TaskExecutor"])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in _HEALTH_SERVICES:
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        where = _host_port(cfg.host, cfg.port)
        try:
            bound = self._server.add_insecure_port(where)
        except RuntimeError as e:
            raise StartupError(f"cannot bind the TaskExecutor service to {where}: {e}") from None
        if bound == 0:  # older grpcio reports a failed bind this way instead of raising
            raise StartupError(f"cannot bind the TaskExecutor service to {where}")
        await self._server.start()
        self.address = _host_port(_advertised_host(cfg.host), bound)
        log.info("TaskManager %s: TaskExecutor service on %s, %d slot(s)", self.id, self.address,
                 cfg.number_of_slots)

        self._channel = grpc.aio.insecure_channel(cfg.jobmanager_address, options=_CHANNEL_OPTIONS)
        self._resource_manager = cluster_pb2_grpc.ResourceManagerStub(self._channel)
        self._job_master = cluster_pb2_grpc.JobMasterStub(self._channel)
        self._background = [
            asyncio.create_task(self._stay_connected(), name="jobmanager-connection"),
            asyncio.create_task(self._report_loop(), name="task-state-reporter"),
        ]
        # What exists now (modules, PySpark, the SparkSession, the server) lives as long as the
        # process: out of the cycle collector's sight, a full collection no longer scans it all on
        # the loop (100-200 ms with thousands of tasks deployed, measured, for nothing to free).
        gc.freeze()

    async def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("TaskManager %s shutting down", self.id)
        if self._server is not None:
            await self._health.enter_graceful_shutdown()

        cause = f"TaskManager {self.id} is shutting down"
        for entry in list(self._tasks.values()):
            if not entry.terminal:
                entry.fail_cause = cause
                self._cancel(entry)
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

        # Closing the heartbeat stream tells the JobManager at once that we are gone.
        for background in self._background:
            background.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(_SERVER_GRACE_S)
        if self.spark is not None:
            spark, self.spark = self.spark, None
            try:
                await asyncio.wait_for(_in_daemon_thread(spark.stop, "spark-stop"), _SPARK_STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("Spark did not stop within %g s", _SPARK_STOP_TIMEOUT_S)
            except Exception:
                log.warning("stopping Spark failed", exc_info=True)
        if self._channel is not None:
            await self._channel.close()
        log.info("TaskManager %s stopped", self.id)

    # ------------------------------------------------------------------ Spark

    def _spark_target(self) -> str:
        cfg = self.config
        if cfg.spark_remote:
            return cfg.spark_remote
        return cfg.spark_master or f"local[{cfg.number_of_slots}]"

    def _create_spark(self) -> SparkSession:
        """Blocking; runs in a thread. PySpark is imported here so --no-spark never loads it."""
        cfg = self.config
        # Spark's Python workers must run our interpreter (our venv, cloudpickle, funke).
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(f"funke-taskmanager-{self.id}")
        builder = builder.remote(cfg.spark_remote) if cfg.spark_remote else builder.master(self._spark_target())
        conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(_available_cores()),
            # Tasks sharing a slot submit Spark jobs concurrently; FIFO would serialize them.
            "spark.scheduler.mode": "FAIR",
            # spark.python.task.killTimeout stays at Spark's 2 s: a cancelled funke task's Python
            # workers end themselves through its cancel marker (operators._cancellable). A short
            # timeout widens a Spark race: a task killed with its stage (a sibling task failed)
            # whose Python worker already went back to the pool has that worker destroyed while
            # another task reuses it, failing a healthy task of another job.
        }
        conf.update(cfg.spark_conf)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        if not cfg.spark_remote:  # a Spark Connect session has no SparkContext
            spark.sparkContext.setLogLevel("WARN")
        return spark

    # ------------------------------------------------------------------ JobManager connection

    async def _stay_connected(self) -> None:
        while True:
            self.registration = await self._register()
            if self.registration.data_dir:
                self._jobmanager_data_dir = self.registration.data_dir
            for service in _HEALTH_SERVICES:
                await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
            if not self._registered_once:
                self._registered_once = True
                if self._on_registered is not None:
                    self._on_registered(self)
            reason = await self._heartbeat(self.registration)
            self.registration = None
            for service in _HEALTH_SERVICES:
                await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
            live = sum(1 for e in self._tasks.values() if not e.terminal)
            log.warning("TaskManager %s lost the JobManager (%s): cancelling and forgetting %d task(s), "
                        "registering again", self.id, reason, live)
            self._forget_all_tasks()

    async def _register(self) -> Registration:
        assert self._resource_manager is not None and self.address is not None
        cfg = self.config
        resources = {
            "cores": str(_available_cores()),
            "spark_master": self._spark_target() if cfg.use_spark else "",
            "pid": str(os.getpid()),
        }
        delay = _BACKOFF_START_S
        failures = 0
        while True:
            request = cluster_pb2.RegisterTaskManagerRequest(
                task_manager_id=self.id, address=self.address, number_of_slots=len(self.slots),
                resources=resources, slot_report=self.slots.report())
            try:
                response = await self._resource_manager.RegisterTaskManager(request, timeout=_RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                failures += 1
                # The first miss is normal (JobManager starting); keep the log quiet after that.
                level = logging.INFO if failures == 1 else logging.DEBUG
                log.log(level, "JobManager at %s does not answer yet (%s); retrying",
                        cfg.jobmanager_address, _rpc_error(e))
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            registration = Registration(
                registration_id=response.registration_id,
                heartbeat_interval_s=response.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_INTERVAL_S,
                heartbeat_timeout_s=response.heartbeat_timeout_seconds or DEFAULT_HEARTBEAT_TIMEOUT_S,
                data_dir=response.data_dir,
            )
            log.info("TaskManager %s registered with the JobManager at %s as %s (%d slots, address %s, "
                     "heartbeat every %g s, data dir %s)", self.id, cfg.jobmanager_address,
                     registration.registration_id, len(self.slots), self.address,
                     registration.heartbeat_interval_s, cfg.data_dir or registration.data_dir or "(default)")
            return registration

    async def _heartbeat(self, registration: Registration) -> str:
        """Keep one heartbeat stream open until it ends; returns why it ended."""
        assert self._resource_manager is not None
        loop = asyncio.get_running_loop()
        call = self._resource_manager.Heartbeat()
        last_answer = loop.time()

        async def read_answers() -> str:
            nonlocal last_answer
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    return "the JobManager closed the heartbeat stream"
                last_answer = loop.time()
                if answer.reregister:
                    return "the JobManager does not know this registration"

        reader = asyncio.create_task(read_answers(), name="heartbeat-reader")
        try:
            while True:
                await call.write(cluster_pb2.HeartbeatRequest(
                    task_manager_id=self.id, registration_id=registration.registration_id,
                    slot_report=self.slots.report()))
                done, _ = await asyncio.wait({reader}, timeout=registration.heartbeat_interval_s)
                if done:
                    return reader.result()
                silent = loop.time() - last_answer
                if silent > registration.heartbeat_timeout_s:
                    # A hung JobManager keeps the stream open; its silence is what we can see.
                    return (f"no heartbeat answer for {silent:.1f} s (timeout "
                            f"{registration.heartbeat_timeout_s:g} s)")
        except grpc.aio.AioRpcError as e:
            return f"heartbeat stream broke: {_rpc_error(e)}"
        except asyncio.InvalidStateError:  # written to a stream that had ended cleanly
            return "the heartbeat stream ended"
        finally:
            reader.cancel()
            call.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    # ------------------------------------------------------------------ TaskExecutor RPCs

    async def submit_tasks(self, request: cluster_pb2.SubmitTasksRequest) -> cluster_pb2.SubmitTasksResponse:
        results = []
        generation = self._generation
        for i, descriptor in enumerate(request.tasks):
            if i and i % _DEPLOYS_PER_TURN == 0:
                await asyncio.sleep(0)  # let heartbeats and reports through
            key = TaskKey(descriptor.job_id, attempt_from_proto(descriptor.attempt))
            if generation != self._generation:
                error: str | None = (f"TaskManager {self.id} lost the JobManager while deploying; "
                                     "it has registered again")
            else:
                error = self._deploy(key, descriptor)
            if error is not None:
                log.warning("rejected task %s (%s): %s", descriptor.task_name, key, error)
            results.append(cluster_pb2.TaskSubmissionResult(
                attempt=descriptor.attempt, accepted=error is None, error=error or ""))
        return cluster_pb2.SubmitTasksResponse(results=results)

    def _deploy(self, key: TaskKey, descriptor: cluster_pb2.TaskDeploymentDescriptor) -> str | None:
        """Start one task; returns why not, or None."""
        if self._stopping:
            return f"TaskManager {self.id} is shutting down"
        if not key.job_id:
            return "the task descriptor has no job id"
        problem = _descriptor_problem(descriptor)
        if problem is not None:
            return problem
        if key in self._tasks:
            return f"task {key} is already deployed on TaskManager {self.id}"
        if key in self._early_cancels:
            del self._early_cancels[key]
            return f"task {key} was cancelled before it was deployed"
        error = self.slots.why_not_deployable(descriptor.slot_index, key.job_id)
        if error is not None:
            return error
        inline = _is_noop_chain(descriptor)
        if self.spark is None and not inline:
            kinds = ", ".join(op.kind for op in descriptor.vertex.operators)
            return (f"TaskManager {self.id} runs without Spark (--no-spark) and can only run chains of "
                    f"{', '.join(sorted(NOOP_KINDS))}; this chain is {kinds or '(empty)'}")
        # With --data-dir this TaskManager sees the shared data dir under its own path.
        if self.config.data_dir or not descriptor.data_dir:
            descriptor.data_dir = self.data_dir
        self._job_data_dirs[key.job_id] = descriptor.data_dir
        attempt_number = key.attempt.attempt_number
        if attempt_number > 0:
            # A new attempt of a producer: the JobManager reset its partitions, so what an older
            # attempt announced must not satisfy a consumer deployed from now on.
            for out in descriptor.outputs:
                self.partitions.supersede(key.job_id, out.data_set_id, out.partition_index, attempt_number)

        if inline:
            def report(state: ExecutionState, failure: FailureInfo | None,
                       produced: list[cluster_pb2.ProducedPartition] | None = None) -> None:
                # Inline tasks report on the loop (from run_inline, a gate callback or cancel).
                self._on_task_state(entry, state, failure, tuple(produced or ()))
        else:
            def report(state: ExecutionState, failure: FailureInfo | None,
                       produced: list[cluster_pb2.ProducedPartition] | None = None) -> None:
                # Called from task threads: hand over to the loop, never touch state here.
                self._to_loop(self._on_task_state, entry, state, failure, tuple(produced or ()))

        try:
            task = Task(descriptor, self.spark, report, partitions=self.partitions, vertices=self.vertices)
        except Exception as e:
            log.warning("could not create task %s", descriptor.task_name, exc_info=True)
            return f"could not create the task: {type(e).__name__}: {e}"
        entry = _TaskEntry(key, descriptor, task, inline)
        if not inline:
            thread = threading.Thread(target=self._run_task, args=(entry,), daemon=True,
                                      name=f"task {descriptor.task_name or key.attempt}")
            try:
                thread.start()
            except RuntimeError as e:  # out of threads
                task.discard()
                return f"could not start a thread for the task: {e}"
            self._threads_running += 1
            self._threads_idle.clear()
        self._tasks[key] = entry
        self.slots.add(descriptor.slot_index, key)
        if log.isEnabledFor(logging.DEBUG):  # not even the task's name is built otherwise
            log.debug("task %s (%s) of job %s deployed to slot %d%s", entry.name, key.attempt, key.job_id,
                      descriptor.slot_index, " (inline)" if inline else "")
        if inline:
            try:
                task.run_inline()
            except Exception as e:  # a bug in run_inline: the task must still end
                log.exception("task %s failed to run inline", entry.name)
                if not entry.terminal:
                    self._on_task_state(entry, ExecutionState.FAILED,
                                        FailureInfo(type(e).__name__, str(e), traceback.format_exc()), ())
        return None

    async def cancel_tasks(self, request: cluster_pb2.CancelTasksRequest) -> None:
        for i, a in enumerate(request.attempts):
            if i and i % _CANCELS_PER_TURN == 0:
                await asyncio.sleep(0)
            key = TaskKey(request.job_id, attempt_from_proto(a))
            entry = self._tasks.get(key)
            if entry is None:
                # The cancel overtook the deployment (or the task is long gone): make sure a
                # late SubmitTasks does not start what the JobManager already gave up on.
                self._early_cancels[key] = None
                while len(self._early_cancels) > _EARLY_CANCELS_MAX:
                    self._early_cancels.popitem(last=False)
                log.info("cancel for unknown task %s: remembered, a late deployment will be rejected", key)
                continue
            entry.cancel_requested = True
            if not entry.terminal:
                log.info("cancelling task %s (%s) of job %s", entry.name, key.attempt, key.job_id)
                self._cancel(entry)

    async def update_partition_info(self, request: cluster_pb2.UpdatePartitionInfoRequest) -> None:
        # Recorded once for every local task reading these partitions (O(1) each, plus the ranges
        # containing it); gates completed by it are called back through the inbox.
        updates = request.updates
        generation = self._generation
        for start in range(0, len(updates), _UPDATES_PER_TURN):
            if start:
                await asyncio.sleep(0)
                if generation != self._generation:
                    return  # the JobManager that sent this is no longer ours
            self.partitions.update(request.job_id, updates[start:start + _UPDATES_PER_TURN])

    async def free_slots(self, request: cluster_pb2.FreeSlotsRequest) -> None:
        holders: set[str] = set()
        for i, index in enumerate(request.slot_indexes):
            if i and i % _CANCELS_PER_TURN == 0:
                await asyncio.sleep(0)
            holder = self._free_slot(index, request.job_id, request.cause)
            if holder is not None:
                holders.add(holder)
        for job_id in holders:
            if not self.slots.holds_slots(job_id):
                self._drop_job_state(job_id)

    def _free_slot(self, index: int, job_id: str, cause: str) -> str | None:
        """Free one slot; returns the job that held it (None: free already, or not freed)."""
        if not self.slots.valid(index):
            log.warning("FreeSlot for slot %d, which this TaskManager does not have", index)
            return None
        holder = self.slots.slots[index].job_id
        if job_id and holder is not None and holder != job_id:
            log.info("FreeSlot for slot %d of job %s ignored: the slot now belongs to job %s",
                     index, job_id, holder)
            return None
        for key in self.slots.free(index):
            entry = self._tasks.get(key)
            if entry is not None and not entry.terminal:
                entry.cancel_requested = True
                log.info("cancelling task %s (%s): its slot %d is freed", entry.name, key.attempt, index)
                self._cancel(entry)
        if holder is not None:
            log.debug("slot %d freed (job %s%s)", index, holder, f": {cause}" if cause else "")
        return holder

    def _drop_job_state(self, job_id: str) -> None:
        """The job holds no slot here any more (or is over): forget what was kept for its tasks
        (decoded vertices, partition availability). Whatever the job deploys here later is
        described from the JobManager's state of that time, and is told of what comes after."""
        self.partitions.drop_job(job_id)
        self.vertices.drop_job(job_id)

    async def release_partitions(self, request: cluster_pb2.ReleasePartitionsRequest) -> None:
        job = request.job_id
        if ids.job_id_problem(job) is not None:
            log.warning("ReleasePartitions for job id %s, which is no job id; ignored", ids.echo(job))
            return
        bad = [p for p in request.partitions if not ids.is_path_id(p.data_set_id)
               or p.partition_index < 0 or p.producer_attempt < 0]
        if bad:
            log.warning("ReleasePartitions of job %s names %d partition(s) with invalid ids; ignored", job, len(bad))
            return
        data_dir = self._job_data_dirs.get(job, self.data_dir)
        produced = self._produced.get(job, set())
        targets = {(data_dir, p.data_set_id, p.partition_index, p.producer_attempt) for p in request.partitions}
        extra: list[str] = []
        if request.whole_job:
            targets |= produced
            self._produced.pop(job, None)
            self._drop_job_state(job)
            marker = layout.cancel_marker(data_dir, job, "_", 0, 0)
            if marker is not None:  # the job's cancel markers, written by this TaskManager's tasks
                extra.append(os.path.dirname(marker))
        else:
            for p in request.partitions:
                self.partitions.release(job, p.data_set_id, p.partition_index, p.producer_attempt)
            # A ref names a partition; whichever data dir it was written under is the one to clean.
            named = {(p.data_set_id, p.partition_index, p.producer_attempt) for p in request.partitions}
            written = {t for t in produced if t[1:] in named}
            targets |= written
            produced -= written
        if targets or extra:
            if targets:
                log.info("releasing %d result partition(s) of job %s", len(targets), job)

            def delete() -> None:
                # Paths are built here too: thousands of them are milliseconds of loop time.
                paths = sorted({layout.partition_dir(d, job, ds, index, attempt) for d, ds, index, attempt in targets})
                delete_partition_dirs(paths + extra)

            await asyncio.to_thread(delete)

    # ------------------------------------------------------------------ task threads and the inbox

    def _run_task(self, entry: _TaskEntry) -> None:
        """The body of a task's thread."""
        error: FailureInfo | None = None
        try:
            entry.task.run()
        except BaseException as e:  # Task.run should report its failures itself; this is a bug there
            error = FailureInfo(type(e).__name__, str(e), traceback.format_exc())
        self._to_loop(self._on_task_thread_exit, entry, error)

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """From any thread: run `callback(*args)` on the loop, after everything posted before it."""
        if self._loop is None:
            return
        self._inbox.append((callback, args))
        self._wake_drain()

    def _post_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Gates completed (the availability record's dispatch): their tasks are called back on
        the loop, a slice per turn, however many thousands there are."""
        if self._loop is None:  # never started: nobody to run them for but the caller
            for callback in callbacks:
                callback()
            return
        self._inbox.extend((callback, ()) for callback in callbacks)
        self._wake_drain()

    def _wake_drain(self) -> None:
        with self._inbox_lock:
            if self._inbox_drain_pending:
                return  # the pending drain takes this one too: one wake-up per burst
            self._inbox_drain_pending = True
        loop = self._loop
        assert loop is not None
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._drain_inbox)
            else:
                loop.call_soon_threadsafe(self._drain_inbox)
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

    def _cancel(self, entry: _TaskEntry) -> None:
        if entry.inline:
            # A no-op task: nothing to interrupt; if it waits for inputs it reports CANCELED now.
            entry.task.cancel()
            return
        # Off the loop: cancelling a Spark task talks to the JVM.
        assert self._loop is not None
        future = self._loop.run_in_executor(None, entry.task.cancel)

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("cancelling task %s failed: %r", entry.name, f.exception())

        future.add_done_callback(done)

    def _on_task_state(self, entry: _TaskEntry, state: ExecutionState, failure: FailureInfo | None,
                       produced: tuple[cluster_pb2.ProducedPartition, ...]) -> None:
        if entry.forgotten:
            return
        if entry.terminal:
            log.warning("task %s reported %s after it had ended %s; ignored", entry.name, state.value,
                        entry.state.value if entry.state else "?")
            return
        entry.state = state
        key = entry.key
        # Start and finish at DEBUG: at thousands of tasks a second, a line per state change was a
        # measurable share of the loop. Failures and cancellations stay at WARNING and INFO.
        if not state.is_terminal:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("task %s (%s) of job %s is %s", entry.name, key.attempt, key.job_id, state.value)
        else:
            self.slots.remove(entry.descriptor.slot_index, key)
            if state is ExecutionState.CANCELED and entry.fail_cause and not entry.cancel_requested:
                # Nobody asked for this cancellation: to the JobManager it is a failure.
                state = ExecutionState.FAILED
                failure = FailureInfo("TaskManagerShutdown", entry.fail_cause)
                entry.state = state
            if state is ExecutionState.FINISHED:
                written = self._produced.setdefault(key.job_id, set())
                for p in produced:
                    written.add((entry.descriptor.data_dir, p.data_set_id, p.partition_index,
                                 key.attempt.attempt_number))
            else:
                produced = ()  # only a finished task's output counts
            if failure is not None:
                log.warning("task %s (%s) of job %s %s: %s", entry.name, key.attempt, key.job_id,
                            state.value, failure)
            elif state is not ExecutionState.FINISHED or log.isEnabledFor(logging.DEBUG):
                log.log(logging.DEBUG if state is ExecutionState.FINISHED else logging.INFO,
                        "task %s (%s) of job %s %s", entry.name, key.attempt, key.job_id, state.value)
        self._outbox.append(_Report(entry, state, failure, produced))
        self._outbox_empty.clear()
        self._outbox_ready.set()

    def _on_task_thread_exit(self, entry: _TaskEntry, error: FailureInfo | None) -> None:
        self._threads_running -= 1
        if self._threads_running == 0:
            self._threads_idle.set()
        if entry.terminal or entry.forgotten:
            return
        assert self._loop is not None
        self._loop.call_later(_MISSING_TERMINAL_GRACE_S, self._fail_if_unfinished, entry, error)

    def _fail_if_unfinished(self, entry: _TaskEntry, error: FailureInfo | None) -> None:
        if entry.terminal or entry.forgotten:
            return
        if error is None:
            error = FailureInfo("TaskManagerError",
                                f"task {entry.name} ended without reporting FINISHED, FAILED or CANCELED")
        self._on_task_state(entry, ExecutionState.FAILED, error, ())

    def _forget_all_tasks(self) -> None:
        for entry in self._tasks.values():
            entry.forgotten = True
            if not entry.terminal:
                self._cancel(entry)
        self._tasks.clear()
        self.slots.clear()
        self._early_cancels.clear()
        # A new registration may come with a new JobManager whose attempts start over.
        self.partitions.clear()
        self.vertices.clear()
        self._generation += 1
        # Their reports are for a registration the JobManager has written off.
        self._outbox.clear()
        self._outbox_empty.set()

    # ------------------------------------------------------------------ reporting

    async def _report_loop(self) -> None:
        """The only sender of task states: in order, batched, retried while the JobManager is away."""
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                batch = [self._outbox.popleft() for _ in range(min(len(self._outbox), _REPORT_BATCH_MAX))]
                await self._send(batch)
            self._outbox_empty.set()

    async def _send(self, batch: list[_Report]) -> None:
        assert self._job_master is not None
        delay = _BACKOFF_START_S
        while True:
            batch = [r for r in batch if not r.entry.forgotten]
            if not batch:
                return
            request = cluster_pb2.UpdateTaskExecutionStateRequest()
            add = request.updates.add
            for i, r in enumerate(batch):
                if i and i % _STATES_PER_TURN == 0:
                    await asyncio.sleep(0)  # a batch of 1 000 is several ms to build
                message = add(job_id=r.entry.key.job_id, attempt=r.entry.descriptor.attempt,
                              state=_STATE_VALUES[r.state], produced=r.produced, task_manager_id=self.id)
                if r.failure is not None:
                    message.failure.CopyFrom(failure_to_proto(r.failure))
            if any(r.entry.forgotten for r in batch):
                continue  # the JobManager was lost while we built it: leave those out
            try:
                await self._job_master.UpdateTaskExecutionState(request, timeout=_RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                if e.code() in _PERMANENT_CODES:
                    log.error("the JobManager refused %d task state update(s) (%s); dropping them",
                              len(batch), _rpc_error(e))
                    self._sent(batch)
                    return
                log.info("could not report %d task state(s) (%s); retrying in %.1f s",
                         len(batch), _rpc_error(e), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            self._sent(batch)
            return

    def _sent(self, batch: list[_Report]) -> None:
        for r in batch:
            if r.state.is_terminal and self._tasks.get(r.entry.key) is r.entry:
                del self._tasks[r.entry.key]


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
