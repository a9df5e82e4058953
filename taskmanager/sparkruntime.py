"""A TaskManager's SparkSession for its life: created off the event loop before the TaskManager
registers (`sparksession.py` plans what to ask Spark for), warmed up while no task has come yet
(`warmup.py`), renewed when a Spark Connect server that restarted has forgotten it (checked every
2 s and before every attempt, `session_for_attempt`; a task the server's shutdown failed, as its
failure says or a tiny query finds, `server_stopping`, waits for the server to come back before it
reports, `server_back`), stopped at shutdown; and the process's
scratch directory (Spark's and the JVM's temporary files).

Blocking Spark calls run in daemon threads (`in_daemon_thread`): a hung SparkSession must not
keep a signalled TaskManager alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from funke.runtime.rpc import advertised_host
from funke.taskmanager import jvmarchive, sparksession

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from funke.taskmanager.taskexecutorconfig import TaskExecutorConfig

log = logging.getLogger("funke.taskmanager")

T = TypeVar("T")

SCRATCH_PREFIX = "funke-taskmanager-"
# How often a TaskManager on Spark Connect asks the server whether it still knows our session.
CONNECT_PING_S = 2.0
# How often a TaskManager asks a Spark Connect server that is shutting down whether it came back.
SERVER_CHECK_S = 0.5
# How long the query asking whether a Spark Connect server is shutting down may take.
SERVER_PROBE_TIMEOUT_S = 10.0
SPARK_STOP_TIMEOUT_S = 10.0
JVM_EXIT_WAIT_S = 2.0  # how long a failed stop waits to tell whether the JVM got the same signal


class StartupError(Exception):
    """The TaskManager cannot start (a port in use, ...): a user's problem, not a bug."""


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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


def in_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
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


# Spark loggers whose warnings say nothing to a funke user: Spark's file reader looks for a
# streaming sink's `_spark_metadata` under the path it is given, and for a glob (a file source's
# `path` such as `data/*.txt`) it warns with a page of Java stack trace that no such file exists.
QUIET_LOGGERS = ("org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",  # Spark 4
                 "org.apache.spark.sql.execution.streaming.FileStreamSink")  # Spark 3


def quiet_loggers(spark: Any) -> None:
    """Only errors from QUIET_LOGGERS in this session's JVM (log4j 2); a JVM without log4j's
    Configurator keeps its warnings."""
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in QUIET_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:
        log.debug("could not quiet Spark's loggers", exc_info=True)


class SparkRuntime:
    def __init__(self, config: TaskExecutorConfig):
        self.config = config
        self.id = config.task_manager_id
        self.session: SparkSession | None = None
        self.scratch: str | None = None  # this process's scratch directory, removed at stop
        self.tasks_started = 0
        self.closing = False
        self._renewal: asyncio.Task[None] | None = None  # a new Spark Connect session being opened
        self._probe: asyncio.Task[bool] | None = None  # is the Spark Connect server shutting down?
        self._watches: list[asyncio.Task[None]] = []
        self._warm_up_job: Any = None  # the warm-up (warmup.WarmUp) while it runs

    # ------------------------------------------------------------------ creating the session

    def target(self) -> str:
        cfg = self.config
        return sparksession.target(cfg.spark_master, cfg.spark_remote, cfg.number_of_slots)

    def scratch_dir(self) -> str:
        """`<temp dir>/funke-taskmanager-<pid>`, created now; the scratch directories of
        TaskManagers that died without removing theirs are removed first."""
        sweep_scratch_dirs(tempfile.gettempdir())
        path = scratch_dir_of(tempfile.gettempdir(), os.getpid())
        for sub in ("spark", "jvm"):
            os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)
        self.scratch = path
        return path

    def plan(self) -> sparksession.SparkPlan:
        cfg = self.config
        archive = None if cfg.spark_remote else jvmarchive.existing()
        if archive is not None:
            jvmarchive.used(archive)  # the cache's cap removes the least recently used first
        elif not cfg.spark_remote:
            log.info("TaskManager %s: no class-data archive for this JVM and Spark yet: Spark starts slower "
                     "(python -m funke.taskmanager.jvmarchive makes one)", self.id)
        return sparksession.plan(
            master=cfg.spark_master, remote=cfg.spark_remote, slots=cfg.number_of_slots, cores=available_cores(),
            user_conf=cfg.spark_conf, scratch=None if cfg.spark_remote else self.scratch_dir(),
            environ=os.environ, python=sys.executable,
            host=advertised_host(cfg.host, cfg.advertise_host, cfg.jobmanager_address),
            jvm_archive=jvmarchive.java_option(archive) if archive is not None else None,
            heartbeat_interval_s=cfg.heartbeat_interval_s, heartbeat_timeout_s=cfg.heartbeat_timeout_s)

    async def start(self) -> SparkSession:
        """The session for the TaskManager's life, created (with the task runtime loaded) in a
        daemon thread; held as `session` from then on."""
        self.session = await in_daemon_thread(self.create_with_task_runtime, "spark-start")
        return self.session

    def create_with_task_runtime(self) -> SparkSession:
        """Blocking: the session, then the task runtime (the operators; PySpark is loaded by then:
        importing it from two threads at once is not safe), off the loop, before the first task."""
        spark = self.create()
        importlib.import_module("funke.taskmanager.task")
        return spark

    def create(self) -> SparkSession:
        """Blocking; runs in a thread. PySpark is imported here so --no-spark never loads it.
        Raises StartupError when Spark cannot run this TaskManager's tasks (see sparksession)."""
        plan = self.plan()
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
        quiet_loggers(spark)
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

    def watch(self) -> None:
        """Once the session is up: on Spark Connect, watch the session; else warm Spark up."""
        cfg = self.config
        if self.session is not None and cfg.spark_remote:
            # Not a background loop of the life-or-death kind: it only renews the session.
            self._watches.append(asyncio.create_task(self.watch_connect_session(), name="spark-connect-watch"))
        if self.session is not None and cfg.warm_up and not cfg.spark_remote:  # a Connect server warms once, for all
            self._watches.append(asyncio.create_task(self.warm_up_when_idle(), name="spark-warm-up"))

    # ------------------------------------------------------------------ warming up

    async def warm_up_when_idle(self) -> None:
        """Spark's first jobs (taskmanager/warmup.py), in a daemon thread while the TaskManager
        serves, once it has run no task yet and the machine's CPUs are idle enough; the first
        task that comes meanwhile interrupts it (`task_starting`), and so does other processes'
        work that takes the CPUs (`_yield_to_others`)."""
        from funke.taskmanager import warmup

        loop = asyncio.get_running_loop()
        before = await loop.run_in_executor(None, warmup.cpu_times)
        since = loop.time()
        said = False
        while True:
            await asyncio.sleep(warmup.CHECK_INTERVAL_S)
            if self.tasks_started or self.closing or self.session is None:
                return
            after = await loop.run_in_executor(None, warmup.cpu_times)
            idle, before = warmup.idle_fraction(before, after), after
            if warmup.due(session_ready=True, tasks_started=self.tasks_started, cpu_idle=idle,
                          waited_s=loop.time() - since, patience_s=warmup.PATIENCE_S):
                break
            if not said:
                said = True
                log.info("TaskManager %s: Spark warm-up waits for idle CPUs (%.0f%% idle), at most %g s", self.id,
                         100 * (idle or 0), warmup.PATIENCE_S)
        job = warmup.WarmUp(self.session, self.scratch or self.scratch_dir())
        self._warm_up_job = job
        # Started on idle CPUs, it gives them back to other processes' work that comes; started
        # after its patience on a machine that is never idle, it runs to its end.
        patient = idle is not None and idle < warmup.IDLE_CPU_FRACTION
        yielding = None if patient else asyncio.create_task(self._yield_to_others(job), name="spark-warm-up-yield")
        try:
            took = await in_daemon_thread(job.run, "spark-warm-up")
        finally:
            self._warm_up_job = None
            if yielding is not None:
                yielding.cancel()
        if job.cancelled:
            log.info("TaskManager %s: Spark warm-up gave way to %s after %.1f s", self.id,
                     "other processes' work" if self.tasks_started == 0 else "the first task", took)
        else:
            log.info("TaskManager %s: Spark warmed up in %.1f s", self.id, took)

    async def _yield_to_others(self, job: Any) -> None:
        """Cancel the running warm-up once other processes take the CPUs (see warmup.py)."""
        from funke.taskmanager import warmup

        loop = asyncio.get_running_loop()

        def reading() -> tuple[tuple[float, float] | None, float | None]:
            return warmup.cpu_times(), warmup.own_cpu_seconds()

        try:
            before = await loop.run_in_executor(None, reading)
            while not job.cancelled:
                await asyncio.sleep(warmup.YIELD_CHECK_INTERVAL_S)
                after = await loop.run_in_executor(None, reading)
                others = warmup.others_busy_fraction(before[0], after[0], before[1], after[1])
                before = after
                if others is not None and others >= warmup.OTHERS_BUSY_FRACTION:
                    log.info("TaskManager %s: other processes took %.0f%% of the CPUs; the Spark warm-up stops",
                             self.id, 100 * others)
                    await loop.run_in_executor(None, job.cancel)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # no readings: the warm-up runs on, as it did before it could tell
            log.debug("watching the CPUs during the warm-up failed", exc_info=True)

    def task_starting(self) -> None:
        """A task is starting: the warm-up, if it runs, stops at once (its Spark jobs are
        interrupted off the loop), and if it has not started, it never will."""
        self.tasks_started += 1
        self._stop_warm_up()

    def _stop_warm_up(self) -> None:
        job = self._warm_up_job
        if job is not None and not job.cancelled:
            asyncio.get_running_loop().run_in_executor(None, job.cancel)

    # ------------------------------------------------------------------ Spark Connect

    async def watch_connect_session(self) -> None:
        """Ask the Connect server for a setting every CONNECT_PING_S: after a restart the
        first answer says our session is gone (PySpark closes the client), and a new one is
        opened, so that an idle TaskManager has one before the next job comes. An attempt does
        not count on it: `session_for_attempt` asks again before every attempt runs."""
        while not self.closing:
            await asyncio.sleep(CONNECT_PING_S)
            spark = self.session
            if spark is None or self._renewing:
                continue
            try:
                # A config read (about 2 ms): unlike the version (an AnalyzePlan), it is checked
                # against the server's session, so a restarted server says so.
                await asyncio.wait_for(in_daemon_thread(lambda: _ping(spark), "spark-connect-ping"), CONNECT_PING_S * 5)
            except Exception as e:  # the server is away (UNAVAILABLE), or it forgot us
                log.debug("TaskManager %s: Spark Connect ping: %s: %s", self.id, type(e).__name__, e)
                self.renew_closed_connect_session()

    @property
    def _renewing(self) -> bool:
        return self._renewal is not None and not self._renewal.done()

    async def session_for_attempt(self) -> SparkSession | None:
        """The session an attempt is to run on, known to the server now. On Spark Connect one
        question first (a config read, about 2 ms; while the server is away it waits for it, as
        every call does); when the server has forgotten the session (it restarted), a new session
        is opened before the attempt runs. Without it the attempt after a restart would meet the
        closed session (NO_ACTIVE_SESSION) and spend a second restart of the job's budget."""
        spark = self.session
        if not self.config.spark_remote or spark is None:
            return spark
        renewal = self._renewal if self._renewing else None
        if renewal is None:
            try:
                await in_daemon_thread(lambda: _ping(spark), "spark-connect-check")
            except Exception as e:  # the server forgot us; or it stayed away longer than the retries wait
                log.debug("TaskManager %s: Spark Connect check before an attempt: %s: %s", self.id,
                          type(e).__name__, e)
                renewal = self.renew_closed_connect_session()
            if renewal is None:
                return self.session
        await asyncio.shield(renewal)
        return self.session

    async def server_back(self, stopped: SparkSession, timeout_s: float) -> bool:
        """A task on session `stopped` failed because its Spark Connect server is shutting down
        (`sparksession.server_stopped`). Waits, at most `timeout_s`, until this TaskManager has a
        session on the server that came back (the first answer of a restarted server closes the
        old session: a new one is opened); True once it has. The dying server may still answer a
        config read from the old session: only a session opened since counts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.closing and (left := deadline - loop.time()) > 0:
            spark = self.session
            renewal = self._renewal if self._renewing else None
            if renewal is None and spark is not None:
                try:
                    await asyncio.wait_for(in_daemon_thread(lambda: _ping(spark), "spark-connect-check"), left)
                except TimeoutError:
                    return False
                except Exception:  # the server forgot the session (it restarted), or it is away
                    renewal = self.renew_closed_connect_session()
                else:
                    if spark is not stopped:
                        return True
            if renewal is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(renewal), max(deadline - loop.time(), 0.0))
            else:
                await asyncio.sleep(SERVER_CHECK_S)
        return False

    async def server_stopping(self, spark: SparkSession) -> bool:
        """After a task on Spark Connect failed for a reason that does not say whether its server
        is shutting down (the server's Python workers may go first, and the task fails for that):
        a tiny query, which a server whose SparkContext stopped refuses, while a config read still
        succeeds there. True when the answer says the server is shutting down. One query at a time,
        shared by the tasks that failed together."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_server(spark), name="spark-connect-probe")
        return await asyncio.shield(self._probe)

    async def _probe_server(self, spark: SparkSession) -> bool:
        try:
            await asyncio.wait_for(in_daemon_thread(lambda: spark.range(1).collect(), "spark-connect-probe"),
                                   SERVER_PROBE_TIMEOUT_S)
        except Exception as e:  # a server away longer than the timeout is not shutting down: it is gone
            return sparksession.server_stopped(str(e))
        return False

    def renew_closed_connect_session(self) -> asyncio.Task[None] | None:
        """A Spark Connect server that restarted has forgotten our session: PySpark's client
        closes itself on the first answer saying so, and every later call fails with
        NO_ACTIVE_SESSION. Opens a new session (once, however many ask); returns the renewal
        under way, None when the session is not closed."""
        if self._renewing:
            return self._renewal
        spark = self.session
        client = getattr(spark, "client", None)
        if spark is None or self.closing or not getattr(client, "is_closed", False):
            return None
        log.warning("TaskManager %s: the Spark Connect session at %s was closed (the server restarted?); "
                    "opening a new one", self.id, self.config.spark_remote)

        async def renew() -> None:
            try:
                # Stopped first: PySpark falls back to its default session where code asks for
                # the active one, and a closed default would hide the new one.
                with contextlib.suppress(Exception):
                    await in_daemon_thread(spark.stop, "spark-stop")
                fresh = await in_daemon_thread(self.create, "spark-reconnect")
            except Exception as e:  # the server is still away: the next attempt or ping tries again
                log.warning("TaskManager %s: no new Spark Connect session yet: %s: %s", self.id, type(e).__name__, e)
            else:
                if self.session is spark and not self.closing:
                    self.session = fresh
                    log.info("TaskManager %s: new Spark Connect session %s", self.id, fresh.session_id)
                else:
                    await in_daemon_thread(fresh.stop, "spark-stop")

        self._renewal = asyncio.get_running_loop().create_task(renew(), name="spark-connect-renew")
        return self._renewal

    # ------------------------------------------------------------------ stopping

    def close(self) -> None:
        """Shutdown begins: no more warm-up or renewal."""
        self.closing = True
        for watch in self._watches:
            watch.cancel()
        self._stop_warm_up()

    async def stop(self) -> None:
        """Stop the session (at most SPARK_STOP_TIMEOUT_S) and remove the scratch directory."""
        if self.session is not None:
            spark, self.session = self.session, None
            try:
                await asyncio.wait_for(in_daemon_thread(spark.stop, "spark-stop"), SPARK_STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("Spark did not stop within %g s", SPARK_STOP_TIMEOUT_S)
            except Exception as exc:
                # A signal to our process group (`funke cluster stop`) stops Spark's JVM as well
                if await in_daemon_thread(lambda: _jvm_exited(spark, JVM_EXIT_WAIT_S), "spark-jvm-exit"):
                    log.info("Spark's JVM had stopped already (it got the same signal)")
                else:
                    log.warning("stopping Spark failed: %s: %s", type(exc).__name__, exc)
                log.debug("stopping Spark failed", exc_info=True)
        if self.scratch is not None:  # shuffle files can be many: off the loop
            scratch, self.scratch = self.scratch, None
            await in_daemon_thread(lambda: shutil.rmtree(scratch, ignore_errors=True), "scratch-removal")


def _ping(spark: Any) -> None:
    """Blocking: one question to a Spark Connect server that it answers from our session."""
    spark.conf.get("spark.sql.session.timeZone")


def _jvm_exited(spark: Any, wait_s: float) -> bool:
    """Whether the JVM that classic PySpark started for `spark` exits within `wait_s` seconds
    (False for Spark Connect, which has none of its own, and when it cannot be told)."""
    try:
        proc = spark.sparkContext._gateway.proc
        proc.wait(timeout=wait_s)
    except Exception:  # Spark Connect has no SparkContext; TimeoutExpired: the JVM still runs
        return False
    return True
