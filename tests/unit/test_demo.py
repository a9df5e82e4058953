"""The demo's account of where its wall time went, from the cluster's and the job's own records."""

from __future__ import annotations

from examples.demo import timing_lines
from funke.v1 import job_pb2, jobmanager_pb2

T0 = 1_800_000_000.0


def _at(seconds: float):
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    ts.FromNanoseconds(int((T0 + seconds) * 1e9))
    return ts


def test_each_taskmanagers_start_and_each_job_status_are_timed_from_the_demos_start() -> None:
    overview = jobmanager_pb2.ClusterOverview(task_managers=[
        jobmanager_pb2.TaskManagerInfo(id="tm-2", registered_at=_at(4.5),
                                       resources={"started_at": f"{T0 + 1.25:.3f}", "spark_ready_at": f"{T0 + 4.25:.3f}"}),
        jobmanager_pb2.TaskManagerInfo(id="tm-1", registered_at=_at(3.5),
                                       resources={"started_at": f"{T0 + 1.0:.3f}", "spark_ready_at": f"{T0 + 3.0:.3f}"}),
    ])
    details = job_pb2.JobDetails(status_history=[
        job_pb2.JobStatusTransition(from_status=job_pb2.JOB_STATUS_CREATED, to_status=job_pb2.JOB_STATUS_RUNNING,
                                    timestamp=_at(5.01)),
        job_pb2.JobStatusTransition(from_status=job_pb2.JOB_STATUS_RUNNING, to_status=job_pb2.JOB_STATUS_FINISHED,
                                    timestamp=_at(8.5)),
    ])
    lines = timing_lines(T0, T0 + 4.75, overview, T0 + 5.0, details, T0 + 8.75)
    assert lines == [
        "where the time went (seconds since the demo started):",
        "  cluster start: 4.75 s (the JobManager serving, every TaskManager registered)",
        "  tm-1: process started 1.00 s, Spark session ready 3.00 s, registered 3.50 s",
        "  tm-2: process started 1.25 s, Spark session ready 4.25 s, registered 4.50 s",
        "  job: submitted 5.00 s, RUNNING 5.01 s, FINISHED 8.50 s, result checked 8.75 s (3.75 s from submission to result)",
    ]


def test_what_a_taskmanager_did_not_say_is_shown_as_unknown() -> None:
    # a TaskManager without Spark (or from before these resources) says nothing of its start
    overview = jobmanager_pb2.ClusterOverview(task_managers=[
        jobmanager_pb2.TaskManagerInfo(id="tm-1", registered_at=_at(2.0), resources={"spark_ready_at": ""})])
    lines = timing_lines(T0, T0 + 2.5, overview, None, None, T0 + 3.0)
    assert lines[2] == "  tm-1: process started -, Spark session ready -, registered 2.00 s"
    assert lines[3] == "  job: result checked 3.00 s"


def test_the_cold_start_benchmark_reads_the_demos_account() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_coldstart

    overview = jobmanager_pb2.ClusterOverview(task_managers=[
        jobmanager_pb2.TaskManagerInfo(id=f"tm-{i}", registered_at=_at(3.5 + i),
                                       resources={"started_at": f"{T0 + 1:.3f}", "spark_ready_at": f"{T0 + 3 + i:.3f}"})
        for i in (1, 2)])
    details = job_pb2.JobDetails(status_history=[job_pb2.JobStatusTransition(
        to_status=job_pb2.JOB_STATUS_FINISHED, timestamp=_at(8.5))])
    output = "\n".join(["top 15 ...", *timing_lines(T0, T0 + 5.75, overview, T0 + 6.0, details, T0 + 9.25),
                        "wall time: 9.25 s in all (cluster start 5.75 s, job 3.50 s)"])
    assert bench_coldstart.parse(output) == {"cluster_start_s": 5.75, "spark_ready_s": 5.0, "job_s": 3.25,
                                             "demo_s": 9.25}


def test_each_subtask_says_where_it_ran_when_it_moved_and_how_long_it_worked() -> None:
    def move(to: int, at: float) -> job_pb2.ExecutionStateTransition:
        return job_pb2.ExecutionStateTransition(to_state=to, timestamp=_at(at))

    ex = job_pb2.Execution(task_manager_id="tm-2", io=job_pb2.TaskIo(seconds=2.345), history=[
        move(job_pb2.EXECUTION_STATE_SCHEDULED, 5.01), move(job_pb2.EXECUTION_STATE_DEPLOYING, 5.02),
        move(job_pb2.EXECUTION_STATE_INITIALIZING, 5.1), move(job_pb2.EXECUTION_STATE_RUNNING, 5.2),
        move(job_pb2.EXECUTION_STATE_FINISHED, 7.5)])
    waiting = job_pb2.Execution(history=[move(job_pb2.EXECUTION_STATE_SCHEDULED, 5.01)])
    details = job_pb2.JobDetails(vertices=[job_pb2.Vertex(subtasks=[
        job_pb2.Subtask(name="Source: words (1/2)", current=ex), job_pb2.Subtask(name="Source: words (2/2)", current=waiting)])])
    lines = timing_lines(T0, T0 + 4.75, None, T0 + 5.0, details, T0 + 8.75)
    assert lines[-2:] == [
        "    Source: words (1/2) on tm-2: DEPLOYING 5.02 s, RUNNING 5.20 s, FINISHED 7.50 s (its work 2.35 s)",
        "    Source: words (2/2) on -: not deployed",
    ]
