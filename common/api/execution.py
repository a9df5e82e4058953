"""What `ExecutionEnvironment.execute()` hands a job to (Flink's PipelineExecutor, found as
Flink's PipelineExecutorServiceLoader finds it).

The DSL describes a job and nothing else; running one takes a client, a cluster and perhaps
starting one, all of which live floors above (`funke.deploy.execution`). So the DSL asks for an
executor: the one set for the current context (`executor_context`: `funke submit` loading a job
file sets one that only captures the job graph), else the one installed under the entry-point
group `funke.executors` (name `default`), which the `funke` distribution registers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any, Protocol

from funke.common.graph.jobgraph import JobGraph

__all__ = ["EXECUTORS_GROUP", "JobCaptured", "PipelineExecutor", "capturing", "current_executor", "executor_context"]

EXECUTORS_GROUP = "funke.executors"
DEFAULT_EXECUTOR = "default"


class PipelineExecutor(Protocol):
    def execute(self, job: JobGraph, *, wait: bool, **options: Any) -> Any:
        """Run `job`: with `wait`, until it ends (a JobExecutionResult); else return at once (a
        JobClient)."""


_context: contextvars.ContextVar[PipelineExecutor | None] = contextvars.ContextVar("funke_executor", default=None)


@contextlib.contextmanager
def executor_context(executor: PipelineExecutor) -> Iterator[None]:
    """`executor` runs whatever `execute()` is called with inside the block."""
    token = _context.set(executor)
    try:
        yield
    finally:
        _context.reset(token)


def current_executor() -> PipelineExecutor:
    executor = _context.get()
    if executor is not None:
        return executor
    found = [e for e in entry_points(group=EXECUTORS_GROUP) if e.name == DEFAULT_EXECUTOR]
    if not found:
        raise RuntimeError(f"no funke executor is installed (entry point group {EXECUTORS_GROUP!r}): "
                           "install the funke distribution (pip install funke, or pip install -e . in a checkout)")
    return found[0].load()()


class JobCaptured(BaseException):
    """Raised by `execute()` under `capturing()`: the job graph is all the caller wanted (Flink's
    ProgramAbortException when a client extracts a program's plan). A BaseException, so that a
    script's `except Exception` does not swallow it."""

    def __init__(self, job: JobGraph, wait: bool):
        super().__init__(f"job {job.name!r} captured")
        self.job = job
        self.wait = wait


class _Capture:
    def execute(self, job: JobGraph, *, wait: bool, **options: Any) -> Any:
        raise JobCaptured(job, wait)


def capturing() -> contextlib.AbstractContextManager[None]:
    """Inside the block `execute()` and `execute_async()` raise JobCaptured with the job graph
    instead of running it: how `funke submit` takes the job of a script written to run alone."""
    return executor_context(_Capture())
