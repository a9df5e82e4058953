"""Keyed state: the state store's files, and the running aggregate's merge, run the
way a Spark Python worker runs it (Arrow batches in, Arrow batches out) but without Spark."""

from __future__ import annotations

import collections
import os

import pyarrow as pa
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.streamingjob import OUTPUT_MODE, query_problems
from funke.common.graph.validation import JobGraphInvalid
from funke.common.streaming import state
from funke.common.streaming.keygroups import key_group_range
from funke.common.streaming.state import MissingState, files_to_delete, load_plan
from funke.taskmanager.operators import keyedstate
from funke.taskmanager.operators.keyedstate import store

# ---------------------------------------------------------------------------- the store's files


def test_a_version_is_the_newest_snapshot_at_or_before_it_and_every_delta_after():
    names = [f"{v}.delta" for v in range(1, 26)] + ["10.snapshot", "20.snapshot", "7.delta.123.tmp"]
    assert load_plan(names, 25) == state.LoadPlan(20, (21, 22, 23, 24, 25))
    assert load_plan(names, 20) == state.LoadPlan(20, ())
    assert load_plan(names, 9) == state.LoadPlan(None, tuple(range(1, 10)))
    assert load_plan(names, 0) == state.LoadPlan(None, ())
    assert load_plan([], 7) == state.LoadPlan(None, ())  # an operator without state yet


def test_a_missing_delta_is_an_error_that_names_it_not_an_empty_state():
    names = ["1.delta", "2.delta", "4.delta"]
    with pytest.raises(MissingState, match="3"):
        load_plan(names, 4)
    with pytest.raises(MissingState, match="older than the oldest"):
        load_plan(["5.delta", "6.delta"], 3)


def test_retention_deletes_only_what_no_kept_version_needs():
    names = [f"{v}.delta" for v in range(1, 31)] + ["10.snapshot", "20.snapshot", "30.snapshot"]
    gone = files_to_delete(names, 30, retain=15)  # versions 16..30 stay loadable: snapshot 10 and on
    assert gone == sorted(f"{v}.delta" for v in range(1, 10))
    kept = [n for n in names if n not in gone]
    for v in range(16, 31):
        load_plan(kept, v)  # raises if something needed went
    assert files_to_delete(names, 30, retain=100) == []


# ---------------------------------------------------------------------------- the running aggregate in a worker


STATE = pa.schema([("word", pa.string()), ("p0", pa.int64()), ("p1_sum", pa.float64()), ("p1_count", pa.int64())])
OUT = pa.schema([("word", pa.string()), ("count", pa.int64()), ("mean", pa.float64())])


def batch_of(rows: list[tuple[str, int]], owned: range) -> pa.RecordBatch:
    """What Spark hands the worker for one batch: per word its partials (count, and n's sum and
    count for avg), with its key group, then a marker row per owned group."""
    per_word: dict[str, list[int]] = collections.defaultdict(list)
    for word, n in rows:
        per_word[word].append(n)
    words = sorted(per_word)
    groups = [hash_group(w) for w in words] + list(owned)
    n = len(words)
    return pa.RecordBatch.from_arrays([
        pa.array(words + [None] * len(owned), pa.string()),
        pa.array([len(per_word[w]) for w in words] + [None] * len(owned), pa.int64()),
        pa.array([float(sum(per_word[w])) for w in words] + [None] * len(owned), pa.float64()),
        pa.array([len(per_word[w]) for w in words] + [None] * len(owned), pa.int64()),
        pa.array(groups, pa.int32()),
        pa.array([False] * n + [True] * len(owned)),
    ], names=[*STATE.names, state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])


def hash_group(word: str) -> int:
    return sum(word.encode()) % 8


def run_batch(root, batch_id, rows, mode="update", retain=100):
    aggregates = [("count", ("p0",)), ("avg", ("p1_sum", "p1_count"))]
    fn = keyedstate.running_aggregate_batches(str(root), ["word"], aggregates, batch_id, mode, retain, STATE, OUT,
                                              range(8))
    out = pa.Table.from_batches(list(fn(iter([batch_of(rows, range(8))]))), schema=OUT)
    return {r["word"]: (r["count"], r["mean"]) for r in out.to_pylist()}


def forget_workers_memory():
    store._loaded().clear()


def test_running_totals_cover_every_batch_so_far_in_update_and_complete_mode(tmp_path):
    feed = [[("a", 1), ("b", 2), ("a", 3)], [("b", 4)], [], [("c", 5), ("a", 6)]]
    seen: list[tuple[str, int]] = []
    for batch_id, rows in enumerate(feed):
        update = run_batch(tmp_path / "u", batch_id, rows, "update")
        complete = run_batch(tmp_path / "c", batch_id, rows, "complete")
        seen += rows
        totals = {w: (len(ns), sum(ns) / len(ns)) for w in {w for w, _ in seen}
                  for ns in [[n for x, n in seen if x == w]]}
        assert complete == totals, f"batch {batch_id}"
        assert update == {w: totals[w] for w in {w for w, _ in rows}}, f"batch {batch_id}"


def test_a_worker_that_starts_fresh_reads_the_same_state_from_the_files(tmp_path):
    for batch_id in range(23):  # past two snapshots
        run_batch(tmp_path, batch_id, [("a", batch_id), (f"w{batch_id % 3}", 1)])
    warm = run_batch(tmp_path, 23, [("a", 1)], "complete")
    forget_workers_memory()
    # batch 23 again, as after a failure: from version 23 on disk, not from the memory that has 24
    cold = run_batch(tmp_path, 23, [("a", 1)], "complete")
    assert warm == cold and warm["a"] == (24, (sum(range(23)) + 1) / 24)


def test_a_worker_holding_an_older_version_catches_up_by_the_deltas_after_it_not_the_whole_group(
        tmp_path, monkeypatch):
    run_batch(tmp_path, 0, [("a", 1), ("b", 2)])
    run_batch(tmp_path, 1, [("a", 3)])
    this_worker = dict(store._loaded())  # holds version 2 of every group
    forget_workers_memory()  # another worker runs batches 2 and 3 ...
    run_batch(tmp_path, 2, [("b", 4), ("c", 5)])
    run_batch(tmp_path, 3, [("a", 6)])
    store._loaded().update(this_worker)  # ... and this one gets batch 4: it reads only deltas 3 and 4

    def whole(*args):
        raise AssertionError("the group was read whole from its files")

    monkeypatch.setattr(store, "version_rows", whole)
    assert run_batch(tmp_path, 4, [("c", 1)], "complete") == {
        "a": (3, 10 / 3), "b": (2, 3.0), "c": (2, 3.0)}


def test_a_batch_run_again_never_sees_what_its_failed_attempt_wrote(tmp_path):
    run_batch(tmp_path, 0, [("a", 1)])
    run_batch(tmp_path, 1, [("a", 100), ("b", 1)])  # attempt 1 of batch 1: its version 2 is written ...
    # ... but the batch failed before its commit; it runs again over the same input, in a worker
    # that holds version 2 in memory, and reads version 1
    again = run_batch(tmp_path, 1, [("a", 100), ("b", 1)])
    assert again == {"a": (2, 50.5), "b": (1, 1.0)}


def test_a_wiped_store_is_not_answered_from_a_workers_memory(tmp_path):
    root = tmp_path / "store"
    run_batch(root, 0, [("a", 1)])
    run_batch(root, 1, [("a", 1)])
    for dirpath, _, files in os.walk(root, topdown=False):
        for f in files:
            os.remove(os.path.join(dirpath, f))
    # a new query with the same checkpoint location starts over at batch 0 ... and batch 1 of it
    # must not be answered with the old query's version 1 still in memory
    run_batch(root, 0, [("z", 1)])
    assert run_batch(root, 1, [("a", 1)], "complete") == {"a": (1, 1.0), "z": (1, 1.0)}


def test_snapshots_and_retention_keep_the_store_small(tmp_path):
    for batch_id in range(40):
        run_batch(tmp_path, batch_id, [("a", 1)], retain=5)
    files = sorted(os.listdir(tmp_path / state.group_dir_name(hash_group("a"))))
    assert "40.snapshot" in files and "30.snapshot" in files and "1.delta" not in files
    assert len(files) <= 2 * state.SNAPSHOT_EVERY + 2, files


# ---------------------------------------------------------------------------- the DSL and the graph's checks


def running_query(mode: str | None = "update", per_batch: bool = False, aggregate: str | None = None):
    env = ExecutionEnvironment("running", parallelism=2)
    keyed = env.read_stream.rate(10).select("value % 3 AS k", "value").key_by("k")
    if per_batch:
        keyed = keyed.per_batch()
    out = keyed.aggregate(aggregate) if aggregate else keyed.count()
    out.discard()
    if mode:
        env.set_output_mode(mode)
    return env


def test_a_keyed_count_over_a_stream_is_running_and_per_batch_says_so_explicitly():
    running = running_query().build()
    kinds = [op.kind for v in running.vertices for op in v.operators]
    assert "running_aggregate" in kinds and "count" not in kinds
    per_batch = running_query(None, per_batch=True).build()
    kinds = [op.kind for v in per_batch.vertices for op in v.operators]
    assert "running_aggregate" not in kinds and "aggregate" in kinds  # count behind its combiner


def test_a_running_aggregate_without_an_output_mode_is_refused_naming_both_ways_out():
    with pytest.raises(JobGraphInvalid) as caught:
        running_query(None).build()
    text = str(caught.value)
    assert "streaming.output-mode" in text and "per_batch().count()" in text, text


def test_a_running_aggregate_that_cannot_keep_partials_is_refused_at_the_call():
    with pytest.raises(ValueError, match="count, sum, min, max and avg"):
        running_query(aggregate="percentile(value, 0.5) AS p")
    running_query(aggregate="avg(value) AS mean").build()
    running_query(per_batch=True, aggregate="percentile(value, 0.5) AS p", mode=None).build()


def test_complete_mode_without_a_running_aggregate_and_concurrent_batches_with_state_are_refused():
    env = ExecutionEnvironment("stateless", parallelism=1)
    env.read_stream.rate(10).discard()
    env.set_output_mode("complete")
    with pytest.raises(JobGraphInvalid, match="no running aggregate"):
        env.build()
    env = running_query()
    env.set_option("streaming.concurrent-jobs", "2")
    with pytest.raises(JobGraphInvalid, match="one batch at a time"):
        env.build()


def test_a_wire_graph_with_a_running_aggregate_not_fed_by_its_keys_lists_the_problem():
    job = running_query().build()
    (edge,) = [e for e in job.edges if any(op.kind == "running_aggregate" for v in job.vertices
                                            if v.id == e.consumer for op in v.operators)]
    import dataclasses
    bad = dataclasses.replace(job, edges=tuple(dataclasses.replace(e, partition_keys=("value",)) if e is edge else e
                                               for e in job.edges))
    problems = query_problems(bad)
    assert any("must be HASH-partitioned on its keys ['k']" in p for p in problems), problems
    assert bad.configuration.options[OUTPUT_MODE] == "update"


def test_the_running_word_count_example_builds_a_running_query_that_survives_the_wire():
    from funke.common.wire.codec import job_graph_from_proto, job_graph_to_proto
    from tests.unit.test_dsl import load_example

    module = load_example("running_wordcount")
    assert "funke submit examples/running_wordcount.py" in module.__doc__
    for mode in ("update", "complete"):
        job = module.build(["--input", "in", "--mode", mode])
        assert [op.kind for v in job.vertices for op in v.operators] == [
            "source.stream.text", "flat_map", "running_aggregate", "sink.print"]
        assert job.configuration.options[OUTPUT_MODE] == mode
        assert job_graph_from_proto(job_graph_to_proto(job)) == job



def test_a_streaming_deployment_routes_hash_exchanges_by_the_consumers_key_groups_and_a_bounded_one_does_not(tmp_path):
    import asyncio

    from funke.common.configuration import ClusterConfiguration
    from funke.common.graph.executiongraph import SlotId
    from funke.common.wire.codec import DeploymentEncoder, deployment_from_proto, job_graph_to_proto
    from funke.jobmanager.dispatcher import Dispatcher

    streaming = running_query()
    for t in streaming._transformations:
        if t.kind == "running_aggregate":
            t.max_parallelism = 60
    bounded = ExecutionEnvironment("bounded", parallelism=2)
    bounded.from_collection([(1,)], "k bigint").key_by("k").count().discard()

    async def key_groups_of_the_exchange(env) -> list[int]:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path / "data")))
        dispatcher.start()
        try:
            jm = dispatcher.jobs[await dispatcher.submit(job_graph_to_proto(env.build()))]
            found = []
            for ev in jm.graph.execution_vertices():
                d = jm.scheduler.deployments.deployment(ev, SlotId("tm", 0))
                for out in d.outputs:
                    message = DeploymentEncoder("/data", {}, []).encode(d)
                    decoded = deployment_from_proto(message, "tm", d.vertex)
                    assert decoded.outputs == d.outputs  # the wire keeps the key groups
                    found.append(out.key_groups)
            return found
        finally:
            await dispatcher.stop()

    assert asyncio.run(key_groups_of_the_exchange(streaming)) == [60, 60]  # two producer subtasks
    assert set(asyncio.run(key_groups_of_the_exchange(bounded))) == {0}


def test_a_checkpoint_whose_state_has_other_key_groups_is_refused_at_submit_saying_why(tmp_path):
    from funke.common.graph.validation import ValidationContext
    from funke.jobmanager.streaming.submit import submit_problems

    checkpoint = tmp_path / "checkpoint"
    env = running_query()
    env.set_checkpoint_location(str(checkpoint))
    for t in env._transformations:
        if t.kind == "running_aggregate":
            t.max_parallelism = 64
    job = env.build()
    (vertex,) = [v for v in job.vertices if v.operators[0].kind == "running_aggregate"]
    context = ValidationContext(data_dir=str(tmp_path / "data"))
    assert submit_problems(job, context) == []  # no state yet
    root = checkpoint / "state" / vertex.id / "op-0"
    root.mkdir(parents=True)
    (root / state.METADATA).write_text(state.metadata_text(64))
    assert submit_problems(job, context) == []  # the same key groups
    (root / state.METADATA).write_text(state.metadata_text(128))
    (problem,) = submit_problems(job, context)
    assert "128 key groups" in problem.message and "set_max_parallelism(128)" in problem.message, problem


# ---------------------------------------------------------------------------- drop_duplicates


ROWS = pa.schema([("id", pa.int64()), ("payload", pa.string())])
KEY = pa.schema([("id", pa.int64())])


def dedup_batch(root, batch_id, rows):
    fn = keyedstate.deduplicate_batches(str(root), ["id"], batch_id, 100, KEY, ROWS, range(4))
    groups = [i % 4 for i, _ in rows] + list(range(4))
    batch = pa.RecordBatch.from_arrays([
        pa.array([i for i, _ in rows] + [None] * 4, pa.int64()),
        pa.array([p for _, p in rows] + [None] * 4, pa.string()),
        pa.array(groups, pa.int32()),
        pa.array([False] * len(rows) + [True] * 4),
    ], names=["id", "payload", state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])
    return pa.Table.from_batches(list(fn(iter([batch]))), schema=ROWS).to_pylist()


def test_drop_duplicates_over_a_stream_keeps_a_key_once_across_batches_and_a_rerun_batch_sees_the_same(tmp_path):
    assert dedup_batch(tmp_path, 0, [(1, "a"), (2, "b")]) == [{"id": 1, "payload": "a"}, {"id": 2, "payload": "b"}]
    assert dedup_batch(tmp_path, 1, [(2, "again"), (3, "c")]) == [{"id": 3, "payload": "c"}]
    forget_workers_memory()
    assert dedup_batch(tmp_path, 1, [(2, "again"), (3, "c")]) == [{"id": 3, "payload": "c"}]  # batch 1 re-run
    assert dedup_batch(tmp_path, 2, [(3, "c"), (1, "a"), (5, "e")]) == [{"id": 5, "payload": "e"}]


def test_drop_duplicates_is_stateful_over_a_stream_and_plain_in_a_bounded_job():
    env = ExecutionEnvironment("dedup", parallelism=2)
    env.read_stream.rate(10).select("value % 5 AS id", "value").drop_duplicates("id").discard()
    job = env.build()  # append mode: a deduplicated stream needs no other output mode
    (vertex,) = [v for v in job.vertices if v.operators[0].kind == "deduplicate"]
    assert [(e.partitioner.value, e.partition_keys) for e in job.edges if e.consumer == vertex.id] == [("HASH", ("id",))]
    bounded = ExecutionEnvironment("dedup", parallelism=2)
    bounded.from_collection([(1,)], "id bigint").drop_duplicates("id").discard()
    assert "deduplicate" in [op.kind for v in bounded.build().vertices for op in v.operators]
    with pytest.raises(ValueError, match="needs the columns"):
        bounded.from_collection([(1,)], "id bigint").drop_duplicates()
    env.set_option("streaming.concurrent-jobs", "3")
    with pytest.raises(JobGraphInvalid, match="one batch at a time"):
        env.build()


def test_rows_of_a_key_group_the_subtask_does_not_own_are_an_error_not_state_written_twice(tmp_path):
    fn = keyedstate.deduplicate_batches(str(tmp_path), ["id"], 0, 100, KEY, ROWS, range(0, 2))
    batch = pa.RecordBatch.from_arrays([pa.array([7], pa.int64()), pa.array(["x"]), pa.array([3], pa.int32()),
                                        pa.array([False])],
                                       names=["id", "payload", state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])
    with pytest.raises(RuntimeError, match=r"key group\(s\) \[3\] reached the subtask owning key groups 0..1"):
        list(fn(iter([batch])))
    assert not os.listdir(tmp_path)


def test_the_task_measures_the_state_a_batch_left_from_the_files_it_wrote(tmp_path):
    run_batch(tmp_path, 0, [("a", 1), ("b", 2), ("a", 3)])
    run_batch(tmp_path, 1, [("c", 1), ("a", 1)])
    after = keyedstate.measure(str(tmp_path), range(8), 2)
    assert (after.rows_total, after.rows_updated, after.rows_removed) == (3, 2, 0)
    written = sum(os.path.getsize(tmp_path / state.group_dir_name(g) / "2.delta") for g in range(8))
    assert after.bytes_written == written > 0
    assert after.bytes_on_disk == sum(os.path.getsize(p) for p in tmp_path.glob("kg-*/*")) > written
    assert after.update_ms > 0 and after.commit_ms > 0
    # the estimate of the state in memory: three short string keys and their partials, a few hundred bytes each
    assert 3 * 100 < after.memory_bytes < 8 * 2000
    assert keyedstate.measure(str(tmp_path), range(8), 5) == state.StateMetrics()  # a version not written
    for batch_id in range(2, 10):  # version 10 is a snapshot too: written, and counted
        run_batch(tmp_path, batch_id, [("a", 1)])
    tenth = keyedstate.measure(str(tmp_path), range(8), 10)
    assert tenth.bytes_written == sum(os.path.getsize(p) for p in tmp_path.glob("kg-*/10.*"))
    assert tenth.bytes_written > sum(os.path.getsize(p) for p in tmp_path.glob("kg-*/10.delta"))


def test_state_metrics_cross_the_wire_and_hostile_numbers_read_as_zero():
    from funke.common.graph.executiongraph import TaskIo
    from funke.common.wire.codec import io_from_proto, io_to_proto

    io = TaskIo(1, 2, 3, 4, 0.5, state.StateMetrics(7, 3, 0, 512, 2048, 4.5, 9000, 1.25))
    assert io_from_proto(io_to_proto(io)) == io
    assert io_from_proto(io_to_proto(TaskIo(1, 2, 3, 4, 0.5))).state is None
    message = io_to_proto(io)
    message.state.rows_total, message.state.update_ms, message.state.memory_bytes = -5, float("nan"), -1
    assert io_from_proto(message).state == state.StateMetrics(0, 3, 0, 512, 2048, 0.0, 0, 1.25)


# ---------------------------------------------------------------------------- a running reduce


PAIRS = pa.schema([("word", pa.string()), ("n", pa.int64())])
PAIR_STATE = pa.schema([("__funke_key_0", pa.string()), ("word", pa.string()), ("n", pa.int64())])


def reduce_batch(root, batch_id, rows, fn, mode="update"):
    import cloudpickle

    run = keyedstate.running_reduce_batches(cloudpickle.dumps(fn), str(root), ["word"], batch_id, mode, 100,
                                            PAIR_STATE, PAIRS, range(8), "operator 'Reduce' (running_reduce)")
    batch = pa.RecordBatch.from_arrays([
        pa.array([w for w, _ in rows] + [None] * 8, pa.string()),
        pa.array([n for _, n in rows] + [None] * 8, pa.int64()),
        pa.array([hash_group(w) for w, _ in rows] + list(range(8)), pa.int32()),
        pa.array([False] * len(rows) + [True] * 8),
    ], names=["word", "n", state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])
    return {r["word"]: r["n"] for r in pa.Table.from_batches(list(run(iter([batch]))), schema=PAIRS).to_pylist()}


def add(a, b):
    return (a.word, a.n + b.n)


def test_a_running_reduce_folds_every_batch_so_far_and_calls_fn_alike_warm_or_cold(tmp_path):
    def traced(a, b):  # runs unpickled, as in a worker: it tells by raising
        if (type(a).__name__, type(b).__name__) != ("Row", "Row"):
            raise TypeError(f"fn got {type(a).__name__}, {type(b).__name__}")
        return {"word": a.word, "n": a.n + b.n}

    assert reduce_batch(tmp_path, 0, [("a", 1), ("b", 2), ("a", 3)], traced) == {"a": 4, "b": 2}
    assert reduce_batch(tmp_path, 1, [("a", 10)], traced) == {"a": 14}
    forget_workers_memory()
    assert reduce_batch(tmp_path, 2, [("b", 1)], traced, "complete") == {"a": 14, "b": 3}  # b's state from the files


def test_a_running_reduce_that_changes_the_key_is_told_so(tmp_path):
    reduce_batch(tmp_path, 0, [("a", 1)], add)
    with pytest.raises(ValueError, match="a keyed reduce keeps the key"):
        reduce_batch(tmp_path, 1, [("a", 1)], lambda a, b: ("z", 0))


# ---------------------------------------------------------------------------- funke state


def test_the_jobmanager_reads_a_keyed_operators_state_as_the_rows_the_query_emits(tmp_path):
    from funke.common import aggregates
    from funke.common.graph.jobgraph import JobVertex, OperatorSpec
    from funke.jobmanager.streaming.state import keyed_state_table

    p = aggregates.PARTIAL_PREFIX
    partials = pa.schema([("word", pa.string()), (f"{p}0", pa.int64()), (f"{p}1_sum", pa.float64()),
                          (f"{p}1_count", pa.int64())])
    root = tmp_path / "state" / "totals" / "op-0"
    vertex = JobVertex("totals", "totals", 2, (OperatorSpec("running_aggregate", "Aggregate", {
        "keys": ["word"], "aggregations": ["count(1) AS n", "avg(v) AS `the mean`"]}),), max_parallelism=8)
    for batch_id, rows in enumerate([[("a", 1), ("b", 2), ("a", 3)], [("b", 4), ("c", 0)]]):
        for subtask in range(2):  # each subtask writes its own groups
            owned = key_group_range(8, 2, subtask)
            fn = keyedstate.running_aggregate_batches(str(root), ["word"], [("count", (f"{p}0",)), (
                "avg", (f"{p}1_sum", f"{p}1_count"))], batch_id, "update", 100, partials, OUT, owned)
            mine = [(w, n) for w, n in rows if hash_group(w) in owned]
            batch = batch_of(mine, owned).rename_columns([*partials.names, state.KEY_GROUP_COLUMN,
                                                          keyedstate.MARKER_COLUMN])
            list(fn(iter([batch])))
    table, matching = keyed_state_table(vertex, str(tmp_path), 2, [], 1000)
    assert table.column_names == ["word", "n", "the mean"] and matching == 3
    assert sorted(table.to_pylist(), key=lambda r: r["word"]) == [
        {"word": "a", "n": 2, "the mean": 2.0}, {"word": "b", "n": 2, "the mean": 3.0}, {"word": "c", "n": 1, "the mean": 0.0}]
    one, matching = keyed_state_table(vertex, str(tmp_path), 1, ["b"], 1000)  # after batch 0
    assert one.to_pylist() == [{"word": "b", "n": 1, "the mean": 2.0}] and matching == 1
    few, matching = keyed_state_table(vertex, str(tmp_path), 2, [], 2)
    assert few.num_rows == 2 and matching == 3
    nothing, matching = keyed_state_table(vertex, str(tmp_path / "elsewhere"), 2, [], 1000)
    assert nothing.num_rows == 0 and matching == 0
