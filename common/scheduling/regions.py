"""Pipelined regions: the units the scheduler deploys together and the failover strategy restarts.

Owns PipelinedRegion, the PipelinedRegions of an ExecutionGraph (computed once, topologically
sorted), and the restart set of Flink's RestartPipelinedRegionFailoverStrategy.

A region is a set of subtasks connected by PIPELINED results: producer and consumer run at the same
time, so they are scheduled and restarted together. BLOCKING results separate regions; a region's
`blocking_inputs` are the consumed partition groups it reads from other regions, and it may be
scheduled once all of them are finished. Regions that depend on each other in a cycle are merged,
because neither could otherwise start first.

Computing regions must stay O(P) for ALL_TO_ALL edges at P = 10 000, so it follows Flink
(DefaultExecutionTopology, FLINK-17330):
  1. logical regions on the JobVertex graph (union-find over PIPELINED results), with cycles
     between logical regions merged;
  2. a logical region with any internal ALL_TO_ALL result becomes one region as a whole. For a
     PIPELINED edge it would anyway; for a BLOCKING one, splitting it could deadlock;
  3. other logical regions are split per subtask with union-find over POINTWISE PIPELINED groups,
     then cycles through their internal BLOCKING groups are merged (Tarjan SCC).
Step 3 also merges a region with the producers of a BLOCKING group it partly produces itself
("cross-region" in Flink). Flink instead waits only for the partitions produced outside; merging
keeps the scheduling rule to "every blocking input is finished", and the group is then read inside
one region. A BLOCKING result inside a region is read by its consumer once its producer, in the
same region, has finished; it is never a scheduling input.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from funke.common.graph.executiongraph import (
    ConsumedPartitionGroup,
    ConsumerVertexGroup,
    ExecutionGraph,
    ExecutionJobVertex,
    ExecutionVertex,
    IntermediateResultPartition,
)
from funke.common.graph.jobgraph import DistributionPattern


class PipelinedRegion:
    """Subtasks connected by pipelined results, in topological order (by job vertex, then subtask
    index: the scheduler deploys a region in this order without sorting it). Equal only to itself."""

    __slots__ = ("index", "vertices", "blocking_inputs", "downstream")

    def __init__(self, index: int):
        self.index = index
        self.vertices: list[ExecutionVertex] = []
        # consumed groups produced in other regions, each once: the scheduling preconditions
        self.blocking_inputs: list[ConsumedPartitionGroup] = []
        # consumer groups of what it produces that have consumers in other regions, each once
        # (what a restart of it restarts downstream); None for a region of one subtask, whose
        # consumer groups are read off the subtask (a batch job at P = 100 000 has 200 000 such
        # regions, and a tuple each would cost memory)
        self.downstream: tuple[ConsumerVertexGroup, ...] | None = None

    def __len__(self) -> int:
        return len(self.vertices)

    def __iter__(self) -> Iterator[ExecutionVertex]:
        return iter(self.vertices)

    def __repr__(self) -> str:
        shown = ", ".join(str(ev.id) for ev in self.vertices[:4])
        more = f", … {len(self.vertices) - 4} more" if len(self.vertices) > 4 else ""
        return f"PipelinedRegion({self.index}: [{shown}{more}], {len(self.blocking_inputs)} blocking inputs)"


class PipelinedRegions:
    """All regions of one ExecutionGraph; a region comes after the regions it consumes from."""

    __slots__ = ("regions", "_by_job_vertex", "_consumer_regions")

    def __init__(self, regions: list[PipelinedRegion],
                 by_job_vertex: dict[ExecutionJobVertex, list[PipelinedRegion]]):
        self.regions = regions
        # job vertex -> the region of each subtask, indexed by subtask index
        self._by_job_vertex = by_job_vertex
        self._consumer_regions: dict[ConsumedPartitionGroup, list[PipelinedRegion]] = {}

    def __len__(self) -> int:
        return len(self.regions)

    def __iter__(self) -> Iterator[PipelinedRegion]:
        return iter(self.regions)

    def region_of(self, ev: ExecutionVertex) -> PipelinedRegion:
        try:
            return self._by_job_vertex[ev.job_vertex][ev.subtask_index]
        except (KeyError, IndexError):
            raise KeyError(f"can not find the pipelined region of {ev.name} ({ev.id})") from None

    def source_regions(self) -> list[PipelinedRegion]:
        """Regions that depend on no other region: the scheduler starts with these."""
        return [r for r in self.regions if not r.blocking_inputs]

    def consumer_regions_of(self, group: ConsumedPartitionGroup) -> list[PipelinedRegion]:
        """Regions holding a consumer of `group`, each once, in region order."""
        cached = self._consumer_regions.get(group)
        if cached is None:
            consumers = group.consumer_vertex_group
            cached = _distinct(self.region_of(ev) for ev in consumers.vertices) if consumers is not None else []
            cached.sort(key=lambda r: r.index)
            self._consumer_regions[group] = cached
        return cached

    def regions_to_restart(
        self,
        failed: Iterable[ExecutionVertex],
        is_available: Callable[[IntermediateResultPartition], bool] | None = None,
    ) -> set[PipelinedRegion]:
        """The regions to restart after `failed` failed: their regions, the producer regions of
        every input partition that is no longer available (their data must be recomputed), and,
        transitively, every region downstream of a restarted one (its input will be rewritten).

        Shared groups are expanded once per call, so an ALL_TO_ALL edge costs O(P), not O(P²).
        """
        available = is_available if is_available is not None else _partition_is_available
        restart: set[PipelinedRegion] = set()
        queue: deque[PipelinedRegion] = deque()
        for ev in failed:
            region = self.region_of(ev)
            if region not in restart:
                restart.add(region)
                queue.append(region)
        seen_consumed: set[ConsumedPartitionGroup] = set()
        seen_consumers: set[ConsumerVertexGroup] = set()
        region_of = self.region_of
        # Only a region's boundary matters: what it reads from other regions and who reads it in
        # other regions. A partition made inside the region is remade by its restart anyway, and
        # a consumer inside it restarts with it (a streaming job at P = 100 000 is one region of
        # 200 000 subtasks: walking them took 100 ms, the boundary is empty).
        while queue:
            region = queue.popleft()
            for consumed in region.blocking_inputs:
                if consumed in seen_consumed:
                    continue
                seen_consumed.add(consumed)
                for partition in consumed.partitions:
                    if not available(partition):
                        producer_region = region_of(partition.producer)
                        if producer_region not in restart:
                            restart.add(producer_region)
                            queue.append(producer_region)
            for consumers in _downstream(region):
                if consumers in seen_consumers:
                    continue
                seen_consumers.add(consumers)
                for consumer in consumers.vertices:
                    consumer_region = region_of(consumer)
                    if consumer_region not in restart:
                        restart.add(consumer_region)
                        queue.append(consumer_region)
        return restart

    def __repr__(self) -> str:
        return f"PipelinedRegions({len(self.regions)} regions)"


def _partition_is_available(partition: IntermediateResultPartition) -> bool:
    return partition.is_available


def _downstream(region: PipelinedRegion) -> Iterable[ConsumerVertexGroup]:
    if region.downstream is not None:
        return region.downstream
    (ev,) = region.vertices
    return [consumers for partition in ev.produced_partitions for consumers in partition.consumer_vertex_groups]


def _distinct(regions: Iterable[PipelinedRegion]) -> list[PipelinedRegion]:
    return list(dict.fromkeys(regions))


def compute_pipelined_regions(graph: ExecutionGraph) -> PipelinedRegions:
    job_vertices = list(graph.vertices.values())  # topological; topological_index is the position
    logical, whole = _logical_regions(graph, job_vertices)

    # Every subtask gets a position: producers before consumers, subtasks in order.
    offsets: list[int] = []
    total = 0
    for ejv in job_vertices:
        offsets.append(total)
        total += ejv.parallelism

    # -- raw regions: union-find over subtasks joined by pipelined results --
    sets = _DisjointSets(total)
    anchors: dict[int, int] = {}  # whole logical region -> the position all its subtasks join
    for ejv in job_vertices:
        lr = logical[ejv.topological_index]
        base = offsets[ejv.topological_index]
        if whole[lr]:
            anchor = anchors.setdefault(lr, base)
            for position in range(base, base + ejv.parallelism):
                sets.union(anchor, position)
            continue
        for ev in ejv.task_vertices:
            for consumed in ev.consumed_partition_groups:
                result = consumed.result
                if result.is_blocking:
                    continue
                producer_base = offsets[result.producer.topological_index]
                for partition in consumed.partitions:
                    sets.union(base + ev.subtask_index, producer_base + partition.partition_index)
    raw_of, raw_count = sets.compact()

    # -- merge raw regions on cycles through blocking groups inside split logical regions.
    # Cycles across logical regions were merged at the logical level, and a whole logical region
    # is one raw region, so these are the only edges that can close a cycle. --
    # Merging can leave a group half inside a merged region (some producers inside, some
    # outside), which must merge as well: repeat until a round merges nothing.
    merging = _DisjointSets(raw_count)
    while True:
        successors: dict[int, list[int]] = {}
        for ejv in job_vertices:
            lr = logical[ejv.topological_index]
            if whole[lr]:
                continue
            base = offsets[ejv.topological_index]
            for ev in ejv.task_vertices:
                consumer_raw = merging.find(raw_of[base + ev.subtask_index])
                for consumed in ev.consumed_partition_groups:
                    result = consumed.result
                    if not result.is_blocking or logical[result.producer.topological_index] != lr:
                        continue
                    producer_base = offsets[result.producer.topological_index]
                    producers = {merging.find(raw_of[producer_base + p.partition_index]) for p in consumed.partitions}
                    partly_inside = consumer_raw in producers
                    for producer_raw in producers:
                        if producer_raw != consumer_raw:
                            successors.setdefault(producer_raw, []).append(consumer_raw)
                            if partly_inside:
                                # a group partly produced by its own consumer's region: merge with
                                # the other producers' regions (see the module docstring)
                                successors.setdefault(consumer_raw, []).append(producer_raw)
        merged_any = False
        for component in _strongly_connected_components(list(successors), successors):
            for raw in component[1:]:
                merging.union(component[0], raw)
                merged_any = True
        if not merged_any:
            break
    merged = [merging.find(raw) for raw in range(raw_count)]

    # -- regions, in order of their first subtask for now --
    regions: list[PipelinedRegion] = []
    region_at: dict[int, PipelinedRegion] = {}
    by_job_vertex: dict[ExecutionJobVertex, list[PipelinedRegion]] = {}
    for ejv in job_vertices:
        base = offsets[ejv.topological_index]
        of_subtask: list[PipelinedRegion] = []
        for ev in ejv.task_vertices:
            key = merged[raw_of[base + ev.subtask_index]]
            region = region_at.get(key)
            if region is None:
                region = region_at[key] = PipelinedRegion(len(regions))
                regions.append(region)
            region.vertices.append(ev)
            of_subtask.append(region)
        by_job_vertex[ejv] = of_subtask

    for region in regions:
        _collect_blocking_inputs(region, by_job_vertex)
        if len(region.vertices) > 1:
            _collect_downstream(region, by_job_vertex)
    ordered = _topological_order(regions, by_job_vertex)
    for index, region in enumerate(ordered):
        region.index = index
    return PipelinedRegions(ordered, by_job_vertex)


def _logical_regions(graph: ExecutionGraph, job_vertices: list[ExecutionJobVertex]) -> tuple[list[int], list[bool]]:
    """Logical region of each job vertex (by topological index), and per logical region whether
    it is one region as a whole (it has an internal ALL_TO_ALL result)."""
    sets = _DisjointSets(len(job_vertices))
    for result in graph.results.values():
        if not result.is_blocking:
            sets.union(result.producer.topological_index, result.consumer.topological_index)
    # The JobGraph is acyclic, but its logical regions need not be: A→B pipelined with A→C→B
    # blocking makes {A, B} and {C} wait for each other.
    raw_of, raw_count = sets.compact()
    representative = [0] * raw_count  # a job vertex of each raw logical region
    for position, raw in enumerate(raw_of):
        representative[raw] = position
    successors: dict[int, list[int]] = {}
    for result in graph.results.values():
        producer = raw_of[result.producer.topological_index]
        consumer = raw_of[result.consumer.topological_index]
        if producer != consumer:
            successors.setdefault(producer, []).append(consumer)
    for component in _strongly_connected_components(list(successors), successors):
        for raw in component[1:]:
            sets.union(representative[component[0]], representative[raw])
    logical, count = sets.compact()

    whole = [False] * count
    for result in graph.results.values():
        lr = logical[result.producer.topological_index]
        if (lr == logical[result.consumer.topological_index]
                and result.edge.distribution_pattern is DistributionPattern.ALL_TO_ALL):
            whole[lr] = True
    return logical, whole


def _collect_blocking_inputs(region: PipelinedRegion,
                             by_job_vertex: dict[ExecutionJobVertex, list[PipelinedRegion]]) -> None:
    # Every consumed group is produced either wholly inside or wholly outside its consumer's
    # region (pipelined groups are unioned, cross-region blocking groups merged), so the first
    # partition tells which.
    seen: set[ConsumedPartitionGroup] = set()
    for ev in region.vertices:
        for consumed in ev.consumed_partition_groups:
            if consumed in seen:
                continue
            seen.add(consumed)
            first = consumed.partitions[0]
            if by_job_vertex[consumed.result.producer][first.partition_index] is not region:
                region.blocking_inputs.append(consumed)


def _collect_downstream(region: PipelinedRegion, by_job_vertex: dict[ExecutionJobVertex, list[PipelinedRegion]]) -> None:
    seen: set[ConsumerVertexGroup] = set()
    downstream: list[ConsumerVertexGroup] = []
    for ev in region.vertices:
        for partition in ev.produced_partitions:
            for consumers in partition.consumer_vertex_groups:
                if consumers in seen:
                    continue
                seen.add(consumers)
                regions = by_job_vertex[consumers.result.consumer]
                if any(regions[consumer.subtask_index] is not region for consumer in consumers.vertices):
                    downstream.append(consumers)
    region.downstream = tuple(downstream)


def _topological_order(regions: list[PipelinedRegion],
                       by_job_vertex: dict[ExecutionJobVertex, list[PipelinedRegion]]) -> list[PipelinedRegion]:
    """Kahn's algorithm over regions and the groups between them. Going through the group keeps
    an ALL_TO_ALL edge at O(P) instead of P² region-to-region edges. Ties go to the region whose
    first subtask comes first, so the order is deterministic."""
    unfinished_inputs = [len(r.blocking_inputs) for r in regions]  # by provisional index
    waiting: dict[ConsumedPartitionGroup, list[PipelinedRegion]] = {}
    unproduced: dict[ConsumedPartitionGroup, int] = {}  # partitions whose region is not yet ordered
    produces: dict[PipelinedRegion, list[ConsumedPartitionGroup]] = {}  # one entry per partition
    for region in regions:
        for consumed in region.blocking_inputs:
            consumers = waiting.get(consumed)
            if consumers is not None:
                consumers.append(region)
                continue
            waiting[consumed] = [region]
            unproduced[consumed] = len(consumed.partitions)
            producer_regions = by_job_vertex[consumed.result.producer]
            for partition in consumed.partitions:
                produces.setdefault(producer_regions[partition.partition_index], []).append(consumed)

    ready = [r.index for r in regions if not r.blocking_inputs]
    heapq.heapify(ready)
    ordered: list[PipelinedRegion] = []
    while ready:
        region = regions[heapq.heappop(ready)]
        ordered.append(region)
        for consumed in produces.get(region, ()):
            unproduced[consumed] -= 1
            if unproduced[consumed]:
                continue
            for consumer in waiting[consumed]:
                unfinished_inputs[consumer.index] -= 1
                if not unfinished_inputs[consumer.index]:
                    heapq.heappush(ready, consumer.index)
    if len(ordered) != len(regions):
        stuck = [r for r in regions if unfinished_inputs[r.index]]
        raise RuntimeError(f"pipelined regions still depend on each other in a cycle: {stuck[:3]}")
    return ordered


class _DisjointSets:
    """Union-find over 0..n-1 with path compression and union by size."""

    __slots__ = ("parent", "size")

    def __init__(self, n: int):
        self.parent = list(range(n))
        self.size = [1] * n

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]

    def compact(self) -> tuple[list[int], int]:
        """Set id of every element, numbered 0.. in order of each set's first element."""
        ids: dict[int, int] = {}
        out = [0] * len(self.parent)
        for x in range(len(self.parent)):
            out[x] = ids.setdefault(self.find(x), len(ids))
        return out, len(ids)


def _strongly_connected_components(nodes: Sequence[int], successors: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """Tarjan's algorithm without recursion (regions can chain for thousands of levels).
    Only nodes reachable from `nodes` are visited; a node not listed in `successors` has none."""
    index_of: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components: list[list[int]] = []
    for root in nodes:
        if root in index_of:
            continue
        index_of[root] = low[root] = len(index_of)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[int, Iterator[int]]] = [(root, iter(successors.get(root, ())))]
        while work:
            node, pending = work[-1]
            descended = False
            for nxt in pending:
                if nxt not in index_of:
                    index_of[nxt] = low[nxt] = len(index_of)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(successors.get(nxt, ()))))
                    descended = True
                    break
                if nxt in on_stack and index_of[nxt] < low[node]:
                    low[node] = index_of[nxt]
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
            if low[node] == index_of[node]:
                component: list[int] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
