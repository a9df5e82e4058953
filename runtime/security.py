"""Secrets and TLS as funke's processes and clients use them: token files, certificates, the
server interceptor that asks every call for its realm's token, and channels that present one.

Which service asks for which secret is decided in `funke.common.security`; this module reads
and writes the files and speaks gRPC. A cluster directory keeps its secrets in:

    <dir>/security/client.token    the clients' token (the JobManager service)
    <dir>/security/cluster.token   the TaskManagers' token (ResourceManager, JobMaster)
    <dir>/security/tls/            with TLS: ca.pem, node.pem + node.key (every JobManager and
                                   TaskManager), client.pem + client.key (for mutual TLS)

Token files and keys are created with mode 0600 in a 0700 directory, and a token file other
users may read is refused, as ssh refuses such a key. A process started without token files
configured uses the default cluster directory's (`$FUNKE_CLUSTER_DIR`, else ~/.funke/cluster),
so `funke jobmanager`, `funke taskmanager` and `funke submit` on one machine find each other's
secrets with no flags at all.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import secrets
import socket
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from funke.common import ids
from funke.common.configuration import ClusterConfiguration
from funke.common.security import (
    MAX_TOKEN_LENGTH,
    TOKEN_BYTES,
    Realm,
    bearer_token,
    plaintext_problem,
    realm_of,
    token_matches,
    token_problem,
)

log = logging.getLogger("funke.security")

SECURITY_DIR = "security"
CLIENT_TOKEN = "client.token"
CLUSTER_TOKEN = "cluster.token"
TLS_DIR = "tls"
CA_CERT = "ca.pem"
NODE_CERT, NODE_KEY = "node.pem", "node.key"
CLIENT_CERT, CLIENT_KEY = "client.pem", "client.key"
CERTIFICATE_DAYS = 365
_MAX_PEM_BYTES = 1024 * 1024

_REALM_NAMES = {
    Realm.CLIENT: "client token",
    Realm.CLUSTER: "cluster token",
    Realm.REGISTRATION: "token of the JobManager this TaskManager is registered with",
}


class SecurityError(Exception):
    """A secret or certificate that cannot be used, or a setup that would expose the cluster."""


def default_cluster_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$FUNKE_CLUSTER_DIR, else ~/.funke/cluster."""
    configured = (os.environ if environ is None else environ).get("FUNKE_CLUSTER_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".funke" / "cluster"


def security_dir(cluster_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(cluster_dir).expanduser() / SECURITY_DIR if cluster_dir is not None else \
        default_cluster_dir() / SECURITY_DIR


# --------------------------------------------------------------------------------------------
# Token files
# --------------------------------------------------------------------------------------------


def read_token(path: str | os.PathLike[str], what: str = "token file") -> str:
    """The token in `path`. Raises SecurityError: missing, unreadable, readable by other users,
    or not a usable token."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(MAX_TOKEN_LENGTH + 2)
    except OSError as exc:
        raise SecurityError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(f"the {what} {path} may be read by other users (mode {stat.S_IMODE(mode):04o}); "
                            f"make it private: chmod 600 {path}")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SecurityError(f"the {what} {path} must hold one line of printable ASCII") from None
    problem = token_problem(text, f"the {what} {path}")
    if problem is not None:
        raise SecurityError(problem)
    return text


def ensure_token(path: str | os.PathLike[str], what: str = "token file") -> tuple[str, bool]:
    """The token in `path`, generated first when the file does not exist: (token, generated).
    Two processes that race to generate agree on the one written first."""
    path = Path(path)
    if not path.exists():
        _private_dir(path.parent)
        token = secrets.token_hex(TOKEN_BYTES)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            try:
                os.link(tmp, path)  # atomic, and fails if someone else was first
                return token, True
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    return read_token(path, what), False


def _private_dir(path: Path) -> None:
    """Create `path` (0700) if missing; a directory that exists is left as it is (it may be
    anyone's, /tmp included: the files in it are what is kept private)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def token_files(config: ClusterConfiguration) -> tuple[Path, Path]:
    """(client token file, cluster token file): as configured, else the default cluster
    directory's."""
    default = security_dir()
    return (Path(config.token_file).expanduser() if config.token_file else default / CLIENT_TOKEN,
            Path(config.cluster_token_file).expanduser() if config.cluster_token_file else default / CLUSTER_TOKEN)


# --------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    """PEM material for one process or client. A server needs `certificate` and `key`; a client
    needs `ca` and, for mutual TLS, `certificate` and `key` too."""

    ca: bytes
    certificate: bytes | None = None
    key: bytes | None = None
    mutual: bool = False
    ca_source: str = ""  # the CA file, for messages

    @classmethod
    def from_files(cls, ca: str | os.PathLike[str], certificate: str | os.PathLike[str] | None = None,
                   key: str | os.PathLike[str] | None = None, mutual: bool = False) -> "Tls":
        return cls(ca=_read_pem(ca, "CA certificate"),
                   certificate=_read_pem(certificate, "certificate") if certificate else None,
                   key=_read_pem(key, "private key", private=True) if key else None,
                   mutual=mutual, ca_source=str(ca))

    @classmethod
    def from_config(cls, config: ClusterConfiguration) -> "Tls | None":
        if not config.ssl_enabled:
            return None
        return cls.from_files(config.ssl_ca_certificate, config.ssl_certificate, config.ssl_key, config.ssl_mutual)

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.certificate is None or self.key is None:
            raise SecurityError("a TLS server needs a certificate and its private key")
        return grpc.ssl_server_credentials([(self.key, self.certificate)],
                                           root_certificates=self.ca if self.mutual else None,
                                           require_client_auth=self.mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.certificate)


def _read_pem(path: str | os.PathLike[str], what: str, private: bool = False) -> bytes:
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise SecurityError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise SecurityError(f"the {what} {path} is not a PEM file")
    if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(f"the {what} {path} may be read by other users (mode {stat.S_IMODE(mode):04o}); "
                            f"make it private: chmod 600 {path}")
    return data


@dataclass(frozen=True)
class GeneratedTls:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / CA_CERT

    @property
    def node(self) -> tuple[Path, Path]:
        return self.dir / NODE_CERT, self.dir / NODE_KEY

    @property
    def client(self) -> tuple[Path, Path]:
        return self.dir / CLIENT_CERT, self.dir / CLIENT_KEY

    def config_entries(self, mutual: bool) -> list[str]:
        """`-D` entries that make a JobManager or TaskManager serve and call with this."""
        cert, key = self.node
        return ["security.ssl.enabled=true", f"security.ssl.certificate={cert}", f"security.ssl.key={key}",
                f"security.ssl.ca-certificate={self.ca}", f"security.ssl.mutual-authentication={str(mutual).lower()}"]


def generate_tls(dir: str | os.PathLike[str], hosts: Iterable[str], now: datetime.datetime | None = None,
                 days: int = CERTIFICATE_DAYS) -> GeneratedTls:
    """A fresh certificate authority and, signed by it, a certificate for the cluster's
    processes (valid for `hosts`: names and addresses, as subject alternative names; for
    serving and for calling, as mutual TLS needs) and one for clients. The authority's private
    key is never written: nothing else can be signed with it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(dir)
    _private_dir(out)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "funke"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("funke cluster CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(common: str, usages: list, alt_names: list | None) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return (cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))

    alt: list = []
    for host in dict.fromkeys(h.strip("[]") for h in hosts if h and h.strip("[]")):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    node_cert, node_key = leaf("funke node", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], alt)
    client_cert, client_key = leaf("funke client", [ExtendedKeyUsageOID.CLIENT_AUTH], None)
    generated = GeneratedTls(out)
    (out / CA_CERT).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(generated.node[1], node_key)
    generated.node[0].write_bytes(node_cert)
    _write_private(generated.client[1], client_key)
    generated.client[0].write_bytes(client_cert)
    return generated


def local_host_names(bind_host: str | None = None, advertised: str | None = None) -> list[str]:
    """The names and addresses this machine's processes may be dialled at: loopback, its host
    name and the addresses that name resolves to, the bound and advertised addresses."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()]
    for extra in (bind_host, advertised):
        if extra and extra not in ("0.0.0.0", "::", "[::]"):
            names.append(extra)
    try:
        names += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)]
    except OSError:
        pass
    return list(dict.fromkeys(n.split("%")[0] for n in names if n))


# --------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------


TokenLookup = Callable[[Realm], Sequence[str]]


class Authenticator(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call that does not present its realm's token
    (`tokens(realm)` says which are valid right now). Open services pass; a method of a service
    of no known realm takes any of the server's tokens; one the server does not serve gets
    UNIMPLEMENTED. A refused call's request is never decoded."""

    def __init__(self, process: str, tokens: TokenLookup):
        self.process = process
        self._tokens = tokens
        self.refused = 0

    async def intercept_service(self, continuation: Callable[[Any], Any],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:  # not served here: UNIMPLEMENTED, whoever asks (the protocol is public)
            return None
        realm = realm_of(details.method)
        if realm is Realm.OPEN:
            return handler
        presented = bearer_token(details.invocation_metadata or ())
        if realm is None:
            expected = [t for r in _REALM_NAMES for t in self._tokens(r)]
        else:
            expected = list(self._tokens(realm))
        if token_matches(presented, expected):
            return handler
        self.refused += 1
        wanted = _REALM_NAMES[realm] if realm is not None else "a token of this cluster"
        what = "no token was presented" if presented is None else "the token presented is not valid here"
        method = details.method if realm is not None else "this method"
        message = f"{self.process}: {method} needs the {wanted} (authorization: Bearer <token>): {what}"
        level = logging.WARNING if self.refused == 1 or self.refused % 1000 == 0 else logging.DEBUG
        log.log(level, "%s: refused an unauthenticated call to %s (%d so far)", self.process,
                ids.echo(details.method), self.refused)
        return _refusal(handler, message)


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # The shape of the method it stands for; requests stay bytes (no deserializer).
    if not (handler.request_streaming or handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_stream_rpc_method_handler(refuse)


def add_port(server: grpc.aio.Server, where: str, tls: Tls | None) -> int:
    """Bind `where` with TLS when given; the port bound (0: failed)."""
    if tls is None:
        return server.add_insecure_port(where)
    return server.add_secure_port(where, tls.server_credentials())


def check_exposure(process: str, host: str, tls: Tls | None, insecure: bool) -> None:
    problem = plaintext_problem(process, host, tls is not None, insecure)
    if problem is not None:
        raise SecurityError(problem)


# --------------------------------------------------------------------------------------------
# Calling
# --------------------------------------------------------------------------------------------


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a plaintext channel (gRPC sends
    call credentials over TLS only)."""

    def __init__(self, token: str):
        self._entry = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), self._entry])

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


class _AioBearerDetails:
    def __init__(self, token: str):
        self._entry = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), self._entry))


# grpc.aio files each interceptor under the first kind of call it is an instance of: one class
# per kind, or streams would go out without the token.
class _AioBearerUnaryUnary(_AioBearerDetails, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _AioBearerUnaryStream(_AioBearerDetails, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _AioBearerStreamUnary(_AioBearerDetails, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


class _AioBearerStreamStream(_AioBearerDetails, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


_AIO_BEARERS = (_AioBearerUnaryUnary, _AioBearerUnaryStream, _AioBearerStreamUnary, _AioBearerStreamStream)


def _credentials(token: str | None, tls: Tls) -> grpc.ChannelCredentials:
    creds = tls.channel_credentials()
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def channel(address: str, token: str | None, tls: Tls | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel that presents `token` on every call: over TLS as call credentials,
    in plaintext as the same metadata."""
    if tls is not None:
        return grpc.secure_channel(address, _credentials(token, tls), options=list(options))
    plain = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(plain, _Bearer(token)) if token else plain


def aio_channel(address: str, token: str | None, tls: Tls | None,
                options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """The asyncio twin of `channel`."""
    if tls is not None:
        return grpc.aio.secure_channel(address, _credentials(token, tls), options=list(options))
    return grpc.aio.insecure_channel(address, options=list(options),
                                     interceptors=[kind(token) for kind in _AIO_BEARERS] if token else None)


@dataclass(frozen=True)
class ClientCredentials:
    """What a client presents to a JobManager: the client token (None: none found) and TLS
    (None: plaintext), with where they came from for error messages."""

    token: str | None = None
    tls: Tls | None = None
    source: str = ""  # "token from ...", "no token found (looked in ...)"

    @classmethod
    def discover(cls, *, token_file: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, cluster_dir: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> "ClientCredentials":
        """Explicit files win; then $FUNKE_TOKEN_FILE and $FUNKE_TLS_CA / _CERT / _KEY; then the
        cluster directory's (`cluster_dir`, else $FUNKE_CLUSTER_DIR, else ~/.funke/cluster):
        security/client.token, and security/tls/ if the cluster runs with TLS. Raises
        SecurityError for a file named explicitly that cannot be used."""
        env = os.environ if environ is None else environ
        folder = (Path(cluster_dir).expanduser() if cluster_dir is not None else default_cluster_dir(env)) / SECURITY_DIR
        token: str | None = None
        named = token_file or env.get("FUNKE_TOKEN_FILE")
        if named:
            token, source = read_token(named, "token file"), f"the token in {named}"
        elif (folder / CLIENT_TOKEN).exists():
            token, source = read_token(folder / CLIENT_TOKEN, "token file"), f"the token in {folder / CLIENT_TOKEN}"
        else:
            source = (f"no token (none in {folder / CLIENT_TOKEN}; give --token-file or set FUNKE_TOKEN_FILE, "
                      "or FUNKE_CLUSTER_DIR to the cluster's directory)")
        ca = tls_ca or env.get("FUNKE_TLS_CA")
        cert = tls_cert or env.get("FUNKE_TLS_CERT")
        key = tls_key or env.get("FUNKE_TLS_KEY")
        tls_folder = folder / TLS_DIR
        if not ca and (tls_folder / CA_CERT).exists():
            ca = str(tls_folder / CA_CERT)
            if not cert and (tls_folder / CLIENT_CERT).exists():
                cert, key = str(tls_folder / CLIENT_CERT), str(tls_folder / CLIENT_KEY)
        if (cert is None) != (key is None):
            raise SecurityError("a client certificate needs its private key, and a key its certificate "
                                "(--tls-cert with --tls-key, or FUNKE_TLS_CERT with FUNKE_TLS_KEY)")
        if cert and not ca:
            raise SecurityError("a client certificate is only used with TLS: give the cluster's CA too "
                                "(--tls-ca or FUNKE_TLS_CA)")
        tls = Tls.from_files(ca, cert, key) if ca else None
        return cls(token=token, tls=tls, source=source)

    @classmethod
    def for_cluster(cls, cluster_dir: str | os.PathLike[str]) -> "ClientCredentials":
        """The credentials kept in a cluster directory (whatever the environment says)."""
        return cls.discover(cluster_dir=cluster_dir, environ={})

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        return channel(address, self.token, self.tls, options)
