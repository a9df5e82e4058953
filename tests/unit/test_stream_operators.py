"""The TaskManager's stream operators on real PySpark (taskmanager/operators/): in a micro-batch
a rate source reads exactly its range's rows — the same values and timestamps as the rule in
common/streaming/sources/, split across subtasks — a stream file source reads the files the
JobManager resolved for the batch, and a file sink stages the batch inside its target for the
JobMaster's commit. Outside a micro-batch a stream source refuses to run."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading

import pytest
from pyspark.sql import SparkSession

from funke.common.streaming.checkpoint import SourceRange
from funke.common.graph.jobgraph import OperatorSpec, PartitionerKind
from funke.common.states import ExecutionState
from funke.common.streaming.sources import BatchInput, RateSource
from funke.jobmanager import streamsinks
from funke.taskmanager.operators import OPERATORS
from funke.taskmanager.operators.context import RuntimeContext
from funke.taskmanager.task import StreamTask


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("funke-test-stream-operators")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def context(spark, tmp_path, vertex: str, subtask: int, parallelism: int, batch: BatchInput | None,
            attempt: int = 0) -> RuntimeContext:
    return RuntimeContext(spark=spark, job_id="job-1", vertex_id=vertex, subtask_index=subtask,
                          parallelism=parallelism, attempt_number=attempt, data_dir=str(tmp_path / "data"),
                          batch=batch)


def test_a_rate_source_reads_exactly_its_range_split_by_subtask(spark, tmp_path):
    r = SourceRange({"rows": 5, "baseMs": 1_000}, {"rows": 12, "baseMs": 1_000}, 7)
    batch = BatchInput(3, 2_000, {"rate": r})
    spec = OperatorSpec("source.rate", "rate", {"rows_per_second": 4})
    rule = RateSource(4, partitions=3)
    for subtask in range(3):
        rows = OPERATORS["source.rate"](context(spark, tmp_path, "rate", subtask, 3, batch), spec).collect()
        got = [(row.value, row.timestamp.replace(tzinfo=dt.timezone.utc)) for row in rows]
        want = [(v, dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)) for v, ms in rule.rows(r, subtask)]
        assert got == want and got  # every subtask has some of the 7 rows


def test_an_empty_rate_range_and_a_missing_batch(spark, tmp_path):
    spec = OperatorSpec("source.rate", "rate", {"rows_per_second": 4})
    empty = BatchInput(0, 0, {"rate": SourceRange(None, None, 0)})
    assert OPERATORS["source.rate"](context(spark, tmp_path, "rate", 0, 1, empty), spec).count() == 0
    with pytest.raises(ValueError, match="is a stream source: it runs in a streaming query's micro-batches"):
        OPERATORS["source.rate"](context(spark, tmp_path, "rate", 0, 1, None), spec)
    with pytest.raises(ValueError, match="names no range for vertex 'rate'"):
        OPERATORS["source.rate"](context(spark, tmp_path, "rate", 0, 1, BatchInput(1, 0, {})), spec)


def test_a_stream_file_source_reads_the_files_of_the_batch_only(spark, tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    for name, text in {"a.txt": "x y\n", "b.txt": "z\n", "c.txt": "not in this batch\n"}.items():
        (incoming / name).write_text(text)
    batch = BatchInput(0, 0, {"words": SourceRange(None, 2)}, {"words": ("a.txt", "b.txt")})
    spec = OperatorSpec("source.stream.text", "words", {"path": str(incoming)})
    lines = [sorted(r.value for r in OPERATORS["source.stream.text"](
        context(spark, tmp_path, "words", s, 2, batch), spec).collect()) for s in range(2)]
    assert lines == [["x y"], ["z"]]
    csv_spec = OperatorSpec("source.stream.csv", "csv", {"path": str(incoming), "schema": "a string"})
    none = BatchInput(1, 0, {"csv": SourceRange(2, 2)}, {"csv": ()})
    assert OPERATORS["source.stream.csv"](context(spark, tmp_path, "csv", 0, 1, none), csv_spec).count() == 0


def test_a_file_sink_stages_each_batch_inside_its_target_for_the_commit(spark, tmp_path):
    target = tmp_path / "out"
    spec = OperatorSpec("sink.parquet", "out", {"path": str(target)})
    df = spark.createDataFrame([(1,), (2,)], "n int")
    for batch_id in (0, 1):
        OPERATORS["sink.parquet"](context(spark, tmp_path, "out", 0, 1, BatchInput(batch_id, 0), attempt=2), spec, df)
        streamsinks.commit_batch(str(target), "job-1", batch_id, {0: 2})
    assert sorted(r.n for r in spark.read.parquet(str(target)).collect()) == [1, 1, 2, 2]
    assert streamsinks.committed_batches(str(target)) == [0, 1]


# ---------------------------------------------------------------------------------------- StreamTask


class BatchReports:
    def __init__(self):
        self.done: list[tuple[int, list]] = []
        self.input_rows: list[int | None] = []
        self.io: list = []
        self._cond = threading.Condition()

    def __call__(self, batch_id, produced, input_rows=None, io=None):
        with self._cond:
            self.done.append((batch_id, list(produced)))
            self.input_rows.append(input_rows)
            self.io.append(io)
            self._cond.notify_all()

    def wait_for(self, batch_id: int, timeout: float = 60.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: any(b == batch_id for b, _ in self.done), timeout)


def test_a_stream_task_stays_running_and_runs_each_batch_it_is_given_over_its_own_partitions(spark, tmp_path):
    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    E = ExecutionState
    rate_range = [SourceRange(None, {"rows": 4, "baseMs": 0}, 4), SourceRange({"rows": 4, "baseMs": 0},
                                                                              {"rows": 10, "baseMs": 0}, 6)]
    producer, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), op("select", exprs=["value"])],
                         vertex="rate", outputs=[output("ds", 0)])
    target = tmp_path / "out"
    consumer, _ = deploy(tmp_path, [op("sink.parquet", path=str(target))], vertex="sink", attempt=3)
    p_reports, c_reports = Reports(), Reports()
    p_batches, c_batches = BatchReports(), BatchReports()
    p_task = StreamTask(producer, spark, p_reports, p_batches)
    c_task = StreamTask(consumer, spark, c_reports, c_batches)
    threads = [threading.Thread(target=t.run, daemon=True) for t in (p_task, c_task)]
    for t in threads:
        t.start()
    assert p_reports.wait_for(E.RUNNING) and c_reports.wait_for(E.RUNNING)
    for batch_id, r in enumerate(rate_range):
        p_task.give_batch(BatchInput(batch_id, 0, {"rate": r}))
        assert p_batches.wait_for(batch_id)
        (produced,) = p_batches.done[-1][1]
        assert produced.row_count == r.rows and produced.data_set_id == "ds"
        c_task.give_batch(BatchInput(batch_id, 0), (gate("ds", range(0, 1), schema=produced.schema),))
        assert c_batches.wait_for(batch_id)
        streamsinks.commit_batch(str(target), "job1", batch_id, {0: 3})
    assert p_reports.states == [E.INITIALIZING, E.RUNNING] and not p_reports.wait_for(E.FINISHED, 0.2)
    p_task.finish()
    c_task.finish()
    for t in threads:
        t.join(60)
    assert p_reports.states[-1] is E.FINISHED and c_reports.states[-1] is E.FINISHED
    assert sorted(r.value for r in spark.read.parquet(str(target)).collect()) == list(range(10))
    # each batch has its own partition of the data set
    assert sorted(os.listdir(tmp_path / "jobs" / "job1" / "partitions" / "ds" / "p0" / "a0")) == ["batch-0", "batch-1"]


def test_a_stream_task_cancelled_between_batches_ends_canceled_and_a_failing_batch_fails_it(spark, tmp_path):
    from tests.unit.test_task_runtime import Reports, deploy, op

    E = ExecutionState
    waiting, _ = deploy(tmp_path, [op("source.rate", rows_per_second=10), op("sink.discard")], vertex="rate")
    reports = Reports()
    task = StreamTask(waiting, spark, reports, BatchReports())
    thread = threading.Thread(target=task.run, daemon=True)
    thread.start()
    assert reports.wait_for(E.RUNNING)
    task.cancel()
    thread.join(30)
    assert reports.states[-1] is E.CANCELED
    failing, _ = deploy(tmp_path, [op("source.rate", rows_per_second=10), op("sink.discard")], vertex="rate", attempt=1)
    reports = Reports()
    task = StreamTask(failing, spark, reports, BatchReports())
    task.give_batch(BatchInput(0, 0, {"other": SourceRange(None, None)}))  # no range for this vertex
    task.run()
    state, failure, _ = reports.last
    assert state is E.FAILED and "names no range for vertex 'rate'" in failure.message


# ---------------------------------------------------------------------------- a batch's exchanges

TYPED = ["value", "value % 3 AS k", "timestamp", "array(value, value + 1) AS arr", "map('v', value) AS m",
         "named_struct('a', value, 'b', concat('x', value)) AS s", "CAST(NULL AS STRING) AS n",
         "CAST(value AS DECIMAL(10, 2)) AS d", "to_date('2026-11-25') AS day"]


def run_exchange(spark, tmp_path, batch_id: int, producer_attempt: int = 0, drop: str | None = None):
    """One batch of a rate source (rows 0..49) split by HASH of `k` into two consumers, each staging
    what it read into a Parquet sink; returns (the producer's partition directory, per consumer
    the rows it read, or the failure)."""
    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    E = ExecutionState
    producer, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), op("select", exprs=TYPED)],
                         vertex="rate", attempt=producer_attempt,
                         outputs=[output("ds", 0, n=2, partitioner=PartitionerKind.HASH, keys=["k"])])
    p_batches = BatchReports()
    p_task = StreamTask(producer, spark, Reports(), p_batches)
    p_task.give_batch(BatchInput(batch_id, 0, {"rate": SourceRange(None, {"rows": 50, "baseMs": 0}, 50)}))
    p_task.finish()
    p_task.run()
    (produced,) = p_batches.done[0][1]
    assert produced.row_count == 50
    directory = tmp_path / "jobs" / "job1" / "partitions" / "ds" / "p0" / f"a{producer_attempt}" / f"batch-{batch_id}"
    if drop:
        os.remove(directory / drop)
    read = []
    for sub in (0, 1):
        target = tmp_path / f"out-{batch_id}-{sub}"
        consumer, _ = deploy(tmp_path, [op("sink.parquet", path=str(target))], vertex="agg", subtask=sub,
                             parallelism=2, attempt=batch_id)
        reports = Reports()
        task = StreamTask(consumer, spark, reports, BatchReports())
        task.give_batch(BatchInput(batch_id, 0), (gate("ds", range(0, 1), subpartition=sub,
                                                       attempts=[producer_attempt], schema=produced.schema),))
        task.finish()
        task.run()
        state, failure, _ = reports.last
        if state is not E.FINISHED:
            read.append(failure)
            continue
        streamsinks.commit_batch(str(target), "job1", batch_id, {sub: batch_id})
        read.append(sorted(spark.read.parquet(str(target)).collect(), key=lambda r: r.value))
    return directory, read


def test_a_small_batch_is_exchanged_in_memory_one_file_per_subpartition_with_every_type_intact(spark, tmp_path):
    directory, (first, second) = run_exchange(spark, tmp_path, 0)
    assert sorted(os.listdir(directory)) == ["sub-0.parquet", "sub-1.parquet"]
    assert sorted(r.value for r in first + second) == list(range(50))
    assert {r.k for r in first}.isdisjoint({r.k for r in second})  # a key goes to one consumer
    row = next(r for r in first + second if r.value == 7)
    assert row.timestamp == dt.datetime(1970, 1, 1, 0, 0, 0, 7000)
    assert (row.arr, row.m, row.s.a, row.s.b, row.n) == ([7, 8], {"v": 7}, 7, "x7", None)
    assert (str(row.d), row.day) == ("7.00", dt.date(2026, 11, 25))


def test_a_batch_over_the_in_memory_limit_goes_through_sparks_writer_and_reads_the_same(spark, tmp_path, monkeypatch):
    _, small = run_exchange(spark, tmp_path, 0)
    monkeypatch.setattr("funke.taskmanager.batchexchange.IN_MEMORY_LIMIT_BYTES", 50 * 16 - 1)
    directory, large = run_exchange(spark, tmp_path, 1)
    assert {"_sub=0", "_sub=1"} <= set(os.listdir(directory))
    assert large == small


def test_a_missing_subpartition_file_fails_its_consumer_instead_of_reading_nothing(spark, tmp_path):
    _, (first, second) = run_exchange(spark, tmp_path, 0, drop="sub-1.parquet")
    assert isinstance(first, list) and first  # subpartition 0 is there and read
    assert "has no subpartition 1" in second.message, second


# ---------------------------------------------------------------------------------------- input rows


def run_source_task(spark, tmp_path, ops, batch: BatchInput, outputs=()):
    from tests.unit.test_task_runtime import Reports, deploy

    d, _ = deploy(tmp_path, ops, vertex="words", outputs=outputs, attempt=batch.batch_id)
    reports, batches = Reports(), BatchReports()
    task = StreamTask(d, spark, reports, batches)
    task.give_batch(batch)
    task.finish()
    task.run()
    assert reports.last[0] is ExecutionState.FINISHED, reports.last
    return batches.input_rows


def test_a_file_source_task_reports_the_rows_it_read_and_a_chain_that_reads_only_some_reports_none(spark, tmp_path):
    from tests.unit.test_task_runtime import op, output

    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "a.txt").write_text("one two\n\nthree\n")  # 3 lines, one of them empty
    (incoming / "b.txt").write_text("four five six seven\n")  # 1 line
    files = {"words": ("a.txt", "b.txt")}
    source = op("source.stream.text", path=str(incoming))
    words = op("flat_map", lambda line: line.split(), schema="word string")
    batch = BatchInput(0, 0, {"words": SourceRange(None, 2)}, files)
    # into an exchange: the lines read (4), not the words written (7)
    assert run_source_task(spark, tmp_path, [source, words], batch, outputs=[output("ds", 0)]) == [4]
    # into a file sink: every row runs
    sink = op("sink.parquet", path=str(tmp_path / "out"))
    assert run_source_task(spark, tmp_path, [source, words, sink], BatchInput(1, 0, batch.ranges, files)) == [4]
    # print shows the first rows only: the count would be a guess
    assert run_source_task(spark, tmp_path, [source, op("sink.print")], BatchInput(2, 0, batch.ranges, files)) == [None]
    # a rate source's count is its range's
    rate = BatchInput(3, 0, {"words": SourceRange(None, {"rows": 12, "baseMs": 0}, 12)})
    assert run_source_task(spark, tmp_path, [op("source.rate", rows_per_second=100), op("sink.discard")], rate) == [12]


def test_foreach_batch_calls_the_users_function_with_each_batch_and_its_id_keeping_its_state(spark, tmp_path):
    from tests.unit.test_task_runtime import Reports, deploy, op

    seen_file = tmp_path / "seen.jsonl"

    class Writer:
        """What a user's foreachBatch function may keep across batches (a connection, a count)."""

        def __init__(self):
            self.calls = 0

        def __call__(self, df, batch_id):
            self.calls += 1
            values = sorted(r.value for r in df.collect())
            with open(seen_file, "a") as f:
                f.write(f"{batch_id} {self.calls} {values}\n")

    d, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), op("sink.foreach_batch", Writer())],
                  vertex="rate")
    reports = Reports()
    task = StreamTask(d, spark, reports, BatchReports())
    task.give_batch(BatchInput(5, 0, {"rate": SourceRange(None, {"rows": 3, "baseMs": 0}, 3)}))
    task.give_batch(BatchInput(6, 0, {"rate": SourceRange({"rows": 3, "baseMs": 0}, {"rows": 5, "baseMs": 0}, 2)}))
    task.finish()
    task.run()
    assert reports.last[0] is ExecutionState.FINISHED
    assert seen_file.read_text().splitlines() == ["5 1 [0, 1, 2]", "6 2 [3, 4]"]
    failing, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000),
                                   op("sink.foreach_batch", lambda df, batch_id: 1 / 0)], vertex="rate", attempt=1)
    reports = Reports()
    task = StreamTask(failing, spark, reports, BatchReports())
    task.give_batch(BatchInput(0, 0, {"rate": SourceRange(None, {"rows": 3, "baseMs": 0}, 3)}))
    task.run()
    state, failure, _ = reports.last
    assert state is ExecutionState.FAILED and failure.exception_type == "ZeroDivisionError"
    assert "in <lambda>" in failure.traceback  # the user's frame


def test_a_stream_task_runs_its_batches_in_a_session_of_its_own_without_adaptive_execution(spark, tmp_path):
    """As Structured Streaming runs a query: the TaskManager's Spark settings, adaptive query
    execution off (a batch's partitions stay as planned), the TaskManager's session untouched."""
    from tests.unit.test_task_runtime import Reports, deploy, op

    seen, taskmanagers = tmp_path / "seen.json", id(spark)  # the function is pickled: no session in it

    def look(df, batch_id):
        session = df.sparkSession
        seen.write_text(json.dumps([id(session) == taskmanagers, session.conf.get("spark.sql.adaptive.enabled"),
                                    session.conf.get("spark.sql.session.timeZone")]))

    spark.conf.set("spark.sql.adaptive.enabled", "true")
    d, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), op("sink.foreach_batch", look)], vertex="rate")
    reports = Reports()
    task = StreamTask(d, spark, reports, BatchReports())
    task.give_batch(BatchInput(0, 0, {"rate": SourceRange(None, {"rows": 3, "baseMs": 0}, 3)}))
    task.finish()
    task.run()
    assert reports.last[0] is ExecutionState.FINISHED
    assert json.loads(seen.read_text()) == [False, "false", "UTC"]
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"


def test_the_warm_up_runs_sparks_first_jobs_and_leaves_nothing_behind(spark, tmp_path):
    from funke.taskmanager import warmup

    took = warmup.run(spark, str(tmp_path))
    assert took > 0 and list(tmp_path.iterdir()) == []
    # a session that is gone: the warm-up says so and returns, it never raises
    broken = type("Gone", (), {"range": lambda *a: (_ for _ in ()).throw(RuntimeError("stopped"))})()
    assert warmup.run(broken, str(tmp_path)) >= 0


def test_a_cancelled_warm_up_runs_no_spark_job_and_leaves_nothing_behind(spark, tmp_path):
    from funke.taskmanager import warmup

    tracker = spark.sparkContext._jsc.sc().statusTracker()
    before = list(tracker.getJobIdsForTag(warmup.TAG))  # an earlier warm-up's
    job = warmup.WarmUp(spark, str(tmp_path))
    job.cancel()  # a task came first
    assert job.run() >= 0 and job.cancelled
    assert list(tracker.getJobIdsForTag(warmup.TAG)) == before
    assert list(tmp_path.iterdir()) == []


def test_subtasks_of_one_taskmanager_record_the_key_groups_at_once_without_tripping_on_each_other(tmp_path):
    """The subtasks of a keyed operator on one TaskManager are threads of one process: each
    records the operator's key groups with its first state at the same moment. A temporary file
    named after the process alone was shared by them: one renamed or removed it under the other
    (FileNotFoundError failed an interval join's first batch in a full run)."""
    import threading

    from funke.taskmanager.operators import transforms

    errors: list[BaseException] = []
    for round_ in range(30):
        root = str(tmp_path / f"op-{round_}")
        barrier = threading.Barrier(8)

        def record() -> None:
            barrier.wait()
            try:
                transforms._check_key_groups(root, "join", 128)
            except BaseException as exc:  # noqa: BLE001 - any of them is the defect
                errors.append(exc)

        threads = [threading.Thread(target=record) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        transforms._KEY_GROUPS_CHECKED.discard((root, 128))
    assert not errors, errors[:3]
    assert all(not name.endswith(".tmp") for d in tmp_path.iterdir() for name in os.listdir(d))


# ------------------------------------------------------------------------- a small batch's partitions


def test_a_small_batch_runs_in_one_spark_partition_so_its_keyed_aggregates_plan_no_shuffle(spark, tmp_path,
                                                                                          monkeypatch):
    """Source and input alike: up to batchexchange.ONE_PARTITION_LIMIT_BYTES a batch is one Spark
    partition inside its task (a groupBy over it needs no Exchange); a larger one stays spread."""
    import json

    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    seen = tmp_path / "seen.jsonl"

    def look(df, batch_id):
        plan = df.groupBy("k").count()._jdf.queryExecution().executedPlan().toString()
        with open(seen, "a") as f:
            f.write(json.dumps([batch_id, df.rdd.getNumPartitions(), "Exchange" in plan]) + "\n")

    keyed = op("select", exprs=["value", "value % 3 AS k"])
    rows = {"rate": SourceRange(None, {"rows": 12, "baseMs": 0}, 12)}  # 12 rows: 192 bytes by the rate's weight

    def source_batch(batch_id: int) -> None:
        d, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), keyed, op("sink.foreach_batch", look)],
                      vertex="rate", attempt=batch_id)
        task = StreamTask(d, spark, Reports(), BatchReports())
        task.give_batch(BatchInput(batch_id, 0, rows))
        task.finish()
        task.run()

    def input_batch(batch_id: int) -> None:
        producer, _ = deploy(tmp_path, [op("source.rate", rows_per_second=1000), keyed], vertex="rate",
                             outputs=[output("ds", 0)], attempt=batch_id)
        done = BatchReports()
        p_task = StreamTask(producer, spark, Reports(), done)
        p_task.give_batch(BatchInput(batch_id, 0, rows))
        p_task.finish()
        p_task.run()
        (produced,) = done.done[0][1]
        consumer, _ = deploy(tmp_path, [op("sink.foreach_batch", look)], vertex="agg", attempt=batch_id)
        task = StreamTask(consumer, spark, Reports(), BatchReports())
        task.give_batch(BatchInput(batch_id, 0), (gate("ds", range(0, 1), attempts=[batch_id], schema=produced.schema),))
        task.finish()
        task.run()

    source_batch(0)
    input_batch(1)
    monkeypatch.setattr("funke.taskmanager.batchexchange.ONE_PARTITION_LIMIT_BYTES", 12 * 16 - 1)
    source_batch(2)
    assert [json.loads(line) for line in seen.read_text().splitlines()] == [
        [0, 1, False], [1, 1, False], [2, 2, True]]


# ------------------------------------------------------------------- a small batch's fixed costs


def staged_batch(spark, tmp_path, source, rows: int, batch_id: int, target_name: str = "out", **sink_options):
    """Batch `batch_id` of a rate source (`rows` rows) through the operators `source` into a
    Parquet sink (its `options`) on one StreamTask; the names the batch staged, and what the
    sink's target holds once the batch is committed."""
    from tests.unit.test_task_runtime import Reports, deploy

    target = tmp_path / target_name
    sink = OperatorSpec("sink.parquet", "out", {"path": str(target), **({"options": sink_options} if sink_options else {})})
    d, _ = deploy(tmp_path, [*source, sink], vertex="rate", attempt=batch_id)
    reports = Reports()
    task = StreamTask(d, spark, reports, BatchReports())
    end = {"rows": rows, "baseMs": 0} if rows else None
    task.give_batch(BatchInput(batch_id, 0, {"rate": SourceRange(None, end, rows)}))
    task.finish()
    task.run()
    assert reports.last[0] is ExecutionState.FINISHED, reports.last
    staged = sorted(os.listdir(target / ".funke-staging-job1" / str(batch_id) / f"0-{batch_id}"))
    streamsinks.commit_batch(str(target), "job1", batch_id, {0: batch_id})
    return staged, spark.read.parquet(str(target))


RATE = OperatorSpec("source.rate", "rate", {"rows_per_second": 1000})


def test_a_small_batchs_parquet_sink_stages_one_file_written_on_the_taskmanager_with_every_type_intact(
        spark, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    source = [RATE, OperatorSpec("select", "typed", {"exprs": TYPED})]
    staged, read = staged_batch(spark, tmp_path, source, 50, 0)
    assert len(staged) == 1 and staged[0].startswith("part-00000-") and staged[0].endswith(".snappy.parquet"), staged
    rows = sorted(read.collect(), key=lambda r: r.value)
    assert [r.value for r in rows] == list(range(50))
    row = rows[7]
    assert row.timestamp == dt.datetime(1970, 1, 1, 0, 0, 0, 7000)
    assert (row.arr, row.m, row.s.a, row.s.b, row.n, str(row.d), row.day) == \
        ([7, 8], {"v": 7}, 7, "x7", None, "7.00", dt.date(2026, 11, 25))
    assert read.schema.simpleString() == ("struct<value:bigint,k:bigint,timestamp:timestamp,arr:array<bigint>,"
                                          "m:map<string,bigint>,s:struct<a:bigint,b:string>,n:string,"
                                          "d:decimal(10,2),day:date>")
    staged, read = staged_batch(spark, tmp_path, source, 0, 1)  # an empty batch: a file with the schema only
    assert len(staged) == 1 and read.count() == 50
    # What other readers (pyarrow, pandas, the JobMaster's collect and Redis sinks) see of the file
    # is what they see of Spark's: the same Arrow types (INT96 timestamps) and values.
    monkeypatch.setattr("funke.taskmanager.batchexchange.ONE_PARTITION_LIMIT_BYTES", 0)
    staged_by_spark, _ = staged_batch(spark, tmp_path, source, 50, 0, target_name="by-spark")
    assert "_SUCCESS" in staged_by_spark
    ours, sparks = (pq.read_table(tmp_path / name, partitioning=None) for name in ("out", "by-spark"))
    # (nullability aside: Spark's writer marks a column its optimizer folded to a constant required)
    assert [(f.name, f.type) for f in ours.schema] == [(f.name, f.type) for f in sparks.schema]
    assert ours.sort_by("value").to_pylist() == sparks.sort_by("value").to_pylist()


def test_a_sink_with_writer_options_or_a_large_batch_stages_through_sparks_writer(spark, tmp_path, monkeypatch):
    staged, read = staged_batch(spark, tmp_path, [RATE], 20, 0, compression="gzip")  # pyarrow writes gzip too
    assert len(staged) == 1 and staged[0].endswith(".gzip.parquet") and read.count() == 20
    staged, read = staged_batch(spark, tmp_path, [RATE], 20, 1, **{"parquet.page.size": "65536"})  # Spark's option
    assert "_SUCCESS" in staged and read.count() == 40
    ntz = OperatorSpec("select", "ntz", {"exprs": ["value", "CAST(timestamp AS TIMESTAMP_NTZ) AS local"]})
    staged, read = staged_batch(spark, tmp_path, [RATE, ntz], 20, 0, target_name="ntz")  # stored as Spark does
    assert "_SUCCESS" in staged and read.schema["local"].dataType.simpleString() == "timestamp_ntz"
    monkeypatch.setattr("funke.taskmanager.batchexchange.ONE_PARTITION_LIMIT_BYTES", 20 * 16 - 1)
    staged, read = staged_batch(spark, tmp_path, [RATE], 20, 2)
    assert "_SUCCESS" in staged and read.count() == 60


def test_a_partition_written_in_memory_is_read_from_memory_in_its_process_only_while_its_file_is_the_one_written(
        tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from funke.taskmanager import batchexchange

    def write(name: str, values: list[int]) -> list[str]:
        directory = str(tmp_path / name)
        batchexchange.write_in_memory(directory, pa.table({"v": values}), pa.chunked_array([[i % 2 for i in values]]), 2)
        return batchexchange.in_memory_files(directory, 1)

    files = write("p0", [1, 2, 3])
    assert batchexchange.local_table(files).column("v").to_pylist() == [1, 3]
    pq.write_table(pa.table({"v": [9]}), files[0] + ".other")
    os.replace(files[0] + ".other", files[0])  # the file written anew (not by this process's exchange)
    assert batchexchange.local_table(files) is None
    other = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"v": [1]}), other)  # a file this process never wrote as a partition
    assert batchexchange.local_table([str(other)]) is None
    monkeypatch.setattr(batchexchange, "LOCAL_BYTES", 2 * pa.table({"v": [1, 3]}).nbytes)
    first, second, third = write("p1", [1, 3]), write("p2", [5, 7]), write("p3", [9, 11])
    assert batchexchange.local_table(first) is None  # least recently used, gone beyond LOCAL_BYTES
    assert [batchexchange.local_table(f).column("v").to_pylist() for f in (second, third)] == [[5, 7], [9, 11]]
    assert batchexchange.local_table(second + third).column("v").to_pylist() == [5, 7, 9, 11]


def test_a_stream_tasks_python_map_builds_its_udf_once_for_all_its_batches(spark, tmp_path, monkeypatch):
    from tests.unit.test_task_runtime import Reports, deploy, op

    mapped = op("map", lambda v: (v, v * 10), schema="value bigint, tenfold bigint")
    kept = op("filter", lambda row: row.value % 2 == 0)
    target = tmp_path / "out"
    d, _ = deploy(tmp_path, [RATE, op("select", exprs=["value"]), mapped, kept, op("sink.parquet", path=str(target))],
                  vertex="rate")
    reports = Reports()
    task = StreamTask(d, spark, reports, BatchReports())
    udfs = []
    for batch_id in range(3):
        start = {"rows": 10 * batch_id, "baseMs": 0} if batch_id else None
        task.give_batch(BatchInput(batch_id, 0, {"rate": SourceRange(start, {"rows": 10 * batch_id + 10, "baseMs": 0}, 10)}))
    task.finish()
    original = StreamTask._run_chain

    def run_chain(self, chain, ctx, gates):  # what the memo holds after each batch
        produced = original(self, chain, ctx, gates)
        udfs.append({key: entry[2] for key, entry in ctx.memo.items() if isinstance(key, tuple) and key[0] == "mapInArrow"})
        return produced

    monkeypatch.setattr(StreamTask, "_run_chain", run_chain)
    task.run()
    assert reports.last[0] is ExecutionState.FINISHED, reports.last
    assert len(udfs) == 3 and len(udfs[0]) == 2 and all(u is not None for u in udfs[0].values())
    # the same UDF objects, batch after batch (map's and filter's)
    assert all(later[key] is udf for later in udfs[1:] for key, udf in udfs[0].items())
    for batch_id in range(3):
        streamsinks.commit_batch(str(target), "job1", batch_id, {0: 0})
    assert sorted(tuple(r) for r in spark.read.parquet(str(target)).collect()) == [(v, v * 10) for v in range(0, 30, 2)]


def test_a_small_micro_batchs_rate_rows_built_as_arrow_are_the_rows_of_the_rule(spark, tmp_path, monkeypatch):
    import dataclasses

    from funke.taskmanager.operators.context import InputMeter

    r = SourceRange({"rows": 5, "baseMs": 1_000}, {"rows": 40, "baseMs": 1_000}, 35)
    batch = BatchInput(3, 2_000, {"rate": r})
    spec = OperatorSpec("source.rate", "rate", {"rows_per_second": 7})
    rule = RateSource(7, partitions=3)

    def read(subtask: int):
        ctx = dataclasses.replace(context(spark, tmp_path, "rate", subtask, 3, batch), meter=InputMeter())
        df = OPERATORS["source.rate"](ctx, spec)
        return df, [(row.value, row.timestamp.replace(tzinfo=dt.timezone.utc)) for row in df.collect()]

    for subtask in range(3):
        df, got = read(subtask)
        want = [(v, dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)) for v, ms in rule.rows(r, subtask)]
        assert got == want and got
        assert [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields] == \
            [("value", "bigint", False), ("timestamp", "timestamp", False)]  # as a range's rows are
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert plan.startswith("Coalesce 1") and "+- LocalTableScan" in plan  # data, no range, one partition
        assert df.rdd.getNumPartitions() == 1
    monkeypatch.setattr("funke.taskmanager.batchexchange.ONE_PARTITION_LIMIT_BYTES", 16 * 5)  # too large: a range
    df, got = read(0)
    assert "Range" in df._jdf.queryExecution().executedPlan().toString()
    assert got == [(v, dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)) for v, ms in rule.rows(r, 0)]


# ------------------------------------------------------------------- records per operator, per batch


def test_a_running_word_counts_vertices_count_their_records_in_and_out_in_every_batch(spark, tmp_path):
    """The running word count's two vertices (`Source -> FlatMap` --HASH--> `Count -> Sink:
    Parquet`), batch by batch: every operator's records in and out, the keyed vertex's records in
    the rows its gate brought and its records out the rows its sink wrote (the words the batch
    changed, in update mode)."""
    from funke.common.graph.streamingjob import CHECKPOINT, OUTPUT_MODE
    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "a.txt").write_text("to be or\nnot to be\n")  # 2 lines, 6 words, 4 distinct
    (incoming / "b.txt").write_text("be quick\n")  # 1 line, 2 words, 2 distinct
    options = {CHECKPOINT: str(tmp_path / "checkpoint"), OUTPUT_MODE: "update"}
    source = [op("source.stream.text", path=str(incoming)), op("flat_map", str.split, schema="word string")]
    producer, _ = deploy(tmp_path, source, vertex="words", outputs=[output("ds", 0, 1, PartitionerKind.HASH, ["word"])],
                         options=options)
    counting = [op("running_aggregate", keys=["word"], aggregations=["count(1) AS count"]),
                op("sink.parquet", path=str(tmp_path / "out"))]
    consumer, _ = deploy(tmp_path, counting, vertex="count", options=options)
    p_batches, c_batches = BatchReports(), BatchReports()
    p_task = StreamTask(producer, spark, Reports(), p_batches)
    c_task = StreamTask(consumer, spark, Reports(), c_batches)
    threads = [threading.Thread(target=t.run, daemon=True) for t in (p_task, c_task)]
    for t in threads:
        t.start()
    for batch_id, name in enumerate(["a.txt", "b.txt"]):
        p_task.give_batch(BatchInput(batch_id, 0, {"words": SourceRange(None, 1)}, {"words": (name,)}))
        assert p_batches.wait_for(batch_id)
        (produced,) = p_batches.done[-1][1]
        c_task.give_batch(BatchInput(batch_id, 0), (gate("ds", range(0, 1), attempts=[0], schema=produced.schema),))
        assert c_batches.wait_for(batch_id)
    p_task.finish()
    c_task.finish()
    for t in threads:
        t.join(60)

    def records(io):
        return [(o.records_in, o.records_out) for o in io.operators], io.records_in, io.records_out

    # lines read, words emitted into the exchange
    assert [records(io) for io in p_batches.io] == [([(2, 2), (2, 6)], 2, 6), ([(1, 1), (1, 2)], 1, 2)]
    # words in; in update mode the words the batch changed out, and written
    assert [records(io) for io in c_batches.io] == [([(6, 4), (4, 4)], 6, 4), ([(2, 2), (2, 2)], 2, 2)]


def test_the_running_word_counts_chains_are_counted_without_an_observation():
    """Counting costs the word count's batches no observation of its own (each costs a small
    batch about 10 ms): the source's lines are counted as they are read (a file source's own
    count), its words by the exchange's write, the keyed vertex's input by its gate's rows and
    its output by what its sink wrote."""
    from funke.taskmanager import recordcounts

    source = recordcounts.plan(("source.stream.text", "flat_map"), streaming=True, has_outputs=True)
    keyed = recordcounts.plan(("running_aggregate", "sink.parquet"), streaming=True, has_outputs=False)
    assert recordcounts.Count.OBSERVED not in source + keyed


@pytest.mark.parametrize("keep_exchange", [False, True])
def test_bench_streamings_query_counts_every_operators_records_without_an_observation(spark, tmp_path, monkeypatch,
                                                                                     keep_exchange):
    """bench_streaming's query (rate -> select -> map -> per-batch aggregate -> Parquet), in one
    vertex or in two: every operator's records, batch after batch, and not one observation (its
    select is a projection: one row per row)."""
    from funke.taskmanager import recordcounts
    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    observed = []
    real = recordcounts.observe_rows
    monkeypatch.setattr(recordcounts, "observe_rows", lambda ctx, df: observed.append(ctx.vertex_id) or real(ctx, df))
    source = [op("source.rate", rows_per_second=1000), op("select", exprs=["value"]),
              op("map", lambda v: (v, v % 4, v * 2), schema="value bigint, bucket int, doubled bigint")]
    keyed = [op("aggregate", keys=["bucket"], aggregations=["count(1) AS n", "sum(doubled) AS total"]),
             op("sink.parquet", path=str(tmp_path / "out"))]
    if keep_exchange:
        producer, _ = deploy(tmp_path, source, vertex="rate", outputs=[output("ds", 0)])
        consumer, _ = deploy(tmp_path, keyed, vertex="aggregate")
        tasks = [(producer, BatchReports()), (consumer, BatchReports())]
    else:
        one, _ = deploy(tmp_path, source + keyed, vertex="rate")
        tasks = [(one, BatchReports())]
    running = [StreamTask(d, spark, Reports(), batches) for d, batches in tasks]
    threads = [threading.Thread(target=t.run, daemon=True) for t in running]
    for t in threads:
        t.start()
    ranges = [SourceRange(None, {"rows": 10, "baseMs": 0}, 10),
              SourceRange({"rows": 10, "baseMs": 0}, {"rows": 13, "baseMs": 0}, 3)]
    for batch_id, rate_range in enumerate(ranges):
        running[0].give_batch(BatchInput(batch_id, 0, {"rate": rate_range}))
        assert tasks[0][1].wait_for(batch_id)
        if keep_exchange:
            (produced,) = tasks[0][1].done[-1][1]
            running[1].give_batch(BatchInput(batch_id, 0), (gate("ds", range(0, 1), schema=produced.schema),))
            assert tasks[1][1].wait_for(batch_id)
    for t in running:
        t.finish()
    for t in threads:
        t.join(60)
    counts = [[(o.records_in, o.records_out) for o in io.operators] for _, batches in tasks for io in batches.io]
    # 10 rows in 4 buckets, then 3 rows in 3 buckets
    if keep_exchange:
        assert counts == [[(10, 10)] * 3, [(3, 3)] * 3, [(10, 4), (4, 4)], [(3, 3), (3, 3)]]
    else:
        assert counts == [[(10, 10)] * 3 + [(10, 4), (4, 4)], [(3, 3)] * 3 + [(3, 3), (3, 3)]]
    assert observed == []
