"""Small JobGraphs for tests: builders for sources, operators, sinks and the edges between them,
and the graphs several suites share (Flink's seed example, source→sink ALL_TO_ALL at any P).

Every graph built here is meant to pass `validation.validate`: sources head with `source.range`,
middle vertices are `union` (any number of inputs), sinks are `sink.discard` (one input). All three
run as tasks with a thread of their own on a TaskManager (none is a no-op chain, which the
TaskManager's core would run by itself), so the simulator can script what each does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from funke.common.graph.executiongraph import ExecutionGraph
from funke.common.graph.jobgraph import (
    DEFAULT_SLOT_SHARING_GROUP,
    DistributionPattern,
    IntermediateDataSet,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    OperatorSpec,
    PartitionerKind,
    ResultPartitionType,
)

ALL_TO_ALL = DistributionPattern.ALL_TO_ALL
POINTWISE = DistributionPattern.POINTWISE
BLOCKING = ResultPartitionType.BLOCKING
PIPELINED = ResultPartitionType.PIPELINED


def source(vertex_id: str, parallelism: int, *, slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP,
           co_location_group: str | None = None) -> JobVertex:
    return JobVertex(vertex_id, vertex_id, parallelism, (OperatorSpec("source.range", config={"end": 10}),),
                     slot_sharing_group=slot_sharing_group, co_location_group=co_location_group)


def operator(vertex_id: str, parallelism: int, *, slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP,
             co_location_group: str | None = None) -> JobVertex:
    return JobVertex(vertex_id, vertex_id, parallelism, (OperatorSpec("union"),),
                     slot_sharing_group=slot_sharing_group, co_location_group=co_location_group)


def sink(vertex_id: str, parallelism: int, *, slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP,
         co_location_group: str | None = None) -> JobVertex:
    return JobVertex(vertex_id, vertex_id, parallelism, (OperatorSpec("sink.discard"),),
                     slot_sharing_group=slot_sharing_group, co_location_group=co_location_group)


@dataclass(frozen=True, slots=True)
class Connection:
    """One producer→consumer edge; `job_graph` turns it into a data set and a JobEdge."""

    producer: str
    consumer: str
    pattern: DistributionPattern = ALL_TO_ALL
    result_type: ResultPartitionType = BLOCKING
    partitioner: PartitionerKind | None = None  # None: FORWARD for POINTWISE, REBALANCE otherwise
    keys: tuple[str, ...] = ()


def connect(producer: str, consumer: str, pattern: DistributionPattern = ALL_TO_ALL,
            result_type: ResultPartitionType = BLOCKING, *, partitioner: PartitionerKind | None = None,
            keys: Sequence[str] = ()) -> Connection:
    return Connection(producer, consumer, pattern, result_type, partitioner, tuple(keys))


def job_graph(name: str, vertices: Sequence[JobVertex], connections: Sequence[Connection],
              job_type: JobType = JobType.BATCH) -> JobGraph:
    """A JobGraph with one data set per connection; a consumer's inputs are numbered in the
    order its connections are listed."""
    by_id = {v.id: v for v in vertices}
    data_sets: list[IntermediateDataSet] = []
    edges: list[JobEdge] = []
    inputs: dict[str, int] = {}
    for c in connections:
        data_set = f"{c.producer}.to.{c.consumer}.{len(data_sets)}"
        partitioner = c.partitioner
        if partitioner is None:
            same = by_id[c.producer].parallelism == by_id[c.consumer].parallelism
            partitioner = (PartitionerKind.FORWARD if c.pattern is POINTWISE and same
                           else PartitionerKind.REBALANCE)
        index = inputs.get(c.consumer, 0)
        inputs[c.consumer] = index + 1
        data_sets.append(IntermediateDataSet(data_set, c.producer))
        edges.append(JobEdge(f"e{len(edges)}", data_set, c.consumer, c.pattern, partitioner, c.keys,
                             c.result_type, index))
    return JobGraph(name, tuple(vertices), tuple(data_sets), tuple(edges), job_type)


def execution_graph(job: JobGraph) -> ExecutionGraph:
    return ExecutionGraph(job, "job-1", now=0.0)


def seed_example_job(result_type: ResultPartitionType = PIPELINED) -> JobGraph:
    """Flink's "Jobs and Scheduling" example: source (p=4) → map (p=4) FORWARD,
    map → reduce (p=3) HASH, all in the default slot-sharing group."""
    return job_graph(
        "seed-example",
        [source("source", 4), operator("map", 4), sink("reduce", 3)],
        [
            connect("source", "map", POINTWISE, result_type, partitioner=PartitionerKind.FORWARD),
            connect("map", "reduce", ALL_TO_ALL, result_type, partitioner=PartitionerKind.HASH, keys=("key",)),
        ],
        JobType.STREAMING if result_type is PIPELINED else JobType.BATCH,
    )


def source_sink_all_to_all(p: int, result_partition_type: ResultPartitionType) -> JobGraph:
    """source (p) → sink (p) over one ALL_TO_ALL REBALANCE edge: the O(P) stress shape."""
    return job_graph(
        f"source-sink-all-to-all-{p}",
        [source("source", p), sink("sink", p)],
        [connect("source", "sink", ALL_TO_ALL, result_partition_type)],
        JobType.STREAMING if result_partition_type is PIPELINED else JobType.BATCH,
    )
