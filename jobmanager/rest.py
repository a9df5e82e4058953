"""The JobManager's REST API and web dashboard (Flink's port 8081), served by aiohttp on the
JobManager's own event loop, reading the same state the gRPC API reads (the Dispatcher's jobs,
archives and cluster overview; the JSON is made in `funke.jobmanager.restviews`).

    GET   /overview  /config  /taskmanagers  /taskmanagers/{tm}
    GET   /jobs  /jobs/overview  /jobs/{jid}  /jobs/{jid}/plan  /jobs/{jid}/exceptions
    GET   /jobs/{jid}/vertices/{vid}  /jobs/{jid}/vertices/{vid}/subtasktimes
    GET   /jobs/{jid}/vertices/{vid}/metrics[?get=id,...]    Flink's metric identifiers, or their values
    GET   /jobs/{jid}/vertices/{vid}/subtasks/{i}/attempts/{a}  /jobs/{jid}/subtasktimes
    GET   /jobs/{jid}/batches  /jobs/{jid}/progress          (streaming queries)
    PATCH /jobs/{jid}?mode=cancel                             202
    POST  /jobs/{jid}/stop   {"drain": false}                 202 (streaming queries)
    GET   /  /web/{module}.js  /web/style.css                 the dashboard (no data in them)
    POST  /login {"token": ...}; GET /?token=...              a session cookie for browsers

Every data endpoint asks for the cluster's client token, as the gRPC API does: `Authorization:
Bearer <token>`, or the `funke_token` cookie a browser gets from /login (HttpOnly,
SameSite=Strict; a cancel or stop by cookie must also come from this origin). Errors are
Flink's `{"errors": [...]}`. No endpoint reads a file the request names, and job submission
stays on gRPC. With TLS configured the API is served over HTTPS with the processes'
certificate (no client certificate asked: the token authenticates)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from aiohttp import web

from funke.common.graph.jobgraph import MAX_PARALLELISM_LIMIT
from funke.common.security import token_matches
from funke.runtime import security
from funke.runtime.metricsserver import serve
from funke.jobmanager import restviews
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError
from funke.jobmanager.jobstore import ArchivedJob

log = logging.getLogger("funke.rest")

COOKIE = "funke_token"
MAX_BODY_BYTES = 64 * 1024
_HTTP_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 409, "UNAVAILABLE": 503,
                "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429}

Current = Callable[[], Dispatcher]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"errors": [message]}, status=status)


def _asset(name: str) -> bytes:
    return resources.files("funke.jobmanager").joinpath("web", name).read_bytes()


def _static_assets() -> dict[str, str]:
    """The dashboard's files a request may name, with their content types: the style sheet and
    every script in web/ (app.js and the ES modules it imports), listed once at import: no path
    from a request reaches the filesystem."""
    types = {".js": "application/javascript", ".css": "text/css"}
    web = resources.files("funke.jobmanager").joinpath("web")
    return {f.name: kind for f in web.iterdir() if (kind := types.get(PurePosixPath(f.name).suffix))}


_STATIC = _static_assets()
_PUBLIC = {"/", "/login", "/favicon.ico", *(f"/web/{name}" for name in _STATIC)}


class RestServer:
    """The REST API and dashboard of one JobManager process. `current()` gives the Dispatcher
    that serves now (raising DispatcherError UNAVAILABLE on a standby)."""

    def __init__(self, current: Current, client_token: str, tls: security.Tls | None = None,
                 version: str = "funke", refresh_interval_ms: int = 1000) -> None:
        self._current = current
        self._token = client_token
        self._tls = tls
        self._version = version
        self._refresh_ms = refresh_interval_ms
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.metrics_url = ""  # the JobManager's Prometheus endpoint, told in /overview
        self.app = self._build()

    # ---- lifecycle

    async def start(self, host: str, ports: range) -> int:
        """Serve on the first free port of `ports` (Flink's rest.bind-port range); returns it.
        Raises OSError when none is free."""
        self._runner, self.port = await serve(self.app, host, ports, self._tls, "the REST API")
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    # ---- the application

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._authenticate], client_max_size=MAX_BODY_BYTES)
        get = [
            ("/", self.index), ("/web/{name}", self.static), ("/config", self.config),
            ("/overview", self.overview), ("/taskmanagers", self.taskmanagers),
            ("/taskmanagers/{tm}", self.taskmanager), ("/jobs", self.jobs), ("/jobs/overview", self.jobs_overview),
            ("/jobs/{jid}", self.job), ("/jobs/{jid}/plan", self.plan), ("/jobs/{jid}/exceptions", self.exceptions),
            ("/jobs/{jid}/subtasktimes", self.job_subtask_times), ("/jobs/{jid}/vertices/{vid}", self.vertex),
            ("/jobs/{jid}/vertices/{vid}/subtasktimes", self.vertex_subtask_times),
            ("/jobs/{jid}/vertices/{vid}/metrics", self.vertex_metrics),
            ("/jobs/{jid}/vertices/{vid}/subtasks/{index}/attempts/{attempt}", self.attempt),
            ("/jobs/{jid}/batches", self.batches), ("/jobs/{jid}/progress", self.progress),
        ]
        for path, handler in get:
            app.router.add_get(path, handler, allow_head=False)
        app.router.add_patch("/jobs/{jid}", self.cancel)
        app.router.add_post("/jobs/{jid}/stop", self.stop_job)
        app.router.add_post("/jobs/{jid}/rescale", self.rescale_job)
        app.router.add_post("/login", self.login)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        try:
            return await handler(request)
        except DispatcherError as exc:
            return _error(_HTTP_STATUS.get(exc.code, 500), str(exc))
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.content_type != "application/json":
                return _error(exc.status, exc.reason)
            raise
        except Exception:  # a bug here must not take the JobManager's loop down, nor leak internals
            log.exception("REST %s %s failed", request.method, request.path)
            return _error(500, "internal error (the JobManager's log has the details)")

    @web.middleware
    async def _authenticate(self, request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.path in _PUBLIC:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        bearer = security.bearer_token([("authorization", header)]) if header else None
        cookie = request.cookies.get(COOKIE)
        if token_matches(bearer, [self._token]):
            return await handler(request)
        if token_matches(cookie, [self._token]):
            if request.method not in ("GET", "HEAD") and not self._same_origin(request):
                return _error(403, "a change by cookie must come from the dashboard's own origin")
            return await handler(request)
        what = "no token was presented" if bearer is None and cookie is None else "the token presented is not valid here"
        return _error(401, f"this API needs the cluster's client token (Authorization: Bearer <token>, or log in "
                      f"at /): {what}")

    def _same_origin(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        return origin is None or origin == f"{self.scheme}://{request.host}"

    def _dispatcher(self) -> Dispatcher:
        return self._current()

    # ---- the dashboard and logging in

    async def index(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        if token is not None:  # the link `funke cluster start` prints: trade it for a cookie
            if not token_matches(token, [self._token]):
                return _error(401, "the token in the link is not this cluster's client token")
            response = web.HTTPSeeOther("/")
            self._set_cookie(response)
            return response
        return web.Response(body=_asset("index.html"), content_type="text/html",
                            headers={"Cache-Control": "no-cache", "X-Frame-Options": "DENY",
                                     "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                                "img-src 'self' data:"})

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _STATIC:  # a fixed list: no path from a request reaches the filesystem
            return _error(404, "no such asset")
        return web.Response(body=_asset(name), content_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

    async def login(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, 'expected {"token": "..."}')
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token_matches(token.strip(), [self._token]):
            return _error(401, "that is not this cluster's client token")
        response = web.Response(status=204)
        self._set_cookie(response)
        return response

    def _set_cookie(self, response: web.StreamResponse) -> None:
        response.set_cookie(COOKIE, self._token, httponly=True, samesite="Strict", path="/",
                            secure=self._tls is not None)

    # ---- the cluster

    async def config(self, request: web.Request) -> web.Response:
        offset = -time.timezone * 1000
        return web.json_response({"refresh-interval": self._refresh_ms, "timezone-name": time.tzname[0],
                                  "timezone-offset": offset, "flink-version": self._version, "flink-revision": "",
                                  "features": {"web-submit": False, "web-cancel": True, "web-history": False}})

    async def overview(self, request: web.Request) -> web.Response:
        body = restviews.overview(self._dispatcher().cluster_overview(), self._version)
        body["metrics"] = self.metrics_url
        return web.json_response(body)

    async def taskmanagers(self, request: web.Request) -> web.Response:
        return web.json_response(restviews.taskmanagers(self._dispatcher().cluster_overview(), _now_ms()))

    async def taskmanager(self, request: web.Request) -> web.Response:
        tm_id = request.match_info["tm"]
        for tm in self._dispatcher().cluster_overview().task_managers:
            if tm.id == tm_id:
                return web.json_response(restviews.taskmanager(tm, _now_ms()))
        return _error(404, f"no TaskManager {tm_id!r} is registered"[:300])

    # ---- jobs

    async def jobs(self, request: web.Request) -> web.Response:
        return web.json_response(restviews.jobs(self._dispatcher().summaries()))

    async def jobs_overview(self, request: web.Request) -> web.Response:
        return web.json_response(restviews.jobs_overview(self._dispatcher().summaries(), _now_ms()))

    def _details(self, request: web.Request) -> tuple[Any, Any]:
        job = self._dispatcher().job(request.match_info["jid"])
        return job, job.details()

    def _locations(self) -> dict[str, str]:
        return {tm.id: tm.address for tm in self._dispatcher().cluster_overview().task_managers}

    async def job(self, request: web.Request) -> web.Response:
        job, details = self._details(request)
        stoppable = not isinstance(job, ArchivedJob) and getattr(job, "query", None) is not None \
            and not job.status.is_terminal
        return web.json_response(restviews.job(details, _now_ms(), stoppable))

    async def plan(self, request: web.Request) -> web.Response:
        return web.json_response({"plan": restviews.plan(self._details(request)[1])})

    async def exceptions(self, request: web.Request) -> web.Response:
        return web.json_response(restviews.exceptions(self._details(request)[1], self._locations()))

    async def job_subtask_times(self, request: web.Request) -> web.Response:
        return web.json_response(restviews.job_subtask_times(self._details(request)[1], _now_ms()))

    def _vertex(self, details: Any, request: web.Request) -> Any:
        vid = request.match_info["vid"]
        for v in details.vertices:
            if v.id == vid:
                return v
        raise DispatcherError("NOT_FOUND", f"job {details.job_id} has no vertex {vid!r}"[:300])

    async def vertex(self, request: web.Request) -> web.Response:
        _, details = self._details(request)
        return web.json_response(restviews.vertex(details, self._vertex(details, request), self._locations(), _now_ms()))

    async def vertex_subtask_times(self, request: web.Request) -> web.Response:
        _, details = self._details(request)
        return web.json_response(restviews.vertex_subtask_times(self._vertex(details, request), self._locations(),
                                                                _now_ms()))

    async def vertex_metrics(self, request: web.Request) -> web.Response:
        """Flink's vertex metrics: without `get`, the identifiers there are ([{"id": ...}]);
        with `get=a,b`, those of them there are with their values ([{"id": ..., "value": ...}])."""
        asked = request.query.get("get")
        if asked is not None and len(asked) > restviews.MAX_METRICS_ASKED:
            return _error(400, f"get names at most {restviews.MAX_METRICS_ASKED} characters of metric identifiers")
        _, details = self._details(request)
        metrics = restviews.vertex_metrics(self._vertex(details, request))
        if asked is None:
            return web.json_response([{"id": name} for name in metrics])
        wanted = dict.fromkeys(name.strip() for name in asked.split(","))
        return web.json_response([{"id": name, "value": metrics[name]} for name in wanted if name in metrics])

    async def attempt(self, request: web.Request) -> web.Response:
        _, details = self._details(request)
        v = self._vertex(details, request)
        index, number = request.match_info["index"], request.match_info["attempt"]
        if not (index.isdigit() and number.isdigit() and len(index) < 10 and len(number) < 10):
            return _error(400, "subtask and attempt are numbers")
        found = restviews.find_attempt(v, int(index), int(number))
        if found is None:
            return _error(404, f"vertex {v.id} has no attempt {number} of subtask {index}")
        sub, execution = found
        return web.json_response(restviews.attempt(v, sub, execution, self._locations(), _now_ms()))

    async def progress(self, request: web.Request) -> web.Response:
        progress = self._dispatcher().query_progress(request.match_info["jid"])
        return web.json_response({"id": progress.query_id, "progress": [json.loads(p) for p in progress.progress_json]})

    async def batches(self, request: web.Request) -> web.Response:
        progress = self._dispatcher().query_progress(request.match_info["jid"])
        return web.json_response(restviews.batches(progress.progress_json))

    async def cancel(self, request: web.Request) -> web.Response:
        if request.query.get("mode", "cancel") != "cancel":
            return _error(400, "mode must be 'cancel' (a streaming query stops with POST /jobs/{jid}/stop)")
        self._dispatcher().cancel(request.match_info["jid"])
        return web.json_response({}, status=202)

    async def rescale_job(self, request: web.Request) -> web.Response:
        """{"parallelism": N, "vertices": [...] (optional)} -> 202 with what happens (Flink's
        /jobs/:jobid/rescaling, here live: at a batch boundary, under the same job id)."""
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        parallelism = body.get("parallelism") if isinstance(body, dict) else None
        vertices = body.get("vertices", []) if isinstance(body, dict) else None
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_PARALLELISM_LIMIT \
                or not isinstance(vertices, list) or len(vertices) > 1000 \
                or not all(isinstance(v, str) and 0 < len(v) <= 256 for v in vertices):
            return _error(400, f'expected {{"parallelism": 1..{MAX_PARALLELISM_LIMIT}, "vertices": [vertex ids] '
                               '(optional)}')
        answer = await self._dispatcher().rescale(request.match_info["jid"], parallelism, vertices, 60.0)
        return web.json_response({"message": answer.message, "parallelism": dict(answer.parallelism),
                                  "lastBatchId": answer.last_batch_id}, status=202)

    async def stop_job(self, request: web.Request) -> web.Response:
        drain = False
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                return _error(400, 'expected {"drain": true|false}')
            drain = bool(body.get("drain", False)) if isinstance(body, dict) else False
        status, message = self._dispatcher().stop_query(request.match_info["jid"], drain, 60.0)
        return web.json_response({"status": status.value, "message": message}, status=202)
