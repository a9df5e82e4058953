"""Who may call what, decided without I/O: which secret each gRPC service asks for, how a
presented bearer token is checked, when a process may serve without TLS, and how many WatchJob
streams one client may hold.

Three secrets guard a cluster, one per kind of caller:

- the **client token**: users and tools (the `funke` CLI, the SDK) on the JobManager service;
- the **cluster token**: TaskManagers on the ResourceManager and JobMaster services (a client
  token cannot register a TaskManager and so receive other users' functions and data paths);
- a TaskManager's **registration token**: a fresh random value it sends with each registration;
  the JobManager presents it on every call to that TaskManager's TaskExecutor service, so the
  TaskManager obeys only the JobManager it is registered with now (another TaskManager does not
  know it, and a deposed leader holds the previous one: the token is also the fencing token).

Health checks stay open: load balancers and launchers probe them before they hold any secret.
The sockets, files and interceptors that apply these rules are in `funke.runtime.security`.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BEARER = "bearer "
AUTHORIZATION = "authorization"  # gRPC metadata keys are lower case
TOKEN_BYTES = 32  # of randomness in a generated secret (256 bits; hex encoded in files)
MAX_TOKEN_LENGTH = 4096  # what a server reads of a presented token before refusing it


class Realm(enum.Enum):
    OPEN = "open"  # anyone (health checks)
    CLIENT = "client"  # the client token
    CLUSTER = "cluster"  # the cluster token
    REGISTRATION = "registration"  # the JobManager's registration token (calls to a TaskManager)


# One table for the whole cluster: the gRPC service (the first part of a method's full name)
# and the secret it asks for. A service not listed asks for any token the server knows; the
# caller then learns it does not exist only once it has authenticated.
SERVICE_REALMS: Mapping[str, Realm] = {
    "grpc.health.v1.Health": Realm.OPEN,
    "funke.v1.JobManager": Realm.CLIENT,
    "grpc.reflection.v1alpha.ServerReflection": Realm.CLIENT,
    "grpc.reflection.v1.ServerReflection": Realm.CLIENT,
    "funke.v1.ResourceManager": Realm.CLUSTER,
    "funke.v1.JobMaster": Realm.CLUSTER,
    "funke.v1.TaskExecutor": Realm.REGISTRATION,
}


def realm_of(method: str) -> Realm | None:
    """The realm of a full method name ("/funke.v1.JobManager/SubmitJob"); None: unknown."""
    service = method.lstrip("/").partition("/")[0]
    return SERVICE_REALMS.get(service)


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of the first `authorization: Bearer <token>` entry; None: none, or not a
    bearer token, or longer than anything funke generates or accepts."""
    for key, value in metadata:
        if key.lower() != AUTHORIZATION:
            continue
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return None
        if len(value) > MAX_TOKEN_LENGTH + len(BEARER) or value[:len(BEARER)].lower() != BEARER:
            return None
        return value[len(BEARER):].strip() or None
    return None


def token_matches(presented: str | None, expected: Iterable[str]) -> bool:
    """Whether `presented` equals one of `expected`, comparing in constant time (each
    comparison takes as long whatever the first differing byte). Every expected token is
    compared, so the time says nothing about which one matched either."""
    if presented is None:
        return False
    given = presented.encode("utf-8", "surrogatepass")
    matched = False
    for token in expected:
        if token and hmac.compare_digest(given, token.encode("utf-8", "surrogatepass")):
            matched = True
    return matched


def token_problem(text: str, source: str) -> str | None:
    """What makes `text` (a token file's content, stripped) unusable, or None."""
    if not text:
        return f"{source} is empty"
    if len(text) < 16:
        return f"{source} holds a token of {len(text)} characters; at least 16 are needed"
    if len(text) > MAX_TOKEN_LENGTH:
        return f"{source} holds a token of {len(text):,} characters; at most {MAX_TOKEN_LENGTH:,} are accepted"
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        return f"{source} must hold one line of printable ASCII without spaces"
    return None


# ---------------------------------------------------------------------------------------
# Serving without TLS
# ---------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server reachable from this machine only."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, or a wildcard ("0.0.0.0", "::", ""): other machines may reach it


def plaintext_problem(process: str, host: str, tls: bool, insecure: bool) -> str | None:
    """Why `process` must not serve on `host`, or None. Off loopback, tokens and pickled
    functions would cross the network in the clear; that takes TLS or an explicit --insecure."""
    if tls or insecure or is_loopback(host):
        return None
    return (f"{process}: refusing to serve on {host or '0.0.0.0'} without TLS: other machines could "
            "read its tokens, jobs and data on the wire. Enable TLS (security.ssl.enabled: true with "
            "security.ssl.certificate, .key and .ca-certificate; `funke cluster start --tls` makes a "
            "certificate authority for one machine), or pass --insecure on a network you trust")


# ---------------------------------------------------------------------------------------
# WatchJob streams
# ---------------------------------------------------------------------------------------


@dataclass
class StreamQuota:
    """Open streams per client and in all, each under its limit. A client is what the server
    can tell callers apart by (its peer host). `acquire` says why not, or None (then counted
    until `release`)."""

    per_client: int
    total: int

    def __post_init__(self) -> None:
        self._open: Counter[str] = Counter()

    def acquire(self, client: str, what: str = "WatchJob streams") -> str | None:
        if self._open[client] >= self.per_client:
            return (f"{client} already holds {self._open[client]} open {what}; at most {self.per_client} "
                    "per client are allowed (close some, or raise jobmanager.watch.max-streams-per-client)")
        if sum(self._open.values()) >= self.total:
            return (f"the JobManager already serves {self.total} open {what}, its limit "
                    "(jobmanager.watch.max-streams)")
        self._open[client] += 1
        return None

    def release(self, client: str) -> None:
        self._open[client] -= 1
        if self._open[client] <= 0:
            del self._open[client]

    def open_streams(self, client: str | None = None) -> int:
        return self._open[client] if client is not None else sum(self._open.values())


def peer_host(peer: str) -> str | None:
    """The IP of a gRPC peer string ("ipv4:10.0.0.3:5123", "ipv6:[::1]:5123"), else None."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host.strip("[]") or None
    return None


def client_of(peer: str) -> str:
    """Whom a WatchJob quota counts a call against: its peer's host ("ipv4:10.0.0.7:51234" ->
    "10.0.0.7"), or the whole peer string when it names no host ("unix:/path")."""
    return peer_host(peer) or peer
