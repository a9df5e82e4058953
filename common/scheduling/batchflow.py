"""How one micro-batch flows through a streaming query's long-lived tasks: which tasks run it
when, what each reads, and when each sink has written it.

Owns, for one run of a streaming query (one set of RUNNING attempts, fixed when the run starts:
any failure restarts every task and starts a new run), the progress of every batch in flight:

- a batch starts at the vertices that read no other vertex (the stream sources' chains);
- a vertex runs batch N once every subtask of every vertex it reads has reported batch N; it is
  told per input and partition which producer attempt wrote batch N's partition, and its schema;
- a sink vertex (its chain ends in a sink) has begun writing batch N when it is told to run it,
  and has written it when every subtask reported it; the batch is through when every sink has.

Sans-IO: `start(batch)` and `on_report(...)` return what to send (`Dispatch`: one vertex's tasks
of one batch, grouped by TaskManager), what the sources read (`InputRead`: the rows their
subtasks counted) and what the sinks did (`SinkStarted`, `SinkWritten`); the
JobMaster's shell sends and feeds the reports back. A report of an attempt that is not this
run's, of a batch not in flight, or repeated, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from funke.common.graph.deployment import BatchGate, BatchTask
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, input_split
from funke.common.streaming.sources import BatchInput


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run `batch` on these tasks of one vertex, on TaskManager `task_manager_id`."""
    task_manager_id: str
    vertex_id: str
    batch: BatchInput
    tasks: tuple[BatchTask, ...]


@dataclass(frozen=True, slots=True)
class SinkStarted:
    batch_id: int
    sink: str


@dataclass(frozen=True, slots=True)
class SinkWritten:
    batch_id: int
    sink: str


@dataclass(frozen=True, slots=True)
class InputRead:
    """Every subtask of stream source `source` read the batch; `rows`: what they counted
    together (None: some subtask did not count); `per_subtask`: what each counted, by subtask
    index (a receiver source's subtask i is its receiver i)."""
    batch_id: int
    source: str
    rows: int | None
    per_subtask: tuple[int | None, ...] = ()


Step = Dispatch | SinkStarted | SinkWritten | InputRead


@dataclass
class _InFlight:
    batch: BatchInput
    reported: dict[str, set[int]] = field(default_factory=dict)  # vertex -> subtasks done
    schemas: dict[str, str] = field(default_factory=dict)  # data set -> schema of its batch partitions
    dispatched: set[str] = field(default_factory=set)
    sinks_left: set[str] = field(default_factory=set)
    input_rows: dict[str, dict[int, int | None]] = field(default_factory=dict)  # source -> subtask -> rows


class BatchFlow:
    def __init__(self, graph: ExecutionGraph, sinks: list[str]):
        self.graph = graph
        self.sinks = frozenset(sinks)
        unknown = self.sinks - set(graph.vertices)
        if unknown:
            raise ValueError(f"sinks {sorted(unknown)} are not vertices of the job")
        # This run's attempts: (vertex, subtask) -> attempt number and TaskManager
        self.attempts: dict[tuple[str, int], int] = {}
        self.task_managers: dict[tuple[str, int], str] = {}
        for ejv in graph.vertices.values():
            for ev in ejv.task_vertices:
                ex = ev.current_execution
                self.attempts[(ejv.id, ev.subtask_index)] = ex.attempt_number
                self.task_managers[(ejv.id, ev.subtask_index)] = ex.task_manager_id or ""
        self._readers = {v: [r.producer.id for r in ejv.inputs] for v, ejv in graph.vertices.items()}
        self._consumers: dict[str, list[str]] = {v: [] for v in graph.vertices}
        for v, producers in self._readers.items():
            for p in producers:
                if v not in self._consumers[p]:
                    self._consumers[p].append(v)
        self._in_flight: dict[int, _InFlight] = {}

    # ------------------------------------------------------------------ views

    @property
    def in_flight(self) -> list[int]:
        return sorted(self._in_flight)

    def all_attempts(self) -> list[ExecutionAttemptId]:
        return [ExecutionAttemptId(v, s, a) for (v, s), a in sorted(self.attempts.items())]

    def sink_attempts(self, sink: str) -> dict[int, int]:
        """subtask -> the attempt whose output of a batch counts (this run's)."""
        return {s: a for (v, s), a in self.attempts.items() if v == sink}

    # ------------------------------------------------------------------ events

    def start(self, batch: BatchInput) -> list[Step]:
        if batch.batch_id in self._in_flight:
            raise ValueError(f"batch {batch.batch_id} is already in flight")
        flight = _InFlight(batch, sinks_left=set(self.sinks))
        self._in_flight[batch.batch_id] = flight
        out: list[Step] = []
        for v in self.graph.vertices:  # topological order
            if not self._readers[v]:
                self._dispatch(flight, v, out)
        return out

    def accepts(self, attempt: ExecutionAttemptId, batch_id: int) -> bool:
        """Whether `on_report` takes this report: the batch is in flight, the attempt is the
        subtask's current one, was given the batch, and has not reported it yet (anything else
        is a report from before this run, or a repeat, and counts for nothing)."""
        flight = self._in_flight.get(batch_id)
        key = (attempt.vertex_id, attempt.subtask_index)
        if flight is None or self.attempts.get(key) != attempt.attempt_number:
            return False
        if attempt.vertex_id not in flight.dispatched:
            return False  # a batch it was not given (a report from before this run)
        return attempt.subtask_index not in flight.reported.get(attempt.vertex_id, ())

    def on_report(self, attempt: ExecutionAttemptId, batch_id: int, schemas: dict[str, str],
                  input_rows: int | None = None) -> list[Step]:
        """Subtask `attempt` wrote batch `batch_id`; `schemas`: data set -> schema of what it wrote;
        `input_rows`: the rows its stream sources read (None: not counted)."""
        if not self.accepts(attempt, batch_id):
            return []
        flight = self._in_flight[batch_id]
        done = flight.reported.setdefault(attempt.vertex_id, set())
        done.add(attempt.subtask_index)
        for data_set, schema in schemas.items():
            if schema:
                flight.schemas.setdefault(data_set, schema)
        out: list[Step] = []
        vertex = attempt.vertex_id
        if not self._readers[vertex]:  # a source vertex: its subtasks' counts add up
            flight.input_rows.setdefault(vertex, {})[attempt.subtask_index] = input_rows
        if len(done) < self.graph.vertices[vertex].parallelism:
            return out
        if not self._readers[vertex]:
            counted = flight.input_rows[vertex]
            per_subtask = tuple(counted.get(i) for i in range(self.graph.vertices[vertex].parallelism))
            total = None if any(n is None for n in per_subtask) else sum(per_subtask)  # type: ignore[arg-type]
            out.append(InputRead(batch_id, vertex, total, per_subtask))
        if vertex in self.sinks:
            out.append(SinkWritten(batch_id, vertex))
            flight.sinks_left.discard(vertex)
        for consumer in self._consumers[vertex]:
            if consumer not in flight.dispatched and all(self._vertex_done(flight, p) for p in self._readers[consumer]):
                self._dispatch(flight, consumer, out)
        if not flight.sinks_left and all(self._vertex_done(flight, v) for v in flight.dispatched):
            del self._in_flight[batch_id]
        return out

    def _vertex_done(self, flight: _InFlight, vertex: str) -> bool:
        return len(flight.reported.get(vertex, ())) == self.graph.vertices[vertex].parallelism

    def _dispatch(self, flight: _InFlight, vertex: str, out: list[Step]) -> None:
        flight.dispatched.add(vertex)
        ejv = self.graph.vertices[vertex]
        by_tm: dict[str, list[BatchTask]] = {}
        for subtask in range(ejv.parallelism):
            gates = []
            for index, result in enumerate(ejv.inputs):
                producer = result.producer
                split = input_split(result.edge, subtask, producer.parallelism, ejv.parallelism)
                attempts = tuple(self.attempts[(producer.id, p)] for p in split.partitions)
                gates.append(BatchGate(index, attempts, flight.schemas.get(result.id, "")))
            task = BatchTask(ExecutionAttemptId(vertex, subtask, self.attempts[(vertex, subtask)]), tuple(gates))
            by_tm.setdefault(self.task_managers[(vertex, subtask)], []).append(task)
        if vertex in self.sinks:
            out.append(SinkStarted(flight.batch.batch_id, vertex))
        for tm, tasks in by_tm.items():
            out.append(Dispatch(tm, vertex, flight.batch, tuple(tasks)))
