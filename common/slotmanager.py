"""The ResourceManager's slot bookkeeping: registered TaskManagers, their slots, heartbeat
deadlines, and the bulk slot requests of jobs.

Sans-IO: methods take events (with `now` passed in) and return actions for the JobManager shell.
A request is all-or-nothing (`count` slots at once), so two jobs never each hold half of what they
need. Requests are served first-fit in arrival order. A request may wait as long as the cluster
*could* serve it (its slots are merely busy); it fails after the slot-request timeout only while
it is unfulfillable — more slots than all registered TaskManagers have — which is what "waiting
for TaskManagers" means. Slots are picked packed (fill one TaskManager first) or evenly spread
(Flink's `cluster.evenly-spread-out-slots`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from funke.common.executiongraph import SlotId
from funke.common.scheduler import SlotRequest
from funke.common.slotsharing import SlotDiagnosis, TaskManagerSlots, diagnose

# Defaults for one machine (Flink's 10 s / 50 s are meant for clusters); a broken heartbeat
# stream is noticed at once anyway, the timeout only catches a hung TaskManager.
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0


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
    """A request could not be served at once; `message` says what is missing."""

    job_id: str
    request_id: int
    message: str
    unfulfillable: bool


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

    @property
    def free(self) -> int:
        return sum(1 for s in self.slots if s is None)


@dataclass(eq=False, slots=True)
class _Pending:
    job_id: str
    request: SlotRequest
    timeout_s: float
    requested_at: float
    unfulfillable_since: float | None = None
    last_message: str = ""


@dataclass(slots=True)
class SlotManager:
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    evenly_spread: bool = False
    task_managers: dict[str, TaskManagerRegistration] = field(default_factory=dict)
    _pending: list[_Pending] = field(default_factory=list)
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
        registration_id = f"{task_manager_id}#{self._registrations}"
        self.task_managers[task_manager_id] = TaskManagerRegistration(
            task_manager_id, address, registration_id, [None] * number_of_slots, dict(resources), now, now
        )
        actions += self._serve(now)
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
        jobs = tuple(sorted({j for j in tm.slots if j is not None}))
        actions: list[SlotManagerAction] = [TaskManagerLost(task_manager_id, cause, jobs)]
        actions += self._serve(now)  # pending requests may have become unfulfillable
        return actions

    def check(self, now: float) -> list[SlotManagerAction]:
        """Timer tick: TaskManagers whose heartbeats stopped, requests unfulfillable too long."""
        actions: list[SlotManagerAction] = []
        for tm in list(self.task_managers.values()):
            silent = now - tm.last_heartbeat
            if silent > self.heartbeat_timeout_s:
                actions += self.lose(tm.task_manager_id, f"no heartbeat for {silent:.1f} s "
                                     f"(heartbeat timeout {self.heartbeat_timeout_s:g} s)", now)
        for p in list(self._pending):
            if p.unfulfillable_since is not None and now - p.unfulfillable_since >= p.timeout_s:
                self._pending.remove(p)
                actions.append(SlotRequestFailed(
                    p.job_id, p.request.request_id,
                    f"could not acquire the required slots within the slot request timeout of "
                    f"{p.timeout_s:g} s: {self._diagnosis(p.request)}",
                ))
        return actions

    # ------------------------------------------------------------------ slots

    def request_slots(self, job_id: str, requests: Sequence[SlotRequest], timeout_s: float, now: float) -> list[SlotManagerAction]:
        for r in requests:
            self._pending.append(_Pending(job_id, r, timeout_s, now))
        return self._serve(now)

    def cancel_request(self, job_id: str, request_id: int) -> None:
        self._pending = [p for p in self._pending if not (p.job_id == job_id and p.request.request_id == request_id)]

    def release_slot(self, slot: SlotId, job_id: str, cause: str, now: float) -> list[SlotManagerAction]:
        tm = self.task_managers.get(slot.task_manager_id)
        if tm is None or not 0 <= slot.slot_index < len(tm.slots) or tm.slots[slot.slot_index] != job_id:
            return []
        tm.slots[slot.slot_index] = None
        return [FreeSlot(slot.task_manager_id, slot.slot_index, job_id, cause)] + self._serve(now)

    def release_job(self, job_id: str, cause: str, now: float) -> list[SlotManagerAction]:
        """The job ended: cancel its requests and free whatever it still holds."""
        self._pending = [p for p in self._pending if p.job_id != job_id]
        actions: list[SlotManagerAction] = []
        for tm in self.task_managers.values():
            for i, holder in enumerate(tm.slots):
                if holder == job_id:
                    tm.slots[i] = None
                    actions.append(FreeSlot(tm.task_manager_id, i, job_id, cause))
        return actions + self._serve(now)

    # ------------------------------------------------------------------ views

    @property
    def total_slots(self) -> int:
        return sum(len(tm.slots) for tm in self.task_managers.values())

    @property
    def free_slots(self) -> int:
        return sum(tm.free for tm in self.task_managers.values())

    def slot_overview(self) -> tuple[TaskManagerSlots, ...]:
        return tuple(TaskManagerSlots(tm.task_manager_id, len(tm.slots), tm.free) for tm in self._ordered())

    def diagnose(self, required_per_group: dict[str, int]) -> SlotDiagnosis:
        return diagnose(required_per_group, self.slot_overview())

    def pending_requests(self, job_id: str) -> list[SlotRequest]:
        return [p.request for p in self._pending if p.job_id == job_id]

    # ------------------------------------------------------------------ internals

    def _ordered(self) -> list[TaskManagerRegistration]:
        return sorted(self.task_managers.values(), key=lambda tm: tm.registered_at)

    def _diagnosis(self, request: SlotRequest) -> SlotDiagnosis:
        return diagnose(dict(request.per_slot_sharing_group), self.slot_overview())

    def _serve(self, now: float) -> list[SlotManagerAction]:
        actions: list[SlotManagerAction] = []
        total = self.total_slots
        for p in list(self._pending):
            count = p.request.count
            if count <= self.free_slots:
                self._pending.remove(p)
                actions.append(SlotsAllocated(p.job_id, p.request.request_id, tuple(self._take(p.job_id, count))))
                continue
            unfulfillable = count > total
            if unfulfillable and p.unfulfillable_since is None:
                p.unfulfillable_since = now
            elif not unfulfillable:
                p.unfulfillable_since = None
            diagnosis = self._diagnosis(p.request)
            message = str(diagnosis) if unfulfillable else (
                f"waiting for {count} free slot(s); the cluster has {self.free_slots} free of {total}")
            if message != p.last_message:
                p.last_message = message
                actions.append(WaitingForResources(p.job_id, p.request.request_id, message, unfulfillable))
        return actions

    def _take(self, job_id: str, count: int) -> Iterable[SlotId]:
        taken: list[SlotId] = []
        for _ in range(count):
            candidates = [tm for tm in self._ordered() if tm.free]
            if self.evenly_spread:
                tm = max(candidates, key=lambda t: t.free)  # first registered wins ties
            else:
                tm = candidates[0]
            index = tm.slots.index(None)
            tm.slots[index] = job_id
            taken.append(SlotId(tm.task_manager_id, index))
        return taken
