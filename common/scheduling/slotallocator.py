"""One job's slots, for its scheduler: which slot each ExecutionSlotSharingGroup runs in and how the
job gets and gives back slots (Flink's SlotSharingExecutionSlotAllocator over the job's slot pool).

Owns the job's slot books:

- the slot map (`slot_of`): the slot each group holds, and how many live executions need it (`usage`);
- the slot pool (`idle`): the job's slots no group runs in, taken by the groups scheduled next and
  handed back after the idle timeout;
- the slot requests the job waits for (`requests`, and `requested`: the request of each group);
- the deployment bulks (`bulks`): executions scheduled together (a pipelined region, or every region
  of an eagerly scheduled job), deployed once every one of their groups has a slot, and the index
  of the bulks waiting for each group.

The scheduler decides: when executions are scheduled, deployed and cancelled, and when a group no
longer needs its slot; this module keeps the books and says which executions are ready to deploy.
It is sans-IO like the scheduler: the slot actions it decides (`RequestSlots`, `CancelSlotRequest`,
`ReleaseSlot`) are appended to the action list it is handed. `validate` checks its invariants.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from funke.common.graph.executiongraph import Execution, ExecutionVertex, SlotId
from funke.common.scheduling.actions import Action, CancelSlotRequest, ReleaseSlot, RequestSlots
from funke.common.scheduling.slotsharing import ExecutionSlotSharingGroup, SlotRequest, SlotSharingPlan
from funke.common.states import DEPLOYED_EXECUTION_STATES, LIVE_EXECUTION_STATES, ExecutionState

__all__ = ["DeploymentBulk", "ExecutionSlotAllocator", "PendingSlotRequest"]

E = ExecutionState
Group = ExecutionSlotSharingGroup


@dataclass(eq=False, slots=True)
class DeploymentBulk:
    """Executions scheduled together; deployed once every one of their groups has a slot. An
    execution that is no longer its vertex's current one, or no longer SCHEDULED, is ignored."""

    executions: list[Execution]
    groups: list[Group]

    def waiting(self) -> list[Execution]:
        return [ex for ex in self.executions if ex.vertex.current_execution is ex and ex.machine.state is E.SCHEDULED]


@dataclass(eq=False, slots=True)
class PendingSlotRequest:
    """A slot request sent for `groups`: all at once, or (independent) in parts, in order, of
    which the first `served` have their slots."""

    groups: list[Group]
    independent: bool = False
    served: int = 0

    def unserved(self) -> list[Group]:
        return self.groups[self.served:]


class ExecutionSlotAllocator:
    """One job's slot books. See the module docstring."""

    def __init__(self, plan: SlotSharingPlan, *, request_timeout_s: float, idle_timeout_s: float):
        self.plan = plan
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s  # <= 0: a slot no group needs goes back at once
        # Never replaced (the scheduler's transitions hold them): live executions per group (kept
        # by those transitions), the slot each group holds.
        self.usage: dict[Group, int] = {}
        self.slot_of: dict[Group, SlotId] = {}
        # The job's slots no group runs in (its slot pool): taken by the groups scheduled next,
        # handed back after the idle timeout. Empty whenever a slot request is pending.
        self.idle: deque[SlotId] = deque()
        self.requested: dict[Group, int] = {}  # group -> pending request id
        self.requests: dict[int, PendingSlotRequest] = {}  # pending slot requests by id
        self.bulks: dict[DeploymentBulk, None] = {}  # waiting bulks, in order (an ordered set)
        # group -> bulks that wait for it: deployed bulks leave at once, others lazily
        self._bulks_with_group: dict[Group, list[DeploymentBulk]] = {}
        self._next_request_id = 1

    # ------------------------------------------------------------------ scheduling

    def schedule(self, bulks: list[list[ExecutionVertex]], *, deploy_now: bool, independent_requests: bool,
                 out: list[Action]) -> tuple[list[Execution], list[DeploymentBulk]]:
        """Bulks of vertices whose current executions were just SCHEDULED: each takes idle slots,
        else asks for the slots its groups lack (one RequestSlots for all). Returns the executions
        to deploy at once (`deploy_now`: their groups hold slots, kept or idle), in order, and the
        new waiting bulks (`take_ready` says which of them are ready). `independent_requests`:
        bulks lacking one slot each (regions in one slot-sharing group, as a batch job's
        one-subtask regions) share one independent request instead of one request each."""
        requests: list[SlotRequest] = []
        lacking_one: list[Group] = []
        lacking: set[Group] = set()
        lacking_at = 0
        new_bulks: list[DeploymentBulk] = []
        group_of, slot_of, requested = self.plan.group_of, self.slot_of, self.requested
        waiting, with_group = self.bulks, self._bulks_with_group
        ready: list[Execution] = []
        idle = self.idle if deploy_now else None
        for vertices in bulks:
            if len(vertices) == 1:  # a batch job's one-subtask regions: thousands at once
                group = group_of(vertices[0])
                if idle and group not in slot_of:
                    slot_of[group] = idle.popleft()  # a slot the job holds, idle
                if deploy_now and group in slot_of:
                    ready.append(vertices[0].current_execution)  # its group's slot: kept, or idle
                    continue
                groups = [group]
                missing = [] if group in slot_of or group in requested or group in lacking else [group]
            else:
                groups = list(dict.fromkeys([group_of(ev) for ev in vertices]))
                if idle:
                    self.take_idle(groups)
                if deploy_now and all(g in slot_of for g in groups):
                    # its groups' slots are held (kept through a global failover, or idle): deployed in order
                    ready.extend(ev.current_execution for ev in vertices)
                    continue
                missing = [g for g in groups if g not in slot_of and g not in requested and g not in lacking]
            if len(missing) == 1 and independent_requests:
                if not lacking_one:
                    lacking_at = len(requests)  # asked for in the order of the regions
                lacking_one.append(missing[0])
                lacking.add(missing[0])
            elif missing:
                requests.append(self._new_request(missing))
            bulk = DeploymentBulk([ev.current_execution for ev in vertices], groups)
            waiting[bulk] = None
            for g in groups:
                listed = with_group.get(g)
                if listed is None:
                    with_group[g] = [bulk]
                else:
                    listed.append(bulk)
            new_bulks.append(bulk)
        if lacking_one:
            requests.insert(lacking_at, self._new_request(lacking_one, independent=True))
        if requests:
            out.append(RequestSlots(tuple(requests), self.request_timeout_s))
        return ready, new_bulks

    def _new_request(self, groups: list[Group], independent: bool = False) -> SlotRequest:
        """A slot request for `groups`: all at once, or (`independent`) each as a slot is free."""
        request_id = self._next_request_id
        self._next_request_id += 1
        self.requests[request_id] = PendingSlotRequest(groups, independent)
        requested = self.requested
        if len(groups) == 1:
            group = groups[0]
            requested[group] = request_id
            return SlotRequest(request_id, 1, ((group.slot_sharing_group, 1),))
        per_group: dict[str, int] = {}
        for g in groups:
            requested[g] = request_id
            per_group[g.slot_sharing_group] = per_group.get(g.slot_sharing_group, 0) + 1
        return SlotRequest(request_id, len(groups), tuple(sorted(per_group.items())), independent)

    def request(self, groups: list[Group], out: list[Action]) -> None:
        """Ask for a slot for each of `groups`, all at once."""
        out.append(RequestSlots((self._new_request(groups),), self.request_timeout_s))

    def take_idle(self, groups: Iterable[Group]) -> None:
        """Groups without a slot take the job's idle ones, in order, while there are."""
        idle, slot_of = self.idle, self.slot_of
        for g in groups:
            if not idle:
                return
            if g not in slot_of:
                slot_of[g] = idle.popleft()

    def missing_groups(self) -> list[Group]:
        """Groups of waiting bulks with neither a slot nor a pending request (their slot was on a
        TaskManager that is gone), in the order of the bulks."""
        missing: dict[Group, None] = {}
        slot_of, requested = self.slot_of, self.requested
        for bulk in self.bulks:
            for g in bulk.groups:
                if g not in slot_of and g not in requested:
                    missing[g] = None
        return list(missing)

    def bulks_needing(self, groups: Iterable[Group]) -> list[DeploymentBulk]:
        """Waiting bulks that contain any of `groups`, in the order they were made. An index, not
        a scan: a batch job at P = 10 000 has thousands of bulks waiting for slots."""
        found: dict[DeploymentBulk, None] = {}
        waiting, index = self.bulks, self._bulks_with_group
        for g in groups:
            listed = index.get(g)
            if listed:
                if len(listed) == 1:  # most groups: one bulk waits for them
                    if listed[0] in waiting:
                        found[listed[0]] = None
                    else:
                        del index[g]
                    continue
                listed[:] = [b for b in listed if b in waiting]
                for b in listed:
                    found[b] = None
        return list(found)

    def take_ready(self, bulks: Iterable[DeploymentBulk]) -> list[Execution]:
        """Of `bulks`, those still waiting whose groups all hold slots stop waiting; returns their
        executions still to deploy (current and SCHEDULED), in order."""
        waiting, slot_of = self.bulks, self.slot_of
        ready: list[Execution] = []
        for bulk in bulks:
            if bulk in waiting:
                groups = bulk.groups
                if len(groups) == 1:
                    if groups[0] not in slot_of:
                        continue
                elif not all(g in slot_of for g in groups):
                    continue
                del waiting[bulk]
                self._unindex(bulk)
                executions = bulk.executions
                if len(executions) == 1:
                    ex = executions[0]
                    if ex.vertex.current_execution is ex and ex.machine.state is E.SCHEDULED:
                        ready.append(ex)
                else:
                    ready.extend(bulk.waiting())
        return ready

    def _unindex(self, bulk: DeploymentBulk) -> None:
        """Forget a deployed bulk in the group index at once: a batch job at P = 100 000 would
        otherwise keep P deployed bulks (and their lists) until their groups are next looked up."""
        index = self._bulks_with_group
        for g in bulk.groups:
            listed = index.get(g)
            if listed is not None:
                if len(listed) == 1 and listed[0] is bulk:
                    del index[g]
                else:
                    listed[:] = [b for b in listed if b is not bulk]
                    if not listed:
                        del index[g]

    # ------------------------------------------------------------------ slots arriving, requests failing

    def allocated(self, allocations: Sequence[tuple[int, Sequence[SlotId]]], *, accept: bool,
                  out: list[Action]) -> list[Group]:
        """Slot requests served (several at once: the SlotManager serves its queue in one pass).
        Returns the groups that got their slots. Slots of requests nobody waits for any more,
        or all of them unless `accept` (the job no longer schedules), go back. ValueError, before
        anything changes, if a request gets more slots than it lacks (or fewer, all at once)."""
        expected: dict[int, int] = {}
        for request_id, slots in allocations:  # checked before anything changes
            asked = self.requests.get(request_id)
            if asked is not None:
                left = expected.get(request_id, len(asked.groups) - asked.served)
                if len(slots) > left or (len(slots) < left and not asked.independent):
                    raise ValueError(f"request {request_id}: got {len(slots)} slots for {left} groups")
                expected[request_id] = left - len(slots)
        served: list[Group] = []
        requests, requested, slot_of = self.requests, self.requested, self.slot_of
        for request_id, slots in allocations:
            asked = requests.get(request_id)
            if asked is None or not accept:
                for slot in slots:
                    out.append(ReleaseSlot(slot, "slot request no longer needed"))
                if asked is not None:
                    del requests[request_id]
                    for g in asked.unserved():
                        requested.pop(g, None)
                    if asked.served + len(slots) < len(asked.groups):  # an independent one: the rest too
                        out.append(CancelSlotRequest(request_id))
                continue
            start = asked.served
            groups = asked.groups[start:start + len(slots)]
            asked.served = start + len(slots)
            if asked.served == len(asked.groups):
                del requests[request_id]
            for group, slot in zip(groups, slots):
                requested.pop(group, None)
                slot_of[group] = slot
            served.extend(groups)
        return served

    def release_unused(self, groups: Iterable[Group], cause: str, out: list[Action]) -> None:
        """Of `groups`, those that hold a slot no live execution needs give it back (their
        executions were cancelled while the request was pending)."""
        usage, slot_of = self.usage, self.slot_of
        for group in groups:
            if usage.get(group, 0) == 0 and group in slot_of:
                self.release(group, cause, out)

    def request_failed(self, request_id: int) -> list[DeploymentBulk] | None:
        """A slot request failed: the bulks that waited for its unserved groups stop waiting and
        are returned (their executions cannot be deployed). None: no such request is pending."""
        asked = self.requests.pop(request_id, None)
        if asked is None:
            return None
        groups = asked.unserved()
        for g in groups:
            self.requested.pop(g, None)
        starved = self.bulks_needing(groups)
        for bulk in starved:
            del self.bulks[bulk]
        return starved

    def task_manager_lost(self, task_manager_id: str) -> None:
        """The slots on a TaskManager that is gone are no longer the job's."""
        slot_of = self.slot_of  # changed in place: the scheduler's transitions hold it
        for group in [g for g, s in slot_of.items() if s.task_manager_id == task_manager_id]:
            del slot_of[group]
        self.idle = deque(s for s in self.idle if s.task_manager_id != task_manager_id)

    # ------------------------------------------------------------------ giving slots back

    def free(self, group: Group, cause: str, *, keep_idle: bool, out: list[Action]) -> bool:
        """No task of `group` runs in its slot any more. The slot stays the job's, idle, for the
        groups scheduled next (Flink's slot pool: a batch job's consumers take the slots of the
        producers that finished before them), unless the job waits for slots (the SlotManager
        serves the waiting requests in their order) or (not `keep_idle`) schedules nothing any
        more. True: the pool was empty, so its idle timer must start."""
        if self.requests or not keep_idle or self.idle_timeout_s <= 0:
            self.release(group, cause, out)
            return False
        started = not self.idle
        self.idle.append(self.slot_of.pop(group))
        return started

    def release(self, group: Group, cause: str, out: list[Action]) -> None:
        out.append(ReleaseSlot(self.slot_of.pop(group), cause))

    def release_idle(self, cause: str, out: list[Action]) -> None:
        idle = self.idle
        while idle:
            out.append(ReleaseSlot(idle.popleft(), cause))

    def unused_groups(self) -> list[Group]:
        """Groups holding a slot that no live execution and no waiting bulk needs."""
        usage, waiting, index = self.usage, self.bulks, self._bulks_with_group
        return [g for g in self.slot_of if not usage.get(g) and not any(b in waiting for b in index.get(g, ()))]

    def drop_dead_bulks(self, free: Callable[[Group], None] | None, out: list[Action]) -> None:
        """Forget bulks with nothing left to deploy; `free` (None: the job keeps its slots) the
        slots only they held; cancel the slot requests nobody waits for."""
        dead = [b for b in self.bulks if not b.waiting()]
        for bulk in dead:
            del self.bulks[bulk]
        needed = {g for b in self.bulks for g in b.groups}
        if dead and free is not None:
            usage, slot_of = self.usage, self.slot_of
            for g in dict.fromkeys(g for b in dead for g in b.groups):
                if g in slot_of and not usage.get(g) and g not in needed:
                    free(g)
        for request_id, asked in list(self.requests.items()):
            groups = asked.unserved()
            if not any(g in needed for g in groups):
                del self.requests[request_id]
                for g in groups:
                    self.requested.pop(g, None)
                out.append(CancelSlotRequest(request_id))

    def cancel_requests(self, out: list[Action]) -> None:
        """Nothing waits for slots any more: every pending request is cancelled, every bulk forgotten."""
        for request_id in self.requests:
            out.append(CancelSlotRequest(request_id))
        self.requests.clear()
        self.requested.clear()
        self.bulks.clear()
        self._bulks_with_group.clear()

    def release_all(self, cause: str, out: list[Action]) -> None:
        """The job ended: every slot goes back, every request is cancelled."""
        for group in list(self.slot_of):
            self.release(group, cause, out)
        self.release_idle(cause, out)
        self.cancel_requests(out)

    # ------------------------------------------------------------------ invariants

    def validate(self, vertices: Sequence[ExecutionVertex], *, terminal: bool, idle_timer: bool) -> None:
        """Check the books against the job's execution vertices; AssertionError naming the first
        disagreement. O(tasks): for tests and fuzzing. `terminal`: the job ended; `idle_timer`:
        the scheduler has a timer to hand idle slots back."""
        group_of = self.plan.group_of
        live: dict[Group, int] = {}
        for ev in vertices:
            if ev.state in LIVE_EXECUTION_STATES:
                group = group_of(ev)
                live[group] = live.get(group, 0) + 1
        for group in set(live) | set(self.usage):
            assert self.usage.get(group, 0) == live.get(group, 0), (
                f"slot-sharing group {group.index}: usage={self.usage.get(group, 0)}, "
                f"{live.get(group, 0)} live executions")
        slots = list(self.slot_of.values())
        assert len(slots) == len(set(slots)), f"two groups in one slot: {sorted(map(str, slots))}"
        idle = set(self.idle)
        assert len(idle) == len(self.idle) and not idle & set(slots), (
            f"an idle slot twice, or also a group's: {sorted(map(str, self.idle))}")
        assert not (idle and self.requests), f"idle slots {sorted(map(str, idle))} while requests {sorted(self.requests)} wait"
        assert not idle or idle_timer, "idle slots without a timer to hand them back"
        for request_id, asked in self.requests.items():
            for g in asked.unserved():
                assert self.requested.get(g) == request_id, (
                    f"group {g.index} waits for request {request_id}, its books say {self.requested.get(g)}")
        for g, request_id in self.requested.items():
            asked = self.requests.get(request_id)
            assert asked is not None and g in asked.unserved(), f"group {g.index} waits for request {request_id}, not pending"
        for bulk in self.bulks:
            for g in bulk.groups:
                assert any(b is bulk for b in self._bulks_with_group.get(g, ())), (
                    f"a waiting bulk is not indexed under its group {g.index}")
        if terminal:
            assert not self.slot_of and not idle, f"the job ended but holds slots {sorted(map(str, slots + list(idle)))}"
            assert not self.requests, f"the job ended but slot requests are pending: {sorted(self.requests)}"
            assert not self.bulks, f"the job ended but {len(self.bulks)} bulks wait"
            return
        for ev in vertices:
            ex = ev.current_execution
            if ex.state in DEPLOYED_EXECUTION_STATES or ex.state is E.CANCELING:
                slot = self.slot_of.get(group_of(ev))
                assert slot == ex.slot, f"{ex!r} runs in {ex.slot}, its group holds {slot}"
