"""`funke`: the command line, as a Flink user would expect it (`flink run`, `flink list`, ...).

Owns the commands, how they find the JobManager, how jobs, events, failures and results are
shown to people (text) and to scripts (`--json`), and the exit codes:

    0  the command did what was asked (for submit and watch: the job FINISHED)
    1  it ran, but the outcome is not success (the job FAILED or was CANCELED, a cluster did
       not start, the JobManager went away while a job was being followed, ...)
    2  it could not run: bad usage, a job file that does not load, an invalid job graph, an
       unknown job id, or no JobManager at the address (nothing answers, or what answers is not
       a JobManager)

The JobManager address comes from `--jobmanager HOST:PORT`, else $FUNKE_JOBMANAGER, else the
address file of the local cluster (`<cluster dir>/jobmanager.address`; the cluster dir is
$FUNKE_CLUSTER_DIR or ~/.funke/cluster; with high availability the leader, looked up in the
cluster's HA services), else 127.0.0.1:6123.
"""

from __future__ import annotations

import os

# gRPC's core logs a failed TLS handshake at INFO on stderr; the error we raise says it better.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from funke.deploy.client import (
    DEFAULT_JOBMANAGER,
    ClientCredentials,
    FunkeError,
    InvalidJobGraph,
    JobManagerClient,
    JobManagerConnectionLost,
    JobManagerUnavailable,
    JobNotFound,
    NotAJobManager,
    NotAuthenticated,
    SecurityError,
    StandbyJobManager,
    execution_state_name,
    job_status_name,
)
from funke.deploy.jobfile import JobFileError, load_job_file
from funke.deploy import localcluster
from funke.v1 import job_pb2, jobgraph_pb2, jobmanager_pb2

if TYPE_CHECKING:
    from funke.common.graph.jobgraph import JobGraph

__all__ = [
    "JobProgress",
    "collect_sinks",
    "follow_job",
    "main",
    "render_failure",
    "render_history",
    "render_job_details",
    "render_rows",
    "resolve_jobmanager",
]

EXIT_OK, EXIT_UNSUCCESSFUL, EXIT_USAGE = 0, 1, 2
ROWS_SHOWN_AFTER_SUBMIT = 20
GLOBALLY_TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})
# ExecutionState in lifecycle order, for "2 RUNNING, 2 FINISHED".
_STATE_ORDER = [execution_state_name(v) for v in job_pb2.ExecutionState.values() if v]
_START_HINT = "start one with `funke cluster start`"

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Finding the JobManager
# --------------------------------------------------------------------------------------------


def resolve_jobmanager(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The JobManager address: `explicit` (--jobmanager), else $FUNKE_JOBMANAGER, else the local
    cluster's address file, else 127.0.0.1:6123."""
    environ = os.environ if environ is None else environ
    if explicit:
        return _checked_address(explicit, "--jobmanager")
    if environ.get("FUNKE_JOBMANAGER"):
        return _checked_address(environ["FUNKE_JOBMANAGER"], "FUNKE_JOBMANAGER")
    recorded = localcluster.read_address(localcluster.default_cluster_dir(environ))
    return recorded or DEFAULT_JOBMANAGER


class UsageError(FunkeError):
    """The command line itself is wrong."""


def _checked_address(address: str, origin: str) -> str:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{origin}: expected HOST:PORT, e.g. 127.0.0.1:6123, got {address!r}")
    return address.strip()


# --------------------------------------------------------------------------------------------
# Formatting helpers
# --------------------------------------------------------------------------------------------


def _seconds(ts: Timestamp) -> float | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.seconds + ts.nanos / 1e9


def format_time(ts: Timestamp, with_date: bool = True) -> str:
    """Local time to the millisecond; "-" for an unset timestamp."""
    seconds = _seconds(ts)
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds)
    text = moment.strftime("%Y-%m-%d %H:%M:%S.%f" if with_date else "%H:%M:%S.%f")
    return text[:-3]


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{int(minutes)} min {rest:.0f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)} h {int(minutes)} min"


def format_counts(counts: Mapping[str, int]) -> str:
    """{"RUNNING": 2, "FINISHED": 2} -> "2 RUNNING, 2 FINISHED" (lifecycle order)."""
    ordered = sorted((k for k, n in counts.items() if n), key=lambda k: (_STATE_ORDER.index(k)
                     if k in _STATE_ORDER else len(_STATE_ORDER), k))
    return ", ".join(f"{counts[k]} {k}" for k in ordered) or "no subtasks"


def _first_line(text: str) -> str:
    """Causes can carry a whole traceback; a one-line listing shows its first line."""
    lines = text.strip().splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line if line else line for line in text.rstrip("\n").splitlines()]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], prefix: str = "  ") -> list[str]:
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    def line(cells: Sequence[str]) -> str:
        return (prefix + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip()
    return [line(header)] + [line(r) for r in rows]


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)  # Decimal, and anything else Arrow hands back


def _to_dict(message: Message) -> dict[str, Any]:
    # Every field printed, defaults included: subtask 0 and attempt 0 are real values that
    # scripts must find.
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _print_json(value: Any, out: TextIO | None = None) -> None:
    print(json.dumps(value, default=_json_default, ensure_ascii=False), file=out or sys.stdout, flush=True)


# --------------------------------------------------------------------------------------------
# Rendering jobs
# --------------------------------------------------------------------------------------------


def history_entries(details: job_pb2.JobDetails) -> list[tuple[str, Timestamp, str]]:
    """(status, when entered, cause) from the initial CREATED on."""
    initial = (job_status_name(details.status_history[0].from_status) if details.status_history
               else job_status_name(details.status))
    entries = [(initial, details.created_at, "")]
    entries += [(job_status_name(t.to_status), t.timestamp, t.cause) for t in details.status_history]
    return entries


def render_history(details: job_pb2.JobDetails, prefix: str = "  ") -> list[str]:
    """`status history: CREATED -> RUNNING -> FINISHED (4.20 s)`, then each status with the
    time it was entered and why."""
    entries = history_entries(details)
    path = " -> ".join(status for status, _, _ in entries)
    start, end = _seconds(entries[0][1]), _seconds(entries[-1][1])
    took = f"  ({format_duration(end - start)})" if start is not None and end is not None and len(entries) > 1 else ""
    lines = [f"status history: {path}{took}"]
    width = max(len(s) for s, _, _ in entries)
    for status, when, cause in entries:
        why = f"  {_first_line(cause)}" if cause else ""
        lines.append(f"{prefix}{format_time(when)}  {status.ljust(width)}{why}".rstrip())
    return lines


def render_failure(failure: job_pb2.Failure, prefix: str = "  ") -> list[str]:
    """`Type: message` (the root cause first), then the Python traceback."""
    head = f"{failure.exception_type}: {failure.message}" if failure.exception_type else failure.message
    lines = _indent(head or "(no message)", prefix)
    if failure.traceback:
        lines += _indent(failure.traceback, prefix + "  ")
    return lines


def _slot_text(execution: job_pb2.Execution) -> tuple[str, str]:
    tm = execution.task_manager_id or "-"
    slot = str(execution.slot_index) if execution.HasField("slot_index") else "-"
    return tm, slot


def render_job_details(details: job_pb2.JobDetails) -> str:
    """What `funke status JOB` prints."""
    status = job_status_name(details.status)
    job_type = jobgraph_pb2.JobType.Name(details.job_type).removeprefix("JOB_TYPE_").lower()
    lines = [f"job {details.job_id}  {details.name!r}  {status}"]
    facts = [f"{job_type}", f"created {format_time(details.created_at)}",
             f"{details.required_slots} slot(s) required"]
    if details.restart_strategy:
        facts.append(f"restart strategy: {details.restart_strategy}")
    if details.failover_strategy:
        facts.append(f"failover strategy: {details.failover_strategy}")
    lines.append("  " + ", ".join(facts))
    if details.waiting_for_resources:
        lines.append(f"  waiting for resources: {details.waiting_for_resources}")
    lines += render_history(details)
    lines.append("vertices:")
    for v in details.vertices:
        lines.append(f"  {v.name}  [{v.id}]  parallelism {v.parallelism}: {format_counts(dict(v.subtasks_per_state))}")
        rows = []
        for sub in v.subtasks:
            tm, slot = _slot_text(sub.current)
            rows.append([f"{sub.subtask_index + 1}/{v.parallelism}", execution_state_name(sub.current.state),
                         str(sub.current.id.attempt_number), tm, slot])
            for prior in sub.prior_attempts:  # earlier attempts, for the story of a restart
                ptm, pslot = _slot_text(prior)
                rows.append(["", f"(was {execution_state_name(prior.state)})", str(prior.id.attempt_number), ptm, pslot])
        if rows:
            lines += _table(["SUBTASK", "STATE", "ATTEMPT", "TASKMANAGER", "SLOT"], rows, prefix="    ")
    if details.latest_progress_json:
        lines.append("latest micro-batch:")
        lines += render_progress_line(json.loads(details.latest_progress_json), prefix="  ")
    if details.HasField("failure"):
        lines.append("failure:")
        lines += render_failure(details.failure)
    if details.exceptions:
        lines.append(f"exception history ({len(details.exceptions)}):")
        for e in details.exceptions:
            where = e.task_name or "job"
            if e.HasField("attempt") and e.task_name:
                where += f" attempt {e.attempt.attempt_number}"
            if e.task_manager_id:
                where += f" on {e.task_manager_id}"
            lines.append(f"  {format_time(e.timestamp)}  {where}")
            lines += render_failure(e.failure, prefix="    ")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "null"  # as Spark's show() prints it
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_rows(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], prefix: str = "  ") -> list[str]:
    if not columns:
        return [f"{prefix}(no columns)"]
    return _table(list(columns), [[_cell(r.get(c)) for c in columns] for r in rows], prefix)


def render_summary_table(jobs: Sequence[job_pb2.JobSummary], now: float) -> str:
    if not jobs:
        return "no jobs"
    rows = []
    for j in sorted(jobs, key=lambda j: _seconds(j.created_at) or 0):
        created = _seconds(j.created_at)
        if _seconds(j.ended_at) is not None:
            duration = format_duration(j.duration_seconds)
        elif created is not None:
            duration = format_duration(max(now - created, 0)) + " so far"
        else:
            duration = "-"
        rows.append([j.job_id, j.name, job_status_name(j.status), format_time(j.created_at), duration,
                     format_counts(dict(j.tasks_per_state))])
    return "\n".join(_table(["JOB ID", "NAME", "STATUS", "CREATED", "DURATION", "TASKS"], rows, prefix=""))


def render_event(event: jobmanager_pb2.JobEvent) -> list[str]:
    """One event as `funke watch` prints it."""
    kind = event.WhichOneof("event")
    if kind == "snapshot":
        d = event.snapshot
        lines = [f"job {d.job_id} {d.name!r} is {job_status_name(d.status)}"]
        for v in d.vertices:
            lines.append(f"  {v.name}  {format_counts(dict(v.subtasks_per_state))}")
        if d.waiting_for_resources:
            lines.append(f"  waiting for resources: {d.waiting_for_resources}")
        return lines
    if kind == "job_status":
        t = event.job_status
        why = f"  ({_first_line(t.cause)})" if t.cause else ""
        return [f"{format_time(t.timestamp, with_date=False)}  job {job_status_name(t.from_status)} -> "
                f"{job_status_name(t.to_status)}{why}"]
    if kind == "execution_state":
        c = event.execution_state
        t = c.transition
        where = f" on {c.task_manager_id}" if c.task_manager_id else ""
        # A failure's cause repeats the failure, which follows in full.
        why = f"  ({_first_line(t.cause)})" if t.cause and not c.HasField("failure") else ""
        lines = [f"{format_time(t.timestamp, with_date=False)}  {c.task_name} attempt {c.attempt.attempt_number}: "
                 f"{execution_state_name(t.from_state)} -> {execution_state_name(t.to_state)}{where}{why}"]
        if c.HasField("failure"):
            lines += render_failure(c.failure, prefix="    ")
        return lines
    if kind == "waiting_for_resources":
        message = event.waiting_for_resources
        return [f"waiting for resources: {message}" if message else "no longer waiting for resources"]
    if kind == "streaming":
        e = event.streaming
        info = json.loads(e.info_json or "{}")
        when = format_time(e.at, with_date=False)
        if e.kind == "QueryProgress":
            return render_progress_line(info, prefix=f"{when}  ")
        detail = ""
        if e.kind.startswith("OutputOperation"):
            detail = f"  ({info.get('sink', '')})" if info.get("sink") else ""
        elif e.kind == "BatchCompleted" and "totalDelayMs" in info:
            detail = (f"  (scheduling delay {info.get('schedulingDelayMs', 0)} ms, processing {info.get('processingDelayMs', 0)}"
                      f" ms, total {info['totalDelayMs']} ms)")
        return [f"{when}  batch {e.batch_id}: {e.kind}{detail}"]
    return [f"(unknown event #{event.sequence})"]


def render_progress_line(p: dict[str, Any], prefix: str = "") -> list[str]:
    """One progress record in a line: batch, rows, rates, durations."""
    durations = p.get("durationMs") or {}
    rate_in, rate_done = p.get("inputRowsPerSecond"), p.get("processedRowsPerSecond")
    parts = [f"batch {p.get('batchId')}", f"{p.get('numInputRows', 0)} input rows"]
    if isinstance(rate_in, (int, float)):
        parts.append(f"{rate_in:,.1f} rows/s in")
    if isinstance(rate_done, (int, float)):
        parts.append(f"{rate_done:,.1f} rows/s processed")
    if "triggerExecution" in durations:
        parts.append(f"took {durations['triggerExecution']} ms")
    return [prefix + ", ".join(parts) + f"  ({p.get('timestamp', '')})"]


def render_progress(records: list[dict[str, Any]]) -> list[str]:
    """What `funke progress JOB` prints: a table of the recent batches."""
    if not records:
        return ["no micro-batch has completed yet"]
    first = records[0]
    lines = [f"query id {first.get('id', '')}  (run {records[-1].get('runId', '')})"]
    rows = []
    for p in records:
        d = p.get("durationMs") or {}
        rows.append([str(p.get("batchId")), str(p.get("timestamp", "")), str(p.get("numInputRows", 0)),
                     _rate(p.get("inputRowsPerSecond")), _rate(p.get("processedRowsPerSecond")),
                     *(str(d.get(k, "")) for k in ("latestOffset", "walCommit", "addBatch", "commitOffsets",
                                                    "triggerExecution")),
                     str(p.get("schedulingDelayMs", "")), str(p.get("totalDelayMs", ""))])
    lines += _table(["BATCH", "TIMESTAMP", "ROWS", "IN ROWS/S", "DONE ROWS/S", "OFFSETS MS", "WAL MS", "ADD MS",
                     "COMMIT MS", "TOTAL MS", "SCHED DELAY", "TOTAL DELAY"], rows, prefix="")
    return lines + render_sources(records[-1])


def render_sources(p: dict[str, Any]) -> list[str]:
    """A progress record's sources: rows and rates; a receiver source's blocks and each
    receiver's lines and rate; a broker's lag per stream key."""
    sources = p.get("sources") or []
    if not sources:
        return []
    lines = [f"sources of batch {p.get('batchId')}:"]
    for s in sources:
        parts = [f"{s.get('numInputRows', 0)} rows"]
        if isinstance(s.get("inputRowsPerSecond"), (int, float)):
            parts.append(f"{_rate(s['inputRowsPerSecond'])} rows/s in")
        if "numBlocks" in s:
            parts.append(f"{s['numBlocks']} blocks")
        if isinstance(s.get("rateLimitPerReceiver"), (int, float)):
            parts.append(f"backpressure: at most {_rate(s['rateLimitPerReceiver'])} lines/s per receiver")
        lines.append(f"  {s.get('description', '')}: " + ", ".join(parts))
        receivers = s.get("receivers") or {}
        for r in sorted(receivers, key=lambda k: int(k) if str(k).isdigit() else 0):
            info = receivers[r] or {}
            records = info.get("records")
            lines.append(f"    receiver {r}: {info.get('blocks', 0)} blocks, "
                         f"{records if records is not None else '?'} lines, "
                         f"{_rate(info.get('recordsPerSecond')) or '?'} lines/s")
        lag = s.get("lag") or {}
        if lag:
            lines.append("    lag (entries after the batch's end): "
                         + ", ".join(f"{key} {n}" for key, n in sorted(lag.items())))
    return lines


def _rate(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) else ""


# --------------------------------------------------------------------------------------------
# Live progress
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _VertexProgress:
    id: str
    name: str
    states: list[str]  # per subtask: its current attempt's state
    attempts: list[int]  # per subtask: the current attempt number

    def counts(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for s in self.states:
            result[s] = result.get(s, 0) + 1
        return result


@dataclass(slots=True)
class JobProgress:
    """A job's status and per-vertex subtask states, folded from its WatchJob events."""

    job_id: str = ""
    name: str = ""
    status: str = ""
    created_at: float | None = None
    ended_at: float | None = None  # when the job became globally terminal
    vertices: dict[str, _VertexProgress] = field(default_factory=dict)
    latest_batch: dict[str, Any] | None = None  # a streaming query's latest progress record

    def apply(self, event: jobmanager_pb2.JobEvent) -> set[str]:
        """Apply one event; returns the ids of the vertices whose counts may have changed
        (plus "" when the job status changed)."""
        kind = event.WhichOneof("event")
        if kind == "snapshot":
            d = event.snapshot
            self.job_id, self.name, self.status = d.job_id, d.name, job_status_name(d.status)
            self.created_at = _seconds(d.created_at)
            if self.status in GLOBALLY_TERMINAL and d.status_history:
                self.ended_at = _seconds(d.status_history[-1].timestamp)
            self.vertices = {}
            for v in d.vertices:
                subtasks = sorted(v.subtasks, key=lambda s: s.subtask_index)
                states = [execution_state_name(s.current.state) for s in subtasks]
                attempts = [s.current.id.attempt_number for s in subtasks]
                if not subtasks:  # a snapshot without subtask detail: the counts suffice
                    states = [s for s, n in v.subtasks_per_state.items() for _ in range(n)]
                    attempts = [0] * len(states)
                self.vertices[v.id] = _VertexProgress(v.id, v.name, states, attempts)
            return {""} | set(self.vertices)
        if kind == "job_status":
            self.status = job_status_name(event.job_status.to_status)
            if self.status in GLOBALLY_TERMINAL:
                self.ended_at = _seconds(event.job_status.timestamp)
            return {""}
        if kind == "execution_state":
            a = event.execution_state.attempt
            v = self.vertices.get(a.vertex_id)
            if v is None or not 0 <= a.subtask_index < len(v.states):
                return set()
            if a.attempt_number < v.attempts[a.subtask_index]:
                return set()  # a late report about an attempt that was already replaced
            v.attempts[a.subtask_index] = a.attempt_number
            v.states[a.subtask_index] = execution_state_name(event.execution_state.transition.to_state)
            return {v.id}
        if kind == "streaming" and event.streaming.kind == "QueryProgress":
            try:
                self.latest_batch = json.loads(event.streaming.info_json or "{}")
            except ValueError:
                return set()
            return {""}
        return set()

    def vertex_line(self, vertex_id: str, width: int = 0) -> str:
        v = self.vertices[vertex_id]
        return f"{v.name.ljust(width)}  {format_counts(v.counts())}"

    def lines(self, now: float) -> list[str]:
        end = self.ended_at if self.ended_at is not None else now
        elapsed = f"  {format_duration(end - self.created_at)}" if self.created_at is not None else ""
        width = max((len(v.name) for v in self.vertices.values()), default=0)
        return [f"job {self.job_id} {self.status}{elapsed}"] + [
            "  " + self.vertex_line(vid, width) for vid in self.vertices]


# The terminal's colours for execution states (the dashboard's palette, as near as a terminal gets).
STATE_STYLES = {"CREATED": "grey50", "SCHEDULED": "grey70", "DEPLOYING": "cyan", "INITIALIZING": "bright_cyan",
                "RUNNING": "blue", "FINISHED": "green", "CANCELING": "yellow", "CANCELED": "grey39",
                "FAILED": "red"}
_BAR_WIDTH = 30


class _LiveView:
    """Where progress goes. On a terminal: one live display, redrawn in place by rich (per
    vertex a bar of its subtasks by state and their counts; the job's status and elapsed time;
    for a streaming query its latest batch and rates), with lasting lines (failures, waiting
    for resources) printed above it. Otherwise (a pipe, a file, --json elsewhere): one plain line
    per change."""

    REDRAW_S = 0.1
    CLOCK_S = 1.0  # the elapsed time in the header moves even when nothing happens

    def __init__(self, progress: JobProgress, out: TextIO, tty: bool) -> None:
        self.progress = progress
        self.out = out
        self.tty = tty
        self._pending: set[str] = set()  # vertex ids ("" for the job) changed since the last flush
        self._last_draw = 0.0
        self._printed: dict[str, str] = {}  # non-TTY: the last line printed per vertex/"" job
        self._live: Any = None  # rich.live.Live once drawn (a terminal only)

    def note(self, lines: Iterable[str]) -> None:
        """Lines that stay: failures, waiting for resources."""
        if not self.tty:
            self._flush()  # what happened before the note is printed before it
            for line in lines:
                print(line, file=self.out)
            self.out.flush()
            return
        live = self._start()
        for line in lines:
            live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._draw()

    def changed(self, keys: set[str]) -> None:
        self._pending |= keys
        if "" in keys:  # a job status change is shown at once
            self._flush()
        else:
            self.tick()

    def tick(self) -> None:
        since = time.monotonic() - self._last_draw
        if (self._pending and since >= self.REDRAW_S) or (self.tty and since >= self.CLOCK_S):
            self._flush()

    def _flush(self) -> None:
        # Changes within one REDRAW_S are shown together: a wide job reports thousands of
        # transitions per second, which nobody can read one by one.
        if self.tty:
            self._draw()
        else:
            width = max((len(v.name) for v in self.progress.vertices.values()), default=0)
            order = list(self.progress.vertices)
            vertices = [k for k in order if k in self._pending]
            job = [""] if "" in self._pending else []
            # The job's line leads (the snapshot), except for its end, which follows the last
            # task changes that caused it.
            keys = vertices + job if self.progress.status in GLOBALLY_TERMINAL else job + vertices
            for key in keys:
                line = (f"job {self.progress.job_id} {self.progress.status}" if key == ""
                        else self.progress.vertex_line(key, width))
                if self._printed.get(key) != line:
                    self._printed[key] = line
                    print(line, file=self.out)
            self.out.flush()
            self._last_draw = time.monotonic()
        self._pending = set()

    def finish(self) -> None:
        self._flush()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _start(self) -> Any:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.out, force_terminal=True, highlight=False)
            self._live = Live(self.render(), console=console, auto_refresh=False, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        return self._live

    def _draw(self) -> None:
        self._start().update(self.render(), refresh=True)
        self._last_draw = time.monotonic()

    def render(self) -> Any:
        """The live display: a header, then per vertex its name, a bar of its subtasks by state,
        their counts; for a streaming query the latest batch."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        p = self.progress
        end = p.ended_at if p.ended_at is not None else time.time()
        elapsed = format_duration(end - p.created_at) if p.created_at is not None else ""
        header = Text.assemble(("job ", "bold"), (p.job_id, "bold"), " ", (p.status, _status_style(p.status)),
                               f"  {elapsed}" if elapsed else "", f"  {p.name}" if p.name else "")
        table = Table.grid(padding=(0, 2))
        for column in ("vertex", "bar", "counts"):
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        for v in p.vertices.values():
            counts = v.counts()
            table.add_row(Text(v.name), _bar(counts, len(v.states)), Text(format_counts(counts)))
        parts: list[Any] = [header, table]
        if p.latest_batch:
            parts.append(Text("  " + render_progress_line(p.latest_batch)[0], style="dim", no_wrap=True,
                              overflow="ellipsis"))
        return Group(*parts)


def _status_style(status: str) -> str:
    return {"RUNNING": "blue", "FINISHED": "green", "FAILED": "red", "FAILING": "red", "CANCELED": "grey39",
            "CANCELLING": "yellow", "RESTARTING": "yellow", "SUSPENDED": "grey50"}.get(status, "")


def _bar(counts: dict[str, int], total: int) -> Any:
    """A bar of `_BAR_WIDTH` cells, each state's share in its colour (every state present shows
    at least one cell)."""
    from rich.text import Text

    bar = Text()
    if total <= 0:
        return bar.append(" " * _BAR_WIDTH)
    order = [s for s in STATE_STYLES if counts.get(s)] + [s for s in counts if s not in STATE_STYLES]
    cells = {s: max(1, round(_BAR_WIDTH * counts[s] / total)) for s in order}
    while sum(cells.values()) > _BAR_WIDTH:  # rounding up the small shares: take from the largest
        largest = max(cells, key=lambda s: cells[s])
        cells[largest] -= 1
    for s in order:
        bar.append("█" * cells[s], style=STATE_STYLES.get(s, "white"))
    return bar.append(" " * (_BAR_WIDTH - sum(cells.values())))


_END = object()


def _with_ticks(events: Iterator[T], interval: float) -> Iterator[T | None]:
    """The events, with None whenever `interval` passes without one (so a terminal view can
    redraw while the stream is quiet). The stream is read on a daemon thread; closing the
    client's channel ends it."""
    box: queue.Queue[Any] = queue.Queue()

    def pump() -> None:
        try:
            for e in events:
                box.put(e)
        except BaseException as exc:  # handed to the reader, which raises it
            box.put(exc)
        box.put(_END)

    threading.Thread(target=pump, name="funke-watch", daemon=True).start()
    while True:
        try:
            item = box.get(timeout=interval)
        except queue.Empty:
            yield None
            continue
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def follow_job(client: JobManagerClient, job_id: str, out: TextIO, *, tty: bool, quiet: bool = False,
               err: TextIO | None = None) -> JobProgress:
    """Watch a job until it ends, showing per-vertex progress on `out` (nothing when `quiet`,
    except that waiting-for-resources messages still go to `err`). Returns the final progress."""
    err = err or sys.stderr
    progress = JobProgress()
    view = _LiveView(progress, out, tty)
    try:
        _follow(client, job_id, progress, view, quiet, err)
    except JobManagerConnectionLost as exc:
        if not quiet:
            view.finish()
        raise JobManagerConnectionLost(client.address, job_id, exc.details, progress.status, exc.code) from None
    if not quiet:
        view.finish()
    return progress


def _follow(client: JobManagerClient, job_id: str, progress: JobProgress, view: "_LiveView", quiet: bool,
            err: TextIO) -> None:
    for event in _with_ticks(client.watch(job_id), _LiveView.REDRAW_S):
        if event is None:
            if not quiet:
                view.tick()
            continue
        kind = event.WhichOneof("event")
        changed = progress.apply(event)
        if quiet:
            waiting = (event.waiting_for_resources if kind == "waiting_for_resources"
                       else event.snapshot.waiting_for_resources if kind == "snapshot" else "")
            if waiting:
                print(f"waiting for resources: {waiting}", file=err, flush=True)
            continue
        if kind == "waiting_for_resources":
            view.note(render_event(event))
        elif kind == "snapshot" and event.snapshot.waiting_for_resources:
            view.changed(changed)
            view.note([f"waiting for resources: {event.snapshot.waiting_for_resources}"])
        elif kind == "execution_state" and event.execution_state.HasField("failure"):
            view.changed(changed)
            view.note(render_event(event))
        elif kind == "streaming":  # a streaming query: its progress, one line per batch (a terminal: live)
            if event.streaming.kind == "QueryProgress":
                if view.tty:
                    view.changed(changed)
                else:
                    view.note(render_event(event))
        else:
            view.changed(changed)


# --------------------------------------------------------------------------------------------
# Commands: jobs
# --------------------------------------------------------------------------------------------


def collect_sinks(job: JobGraph) -> list[str]:
    """Ids of the vertices that end in a collect sink."""
    return [v.id for v in job.vertices if v.operators and v.operators[-1].kind == "sink.collect"]


def _client(args: argparse.Namespace) -> JobManagerClient:
    address = resolve_jobmanager(args.jobmanager)
    credentials = ClientCredentials.discover(token_file=args.token_file, tls_ca=args.tls_ca,
                                             tls_cert=args.tls_cert, tls_key=args.tls_key)
    if not args.jobmanager and not os.environ.get("FUNKE_JOBMANAGER"):
        root = localcluster.default_cluster_dir()
        if localcluster.ha_services(root) is not None:
            # A high-availability cluster: follow its leader through failovers.
            return JobManagerClient(address, leader=lambda: localcluster.read_address(root), credentials=credentials)
    return JobManagerClient(address, credentials=credentials)


_SUBMIT_FLAGS = {"--detach": "detach", "--json": "json"}


def _split_submit_args(args: argparse.Namespace, after_dashes: list[str]) -> None:
    """Our own flags may also follow the job file (`funke submit job.py --parallelism 4 --json`);
    everything else there, and everything after `--`, belongs to the job."""
    job_args: list[str] = []
    rest = list(args.job_args)
    while rest:
        token = rest.pop(0)
        if token in _SUBMIT_FLAGS:
            setattr(args, _SUBMIT_FLAGS[token], True)
        elif token == "--jobmanager":
            if not rest:
                raise UsageError("--jobmanager needs HOST:PORT")
            args.jobmanager = rest.pop(0)
        elif token.startswith("--jobmanager="):
            args.jobmanager = token.partition("=")[2]
        else:
            job_args.append(token)
    args.job_args = job_args + after_dashes


def cmd_submit(args: argparse.Namespace) -> int:
    job = load_job_file(args.file, args.job_args)
    with _client(args) as client:
        job_id = client.submit(job)
        if args.detach:
            if args.json:
                _print_json({"job_id": job_id, "name": job.name})
            else:
                print(job_id, flush=True)  # alone on its line: JOB=$(funke submit --detach ...)
            return EXIT_OK
        out = sys.stdout
        if not args.json:
            print(f"submitted job {job_id} {job.name!r} to {client.address}", flush=True)
        try:
            progress = follow_job(client, job_id, out, tty=out.isatty(), quiet=args.json)
        except KeyboardInterrupt:
            _error(f"stopped following job {job_id}; it keeps running: `funke status {job_id}`, "
                   f"`funke cancel {job_id}`")
            return 130
        try:
            details = client.get_job(job_id)
            status = job_status_name(details.status)
            columns: list[str] = []
            rows: list[dict[str, Any]] | None = None
            collects = collect_sinks(job)
            if status == "FINISHED" and len(collects) == 1:
                _, table = client.result_table(job_id, collects[0])
                columns, rows = table.column_names, table.to_pylist()
        except JobManagerUnavailable as exc:  # it answered a moment ago: it went away
            raise JobManagerConnectionLost(client.address, job_id, exc.details, progress.status, exc.code) from None
    if args.json:
        document: dict[str, Any] = {
            "job_id": job_id,
            "name": details.name,
            "status": status,
            "status_history": [_to_dict(t) for t in details.status_history],
            "created_at": details.created_at.ToJsonString() if _seconds(details.created_at) else None,
            "failure": _to_dict(details.failure) if details.HasField("failure") else None,
        }
        if rows is not None:
            document["rows"] = rows
        _print_json(document)
    else:
        print("\n".join(render_outcome(details, columns, rows)), flush=True)
    return EXIT_OK if status == "FINISHED" else EXIT_UNSUCCESSFUL


def render_outcome(details: job_pb2.JobDetails, columns: Sequence[str] = (),
                   rows: Sequence[Mapping[str, Any]] | None = None,
                   limit: int = ROWS_SHOWN_AFTER_SUBMIT) -> list[str]:
    """What `funke submit` prints once the job ended."""
    lines = render_history(details)
    if details.HasField("failure"):
        lines.append("failure (root cause first):")
        lines += render_failure(details.failure)
        lines.append(f"  the full story: funke status {details.job_id}")
    if rows is not None:
        shown = rows[:limit]
        more = f", the first {len(shown)} shown; all of them: funke result {details.job_id}" if len(rows) > limit else ""
        lines.append(f"collected {len(rows)} row(s){more}:")
        lines += render_rows(columns, shown)
    return lines


def cmd_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.list_jobs()
    if args.json:
        _print_json({"jobs": [_to_dict(j) for j in jobs]})
    else:
        print(render_summary_table(jobs, time.time()))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        details = client.get_job(args.job)
    if args.json:
        _print_json(_to_dict(details))
    else:
        print(render_job_details(details))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    final = ""
    with _client(args) as client:
        for event in client.watch(args.job):
            kind = event.WhichOneof("event")
            if kind == "snapshot":
                final = job_status_name(event.snapshot.status)
            elif kind == "job_status":
                final = job_status_name(event.job_status.to_status)
            if args.json:
                _print_json(_to_dict(event))
            else:
                print("\n".join(render_event(event)), flush=True)
    return EXIT_OK if final == "FINISHED" else EXIT_UNSUCCESSFUL


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.cancel(args.job)
    if args.json:
        _print_json({"job_id": args.job, "status": status})
    else:
        print(f"job {args.job} is {status}")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status, message = client.stop(args.job, drain=args.drain, timeout_s=args.timeout)
        if args.detach:
            if args.json:
                _print_json({"job_id": args.job, "status": status, "message": message})
            else:
                print(f"job {args.job} is {status}: {message}")
            return EXIT_OK
        if not args.json:
            print(f"job {args.job}: {message}", flush=True)
            print("following it until it ends: exit 0 if it ends FINISHED, 1 if it is cancelled (CANCELED) or fails",
                  flush=True)
        final = status
        for event in client.watch(args.job):  # until the job ends: FINISHED, or CANCELED on timeout
            kind = event.WhichOneof("event")
            if kind == "snapshot":
                final = job_status_name(event.snapshot.status)
            elif kind == "job_status":
                final = job_status_name(event.job_status.to_status)
                if not args.json:
                    print("\n".join(render_event(event)), flush=True)
    if args.json:
        _print_json({"job_id": args.job, "status": final, "message": message})
    else:
        print(f"job {args.job} is {final}")
    return EXIT_OK if final == "FINISHED" else EXIT_UNSUCCESSFUL


def cmd_progress(args: argparse.Namespace) -> int:
    with _client(args) as client:
        records = client.progress(args.job)
    if args.json:
        _print_json(records)
    else:
        print("\n".join(render_progress(records)))
    return EXIT_OK


def cmd_conformance(args: argparse.Namespace) -> int:
    from funke.deploy import conformance

    if args.list:
        for s in conformance.SCENARIOS:
            print(f"{s.name:26} {s.about}{' (--destructive)' if s.destructive else ''}\n{'':26} expected: {s.expected}")
        return EXIT_OK
    with _client(args) as client:
        report = None if args.json else (lambda o: print(
            f"{o.name}: {'pass' if o.passed else 'FAIL'} ({o.observed}, {o.seconds:.1f} s)", flush=True))
        try:
            outcomes = conformance.run_scenarios(client, args.only, report=report, destructive=args.destructive,
                                                 kill_command=args.kill_command or "",
                                                 restore_command=args.restore_command or "")
        except ValueError as exc:
            _error(str(exc))
            return EXIT_USAGE
    if args.junit:
        Path(args.junit).write_text(conformance.junit(outcomes))
    if args.json:
        _print_json(conformance.as_json(outcomes))
    else:
        print()
        print(conformance.table(outcomes))
        passed = sum(o.passed for o in outcomes)
        print(f"\n{passed} of {len(outcomes)} scenario(s) passed in {sum(o.seconds for o in outcomes):.1f} s")
    return EXIT_OK if all(o.passed for o in outcomes) else EXIT_UNSUCCESSFUL


def cmd_result(args: argparse.Namespace) -> int:
    with _client(args) as client:
        vertex_id, table = client.result_table(args.job, args.vertex or "")
    rows = table.to_pylist()
    if args.json:
        _print_json({"job_id": args.job, "vertex_id": vertex_id, "row_count": len(rows),
                     "columns": table.column_names, "rows": rows})
    else:
        print("\n".join(render_rows(table.column_names, rows, prefix="")))
        print(f"({len(rows)} row(s) from {vertex_id})")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Commands: the local cluster and the processes
# --------------------------------------------------------------------------------------------


def _cluster_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir).expanduser().resolve() if args.dir else localcluster.default_cluster_dir()


def cmd_cluster_start(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    print(f"starting a JobManager and {args.taskmanagers} TaskManager(s) x {args.slots} slot(s) in {root} ...",
          flush=True)
    tm_options: list[str] = []
    if args.spark_master:
        tm_options += ["--spark-master", args.spark_master]
    if args.spark_remote:
        tm_options += ["--spark-remote", args.spark_remote]
    for entry in args.spark_conf:
        tm_options += ["--spark-conf", entry]
    if args.workers is not None and args.spark != "standalone":
        raise localcluster.ClusterError("--workers is for --spark standalone")
    workers = (args.workers or 2) if args.spark == "standalone" else 0
    info = localcluster.start(localcluster.ClusterSpec(
        root, args.taskmanagers, args.slots, port=args.port, data_dir=args.data_dir, dynamic=args.dynamic,
        no_spark=args.no_spark, timeout=args.timeout, ha=args.ha, jobmanagers=args.jobmanagers,
        zookeeper_quorum=args.zookeeper_quorum, host=args.host, taskmanager_options=tm_options,
        spark_workers=workers, tls="mtls" if args.mtls else "tls" if args.tls else "none", insecure=args.insecure,
        tls_hosts=args.tls_host))
    leads = " (leader)" if info.high_availability != "none" else ""
    rows = [[info.jobmanager.name + leads, info.address, "", str(info.jobmanager.pid), str(info.jobmanager.log)]]
    rows += [[jm.name + " (standby)", "", "", str(jm.pid), str(jm.log)] for jm in info.standbys]
    rows += [[tm.name, "", str(info.slots_per_taskmanager), str(tm.pid), str(tm.log)] for tm in info.taskmanagers]
    if info.zookeeper is not None:
        rows.insert(0, [info.zookeeper.name, info.zookeeper_quorum, "", str(info.zookeeper.pid), str(info.zookeeper.log)])
    if info.spark_master:
        rows.append([f"spark standalone ({workers} worker(s))", info.spark_master, "", "",
                     str(root / localcluster.STANDALONE_DIR / "log")])
    print("\n".join(_table(["PROCESS", "ADDRESS", "SLOTS", "PID", "LOG"], rows)))
    total = len(info.taskmanagers) * info.slots_per_taskmanager
    print(f"cluster running: JobManager at {info.address}, {len(info.taskmanagers)} TaskManager(s), "
          f"{total} slot(s); data dir {info.data_dir}")
    if info.dashboard_url:
        print(f"web dashboard: {info.dashboard_url}  (log in with the client token: open "
              f"{info.dashboard_url}?token=$(cat {root / 'security' / 'client.token'}))")
    tls = {"tls": "TLS", "mtls": "mutual TLS"}.get(localcluster.tls_mode(root), "plaintext (loopback)")
    if args.insecure and args.host:
        tls = "plaintext, reachable from other machines (--insecure)"
    print(f"security: {tls}; every call needs the tokens in {root / 'security'} (mode 0700), which "
          "funke commands and the SDK read from there")
    dir_flag = "" if root == localcluster.default_cluster_dir().resolve() else f" --dir {root}"
    if dir_flag:
        print(f"other commands find it with: export FUNKE_CLUSTER_DIR={root}  (or --jobmanager {info.address})")
    print(f"stop it with: funke cluster stop{dir_flag}")
    return EXIT_OK


def cmd_cluster_secrets(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    mode = "mtls" if args.mtls else "tls" if args.tls else "none"
    folder = localcluster.prepare_security(root, mode, args.host, args.tls_host)
    print(f"secrets in {folder} (0700): client.token (clients), cluster.token (TaskManagers)"
          + (f"; {'mutual ' if mode == 'mtls' else ''}TLS in {folder / 'tls'}: ca.pem, node.pem + node.key "
             "(every JobManager and TaskManager), client.pem + client.key (clients)" if mode != "none" else ""))
    print("processes started with these (the -D flags, or the same keys in a --config file):")
    print("  " + " ".join(localcluster.security_options(root)))
    return EXIT_OK


def cmd_cluster_kill(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    pid = localcluster.kill(root, args.name)  # a process the cluster recorded, by its pid
    print(f"{args.name} (pid {pid}) killed")
    return EXIT_OK


def cmd_cluster_add_taskmanager(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", args.name) or localcluster.is_jobmanager(args.name) \
            or args.name == localcluster.ZOOKEEPER:
        _error(f"{args.name!r} is no TaskManager name: letters, digits, '.', '_', '-' (e.g. tm-3)")
        return EXIT_USAGE
    info = localcluster.start_taskmanager(root, args.name, args.slots, timeout=args.timeout)
    print(f"{info.name} (pid {info.pid}) registered; log {info.log}")
    return EXIT_OK


def cmd_cluster_add_jobmanager(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    if args.name is not None and not re.fullmatch(r"jobmanager(-[A-Za-z0-9][A-Za-z0-9_.]{0,31})?", args.name):
        _error(f"{args.name!r} is no JobManager name: jobmanager, or jobmanager-<letters, digits, '.', '_'> "
               "(e.g. jobmanager-3)")
        return EXIT_USAGE
    info = localcluster.start_jobmanager(root, args.name, timeout=args.timeout)
    lease = localcluster.wait_for_leader(root, args.timeout)
    if lease is None:
        role = "no leader is elected yet"
    elif localcluster.leader_name(root) == info.name:
        role = f"it leads (epoch {lease.epoch})"
    else:
        role = f"standby; the leader is {lease.address} (epoch {lease.epoch})"
    print(f"{info.name} (pid {info.pid}) serves: {role}; log {info.log}")
    return EXIT_OK


def cmd_cluster_stop(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    outcomes = localcluster.stop(root, timeout=args.timeout)
    if not outcomes:
        print(f"no cluster recorded in {root}; nothing to stop")
        return EXIT_OK
    for process, outcome in outcomes:
        joined = "" if process.recorded else ", joined by hand"
        print(f"{process.name} (pid {process.pid}{joined}): {outcome}")
    return EXIT_OK


def cmd_cluster_status(args: argparse.Namespace) -> int:
    root = _cluster_dir(args)
    st = localcluster.status(root)
    if args.json:
        _print_json({
            "dir": str(st.dir),
            "running": st.running,
            "address": st.address,
            "processes": [{"name": p.name, "pid": p.pid, "alive": p.alive, "log": str(p.log),
                           **({} if p.recorded else {"recorded": False, "address": p.address, "host": p.host})}
                          for p in st.processes],
            "overview": _to_dict(st.overview) if st.overview is not None else None,
            "error": st.error or None,
            "high_availability": st.high_availability,
            "tls": localcluster.tls_mode(root),
            "leader": ({"epoch": st.lease.epoch, "address": st.lease.address, "holder": st.lease.holder,
                        "since": st.lease.since, "valid": st.lease.valid(time.time())}
                       if st.lease is not None else None),
        })
        return EXIT_OK if st.running else EXIT_UNSUCCESSFUL
    if not st.processes:
        print(f"no cluster recorded in {root}")
        return EXIT_UNSUCCESSFUL
    print(f"cluster in {st.dir}: {'running' if st.running else 'NOT running'}")
    lease = st.lease
    leader_pid = lease.holder.split(":")[1] if lease is not None and lease.holder.count(":") >= 2 else ""
    if st.high_availability != "none":
        if lease is not None and lease.valid(time.time()):
            print(f"high availability: {st.high_availability}; leader epoch {lease.epoch} at {lease.address} "
                  f"(pid {leader_pid}) since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(lease.since))}")
        else:
            print(f"high availability: {st.high_availability}; no leader right now"
                  + (f" (last: epoch {lease.epoch})" if lease is not None else ""))
    registered = {tm.id: tm for tm in st.overview.task_managers} if st.overview is not None else {}
    rows = []
    for p in st.processes:
        tm = registered.get(p.name)
        if localcluster.is_jobmanager(p.name) and st.high_availability != "none":
            leads = lease is not None and lease.valid(time.time()) and str(p.pid) == leader_pid
            detail = f"leader, epoch {lease.epoch}, {st.address}" if leads and lease else "standby"
            if not p.recorded:
                detail += (f" at {p.address}" if not leads else "") + ", joined by hand (not started by `funke cluster`)"
        elif p.name == localcluster.JOBMANAGER:
            detail = st.address or "-"
        elif p.name == localcluster.ZOOKEEPER:
            detail = "the cluster's ZooKeeper server"
        elif tm is not None:
            detail = f"{tm.address}, {tm.slots_free}/{tm.slots_total} slots free"
        else:
            detail = "not registered" if st.overview is not None else "-"
        rows.append([p.name, str(p.pid), "alive" if p.alive else "dead", detail])
    print("\n".join(_table(["PROCESS", "PID", "STATE", "DETAIL"], rows)))
    if st.overview is not None:
        o = st.overview
        others = [tm.id for tm in o.task_managers if tm.id not in {p.name for p in st.processes}]
        print(f"{len(o.task_managers)} TaskManager(s) registered, {o.slots_free}/{o.slots_total} slot(s) free"
              + (f" (also registered from elsewhere: {', '.join(others)})" if others else ""))
        jobs = ", ".join(f"{n} {s}" for s, n in sorted(o.jobs_by_status.items())) or "none"
        print(f"jobs: {jobs}; data dir {o.data_dir or '-'}")
    tls = {"tls": "TLS", "mtls": "mutual TLS"}.get(localcluster.tls_mode(root), "no TLS")
    print(f"security: tokens in {root / 'security'}, {tls}")
    if st.error:
        print(f"problem: {st.error}")
    return EXIT_OK if st.running else EXIT_UNSUCCESSFUL


def _run_process(kind: str, argv: list[str]) -> int:
    if kind == "jobmanager":
        from funke.jobmanager.main import main as run
    else:
        from funke.taskmanager.main import main as run
    return run(argv)


# --------------------------------------------------------------------------------------------
# The parser and main
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="funke",
        description="Run and inspect funke jobs: a Flink-style job-graph runtime on PySpark.",
        epilog="JobManager address: --jobmanager, else $FUNKE_JOBMANAGER, else the local cluster's "
               "address file, else 127.0.0.1:6123. Exit codes: 0 success, 1 the job or cluster did not "
               "succeed, 2 usage error, bad job, unknown job or unreachable JobManager.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str,
                jobmanager: bool = True, **kwargs: Any) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=help, allow_abbrev=False, **kwargs)
        p.set_defaults(handler=handler)
        if jobmanager:
            p.add_argument("--jobmanager", metavar="HOST:PORT", help="the JobManager to talk to")
            p.add_argument("--token-file", metavar="FILE", help="the cluster's client token (default: "
                           "$FUNKE_TOKEN_FILE, else <cluster dir>/security/client.token)")
            p.add_argument("--tls-ca", metavar="PEM", help="speak TLS, trusting this CA (default: $FUNKE_TLS_CA, "
                           "else <cluster dir>/security/tls/ca.pem if the cluster runs with TLS)")
            p.add_argument("--tls-cert", metavar="PEM", help="this client's certificate, for mutual TLS "
                           "(default: $FUNKE_TLS_CERT)")
            p.add_argument("--tls-key", metavar="PEM", help="its private key (default: $FUNKE_TLS_KEY)")
        return p

    cluster = commands.add_parser("cluster", help="start, stop or inspect a local multi-process cluster",
                                  description="A local cluster: one JobManager and N TaskManager processes.")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    dir_help = "the cluster directory (default: $FUNKE_CLUSTER_DIR or ~/.funke/cluster)"
    start = cluster_commands.add_parser("start", help="start a JobManager and TaskManagers", allow_abbrev=False)
    start.set_defaults(handler=cmd_cluster_start)
    start.add_argument("--taskmanagers", type=_non_negative_int, default=2, metavar="N", help="default: 2")
    start.add_argument("--slots", type=_positive_int, default=2, metavar="S", help="slots per TaskManager (default: 2)")
    start.add_argument("--dir", help=dir_help)
    start.add_argument("--port", type=_port, default=0, help="the JobManager's port (default: 0, a free one)")
    start.add_argument("--data-dir", help="the JobManager's data dir (default: <dir>/data)")
    start.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                       help="JobManager configuration, e.g. -D restart-strategy.type=fixed-delay")
    start.add_argument("--host", help="the address every process binds (default: 127.0.0.1; 0.0.0.0 lets other "
                       "machines reach them, advertising this machine's address)")
    spark = start.add_mutually_exclusive_group()
    spark.add_argument("--no-spark", action="store_true", help="TaskManagers without Spark (no-op jobs only)")
    spark.add_argument("--spark-master", metavar="URL",
                       help="the TaskManagers' Spark master, e.g. spark://host:7077 (default: local[<slots>] each)")
    spark.add_argument("--spark-remote", metavar="URL",
                       help="a Spark Connect server (sc://host:15002) for every TaskManager instead")
    spark.add_argument("--spark", choices=["local", "standalone"], default="local",
                       help="'standalone': start a Spark standalone master and workers from pip's PySpark for "
                       "the TaskManagers' Spark stages (default: local, each TaskManager its own local[<slots>])")
    start.add_argument("--workers", type=_positive_int, metavar="N",
                       help="with --spark standalone: how many Spark workers (default: 2)")
    start.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                       help="Spark configuration for every TaskManager (repeatable)")
    start.add_argument("--timeout", type=float, default=120, help="seconds to wait for startup (default: 120)")
    tls = start.add_mutually_exclusive_group()
    tls.add_argument("--tls", action="store_true", help="serve every gRPC port with TLS: a certificate authority "
                     "for this cluster and certificates for this machine are made in <dir>/security/tls")
    tls.add_argument("--mtls", action="store_true", help="mutual TLS: as --tls, and every caller (TaskManagers, "
                     "the JobManager, clients) shows a certificate the cluster's CA signed")
    start.add_argument("--tls-host", action="append", default=[], metavar="HOST",
                       help="with --tls/--mtls: another name or address the processes' certificate is valid for "
                       "(a machine whose TaskManagers use it; repeatable)")
    tls.add_argument("--insecure", action="store_true", help="with --host off loopback: serve without TLS anyway "
                     "(tokens, jobs and data cross the network in the clear)")
    start.add_argument("--ha", choices=list(localcluster.HA_MODES), default="none",
                       help="high availability: 'filesystem' elects a leader among the JobManagers through a "
                            "lease in <dir>/ha and keeps jobs there across JobManager failures; 'zookeeper' does "
                            "so on ZooKeeper (default: none)")
    start.add_argument("--zookeeper-quorum", metavar="HOST:PORT[,...]",
                       help="with --ha zookeeper: the ZooKeeper to use (default: start one for the cluster, "
                            "from the Debian package zookeeper)")
    start.add_argument("--jobmanagers", type=_positive_int, default=1, metavar="N",
                       help="JobManagers to start: one leads, the others stand by (needs --ha; default: 1)")
    secrets = cluster_commands.add_parser(
        "secrets", help="make the cluster's tokens (and with --tls/--mtls its certificates) without starting "
        "anything, e.g. to copy them to the hosts of a cluster across machines", allow_abbrev=False)
    secrets.set_defaults(handler=cmd_cluster_secrets)
    secrets.add_argument("--dir", help=dir_help)
    secrets_tls = secrets.add_mutually_exclusive_group()
    secrets_tls.add_argument("--tls", action="store_true", help="a certificate authority and certificates too")
    secrets_tls.add_argument("--mtls", action="store_true", help="as --tls, marked for mutual TLS")
    secrets.add_argument("--host", help="the address this machine's processes bind (for the certificate)")
    secrets.add_argument("--tls-host", action="append", default=[], metavar="HOST",
                         help="another name or address the processes' certificate is valid for (repeatable)")
    stop = cluster_commands.add_parser("stop", help="stop the cluster's processes", allow_abbrev=False)
    stop.set_defaults(handler=cmd_cluster_stop)
    stop.add_argument("--dir", help=dir_help)
    stop.add_argument("--timeout", type=float, default=15, help="seconds before SIGKILL (default: 15)")
    kill = cluster_commands.add_parser("kill", help="SIGKILL one of the cluster's processes (and what it started), "
                                       "as if its machine died", allow_abbrev=False)
    kill.set_defaults(handler=cmd_cluster_kill)
    kill.add_argument("name", metavar="NAME", help="tm-1, jobmanager, ... (see funke cluster status)")
    kill.add_argument("--dir", help=dir_help)
    add_jm = cluster_commands.add_parser(
        "add-jobmanager", help="start a JobManager in a high-availability cluster: a dead one again, one more "
        "standby, or the first again after every JobManager died (the TaskManagers and stored jobs wait for it)",
        allow_abbrev=False)
    add_jm.set_defaults(handler=cmd_cluster_add_jobmanager)
    add_jm.add_argument("name", metavar="NAME", nargs="?", help="e.g. jobmanager-3 (default: the first of "
                        "jobmanager, jobmanager-2, ... not running)")
    add_jm.add_argument("--dir", help=dir_help)
    add_jm.add_argument("--timeout", type=float, default=60,
                        help="seconds to wait for it to serve and for a leader (default: 60)")
    add = cluster_commands.add_parser("add-taskmanager", help="start a TaskManager in the running cluster (a new "
                                      "one, or a dead one again), with the cluster's TaskManager options",
                                      allow_abbrev=False)
    add.set_defaults(handler=cmd_cluster_add_taskmanager)
    add.add_argument("name", metavar="NAME", help="e.g. tm-3")
    add.add_argument("--slots", type=_positive_int, default=2, metavar="S", help="default: 2")
    add.add_argument("--dir", help=dir_help)
    add.add_argument("--timeout", type=float, default=120, help="seconds to wait for its registration (default: 120)")
    status = cluster_commands.add_parser("status", help="the cluster's processes and slots", allow_abbrev=False)
    status.set_defaults(handler=cmd_cluster_status)
    status.add_argument("--dir", help=dir_help)
    status.add_argument("--json", action="store_true")

    # Their arguments are passed through untouched (main dispatches before parsing); listed
    # here for the help text.
    commands.add_parser("jobmanager", help="run a JobManager process (see `funke jobmanager --help`)", add_help=False)
    commands.add_parser("taskmanager", help="run a TaskManager process (see `funke taskmanager --help`)", add_help=False)

    submit = command("submit", cmd_submit, "submit a job file and, unless --detach, follow it to its end")
    submit.add_argument("--detach", action="store_true", help="print the job id and return at once")
    submit.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    submit.add_argument("file", help="a Python file defining build(args) or a module-level `job`")
    submit.add_argument("job_args", nargs=argparse.REMAINDER,
                        help="arguments for the job's build(args); put them after `--` if they clash with ours")

    p = command("list", cmd_list, "list the jobs")
    p.add_argument("--json", action="store_true")
    p = command("status", cmd_status, "a job's status, history, subtasks and failures")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")
    p = command("watch", cmd_watch, "print a job's events until it ends (exit 0 if it FINISHED)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p = command("cancel", cmd_cancel, "cancel a job")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")
    p = command("stop", cmd_stop, "stop a streaming query gracefully: no new batch; the batches in flight finish "
                "and commit, later logged ones are not run (they wait in the offset log for the next run); the job "
                "ends FINISHED (exit 0), or, not done within --timeout, is cancelled: CANCELED (exit 1)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--drain", action="store_true",
                   help="run the logged batches too, then process everything the sources hold now")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="cancel the job if it has not ended by then: CANCELED, exit 1 (default 60)")
    p.add_argument("--detach", action="store_true", help="return at once instead of following the job to its end")
    p.add_argument("--json", action="store_true")
    p = command("progress", cmd_progress, "a streaming query's recent micro-batches (the last 100)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true", help="Structured Streaming's progress records, as JSON")
    p = command("result", cmd_result, "the rows a job collected (FINISHED, or a streaming query's committed batches)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--vertex", help="the collect sink's vertex id (needed when the job has several)")
    p.add_argument("--json", action="store_true")
    p = command("conformance", cmd_conformance,
                "run scenario jobs on the cluster and check every job and task moves only along the legal "
                "paths of the state machines (exit 0 only if every scenario passes)")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run only these scenarios")
    p.add_argument("--list", action="store_true", help="list the scenarios and their expected paths")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--junit", metavar="FILE", help="also write the outcome as JUnit XML")
    p.add_argument("--destructive", action="store_true",
                   help="also run the scenarios that stop a TaskManager (they need --kill-command)")
    p.add_argument("--kill-command", metavar="CMD", help="a shell command that kills TaskManager {taskmanager}, "
                   "e.g. 'funke cluster kill {taskmanager}' for a local cluster")
    p.add_argument("--restore-command", metavar="CMD", help="a shell command that starts it again, e.g. "
                   "'funke cluster add-taskmanager {taskmanager}'")
    return parser


def _int_arg(check: Callable[[int], bool], what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{what}, got {value}")
        return value
    return parse


_positive_int = _int_arg(lambda v: v >= 1, "must be at least 1")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


_non_negative_int = _int_arg(lambda v: v >= 0, "must be 0 or more")
_port = _int_arg(lambda v: 0 <= v <= 65535, "must be a port number (0-65535)")


def _key_value(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _error(message: str) -> None:
    print(f"funke: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("jobmanager", "taskmanager"):
        return _run_process(argv[0], argv[1:])
    after_dashes: list[str] = []
    if argv and argv[0] == "submit" and "--" in argv:
        cut = argv.index("--")
        argv, after_dashes = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error or the help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "submit":
            _split_submit_args(args, after_dashes)
        return args.handler(args)
    except (NotAJobManager, NotAuthenticated, SecurityError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except StandbyJobManager as exc:  # a JobManager answered: the cluster runs, led elsewhere
        _error(str(exc))
        return EXIT_USAGE
    except JobManagerUnavailable as exc:
        _error(str(exc) if exc.tls_hint else f"{exc}; {_START_HINT}")
        return EXIT_USAGE
    except JobManagerConnectionLost as exc:
        _error(str(exc))
        return EXIT_UNSUCCESSFUL
    except JobNotFound as exc:
        _error(exc.details)
        return EXIT_USAGE
    except InvalidJobGraph as exc:
        _error(f"the job graph is invalid ({len(exc.problems)} problem(s)):")
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_USAGE
    except JobFileError as exc:
        _error(str(exc))
        if exc.user_traceback:
            print(exc.user_traceback.rstrip(), file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except FunkeError as exc:
        _error(str(exc))
        return EXIT_UNSUCCESSFUL
    except localcluster.ClusterError as exc:
        _error(str(exc))
        return EXIT_UNSUCCESSFUL
    except SystemExit as exc:  # a job file's own argument parser (e.g. its --help)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
