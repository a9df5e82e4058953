"""The scheduler's and the slot manager's books stay as small as the job's live state."""

from __future__ import annotations

from funke.common.graph.executiongraph import ExecutionGraph, SlotId
from funke.common.graph.jobgraph import ResultPartitionType
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy
from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.states import ExecutionState
from tests.conformance.graphs import source_sink_all_to_all

E = ExecutionState


def _drive(scheduler: s.Scheduler, slots: sm.SlotManager, actions: list) -> list[s.DeployTask]:
    deployed, queue = [], list(actions)
    while queue:
        a = queue.pop(0)
        if isinstance(a, s.RequestSlots):
            allocated = slots.request_slots("job", a.requests, a.timeout_s, 0.0)
        elif isinstance(a, s.ReleaseSlot):
            allocated = slots.release_slot(a.slot, "job", a.cause, 0.0)
        else:
            if isinstance(a, s.DeployTask):
                deployed.append(a)
            continue
        for x in allocated:
            if isinstance(x, sm.SlotsAllocated):
                queue.extend(scheduler.on_slots_allocated(x.request_id, x.slots, 0.0))
    return deployed


def test_deployed_bulks_leave_the_group_index_at_once():
    p = 6
    graph = ExecutionGraph(source_sink_all_to_all(p, ResultPartitionType.BLOCKING), "job", 0.0)
    scheduler = s.Scheduler(graph, restart_strategy=FixedDelayRestartBackoffTimeStrategy(1, 0.0))
    slots = sm.SlotManager(heartbeat_timeout_s=1e9)
    slots.register("tm-0", "", p, {}, 0.0)
    sources = _drive(scheduler, slots, scheduler.start(0.0))
    assert len(sources) == p
    assert scheduler.slots._bulks_with_group == {}  # every source region's bulk was deployed
    sinks = []
    for d in sources:
        sinks += _drive(scheduler, slots, scheduler.on_task_state(d.deployment.attempt, E.FINISHED, 0.0))
    assert len(sinks) == p
    assert scheduler.slots._bulks_with_group == {}
    scheduler.validate_state()


def test_packed_slots_fill_the_first_task_manager_lowest_slot_first():
    slots = sm.SlotManager(heartbeat_timeout_s=1e9)
    slots.register("tm-0", "", 3, {}, 0.0)
    slots.register("tm-1", "", 3, {}, 0.0)
    (first,) = slots.request_slots("a", [sm.SlotRequest(1, 2, (("default", 2),))], 300.0, 0.0)
    assert first.slots == (SlotId("tm-0", 0), SlotId("tm-0", 1))
    slots.release_slot(SlotId("tm-0", 0), "a", "done", 0.0)
    (second,) = slots.request_slots("b", [sm.SlotRequest(1, 3, (("default", 3),))], 300.0, 0.0)
    assert second.slots == (SlotId("tm-0", 0), SlotId("tm-0", 2), SlotId("tm-1", 0))
    assert slots.free_slots == 2
