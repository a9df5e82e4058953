"""Records per operator without Spark: how each operator of a chain is counted
(`funke.taskmanager.recordcounts.plan`), the counts on the wire, added up over a streaming task's
batches, in an HA progress record, in the REST API's shapes (Flink's vertex metrics) and in the
TaskManager's Prometheus metrics. What a run on Spark counts is tests/unit/test_task_runtime.py's
and test_stream_operators.py's."""

from __future__ import annotations

import pytest

from funke.common.graph.executiongraph import ExecutionAttemptId, OperatorIo, TaskIo, add_operator_io
from funke.common.task.taskexecutorstate import TaskKey
from funke.common.wire.codec import io_from_proto, io_to_proto
from funke.jobmanager import restviews
from funke.common.scheduling.scheduler import FinishedSubtask
from funke.common.states import ExecutionState, Transition
from funke.jobmanager.highavailability import progress_record, read_progress
from funke.taskmanager.metrics import TaskMetrics
from funke.taskmanager.recordcounts import Count, plan
from funke.v1 import job_pb2

C = Count


@pytest.mark.parametrize("kinds, streaming, outputs, expected", [
    # from_range -> map -> filter -> collect: the filter's out is what the collect sink wrote
    (("source.range", "map", "filter", "sink.collect"), False, False, (C.OBSERVED, C.SAME, C.NEXT, C.WRITTEN)),
    # into an exchange: the tail's out is its result partitions' rows
    (("source.range", "where", "flat_map"), False, True, (C.OBSERVED, C.OBSERVED, C.PRODUCED)),
    # a where behind a file source: no count between them (Spark pushes the filter into the scan)
    (("source.parquet", "where", "sink.collect"), False, False, (C.FILES, C.NEXT, C.WRITTEN)),
    (("source.delta", "where", "select"), False, True, (C.FILES, C.OBSERVED, C.PRODUCED)),
    (("source.csv", "where", "sink.parquet"), False, False, (C.NONE, C.NEXT, C.WRITTEN)),
    (("source.csv", "select", "sink.parquet"), False, False, (C.OBSERVED, C.NEXT, C.WRITTEN)),
    # a stream source: its batch's count; the keyed vertex of a word count
    (("source.stream.text", "flat_map"), True, True, (C.SOURCE, C.PRODUCED)),
    (("running_aggregate", "sink.parquet"), True, False, (C.NEXT, C.WRITTEN)),
    (("watermark", "window_aggregate", "sink.delta"), True, False, (C.SAME, C.NEXT, C.WRITTEN)),
    # a streaming print shows some rows, foreach_batch runs what the user runs, noop nothing: no
    # observation, only what is known without one
    (("source.rate", "where", "sink.print"), True, False, (C.SOURCE, C.NONE, C.WRITTEN)),
    (("source.rate", "where", "map", "sink.foreach_batch"), True, False, (C.SOURCE, C.NONE, C.SAME, C.WRITTEN)),
    (("source.range", "where", "sink.noop"), False, False, (C.NONE, C.NONE, C.WRITTEN)),
    # a select is a projection (its records in) unless Spark's plan of it says otherwise
    (("source.rate", "select", "sink.print"), True, False, (C.SOURCE, C.PROJECTED, C.WRITTEN)),
    # bench_streaming's query, in one vertex and in two
    (("source.rate", "select", "map", "aggregate", "sink.parquet"), True, False,
     (C.SOURCE, C.PROJECTED, C.SAME, C.NEXT, C.WRITTEN)),
    (("source.rate", "select", "map"), True, True, (C.SOURCE, C.AHEAD, C.PRODUCED)),
    (("aggregate", "sink.parquet"), True, False, (C.NEXT, C.WRITTEN)),
    # what operators that pass every record on emitted, an operator before them emitted
    (("source.range", "where", "map", "watermark", "sink.json"), False, False,
     (C.OBSERVED, C.AHEAD, C.SAME, C.NEXT, C.WRITTEN)),
    (("source.range", "where", "map", "flat_map"), False, True, (C.OBSERVED, C.OBSERVED, C.SAME, C.PRODUCED)),
    # a bounded job's print prints every row
    (("source.range", "select", "sink.print"), False, False, (C.OBSERVED, C.NEXT, C.WRITTEN)),
    # a transform's function may leave its input out: nothing before it is observed
    (("source.range", "where", "transform", "where", "sink.collect"), False, False,
     (C.NONE, C.NONE, C.OBSERVED, C.NEXT, C.WRITTEN)),
    # a vertex of only a sink, and a chain with neither a sink nor outputs
    (("sink.parquet",), True, False, (C.WRITTEN,)),
    (("source.range", "select"), False, False, (C.NONE, C.NONE)),  # nothing runs
])
def test_how_each_operator_of_a_chain_is_counted(kinds, streaming, outputs, expected):
    assert plan(kinds, streaming=streaming, has_outputs=outputs) == expected


def test_counts_add_up_over_batches_and_a_count_measured_in_none_stays_unmeasured():
    a = (OperatorIo(3, 2), OperatorIo(2, None))
    b = (OperatorIo(1, 1), OperatorIo(None, None), OperatorIo(5, 5))
    assert add_operator_io(a, b) == (OperatorIo(4, 3), OperatorIo(2, None), OperatorIo(5, 5))
    assert add_operator_io((), a) == a and add_operator_io(a, ()) == a


def test_operator_counts_cross_the_wire_unmeasured_ones_unset_and_hostile_ones_read_as_zero():
    io = TaskIo(10, 4, 0, 0, 0.5, operators=(OperatorIo(10, 10), OperatorIo(10, None), OperatorIo(None, 4)))
    message = io_to_proto(io)
    assert [o.HasField("records_out") for o in message.operators] == [True, False, True]
    assert io_from_proto(message) == io
    assert io_from_proto(io_to_proto(TaskIo(1, 2))).operators == ()
    message.operators[0].records_in = -7
    for _ in range(2000):  # more than a chain can hold: the rest is not read
        message.operators.add(records_in=1)
    decoded = io_from_proto(message)
    assert decoded.operators[0] == OperatorIo(0, 10) and len(decoded.operators) == 1000


def test_a_progress_record_keeps_the_operator_counts_and_reads_one_written_without_them():
    io = TaskIo(10, 4, 1, 2, 0.5, operators=(OperatorIo(10, 10), OperatorIo(10, None)))
    done = (Transition(ExecutionState.CREATED, ExecutionState.FINISHED, 2.0, ""),)
    record = progress_record(FinishedSubtask("v", 0, 1, (), None, 1.0, done, io))
    [back] = read_progress([record])
    assert back.io is not None and back.io.operators == io.operators
    record["io"] = record["io"][:5]  # an earlier leader's record
    [old] = read_progress([record])
    assert old.io == TaskIo(10, 4, 1, 2, 0.5)


def vertex_with_counts() -> job_pb2.Vertex:
    v = job_pb2.Vertex(id="count", name="Count -> Sink: Parquet", parallelism=3, operators=["Count", "Sink: Parquet"])
    for i, (state, counted) in enumerate([(job_pb2.EXECUTION_STATE_RUNNING, [(6, 4), (4, 4)]),
                                          (job_pb2.EXECUTION_STATE_FINISHED, [(2, 2), (None, 2)]),
                                          (job_pb2.EXECUTION_STATE_FAILED, [(99, 99), (99, 99)])]):
        sub = v.subtasks.add(subtask_index=i, name=f"Count (#{i})")
        sub.current.state = state
        sub.current.io.records_in, sub.current.io.records_out = counted[0][0], counted[-1][1]
        for records_in, records_out in counted:
            o = sub.current.io.operators.add()
            if records_in is not None:
                o.records_in = records_in
            o.records_out = records_out
    return v


def test_the_rest_api_adds_up_each_operators_records_over_the_subtasks_that_report():
    v = vertex_with_counts()
    ios = [s.current.io for s in v.subtasks if s.current.state != job_pb2.EXECUTION_STATE_FAILED]
    assert restviews.operators(v, ios) == [
        {"index": 0, "name": "Count", "metrics": {"read-records": 8, "write-records": 6}},
        {"index": 1, "name": "Sink: Parquet", "metrics": {"read-records": 4, "write-records": 6}}]
    assert restviews.operators(v, []) == [
        {"index": 0, "name": "Count", "metrics": {"read-records": None, "write-records": None}},
        {"index": 1, "name": "Sink: Parquet", "metrics": {"read-records": None, "write-records": None}}]


def test_a_vertexs_metrics_by_flinks_identifiers():
    metrics = restviews.vertex_metrics(vertex_with_counts())
    assert metrics["0.numRecordsIn"] == "6" and metrics["1.numRecordsOut"] == "2"
    assert metrics["0.Count.numRecordsOut"] == "4" and metrics["0.Sink__Parquet.numRecordsIn"] == "4"
    assert "1.Sink__Parquet.numRecordsIn" not in metrics  # not measured
    assert not any(k.startswith("2.") for k in metrics)  # a failed attempt reports nothing
    assert restviews.metric_name("Source: a.b, c" + "x" * 100) == "Source__a_b__c" + "x" * 66
    twice = job_pb2.Vertex(id="v", name="Map -> Map", operators=["Map", "Map"])
    sub = twice.subtasks.add(subtask_index=0)
    sub.current.state = job_pb2.EXECUTION_STATE_FINISHED
    sub.current.io.operators.add(records_in=1, records_out=1)
    sub.current.io.operators.add(records_in=1, records_out=0)
    assert restviews.vertex_metrics(twice)["0.Map_1.numRecordsOut"] == "0"


def test_the_taskmanagers_prometheus_metrics_have_each_operators_records():
    metrics = TaskMetrics("tm-1", lambda: (2, 1, 1))
    key = TaskKey("job", ExecutionAttemptId("count", 0, 0))
    names = ("Count", "Sink: Parquet")
    metrics.batch_done(key, "Count (1/1)", TaskIo(6, 4, operators=(OperatorIo(6, 4), OperatorIo(4, 4))), names)
    metrics.batch_done(key, "Count (1/1)", TaskIo(2, 2, operators=(OperatorIo(2, 2), OperatorIo(None, 2))), names)
    families = {f.name: f for f in metrics.collect()}
    samples = {(s.labels["operator_id"], s.labels["operator_name"]): s.value
               for s in families["funke_taskmanager_job_task_operator_numRecordsIn"].samples}
    assert samples == {("count/0", "Count"): 8, ("count/1", "Sink: Parquet"): 4}
    out = [s for s in families["funke_taskmanager_job_task_operator_numRecordsOut"].samples]
    assert {s.labels["operator_id"]: s.value for s in out} == {"count/0": 6, "count/1": 6}
    assert out[0].labels["job_id"] == "job" and out[0].labels["tm_id"] == "tm-1"
