"""What the JobManager shows of a job, in its wire form: the details, the summary and the events
of one job, built from its ExecutionGraph and its scheduler.

Owns which of the scheduler's bookkeeping a client sees (`funke status`, `funke list`,
`funke watch`, the REST API and dashboard through them); how each value is put on the wire is
`codec.py`'s.
"""

from __future__ import annotations

from funke.common.wire import codec
from funke.common.graph.executiongraph import ExecutionGraph, ExecutionJobVertex
from funke.common.scheduling.scheduler import ExecutionStateChanged, JobStatusChanged, Scheduler
from funke.v1 import job_pb2 as job_pb
from funke.v1 import jobmanager_pb2 as jobmanager_pb


def _states_per_vertex(ejv: ExecutionJobVertex) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ev in ejv.task_vertices:
        counts[ev.state.value] = counts.get(ev.state.value, 0) + 1
    return counts


def job_details(graph: ExecutionGraph, scheduler: Scheduler, *, waiting_for_resources: str = "",
                restart_description: str = "") -> job_pb.JobDetails:
    msg = job_pb.JobDetails(
        job_id=graph.job_id,
        name=graph.job_graph.name,
        job_type=codec.job_type_to_proto(graph.job_graph.job_type),
        status=codec.job_status_to_proto(graph.status),
        created_at=codec.timestamp(graph.status_machine.created_at),
        status_history=[codec.job_transition_to_proto(h.transition, h.leader_epoch, h.job_manager)
                        for h in graph.status_history()],
        waiting_for_resources=waiting_for_resources,
        required_slots=scheduler.plan.required_slots(),
        restart_strategy=restart_description,
        failover_strategy=scheduler.failover_strategy.value,
        num_restarts=scheduler.num_restarts,
    )
    for ejv in graph.vertices.values():
        vertex = msg.vertices.add(
            id=ejv.id, name=ejv.name, parallelism=ejv.parallelism,
            slot_sharing_group=ejv.slot_sharing_group, co_location_group=ejv.co_location_group or "",
        )
        vertex.subtasks_per_state.update(_states_per_vertex(ejv))
        vertex.operators.extend(op.display_name for op in ejv.job_vertex.operators)
        for ev in ejv.task_vertices:
            sub = vertex.subtasks.add(subtask_index=ev.subtask_index, name=ev.name)
            sub.current.CopyFrom(codec.execution_to_proto(ev.current_execution))
            sub.prior_attempts.extend(codec.execution_to_proto(ex) for ex in ev.prior_executions)
    for entry in scheduler.exception_history:
        e = msg.exceptions.add(timestamp=codec.timestamp(entry.timestamp), task_name=entry.task_name,
                               task_manager_id=entry.task_manager_id or "", failure=codec.failure_to_proto(entry.failure))
        if entry.attempt is not None:
            e.attempt.CopyFrom(codec.attempt_to_proto(entry.attempt))
    if scheduler.failure is not None:
        msg.failure.CopyFrom(codec.failure_to_proto(scheduler.failure))
    msg.data_sets.extend(codec.data_set_to_proto(d) for d in graph.job_graph.data_sets)
    msg.edges.extend(codec.edge_to_proto(e) for e in graph.job_graph.edges)
    return msg


def job_summary(graph: ExecutionGraph, scheduler: Scheduler) -> job_pb.JobSummary:
    created = graph.status_machine.created_at
    msg = job_pb.JobSummary(
        job_id=graph.job_id, name=graph.job_graph.name, job_type=codec.job_type_to_proto(graph.job_graph.job_type),
        status=codec.job_status_to_proto(graph.status), created_at=codec.timestamp(created),
        total_tasks=graph.number_of_vertices(),
    )
    msg.tasks_per_state.update({state.value: n for state, n in scheduler.state_counts.items() if n})
    if graph.status.is_globally_terminal and graph.status_machine.history:
        ended = graph.status_machine.history[-1].timestamp
        msg.ended_at.CopyFrom(codec.timestamp(ended))
        msg.duration_seconds = ended - created
    return msg


def event_to_proto(sequence: int, change: JobStatusChanged | ExecutionStateChanged, leader_epoch: int = 0,
                   job_manager: str = "") -> jobmanager_pb.JobEvent:
    if isinstance(change, JobStatusChanged):
        return jobmanager_pb.JobEvent(sequence=sequence, job_status=codec.job_transition_to_proto(
            change.transition, leader_epoch, job_manager))
    state = jobmanager_pb.ExecutionStateChange(
        attempt=codec.attempt_to_proto(change.attempt), task_name=change.task_name,
        transition=codec.execution_transition_to_proto(change.transition), task_manager_id=change.task_manager_id or "")
    if change.failure is not None:
        state.failure.CopyFrom(codec.failure_to_proto(change.failure))
    return jobmanager_pb.JobEvent(sequence=sequence, execution_state=state)
