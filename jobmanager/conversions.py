"""Translation between the JobManager's model (ExecutionGraph, scheduler actions) and the wire
(funke.v1 messages). The only place the JobManager builds protobuf messages from its state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from google.protobuf.timestamp_pb2 import Timestamp

from funke.common.executiongraph import Execution, ExecutionAttemptId, ExecutionJobVertex, FailureInfo
from funke.common.jobgraph import JobType
from funke.common.scheduler import ExecutionStateChanged, JobStatusChanged, TaskDeployment
from funke.common.states import ExecutionState, JobStatus, Transition
from funke.common.wire import vertex_to_proto
from funke.v1 import cluster_pb2, jobgraph_pb2, job_pb2, jobmanager_pb2

if TYPE_CHECKING:
    from funke.jobmanager.jobmaster import JobMaster


def timestamp(t: float) -> Timestamp:
    seconds = int(t)
    return Timestamp(seconds=seconds, nanos=int((t - seconds) * 1e9))


def job_status_pb(s: JobStatus) -> int:
    return job_pb2.JobStatus.Value(f"JOB_STATUS_{s.value}")


def job_status_from_pb(v: int) -> JobStatus:
    return JobStatus(job_pb2.JobStatus.Name(v).removeprefix("JOB_STATUS_"))


def execution_state_pb(s: ExecutionState) -> int:
    return job_pb2.ExecutionState.Value(f"EXECUTION_STATE_{s.value}")


def execution_state_from_pb(v: int) -> ExecutionState:
    return ExecutionState(job_pb2.ExecutionState.Name(v).removeprefix("EXECUTION_STATE_"))


def job_type_pb(t: JobType) -> int:
    return jobgraph_pb2.JobType.Value(f"JOB_TYPE_{t.value}")


def attempt_pb(a: ExecutionAttemptId) -> job_pb2.ExecutionAttemptId:
    return job_pb2.ExecutionAttemptId(vertex_id=a.vertex_id, subtask_index=a.subtask_index, attempt_number=a.attempt_number)


def attempt_from_pb(a: job_pb2.ExecutionAttemptId) -> ExecutionAttemptId:
    return ExecutionAttemptId(a.vertex_id, a.subtask_index, a.attempt_number)


def failure_pb(f: FailureInfo) -> job_pb2.Failure:
    return job_pb2.Failure(exception_type=f.exception_type, message=f.message, traceback=f.traceback)


# A failure reported by a TaskManager is kept in the job's history and shown by `funke status`:
# bounded, keeping the start (what it is) and the end (the innermost frames) of what is longer.
MAX_FAILURE_TYPE = 200
MAX_FAILURE_MESSAGE = 16 * 1024
MAX_FAILURE_TRACEBACK = 64 * 1024


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half:,} characters left out) ...\n{text[-half:]}"


def failure_from_pb(f: job_pb2.Failure) -> FailureInfo:
    return FailureInfo(_bounded(f.exception_type, MAX_FAILURE_TYPE), _bounded(f.message, MAX_FAILURE_MESSAGE),
                       _bounded(f.traceback, MAX_FAILURE_TRACEBACK))


def job_transition_pb(t: Transition) -> job_pb2.JobStatusTransition:
    return job_pb2.JobStatusTransition(
        from_status=job_status_pb(t.from_state), to_status=job_status_pb(t.to_state),
        timestamp=timestamp(t.timestamp), cause=t.cause)


def execution_transition_pb(t: Transition) -> job_pb2.ExecutionStateTransition:
    return job_pb2.ExecutionStateTransition(
        from_state=execution_state_pb(t.from_state), to_state=execution_state_pb(t.to_state),
        timestamp=timestamp(t.timestamp), cause=t.cause)


def execution_pb(ex: Execution) -> job_pb2.Execution:
    msg = job_pb2.Execution(
        id=attempt_pb(ex.attempt_id),
        state=execution_state_pb(ex.state),
        created_at=timestamp(ex.machine.created_at),
        history=[execution_transition_pb(t) for t in ex.machine.history],
        task_manager_id=ex.task_manager_id or "",
    )
    if ex.slot is not None:
        msg.slot_index = ex.slot.slot_index
    if ex.failure is not None:
        msg.failure.CopyFrom(failure_pb(ex.failure))
    return msg


def states_per_vertex(ejv: ExecutionJobVertex) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ev in ejv.task_vertices:
        counts[ev.state.value] = counts.get(ev.state.value, 0) + 1
    return counts


def job_details(jm: "JobMaster") -> job_pb2.JobDetails:
    graph, scheduler = jm.graph, jm.scheduler
    msg = job_pb2.JobDetails(
        job_id=graph.job_id,
        name=graph.job_graph.name,
        job_type=job_type_pb(graph.job_graph.job_type),
        status=job_status_pb(graph.status),
        created_at=timestamp(graph.status_machine.created_at),
        status_history=[job_transition_pb(t) for t in graph.status_machine.history],
        waiting_for_resources=jm.waiting_for_resources,
        required_slots=scheduler.plan.required_slots(),
        restart_strategy=jm.restart_description,
        failover_strategy=scheduler.failover_strategy.value,
    )
    for ejv in graph.vertices.values():
        vertex = msg.vertices.add(
            id=ejv.id, name=ejv.name, parallelism=ejv.parallelism,
            slot_sharing_group=ejv.slot_sharing_group, co_location_group=ejv.co_location_group or "",
        )
        vertex.subtasks_per_state.update(states_per_vertex(ejv))
        for ev in ejv.task_vertices:
            sub = vertex.subtasks.add(subtask_index=ev.subtask_index, name=ev.name)
            sub.current.CopyFrom(execution_pb(ev.current_execution))
            sub.prior_attempts.extend(execution_pb(ex) for ex in ev.prior_executions)
    for entry in scheduler.exception_history:
        e = msg.exceptions.add(timestamp=timestamp(entry.timestamp), task_name=entry.task_name,
                               task_manager_id=entry.task_manager_id or "", failure=failure_pb(entry.failure))
        if entry.attempt is not None:
            e.attempt.CopyFrom(attempt_pb(entry.attempt))
    if scheduler.failure is not None:
        msg.failure.CopyFrom(failure_pb(scheduler.failure))
    return msg


def job_summary(jm: "JobMaster") -> job_pb2.JobSummary:
    graph = jm.graph
    created = graph.status_machine.created_at
    msg = job_pb2.JobSummary(
        job_id=graph.job_id, name=graph.job_graph.name, job_type=job_type_pb(graph.job_graph.job_type),
        status=job_status_pb(graph.status), created_at=timestamp(created),
        total_tasks=graph.number_of_vertices(),
    )
    msg.tasks_per_state.update({state.value: n for state, n in jm.scheduler.state_counts.items() if n})
    if graph.status.is_globally_terminal and graph.status_machine.history:
        ended = graph.status_machine.history[-1].timestamp
        msg.ended_at.CopyFrom(timestamp(ended))
        msg.duration_seconds = ended - created
    return msg


def event_pb(sequence: int, change: JobStatusChanged | ExecutionStateChanged) -> jobmanager_pb2.JobEvent:
    if isinstance(change, JobStatusChanged):
        return jobmanager_pb2.JobEvent(sequence=sequence, job_status=job_transition_pb(change.transition))
    state = jobmanager_pb2.ExecutionStateChange(
        attempt=attempt_pb(change.attempt), task_name=change.task_name,
        transition=execution_transition_pb(change.transition), task_manager_id=change.task_manager_id or "")
    if change.failure is not None:
        state.failure.CopyFrom(failure_pb(change.failure))
    return jobmanager_pb2.JobEvent(sequence=sequence, execution_state=state)


class DescriptorFactory:
    """Builds TaskDeploymentDescriptors; the JobVertex message of each vertex is built once."""

    def __init__(self, data_dir: str, options: dict[str, str], artifacts: Iterable[jobgraph_pb2.Artifact]):
        self.data_dir = data_dir
        self.options = dict(options)
        self.artifacts = list(artifacts)
        self._artifact_bytes = sum(a.ByteSize() for a in self.artifacts)
        self._vertices: dict[str, jobgraph_pb2.JobVertex] = {}
        self._sizes: dict[str, int] = {}

    def size_of(self, vertex_id: str) -> int:
        """About how many bytes a descriptor of this vertex has (after `build` made one)."""
        return self._sizes.get(vertex_id, 0)

    def build(self, d: TaskDeployment) -> cluster_pb2.TaskDeploymentDescriptor:
        vertex = self._vertices.get(d.vertex.id)
        if vertex is None:
            vertex = self._vertices[d.vertex.id] = vertex_to_proto(d.vertex)
            self._sizes[d.vertex.id] = vertex.ByteSize() + self._artifact_bytes + 1024
        msg = cluster_pb2.TaskDeploymentDescriptor(
            job_id=d.job_id, job_name=d.job_name, attempt=attempt_pb(d.attempt), task_name=d.task_name,
            parallelism=d.parallelism, slot_index=d.slot.slot_index, vertex=vertex, data_dir=self.data_dir,
            artifacts=self.artifacts,
        )
        msg.job_options.update(self.options)
        for gate in d.inputs:
            g = msg.inputs.add(
                input_index=gate.input_index, data_set_id=gate.data_set_id,
                partition_start=gate.partition_start, partition_end=gate.partition_end,
                uniform_attempt=gate.uniform_attempt, schema=gate.schema,
            )
            if gate.subpartition is not None:
                g.subpartition = gate.subpartition
            if gate.producer_attempts is not None:
                g.producer_attempts.extend(gate.producer_attempts)
        for out in d.outputs:
            msg.outputs.add(
                data_set_id=out.data_set_id, partition_index=out.partition_index,
                num_subpartitions=out.num_subpartitions,
                partitioner=jobgraph_pb2.Partitioner.Value(f"PARTITIONER_{out.partitioner.value}"),
                partition_keys=out.partition_keys,
                partition_type=jobgraph_pb2.ResultPartitionType.Value(f"RESULT_PARTITION_TYPE_{out.partition_type.value}"),
            )
        return msg
