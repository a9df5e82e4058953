"""The ResourceManager's slot bookkeeping: registered TaskManagers, their slots, heartbeat
deadlines, and the bulk slot requests of jobs.

Sans-IO: methods take events (with `now` passed in) and return actions for the JobManager shell.
A request is all-or-nothing (`count` slots at once), so two jobs never each hold half of what they
need, unless it is independent (slots each useful alone: served in parts, each part its own
SlotsAllocated). Requests are served first-fit in arrival order. A request may wait as long as the cluster
*could* serve it (its slots are merely busy); it fails after the slot-request timeout only while
it is unfulfillable — more slots than all registered TaskManagers have — which is what "waiting
for TaskManagers" means. Slots are picked packed (fill one TaskManager first) or evenly spread
(Flink's `cluster.evenly-spread-out-slots`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from funke.common.records import quick_init
from funke.common.graph.executiongraph import SlotId
from funke.common.scheduling.slotsharing import SlotDiagnosis, SlotRequest, TaskManagerSlots, diagnose

# Defaults for one machine (Flink's 10 s / 50 s are meant for clusters); a broken heartbeat
# stream is noticed at once anyway, the timeout only catches a hung TaskManager.
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0


@quick_init
@dataclass(frozen=True, slots=True)
class SlotsAllocated:
    job_id: str
    request_id: int
    slots: tuple[SlotId, ...]


@dataclass(frozen=True, slots=True)
class SlotRequestFailed:
    job_id: str
    request_id: int
    message: str


@dataclass(frozen=True, slots=True)
class WaitingForResources:
    """Whether a job waits for slots the cluster does not have (more than all registered
    TaskManagers together): `message` says what is missing, "" that it no longer waits.
    Emitted when this changes, not for requests that merely wait for busy slots."""

    job_id: str
    message: str


@quick_init
@dataclass(frozen=True, slots=True)
class FreeSlot:
    task_manager_id: str
    slot_index: int
    job_id: str
    cause: str


@dataclass(frozen=True, slots=True)
class TaskManagerLost:
    task_manager_id: str
    cause: str
    job_ids: tuple[str, ...]  # jobs that held slots there


SlotManagerAction = SlotsAllocated | SlotRequestFailed | WaitingForResources | FreeSlot | TaskManagerLost


@dataclass(eq=False, slots=True)
class TaskManagerRegistration:
    task_manager_id: str
    address: str
    registration_id: str
    slots: list[str | None]  # job id holding each slot; None: free
    resources: dict[str, str]
    registered_at: float
    last_heartbeat: float
    free_indexes: list[int] = field(default_factory=list)  # a heap: the lowest free slot first
    ids: list[SlotId] = field(default_factory=list, repr=False)  # each slot's id, made once

    def __post_init__(self) -> None:
        self.free_indexes = [i for i, holder in enumerate(self.slots) if holder is None]
        heapq.heapify(self.free_indexes)
        self.ids = [SlotId(self.task_manager_id, i) for i in range(len(self.slots))]

    @property
    def free(self) -> int:
        return len(self.free_indexes)


@dataclass(eq=False, slots=True)
class _Pending:
    job_id: str
    request: SlotRequest
    timeout_s: float
    requested_at: float
    unfulfillable_since: float | None = None
    served: int = 0  # an independent request's slots allocated so far


@dataclass(slots=True)
class SlotManager:
    """Every operation is O(1) or O(log n) in the number of slots and pending requests, except
    those that by nature visit them all (a TaskManager's arrival or loss re-checks the pending
    requests; a job's end frees its slots): a batch job at parallelism 10 000 keeps thousands of
    requests pending while slots come and go."""

    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    evenly_spread: bool = False
    # Part of every registration id: a new JobManager (a new leader) never hands out an id an
    # earlier one did, so a TaskManager refuses what an earlier JobManager still sends.
    session: str = ""
    task_managers: dict[str, TaskManagerRegistration] = field(default_factory=dict)  # in registration order
    _pending: dict[tuple[str, int], _Pending] = field(default_factory=dict)  # in arrival order
    _pending_per_job: dict[str, int] = field(default_factory=dict)
    _unfulfillable: dict[tuple[str, int], _Pending] = field(default_factory=dict)
    _waiting_message: dict[str, str] = field(default_factory=dict)  # jobs told they wait for TaskManagers
    _total: int = 0
    _free: int = 0
    _registrations: int = 0

    # ------------------------------------------------------------------ TaskManagers

    def register(
        self, task_manager_id: str, address: str, number_of_slots: int, resources: dict[str, str], now: float
    ) -> tuple[str, list[SlotManagerAction]]:
        """Register (or re-register) a TaskManager. A known id registering again means the
        old process is gone: its slots and everything in them are lost first."""
        actions: list[SlotManagerAction] = []
        if task_manager_id in self.task_managers:
            actions += self.lose(task_manager_id, "it registered again (restarted)", now)
        self._registrations += 1
        registration_id = f"{task_manager_id}#{self.session}{self._registrations}"
        self.task_managers[task_manager_id] = TaskManagerRegistration(
            task_manager_id, address, registration_id, [None] * number_of_slots, dict(resources), now, now
        )
        self._total += number_of_slots
        self._free += number_of_slots
        actions += self._serve(now, capacity_changed=True)
        return registration_id, actions

    def heartbeat(self, task_manager_id: str, registration_id: str, now: float) -> bool:
        """False: this registration is unknown (the TaskManager must register again)."""
        tm = self.task_managers.get(task_manager_id)
        if tm is None or tm.registration_id != registration_id:
            return False
        tm.last_heartbeat = now
        return True

    def lose(self, task_manager_id: str, cause: str, now: float, registration_id: str | None = None) -> list[SlotManagerAction]:
        tm = self.task_managers.get(task_manager_id)
        if tm is None or (registration_id is not None and tm.registration_id != registration_id):
            return []
        del self.task_managers[task_manager_id]
        self._total -= len(tm.slots)
        self._free -= tm.free
        jobs = tuple(sorted({j for j in tm.slots if j is not None}))
        actions: list[SlotManagerAction] = [TaskManagerLost(task_manager_id, cause, jobs)]
        actions += self._serve(now, capacity_changed=True)  # pending requests may have become unfulfillable
        return actions

    def overdue(self, now: float) -> list[str]:
        """The TaskManagers whose heartbeats stopped (silent past the heartbeat timeout at
        `now`): what the next `check` would write off. Asks, changes nothing."""
        return [tm.task_manager_id for tm in self.task_managers.values()
                if now - tm.last_heartbeat > self.heartbeat_timeout_s]

    def check(self, now: float) -> list[SlotManagerAction]:
        """Timer tick: TaskManagers whose heartbeats stopped, requests unfulfillable too long."""
        actions: list[SlotManagerAction] = []
        for tm in list(self.task_managers.values()):
            silent = now - tm.last_heartbeat
            if silent > self.heartbeat_timeout_s:
                actions += self.lose(tm.task_manager_id, f"no heartbeat for {silent:.1f} s "
                                     f"(heartbeat timeout {self.heartbeat_timeout_s:g} s)", now)
        expired = [p for p in self._unfulfillable.values() if now - p.unfulfillable_since >= p.timeout_s]
        for p in expired:
            self._forget(p)
            actions.append(SlotRequestFailed(
                p.job_id, p.request.request_id,
                f"could not acquire the required slots within the slot request timeout of "
                f"{p.timeout_s:g} s: {self._diagnosis(p.request)}",
            ))
        if expired:
            actions += self._update_waiting({p.job_id for p in expired})
        return actions

    # ------------------------------------------------------------------ slots

    def request_slots(self, job_id: str, requests: Sequence[SlotRequest], timeout_s: float, now: float) -> list[SlotManagerAction]:
        fresh = []
        for r in requests:
            p = _Pending(job_id, r, timeout_s, now)
            self._pending[(job_id, r.request_id)] = p
            self._pending_per_job[job_id] = self._pending_per_job.get(job_id, 0) + 1
            fresh.append(p)
        actions = self._serve(now)
        newly_unfulfillable = False
        for p in fresh:
            if (p.job_id, p.request.request_id) in self._pending and p.request.least > self._total:
                p.unfulfillable_since = now
                self._unfulfillable[(p.job_id, p.request.request_id)] = p
                newly_unfulfillable = True
        if newly_unfulfillable:
            actions += self._update_waiting({job_id})
        return actions

    def cancel_request(self, job_id: str, request_id: int) -> list[SlotManagerAction]:
        p = self._pending.get((job_id, request_id))
        if p is None:
            return []
        self._forget(p)
        return self._update_waiting({job_id})

    def release_slot(self, slot: SlotId, job_id: str, cause: str, now: float) -> list[SlotManagerAction]:
        tm = self.task_managers.get(slot.task_manager_id)
        if tm is None or not 0 <= slot.slot_index < len(tm.slots) or tm.slots[slot.slot_index] != job_id:
            return []
        tm.slots[slot.slot_index] = None
        heapq.heappush(tm.free_indexes, slot.slot_index)
        self._free += 1
        return [FreeSlot(slot.task_manager_id, slot.slot_index, job_id, cause)] + self._serve(now)

    def release_job(self, job_id: str, cause: str, now: float) -> list[SlotManagerAction]:
        """The job ended: cancel its requests and free whatever it still holds."""
        for p in [p for p in self._pending.values() if p.job_id == job_id]:
            self._forget(p)
        actions: list[SlotManagerAction] = self._update_waiting({job_id})
        for tm in self.task_managers.values():
            for i, holder in enumerate(tm.slots):
                if holder == job_id:
                    tm.slots[i] = None
                    heapq.heappush(tm.free_indexes, i)
                    self._free += 1
                    actions.append(FreeSlot(tm.task_manager_id, i, job_id, cause))
        return actions + self._serve(now)

    # ------------------------------------------------------------------ views

    @property
    def total_slots(self) -> int:
        return self._total

    @property
    def free_slots(self) -> int:
        return self._free

    def slot_overview(self) -> tuple[TaskManagerSlots, ...]:
        return tuple(TaskManagerSlots(tm.task_manager_id, len(tm.slots), tm.free) for tm in self.task_managers.values())

    def diagnose(self, required_per_group: dict[str, int]) -> SlotDiagnosis:
        return diagnose(required_per_group, self.slot_overview())

    def pending_requests(self, job_id: str) -> list[SlotRequest]:
        return [p.request for p in self._pending.values() if p.job_id == job_id]

    def has_pending_requests(self, job_id: str) -> bool:
        return self._pending_per_job.get(job_id, 0) > 0

    # ------------------------------------------------------------------ internals

    def _diagnosis(self, request: SlotRequest) -> SlotDiagnosis:
        if request.independent:  # what it needs to make progress: one slot
            return diagnose({request.per_slot_sharing_group[0][0]: 1}, self.slot_overview())
        return diagnose(dict(request.per_slot_sharing_group), self.slot_overview())

    def _forget(self, p: _Pending) -> None:
        key = (p.job_id, p.request.request_id)
        del self._pending[key]
        self._unfulfillable.pop(key, None)
        left = self._pending_per_job[p.job_id] - 1
        if left:
            self._pending_per_job[p.job_id] = left
        else:
            del self._pending_per_job[p.job_id]

    def _serve(self, now: float, capacity_changed: bool = False) -> list[SlotManagerAction]:
        """First fit, in arrival order, while slots are free; after a TaskManager came or went,
        also re-check which requests exceed the cluster."""
        if not capacity_changed and not (self._free and self._pending):
            return []  # nothing to serve, nobody's waiting changed (every slot freed while idle)
        actions: list[SlotManagerAction] = []
        served: set[str] = set()
        if self._free and self._pending:
            chosen: list[tuple[_Pending, int]] = []
            free = self._free
            for p in self._pending.values():
                request = p.request
                need = request.count - p.served
                if need <= free or request.independent:
                    take = min(need, free)
                    chosen.append((p, take))
                    free -= take
                    if not free:
                        break
            for p, take in chosen:
                p.served += take
                if p.served == p.request.count:
                    self._forget(p)
                served.add(p.job_id)
                actions.append(SlotsAllocated(p.job_id, p.request.request_id, tuple(self._take(p.job_id, take))))
        changed = set(served)
        if capacity_changed:
            for key, p in self._pending.items():
                unfulfillable = p.request.least > self._total
                if unfulfillable and p.unfulfillable_since is None:
                    p.unfulfillable_since = now
                    self._unfulfillable[key] = p
                    changed.add(p.job_id)
                elif not unfulfillable and p.unfulfillable_since is not None:
                    p.unfulfillable_since = None
                    del self._unfulfillable[key]
                    changed.add(p.job_id)
            changed |= set(self._waiting_message)  # the numbers in the message changed
        return actions + self._update_waiting(changed)

    def _update_waiting(self, jobs: set[str]) -> list[SlotManagerAction]:
        actions: list[SlotManagerAction] = []
        for job_id in sorted(jobs):
            first = next((p for p in self._unfulfillable.values() if p.job_id == job_id), None) if self._unfulfillable else None
            message = str(self._diagnosis(first.request)) if first is not None else ""
            if message != self._waiting_message.get(job_id, ""):
                if message:
                    self._waiting_message[job_id] = message
                else:
                    self._waiting_message.pop(job_id, None)
                actions.append(WaitingForResources(job_id, message))
        return actions

    def _take(self, job_id: str, count: int) -> Iterable[SlotId]:
        taken: list[SlotId] = []
        if not self.evenly_spread:
            # packed: the first registered TaskManager with a free slot, its lowest free slot first
            for tm in self.task_managers.values():
                free, slots, ids = tm.free_indexes, tm.slots, tm.ids
                while free and len(taken) < count:
                    index = heapq.heappop(free)
                    slots[index] = job_id
                    taken.append(ids[index])
                if len(taken) == count:
                    break
            self._free -= len(taken)
            return taken
        for _ in range(count):
            tm = max((t for t in self.task_managers.values() if t.free), key=lambda t: t.free)  # first registered wins ties
            index = heapq.heappop(tm.free_indexes)
            tm.slots[index] = job_id
            self._free -= 1
            taken.append(tm.ids[index])
        return taken
