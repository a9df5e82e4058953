"""`funke jobmanager`: the JobManager process (dispatcher, resource manager, job masters) on one
asyncio event loop, serving the client API, the TaskManager protocol and gRPC health.

Without high availability the process leads from the start, alone on its data directory (which
it locks). With it (`high-availability: filesystem` or `zookeeper`) it is a contender: it serves at once, as a
standby whose every call is answered UNAVAILABLE with the leader's address, until it is granted
leadership; then a Dispatcher of that epoch recovers the stored jobs and serves. Losing
leadership suspends its jobs and makes it a standby again; SIGTERM suspends them, records it and
releases the lease, so a standby takes over at once."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from funke.common.configuration import ClusterConfiguration, ConfigurationError, bind_host, parse_configuration
from funke.runtime import datafs, owner
from funke.runtime.configfile import load_configuration
from funke.common.security import Realm, StreamQuota
from funke.runtime import security
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS, STANDBY_PREFIX, add_service, advertised_host, host_port
from funke.jobmanager import datadir
from funke.runtime.haservices import ha_services
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError
from funke.jobmanager.highavailability import LeaderElection
from funke.runtime.metricsserver import MetricsServer, registry_with
from funke.jobmanager.metrics import JobManagerCollector
from funke.jobmanager.rest import RestServer
from funke.jobmanager.services import JobManagerService, JobMasterService, ResourceManagerService
from funke.v1 import cluster_pb2, jobmanager_pb2

log = logging.getLogger("funke.jobmanager")

DEFAULT_PORT = 6123  # Flink's JobManager RPC port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="funke jobmanager", description="Run a funke JobManager.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--advertise-host", default=None, metavar="HOST",
                   help="the address TaskManagers and clients are told (the address file, the HA lease) when it "
                   "is not --host; with --host 0.0.0.0 and no --advertise-host: this machine's address on its "
                   "default route")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind; 0 picks a free one")
    p.add_argument("--data-dir", help="where result partitions and collected results live (any Spark URI)")
    p.add_argument("--config", help="a file of 'key: value' lines (Flink's flink-conf.yaml keys)")
    p.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                   help="a configuration entry, e.g. -D restart-strategy.type=fixed-delay")
    p.add_argument("--address-file", help="write host:port here once serving (used by launchers)")
    p.add_argument("--rest-url-file", help="write the web dashboard's URL here once serving (used by launchers)")
    p.add_argument("--insecure", action="store_true",
                   help="serve on an address other machines can reach without TLS (security.insecure); "
                   "tokens, jobs and data then cross the network in the clear")
    p.add_argument("--owner", metavar="PID:START", type=owner.owner_argument,
                   help="stop once this process has ended (an embedded mini cluster's owner: funke.runtime.owner)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("funke")
    except PackageNotFoundError:
        return "dev"


def build_configuration(args: argparse.Namespace) -> ClusterConfiguration:
    config = load_configuration(args.config, args.dynamic)
    data_dir = args.data_dir or config.data_dir or str(Path.home() / ".funke" / "data")
    if "://" not in data_dir:
        data_dir = os.path.abspath(data_dir)
        os.makedirs(data_dir, exist_ok=True)
    return parse_configuration({}, base=ClusterConfiguration(**{**_fields(config), "data_dir": data_dir}))


def _fields(config: ClusterConfiguration) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


class StandbyRefusal(DispatcherError):
    """A standby's answer: UNAVAILABLE, naming the leader as last seen; `looked_up()` names
    it as the HA services say now when that view is stale (a JobManager that was paused)."""

    def __init__(self, election: LeaderElection, where: str | None = None):
        super().__init__("UNAVAILABLE", f"{STANDBY_PREFIX}; "
                         + (where if where is not None else election.describe_leader()))
        self.election = election

    async def looked_up(self) -> DispatcherError:
        return StandbyRefusal(self.election, await self.election.look_up_leader())


class JobManagerRole:
    """Which Dispatcher serves right now: the one Dispatcher without HA; with HA, the one of
    the epoch this process leads, or none (standby)."""

    def __init__(self, config: ClusterConfiguration, health_servicer: health.aio.HealthServicer,
                 tls: security.Tls | None = None):
        self.config = config
        self.health = health_servicer
        self.tls = tls
        self.dispatcher: Dispatcher | None = None
        self.election: LeaderElection | None = None

    def current(self) -> Dispatcher:
        if self.dispatcher is not None:
            return self.dispatcher
        if self.election is None:
            raise DispatcherError("UNAVAILABLE", f"{STANDBY_PREFIX}; it is starting")
        raise StandbyRefusal(self.election)

    async def serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("funke.v1.JobManager", "funke.v1.ResourceManager", "funke.v1.JobMaster"):
            await self.health.set(service, status)

    async def granted(self, epoch: int) -> None:
        assert self.election is not None
        dispatcher = Dispatcher(self.config, ha=self.election.context(epoch), tls=self.tls)
        dispatcher.start()
        await dispatcher.recover()
        if self.election.leading_epoch != epoch:  # lost it again while recovering
            await dispatcher.stop("the JobManager lost leadership while recovering its jobs")
            return
        self.dispatcher = dispatcher
        await self.serving(True)
        print(f"JobManager leads (epoch {epoch})", flush=True)

    async def revoked(self, epoch: int, reason: str) -> None:
        dispatcher, self.dispatcher = self.dispatcher, None
        await self.serving(False)
        if dispatcher is not None:
            await dispatcher.stop(f"the JobManager lost leadership (epoch {epoch}): {reason}")
        print(f"JobManager is a standby (lost epoch {epoch})", flush=True)


@dataclass(frozen=True)
class Secrets:
    """What this JobManager asks callers for, and the TLS it serves and calls with."""

    client_token: str
    cluster_token: str
    tls: security.Tls | None

    def tokens(self, realm: Realm) -> tuple[str, ...]:
        return {Realm.CLIENT: (self.client_token,), Realm.CLUSTER: (self.cluster_token,)}.get(realm, ())


def load_secrets(args: argparse.Namespace, config: ClusterConfiguration) -> Secrets:
    """Raises SecurityError. Token files that do not exist yet are generated (0600)."""
    tls = security.Tls.from_config(config)
    security.check_exposure("the JobManager", args.host, tls, args.insecure or config.insecure)
    security.check_exposure("the JobManager's REST API", bind_host(config.rest_bind_address, args.host), tls,
                            args.insecure or config.insecure)
    security.check_exposure("the JobManager's metrics", bind_host(config.metrics_host, args.host), tls,
                            args.insecure or config.insecure)
    client_file, cluster_file = security.token_files(config)
    client_token, made_client = security.ensure_token(client_file, "client token file")
    cluster_token, made_cluster = security.ensure_token(cluster_file, "cluster token file")
    if client_token == cluster_token:
        raise security.SecurityError(f"the client token ({client_file}) and the cluster token ({cluster_file}) "
                                     "are the same: a client could then register a TaskManager")
    for path, made, who in ((client_file, made_client, "clients"), (cluster_file, made_cluster, "TaskManagers")):
        log.info("%s the token for %s in %s", "generated" if made else "using", who, path)
    return Secrets(client_token, cluster_token, tls)


async def serve(args: argparse.Namespace, config: ClusterConfiguration, secrets: Secrets) -> None:
    health_servicer = health.aio.HealthServicer()
    role = JobManagerRole(config, health_servicer, secrets.tls)
    authenticator = security.Authenticator("JobManager", secrets.tokens)
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS, interceptors=[authenticator])
    services = jobmanager_pb2.DESCRIPTOR.services_by_name, cluster_pb2.DESCRIPTOR.services_by_name
    watch_quota = StreamQuota(config.watch_streams_per_client, config.watch_streams_total)
    add_service(server, JobManagerService(role.current, watch_quota), services[0]["JobManager"])
    add_service(server, ResourceManagerService(role.current), services[1]["ResourceManager"])
    add_service(server, JobMasterService(role.current), services[1]["JobMaster"])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # Server reflection: grpcurl and similar tools list and call the API (with the client token:
    # grpcurl -H "authorization: Bearer $(cat .../client.token)" ... list).
    reflection.enable_server_reflection((
        services[0]["JobManager"].full_name, services[1]["ResourceManager"].full_name,
        services[1]["JobMaster"].full_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME), server)
    port = security.add_port(server, f"{args.host}:{args.port}", secrets.tls)
    if port == 0:
        raise SystemExit(f"cannot bind {args.host}:{args.port}")
    await server.start()
    host = advertised_host(args.host, args.advertise_host)
    address = host_port(host, port)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    rest = RestServer(role.current, secrets.client_token, secrets.tls, version=f"funke {_version()}")
    # The dashboard, the REST API and the metrics bind where the gRPC service does unless told.
    rest_bind, metrics_bind = bind_host(config.rest_bind_address, args.host), bind_host(config.metrics_host, args.host)
    first, last = config.rest_ports
    try:
        rest_port = await rest.start(rest_bind, range(first, last + 1))
    except OSError as exc:
        await server.stop(None)
        raise SystemExit(f"the REST API: {exc} (rest.bind-port)") from None
    metrics = MetricsServer(registry_with(JobManagerCollector(role.current)), secrets.tls)
    first, last = config.metrics_ports
    try:
        metrics_port = await metrics.start(metrics_bind, range(first, last + 1))
    except OSError as exc:
        await rest.stop()
        await server.stop(None)
        raise SystemExit(f"Prometheus metrics: {exc} (metrics.reporter.prom.port)") from None
    metrics_host = advertised_host(metrics_bind, args.advertise_host)
    metrics_url = f"{metrics.scheme}://{host_port(metrics_host, metrics_port)}/metrics"
    rest.metrics_url = metrics_url
    rest_host = advertised_host(rest_bind, args.advertise_host)
    rest_url = f"{rest.scheme}://{host_port(rest_host, rest_port)}/"
    if config.ha_enabled:
        ha = ha_services(config)
        assert ha is not None
        role.election = LeaderElection(ha, address, role.granted, role.revoked)
        await role.serving(False)
        role.election.start()
    else:
        role.dispatcher = Dispatcher(config, tls=secrets.tls)
        role.dispatcher.start()
        await role.serving(True)
    # Everything loaded so far lives as long as the process: keep the collector from rescanning
    # it in every full collection (which a job of 20 000 tasks would otherwise trigger often).
    gc.freeze()
    for path, text in ((args.rest_url_file, rest_url), (args.address_file, address)):  # the address last:
        if path:  # launchers wait for it
            tmp = f"{path}.tmp"
            Path(tmp).write_text(text)
            os.replace(tmp, path)
    log.info("JobManager: web dashboard and REST API at %s, Prometheus metrics at %s", rest_url, metrics_url)
    log.info("JobManager listening on %s, data dir %s%s", address, config.data_dir,
             f", high availability {config.high_availability} in {config.ha_storage_dir}" if config.ha_enabled else "")
    print(f"JobManager listening on {address}{' (TLS)' if secrets.tls else ''}; web dashboard at {rest_url}",
          flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watching = asyncio.create_task(owner.watch_owner(args.owner, stop.set)) if args.owner else None
    await stop.wait()
    if watching is not None:
        watching.cancel()
    log.info("JobManager shutting down")
    await health_servicer.enter_graceful_shutdown()
    if role.election is not None:
        async def step_down() -> None:
            dispatcher, role.dispatcher = role.dispatcher, None
            if dispatcher is not None:
                await dispatcher.stop("JobManager shut down")
        await role.election.stop(step_down)
    elif role.dispatcher is not None:
        await role.dispatcher.stop()
    await rest.stop()
    await metrics.stop()
    await server.stop(grace=2.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_configuration(args)
    except ConfigurationError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        datafs.check(config.data_dir)
    except datafs.DataDirError as exc:
        print(f"data directory: {exc}", file=sys.stderr)
        return 2
    try:
        secrets = load_secrets(args, config)
    except security.SecurityError as exc:
        print(f"security: {exc}", file=sys.stderr)
        return 2
    if config.ha_enabled:
        # The lease says who acts; the JobManagers of the cluster share the data directory, and
        # the leader sweeps it once it leads.
        try:
            asyncio.run(serve(args, config, secrets))
        except OSError as exc:
            print(f"high availability: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        # Before serving: no job may start while an earlier JobManager's leftovers are swept.
        claim = datadir.claim(config.data_dir)
    except datadir.DataDirInUse as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, config, secrets))
    finally:
        claim.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
