"""Several slot allocations or task reports as one event do what they do one event at a time."""

from __future__ import annotations

import pytest

from funke.common.graph.deployment import ProducedPartition, TaskReport
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo, SlotId
from funke.common.graph.jobgraph import ResultPartitionType
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy
from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.states import ExecutionState
from tests.conformance.graphs import source_sink_all_to_all

E = ExecutionState
P = 6


def _scheduler(kind: ResultPartitionType = ResultPartitionType.BLOCKING, slot_idle_timeout_s: float = 10.0) -> s.Scheduler:
    graph = ExecutionGraph(source_sink_all_to_all(P, kind), "job", 0.0)
    return s.Scheduler(graph, restart_strategy=FixedDelayRestartBackoffTimeStrategy(3, 0.0),
                       slot_idle_timeout_s=slot_idle_timeout_s)


def _plain(actions: list) -> list:
    """Actions without the stimulus ids (which name the event that made them)."""
    out = []
    for a in actions:
        if isinstance(a, s.ExecutionStateChanged):
            out.append(a._replace(transition=a.transition._replace(stimulus_id="")))
        elif isinstance(a, s.JobStatusChanged):
            out.append(s.JobStatusChanged(a.transition._replace(stimulus_id="")))
        elif isinstance(a, s.DeployTask):
            out.append(("deploy", a.deployment.attempt, a.deployment.slot))
        elif isinstance(a, s.CancelTask):
            out.append(("cancel", a.task_manager_id, a.attempt))
        else:
            out.append(a)
    return out


def _states(scheduler: s.Scheduler) -> list:
    return [(ev.name, ev.current_execution.attempt_number, ev.state, ev.current_execution.slot)
            for ev in scheduler.graph.execution_vertices()]


def _requests(actions: list) -> list[sm.SlotRequest]:
    return [r for a in actions if isinstance(a, s.RequestSlots) for r in a.requests]


def _allocate(requests: list[sm.SlotRequest], first: int = 0) -> list[tuple[int, tuple[SlotId, ...]]]:
    allocations, n = [], first
    for r in requests:
        allocations.append((r.request_id, tuple(SlotId("tm-1", n + i) for i in range(r.count))))
        n += r.count
    return allocations


def _one_by_one(allocations: list[tuple[int, tuple[SlotId, ...]]]) -> list[tuple[int, tuple[SlotId, ...]]]:
    """The same slots as one allocation each, as an independent request gets them when its slots
    free up one at a time."""
    return [(rid, (slot,)) for rid, slots in allocations for slot in slots]


def test_a_batch_jobs_one_subtask_regions_share_one_independent_slot_request():
    scheduler = _scheduler()
    (request,) = _requests(scheduler.start(0.0))  # a BLOCKING source is its own region
    assert (request.count, request.independent, request.per_slot_sharing_group) == (P, True, (("default", P),))


@pytest.mark.parametrize("parts", ["one allocation", "one slot per allocation"])
def test_allocations_in_one_event_deploy_as_one_at_a_time(parts):
    one, bulk = _scheduler(), _scheduler()
    requests = _requests(one.start(0.0))
    assert _requests(bulk.start(0.0)) == requests
    singly_allocated = _one_by_one(_allocate(requests))
    singly = [a for rid, slots in singly_allocated for a in one.on_slots_allocated(rid, slots, 1.0)]
    together = bulk.on_allocations(_allocate(requests) if parts == "one allocation" else singly_allocated, 1.0)
    assert sum(isinstance(a, s.DeployTask) for a in together) == P
    assert sorted(map(repr, _plain(together))) == sorted(map(repr, _plain(singly)))
    assert _states(bulk) == _states(one)
    assert bulk.slots.requests == one.slots.requests == {}
    bulk.validate_state()


def test_allocations_for_a_request_nobody_waits_for_go_back():
    scheduler = _scheduler()
    (request,) = _requests(scheduler.start(0.0))
    stale = (999, (SlotId("tm-1", 50),))
    actions = scheduler.on_allocations([stale, (request.request_id, (SlotId("tm-1", 0),))], 1.0)
    assert s.ReleaseSlot(SlotId("tm-1", 50), "slot request no longer needed") in actions
    assert sum(isinstance(a, s.DeployTask) for a in actions) == 1
    assert scheduler.slots.requests[request.request_id].served == 1  # the rest still waits for slots
    scheduler.validate_state()


def test_allocations_that_do_not_fit_their_request_change_nothing():
    scheduler = _scheduler()
    (request,) = _requests(scheduler.start(0.0))
    before = _states(scheduler)
    good = (request.request_id, (SlotId("tm-1", 0),))
    bad = (request.request_id, tuple(SlotId("tm-1", i) for i in range(1, P + 1)))  # one slot too many
    with pytest.raises(ValueError, match=f"got {P} slots for {P - 1} groups"):
        scheduler.on_allocations([good, bad], 1.0)
    assert _states(scheduler) == before  # the good one before it was not applied either
    assert scheduler.slots.requests[request.request_id].served == 0


def test_a_job_with_fewer_slots_than_regions_runs_them_in_waves_through_one_request():
    """P one-subtask regions on P // 2 slots: the SlotManager serves the independent request in
    parts, each freed slot going to the next region in order."""
    scheduler = _scheduler()
    slots = sm.SlotManager(heartbeat_timeout_s=1e9)
    slots.register("tm-1", "", P // 2, {}, 0.0)
    queue = list(scheduler.start(0.0))
    deployed: list[ExecutionAttemptId] = []
    waves = []
    while queue or deployed:
        while queue:
            a = queue.pop(0)
            answers = []
            if isinstance(a, s.RequestSlots):
                answers = slots.request_slots("job", a.requests, a.timeout_s, 0.0)
            elif isinstance(a, s.ReleaseSlot):
                answers = slots.release_slot(a.slot, "job", a.cause, 0.0)
            elif isinstance(a, s.CancelSlotRequest):
                slots.cancel_request("job", a.request_id)
            elif isinstance(a, s.DeployTask):
                deployed.append(a.attempt)
            allocations = [(x.request_id, x.slots) for x in answers if isinstance(x, sm.SlotsAllocated)]
            if allocations:
                queue += scheduler.on_allocations(allocations, 0.0)
        if deployed:
            waves.append(sorted((d.vertex_id, d.subtask_index) for d in deployed))
            queue += scheduler.on_task_states([TaskReport("job", d, E.FINISHED) for d in deployed], 0.0)
            deployed = []
    assert scheduler.status.value == "FINISHED" or scheduler.committing
    assert waves[:2] == [[("source", i) for i in range(P // 2)], [("source", i) for i in range(P // 2, P)]]
    assert sorted(x for wave in waves[2:] for x in wave) == [("sink", i) for i in range(P)]
    assert not slots.has_pending_requests("job") and scheduler.slots.requests == {}
    scheduler.validate_state()


def _deployed(scheduler: s.Scheduler) -> list[ExecutionAttemptId]:
    deployed = [a.deployment.attempt for a in scheduler.on_allocations(_allocate(_requests(scheduler.start(0.0))), 0.0)
                if isinstance(a, s.DeployTask)]
    assert len(deployed) == P
    return deployed


def test_reports_in_one_event_act_as_one_at_a_time():
    """Finished sources (the last one releases the sinks), a failure (a region restart: its
    cancellation), a report the table does not allow and one for an attempt that is not current."""
    one, bulk = _scheduler(), _scheduler()
    sources = _deployed(one)
    assert _deployed(bulk) == sources
    (data_set,) = one.graph.vertices["source"].produced
    produced = (ProducedPartition(data_set.id, 0, "schema"),)
    reports = [TaskReport("job", a, E.INITIALIZING, task_manager_id="tm-1") for a in sources]
    reports += [TaskReport("job", sources[0], E.FINISHED, produced=produced, task_manager_id="tm-1",
                           stimulus_id="tm-1:report-1")]
    reports += [TaskReport("job", a, E.FINISHED, task_manager_id="tm-1") for a in sources[1:4]]
    reports += [TaskReport("job", sources[4], E.FAILED, FailureInfo("Boom", "a source failed"), task_manager_id="tm-1"),
                TaskReport("job", sources[5], E.CREATED, task_manager_id="tm-1"),  # not a legal report: ignored
                TaskReport("job", ExecutionAttemptId("source", 5, 7), E.FINISHED)]  # no such attempt: ignored
    singly = []
    for r in reports:
        schemas = {(p.data_set_id, p.partition_index): p.schema for p in r.produced}
        singly += one.on_task_state(r.attempt, r.state, 2.0, failure=r.failure, produced_schemas=schemas, io=r.io,
                                    stimulus_id=r.stimulus_id or "tm-1:report")
    together = bulk.on_task_states(reports, 2.0)
    assert _plain(together) == _plain(singly)
    assert any(isinstance(a, s.StartTimer) for a in together)  # the failed source's region restarts
    assert _states(bulk) == _states(one)
    bulk.validate_state()
    # each transition names its own report, or the TaskManager that sent it
    finished = bulk.graph.vertices["source"].task_vertices[0].current_execution.machine.history[-1]
    assert finished.to_state is E.FINISHED and finished.stimulus_id == "tm-1:report-1"
    running = bulk.graph.vertices["source"].task_vertices[1].current_execution.machine.history[-2]
    assert running.to_state is E.INITIALIZING and running.stimulus_id == "tm-1:report"
    assert bulk.graph.vertices["source"].task_vertices[0].produced_partitions[0].location.schema == "schema"


def test_the_last_report_of_a_call_releases_the_consumers_into_the_slots_the_producers_left():
    scheduler = _scheduler()
    sources = _deployed(scheduler)
    left = {scheduler.graph.find_execution(a).slot for a in sources}
    actions = scheduler.on_task_states([TaskReport("job", a, E.FINISHED) for a in sources], 3.0)
    assert _requests(actions) == [] and not any(isinstance(a, s.ReleaseSlot) for a in actions)
    deploys = [a for a in actions if isinstance(a, s.DeployTask)]
    assert sorted(d.attempt.vertex_id for d in deploys) == ["sink"] * P and {d.slot for d in deploys} == left
    scheduler.validate_state()


def test_without_a_slot_pool_the_consumers_ask_for_slots_again():
    scheduler = _scheduler(slot_idle_timeout_s=0.0)
    sources = _deployed(scheduler)
    actions = scheduler.on_task_states([TaskReport("job", a, E.FINISHED) for a in sources], 3.0)
    assert sum(isinstance(a, s.ReleaseSlot) for a in actions) == P
    sinks = _requests(actions)
    assert [(r.count, r.independent) for r in sinks] == [(P, True)]
    deploys = [a for a in scheduler.on_allocations(_allocate(sinks), 4.0) if isinstance(a, s.DeployTask)]
    assert sorted(d.deployment.attempt.vertex_id for d in deploys) == ["sink"] * P
    scheduler.validate_state()


def test_what_an_event_makes_garbage_is_released_in_one_action_per_task_manager():
    """A failover's cancelled producers each leave partitions nobody will read: their
    TaskManager is told once per event, with all of them, after the event's state changes."""
    scheduler = _scheduler(ResultPartitionType.PIPELINED)
    actions = scheduler.start(0.0)
    (request,) = _requests(actions)
    slots = tuple(SlotId(f"tm-{i % 2}", i) for i in range(request.count))
    deployed = [a.attempt for a in scheduler.on_allocations([(request.request_id, slots)], 0.0)
                if isinstance(a, s.DeployTask)]
    scheduler.on_task_states([TaskReport("job", a, E.INITIALIZING) for a in deployed], 0.0)
    scheduler.on_task_states([TaskReport("job", a, E.RUNNING) for a in deployed], 0.0)
    sink = ExecutionAttemptId("sink", 0, 0)
    cancelled = [a.attempt for a in scheduler.on_task_state(sink, E.FAILED, 1.0, failure=FailureInfo("Boom", "x"))
                 if isinstance(a, s.CancelTask)]
    assert len(cancelled) == 2 * P - 1
    actions = scheduler.on_task_states([TaskReport("job", a, E.CANCELED) for a in cancelled], 2.0)
    released = [(a.task_manager_id, sorted(r.partition_index for r in a.partitions))
                for a in actions if isinstance(a, s.ReleasePartitions)]
    assert sorted(released) == [("tm-0", [0, 2, 4]), ("tm-1", [1, 3, 5])]
    last_change = max(i for i, a in enumerate(actions) if isinstance(a, s.ExecutionStateChanged))
    assert all(i > last_change for i, a in enumerate(actions) if isinstance(a, s.ReleasePartitions))
    scheduler.validate_state()
