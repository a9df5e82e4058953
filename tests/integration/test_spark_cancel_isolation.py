"""A task cancelled on a TaskManager leaves the other tasks of its SparkSession alone, whatever
the cancellation met: here, a task cancelled while Spark waits for the Python daemon to fork its
worker, beside another job's task whose Python worker runs the user's function.

Spark (4.3, SPARK-54711) waits up to 60 s for the daemon's answer in a Selector. A task thread
interrupted there (Spark SQL kills a cancelled job's tasks with Thread.interrupt unless told
otherwise; funke tells it: spark.sql.execution.interruptOnCancel=false) returns at once, Spark
takes the daemon for lost and restarts it, and the old daemon's shutdown SIGHUPs every worker it
forked: the other job's task failed with "Python worker exited unexpectedly (crashed)" (seen in
the suite: test_user_tracebacks, one of seven concurrent jobs). The race is made certain by
pausing the daemon (SIGSTOP) while the cancelled task waits for it: a daemon slow to answer, as
on a loaded machine. The session is a TaskManager's own (`SparkRuntime.create`), the two tasks
are funke Tasks of two jobs, and the cancellation is funke's (`Task.cancel`).
tests/chaos/chaos_python_daemon.py measures the race over many rounds."""

from __future__ import annotations

import os
import shutil
import signal
import time

import psutil
import pytest

from funke.common.states import ExecutionState
from funke.taskmanager.sparkruntime import SparkRuntime
from funke.taskmanager.taskexecutorconfig import TaskExecutorConfig
from tests.unit.test_task_runtime import deploy, op, start

S = ExecutionState


@pytest.fixture(scope="module")
def spark():
    # three slots: the victim's task, the cancelled task, and a probe job beside them
    environ = dict(os.environ)
    runtime = SparkRuntime(TaskExecutorConfig("tm-cancel-isolation", number_of_slots=3, warm_up=False))
    session = runtime.create_with_task_runtime()
    assert session.sparkContext.appName == "funke-taskmanager-tm-cancel-isolation", "getOrCreate reused a session"
    yield session
    session.stop()
    stop_jvm()
    os.environ.clear()
    os.environ.update(environ)
    shutil.rmtree(runtime.scratch, ignore_errors=True)


def stop_jvm() -> None:
    """Ends the JVM PySpark started in this process. A TaskManager's session starts it with its
    own system properties (java.io.tmpdir in the scratch removed above, Unix-socket Python
    workers), and PySpark keeps one JVM per process for every later session: the next test
    module's getOrCreate would inherit them and fail to bind its socket in a removed directory."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        proc.stdin.close()  # the JVM exits when its stdin ends
        proc.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def wait_until(condition, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


def threads_creating_python_workers(spark) -> list:
    """The JVM threads inside PythonWorkerFactory.createWorker: waiting for the daemon's answer."""
    found = []
    for thread, frames in spark.sparkContext._jvm.java.lang.Thread.getAllStackTraces().items():
        if thread.getName().startswith("Executor task launch worker") and any(
                frame.getClassName().endswith("PythonWorkerFactory")
                and frame.getMethodName().startswith("createWorker") for frame in frames):
            found.append(thread)
    return found


def sigterm_pending(pid: int) -> bool:
    """Whether `pid` (a stopped process) was sent a SIGTERM that it has not handled yet."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(fields[k].strip(), 16) & bit for k in ("SigPnd", "ShdPnd"))


def test_a_task_cancelled_while_its_python_worker_starts_leaves_another_jobs_worker_running(spark, tmp_path):
    pid_file, go = str(tmp_path / "victim-worker"), str(tmp_path / "go")

    def wait_for_go(n):
        import os
        import time
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        while not os.path.exists(go):
            time.sleep(0.02)
        return n

    # one row each: one Spark task each (a range would be split over every core)
    one_row = op("source.collection", rows=[[1]], schema="id bigint")
    victim, victim_reports, victim_thread = start(deploy(
        tmp_path, [one_row, op("map", wait_for_go, schema="id bigint"), op("sink.discard")], job="victim"), spark)
    worker = psutil.Process(int(wait_until(lambda: os.path.exists(pid_file) and open(pid_file).read(),
                                           "the victim's user function")))
    daemon = worker.parent()
    assert "pyspark.daemon" in " ".join(daemon.cmdline()), daemon.cmdline()

    # The workers the victim's earlier Spark jobs gave back (Spark reuses them): gone, so that the
    # next task has to ask the daemon for one.
    for idle in daemon.children():
        if idle.pid != worker.pid:
            idle.kill()
            idle.wait(10)
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        cancelled, cancelled_reports, cancelled_thread = start(deploy(
            tmp_path, [one_row, op("map", lambda n: n, schema="id bigint"), op("sink.discard")], job="cancelled"),
            spark)
        [waiting] = wait_until(lambda: threads_creating_python_workers(spark), "a task waiting for its Python worker")
        cancelled.cancel()
        # A job submitted after the cancellation, on the third core: by the time it ran, the
        # executor has been told to kill the cancelled task (one endpoint, messages in order).
        assert spark.range(3).count() == 3
        # Killed with an interrupt, the waiting thread restarts the daemon: a SIGTERM, pending while
        # the daemon is paused. Killed without, it waits on for the daemon's answer.
        restarted = wait_until(
            lambda: "restarted" if sigterm_pending(daemon.pid) else (
                "waits" if not waiting.isInterrupted() and threads_creating_python_workers(spark) else None),
            "the cancelled task's thread to restart the daemon or wait on") == "restarted"
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    if restarted:  # the daemon SIGHUPs the workers it forked, then exits
        daemon.wait(60)
    open(go, "w").close()
    victim_thread.join(60)
    cancelled_thread.join(60)
    assert not victim_thread.is_alive() and not cancelled_thread.is_alive()

    state, failure, _ = victim_reports.last
    assert state is S.FINISHED, f"the victim {state.name}: {failure and failure.traceback}"
    assert victim_reports.states == [S.INITIALIZING, S.RUNNING, S.FINISHED]
    assert cancelled_reports.last[0] is S.CANCELED
    assert not restarted, "Spark restarted its Python daemon for a cancelled task"
