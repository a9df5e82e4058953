"""Deployments and partition updates built from the ExecutionGraph (Flink's
TaskDeploymentDescriptorFactory).

Owns how the scheduler's decision "deploy this execution into this slot" becomes a deployment
(`graph/deployment.py`): what each input gate reads (its partition range and subpartition, and
per partition the producer attempt to read or to wait for) and what each result partition is
split into. What a job vertex's subtasks share is one `VertexDeployment`; a deployment adds the
attempt, the slot and what its inputs read now. It also owns which TaskManagers run deployed consumers of a
result, so that a partition that finishes after its consumers were deployed is announced once per
TaskManager, not once per consumer.

Everything is O(P) per job vertex: the gate of the P consumers of an ALL_TO_ALL result is built
once per change of that result (cached by the group's version) and shared.
"""

from __future__ import annotations

from funke.common.graph.deployment import (
    GateLayout,
    GateState,
    OutputLayout,
    PartitionUpdate,
    TaskDeployment,
    VertexDeployment,
    available,
    awaiting,
)
from funke.common.graph.jobgraph import DistributionPattern, PartitionerKind
from funke.common.graph.executiongraph import (
    ConsumedPartitionGroup,
    Execution,
    ExecutionGraph,
    ExecutionJobVertex,
    ExecutionVertex,
    IntermediateResultPartition,
    PartitionLocation,
    SlotId,
    subpartition_count,
)


class TaskDeploymentFactory:
    def __init__(self, graph: ExecutionGraph, *, streaming: bool = False):
        self.graph = graph
        self.streaming = streaming  # a streaming query's tasks: long-lived, given micro-batches
        # id(ConsumedPartitionGroup) -> (its version, (uniform, per-partition attempts, schema))
        self._gate_cache: dict[int, tuple[int, tuple]] = {}
        # id(ConsumerVertexGroup) -> TaskManager -> how many of its consumers are deployed there
        # (only TaskManagers with some, only groups with some anywhere)
        self._deployed_on: dict[int, dict[str, int]] = {}
        # job vertex id -> what its subtasks' deployments share
        self._vertices: dict[str, VertexDeployment] = {}

    def vertex_deployment(self, ejv: ExecutionJobVertex) -> VertexDeployment:
        """What every deployment of `ejv`'s subtasks shares, made on first use."""
        made = self._vertices.get(ejv.id)
        if made is not None:
            return made
        inputs = []
        for index, result in enumerate(ejv.inputs):
            edge = result.edge
            upstream = result.producer.parallelism
            all_to_all = edge.distribution_pattern is DistributionPattern.ALL_TO_ALL
            inputs.append(GateLayout(index, result.id, edge, upstream, range(upstream) if all_to_all else None,
                                     edge.partitioner is not PartitionerKind.BROADCAST))
        outputs = []
        for result in ejv.produced:
            edge = result.edge
            downstream = result.consumer.parallelism
            count = (subpartition_count(edge, 0, ejv.parallelism, downstream)
                     if edge.distribution_pattern is DistributionPattern.ALL_TO_ALL else None)
            key_groups = (result.consumer.job_vertex.effective_max_parallelism
                          if self.streaming and edge.partitioner is PartitionerKind.HASH else 0)
            outputs.append(OutputLayout(result.id, edge, downstream, count, key_groups))
        made = self._vertices[ejv.id] = VertexDeployment(
            self.graph.job_id, self.graph.job_graph.name, ejv.job_vertex, ejv.parallelism, self.streaming,
            tuple(inputs), tuple(outputs))
        return made

    def gates(self, ev: ExecutionVertex) -> tuple[GateState, ...]:
        """What each input of `ev` reads if it is deployed now."""
        groups = ev.consumed_partition_groups
        if not groups:
            return ()
        gate_state = self._gate_state
        return tuple([gate_state(group) for group in groups])

    def deployment(self, ev: ExecutionVertex, slot: SlotId, stimulus_id: str = "") -> TaskDeployment:
        """The deployment of `ev`'s current attempt into `slot`, whole."""
        return self.vertex_deployment(ev.job_vertex).task(ev.current_execution.attempt_id, ev.name, slot,
                                                          self.gates(ev), stimulus_id)

    def _gate_state(self, group: ConsumedPartitionGroup) -> GateState:
        """(the producer attempt if all partitions have the same, the attempt per partition,
        schema) of a consumed group. Cached per group version: the P consumers of an ALL_TO_ALL
        result share one group, and building its P attempts for each of them would make
        deployment O(P²)."""
        cached = self._gate_cache.get(id(group))
        if cached is not None and cached[0] == group.version:
            return cached[1]
        # A partition not finished yet is awaited from its producer's current attempt: a consumer
        # TaskManager may still remember an older attempt of it, which must not count.
        producers = tuple(available(p.location.producer_attempt) if p.location
                          else awaiting(p.producer.current_execution.attempt_number) for p in group.partitions)
        uniform = producers[0] if producers and producers.count(producers[0]) == len(producers) else None
        schema = next((p.location.schema for p in group.partitions if p.location), "")
        state = (uniform, producers, schema)
        self._gate_cache[id(group)] = (group.version, state)
        return state

    # -- where deployed consumers run --

    def consumer_moved(self, execution: Execution, task_manager_id: str, step: int) -> None:
        """`execution` started (+1) or stopped (-1) running on `task_manager_id`."""
        deployed_on = self._deployed_on
        for consumed in execution.vertex.consumed_partition_groups:
            key = id(consumed.consumer_vertex_group)
            on = deployed_on.get(key)
            if on is None:
                on = deployed_on[key] = {}
            n = on.get(task_manager_id, 0) + step
            if n:
                on[task_manager_id] = n
            else:  # none there any more: a producer finishing later looks at no TaskManager at all
                del on[task_manager_id]
                if not on:
                    del deployed_on[key]

    def partition_updates(self, partition: IntermediateResultPartition,
                          location: PartitionLocation) -> list[tuple[str, PartitionUpdate]]:
        """A partition finished: (TaskManager, update) for every TaskManager running consumers
        deployed before it existed (pipelined inputs, eager scheduling)."""
        task_managers: set[str] = set()
        for group in partition.consumer_vertex_groups:
            on = self._deployed_on.get(id(group))
            if on:
                task_managers.update(on)
        if not task_managers:
            return []  # no consumer deployed yet (blocking inputs): they will be told at deployment
        update = PartitionUpdate(partition.result.id, partition.partition_index, location.producer_attempt,
                                 location.schema)
        return [(tm, update) for tm in sorted(task_managers)]
