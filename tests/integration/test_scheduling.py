"""Placement, waiting for slots, and bad input, on a real cluster of no-op TaskManagers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

from funke.deploy.client import InvalidJobGraph, JobAlreadyExists, JobNotFound
from funke.common.graph.jobgraph import (
    DistributionPattern,
    IntermediateDataSet,
    JobConfiguration,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    OperatorSpec,
    PartitionerKind,
    ResultPartitionType,
)
from funke.v1 import job_pb2, jobmanager_pb2, jobmanager_pb2_grpc
from tests.integration.conftest import REPO, wait_for_end

pytestmark = pytest.mark.cluster

SOURCE = (OperatorSpec("source.noop"),)
SINK = (OperatorSpec("noop"), OperatorSpec("sink.noop"))


def status_name(details) -> str:
    return job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")


def two_vertices(p: int, *, co_location: str | None = None, job_type=JobType.STREAMING,
                 timeout_s: float | None = None, job_id: str = "", name: str = "noop") -> JobGraph:
    """source -> sink at parallelism p, over a REBALANCE edge (so no local-input preference)."""
    pipelined = job_type is JobType.STREAMING
    return JobGraph(
        name,
        (JobVertex("src", "Source", p, SOURCE, co_location_group=co_location),
         JobVertex("sink", "Sink", p, SINK, co_location_group=co_location)),
        (IntermediateDataSet("d", "src"),),
        (JobEdge("e", "d", "sink", DistributionPattern.ALL_TO_ALL, PartitionerKind.REBALANCE,
                 result_partition_type=ResultPartitionType.PIPELINED if pipelined else ResultPartitionType.BLOCKING),),
        job_type=job_type,
        configuration=JobConfiguration(slot_request_timeout_s=timeout_s),
        job_id=job_id,
    )


def test_co_located_subtasks_run_in_the_same_slot(noop_cluster):
    client = noop_cluster.client
    job_id = client.submit(two_vertices(4, co_location="pair"))
    _, details = wait_for_end(client, job_id)
    assert status_name(details) == "FINISHED"
    src, sink = details.vertices
    placements = set()
    for a, b in zip(src.subtasks, sink.subtasks):
        assert a.subtask_index == b.subtask_index
        slot_a = (a.current.task_manager_id, a.current.slot_index)
        assert slot_a == (b.current.task_manager_id, b.current.slot_index), f"subtask {a.subtask_index} split"
        placements.add(slot_a)
    assert len(placements) == 4  # four co-located pairs, four different slots of the 2 x 2 cluster
    assert {tm for tm, _ in placements} == {"tm-1", "tm-2"}


def test_a_job_needing_more_slots_than_the_cluster_has_waits_then_fails(noop_cluster):
    client = noop_cluster.client
    started = time.time()
    job_id = client.submit(two_vertices(5, timeout_s=3.0))
    time.sleep(0.5)
    waiting = client.get_job(job_id)
    assert status_name(waiting) == "CREATED"  # waiting for TaskManagers, not failed yet
    assert "slot-sharing group 'default': 5" in waiting.waiting_for_resources
    assert "4 slots in total" in waiting.waiting_for_resources
    _, details = wait_for_end(client, job_id)
    assert status_name(details) == "FAILED"
    assert time.time() - started >= 3.0
    history = [job_pb2.JobStatus.Name(t.to_status).removeprefix("JOB_STATUS_") for t in details.status_history]
    assert history == ["FAILING", "FAILED"]
    message = details.failure.message
    assert "slot-sharing group 'default': 5" in message and "4 slots in total" in message
    assert details.failure.exception_type == "NoResourceAvailableException"


def test_funke_submit_says_at_once_that_the_job_is_waiting_for_slots(noop_cluster, tmp_path):
    job_file = tmp_path / "wide.py"
    job_file.write_text(
        "from tests.integration.test_scheduling import two_vertices\n"
        "job = two_vertices(6, timeout_s=8.0, name='wide')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "funke.deploy.cli", "submit", "--jobmanager", noop_cluster.address, str(job_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env=dict(os.environ, FUNKE_CLUSTER_DIR=str(noop_cluster.dir)),
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "waiting for resources" in line:
                break
        # said while the job waits, not found in its history once the slot request timed out
        waiting = [j for j in noop_cluster.client.list_jobs() if j.name == "wide"]
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    assert "waiting for resources" in output, output
    assert len(waiting) == 1 and waiting[0].status not in (job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELED), \
        waiting
    assert "6" in lines[-1] and "4 slots in total" in lines[-1]
    assert proc.returncode == 1 and "FAILED" in rest


def test_bad_job_graphs_get_every_problem_and_the_jobmanager_keeps_serving(noop_cluster):
    client = noop_cluster.client
    cyclic = JobGraph(
        "broken",
        (JobVertex("src", "Source", 2, SOURCE),
         JobVertex("a", "A", 2, (OperatorSpec("noop"),)),
         JobVertex("b", "B", 0, (OperatorSpec("noop"),))),
        (IntermediateDataSet("s-a", "src"), IntermediateDataSet("a-b", "a"), IntermediateDataSet("b-a", "b"),
         IntermediateDataSet("ghost-out", "ghost")),
        (JobEdge("e1", "s-a", "a"), JobEdge("e2", "a-b", "b"), JobEdge("e3", "b-a", "a", input_index=1),
         JobEdge("e4", "ghost-out", "nowhere")),
    )
    with pytest.raises(InvalidJobGraph) as err:
        client.submit(cyclic)
    problems = "\n".join(err.value.problems)
    assert "cycle: a -> b -> a" in problems or "cycle: b -> a -> b" in problems
    assert "vertex 'b': parallelism 0 is less than 1" in problems
    assert "produced by unknown vertex 'ghost'" in problems
    assert "leads to unknown vertex 'nowhere'" in problems
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    # nothing was half-created, and the JobManager still serves
    assert all(j.name != "broken" for j in client.list_jobs())
    job_id = client.submit(two_vertices(2))
    assert status_name(wait_for_end(client, job_id)[1]) == "FINISHED"


def test_unknown_job_ids_are_not_found_everywhere(noop_cluster):
    client = noop_cluster.client
    for call in (client.get_job, client.cancel, lambda j: list(client.watch(j)), client.result):
        with pytest.raises(JobNotFound):
            call("0" * 32)
    status = noop_cluster.funke("status", "0" * 32, check=False)
    assert status.returncode == 2 and "no job with id" in status.stderr


def test_a_reused_job_id_is_rejected(noop_cluster):
    client = noop_cluster.client
    client.submit(two_vertices(1, job_id="my-fixed-id"))
    with pytest.raises(JobAlreadyExists):
        client.submit(two_vertices(1, job_id="my-fixed-id"))


def test_health_and_cluster_overview(noop_cluster):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with noop_cluster.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="funke.v1.JobManager"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        overview = jobmanager_pb2_grpc.JobManagerStub(channel).GetClusterOverview(jobmanager_pb2.GetClusterOverviewRequest())
    assert sorted(tm.id for tm in overview.task_managers) == ["tm-1", "tm-2"]  # in registration order
    assert overview.slots_total == 4
    # every TaskManager serves gRPC health too
    for tm in overview.task_managers:
        with grpc.insecure_channel(tm.address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_a_hung_taskmanager_is_lost_after_the_heartbeat_timeout_and_registers_again_when_it_wakes(noop_cluster):
    import os
    import signal

    client = noop_cluster.client
    pid = noop_cluster.pids()["tm-2"]
    registered = lambda: {tm.id for tm in client.cluster_overview().task_managers}  # noqa: E731
    os.kill(pid, signal.SIGSTOP)  # alive, connection open, but silent
    try:
        stopped = time.time()
        while "tm-2" in registered():
            assert time.time() - stopped < 10, "a silent TaskManager was never declared lost"
            time.sleep(0.1)
        lost_after = time.time() - stopped
        # the last heartbeat came up to one interval (1 s) before the stop; the timeout is 2 s
        assert 0.9 < lost_after < 6, f"lost after {lost_after:.1f} s"
        # jobs go on with the slots that are left
        job_id = client.submit(two_vertices(2))
        assert status_name(wait_for_end(client, job_id)[1]) == "FINISHED"
    finally:
        os.kill(pid, signal.SIGCONT)
    woke = time.time()
    while "tm-2" not in registered():
        assert time.time() - woke < 15, "the TaskManager did not register again after waking up"
        time.sleep(0.1)
    assert client.cluster_overview().slots_total == 4


def test_every_transition_names_the_event_that_caused_it_across_both_processes(noop_cluster):
    """Stimulus ids: a JobManager event ("jm:...") or a TaskManager's ("tm-N:..."), kept with
    every transition, so a task's story says what moved it on either side."""
    client = noop_cluster.client
    job_id = client.submit(two_vertices(2, job_type=JobType.STREAMING))  # sinks wait for the sources
    _, details = wait_for_end(client, job_id)
    assert status_name(details) == "FINISHED"
    transitions = [t for v in details.vertices for sub in v.subtasks for t in sub.current.history]
    assert transitions and all(t.stimulus_id for t in transitions), [t for t in transitions if not t.stimulus_id][:3]
    assert all(t.stimulus_id for t in details.status_history)
    sink_finished = [t.stimulus_id for v in details.vertices if v.id == "sink" for sub in v.subtasks
                     for t in sub.current.history if t.to_state == job_pb2.EXECUTION_STATE_FINISHED]
    # a sink finished when its TaskManager learned its input was there: that TaskManager's event
    assert sink_finished and all(s.startswith(("tm-1:", "tm-2:")) for s in sink_finished), sink_finished
    scheduled = [t.stimulus_id for t in transitions if t.to_state == job_pb2.EXECUTION_STATE_SCHEDULED]
    assert all(s.startswith("jm:") for s in scheduled), scheduled
