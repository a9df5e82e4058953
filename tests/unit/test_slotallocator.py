"""A job's slot books (`slotallocator.py`) on their own: bulks and their slot requests, slots
arriving, the idle pool, giving slots back, and the invariants `validate` checks."""

from __future__ import annotations

import pytest

from funke.common.graph.executiongraph import ExecutionGraph, SlotId
from funke.common.graph.jobgraph import ResultPartitionType
from funke.common.scheduling.actions import CancelSlotRequest, ReleaseSlot, RequestSlots
from funke.common.scheduling.slotallocator import ExecutionSlotAllocator
from funke.common.scheduling.slotsharing import build_slot_sharing_plan
from funke.common.states import ExecutionState
from tests.conformance.graphs import source_sink_all_to_all

E = ExecutionState
P = 3


def _job(kind: ResultPartitionType = ResultPartitionType.BLOCKING, idle_timeout_s: float = 10.0):
    graph = ExecutionGraph(source_sink_all_to_all(P, kind), "job", 0.0)
    allocator = ExecutionSlotAllocator(build_slot_sharing_plan(graph), request_timeout_s=300.0,
                                       idle_timeout_s=idle_timeout_s)
    return graph, allocator


def _scheduled(allocator: ExecutionSlotAllocator, vertices) -> None:
    """The executions SCHEDULED, as the scheduler's transitions leave them (and their groups' usage)."""
    for ev in vertices:
        ev.current_execution.transition(E.SCHEDULED, 0.0)
        group = allocator.plan.group_of(ev)
        allocator.usage[group] = allocator.usage.get(group, 0) + 1


def _slot(i: int, tm: str = "tm-1") -> SlotId:
    return SlotId(tm, i)


def test_one_subtask_bulks_share_one_independent_request_served_in_parts():
    graph, allocator = _job()
    sources = graph.vertices["source"].task_vertices
    _scheduled(allocator, sources)
    out: list = []
    ready, bulks = allocator.schedule([[ev] for ev in sources], deploy_now=True, independent_requests=True, out=out)
    assert ready == [] and len(bulks) == P
    (action,) = out
    assert isinstance(action, RequestSlots) and action.timeout_s == 300.0
    (request,) = action.requests
    assert (request.count, request.independent) == (P, True)
    allocator.validate(graph.execution_vertices(), terminal=False, idle_timer=False)

    served = allocator.allocated([(request.request_id, (_slot(0),))], accept=True, out=out)
    assert served == [allocator.plan.group_of(sources[0])]
    assert allocator.take_ready(allocator.bulks_needing(served)) == [sources[0].current_execution]
    assert allocator.requests[request.request_id].served == 1 and len(allocator.bulks) == P - 1
    assert allocator.take_ready(bulks) == []  # the others still wait for their slots
    allocator.validate(graph.execution_vertices(), terminal=False, idle_timer=False)


def test_a_bulk_of_several_groups_asks_for_all_at_once_and_is_ready_with_its_last_slot():
    graph, allocator = _job(ResultPartitionType.PIPELINED)
    vertices = graph.execution_vertices()
    _scheduled(allocator, vertices)
    out: list = []
    ready, (bulk,) = allocator.schedule([vertices], deploy_now=True, independent_requests=False, out=out)
    (request,) = out[0].requests
    assert ready == [] and (request.count, request.independent) == (P, False)
    with pytest.raises(ValueError, match="got 1 slots for 3 groups"):
        allocator.allocated([(request.request_id, (_slot(0),))], accept=True, out=out)
    served = allocator.allocated([(request.request_id, tuple(_slot(i) for i in range(P)))], accept=True, out=out)
    assert len(served) == P and not allocator.requests and not allocator.requested
    assert allocator.take_ready([bulk]) == [ev.current_execution for ev in vertices]
    assert not allocator.bulks and not allocator._bulks_with_group


def test_slots_for_a_request_nobody_waits_for_go_back_and_the_rest_is_cancelled():
    graph, allocator = _job()
    sources = graph.vertices["source"].task_vertices
    _scheduled(allocator, sources)
    out: list = []
    allocator.schedule([[ev] for ev in sources], deploy_now=True, independent_requests=True, out=out)
    (request,) = out[0].requests
    out.clear()
    assert allocator.allocated([(request.request_id, (_slot(0),)), (99, (_slot(1),))], accept=False, out=out) == []
    assert out == [ReleaseSlot(_slot(0), "slot request no longer needed"), CancelSlotRequest(request.request_id),
                   ReleaseSlot(_slot(1), "slot request no longer needed")]
    assert not allocator.requests and not allocator.requested


def test_a_freed_slot_stays_idle_for_the_next_bulk_unless_the_job_waits_for_slots():
    graph, allocator = _job()
    a, b = graph.vertices["source"].task_vertices[:2]
    group_a, group_b = allocator.plan.group_of(a), allocator.plan.group_of(b)
    allocator.slot_of[group_a] = _slot(0)
    allocator.slot_of[group_b] = _slot(1)
    out: list = []
    assert allocator.free(group_a, "done", keep_idle=True, out=out) is True  # the pool's first: its timer starts
    assert allocator.free(group_b, "done", keep_idle=True, out=out) is False
    assert list(allocator.idle) == [_slot(0), _slot(1)] and out == [] and not allocator.slot_of
    # a bulk scheduled next takes an idle slot and is ready at once
    _scheduled(allocator, [a])
    ready, bulks = allocator.schedule([[a]], deploy_now=True, independent_requests=True, out=out)
    assert ready == [a.current_execution] and bulks == [] and out == []
    assert allocator.slot_of == {group_a: _slot(0)} and list(allocator.idle) == [_slot(1)]
    allocator.release_idle("idle", out)
    assert out == [ReleaseSlot(_slot(1), "idle")]


def test_free_gives_the_slot_back_when_the_job_waits_schedules_nothing_or_keeps_no_idle_slots():
    for idle_timeout_s, keep_idle, waiting in ((10.0, True, True), (10.0, False, False), (0.0, True, False)):
        graph, allocator = _job(idle_timeout_s=idle_timeout_s)
        sources = graph.vertices["source"].task_vertices
        group = allocator.plan.group_of(sources[0])
        allocator.slot_of[group] = _slot(0)
        out: list = []
        if waiting:
            _scheduled(allocator, sources[1:])
            allocator.schedule([[ev] for ev in sources[1:]], deploy_now=True, independent_requests=True, out=out)
            out.clear()
        assert allocator.free(group, "done", keep_idle=keep_idle, out=out) is False
        assert out == [ReleaseSlot(_slot(0), "done")] and not allocator.idle


def test_a_failed_request_starves_its_bulks_and_an_unknown_one_changes_nothing():
    graph, allocator = _job()
    sources = graph.vertices["source"].task_vertices
    _scheduled(allocator, sources)
    out: list = []
    _, bulks = allocator.schedule([[ev] for ev in sources], deploy_now=True, independent_requests=True, out=out)
    (request,) = out[0].requests
    assert allocator.request_failed(12345) is None
    assert allocator.request_failed(request.request_id) == bulks
    assert not allocator.bulks and not allocator.requests and not allocator.requested


def test_a_lost_task_managers_slots_are_forgotten_and_their_bulks_ask_again():
    graph, allocator = _job(ResultPartitionType.PIPELINED)
    vertices = graph.execution_vertices()
    _scheduled(allocator, vertices)
    out: list = []
    allocator.schedule([vertices], deploy_now=True, independent_requests=False, out=out)
    (request,) = out[0].requests
    # served (the scheduler has not deployed the bulk yet): two of its slots on tm-2
    allocator.allocated([(request.request_id, (_slot(0), _slot(0, "tm-2"), _slot(1, "tm-2")))], accept=True, out=out)
    allocator.task_manager_lost("tm-2")
    assert list(allocator.slot_of.values()) == [_slot(0)]
    missing = allocator.missing_groups()
    assert len(missing) == 2
    out.clear()
    allocator.request(missing, out)
    (again,) = out[0].requests
    assert again.count == 2 and all(allocator.requested[g] == again.request_id for g in missing)
    allocator.validate(vertices, terminal=False, idle_timer=False)


def test_release_all_hands_back_every_slot_and_cancels_every_request():
    graph, allocator = _job()
    sources = graph.vertices["source"].task_vertices
    allocator.slot_of[allocator.plan.group_of(sources[0])] = _slot(0)
    allocator.idle.append(_slot(1))
    out: list = []
    allocator.release_all("job CANCELED", out)
    assert out == [ReleaseSlot(_slot(0), "job CANCELED"), ReleaseSlot(_slot(1), "job CANCELED")]
    assert not allocator.slot_of and not allocator.idle
    allocator.validate(graph.execution_vertices(), terminal=True, idle_timer=False)


@pytest.mark.parametrize("defect, message", [
    ("two groups, one slot", "two groups in one slot"),
    ("idle and held", "an idle slot twice, or also a group's"),
    ("idle without a timer", "idle slots without a timer"),
    ("idle while waiting", "while requests"),
    ("requested, not pending", "not pending"),
    ("usage", "live executions"),
    ("ended, holding a slot", "the job ended but holds slots"),
])
def test_validate_names_what_disagrees(defect, message):
    graph, allocator = _job()
    vertices = graph.execution_vertices()
    sources = graph.vertices["source"].task_vertices
    g0, g1 = allocator.plan.group_of(sources[0]), allocator.plan.group_of(sources[1])
    terminal, idle_timer = False, True
    if defect == "two groups, one slot":
        allocator.slot_of.update({g0: _slot(0), g1: _slot(0)})
    elif defect == "idle and held":
        allocator.slot_of[g0] = _slot(0)
        allocator.idle.append(_slot(0))
    elif defect == "idle without a timer":
        allocator.idle.append(_slot(0))
        idle_timer = False
    elif defect == "idle while waiting":
        _scheduled(allocator, sources[:1])
        allocator.schedule([sources[:1]], deploy_now=False, independent_requests=True, out=[])
        allocator.idle.append(_slot(0))
    elif defect == "requested, not pending":
        allocator.requested[g0] = 41
    elif defect == "usage":
        allocator.usage[g0] = 1
    else:
        allocator.slot_of[g0] = _slot(0)
        terminal = True
    with pytest.raises(AssertionError, match=message):
        allocator.validate(vertices, terminal=terminal, idle_timer=idle_timer)
