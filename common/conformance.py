"""Conformance assertions, shared by the pure-core tests, the live-cluster tests and the
conformance kit that checks any running cluster (`funke conformance`, `deploy/conformance.py`).

They take plain records — (entity, from, to, timestamp) — so the same checks run on a
StateMachine's history, on the scheduler's actions, and on a WatchJob stream from a real
JobManager. The expected tables below are written out from the specification (Flink's
"Jobs and Scheduling" and ExecutionState), independently of `funke.common.states`: the
conformance tests assert the implementation equals them, so a table change fails a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from funke.common.states import ExecutionState, JobStatus

J, E = JobStatus, ExecutionState

EXPECTED_JOB_TRANSITIONS: dict[JobStatus, set[JobStatus]] = {
    J.CREATED: {J.RUNNING, J.CANCELLING, J.FAILING, J.SUSPENDED},
    J.RUNNING: {J.FINISHED, J.FAILING, J.CANCELLING, J.SUSPENDED},
    J.FAILING: {J.RESTARTING, J.FAILED, J.CANCELLING, J.SUSPENDED},
    J.RESTARTING: {J.CREATED, J.CANCELLING, J.FAILED, J.SUSPENDED},
    J.CANCELLING: {J.CANCELED, J.FAILED, J.SUSPENDED},
    J.FINISHED: set(),
    J.CANCELED: set(),
    J.FAILED: set(),
    J.SUSPENDED: set(),
}

EXPECTED_EXECUTION_TRANSITIONS: dict[ExecutionState, set[ExecutionState]] = {
    E.CREATED: {E.SCHEDULED, E.CANCELED, E.FAILED},
    E.SCHEDULED: {E.DEPLOYING, E.CANCELED, E.FAILED},
    E.DEPLOYING: {E.INITIALIZING, E.FINISHED, E.CANCELING, E.FAILED},
    E.INITIALIZING: {E.RUNNING, E.FINISHED, E.CANCELING, E.FAILED},
    E.RUNNING: {E.FINISHED, E.CANCELING, E.FAILED},
    E.CANCELING: {E.CANCELED, E.FAILED},
    E.FINISHED: set(),
    E.CANCELED: set(),
    E.FAILED: set(),
}

GLOBALLY_TERMINAL_JOB = {J.FINISHED, J.CANCELED, J.FAILED}


class ConformanceError(AssertionError):
    """An observed stream breaks the specification (raised, not asserted: the kit must check
    under `python -O` too)."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


@dataclass(frozen=True, slots=True)
class Step:
    """One observed transition of one entity (a job, or an execution attempt)."""

    entity: str
    from_state: str
    to_state: str
    timestamp: float
    cause: str = ""  # what the cluster said caused it, where it says


def assert_path(table: Mapping, steps: Iterable[Step], initial: str = "CREATED") -> list[str]:
    """The steps of one entity form a path through `table` starting at `initial`:
    each step starts where the previous one ended, each step is legal, time never goes back.
    Returns the path of state names."""
    by_name = {s.value: {t.value for t in targets} for s, targets in table.items()}
    path = [initial]
    last_time = float("-inf")
    for step in steps:
        _check(step.from_state == path[-1],
               f"{step.entity}: step {step.from_state}->{step.to_state} does not start at {path[-1]} (path {path})")
        _check(step.to_state in by_name.get(step.from_state, ()),
               f"{step.entity}: {step.from_state}->{step.to_state} is not in the table"
               f"{f' (cause: {step.cause})' if step.cause else ''} (path {path})")
        _check(step.timestamp >= last_time, f"{step.entity}: time went back at {step.from_state}->{step.to_state}")
        last_time = step.timestamp
        path.append(step.to_state)
    return path


def assert_job_path(steps: Iterable[Step], initial: str = "CREATED") -> list[str]:
    return assert_path(EXPECTED_JOB_TRANSITIONS, steps, initial)


def assert_execution_path(steps: Iterable[Step], initial: str = "CREATED") -> list[str]:
    return assert_path(EXPECTED_EXECUTION_TRANSITIONS, steps, initial)


def assert_event_stream(job_steps: list[Step], execution_steps: list[Step],
                        initial_job: str = "CREATED", initial_executions: Mapping[str, str] | None = None,
                        require_terminal: bool = True) -> dict[str, list[str]]:
    """A whole job's stream: the job's steps are one legal path; each execution attempt's
    steps are a legal path; the job ends globally terminal (if required) and nothing of the job
    happens after that; when the job FINISHED, every execution's last state is FINISHED.
    Returns the paths by entity ("job" for the job)."""
    paths = {"job": assert_job_path(job_steps, initial_job)}
    by_entity: dict[str, list[Step]] = {}
    for step in execution_steps:
        by_entity.setdefault(step.entity, []).append(step)
    initial_executions = initial_executions or {}
    for entity, steps in by_entity.items():
        paths[entity] = assert_execution_path(steps, initial_executions.get(entity, "CREATED"))
    final = paths["job"][-1]
    if require_terminal:
        _check(final in {s.value for s in GLOBALLY_TERMINAL_JOB}, f"job ended in {final}, not a globally terminal status")
        end = job_steps[-1].timestamp if job_steps else float("-inf")
        late = [s for s in execution_steps if s.timestamp > end + 1e-9 and s.to_state not in ("CANCELED", "FAILED")]
        _check(not late, f"executions progressed after the job ended {final}: {late[:3]}")
    if final == "FINISHED":
        # the newest attempt of every subtask must have finished
        newest: dict[str, tuple[int, str]] = {}
        for entity, path in paths.items():
            if entity == "job":
                continue
            vertex, _, attempt = entity.rpartition("#")
            n = int(attempt) if attempt.isdigit() else 0
            if vertex not in newest or n >= newest[vertex][0]:
                newest[vertex] = (n, path[-1])
        unfinished = {v: st for v, (_, st) in newest.items() if st != "FINISHED"}
        _check(not unfinished, f"job FINISHED but these subtasks did not: {unfinished}")
    return paths


def steps_from_history(entity: str, history) -> list[Step]:
    """Steps from a StateMachine history (funke.common.states.Transition records)."""
    return [Step(entity, t.from_state.value, t.to_state.value, t.timestamp) for t in history]
