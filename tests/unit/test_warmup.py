"""When a TaskManager warms Spark up: only with CPU to spare, never against a task.

The rule is pure (`warmup.due`); the TaskExecutor's watch is run in process with the machine's
CPU readings and the warm-up itself stood in for (no Spark, no JobManager)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from funke.taskmanager import warmup
from funke.taskmanager.taskexecutor import TaskExecutor, TaskExecutorConfig


def test_idle_fraction_is_the_idle_share_of_the_cpu_time_between_two_readings() -> None:
    assert warmup.idle_fraction((100, 1000), (250, 1200)) == pytest.approx(0.75)
    assert warmup.idle_fraction((100, 1000), (100, 1200)) == 0.0
    # unknown: no reading, or no time passed
    assert warmup.idle_fraction(None, (100, 1000)) is None
    assert warmup.idle_fraction((100, 1000), (100, 1000)) is None


def test_others_busy_fraction_is_the_busy_share_not_spent_by_this_process_and_its_children() -> None:
    # 200 s of CPU time, 50 idle: 150 busy, of which 30 this process's -> 120 / 200 others'
    assert warmup.others_busy_fraction((100, 1000), (150, 1200), 10.0, 40.0) == pytest.approx(0.6)
    assert warmup.others_busy_fraction((100, 1000), (150, 1200), 10.0, 160.0) == 0.0  # all its own
    assert warmup.others_busy_fraction((100, 1000), (150, 1200), 40.0, 10.0) == pytest.approx(0.75)  # a child ended
    for unknown in [(None, (1, 2), 0.0, 1.0), ((1, 2), (1, 2), 0.0, 1.0), ((1, 2), (2, 4), None, 1.0)]:
        assert warmup.others_busy_fraction(*unknown) is None


def test_own_cpu_seconds_counts_this_process_and_its_children() -> None:
    import subprocess
    import sys
    import time

    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.5: pass\ntime.sleep(30)"])
    try:
        start = warmup.own_cpu_seconds()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the child burnt its 0.5 s, however loaded the machine
            times = psutil.Process(child.pid).cpu_times()
            if times.user + times.system >= 0.5:
                break
            time.sleep(0.05)
        assert start is not None and warmup.own_cpu_seconds() - start >= 0.3  # what it burnt after `start`
    finally:
        child.kill()
        child.wait()


def test_cpu_times_reads_the_machines_cpus() -> None:
    reading = warmup.cpu_times()
    assert reading is not None and 0 <= reading[0] <= reading[1]


@pytest.mark.parametrize("session_ready, tasks_started, cpu_idle, waited_s, expected", [
    (True, 0, 0.9, 1, True),
    (True, 0, None, 1, True),  # no reading of the CPUs: nothing better to go by
    (True, 0, 0.4, 1, True),  # beside a streaming query that leaves part of a core
    (True, 0, 0.1, 1, False),  # a job keeps the CPUs busy: the warm-up would slow it
    (True, 0, 0.1, 30, True),  # ... for ever: a spare TaskManager should not stay cold
    (True, 1, 1.0, 1, False),  # a task ran: it warmed the session itself
    (True, 1, 0.1, 60, False),
    (False, 0, 1.0, 60, False),
])
def test_the_warm_up_is_due_only_on_an_untouched_session_with_idle_cpus_or_after_waiting_long(
        session_ready, tasks_started, cpu_idle, waited_s, expected) -> None:
    assert warmup.due(session_ready=session_ready, tasks_started=tasks_started, cpu_idle=cpu_idle,
                      waited_s=waited_s, patience_s=30) is expected


class FakeWarmUp:
    """Stands in for warmup.WarmUp: runs until cancelled (or told to finish)."""

    made: list["FakeWarmUp"] = []

    def __init__(self, spark, scratch):
        self.running = threading.Event()
        self.finish = threading.Event()
        self._cancelled = threading.Event()
        FakeWarmUp.made.append(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        self.finish.set()

    def run(self) -> float:
        self.running.set()
        self.finish.wait(10)
        return 0.5


@pytest.fixture
def executor(monkeypatch, tmp_path):
    FakeWarmUp.made = []
    readings = iter([])
    monkeypatch.setattr(warmup, "CHECK_INTERVAL_S", 0.01)
    monkeypatch.setattr(warmup, "YIELD_CHECK_INTERVAL_S", 0.01)
    own = iter([])
    monkeypatch.setattr(warmup, "WarmUp", FakeWarmUp)
    executor = TaskExecutor(TaskExecutorConfig("tm-warm", jobmanager_address="127.0.0.1:1", number_of_slots=1,
                                               use_spark=False))
    executor.spark_runtime.session = object()  # a session, as far as the watch is concerned
    executor.spark_runtime.scratch = str(tmp_path)

    def cpu(sequence):
        nonlocal readings
        readings = iter(sequence)
        monkeypatch.setattr(warmup, "cpu_times", lambda: next(readings))

    def cpu_of_own(sequence):  # this process and its descendants; unset: all the busy time is its own
        nonlocal own
        own = iter(sequence)
        monkeypatch.setattr(warmup, "own_cpu_seconds", lambda: next(own))

    monkeypatch.setattr(warmup, "own_cpu_seconds", lambda: None)
    executor.cpu = cpu
    executor.cpu_of_own = cpu_of_own
    return executor


async def _started(executor) -> asyncio.Task:
    """The TaskManager's warm-up watch, once the warm-up it started is running."""
    executor._loop = asyncio.get_running_loop()
    watch = asyncio.create_task(executor.spark_runtime.warm_up_when_idle())
    while not FakeWarmUp.made:
        await asyncio.sleep(0.005)
    assert FakeWarmUp.made[0].running.wait(5)
    return watch


def test_on_a_machine_that_stays_busy_the_warm_up_starts_after_its_patience(executor, monkeypatch) -> None:
    monkeypatch.setattr(warmup, "PATIENCE_S", 0.2)
    executor.cpu([(10 * i, 100 * i) for i in range(10_000)])  # always 10% idle

    async def scenario() -> None:
        executor._loop = asyncio.get_running_loop()
        watch = asyncio.create_task(executor.spark_runtime.warm_up_when_idle())
        started = asyncio.get_running_loop().time()
        while not FakeWarmUp.made:
            await asyncio.sleep(0.005)
        assert asyncio.get_running_loop().time() - started >= 0.2
        FakeWarmUp.made[0].finish.set()
        await asyncio.wait_for(watch, 5)

    asyncio.run(scenario())
    assert len(FakeWarmUp.made) == 1


def test_with_busy_cpus_the_warm_up_waits_and_starts_once_they_are_idle(executor) -> None:
    # (idle, total) jiffies: 10% idle, 10% idle, then 90% idle
    executor.cpu([(0, 0), (10, 100), (20, 200), (110, 300)] + [(110 + 90 * i, 300 + 100 * i) for i in range(1, 100)])
    _runs_to_its_end(executor)


def test_a_task_that_starts_interrupts_the_warm_up_and_one_that_came_first_prevents_it(executor) -> None:
    executor.cpu([(100 * i, 100 * i) for i in range(1000)])  # always idle

    async def scenario() -> None:
        watch = await _started(executor)
        # what _start_task does first for every task
        executor.spark_runtime.task_starting()
        await asyncio.wait_for(watch, 5)
        # a TaskManager that has run a task never starts one
        again = asyncio.create_task(executor.spark_runtime.warm_up_when_idle())
        await asyncio.wait_for(again, 5)

    asyncio.run(scenario())
    assert len(FakeWarmUp.made) == 1 and FakeWarmUp.made[0].cancelled


class _Context:
    """A SparkContext's job tags and cancellation, with one job that runs until it is interrupted."""

    def __init__(self):
        self.cancels = 0
        self.job_running = threading.Event()
        self.interrupted = threading.Event()

    def addJobTag(self, tag):
        pass

    def removeJobTag(self, tag):
        pass

    def cancelJobsWithTag(self, tag):
        self.cancels += 1
        if self.job_running.is_set():
            self.interrupted.set()


def test_a_job_the_warm_up_submits_just_after_the_cancel_is_interrupted_too(tmp_path, monkeypatch) -> None:
    context = _Context()
    session = type("Session", (), {"sparkContext": context})()
    job = warmup.WarmUp(session, str(tmp_path))
    planning = threading.Event()
    cancelled = threading.Event()
    ran = []

    def aggregate_and_write() -> None:  # cancel() comes while the job is planned, before it runs
        planning.set()
        assert cancelled.wait(10)
        context.job_running.set()
        ran.append(context.interrupted.wait(10))  # the job runs until Spark interrupts it
        context.job_running.clear()

    monkeypatch.setattr(job, "_aggregate_and_write", aggregate_and_write)
    monkeypatch.setattr(job, "_read", lambda: ran.append("read"))
    runner = threading.Thread(target=job.run)
    runner.start()
    assert planning.wait(10)
    job.cancel()
    cancelled.set()
    runner.join(30)
    assert ran == [True]  # interrupted, and the read after it skipped
    assert context.cancels >= 2


def test_a_running_warm_up_gives_way_when_other_processes_take_the_cpus(executor) -> None:
    """A job that starts on another TaskManager of the machine just after the warm-up did: the
    warm-up stops instead of slowing it (its own busy time does not count)."""
    # idle until it starts, then 90% busy; of the busy time 20 units a reading are its own
    executor.cpu([(100 * i, 100 * i) for i in range(1, 3)] + [(200 + 10 * i, 200 + 100 * i) for i in range(1, 1000)])
    executor.cpu_of_own([20.0 * i for i in range(1000)])

    async def scenario() -> None:
        executor._loop = asyncio.get_running_loop()
        watch = asyncio.create_task(executor.spark_runtime.warm_up_when_idle())
        await asyncio.wait_for(watch, 5)  # it returns: the warm-up was cancelled

    asyncio.run(scenario())
    assert len(FakeWarmUp.made) == 1 and FakeWarmUp.made[0].cancelled


def _runs_to_its_end(executor) -> None:
    """The warm-up starts, is still running 20 CPU readings later, and ends when it is done."""

    async def scenario() -> None:
        watch = await _started(executor)
        await asyncio.sleep(0.2)
        assert not FakeWarmUp.made[0].cancelled
        FakeWarmUp.made[0].finish.set()
        await asyncio.wait_for(watch, 5)

    asyncio.run(scenario())
    assert len(FakeWarmUp.made) == 1 and not FakeWarmUp.made[0].cancelled


def test_a_warm_up_busy_with_its_own_work_runs_to_its_end(executor) -> None:
    executor.cpu([(100 * i, 100 * i) for i in range(1, 3)] + [(200 + 10 * i, 200 + 100 * i) for i in range(1, 1000)])
    executor.cpu_of_own([90.0 * i for i in range(1000)])  # all the busy time is its own
    _runs_to_its_end(executor)


def test_a_warm_up_started_after_its_patience_does_not_give_way(executor, monkeypatch) -> None:
    """On a machine that is never idle, the warm-up that finally starts runs to its end: giving way
    to the same busy machine would leave the TaskManager cold for ever."""
    monkeypatch.setattr(warmup, "PATIENCE_S", 0.05)
    executor.cpu([(10 * i, 100 * i) for i in range(10_000)])  # always 10% idle
    executor.cpu_of_own([0.0] * 10_000)  # and none of the busy time its own
    _runs_to_its_end(executor)
