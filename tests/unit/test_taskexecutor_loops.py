"""A TaskExecutor whose report loop ends on its own (a bug) stops loudly instead of staying
registered and silent (in process, no Spark, no JobManager: only its own loops run)."""

from __future__ import annotations

import asyncio
import logging

from funke.taskmanager.taskexecutor import TaskExecutor, TaskExecutorConfig


def test_a_background_loop_that_dies_stops_the_taskmanager_and_says_why(caplog):
    executor = TaskExecutor(TaskExecutorConfig("tm-loops", jobmanager_address="127.0.0.1:1", number_of_slots=1,
                                               use_spark=False))

    async def broken_report_loop() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("a bug in the report loop")

    executor._report_loop = broken_report_loop  # type: ignore[method-assign]

    async def scenario() -> None:
        await asyncio.wait_for(executor.run(), 30)

    with caplog.at_level(logging.CRITICAL, logger="funke.taskmanager"):
        asyncio.run(scenario())
    assert "task-state-reporter" in executor.failure and "a bug in the report loop" in executor.failure
    assert any("ended on its own with RuntimeError: a bug in the report loop" in r.getMessage() for r in caplog.records)


def test_a_stop_that_was_asked_for_is_not_a_failure():
    executor = TaskExecutor(TaskExecutorConfig("tm-stop", jobmanager_address="127.0.0.1:1", number_of_slots=1,
                                               use_spark=False))

    async def scenario() -> None:
        run = asyncio.create_task(executor.run())
        await asyncio.sleep(0.3)
        executor.stop()
        await asyncio.wait_for(run, 30)

    asyncio.run(scenario())
    assert executor.failure == ""


def test_spark_is_launched_before_any_grpc_server_exists_and_the_servers_come_after_it():
    # PySpark forks spark-submit with a preexec_fn: a fork while another thread calls into gRPC
    # skips gRPC's fork handlers (the launch failed, the TaskManager's epoll set broke).
    import time

    executor = TaskExecutor(TaskExecutorConfig("tm-order", jobmanager_address="127.0.0.1:1", number_of_slots=1,
                                               warm_up=False))
    seen = []

    def launching_spark():
        for _ in range(20):  # while "the JVM boots": does a server appear meanwhile?
            seen.append(executor._server is not None)
            time.sleep(0.05)
        return type("Session", (), {"stop": lambda self: None})()  # as far as start and stop are concerned

    executor.spark_runtime.create_with_task_runtime = launching_spark  # type: ignore[method-assign]

    async def scenario() -> None:
        run = asyncio.create_task(executor.run())
        while executor._server is None and not run.done():
            await asyncio.sleep(0.05)
        executor.stop()
        await asyncio.wait_for(run, 30)

    asyncio.run(scenario())
    assert len(seen) == 20 and not any(seen)
    assert executor.spark_ready_at > 0  # the servers came once the session was up
