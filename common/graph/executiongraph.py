"""The ExecutionGraph: the parallel view of a JobGraph that the JobMaster tracks.

Owns ExecutionJobVertex (one per JobVertex), ExecutionVertex (one per subtask), Execution (one per
attempt, prior attempts kept), IntermediateResult (one per data set) and IntermediateResultPartition
(one per producer subtask), and the wiring between them.

Wiring is O(P), never O(P²): an ALL_TO_ALL edge is one ConsumedPartitionGroup (all partitions of
the result) shared by every consumer subtask, and one ConsumerVertexGroup (all consumer subtasks)
shared by every partition. POINTWISE edges get small groups following Flink's index arithmetic.

Partition bookkeeping (which producer attempt finished a partition, how many partitions of a
consumed group are still unfinished) lives here so that "are this region's inputs ready" is O(1)
per group. Decisions about *what to do* live in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Sequence

from funke.common.records import quick_init
from funke.common.streaming.eventtime import EventTimeStats
from funke.common.streaming.state import StateMetrics
from funke.common.graph.jobgraph import (
    DistributionPattern,
    JobEdge,
    JobGraph,
    JobVertex,
    PartitionerKind,
    ResultPartitionType,
)
from funke.common.states import (
    EXECUTION_STATE_TRANSITIONS,
    ExecutionState,
    JobStatus,
    StateMachine,
    Transition,
    job_status_machine,
)


# Prior attempts kept per subtask (Flink's jobmanager.execution.attempts-history-size).
ATTEMPTS_HISTORY_SIZE = 16
_TERMINAL_EXECUTION_STATES = frozenset(state for state in ExecutionState if state.is_terminal)


@dataclass(frozen=True, slots=True, order=True)
class ExecutionVertexId:
    vertex_id: str
    subtask_index: int

    def __str__(self) -> str:
        return f"{self.vertex_id}[{self.subtask_index}]"


@quick_init
@dataclass(frozen=True, slots=True, order=True)
class ExecutionAttemptId:
    vertex_id: str
    subtask_index: int
    attempt_number: int

    @property
    def vertex(self) -> ExecutionVertexId:
        return ExecutionVertexId(self.vertex_id, self.subtask_index)

    def __str__(self) -> str:
        return f"{self.vertex_id}[{self.subtask_index}]#{self.attempt_number}"


@quick_init
@dataclass(frozen=True, slots=True, order=True)
class SlotId:
    task_manager_id: str
    slot_index: int

    def __str__(self) -> str:
        return f"{self.task_manager_id}/slot-{self.slot_index}"


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """Why an execution or a job failed: the exception type, its message and the Python
    traceback as text (from the TaskManager, so the user sees their own frames)."""

    exception_type: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.exception_type}: {self.message}"


@dataclass(frozen=True, slots=True)
class OperatorIo:
    """What one operator of a task's chain received and emitted (Flink's numRecordsIn and
    numRecordsOut of an operator); None: not measured (how each is counted:
    `funke.taskmanager.recordcounts`)."""

    records_in: int | None = None
    records_out: int | None = None

    def __add__(self, other: OperatorIo) -> OperatorIo:
        """Two runs' counts added up (a streaming task's batches); a count measured in neither is
        still not measured."""
        return OperatorIo(_plus(self.records_in, other.records_in), _plus(self.records_out, other.records_out))


def _plus(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def add_operator_io(a: tuple[OperatorIo, ...], b: tuple[OperatorIo, ...]) -> tuple[OperatorIo, ...]:
    """Per operator of the chain, two runs' counts added up (a run that counted none: ())."""
    if len(a) < len(b):
        a, b = b, a
    return tuple(x + y for x, y in zip(a, b)) + a[len(b):]


@dataclass(frozen=True, slots=True)
class TaskIo:
    """What one task attempt (or one micro-batch of it) read and wrote: the records its chain's
    head received (a source: the records it read) and its tail emitted (into its result
    partitions, or a sink: the records it wrote), the bytes of the result partitions it consumed
    and produced, how long it ran, and per operator of its chain its records in and out."""

    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    # a streaming task's batch through a keyed operator: its state after the batch
    state: StateMetrics | None = None
    # a streaming task's batch: per watermark operator of its chain, the event times it saw;
    # and the rows its window operator found late
    event_time: dict[str, EventTimeStats] = field(default_factory=dict)
    late_rows: int = 0
    # per operator of the chain, head first (empty: not counted)
    operators: tuple[OperatorIo, ...] = ()



class Execution(StateMachine[ExecutionState]):
    """One attempt to run an ExecutionVertex: its own state machine under
    EXECUTION_STATE_TRANSITIONS (`machine` is the attempt itself, named by str(self) in errors;
    a restart of P subtasks makes P attempts, not twice as many objects)."""

    __slots__ = ("vertex", "attempt_number", "machine", "slot", "failure", "attempt_id", "io")

    def __init__(self, vertex: "ExecutionVertex", attempt_number: int, now: float):
        self.vertex = vertex
        self.attempt_number = attempt_number
        self.attempt_id = ExecutionAttemptId(vertex.job_vertex.id, vertex.subtask_index, attempt_number)
        # StateMachine.__init__(self, self, EXECUTION_STATE_TRANSITIONS, CREATED, now), inline
        self.entity = self.machine = self
        self.table = EXECUTION_STATE_TRANSITIONS
        self.state = ExecutionState.CREATED
        self.created_at = now
        self.history = []
        self.slot: SlotId | None = None
        self.failure: FailureInfo | None = None
        self.io: TaskIo | None = None  # what it read and wrote, as its TaskManager reported on FINISHED

    @property
    def task_manager_id(self) -> str | None:
        return self.slot.task_manager_id if self.slot else None

    def __str__(self) -> str:
        return f"{self.vertex.name} attempt #{self.attempt_number}"

    def __repr__(self) -> str:
        return f"Execution({self.attempt_id}, {self.state.value})"


class ExecutionVertex:
    """One parallel subtask of a JobVertex: its current Execution and the prior ones."""

    __slots__ = (
        "job_vertex", "subtask_index", "current_execution", "prior_executions",
        "consumed_partition_groups", "produced_partitions", "_name",
    )

    def __init__(self, job_vertex: "ExecutionJobVertex", subtask_index: int, now: float):
        self.job_vertex = job_vertex
        self.subtask_index = subtask_index
        self.prior_executions: list[Execution] = []
        # one per input of the job vertex, in input order
        self.consumed_partition_groups: list[ConsumedPartitionGroup] = []
        # one per produced IntermediateResult, in the job vertex's produced order
        self.produced_partitions: list[IntermediateResultPartition] = []
        self._name: str | None = None  # made on first use: every state change of a subtask names it
        self.current_execution = Execution(self, job_vertex.graph.first_attempt_number, now)

    @property
    def id(self) -> ExecutionVertexId:
        return ExecutionVertexId(self.job_vertex.id, self.subtask_index)

    @property
    def name(self) -> str:
        name = self._name
        if name is None:
            name = self._name = self.format_name()
        return name

    def format_name(self) -> str:
        return f"{self.job_vertex.name} ({self.subtask_index + 1}/{self.job_vertex.parallelism})"

    @property
    def state(self) -> ExecutionState:
        return self.current_execution.state

    def reset_for_new_execution(self, now: float) -> Execution:
        """Start a new attempt; the current one must be terminal."""
        new_attempts([self], now)
        return self.current_execution

    def execution(self, attempt_number: int) -> Execution | None:
        if attempt_number == self.current_execution.attempt_number:
            return self.current_execution
        for ex in self.prior_executions:
            if ex.attempt_number == attempt_number:
                return ex
        return None

    def __repr__(self) -> str:
        return f"ExecutionVertex({self.name}, {self.state.value})"


def new_attempts(vertices: Sequence[ExecutionVertex], now: float) -> None:
    """A new attempt for each of `vertices` (`reset_for_new_execution`), in one pass: a global
    restart makes one per subtask. Their current attempts must all be terminal; nothing changes
    if one is not."""
    for ev in vertices:
        if ev.current_execution.state not in _TERMINAL_EXECUTION_STATES:
            raise ValueError(f"{ev.name}: cannot start a new attempt while {ev.current_execution!r} is not terminal")
    for ev in vertices:
        current = ev.current_execution
        prior = ev.prior_executions
        prior.append(current)
        if len(prior) > ATTEMPTS_HISTORY_SIZE:
            del prior[0]  # a job restarting for days keeps the latest attempts only
        # Above every attempt of this run; an attempt taken over from an earlier run (a job a new
        # leader recovered) is numbered below the run's first one.
        number = current.attempt_number + 1
        first = ev.job_vertex.graph.first_attempt_number
        ev.current_execution = Execution(ev, number if number > first else first, now)


class ExecutionJobVertex:
    """All subtasks of one JobVertex."""

    __slots__ = ("graph", "job_vertex", "task_vertices", "inputs", "produced", "topological_index",
                 "id", "name", "parallelism", "slot_sharing_group", "co_location_group")

    def __init__(self, graph: "ExecutionGraph", job_vertex: JobVertex, topological_index: int, now: float):
        self.graph = graph
        self.job_vertex = job_vertex
        self.topological_index = topological_index
        # the JobVertex's, kept here as well: read on every transition and deployment
        self.id = job_vertex.id
        self.name = job_vertex.name
        self.parallelism = job_vertex.parallelism
        self.slot_sharing_group = job_vertex.slot_sharing_group
        self.co_location_group = job_vertex.co_location_group
        self.task_vertices = [ExecutionVertex(self, i, now) for i in range(job_vertex.parallelism)]
        self.inputs: list[IntermediateResult] = []
        self.produced: list[IntermediateResult] = []

    def __repr__(self) -> str:
        return f"ExecutionJobVertex({self.id}, p={self.parallelism})"


class IntermediateResult:
    """The runtime view of one IntermediateDataSet: one partition per producer subtask."""

    __slots__ = ("id", "producer", "edge", "consumer", "partitions")

    def __init__(self, data_set_id: str, producer: ExecutionJobVertex, edge: JobEdge, consumer: ExecutionJobVertex):
        self.id = data_set_id
        self.producer = producer
        self.edge = edge
        self.consumer = consumer
        self.partitions = [IntermediateResultPartition(self, i) for i in range(producer.parallelism)]
        for ev, partition in zip(producer.task_vertices, self.partitions):
            ev.produced_partitions.append(partition)

    @property
    def result_partition_type(self) -> ResultPartitionType:
        return self.edge.result_partition_type

    @property
    def is_blocking(self) -> bool:
        return self.edge.result_partition_type is ResultPartitionType.BLOCKING

    def __repr__(self) -> str:
        return f"IntermediateResult({self.id}: {self.producer.id} -> {self.consumer.id})"


@quick_init
@dataclass(frozen=True, slots=True)
class PartitionLocation:
    """Where a finished partition lives: the attempt that wrote it, on which TaskManager,
    with which schema (Spark StructType JSON, so consumers read empty partitions correctly)."""

    producer_attempt: int
    task_manager_id: str
    schema: str


class IntermediateResultPartition:
    """The output of one producer subtask for one IntermediateResult."""

    __slots__ = ("result", "partition_index", "consumer_vertex_groups", "consumed_partition_groups", "location")

    def __init__(self, result: IntermediateResult, partition_index: int):
        self.result = result
        self.partition_index = partition_index
        self.consumer_vertex_groups: list[ConsumerVertexGroup] = []
        self.consumed_partition_groups: list[ConsumedPartitionGroup] = []
        self.location: PartitionLocation | None = None

    @property
    def producer(self) -> ExecutionVertex:
        return self.result.producer.task_vertices[self.partition_index]

    @property
    def is_available(self) -> bool:
        return self.location is not None

    def __repr__(self) -> str:
        return f"IntermediateResultPartition({self.result.id}[{self.partition_index}])"


class ConsumedPartitionGroup:
    """Partitions of one result that are consumed together by the vertices of one
    ConsumerVertexGroup. Tracks how many are not yet finished."""

    __slots__ = ("result", "partitions", "consumer_vertex_group", "unfinished", "version")

    def __init__(self, result: IntermediateResult, partitions: Sequence[IntermediateResultPartition]):
        self.result = result
        self.partitions = partitions
        self.consumer_vertex_group: ConsumerVertexGroup | None = None
        self.unfinished = len(partitions)
        self.version = 0  # bumped whenever a partition's location changes (caches key on it)

    @property
    def all_finished(self) -> bool:
        return self.unfinished == 0

    def __len__(self) -> int:
        return len(self.partitions)

    def __repr__(self) -> str:
        return f"ConsumedPartitionGroup({self.result.id}, {len(self.partitions)} partitions, {self.unfinished} unfinished)"


class ConsumerVertexGroup:
    """Consumer subtasks that read the same ConsumedPartitionGroup."""

    __slots__ = ("result", "vertices", "consumed_group")

    def __init__(self, result: IntermediateResult, vertices: Sequence[ExecutionVertex], consumed_group: ConsumedPartitionGroup):
        self.result = result
        self.vertices = vertices
        self.consumed_group = consumed_group
        consumed_group.consumer_vertex_group = self

    def __len__(self) -> int:
        return len(self.vertices)


def pointwise_producers_of(consumer_index: int, upstream: int, downstream: int) -> range:
    """Partitions read by consumer subtask `consumer_index` on a POINTWISE edge."""
    if upstream >= downstream:
        return range(consumer_index * upstream // downstream, (consumer_index + 1) * upstream // downstream)
    p = consumer_index * upstream // downstream
    # the producer whose consumer range contains consumer_index
    while not (_first_consumer(p, upstream, downstream) <= consumer_index < _first_consumer(p + 1, upstream, downstream)):
        p += 1
    return range(p, p + 1)


def pointwise_consumers_of(partition_index: int, upstream: int, downstream: int) -> range:
    """Consumer subtasks fed by producer partition `partition_index` on a POINTWISE edge."""
    if upstream >= downstream:
        # consumer i reads [i*U/D, (i+1)*U/D): find the i whose range holds the partition
        c = partition_index * downstream // upstream
        while not (c * upstream // downstream <= partition_index < (c + 1) * upstream // downstream):
            c += 1
        return range(c, c + 1)
    return range(_first_consumer(partition_index, upstream, downstream),
                 _first_consumer(partition_index + 1, upstream, downstream))


def _first_consumer(p: int, upstream: int, downstream: int) -> int:
    return (p * downstream + upstream - 1) // upstream


@dataclass(frozen=True, slots=True)
class InputSplit:
    """What one consumer subtask reads from one input: partitions and, per partition,
    which subpartition (None: the whole partition)."""

    partitions: range
    subpartition: int | None  # the same subpartition index for every partition of the range


def input_split(edge: JobEdge, consumer_index: int, upstream: int, downstream: int) -> InputSplit:
    """How subtask `consumer_index` of the consumer reads an edge's result.

    ALL_TO_ALL HASH/REBALANCE: subpartition `consumer_index` of every producer partition.
    ALL_TO_ALL BROADCAST: every producer partition whole.
    POINTWISE, upstream >= downstream: a range of whole partitions.
    POINTWISE, upstream < downstream: one partition, which its producer splits round-robin into
    as many subpartitions as it has consumers; this consumer takes its position among them
    (None when the producer has this one consumer only: it writes no subpartitions).
    """
    if edge.distribution_pattern is DistributionPattern.ALL_TO_ALL:
        if edge.partitioner is PartitionerKind.BROADCAST:
            return InputSplit(range(upstream), None)
        return InputSplit(range(upstream), consumer_index)
    producers = pointwise_producers_of(consumer_index, upstream, downstream)
    if upstream >= downstream:
        return InputSplit(producers, None)
    p = producers.start
    consumers = pointwise_consumers_of(p, upstream, downstream)
    if len(consumers) == 1:  # the producer feeds only this consumer and writes no subpartitions
        return InputSplit(producers, None)
    return InputSplit(producers, consumer_index - consumers.start)


def subpartition_count(edge: JobEdge, partition_index: int, upstream: int, downstream: int) -> int:
    """How many subpartitions producer `partition_index` writes for an edge (1: unsplit)."""
    if edge.distribution_pattern is DistributionPattern.ALL_TO_ALL:
        return 1 if edge.partitioner is PartitionerKind.BROADCAST else downstream
    if upstream >= downstream:
        return 1
    return len(pointwise_consumers_of(partition_index, upstream, downstream))


@dataclass(frozen=True, slots=True)
class Incarnation:
    """Which run of a job an ExecutionGraph is (high availability: a job recovered by a new leader
    gets a new ExecutionGraph that continues the old one's story).

    `leader_epoch` and `job_manager` say under which leader this graph runs (0 and "": no high
    availability); `earlier_history` holds the job status transitions of the earlier runs, each
    with the epoch and JobManager it happened under; `first_attempt_number` starts this run's
    attempts above every earlier run's, so no output of an earlier run's straggling task can be
    taken for this run's; `created_at` is when the job was first submitted."""

    leader_epoch: int = 0
    job_manager: str = ""
    earlier_history: tuple["LeaderTransition", ...] = ()
    first_attempt_number: int = 0
    created_at: float | None = None


@dataclass(frozen=True, slots=True)
class LeaderTransition:
    """A job status transition and the leader it happened under."""

    transition: Transition[JobStatus]
    leader_epoch: int
    job_manager: str


class ExecutionGraph:
    """The ExecutionGraph of one job: vertices in topological order, results, job status and
    the history of failures."""

    def __init__(self, job_graph: JobGraph, job_id: str, now: float, incarnation: Incarnation = Incarnation()):
        self.job_graph = job_graph
        self.job_id = job_id
        self.incarnation = incarnation
        self.first_attempt_number = incarnation.first_attempt_number
        self.status_machine: StateMachine[JobStatus] = job_status_machine(f"job '{job_graph.name}' ({job_id})", now)
        if incarnation.created_at is not None:
            self.status_machine.created_at = incarnation.created_at
        self.vertices: dict[str, ExecutionJobVertex] = {}
        self.results: dict[str, IntermediateResult] = {}
        for i, jv in enumerate(job_graph.topological_order()):
            self.vertices[jv.id] = ExecutionJobVertex(self, jv, i, now)
        edge_of = {e.data_set: e for e in job_graph.edges}
        # produced results in declaration order of the data sets (a chain's outputs by position)
        for data_set in job_graph.data_sets:
            edge = edge_of[data_set.id]
            producer = self.vertices[data_set.producer]
            result = IntermediateResult(data_set.id, producer, edge, self.vertices[edge.consumer])
            self.results[result.id] = result
            producer.produced.append(result)
        # inputs in input_index order, so consumed_partition_groups line up with the chain's inputs
        for edge in sorted(job_graph.edges, key=lambda e: (e.consumer, e.input_index)):
            result = self.results[edge.data_set]
            self.vertices[edge.consumer].inputs.append(result)
            _connect(result)

    @property
    def status(self) -> JobStatus:
        return self.status_machine.state

    def status_history(self) -> list[LeaderTransition]:
        """Every job status transition of every run of this job, oldest first."""
        inc = self.incarnation
        return list(inc.earlier_history) + [LeaderTransition(t, inc.leader_epoch, inc.job_manager)
                                            for t in self.status_machine.history]

    def execution_vertices(self) -> list[ExecutionVertex]:
        """Every subtask, job vertex by job vertex in topological order (a new list, made in C:
        a global failover walks it three times)."""
        return list(chain.from_iterable([ejv.task_vertices for ejv in self.vertices.values()]))

    def find_execution(self, attempt: ExecutionAttemptId) -> Execution | None:
        ejv = self.vertices.get(attempt.vertex_id)
        if ejv is None or not 0 <= attempt.subtask_index < ejv.parallelism:
            return None
        return ejv.task_vertices[attempt.subtask_index].execution(attempt.attempt_number)

    def number_of_vertices(self) -> int:
        return sum(ejv.parallelism for ejv in self.vertices.values())

    # -- partition bookkeeping --

    def mark_partition_finished(self, partition: IntermediateResultPartition, location: PartitionLocation) -> list[ConsumedPartitionGroup]:
        """Record a finished partition; return the consumed groups that became complete."""
        completed: list[ConsumedPartitionGroup] = []
        for group in partition.consumed_partition_groups:
            group.version += 1
            if partition.location is None:
                group.unfinished -= 1
                if group.unfinished == 0:
                    completed.append(group)
        partition.location = location
        return completed

    def mark_partition_unavailable(self, partition: IntermediateResultPartition) -> None:
        if partition.location is not None:
            partition.location = None
            for group in partition.consumed_partition_groups:
                group.unfinished += 1
                group.version += 1


def _connect(result: IntermediateResult) -> None:
    producer, consumer, edge = result.producer, result.consumer, result.edge
    if edge.distribution_pattern is DistributionPattern.ALL_TO_ALL:
        group = ConsumedPartitionGroup(result, result.partitions)
        vertices = ConsumerVertexGroup(result, consumer.task_vertices, group)
        for ev in consumer.task_vertices:
            ev.consumed_partition_groups.append(group)
        for partition in result.partitions:
            partition.consumed_partition_groups.append(group)
            partition.consumer_vertex_groups.append(vertices)
        return
    upstream, downstream = producer.parallelism, consumer.parallelism
    if upstream >= downstream:
        # each consumer reads a contiguous range of partitions, alone
        for ev in consumer.task_vertices:
            r = pointwise_producers_of(ev.subtask_index, upstream, downstream)
            group = ConsumedPartitionGroup(result, result.partitions[r.start:r.stop])
            vertices = ConsumerVertexGroup(result, [ev], group)
            ev.consumed_partition_groups.append(group)
            for partition in group.partitions:
                partition.consumed_partition_groups.append(group)
                partition.consumer_vertex_groups.append(vertices)
    else:
        # each partition feeds a contiguous range of consumers, who share one group
        for partition in result.partitions:
            r = pointwise_consumers_of(partition.partition_index, upstream, downstream)
            group = ConsumedPartitionGroup(result, [partition])
            vertices = ConsumerVertexGroup(result, consumer.task_vertices[r.start:r.stop], group)
            partition.consumed_partition_groups.append(group)
            partition.consumer_vertex_groups.append(vertices)
            for ev in vertices.vertices:
                ev.consumed_partition_groups.append(group)
