"""Pipelined regions and the region failover restart set (funke.common.scheduling.regions)."""

from __future__ import annotations

from collections import deque

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from funke.common.graph.executiongraph import ExecutionGraph, PartitionLocation
from funke.common.graph.jobgraph import DistributionPattern
from funke.common.scheduling.regions import PipelinedRegions, compute_pipelined_regions
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
    sink,
    source,
    source_sink_all_to_all,
)


def ids(region) -> list[str]:
    return [str(ev.id) for ev in region.vertices]


def layout(regions: PipelinedRegions) -> list[list[str]]:
    return [ids(r) for r in regions.regions]


def ev(graph: ExecutionGraph, vertex_id: str, subtask: int):
    return graph.vertices[vertex_id].task_vertices[subtask]


def finish_all_partitions(graph: ExecutionGraph) -> None:
    for result in graph.results.values():
        for partition in result.partitions:
            graph.mark_partition_finished(partition, PartitionLocation(0, "tm-1", "x INT"))


def restart_ids(regions: PipelinedRegions, failed, **kw) -> list[list[str]]:
    return sorted(ids(r) for r in regions.regions_to_restart(failed, **kw))


def batch_pipeline() -> ExecutionGraph:
    """src (2) -FORWARD-> map (2) -ALL_TO_ALL-> snk (2), every result BLOCKING."""
    return execution_graph(job_graph(
        "batch",
        [source("src", 2), operator("map", 2), sink("snk", 2)],
        [connect("src", "map", POINTWISE, BLOCKING), connect("map", "snk", ALL_TO_ALL, BLOCKING)],
    ))


# -- computing regions --

def test_all_blocking_pipeline_has_one_region_per_subtask():
    graph = batch_pipeline()
    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [["src[0]"], ["src[1]"], ["map[0]"], ["map[1]"], ["snk[0]"], ["snk[1]"]]
    assert [r.index for r in regions.regions] == list(range(6))
    assert regions.source_regions() == regions.regions[:2]
    # map[i] waits for its own FORWARD partition; both sinks wait for the one ALL_TO_ALL group
    map0, map1, snk0, snk1 = regions.regions[2:]
    assert map0.blocking_inputs == ev(graph, "map", 0).consumed_partition_groups
    assert map1.blocking_inputs == ev(graph, "map", 1).consumed_partition_groups
    assert len(snk0.blocking_inputs) == 1 and snk0.blocking_inputs[0] is snk1.blocking_inputs[0]
    assert len(snk0.blocking_inputs[0]) == 2


def test_all_pipelined_job_is_one_region_when_everything_is_connected():
    graph = execution_graph(seed_example_job(PIPELINED))
    regions = compute_pipelined_regions(graph)

    assert len(regions) == 1
    (region,) = regions.regions
    assert len(region) == 11
    assert list(region) == list(graph.execution_vertices())  # topological order inside
    assert region.blocking_inputs == []
    assert regions.source_regions() == [region]


def test_pipelined_pointwise_chains_are_one_region_per_chain():
    graph = execution_graph(job_graph(
        "chains", [source("src", 3), sink("snk", 3)], [connect("src", "snk", POINTWISE, PIPELINED)]))

    assert layout(compute_pipelined_regions(graph)) == [
        ["src[0]", "snk[0]"], ["src[1]", "snk[1]"], ["src[2]", "snk[2]"]]


def test_pipelined_pointwise_fan_in_joins_the_producers_of_each_consumer():
    graph = execution_graph(job_graph(
        "fan-in", [source("src", 4), sink("snk", 2)], [connect("src", "snk", POINTWISE, PIPELINED)]))

    assert layout(compute_pipelined_regions(graph)) == [
        ["src[0]", "src[1]", "snk[0]"], ["src[2]", "src[3]", "snk[1]"]]


def test_mixed_pipelined_chains_are_separated_by_a_blocking_shuffle():
    graph = execution_graph(job_graph(
        "mixed",
        [source("src", 2), operator("map", 2), sink("snk", 2)],
        [connect("src", "map", POINTWISE, PIPELINED), connect("map", "snk", ALL_TO_ALL, BLOCKING)],
    ))
    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [["src[0]", "map[0]"], ["src[1]", "map[1]"], ["snk[0]"], ["snk[1]"]]
    assert regions.source_regions() == regions.regions[:2]
    shuffle = ev(graph, "snk", 0).consumed_partition_groups[0]
    assert regions.consumer_regions_of(shuffle) == regions.regions[2:]
    assert regions.consumer_regions_of(shuffle) is regions.consumer_regions_of(shuffle)  # cached


def test_pipelined_shuffle_then_blocking_forward():
    graph = execution_graph(job_graph(
        "shuffle-then-forward",
        [source("src", 2), operator("map", 3), sink("snk", 3)],
        [connect("src", "map", ALL_TO_ALL, PIPELINED), connect("map", "snk", POINTWISE, BLOCKING)],
    ))
    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [
        ["src[0]", "src[1]", "map[0]", "map[1]", "map[2]"], ["snk[0]"], ["snk[1]"], ["snk[2]"]]
    assert all(len(r.blocking_inputs) == 1 for r in regions.regions[1:])


def test_blocking_all_to_all_inside_a_pipelined_logical_region_makes_it_one_region():
    # a → b pipelined, a → c blocking ALL_TO_ALL, c → b pipelined: {a, b, c} is one logical
    # region; splitting it per subtask could deadlock (FLINK-17330), so it stays whole
    graph = execution_graph(job_graph(
        "blocking-inside",
        [source("a", 2), operator("c", 2), operator("b", 2)],
        [connect("a", "b", POINTWISE, PIPELINED), connect("a", "c", ALL_TO_ALL, BLOCKING),
         connect("c", "b", POINTWISE, PIPELINED)],
    ))
    regions = compute_pipelined_regions(graph)

    assert len(regions) == 1
    assert len(regions.regions[0]) == 6
    assert regions.regions[0].blocking_inputs == []  # the blocking group is read inside


def test_pointwise_pipelined_regions_in_a_cycle_through_blocking_results_are_merged():
    # a[i] → b[i] pipelined; a[i] → c[i] → b[i] blocking. {a[i], b[i]} and {c[i]} would each
    # wait for the other, so they merge — per subtask, not into one region.
    graph = execution_graph(job_graph(
        "cycle",
        [source("a", 2), operator("c", 2), operator("b", 2)],
        [connect("a", "b", POINTWISE, PIPELINED), connect("a", "c", POINTWISE, BLOCKING),
         connect("c", "b", POINTWISE, BLOCKING)],
    ))
    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [["a[0]", "c[0]", "b[0]"], ["a[1]", "c[1]", "b[1]"]]
    assert regions.source_regions() == regions.regions


def test_blocking_group_partly_produced_by_its_consumers_region_is_merged():
    # k[0] → a[0], a[1] and k[1] → a[2] (pointwise 2→3, pipelined); k[i] → c[i] pipelined.
    # Raw regions {k0, a0, a1, c0} and {k1, a2, c1}; c[1] reads a[1] and a[2] BLOCKING as one
    # group, half produced in its own region: waiting for the whole group would deadlock.
    graph = execution_graph(job_graph(
        "cross-region",
        [source("k", 2), operator("a", 3), operator("c", 2)],
        [connect("k", "a", POINTWISE, PIPELINED), connect("k", "c", POINTWISE, PIPELINED),
         connect("a", "c", POINTWISE, BLOCKING)],
    ))
    cross = ev(graph, "c", 1).consumed_partition_groups[1]
    assert [p.partition_index for p in cross.partitions] == [1, 2]

    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [["k[0]", "k[1]", "a[0]", "a[1]", "a[2]", "c[0]", "c[1]"]]
    assert_region_invariants(graph, regions)


def test_regions_are_topologically_sorted_across_branches():
    # src2's region is declared last but feeds the join, so it must come before it
    graph = execution_graph(job_graph(
        "join",
        [source("src1", 1), operator("join", 1), source("src2", 1)],
        [connect("src1", "join", POINTWISE, BLOCKING), connect("src2", "join", POINTWISE, BLOCKING)],
    ))
    regions = compute_pipelined_regions(graph)

    assert layout(regions) == [["src1[0]"], ["src2[0]"], ["join[0]"]]
    assert len(regions.regions[2].blocking_inputs) == 2


def test_region_of_rejects_a_subtask_of_another_graph():
    regions = compute_pipelined_regions(batch_pipeline())
    with pytest.raises(KeyError, match="lonely"):
        regions.region_of(ev(execution_graph(job_graph("x", [source("lonely", 1)], [])), "lonely", 0))


# -- restart sets --

def test_failure_in_consumer_region_with_available_input_restarts_it_and_downstream():
    graph = batch_pipeline()
    finish_all_partitions(graph)
    regions = compute_pipelined_regions(graph)

    assert restart_ids(regions, [ev(graph, "map", 0)]) == [["map[0]"], ["snk[0]"], ["snk[1]"]]
    assert restart_ids(regions, [ev(graph, "snk", 1)]) == [["snk[1]"]]


def test_unavailable_input_partition_adds_its_producer_region():
    graph = batch_pipeline()
    finish_all_partitions(graph)
    graph.mark_partition_unavailable(ev(graph, "src", 0).produced_partitions[0])
    regions = compute_pipelined_regions(graph)

    assert restart_ids(regions, [ev(graph, "map", 0)]) == [["map[0]"], ["snk[0]"], ["snk[1]"], ["src[0]"]]
    # map[1] reads src[1], which is still there
    assert restart_ids(regions, [ev(graph, "map", 1)]) == [["map[1]"], ["snk[0]"], ["snk[1]"]]


def test_failure_upstream_restarts_every_downstream_consumer_region():
    graph = batch_pipeline()
    finish_all_partitions(graph)
    regions = compute_pipelined_regions(graph)

    assert restart_ids(regions, [ev(graph, "src", 1)]) == [["map[1]"], ["snk[0]"], ["snk[1]"], ["src[1]"]]


def test_lost_shuffle_output_restarts_the_producers_transitively():
    # nothing is available: snk[0] needs both maps, which need their sources, whose restart
    # rewrites everything downstream
    graph = batch_pipeline()
    regions = compute_pipelined_regions(graph)

    assert len(regions.regions_to_restart([ev(graph, "snk", 0)])) == 6


def test_availability_can_be_overridden_by_the_caller():
    graph = batch_pipeline()
    finish_all_partitions(graph)
    regions = compute_pipelined_regions(graph)
    lost = ev(graph, "map", 1).produced_partitions[0]

    restarted = restart_ids(regions, [ev(graph, "snk", 0)], is_available=lambda p: p is not lost)

    assert restarted == [["map[1]"], ["snk[0]"], ["snk[1]"]]


def test_failure_in_a_pipelined_region_restarts_the_whole_region():
    graph = execution_graph(seed_example_job(PIPELINED))
    regions = compute_pipelined_regions(graph)

    assert regions.regions_to_restart([ev(graph, "map", 2)]) == set(regions.regions)


def test_unknown_failed_vertex_is_an_error():
    regions = compute_pipelined_regions(batch_pipeline())
    with pytest.raises(KeyError, match="can not find the pipelined region"):
        regions.regions_to_restart([ev(execution_graph(job_graph("x", [source("lonely", 1)], [])), "lonely", 0)])


# -- scale --

@pytest.mark.parametrize("result_type", [BLOCKING, PIPELINED])
def test_all_to_all_at_p_10000_stays_linear(result_type):
    graph = execution_graph(source_sink_all_to_all(10_000, result_type))
    regions = compute_pipelined_regions(graph)
    restart = regions.regions_to_restart([ev(graph, "sink", 0)])  # nothing available: worst case
    assert len(regions) == (20_000 if result_type is BLOCKING else 1)
    assert sum(len(r) for r in restart) == 20_000
    # the 10 000 sinks share one consumed-partition group: no P x P edges
    assert len({id(g) for v in graph.vertices["sink"].task_vertices for g in v.consumed_partition_groups}) == 1

    def regions_and_restart(p: int):
        g = execution_graph(source_sink_all_to_all(p, result_type))
        return lambda: compute_pipelined_regions(g).regions_to_restart([ev(g, "sink", 0)])

    assert growth(regions_and_restart, 500) < 2.5  # linear: about 2; quadratic: about 4


# -- properties on random graphs, against a naive reference --

@st.composite
def random_graphs(draw) -> ExecutionGraph:
    n = draw(st.integers(1, 6))
    parallelism = [draw(st.integers(1, 4)) for _ in range(n)]
    connections = []
    has_input = [False] * n
    for consumer in range(1, n):
        producers = draw(st.lists(st.integers(0, consumer - 1), max_size=2))
        for producer in producers:
            pattern = draw(st.sampled_from([POINTWISE, ALL_TO_ALL]))
            result_type = draw(st.sampled_from([BLOCKING, PIPELINED]))
            connections.append(connect(f"v{producer}", f"v{consumer}", pattern, result_type))
            has_input[consumer] = True
    vertices = [operator(f"v{i}", parallelism[i]) if has_input[i] else source(f"v{i}", parallelism[i])
                for i in range(n)]
    graph = execution_graph(job_graph("random", vertices, connections))
    for result in graph.results.values():
        for partition in result.partitions:
            if draw(st.booleans()):
                graph.mark_partition_finished(partition, PartitionLocation(0, "tm", "x INT"))
    return graph


def assert_region_invariants(graph: ExecutionGraph, regions: PipelinedRegions) -> None:
    every = [v for r in regions.regions for v in r.vertices]
    assert sorted(v.id for v in every) == sorted(v.id for v in graph.execution_vertices())
    for index, region in enumerate(regions.regions):
        assert region.index == index
        assert all(regions.region_of(v) is region for v in region.vertices)
        # the order the scheduler deploys a region in, without sorting it
        order = [(v.job_vertex.topological_index, v.subtask_index) for v in region.vertices]
        assert order == sorted(order)
        external = []
        for v in region.vertices:
            for group in v.consumed_partition_groups:
                producers = {regions.region_of(p.producer) for p in group.partitions}
                if not group.result.is_blocking:
                    assert producers == {region}, "a pipelined group crosses regions"
                # wholly inside or wholly outside: "all blocking inputs finished" is then the
                # exact scheduling condition
                assert region not in producers or producers == {region}
                if region not in producers and all(group is not g for g in external):
                    external.append(group)
                    assert all(p.index < index for p in producers), "regions are not topologically sorted"
        assert region.blocking_inputs == external
        # what it restarts downstream: consumer groups with a consumer in another region
        leaving = []
        for v in region.vertices:
            for partition in v.produced_partitions:
                for consumers in partition.consumer_vertex_groups:
                    if (any(regions.region_of(c) is not region for c in consumers.vertices)
                            and all(consumers is not g for g in leaving)):
                        leaving.append(consumers)
        if len(region.vertices) > 1:
            assert list(region.downstream) == leaving
        else:
            assert region.downstream is None  # read off its one subtask
    # no cycle between regions through any result
    region_graph = nx.DiGraph()
    region_graph.add_nodes_from(r.index for r in regions.regions)
    for result in graph.results.values():
        for partition in result.partitions:
            for consumers in partition.consumer_vertex_groups:
                for consumer in consumers.vertices:
                    a, b = regions.region_of(partition.producer).index, regions.region_of(consumer).index
                    if a != b:
                        region_graph.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(region_graph)


def naive_regions(graph: ExecutionGraph) -> set[frozenset[str]]:
    """The same rules as compute_pipelined_regions, written plainly over every subtask edge."""
    logical = nx.Graph()
    logical.add_nodes_from(graph.vertices)
    for r in graph.results.values():
        if not r.is_blocking:
            logical.add_edge(r.producer.id, r.consumer.id)
    logical_of = {v: i for i, c in enumerate(nx.connected_components(logical)) for v in c}
    between = nx.DiGraph()
    between.add_nodes_from(set(logical_of.values()))
    for r in graph.results.values():
        between.add_edge(logical_of[r.producer.id], logical_of[r.consumer.id])
    merged = {n: i for i, c in enumerate(nx.strongly_connected_components(between)) for n in c}
    logical_of = {v: merged[lr] for v, lr in logical_of.items()}
    whole = {logical_of[r.producer.id] for r in graph.results.values()
             if logical_of[r.producer.id] == logical_of[r.consumer.id]
             and r.edge.distribution_pattern is DistributionPattern.ALL_TO_ALL}

    raw = nx.Graph()
    raw.add_nodes_from(v.id for v in graph.execution_vertices())
    for v in graph.execution_vertices():
        lr = logical_of[v.job_vertex.id]
        if lr in whole:
            first = next(u for u in graph.execution_vertices() if logical_of[u.job_vertex.id] == lr)
            raw.add_edge(first.id, v.id)
        for group in v.consumed_partition_groups:
            if not group.result.is_blocking:
                for p in group.partitions:
                    raw.add_edge(p.producer.id, v.id)
    region_of = {v: i for i, c in enumerate(nx.connected_components(raw)) for v in c}
    while True:  # merge cycles and half-inside groups until nothing changes
        cycles = nx.DiGraph()
        cycles.add_nodes_from(set(region_of.values()))
        for v in graph.execution_vertices():
            for group in v.consumed_partition_groups:
                same_logical = logical_of[group.result.producer.id] == logical_of[v.job_vertex.id]
                if group.result.is_blocking and same_logical:
                    producers = {region_of[p.producer.id] for p in group.partitions}
                    for rp in producers:
                        cycles.add_edge(rp, region_of[v.id])
                        if region_of[v.id] in producers:
                            cycles.add_edge(region_of[v.id], rp)
        final = {n: i for i, c in enumerate(nx.strongly_connected_components(cycles)) for n in c}
        if len(set(final.values())) == len(set(region_of.values())):
            break
        region_of = {v: final[r] for v, r in region_of.items()}
    out: dict[int, set[str]] = {}
    for v, r in region_of.items():
        out.setdefault(r, set()).add(str(v))
    return {frozenset(s) for s in out.values()}


def naive_restart(graph: ExecutionGraph, regions: PipelinedRegions, failed) -> set[int]:
    """Flink's BFS without the visited-group shortcuts."""
    todo = deque(regions.region_of(v) for v in failed)
    seen = set(todo)
    while todo:
        region = todo.popleft()
        for v in region.vertices:
            nxt = [p.producer for g in v.consumed_partition_groups for p in g.partitions if not p.is_available]
            nxt += [c for p in v.produced_partitions for g in p.consumer_vertex_groups for c in g.vertices]
            for u in nxt:
                r = regions.region_of(u)
                if r not in seen:
                    seen.add(r)
                    todo.append(r)
    return {r.index for r in seen}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.data())
def test_random_graphs_match_the_naive_reference(graph, data):
    regions = compute_pipelined_regions(graph)

    assert_region_invariants(graph, regions)
    assert {frozenset(ids(r)) for r in regions.regions} == naive_regions(graph)
    vertices = list(graph.execution_vertices())
    failed = data.draw(st.lists(st.sampled_from(vertices), min_size=1, max_size=3))
    assert {r.index for r in regions.regions_to_restart(failed)} == naive_restart(graph, regions, failed)


def test_merging_a_cycle_can_leave_a_group_half_inside_which_merges_too():
    """v0(3) -> v1(2) blocking and v1 -> v3(3) blocking, with v0 -> v3 pipelined. Merging the
    cycle v1[1] <-> {v0[2], v3[2]} leaves v1[1]'s input {v0[1], v0[2]} half inside the merged
    region; waiting for it would deadlock, so {v0[1], v3[1]} must join as well."""
    graph = execution_graph(job_graph(
        "half-inside",
        [source("v0", 3), operator("v1", 2), source("v2", 1), operator("v3", 3)],
        [connect("v0", "v1", POINTWISE, BLOCKING), connect("v0", "v3", POINTWISE, PIPELINED),
         connect("v1", "v3", POINTWISE, BLOCKING)],
    ))
    regions = compute_pipelined_regions(graph)
    assert_region_invariants(graph, regions)
    assert {frozenset(ids(r)) for r in regions.regions} == naive_regions(graph)
    assert sorted(sorted(ids(r)) for r in regions.regions) == sorted([
        sorted(["v0[0]", "v1[0]", "v3[0]"]),
        sorted(["v0[1]", "v3[1]", "v0[2]", "v1[1]", "v3[2]"]),
        ["v2[0]"],
    ])
