"""Task runtime (funke.taskmanager.task, funke.taskmanager.operators) on a real local SparkSession.

Tasks run hand-built TaskDeployments directly, without gRPC and without the TaskManager's core: a
producer's reports give the schema its consumers need, and a consumer is handed the producer
attempts to read, exactly as the core would hand them over (`Task.give_inputs`). What the core
decides (which attempts, when, no-op chains, cancel wins) is tested on the core.
"""

from __future__ import annotations

import collections
import csv
import datetime
import io
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

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
from funke.common.graph.operators import CATALOGUE
from funke.common.states import ExecutionState
from funke.taskmanager import streaming
from funke.taskmanager.operators import OPERATORS
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


# ---- (a) a two-stage word count ----


def split_words(line):
    return line.split()


def write_corpus(directory: Path, files: int, lines: int, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(150)] + ["flink", "spark", "ünïcode"]
    counts: collections.Counter = collections.Counter()
    directory.mkdir()
    for f in range(files):
        text = []
        for _ in range(lines):
            words = [rng.choice(vocabulary) for _ in range(rng.randint(0, 12))]
            counts.update(words)
            text.append(" ".join(words))
        (directory / f"part-{f}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return counts


def run_word_count(spark, data_dir: Path, corpus: Path, sources: int = 2, counters: int = 2, options=None,
                   precount: bool = False):
    """source.text + flat_map --HASH(word)--> count + sink.collect; with `precount`, as the
    README's word count: source.text + flat_map + count --HASH(word)--> sum of the counts +
    sink.collect. Returns word -> count per counter subtask, and the rows exchanged."""
    source_ops = [op("source.text", path=str(corpus)), op("flat_map", split_words, schema="word string")]
    if precount:
        source_ops.append(op("count", keys=["word"]))
    schemas = set()
    total_rows = lines_read = 0
    for i in range(sources):
        reports = run(deploy(data_dir, source_ops, vertex="tokenize", subtask=i, parallelism=sources,
                             outputs=[output("words", i, counters, HASH, ["word"])], options=options), spark)
        produced = finished(reports)
        assert [(p.data_set_id, p.partition_index) for p in produced] == [("words", i)]
        schemas.add(produced[0].schema)
        total_rows += produced[0].row_count
        # what it wrote, as reported for the metrics: its rows, and the bytes of its partition;
        # what it read: its source's records, the lines of its files
        io = reports.io[-1]
        assert io.records_out == produced[0].row_count and io.seconds > 0
        assert (io.bytes_out > 0) == (produced[0].row_count > 0) and io.bytes_in == 0
        lines_read += io.records_in
    assert lines_read == sum(len(f.read_text(encoding="utf-8").splitlines()) for f in corpus.iterdir())
    (schema,) = schemas
    count_ops = [op("aggregate", keys=["word"], aggregations=["sum(`count`) as `count`"]) if precount
                 else op("count", keys=["word"]), op("sink.collect")]
    per_subtask = []
    records_in = 0
    for i in range(counters):
        reports = run(deploy(data_dir, count_ops, vertex="count", subtask=i, parallelism=counters,
                             inputs=[gate("words", range(sources), subpartition=i, schema=schema)], options=options),
                      spark)
        finished(reports)
        per_subtask.append({r["word"]: r["count"] for r in collected(data_dir, "count", i)})
        # rows read: its own subpartition of every producer's partition, from the Parquet footers
        records_in += reports.io[-1].records_in
        assert reports.io[-1].records_out == len(per_subtask[-1])  # the rows its sink wrote
    assert records_in == total_rows  # every row went to exactly one counter, and was counted once
    return per_subtask, total_rows


@pytest.mark.parametrize("limit, precount, writer", [
    (None, True, "memory"),  # counted per word before the exchange: a small output, by Spark's estimate
    ("0", True, "spark"),    # unless the job's limit is 0
    (None, False, "spark"),  # flat_map's words themselves: more rows than Spark's estimate foresees
])
def test_two_stage_word_count_matches_counter_exactly(spark, tmp_path, limit, precount, writer):
    # A small output is collected and written by the task itself; either way the counts and the
    # metrics are the same.
    expected = write_corpus(tmp_path / "corpus", files=3, lines=400, seed=7)
    options = {EXCHANGE_IN_MEMORY_MAX_BYTES: limit} if limit is not None else None
    per_subtask, total_rows = run_word_count(spark, tmp_path / "data", tmp_path / "corpus", options=options,
                                             precount=precount)
    for i in range(2):
        assert written_by(layout.partition_dir(str(tmp_path / "data"), "job1", "words", i, 0)) == writer
    # HASH routing: every word is counted by exactly one subtask, and both got some.
    assert all(per_subtask) and not set(per_subtask[0]) & set(per_subtask[1])
    merged = collections.Counter()
    for counts in per_subtask:
        merged.update(counts)
    assert merged == expected
    if precount:  # a row per word and producer subtask
        assert len(expected) <= total_rows < sum(expected.values())
    else:  # a row per word in the text
        assert total_rows == sum(expected.values())


# ---- (b) empty shares, empty subpartitions, unsplit partitions ----


def test_empty_file_share_and_empty_subpartition_still_work(spark, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "only.txt").write_text("same same\nsame\n")
    # one file for two source subtasks: subtask 1 reads nothing; one word: one subpartition empty
    per_subtask, total_rows = run_word_count(spark, tmp_path / "data", corpus)
    assert sorted(per_subtask, key=len) == [{}, {"same": 3}]
    assert total_rows == 3


def test_a_partition_written_unsplit_is_subpartition_zero(spark, tmp_path):
    # POINTWISE 2 -> 3: producer 1 feeds only consumer 2, so it writes one unsplit partition,
    # while consumer 2's gate still names subpartition 0 of it.
    rows = op("source.collection", rows=[[1], [2], [3], [4]], schema="n int")  # subtask 1 of 2: 3, 4
    produced = finished(run(deploy(tmp_path, [rows], vertex="p", subtask=1, parallelism=2,
                                   outputs=[output("ds", 1, 1, REBALANCE)]), spark))
    finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", subtask=2, parallelism=3,
                        inputs=[gate("ds", range(1, 2), subpartition=0, schema=produced[0].schema)]), spark))
    assert sorted(r["n"] for r in collected(tmp_path, "c", 2)) == [3, 4]


def k_and_v(n):
    return (n % 3, n)


@pytest.mark.parametrize("source, writer", [
    # rows from the driver of plain types: handed to Spark as Arrow, which Spark sizes: small
    (op("source.collection", rows=[[k % 3, k] for k in range(12)], schema="k int, v int"), "memory"),
    # with a date column: handed over as Python objects, which Spark cannot size: its writer
    (op("source.collection", rows=[[k % 3, k, "2024-01-02"] for k in range(12)], schema="k int, v int, d date"),
     "spark"),
    # a range of 12: Spark knows it is small, so the task collects and writes it
    (op("source.range", k_and_v, end=12, schema="k bigint, v bigint"), "memory"),
])
def test_several_outputs_are_routed_by_their_own_partitioner(spark, tmp_path, source, writer):
    rows = source
    produced = finished(run(deploy(tmp_path, [rows], outputs=[
        output("hashed", 0, 2, HASH, ["k"]), output("spread", 0, 2, REBALANCE), output("everyone", 0, 1, BROADCAST),
    ]), spark))
    assert [(p.data_set_id, p.row_count) for p in produced] == [("hashed", 12), ("spread", 12), ("everyone", 12)]
    assert len({p.schema for p in produced}) == 1
    hashed = partition_rows(tmp_path, "hashed", 0)
    assert sorted(r["v"] for r in hashed) == list(range(12))
    sub_of_key = {}
    for r in hashed:
        assert sub_of_key.setdefault(r["k"], r["_sub"]) == r["_sub"]  # one key, one subpartition
    spread = partition_rows(tmp_path, "spread", 0)
    assert sorted(r["v"] for r in spread) == list(range(12))
    assert {r["_sub"] for r in spread} == {0, 1}
    assert sorted(r["v"] for r in partition_rows(tmp_path, "everyone", 0)) == list(range(12))
    assert "_sub" not in partition_rows(tmp_path, "everyone", 0)[0]
    for data_set in ("hashed", "spread", "everyone"):
        assert written_by(layout.partition_dir(str(tmp_path), "job1", data_set, 0, 0)) == writer


def k_v_and_day(n):
    return (n % 3, n, datetime.date(2024, 1, 2))


def hundredfold(n):
    return [(n % 3, n * 100 + i) for i in range(100)]


@pytest.mark.parametrize("chain, writer", [
    # a function that multiplies its rows, whose output Spark estimates at its input's size
    ([op("source.range", end=12), op("flat_map", hundredfold, schema="k bigint, v bigint")], "spark"),
    # the same, then a row per key: the output is no larger than the keys
    ([op("source.range", end=12), op("flat_map", hundredfold, schema="k bigint, v bigint"),
      op("combine", keys=["k"], aggregations=["count(1) as n"])], "memory"),
    # a generator in SQL, which Spark also estimates at its input's size
    ([op("source.range", end=12), op("select", exprs=["id % 3 as k", "explode(sequence(1, 100)) as v"])], "spark"),
])
def test_an_output_that_may_have_more_rows_than_spark_foresees_is_not_collected(spark, tmp_path, chain, writer):
    produced = finished(run(deploy(tmp_path, chain, outputs=[output("ds", 0, 2, HASH, ["k"])]), spark))
    assert written_by(layout.partition_dir(str(tmp_path), "job1", "ds", 0, 0)) == writer
    rows = partition_rows(tmp_path, "ds", 0)
    assert len(rows) == produced[0].row_count == (3 if writer == "memory" else 1200)


def test_a_consumer_reads_partitions_written_either_way_together(spark, tmp_path):
    # producer 0's output is small by Spark's estimate (a range), producer 1's is not (rows from
    # the driver with a date column): its consumers read the one's files and the other's
    # directories as one input
    small = op("source.range", k_v_and_day, end=40, schema="k bigint, v bigint, d date")
    unknown = op("source.collection", rows=[[k % 3, k, "2024-01-02"] for k in range(40, 60)],
                 schema="k bigint, v bigint, d date")
    schemas = set()
    for i, source in enumerate((small, unknown)):
        produced = finished(run(deploy(tmp_path, [source], vertex=f"p{i}",  # each source's whole share
                                       outputs=[output("ds", i, 2, HASH, ["k"])]), spark))
        schemas.add(produced[0].schema)
    assert [written_by(layout.partition_dir(str(tmp_path), "job1", "ds", i, 0)) for i in range(2)] == ["memory", "spark"]
    (schema,) = schemas
    seen, keys = [], []
    for c in range(2):
        reports = run(deploy(tmp_path, [op("sink.collect")], vertex="c", subtask=c, parallelism=2,
                             inputs=[gate("ds", range(2), subpartition=c, schema=schema)]), spark)
        finished(reports)
        rows = collected(tmp_path, "c", c)
        assert reports.io[-1].records_in == len(rows)  # its subpartition of both, from the footers
        seen += [(r["k"], r["v"]) for r in rows]
        keys.append({r["k"] for r in rows})
    assert sorted(seen) == sorted((k % 3, k) for k in range(60))  # every row once
    assert not keys[0] & keys[1]  # both producers route a key to the same consumer


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


# ---- (g) each operator on tiny data ----


@pytest.fixture
def ctx(spark, tmp_path):
    return RuntimeContext(spark, "job-g", "v", 0, 1, 0, str(tmp_path / "data"))


def rows_of(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def test_every_catalogue_kind_has_an_implementation():
    # stream sources are the streaming registry's, every other kind operators.OPERATORS'
    assert {k for k in CATALOGUE if streaming.operator(k) is not None} == set(CATALOGUE)
    assert set(OPERATORS) | set(streaming.TASK_SOURCES) == set(CATALOGUE)


def test_map_flat_map_filter_calling_convention(spark, ctx):
    people = spark.createDataFrame([(1, "ada"), (2, "bob"), (3, "cy")], "n int, name string")
    names = spark.createDataFrame([("ada",), ("bob",)], "name string")

    def apply(kind, df, fn, **config):
        return rows_of(OPERATORS[kind](ctx, op(kind, fn, **config), [df]))

    # several columns in: a Row; tuple, dict and Row results
    assert apply("map", people, lambda r: (r.n * 10, r.name.upper()), schema="n int, name string") == \
        [(10, "ADA"), (20, "BOB"), (30, "CY")]
    assert apply("map", people, lambda r: {"len": len(r.name), "n": r.n}, schema="n int, len int") == \
        [(1, 3), (2, 3), (3, 2)]
    assert apply("map", people, lambda r: Row(x=float(r.n)), schema="x double") == [(1.0,), (2.0,), (3.0,)]
    # one column in: the bare value; one atomic column out: the bare value
    assert apply("map", names, len, schema="n int") == [(3,), (3,)]
    # one array column out: a list is the value, not a row
    assert apply("map", names, list, schema="letters array<string>") == [(["a", "d", "a"],), (["b", "o", "b"],)]
    assert apply("flat_map", names, lambda s: [(s, i) for i in range(len(s) - 1)], schema="s string, i int") == \
        [("ada", 0), ("ada", 1), ("bob", 0), ("bob", 1)]
    assert apply("flat_map", people, lambda r: [] if r.n == 2 else [r.n], schema="n int") == [(1,), (3,)]
    filtered = OPERATORS["filter"](ctx, op("filter", lambda r: r.n != 2), [people])
    assert filtered.schema == people.schema and rows_of(filtered) == [(1, "ada"), (3, "cy")]


def test_python_workers_do_not_need_funke(tmp_path):
    # What mapInArrow ships must unpickle where only pyspark, pyarrow and cloudpickle exist
    # (a Spark Connect server, a cluster's executors).
    from pyspark import cloudpickle as spark_cloudpickle

    from funke.taskmanager.operators import udf

    schema = pa.schema([("n", pa.int64())])
    shipped = tmp_path / "fn.pkl"
    shipped.write_bytes(spark_cloudpickle.dumps(
        udf.map_batches(cloudpickle.dumps(lambda n: n * 2), schema, "double", flat=False)))
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    probe = (
        f"import sys; sys.path += {site_packages!r}\n"
        "import importlib.util, pickle, pyarrow as pa\n"
        "assert importlib.util.find_spec('funke') is None\n"
        f"fn = pickle.loads(open({str(shipped)!r}, 'rb').read())\n"
        "print(next(fn(iter([pa.record_batch([pa.array([1, 2])], names=['n'])]))).to_pydict())\n"
    )
    # -S: no site processing, so the editable install's path hook for funke is not there.
    done = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'n': [2, 4]}"


def test_plain_tuple_results_take_the_fast_path_and_give_what_the_row_by_row_path_gives():
    from funke.taskmanager.operators.udf import RowWriter

    schema = pa.schema([("n", pa.int64()), ("bucket", pa.int32()), ("name", pa.string())])
    writer = RowWriter(schema, "widen")
    tuples = [(1, 2, "a"), (None, 3, None), (2**40, -1, "ü")]
    fast = writer.batch_of_results(tuples)
    assert fast.schema == schema and fast.to_pylist() == writer.batch([writer.values(r) for r in tuples]).to_pylist()
    # lists, dicts and Rows are normalised row by row, to the same rows
    mixed = [[1, 2, "a"], {"name": None, "n": None, "bucket": 3}, Row(n=2**40, bucket=-1, name="ü")]
    assert writer.batch_of_results(mixed).to_pylist() == fast.to_pylist()
    # what does not fit is named: the operator, and the column or the row
    with pytest.raises(TypeError, match="widen: column 'bucket' \\(int32\\)"):
        writer.batch_of_results([(1, 2**40, "a")])
    with pytest.raises(ValueError, match="widen: result \\(1, 2\\) has 2 value"):
        writer.batch_of_results([(1, 2, "a"), (1, 2)])
    assert writer.batch_of_results([]).num_rows == 0


def test_map_result_that_does_not_fit_the_schema_names_the_operator(spark, ctx):
    df = spark.createDataFrame([(1, "a")], "n int, s string")
    bad = OPERATORS["map"](ctx, op("map", lambda r: (1, 2, 3), name="widen", schema="n int, s string"), [df])
    with pytest.raises(Exception, match="widen"):
        bad.collect()


def test_select_where_aggregate_count(spark, ctx):
    df = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3), ("c", None)], "k string, v int")
    assert rows_of(OPERATORS["select"](ctx, op("select", exprs=["upper(k) as K", "v * 2 as d"]), [df])) == \
        sorted([("A", 2), ("B", 4), ("A", 6), ("C", None)], key=lambda t: (t[0], t[1] or 0))
    assert rows_of(OPERATORS["where"](ctx, op("where", condition="v >= 2"), [df])) == [("a", 3), ("b", 2)]
    aggregated = OPERATORS["aggregate"](ctx, op("aggregate", keys=["k"], aggregations=["sum(v) as total", "count(v) as n"]), [df])
    assert aggregated.columns == ["k", "total", "n"]
    assert rows_of(aggregated) == [("a", 4, 2), ("b", 2, 1), ("c", None, 0)]
    assert rows_of(OPERATORS["count"](ctx, op("count", keys=["k"]), [df])) == [("a", 2), ("b", 1), ("c", 1)]


def add_values(a, b):
    return Row(k=a.k, v=a.v + b.v)


def test_reduce_is_a_keyed_reduce(spark, ctx):
    df = spark.createDataFrame([(f"k{i % 4}", i) for i in range(40)], "k string, v bigint")
    reduced = OPERATORS["reduce"](ctx, op("reduce", add_values, keys=["k"]), [df])
    assert reduced.schema == df.schema
    assert rows_of(reduced) == [(f"k{j}", sum(i for i in range(40) if i % 4 == j)) for j in range(4)]
    # one column: bare values in and out
    words = spark.createDataFrame([("x",), ("y",), ("x",)], "w string")
    assert rows_of(OPERATORS["reduce"](ctx, op("reduce", lambda a, b: a, keys=["w"]), [words])) == [("x",), ("y",)]


def test_join_union_transform_noop(spark, ctx):
    left = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id int, l string")
    right = spark.createDataFrame([(2, "B"), (3, "C"), (4, "D")], "id int, r string")
    assert rows_of(OPERATORS["join"](ctx, op("join", on=["id"]), [left, right])) == [(2, "b", "B"), (3, "c", "C")]
    assert rows_of(OPERATORS["join"](ctx, op("join", on=["id"], how="left"), [left, right])) == \
        [(1, "a", None), (2, "b", "B"), (3, "c", "C")]
    flipped = spark.createDataFrame([("z", 9)], "l string, id int")
    unioned = OPERATORS["union"](ctx, op("union"), [left, flipped, left.limit(1)])
    assert unioned.columns == ["id", "l"] and rows_of(unioned) == [(1, "a"), (1, "a"), (2, "b"), (3, "c"), (9, "z")]
    transformed = OPERATORS["transform"](ctx, op("transform", lambda df: df.withColumn("x", F.col("id") + 1)), [left])
    assert rows_of(transformed) == [(1, "a", 2), (2, "b", 3), (3, "c", 4)]
    assert rows_of(OPERATORS["noop"](ctx, op("noop"), [left])) == rows_of(left)


def square(i):
    return (i, i * i, f"#{i}")


def test_range_shares_and_generator(spark, ctx):
    def share(subtask, parallelism, spec):
        sub = RuntimeContext(spark, "j", "v", subtask, parallelism, 0, ctx.data_dir)
        return rows_of(OPERATORS["source.range"](sub, spec))

    plain = op("source.range", start=3, end=20, step=3)
    shares = [share(i, 4, plain) for i in range(4)]
    assert [r for s in shares for r in s] == [(i,) for i in range(3, 20, 3)]
    assert [len(s) for s in shares] == [1, 2, 1, 2]
    generated = op("source.range", square, end=10, step=2, schema="id bigint, sq bigint, label string")
    assert share(1, 2, generated) == [(4, 16, "#4"), (6, 36, "#6"), (8, 64, "#8")]
    assert share(5, 6, op("source.range", start=10, end=0, step=-4)) == [(2,)]


def test_collection_shares_and_json_coercion(spark):
    rows = [{"x": 1, "d": "2024-01-02", "tags": ["a"]}, [2.5, None, []], {"x": 3}]
    spec = op("source.collection", rows=rows, schema="x double, d date, tags array<string>")
    shares = [OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", i, 2, 0, "/unused"), spec).collect()
              for i in range(2)]
    assert [tuple(r) for s in shares for r in s] == [(1.0, datetime.date(2024, 1, 2), ["a"]), (2.5, None, []), (3.0, None, None)]
    assert [len(s) for s in shares] == [1, 2]
    empty = OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 5, 0, "/unused"), spec)
    assert empty.count() == 0 and empty.schema.names == ["x", "d", "tags"]


@pytest.mark.parametrize("schema, rows", [
    ("n bigint", [[2.0]]),                  # a float for a bigint
    ("n bigint", [[True]]),                 # a bool for a bigint
    ("s string", [[1]]),                    # a number for a string
    ("b binary", [["x"]]),                  # a string for binary
    ("n tinyint", [[300]]),                 # out of the type's range
    ("n bigint", [[2**63]]),                # out of bigint's
    ("x float", [[1.1]]),                   # rounded to a float
    ("n bigint not null", [[1], [None]]),   # a null where none may be
    ("n int, s string", [[1, "a"], {"s": "b"}, [None, None]]),
])
def test_a_collection_gives_what_spark_gives_for_the_same_rows(spark, schema, rows):
    """Plain columns reach Spark as Arrow: the rows, or the failure, are those of Spark's own
    conversion of the same rows."""
    from funke.taskmanager.operators.sources import _coerce_row

    def outcome(make):
        try:
            return [tuple(r) for r in make().collect()]
        except Exception as e:  # PySparkTypeError, PySparkValueError, ...
            return f"fails: {type(e).__name__}"

    parsed = StructType.fromDDL(schema)
    ours = outcome(lambda: OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 1, 0, "/unused"),
                                                          op("source.collection", rows=rows, schema=schema)))
    sparks = outcome(lambda: spark.createDataFrame([_coerce_row(r, parsed) for r in rows], parsed))
    assert ours == sparks


def test_a_plain_collection_reaches_spark_as_data_spark_can_size(spark):
    from funke.taskmanager import batchexchange

    spec = op("source.collection", rows=[[1, "a", 0.5, True], {"n": None, "s": None}], schema="n int, s string, x double, b boolean")
    df = OPERATORS["source.collection"](RuntimeContext(spark, "j", "v", 0, 1, 0, "/unused"), spec)
    assert [tuple(r) for r in df.collect()] == [(1, "a", 0.5, True), (None, None, None, None)]
    assert batchexchange.estimated_bytes(df) is not None


def test_file_sources_split_by_file_and_keep_the_schema_for_empty_shares(spark, tmp_path):
    frame = spark.createDataFrame([(i, f"s{i}") for i in range(6)], "n bigint, s string").repartition(3)
    for fmt in ("parquet", "csv", "json", "text"):
        directory = str(tmp_path / fmt)
        out = frame.selectExpr("concat(n, ':', s) as value") if fmt == "text" else frame
        writer = out.write.format(fmt)
        (writer.option("header", "true") if fmt == "csv" else writer).save(directory)
        config = {"path": directory}
        if fmt == "csv":
            config["schema"] = "n bigint, s string"
        spec = OperatorSpec(f"source.{fmt}", "", config)
        shares = [OPERATORS[spec.kind](RuntimeContext(spark, "j", "v", i, 4, 0, "/unused"), spec) for i in range(4)]
        files = sorted(spark.read.format("text").load(directory).inputFiles())
        assert len(files) == 3
        assert [len(s.inputFiles()) for s in shares] == [1, 1, 1, 0], fmt
        assert len({s.schema.simpleString() for s in shares}) == 1, fmt
        everything = sorted(tuple(r) for s in shares for r in s.collect())
        if fmt == "text":
            assert everything == sorted((f"{i}:s{i}",) for i in range(6))
        else:
            assert everything == [(i, f"s{i}") for i in range(6)], fmt


def test_file_sinks_stage_their_format_and_refuse_a_non_empty_target(spark, ctx, tmp_path):
    df = spark.createDataFrame([(1, "a"), (2, None)], "n int, s string").coalesce(1)

    def sink(kind, target, **config):
        OPERATORS[kind](ctx, op(kind, path=str(target), **config), df)
        staging = Path(layout.sink_staging_dir(str(target), ctx.job_id, 0, 0))
        return [p for p in sorted(staging.iterdir()) if not p.name.startswith((".", "_"))]

    (parquet,) = sink("sink.parquet", tmp_path / "out.parquet")
    assert pq.read_table(parquet).to_pylist() == [{"n": 1, "s": "a"}, {"n": 2, "s": None}]
    (csv_file,) = sink("sink.csv", tmp_path / "out.csv")
    assert list(csv.reader(io.StringIO(csv_file.read_text()))) == [["n", "s"], ["1", "a"], ["2", ""]]
    (json_file,) = sink("sink.json", tmp_path / "out.json")
    assert [json.loads(line) for line in json_file.read_text().splitlines()] == [{"n": 1, "s": "a"}, {"n": 2}]
    (text_file,) = sink("sink.text", tmp_path / "out.txt")
    assert text_file.read_text().splitlines() == ["1\ta", "2\t"]
    assert not (tmp_path / "out.txt").exists()  # only the commit puts it there

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "old.csv").write_text("x\n")
    with pytest.raises(FileExistsError, match="taken"):
        sink("sink.csv", taken)
    assert len(sink("sink.csv", taken, mode="overwrite")) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(sink("sink.text", empty)) == 1


def test_collect_print_and_discard_sinks(spark, ctx, capsys):
    df = spark.createDataFrame([(1, "a")], "n int, s string")
    OPERATORS["sink.collect"](ctx, op("sink.collect"), df)
    staged = layout.sink_staging_dir(layout.collect_dir(ctx.data_dir, "job-g", "v"), "job-g", 0, 0)
    assert pq.read_table(staged).to_pylist() == [{"n": 1, "s": "a"}]
    OPERATORS["sink.print"](RuntimeContext(spark, "j", "v", 2, 3, 0, ctx.data_dir), op("sink.print"), df)
    assert capsys.readouterr().out == "3> Row(n=1, s='a')\n"
    OPERATORS["sink.discard"](ctx, op("sink.discard"), df)


def test_a_consumer_reads_the_same_rows_in_the_same_order_from_memory_and_from_the_files(spark, tmp_path, monkeypatch):
    # A restarted consumer (another TaskManager, or this one after a restart) reads the files its
    # first attempt read from memory: what it computes, and so a sink's bytes, must not change.
    from funke.taskmanager import batchexchange

    sizes = (5, 300, 40)  # Spark's reader would take the files largest first
    for i, n in enumerate(sizes):
        produced = finished(run(deploy(tmp_path, [op("source.range", k_and_v, end=n, schema="k bigint, v bigint")],
                                       vertex=f"p{i}", outputs=[output("ds", i, 1)]), spark))
        assert written_by(layout.partition_dir(str(tmp_path), "job1", "ds", i, 0)) == "memory"

    def consume(attempt: int) -> list[tuple[int, int]]:
        finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", attempt=attempt,
                            inputs=[gate("ds", range(3), subpartition=0, schema=produced[0].schema)]), spark))
        return [(r["k"], r["v"]) for r in collected(tmp_path, "c", 0, attempt=attempt)]

    from_memory = consume(0)
    monkeypatch.setattr(batchexchange, "_LOCAL", batchexchange._LocalPartitions())  # a process that wrote none
    assert batchexchange.local_table([layout.partition_dir(str(tmp_path), "job1", "ds", 0, 0) + "/sub-0.parquet"]) is None
    from_files = consume(1)
    assert from_files == from_memory
    assert sorted(from_memory) == sorted(k_and_v(n) for size in sizes for n in range(size))


def test_rows_after_producers_that_had_none_for_a_consumer_are_not_lost(spark, tmp_path, monkeypatch):
    # PySpark's createDataFrame drops the rows that follow empty Arrow record batches: the
    # subpartitions of producers that had no rows for this consumer must not hide the others'.
    from funke.taskmanager import batchexchange

    for i, n in enumerate((0, 0, 3, 0, 2)):
        produced = finished(run(deploy(tmp_path, [op("source.range", k_and_v, end=n, schema="k bigint, v bigint")],
                                       vertex=f"p{i}", outputs=[output("ds", i, 1)]), spark))
    for attempt, local in enumerate((True, False)):
        if not local:
            monkeypatch.setattr(batchexchange, "_LOCAL", batchexchange._LocalPartitions())
        finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", attempt=attempt,
                            inputs=[gate("ds", range(5), subpartition=0, schema=produced[0].schema)]), spark))
        assert sorted((r["k"], r["v"]) for r in collected(tmp_path, "c", 0, attempt=attempt)) == \
            sorted([k_and_v(n) for n in range(3)] + [k_and_v(n) for n in range(2)]), f"local: {local}"


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
