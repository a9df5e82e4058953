"""The REST API's JSON, made from the protobuf state the gRPC API serves (`JobDetails`,
`JobSummary`, `ClusterOverview`): Flink's REST shapes and key names where a Flink user's tooling
reads them, a few funke keys beside them. Pure functions: no I/O, time passed in.

Times are milliseconds since the epoch, -1 when unset (Flink's convention); states are Flink's
upper-case names."""

from __future__ import annotations

import json
from datetime import datetime
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from funke.v1 import job_pb2, jobgraph_pb2, jobmanager_pb2

TERMINAL = {"FINISHED", "FAILED", "CANCELED", "SUSPENDED"}
EXECUTION_STATES = ("CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING", "FINISHED", "CANCELING",
                    "CANCELED", "FAILED", "RECONCILING")
_SHIP_STRATEGY = {"HASH": "HASH", "FORWARD": "FORWARD", "REBALANCE": "REBALANCE", "BROADCAST": "BROADCAST",
                  "RESCALE": "RESCALE"}


def ms(ts: Timestamp) -> int:
    """A protobuf timestamp in epoch milliseconds; -1 if unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return -1
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def job_status(value: int) -> str:
    return job_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_") if value in job_pb2.JobStatus.values() else "UNKNOWN"


def execution_state(value: int) -> str:
    return (job_pb2.ExecutionState.Name(value).removeprefix("EXECUTION_STATE_")
            if value in job_pb2.ExecutionState.values() else "UNKNOWN")


def job_type(value: int) -> str:
    name = jobgraph_pb2.JobType.Name(value) if value in jobgraph_pb2.JobType.values() else "UNKNOWN"
    return name.removeprefix("JOB_TYPE_")


def _enum(enum: Any, value: int, prefix: str) -> str:
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        return "UNKNOWN"


def _duration(start: int, end: int, now: int) -> int:
    if start < 0:
        return -1
    return (end if end >= 0 else now) - start


def _task_counts(counts: Mapping[str, int], total: int | None = None) -> dict[str, int]:
    """Flink's `tasks` object: every state in lower case, plus the total."""
    out = {state.lower(): int(counts.get(state, 0)) for state in EXECUTION_STATES}
    out["total"] = total if total is not None else sum(counts.values())
    return out


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------


def overview(o: jobmanager_pb2.ClusterOverview, version: str) -> dict[str, Any]:
    by_state = dict(o.jobs_by_status)
    leader = None
    if o.HasField("leader") and o.leader.high_availability:
        leader = {"high-availability": o.leader.high_availability, "epoch": o.leader.epoch,
                  "address": o.leader.address, "job-manager": o.leader.job_manager, "since": ms(o.leader.since)}
    return {
        "taskmanagers": len(o.task_managers),
        "slots-total": o.slots_total,
        "slots-available": o.slots_free,
        "jobs-running": sum(n for s, n in by_state.items() if s not in TERMINAL),
        "jobs-finished": by_state.get("FINISHED", 0),
        "jobs-cancelled": by_state.get("CANCELED", 0),
        "jobs-failed": by_state.get("FAILED", 0),
        "jobs-by-state": by_state,
        "flink-version": version,
        "flink-commit": "",
        "data-dir": o.data_dir,
        "leader": leader,
    }


def taskmanager(tm: jobmanager_pb2.TaskManagerInfo, now: int) -> dict[str, Any]:
    heartbeat = ms(tm.last_heartbeat)
    cores = tm.resources.get("cores", "")
    return {
        "id": tm.id,
        "path": tm.address,
        "dataPort": -1,
        "timeSinceLastHeartbeat": now - heartbeat if heartbeat >= 0 else -1,
        "slotsNumber": tm.slots_total,
        "freeSlots": tm.slots_free,
        "registered-at": ms(tm.registered_at),
        "hardware": {"cpuCores": int(cores) if cores.isdigit() else -1},
        "resources": dict(tm.resources),
        "slots": [{"index": s.index, "job-id": s.job_id or None} for s in tm.slots],
    }


def taskmanagers(o: jobmanager_pb2.ClusterOverview, now: int) -> dict[str, Any]:
    return {"taskmanagers": [taskmanager(tm, now) for tm in o.task_managers]}


# --------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------


def job_summary(s: job_pb2.JobSummary, now: int) -> dict[str, Any]:
    start, end = ms(s.created_at), ms(s.ended_at)
    return {
        "jid": s.job_id,
        "name": s.name,
        "state": job_status(s.status),
        "job-type": job_type(s.job_type),
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now),
        "last-modification": end if end >= 0 else now,
        "tasks": _task_counts(s.tasks_per_state, s.total_tasks),
    }


def jobs(summaries: Iterable[job_pb2.JobSummary]) -> dict[str, Any]:
    return {"jobs": [{"id": s.job_id, "status": job_status(s.status)} for s in summaries]}


def jobs_overview(summaries: Iterable[job_pb2.JobSummary], now: int) -> dict[str, Any]:
    return {"jobs": [job_summary(s, now) for s in summaries]}


def _timestamps(d: job_pb2.JobDetails) -> dict[str, int]:
    """When the job last entered each status (Flink's `timestamps`)."""
    out = {"CREATED": ms(d.created_at)}
    for t in d.status_history:
        out[job_status(t.to_status)] = ms(t.timestamp)
    return out


def _end(d: job_pb2.JobDetails) -> int:
    if job_status(d.status) not in TERMINAL or not d.status_history:
        return -1
    return ms(d.status_history[-1].timestamp)


def _executions(sub: job_pb2.Subtask) -> list[job_pb2.Execution]:
    return [*sub.prior_attempts, sub.current]


def _execution_times(e: job_pb2.Execution) -> tuple[int, int]:
    """(start, end) of an attempt: from its creation to its terminal state (-1: not yet)."""
    start = ms(e.created_at)
    state = execution_state(e.state)
    end = ms(e.history[-1].timestamp) if e.history and state in ("FINISHED", "CANCELED", "FAILED") else -1
    return start, end


def vertex_status(counts: Mapping[str, int], parallelism: int) -> str:
    """An ExecutionJobVertex's aggregate state, as Flink derives it from its subtasks'."""
    if counts.get("FAILED"):
        return "FAILED"
    if counts.get("CANCELING"):
        return "CANCELING"
    if counts.get("CANCELED"):
        return "CANCELED"
    if counts.get("RUNNING") or counts.get("INITIALIZING"):
        return "RUNNING"
    if counts.get("DEPLOYING"):
        return "DEPLOYING"
    if counts.get("SCHEDULED"):
        return "SCHEDULED"
    if counts.get("FINISHED", 0) == parallelism and parallelism > 0:
        return "FINISHED"
    if counts.get("FINISHED"):
        return "RUNNING"  # some finished, the rest not started yet (a batch job's later regions)
    return "CREATED"


def _counted(v: job_pb2.Vertex) -> list[job_pb2.TaskIo]:
    """What a vertex's subtasks' current attempts read and wrote, as their TaskManagers measured
    it: a batch task's once it FINISHED, a streaming task's batch by batch."""
    return [sub.current.io for sub in v.subtasks if execution_state(sub.current.state) in ("FINISHED", "RUNNING")]


def _vertex_io(v: job_pb2.Vertex) -> dict[str, int]:
    """What a vertex's subtasks read and wrote, summed over their current attempts: the records
    its chain's head received (a source: the records it read) and its tail emitted (a sink: the
    records it wrote), the bytes of the result partitions they read and wrote."""
    total: Counter[str] = Counter()
    for io in _counted(v):
        total.update({"read-records": io.records_in, "write-records": io.records_out,
                      "read-bytes": io.bytes_in, "write-bytes": io.bytes_out})
    return {key: total.get(key, 0) for key in ("read-records", "write-records", "read-bytes", "write-bytes")}


def _sum_measured(values: Iterable[int | None]) -> int | None:
    measured = [v for v in values if v is not None]
    return sum(measured) if measured else None


def _operator_counts(io: job_pb2.TaskIo, i: int) -> tuple[int | None, int | None]:
    if i >= len(io.operators):
        return None, None
    o = io.operators[i]
    return (o.records_in if o.HasField("records_in") else None, o.records_out if o.HasField("records_out") else None)


def operators(v: job_pb2.Vertex, ios: Sequence[job_pb2.TaskIo]) -> list[dict[str, Any]]:
    """Per operator of the vertex's chain, head first, its records in and out added up over `ios`
    (Flink's numRecordsIn and numRecordsOut of an operator; a source's records in are the records
    it read, a sink's records out the records it wrote); null: measured in none."""
    out = []
    for i, name in enumerate(v.operators):
        counts = [_operator_counts(io, i) for io in ios]
        out.append({"index": i, "name": name,
                    "metrics": {"read-records": _sum_measured(c[0] for c in counts),
                                "write-records": _sum_measured(c[1] for c in counts)}})
    return out


# Flink's task metrics of a subtask, by name, from its TaskIo.
_TASK_METRICS = {"numRecordsIn": "records_in", "numRecordsOut": "records_out", "numBytesIn": "bytes_in",
                 "numBytesOut": "bytes_out"}
# Flink's limit on an operator's name in its metric identifiers.
_OPERATOR_NAME_MAX = 80
MAX_METRICS_ASKED = 4096  # characters of ?get=


def metric_name(name: str) -> str:
    """An operator's name as Flink's metric query service puts it in an identifier: ' ', '.', ':'
    and ',' made '_', at most 80 characters ("Sink: Parquet" -> "Sink__Parquet")."""
    return "".join("_" if c in " .:," else c for c in name[:_OPERATOR_NAME_MAX])


def vertex_metrics(v: job_pb2.Vertex) -> dict[str, str]:
    """Flink's /jobs/:jid/vertices/:vid/metrics of a vertex, by identifier: per subtask
    ("<subtask>.<metric>") its task's records and bytes in and out, and per operator of its chain
    ("<subtask>.<operator>.<metric>") its records in and out where they were measured; values as
    Flink gives them, strings."""
    names, seen = [], set()
    for i, name in enumerate(v.operators):  # two operators of one name: the later ones get their index
        n = metric_name(name)
        names.append(n if n not in seen else f"{n}_{i}")
        seen.add(n)
    out: dict[str, str] = {}
    for sub in v.subtasks:
        if execution_state(sub.current.state) not in ("FINISHED", "RUNNING"):
            continue
        io, k = sub.current.io, sub.subtask_index
        for metric, field in _TASK_METRICS.items():
            out[f"{k}.{metric}"] = str(getattr(io, field))
        for i, name in enumerate(names):
            records_in, records_out = _operator_counts(io, i)
            for metric, value in (("numRecordsIn", records_in), ("numRecordsOut", records_out)):
                if value is not None:
                    out[f"{k}.{name}.{metric}"] = str(value)
    return out


def plan(d: job_pb2.JobDetails) -> dict[str, Any]:
    """Flink's job plan: one node per vertex, with its inputs (the upstream vertex, ship
    strategy, distribution pattern, exchange)."""
    producer = {ds.id: ds.producer_vertex_id for ds in d.data_sets}
    inputs: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(d.edges, key=lambda e: (e.consumer_vertex_id, e.input_index)):
        partitioner = _enum(jobgraph_pb2.Partitioner, e.partitioner, "PARTITIONER_")
        inputs.setdefault(e.consumer_vertex_id, []).append({
            "num": e.input_index,
            "id": producer.get(e.data_set_id, ""),
            "ship_strategy": _SHIP_STRATEGY.get(partitioner, partitioner),
            "distribution-pattern": _enum(jobgraph_pb2.DistributionPattern, e.distribution_pattern,
                                          "DISTRIBUTION_PATTERN_"),
            "exchange": _enum(jobgraph_pb2.ResultPartitionType, e.result_partition_type,
                              "RESULT_PARTITION_TYPE_").lower(),
            "keys": list(e.partition_keys),
        })
    return {"jid": d.job_id, "name": d.name, "type": job_type(d.job_type), "nodes": [
        {"id": v.id, "parallelism": v.parallelism, "operator": "", "operator_strategy": "", "description": v.name,
         "slot-sharing-group": v.slot_sharing_group, "inputs": inputs.get(v.id, []), "optimizer_properties": {}}
        for v in d.vertices]}


def job(d: job_pb2.JobDetails, now: int, stoppable: bool) -> dict[str, Any]:
    start, end = ms(d.created_at), _end(d)
    vertices = []
    status_counts: Counter[str] = Counter()
    for v in d.vertices:
        counts = dict(v.subtasks_per_state)
        status = vertex_status(counts, v.parallelism)
        status_counts[status] += 1
        starts = [ms(sub.current.created_at) for sub in v.subtasks if ms(sub.current.created_at) >= 0]
        ends = [_execution_times(sub.current)[1] for sub in v.subtasks]
        v_start = min(starts) if starts else -1
        v_end = max(ends) if ends and all(x >= 0 for x in ends) else -1
        vertices.append({
            "id": v.id, "name": v.name, "maxParallelism": -1, "parallelism": v.parallelism, "status": status,
            "start-time": v_start, "end-time": v_end, "duration": _duration(v_start, v_end, now),
            "tasks": {state: int(counts.get(state, 0)) for state in EXECUTION_STATES},
            "metrics": {**_vertex_io(v), "read-records-complete": status == "FINISHED",
                        "write-records-complete": status == "FINISHED"},
            "operators": operators(v, _counted(v)),
        })
    latest = None
    if d.latest_progress_json:
        try:
            latest = json.loads(d.latest_progress_json)
        except ValueError:
            latest = None
    return {
        "jid": d.job_id, "name": d.name, "isStoppable": stoppable, "state": job_status(d.status),
        "job-type": job_type(d.job_type), "start-time": start, "end-time": end,
        "duration": _duration(start, end, now), "maxParallelism": -1, "now": now,
        "timestamps": _timestamps(d), "vertices": vertices,
        "status-counts": {state: status_counts.get(state, 0) for state in EXECUTION_STATES},
        "plan": plan(d),
        "waiting-for-resources": d.waiting_for_resources,
        "restart-strategy": d.restart_strategy,
        "failover-strategy": d.failover_strategy,
        "failure": _failure(d.failure) if d.HasField("failure") else None,
        "latest-progress": latest,
        "rescales": [rescale(r) for r in d.rescales],
    }


def rescale(r: job_pb2.Rescale) -> dict[str, Any]:
    """A live rescale's story (funke's key): its state, what it changes, each state entered."""
    def name(value: int) -> str:
        return _enum(job_pb2.RescaleState, value, "RESCALE_STATE_")

    return {"state": name(r.state), "cause": r.cause, "requested-at": ms(r.requested_at),
            "parallelism": dict(r.parallelism), "last-batch-id": r.last_batch_id, "failure": r.failure or None,
            "history": [{"from": name(t.from_state), "to": name(t.to_state), "timestamp": ms(t.timestamp),
                         "cause": t.cause, "stimulus-id": t.stimulus_id} for t in r.history]}


def _failure(f: job_pb2.Failure) -> dict[str, str]:
    return {"exception": f.exception_type, "message": f.message, "traceback": f.traceback}


def exceptions(d: job_pb2.JobDetails, locations: Mapping[str, str]) -> dict[str, Any]:
    """The exception history, root cause first (the job's failure, then the newest task
    failures first, as Flink lists them)."""
    entries = [{
        "exceptionName": e.failure.exception_type,
        "stacktrace": e.failure.traceback or f"{e.failure.exception_type}: {e.failure.message}",
        "message": e.failure.message,
        "timestamp": ms(e.timestamp),
        "taskName": e.task_name,
        "location": locations.get(e.task_manager_id, ""),
        "taskManagerId": e.task_manager_id,
        "failureLabels": {},
        "concurrentExceptions": [],
    } for e in sorted(d.exceptions, key=lambda e: ms(e.timestamp), reverse=True)]
    root = d.failure if d.HasField("failure") else (d.exceptions[-1].failure if d.exceptions else None)
    root_time = _end(d) if d.HasField("failure") else (ms(d.exceptions[-1].timestamp) if d.exceptions else None)
    return {
        "root-exception": (root.traceback or f"{root.exception_type}: {root.message}") if root is not None else None,
        "timestamp": root_time,
        "all-exceptions": [],
        "truncated": False,
        "exceptionHistory": {"entries": entries, "truncated": False},
    }


def _state_durations(e: job_pb2.Execution, now: int) -> dict[str, int]:
    """Milliseconds the attempt spent in each state (the current one up to now)."""
    out: Counter[str] = Counter()
    for state, start, end in _segments(e):
        out[state] += (end if end is not None else now) - start
    return dict(out)


def _segments(e: job_pb2.Execution) -> list[tuple[str, int, int | None]]:
    """(state, entered, left or None) for each state the attempt was in."""
    segments: list[tuple[str, int, int | None]] = []
    state, since = "CREATED", ms(e.created_at)
    for t in e.history:
        at = ms(t.timestamp)
        segments.append((state, since, at))
        state, since = execution_state(t.to_state), at
    segments.append((state, since, None if state not in ("FINISHED", "CANCELED", "FAILED") else since))
    return segments


def attempt(v: job_pb2.Vertex, sub: job_pb2.Subtask, e: job_pb2.Execution, locations: Mapping[str, str],
            now: int) -> dict[str, Any]:
    start, end = _execution_times(e)
    return {
        "subtask": sub.subtask_index,
        "status": execution_state(e.state),
        "attempt": e.id.attempt_number,
        "id": f"{v.id}/{sub.subtask_index}/{e.id.attempt_number}",
        "name": sub.name,
        "taskmanager-id": e.task_manager_id,
        "host": locations.get(e.task_manager_id, ""),
        "slot": e.slot_index if e.HasField("slot_index") else None,
        "start-time": start,
        "end-time": end,
        "duration": _duration(start, end, now),
        "status-duration": _state_durations(e, now),
        "metrics": {"read-records": e.io.records_in, "write-records": e.io.records_out,
                    "read-bytes": e.io.bytes_in, "write-bytes": e.io.bytes_out, "seconds": e.io.seconds},
        "operators": operators(v, [e.io]),
        "history": [{"from": execution_state(t.from_state), "to": execution_state(t.to_state),
                     "timestamp": ms(t.timestamp), "cause": t.cause} for t in e.history],
        "failure": _failure(e.failure) if e.HasField("failure") else None,
    }


def vertex(d: job_pb2.JobDetails, v: job_pb2.Vertex, locations: Mapping[str, str], now: int) -> dict[str, Any]:
    return {"id": v.id, "name": v.name, "parallelism": v.parallelism, "maxParallelism": -1, "now": now,
            "subtasks": [attempt(v, sub, sub.current, locations, now) for sub in v.subtasks]}


def find_attempt(v: job_pb2.Vertex, subtask: int, number: int) -> tuple[job_pb2.Subtask, job_pb2.Execution] | None:
    for sub in v.subtasks:
        if sub.subtask_index == subtask:
            for e in _executions(sub):
                if e.id.attempt_number == number:
                    return sub, e
    return None


def vertex_subtask_times(v: job_pb2.Vertex, locations: Mapping[str, str], now: int) -> dict[str, Any]:
    """Flink's subtasktimes: when each subtask's current attempt entered each state."""
    subtasks = []
    for sub in v.subtasks:
        e = sub.current
        stamps = {"CREATED": ms(e.created_at)}
        for t in e.history:
            stamps[execution_state(t.to_state)] = ms(t.timestamp)
        start, end = _execution_times(e)
        subtasks.append({"subtask": sub.subtask_index, "host": locations.get(e.task_manager_id, ""),
                         "duration": _duration(start, end, now), "timestamps": stamps})
    return {"id": v.id, "name": v.name, "now": now, "subtasks": subtasks}


def job_subtask_times(d: job_pb2.JobDetails, now: int) -> dict[str, Any]:
    """Every attempt of every subtask with its states as time segments (the dashboard's
    timeline); `end` null: the attempt is in that state now."""
    attempts = []
    for v in d.vertices:
        for sub in v.subtasks:
            for e in _executions(sub):
                attempts.append({
                    "vertex": v.id, "vertex-name": v.name, "subtask": sub.subtask_index,
                    "attempt": e.id.attempt_number, "taskmanager-id": e.task_manager_id,
                    "slot": e.slot_index if e.HasField("slot_index") else None,
                    "states": [{"state": s, "start": a, "end": b} for s, a, b in _segments(e)],
                })
    return {"jid": d.job_id, "now": now, "attempts": attempts}


def _epoch_ms(value: Any) -> int:
    """Spark's progress timestamp (ISO 8601, "2026-11-26T06:00:00.000Z") in epoch ms; -1 if
    it is not one."""
    if isinstance(value, (int, float)):
        return int(value)
    try:
        return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return -1


def batches(progress_json: Sequence[str]) -> dict[str, Any]:
    """A streaming query's recent batches from its progress records (Spark's
    StreamingQueryProgress keys)."""
    out = []
    for text in progress_json:
        try:
            p = json.loads(text)
        except ValueError:
            continue
        durations = p.get("durationMs") or {}
        out.append({
            "batchId": p.get("batchId"),
            "timestamp": _epoch_ms(p.get("timestamp")),
            "numInputRows": p.get("numInputRows", 0),
            "inputRowsPerSecond": p.get("inputRowsPerSecond", 0.0),
            "processedRowsPerSecond": p.get("processedRowsPerSecond", 0.0),
            "durationMs": durations.get("triggerExecution", sum(v for v in durations.values()
                                                                if isinstance(v, (int, float)))),
            # per keyed operator: keys held, and the state's bytes on disk
            "state": [{"operator": o.get("operatorName"), "keys": o.get("numRowsTotal", 0),
                       "bytesOnDisk": o.get("stateOnDiskBytes", 0)}
                      for o in p.get("stateOperators") or () if isinstance(o, dict)],
        })
        times = p.get("eventTime")
        if isinstance(times, dict):  # event time: the watermark the batch ran with, its late rows
            watermark = _epoch_ms(times.get("watermark")) if times.get("watermark") else -1
            out[-1]["watermark"] = watermark if watermark >= 0 else None
            out[-1]["lateRows"] = p.get("numLateRows", 0)
    return {"batches": out}
