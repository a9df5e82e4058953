"""How a micro-batch flows through a streaming query's tasks (common/scheduling/batchflow.py): sources first,
a vertex once every subtask of its inputs reported the batch, with the producer attempts and
schema of each input partition; sinks' started/written; stale and repeated reports ignored."""

from __future__ import annotations

import pytest

from funke.common.scheduling.batchflow import BatchFlow, Dispatch, InputRead, SinkStarted, SinkWritten
from funke.common.streaming.checkpoint import SourceRange
from funke.common.graph.executiongraph import Execution, ExecutionAttemptId, SlotId
from funke.common.graph.jobgraph import JobType, JobVertex, OperatorSpec
from funke.common.streaming.sources import BatchInput
from funke.common.graph.deployment import BatchGate
from tests.conformance.graphs import ALL_TO_ALL, PIPELINED, POINTWISE, connect, execution_graph, job_graph


def _vertex(vertex_id: str, parallelism: int, kind: str, **config) -> JobVertex:
    return JobVertex(vertex_id, vertex_id, parallelism, (OperatorSpec(kind, config=config),))


def _flow():
    job = job_graph("flow", [
        _vertex("src", 2, "source.rate", rows_per_second=10),
        _vertex("agg", 3, "union"),
        _vertex("out", 3, "sink.discard"),
        _vertex("raw", 1, "sink.discard"),
    ], [connect("src", "agg", ALL_TO_ALL, PIPELINED), connect("agg", "out", POINTWISE, PIPELINED),
        connect("src", "raw", ALL_TO_ALL, PIPELINED)], JobType.STREAMING)
    graph = execution_graph(job)
    for ejv in graph.vertices.values():
        for ev in ejv.task_vertices:
            ev.current_execution.slot = SlotId(f"tm-{ev.subtask_index % 2}", 0)
    # the source's second subtask runs as attempt 3 (it was restarted before this run)
    src1 = graph.vertices["src"].task_vertices[1]
    src1.current_execution = Execution(src1, 3, 0.0)
    src1.current_execution.slot = SlotId("tm-1", 0)
    return graph, BatchFlow(graph, ["out", "raw"])


def _batch(batch_id: int) -> BatchInput:
    return BatchInput(batch_id, 1000 * batch_id, {"src": SourceRange(None, {"rows": 5, "baseMs": 0}, 5)})


def _attempt(flow: BatchFlow, vertex: str, subtask: int) -> ExecutionAttemptId:
    return ExecutionAttemptId(vertex, subtask, flow.attempts[(vertex, subtask)])


def _dispatched(steps) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in steps:
        if isinstance(s, Dispatch):
            out.setdefault(s.vertex_id, []).extend((s.task_manager_id, t) for t in s.tasks)
    return out


def test_a_batch_starts_at_the_sources_and_moves_on_once_every_producer_subtask_reported():
    graph, flow = _flow()
    steps = flow.start(_batch(0))
    sent = _dispatched(steps)
    assert list(sent) == ["src"]
    assert sorted((tm, t.attempt) for tm, t in sent["src"]) == [
        ("tm-0", ExecutionAttemptId("src", 0, 0)), ("tm-1", ExecutionAttemptId("src", 1, 3))]
    assert all(t.gates == () for _, t in sent["src"])
    assert flow.on_report(_attempt(flow, "src", 0), 0, {"src.to.agg.0": "S1"}) == []  # one of two
    steps = flow.on_report(_attempt(flow, "src", 1), 0, {"src.to.agg.0": "S1", "src.to.raw.2": "S1"})
    sent = _dispatched(steps)
    assert sorted(sent) == ["agg", "raw"]
    # every consumer of the ALL_TO_ALL edges reads both source partitions, at their attempts
    for _, task in sent["agg"] + sent["raw"]:
        (gate,) = task.gates
        assert gate.attempts == (0, 3) and gate.schema == "S1"
    assert SinkStarted(0, "raw") in steps and SinkStarted(0, "out") not in steps
    assert flow.in_flight == [0]


def test_sinks_are_written_when_all_their_subtasks_reported_and_then_the_batch_is_through():
    graph, flow = _flow()
    flow.start(_batch(7))
    for s in range(2):
        flow.on_report(_attempt(flow, "src", s), 7, {})
    steps = flow.on_report(_attempt(flow, "raw", 0), 7, {})
    assert steps == [SinkWritten(7, "raw")]
    steps = []
    for s in range(3):
        steps += flow.on_report(_attempt(flow, "agg", s), 7, {"agg.to.out.1": "S2"})
    sent = _dispatched(steps)
    # POINTWISE at equal parallelism: subtask i of the sink reads partition i of agg
    assert sorted(t.gates for _, t in sent["out"]) == [(BatchGate(0, (0,), "S2"),)] * 3
    assert SinkStarted(7, "out") in steps
    for s in range(2):
        assert flow.on_report(_attempt(flow, "out", s), 7, {}) == []
    assert flow.on_report(_attempt(flow, "out", 2), 7, {}) == [SinkWritten(7, "out")]
    assert flow.in_flight == []
    assert flow.sink_attempts("out") == {0: 0, 1: 0, 2: 0}


def test_stale_repeated_and_unknown_reports_change_nothing():
    graph, flow = _flow()
    flow.start(_batch(1))
    assert flow.on_report(ExecutionAttemptId("src", 1, 2), 1, {}) == []  # an older attempt
    assert flow.on_report(_attempt(flow, "src", 0), 9, {}) == []  # a batch not in flight
    assert flow.on_report(_attempt(flow, "agg", 0), 1, {}) == []  # a batch it was not given
    flow.on_report(_attempt(flow, "src", 0), 1, {})
    assert flow.on_report(_attempt(flow, "src", 0), 1, {}) == []  # again
    assert "agg" not in _dispatched(flow.on_report(_attempt(flow, "src", 0), 1, {}))
    with pytest.raises(ValueError, match="already in flight"):
        flow.start(_batch(1))


def test_two_batches_in_flight_are_kept_apart():
    graph, flow = _flow()
    flow.start(_batch(1))
    flow.start(_batch(2))
    for s in range(2):
        flow.on_report(_attempt(flow, "src", s), 2, {})
    assert flow.on_report(_attempt(flow, "raw", 0), 2, {}) == [SinkWritten(2, "raw")]
    assert flow.in_flight == [1, 2]


def test_sinks_must_be_vertices_of_the_job():
    graph, _ = _flow()
    with pytest.raises(ValueError, match="not vertices"):
        BatchFlow(graph, ["nowhere"])


def test_a_source_vertex_reports_the_rows_its_subtasks_counted_once_all_of_them_read_the_batch():
    graph, flow = _flow()
    flow.start(_batch(2))
    assert InputRead(2, "src", 3) not in flow.on_report(_attempt(flow, "src", 0), 2, {}, input_rows=3)
    assert InputRead(2, "src", 7, (3, 4)) in flow.on_report(_attempt(flow, "src", 1), 2, {}, input_rows=4)
    # a repeated report counts once; a consumer's report is no source's count
    assert flow.on_report(_attempt(flow, "src", 1), 2, {}, input_rows=4) == []
    assert not [s for s in flow.on_report(_attempt(flow, "raw", 0), 2, {}, input_rows=9) if isinstance(s, InputRead)]
    # one subtask that did not count makes the source's count unknown
    flow.start(_batch(3))
    flow.on_report(_attempt(flow, "src", 0), 3, {}, input_rows=None)
    assert InputRead(3, "src", None, (None, 5)) in flow.on_report(_attempt(flow, "src", 1), 3, {}, input_rows=5)
