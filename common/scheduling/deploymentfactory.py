"""Deployments and partition updates built from the ExecutionGraph (Flink's
TaskDeploymentDescriptorFactory).

Owns how the scheduler's decision "deploy this execution into this slot" becomes a
`TaskDeployment` (`graph/deployment.py`): what each input gate reads (its partition range and
subpartition, and per partition the producer attempt to read or to wait for) and what each
result partition is split into. It also owns which TaskManagers run deployed consumers of a
result, so that a partition that finishes after its consumers were deployed is announced once per
TaskManager, not once per consumer.

Everything is O(P) per job vertex: the gate of the P consumers of an ALL_TO_ALL result is built
once per change of that result (cached by the group's version) and shared.
"""

from __future__ import annotations

from funke.common.graph.deployment import (
    InputGateDeployment,
    PartitionUpdate,
    ProducerAttempt,
    ResultPartitionSpec,
    TaskDeployment,
    available,
    awaiting,
)
from funke.common.graph.jobgraph import PartitionerKind
from funke.common.graph.executiongraph import (
    ConsumedPartitionGroup,
    Execution,
    ExecutionGraph,
    ExecutionVertex,
    IntermediateResultPartition,
    PartitionLocation,
    SlotId,
    input_split,
    subpartition_count,
)


class TaskDeploymentFactory:
    def __init__(self, graph: ExecutionGraph, *, streaming: bool = False):
        self.graph = graph
        self.streaming = streaming  # a streaming query's tasks: long-lived, given micro-batches
        # id(ConsumedPartitionGroup) -> (its version, (uniform, per-partition attempts, schema))
        self._gate_cache: dict[int, tuple[int, tuple]] = {}
        # id(ConsumerVertexGroup) -> TaskManager -> how many of its consumers are deployed there
        self._deployed_on: dict[int, dict[str, int]] = {}

    def deployment(self, ev: ExecutionVertex, slot: SlotId, stimulus_id: str = "") -> TaskDeployment:
        ejv = ev.job_vertex
        inputs = []
        for index, (result, group) in enumerate(zip(ejv.inputs, ev.consumed_partition_groups)):
            split = input_split(result.edge, ev.subtask_index, result.producer.parallelism, ejv.parallelism)
            uniform, producers, schema = self._gate_state(group)
            inputs.append(InputGateDeployment(
                input_index=index,
                data_set_id=result.id,
                partitions=split.partitions,
                subpartition=split.subpartition,
                uniform=uniform,
                producers=producers if uniform is None else None,
                schema=schema,
            ))
        outputs = []
        for result, partition in zip(ejv.produced, ev.produced_partitions):
            edge = result.edge
            outputs.append(ResultPartitionSpec(
                data_set_id=result.id,
                partition_index=partition.partition_index,
                num_subpartitions=subpartition_count(edge, partition.partition_index, ejv.parallelism,
                                                     result.consumer.parallelism),
                partitioner=edge.partitioner,
                partition_keys=edge.partition_keys,
                partition_type=edge.result_partition_type,
                key_groups=(result.consumer.job_vertex.effective_max_parallelism
                            if self.streaming and edge.partitioner is PartitionerKind.HASH else 0),
            ))
        return TaskDeployment(
            job_id=self.graph.job_id,
            job_name=self.graph.job_graph.name,
            attempt=ev.current_execution.attempt_id,
            task_name=ev.name,
            parallelism=ejv.parallelism,
            slot=slot,
            vertex=ejv.job_vertex,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            stimulus_id=stimulus_id,
            streaming=self.streaming,
        )

    def _gate_state(self, group: ConsumedPartitionGroup) -> tuple[ProducerAttempt | None, tuple[ProducerAttempt, ...],
                                                                   str]:
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
        for consumed in execution.vertex.consumed_partition_groups:
            on = self._deployed_on.setdefault(id(consumed.consumer_vertex_group), {})
            on[task_manager_id] = on.get(task_manager_id, 0) + step

    def partition_updates(self, partition: IntermediateResultPartition,
                          location: PartitionLocation) -> list[tuple[str, PartitionUpdate]]:
        """A partition finished: (TaskManager, update) for every TaskManager running consumers
        deployed before it existed (pipelined inputs, eager scheduling)."""
        task_managers: set[str] = set()
        for group in partition.consumer_vertex_groups:
            on = self._deployed_on.get(id(group))
            if on:
                task_managers.update(tm for tm, n in on.items() if n)
        if not task_managers:
            return []  # no consumer deployed yet (blocking inputs): they will be told at deployment
        update = PartitionUpdate(partition.result.id, partition.partition_index, location.producer_attempt,
                                 location.schema)
        return [(tm, update) for tm in sorted(task_managers)]
