"""Partition availability on one TaskManager, and the input gates its tasks wait on.

Owns, per (job, data set), which partitions are available and from which producer attempt, as the
JobManager announced them (UpdatePartitionInfo), and the gates of the tasks reading them. An update
is recorded once per TaskManager, whatever number of local tasks read it: recording partition k
costs O(1) plus O(number of distinct partition ranges containing k), because consumers that read
the same range of a data set without knowing any producer attempt yet (the P consumers of an
ALL_TO_ALL edge deployed eagerly) share one `_ConsumedPartitionGroup` and its count of available
partitions (Flink's name for the same idea). A task does not receive updates: it waits until its
gates are complete and is then called back, once per gate.

What a gate reads is the newer of the producer attempt its deployment descriptor names
(producer_attempts / uniform_attempt) and the one recorded here, so an update that arrived before
the task's SubmitTasks counts as much as one that arrived after it, and a newer producer attempt
supersedes an older one. Entries leave when this TaskManager learns they are stale: a newer
attempt of the producer is deployed here, the partition is released here, a gate opens whose
descriptor waits for a newer attempt than the one recorded (the JobManager restarted the producer
on another TaskManager: see `awaited_attempt`), or the job holds no slot here any more (then
everything of the job goes). Since every descriptor names, per partition, either the finished
attempt to read or the attempt it waits for, a gate never completes on an attempt the JobManager
has reset.

Thread-safety: the TaskExecutor's loop records updates and opens gates; a task thread takes its
gates' snapshot when it starts reading, and a standalone Task (no TaskExecutor) records its own
updates from any thread. So every method takes the one lock, and callbacks run after it is
released, through `dispatch` (the TaskExecutor spreads them over loop turns; standalone, they run
at once on the calling thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from funke.v1 import cluster_pb2

__all__ = ["UNAVAILABLE", "GateSnapshot", "InputGate", "PartitionAvailability", "PartitionUnavailable"]

UNAVAILABLE = -1  # a producer attempt that is not known yet (InputGateDeploymentDescriptor)
# A descriptor's attempt n >= 0: available from attempt n. Negative: not yet available; -1 - n
# waits for attempt n, and an older attempt remembered here is stale (the JobManager restarted
# the producer), so it is forgotten when such a gate opens.


def awaited_attempt(value: int) -> int:
    return -1 - value

Callback = Callable[[], None]
Dispatch = Callable[[list[Callback]], None]

# A group compacts its list of waiting gates once more than this share of them has closed
# (cancelled tasks), so a long wait through many cancellations does not grow without end.
_COMPACT_SHARE = 0.5


class PartitionUnavailable(Exception):
    """A partition a gate counted as available was invalidated before the task read it."""


@dataclass(frozen=True, slots=True)
class GateSnapshot:
    """What a task reads from one input, fixed when it starts reading: a later update does not
    change what is being read."""

    input_index: int
    data_set_id: str
    partitions: range
    subpartition: int | None
    attempts: tuple[int, ...]
    schema: str

    def describe(self) -> str:
        return f"input {self.input_index} (data set {self.data_set_id!r})"


class _ConsumedPartitionGroup:
    """A range of one data set read by gates that had no producer attempt from their descriptors;
    complete when every partition of the range is available."""

    __slots__ = ("partitions", "available", "waiting", "closed")

    def __init__(self, partitions: range, available: int):
        self.partitions = partitions
        self.available = available
        self.waiting: list[InputGate] = []
        self.closed = 0  # gates in `waiting` that were closed since the last compaction

    @property
    def complete(self) -> bool:
        return self.available >= len(self.partitions)


class _DataSetPartitions:
    """What this TaskManager knows of one data set of one job."""

    __slots__ = ("attempts", "schema", "groups", "groups_of", "waiting", "floors")

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}  # partition index -> newest producer attempt available
        # (start, stop) of a range -> the highest attempt a gate over it was told to wait for
        self.floors: dict[tuple[int, int], int] = {}
        self.schema = ""
        self.groups: dict[tuple[int, int], _ConsumedPartitionGroup] = {}
        # Index: partition -> the groups whose range contains it. Built once per distinct range,
        # so its size is bounded by the ranges deployed here (P for ALL_TO_ALL, P for POINTWISE).
        self.groups_of: dict[int, list[_ConsumedPartitionGroup]] = {}
        # Gates whose descriptor named some attempts but not all: partition -> gates missing it.
        self.waiting: dict[int, list[InputGate]] = {}

    def group(self, partitions: range) -> _ConsumedPartitionGroup:
        key = (partitions.start, partitions.stop)
        group = self.groups.get(key)
        if group is None:
            attempts = self.attempts
            group = _ConsumedPartitionGroup(partitions, sum(1 for p in partitions if p in attempts))
            self.groups[key] = group
            for p in partitions:
                listed = self.groups_of.get(p)
                if listed is None:
                    self.groups_of[p] = [group]
                else:
                    listed.append(group)
        return group


class InputGate:
    """One input of one task. Complete when every partition of its range has a producer attempt,
    from the descriptor or from the TaskManager's record; `on_complete` is called once, when it
    becomes complete after it was opened (not if it was complete from the start)."""

    __slots__ = ("input_index", "data_set_id", "partitions", "subpartition", "schema", "_uniform",
                 "_attempts", "_data_set", "_group", "missing", "complete", "closed", "on_complete")

    def __init__(self, m: cluster_pb2.InputGateDeploymentDescriptor, on_complete: Callback):
        self.input_index = m.input_index
        self.data_set_id = m.data_set_id
        self.partitions = range(m.partition_start, m.partition_end)
        self.subpartition: int | None = m.subpartition if m.HasField("subpartition") else None
        self.schema = m.schema
        self._attempts: list[int] | None = None
        self._uniform = m.uniform_attempt
        if m.producer_attempts:
            if len(m.producer_attempts) != len(self.partitions):
                raise ValueError(
                    f"input {m.input_index} (data set {m.data_set_id!r}): {len(m.producer_attempts)} "
                    f"producer attempts for {len(self.partitions)} partitions"
                )
            self._attempts = list(m.producer_attempts)
            self._uniform = UNAVAILABLE  # not used when attempts are listed
        self._data_set: _DataSetPartitions | None = None
        self._group: _ConsumedPartitionGroup | None = None
        self.missing = 0  # partitions a descriptor-listed gate still waits for
        self.complete = False
        self.closed = False
        self.on_complete: Callback | None = on_complete

    def describe(self) -> str:
        return f"input {self.input_index} (data set {self.data_set_id!r})"


class PartitionAvailability:
    """The registry of available partitions of every job on this TaskManager."""

    def __init__(self, dispatch: Dispatch | None = None):
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, _DataSetPartitions]] = {}
        self._dispatch = dispatch

    def _data_set(self, job_id: str, data_set_id: str) -> _DataSetPartitions:
        data_sets = self._jobs.get(job_id)
        if data_sets is None:
            data_sets = self._jobs[job_id] = {}
        ds = data_sets.get(data_set_id)
        if ds is None:
            ds = data_sets[data_set_id] = _DataSetPartitions()
        return ds

    def _run(self, callbacks: list[Callback]) -> None:
        if not callbacks:
            return
        if self._dispatch is not None:
            self._dispatch(callbacks)
        else:
            for callback in callbacks:
                callback()

    # ---- gates ----

    def open_gate(self, job_id: str, m: cluster_pb2.InputGateDeploymentDescriptor,
                  on_complete: Callback) -> tuple[InputGate, bool]:
        """A task's gate for input `m`, and whether it has to wait (then `on_complete` follows).

        O(1) for a gate whose descriptor names one attempt for all partitions (uniform), and for
        one that shares a range already seen here; O(range) once per new range, and for a gate
        whose descriptor lists attempts per partition (as long as that list)."""
        gate = InputGate(m, on_complete)  # validates before anything is registered
        with self._lock:
            ds = self._data_set(job_id, gate.data_set_id)
            gate._data_set = ds
            attempts = gate._attempts
            self._forget_older_than_awaited(job_id, ds, gate)
            if not gate.partitions or (attempts is None and gate._uniform >= 0) or (
                    attempts is not None and min(attempts) >= 0):
                gate.complete = True
            elif attempts is None:
                group = ds.group(gate.partitions)
                if group.complete:
                    gate.complete = True
                else:
                    gate._group = group
                    group.waiting.append(gate)
            else:
                recorded = ds.attempts
                missing = [p for p, a in zip(gate.partitions, attempts) if a < 0 and p not in recorded]
                for p in missing:
                    listed = ds.waiting.get(p)
                    if listed is None:
                        ds.waiting[p] = [gate]
                    else:
                        listed.append(gate)
                gate.missing = len(missing)
                gate.complete = not missing
            return gate, not gate.complete

    def _forget_older_than_awaited(self, job_id: str, ds: "_DataSetPartitions", gate: InputGate) -> None:
        """Recorded attempts older than those the gate's descriptor waits for are stale: the
        JobManager restarted their producers. Per distinct range and awaited attempt this scans
        the record once, so P consumers of a restarted ALL_TO_ALL producer cost O(P), not O(P²)."""
        if gate._attempts is None:
            awaited = awaited_attempt(gate._uniform) if gate._uniform < 0 else 0
            key = (gate.partitions.start, gate.partitions.stop)
            if awaited <= ds.floors.get(key, 0):
                return
            ds.floors[key] = awaited
            stale = [p for p, a in ds.attempts.items() if a < awaited and p in gate.partitions]
        else:
            stale = [p for p, a in zip(gate.partitions, gate._attempts)
                     if a < 0 and ds.attempts.get(p, awaited_attempt(a)) < awaited_attempt(a)]
        for p in stale:
            self._forget(job_id, gate.data_set_id, p, ds.attempts[p])

    def close(self, gates: Iterable[InputGate]) -> None:
        """The task is done with its gates: they are never called back."""
        with self._lock:
            for gate in gates:
                if gate.closed:
                    continue
                gate.closed = True
                # The callback refers to the task, which refers to its gates: dropping it lets a
                # finished task go without the cycle collector.
                gate.on_complete = None
                group = gate._group
                if group is not None and not gate.complete:
                    group.closed += 1
                    if group.closed > _COMPACT_SHARE * len(group.waiting):
                        group.waiting = [g for g in group.waiting if not g.closed]
                        group.closed = 0

    def snapshot(self, job_id: str, gate: InputGate) -> GateSnapshot:
        """What a complete gate reads: per partition, the newer of the descriptor's attempt and
        the recorded one."""
        ds = gate._data_set
        assert ds is not None, "snapshot of a gate that was never opened"
        with self._lock:
            recorded = dict(ds.attempts)  # copied under the lock, read outside it
            schema = ds.schema or gate.schema
        if gate._attempts is not None:
            described: Iterable[int] = gate._attempts
        else:
            described = (gate._uniform,) * len(gate.partitions)
        attempts = tuple(a if a >= 0 else recorded.get(p, UNAVAILABLE) for p, a in zip(gate.partitions, described))
        if min(attempts, default=0) < 0:
            lost = [p for p, a in zip(gate.partitions, attempts) if a < 0]
            raise PartitionUnavailable(
                f"{gate.describe()}: partition(s) {lost[:10]} of job {job_id} became unavailable before they were read")
        return GateSnapshot(gate.input_index, gate.data_set_id, gate.partitions, gate.subpartition, attempts, schema)

    # ---- what the JobManager tells ----

    def update(self, job_id: str, updates: Iterable[cluster_pb2.PartitionInfoUpdate]) -> None:
        """Partitions became available (UpdatePartitionInfo); gates they complete are called back."""
        fired: list[Callback] = []
        with self._lock:
            data_sets = self._jobs.get(job_id)
            if data_sets is None:
                data_sets = self._jobs[job_id] = {}
            for u in updates:
                ds = data_sets.get(u.data_set_id)
                if ds is None:
                    ds = data_sets[u.data_set_id] = _DataSetPartitions()
                self._record(ds, u.partition_index, u.producer_attempt, u.schema, fired)
        self._run(fired)

    def update_one(self, job_id: str, data_set_id: str, partition_index: int, producer_attempt: int,
                   schema: str = "") -> None:
        fired: list[Callback] = []
        with self._lock:
            self._record(self._data_set(job_id, data_set_id), partition_index, producer_attempt, schema, fired)
        self._run(fired)

    @staticmethod
    def _record(ds: _DataSetPartitions, index: int, attempt: int, schema: str, fired: list[Callback]) -> None:
        if schema:
            ds.schema = schema
        if attempt < 0:
            return  # names no attempt: nothing became available
        old = ds.attempts.get(index)
        if old is not None and old >= attempt:
            return  # the same news again, or an older attempt than the one we know
        ds.attempts[index] = attempt
        if old is not None:
            return  # a newer attempt of a partition that was available already: counts unchanged
        for group in ds.groups_of.get(index, ()):
            group.available += 1
            if group.complete and group.waiting:
                waiting, group.waiting, group.closed = group.waiting, [], 0
                for gate in waiting:
                    if gate.on_complete is not None:  # None: closed
                        gate.complete = True
                        fired.append(gate.on_complete)
        waiting_gates = ds.waiting.pop(index, None)
        if waiting_gates:
            for gate in waiting_gates:
                gate.missing -= 1
                if gate.missing == 0 and gate.on_complete is not None:
                    gate.complete = True
                    fired.append(gate.on_complete)

    def supersede(self, job_id: str, data_set_id: str, partition_index: int, producer_attempt: int) -> None:
        """Attempt `producer_attempt` of the partition's producer is deployed: whatever an older
        attempt made is stale (the JobManager reset the partition before redeploying it)."""
        with self._lock:
            self._forget(job_id, data_set_id, partition_index, producer_attempt - 1)

    def release(self, job_id: str, data_set_id: str, partition_index: int, producer_attempt: int) -> None:
        """The partition (up to this attempt) is released: later tasks must not count on it."""
        with self._lock:
            self._forget(job_id, data_set_id, partition_index, producer_attempt)

    def _forget(self, job_id: str, data_set_id: str, index: int, up_to_attempt: int) -> None:
        # Gates already complete stay complete (their tasks are being cancelled by the JobManager,
        # which invalidated the partition); groups still waiting count it as missing again. A
        # gate that listed attempts and is still waiting keeps its count: its snapshot catches
        # the loss (PartitionUnavailable).
        ds = self._jobs.get(job_id, {}).get(data_set_id)
        if ds is None:
            return
        old = ds.attempts.get(index)
        if old is None or old > up_to_attempt:
            return
        del ds.attempts[index]
        for group in ds.groups_of.get(index, ()):
            group.available -= 1

    def drop_job(self, job_id: str) -> None:
        """Forget everything of the job (its open gates keep working on what they have)."""
        with self._lock:
            self._jobs.pop(job_id, None)

    def clear(self) -> None:
        with self._lock:
            self._jobs.clear()

    def jobs(self) -> list[str]:
        with self._lock:
            return list(self._jobs)
