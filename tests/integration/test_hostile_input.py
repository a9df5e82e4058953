"""Hostile and malformed input against live clusters: one regression test per defect found by
fuzzing the client API (ids into paths, empty sink paths, non-finite numbers, a NaN timeout, an
attempts count beyond 32 bits, undecodable bodies, unbounded echoes, invalid graphs accepted,
jobs never evicted, orphaned job data, the CLI pointed at the wrong server or losing its
JobManager, a commit that publishes less than was produced).

The random counterpart of these is `test_api_fuzz.py`."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from funke.deploy.jobfile import load_job_file
from funke.common.graph.jobgraph import (
    Artifact,
    IntermediateDataSet,
    JobConfiguration,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorSpec,
    RestartStrategyConfig,
)
from funke.common.wire.codec import job_graph_to_proto
from funke.deploy import localcluster
from funke.v1 import cluster_pb2, job_pb2, jobmanager_pb2, jobmanager_pb2_grpc
from tests.integration.conftest import REPO, client_of, funke, wait_for_end

pytestmark = pytest.mark.cluster

WORDCOUNT = REPO / "examples" / "wordcount.py"
METHODS = ["SubmitJob", "ListJobs", "GetJob", "CancelJob", "WatchJob", "GetClusterOverview", "GetJobResult"]


def noop_job(job_id: str = "", p: int = 1, name: str = "noop", **config) -> JobGraph:
    return JobGraph(
        name,
        (JobVertex("src", "Source", p, (OperatorSpec("source.noop"),)),
         JobVertex("sink", "Sink", p, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
        (IntermediateDataSet("src.out0", "src"),),
        (JobEdge("src->sink", "src.out0", "sink"),),
        configuration=JobConfiguration(**config),
        job_id=job_id,
    )


def submit_raw(cluster, message) -> tuple[str, str]:
    """SubmitJob with a protobuf JobGraph as given (no client-side encoding or checks)."""
    with cluster.channel() as channel:
        stub = jobmanager_pb2_grpc.JobManagerStub(channel)
        try:
            response = stub.SubmitJob(jobmanager_pb2.SubmitJobRequest(job_graph=message), timeout=30)
            return "OK", response.job_id
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()


def status_name(details) -> str:
    return job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


# ---- 1. path traversal through ids ------------------------------------------------------------

def test_job_ids_that_name_a_directory_above_the_job_are_refused_and_earlier_results_survive(spark_cluster):
    client = spark_cluster.client
    first = client.submit(load_job_file(WORDCOUNT, ["--parallelism", "1"]))
    _, details = wait_for_end(client, first)
    assert status_name(details) == "FINISHED"
    rows = client.result(first)
    data_dir = Path(client.cluster_overview().data_dir)
    before = tree(data_dir.parent)
    for job_id in ("..", "../..", "../../..", "a/../..", ".", "x/y", "x\\y", "\x00"):
        job = load_job_file(WORDCOUNT, ["--parallelism", "1"])
        message = job_graph_to_proto(job)
        message.job_id = job_id
        message.vertices[0].operators[0].config_json = '{"path": "/nonexistent/*.txt"}'  # it would fail
        code, details_text = submit_raw(spark_cluster, message)
        assert code == "INVALID_ARGUMENT" and "job id" in details_text, (job_id, code, details_text)
    assert tree(data_dir.parent) == before  # nothing was created or deleted
    assert client.result(first) == rows  # the earlier job's result is intact


def test_vertex_and_data_set_ids_that_would_leave_their_directory_are_refused(noop_cluster):
    for field_path in ("vertex", "data set"):
        message = job_graph_to_proto(noop_job())
        if field_path == "vertex":
            message.vertices[0].id = "../../escape"
            message.data_sets[0].producer_vertex_id = "../../escape"
        else:
            message.data_sets[0].id = "../escape"
            message.edges[0].data_set_id = "../escape"
        code, text = submit_raw(noop_cluster, message)
        assert code == "INVALID_ARGUMENT" and "may only contain" in text, text


# ---- 2. empty sink path, NUL ------------------------------------------------------------------

@pytest.mark.parametrize("path", ["", " ", "/out/x\x00y", "relative/out", "/"])
def test_sink_paths_that_are_empty_relative_a_root_or_hold_nul_are_refused(noop_cluster, path):
    message = job_graph_to_proto(noop_job())
    sink = message.vertices[1].operators[1]
    sink.kind, sink.config_json = "sink.csv", json.dumps({"path": path, "mode": "overwrite"})
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "config 'path'" in text, text


def test_a_sink_writing_over_the_data_directory_is_refused(noop_cluster):
    data_dir = noop_cluster.client.cluster_overview().data_dir
    for target in (data_dir, str(Path(data_dir).parent), data_dir + "/jobs/x"):
        message = job_graph_to_proto(noop_job())
        sink = message.vertices[1].operators[1]
        sink.kind, sink.config_json = "sink.csv", json.dumps({"path": target, "mode": "overwrite"})
        code, text = submit_raw(noop_cluster, message)
        assert code == "INVALID_ARGUMENT" and "overlaps the cluster's data directory" in text, (target, text)


# ---- 3. one non-finite number wedged the cluster -----------------------------------------------

def test_a_non_finite_number_is_refused_and_the_cluster_keeps_scheduling(noop_cluster):
    message = job_graph_to_proto(noop_job())
    message.vertices[0].operators[0].kind = "source.range"
    message.vertices[0].operators[0].config_json = '{"end": 1e999}'
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "out of range for a double" in text, text
    # the slots are all free and the next job runs
    overview = noop_cluster.client.cluster_overview()
    assert overview.slots_free == overview.slots_total
    job_id = noop_cluster.client.submit(noop_job(p=2))
    _, details = wait_for_end(noop_cluster.client, job_id)
    assert status_name(details) == "FINISHED"


# ---- 4. NaN timeout, attempts beyond 32 bits ---------------------------------------------------

def test_a_nan_slot_request_timeout_and_attempts_beyond_32_bits_are_refused(noop_cluster):
    message = job_graph_to_proto(noop_job())
    message.configuration.slot_request_timeout_seconds = math.nan
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "slot request timeout" in text, text
    job = noop_job(restart_strategy=RestartStrategyConfig("fixed-delay", {"attempts": str(10**23)}))
    code, text = submit_raw(noop_cluster, job_graph_to_proto(job))
    assert code == "INVALID_ARGUMENT" and "does not fit in 32 bits" in text, text


# ---- 5. undecodable bodies ---------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_undecodable_request_bodies_get_invalid_argument(noop_cluster, method):
    bodies = [b"\xff" * 64, b"\x0a\x40short"]  # not protobuf at all; a length beyond the end
    if method not in ("ListJobs", "GetClusterOverview"):  # their requests have no fields to misfill
        bodies.append(b"\x0a\x02\xff\xfe")  # job graph / job id (field 1) that is not UTF-8
    with noop_cluster.channel() as channel:
        for body in bodies:
            if method == "WatchJob":
                call = channel.unary_stream(f"/funke.v1.JobManager/{method}")(body, timeout=10)
                with pytest.raises(grpc.RpcError) as info:
                    list(call)
            else:
                with pytest.raises(grpc.RpcError) as info:
                    channel.unary_unary(f"/funke.v1.JobManager/{method}")(body, timeout=10)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, body, info.value.details())
            assert f"funke.v1.JobManager/{method}" in info.value.details()


def test_undecodable_bodies_to_a_taskmanager_are_refused_before_they_are_decoded(noop_cluster):
    """Only the JobManager a TaskManager registered with holds its token: anyone else, with the
    cluster's own tokens even, is refused before the body is decoded (the decoder's answer to
    what does get through, INVALID_ARGUMENT, is tested in tests/unit/test_rpc.py)."""
    tm_address = noop_cluster.client.cluster_overview().task_managers[0].address
    for realm in ("client", "cluster"):
        with noop_cluster.channel(realm, address=tm_address) as channel:
            for method in ("SubmitTasks", "CancelTasks", "UpdatePartitionInfo", "FreeSlots", "ReleasePartitions"):
                with pytest.raises(grpc.RpcError) as info:
                    channel.unary_unary(f"/funke.v1.TaskExecutor/{method}")(b"\x0a\x40short", timeout=10)
                assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED, (method, info.value.details())
                assert "the token presented is not valid here" in info.value.details()


# ---- 6. unbounded echoes -----------------------------------------------------------------------

def test_a_huge_job_id_gets_its_real_answer_in_a_short_message(noop_cluster):
    huge = "j" * (1 << 20)
    with noop_cluster.channel(options=[("grpc.max_send_message_length", 8 << 20)]) as channel:
        stub = jobmanager_pb2_grpc.JobManagerStub(channel)
        for call, request in ((stub.GetJob, jobmanager_pb2.GetJobRequest(job_id=huge)),
                              (stub.CancelJob, jobmanager_pb2.CancelJobRequest(job_id=huge))):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
            assert len(info.value.details()) < 300 and "1,048,576 characters" in info.value.details()
    message = job_graph_to_proto(noop_job())
    message.job_id = huge
    message.vertices.add(id=huge, name=huge, parallelism=1)
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and len(text) < 4000, (code, len(text))
    # Many problems in wide characters (gRPC percent-encodes every byte of them, three for one).
    message = job_graph_to_proto(noop_job())
    for i in range(60):
        v = message.vertices.add(id=f"v{i}", name="n", parallelism=1)
        v.slot_sharing_group = "\U0001f600" * 301  # too long: each problem quotes 80 of them
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "problem(s)" in text, (code, text[:200])
    # A heartbeat stream that changes its TaskManager id is refused, quoting the ids short.
    with noop_cluster.channel("cluster") as channel:
        beats = [cluster_pb2.HeartbeatRequest(task_manager_id=tm, registration_id="r").SerializeToString()
                 for tm in ("z" * 200_000, "fuzz-tm")]
        with pytest.raises(grpc.RpcError) as info:
            list(channel.stream_stream("/funke.v1.ResourceManager/Heartbeat")(iter(beats), timeout=10))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and len(info.value.details()) < 300


# ---- 7. invalid graphs that failed only at run time, or never ----------------------------------

@pytest.mark.parametrize("mode", ["append", "", "OVERWRITE"])
def test_sink_modes_other_than_error_and_overwrite_are_refused(noop_cluster, mode):
    message = job_graph_to_proto(noop_job())
    sink = message.vertices[1].operators[1]
    sink.kind, sink.config_json = "sink.csv", json.dumps({"path": "/tmp/funke-never-written", "mode": mode})
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "config 'mode'" in text, text


@pytest.mark.parametrize("path", [5, ["/a"], None, ""])
def test_source_paths_that_are_not_one_path_are_refused(noop_cluster, path):
    message = job_graph_to_proto(noop_job())
    source = message.vertices[0].operators[0]
    source.kind, source.config_json = "source.text", json.dumps({"path": path})
    code, text = submit_raw(noop_cluster, message)
    assert code == "INVALID_ARGUMENT" and "config 'path'" in text, text


def test_duplicate_empty_and_escaping_artifact_names_are_refused(noop_cluster):
    job = noop_job()
    job = JobGraph(job.name, job.vertices, job.data_sets, job.edges,
                   artifacts=(Artifact("a.py", b"1"), Artifact("a.py", b"2"), Artifact("", b""), Artifact("../x.py", b"")))
    code, text = submit_raw(noop_cluster, job_graph_to_proto(job))
    assert code == "INVALID_ARGUMENT"
    assert "name is used 2 times" in text and "name is empty" in text and "'../x.py'" in text, text


# ---- 8. retention of terminal jobs ------------------------------------------------------------

def test_terminal_jobs_are_evicted_beyond_the_jobstore_capacity_with_their_data(tmp_path):
    d = tmp_path / "cluster"
    funke("cluster", "start", "--taskmanagers", "1", "--slots", "2", "--dir", str(d), "--no-spark",
          "-D", "jobstore.max-capacity=3", timeout=120)
    try:
        data = d / "data"
        with client_of(d) as client:
            ids = []
            for i in range(5):
                # rows it leaves, there before it ends as a collect sink's are: made after the end,
                # the job's own clean-up (which keeps a FINISHED job's collected rows, else removes
                # its directory) could list the directory before and remove it after
                (data / "jobs" / f"kept-{i}" / "collect").mkdir(parents=True, exist_ok=True)
                job_id = client.submit(noop_job(job_id=f"kept-{i}"))
                wait_for_end(client, job_id)
                ids.append(job_id)
            deadline = time.time() + 10
            while len(client.list_jobs()) > 3 and time.time() < deadline:
                time.sleep(0.05)
            assert [j.job_id for j in client.list_jobs()] == ids[2:]
            with pytest.raises(Exception, match="no job with id 'kept-0'.*at most 3"):
                client.get_job("kept-0")
            deadline = time.time() + 10
            while (data / "jobs" / "kept-1").exists() and time.time() < deadline:
                time.sleep(0.05)
            assert sorted(p.name for p in (data / "jobs").iterdir()) == ["kept-2", "kept-3", "kept-4"]
            assert status_name(client.get_job("kept-4")) == "FINISHED"  # the archive answers GetJob
            assert [e.WhichOneof("event") for e in client.watch("kept-4")] == ["snapshot"]
    finally:
        funke("cluster", "stop", "--dir", str(d), timeout=60)


# ---- 9. orphaned job data after a crash; one JobManager per data directory ---------------------

def test_a_jobmanager_sweeps_what_a_crashed_one_left_and_a_second_one_is_refused(tmp_path):
    first, second, data = tmp_path / "first", tmp_path / "second", tmp_path / "data"
    funke("cluster", "start", "--taskmanagers", "0", "--dir", str(first), "--data-dir", str(data), "--no-spark",
          timeout=120)
    try:
        # A second JobManager on the same data directory would sweep the first one's jobs: refused.
        other = funke("jobmanager", "--port", "0", "--data-dir", str(data), check=False, timeout=60)
        assert other.returncode == 2 and "in use by another JobManager" in other.stderr, other.stderr
        # What a job of the first JobManager leaves when that JobManager is killed mid-job:
        leftover = data / "jobs" / "crashed-job" / "partitions" / "src.out0" / "p0" / "a0"
        leftover.mkdir(parents=True)
        (leftover / "part-0.parquet").write_text("x")
        (data / "jobs" / "crashed-job" / "cancelled").mkdir()
        (data / "keep-me.txt").write_text("not a job's")
        localcluster.kill(first, "jobmanager")
    finally:
        funke("cluster", "stop", "--dir", str(first), timeout=60)
    funke("cluster", "start", "--taskmanagers", "0", "--dir", str(second), "--data-dir", str(data), "--no-spark",
          timeout=120)
    try:
        assert not (data / "jobs" / "crashed-job").exists()
        assert (data / "keep-me.txt").read_text() == "not a job's"
        assert "removed what 1 job(s) of an earlier JobManager left" in (second / "log" / "jobmanager.log").read_text()
    finally:
        funke("cluster", "stop", "--dir", str(second), timeout=60)


# ---- 10. the CLI at the wrong server, or losing its JobManager ----------------------------------

def test_the_cli_pointed_at_a_taskmanager_says_there_is_no_jobmanager_there(noop_cluster):
    tm_address = noop_cluster.client.cluster_overview().task_managers[0].address
    result = funke("list", "--jobmanager", tm_address, check=False, timeout=60)
    assert result.returncode == 2, result
    assert f"the server at {tm_address} is not a funke JobManager" in result.stderr
    assert "UNIMPLEMENTED" not in result.stderr and "Method not found" not in result.stderr


def test_submit_says_what_losing_the_jobmanager_means_for_the_job(tmp_path):
    d = tmp_path / "cluster"
    funke("cluster", "start", "--taskmanagers", "1", "--slots", "1", "--dir", str(d), "--no-spark", timeout=120)
    job_file = tmp_path / "waits.py"
    job_file.write_text(textwrap.dedent("""
        from funke.common.graph.jobgraph import (IntermediateDataSet, JobConfiguration, JobEdge, JobGraph, JobType,
                                           JobVertex, OperatorSpec)

        def build(args):  # 4 slots wanted, 1 offered: the job waits while `funke submit` follows it
            return JobGraph(
                "waits for slots",
                (JobVertex("src", "Source", 4, (OperatorSpec("source.noop"),)),
                 JobVertex("sink", "Sink", 4, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
                (IntermediateDataSet("src.out0", "src"),), (JobEdge("e", "src.out0", "sink"),),
                job_type=JobType.STREAMING,  # deployed all at once: 4 slots or nothing
                configuration=JobConfiguration(slot_request_timeout_s=120.0))
    """))
    address = (d / "jobmanager.address").read_text().strip()
    submit = subprocess.Popen([sys.executable, "-m", "funke.deploy.cli", "submit", str(job_file),
                               "--jobmanager", address], cwd=REPO, text=True,
                              env=dict(os.environ, FUNKE_CLUSTER_DIR=str(d)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with client_of(d) as client:
            deadline = time.time() + 60
            while not client.list_jobs() and time.time() < deadline:
                time.sleep(0.1)
            assert client.list_jobs(), "the job was not submitted"
        time.sleep(0.5)  # `funke submit` is following the job now
        localcluster.kill(d, "jobmanager")
        out, err = submit.communicate(timeout=60)
    finally:
        if submit.poll() is None:
            submit.send_signal(signal.SIGKILL)
            submit.wait()
        funke("cluster", "stop", "--dir", str(d), timeout=60)
    assert submit.returncode == 1, (out, err)
    assert f"lost the connection to the JobManager at {address} while following job" in err, err
    assert "outcome is unknown" in err and "start one with" not in err


# ---- 11. a commit that publishes less than was produced ---------------------------------------

def test_a_jobmanager_that_cannot_see_the_taskmanagers_output_fails_the_job_instead_of_publishing_less(tmp_path):
    """As on several machines without a shared data directory: the TaskManager writes into its own
    directory, the JobManager looks into its own."""
    d, tm_data = tmp_path / "cluster", tmp_path / "taskmanager-only"
    funke("cluster", "start", "--taskmanagers", "0", "--dir", str(d), timeout=120)
    tm_log = open(d / "log" / "tm-own.log", "wb")
    address = (d / "jobmanager.address").read_text().strip()
    tm = subprocess.Popen([sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", address, "--slots", "2",
                           "--id", "tm-own", "--data-dir", str(tm_data), *localcluster.security_options(d)],
                          cwd=d, stdout=tm_log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with client_of(d) as client:
            deadline = time.time() + 120
            while not client.cluster_overview().task_managers and time.time() < deadline:
                assert tm.poll() is None, (d / "log" / "tm-own.log").read_text()
                time.sleep(0.2)
        result = funke("submit", str(WORDCOUNT), "--jobmanager", address, "--parallelism", "1", check=False,
                       timeout=300, env=dict(os.environ, FUNKE_CLUSTER_DIR=str(d)))
        assert result.returncode == 1, result
        assert "FAILED" in result.stdout and "is not there" in result.stdout and "shared" in result.stdout, result.stdout
        assert "collected 0 row(s)" not in result.stdout
    finally:
        os.killpg(tm.pid, signal.SIGTERM)
        try:
            tm.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(tm.pid, signal.SIGKILL)
            tm.wait()
        tm_log.close()
        funke("cluster", "stop", "--dir", str(d), timeout=60)


def test_collected_rows_that_vanished_are_an_error_not_an_empty_result(spark_cluster):
    client = spark_cluster.client
    job_id = client.submit(load_job_file(WORDCOUNT, ["--parallelism", "1"]))
    _, details = wait_for_end(client, job_id)
    assert status_name(details) == "FINISHED" and client.result(job_id)
    collected = Path(client.cluster_overview().data_dir) / "jobs" / job_id / "collect"
    # The JobManager may still be removing the sink's staging directory inside it (its clean-up
    # after the commit runs off the loop): whatever of it is gone already is no error here.
    deadline = time.time() + 10
    while collected.exists():
        assert time.time() < deadline, f"{collected} could not be removed"
        shutil.rmtree(collected, ignore_errors=True)
    with pytest.raises(Exception, match="no longer in the data directory"):
        client.result(job_id)
