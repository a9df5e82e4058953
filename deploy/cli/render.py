"""How `funke` shows jobs to people (text) and to scripts (`--json`): times, durations, state
counts, a job's details and status history, failures, events, micro-batch progress, result rows,
and the tables they sit in (rich, rendered to plain text: the same in a pipe as on a terminal)."""

from __future__ import annotations

import datetime
import io
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.table import Table
from rich.text import Text

from funke.deploy.client import execution_state_name, job_status_name
from funke.v1 import job_pb2, jobgraph_pb2, jobmanager_pb2


ROWS_SHOWN_AFTER_SUBMIT = 20


GLOBALLY_TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})


# ExecutionState in lifecycle order, for "2 RUNNING, 2 FINISHED".
_STATE_ORDER = [execution_state_name(v) for v in job_pb2.ExecutionState.values() if v]


def seconds_of(ts: Timestamp) -> float | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.seconds + ts.nanos / 1e9


def format_time(ts: Timestamp, with_date: bool = True) -> str:
    """Local time to the millisecond; "-" for an unset timestamp."""
    seconds = seconds_of(ts)
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


def first_line(text: str) -> str:
    """Causes can carry a whole traceback; a one-line listing shows its first line."""
    lines = text.strip().splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""


def indent(text: str, prefix: str) -> list[str]:
    return [prefix + line if line else line for line in text.rstrip("\n").splitlines()]


def table_lines(header: Sequence[str], rows: Iterable[Sequence[str]], prefix: str = "  ",
                show_header: bool = True) -> list[str]:
    """A table as lines of plain text: the header (unless not `show_header`), then a line per row,
    columns two blanks apart and as wide as their widest cell (rich measures the cells: wide
    characters count double)."""
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="none",
                  show_header=show_header)
    for title in header:
        table.add_column(Text(title), no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    text = io.StringIO()
    Console(file=text, width=_UNBOUNDED, color_system=None, force_terminal=False, markup=False, emoji=False,
            highlight=False).print(table)
    return [(prefix + line).rstrip() for line in text.getvalue().splitlines()]


# Wide enough that no table is ever wrapped or cut: a pipe or a file has no width.
_UNBOUNDED = 100_000


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)  # Decimal, and anything else Arrow hands back


def to_dict(message: Message) -> dict[str, Any]:
    # Every field printed, defaults included: subtask 0 and attempt 0 are real values that
    # scripts must find.
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def print_json(value: Any, out: TextIO | None = None) -> None:
    print(json.dumps(value, default=_json_default, ensure_ascii=False), file=out or sys.stdout, flush=True)


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
    start, end = seconds_of(entries[0][1]), seconds_of(entries[-1][1])
    took = f"  ({format_duration(end - start)})" if start is not None and end is not None and len(entries) > 1 else ""
    rows = [(format_time(when), status, first_line(cause)) for status, when, cause in entries]
    return [f"status history: {path}{took}", *table_lines(("", "", ""), rows, prefix, show_header=False)]


def rescale_state_name(value: int) -> str:
    return job_pb2.RescaleState.Name(value).removeprefix("RESCALE_STATE_")


def render_rescales(details: job_pb2.JobDetails, prefix: str = "  ") -> list[str]:
    """A streaming query's live rescales, oldest first: what each changed, its path with how long
    it took, each state with the time it was entered and why (FAILED: why it failed)."""
    if not details.rescales:
        return []
    lines = [f"rescales ({len(details.rescales)}):"]
    for r in details.rescales:
        entries = [("REQUESTED", r.requested_at, "")] + [(rescale_state_name(t.to_state), t.timestamp, t.cause)
                                                         for t in r.history]
        start, end = seconds_of(entries[0][1]), seconds_of(entries[-1][1])
        took = f"  ({format_duration(end - start)})" if start is not None and end is not None and len(entries) > 1 else ""
        after = f" after batch {r.last_batch_id}" if r.last_batch_id >= 0 else ""
        lines.append(f"{prefix}{r.cause}{after}: {' -> '.join(state for state, _, _ in entries)}{took}")
        rows = [(format_time(when), state, first_line(cause)) for state, when, cause in entries]
        lines += table_lines(("", "", ""), rows, prefix + "  ", show_header=False)  # FAILED's cause: why
    return lines


def render_failure(failure: job_pb2.Failure, prefix: str = "  ") -> list[str]:
    """`Type: message` (the root cause first), then the Python traceback."""
    head = f"{failure.exception_type}: {failure.message}" if failure.exception_type else failure.message
    lines = indent(head or "(no message)", prefix)
    if failure.traceback:
        lines += indent(failure.traceback, prefix + "  ")
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
    lines += render_rescales(details)
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
            lines += table_lines(["SUBTASK", "STATE", "ATTEMPT", "TASKMANAGER", "SLOT"], rows, prefix="    ")
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
    return table_lines(list(columns), [[_cell(r.get(c)) for c in columns] for r in rows], prefix)


def render_summary_table(jobs: Sequence[job_pb2.JobSummary], now: float) -> str:
    if not jobs:
        return "no jobs"
    rows = []
    for j in sorted(jobs, key=lambda j: seconds_of(j.created_at) or 0):
        created = seconds_of(j.created_at)
        if seconds_of(j.ended_at) is not None:
            duration = format_duration(j.duration_seconds)
        elif created is not None:
            duration = format_duration(max(now - created, 0)) + " so far"
        else:
            duration = "-"
        rows.append([j.job_id, j.name, job_status_name(j.status), format_time(j.created_at), duration,
                     format_counts(dict(j.tasks_per_state))])
    return "\n".join(table_lines(["JOB ID", "NAME", "STATUS", "CREATED", "DURATION", "TASKS"], rows, prefix=""))


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
        why = f"  ({first_line(t.cause)})" if t.cause else ""
        return [f"{format_time(t.timestamp, with_date=False)}  job {job_status_name(t.from_status)} -> "
                f"{job_status_name(t.to_status)}{why}"]
    if kind == "execution_state":
        c = event.execution_state
        t = c.transition
        where = f" on {c.task_manager_id}" if c.task_manager_id else ""
        # A failure's cause repeats the failure, which follows in full.
        why = f"  ({first_line(t.cause)})" if t.cause and not c.HasField("failure") else ""
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
    watermark = (p.get("eventTime") or {}).get("watermark")
    if watermark:
        parts.append(f"watermark {watermark}")
    if p.get("numLateRows"):
        parts.append(f"{p['numLateRows']} late rows")
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
    lines += table_lines(["BATCH", "TIMESTAMP", "ROWS", "IN ROWS/S", "DONE ROWS/S", "OFFSETS MS", "WAL MS", "ADD MS",
                     "COMMIT MS", "TOTAL MS", "SCHED DELAY", "TOTAL DELAY"], rows, prefix="")
    return lines + render_sources(records[-1]) + render_event_time(records[-1]) + render_state(records[-1])


def render_event_time(p: dict[str, Any]) -> list[str]:
    """A progress record's event time: the batch's earliest, average and latest event times, the
    watermark it ran with, and the rows its windows found late."""
    times = p.get("eventTime")
    if not isinstance(times, dict) or "numLateRows" not in p:
        return []
    seen = ", ".join(f"{k} {times[k]}" for k in ("min", "avg", "max") if k in times) or "no event times"
    return [f"event time of batch {p.get('batchId')}: {seen}; watermark {times.get('watermark', 'none yet')}; "
            f"{p.get('numLateRows', 0)} late rows"]


def render_state(p: dict[str, Any]) -> list[str]:
    """A progress record's keyed operators: keys held and written, the state's files."""
    operators = p.get("stateOperators") or []
    if not operators:
        return []
    lines = [f"state after batch {p.get('batchId')}:"]
    for o in operators:
        lines.append(f"  {o.get('operatorName', '')}: {o.get('numRowsTotal', 0)} keys, {o.get('numRowsUpdated', 0)} "
                     f"updated, {o.get('numRowsRemoved', 0)} removed, {_bytes(o.get('checkpointBytesWritten'))} "
                     f"written, {_bytes(o.get('stateOnDiskBytes'))} on disk in {o.get('numKeyGroups', '?')} key "
                     f"groups, about {_bytes(o.get('memoryUsedBytes'))} in memory, {o.get('allUpdatesTimeMs', 0)} ms "
                     f"updating and {o.get('commitTimeMs', 0)} ms committing")
    return lines


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return ""


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
