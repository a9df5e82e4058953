"""A deployment the scheduler decides is one VertexDeployment per job vertex plus the subtask's
own part; the JobManager encodes it straight from those (`DeploymentEncoder.encode_task`), and it
must say exactly what the whole TaskDeployment says."""

from __future__ import annotations

import pytest

from funke.common.graph.deployment import ProducedPartition, TaskReport
from funke.common.graph.executiongraph import ExecutionGraph
from funke.common.graph.jobgraph import JobType, PartitionerKind
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy
from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.states import ExecutionState
from funke.common.wire.codec import DeploymentEncoder, deployment_from_proto
from funke.v1 import jobgraph_pb2 as pb
from tests.conformance.graphs import (
    ALL_TO_ALL,
    BLOCKING,
    PIPELINED,
    POINTWISE,
    connect,
    job_graph,
    operator,
    sink,
    source,
)

E = ExecutionState


def _shapes():
    """Every way a subtask's inputs and outputs are laid out: ALL_TO_ALL (rebalance, hash,
    broadcast), POINTWISE with fewer, as many and more consumers than producers, two inputs."""
    vertices = [source("a", 5), source("b", 2), operator("up", 2), operator("down", 5), operator("same", 5),
                operator("keyed", 3), sink("two-inputs", 4)]
    for result_type, job_type in ((BLOCKING, JobType.BATCH), (PIPELINED, JobType.STREAMING)):
        yield job_graph(f"shapes-{job_type.value}", vertices, [
            connect("a", "up", POINTWISE, result_type),  # 5 -> 2: ranges of whole partitions
            connect("b", "down", POINTWISE, result_type),  # 2 -> 5: subpartitions of one partition
            connect("a", "same", POINTWISE, result_type),  # FORWARD
            connect("same", "keyed", ALL_TO_ALL, result_type, partitioner=PartitionerKind.HASH, keys=("k",)),
            connect("up", "two-inputs", ALL_TO_ALL, result_type, partitioner=PartitionerKind.BROADCAST),
            connect("keyed", "two-inputs", ALL_TO_ALL, result_type),
            connect("down", "two-inputs", POINTWISE, result_type),  # 5 -> 4
        ], job_type)


def _deployments(job) -> list[s.DeployTask]:
    """Run the job's scheduler until every subtask was deployed (finishing each deployed task,
    so blocking consumers see their producers' partitions available)."""
    scheduler = s.Scheduler(ExecutionGraph(job, "job-1", 0.0), restart_strategy=FixedDelayRestartBackoffTimeStrategy(1, 0.0))
    slots = sm.SlotManager(heartbeat_timeout_s=1e9)
    slots.register("tm-1", "", 64, {}, 0.0)
    deployed: list[s.DeployTask] = []
    queue = list(scheduler.start(0.0))
    while queue:
        a = queue.pop(0)
        if isinstance(a, s.RequestSlots):
            for x in slots.request_slots("job-1", a.requests, a.timeout_s, 0.0):
                if isinstance(x, sm.SlotsAllocated):
                    queue += scheduler.on_slots_allocated(x.request_id, x.slots, 0.0)
        elif isinstance(a, s.DeployTask):
            deployed.append(a)
            if job.job_type is JobType.BATCH:
                produced = tuple(ProducedPartition(o.data_set_id, o.partition_index, f"schema-{o.data_set_id}")
                                 for o in a.deployment.outputs)
                queue += scheduler.on_task_states([TaskReport("job-1", a.attempt, E.FINISHED, produced=produced)], 0.0)
    assert len(deployed) == sum(v.parallelism for v in job.vertices)
    return deployed


@pytest.mark.parametrize("job", list(_shapes()), ids=lambda job: job.name)
def test_a_deployment_encoded_from_its_vertex_says_what_the_whole_deployment_says(job):
    artifacts = [pb.Artifact(name="lib.py", content=b"VALUE = 1\n")]
    encoder = DeploymentEncoder("/data", {"spark.sql.shuffle.partitions": "4"}, artifacts)
    tasks = _deployments(job)
    awaited = available = 0
    for a in tasks:
        whole = a.deployment
        assert whole.attempt == a.attempt and whole.slot == a.slot and whole.task_name == a.task_name
        direct = encoder.encode_task(a.vertex, a.attempt, a.task_name, a.slot, a.gates, a.stimulus_id)
        assert direct == encoder.encode(whole), a.task_name
        decoded = deployment_from_proto(direct, a.slot.task_manager_id, whole.vertex)
        assert (decoded.inputs, decoded.outputs, decoded.attempt, decoded.slot) == (
            whole.inputs, whole.outputs, whole.attempt, whole.slot)
        assert decoded.data_dir == "/data" and decoded.job_options == {"spark.sql.shuffle.partitions": "4"}
        assert len(decoded.artifacts) == 1
        for gate in whole.inputs:
            kinds = {type(p).__name__ for p in ([gate.uniform] if gate.uniform is not None else gate.producers)}
            awaited += "Awaiting" in kinds
            available += "Available" in kinds
    # the eager (streaming) job deploys consumers before their producers finish, the batch job after
    assert (awaited, available) == ((0, 27) if job.job_type is JobType.BATCH else (27, 0))  # 2 + 5 + 5 + 3 + 3 x 4 gates
    # what the subtasks of a vertex share is one object
    assert len({id(a.vertex) for a in tasks}) == len(job.vertices)
