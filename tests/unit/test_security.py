"""Who may call what (`funke.common.security`) and the files, certificates, interceptor and
channels that apply it (`funke.runtime.security`), against a real gRPC server in this process."""

from __future__ import annotations

import asyncio
import datetime
import os
import stat
import threading

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.common.configuration import ConfigurationError, parse_configuration
from funke.common.security import (
    SERVICE_REALMS,
    Realm,
    StreamQuota,
    bearer_token,
    client_of,
    is_loopback,
    plaintext_problem,
    realm_of,
    token_matches,
    token_problem,
)
from funke.runtime import security
from funke.runtime.rpc import add_service
from funke.v1 import cluster_pb2, jobmanager_pb2, jobmanager_pb2_grpc

CLIENT, CLUSTER, REGISTRATION = "c" * 64, "k" * 64, "r" * 64


# ------------------------------------------------------------------------------ the rules


def test_every_service_of_the_wire_contract_has_a_realm():
    """A service added to the .proto files without an entry here would take any token."""
    services = [*jobmanager_pb2.DESCRIPTOR.services_by_name.values(), *cluster_pb2.DESCRIPTOR.services_by_name.values()]
    assert services
    for service in services:
        assert service.full_name in SERVICE_REALMS, service.full_name
    assert realm_of("/funke.v1.JobManager/SubmitJob") is Realm.CLIENT
    assert realm_of("/funke.v1.ResourceManager/RegisterTaskManager") is Realm.CLUSTER
    assert realm_of("/funke.v1.TaskExecutor/SubmitTasks") is Realm.REGISTRATION
    assert realm_of("/grpc.health.v1.Health/Check") is Realm.OPEN
    assert realm_of("/some.Other/Method") is None and realm_of("") is None


@pytest.mark.parametrize("metadata, token", [
    ([("authorization", "Bearer abc")], "abc"),
    ([("Authorization", "bearer  abc ")], "abc"),
    ([("x", "y"), ("authorization", b"Bearer abc")], "abc"),
    ([("authorization", "Basic abc")], None),
    ([("authorization", "Bearer ")], None),
    ([("authorization", "Bearer " + "x" * 5000)], None),
    ([("authorization", b"Bearer \xff")], None),
    ([], None),
])
def test_a_bearer_token_is_read_from_the_metadata(metadata, token):
    assert bearer_token(metadata) == token


def test_tokens_are_compared_whole():
    assert token_matches("abc", ["x", "abc"])
    assert not token_matches("abc", ["abcd"]) and not token_matches("abcd", ["abc"])
    assert not token_matches(None, ["abc"]) and not token_matches("", [""]) and not token_matches("abc", [])
    assert not token_matches("é", ["e"])


@pytest.mark.parametrize("text, problem", [
    ("a" * 64, None), ("", "is empty"), ("short", "at least 16"), ("a" * 5000, "at most 4,096"),
    ("a" * 20 + " b", "printable ASCII"), ("é" * 20, "printable ASCII"),
])
def test_what_makes_a_token_unusable(text, problem):
    found = token_problem(text, "the file")
    assert (found is None) if problem is None else (problem in found), found


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("a.localhost", True), ("0.0.0.0", False), ("", False), ("::", False), ("10.0.0.1", False),
    ("myhost", False),
])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_plaintext_off_loopback_needs_tls_or_insecure_said_by_name():
    problem = plaintext_problem("the JobManager", "0.0.0.0", tls=False, insecure=False)
    assert problem is not None and "without TLS" in problem and "--insecure" in problem and "--tls" in problem
    assert plaintext_problem("the JobManager", "0.0.0.0", tls=True, insecure=False) is None
    assert plaintext_problem("the JobManager", "0.0.0.0", tls=False, insecure=True) is None
    assert plaintext_problem("the JobManager", "127.0.0.1", tls=False, insecure=False) is None


def test_stream_quota_per_client_and_in_all():
    quota = StreamQuota(per_client=2, total=3)
    assert quota.acquire("a") is None and quota.acquire("a") is None
    refused = quota.acquire("a")
    assert refused is not None and "at most 2 per client" in refused and "max-streams-per-client" in refused
    assert quota.acquire("b") is None
    refused = quota.acquire("c")
    assert refused is not None and "3 open WatchJob streams, its limit" in refused
    quota.release("a")
    assert quota.acquire("c") is None
    assert quota.open_streams() == 3 and quota.open_streams("a") == 1


@pytest.mark.parametrize("peer, client", [
    ("ipv4:10.0.0.7:51234", "10.0.0.7"), ("ipv6:[::1]:5", "::1"), ("unix:/tmp/s", "unix:/tmp/s"),
])
def test_a_client_is_its_peer_host(peer, client):
    assert client_of(peer) == client


def test_security_configuration_keys():
    config = parse_configuration({"security.auth.token-file": "/s/client.token", "security.ssl.enabled": "true",
                                  "security.ssl.certificate": "/s/n.pem", "security.ssl.key": "/s/n.key",
                                  "security.ssl.ca-certificate": "/s/ca.pem",
                                  "security.ssl.mutual-authentication": "true",
                                  "jobmanager.watch.max-streams-per-client": "3"})
    assert config.token_file == "/s/client.token" and config.ssl_enabled and config.ssl_mutual
    assert config.watch_streams_per_client == 3
    with pytest.raises(ConfigurationError) as info:
        parse_configuration({"security.ssl.enabled": "true", "security.auth.cluster-token-file": "s3://b/t"})
    text = str(info.value)
    assert "security.ssl.certificate" in text and "security.ssl.ca-certificate" in text and "expected a local file" in text


# ------------------------------------------------------------------------------ files


def test_a_generated_token_is_private_and_kept(tmp_path):
    path = tmp_path / "secrets" / "client.token"
    token, made = security.ensure_token(path)
    assert made and len(token) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert security.ensure_token(path) == (token, False)
    assert security.read_token(path) == token


def test_processes_racing_to_generate_a_token_agree_on_one(tmp_path):
    path = tmp_path / "cluster.token"
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(security.ensure_token(path)[0])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len(set(results)) == 1 and results[0] == path.read_text().strip()
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.token"]  # no temporary file left


def test_a_token_file_others_may_read_is_refused(tmp_path):
    path = tmp_path / "client.token"
    path.write_text("a" * 64)
    path.chmod(0o644)
    with pytest.raises(security.SecurityError) as info:
        security.read_token(path, "client token file")
    assert "may be read by other users (mode 0644)" in str(info.value) and f"chmod 600 {path}" in str(info.value)
    path.chmod(0o600)
    assert security.read_token(path) == "a" * 64
    with pytest.raises(security.SecurityError, match="cannot read the token file"):
        security.read_token(tmp_path / "missing")


def test_a_generated_authority_signs_what_it_says_and_keeps_no_key(tmp_path):
    now = datetime.datetime(2026, 11, 26, tzinfo=datetime.timezone.utc)
    tls = security.generate_tls(tmp_path / "tls", ["localhost", "127.0.0.1", "::1", "10.1.2.3", "node-1"], now=now)
    ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    node = x509.load_pem_x509_certificate(tls.node[0].read_bytes())
    client = x509.load_pem_x509_certificate(tls.client[0].read_bytes())
    for leaf in (node, client):
        ca.public_key().verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))
        assert leaf.issuer == ca.subject
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "node-1"}
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1", "10.1.2.3"}
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages and ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert node.not_valid_after_utc - now > datetime.timedelta(days=364)
    assert sorted(p.name for p in tls.dir.iterdir()) == ["ca.pem", "client.key", "client.pem", "node.key", "node.pem"]
    for key in (tls.node[1], tls.client[1]):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_client_credentials_are_found_in_the_cluster_directory(tmp_path):
    folder = tmp_path / "security"
    token, _ = security.ensure_token(folder / "client.token")
    found = security.ClientCredentials.discover(environ={"FUNKE_CLUSTER_DIR": str(tmp_path)})
    assert found.token == token and found.tls is None and str(folder / "client.token") in found.source
    security.generate_tls(folder / "tls", ["localhost"])
    found = security.ClientCredentials.discover(cluster_dir=tmp_path, environ={})
    assert found.tls is not None and found.tls.certificate is not None and found.tls.ca_source.endswith("ca.pem")
    other = tmp_path / "other.token"
    other.write_text("o" * 32)
    other.chmod(0o600)
    assert security.ClientCredentials.discover(
        environ={"FUNKE_CLUSTER_DIR": str(tmp_path), "FUNKE_TOKEN_FILE": str(other)}).token == "o" * 32
    nothing = security.ClientCredentials.discover(environ={"FUNKE_CLUSTER_DIR": str(tmp_path / "none")})
    assert nothing.token is None and "give --token-file or set FUNKE_TOKEN_FILE" in nothing.source
    with pytest.raises(security.SecurityError, match="needs its private key"):
        security.ClientCredentials.discover(tls_ca=str(folder / "tls" / "ca.pem"), tls_cert=str(folder / "tls" / "client.pem"),
                                            environ={})


# ------------------------------------------------------------------------------ the interceptor


class _JobManager(jobmanager_pb2_grpc.JobManagerServicer):
    async def ListJobs(self, request, context):
        return jobmanager_pb2.ListJobsResponse()

    async def WatchJob(self, request, context):
        yield jobmanager_pb2.JobEvent(sequence=1)


class Server:
    """A JobManager service (ListJobs, WatchJob) and health behind the Authenticator, on a loop
    of its own; `tls`: serve with it."""

    def __init__(self, tls: security.Tls | None = None):
        self.tls = tls
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.authenticator = security.Authenticator("test server", self.tokens)
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    @staticmethod
    def tokens(realm: Realm) -> tuple[str, ...]:
        return {Realm.CLIENT: (CLIENT,), Realm.CLUSTER: (CLUSTER,), Realm.REGISTRATION: (REGISTRATION,)}[realm]

    async def _start(self) -> int:
        self.server = grpc.aio.server(interceptors=[self.authenticator])
        add_service(self.server, _JobManager(), jobmanager_pb2.DESCRIPTOR.services_by_name["JobManager"])
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)
        port = security.add_port(self.server, "127.0.0.1:0", self.tls)
        await self.server.start()
        return port

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _code(call) -> grpc.StatusCode:
    try:
        call()
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def test_only_the_services_token_gets_through(server):
    for token, expected in ((CLIENT, grpc.StatusCode.OK), (None, grpc.StatusCode.UNAUTHENTICATED),
                            (CLUSTER, grpc.StatusCode.UNAUTHENTICATED), (REGISTRATION, grpc.StatusCode.UNAUTHENTICATED),
                            (CLIENT[:-1] + "x", grpc.StatusCode.UNAUTHENTICATED)):
        with security.channel(server.address, token, None) as channel:
            stub = jobmanager_pb2_grpc.JobManagerStub(channel)
            assert _code(lambda: stub.ListJobs(jobmanager_pb2.ListJobsRequest(), timeout=5)) is expected, token
            assert _code(lambda: list(stub.WatchJob(jobmanager_pb2.WatchJobRequest(job_id="j"), timeout=5))) is expected
            # health stays open: launchers probe it before they hold any secret
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert server.authenticator.refused == 8


def test_a_refusal_says_what_is_missing_and_never_decodes_the_body(server):
    with security.channel(server.address, None, None) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/funke.v1.JobManager/ListJobs")(b"\xff\xff not a message", timeout=5)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == ("test server: /funke.v1.JobManager/ListJobs needs the client token "
                                    "(authorization: Bearer <token>): no token was presented")
    # a method this server does not serve: UNIMPLEMENTED, whoever asks
    with security.channel(server.address, None, None) as channel:
        assert _code(lambda: channel.unary_unary("/funke.v1.TaskExecutor/SubmitTasks")(b"", timeout=5)) is \
            grpc.StatusCode.UNIMPLEMENTED


def test_tls_and_mutual_tls_carry_the_token_as_call_credentials(tmp_path):
    made = security.generate_tls(tmp_path / "tls", ["127.0.0.1"])
    other = security.generate_tls(tmp_path / "other", ["127.0.0.1"])
    for mutual in (False, True):
        served = security.Tls.from_files(made.ca, *made.node, mutual=mutual)
        s = Server(served)
        try:
            good = security.Tls.from_files(made.ca, *made.client)
            for tls, token, expected in ((good, CLIENT, grpc.StatusCode.OK),
                                         (good, None, grpc.StatusCode.UNAUTHENTICATED),
                                         (security.Tls.from_files(other.ca, *other.client), CLIENT,
                                          grpc.StatusCode.UNAVAILABLE),  # the server's certificate is not trusted
                                         (security.Tls.from_files(made.ca), CLIENT,
                                          grpc.StatusCode.UNAVAILABLE if mutual else grpc.StatusCode.OK),
                                         (security.Tls.from_files(made.ca, *other.client), CLIENT,
                                          grpc.StatusCode.UNAVAILABLE if mutual else grpc.StatusCode.OK),
                                         (None, CLIENT, grpc.StatusCode.UNAVAILABLE)):  # plaintext to TLS
                with security.channel(s.address, token, tls) as channel:
                    stub = jobmanager_pb2_grpc.JobManagerStub(channel)
                    code = _code(lambda: stub.ListJobs(jobmanager_pb2.ListJobsRequest(), timeout=5))
                    assert code in (expected,) if expected is not grpc.StatusCode.UNAVAILABLE else \
                        code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN), (mutual, token, code)
        finally:
            s.close()


def test_a_private_key_others_may_read_is_refused(tmp_path):
    made = security.generate_tls(tmp_path / "tls", ["127.0.0.1"])
    os.chmod(made.node[1], 0o640)
    with pytest.raises(security.SecurityError, match="may be read by other users"):
        security.Tls.from_files(made.ca, *made.node)
    with pytest.raises(security.SecurityError, match="cannot read the CA certificate"):
        security.Tls.from_files(made.node[1].with_name("missing.pem"))
    (tmp_path / "token.pem").write_text("a" * 64)
    with pytest.raises(security.SecurityError, match="is not a PEM file"):
        security.Tls.from_files(tmp_path / "token.pem")


def test_cluster_secrets_makes_what_processes_on_other_hosts_are_started_with(tmp_path, capsys):
    from funke.deploy import cli, localcluster
    from funke.runtime.configfile import load_configuration

    assert cli.main(["cluster", "secrets", "--dir", str(tmp_path), "--mtls", "--tls-host", "tm1"]) == 0
    out = capsys.readouterr().out
    assert f"secrets in {tmp_path / 'security'} (0700)" in out and "mutual TLS" in out
    flags = localcluster.security_options(tmp_path)
    assert " ".join(flags) in out
    config = load_configuration(None, flags[1::2])
    assert config.ssl_enabled and config.ssl_mutual and config.token_file == str(tmp_path / "security" / "client.token")
    tls = security.Tls.from_config(config)
    assert tls is not None and tls.key is not None
    node = x509.load_pem_x509_certificate(tls.certificate)
    assert "tm1" in node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert localcluster.tls_mode(tmp_path) == "mtls"
    # again without TLS: the tokens stay, the certificates go (a client must not try TLS then)
    token = (tmp_path / "security" / "client.token").read_text()
    assert cli.main(["cluster", "secrets", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "security" / "client.token").read_text() == token
    assert not (tmp_path / "security" / "tls").exists() and localcluster.tls_mode(tmp_path) == "none"


def test_rest_and_metrics_ports_and_addresses():
    config = parse_configuration({"rest.bind-port": "8081-8090", "metrics.reporter.prom.port": "0",
                                  "rest.address": "0.0.0.0", "metrics.reporter.prom.host": "[::1]"})
    assert config.rest_ports == (8081, 8090) and config.metrics_ports == (0, 0)
    assert config.rest_bind_address == "0.0.0.0" and config.metrics_host == "::1"
    with pytest.raises(ConfigurationError) as info:
        parse_configuration({"rest.port": "9000-8000", "metrics.reporter.prom.port": "70000",
                             "rest.bind-address": "a b"})
    assert len(info.value.problems) == 3
