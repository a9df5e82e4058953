"""The JobGraph: what a user submits.

Owns the logical job model (JobVertex, IntermediateDataSet, JobEdge, job configuration) and
nothing else: validation lives in `validation.py`, the parallel view in `executiongraph.py`, the
wire form in `wire.py`. Instances are plain immutable values so that a graph can be shared
between the dispatcher, the scheduler and the client without copying.

Flink vocabulary: a JobVertex is one operator chain with a parallelism; it produces
IntermediateDataSets; a JobEdge connects a data set to a consuming JobVertex and says how the
producer's subtasks are wired to the consumer's subtasks.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field
from typing import Mapping

from funke.common import ids
from funke.common.graph.operators import OperatorRole, operator_role

DEFAULT_SLOT_SHARING_GROUP = "default"
# Flink's default upper bound for max parallelism when none is given is 128 for small
# parallelisms and grows with parallelism; we keep one simple rule: max(128, parallelism).
DEFAULT_MAX_PARALLELISM_FLOOR = 128
MAX_PARALLELISM_LIMIT = 32768


class JobType(enum.Enum):
    # Members are singletons compared by identity: hash them by identity too (Enum's own
    # __hash__ is Python code, and these are hashed on every state change).
    __hash__ = object.__hash__
    BATCH = "BATCH"
    STREAMING = "STREAMING"


class DistributionPattern(enum.Enum):
    """How producer subtasks connect to consumer subtasks."""
    __hash__ = object.__hash__

    POINTWISE = "POINTWISE"
    ALL_TO_ALL = "ALL_TO_ALL"


class PartitionerKind(enum.Enum):
    """How a producer subtask splits its records among the consumer subtasks it feeds."""
    __hash__ = object.__hash__

    FORWARD = "FORWARD"
    HASH = "HASH"
    REBALANCE = "REBALANCE"
    BROADCAST = "BROADCAST"


class ResultPartitionType(enum.Enum):
    """BLOCKING results are complete before consumers start and survive consumer failures;
    PIPELINED results tie producer and consumer into one pipelined region."""
    __hash__ = object.__hash__

    BLOCKING = "BLOCKING"
    PIPELINED = "PIPELINED"


class FailoverStrategyKind(enum.Enum):
    __hash__ = object.__hash__
    FULL = "full"
    REGION = "region"


def chain_name(names: list[str]) -> str:
    """"Source: text -> FlatMap -> Count", as Flink names a chain; a chain too long to name in
    full keeps its ends: "A -> B -> ... (37 more) -> Z"."""
    name = " -> ".join(names)
    if len(name) <= ids.MAX_NAME_LENGTH:
        return name
    head, tail = list(names[:2]), names[-1]
    while len(head) > 1 and len(" -> ".join(head)) > ids.MAX_NAME_LENGTH // 2:
        head.pop()
    middle = f"... ({len(names) - len(head) - 1} more)"
    shortened = " -> ".join([*head, middle, tail])
    return shortened if len(shortened) <= ids.MAX_NAME_LENGTH else shortened[: ids.MAX_NAME_LENGTH - 3] + "..."


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    """One operator of a chain: a catalogue kind (see `operators.py`), its JSON-able
    configuration and, for Python-function operators, the cloudpickled function."""

    kind: str
    name: str = ""
    config: Mapping[str, object] = field(default_factory=dict)
    function: bytes = b""

    @property
    def display_name(self) -> str:
        return self.name or self.kind


@dataclass(frozen=True, slots=True)
class JobVertex:
    """An operator chain with a parallelism. The head operator consumes the vertex's inputs
    (in `JobEdge.input_index` order); the tail operator produces its data sets."""

    id: str
    name: str
    parallelism: int
    operators: tuple[OperatorSpec, ...] = ()
    max_parallelism: int | None = None
    slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP
    co_location_group: str | None = None

    @property
    def effective_max_parallelism(self) -> int:
        if self.max_parallelism is not None:
            return self.max_parallelism
        return min(max(DEFAULT_MAX_PARALLELISM_FLOOR, self.parallelism), MAX_PARALLELISM_LIMIT)

    @property
    def is_source(self) -> bool:
        return bool(self.operators) and operator_role(self.operators[0].kind) is OperatorRole.SOURCE


@dataclass(frozen=True, slots=True)
class IntermediateDataSet:
    """The result a vertex produces; consumed through exactly one JobEdge."""

    id: str
    producer: str  # JobVertex id


@dataclass(frozen=True, slots=True)
class JobEdge:
    id: str
    data_set: str  # IntermediateDataSet id
    consumer: str  # JobVertex id
    distribution_pattern: DistributionPattern = DistributionPattern.ALL_TO_ALL
    partitioner: PartitionerKind = PartitionerKind.REBALANCE
    partition_keys: tuple[str, ...] = ()
    result_partition_type: ResultPartitionType = ResultPartitionType.BLOCKING
    input_index: int = 0


# Flink's option: the result partition type of every exchange of a job.
BATCH_SHUFFLE_MODE = "execution.batch-shuffle-mode"
SHUFFLE_MODES = {
    "ALL_EXCHANGES_BLOCKING": ResultPartitionType.BLOCKING,
    "ALL_EXCHANGES_PIPELINED": ResultPartitionType.PIPELINED,
}


def result_partition_type(job_type: JobType, options: Mapping[str, str]) -> ResultPartitionType:
    """The result partition type of a job's exchanges: BATCH_SHUFFLE_MODE's, else BLOCKING for
    a BATCH job and PIPELINED for a STREAMING one. Raises ValueError for an unknown mode."""
    mode = options.get(BATCH_SHUFFLE_MODE)
    if mode is None:
        return ResultPartitionType.BLOCKING if job_type is JobType.BATCH else ResultPartitionType.PIPELINED
    # Unlike Flink, the option is honoured for streaming jobs too: funke's streaming jobs are
    # bounded, so blocking exchanges are meaningful there as well.
    try:
        return SHUFFLE_MODES[mode.strip().upper()]
    except KeyError:
        raise ValueError(
            f"{BATCH_SHUFFLE_MODE}: unsupported value {mode!r} (accepted: {', '.join(SHUFFLE_MODES)})"
        ) from None


@dataclass(frozen=True, slots=True)
class RestartStrategyConfig:
    """Which restart strategy a job uses; `options` take Flink's key suffixes, e.g.
    {"attempts": "3", "delay": "1 s"} for fixed-delay. Parsed by `restart.py`."""

    kind: str = "none"  # none | fixed-delay | failure-rate | exponential-delay
    options: Mapping[str, str] = field(default_factory=dict)


# A bounded job's exchange: a producer whose output Spark estimates at no more than this many bytes
# collects it as Arrow and writes one Parquet file per subpartition itself, as a micro-batch's
# producer does (taskmanager/batchexchange.py); above it (or 0), Spark's distributed writer.
EXCHANGE_IN_MEMORY_MAX_BYTES = "batch.exchange.in-memory.max-bytes"
DEFAULT_EXCHANGE_IN_MEMORY_MAX_BYTES = 8 * 1024 * 1024
MAX_EXCHANGE_IN_MEMORY_MAX_BYTES = 1024 * 1024 * 1024


def exchange_in_memory_max_bytes(options: Mapping[str, str]) -> int:
    """The job's `EXCHANGE_IN_MEMORY_MAX_BYTES` (its default when unset); ValueError if it is no
    whole number of bytes from 0 to MAX_EXCHANGE_IN_MEMORY_MAX_BYTES."""
    raw = options.get(EXCHANGE_IN_MEMORY_MAX_BYTES)
    if raw is None:
        return DEFAULT_EXCHANGE_IN_MEMORY_MAX_BYTES
    text = str(raw).strip()
    if not text.isdigit() or not text.isascii() or int(text) > MAX_EXCHANGE_IN_MEMORY_MAX_BYTES:
        raise ValueError(f"option {EXCHANGE_IN_MEMORY_MAX_BYTES} must be a whole number of bytes from 0 to "
                         f"{MAX_EXCHANGE_IN_MEMORY_MAX_BYTES} (0: always Spark's writer), got {text[:40]!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class JobConfiguration:
    restart_strategy: RestartStrategyConfig | None = None  # None: the cluster default
    failover_strategy: FailoverStrategyKind | None = None  # None: the cluster default (region)
    slot_request_timeout_s: float | None = None  # None: the cluster default
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file the job's code needs on the TaskManagers (a Python module, a zip, a data file)."""

    name: str
    content: bytes = b""
    uri: str = ""


@dataclass(frozen=True, slots=True)
class JobGraph:
    name: str
    vertices: tuple[JobVertex, ...]
    data_sets: tuple[IntermediateDataSet, ...] = ()
    edges: tuple[JobEdge, ...] = ()
    job_type: JobType = JobType.BATCH
    configuration: JobConfiguration = field(default_factory=JobConfiguration)
    artifacts: tuple[Artifact, ...] = ()
    job_id: str = ""  # empty: the dispatcher assigns one

    # -- lookups (graphs are small at the logical level; these are linear scans on purpose
    #    so that a JobGraph stays a plain value without hidden indexes) --

    def vertex(self, vertex_id: str) -> JobVertex:
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        raise KeyError(vertex_id)

    def data_set(self, data_set_id: str) -> IntermediateDataSet:
        for d in self.data_sets:
            if d.id == data_set_id:
                return d
        raise KeyError(data_set_id)

    def inputs_of(self, vertex_id: str) -> list[JobEdge]:
        return sorted((e for e in self.edges if e.consumer == vertex_id), key=lambda e: e.input_index)

    def produced_by(self, vertex_id: str) -> list[IntermediateDataSet]:
        return [d for d in self.data_sets if d.producer == vertex_id]

    def consumers_of(self, data_set_id: str) -> list[JobEdge]:
        return [e for e in self.edges if e.data_set == data_set_id]

    def topological_order(self) -> list[JobVertex]:
        """Vertices with producers before consumers; ties keep declaration order.
        Requires a valid (acyclic) graph."""
        producer_of = {d.id: d.producer for d in self.data_sets}
        indegree = {v.id: 0 for v in self.vertices}
        downstream: dict[str, list[str]] = {v.id: [] for v in self.vertices}
        for e in self.edges:
            src = producer_of[e.data_set]
            downstream[src].append(e.consumer)
            indegree[e.consumer] += 1
        position = {v.id: i for i, v in enumerate(self.vertices)}
        order: list[str] = []
        heap = [(position[vid], vid) for vid, d in indegree.items() if d == 0]
        heapq.heapify(heap)
        while heap:
            _, vid = heapq.heappop(heap)
            order.append(vid)
            for c in downstream[vid]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(heap, (position[c], c))
        if len(order) != len(self.vertices):
            raise ValueError("job graph has a cycle; validate it first")
        by_id = {v.id: v for v in self.vertices}
        return [by_id[v] for v in order]
