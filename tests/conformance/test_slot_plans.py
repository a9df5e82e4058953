"""Conformance: which subtasks share a slot, and how many slots a job needs (Flink's
LocalInputPreferredSlotSharingStrategy and the "Jobs and Scheduling" example)."""

from __future__ import annotations

import pytest

from funke.common.graph.executiongraph import ExecutionGraph
from funke.common.graph.jobgraph import JobGraph, PartitionerKind
from funke.common.scheduling.slotsharing import (
    ExecutionSlotSharingGroup,
    SlotSharingPlan,
    TaskManagerSlots,
    build_slot_sharing_plan,
    diagnose,
)
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
    sink,
    source,
    source_sink_all_to_all,
)


def members(group: ExecutionSlotSharingGroup) -> list[str]:
    return [str(ev.id) for ev in group.vertices]


def layout(plan: SlotSharingPlan) -> list[list[str]]:
    return [members(g) for g in plan.groups]


def assert_plan_invariants(plan: SlotSharingPlan, graph: ExecutionGraph) -> None:
    seen = set()
    for index, group in enumerate(plan.groups):
        assert group.index == index
        job_vertices = [ev.job_vertex.id for ev in group.vertices]
        assert len(job_vertices) == len(set(job_vertices)), f"{group!r} holds two subtasks of one job vertex"
        for ev in group.vertices:
            assert ev.job_vertex.slot_sharing_group == group.slot_sharing_group
            assert plan.group_of(ev) is group
            seen.add(ev)
    assert seen == set(graph.execution_vertices())


# -- the seed example --

@pytest.mark.parametrize("result_type", [PIPELINED, BLOCKING])
def test_seed_example_pipelines_source_map_reduce_into_four_slots(result_type):
    graph = execution_graph(seed_example_job(result_type))
    plan = build_slot_sharing_plan(graph)

    assert plan.required_slots() == 4
    assert plan.required_slots_per_group() == {"default": 4}
    assert layout(plan) == [
        ["source[0]", "map[0]", "reduce[0]"],
        ["source[1]", "map[1]", "reduce[1]"],
        ["source[2]", "map[2]", "reduce[2]"],
        ["source[3]", "map[3]"],
    ]
    assert_plan_invariants(plan, graph)


def test_seed_example_fits_two_task_managers_with_three_slots_each():
    plan = build_slot_sharing_plan(execution_graph(seed_example_job()))
    diagnosis = diagnose(plan.required_slots_per_group(),
                         [TaskManagerSlots("tm-a", 3, 3), TaskManagerSlots("tm-b", 3, 3)])

    assert diagnosis.sufficient
    assert (diagnosis.required_total, diagnosis.available_total, diagnosis.free_total) == (4, 6, 6)


def test_seed_example_does_not_fit_one_task_manager_with_three_slots():
    plan = build_slot_sharing_plan(execution_graph(seed_example_job()))
    diagnosis = diagnose(plan.required_slots_per_group(), [TaskManagerSlots("tm-a", 3, 3)])

    assert not diagnosis.sufficient
    assert str(diagnosis) == (
        "job needs 4 slots (slot-sharing group 'default': 4) but the cluster has 3 slots in total, "
        "3 free (1 TaskManager: tm-a 3/3 free)"
    )


def test_diagnosis_counts_free_slots_not_total_slots():
    diagnosis = diagnose({"default": 4}, [TaskManagerSlots("tm-a", 2, 2), TaskManagerSlots("tm-b", 3, 1)])

    assert not diagnosis.sufficient
    assert str(diagnosis) == (
        "job needs 4 slots (slot-sharing group 'default': 4) but the cluster has 5 slots in total, "
        "3 free (2 TaskManagers: tm-a 2/2 free, tm-b 1/3 free)"
    )


def test_diagnosis_without_task_managers_says_none_is_registered():
    diagnosis = diagnose({"default": 4, "io": 2}, [])

    assert not diagnosis.sufficient
    assert diagnosis.available_total == 0
    assert str(diagnosis) == (
        "job needs 6 slots (slot-sharing groups 'default': 4, 'io': 2) but no TaskManager is registered"
    )


def test_task_manager_cannot_have_more_free_than_total_slots():
    with pytest.raises(ValueError, match="tm-a"):
        TaskManagerSlots("tm-a", 2, 3)


# -- local input preference --

def test_consumer_with_larger_parallelism_gets_new_slots_only_beyond_the_producers():
    graph = execution_graph(job_graph("widen", [source("src", 2), sink("snk", 5)],
                                      [connect("src", "snk", ALL_TO_ALL, PIPELINED)]))
    plan = build_slot_sharing_plan(graph)

    assert layout(plan) == [
        ["src[0]", "snk[0]"], ["src[1]", "snk[1]"], ["snk[2]"], ["snk[3]"], ["snk[4]"],
    ]
    assert plan.required_slots_per_group() == {"default": 5}


def test_pointwise_fan_out_follows_producer_then_takes_the_oldest_free_slot():
    # src[0] feeds snk[0..1], src[1] feeds snk[2..3]: one consumer per producer can join it;
    # the others take the oldest group still free for 'snk', here new ones.
    graph = execution_graph(job_graph("fan-out", [source("src", 2), sink("snk", 4)],
                                      [connect("src", "snk", POINTWISE, PIPELINED)]))
    plan = build_slot_sharing_plan(graph)

    assert layout(plan) == [["src[0]", "snk[0]"], ["src[1]", "snk[2]"], ["snk[1]"], ["snk[3]"]]


def test_subtask_without_local_input_takes_the_oldest_free_slot_not_a_new_one():
    # b's only producer is in another slot-sharing group, so b has no local preference and
    # fills a's groups from the oldest
    graph = execution_graph(job_graph(
        "no-local-input",
        [source("a", 3), source("c", 2, slot_sharing_group="other"), sink("b", 2)],
        [connect("c", "b", POINTWISE, PIPELINED)],
    ))
    plan = build_slot_sharing_plan(graph)

    assert layout(plan) == [["a[0]", "b[0]"], ["a[1]", "b[1]"], ["a[2]"], ["c[0]"], ["c[1]"]]
    assert plan.required_slots_per_group() == {"default": 3, "other": 2}


def test_consumer_of_several_inputs_follows_its_first_input():
    graph = execution_graph(job_graph(
        "two-inputs",
        [source("x", 2), operator("y", 2), operator("z", 2)],
        [connect("x", "y", POINTWISE, PIPELINED), connect("x", "z", ALL_TO_ALL, PIPELINED),
         connect("y", "z", ALL_TO_ALL, PIPELINED)],
    ))
    plan = build_slot_sharing_plan(graph)

    assert layout(plan) == [["x[0]", "y[0]", "z[0]"], ["x[1]", "y[1]", "z[1]"]]


def test_pointwise_fan_in_joins_the_group_of_its_first_producer():
    # rev[i] reads w[2i] and w[2i+1], and w[k] sits in group k
    graph = execution_graph(co_location_job(co_located=False))
    plan = build_slot_sharing_plan(graph)
    rev = graph.vertices["rev"].task_vertices

    assert [plan.group_of(ev).index for ev in rev] == [0, 2, 4]


# -- co-location --

def co_location_job(co_located: bool) -> JobGraph:
    """head (p=3) and tail (p=3), co-located in "it" if asked; tail's local input rev[i] sits in
    group 2i, so the local-input preference alone would put tail[1] and tail[2] elsewhere than
    head[1] and head[2]."""
    it = "it" if co_located else None
    return job_graph(
        "iteration",
        [source("head", 3, co_location_group=it), source("w", 6), operator("rev", 3),
         sink("tail", 3, co_location_group=it)],
        [connect("w", "rev", POINTWISE, PIPELINED), connect("rev", "tail", POINTWISE, PIPELINED)],
    )


def test_without_co_location_tail_follows_its_local_input():
    graph = execution_graph(co_location_job(co_located=False))
    plan = build_slot_sharing_plan(graph)

    tail = graph.vertices["tail"].task_vertices
    assert [plan.group_of(ev).index for ev in tail] == [0, 2, 4]


def test_co_located_subtasks_share_a_slot_even_against_local_input_preference():
    graph = execution_graph(co_location_job(co_located=True))
    plan = build_slot_sharing_plan(graph)

    head, tail = graph.vertices["head"].task_vertices, graph.vertices["tail"].task_vertices
    rev = graph.vertices["rev"].task_vertices
    for i in range(3):
        assert plan.group_of(tail[i]) is plan.group_of(head[i])
    assert [plan.group_of(ev).index for ev in tail] == [0, 1, 2]
    assert plan.group_of(tail[1]) is not plan.group_of(rev[1])
    assert plan.required_slots() == 6
    assert_plan_invariants(plan, graph)


def test_co_location_follows_the_first_member_in_topological_order():
    # tail comes first (head is declared after it) and sits with its inputs: tail[1] reads
    # w[2] and w[3], so it is in group 2. head, a source with no preference of its own, would
    # take the oldest free groups 0 and 1; co-location puts head[1] in group 2.
    job = job_graph(
        "co-location-order",
        [source("w", 4), sink("tail", 2, co_location_group="it"), source("head", 2, co_location_group="it")],
        [connect("w", "tail", POINTWISE, PIPELINED)],
    )
    graph = execution_graph(job)
    plan = build_slot_sharing_plan(graph)

    head, tail = graph.vertices["head"].task_vertices, graph.vertices["tail"].task_vertices
    assert [plan.group_of(ev).index for ev in tail] == [0, 2]
    assert [plan.group_of(ev).index for ev in head] == [0, 2]
    assert plan.required_slots() == 4


# -- slot-sharing groups --

def test_separate_slot_sharing_groups_need_the_sum_of_their_largest_parallelisms():
    job = job_graph(
        "two-groups",
        [source("src", 4), operator("map", 2), sink("snk", 5, slot_sharing_group="sinks"),
         sink("audit", 3, slot_sharing_group="sinks")],
        [connect("src", "map", ALL_TO_ALL, PIPELINED), connect("map", "snk", ALL_TO_ALL, PIPELINED),
         connect("src", "audit", ALL_TO_ALL, BLOCKING)],
    )
    graph = execution_graph(job)
    plan = build_slot_sharing_plan(graph)

    assert plan.required_slots_per_group() == {"default": 4, "sinks": 5}
    assert plan.required_slots() == 9
    # no group mixes slot-sharing groups, and the producer in another group is no preference
    assert_plan_invariants(plan, graph)
    assert layout(plan)[4:] == [["snk[0]", "audit[0]"], ["snk[1]", "audit[1]"], ["snk[2]", "audit[2]"],
                                ["snk[3]"], ["snk[4]"]]


def test_group_of_rejects_a_subtask_of_another_graph():
    plan = build_slot_sharing_plan(execution_graph(seed_example_job()))
    other = execution_graph(job_graph("other", [source("lonely", 1)], []))

    with pytest.raises(KeyError, match="lonely"):
        plan.group_of(other.vertices["lonely"].task_vertices[0])


@pytest.mark.parametrize("result_type", [PIPELINED, BLOCKING])
def test_all_to_all_source_sink_pairs_subtask_i_with_subtask_i(result_type):
    p = 500
    graph = execution_graph(source_sink_all_to_all(p, result_type))
    plan = build_slot_sharing_plan(graph)

    assert plan.required_slots() == p
    assert [members(g) for g in plan.groups[:2]] == [["source[0]", "sink[0]"], ["source[1]", "sink[1]"]]
    assert all(len(g.vertices) == 2 for g in plan.groups)
    assert_plan_invariants(plan, graph)


def test_hash_edges_from_helpers_carry_keys():
    # the seed example's HASH edge must be valid for validation (HASH needs keys and ALL_TO_ALL)
    edge = next(e for e in seed_example_job().edges if e.partitioner is PartitionerKind.HASH)
    assert edge.partition_keys and edge.distribution_pattern is ALL_TO_ALL


def test_helper_graphs_pass_validation():
    pytest.importorskip("funke.common.graph.restart")  # validation checks restart strategies with it
    from funke.common.graph.validation import find_problems

    for job in (seed_example_job(), seed_example_job(BLOCKING), source_sink_all_to_all(3, BLOCKING)):
        assert find_problems(job) == []
