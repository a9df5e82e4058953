"""Prometheus metrics of a funke process (Flink's PrometheusReporter: `metrics.reporter.prom.*`),
served by aiohttp on the process's own event loop: a scrape runs the collectors there, so they
read the process's state from the loop that owns it, never from another thread.

Metric names are Flink's, under a `funke_` prefix and the process's scope (`funke_jobmanager_…`,
`funke_taskmanager_job_task_…`); the process basics are prometheus_client's standard `process_*`
metrics. The endpoint holds no secrets and takes no input; it binds loopback unless configured
otherwise, and off loopback it needs TLS (served with the processes' certificate) or --insecure,
as the gRPC ports do."""

from __future__ import annotations

import logging
import os
import ssl
import tempfile

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from funke.runtime import security

log = logging.getLogger("funke.metrics")


def registry_with(*collectors: Collector) -> CollectorRegistry:
    """A registry of `collectors` and the process basics."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def ssl_context(tls: security.Tls | None) -> ssl.SSLContext | None:
    """A server-side context from PEM material (no client certificate asked for)."""
    if tls is None or tls.certificate is None or tls.key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # ssl loads a chain from files only: the PEMs go to a private temporary directory for it.
    with tempfile.TemporaryDirectory(prefix="funke-tls-") as folder:
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in ((cert, tls.certificate), (key, tls.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    return context


async def bind(runner: web.AppRunner, host: str, ports: range, context: ssl.SSLContext | None, what: str) -> int:
    """Start `runner` on the first free port of `ports` (0: any); returns the port. Raises
    OSError naming `what` when none is free."""
    last: OSError | None = None
    for port in ports:
        site = web.TCPSite(runner, host, port, ssl_context=context, reuse_address=False)
        try:
            await site.start()
        except OSError as exc:
            last = exc
            continue
        server = site._server  # aiohttp keeps the asyncio server here; port 0 is resolved from it
        sockets = getattr(server, "sockets", None)
        return sockets[0].getsockname()[1] if sockets else port
    raise OSError(f"no free port for {what} in {ports.start}-{ports.stop - 1} on {host}: {last}")


async def serve(app: web.Application, host: str, ports: range, tls: security.Tls | None,
                what: str) -> tuple[web.AppRunner, int]:
    """Serve `app` (HTTPS with `tls`) on the first free port of `ports`: (its runner, the port).
    Raises OSError naming `what` when none is free."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        return runner, await bind(runner, host, ports, ssl_context(tls), what)
    except OSError:
        await runner.cleanup()
        raise


class MetricsServer:
    """GET /metrics in Prometheus' text format, from `registry`."""

    def __init__(self, registry: CollectorRegistry, tls: security.Tls | None = None) -> None:
        self.registry = registry
        self._tls = tls
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, ports: range) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics, allow_head=False)
        self._runner, self.port = await serve(app, host, ports, self._tls, "the Prometheus metrics")
        return self.port

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            body = generate_latest(self.registry)
        except Exception:  # a collector's bug: a failed scrape, never a dead process
            log.exception("collecting metrics failed")
            return web.Response(status=500, text="collecting metrics failed (see the process's log)\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
