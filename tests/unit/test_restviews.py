"""The REST API's JSON from the protobuf state (funke.jobmanager.restviews): Flink's keys and
conventions (epoch ms, -1 unset), the plan from the job graph's edges, attempts as time
segments, a vertex's aggregate state, the exception history root cause first."""

from __future__ import annotations

import json

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from funke.jobmanager import restviews
from funke.v1 import job_pb2, jobgraph_pb2, jobmanager_pb2

E = job_pb2.ExecutionState


def ts(seconds: float) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


def execution(vertex: str, subtask: int, attempt: int, states: list[tuple[int, float]], created: float,
              tm: str = "tm-1") -> job_pb2.Execution:
    e = job_pb2.Execution(id=job_pb2.ExecutionAttemptId(vertex_id=vertex, subtask_index=subtask, attempt_number=attempt),
                          state=states[-1][0] if states else E.EXECUTION_STATE_CREATED, created_at=ts(created),
                          task_manager_id=tm, slot_index=subtask)
    previous = E.EXECUTION_STATE_CREATED
    for state, at in states:
        e.history.add(from_state=previous, to_state=state, timestamp=ts(at))
        previous = state
    return e


def details() -> job_pb2.JobDetails:
    d = job_pb2.JobDetails(job_id="j1", name="two stages", job_type=jobgraph_pb2.JOB_TYPE_BATCH,
                           status=job_pb2.JOB_STATUS_FAILED, created_at=ts(100.0))
    d.status_history.add(from_status=job_pb2.JOB_STATUS_CREATED, to_status=job_pb2.JOB_STATUS_RUNNING, timestamp=ts(101.0))
    d.status_history.add(from_status=job_pb2.JOB_STATUS_RUNNING, to_status=job_pb2.JOB_STATUS_FAILING, timestamp=ts(104.0))
    d.status_history.add(from_status=job_pb2.JOB_STATUS_FAILING, to_status=job_pb2.JOB_STATUS_FAILED, timestamp=ts(105.0))
    done = [(E.EXECUTION_STATE_SCHEDULED, 101.0), (E.EXECUTION_STATE_DEPLOYING, 101.0),
            (E.EXECUTION_STATE_INITIALIZING, 101.5), (E.EXECUTION_STATE_RUNNING, 101.5), (E.EXECUTION_STATE_FINISHED, 102.0)]
    src = d.vertices.add(id="src", name="Source", parallelism=2)
    src.subtasks_per_state.update({"FINISHED": 2})
    for i in range(2):
        sub = src.subtasks.add(subtask_index=i, name=f"Source ({i + 1}/2)")
        sub.current.CopyFrom(execution("src", i, 0, done, 100.0))
        sub.current.io.CopyFrom(job_pb2.TaskIo(records_out=10 + i, bytes_out=100, seconds=0.5))
    sink = d.vertices.add(id="sink", name="Sink", parallelism=1)
    sink.subtasks_per_state.update({"FAILED": 1})
    sub = sink.subtasks.add(subtask_index=0, name="Sink (1/1)")
    sub.prior_attempts.add().CopyFrom(execution("sink", 0, 0, [(E.EXECUTION_STATE_FAILED, 103.0)], 100.0))
    sub.current.CopyFrom(execution("sink", 0, 1, [(E.EXECUTION_STATE_RUNNING, 103.5), (E.EXECUTION_STATE_FAILED, 104.0)],
                                   103.2, tm="tm-2"))
    sub.current.failure.CopyFrom(job_pb2.Failure(exception_type="ValueError", message="bad", traceback="Traceback...\nValueError: bad"))
    d.data_sets.add(id="src.out0", producer_vertex_id="src")
    d.edges.add(id="e", data_set_id="src.out0", consumer_vertex_id="sink",
                distribution_pattern=jobgraph_pb2.DISTRIBUTION_PATTERN_ALL_TO_ALL,
                partitioner=jobgraph_pb2.PARTITIONER_HASH, partition_keys=["k"],
                result_partition_type=jobgraph_pb2.RESULT_PARTITION_TYPE_BLOCKING)
    d.exceptions.add(timestamp=ts(103.0), task_name="Sink (1/1)", task_manager_id="tm-1",
                     failure=job_pb2.Failure(exception_type="OSError", message="first"))
    d.exceptions.add(timestamp=ts(104.0), task_name="Sink (1/1)", task_manager_id="tm-2",
                     failure=job_pb2.Failure(exception_type="ValueError", message="bad", traceback="Traceback...\nValueError: bad"))
    d.failure.CopyFrom(job_pb2.Failure(exception_type="ValueError", message="bad", traceback="Traceback...\nValueError: bad"))
    return d


def test_a_job_in_flinks_shape():
    job = restviews.job(details(), now=200_000, stoppable=False)
    assert job["state"] == "FAILED" and job["start-time"] == 100_000 and job["end-time"] == 105_000
    assert job["duration"] == 5_000 and job["timestamps"] == {"CREATED": 100_000, "RUNNING": 101_000,
                                                              "FAILING": 104_000, "FAILED": 105_000}
    src, sink = job["vertices"]
    assert src["status"] == "FINISHED" and sink["status"] == "FAILED"
    assert src["metrics"]["write-records"] == 21 and src["metrics"]["write-bytes"] == 200
    assert sink["metrics"]["read-records"] == 0  # its attempt did not finish: nothing reported
    assert job["status-counts"]["FINISHED"] == 1 and job["status-counts"]["FAILED"] == 1
    assert job["failure"] == {"exception": "ValueError", "message": "bad", "traceback": "Traceback...\nValueError: bad"}


def test_the_plan_names_each_input_with_its_strategy():
    nodes = restviews.plan(details())["nodes"]
    assert [n["id"] for n in nodes] == ["src", "sink"] and nodes[0]["inputs"] == []
    assert nodes[1]["inputs"] == [{"num": 0, "id": "src", "ship_strategy": "HASH", "distribution-pattern": "ALL_TO_ALL",
                                   "exchange": "blocking", "keys": ["k"]}]


def test_attempts_as_time_segments_prior_ones_included():
    times = restviews.job_subtask_times(details(), now=200_000)
    attempts = {(a["vertex"], a["subtask"], a["attempt"]): a for a in times["attempts"]}
    assert set(attempts) == {("src", 0, 0), ("src", 1, 0), ("sink", 0, 0), ("sink", 0, 1)}
    segments = attempts[("sink", 0, 1)]["states"]
    assert segments == [{"state": "CREATED", "start": 103_200, "end": 103_500},
                        {"state": "RUNNING", "start": 103_500, "end": 104_000},
                        {"state": "FAILED", "start": 104_000, "end": 104_000}]
    assert attempts[("sink", 0, 1)]["taskmanager-id"] == "tm-2"


def test_an_attempt_in_detail_and_a_vertex():
    d = details()
    sink = d.vertices[1]
    sub, e = restviews.find_attempt(sink, 0, 0)
    assert e.id.attempt_number == 0 and restviews.find_attempt(sink, 0, 7) is None
    one = restviews.attempt(sink, sub, sub.current, {"tm-2": "10.0.0.2:4000"}, now=200_000)
    assert one["status"] == "FAILED" and one["host"] == "10.0.0.2:4000" and one["duration"] == 800
    assert one["status-duration"] == {"CREATED": 300, "RUNNING": 500, "FAILED": 0}
    vertex = restviews.vertex(d, d.vertices[0], {}, now=200_000)
    assert [s["subtask"] for s in vertex["subtasks"]] == [0, 1] and vertex["subtasks"][1]["metrics"]["write-records"] == 11


def test_exceptions_root_cause_first():
    out = restviews.exceptions(details(), {"tm-1": "a:1", "tm-2": "b:2"})
    assert out["root-exception"] == "Traceback...\nValueError: bad" and out["timestamp"] == 105_000
    entries = out["exceptionHistory"]["entries"]
    assert [e["exceptionName"] for e in entries] == ["ValueError", "OSError"]  # newest first
    assert entries[1]["stacktrace"] == "OSError: first" and entries[0]["location"] == "b:2"


@pytest.mark.parametrize("counts, parallelism, state", [
    ({"FINISHED": 2}, 2, "FINISHED"), ({"FINISHED": 1, "CREATED": 1}, 2, "RUNNING"), ({"CREATED": 2}, 2, "CREATED"),
    ({"RUNNING": 1, "FAILED": 1}, 2, "FAILED"), ({"CANCELING": 1, "RUNNING": 1}, 2, "CANCELING"),
    ({"DEPLOYING": 1, "CREATED": 1}, 2, "DEPLOYING"), ({"INITIALIZING": 2}, 2, "RUNNING"),
])
def test_a_vertexs_aggregate_state(counts, parallelism, state):
    assert restviews.vertex_status(counts, parallelism) == state


def test_the_cluster_and_batches():
    o = jobmanager_pb2.ClusterOverview(slots_total=4, slots_free=1, data_dir="/d")
    o.jobs_by_status.update({"RUNNING": 2, "FINISHED": 3, "CANCELED": 1})
    tm = o.task_managers.add(id="tm-1", address="h:1", slots_total=4, slots_free=1, last_heartbeat=ts(99.5))
    tm.resources["cores"] = "8"
    overview = restviews.overview(o, "funke 1")
    assert (overview["jobs-running"], overview["jobs-finished"], overview["jobs-cancelled"]) == (2, 3, 1)
    assert overview["leader"] is None and overview["slots-available"] == 1
    [one] = restviews.taskmanagers(o, now=100_000)["taskmanagers"]
    assert one["timeSinceLastHeartbeat"] == 500 and one["hardware"]["cpuCores"] == 8
    records = [json.dumps({"batchId": 1, "timestamp": "2026-11-26T06:00:00.000Z", "numInputRows": 5,
                           "inputRowsPerSecond": 2.5, "processedRowsPerSecond": 10.0,
                           "durationMs": {"triggerExecution": 500},
                           "stateOperators": [{"operatorName": "count", "numRowsTotal": 7, "stateOnDiskBytes": 900}]}),
               "not json"]
    assert restviews.batches(records)["batches"] == [{"batchId": 1, "timestamp": 1795672800000, "numInputRows": 5,
                                                      "inputRowsPerSecond": 2.5, "processedRowsPerSecond": 10.0,
                                                      "durationMs": 500,
                                                      "state": [{"operator": "count", "keys": 7, "bytesOnDisk": 900}]}]
    # a query with event time: the watermark the batch ran with (epoch ms), its late rows
    timed = json.dumps({"batchId": 2, "timestamp": "2026-11-26T06:00:01.000Z", "durationMs": {},
                        "eventTime": {"watermark": "2023-11-14T22:13:20.000Z"}, "numLateRows": 3})
    [batch] = restviews.batches([timed])["batches"]
    assert (batch["watermark"], batch["lateRows"]) == (1_700_000_000_000, 3)
    [first] = restviews.batches([json.dumps({"batchId": 0, "eventTime": {}, "numLateRows": 0})])["batches"]
    assert (first["watermark"], first["lateRows"]) == (None, 0)  # no watermark yet
    assert restviews.ms(Timestamp()) == -1
