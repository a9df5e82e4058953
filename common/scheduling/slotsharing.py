"""Slot sharing: which subtasks run together in one slot, and whether the cluster has the slots.

Owns ExecutionSlotSharingGroup (the subtasks that one slot will host), the SlotSharingPlan built for
an ExecutionGraph, the bulk SlotRequest the scheduler sends the ResourceManager's slot manager for
the groups, and the "not enough slots" diagnosis both report.

The plan follows Flink's LocalInputPreferredSlotSharingStrategy: job vertices are visited in
topological order, and each subtask joins, in order of preference,
  1. the group of its co-location constraint (hard: subtask i of every member of a co-location
     group shares one slot),
  2. the group of one of its producers in the same slot-sharing group (local input), or
  3. the oldest group of its slot-sharing group that holds no subtask of its job vertex yet,
     else a new group.
A group holds at most one subtask per job vertex, so a slot-sharing group needs as many slots as
its largest parallelism. Building the plan is O(total subtasks + consumed partitions): an
ALL_TO_ALL input is one shared ConsumedPartitionGroup whose candidate groups are listed once and
each looked at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, cast

from funke.common.records import quick_init
from funke.common.graph.executiongraph import (
    ConsumedPartitionGroup,
    ExecutionGraph,
    ExecutionJobVertex,
    ExecutionVertex,
)


class ExecutionSlotSharingGroup:
    """Subtasks that share one slot; at most one subtask per job vertex. Equal only to itself."""

    __slots__ = ("index", "slot_sharing_group", "vertices")

    def __init__(self, index: int, slot_sharing_group: str):
        self.index = index
        self.slot_sharing_group = slot_sharing_group
        self.vertices: list[ExecutionVertex] = []

    def __len__(self) -> int:
        return len(self.vertices)

    def __iter__(self) -> Iterator[ExecutionVertex]:
        return iter(self.vertices)

    def __repr__(self) -> str:
        members = ", ".join(str(ev.id) for ev in self.vertices)
        return f"ExecutionSlotSharingGroup({self.index}, '{self.slot_sharing_group}', [{members}])"


class SlotSharingPlan:
    """The ExecutionSlotSharingGroups of one ExecutionGraph, in creation order."""

    __slots__ = ("groups", "by_job_vertex")

    def __init__(self, groups: list[ExecutionSlotSharingGroup],
                 by_job_vertex: dict[str, list[ExecutionSlotSharingGroup]]):
        self.groups = groups
        # job vertex id -> the group of each subtask, indexed by subtask index (`group_of` checks
        # that the subtask is one of this plan's; the scheduler's hot loops index it directly)
        self.by_job_vertex = by_job_vertex

    def group_of(self, ev: ExecutionVertex) -> ExecutionSlotSharingGroup:
        try:
            return self.by_job_vertex[ev.job_vertex.id][ev.subtask_index]
        except (KeyError, IndexError):
            raise KeyError(f"{ev.name} ({ev.id}) is not part of this slot-sharing plan") from None

    def required_slots(self) -> int:
        return len(self.groups)

    def required_slots_per_group(self) -> dict[str, int]:
        """Slot-sharing group name -> slots it needs, in order of first appearance."""
        counts: dict[str, int] = {}
        for group in self.groups:
            counts[group.slot_sharing_group] = counts.get(group.slot_sharing_group, 0) + 1
        return counts

    def __repr__(self) -> str:
        return f"SlotSharingPlan({len(self.groups)} groups, {self.required_slots_per_group()})"


def build_slot_sharing_plan(graph: ExecutionGraph) -> SlotSharingPlan:
    groups: list[ExecutionSlotSharingGroup] = []
    # slot-sharing group name -> its ESSGs in creation order ("oldest first" for step 3)
    pools: dict[str, list[ExecutionSlotSharingGroup]] = {}
    by_job_vertex: dict[str, list[ExecutionSlotSharingGroup]] = {}
    # co-location group name -> subtask index -> ESSG; filled once a whole job vertex is placed,
    # so the first member of a co-location group places freely and later members follow it
    constraints: dict[str, dict[int, ExecutionSlotSharingGroup]] = {}

    for ejv in graph.vertices.values():  # topological order
        ssg = ejv.slot_sharing_group
        pool = pools.setdefault(ssg, [])
        placed: list[ExecutionSlotSharingGroup | None] = [None] * ejv.parallelism
        # ESSGs already holding a subtask of this job vertex: no longer available to it
        taken: set[ExecutionSlotSharingGroup] = set()
        # per consumed group, the producers' ESSGs not yet looked at; shared by all consumer
        # subtasks of the group, which is what keeps ALL_TO_ALL inputs linear
        candidates: dict[ConsumedPartitionGroup, deque[ExecutionSlotSharingGroup]] = {}
        constraint = constraints.get(ejv.co_location_group) if ejv.co_location_group else None

        def place(ev: ExecutionVertex, group: ExecutionSlotSharingGroup) -> None:
            group.vertices.append(ev)
            taken.add(group)
            placed[ev.subtask_index] = group

        # Pass 1 places every subtask that has a preference before pass 2 hands out free groups,
        # so that a subtask without preference cannot take the group a later sibling's input
        # would have chosen.
        remaining: list[ExecutionVertex] = []
        for ev in ejv.task_vertices:
            group = constraint.get(ev.subtask_index) if constraint is not None else None
            if group is not None:
                if group.slot_sharing_group != ssg:
                    raise ValueError(
                        f"{ev.name}: co-location group '{ejv.co_location_group}' spans slot-sharing "
                        f"groups '{group.slot_sharing_group}' and '{ssg}'; validate the job graph first"
                    )
            else:
                group = _producer_group(ev, ejv, taken, candidates, by_job_vertex)
            if group is None:
                remaining.append(ev)
            else:
                place(ev, group)

        # Pass 2: the oldest group without a subtask of this job vertex. The cursor only skips
        # groups this job vertex took (at most its parallelism of them), so this stays linear.
        cursor = 0
        for ev in remaining:
            while cursor < len(pool) and pool[cursor] in taken:
                cursor += 1
            if cursor < len(pool):
                group = pool[cursor]
            else:
                group = ExecutionSlotSharingGroup(len(groups), ssg)
                groups.append(group)
                pool.append(group)
            place(ev, group)

        final = cast(list[ExecutionSlotSharingGroup], placed)  # every subtask is placed by now
        by_job_vertex[ejv.id] = final
        if ejv.co_location_group:
            constraint = constraints.setdefault(ejv.co_location_group, {})
            for index, group in enumerate(final):
                constraint.setdefault(index, group)

    return SlotSharingPlan(groups, by_job_vertex)


def _producer_group(
    ev: ExecutionVertex,
    ejv: ExecutionJobVertex,
    taken: set[ExecutionSlotSharingGroup],
    candidates: dict[ConsumedPartitionGroup, deque[ExecutionSlotSharingGroup]],
    by_job_vertex: dict[str, list[ExecutionSlotSharingGroup]],
) -> ExecutionSlotSharingGroup | None:
    """The first producer ESSG of `ev`'s inputs that holds no subtask of `ejv` yet. Every
    candidate is dropped once looked at, accepted or not, as Flink does."""
    for consumed in ev.consumed_partition_groups:
        queue = candidates.get(consumed)
        if queue is None:
            producer = consumed.result.producer
            if producer.slot_sharing_group == ejv.slot_sharing_group:
                producer_groups = by_job_vertex[producer.id]
                # partition i is written by producer subtask i; producers of one job vertex sit
                # in distinct ESSGs, so the queue has no duplicates
                queue = deque(producer_groups[p.partition_index] for p in consumed.partitions)
            else:
                queue = deque()
            candidates[consumed] = queue
        while queue:
            group = queue.popleft()
            if group not in taken:
                return group
    return None


@quick_init
@dataclass(frozen=True, slots=True)
class SlotRequest:
    """A bulk request: all `count` slots or none (so two jobs never hold half of what they need).
    An `independent` one asks for `count` slots each of which is useful alone (the one-group
    regions of a batch job): it is served in parts, in order, as slots are free, one request for
    what would otherwise be `count` requests of one slot."""

    request_id: int
    count: int
    per_slot_sharing_group: tuple[tuple[str, int], ...]
    independent: bool = False

    @property
    def least(self) -> int:
        """The fewest slots one allocation of it takes."""
        return 1 if self.independent else self.count


@dataclass(frozen=True, slots=True)
class TaskManagerSlots:
    task_manager_id: str
    total: int
    free: int

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.total:
            raise ValueError(f"TaskManager {self.task_manager_id}: {self.free} free of {self.total} slots")


@dataclass(frozen=True, slots=True)
class SlotDiagnosis:
    """What a job needs against what the cluster has: the "not enough slots" explanation."""

    required_per_group: tuple[tuple[str, int], ...]
    task_managers: tuple[TaskManagerSlots, ...]

    @property
    def required_total(self) -> int:
        return sum(n for _, n in self.required_per_group)

    @property
    def available_total(self) -> int:
        return sum(tm.total for tm in self.task_managers)

    @property
    def free_total(self) -> int:
        return sum(tm.free for tm in self.task_managers)

    @property
    def sufficient(self) -> bool:
        return self.required_total <= self.free_total

    def __str__(self) -> str:
        per_group = ", ".join(f"'{name}': {n}" for name, n in self.required_per_group)
        noun = "slot-sharing group" if len(self.required_per_group) == 1 else "slot-sharing groups"
        needs = f"job needs {_count(self.required_total, 'slot')}"
        if self.required_per_group:
            needs += f" ({noun} {per_group})"
        if not self.task_managers:
            return f"{needs} but no TaskManager is registered"
        tms = ", ".join(f"{tm.task_manager_id} {tm.free}/{tm.total} free" for tm in self.task_managers)
        return (
            f"{needs} {'and' if self.sufficient else 'but'} the cluster has "
            f"{_count(self.available_total, 'slot')} in total, {self.free_total} free "
            f"({_count(len(self.task_managers), 'TaskManager')}: {tms})"
        )


def diagnose(required_per_group: Mapping[str, int], task_managers: Iterable[TaskManagerSlots]) -> SlotDiagnosis:
    return SlotDiagnosis(tuple(required_per_group.items()), tuple(task_managers))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
