"""The client SDK: talking to a JobManager from Python.

Owns the synchronous gRPC client of the `funke.v1.JobManager` service (`JobManagerClient`), the
errors a caller sees (`FunkeError` and its subclasses, which keep the gRPC status code and the
server's message), and the decoding of collected results (an Arrow IPC stream) into rows. Job
files are loaded by `funke.deploy.jobfile`; presenting jobs to people is `funke.deploy.cli`'s.

    from funke.deploy.client import JobManagerClient
    from funke.deploy.jobfile import load_job_file

The client presents the cluster's client token, and speaks TLS when the cluster does: found
by `ClientCredentials.discover` (--token-file / $FUNKE_TOKEN_FILE, else the cluster
directory's security/ folder), or given as `credentials=`.

    with JobManagerClient("127.0.0.1:6123") as client:
        job_id = client.submit(load_job_file("examples/wordcount.py", []))
        for event in client.watch(job_id):
            ...
        rows = client.result(job_id)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc
from funke.common.graph.jobgraph import JobGraph
from funke.runtime.rpc import MESSAGE_SIZE_OPTIONS, STANDBY_PREFIX
from funke.runtime.security import ClientCredentials, SecurityError
from funke.v1 import job_pb2, jobgraph_pb2, jobmanager_pb2, jobmanager_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DEFAULT_JOBMANAGER",
    "FunkeError",
    "InvalidJobGraph",
    "JobAlreadyExists",
    "ClientCredentials",
    "JobManagerClient",
    "JobManagerConnectionLost",
    "JobManagerUnavailable",
    "JobNotFound",
    "NotAJobManager",
    "NotAuthenticated",
    "SecurityError",
    "StandbyJobManager",
    "execution_state_name",
    "job_status_name",
]

DEFAULT_JOBMANAGER = "127.0.0.1:6123"  # Flink's JobManager RPC port
# The health service name the JobManager sets SERVING once it accepts jobs.
_HEALTH_SERVICE = "funke.v1.JobManager"
_LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")
# How a stream ends when the server process goes away under it.
_CONNECTION_LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                    grpc.StatusCode.INTERNAL})


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class FunkeError(Exception):
    """An error for the user. `code` is the gRPC status code when the JobManager answered with
    one (None for errors found on this side), `details` the server's message."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details or message


class InvalidJobGraph(FunkeError):
    """The JobManager (or the encoder on this side) rejected the job graph; `problems` lists
    every problem, one line each."""

    def __init__(self, message: str, problems: Sequence[str], code: grpc.StatusCode | None = None) -> None:
        super().__init__(message, code)
        self.problems: tuple[str, ...] = tuple(problems)


class JobNotFound(FunkeError):
    """No job with that id (or no such collect sink in it)."""


class JobAlreadyExists(FunkeError):
    """A job id that is already taken was submitted again."""


class JobManagerUnavailable(FunkeError):
    """The JobManager could not be reached, or did not answer in time."""

    def __init__(self, address: str, details: str, code: grpc.StatusCode | None = None, tls_hint: str = "") -> None:
        # gRPC's connection errors can span lines; the user gets one.
        reason = " ".join(details.split()) or "no answer"
        super().__init__(f"cannot reach the JobManager at {address}: {reason}{tls_hint}", code, details)
        self.address = address
        self.tls_hint = tls_hint  # what the failure may mean for TLS ("": nothing TLS-like)


class StandbyJobManager(JobManagerUnavailable):
    """A JobManager answered, as a standby of a high-availability cluster: the cluster runs, its
    leader (named in the message when one is elected) is elsewhere."""

    def __init__(self, address: str, details: str, code: grpc.StatusCode | None = None) -> None:
        reason = " ".join(details.split())
        FunkeError.__init__(self, f"the JobManager at {address} is a standby (high availability): "
                                  f"{reason.removeprefix(STANDBY_PREFIX).lstrip('; ')}", code, details)
        self.address = address
        self.tls_hint = ""


class NotAJobManager(JobManagerUnavailable):
    """Something answers at the address, but it is not a funke JobManager (a TaskManager's port,
    another gRPC server)."""

    def __init__(self, address: str, details: str, code: grpc.StatusCode | None = None) -> None:
        FunkeError.__init__(
            self, f"the server at {address} is not a funke JobManager: it does not offer the funke.v1.JobManager "
                  "service (is this a TaskManager's port? `funke cluster status` shows the JobManager's address)",
            code, details)
        self.address = address


class NotAuthenticated(FunkeError):
    """The JobManager refused the call: this client presented no token, or not the cluster's."""

    def __init__(self, address: str, details: str, credentials: ClientCredentials | None,
                 code: grpc.StatusCode | None = None) -> None:
        used = credentials.source if credentials is not None else "no token"
        super().__init__(f"the JobManager at {address} refused this client: {details}. This client used {used}",
                         code, details)
        self.address = address


class JobManagerConnectionLost(FunkeError):
    """The JobManager went away while a job was being followed: the job's outcome is unknown here."""

    def __init__(self, address: str, job_id: str, details: str, last_status: str = "",
                 code: grpc.StatusCode | None = None) -> None:
        seen = f" (last seen {last_status})" if last_status else ""
        reason = " ".join(details.split()) or "no answer"
        super().__init__(
            f"lost the connection to the JobManager at {address} while following job {job_id}{seen}: {reason}. "
            "The job's outcome is unknown: without high availability a job does not outlive its JobManager "
            "(one that shuts down cleanly suspends its jobs; one that crashed takes them with it). If the "
            f"JobManager is still up, `funke status {job_id}` shows the job", code, details)
        self.address = address
        self.job_id = job_id


def _problems_of(message: str) -> list[str]:
    """The JobManager lists problems as "  - ..." lines under a summary line; a single problem
    comes as the bare message."""
    listed = [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]
    return listed or [message.strip()]


def _tls_hint(details: str, credentials: ClientCredentials | None) -> str:
    """What a failed connection may mean for TLS, judged from gRPC's words for it."""
    text = details.lower()
    tls = credentials.tls if credentials is not None else None
    closed = any(words in text for words in ("socket closed", "connection reset", "end of tcp stream"))
    if tls is not None and ("certificate_verify_failed" in text or "handshake" in text or "ssl" in text):
        return (f" (TLS: the JobManager's certificate is not one the CA this client trusts signed, or it "
                f"does not name this address; the CA: {tls.ca_source or 'given in code'})")
    if tls is not None and closed and tls.certificate is None:
        return (" (TLS: if the cluster runs with mutual TLS, this client needs a certificate its CA signed: "
                "--tls-cert and --tls-key, or FUNKE_TLS_CERT and FUNKE_TLS_KEY)")
    if tls is not None and closed:
        return (" (TLS: if the cluster runs with mutual TLS, it did not take this client's certificate: it "
                "must be signed by the cluster's CA)")
    if tls is None and (closed or "handshake" in text):
        return (" (if the cluster runs with TLS, this client needs its CA: --tls-ca or FUNKE_TLS_CA, or "
                "FUNKE_CLUSTER_DIR naming the cluster's directory)")
    return ""


def _translate(exc: grpc.RpcError, address: str, *, submitting: bool = False,
               credentials: ClientCredentials | None = None) -> FunkeError:
    code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
    details: str = exc.details() or ""  # type: ignore[attr-defined]
    if code is grpc.StatusCode.UNAVAILABLE and details.startswith(STANDBY_PREFIX):
        return StandbyJobManager(address, details, code)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return JobManagerUnavailable(address, details or code.name, code, _tls_hint(details, credentials))
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return NotAuthenticated(address, details, credentials, code)
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return NotAJobManager(address, details or code.name, code)
    if code is grpc.StatusCode.NOT_FOUND:
        return JobNotFound(details, code)
    if code is grpc.StatusCode.ALREADY_EXISTS:
        return JobAlreadyExists(details, code)
    if code is grpc.StatusCode.INVALID_ARGUMENT and submitting:
        return InvalidJobGraph(details, _problems_of(details), code)
    return FunkeError(f"{details} ({code.name})" if details else code.name, code, details)


# --------------------------------------------------------------------------------------------
# Enum names as users read them
# --------------------------------------------------------------------------------------------


def job_status_name(value: int) -> str:
    """JOB_STATUS_RUNNING -> "RUNNING" (unknown numbers are shown, not raised on)."""
    try:
        return job_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_")
    except ValueError:
        return f"UNKNOWN({value})"


def execution_state_name(value: int) -> str:
    """EXECUTION_STATE_RUNNING -> "RUNNING"."""
    try:
        return job_pb2.ExecutionState.Name(value).removeprefix("EXECUTION_STATE_")
    except ValueError:
        return f"UNKNOWN({value})"


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


class JobManagerClient:
    """A synchronous client of one JobManager. `timeout` bounds every unary call in seconds;
    `watch` has no deadline (a job may run for hours).

    With high availability, `leader` looks up the current leader's address (None: none elected
    right now). A call that finds no leader at `address` (the leader died, or it is a standby)
    then follows the leader for up to `failover_timeout` seconds and is made again there, and
    `watch` keeps following a job across a leader change (the new leader's snapshot comes next)."""

    def __init__(self, address: str, timeout: float = 30, *, leader: Callable[[], str | None] | None = None,
                 failover_timeout: float = 60, credentials: ClientCredentials | None = None) -> None:
        """`credentials`: the token and TLS to present; None: `ClientCredentials.discover()`
        (raises SecurityError for a token or certificate file named there that cannot be used)."""
        self.credentials = credentials if credentials is not None else ClientCredentials.discover()
        self.timeout = timeout
        self.failover_timeout = failover_timeout
        self._leader = leader
        self._connect(address)

    def _connect(self, address: str) -> None:
        self.address = address
        options: list[tuple[str, Any]] = list(MESSAGE_SIZE_OPTIONS)
        if address.startswith(_LOOPBACK_HOSTS):
            # An http_proxy in the environment must not capture a loopback connection.
            options.append(("grpc.enable_http_proxy", 0))
        self._channel = self.credentials.channel(address, options)
        self._stub = jobmanager_pb2_grpc.JobManagerStub(self._channel)

    def _follow_leader(self, deadline: float) -> bool:
        """Wait for a leader (until `deadline`, monotonic) and talk to it from now on. False:
        no high availability, or no leader in time."""
        if self._leader is None:
            return False
        while True:
            address = self._leader()
            if address:
                if address != self.address:
                    self._channel.close()
                    self._connect(address)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    # ---- lifecycle ----

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def wait_until_ready(self, timeout: float = 30) -> None:
        """Block until the JobManager's health service reports SERVING, or raise
        JobManagerUnavailable after `timeout` seconds."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        request = health_pb2.HealthCheckRequest(service=_HEALTH_SERVICE)
        deadline = time.monotonic() + timeout
        last = "no answer"
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                # wait_for_ready: a JobManager that is still starting is waited for, not failed.
                response = stub.Check(request, timeout=min(remaining, 5.0), wait_for_ready=True)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise _translate(exc, self.address, credentials=self.credentials) from None
                last = exc.details() or code.name  # type: ignore[attr-defined]
            else:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = f"health status {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}"
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        raise JobManagerUnavailable(self.address, f"not serving after {timeout:g} s ({last})")

    # ---- the JobManager service ----

    def submit(self, job: JobGraph | jobgraph_pb2.JobGraph) -> str:
        """Submit a job; returns its id. Raises InvalidJobGraph listing every problem."""
        if isinstance(job, JobGraph):
            from funke.common.wire.codec import WireError, job_graph_to_proto

            try:
                message = job_graph_to_proto(job)
            except WireError as exc:
                raise InvalidJobGraph(str(exc), exc.problems) from None
        elif isinstance(job, jobgraph_pb2.JobGraph):
            message = job
        else:
            raise TypeError(f"submit() takes a JobGraph or a funke.v1.JobGraph, got {type(job).__name__}")
        if self._leader is not None and not message.job_id:
            # Chosen here, so that submitting again to a new leader cannot start the job twice.
            named = jobgraph_pb2.JobGraph()
            named.CopyFrom(message)
            named.job_id = uuid.uuid4().hex
            message = named
        request = jobmanager_pb2.SubmitJobRequest(job_graph=message)
        deadline = time.monotonic() + self.failover_timeout
        retried = False
        while True:
            try:
                return self._stub.SubmitJob(request, timeout=self.timeout).job_id
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if retried and code == grpc.StatusCode.ALREADY_EXISTS and message.job_id:
                    return message.job_id  # the first try reached the old leader and was stored
                if self._retry(code, deadline):
                    retried = True
                    continue
                raise _translate(exc, self.address, submitting=True, credentials=self.credentials) from None

    def _retry(self, code: grpc.StatusCode, deadline: float) -> bool:
        """After a failed call: whether to call again, at the leader (waited for). UNAVAILABLE:
        no leader here. DEADLINE_EXCEEDED: a leader that hangs (paused, partitioned) is followed
        if another has been elected meanwhile."""
        if self._leader is None or time.monotonic() >= deadline:
            return False
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            address = self._leader()
            return bool(address) and address != self.address and self._follow_leader(deadline)
        if code != grpc.StatusCode.UNAVAILABLE:
            return False
        time.sleep(0.1)
        return self._follow_leader(deadline)

    def list_jobs(self) -> list[job_pb2.JobSummary]:
        response = self._call("ListJobs", jobmanager_pb2.ListJobsRequest())
        return list(response.jobs)

    def get_job(self, job_id: str) -> job_pb2.JobDetails:
        return self._call("GetJob", jobmanager_pb2.GetJobRequest(job_id=job_id))

    def cancel(self, job_id: str) -> str:
        """Request cancellation; returns the job's status right after, e.g. "CANCELLING"."""
        response = self._call("CancelJob", jobmanager_pb2.CancelJobRequest(job_id=job_id))
        return job_status_name(response.status)

    def stop(self, job_id: str, drain: bool = False, timeout_s: float = 0.0) -> tuple[str, str]:
        """Stop a streaming query gracefully; returns (the job's status right after, what
        happens now). The job ends FINISHED once its batch in flight committed, or is cancelled
        after `timeout_s` (0: the JobManager's default, 60 s)."""
        response = self._call("StopJob", jobmanager_pb2.StopJobRequest(job_id=job_id, drain=drain,
                                                                       timeout_seconds=timeout_s))
        return job_status_name(response.status), response.message

    def rescale(self, job_id: str, parallelism: int, vertices: Sequence[str] = (),
                timeout_s: float = 0.0) -> jobmanager_pb2.RescaleJobResponse:
        """A running streaming query at another parallelism, live: its batch in flight commits,
        then it runs on under the same id at `parallelism` (every vertex but receivers, or
        `vertices`). Returns at once (message, vertex -> parallelism, the last batch committed);
        `rescale_pause` tells, from the progress records, how long batches paused."""
        return self._call("RescaleJob", jobmanager_pb2.RescaleJobRequest(
            job_id=job_id, parallelism=parallelism, vertex_id=list(vertices), timeout_seconds=timeout_s))

    def progress(self, job_id: str) -> list[dict[str, Any]]:
        """A streaming query's recent progress records (the last 100, oldest first)."""
        response = self._call("GetQueryProgress", jobmanager_pb2.GetQueryProgressRequest(job_id=job_id))
        return [json.loads(p) for p in response.progress_json]

    def watch(self, job_id: str) -> Iterator[jobmanager_pb2.JobEvent]:
        """The job's snapshot, then every event in order; ends once the job is terminal on the
        JobManager. Closing the iterator early cancels the stream. A stream that breaks after it
        began raises JobManagerConnectionLost. With high availability a job that was SUSPENDED
        or whose JobManager went away is followed to the next leader, which sends a new
        snapshot (its history continued) and the events after it."""
        if self._leader is None:
            yield from self._watch_rescaled(job_id)
            return
        deadline: float | None = None
        while True:
            suspended = False
            try:
                for event in self._watch_once(job_id):
                    deadline = None
                    kind = event.WhichOneof("event")
                    status = (event.snapshot.status if kind == "snapshot"
                              else event.job_status.to_status if kind == "job_status" else None)
                    if status is not None:
                        suspended = status == job_pb2.JOB_STATUS_SUSPENDED
                    yield event
                if not suspended:
                    return
            except (JobManagerConnectionLost, JobManagerUnavailable):
                pass
            deadline = deadline or time.monotonic() + self.failover_timeout
            time.sleep(0.1)
            if not self._follow_leader(deadline) or time.monotonic() >= deadline:
                raise JobManagerConnectionLost(self.address, job_id, f"no leader took the job over within "
                                               f"{self.failover_timeout:g} s")

    def _watch_rescaled(self, job_id: str) -> Iterator[jobmanager_pb2.JobEvent]:
        """Without high availability a job is SUSPENDED on a running JobManager only to be rescaled
        (`rescale`): its next run, under the same id, is followed (a snapshot, then its events)."""
        deadline: float | None = None
        while True:
            last = None
            for event in self._watch_once(job_id):
                kind = event.WhichOneof("event")
                if kind in ("snapshot", "job_status"):
                    last = event.snapshot.status if kind == "snapshot" else event.job_status.to_status
                    if last != job_pb2.JOB_STATUS_SUSPENDED or deadline is None:
                        yield event
                        deadline = None
                else:
                    yield event
            if last != job_pb2.JOB_STATUS_SUSPENDED:
                return
            deadline = deadline or time.monotonic() + self.failover_timeout
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _watch_once(self, job_id: str) -> Iterator[jobmanager_pb2.JobEvent]:
        call = self._stub.WatchJob(jobmanager_pb2.WatchJobRequest(job_id=job_id))
        started = False
        try:
            for event in call:
                started = True
                yield event
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if started and code in _CONNECTION_LOST_CODES:
                raise JobManagerConnectionLost(self.address, job_id, exc.details() or code.name, code=code) from None
            raise _translate(exc, self.address, credentials=self.credentials) from None
        finally:
            call.cancel()

    def cluster_overview(self) -> jobmanager_pb2.ClusterOverview:
        return self._call("GetClusterOverview", jobmanager_pb2.GetClusterOverviewRequest())

    def result_table(self, job_id: str, vertex_id: str = "") -> tuple[str, pa.Table]:
        """The rows a FINISHED job collected, as the collect sink's vertex id and an Arrow table.
        An empty `vertex_id` means the job's only collect sink."""
        import pyarrow as pa  # only results need Arrow; keep the client quick to import

        response: jobmanager_pb2.JobResult = self._call(
            "GetJobResult", jobmanager_pb2.GetJobResultRequest(job_id=job_id, vertex_id=vertex_id))
        if not response.arrow_ipc_stream:
            return response.vertex_id, pa.table({})
        with pa.ipc.open_stream(response.arrow_ipc_stream) as reader:
            return response.vertex_id, reader.read_all()

    def result_batches(self, job_id: str, vertex_id: str = "", from_batch: int = 0,
                       max_batches: int = 0) -> tuple[str, list[tuple[int, pa.Table]]]:
        """A streaming query's collect sink batch by batch: the sink's vertex id and, oldest first,
        (batch id, its rows) of the committed batches with an id >= `from_batch` (at most
        `max_batches`; 0: the JobManager's default, 100)."""
        import pyarrow as pa

        response: jobmanager_pb2.JobResult = self._call("GetJobResult", jobmanager_pb2.GetJobResultRequest(
            job_id=job_id, vertex_id=vertex_id, from_batch=from_batch, max_batches=max_batches))
        batches = []
        for b in response.batches:
            with pa.ipc.open_stream(b.arrow_ipc_stream) as reader:
                batches.append((b.batch_id, reader.read_all()))
        return response.vertex_id, batches

    def keyed_state(self, job_id: str, vertex_id: str = "", key: Sequence[str] = (),
                    limit: int = 0) -> tuple[jobmanager_pb2.KeyedState, pa.Table]:
        """A streaming query's keyed state after its last committed batch: the reply (vertex,
        batch, how many keys matched) and the rows as an Arrow table. `key`: the leading key
        columns' values as text (none: every key); `limit`: rows at most (0: 1000)."""
        import pyarrow as pa

        response: jobmanager_pb2.KeyedState = self._call("GetKeyedState", jobmanager_pb2.GetKeyedStateRequest(
            job_id=job_id, vertex_id=vertex_id, key=list(key), limit=limit))
        if not response.arrow_ipc_stream:
            return response, pa.table({})
        with pa.ipc.open_stream(response.arrow_ipc_stream) as reader:
            return response, reader.read_all()

    def result(self, job_id: str, vertex_id: str = "") -> list[dict[str, Any]]:
        """The collected rows as dicts keyed by column name."""
        return self.result_table(job_id, vertex_id)[1].to_pylist()

    def _call(self, method: Any, request: Any) -> Any:
        deadline = time.monotonic() + self.failover_timeout
        while True:
            try:
                # Looked up each time: following the leader replaces the stub.
                return getattr(self._stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                if self._retry(exc.code(), deadline):  # type: ignore[attr-defined]
                    continue
                raise _translate(exc, self.address, credentials=self.credentials) from None


def rescale_pause(progress: list[dict[str, Any]], last_batch_id: int) -> dict[str, Any] | None:
    """How long a rescaled query's batches paused, from its progress records: the last batch the
    run that was asked to rescale committed (the run of batch `last_batch_id`) and the first
    batch a later run committed, each at its commit time (batch time + total delay). None
    until a later run has committed a batch."""
    def committed_at(record: dict[str, Any]) -> int:
        return int(record["batchTime"]) + int(record["totalDelayMs"])

    runs = [r.get("runId") for r in progress if r.get("batchId") == last_batch_id]
    if last_batch_id >= 0 and not runs:
        return None
    old_run = runs[-1] if runs else None
    before = [r for r in progress if r.get("runId") == old_run] if old_run is not None else []
    later = [r for r in progress if r.get("runId") != old_run and int(r.get("batchId", -1)) > last_batch_id]
    if not later:
        return None
    first = min(later, key=lambda r: int(r["batchId"]))
    if not before:
        return {"last_batch_before": None, "first_batch_after": first["batchId"], "pause_ms": None}
    last = max(before, key=lambda r: int(r["batchId"]))
    return {"last_batch_before": last["batchId"], "first_batch_after": first["batchId"],
            "pause_ms": committed_at(first) - committed_at(last)}

