"""`funke jobmanager`: the JobManager process (dispatcher, resource manager, job masters) on one
asyncio event loop, serving the client API, the TaskManager protocol and gRPC health."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.common.configuration import (
    ClusterConfiguration,
    ConfigurationError,
    parse_configuration,
    parse_key_values,
    parse_config_lines,
)
from funke.deploy.rpc import MESSAGE_SIZE_OPTIONS, add_service
from funke.jobmanager import datadir
from funke.jobmanager.dispatcher import Dispatcher
from funke.jobmanager.services import JobManagerService, JobMasterService, ResourceManagerService
from funke.v1 import cluster_pb2, jobmanager_pb2

log = logging.getLogger("funke.jobmanager")

DEFAULT_PORT = 6123  # Flink's JobManager RPC port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="funke jobmanager", description="Run a funke JobManager.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind; 0 picks a free one")
    p.add_argument("--data-dir", help="where result partitions and collected results live (any Spark URI)")
    p.add_argument("--config", help="a file of 'key: value' lines (Flink's flink-conf.yaml keys)")
    p.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                   help="a configuration entry, e.g. -D restart-strategy.type=fixed-delay")
    p.add_argument("--address-file", help="write host:port here once serving (used by launchers)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def build_configuration(args: argparse.Namespace) -> ClusterConfiguration:
    entries: dict[str, str] = {}
    if args.config:
        try:
            text = Path(args.config).read_text()
        except OSError as exc:
            raise ConfigurationError([f"cannot read {args.config}: {exc.strerror or exc}"]) from None
        entries.update(parse_config_lines(text, args.config))
    entries.update(parse_key_values(args.dynamic))
    config = parse_configuration(entries)
    data_dir = args.data_dir or config.data_dir or str(Path.home() / ".funke" / "data")
    if "://" not in data_dir:
        data_dir = os.path.abspath(data_dir)
        os.makedirs(data_dir, exist_ok=True)
    return parse_configuration({}, base=ClusterConfiguration(**{**_fields(config), "data_dir": data_dir}))


def _fields(config: ClusterConfiguration) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


async def serve(args: argparse.Namespace, config: ClusterConfiguration) -> None:
    dispatcher = Dispatcher(config)
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    services = jobmanager_pb2.DESCRIPTOR.services_by_name, cluster_pb2.DESCRIPTOR.services_by_name
    add_service(server, JobManagerService(dispatcher), services[0]["JobManager"])
    add_service(server, ResourceManagerService(dispatcher), services[1]["ResourceManager"])
    add_service(server, JobMasterService(dispatcher), services[1]["JobMaster"])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        raise SystemExit(f"cannot bind {args.host}:{args.port}")
    await server.start()
    dispatcher.start()
    # Everything loaded so far lives as long as the process: keep the collector from rescanning
    # it in every full collection (which a job of 20 000 tasks would otherwise trigger often).
    gc.freeze()
    address = f"{args.host}:{port}"
    for service in ("", "funke.v1.JobManager", "funke.v1.ResourceManager", "funke.v1.JobMaster"):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    if args.address_file:
        tmp = f"{args.address_file}.tmp"
        Path(tmp).write_text(address)
        os.replace(tmp, args.address_file)
    log.info("JobManager listening on %s, data dir %s", address, config.data_dir)
    print(f"JobManager listening on {address}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("JobManager shutting down")
    await health_servicer.enter_graceful_shutdown()
    await dispatcher.stop()
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
    if config.ha_enabled:
        # The HA services exist (funke.deploy.hafilesystem); the JobManager does not contend or
        # recover through them yet. Refusing beats running without the availability asked for.
        print(f"high-availability: {config.high_availability} is not available in this JobManager yet; "
              "run without it (high-availability: none)", file=sys.stderr)
        return 2
    try:
        # Before serving: no job may start while an earlier JobManager's leftovers are swept.
        claim = datadir.claim(config.data_dir)
    except datadir.DataDirInUse as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, config))
    finally:
        claim.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
