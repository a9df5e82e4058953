"""Task runtime (funke.taskmanager.task, funke.taskmanager.operators) on a real local SparkSession.

Tasks run hand-built TaskDeployments directly, without gRPC and without the TaskManager's core: a
producer's reports give the schema its consumers need, and a consumer is handed the producer
attempts to read, exactly as the core would hand them over (`Task.give_inputs`). What the core
decides (which attempts, when, no-op chains, cancel wins) is tested on the core.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from funke.common import layout
from funke.common.graph.deployment import Awaiting, InputGateDeployment, ResultPartitionSpec, TaskDeployment
from funke.common.graph.executiongraph import ExecutionAttemptId, SlotId
from funke.common.task.inputgates import GateSnapshot
from funke.common.graph.jobgraph import (
    EXCHANGE_IN_MEMORY_MAX_BYTES,
    JobVertex,
    OperatorSpec,
    PartitionerKind,
    ResultPartitionType,
)
from funke.common.states import ExecutionState
from funke.taskmanager.operators.context import RuntimeContext
from funke.taskmanager.task import Task

# The functions below are shipped to Python workers; by value, so workers need not import tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

S = ExecutionState
HASH, REBALANCE, BROADCAST = PartitionerKind.HASH, PartitionerKind.REBALANCE, PartitionerKind.BROADCAST


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("funke-test-task-runtime")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Spark's own kill of a cancelled task's Python worker, slower than any bound below: only
        # funke's cancel marker can end a worker in time (test_cancel_interrupts_...)
        .config("spark.python.task.killTimeout", "60s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# ---- building descriptors by hand ----


def op(kind: str, fn=None, name: str = "", **config) -> OperatorSpec:
    return OperatorSpec(kind, name, config, cloudpickle.dumps(fn) if fn is not None else b"")


def gate(data_set: str, partitions: range, *, subpartition: int | None = None, attempts: list[int] | None = None,
         schema: str = "", index: int = 0) -> GateSnapshot:
    """What the core hands a consumer: per partition, the producer attempt to read (0 unless named)."""
    return GateSnapshot(index, data_set, partitions, subpartition,
                        tuple(attempts) if attempts is not None else (0,) * len(partitions), schema)


def output(data_set: str, index: int, n: int = 1, partitioner=REBALANCE, keys=()) -> ResultPartitionSpec:
    return ResultPartitionSpec(data_set, index, n, partitioner, tuple(keys), ResultPartitionType.BLOCKING)


def deploy(data_dir, ops, *, vertex: str = "v", subtask: int = 0, parallelism: int = 1, attempt: int = 0,
           inputs=(), outputs=(), job: str = "job1", options=None) -> tuple[TaskDeployment, tuple[GateSnapshot, ...]]:
    """A deployment, and the inputs the core would hand it once they are complete."""
    jv = JobVertex(id=vertex, name=vertex, parallelism=parallelism, operators=tuple(ops))
    gates = tuple(InputGateDeployment(g.input_index, g.data_set_id, g.partitions, g.subpartition, Awaiting(0), None,
                                      g.schema) for g in inputs)
    d = TaskDeployment(
        job_id=job, job_name="test", attempt=ExecutionAttemptId(vertex, subtask, attempt),
        task_name=f"{vertex} ({subtask + 1}/{parallelism})", parallelism=parallelism, slot=SlotId("tm", 0),
        vertex=jv, inputs=gates, outputs=tuple(outputs), data_dir=str(data_dir), job_options=dict(options or {}))
    return d, tuple(inputs)


class Reports:
    """The report callback: records every (state, failure, produced), wakes waiters."""

    def __init__(self):
        self.items: list[tuple[ExecutionState, object, list]] = []
        self.io: list = []  # what the task read and wrote, with each report (None but with FINISHED)
        self._cond = threading.Condition()

    def __call__(self, state, failure, produced, io=None):
        with self._cond:
            self.items.append((state, failure, list(produced)))
            self.io.append(io)
            self._cond.notify_all()

    @property
    def states(self) -> list[ExecutionState]:
        return [s for s, _, _ in self.items]

    @property
    def last(self):
        return self.items[-1]

    def wait_for(self, state: ExecutionState, timeout: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: state in self.states, timeout)


def run(deployed, spark) -> Reports:
    """Run a task with its inputs given at once."""
    deployment, inputs = deployed
    reports = Reports()
    Task(deployment, spark, reports, inputs=inputs).run()
    return reports


def start(deployed, spark, *, inputs_now: bool = True) -> tuple[Task, Reports, threading.Thread]:
    deployment, inputs = deployed
    reports = Reports()
    task = Task(deployment, spark, reports, inputs=inputs if inputs_now else None)
    thread = threading.Thread(target=task.run, daemon=True)
    thread.start()
    return task, reports, thread


def finished(reports: Reports) -> list:
    state, failure, produced = reports.last
    assert state is S.FINISHED, f"{reports.states}: {failure and failure.traceback}"
    assert reports.states == [S.INITIALIZING, S.RUNNING, S.FINISHED]
    return produced


def collected(data_dir, vertex: str, subtask: int, job: str = "job1", attempt: int = 0) -> list[dict]:
    """What a sink.collect subtask staged."""
    staging = layout.sink_staging_dir(layout.collect_dir(str(data_dir), job, vertex), job, subtask, attempt)
    return pq.read_table(staging).to_pylist()


def partition_rows(data_dir, data_set: str, index: int, attempt: int = 0, job: str = "job1") -> list[dict]:
    """A result partition's rows, each with its subpartition as `_sub` when the partition is split,
    whichever way it was written (`written_by`)."""
    path = layout.partition_dir(str(data_dir), job, data_set, index, attempt)
    if written_by(path) == "memory":
        rows = []
        names = sorted(os.listdir(path))
        for name in names:
            part = pq.read_table(os.path.join(path, name)).to_pylist()
            rows += [dict(r, _sub=int(name[len("sub-"):-len(".parquet")])) for r in part] if len(names) > 1 else part
        return rows
    # pyarrow hides names starting with "_" by default, Hadoop only those without "=".
    dataset = pads.dataset(path, format="parquet", partitioning="hive", ignore_prefixes=[".", "_SUCCESS"])
    return dataset.to_table().to_pylist()


def written_by(partition_dir) -> str:
    """"memory" for a partition its task collected and wrote itself (one sub-<k>.parquet file per
    subpartition, nothing else), "spark" for one Spark's writer wrote (its _SUCCESS marker)."""
    names = set(os.listdir(partition_dir))
    if "_SUCCESS" in names:
        return "spark"
    assert names and all(n.startswith("sub-") and n.endswith(".parquet") for n in names), names
    return "memory"


@pytest.fixture
def ctx(spark, tmp_path):
    """An operator's context in subtask 0 of 1, for the tests that run operators alone."""
    return RuntimeContext(spark, "job-g", "v", 0, 1, 0, str(tmp_path / "data"))


# ---- (b2) records per operator (Flink's numRecordsIn and numRecordsOut) ----


def records(io) -> list[tuple[int | None, int | None]]:
    return [(o.records_in, o.records_out) for o in io.operators]


def test_a_chained_vertex_counts_the_records_of_every_operator(spark, tmp_path):
    # from_range(1000) -> map -> filter -> collect at parallelism 1: one vertex, no exchange. Each
    # operator's records in and out; the vertex's are its head's in (a source: the records it
    # read) and its tail's out (a sink: the records it wrote).
    ops = [op("source.range", end=1000), op("map", lambda x: x * 3, schema="n bigint"),
           op("filter", lambda n: n % 2 == 0), op("sink.collect")]
    reports = run(deploy(tmp_path, ops), spark)
    finished(reports)
    io = reports.io[-1]
    assert records(io) == [(1000, 1000), (1000, 1000), (1000, 500), (500, 500)]
    assert (io.records_in, io.records_out) == (1000, 500)
    assert len(collected(tmp_path, "v", 0)) == 500


@pytest.mark.parametrize("limit", [None, "0"])  # the exchange written in memory, or by Spark's writer
def test_records_per_operator_on_both_sides_of_an_exchange(spark, tmp_path, limit):
    options = {EXCHANGE_IN_MEMORY_MAX_BYTES: limit} if limit else None
    producer = [op("source.range", end=100), op("where", condition="id % 10 <> 0"),
                op("flat_map", lambda i: [i, i], schema="id bigint")]
    reports = run(deploy(tmp_path, producer, vertex="p", outputs=[output("ds", 0)], options=options), spark)
    (produced,) = finished(reports)
    io = reports.io[-1]
    assert records(io) == [(100, 100), (100, 90), (90, 180)] and (io.records_in, io.records_out) == (100, 180)
    consumer = [op("count", keys=["id"]), op("sink.collect")]
    reports = run(deploy(tmp_path, consumer, vertex="c", inputs=[gate("ds", range(0, 1), schema=produced.schema)],
                         options=options), spark)
    finished(reports)
    io = reports.io[-1]
    assert records(io) == [(180, 90), (90, 90)] and (io.records_in, io.records_out) == (180, 90)


def test_a_select_is_counted_as_a_projection_unless_it_makes_rows_of_its_own(spark, tmp_path, monkeypatch):
    from funke.taskmanager import recordcounts

    observed = []
    real = recordcounts.observe_rows
    monkeypatch.setattr(recordcounts, "observe_rows", lambda ctx, df: observed.append(ctx.vertex_id) or real(ctx, df))
    plain = [op("source.range", end=10), op("select", exprs=["id * 2 AS d"]), op("where", condition="d < 10"),
             op("sink.collect")]
    reports = run(deploy(tmp_path, plain, vertex="plain"), spark)
    finished(reports)
    assert records(reports.io[-1]) == [(10, 10), (10, 10), (10, 5), (5, 5)]
    assert observed == ["plain"]  # the source's count; the select passed each row on
    exploding = [op("source.range", end=4), op("select", exprs=["explode(array(id, id)) AS id"]),
                 op("select", exprs=["id + 1 AS n"]), op("sink.collect")]
    reports = run(deploy(tmp_path, exploding, vertex="exploding"), spark)
    finished(reports)
    assert records(reports.io[-1]) == [(4, 4), (4, 8), (8, 8), (8, 8)]
    # at the head of a chain that reads an exchange: a projection of what it read
    producer = [op("source.range", end=6)]
    (produced,) = finished(run(deploy(tmp_path, producer, vertex="p", outputs=[output("ds", 0)]), spark))
    head = [op("select", exprs=["id * 3 AS t"]), op("where", condition="t > 6"), op("sink.collect")]
    observed.clear()
    reports = run(deploy(tmp_path, head, vertex="head", inputs=[gate("ds", range(0, 1), schema=produced.schema)]),
                  spark)
    finished(reports)
    assert records(reports.io[-1]) == [(6, 6), (6, 3), (3, 3)] and observed == []


def replace_rows(df):
    return df.sparkSession.range(3)


def test_a_transform_that_leaves_its_input_out_ends_with_the_counts_it_can_give(spark, tmp_path):
    # The rows before it never run: an observation there would never be filled (and reading it
    # would never end).
    ops = [op("source.range", end=10), op("where", condition="id > 4"), op("transform", replace_rows),
           op("sink.collect")]
    reports = run(deploy(tmp_path, ops), spark)
    finished(reports)
    assert records(reports.io[-1]) == [(None, None), (None, None), (None, 3), (3, 3)]
    assert (reports.io[-1].records_in, reports.io[-1].records_out) == (0, 3)


@pytest.mark.parametrize("memo", [None, {}])  # PySpark's Observation, and a streaming task's few round trips
def test_an_observation_no_action_ran_reads_as_not_counted_rather_than_waiting_for_ever(spark, tmp_path, monkeypatch,
                                                                                       memo):
    import dataclasses

    from funke.taskmanager.operators import classic

    monkeypatch.setattr(classic, "OBSERVATION_WAIT_S", 0.1)
    context = dataclasses.replace(RuntimeContext(spark, "j", "v", 0, 1, 0, str(tmp_path)), memo=memo)
    _, never = classic.observe_rows(context, spark.range(5))
    assert never.rows() is None
    df, counted = classic.observe_rows(context, spark.range(5))
    df.write.format("noop").mode("overwrite").save()
    assert counted.rows() == 5
    df, empty = classic.observe_rows(context, spark.range(5))
    df.where("false").write.format("noop").mode("overwrite").save()  # planned away: no count
    assert empty.rows() is None


def test_a_where_behind_a_parquet_source_still_prunes_and_the_source_is_counted_from_its_files(spark, tmp_path):
    # No count between them: Spark pushes the where's filter into the scan (partitions pruned,
    # row groups skipped); the source's records are its files' rows, from their footers.
    table = tmp_path / "table"
    spark.range(60).selectExpr("id", "id % 3 AS part").write.partitionBy("part").parquet(str(table))
    ops = [op("source.parquet", path=str(table)), op("where", condition="part = 1"), op("sink.collect")]
    reports = run(deploy(tmp_path, ops), spark)
    finished(reports)
    assert records(reports.io[-1]) == [(60, 60), (60, 20), (20, 20)]


# ---- (c) failures ----


def explode_on_zero(n):
    return 10 // (n - n)


def test_failing_user_function_reports_failed_with_the_users_frame(spark, tmp_path):
    ops = [op("source.collection", rows=[[1], [2]], schema="n int"),
           op("map", explode_on_zero, schema="n int"), op("sink.discard")]
    reports = run(deploy(tmp_path, ops), spark)
    assert reports.states == [S.INITIALIZING, S.RUNNING, S.FAILED]
    failure = reports.last[1]
    # the user's exception, unwrapped from Spark's PythonException, with the user's frame
    assert failure.exception_type == "ZeroDivisionError"
    assert "by zero" in failure.message
    assert "in explode_on_zero" in failure.traceback


def test_a_function_that_does_not_unpickle_fails_while_initializing(tmp_path):
    broken = OperatorSpec("map", "broken", {"schema": "n int"}, b"not a pickle")
    reports = run(deploy(tmp_path, [op("source.noop"), broken, op("sink.noop")]), None)
    assert reports.states == [S.INITIALIZING, S.FAILED]
    assert "'broken'" in reports.last[1].message


# ---- (d) cancellation ----


def test_cancel_while_waiting_for_an_input_is_quick(spark, tmp_path):
    task, reports, thread = start(deploy(tmp_path, [op("sink.collect")], inputs=[gate("ds", range(2))]), spark,
                                  inputs_now=False)
    assert reports.wait_for(S.RUNNING)
    time.sleep(0.2)
    assert thread.is_alive()  # waiting, not failed
    task.cancel()
    thread.join(5)  # a bound, not a measurement: without the cancel it would wait for ever
    assert not thread.is_alive()
    assert reports.states == [S.INITIALIZING, S.RUNNING, S.CANCELED]
    assert reports.last[1] is None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


def test_cancel_interrupts_the_spark_job_and_ends_its_python_workers_at_once(spark, tmp_path):
    """The fixture sets spark.python.task.killTimeout to 60 s, so within the 10 s allowed below
    only the worker's own watcher (seeing the attempt's cancel marker) can end it."""
    where = tmp_path / "workers"
    where.mkdir()
    pids_dir = str(where)

    def sleep_long(n):
        import os
        import time
        open(os.path.join(pids_dir, str(os.getpid())), "w").close()
        time.sleep(120)
        return n

    ops = [op("source.range", end=4), op("map", sleep_long, schema="id bigint"), op("sink.discard")]
    task, reports, thread = start(deploy(tmp_path, ops), spark)
    deadline = time.monotonic() + 30
    while not any(where.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [int(p.name) for p in where.iterdir()]
    assert workers, "the user function never started"
    assert all(alive(pid) for pid in workers)
    task.cancel()
    assert Path(layout.cancel_marker(str(tmp_path), "job1", "v", 0, 0)).exists()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)], "a cancelled attempt's Python worker still runs"
    thread.join(15)
    assert not thread.is_alive()
    assert reports.states == [S.INITIALIZING, S.RUNNING, S.CANCELED]
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 5
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tracker.getActiveJobsIds()


def test_cancel_before_run_reports_only_canceled(tmp_path):
    reports = Reports()
    task = Task(deploy(tmp_path, [op("source.range", end=3), op("sink.discard")])[0], None, reports)
    task.cancel()
    task.run()
    assert reports.states == [S.CANCELED]


# ---- (e) inputs handed over later ----


def test_a_consumer_reads_the_producer_attempts_it_is_given_once_they_are_given(spark, tmp_path):
    def produce(subtask: int, attempt: int, rows: list) -> str:
        ops = [op("source.collection", rows=rows, schema="n int, s string")]
        produced = finished(run(deploy(tmp_path, ops, vertex="p", subtask=subtask, parallelism=2, attempt=attempt,
                                       outputs=[output("ds", subtask)]), spark))
        return produced[0].schema

    rows = [[1, "a"], [2, "b"], [3, None]]  # subtask 0 of 2 makes the first, subtask 1 the rest
    schema = produce(0, 0, rows)
    consumer = deploy(tmp_path, [op("sink.collect")], vertex="c", inputs=[gate("ds", range(2), schema=schema)])
    task, reports, thread = start(consumer, spark, inputs_now=False)
    assert reports.wait_for(S.RUNNING)
    # the second producer needed a second attempt; the consumer is told to read that one
    produce(1, 1, rows)
    task.give_inputs((gate("ds", range(2), attempts=[0, 1], schema=schema),))
    thread.join(30)
    finished(reports)
    assert sorted((r["n"], r["s"]) for r in collected(tmp_path, "c", 0)) == [(1, "a"), (2, "b"), (3, None)]


def test_a_chain_that_needs_spark_fails_without_it(tmp_path):
    reports = run(deploy(tmp_path, [op("source.range", end=3), op("sink.discard")]), None)
    assert reports.states[-1] is S.FAILED and "SparkSession" in reports.last[1].message



def test_a_glob_path_leaves_no_java_stack_trace_in_the_taskmanagers_log(spark):
    # Spark's reader warns, with a page of stack trace, that a glob has no `_spark_metadata`:
    # a TaskManager's session logs only that logger's errors.
    from funke.taskmanager.sparkruntime import QUIET_LOGGERS, quiet_loggers

    jvm = spark.sparkContext._jvm
    logger = jvm.org.apache.logging.log4j.LogManager.getLogger(QUIET_LOGGERS[0])
    spark.sparkContext.setLogLevel("WARN")  # as a TaskManager's session logs
    try:
        assert logger.isWarnEnabled()
        quiet_loggers(spark)
        assert not logger.isWarnEnabled() and logger.isErrorEnabled()
        assert jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.scheduler.TaskSetManager").isWarnEnabled()
    finally:
        spark.sparkContext.setLogLevel("ERROR")
