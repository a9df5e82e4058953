"""Rescaling a streaming query, the pure parts: the graph at the new parallelism (key groups kept,
receivers left alone, what cannot be done refused whole) and the pause read from the progress
records. A live rescale on a cluster is tests/integration/test_keyed_state.py's."""

from __future__ import annotations

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.streamingjob import rescaled
from funke.common.graph.validation import find_problems
from funke.deploy.client import rescale_pause


def query(receivers: bool = False):
    env = ExecutionEnvironment("q", parallelism=2)
    source = env.read_stream.socket_text("127.0.0.1", 9999) if receivers else env.read_stream.rate(10)
    source.select("1 AS k").key_by("k").count().set_max_parallelism(8).discard()
    env.set_output_mode("update")
    return env.build()


def test_every_vertex_but_receivers_gets_the_new_parallelism_and_keeps_its_key_groups():
    job = query()
    new, problems = rescaled(job, 4)
    assert problems == [] and find_problems(new) == []
    assert {v.parallelism for v in new.vertices} == {4}
    before = {v.id: v.effective_max_parallelism for v in job.vertices}
    assert {v.id: v.max_parallelism for v in new.vertices} == before  # 128 for the source, 8 for the count
    one, problems = rescaled(job, 1, [v.id for v in job.vertices if v.max_parallelism == 8])
    assert problems == [] and sorted(v.parallelism for v in one.vertices) == [1, 2]


def test_what_cannot_be_rescaled_is_refused_with_every_reason():
    job = query()
    _, problems = rescaled(job, 9)
    assert any("exceeds its max parallelism 8" in p for p in problems), problems
    _, problems = rescaled(job, 2, ["nope"])
    assert any("no vertex 'nope'" in p for p in problems)
    assert rescaled(job, 0)[1] == ["parallelism must be a positive integer, got 0"]
    socket = query(receivers=True)
    receiver = next(v.id for v in socket.vertices if v.operators[0].kind == "source.socket")
    new, problems = rescaled(socket, 3)
    assert next(v for v in new.vertices if v.id == receiver).parallelism == 1  # receivers=1: left alone
    assert any("receiver sources" in p for p in rescaled(socket, 3, [receiver])[1])


def per_batch_query(watermark_after: bool = False):
    env = ExecutionEnvironment("one", job_type="streaming")  # parallelism 1: the aggregate chains to the source
    counts = env.read_stream.rate(10).select("value % 3 AS k", "timestamp AS ts").key_by("k").per_batch().aggregate(
        "count(1) AS n", "max(ts) AS ts")
    if watermark_after:
        counts = counts.with_watermark("ts", "1 second")
    counts.write_parquet("/out/counts")
    return env.build()


def test_rescaling_a_query_chained_at_parallelism_1_puts_its_hash_exchange_back():
    job = per_batch_query()
    assert [v.id for v in job.vertices] == ["source-rate"] and job.edges == ()
    new, problems = rescaled(job, 3)
    assert problems == [] and find_problems(new) == []
    assert [(v.id, v.name, v.parallelism, [op.kind for op in v.operators]) for v in new.vertices] == [
        ("source-rate", "Source: rate -> Select", 3, ["source.rate", "select"]),
        ("aggregate", "Aggregate -> Sink: Parquet", 3, ["aggregate", "sink.parquet"])]
    assert "elided_hash_exchange" not in new.vertices[1].operators[0].config
    (edge,) = new.edges
    assert (edge.consumer, edge.partitioner.value, edge.partition_keys, edge.result_partition_type.value) == (
        "aggregate", "HASH", ("k",), "PIPELINED")
    assert [(d.id, d.producer) for d in new.data_sets] == [(edge.data_set, "source-rate")]
    same, problems = rescaled(job, 1)  # still one subtask each: nothing to put back
    assert problems == [] and same.vertices[0].operators == job.vertices[0].operators and same.edges == ()
    _, problems = rescaled(per_batch_query(watermark_after=True), 2)
    assert any("its watermark 'Watermark ts' follows an aggregate chained at parallelism 1" in p for p in problems), problems


def record(batch: int, run: str, batch_time: int, total_delay: int) -> dict:
    return {"batchId": batch, "runId": run, "batchTime": batch_time, "totalDelayMs": total_delay}


def test_the_pause_is_from_the_old_runs_last_commit_to_the_new_runs_first():
    progress = [record(3, "a", 1_000, 200), record(4, "a", 1_500, 300)]
    assert rescale_pause(progress, 3) is None  # the new run has not committed yet
    progress += [record(5, "b", 2_000, 1_400), record(6, "b", 3_500, 200)]
    assert rescale_pause(progress, 3) == {"last_batch_before": 4, "first_batch_after": 5, "pause_ms": 1_600}
    assert rescale_pause(progress, 99) is None
