"""The deployment contract between the JobManager and its TaskManagers, as typed values.

Owns what travels between the two cores, in the model's terms: the deployment of one execution
attempt (`TaskDeployment`, with its input gates and result partitions), the reports a TaskManager
sends back (`TaskReport`), partitions becoming available (`PartitionUpdate`) or being released
(`PartitionRef`), what each streaming task reads of a micro-batch (`BatchTask`). The scheduler
(`scheduling/scheduler.py`) and the batch flow (`scheduling/batchflow.py`) produce deployments and
batches and consume reports; the TaskManager core (`task/taskexecutorstate.py`) does the opposite.
Neither sees protobuf: `wire/codec.py` is the one place these become wire messages and back.

A consumer's input names, per partition of its range, the producer attempt to read:
`Available(n)` when attempt n finished it, `Awaiting(n)` when the consumer was deployed before
attempt n finished (it arrives later as a `PartitionUpdate`). An older attempt a TaskManager may
remember of an `Awaiting` partition is stale: the JobManager restarted its producer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, NamedTuple

from funke.common.records import quick_init
from funke.common.graph.executiongraph import (
    ExecutionAttemptId,
    FailureInfo,
    SlotId,
    TaskIo,
    input_split,
    subpartition_count,
)
from funke.common.graph.jobgraph import Artifact, JobEdge, JobVertex, PartitionerKind, ResultPartitionType
from funke.common.states import ExecutionState


@dataclass(frozen=True, slots=True)
class Available:
    """The partition is finished: read what producer attempt `attempt` wrote."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Awaiting:
    """The partition is not finished yet: wait for producer attempt `attempt`."""

    attempt: int


ProducerAttempt = Available | Awaiting

NO_OPTIONS: Mapping[str, str] = MappingProxyType({})

# Shared instances for the attempt numbers every job uses: deployments of large jobs name one per
# partition, and identical objects compare at once.
_AVAILABLE = tuple(Available(n) for n in range(32))
_AWAITING = tuple(Awaiting(n) for n in range(32))


def available(attempt: int) -> Available:
    return _AVAILABLE[attempt] if 0 <= attempt < 32 else Available(attempt)


def awaiting(attempt: int) -> Awaiting:
    return _AWAITING[attempt] if 0 <= attempt < 32 else Awaiting(attempt)


@quick_init
@dataclass(frozen=True, slots=True)
class InputGateDeployment:
    """What a consumer reads from one input: partitions `partitions` of a data set, subpartition
    `subpartition` of each (None: whole partitions). `uniform` names the producer attempt of every
    partition when they are all the same; otherwise `producers` names one per partition."""

    input_index: int
    data_set_id: str
    partitions: range
    subpartition: int | None
    uniform: ProducerAttempt | None
    producers: tuple[ProducerAttempt, ...] | None
    schema: str  # Spark StructType JSON; "" until a producer finished

    def producer_of(self, position: int) -> ProducerAttempt:
        """The producer attempt of the `position`-th partition of the range."""
        if self.producers is not None:
            return self.producers[position]
        assert self.uniform is not None
        return self.uniform

    def describe(self) -> str:
        return f"input {self.input_index} (data set {self.data_set_id!r})"


@quick_init
@dataclass(frozen=True, slots=True)
class ResultPartitionSpec:
    data_set_id: str
    partition_index: int
    num_subpartitions: int
    partitioner: PartitionerKind
    partition_keys: tuple[str, ...]
    partition_type: ResultPartitionType
    # HASH into a streaming query's vertex: route by key group (`funke.common.streaming.state`) over
    # the consumer's max parallelism, so a keyed operator's subtask gets exactly its groups' keys.
    # 0: by hash modulo the number of consumers.
    key_groups: int = 0


@quick_init
@dataclass(frozen=True, slots=True)
class TaskDeployment:
    """One execution attempt, as deployed into a slot. The scheduler fills the job's part; the
    JobMaster adds the cluster's (`data_dir`, the job's options and artifacts)."""

    job_id: str
    job_name: str
    attempt: ExecutionAttemptId
    task_name: str
    parallelism: int
    slot: SlotId
    vertex: JobVertex
    inputs: tuple[InputGateDeployment, ...]
    outputs: tuple[ResultPartitionSpec, ...]
    data_dir: str = ""
    # a shared, read-only empty mapping unless the JobMaster sets the job's options
    job_options: Mapping[str, str] = field(default_factory=lambda: NO_OPTIONS)
    artifacts: tuple[Artifact, ...] = ()
    stimulus_id: str = ""  # the JobManager event that decided the deployment
    # A streaming query's task: long-lived, it runs the micro-batches it is given (its inputs
    # are named per batch, not awaited at deployment)
    streaming: bool = False


class GateLayout(NamedTuple):
    """How the subtasks of one job vertex read one input, up to their own index."""

    input_index: int
    data_set_id: str
    edge: JobEdge
    upstream: int  # the producer's parallelism
    every_partition: range | None  # ALL_TO_ALL: what every subtask reads; None: per subtask (POINTWISE)
    one_subpartition: bool  # ALL_TO_ALL: each subtask reads its own subpartition (not BROADCAST)


class OutputLayout(NamedTuple):
    """How the subtasks of one job vertex write one result; a subtask's partition index is its
    own index."""

    data_set_id: str
    edge: JobEdge
    downstream: int  # the consumer's parallelism
    subpartitions: int | None  # the same for every subtask (ALL_TO_ALL); None: per subtask (POINTWISE)
    key_groups: int


# What one input reads at a deployment, as the JobManager's deployment factory caches it per
# consumed partition group: (the attempt of every partition if they are all the same, the
# attempt per partition, the schema).
GateState = tuple[ProducerAttempt | None, tuple[ProducerAttempt, ...], str]


@dataclass(frozen=True, slots=True)
class VertexDeployment:
    """What the deployments of one job vertex's subtasks share, made once per vertex: a
    deployment is this plus the subtask's attempt, slot and what its inputs read (`GateState`).
    The JobManager encodes deployments from it without building a TaskDeployment each
    (`wire/codec.py`); `task` builds one, as a TaskManager sees it."""

    job_id: str
    job_name: str
    vertex: JobVertex
    parallelism: int
    streaming: bool
    inputs: tuple[GateLayout, ...]
    outputs: tuple[OutputLayout, ...]

    def split(self, gate: GateLayout, subtask_index: int) -> tuple[range, int | None]:
        """The partitions subtask `subtask_index` reads of an input, and which subpartition of each."""
        if gate.every_partition is not None:
            return gate.every_partition, subtask_index if gate.one_subpartition else None
        split = input_split(gate.edge, subtask_index, gate.upstream, self.parallelism)
        return split.partitions, split.subpartition

    def subpartitions(self, output: OutputLayout, subtask_index: int) -> int:
        if output.subpartitions is not None:
            return output.subpartitions
        return subpartition_count(output.edge, subtask_index, self.parallelism, output.downstream)

    def task(self, attempt: ExecutionAttemptId, task_name: str, slot: SlotId, gates: tuple[GateState, ...],
             stimulus_id: str = "") -> TaskDeployment:
        index = attempt.subtask_index
        inputs = []
        for layout, (uniform, producers, schema) in zip(self.inputs, gates):
            partitions, subpartition = self.split(layout, index)
            inputs.append(InputGateDeployment(layout.input_index, layout.data_set_id, partitions, subpartition, uniform,
                                              producers if uniform is None else None, schema))
        outputs = tuple(ResultPartitionSpec(o.data_set_id, index, self.subpartitions(o, index), o.edge.partitioner,
                                            o.edge.partition_keys, o.edge.result_partition_type, o.key_groups)
                        for o in self.outputs)
        return TaskDeployment(self.job_id, self.job_name, attempt, task_name, self.parallelism, slot, self.vertex,
                              tuple(inputs), outputs, stimulus_id=stimulus_id, streaming=self.streaming)


@dataclass(frozen=True, slots=True)
class ProducedPartition:
    """A result partition a finished task wrote."""

    data_set_id: str
    partition_index: int
    schema: str  # Spark StructType JSON of the rows; "" for a no-op chain
    row_count: int = 0


@quick_init
@dataclass(frozen=True, slots=True)
class TaskReport:
    """What a TaskManager tells the JobManager about one task: a new state, why it failed, and
    with FINISHED the partitions it produced."""

    job_id: str
    attempt: ExecutionAttemptId
    state: ExecutionState
    failure: FailureInfo | None = None
    produced: tuple[ProducedPartition, ...] = ()
    task_manager_id: str = ""
    stimulus_id: str = ""  # the TaskManager event that caused it
    batch_id: int | None = None  # a streaming task finished this micro-batch (it stays RUNNING)
    input_rows: int | None = None  # with batch_id: the rows its stream source read (None: not counted)
    io: TaskIo | None = None  # with FINISHED or a batch: what it read and wrote


@quick_init
@dataclass(frozen=True, slots=True)
class PartitionUpdate:
    """Partition `partition_index` of a data set is available from `producer_attempt`."""

    data_set_id: str
    partition_index: int
    producer_attempt: int
    schema: str


@quick_init
@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One producer attempt's result partition, to be released."""

    data_set_id: str
    partition_index: int
    producer_attempt: int


@dataclass(frozen=True, slots=True)
class BatchGate:
    """What a streaming task reads of one input in a micro-batch: per partition of the gate's
    range, the producer attempt whose batch partition to read, and the data's schema."""

    input_index: int
    attempts: tuple[int, ...]
    schema: str


@dataclass(frozen=True, slots=True)
class BatchTask:
    attempt: ExecutionAttemptId
    gates: tuple[BatchGate, ...] = ()
