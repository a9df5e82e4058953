"""A TaskManager's Prometheus metrics, Flink's names under `funke_taskmanager_`: its slots
(`taskSlotsTotal`, `taskSlotsAvailable`, `numRunningTasks`) and, per task it ran, what the task
read and wrote (`job_task_numRecordsIn`, `job_task_numRecordsOut`, `job_task_numBytesIn`,
`job_task_numBytesOut` and the per-second rates over the task's running time), labelled
job_id, vertex_id, task_name, subtask_index, attempt and tm_id; and per operator of the task's
chain its records in and out (`job_task_operator_numRecordsIn`, `job_task_operator_numRecordsOut`,
labelled as the task's plus operator_id, `<vertex_id>/<index in the chain>`, and
operator_name), where they were measured. A streaming task's counts add up over its
micro-batches. Owned by the TaskManager's loop (the shell records, a scrape reads); the most
recent tasks are kept, the oldest dropped beyond a bound."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from funke.common.graph.executiongraph import OperatorIo, TaskIo, add_operator_io
from funke.common.task.taskexecutorstate import TaskKey

PREFIX = "funke_taskmanager_"
MAX_TASKS = 5000
LABELS = ["job_id", "vertex_id", "task_name", "subtask_index", "attempt", "tm_id"]
OPERATOR_LABELS = LABELS + ["operator_id", "operator_name"]


@dataclass
class _Counts:
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    operators: tuple[OperatorIo, ...] = ()
    operator_names: tuple[str, ...] = ()


class TaskMetrics(Collector):
    def __init__(self, task_manager_id: str, slots: Callable[[], tuple[int, int, int]]) -> None:
        """`slots()`: (total, free, tasks running) now."""
        self.task_manager_id = task_manager_id
        self._slots = slots
        self._tasks: OrderedDict[TaskKey, tuple[list[str], _Counts]] = OrderedDict()

    def _entry(self, key: TaskKey, name: str, operators: tuple[str, ...]) -> _Counts:
        entry = self._tasks.get(key)
        if entry is None:
            a = key.attempt
            entry = ([key.job_id, a.vertex_id, name, str(a.subtask_index), str(a.attempt_number),
                      self.task_manager_id], _Counts(operator_names=operators))
            self._tasks[key] = entry
            while len(self._tasks) > MAX_TASKS:
                self._tasks.popitem(last=False)
        return entry[1]

    def task_finished(self, key: TaskKey, name: str, io: TaskIo, operators: tuple[str, ...] = ()) -> None:
        """A batch task's whole run (`operators`: the names of its chain's operators)."""
        counts = self._entry(key, name, operators)
        counts.records_in, counts.records_out = io.records_in, io.records_out
        counts.bytes_in, counts.bytes_out, counts.seconds = io.bytes_in, io.bytes_out, io.seconds
        counts.operators = io.operators

    def batch_done(self, key: TaskKey, name: str, io: TaskIo, operators: tuple[str, ...] = ()) -> None:
        """One micro-batch of a streaming task: added to what it did before."""
        counts = self._entry(key, name, operators)
        counts.records_in += io.records_in
        counts.records_out += io.records_out
        counts.bytes_in += io.bytes_in
        counts.bytes_out += io.bytes_out
        counts.seconds += io.seconds
        counts.operators = add_operator_io(counts.operators, io.operators)

    def collect(self) -> Iterator[Metric]:
        total, free, running = self._slots()
        yield GaugeMetricFamily(PREFIX + "taskSlotsTotal", "task slots of this TaskManager", value=total)
        yield GaugeMetricFamily(PREFIX + "taskSlotsAvailable", "task slots free", value=free)
        yield GaugeMetricFamily(PREFIX + "numRunningTasks", "tasks running now", value=running)
        families = {
            "numRecordsIn": "rows the task read from its inputs' result partitions",
            "numRecordsOut": "rows the task's chain emitted into its result partitions",
            "numBytesIn": "bytes of the result partitions it read",
            "numBytesOut": "bytes of the result partitions it wrote",
            "numRecordsInPerSecond": "rows read per second of the task's running time",
            "numRecordsOutPerSecond": "rows emitted per second of the task's running time",
            "numBytesOutPerSecond": "bytes written per second of the task's running time",
        }
        out = {name: GaugeMetricFamily(PREFIX + "job_task_" + name, doc, labels=LABELS) for name, doc in families.items()}
        for labels, c in list(self._tasks.values()):
            per_second = 1 / c.seconds if c.seconds > 0 else 0.0
            for name, value in (("numRecordsIn", c.records_in), ("numRecordsOut", c.records_out),
                                ("numBytesIn", c.bytes_in), ("numBytesOut", c.bytes_out),
                                ("numRecordsInPerSecond", c.records_in * per_second),
                                ("numRecordsOutPerSecond", c.records_out * per_second),
                                ("numBytesOutPerSecond", c.bytes_out * per_second)):
                out[name].add_metric(labels, value)
        yield from out.values()
        records = {"numRecordsIn": "records the operator received (a source: the records it read)",
                   "numRecordsOut": "records the operator emitted (a sink: the records it wrote)"}
        per_operator = {name: GaugeMetricFamily(PREFIX + "job_task_operator_" + name, doc, labels=OPERATOR_LABELS)
                        for name, doc in records.items()}
        for labels, c in list(self._tasks.values()):
            for i, o in enumerate(c.operators):
                operator = [f"{labels[1]}/{i}", c.operator_names[i] if i < len(c.operator_names) else ""]
                for name, value in (("numRecordsIn", o.records_in), ("numRecordsOut", o.records_out)):
                    if value is not None:
                        per_operator[name].add_metric(labels + operator, value)
        yield from per_operator.values()
