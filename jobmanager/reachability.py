"""Can the JobManager reach a TaskManager at the address it registered?

A TaskManager on another host that binds 127.0.0.1 (the default) or advertises a name that
resolves to loopback heartbeats happily — it dials the JobManager, not the other way round — but
every deployment to it fails. So registration checks the address before any slot is offered:

- an address on loopback from a peer that is not on loopback is refused outright (the
  JobManager would dial itself);
- otherwise the JobManager dials it: one gRPC health check with a short deadline. Any answer,
  even "unknown service", proves reachability; no connection refuses the registration.

The gateway uses the same probe when a deployment finds the TaskManager unreachable: if the
probe fails too, the TaskManager is marked lost at once (its slots are not offered again) instead
of every job failing its deployments there until the heartbeat times out."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funke.common import ids
from funke.common.security import is_loopback, peer_host
from funke.runtime import security

__all__ = ["is_loopback", "loopback_problem", "peer_host", "registration_problem", "unreachable"]

DEFAULT_PROBE_TIMEOUT_S = 5.0
_NO_CONNECTION = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def loopback_problem(task_manager_id: str, address: str, peer: str | None) -> str | None:
    host = address.rpartition(":")[0]
    if peer is not None and is_loopback(host) and not is_loopback(peer):
        return (f"TaskManager {ids.echo(task_manager_id)} registered the loopback address {ids.echo(address)} "
                f"but connects from {peer}: the JobManager cannot dial it there. Start it with --host set to "
                "an address the JobManager can reach (or --host 0.0.0.0), or --advertise-host")
    return None


async def unreachable(address: str, timeout_s: float, tls: security.Tls | None = None) -> str | None:
    """None when something answers gRPC at `address` within `timeout_s` (over TLS, if given:
    then only a server whose certificate the cluster's CA signed counts); else why not."""
    channel = security.aio_channel(address, None, tls)
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        return None
    except grpc.aio.AioRpcError as e:
        if e.code() in _NO_CONNECTION:
            return f"{e.code().name}: {e.details()}"
        return None  # it answered, if only to say no
    finally:
        await channel.close()


async def registration_problem(task_manager_id: str, address: str, peer: str, timeout_s: float,
                               tls: security.Tls | None = None) -> str | None:
    """Why the JobManager will not take a TaskManager at `address`, or None."""
    host = peer_host(peer)
    problem = loopback_problem(task_manager_id, address, host)
    if problem is not None:
        return problem
    why = await unreachable(address, timeout_s, tls)
    if why is not None:
        return (f"the JobManager cannot reach TaskManager {ids.echo(task_manager_id)} at {ids.echo(address)} "
                f"({why}){f'; it connects from {host}' if host else ''}. Start it with --host set to an address "
                "the JobManager can reach, or --advertise-host when it is behind NAT or in a container")
    return None
