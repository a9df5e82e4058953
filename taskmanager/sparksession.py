"""The TaskManager's SparkSession: what it asks Spark for, and the checks that it got it.

Three kinds of Spark target, three sets of rules (`plan` is pure, so they are unit-tested):

- **local[N]** (the default): one JVM beside the TaskManager; funke's defaults (FAIR scheduling,
  no UI, scratch under the TaskManager's own directory, shuffle partitions = cores) and the
  user's `--spark-conf` on top.
- **a cluster master** (`spark://`, `yarn`, `k8s://`...): the same, plus what a shared cluster
  needs. On a standalone master an application takes every free core unless it says otherwise,
  so the first TaskManager would starve the rest: `spark.cores.max` defaults to the slots
  (one core per slot). After start, `await_executors` checks that the master really gave
  executors; a TaskManager whose Spark work could never run refuses to start, saying why.
- **Spark Connect** (`sc://`): the server is shared and its startup settings are its own.
  Only the user's settings are sent, each checked with the server first (`spark.conf.
  isModifiable`): one the server cannot change at runtime is an error at start, never a silent
  warning. FAIR scheduling is the server's to enable; `connect_warnings` says when it is not.

The Python of Spark's workers: the user's `spark.pyspark.python` or `PYSPARK_PYTHON` wins;
only when neither is set do the workers run this TaskManager's interpreter (right for local
mode; on a cluster the workers need funke's packages, see docs/operations/multi-host.md). Either way it reaches
the workers through this process's PYSPARK_PYTHON, which PySpark sends with every function.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from funke.common.scheduling.slotmanager import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S

LOCAL_PREFIX = "local"
CONNECT_PREFIX = "sc://"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
PYTHON_CONF = "spark.pyspark.python"
PYTHON_ENV = "PYSPARK_PYTHON"
CORES_MAX = "spark.cores.max"
UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
UNIX_SOCKET_DIR = "spark.python.unix.domain.socket.dir"
INTERRUPT_ON_CANCEL = "spark.sql.execution.interruptOnCancel"
# A Unix socket's path holds at most 107 bytes; Spark names its sockets ".<uuid4>.sock" in their
# directory (java.io.tmpdir unless UNIX_SOCKET_DIR says otherwise): 43 bytes with the slash.
MAX_UNIX_SOCKET_PATH = 107
UNIX_SOCKET_NAME_BYTES = 43
# Spark Connect calls retry an absent server every 2 s (PySpark's default backs off to 60 s),
# for about as long as PySpark's default allows (10 minutes).
CONNECT_RETRY_MAX_BACKOFF_MS = 2000
CONNECT_RETRIES = 305
# What a Spark Connect server says to the calls of a session whose server is shutting down: its
# SparkContext stopped, it answers nothing but errors until it exits (a config read may still
# succeed meanwhile: only its restart, a new server, can run the session's work again).
SERVER_STOPPED_MARKS = ("Cannot call methods on a stopped SparkContext", "because SparkContext was shut down")
# How long a task that failed so waits for the restarted server before it reports FAILED.
SERVER_RESTART_WAIT_S = 60.0
# How long a TaskManager on a cluster master waits for its first executor before refusing to start.
DEFAULT_EXECUTOR_TIMEOUT_S = 60.0
# The driver JVM's optimising compiler (C2) takes a method once it ran 10x as often as HotSpot's
# defaults say: at start a JVM compiles hundreds of methods that run a few thousand times and
# never again (a session's start and first jobs: about 20% of their CPU), while the loops of a
# real job cross these counts within milliseconds (per-query times of small queries unchanged).
DRIVER_JIT_OPTIONS = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
                      "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000")
# Spark's network timeouts on a cluster master, derived from funke's heartbeat settings
# (`network_conf`): Spark's own (120 s, and 3 shuffle-fetch retries 5 s apart, each waiting for
# a connection as long) let a host that drops off the network stall the other hosts' tasks for
# minutes while funke gave the TaskManager there up in seconds.
NETWORK_TIMEOUT = "spark.network.timeout"
MIN_NETWORK_TIMEOUT_S = 10.0  # not below: under it a busy executor's GC pause would look like a lost host
SPARK_DEFAULT_ASK_TIMEOUT = "120s"


class SparkStartError(Exception):
    """Spark started, but not so that this TaskManager's tasks could ever run."""


@dataclass(frozen=True, slots=True)
class SparkPlan:
    target: str  # the master URL, or the Spark Connect URL
    connect: bool
    conf: dict[str, str]  # for the session builder (classic), or to set once connected (Connect)
    environ: dict[str, str] = field(default_factory=dict)  # set before the JVM starts
    notes: tuple[str, ...] = ()  # what the TaskManager logs at start

    @property
    def cluster(self) -> bool:
        """A master that hands out executors on other machines (standalone, YARN, Kubernetes)."""
        return not self.connect and not self.target.startswith(LOCAL_PREFIX)

    @property
    def standalone(self) -> bool:
        return self.target.startswith("spark://")


def network_conf(heartbeat_interval_s: float, heartbeat_timeout_s: float,
                 user: Mapping[str, str]) -> dict[str, str]:
    """Spark's failure detection on a cluster master, in step with funke's heartbeats (which give
    a silent TaskManager up after `heartbeat_timeout_s`), each key unless the user set it:

    - spark.network.timeout: twice the heartbeat timeout, at least MIN_NETWORK_TIMEOUT_S. Within
      it an executor that sent no heartbeat is lost, and a shuffle fetch waiting on a silent peer
      fails (spark.shuffle.io.connectionTimeout follows it): its stage runs again elsewhere;
    - spark.network.timeoutInterval (how often the driver looks for lost executors): half of it
      (Spark requires at most the timeout);
    - spark.executor.heartbeatInterval: a quarter of it, between 1 and 10 s (Spark requires less
      than the timeout);
    - spark.shuffle.io.connectionCreationTimeout: the heartbeat timeout (a connection to a live
      host takes milliseconds; one to a lost host hangs until this);
    - spark.shuffle.io.retryWait: the heartbeat interval (3 retries, spark.shuffle.io.maxRetries);
    - spark.rpc.askTimeout: Spark's 120 s (it follows spark.network.timeout otherwise): a live
      peer's slow answer is not a lost host.

    A user's spark.network.timeout is the base of the others (a bare number is seconds)."""
    conf: dict[str, str] = {}
    network_s = _spark_seconds(user[NETWORK_TIMEOUT]) if NETWORK_TIMEOUT in user else None
    if NETWORK_TIMEOUT in user and network_s is None:
        return conf  # not a time we can read: Spark says what is wrong with it
    if network_s is None:
        network_s = max(2 * heartbeat_timeout_s, MIN_NETWORK_TIMEOUT_S)
        conf[NETWORK_TIMEOUT] = _spark_time(network_s)
    conf["spark.network.timeoutInterval"] = _spark_time(max(network_s / 2, 1.0))
    conf["spark.executor.heartbeatInterval"] = _spark_time(min(max(network_s / 4, 1.0), 10.0))
    conf["spark.shuffle.io.connectionCreationTimeout"] = _spark_time(min(heartbeat_timeout_s, network_s))
    conf["spark.shuffle.io.retryWait"] = _spark_time(heartbeat_interval_s)
    conf["spark.rpc.askTimeout"] = SPARK_DEFAULT_ASK_TIMEOUT
    return {k: v for k, v in conf.items() if k not in user}


_SPARK_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _spark_seconds(text: str) -> float | None:
    """A duration as Spark reads spark.network.timeout ("120s", "2min", "500ms"; bare: seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in ("", *_SPARK_TIME_UNITS):
        return None
    return float(match.group(1)) * _SPARK_TIME_UNITS.get(match.group(2) or "s", 1.0)


def _spark_time(seconds: float) -> str:
    """Whole milliseconds, as every Spark time setting reads them."""
    return f"{max(round(seconds * 1000), 1)}ms"


def target(master: str | None, remote: str | None, slots: int) -> str:
    return remote or master or f"local[{slots}]"


def plan(*, master: str | None, remote: str | None, slots: int, cores: int, user_conf: tuple[tuple[str, str], ...],
         scratch: str | None, environ: Mapping[str, str], python: str, host: str | None = None,
         jvm_archive: str | None = None, heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
         heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S) -> SparkPlan:
    """What to ask Spark for. `cores`: this machine's; `scratch`: the TaskManager's own scratch
    directory (classic sessions only); `python`: this TaskManager's interpreter; `host`: the
    address the TaskManager advertises, where a cluster's executors reach its Spark driver too;
    `jvm_archive`: the JVM option that maps the class-data archive of the driver's JVM
    (taskmanager/jvmarchive.py), if there is one (classic sessions only); `heartbeat_*`: funke's
    heartbeat settings, from which a cluster's network timeouts are derived (`network_conf`)."""
    url = target(master, remote, slots)
    user = dict(user_conf)
    notes: list[str] = []
    env: dict[str, str] = {}
    if PYTHON_CONF in user and not remote:
        # PySpark sends its driver's PYSPARK_PYTHON with every function (spark-submit is what
        # turns the setting into that variable, and a TaskManager is not started by it).
        env[PYTHON_ENV] = user[PYTHON_CONF]
        notes.append(f"Spark's Python workers run {user[PYTHON_CONF]} ({PYTHON_CONF})")
    elif environ.get(PYTHON_ENV):
        notes.append(f"Spark's Python workers run {environ[PYTHON_ENV]} ({PYTHON_ENV})")
    elif not remote:  # a Connect server's workers run the server's Python
        env[PYTHON_ENV] = python
    if remote:
        return SparkPlan(url, True, user, env, tuple(notes))

    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Tasks sharing a slot submit Spark jobs concurrently; FIFO would serialize them.
        "spark.scheduler.mode": "FAIR",
        # A Python worker that dies (a segfault in native code, the OOM killer) leaves its
        # stack in the task's failure, instead of only "Python worker exited unexpectedly".
        "spark.python.worker.faulthandler.enabled": "true",
        # spark.python.task.killTimeout stays at Spark's 2 s: a cancelled funke task's Python
        # workers end themselves through its cancel marker (operators.udf.cancellable).
        # A cancelled job's tasks are killed without Thread.interrupt (Spark SQL interrupts them
        # by default). A task thread interrupted while it waits for the Python daemon to fork
        # its worker (PythonWorkerFactory's 60 s select returns at once) makes Spark take the
        # daemon for lost and restart it, and the old daemon's shutdown SIGHUPs every worker it
        # forked: the Python workers of every other running task of this session, other jobs'
        # too, which fail with "Python worker exited unexpectedly (crashed)" (docs/limits.md).
        # Killed tasks still end: Python work by the cancel marker or Spark's monitor, JVM work
        # at its next row.
        INTERRUPT_ON_CANCEL: "false",
        # Executors talk to their Python workers (on the same host) over Unix domain sockets:
        # over TCP, Nagle's algorithm and the peer's delayed ACK hold a small batch's rows for
        # 40 ms at every Python stage (every map, filter or keyed-state operator of a micro-batch).
        UNIX_SOCKETS: "true",
    }
    local = url.startswith(LOCAL_PREFIX)
    if local:
        conf["spark.sql.shuffle.partitions"] = str(cores)
    else:
        if url.startswith("spark://") and CORES_MAX not in user:
            # A standalone application takes every free core unless capped: one per slot.
            conf[CORES_MAX] = str(slots)
            notes.append(f"asking the standalone master for {slots} core(s) ({CORES_MAX}, one per slot)")
        conf["spark.sql.shuffle.partitions"] = user.get(CORES_MAX, str(slots))
        derived = network_conf(heartbeat_interval_s, heartbeat_timeout_s, user)
        conf.update(derived)
        if NETWORK_TIMEOUT in derived:
            notes.append(f"Spark gives a silent executor or shuffle peer up after "
                         f"{_spark_seconds(derived[NETWORK_TIMEOUT]):g} s ({NETWORK_TIMEOUT}, from heartbeat.timeout "
                         f"{heartbeat_timeout_s:g} s)")
        if host and "spark.driver.host" not in user:
            # Spark's own guess is the host name's address, which may be loopback or another
            # interface; the executors must dial the driver where the JobManager dials us.
            conf["spark.driver.host"] = host
    java_options = [DRIVER_JIT_OPTIONS]
    if scratch is not None:
        # Spark's block manager, shuffle files and the JVM's extracted native libraries go under
        # the TaskManager's scratch directory, removed when it stops, not strewn over /tmp.
        conf["spark.local.dir"] = f"{scratch}/spark"
        java_options.append(f"-Djava.io.tmpdir={scratch}/jvm")
    if jvm_archive:
        # The driver's classes come parsed and verified from the archive: the JVM starts and runs
        # its first queries on about 40% less CPU (a JVM it does not fit starts without it).
        java_options.append(jvm_archive)
        notes.append(f"Spark's JVM maps its classes from the class-data archive ({jvm_archive})")
    conf[DRIVER_JAVA_OPTIONS] = " ".join(java_options)
    socket_dir = user.get(UNIX_SOCKET_DIR) or (f"{scratch}/jvm" if scratch is not None else None)
    if socket_dir is not None and len(os.fsencode(socket_dir)) + UNIX_SOCKET_NAME_BYTES > MAX_UNIX_SOCKET_PATH:
        # A socket there could not be bound (OSError: AF_UNIX path too long, the session would
        # not start): TCP, as Spark's default.
        conf[UNIX_SOCKETS] = "false"
        if user.get(UNIX_SOCKETS, "true").lower() == "true":
            notes.append(f"Spark's Python workers talk over TCP, not Unix sockets: {socket_dir} is too long a "
                         f"directory for a socket's path (at most {MAX_UNIX_SOCKET_PATH - UNIX_SOCKET_NAME_BYTES} bytes)")
    for key, value in user.items():
        if key == DRIVER_JAVA_OPTIONS and DRIVER_JAVA_OPTIONS in conf:
            conf[key] += f" {value}"
        else:
            conf[key] = value
    return SparkPlan(url, False, conf, env, tuple(notes))


def server_stopped(message: str) -> bool:
    """Whether a task's failure says that the Spark Connect server it ran on is shutting down."""
    return any(mark in message for mark in SERVER_STOPPED_MARKS)


def check_connect_conf(plan_: SparkPlan, is_modifiable: Callable[[str], bool]) -> None:
    """Raises SparkStartError naming every user setting a Connect server will not take at runtime
    (it would ignore it with a warning: FAIR scheduling or executor memory silently not applied)."""
    static = sorted(k for k in plan_.conf if not is_modifiable(k))
    if static:
        raise SparkStartError(
            f"the Spark Connect server at {plan_.target} cannot change {', '.join(static)} for one "
            "session: set them when starting the server (--conf KEY=VALUE), not with --spark-conf")


def connect_warnings(scheduler_mode: str | None) -> list[str]:
    if (scheduler_mode or "FIFO").upper() != "FAIR":
        return [f"the Spark Connect server schedules {scheduler_mode or 'FIFO'}: tasks sharing a slot run one "
                "after another; start the server with --conf spark.scheduler.mode=FAIR"]
    return []


def await_executors(plan_: SparkPlan, executors: Callable[[], int], *, timeout_s: float,
                    sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> int:
    """On a cluster master: wait until the application has an executor; returns how many it has.
    Raises SparkStartError when none comes within `timeout_s`: a TaskManager that accepted tasks
    would leave them RUNNING forever ("Initial job has not accepted any resources")."""
    if not plan_.cluster:
        return 0
    deadline = clock() + timeout_s
    while True:
        count = executors()
        if count > 0:
            return count
        if clock() >= deadline:
            asked = plan_.conf.get(CORES_MAX)
            memory = plan_.conf.get("spark.executor.memory", "1g (Spark's default)")
            raise SparkStartError(
                f"the Spark master {plan_.target} gave this TaskManager no executor within {timeout_s:g} s "
                f"(it asked for {asked + ' core(s)' if asked else 'cores'}, {memory} per executor): its workers "
                f"have no free cores or memory, or cannot reach this process; see the master's web UI. "
                f"Stop other applications, add workers, or lower {CORES_MAX} / spark.executor.memory")
        sleep(0.2)
