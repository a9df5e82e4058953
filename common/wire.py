"""The wire form of the JobGraph: conversion between `funke.common.jobgraph` and `funke.v1`.

Owns how each part of the logical job model maps to its protobuf message and back, and nothing
else: no validation (that is `validation.py`'s job, on the decoded model) and no RPC.

Rules:
- enums map by name; a proto value is the Python name with the enum's prefix
  (PARTITIONER_HASH <-> PartitionerKind.HASH); the proto's UNSPECIFIED (0) decodes to the
  model's default, so a client that leaves a field unset gets what the Python API would give it.
- `OperatorSpec.config` travels as canonical JSON (sorted keys, no spaces) in `config_json`.
- optional scalars and messages keep their presence: None <-> unset.
- sequences decode to tuples, maps to dicts.

Decoding treats the message as untrusted input: anything a client can put on the wire that the
model cannot represent raises `WireError`, never another exception, and lists every such problem
at once, each naming what it is about (like `validation.JobGraphInvalid`). Encoding raises
`WireError` as well, for a model that cannot be put on the wire (a config that is not JSON, an
int that does not fit int32, ...).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from funke.common.jobgraph import (
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
from funke.v1 import jobgraph_pb2 as pb

__all__ = [
    "WireError",
    "job_graph_to_proto",
    "job_graph_from_proto",
    "vertex_to_proto",
    "vertex_from_proto",
    "operator_to_proto",
    "operator_from_proto",
]


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
            # Programming error, not user input: the .proto and jobgraph.py disagree.
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


def _data_set_to_proto(d: IntermediateDataSet) -> pb.IntermediateDataSet:
    return _encoding(f"data set {d.id!r}", lambda: pb.IntermediateDataSet(id=d.id, producer_vertex_id=d.producer))


def _data_set_from_proto(m: pb.IntermediateDataSet) -> IntermediateDataSet:
    return IntermediateDataSet(id=m.id, producer=m.producer_vertex_id)


def _edge_to_proto(e: JobEdge) -> pb.JobEdge:
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
    data_sets = [_data_set_to_proto(d) for d in job.data_sets]
    edges = [_edge_to_proto(e) for e in job.edges]
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
