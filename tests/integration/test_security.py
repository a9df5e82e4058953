"""Secure by default, against live clusters: every RPC without its token is refused and changes
nothing, a TaskManager with the wrong secret never registers, TLS and mutual TLS clusters run
the word count, a client without the cluster's CA is told so, plaintext off loopback is refused,
and WatchJob streams and unfinished jobs are bounded.

The count of refused RPCs is written to `unauthenticated.json` in `artifacts_dir("security")`
($FUNKE_TEST_ARTIFACTS/security, else in the temporary directory)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass

from funke.common.wire.codec import job_graph_to_proto
from funke.common.graph.jobgraph import IntermediateDataSet, JobEdge, JobGraph, JobType, JobVertex, OperatorSpec
from funke.runtime import security
from funke.deploy.client import FunkeError, JobManagerClient, NotAuthenticated, job_status_name
from funke.deploy.jobfile import load_job_file
from funke.v1 import cluster_pb2, jobmanager_pb2
from tests.integration.conftest import REPO, artifacts_dir, client_of, funke, secured_channel, wait_for, wait_for_end

pytestmark = pytest.mark.cluster

SUMMARY = artifacts_dir("security") / "unauthenticated.json"
WORDCOUNT = REPO / "examples" / "wordcount.py"
MAX_ACTIVE_JOBS = 3
WATCHES_PER_CLIENT = 2


def waiting_job(job_id: str) -> JobGraph:
    """A streaming job of parallelism 4 on a cluster of 1 slot: it waits for resources, running
    nothing, until it is cancelled (or its slot request times out, after an hour)."""
    from funke.common.graph.jobgraph import JobConfiguration

    return JobGraph(
        "waits", (JobVertex("src", "Source", 4, (OperatorSpec("source.noop"),)),
                  JobVertex("sink", "Sink", 4, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
        (IntermediateDataSet("src.out0", "src"),), (JobEdge("e", "src.out0", "sink"),),
        job_type=JobType.STREAMING, configuration=JobConfiguration(slot_request_timeout_s=3600.0), job_id=job_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("secured")
    funke("cluster", "start", "--dir", str(d), "--taskmanagers", "1", "--slots", "1", "--no-spark",
          "-D", f"jobmanager.max-active-jobs={MAX_ACTIVE_JOBS}",
          "-D", f"jobmanager.watch.max-streams-per-client={WATCHES_PER_CLIENT}", timeout=120)
    client = client_of(d)
    yield d, client
    client.close()
    funke("cluster", "stop", "--dir", str(d), timeout=60)


def state_of(client) -> tuple:
    """What an RPC could change: every job and its status, every TaskManager and its free slots."""
    overview = client.cluster_overview()
    return (sorted((j.job_id, job_status_name(j.status)) for j in client.list_jobs()),
            sorted((tm.id, tm.address, tm.slots_free, tm.slots_total) for tm in overview.task_managers))


def _bodies(waiting: str, tm_address: str) -> dict[str, bytes]:
    """Requests that would do harm if they got through: a job, a cancellation, a TaskManager
    registration, a deployment, freeing a slot. Other methods get their empty request."""
    deployment = cluster_pb2.TaskDeploymentDescriptor(job_id=waiting, task_name="rogue (1/1)")
    deployment.attempt.vertex_id = "src"
    return {
        "SubmitJob": jobmanager_pb2.SubmitJobRequest(job_graph=job_graph_to_proto(waiting_job("rogue-job"))).SerializeToString(),
        "CancelJob": jobmanager_pb2.CancelJobRequest(job_id=waiting).SerializeToString(),
        "StopJob": jobmanager_pb2.StopJobRequest(job_id=waiting).SerializeToString(),
        "GetJob": jobmanager_pb2.GetJobRequest(job_id=waiting).SerializeToString(),
        "WatchJob": jobmanager_pb2.WatchJobRequest(job_id=waiting).SerializeToString(),
        "RegisterTaskManager": cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id="rogue-tm", address=tm_address, number_of_slots=64,
            registration_token="r" * 64).SerializeToString(),
        "SubmitTasks": cluster_pb2.SubmitTasksRequest(tasks=[deployment]).SerializeToString(),
        "FreeSlots": cluster_pb2.FreeSlotsRequest(slot_indexes=[0], job_id=waiting, cause="rogue").SerializeToString(),
        "CancelTasks": cluster_pb2.CancelTasksRequest(attempts=[deployment.attempt]).SerializeToString(),
    }


def _call(channel: grpc.Channel, method, body: bytes, token: str | None) -> str:
    path = f"/{method.containing_service.full_name}/{method.name}"
    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    try:
        if method.client_streaming:
            list(channel.stream_stream(path)(iter([body]), timeout=10, metadata=metadata))
        elif method.server_streaming:
            list(channel.unary_stream(path)(body, timeout=10, metadata=metadata))
        else:
            channel.unary_unary(path)(body, timeout=10, metadata=metadata)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def test_every_rpc_without_its_token_is_refused_and_changes_nothing(cluster):
    d, client = cluster
    waiting = client.submit(waiting_job("security-waiting"))
    wait_for("the job to wait for slots", lambda: client.get_job(waiting).waiting_for_resources)
    tm = client.cluster_overview().task_managers[0]
    folder = d / "security"
    client_token = security.read_token(folder / "client.token")
    cluster_token = security.read_token(folder / "cluster.token")
    before = state_of(client)
    bodies = _bodies(waiting, tm.address)
    targets = [(client.address, "funke.v1.JobManager", jobmanager_pb2, [None, "w" * 64, cluster_token]),
               (client.address, "funke.v1.ResourceManager", cluster_pb2, [None, "w" * 64, client_token]),
               (client.address, "funke.v1.JobMaster", cluster_pb2, [None, "w" * 64, client_token]),
               # a TaskManager takes only its JobManager's registration token: not even the cluster's
               (tm.address, "funke.v1.TaskExecutor", cluster_pb2, [None, "w" * 64, client_token, cluster_token])]
    codes: collections.Counter[str] = collections.Counter()
    per_service: dict[str, int] = {}
    for address, service_name, module, tokens in targets:
        service = module.DESCRIPTOR.services_by_name[service_name.rpartition(".")[2]]
        with security.channel(address, None, None) as channel:
            for method in service.methods:
                body = bodies.get(method.name, GetMessageClass(method.input_type)().SerializeToString())
                for token in tokens:
                    code = _call(channel, method, body, token)
                    assert code == "UNAUTHENTICATED", (service_name, method.name, token and token[:4], code)
                    codes[code] += 1
        per_service[service_name] = len(service.methods) * len(tokens)
    # nothing happened: no job submitted or cancelled, no TaskManager registered, no slot freed
    assert state_of(client) == before
    assert job_status_name(client.get_job(waiting).status) == "CREATED"
    log = (d / "log" / "jobmanager.log").read_text()
    assert "refused an unauthenticated call" in log
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps({"rpcs": sum(codes.values()), "codes": dict(codes), "per_service": per_service},
                                  indent=2) + "\n")
    print(json.dumps({"rpcs": sum(codes.values()), "codes": dict(codes), "per_service": per_service}))
    # and with the right token the same client gets through
    assert client.cancel(waiting) in ("CANCELING", "CANCELED")
    wait_for_end(client, waiting)


def test_a_taskmanager_without_the_cluster_token_never_registers(cluster, tmp_path):
    d, client = cluster
    address = client.address
    # A user who holds the clients' token only, posing as a TaskManager to receive others' jobs.
    log = tmp_path / "rogue.log"
    rogue = subprocess.Popen(
        [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", address, "--id", "rogue-tm",
         "-D", f"security.auth.cluster-token-file={d / 'security' / 'client.token'}"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=REPO, start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_for("the refusal", lambda: "refused the registration" in log.read_text(), timeout=60)
        assert "needs the cluster token" in log.read_text()
        time.sleep(1.0)
        assert "rogue-tm" not in {t.id for t in client.cluster_overview().task_managers}
        assert rogue.poll() is None  # it keeps asking, and keeps being refused
    finally:
        os.killpg(rogue.pid, 9)  # the process we started, by its pid
        rogue.wait(10)
    # Without any token file it does not start at all, and says where it looked.
    result = subprocess.run(
        [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", address,
         "-D", f"security.auth.cluster-token-file={tmp_path / 'none.token'}"],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and f"no cluster token at {tmp_path / 'none.token'}" in result.stderr


def test_a_client_without_the_token_is_told_where_it_looked(cluster, tmp_path):
    d, client = cluster
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(tmp_path / "elsewhere"))
    env.pop("FUNKE_TOKEN_FILE", None)
    result = funke("list", "--jobmanager", client.address, check=False, env=env)
    assert result.returncode == 2, result
    assert "refused this client" in result.stderr and "no token was presented" in result.stderr
    assert f"none in {tmp_path / 'elsewhere' / 'security' / 'client.token'}" in result.stderr
    ok = funke("list", "--jobmanager", client.address, "--token-file", str(d / "security" / "client.token"), env=env)
    assert ok.returncode == 0
    # the SDK raises NotAuthenticated, naming what it presented
    with JobManagerClient(client.address, credentials=security.ClientCredentials(source="no token (test)")) as bare:
        with pytest.raises(NotAuthenticated) as info:
            bare.list_jobs()
    assert "This client used no token (test)" in str(info.value)


def test_watch_streams_per_client_are_bounded(cluster):
    d, client = cluster
    job_id = client.submit(waiting_job("security-watched"))
    streams = [client.watch(job_id) for _ in range(WATCHES_PER_CLIENT)]
    try:
        for stream in streams:
            assert next(stream).WhichOneof("event") == "snapshot"
        with pytest.raises(FunkeError) as info:
            next(client.watch(job_id))
        assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"at most {WATCHES_PER_CLIENT} per client" in info.value.details
        assert "jobmanager.watch.max-streams-per-client" in info.value.details
        streams.pop().close()  # closing one frees its place
        again = wait_for("a place", lambda: _first_event(client, job_id))
        assert again == "snapshot"
    finally:
        for stream in streams:
            stream.close()
        client.cancel(job_id)
        wait_for_end(client, job_id)


def _first_event(client, job_id: str) -> str | None:
    stream = client.watch(job_id)
    try:
        return next(stream).WhichOneof("event")
    except FunkeError:
        return None
    finally:
        stream.close()


def test_unfinished_jobs_are_bounded_and_a_refused_submission_leaves_nothing(cluster):
    d, client = cluster
    ids = [client.submit(waiting_job(f"security-active-{i}")) for i in range(MAX_ACTIVE_JOBS)]
    try:
        with pytest.raises(FunkeError) as info:
            client.submit(waiting_job("security-one-too-many"))
        assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"jobmanager.max-active-jobs: {MAX_ACTIVE_JOBS}" in info.value.details
        assert "security-one-too-many" not in {j.job_id for j in client.list_jobs()}
    finally:
        for job_id in ids:
            client.cancel(job_id)
        for job_id in ids:
            wait_for_end(client, job_id)
    # once they ended, there is room again
    done = client.submit(waiting_job("security-after"))
    client.cancel(done)
    wait_for_end(client, done)


def test_plaintext_off_loopback_is_refused_unless_asked_for_by_name(tmp_path):
    jm = funke("jobmanager", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "data"),
               check=False, timeout=60)
    assert jm.returncode == 2 and "refusing to serve on 0.0.0.0 without TLS" in jm.stderr, jm.stderr
    tm = funke("taskmanager", "--no-spark", "--host", "0.0.0.0", check=False, timeout=60)
    assert tm.returncode == 2 and "refusing to serve on 0.0.0.0 without TLS" in tm.stderr, tm.stderr
    d = tmp_path / "cluster"
    started = funke("cluster", "start", "--dir", str(d), "--host", "0.0.0.0", "--taskmanagers", "0", "--no-spark",
                    check=False, timeout=60)
    assert started.returncode == 2 and "pass --insecure (or --tls)" in started.stderr, started.stderr
    assert not list((d / "pids").glob("*.pid"))  # nothing was started


def test_a_token_file_others_may_read_stops_the_jobmanager(tmp_path):
    token = tmp_path / "client.token"
    token.write_text("p" * 64)
    token.chmod(0o644)
    jm = funke("jobmanager", "--port", "0", "--data-dir", str(tmp_path / "data"),
               "-D", f"security.auth.token-file={token}", check=False, timeout=60)
    assert jm.returncode == 2 and f"chmod 600 {token}" in jm.stderr, jm.stderr


# ------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module", params=["tls", "mtls"])
def tls_cluster(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"{request.param}-cluster")
    started = funke("cluster", "start", "--dir", str(d), "--taskmanagers", "1", "--slots", "2",
                    f"--{request.param}", timeout=300)
    assert ("security: mutual TLS" if request.param == "mtls" else "security: TLS;") in started.stdout
    yield request.param, d
    funke("cluster", "stop", "--dir", str(d), timeout=60)


def test_a_tls_cluster_runs_the_word_count(tls_cluster, tmp_path):
    mode, d = tls_cluster
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("To be, or not to be: that is the question.\nTo sleep, perchance to dream.\n")
    # through the CLI, as a user would: the cluster directory gives the token, the CA and (mTLS)
    # the client's certificate
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(d))
    run = funke("submit", str(WORDCOUNT), "--input", str(corpus / "*.txt"), env=env, timeout=300)
    assert "FINISHED" in run.stdout, run.stdout
    assert "to" in run.stdout and "4" in run.stdout
    # and through the SDK, checking every count
    with client_of(d) as client:
        assert client.credentials.tls is not None
        job_id = client.submit(load_job_file(WORDCOUNT, ["--input", str(corpus / "*.txt")]))
        _, details = wait_for_end(client, job_id)
        assert job_status_name(details.status) == "FINISHED", details.failure
        counts = {r["word"]: r["count"] for r in client.result(job_id)}
    assert counts == {"to": 4, "be": 2, "or": 1, "not": 1, "that": 1, "is": 1, "the": 1, "question": 1,
                      "sleep": 1, "perchance": 1, "dream": 1}
    # every process serves TLS: plaintext to the TaskManager fails too
    tm_address = counts and client_of(d).cluster_overview().task_managers[0].address
    with secured_channel(d, tm_address) as good, security.channel(tm_address, None, None) as plain:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        assert health_pb2_grpc.HealthStub(good).Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_client_without_the_cas_trust_is_told_what_is_missing(tls_cluster, tmp_path):
    mode, d = tls_cluster
    address = (d / "jobmanager.address").read_text().strip()
    # only the token: no CA
    alone = tmp_path / "token-only" / "security"
    alone.mkdir(parents=True)
    shutil.copy(d / "security" / "client.token", alone / "client.token")
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(alone.parent))
    result = funke("list", "--jobmanager", address, check=False, env=env)
    assert result.returncode == 2
    assert "if the cluster runs with TLS, this client needs its CA: --tls-ca or FUNKE_TLS_CA" in result.stderr, result.stderr
    assert "I1" not in result.stderr  # gRPC's own handshake log stays out of the way
    # another authority's CA: the JobManager's certificate is not trusted
    other = security.generate_tls(tmp_path / "other-ca", ["127.0.0.1"])
    result = funke("list", "--jobmanager", address, "--tls-ca", str(other.ca), check=False, env=env)
    assert result.returncode == 2
    assert "the JobManager's certificate is not one the CA this client trusts signed" in result.stderr, result.stderr
    assert str(other.ca) in result.stderr
    # the right CA and no certificate of its own: enough for TLS, not for mutual TLS
    result = funke("list", "--jobmanager", address, "--tls-ca", str(d / "security" / "tls" / "ca.pem"), check=False,
                   env=env)
    if mode == "tls":
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2
        assert "if the cluster runs with mutual TLS, this client needs a certificate its CA signed" in result.stderr
        # a certificate another authority signed is not taken either
        result = funke("list", "--jobmanager", address, "--tls-ca", str(d / "security" / "tls" / "ca.pem"),
                       "--tls-cert", str(other.client[0]), "--tls-key", str(other.client[1]), check=False, env=env)
        assert result.returncode == 2 and "it did not take this client's certificate" in result.stderr
