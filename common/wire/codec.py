"""The wire form of every model: conversion between funke's model types and `funke.v1` messages.

Owns how each model value maps to its protobuf message and back, and nothing else: no validation
(that is `graph/validation.py`'s job, on the decoded model) and no RPC. Sections: the JobGraph
(client -> JobManager); the states, attempts and failures the JobManager shows of jobs (what it
builds from its scheduler is `jobviews.py`); the deployment contract of `graph/deployment.py`
(JobManager <-> TaskManager); the TaskManager's slot report. Both processes use this one module, so
the two ends of a message cannot drift apart.

Rules:
- enums map by name; a proto value is the Python name with the enum's prefix
  (PARTITIONER_HASH <-> PartitionerKind.HASH); the proto's UNSPECIFIED (0) decodes to the
  model's default, so a client that leaves a field unset gets what the Python API would give it.
- `OperatorSpec.config` travels as canonical JSON (sorted keys, no spaces) in `config_json`.
- optional scalars and messages keep their presence: None <-> unset.
- sequences decode to tuples, maps to dicts.
- a producer attempt of an input gate travels as an int: n for `Available(n)`, -1 - n for
  `Awaiting(n)`.

Decoding a JobGraph treats the message as untrusted input: anything a client can put on the wire
that the model cannot represent raises `WireError`, never another exception, and lists every such
problem at once, each naming what it is about (like `validation.JobGraphInvalid`). Encoding raises
`WireError` as well, for a model that cannot be put on the wire (a config that is not JSON, an
int that does not fit int32, ...).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from google.protobuf.timestamp_pb2 import Timestamp

from funke.common.graph.deployment import (
    NO_OPTIONS,
    Available,
    BatchGate,
    BatchTask,
    GateState,
    InputGateDeployment,
    PartitionRef,
    PartitionUpdate,
    ProducedPartition,
    ProducerAttempt,
    ResultPartitionSpec,
    TaskDeployment,
    TaskReport,
    VertexDeployment,
    available,
    awaiting,
)
from funke.common.graph.executiongraph import (
    Execution,
    ExecutionAttemptId,
    FailureInfo,
    OperatorIo,
    SlotId,
    TaskIo,
)
from funke.common.graph.validation import MAX_OPERATORS_PER_VERTEX
from funke.common.graph.jobgraph import (
    DEFAULT_SLOT_SHARING_GROUP,
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
from funke.common.ids import echo
from funke.common.states import ExecutionState, JobStatus, RescaleState, Transition
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import BatchInput
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.state import StateLineage, StateMetrics
from funke.v1 import cluster_pb2 as cluster_pb
from funke.v1 import job_pb2 as job_pb
from funke.v1 import jobgraph_pb2 as pb

if TYPE_CHECKING:
    from funke.common.scheduling.rescale import Rescale


class WireError(ValueError):
    """A message that does not decode to a model (or a model that does not encode)."""

    def __init__(self, problems: Sequence[str]):
        self.problems: tuple[str, ...] = tuple(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            listing = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{len(self.problems)} problem(s) on the wire:\n{listing}"
        super().__init__(message)


# Problems found while decoding are appended here rather than raised, so that one decode
# reports all of them; the public functions raise once at the end.
_Problems = list[str]


def _raise_if_any(problems: _Problems) -> None:
    if problems:
        raise WireError(problems)


# ---- enums ----

class _EnumMap:
    """A Python enum <-> proto enum by member name, built (and checked) once at import."""

    def __init__(self, py: type[enum.Enum], proto: EnumTypeWrapper, prefix: str, default: enum.Enum):
        self.py = py
        self.proto = proto
        self.default = default
        self.to_number: dict[enum.Enum, int] = {}
        self.from_number: dict[int, enum.Enum] = {}
        for name, number in proto.items():
            if number == 0:
                # UNSPECIFIED: what a client gets by leaving the field alone.
                self.from_number[0] = default
                continue
            member = py[name.removeprefix(prefix)]  # a KeyError here: the two enums drifted
            self.to_number[member] = number
            self.from_number[number] = member
        missing = [m.name for m in py if m not in self.to_number]
        if missing or 0 not in self.from_number:
            # Programming error, not user input: the .proto and graph/jobgraph.py disagree.
            raise RuntimeError(f"{py.__name__} and proto {proto.DESCRIPTOR.name} disagree: {missing}")

    def encode(self, member: enum.Enum, subject: str, field_name: str) -> int:
        try:
            return self.to_number[member]
        except (KeyError, TypeError):  # TypeError: an unhashable junk value
            raise WireError([f"{subject}: {field_name} {member!r} is not a {self.py.__name__}"]) from None

    def decode(self, number: int, subject: str, field_name: str, problems: _Problems) -> enum.Enum:
        # proto3 enums are open: a newer client may send a number this build does not know.
        member = self.from_number.get(number)
        if member is None:
            problems.append(f"{subject}: unknown {self.proto.DESCRIPTOR.name} value {number} for {field_name}")
            return self.default
        return member


_JOB_TYPE = _EnumMap(JobType, pb.JobType, "JOB_TYPE_", JobType.BATCH)
_DISTRIBUTION = _EnumMap(
    DistributionPattern, pb.DistributionPattern, "DISTRIBUTION_PATTERN_", DistributionPattern.ALL_TO_ALL
)
_PARTITIONER = _EnumMap(PartitionerKind, pb.Partitioner, "PARTITIONER_", PartitionerKind.REBALANCE)
_PARTITION_TYPE = _EnumMap(
    ResultPartitionType, pb.ResultPartitionType, "RESULT_PARTITION_TYPE_", ResultPartitionType.BLOCKING
)


# ---- encoding helpers ----

T = TypeVar("T")


def _encoding(subject: str, build: Callable[[], T]) -> T:
    """Runs `build`, turning protobuf's complaints about a field value into a WireError that
    names the subject (protobuf raises TypeError for a wrong type, ValueError for an int out of
    range or a str that is not valid UTF-8)."""
    try:
        return build()
    except WireError:
        raise
    except (TypeError, ValueError) as e:
        raise WireError([f"{subject}: cannot be encoded: {e}"]) from None


def _vertex_subject(vertex_id: str | None) -> str:
    return f"vertex {echo(vertex_id)}" if vertex_id is not None else "vertex"


def _operator_subject(vertex_id: str | None, index: int | None, kind: str, name: str) -> str:
    where = f"operator {index} " if index is not None else "operator "
    label = f"{echo(name)} (kind {echo(kind)})" if name else f"kind {echo(kind)}"
    if vertex_id is None:
        return where + label
    return f"{_vertex_subject(vertex_id)}, {where}{label}"


# ---- operators ----


def operator_to_proto(op: OperatorSpec, *, vertex_id: str | None = None, index: int | None = None) -> pb.OperatorSpec:
    """`vertex_id` and `index` only make error messages say where the operator is."""
    subject = _operator_subject(vertex_id, index, op.kind, op.name)
    if not isinstance(op.config, Mapping):
        raise WireError([f"{subject}: config must be a mapping, got {type(op.config).__name__}"])
    try:
        # allow_nan=False: NaN/Infinity are not JSON, and config_json must be readable by any
        # JSON parser, not just Python's.
        config_json = json.dumps(dict(op.config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise WireError([f"{subject}: config is not JSON-serialisable: {e}"]) from None
    return _encoding(
        subject,
        lambda: pb.OperatorSpec(kind=op.kind, name=op.name, config_json=config_json, function=op.function),
    )


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # Python reads 1e999 as inf; no JSON parser elsewhere would, and no operator can use it.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range for a double")
    return value


def _operator_from_proto(m: pb.OperatorSpec, vertex_id: str | None, index: int | None, problems: _Problems) -> OperatorSpec:
    config: dict[str, object] = {}
    # proto3 cannot tell an unset string from "": an operator without configuration (union,
    # sink.print, ...) sent by a client that never set the field has the empty object.
    if m.config_json:
        subject = _operator_subject(vertex_id, index, m.kind, m.name)
        try:
            parsed = json.loads(m.config_json, parse_constant=_reject_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as e:
            # ValueError covers JSONDecodeError, NaN/Infinity and ints beyond Python's digit
            # limit; RecursionError a hostile nesting depth.
            problems.append(f"{subject}: config_json is not valid JSON: {str(e)[:200]}")
        else:
            if isinstance(parsed, dict):
                config = parsed
            else:
                problems.append(f"{subject}: config_json must be a JSON object, got {type(parsed).__name__}")
    return OperatorSpec(kind=m.kind, name=m.name, config=config, function=m.function)


def operator_from_proto(
    m: pb.OperatorSpec, *, vertex_id: str | None = None, index: int | None = None
) -> OperatorSpec:
    """`vertex_id` and `index` only make error messages say where the operator is."""
    problems: _Problems = []
    op = _operator_from_proto(m, vertex_id, index, problems)
    _raise_if_any(problems)
    return op


# ---- vertices ----


def vertex_to_proto(v: JobVertex) -> pb.JobVertex:
    operators = [operator_to_proto(op, vertex_id=v.id, index=i) for i, op in enumerate(v.operators)]

    def build() -> pb.JobVertex:
        m = pb.JobVertex(
            id=v.id,
            name=v.name,
            parallelism=v.parallelism,
            operators=operators,
            slot_sharing_group=v.slot_sharing_group,
        )
        # Assigning only when present keeps None distinct from 0 / "" on the wire.
        if v.max_parallelism is not None:
            m.max_parallelism = v.max_parallelism
        if v.co_location_group is not None:
            m.co_location_group = v.co_location_group
        return m

    return _encoding(_vertex_subject(v.id), build)


def _vertex_from_proto(m: pb.JobVertex, problems: _Problems) -> JobVertex:
    return JobVertex(
        id=m.id,
        name=m.name,
        parallelism=m.parallelism,
        operators=tuple(_operator_from_proto(op, m.id, i, problems) for i, op in enumerate(m.operators)),
        max_parallelism=m.max_parallelism if m.HasField("max_parallelism") else None,
        slot_sharing_group=m.slot_sharing_group or DEFAULT_SLOT_SHARING_GROUP,
        co_location_group=m.co_location_group if m.HasField("co_location_group") else None,
    )


def vertex_from_proto(m: pb.JobVertex) -> JobVertex:
    problems: _Problems = []
    v = _vertex_from_proto(m, problems)
    _raise_if_any(problems)
    return v


# ---- data sets, edges ----


def data_set_to_proto(d: IntermediateDataSet) -> pb.IntermediateDataSet:
    return _encoding(f"data set {d.id!r}", lambda: pb.IntermediateDataSet(id=d.id, producer_vertex_id=d.producer))


def _data_set_from_proto(m: pb.IntermediateDataSet) -> IntermediateDataSet:
    return IntermediateDataSet(id=m.id, producer=m.producer_vertex_id)


def edge_to_proto(e: JobEdge) -> pb.JobEdge:
    subject = f"edge {e.id!r}"
    distribution = _DISTRIBUTION.encode(e.distribution_pattern, subject, "distribution_pattern")
    partitioner = _PARTITIONER.encode(e.partitioner, subject, "partitioner")
    partition_type = _PARTITION_TYPE.encode(e.result_partition_type, subject, "result_partition_type")
    return _encoding(
        subject,
        lambda: pb.JobEdge(
            id=e.id,
            data_set_id=e.data_set,
            consumer_vertex_id=e.consumer,
            distribution_pattern=distribution,
            partitioner=partitioner,
            partition_keys=e.partition_keys,
            result_partition_type=partition_type,
            input_index=e.input_index,
        ),
    )


def _edge_from_proto(m: pb.JobEdge, problems: _Problems) -> JobEdge:
    subject = f"edge {echo(m.id)}"
    return JobEdge(
        id=m.id,
        data_set=m.data_set_id,
        consumer=m.consumer_vertex_id,
        distribution_pattern=_DISTRIBUTION.decode(m.distribution_pattern, subject, "distribution_pattern", problems),
        partitioner=_PARTITIONER.decode(m.partitioner, subject, "partitioner", problems),
        partition_keys=tuple(m.partition_keys),
        result_partition_type=_PARTITION_TYPE.decode(
            m.result_partition_type, subject, "result_partition_type", problems
        ),
        input_index=m.input_index,
    )


# ---- configuration, artifacts ----


def _configuration_to_proto(c: JobConfiguration) -> pb.JobConfiguration:
    subject = "job configuration"
    if c.failover_strategy is not None and not isinstance(c.failover_strategy, FailoverStrategyKind):
        raise WireError([f"{subject}: failover_strategy {c.failover_strategy!r} is not a FailoverStrategyKind"])

    def build() -> pb.JobConfiguration:
        m = pb.JobConfiguration(failover_strategy=c.failover_strategy.value if c.failover_strategy else "",
                                options=dict(c.options))
        if c.restart_strategy is not None:
            m.restart_strategy.CopyFrom(
                pb.RestartStrategy(type=c.restart_strategy.kind, options=dict(c.restart_strategy.options))
            )
        if c.slot_request_timeout_s is not None:
            m.slot_request_timeout_seconds = c.slot_request_timeout_s
        return m

    return _encoding(subject, build)


def _configuration_from_proto(m: pb.JobConfiguration, problems: _Problems) -> JobConfiguration:
    failover = None  # the cluster default
    if m.failover_strategy:
        try:
            failover = FailoverStrategyKind(m.failover_strategy)
        except ValueError:
            known = ", ".join(repr(k.value) for k in FailoverStrategyKind)
            problems.append(
                f"job configuration: unknown failover_strategy {echo(m.failover_strategy)} (expected one of {known})"
            )
    restart = None
    if m.HasField("restart_strategy"):
        restart = RestartStrategyConfig(kind=m.restart_strategy.type, options=dict(m.restart_strategy.options))
    return JobConfiguration(
        restart_strategy=restart,
        failover_strategy=failover,
        slot_request_timeout_s=m.slot_request_timeout_seconds if m.HasField("slot_request_timeout_seconds") else None,
        options=dict(m.options),
    )


def _artifact_to_proto(a: Artifact) -> pb.Artifact:
    return _encoding(f"artifact {a.name!r}", lambda: pb.Artifact(name=a.name, content=a.content, uri=a.uri))


def _artifact_from_proto(m: pb.Artifact) -> Artifact:
    return Artifact(name=m.name, content=m.content, uri=m.uri)


# ---- the job graph ----


def job_graph_to_proto(job: JobGraph) -> pb.JobGraph:
    vertices = [vertex_to_proto(v) for v in job.vertices]
    data_sets = [data_set_to_proto(d) for d in job.data_sets]
    edges = [edge_to_proto(e) for e in job.edges]
    configuration = _configuration_to_proto(job.configuration)
    artifacts = [_artifact_to_proto(a) for a in job.artifacts]
    job_type = _JOB_TYPE.encode(job.job_type, "job", "job_type")
    return _encoding(
        "job",
        lambda: pb.JobGraph(
            job_id=job.job_id,
            name=job.name,
            job_type=job_type,
            vertices=vertices,
            data_sets=data_sets,
            edges=edges,
            configuration=configuration,
            artifacts=artifacts,
        ),
    )


def job_graph_from_proto(m: pb.JobGraph) -> JobGraph:
    problems: _Problems = []
    job = JobGraph(
        job_id=m.job_id,
        name=m.name,
        job_type=_JOB_TYPE.decode(m.job_type, "job", "job_type", problems),
        vertices=tuple(_vertex_from_proto(v, problems) for v in m.vertices),
        data_sets=tuple(_data_set_from_proto(d) for d in m.data_sets),
        edges=tuple(_edge_from_proto(e, problems) for e in m.edges),
        # An unset configuration reads as the default message, i.e. the model's defaults.
        configuration=_configuration_from_proto(m.configuration, problems),
        artifacts=tuple(_artifact_from_proto(a) for a in m.artifacts),
    )
    _raise_if_any(problems)
    return job


# ================================================================================================
# States, attempts, failures
# ================================================================================================

_JOB_STATUS_TO: dict[JobStatus, int] = {s: job_pb.JobStatus.Value(f"JOB_STATUS_{s.value}") for s in JobStatus}
_JOB_STATUS_FROM: dict[int, JobStatus] = {v: k for k, v in _JOB_STATUS_TO.items()}
_EXECUTION_STATE_TO: dict[ExecutionState, int] = {
    s: job_pb.ExecutionState.Value(f"EXECUTION_STATE_{s.value}") for s in ExecutionState}
_EXECUTION_STATE_FROM: dict[int, ExecutionState] = {v: k for k, v in _EXECUTION_STATE_TO.items()}


def job_status_to_proto(status: JobStatus) -> int:
    return _JOB_STATUS_TO[status]


def job_status_from_proto(value: int) -> JobStatus:
    try:
        return _JOB_STATUS_FROM[value]
    except KeyError:
        raise ValueError(f"unknown JobStatus value {value}") from None


def execution_state_from_proto(value: int) -> ExecutionState:
    try:
        return _EXECUTION_STATE_FROM[value]
    except KeyError:
        raise ValueError(f"unknown ExecutionState value {value}") from None


def job_type_to_proto(job_type: JobType) -> int:
    return _JOB_TYPE.to_number[job_type]


def timestamp(t: float) -> Timestamp:
    seconds = int(t)
    return Timestamp(seconds=seconds, nanos=int((t - seconds) * 1e9))


def attempt_to_proto(a: ExecutionAttemptId) -> job_pb.ExecutionAttemptId:
    return job_pb.ExecutionAttemptId(vertex_id=a.vertex_id, subtask_index=a.subtask_index,
                                     attempt_number=a.attempt_number)


def attempt_from_proto(m: job_pb.ExecutionAttemptId) -> ExecutionAttemptId:
    return ExecutionAttemptId(m.vertex_id, m.subtask_index, m.attempt_number)


# A failure reported by a TaskManager is kept in the job's history and shown by `funke status`:
# bounded, keeping the start (what it is) and the end (the innermost frames) of what is longer.
MAX_FAILURE_TYPE = 200
MAX_FAILURE_MESSAGE = 16 * 1024
MAX_FAILURE_TRACEBACK = 64 * 1024


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half:,} characters left out) ...\n{text[-half:]}"


def failure_to_proto(f: FailureInfo) -> job_pb.Failure:
    return job_pb.Failure(exception_type=f.exception_type, message=f.message, traceback=f.traceback)


def failure_from_proto(m: job_pb.Failure) -> FailureInfo:
    return FailureInfo(_bounded(m.exception_type, MAX_FAILURE_TYPE), _bounded(m.message, MAX_FAILURE_MESSAGE),
                       _bounded(m.traceback, MAX_FAILURE_TRACEBACK))


# ================================================================================================
# What the JobManager shows of a job
# ================================================================================================


_RESCALE_STATE_TO: dict[RescaleState, int] = {s: job_pb.RescaleState.Value(f"RESCALE_STATE_{s.value}")
                                              for s in RescaleState}


def rescale_to_proto(r: "Rescale") -> job_pb.Rescale:
    """A live rescale and its story (`funke.common.scheduling.rescale.Rescale`)."""
    return job_pb.Rescale(
        state=_RESCALE_STATE_TO[r.state], requested_at=timestamp(r.requested_at), cause=r.cause,
        parallelism=r.parallelism, last_batch_id=r.last_batch_id, failure=r.failure,
        history=[job_pb.RescaleTransition(from_state=_RESCALE_STATE_TO[t.from_state], to_state=_RESCALE_STATE_TO[t.to_state],
                                          timestamp=timestamp(t.timestamp), cause=t.cause, stimulus_id=t.stimulus_id)
                 for t in r.history])


def job_transition_to_proto(t: Transition, leader_epoch: int = 0, job_manager: str = "") -> job_pb.JobStatusTransition:
    return job_pb.JobStatusTransition(
        from_status=_JOB_STATUS_TO[t.from_state], to_status=_JOB_STATUS_TO[t.to_state],
        timestamp=timestamp(t.timestamp), cause=t.cause, stimulus_id=t.stimulus_id,
        leader_epoch=leader_epoch, job_manager=job_manager)


def execution_transition_to_proto(t: Transition) -> job_pb.ExecutionStateTransition:
    return job_pb.ExecutionStateTransition(
        from_state=_EXECUTION_STATE_TO[t.from_state], to_state=_EXECUTION_STATE_TO[t.to_state],
        timestamp=timestamp(t.timestamp), cause=t.cause, stimulus_id=t.stimulus_id)


def execution_to_proto(ex: Execution) -> job_pb.Execution:
    msg = job_pb.Execution(
        id=attempt_to_proto(ex.attempt_id),
        state=_EXECUTION_STATE_TO[ex.state],
        created_at=timestamp(ex.machine.created_at),
        history=[execution_transition_to_proto(t) for t in ex.machine.history],
        task_manager_id=ex.task_manager_id or "",
    )
    if ex.io is not None:
        msg.io.CopyFrom(io_to_proto(ex.io))
    if ex.slot is not None:
        msg.slot_index = ex.slot.slot_index
    if ex.failure is not None:
        msg.failure.CopyFrom(failure_to_proto(ex.failure))
    return msg


# ================================================================================================
# The deployment contract (graph/deployment.py)
# ================================================================================================


def producer_attempt_to_int(p: ProducerAttempt) -> int:
    return p.attempt if isinstance(p, Available) else -1 - p.attempt


def producer_attempt_from_int(value: int) -> ProducerAttempt:
    return available(value) if value >= 0 else awaiting(-1 - value)


def gate_from_proto(m: cluster_pb.InputGateDeploymentDescriptor) -> InputGateDeployment:
    partitions = range(m.partition_start, m.partition_end)
    if m.producer_attempts:
        if len(m.producer_attempts) != len(partitions):
            raise ValueError(f"input {m.input_index} (data set {m.data_set_id!r}): {len(m.producer_attempts)} "
                             f"producer attempts for {len(partitions)} partitions")
        uniform, producers = None, tuple(producer_attempt_from_int(a) for a in m.producer_attempts)
    else:
        uniform, producers = producer_attempt_from_int(m.uniform_attempt), None
    return InputGateDeployment(
        input_index=m.input_index, data_set_id=m.data_set_id, partitions=partitions,
        subpartition=m.subpartition if m.HasField("subpartition") else None,
        uniform=uniform, producers=producers, schema=m.schema)


def _result_partition_from_proto(m: cluster_pb.ResultPartitionDeploymentDescriptor) -> ResultPartitionSpec:
    partitioner = _PARTITIONER.from_number.get(m.partitioner)
    partition_type = _PARTITION_TYPE.from_number.get(m.partition_type)
    if partitioner is None or partition_type is None:  # name every unknown value
        problems: _Problems = []
        _PARTITIONER.decode(m.partitioner, f"data set {m.data_set_id!r}", "partitioner", problems)
        _PARTITION_TYPE.decode(m.partition_type, f"data set {m.data_set_id!r}", "partition_type", problems)
        _raise_if_any(problems)
    return ResultPartitionSpec(m.data_set_id, m.partition_index, m.num_subpartitions, partitioner,  # type: ignore[arg-type]
                               tuple(m.partition_keys), partition_type, m.key_groups)  # type: ignore[arg-type]


class DeploymentEncoder:
    """Encodes one job's deployments. The JobVertex message of each vertex is built once, and the
    job's options and artifacts (already wire messages: they came with the submission) are
    shared by every descriptor."""

    def __init__(self, data_dir: str, options: Mapping[str, str], artifacts: Iterable[pb.Artifact]):
        self.data_dir = data_dir
        self.options = dict(options)
        self.artifacts = list(artifacts)
        self._artifact_bytes = sum(a.ByteSize() for a in self.artifacts)
        self._vertices: dict[str, pb.JobVertex] = {}
        self._sizes: dict[str, int] = {}
        self._templates: dict[str, cluster_pb.TaskDeploymentDescriptor] = {}  # per job vertex: `encode_task`

    def size_of(self, vertex_id: str) -> int:
        """About how many bytes a descriptor of this vertex has (after `encode` made one)."""
        return self._sizes.get(vertex_id, 0)

    def encode(self, d: TaskDeployment) -> cluster_pb.TaskDeploymentDescriptor:
        """A whole TaskDeployment, as a descriptor (a deployment the scheduler made goes through
        `encode_task`, which needs no TaskDeployment)."""
        msg = cluster_pb.TaskDeploymentDescriptor(
            job_id=d.job_id, job_name=d.job_name, attempt=attempt_to_proto(d.attempt), task_name=d.task_name,
            parallelism=d.parallelism, slot_index=d.slot.slot_index, vertex=self._vertex(d.vertex),
            data_dir=d.data_dir or self.data_dir, artifacts=self.artifacts, stimulus_id=d.stimulus_id,
            streaming=d.streaming,
        )
        msg.job_options.update(self.options)
        for gate in d.inputs:
            _add_gate(msg, gate.input_index, gate.data_set_id, gate.partitions, gate.subpartition, gate.uniform,
                      gate.producers, gate.schema)
        for out in d.outputs:
            _add_output(msg, out.data_set_id, out.partition_index, out.num_subpartitions, out.partitioner,
                        out.partition_keys, out.partition_type, out.key_groups)
        return msg

    def encode_task(self, vertex: VertexDeployment, attempt: ExecutionAttemptId, task_name: str, slot: SlotId,
                    gates: Sequence[GateState], stimulus_id: str) -> cluster_pb.TaskDeploymentDescriptor:
        """The descriptor of `vertex.task(attempt, task_name, slot, gates, stimulus_id)`, made
        from a copy of what the vertex's descriptors share, without building the TaskDeployment."""
        template = self._templates.get(vertex.vertex.id)
        if template is None:
            template = self._templates[vertex.vertex.id] = cluster_pb.TaskDeploymentDescriptor(
                job_id=vertex.job_id, job_name=vertex.job_name, parallelism=vertex.parallelism,
                vertex=self._vertex(vertex.vertex), data_dir=self.data_dir, artifacts=self.artifacts,
                streaming=vertex.streaming)
            template.job_options.update(self.options)
        msg = cluster_pb.TaskDeploymentDescriptor()
        msg.CopyFrom(template)
        a = msg.attempt
        a.vertex_id, a.subtask_index, a.attempt_number = attempt.vertex_id, attempt.subtask_index, attempt.attempt_number
        msg.task_name, msg.slot_index, msg.stimulus_id = task_name, slot.slot_index, stimulus_id
        index = attempt.subtask_index
        for layout, (uniform, producers, schema) in zip(vertex.inputs, gates):
            partitions, subpartition = vertex.split(layout, index)
            _add_gate(msg, layout.input_index, layout.data_set_id, partitions, subpartition, uniform, producers, schema)
        for out in vertex.outputs:
            edge = out.edge
            _add_output(msg, out.data_set_id, index, vertex.subpartitions(out, index), edge.partitioner,
                        edge.partition_keys, edge.result_partition_type, out.key_groups)
        return msg

    def _vertex(self, v: JobVertex) -> pb.JobVertex:
        vertex = self._vertices.get(v.id)
        if vertex is None:
            vertex = self._vertices[v.id] = vertex_to_proto(v)
            self._sizes[v.id] = vertex.ByteSize() + self._artifact_bytes + 1024
        return vertex


def _add_gate(msg: cluster_pb.TaskDeploymentDescriptor, input_index: int, data_set_id: str, partitions: range,
              subpartition: int | None, uniform: ProducerAttempt | None, producers: Sequence[ProducerAttempt] | None,
              schema: str) -> None:
    g = msg.inputs.add(input_index=input_index, data_set_id=data_set_id, partition_start=partitions.start,
                       partition_end=partitions.stop, schema=schema)
    if subpartition is not None:
        g.subpartition = subpartition
    if uniform is not None:
        g.uniform_attempt = producer_attempt_to_int(uniform)
    else:
        assert producers is not None
        g.uniform_attempt = -1
        g.producer_attempts.extend(producer_attempt_to_int(p) for p in producers)


def _add_output(msg: cluster_pb.TaskDeploymentDescriptor, data_set_id: str, partition_index: int, subpartitions: int,
                partitioner: PartitionerKind, keys: tuple[str, ...], kind: ResultPartitionType, key_groups: int) -> None:
    msg.outputs.add(data_set_id=data_set_id, partition_index=partition_index, num_subpartitions=subpartitions,
                    partitioner=_PARTITIONER.to_number[partitioner], partition_keys=keys,
                    partition_type=_PARTITION_TYPE.to_number[kind], key_groups=key_groups)


def deployment_from_proto(m: cluster_pb.TaskDeploymentDescriptor, task_manager_id: str,
                          vertex: JobVertex, data_dir: str | None = None) -> TaskDeployment:
    """A TaskManager's view of a descriptor; `vertex` is the descriptor's JobVertex, decoded (and
    cached) by the caller; `data_dir`, if given, replaces the descriptor's (a TaskManager that sees
    the shared data dir under a path of its own). Raises ValueError for a descriptor that does
    not decode."""
    return TaskDeployment(
        job_id=m.job_id, job_name=m.job_name, attempt=attempt_from_proto(m.attempt), task_name=m.task_name,
        parallelism=m.parallelism, slot=SlotId(task_manager_id, m.slot_index), vertex=vertex,
        inputs=tuple(gate_from_proto(g) for g in m.inputs) if m.inputs else (),
        outputs=tuple(_result_partition_from_proto(o) for o in m.outputs) if m.outputs else (),
        data_dir=m.data_dir if data_dir is None else data_dir,
        job_options=dict(m.job_options) if m.job_options else NO_OPTIONS,
        artifacts=tuple(_artifact_from_proto(a) for a in m.artifacts) if m.artifacts else (),
        stimulus_id=m.stimulus_id,
        streaming=m.streaming,
    )


def produced_to_proto(p: ProducedPartition) -> cluster_pb.ProducedPartition:
    return cluster_pb.ProducedPartition(data_set_id=p.data_set_id, partition_index=p.partition_index,
                                        schema=p.schema, row_count=p.row_count)


def io_to_proto(io: TaskIo) -> job_pb.TaskIo:
    msg = job_pb.TaskIo(records_in=io.records_in, records_out=io.records_out, bytes_in=io.bytes_in,
                        bytes_out=io.bytes_out, seconds=io.seconds)
    if io.state is not None:
        s = io.state
        msg.state.CopyFrom(job_pb.StateMetrics(rows_total=s.rows_total, rows_updated=s.rows_updated,
                                               rows_removed=s.rows_removed, bytes_written=s.bytes_written,
                                               bytes_on_disk=s.bytes_on_disk, update_ms=s.update_ms,
                                               memory_bytes=s.memory_bytes, commit_ms=s.commit_ms))
    for operator, e in io.event_time.items():
        msg.event_time[operator].CopyFrom(job_pb.EventTimeStats(min_ms=e.min_ms, max_ms=e.max_ms, sum_ms=e.sum_ms,
                                                                count=e.count))
    msg.late_rows = io.late_rows
    for o in io.operators:
        entry = msg.operators.add()
        if o.records_in is not None:
            entry.records_in = o.records_in
        if o.records_out is not None:
            entry.records_out = o.records_out
    return msg


def io_from_proto(m: job_pb.TaskIo) -> TaskIo:
    """Counts that cannot be ones (negative, not finite) are read as 0."""
    def count(v: int) -> int:
        return v if v >= 0 else 0
    def duration(v: float) -> float:
        return v if v == v and 0 <= v < float("inf") else 0.0
    state = None
    if m.HasField("state"):
        s = m.state
        state = StateMetrics(count(s.rows_total), count(s.rows_updated), count(s.rows_removed),
                             count(s.bytes_written), count(s.bytes_on_disk), duration(s.update_ms),
                             count(s.memory_bytes), duration(s.commit_ms))
    event_time = {}
    for operator, e in m.event_time.items():
        if e.HasField("max_ms") and e.HasField("min_ms") and e.min_ms <= e.max_ms and e.count > 0 \
                and math.isfinite(e.sum_ms):
            event_time[operator] = EventTimeStats(e.min_ms, e.max_ms, e.sum_ms, e.count)
    def measured(o: job_pb.OperatorIo, name: str) -> int | None:
        return count(getattr(o, name)) if o.HasField(name) else None
    # At most as many as a chain may hold operators: the list is sized by the sender.
    operators = tuple(OperatorIo(measured(o, "records_in"), measured(o, "records_out"))
                      for o in m.operators[:MAX_OPERATORS_PER_VERTEX])
    return TaskIo(count(m.records_in), count(m.records_out), count(m.bytes_in), count(m.bytes_out),
                  duration(m.seconds), state, event_time, count(m.late_rows), operators)


def report_to_proto(r: TaskReport) -> cluster_pb.TaskExecutionState:
    msg = cluster_pb.TaskExecutionState(
        job_id=r.job_id, attempt=attempt_to_proto(r.attempt), state=_EXECUTION_STATE_TO[r.state],
        produced=[produced_to_proto(p) for p in r.produced], task_manager_id=r.task_manager_id,
        stimulus_id=r.stimulus_id)
    if r.failure is not None:
        msg.failure.CopyFrom(failure_to_proto(r.failure))
    if r.batch_id is not None:
        msg.batch_id = r.batch_id
    if r.input_rows is not None:
        msg.input_rows = r.input_rows
    if r.io is not None:
        msg.io.CopyFrom(io_to_proto(r.io))
    return msg


def report_from_proto(m: cluster_pb.TaskExecutionState) -> TaskReport:
    """Raises ValueError for a state this build does not know."""
    return TaskReport(
        job_id=m.job_id, attempt=attempt_from_proto(m.attempt), state=execution_state_from_proto(m.state),
        failure=failure_from_proto(m.failure) if m.HasField("failure") else None,
        produced=tuple(ProducedPartition(p.data_set_id, p.partition_index, p.schema, p.row_count)
                       for p in m.produced),
        task_manager_id=m.task_manager_id, stimulus_id=m.stimulus_id,
        batch_id=m.batch_id if m.HasField("batch_id") else None,
        # a count that cannot be one is no count (the batch's report still counts)
        input_rows=m.input_rows if m.HasField("input_rows") and m.input_rows >= 0 else None,
        io=io_from_proto(m.io) if m.HasField("io") else None)


# ---------------------------------------------------------------------------- micro-batches


def run_batch_to_proto(job_id: str, registration_id: str, batch: BatchInput,
                       tasks: Sequence[tuple[ExecutionAttemptId, Sequence[tuple[int, Sequence[int], str]]]],
                       released: Sequence[int] = ()) -> cluster_pb.RunBatchesRequest:
    """A RunBatches request: the batch, and per task, per input (index, producer attempts, schema);
    `released`: earlier batches that are through."""
    msg = cluster_pb.RunBatchesRequest(
        job_id=job_id, registration_id=registration_id, batch_id=batch.batch_id, batch_time_ms=batch.batch_time_ms,
        ranges_json=json.dumps({v: {"start": r.start, "end": r.end, "rows": r.rows} for v, r in batch.ranges.items()},
                               sort_keys=True), released_batches=sorted(released))
    for vertex, names in batch.files.items():
        msg.files[vertex].names.extend(names)
    for vertex, rate in batch.rate_limits.items():
        msg.rate_limits[vertex] = rate
    if batch.watermark_ms is not None:
        msg.watermark_ms = batch.watermark_ms
    if batch.state is not None:
        msg.state_lineage_json = json.dumps(batch.state.to_json(), separators=(",", ":"))
    for attempt, gates in tasks:
        t = msg.tasks.add(attempt=attempt_to_proto(attempt))
        for index, attempts, schema in gates:
            t.gates.add(input_index=index, producer_attempts=list(attempts), schema=schema)
    return msg


def batch_from_proto(m: cluster_pb.RunBatchesRequest) -> BatchInput:
    """The batch a RunBatches request names; ValueError if it does not decode."""
    if m.batch_id < 0 or m.batch_time_ms < 0:
        raise ValueError(f"batch id and time must not be negative, got {m.batch_id} and {m.batch_time_ms}")
    try:
        raw = json.loads(m.ranges_json or "{}")
        ranges = {str(v): SourceRange(r["start"], r["end"], int(r.get("rows", 0))) for v, r in dict(raw).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"the batch's ranges do not decode: {exc}") from None
    bad = {v: r for v, r in m.rate_limits.items() if not (math.isfinite(r) and r > 0)}
    if bad:
        raise ValueError(f"rate limits must be positive numbers, got {bad}")
    lineage = None
    if m.state_lineage_json:
        try:
            lineage = StateLineage.from_json(json.loads(m.state_lineage_json))
        except ValueError as exc:
            raise ValueError(f"the batch's state lineage does not decode: {exc}") from None
        if lineage.token(m.batch_id + 1) is None:
            raise ValueError(f"the batch's state lineage names no run for batch {m.batch_id}")
    return BatchInput(m.batch_id, m.batch_time_ms, ranges, {v: tuple(f.names) for v, f in m.files.items()},
                      dict(m.rate_limits), m.watermark_ms if m.HasField("watermark_ms") else None, lineage)


def task_result_to_proto(attempt: job_pb.ExecutionAttemptId, error: str | None) -> cluster_pb.TaskSubmissionResult:
    """A TaskManager's answer for one task of a SubmitTasks or RunBatches call (`attempt` as the
    call named it): accepted unless `error` says why not."""
    return cluster_pb.TaskSubmissionResult(attempt=attempt, accepted=error is None, error=error or "")


def batch_tasks_from_proto(m: cluster_pb.RunBatchesRequest) -> tuple[BatchTask, ...]:
    """The tasks a RunBatches request names, each with what it reads of its inputs (the other
    half of `run_batch_to_proto`'s `tasks`)."""
    return tuple(BatchTask(attempt_from_proto(t.attempt), tuple(
        BatchGate(g.input_index, tuple(g.producer_attempts), g.schema) for g in t.gates)) for t in m.tasks)


def partition_update_to_proto(u: PartitionUpdate) -> cluster_pb.PartitionInfoUpdate:
    return cluster_pb.PartitionInfoUpdate(data_set_id=u.data_set_id, partition_index=u.partition_index,
                                          producer_attempt=u.producer_attempt, schema=u.schema)


def partition_update_from_proto(m: cluster_pb.PartitionInfoUpdate) -> PartitionUpdate:
    return PartitionUpdate(m.data_set_id, m.partition_index, m.producer_attempt, m.schema)


def partition_ref_to_proto(r: PartitionRef) -> cluster_pb.ResultPartitionRef:
    return cluster_pb.ResultPartitionRef(data_set_id=r.data_set_id, partition_index=r.partition_index,
                                         producer_attempt=r.producer_attempt)


def partition_ref_from_proto(m: cluster_pb.ResultPartitionRef) -> PartitionRef:
    return PartitionRef(m.data_set_id, m.partition_index, m.producer_attempt)
