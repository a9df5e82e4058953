"""The JobManager checks that it can dial a TaskManager before taking its slots, and a
deployment that finds one unreachable has it probed and lost (`jobmanager/reachability.py`,
`jobmanager/gateway.py`, `advertised_host` of the TaskManager); real gRPC on loopback."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from funke.jobmanager import reachability
from funke.jobmanager.gateway import TaskManagerGateway
from funke.runtime.rpc import advertised_host
from funke.v1 import cluster_pb2


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def health_server() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("peer, host", [
    ("ipv4:10.0.0.3:5123", "10.0.0.3"), ("ipv6:[::1]:5123", "::1"), ("ipv6:[fe80::1]:80", "fe80::1"),
    ("unix:/tmp/s", None), ("", None),
])
def test_peer_host(peer, host):
    assert reachability.peer_host(peer) == host


def test_a_loopback_address_from_another_host_is_refused_outright():
    problem = reachability.loopback_problem("tm-b", "127.0.0.1:4567", "10.0.0.3")
    assert problem is not None and "127.0.0.1:4567" in problem and "10.0.0.3" in problem and "--host" in problem
    assert "--advertise-host" in problem
    assert reachability.loopback_problem("tm-b", "localhost:4567", "192.168.1.9") is not None
    assert reachability.loopback_problem("tm-b", "[::1]:4567", "10.0.0.3") is not None
    # loopback from loopback is one machine; a routable address or a name is for the probe
    assert reachability.loopback_problem("tm-b", "127.0.0.1:4567", "127.0.0.1") is None
    assert reachability.loopback_problem("tm-b", "10.0.0.3:4567", "10.0.0.3") is None
    assert reachability.loopback_problem("tm-b", "tm-host:4567", "10.0.0.3") is None


def test_the_probe_tells_an_answering_address_from_a_dead_one():
    async def body():
        server, address = await health_server()
        try:
            assert await reachability.unreachable(address, 2.0) is None
            why = await reachability.unreachable(f"127.0.0.1:{closed_port()}", 2.0)
            assert why is not None and why.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            problem = await reachability.registration_problem("tm-x", f"127.0.0.1:{closed_port()}",
                                                              "ipv4:127.0.0.1:5000", 2.0)
            assert problem is not None and "cannot reach TaskManager 'tm-x'" in problem
            assert await reachability.registration_problem("tm-x", address, "ipv4:127.0.0.1:5000", 2.0) is None
        finally:
            await server.stop(None)

    asyncio.run(body())


def test_a_deployment_that_finds_no_taskmanager_fails_and_has_it_declared_lost():
    async def body():
        failed, lost = [], asyncio.Event()
        causes = []

        def unreachable(tm_id, registration_id, cause):
            causes.append((tm_id, registration_id, cause))
            lost.set()

        gateway = TaskManagerGateway("tm-gone", f"127.0.0.1:{closed_port()}",
                                     lambda job, attempt, failure: failed.append((job, failure)),
                                     "reg-1", on_unreachable=unreachable)
        d = cluster_pb2.TaskDeploymentDescriptor(job_id="job-1")
        d.attempt.vertex_id = "v"
        gateway.submit(d)
        await asyncio.wait_for(lost.wait(), 10)
        await gateway.close()
        [(job, failure)] = failed
        assert job == "job-1" and "could not deploy to TaskManager tm-gone" in failure.message
        [(tm_id, registration_id, cause)] = causes
        assert (tm_id, registration_id) == ("tm-gone", "reg-1")
        assert "unreachable at 127.0.0.1:" in cause and "a probe" in cause

    asyncio.run(body())


def test_a_deployment_refused_by_a_live_taskmanager_does_not_make_it_lost():
    async def body():
        server, address = await health_server()  # answers gRPC, but not the TaskExecutor service
        failed, causes = [], []
        gateway = TaskManagerGateway("tm-live", address, lambda job, attempt, failure: failed.append(failure),
                                     "reg-1", on_unreachable=lambda *a: causes.append(a))
        gateway.submit(cluster_pb2.TaskDeploymentDescriptor(job_id="job-1"))
        for _ in range(100):
            if failed:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a probe, had one started, would have answered by now
        await gateway.close()
        await server.stop(None)
        assert failed and "UNIMPLEMENTED" in failed[0].message
        assert causes == []

    asyncio.run(body())


def test_the_advertised_host():
    assert advertised_host("10.1.2.3", None, "10.1.2.1:6123") == "10.1.2.3"
    assert advertised_host("0.0.0.0", "tm1.example.org", "10.1.2.1:6123") == "tm1.example.org"
    # a wildcard bind advertises the address on the route to the JobManager, not a host name
    assert advertised_host("0.0.0.0", None, "127.0.0.1:6123") == "127.0.0.1"
    assert advertised_host("", None, "localhost:6123") in ("127.0.0.1", "::1")


@pytest.mark.parametrize("address, refused", [
    ("127.0.0.1:9", False), ("[::1]:9", False), ("tm-host.example:80", False),
    ("unix:/tmp/socket:80", True), ("dns://x:80", True), ("ipv4:10.0.0.1:80", True), ("a b:1", True),
    ("nohost", True), ("host:0", True),
])
def test_only_a_host_and_port_is_an_address_the_jobmanager_dials(address, refused):
    """The JobManager dials what a TaskManager registers: never a gRPC target of another kind."""
    from funke.jobmanager.services import registration_problem

    problem = registration_problem(cluster_pb2.RegisterTaskManagerRequest(
        task_manager_id="tm-1", address=address, number_of_slots=1, registration_token="t" * 64))
    assert (problem is not None) == refused, problem
