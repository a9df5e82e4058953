"""ExecutionSlotSharingGroups and the slot diagnosis (funke.common.scheduling.slotsharing)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from funke.common.graph.executiongraph import ExecutionGraph
from funke.common.scheduling.slotsharing import (
    ExecutionSlotSharingGroup,
    SlotDiagnosis,
    TaskManagerSlots,
    build_slot_sharing_plan,
    diagnose,
)
from tests.steps import growth
from tests.conformance.graphs import (
    ALL_TO_ALL,
    BLOCKING,
    PIPELINED,
    POINTWISE,
    connect,
    execution_graph,
    job_graph,
    operator,
    seed_example_job,
    source,
    source_sink_all_to_all,
)


def test_groups_are_numbered_in_creation_order_and_equal_only_to_themselves():
    plan = build_slot_sharing_plan(execution_graph(seed_example_job()))

    assert [g.index for g in plan.groups] == [0, 1, 2, 3]
    twin = ExecutionSlotSharingGroup(0, "default")
    twin.vertices.extend(plan.groups[0].vertices)
    assert twin != plan.groups[0]
    assert len({plan.groups[0], plan.groups[0], twin}) == 2
    assert list(plan.groups[3]) == plan.groups[3].vertices and len(plan.groups[3]) == 2


def test_required_slots_per_group_lists_groups_in_order_of_first_use():
    job = job_graph("order", [source("a", 2, slot_sharing_group="z"), source("b", 3)], [])
    plan = build_slot_sharing_plan(execution_graph(job))

    assert list(plan.required_slots_per_group().items()) == [("z", 2), ("default", 3)]
    assert plan.required_slots() == 5


def test_a_co_location_group_spanning_slot_sharing_groups_is_rejected():
    # validation forbids this; the plan refuses it too rather than mixing groups in one slot
    job = job_graph("bad", [source("a", 2, co_location_group="it"),
                            source("b", 2, slot_sharing_group="other", co_location_group="it")], [])
    with pytest.raises(ValueError, match="co-location group 'it' spans slot-sharing groups"):
        build_slot_sharing_plan(execution_graph(job))


def test_diagnosis_of_enough_free_slots_is_sufficient_and_says_so():
    diagnosis = diagnose({"default": 2}, [TaskManagerSlots("tm-a", 1, 1), TaskManagerSlots("tm-b", 2, 1)])

    assert diagnosis.sufficient
    assert str(diagnosis) == (
        "job needs 2 slots (slot-sharing group 'default': 2) and the cluster has 3 slots in total, "
        "2 free (2 TaskManagers: tm-a 1/1 free, tm-b 1/2 free)"
    )


def test_diagnosis_is_a_value():
    a = diagnose({"default": 1}, [TaskManagerSlots("tm-a", 1, 0)])
    b = SlotDiagnosis((("default", 1),), (TaskManagerSlots("tm-a", 1, 0),))

    assert a == b and hash(a) == hash(b)
    assert not a.sufficient
    assert str(a) == ("job needs 1 slot (slot-sharing group 'default': 1) but the cluster has 1 slot "
                      "in total, 0 free (1 TaskManager: tm-a 0/1 free)")


@pytest.mark.parametrize("result_type", [BLOCKING, PIPELINED])
def test_all_to_all_at_p_10000_stays_linear(result_type):
    graph = execution_graph(source_sink_all_to_all(10_000, result_type))
    plan = build_slot_sharing_plan(graph)
    assert plan.required_slots() == 10_000
    assert plan.group_of(graph.vertices["sink"].task_vertices[9_999]).index == 9_999

    def plan_of(p: int):
        g = execution_graph(source_sink_all_to_all(p, result_type))
        return lambda: build_slot_sharing_plan(g)

    assert growth(plan_of, 500) < 2.5  # linear: about 2; a P² scan: about 4


def test_wide_fan_out_uses_the_oldest_free_group_without_rescanning():
    # every sink subtask beyond the first per source goes through the "oldest free" path
    def fan_out(sinks: int):
        return execution_graph(job_graph("fan-out", [source("src", 100), operator("snk", sinks)],
                                         [connect("src", "snk", POINTWISE, PIPELINED)]))

    assert build_slot_sharing_plan(fan_out(10_000)).required_slots() == 10_000
    assert growth(lambda sinks: (lambda g=fan_out(sinks): build_slot_sharing_plan(g)), 2_000) < 2.5


# -- against a plain transcription of Flink's algorithm, on random graphs --

def reference_plan(graph: ExecutionGraph) -> list[list[str]]:
    """LocalInputPreferredSlotSharingStrategy written plainly: ordered sets as dicts, every
    available set updated for every job vertex of the slot-sharing group."""
    groups: list[list] = []
    ssg_members: dict[str, list[str]] = {}
    for ejv in graph.vertices.values():
        ssg_members.setdefault(ejv.slot_sharing_group, []).append(ejv.id)
    available: dict[str, dict[int, None]] = {jv: {} for jv in graph.vertices}
    group_of: dict[object, int] = {}
    constraints: dict[tuple[str, int], int] = {}

    def add(ev, g):
        groups[g].append(ev)
        group_of[ev] = g
        available[ev.job_vertex.id].pop(g, None)

    for ejv in graph.vertices.values():
        candidates: dict[int, dict[int, None]] = {}
        remaining = []
        for ev in ejv.task_vertices:
            g = None
            if ejv.co_location_group:
                g = constraints.get((ejv.co_location_group, ev.subtask_index))
            if g is None:
                for cpg in ev.consumed_partition_groups:
                    if id(cpg) not in candidates:
                        producer = cpg.partitions[0].producer.job_vertex
                        candidates[id(cpg)] = (
                            {group_of[p.producer]: None for p in cpg.partitions}
                            if producer.slot_sharing_group == ejv.slot_sharing_group else {})
                    cand = candidates[id(cpg)]
                    while cand and g is None:
                        c = next(iter(cand))
                        del cand[c]
                        if c in available[ejv.id]:
                            g = c
                    if g is not None:
                        break
            if g is None:
                remaining.append(ev)
            else:
                add(ev, g)
        for ev in remaining:
            if available[ejv.id]:
                g = next(iter(available[ejv.id]))
            else:
                g = len(groups)
                groups.append([])
                for jv in ssg_members[ejv.slot_sharing_group]:
                    available[jv][g] = None
            add(ev, g)
        if ejv.co_location_group:
            for ev in ejv.task_vertices:
                constraints.setdefault((ejv.co_location_group, ev.subtask_index), group_of[ev])
    return [[str(ev.id) for ev in g] for g in groups]


@st.composite
def random_graphs(draw) -> ExecutionGraph:
    n = draw(st.integers(1, 7))
    parallelism = [draw(st.integers(1, 5)) for _ in range(n)]
    ssg = [draw(st.sampled_from(["default", "default", "other"])) for _ in range(n)]
    co_location: list[str | None] = [None] * n
    # co-locate pairs with equal parallelism and slot-sharing group, as validation requires
    for i in range(n):
        for j in range(i):
            if (co_location[i] is None and parallelism[i] == parallelism[j] and ssg[i] == ssg[j]
                    and draw(st.integers(0, 3)) == 0):
                co_location[i] = co_location[j] = co_location[j] or f"co{j}"
    connections = []
    has_input = [False] * n
    for consumer in range(1, n):
        for producer in draw(st.lists(st.integers(0, consumer - 1), max_size=3)):
            pattern = draw(st.sampled_from([POINTWISE, ALL_TO_ALL]))
            connections.append(connect(f"v{producer}", f"v{consumer}", pattern,
                                       draw(st.sampled_from([BLOCKING, PIPELINED]))))
            has_input[consumer] = True
    vertices = [
        (operator if has_input[i] else source)(f"v{i}", parallelism[i], slot_sharing_group=ssg[i],
                                               co_location_group=co_location[i])
        for i in range(n)
    ]
    return execution_graph(job_graph("random", vertices, connections))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_match_a_plain_transcription_of_flinks_strategy(graph):
    plan = build_slot_sharing_plan(graph)

    assert [[str(ev.id) for ev in g.vertices] for g in plan.groups] == reference_plan(graph)
    largest: dict[str, int] = {}
    for ejv in graph.vertices.values():
        largest[ejv.slot_sharing_group] = max(largest.get(ejv.slot_sharing_group, 0), ejv.parallelism)
    assert plan.required_slots_per_group() == largest
    for ejv in graph.vertices.values():
        for ev in ejv.task_vertices:
            group = plan.group_of(ev)
            assert ev in group.vertices
            assert group.slot_sharing_group == ejv.slot_sharing_group
            assert sum(1 for u in group.vertices if u.job_vertex is ejv) == 1
            if ejv.co_location_group:
                for other in graph.vertices.values():
                    if other.co_location_group == ejv.co_location_group:
                        assert plan.group_of(other.task_vertices[ev.subtask_index]) is group
