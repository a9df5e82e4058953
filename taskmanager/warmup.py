"""A TaskManager's first Spark work, done before any task needs it, with CPU nobody else wants.

A fresh SparkSession's first job is slow: the JVM loads and compiles the classes of each kind of
plan, and the first Python UDF starts Spark's Python worker daemon and its first workers, which
import pyarrow and unpickle funke's operator runtime. On this project's 2-core machines that first
job takes about 9 s where the same job warm takes 0.5 s. Nobody waits for a bounded job's first
task as for a streaming query's batches: a TaskManager that takes over a query after a failure
would run its first batch that much later. So a TaskManager runs one small job of each kind its
tasks run (a range, a Python map over Arrow batches, a keyed aggregate, a Parquet write and read,
a collect as Arrow), in its own scratch directory, off its event loop.

The warm-up yields to real work. It is CPU for later, so it takes what is spare: it starts once
the TaskManager has run no task yet and the machine's CPUs have been idle enough for a moment,
or, on a machine that is never idle, after waiting PATIENCE_S (a spare TaskManager should not
take over a query cold for ever) (`due`); a task that arrives meanwhile interrupts it
(`WarmUp.cancel`): that task's own first Spark job warms the session as well, and sooner. So
does work of other processes that takes the CPUs while it runs (`others_busy_fraction`): a job
that started on another TaskManager of the machine just after the warm-up did.
Without that, on a small machine the warm-ups of idle TaskManagers ran at the same time as the
first job of the cluster, on the same cores, and made it slower instead of faster.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator

import psutil
import pyarrow as pa
from pyspark.sql import SparkSession

from funke.taskmanager.operators.udf import cancellable

log = logging.getLogger("funke.taskmanager")

# The TaskManager looks this often whether it may warm up.
CHECK_INTERVAL_S = 1.0
# ... and does once its CPUs were at least this idle over the last interval: not while a job
# keeps them busy (a cluster's cold first job: 0-15% idle on 2 cores), but beside a streaming
# query that leaves part of a core (30-50%), so that a TaskManager is warm when the query fails
# over to it.
IDLE_CPU_FRACTION = 0.3
# ... or once it has waited this long for idle CPUs, on a machine busy with other work.
PATIENCE_S = 15.0
# While it runs it looks this often whether other processes want the CPUs ...
YIELD_CHECK_INTERVAL_S = 0.25
# ... and stops once they took at least this share of the machine's CPU time over such an
# interval (a job on another TaskManager of this machine: the warm-up would slow it, as the one
# of an idle TaskManager slowed the demo's word count on its neighbour from 6.3 to 8.0 s).
OTHERS_BUSY_FRACTION = 0.4
# Spark job tag of the warm-up's jobs, so that cancel() interrupts exactly those.
TAG = "funke-warm-up"
# A cancelled warm-up's jobs are interrupted again this often until it returned: a job it submits
# just after the cancel (while it was planning it) is caught too.
REINTERRUPT_S = 0.1


def _identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def cpu_times() -> tuple[float, float] | None:
    """(idle, total) seconds of this machine's CPUs so far (psutil), None if they cannot be read."""
    try:
        times = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    return times.idle + getattr(times, "iowait", 0.0), sum(times)


def idle_fraction(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """How idle the CPUs were between two `cpu_times()` readings (None: unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def own_cpu_seconds() -> float | None:
    """CPU seconds this process and its descendants (Spark's JVM, its Python workers) used so far,
    None if they cannot be read."""
    try:
        me = psutil.Process()
        times = me.cpu_times()
        total = times.user + times.system
        for child in me.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.Error:  # it ended meanwhile
                continue
            total += times.user + times.system
    except (OSError, psutil.Error):
        return None
    return total


def others_busy_fraction(before: tuple[float, float] | None, after: tuple[float, float] | None,
                         own_before: float | None, own_after: float | None) -> float | None:
    """The share of the machine's CPU time between two readings (`cpu_times()`) that processes
    other than this one and its descendants used (`own_cpu_seconds()`); None: unknown."""
    if before is None or after is None or own_before is None or own_after is None or after[1] <= before[1]:
        return None
    total = after[1] - before[1]
    busy = total - (after[0] - before[0])
    own = max(0.0, own_after - own_before)  # a worker that ended takes its seconds with it
    return max(0.0, busy - own) / total


def due(*, session_ready: bool, tasks_started: int, cpu_idle: float | None, waited_s: float = 0.0,
        idle_needed: float = IDLE_CPU_FRACTION, patience_s: float = PATIENCE_S) -> bool:
    """Whether to warm up now: the session is there, no task has run on it yet (a task warms it
    by running), and the machine's CPUs were idle enough lately (unknown counts as idle: without
    a reading there is nothing better to go by) or it has waited `patience_s` for that."""
    if not session_ready or tasks_started:
        return False
    return cpu_idle is None or cpu_idle >= idle_needed or waited_s >= patience_s


class WarmUp:
    """The warm-up jobs on one session; `run` blocks (a thread of its own), `cancel` may be called
    from any thread and makes `run` return soon, skipping what it has not started."""

    def __init__(self, spark: SparkSession, scratch: str):
        self._spark = spark
        self._path = os.path.join(scratch, "warmup")
        self._cancelled = threading.Event()
        self._done = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Interrupts the warm-up's Spark jobs until `run` returned (at once if it is not running)."""
        first = not self._cancelled.is_set()
        self._cancelled.set()
        self._interrupt()
        if first:
            threading.Thread(target=self._keep_interrupting, name="spark-warm-up-cancel", daemon=True).start()

    def _keep_interrupting(self) -> None:
        deadline = time.monotonic() + 60  # a warm-up that never runs is not waited for
        while not self._done.wait(REINTERRUPT_S) and time.monotonic() < deadline:
            self._interrupt()

    def _interrupt(self) -> None:
        try:
            self._spark.sparkContext.cancelJobsWithTag(TAG)
        except Exception:  # a stopped session, or one that has no SparkContext
            log.debug("interrupting the warm-up failed", exc_info=True)

    def run(self) -> float:
        """Runs the warm-up jobs; returns how long they took (s). Failures are logged, never
        raised: a TaskManager whose warm-up fails still runs tasks, only its first ones are slower."""
        started = time.monotonic()
        spark = self._spark
        tagged = False
        try:
            spark.sparkContext.addJobTag(TAG)  # this thread's jobs
            tagged = True
            steps = (self._aggregate_and_write, self._read)
            for step in steps:
                if self.cancelled:
                    break
                step()
        except Exception as exc:  # cancelled, or the TaskManager stopped meanwhile
            if not self.cancelled:
                log.info("Spark warm-up did not finish (%s: %s); the first tasks start cold", type(exc).__name__,
                         str(exc).splitlines()[0] if str(exc) else "")
        finally:
            self._done.set()
            if tagged:
                try:
                    spark.sparkContext.removeJobTag(TAG)
                except Exception:
                    pass
            shutil.rmtree(self._path, ignore_errors=True)
        return time.monotonic() - started

    def _aggregate_and_write(self) -> None:
        df = self._spark.range(0, 1000, 1, 2).selectExpr("id AS value", "id % 7 AS key")
        mapped = df.mapInArrow(cancellable(_identity, None), df.schema)
        mapped.groupBy("key").agg({"value": "sum"}).write.mode("overwrite").parquet(self._path)

    def _read(self) -> None:
        self._spark.read.parquet(self._path).toArrow()


def run(spark: SparkSession, scratch: str) -> float:
    """The whole warm-up at once (see WarmUp.run)."""
    return WarmUp(spark, scratch).run()
