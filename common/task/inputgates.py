"""Partition availability on one TaskManager, and the input gates its tasks wait on.

Owns, per (job, data set), which partitions are available and from which producer attempt, as the
JobManager announced them (UpdatePartitionInfo), and the gates of the tasks reading them. Part of
the TaskManager's core (`taskexecutorstate.py`): pure bookkeeping, touched by one thread only.

An update is recorded once per TaskManager, whatever number of local tasks read it: recording
partition k costs O(1) plus O(number of distinct partition ranges containing k), because gates
that read the same range of a data set without knowing any producer attempt yet (the P consumers
of an ALL_TO_ALL edge deployed eagerly) share one `_ConsumedPartitionGroup` and its count of
available partitions (Flink's name for the same idea). A gate that becomes complete calls its
owner back, once.

What a gate reads is the newer of the producer attempt its deployment names (`Available(n)`) and
the one recorded here, so an update that arrived before the task's deployment counts as much as
one that arrived after it, and a newer producer attempt supersedes an older one. Entries leave
when this TaskManager learns they are stale: a newer attempt of the producer is deployed here, the
partition is released here, a gate opens that awaits a newer attempt (`Awaiting(n)`) than the one
recorded (the JobManager restarted the producer on another TaskManager), or the job holds no slot
here any more (then everything of the job goes). So a gate never completes on an attempt the
JobManager has reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from funke.common.graph.deployment import Available, Awaiting, InputGateDeployment, PartitionUpdate

__all__ = ["GateSnapshot", "InputGate", "PartitionAvailability", "UNAVAILABLE"]

UNAVAILABLE = -1  # in a snapshot: a partition whose attempt is not known

Callback = Callable[[], None]

# A group compacts its list of waiting gates once more than this share of them has closed
# (cancelled tasks), so a long wait through many cancellations does not grow without end.
_COMPACT_SHARE = 0.5
# Gates over at least this many partitions share their reads (`snapshot`); narrower ones are
# cheaper to read again than to remember.
_SHARED_VIEW_MIN = 16


@dataclass(frozen=True, slots=True)
class GateSnapshot:
    """What a task reads from one input, fixed when its gate completed: per partition of the
    range, the producer attempt whose output to read."""

    input_index: int
    data_set_id: str
    partitions: range
    subpartition: int | None
    attempts: tuple[int, ...]
    schema: str
    # partitions of the range with no known attempt (released before the gate's task read them)
    unavailable: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"input {self.input_index} (data set {self.data_set_id!r})"


class _ConsumedPartitionGroup:
    """A range of one data set read by gates that had no producer attempt from their deployments;
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

    __slots__ = ("attempts", "version", "views", "schema", "groups", "groups_of", "waiting", "floors", "minimum")

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}  # partition index -> newest producer attempt available
        self.version = 0  # bumped whenever `attempts` changes
        # (start, stop, uniform) of gates that name no producer per partition -> (version, attempts,
        # unavailable) as last read: the P consumers of an ALL_TO_ALL edge that complete together
        # share one O(P) read instead of each making its own
        self.views: dict[tuple[int, int, Available | Awaiting], tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
        # (start, stop) of a range -> the highest attempt a gate over it was told to wait for
        self.floors: dict[tuple[int, int], int] = {}
        # partition index -> the oldest attempt that is not stale (a newer one was deployed here,
        # or a gate listing producers awaits it): late news of an older one is ignored
        self.minimum: dict[int, int] = {}
        self.schema = ""
        self.groups: dict[tuple[int, int], _ConsumedPartitionGroup] = {}
        # Index: partition -> the groups whose range contains it. Built once per distinct range,
        # so its size is bounded by the ranges deployed here (P for ALL_TO_ALL, P for POINTWISE).
        self.groups_of: dict[int, list[_ConsumedPartitionGroup]] = {}
        # Gates whose deployment named some attempts but not all: partition -> gates missing it.
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
    from the deployment or from the TaskManager's record; `on_complete` is called once, when it
    becomes complete after it was opened (not if it was complete from the start)."""

    __slots__ = ("deployment", "_data_set", "_group", "missing", "complete", "closed", "on_complete")

    def __init__(self, deployment: InputGateDeployment, on_complete: Callback):
        self.deployment = deployment
        self._data_set: _DataSetPartitions | None = None
        self._group: _ConsumedPartitionGroup | None = None
        self.missing = 0  # partitions a gate with listed producers still waits for
        self.complete = False
        self.closed = False
        self.on_complete: Callback | None = on_complete

    @property
    def partitions(self) -> range:
        return self.deployment.partitions

    def describe(self) -> str:
        return self.deployment.describe()


class PartitionAvailability:
    """The registry of available partitions of every job on this TaskManager."""

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, _DataSetPartitions]] = {}

    def _data_set(self, job_id: str, data_set_id: str) -> _DataSetPartitions:
        data_sets = self._jobs.get(job_id)
        if data_sets is None:
            data_sets = self._jobs[job_id] = {}
        ds = data_sets.get(data_set_id)
        if ds is None:
            ds = data_sets[data_set_id] = _DataSetPartitions()
        return ds

    # ---- gates ----

    def open_gate(self, job_id: str, deployment: InputGateDeployment, on_complete: Callback) -> tuple[InputGate, bool]:
        """A task's gate for one input, and whether it has to wait (then `on_complete` follows).

        O(1) for a gate whose deployment names one attempt for all partitions (uniform), and for
        one that shares a range already seen here; O(range) once per new range, and for a gate
        whose deployment lists producers per partition (as long as that list)."""
        gate = InputGate(deployment, on_complete)
        ds = self._data_set(job_id, deployment.data_set_id)
        gate._data_set = ds
        self._forget_older_than_awaited(job_id, ds, gate)
        producers, uniform = deployment.producers, deployment.uniform
        if not deployment.partitions or (producers is None and isinstance(uniform, Available)) or (
                producers is not None and all(type(p) is Available for p in producers)):
            gate.complete = True
        elif producers is None:
            group = ds.group(deployment.partitions)
            if group.complete:
                gate.complete = True
            else:
                gate._group = group
                group.waiting.append(gate)
        else:
            recorded = ds.attempts
            missing = [p for p, a in zip(deployment.partitions, producers)
                       if type(a) is Awaiting and p not in recorded]
            for p in missing:
                listed = ds.waiting.get(p)
                if listed is None:
                    ds.waiting[p] = [gate]
                else:
                    listed.append(gate)
            gate.missing = len(missing)
            gate.complete = not missing
        return gate, not gate.complete

    def _forget_older_than_awaited(self, job_id: str, ds: _DataSetPartitions, gate: InputGate) -> None:
        """Recorded attempts older than those the gate awaits are stale: the JobManager restarted
        their producers. Per distinct range and awaited attempt this scans the record once, so P
        consumers of a restarted ALL_TO_ALL producer cost O(P), not O(P²)."""
        d = gate.deployment
        if d.producers is None:
            awaited = d.uniform.attempt if isinstance(d.uniform, Awaiting) else 0
            key = (d.partitions.start, d.partitions.stop)
            if awaited <= ds.floors.get(key, 0):
                return
            ds.floors[key] = awaited
            stale = [p for p, a in ds.attempts.items() if a < awaited and p in d.partitions]
        else:
            stale = []
            for p, a in zip(d.partitions, d.producers):
                if type(a) is Awaiting:
                    if a.attempt > ds.minimum.get(p, 0):
                        ds.minimum[p] = a.attempt
                    if ds.attempts.get(p, a.attempt) < a.attempt:
                        stale.append(p)
        for p in stale:
            self._forget(job_id, d.data_set_id, p, ds.attempts[p])

    def close(self, gates: Iterable[InputGate]) -> None:
        """The task is done with its gates: they are never called back."""
        for gate in gates:
            if gate.closed:
                continue
            gate.closed = True
            gate.on_complete = None
            group = gate._group
            if group is not None and not gate.complete:
                group.closed += 1
                if group.closed > _COMPACT_SHARE * len(group.waiting):
                    group.waiting = [g for g in group.waiting if not g.closed]
                    group.closed = 0

    def snapshot(self, job_id: str, gate: InputGate) -> GateSnapshot:
        """What a complete gate reads: per partition, the newer of the deployment's attempt and
        the recorded one. Gates over the same range with the same uniform deployment share the
        read while nothing changes in between, so P such snapshots cost O(P), not O(P²)."""
        ds = gate._data_set
        assert ds is not None, "snapshot of a gate that was never opened"
        d = gate.deployment
        recorded = ds.attempts
        if d.producers is not None or len(d.partitions) < _SHARED_VIEW_MIN:
            producers = d.producers if d.producers is not None else (d.uniform,) * len(d.partitions)
            attempts = tuple(a.attempt if type(a) is Available else recorded.get(p, UNAVAILABLE)
                             for p, a in zip(d.partitions, producers))
            unavailable = tuple(p for p, a in zip(d.partitions, attempts) if a == UNAVAILABLE)
        else:
            key = (d.partitions.start, d.partitions.stop, d.uniform)
            view = ds.views.get(key)
            if view is not None and view[0] == ds.version:
                attempts, unavailable = view[1], view[2]
            else:
                if type(d.uniform) is Available:
                    attempts, unavailable = (d.uniform.attempt,) * len(d.partitions), ()
                else:
                    attempts = tuple(recorded.get(p, UNAVAILABLE) for p in d.partitions)
                    unavailable = tuple(p for p, a in zip(d.partitions, attempts) if a == UNAVAILABLE)
                ds.views[key] = (ds.version, attempts, unavailable)
        return GateSnapshot(d.input_index, d.data_set_id, d.partitions, d.subpartition, attempts,
                            ds.schema or d.schema, unavailable)

    # ---- what the JobManager tells ----

    def update(self, job_id: str, updates: Iterable[PartitionUpdate]) -> list[Callback]:
        """Partitions became available (UpdatePartitionInfo); returns the callbacks of the gates
        they completed, for the caller to run."""
        fired: list[Callback] = []
        data_sets = self._jobs.get(job_id)
        if data_sets is None:
            data_sets = self._jobs[job_id] = {}
        for u in updates:
            ds = data_sets.get(u.data_set_id)
            if ds is None:
                ds = data_sets[u.data_set_id] = _DataSetPartitions()
            self._record(ds, u.partition_index, u.producer_attempt, u.schema, fired)
        return fired

    @staticmethod
    def _record(ds: _DataSetPartitions, index: int, attempt: int, schema: str, fired: list[Callback]) -> None:
        if schema:
            ds.schema = schema
        if attempt < 0:
            return  # names no attempt: nothing became available
        old = ds.attempts.get(index)
        if old is not None and old >= attempt:
            return  # the same news again, or an older attempt than the one we know
        if attempt < ds.minimum.get(index, 0):
            return  # late news of an attempt that was superseded
        groups = ds.groups_of.get(index, ())
        if any(attempt < ds.floors.get((g.partitions.start, g.partitions.stop), 0) for g in groups):
            return  # late news of an attempt older than gates over this partition await
        ds.attempts[index] = attempt
        ds.version += 1
        if old is not None:
            return  # a newer attempt of a partition that was available already: counts unchanged
        for group in groups:
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
        ds = self._data_set(job_id, data_set_id)
        if producer_attempt > ds.minimum.get(partition_index, 0):
            ds.minimum[partition_index] = producer_attempt
        self._forget(job_id, data_set_id, partition_index, producer_attempt - 1)

    def release(self, job_id: str, data_set_id: str, partition_index: int, producer_attempt: int) -> None:
        """The partition (up to this attempt) is released: later tasks must not count on it."""
        self._forget(job_id, data_set_id, partition_index, producer_attempt)

    def _forget(self, job_id: str, data_set_id: str, index: int, up_to_attempt: int) -> None:
        # Gates already complete stay complete (their tasks are being cancelled by the JobManager,
        # which invalidated the partition); groups still waiting count it as missing again.
        ds = self._jobs.get(job_id, {}).get(data_set_id)
        if ds is None:
            return
        old = ds.attempts.get(index)
        if old is None or old > up_to_attempt:
            return
        del ds.attempts[index]
        ds.version += 1
        for group in ds.groups_of.get(index, ()):
            group.available -= 1

    def drop_job(self, job_id: str) -> None:
        """Forget everything of the job (its open gates keep working on what they have)."""
        self._jobs.pop(job_id, None)

    def clear(self) -> None:
        self._jobs.clear()

    def jobs(self) -> list[str]:
        return list(self._jobs)

    def knows(self, job_id: str) -> bool:
        return job_id in self._jobs
