"""Running a job from Python: what `env.execute()` and `env.execute_async()` do, the JobClient
and JobExecutionResult they return, and the embedded mini cluster they start when no cluster is
configured (PyFlink's local mode: `python my_job.py` with nothing running).

Where a job goes (`Executor`, the `default` entry of the `funke.executors` entry-point group
that `funke.common.api.execution` looks up):

1. `jobmanager="HOST:PORT"` passed to execute();
2. $FUNKE_JOBMANAGER;
3. the local cluster (`funke cluster start`: $FUNKE_CLUSTER_DIR or ~/.funke/cluster) if its
   JobManager runs; with high availability, its leader, followed through failovers;
4. else an embedded mini cluster: a JobManager and one TaskManager (slots: the job's need, at
   least the machine's cores) started as children of this process in a temporary directory,
   reused by later jobs of the process, stopped when it exits. They watch this process
   (`--owner`), so they stop on their own when it is killed (a notebook kernel that dies).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from funke.common.graph.jobgraph import DEFAULT_SLOT_SHARING_GROUP, JobGraph, JobType
from funke.deploy import clusterdir
from funke.deploy.client import FunkeError, JobManagerClient, job_status_name
from funke.runtime.owner import owner_alive, owner_token, parse_owner
from funke.runtime.security import ClientCredentials, default_cluster_dir

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from funke.v1 import job_pb2

__all__ = ["BatchResult", "Executor", "JobClient", "JobExecutionResult", "JobFailed", "MiniCluster", "OperatorMetrics",
           "VertexMetrics"]

TERMINAL = ("FINISHED", "FAILED", "CANCELED")  # globally terminal: SUSPENDED goes on (HA, rescale)
_POLL_FIRST_S, _POLL_MAX_S = 0.02, 0.25
_PREFIX = "funke-minicluster-"
_OWNER_FILE = "owner"  # PID:START of the process that started the mini cluster


class JobFailed(FunkeError):
    """`execute()` or `get_job_execution_result()` of a job that ended FAILED or CANCELED: the
    message carries the root cause and its Python traceback; `result` the whole outcome."""

    def __init__(self, result: "JobExecutionResult"):
        failure = result.failure
        cause = ""
        if failure is not None and (failure.exception_type or failure.message):
            cause = f": {failure.exception_type}: {failure.message}"
            if failure.traceback:
                cause += f"\n{failure.traceback.rstrip()}"
        super().__init__(f"job {result.job_name!r} ({result.job_id}) {result.status}{cause}")
        self.result = result


@dataclass(frozen=True, slots=True)
class OperatorMetrics:
    """What one operator of a vertex's chain received and emitted, over the vertex's subtasks
    (Flink's numRecordsIn and numRecordsOut of an operator; a source's records in are the
    records it read, a sink's records out the records it wrote); None: not measured."""

    name: str
    records_in: int | None
    records_out: int | None


@dataclass(frozen=True, slots=True)
class VertexMetrics:
    """What the subtasks of one JobVertex read and wrote (their current attempts, as their
    TaskManagers measured them): the records its chain's head received (a source: the records it
    read) and its tail emitted (a sink: the records it wrote), the bytes of the result
    partitions it read and wrote, and per operator of its chain its records in and out."""

    vertex_id: str
    name: str
    parallelism: int
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    operators: tuple[OperatorMetrics, ...] = ()


def _operator_metrics(names: Sequence[str], ios: Sequence[Any]) -> tuple[OperatorMetrics, ...]:
    """Per operator of the chain, its subtasks' counts added up (None: measured by none)."""
    def total(values: list[tuple[bool, int]]) -> int | None:
        measured = [v for has, v in values if has]
        return sum(measured) if measured else None

    out = []
    for i, name in enumerate(names):
        ops = [io.operators[i] for io in ios if i < len(io.operators)]
        out.append(OperatorMetrics(name, total([(o.HasField("records_in"), o.records_in) for o in ops]),
                                   total([(o.HasField("records_out"), o.records_out) for o in ops])))
    return tuple(out)


def _collect_sinks(job: JobGraph) -> list[str]:
    return [v.id for v in job.vertices if v.operators and v.operators[-1].kind == "sink.collect"]


def _sink_id(sink: Any, available: Sequence[str]) -> str:
    """A collect sink named by its handle (what `collect()` returned), its vertex id, or nothing
    (the job's only one)."""
    if sink is None:
        if len(available) == 1:
            return available[0]
        if not available:
            raise ValueError("the job has no collect() sink")
        raise ValueError(f"the job has {len(available)} collect() sinks ({', '.join(available)}): name one "
                         f"(the handle collect() returned, or its vertex id)")
    vertex_id = sink if isinstance(sink, str) else getattr(sink, "vertex_id", None)
    if not isinstance(vertex_id, str) or vertex_id not in available:
        raise ValueError(f"{sink!r} is not a collect() sink of the job (its collect sinks: {', '.join(available)})")
    return vertex_id


def _rows(table: "pa.Table") -> list[Any]:
    from pyspark.sql import Row

    return [Row(**record) for record in table.to_pylist()]


def _seconds(ts: Any) -> float:
    return ts.seconds + ts.nanos / 1e9


class JobExecutionResult:
    """How a job ended: `status`, `duration_s`, `failure` (root cause with its traceback),
    per-vertex `metrics`, and the rows of its `collect()` sinks (`collect()`, `to_arrow()`,
    `to_pandas()`; with several sinks, name one). PyFlink's getters are there too."""

    def __init__(self, details: "job_pb2.JobDetails", tables: Mapping[str, "pa.Table"]):
        self.details = details
        self.job_id: str = details.job_id
        self.job_name: str = details.name
        self.status: str = job_status_name(details.status)
        self.failure = details.failure if details.HasField("failure") else None
        history = details.status_history
        start = _seconds(details.created_at)
        self.duration_s = max(0.0, _seconds(history[-1].timestamp) - start) if history else 0.0
        self.metrics: dict[str, VertexMetrics] = {}
        for v in details.vertices:
            ios = [s.current.io for s in v.subtasks]
            self.metrics[v.id] = VertexMetrics(v.id, v.name, v.parallelism, sum(i.records_in for i in ios),
                                               sum(i.records_out for i in ios), sum(i.bytes_in for i in ios),
                                               sum(i.bytes_out for i in ios), _operator_metrics(v.operators, ios))
        self._tables = dict(tables)

    @property
    def is_successful(self) -> bool:
        return self.status == "FINISHED"

    @property
    def sinks(self) -> list[str]:
        """The vertex ids of the job's collect() sinks."""
        return list(self._tables)

    def to_arrow(self, sink: Any = None) -> "pa.Table":
        return self._tables[_sink_id(sink, list(self._tables))]

    def to_pandas(self, sink: Any = None) -> "pd.DataFrame":
        return self.to_arrow(sink).to_pandas()

    def collect(self, sink: Any = None) -> list[Any]:
        """The rows as PySpark Rows."""
        return _rows(self.to_arrow(sink))

    # PyFlink's names
    def get_job_id(self) -> str:
        return self.job_id

    def get_net_runtime(self) -> int:
        """Milliseconds from submission to the end."""
        return round(self.duration_s * 1000)

    def get_job_status(self) -> str:
        return self.status

    def __repr__(self) -> str:
        rows = ", ".join(f"{v}: {t.num_rows} rows" for v, t in self._tables.items())
        return (f"JobExecutionResult({self.job_name!r}, {self.job_id}, {self.status}, {self.duration_s:.2f} s"
                f"{', ' + rows if rows else ''})")


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The rows one committed micro-batch of a streaming query gave a collect() sink."""

    batch_id: int
    table: "pa.Table"

    def to_arrow(self) -> "pa.Table":
        return self.table

    def to_pandas(self) -> "pd.DataFrame":
        return self.table.to_pandas()

    def collect(self) -> list[Any]:
        return _rows(self.table)


class JobClient:
    """A submitted job (PyFlink's JobClient): its id and status, cancel, its result once it
    ended; for a streaming query also `stop(drain=...)`, `progress()` and `batches()`, the
    committed batches of a collect() sink as they come."""

    def __init__(self, client: JobManagerClient, job_id: str, job: JobGraph, *, owns_client: bool = True):
        self.client = client
        self.job_id = job_id
        self.job = job
        self._owns_client = owns_client

    def get_job_id(self) -> str:
        return self.job_id

    def get_job_status(self) -> str:
        return job_status_name(self.client.get_job(self.job_id).status)

    def cancel(self) -> str:
        return self.client.cancel(self.job_id)

    def stop(self, drain: bool = False, timeout_s: float = 0.0) -> str:
        """A streaming query's graceful stop (`funke stop`): returns what will happen."""
        return self.client.stop(self.job_id, drain=drain, timeout_s=timeout_s)[1]

    def progress(self) -> list[dict[str, Any]]:
        """A streaming query's recent progress records, oldest first."""
        return self.client.progress(self.job_id)

    def wait(self, timeout: float | None = None) -> "job_pb2.JobDetails":
        """The job's details once it is FINISHED, FAILED or CANCELED; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _POLL_FIRST_S
        while True:
            details = self.client.get_job(self.job_id)
            if job_status_name(details.status) in TERMINAL:
                return details
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(f"job {self.job_id} is still {job_status_name(details.status)} after {timeout:g} s")
            time.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX_S)

    def get_job_execution_result(self, timeout: float | None = None) -> JobExecutionResult:
        """Wait for the end; the result, or JobFailed if the job did not finish."""
        details = self.wait(timeout)
        tables: dict[str, pa.Table] = {}
        if job_status_name(details.status) == "FINISHED":
            for vertex_id in _collect_sinks(self.job):
                tables[vertex_id] = self.client.result_table(self.job_id, vertex_id)[1]
        result = JobExecutionResult(details, tables)
        if not result.is_successful:
            raise JobFailed(result)
        return result

    def to_arrow(self, sink: Any = None) -> "pa.Table":
        """The rows of a collect() sink: of a finished job, or what a streaming query committed so far."""
        return self.client.result_table(self.job_id, _sink_id(sink, _collect_sinks(self.job)))[1]

    def to_pandas(self, sink: Any = None) -> "pd.DataFrame":
        return self.to_arrow(sink).to_pandas()

    def collect(self, sink: Any = None) -> list[Any]:
        return _rows(self.to_arrow(sink))

    def batches(self, sink: Any = None, *, from_batch: int = 0, follow: bool = True,
                poll_s: float = 0.2) -> Iterator[BatchResult]:
        """A streaming query's committed batches of a collect() sink, oldest first, from
        `from_batch` on. With `follow`, new batches as they commit, until the query has ended
        and its last batch was given; else only those committed now."""
        if self.job.job_type is not JobType.STREAMING:
            raise ValueError(f"job {self.job.name!r} is a batch job: its rows are in get_job_execution_result()")
        vertex_id = _sink_id(sink, _collect_sinks(self.job))
        next_batch = from_batch
        while True:
            ended = follow and job_status_name(self.client.get_job(self.job_id).status) in TERMINAL
            _, got = self.client.result_batches(self.job_id, vertex_id, next_batch)
            for batch_id, table in got:
                yield BatchResult(batch_id, table)
                next_batch = batch_id + 1
            if got:
                continue  # there may be more than one reply holds
            if not follow or ended:
                return
            time.sleep(poll_s)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "JobClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobClient({self.job.name!r}, {self.job_id}, {self.client.address})"


def required_slots(job: JobGraph) -> int:
    """Slots the job needs at once: per slot-sharing group, its largest parallelism."""
    per_group: dict[str, int] = {}
    for v in job.vertices:
        group = v.slot_sharing_group or DEFAULT_SLOT_SHARING_GROUP
        per_group[group] = max(per_group.get(group, 0), v.parallelism)
    return sum(per_group.values())


class MiniCluster:
    """A JobManager and one TaskManager, children of this process, in a temporary directory;
    one per process (`current`), stopped at exit, and stopping on their own should this process
    be killed (`--owner`)."""

    _current: "MiniCluster | None" = None
    _lock = threading.Lock()

    def __init__(self, slots: int, timeout: float = 120):
        from funke.deploy import localcluster

        self.slots = slots
        _remove_orphans()
        self.dir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        token = owner_token(os.getpid())
        (self.dir / _OWNER_FILE).write_text(token + "\n")
        started = time.monotonic()
        try:
            self.info = localcluster.start(localcluster.ClusterSpec(
                dir=self.dir, taskmanagers=1, slots=slots, owner=token, timeout=timeout))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.start_s = time.monotonic() - started

    @classmethod
    def current(cls, slots_needed: int = 1) -> "MiniCluster":
        """This process's mini cluster, started on first use with the slots `slots_needed`
        (at least the machine's cores)."""
        with cls._lock:
            mini = cls._current
            if mini is None:
                mini = cls._current = cls(max(slots_needed, os.cpu_count() or 2, 2))
                atexit.register(cls.shutdown)
                print(f"funke: no cluster configured: started an embedded mini cluster (1 TaskManager, "
                      f"{mini.slots} slots) in {mini.start_s:.1f} s; it stops when this process ends "
                      f"(dashboard: {mini.info.dashboard_url}, logs: {mini.dir / 'log'})", file=sys.stderr, flush=True)
            elif slots_needed > mini.slots:
                raise FunkeError(f"the job needs {slots_needed} slots at once and the embedded mini cluster has "
                                 f"{mini.slots}: lower its parallelism, or call MiniCluster.shutdown() first "
                                 f"(the next job starts one with enough slots)")
            return mini

    @classmethod
    def shutdown(cls) -> None:
        """Stop this process's mini cluster, if it runs (idempotent)."""
        from funke.deploy import localcluster

        with cls._lock:
            mini, cls._current = cls._current, None
        if mini is not None:
            try:
                localcluster.stop(mini.dir, timeout=10)
            finally:
                shutil.rmtree(mini.dir, ignore_errors=True)

    def client(self) -> JobManagerClient:
        return self.info.client()


def _remove_orphans() -> None:
    """Directories of mini clusters whose owner was killed (no atexit ran) and whose processes
    have stopped since (they watch their owner): removed by the next mini cluster."""
    for d in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            pid, start = parse_owner((d / _OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not one of ours, or still being made
        if owner_alive(pid, start) or any(p.alive for p in clusterdir.recorded_processes(d)):
            continue
        shutil.rmtree(d, ignore_errors=True)


def connect(jobmanager: str | None = None, environ: Mapping[str, str] | None = None,
            slots_needed: int = 1) -> JobManagerClient:
    """A client of where a job goes (the module docstring's order)."""
    environ = os.environ if environ is None else environ
    address = jobmanager or environ.get("FUNKE_JOBMANAGER")
    if address:
        return JobManagerClient(address.strip(), credentials=ClientCredentials.discover(environ=environ))
    root = default_cluster_dir(environ).expanduser()
    if root.is_dir():
        ha = clusterdir.ha_services(root) is not None
        running = any(p.alive and clusterdir.is_jobmanager(p.name) for p in clusterdir.recorded_processes(root))
        address = clusterdir.read_address(root)
        if address and (running or ha):
            credentials = clusterdir.credentials(root)
            if ha:
                return JobManagerClient(address, leader=lambda: clusterdir.read_address(root), credentials=credentials)
            return JobManagerClient(address, credentials=credentials)
    return MiniCluster.current(slots_needed).client()


class Executor:
    """The `default` executor: submits where `connect` says; waits or hands back a JobClient."""

    def execute(self, job: JobGraph, *, wait: bool, jobmanager: str | None = None,
                timeout: float | None = None) -> JobExecutionResult | JobClient:
        client = connect(jobmanager, slots_needed=required_slots(job))
        try:
            job_id = client.submit(job)
        except BaseException:
            client.close()
            raise
        job_client = JobClient(client, job_id, job)
        if not wait:
            return job_client
        with job_client:
            try:
                return job_client.get_job_execution_result(timeout)
            except KeyboardInterrupt:
                # Ctrl-C (a notebook's interrupt) while waiting stops the job, as PySpark cancels
                # its running jobs; execute_async() is there to leave one running.
                try:
                    job_client.cancel()
                    print(f"funke: interrupted: job {job_id} cancelled", file=sys.stderr, flush=True)
                except FunkeError as exc:
                    print(f"funke: interrupted: cancelling job {job_id} failed: {exc}", file=sys.stderr, flush=True)
                raise
