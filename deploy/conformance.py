"""`funke conformance`: the state-machine conformance kit, run against any live cluster.

Each scenario submits a small job built to take one path through Flink's job state machine (a
job that finishes, a user function failing with and without restarts, region and full failover,
cancellation from each live status, a job waiting for slots the cluster does not have), follows
its WatchJob stream, and checks:

- every step of the job and of every execution attempt against the transition tables of the
  specification (`funke.common.conformance`, written out independently of the implementation),
  in order and in time; nothing of the job moves after it ended;
- the job's path (its statuses from CREATED on) against the scenario's expected path;
- the scenario's own points (a failure keeps the Python traceback, the root cause comes first,
  the waiting message names what is missing...);
- that it left nothing behind: the job ended, every slot is free again. Sinks are `discard()`
  and `collect()`, so no files are written; the job stays in the cluster's job history, as every
  ended job does.

The functions the jobs run are defined here, so a TaskManager imports them from its own funke
installation. A function that must fail once, then succeed, leaves a marker file in the
temporary directory of the TaskManager's machine, named after the run; its failing subtask
runs at parallelism 1, so on a cluster of several machines a retried subtask that lands on
another machine may fail once more: the expected paths allow repeated restarts.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from funke.common.conformance import ConformanceError, Step, assert_event_stream
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.jobgraph import JobGraph
from funke.deploy.cli.render import table_lines
from funke.deploy.client import JobManagerClient
from funke.v1 import job_pb2

# How long one scenario may take before it counts as failed (its job is cancelled).
SCENARIO_TIMEOUT_S = 180.0


# ---------------------------------------------------------------------------- what jobs run

def _fails_on(record: int, marker: str | None):
    """A map that raises on `record`: every time, or (with a marker path) only until the marker
    exists on this machine."""

    def check(n):
        if n == record:
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                raise RuntimeError(f"record {record} fails on purpose (funke conformance)")
        return n

    return check


def _slow(seconds: float):
    def wait(n):
        time.sleep(seconds)
        return n

    return wait


# ---------------------------------------------------------------------------- scenarios

@dataclass
class Observed:
    job_id: str
    path: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    # the job's path: statuses joined by " -> "; "(A -> B)+" once or more, "(A)?" at most once
    expected: str
    build: Callable[["Run"], JobGraph]
    # acts on the running job (cancels it at a chosen moment); None: let it run to its end
    act: Callable[["Run", str], None] | None = None
    # the scenario's own checks on the final details; returns problems
    check: Callable[["Run", job_pb2.JobDetails], list[str]] | None = None
    # only with --destructive: it stops a TaskManager of the cluster (and starts it again)
    destructive: bool = False


@dataclass
class Outcome:
    name: str
    about: str
    expected: str
    observed: str
    passed: bool
    seconds: float
    problems: list[str]
    job_id: str


class Run:
    """One run of the kit against one cluster: its client, what the cluster offers, and a token
    that names what the run leaves on TaskManager machines (fail-once markers)."""

    def __init__(self, client: JobManagerClient, kill_command: str = "", restore_command: str = ""):
        self.client = client
        self.token = uuid.uuid4().hex[:12]
        overview = client.cluster_overview()
        self.slots = overview.slots_total
        self.kill_command, self.restore_command = kill_command, restore_command
        self.killed: list[str] = []  # TaskManagers the run stopped, to start again
        self.seen: dict[str, str] = {}  # job id -> the waiting message seen while it ran

    def shell(self, template: str, task_manager: str) -> None:
        """Run a --kill-command / --restore-command with {taskmanager} filled in."""
        command = template.replace("{taskmanager}", shlex.quote(task_manager))
        result = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise ConformanceError(f"`{command}` exited {result.returncode}: {(result.stderr or result.stdout)[-300:]}")

    def marker(self, scenario: str) -> str:
        return os.path.join(tempfile.gettempdir(), f"funke-conformance-{self.token}-{scenario}")

    def env(self, scenario: str, **kw) -> ExecutionEnvironment:
        return ExecutionEnvironment(f"conformance: {scenario}", **kw)


def _finishes(run: Run) -> JobGraph:
    env = run.env("finishes", parallelism=2)
    env.from_range(100).map(_slow(0.0), schema="id bigint").collect()
    return env.build()


def _check_finished_rows(run: Run, details) -> list[str]:
    rows = run.client.result(details.job_id)
    got = sorted(r["id"] for r in rows)
    return [] if got == list(range(100)) else [f"collected {len(got)} rows, not the ids 0..99"]


def _failing(name: str, attempts: int, failover: str = "region", once: bool = False, delay: str = "200 ms"):
    def build(run: Run) -> JobGraph:
        env = run.env(name, parallelism=1)
        if attempts:
            env.set_restart_strategy("fixed-delay", attempts=attempts, delay=delay)
        env.set_failover_strategy(failover)
        (env.from_range(20).map(_fails_on(7, run.marker(name) if once else None), schema="id bigint")
            .rebalance().map(_slow(0.0), schema="id bigint").set_parallelism(2).discard())
        return env.build()

    return build


def _check_failure_kept(run: Run, details) -> list[str]:
    problems = []
    failed = [e for e in details.exceptions if e.task_name]
    if not failed:
        problems.append("no task failure recorded")
    elif not all("in check" in e.failure.traceback for e in failed):
        problems.append("a task failure lost the Python traceback of the function that raised")
    if not details.failure.message.startswith("record 7 fails on purpose"):
        problems.append(f"the job's failure does not start with the root cause: {details.failure.message[:120]!r}")
    return problems


def _check_exhausted(run: Run, details) -> list[str]:
    problems = _check_failure_kept(run, details)
    failed = [e for e in details.exceptions if e.task_name]
    if len(failed) != 3:
        problems.append(f"{len(failed)} task failures recorded, expected 3 (the first run and 2 restarts)")
    return problems


def _check_region_failover(run: Run, details) -> list[str]:
    """The failing chain (source -> map, parallelism 1) is its own region behind a BLOCKING
    exchange: it runs again, its consumers run once."""
    source, *consumers = details.vertices
    problems = []
    if not all(s.current.id.attempt_number >= 1 for s in source.subtasks):
        problems.append("the failed region (the source's chain) did not run again")
    again = [f"{v.id}[{s.subtask_index}]" for v in consumers for s in v.subtasks if s.current.id.attempt_number]
    if again:
        problems.append(f"{', '.join(again)} ran again, though their regions never failed")
    return problems


def _cancel_when(condition: Callable[[job_pb2.JobDetails], bool], what: str):
    def act(run: Run, job_id: str) -> None:
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S / 2
        while time.monotonic() < deadline:
            details = run.client.get_job(job_id)
            if condition(details):
                run.client.cancel(job_id)
                return
            if _status(details.status) in ("FINISHED", "FAILED", "CANCELED"):
                raise ConformanceError(f"the job ended {_status(details.status)} before it was {what}")
            time.sleep(0.05)
        raise ConformanceError(f"the job was never {what}")

    return act


def _cancel_at_once(run: Run, job_id: str) -> None:
    run.client.cancel(job_id)


def _long_running(name: str):
    def build(run: Run) -> JobGraph:
        env = run.env(name, parallelism=1)
        env.from_range(600).map(_slow(0.1), schema="id bigint").discard()
        return env.build()

    return build


def _too_wide(name: str, timeout: float | None):
    def build(run: Run) -> JobGraph:
        env = run.env(name, job_type="streaming", parallelism=run.slots + 1)
        if timeout:
            env.set_slot_request_timeout(timeout)
        env.from_range(run.slots + 1).discard()
        return env.build()

    return build


def _see_waiting(run: Run, job_id: str) -> None:
    """Wait for the job's waiting message (what it waits for), then let the timeout fail it."""
    deadline = time.monotonic() + SCENARIO_TIMEOUT_S / 2
    while time.monotonic() < deadline:
        details = run.client.get_job(job_id)
        if details.waiting_for_resources:
            run.seen[job_id] = details.waiting_for_resources
            return
        if _status(details.status) in ("FINISHED", "FAILED", "CANCELED"):
            raise ConformanceError(f"the job ended {_status(details.status)} without saying what it waited for")
        time.sleep(0.05)
    raise ConformanceError("the job never said it was waiting for slots")


def _check_waited(run: Run, details) -> list[str]:
    problems = []
    waiting = run.seen.get(details.job_id, "")
    if "slot" not in waiting.lower():
        problems.append(f"the waiting message does not speak of slots: {waiting[:160]!r}")
    if "slot" not in details.failure.message.lower():
        problems.append(f"the failure does not say slots were missing: {details.failure.message[:160]!r}")
    return problems


def _running(details) -> bool:
    return _status(details.status) == "RUNNING" and any(
        _state(s.current.state) == "RUNNING" for v in details.vertices for s in v.subtasks)


def _streaming(run: Run) -> JobGraph:
    # A fixed name, so the checkpoint directory the query keeps (<data dir>/checkpoints/...) is
    # the same one every run; a rate source's offsets are computed, so resuming costs nothing.
    env = run.env("graceful-stop", parallelism=1)
    env.read_stream.rate(50, max_rows_per_trigger=100).discard()
    env.set_trigger("200 ms")
    return env.build()


def _stop_after_batches(run: Run, job_id: str) -> None:
    deadline = time.monotonic() + SCENARIO_TIMEOUT_S / 2
    while len(run.client.progress(job_id)) < 2:
        if time.monotonic() > deadline:
            raise ConformanceError("the streaming query never completed 2 batches")
        time.sleep(0.1)
    run.client.stop(job_id)


def _check_stopped(run: Run, details) -> list[str]:
    batches = run.client.progress(details.job_id)
    return [] if len(batches) >= 2 else [f"{len(batches)} batch(es) in the progress records, expected at least 2"]


def _long_job(run: Run) -> JobGraph:
    env = run.env("taskmanager-lost", parallelism=1)
    env.set_restart_strategy("fixed-delay", attempts=3, delay="500 ms")
    env.set_failover_strategy("region")
    env.from_range(40).map(_slow(0.25), schema="id bigint").discard()
    return env.build()


def _kill_its_taskmanager(run: Run, job_id: str) -> None:
    if len(run.client.cluster_overview().task_managers) < 2:
        raise ConformanceError("losing a TaskManager needs at least 2 in the cluster (the task must run elsewhere)")
    if not run.kill_command:
        raise ConformanceError("--destructive needs --kill-command (and --restore-command), e.g. "
                               "'funke cluster kill {taskmanager}'")
    deadline = time.monotonic() + SCENARIO_TIMEOUT_S / 2
    while time.monotonic() < deadline:
        details = run.client.get_job(job_id)
        hosts = [s.current.task_manager_id for v in details.vertices for s in v.subtasks
                 if _state(s.current.state) == "RUNNING"]
        if hosts:
            run.killed.append(hosts[0])
            run.shell(run.kill_command, hosts[0])
            return
        time.sleep(0.05)
    raise ConformanceError("the job's task never ran")


def _check_ran_elsewhere(run: Run, details) -> list[str]:
    problems = []
    killed = run.killed[-1] if run.killed else ""
    if not any(killed and killed in e.failure.message for e in details.exceptions):
        problems.append(f"no failure names the lost TaskManager {killed}")
    elsewhere = [s.current.task_manager_id for v in details.vertices for s in v.subtasks]
    if killed in elsewhere:
        problems.append(f"the task's last attempt ran on {killed}, the TaskManager that was killed")
    if run.restore_command and killed:
        run.shell(run.restore_command, killed)
        run.killed.remove(killed)
    return problems


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("finishes", "a bounded job runs to its end; its collected rows are all there",
             "CREATED -> RUNNING -> FINISHED", _finishes, check=_check_finished_rows),
    Scenario("fails-without-restart", "a user function raises, no restart strategy: the job fails, "
             "the Python traceback kept", "CREATED -> RUNNING -> FAILING -> FAILED",
             _failing("fails-without-restart", 0), check=_check_failure_kept),
    Scenario("restarts-exhausted", "fixed-delay, 2 attempts, a function that always fails: the "
             "root cause comes first", "CREATED -> RUNNING -> FAILING -> FAILED",
             _failing("restarts-exhausted", 2), check=_check_exhausted),
    Scenario("region-failover", "a function fails once; region failover restarts its region and "
             "the job stays RUNNING", "CREATED -> RUNNING -> FINISHED",
             _failing("region-failover", 3, once=True), check=_check_region_failover),
    Scenario("full-failover", "a function fails once; full failover restarts the whole job",
             "CREATED -> RUNNING -> (FAILING -> RESTARTING -> CREATED -> RUNNING)+ -> FINISHED",
             _failing("full-failover", 3, failover="full", once=True)),
    Scenario("cancel-at-once", "cancelled right after submission, whatever it reached",
             "CREATED -> (RUNNING)? -> CANCELLING -> CANCELED", _long_running("cancel-at-once"), act=_cancel_at_once),
    Scenario("cancel-running", "cancelled while its tasks run", "CREATED -> RUNNING -> CANCELLING -> CANCELED",
             _long_running("cancel-running"), act=_cancel_when(_running, "RUNNING")),
    Scenario("cancel-restarting", "cancelled during the restart delay (60 s)",
             "CREATED -> RUNNING -> FAILING -> RESTARTING -> CANCELLING -> CANCELED",
             _failing("cancel-restarting", 3, failover="full", delay="60 s"),
             act=_cancel_when(lambda d: _status(d.status) == "RESTARTING", "RESTARTING")),
    Scenario("cancel-waiting-for-slots", "needs one slot more than the cluster has; cancelled while "
             "it waits in CREATED", "CREATED -> CANCELLING -> CANCELED", _too_wide("cancel-waiting-for-slots", None),
             act=_cancel_when(lambda d: bool(d.waiting_for_resources), "waiting for slots")),
    Scenario("slots-time-out", "needs one slot more than the cluster has, a 3 s slot request "
             "timeout: it waits, then fails saying so", "CREATED -> FAILING -> FAILED",
             _too_wide("slots-time-out", 3.0), act=_see_waiting, check=_check_waited),
    Scenario("graceful-stop", "a streaming query (rate -> discard, 200 ms trigger) stopped after 2 batches: "
             "its batch in flight commits, it ends FINISHED", "CREATED -> RUNNING -> FINISHED",
             _streaming, act=_stop_after_batches, check=_check_stopped),
    Scenario("taskmanager-lost", "the TaskManager running the task is killed: region failover runs it on another "
             "one, the job stays RUNNING", "CREATED -> RUNNING -> FINISHED",
             _long_job, act=_kill_its_taskmanager, check=_check_ran_elsewhere, destructive=True),
)


# ---------------------------------------------------------------------------- running them

def run_scenarios(client: JobManagerClient, only: Sequence[str] = (),
                  report: Callable[[Outcome], None] | None = None, *, destructive: bool = False,
                  kill_command: str = "", restore_command: str = "") -> list[Outcome]:
    """Run the scenarios (all, or those named in `only`; the destructive ones only when asked)
    one after the other."""
    unknown = sorted(set(only) - {s.name for s in SCENARIOS})
    if unknown:
        raise ValueError(f"unknown scenario(s): {', '.join(unknown)}; the scenarios are "
                         f"{', '.join(s.name for s in SCENARIOS)}")
    if destructive and not kill_command:
        raise ValueError("--destructive needs --kill-command, e.g. 'funke cluster kill {taskmanager}' "
                         "(and --restore-command 'funke cluster add-taskmanager {taskmanager}')")
    run = Run(client, kill_command, restore_command)
    outcomes = []
    for scenario in SCENARIOS:
        if (only and scenario.name not in only) or (scenario.destructive and not destructive):
            continue
        outcome = _run_one(run, scenario)
        outcomes.append(outcome)
        if report is not None:
            report(outcome)
    for task_manager in list(run.killed):  # a scenario that failed before it could restore
        if run.restore_command:
            run.shell(run.restore_command, task_manager)
    return outcomes


def _run_one(run: Run, scenario: Scenario) -> Outcome:
    started = time.monotonic()
    observed = Observed("")
    try:
        observed.job_id = run.client.submit(scenario.build(run))
        events: list = []
        follower = threading.Thread(target=lambda: events.extend(run.client.watch(observed.job_id)), daemon=True)
        follower.start()
        if scenario.act is not None:
            scenario.act(run, observed.job_id)
        follower.join(SCENARIO_TIMEOUT_S)
        if follower.is_alive():
            run.client.cancel(observed.job_id)
            raise ConformanceError(f"the job did not end within {SCENARIO_TIMEOUT_S:g} s (cancelled)")
        details = run.client.get_job(observed.job_id)
        # The job's whole path comes with its details (the stream starts with a snapshot taken
        # when it was opened); the executions' steps come from the stream, after the snapshot.
        job_steps = [Step("job", _status(t.from_status), _status(t.to_status), _seconds(t.timestamp), t.cause)
                     for t in details.status_history]
        observed.path = ["CREATED"] + [s.to_state for s in job_steps]
        # Every attempt's whole story from the details (the stream may open after the first
        # steps: on a busy machine a task can be RUNNING before the watcher's snapshot), then
        # the stream's own steps after its snapshot.
        observed.path = assert_event_stream(job_steps, _history_steps(details))["job"]
        snapshot, execution_steps = _execution_steps(events)
        assert_event_stream(job_steps, execution_steps, initial_executions=snapshot)
        if not re.fullmatch(_pattern(scenario.expected), " ".join(observed.path)):
            observed.problems.append(f"the job took {' -> '.join(observed.path)}")
        if scenario.check is not None:
            observed.problems += scenario.check(run, details)
        observed.problems += _left_behind(run)
    except ConformanceError as e:
        observed.problems.append(str(e))
    except Exception as e:  # the cluster refused or went away: the scenario failed, the kit goes on
        observed.problems.append(f"{type(e).__name__}: {e}")
    return Outcome(scenario.name, scenario.about, scenario.expected, " -> ".join(observed.path) or "(none)", not observed.problems, time.monotonic() - started,
                   observed.problems, observed.job_id)


def _pattern(expected: str) -> str:
    """An expected path as a regular expression over the observed statuses joined by spaces."""
    words = expected.replace(" -> ", " ") + " "
    return re.sub(r"\(([A-Z ]+)\)([+?]) ", r"(?:\1 )\2", words).rstrip()


def _left_behind(run: Run, timeout: float = 10.0) -> list[str]:
    """Every slot free again (slots are released right after the job's end, asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        overview = run.client.cluster_overview()
        if overview.slots_free == overview.slots_total:
            return []
        if time.monotonic() > deadline:
            return [f"{overview.slots_total - overview.slots_free} slot(s) still taken {timeout:g} s after the job ended"]
        time.sleep(0.1)


def _execution_steps(events: Sequence) -> tuple[dict[str, str], list[Step]]:
    """The attempts' states in the stream's opening snapshot, and every step after it."""
    if not events or events[0].WhichOneof("event") != "snapshot":
        raise ConformanceError("the WatchJob stream did not open with a snapshot of the job")
    snapshot = {f"{v.id}[{s.subtask_index}]#{s.current.id.attempt_number}": _state(s.current.state)
                for v in events[0].snapshot.vertices for s in v.subtasks}
    steps = []
    for e in events[1:]:
        if e.WhichOneof("event") == "execution_state":
            c = e.execution_state
            t = c.transition
            steps.append(Step(f"{c.attempt.vertex_id}[{c.attempt.subtask_index}]#{c.attempt.attempt_number}",
                              _state(t.from_state), _state(t.to_state), _seconds(t.timestamp), t.cause))
    return snapshot, steps


def _history_steps(details) -> list[Step]:
    """Every step of every attempt (prior and current) of every subtask, from the job's details."""
    steps = []
    for v in details.vertices:
        for s in v.subtasks:
            for attempt in (*s.prior_attempts, s.current):
                entity = f"{v.id}[{s.subtask_index}]#{attempt.id.attempt_number}"
                steps += [Step(entity, _state(t.from_state), _state(t.to_state), _seconds(t.timestamp), t.cause)
                          for t in attempt.history]
    return steps


def _seconds(ts) -> float:
    return ts.seconds + ts.nanos / 1e9


def _status(value: int) -> str:
    return job_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_")


def _state(value: int) -> str:
    return job_pb2.ExecutionState.Name(value).removeprefix("EXECUTION_STATE_")


# ---------------------------------------------------------------------------- reports

def table(outcomes: Sequence[Outcome]) -> str:
    rows = [(o.name, o.expected, o.observed, "pass" if o.passed else "FAIL", f"{o.seconds:.1f} s") for o in outcomes]
    lines = table_lines(("SCENARIO", "EXPECTED PATH", "OBSERVED PATH", "VERDICT", "TIME"), rows, prefix="")
    for o in outcomes:
        for problem in o.problems:
            lines.append(f"  {o.name}: {problem}")
    return "\n".join(lines)


def as_json(outcomes: Sequence[Outcome]) -> dict:
    return {"passed": all(o.passed for o in outcomes), "scenarios": [
        {"name": o.name, "about": o.about, "expected": o.expected, "observed": o.observed, "passed": o.passed,
         "seconds": round(o.seconds, 3), "problems": o.problems, "job_id": o.job_id} for o in outcomes]}


def junit(outcomes: Sequence[Outcome]) -> str:
    failures = sum(not o.passed for o in outcomes)
    total = sum(o.seconds for o in outcomes)
    cases = []
    for o in outcomes:
        body = "" if o.passed else f"<failure message={quoteattr('; '.join(o.problems))}>{escape(o.observed)}</failure>"
        cases.append(f'  <testcase classname="funke.conformance" name={quoteattr(o.name)} time="{o.seconds:.3f}">'
                     f"{body}</testcase>")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="funke conformance" tests="{len(outcomes)}" '
            f'failures="{failures}" time="{total:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n")
