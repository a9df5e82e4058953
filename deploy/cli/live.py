"""A job followed while it runs (`funke submit`, and the demos): its WatchJob events folded into
per-vertex subtask states (`JobProgress`) and shown as they change (`LiveView`): on a terminal one
display rich redraws in place, elsewhere one plain line per change."""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from funke.deploy.cli.render import (
    GLOBALLY_TERMINAL,
    format_counts,
    format_duration,
    render_event,
    render_progress_line,
    seconds_of,
)
from funke.deploy.client import JobManagerClient, JobManagerConnectionLost, execution_state_name, job_status_name
from funke.v1 import jobmanager_pb2


T = TypeVar("T")


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
            self.created_at = seconds_of(d.created_at)
            if self.status in GLOBALLY_TERMINAL and d.status_history:
                self.ended_at = seconds_of(d.status_history[-1].timestamp)
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
                self.ended_at = seconds_of(event.job_status.timestamp)
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


class LiveView:
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
    view = LiveView(progress, out, tty)
    try:
        _follow(client, job_id, progress, view, quiet, err)
    except JobManagerConnectionLost as exc:
        if not quiet:
            view.finish()
        raise JobManagerConnectionLost(client.address, job_id, exc.details, progress.status, exc.code) from None
    if not quiet:
        view.finish()
    return progress


def _follow(client: JobManagerClient, job_id: str, progress: JobProgress, view: "LiveView", quiet: bool,
            err: TextIO) -> None:
    for event in _with_ticks(client.watch(job_id), LiveView.REDRAW_S):
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
