"""JobGraph <-> protobuf: round trips, defaults for unset fields, and WireError for junk."""

from __future__ import annotations

import json

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from funke.common.graph.jobgraph import (
    Artifact,
    DistributionPattern,
    FailoverStrategyKind,
    IntermediateDataSet,
    JobConfiguration,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    OperatorSpec,
    PartitionerKind,
    RestartStrategyConfig,
    ResultPartitionType,
)
from funke.common.graph.operators import CATALOGUE
from funke.common.wire.codec import (
    WireError,
    job_graph_from_proto,
    job_graph_to_proto,
    operator_from_proto,
    operator_to_proto,
    vertex_from_proto,
    vertex_to_proto,
)
from funke.v1 import jobgraph_pb2 as pb


def through_the_wire(job: JobGraph) -> JobGraph:
    data = job_graph_to_proto(job).SerializeToString()
    return job_graph_from_proto(pb.JobGraph.FromString(data))


def full_graph() -> JobGraph:
    """Every field of every message set to a non-default value."""
    left = JobVertex(
        id="left",
        name="Left source",
        parallelism=2,
        operators=(OperatorSpec("source.parquet", "read orders", {"path": "/data/orders", "columns": ["id", "v"]}),),
        max_parallelism=64,
        slot_sharing_group="sources",
        co_location_group="co-1",
    )
    right = JobVertex(
        id="right",
        name="Right source",
        parallelism=3,
        operators=(
            OperatorSpec("source.range", config={"end": 100, "step": 1.5, "nested": {"b": None, "a": True}}),
            OperatorSpec("map", "double", {"schema": "id long"}, function=b"\x80\x05cloudpickled\x00"),
        ),
        co_location_group="co-1",
    )
    join = JobVertex(
        id="join",
        name="Join -> Sink",
        parallelism=4,
        operators=(
            OperatorSpec("join", config={"on": ["id"], "how": "inner"}),
            OperatorSpec("sink.collect", "collect"),
        ),
        max_parallelism=0,  # presence: 0 is not "unset"
    )
    return JobGraph(
        job_id="job-0001",
        name="orders join",
        job_type=JobType.STREAMING,
        vertices=(left, right, join),
        data_sets=(IntermediateDataSet("ds-left", "left"), IntermediateDataSet("ds-right", "right")),
        edges=(
            JobEdge(
                id="e-left",
                data_set="ds-left",
                consumer="join",
                distribution_pattern=DistributionPattern.ALL_TO_ALL,
                partitioner=PartitionerKind.HASH,
                partition_keys=("id", "region"),
                result_partition_type=ResultPartitionType.PIPELINED,
                input_index=0,
            ),
            JobEdge(
                id="e-right",
                data_set="ds-right",
                consumer="join",
                distribution_pattern=DistributionPattern.POINTWISE,
                partitioner=PartitionerKind.FORWARD,
                result_partition_type=ResultPartitionType.BLOCKING,
                input_index=1,
            ),
        ),
        configuration=JobConfiguration(
            restart_strategy=RestartStrategyConfig("fixed-delay", {"attempts": "3", "delay": "1 s"}),
            failover_strategy=FailoverStrategyKind.FULL,
            slot_request_timeout_s=12.5,
            options={"spark.sql.shuffle.partitions": "8", "funke.tag": "x"},
        ),
        artifacts=(
            Artifact("udfs.py", content=b"def f(x):\n    return x\n"),
            Artifact("lookup.csv", uri="file:///data/lookup.csv"),
        ),
    )


# ---- round trips ----


def test_full_graph_round_trips() -> None:
    job = full_graph()
    assert through_the_wire(job) == job


def test_full_graph_decodes_to_tuples_and_sets_every_field() -> None:
    m = job_graph_to_proto(full_graph())
    join = next(v for v in m.vertices if v.id == "join")
    assert join.HasField("max_parallelism") and join.max_parallelism == 0
    assert not join.HasField("co_location_group")
    assert m.edges[0].partitioner == pb.PARTITIONER_HASH
    assert m.edges[1].input_index == 1
    assert m.configuration.failover_strategy == "full"
    assert m.configuration.HasField("restart_strategy")

    back = through_the_wire(full_graph())
    assert isinstance(back.vertices, tuple) and isinstance(back.edges, tuple)
    assert isinstance(back.vertices[0].operators, tuple)
    assert back.edges[0].partition_keys == ("id", "region")


def test_config_json_is_canonical() -> None:
    m = operator_to_proto(OperatorSpec("select", config={"b": [1, 2], "a": {"y": 1, "x": "é"}}))
    assert m.config_json == '{"a":{"x":"\\u00e9","y":1},"b":[1,2]}'


def test_vertex_and_operator_round_trip_on_their_own() -> None:
    v = full_graph().vertex("right")
    assert vertex_from_proto(pb.JobVertex.FromString(vertex_to_proto(v).SerializeToString())) == v
    op = v.operators[1]
    assert operator_from_proto(operator_to_proto(op)) == op


def test_unset_optionals_stay_unset() -> None:
    job = JobGraph("j", (JobVertex("v", "v", 1),))
    back = through_the_wire(job)
    assert back == job
    assert back.vertices[0].max_parallelism is None
    assert back.vertices[0].co_location_group is None
    assert back.configuration.restart_strategy is None
    assert back.configuration.slot_request_timeout_s is None


def test_present_but_empty_optionals_stay_present() -> None:
    job = JobGraph(
        "j",
        (JobVertex("v", "v", 1, co_location_group=""),),
        configuration=JobConfiguration(restart_strategy=RestartStrategyConfig("", {}), slot_request_timeout_s=0.0),
    )
    back = through_the_wire(job)
    assert back.vertices[0].co_location_group == ""
    assert back.configuration.restart_strategy == RestartStrategyConfig("", {})
    assert back.configuration.slot_request_timeout_s == 0.0


# ---- hypothesis ----

texts = st.text(max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=10,
)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
string_maps = st.dictionaries(texts, texts, max_size=3)

operators = st.builds(
    OperatorSpec,
    kind=st.sampled_from(sorted(CATALOGUE)) | texts,
    name=texts,
    config=st.dictionaries(texts, json_values, max_size=4),
    function=st.binary(max_size=16),
)
vertices = st.builds(
    JobVertex,
    id=texts,
    name=texts,
    parallelism=int32,
    operators=st.lists(operators, max_size=3).map(tuple),
    max_parallelism=st.none() | int32,
    # "" is the one value that does not survive: the wire reads it as "default".
    slot_sharing_group=st.text(min_size=1, max_size=12),
    co_location_group=st.none() | texts,
)
edges = st.builds(
    JobEdge,
    id=texts,
    data_set=texts,
    consumer=texts,
    distribution_pattern=st.sampled_from(DistributionPattern),
    partitioner=st.sampled_from(PartitionerKind),
    partition_keys=st.lists(texts, max_size=3).map(tuple),
    result_partition_type=st.sampled_from(ResultPartitionType),
    input_index=int32,
)
configurations = st.builds(
    JobConfiguration,
    restart_strategy=st.none() | st.builds(RestartStrategyConfig, kind=texts, options=string_maps),
    failover_strategy=st.none() | st.sampled_from(FailoverStrategyKind),
    slot_request_timeout_s=st.none() | st.floats(allow_nan=False),
    options=string_maps,
)
job_graphs = st.builds(
    JobGraph,
    name=texts,
    vertices=st.lists(vertices, max_size=4).map(tuple),
    data_sets=st.lists(st.builds(IntermediateDataSet, id=texts, producer=texts), max_size=4).map(tuple),
    edges=st.lists(edges, max_size=4).map(tuple),
    job_type=st.sampled_from(JobType),
    configuration=configurations,
    artifacts=st.lists(st.builds(Artifact, name=texts, content=st.binary(max_size=16), uri=texts), max_size=3).map(
        tuple
    ),
    job_id=texts,
)


@settings(max_examples=200, deadline=None)
@given(job_graphs)
def test_generated_graphs_round_trip(job: JobGraph) -> None:
    assert through_the_wire(job) == job


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_junk_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    try:
        m = pb.JobGraph.FromString(data)
    except DecodeError:
        return  # not a message at all: the RPC layer's problem, not ours
    try:
        job_graph_from_proto(m)
    except WireError:
        pass


enum_numbers = st.sampled_from([0, 1, 2, 3, 4]) | int32
wire_vertices = st.builds(
    pb.JobVertex,
    id=texts,
    parallelism=int32,
    operators=st.lists(
        st.builds(pb.OperatorSpec, kind=texts, config_json=texts | json_values.map(json.dumps)), max_size=2
    ),
    slot_sharing_group=texts,
)
wire_edges = st.builds(
    pb.JobEdge,
    id=texts,
    distribution_pattern=enum_numbers,
    partitioner=enum_numbers,
    result_partition_type=enum_numbers,
    input_index=int32,
)
wire_graphs = st.builds(
    pb.JobGraph,
    job_type=enum_numbers,
    vertices=st.lists(wire_vertices, max_size=3),
    edges=st.lists(wire_edges, max_size=3),
    configuration=st.builds(
        pb.JobConfiguration,
        failover_strategy=st.sampled_from(["", "region", "full", "REGION"]) | texts,
        options=string_maps,
    ),
)


@settings(max_examples=300, deadline=None)
@given(wire_graphs)
def test_any_client_message_decodes_or_raises_wire_error(m: pb.JobGraph) -> None:
    try:
        job = job_graph_from_proto(pb.JobGraph.FromString(m.SerializeToString()))
    except WireError as e:
        assert e.problems
        return
    assert isinstance(job, JobGraph)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | json_values.map(json.dumps))
def test_any_config_json_decodes_or_raises_wire_error(config_json: str) -> None:
    try:
        op = operator_from_proto(pb.OperatorSpec(kind="map", config_json=config_json))
    except WireError:
        return
    assert isinstance(op.config, dict)


# ---- unset (UNSPECIFIED / empty) fields ----


def test_unspecified_enums_and_empty_fields_decode_to_the_model_defaults() -> None:
    m = pb.JobGraph(
        name="bare",
        vertices=[pb.JobVertex(id="v", name="v", parallelism=1, operators=[pb.OperatorSpec(kind="union")])],
        data_sets=[pb.IntermediateDataSet(id="d", producer_vertex_id="v")],
        edges=[pb.JobEdge(id="e", data_set_id="d", consumer_vertex_id="v")],
    )
    assert m.job_type == pb.JOB_TYPE_UNSPECIFIED
    job = job_graph_from_proto(pb.JobGraph.FromString(m.SerializeToString()))

    assert job.job_type is JobType.BATCH
    edge = job.edges[0]
    assert edge.distribution_pattern is DistributionPattern.ALL_TO_ALL
    assert edge.partitioner is PartitionerKind.REBALANCE
    assert edge.result_partition_type is ResultPartitionType.BLOCKING
    vertex = job.vertices[0]
    assert vertex.slot_sharing_group == "default"
    assert vertex.operators[0].config == {}  # config_json never set
    assert job.configuration == JobConfiguration()
    assert job.configuration.failover_strategy is None  # the cluster default applies


def test_enums_map_by_name() -> None:
    for kind in PartitionerKind:
        edge = JobEdge("e", "d", "c", partitioner=kind)
        m = job_graph_to_proto(JobGraph("j", (), edges=(edge,))).edges[0]
        assert pb.Partitioner.Name(m.partitioner) == f"PARTITIONER_{kind.name}"


# ---- junk on the wire ----


def bad_config_graph(config_json: str) -> pb.JobGraph:
    return pb.JobGraph(
        name="bad",
        vertices=[
            pb.JobVertex(
                id="mapper",
                parallelism=1,
                operators=[
                    pb.OperatorSpec(kind="source.range", config_json='{"end":3}'),
                    pb.OperatorSpec(kind="map", name="to upper", config_json=config_json),
                ],
            )
        ],
    )


@pytest.mark.parametrize(
    "config_json, why",
    [
        ("{not json", "not valid JSON"),
        ('{"a": 1', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('"text"', "must be a JSON object, got str"),
        ("null", "must be a JSON object, got NoneType"),
        ('{"x": NaN}', "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),  # nesting deeper than the recursion limit
        ('{"n": ' + "9" * 5000 + "}", "not valid JSON"),  # beyond Python's int digit limit
        ('{"end": 1e999}', "out of range for a double"),  # Python alone would read it as inf
        ('{"rows": [[-1e400]]}', "out of range for a double"),
    ],
)
def test_bad_config_json_raises_wire_error_naming_vertex_and_operator(config_json: str, why: str) -> None:
    with pytest.raises(WireError) as info:
        job_graph_from_proto(bad_config_graph(config_json))
    message = str(info.value)
    assert "vertex 'mapper'" in message
    assert "operator 1 'to upper'" in message
    assert why in message
    assert isinstance(info.value, ValueError)


def test_every_problem_is_listed_at_once() -> None:
    m = bad_config_graph("[]")
    m.vertices[0].operators[0].config_json = "{"
    m.edges.add(id="e", partitioner=99, distribution_pattern=42)
    m.job_type = 7
    m.configuration.failover_strategy = "sideways"
    with pytest.raises(WireError) as info:
        job_graph_from_proto(m)
    problems = info.value.problems
    assert len(problems) == 6, problems
    message = str(info.value)
    assert "operator 0" in message and "operator 1" in message
    assert "edge 'e': unknown Partitioner value 99" in message
    assert "edge 'e': unknown DistributionPattern value 42" in message
    assert "job: unknown JobType value 7" in message
    assert "unknown failover_strategy 'sideways'" in message


def test_vertex_from_proto_raises_wire_error_for_bad_config() -> None:
    with pytest.raises(WireError, match="vertex 'mapper'"):
        vertex_from_proto(bad_config_graph("1").vertices[0])


# ---- models that cannot go on the wire ----


@pytest.mark.parametrize(
    "vertex, why",
    [
        (JobVertex("v", "v", 1, (OperatorSpec("map", "m", {"f": {1, 2}}),)), "not JSON-serialisable"),
        (JobVertex("v", "v", 1, (OperatorSpec("map", "m", {"x": float("nan")}),)), "not JSON-serialisable"),
        (JobVertex("v", "v", 1, (OperatorSpec("map", "m", ["not", "a", "mapping"]),)), "must be a mapping"),  # type: ignore[arg-type]
        (JobVertex("v", "v", 2**31), "cannot be encoded"),
        (JobVertex("v", "v", 1, max_parallelism=-(2**40)), "cannot be encoded"),
    ],
)
def test_unencodable_models_raise_wire_error(vertex: JobVertex, why: str) -> None:
    with pytest.raises(WireError, match=why) as info:
        job_graph_to_proto(JobGraph("j", (vertex,)))
    assert "vertex 'v'" in str(info.value)


def test_a_micro_batch_survives_the_wire_and_a_broken_one_is_refused():
    from funke.common.streaming.checkpoint import SourceRange
    from funke.common.wire.codec import batch_from_proto, run_batch_to_proto
    from funke.common.graph.executiongraph import ExecutionAttemptId
    from funke.common.streaming.sources import BatchInput

    batch = BatchInput(7, 123, {"rate": SourceRange({"rows": 1, "baseMs": 5}, {"rows": 9, "baseMs": 5}, 8),
                                "files": SourceRange(None, 2)}, {"files": ("a.csv", "b.csv")})
    msg = run_batch_to_proto("job-1", "tm#1", batch, [(ExecutionAttemptId("v", 1, 2), [(0, [3, 4], "{}")])])
    assert batch_from_proto(msg) == batch
    assert list(msg.tasks[0].gates[0].producer_attempts) == [3, 4] and msg.registration_id == "tm#1"
    for breakage in ({"ranges_json": "{not json"}, {"ranges_json": '{"v": {"end": 1}}'}, {"batch_id": -1}):
        broken = type(msg)()
        broken.CopyFrom(msg)
        for field, value in breakage.items():
            setattr(broken, field, value)
        with pytest.raises(ValueError):
            batch_from_proto(broken)


def test_a_batch_report_carries_its_counted_input_rows_and_a_negative_count_is_no_count():
    from funke.common.wire.codec import report_from_proto, report_to_proto
    from funke.common.graph.deployment import TaskReport
    from funke.common.graph.executiongraph import ExecutionAttemptId
    from funke.common.states import ExecutionState

    report = TaskReport("job-1", ExecutionAttemptId("src", 0, 1), ExecutionState.RUNNING, batch_id=4, input_rows=812)
    assert report_from_proto(report_to_proto(report)) == report
    uncounted = TaskReport("job-1", ExecutionAttemptId("src", 0, 1), ExecutionState.RUNNING, batch_id=4)
    assert not report_to_proto(uncounted).HasField("input_rows")
    assert report_from_proto(report_to_proto(uncounted)).input_rows is None
    hostile = report_to_proto(report)
    hostile.input_rows = -3
    decoded = report_from_proto(hostile)
    assert decoded.input_rows is None and decoded.batch_id == 4  # the batch still counts as reported


def test_a_micro_batchs_tasks_and_their_gates_decode_as_they_were_encoded():
    from funke.common.graph.deployment import BatchGate, BatchTask
    from funke.common.graph.executiongraph import ExecutionAttemptId
    from funke.common.streaming.sources import BatchInput
    from funke.common.wire.codec import batch_tasks_from_proto, run_batch_to_proto

    tasks = [(ExecutionAttemptId("sink", 1, 2), [(0, [3, -1], "{}"), (1, [], "")]), (ExecutionAttemptId("src", 0, 0), [])]
    msg = run_batch_to_proto("job-1", "tm#1", BatchInput(7, 123), tasks)
    assert batch_tasks_from_proto(msg) == (
        BatchTask(ExecutionAttemptId("sink", 1, 2), (BatchGate(0, (3, -1), "{}"), BatchGate(1, (), ""))),
        BatchTask(ExecutionAttemptId("src", 0, 0)))


def test_a_released_partition_and_a_task_answer_survive_the_wire():
    from funke.common.graph.deployment import PartitionRef
    from funke.common.graph.executiongraph import ExecutionAttemptId
    from funke.common.wire.codec import (attempt_to_proto, partition_ref_from_proto, partition_ref_to_proto,
                                         task_result_to_proto)

    ref = PartitionRef("ds-1", 3, 2)
    assert partition_ref_from_proto(partition_ref_to_proto(ref)) == ref
    attempt = attempt_to_proto(ExecutionAttemptId("v", 0, 1))
    accepted = task_result_to_proto(attempt, None)
    assert accepted.accepted and accepted.error == "" and accepted.attempt == attempt
    refused = task_result_to_proto(attempt, "no slot")
    assert not refused.accepted and refused.error == "no slot"


def test_every_job_status_decodes_as_it_was_encoded_and_an_unknown_one_is_refused():
    from funke.common.states import JobStatus
    from funke.common.wire.codec import job_status_from_proto, job_status_to_proto

    assert all(job_status_from_proto(job_status_to_proto(s)) is s for s in JobStatus)
    with pytest.raises(ValueError):
        job_status_from_proto(999)
