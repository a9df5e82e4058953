"""Job files: running a user's Python file to get the JobGraph it describes.

Owns the contract of a job file (`build(args)` or a module-level `job`, either a JobGraph or an
ExecutionEnvironment) and what running one takes: its own directory on `sys.path` so it can import
its neighbours, its own `sys.argv`, and registering it and its neighbour modules with cloudpickle
so that the functions they define travel by value to the TaskManagers (which cannot import them).
This is client-side machinery that changes the interpreter's module state; it lives here, beside
the client, not in the pure core.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
import types
import warnings
from collections.abc import Sequence
from pathlib import Path

from funke.common.api.execution import JobCaptured, capturing
from funke.common.graph.jobgraph import JobGraph
from funke.common.moved import FunkeDeprecationWarning
from funke.deploy.client import FunkeError, InvalidJobGraph

__all__ = ["JOB_MODULE", "JobFileError", "load_job_file"]

JOB_MODULE = "__funke_job__"  # the module name a job file runs as


class JobFileError(FunkeError):
    """A job file that cannot be loaded: missing, raising, or defining no job. `user_traceback`
    is the traceback of the job file's own code when it raised."""

    def __init__(self, message: str, user_traceback: str = "") -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


def load_job_file(path: str | os.PathLike[str], args: Sequence[str] = ()) -> JobGraph:
    """Run a job file and return its JobGraph.

    The file runs as the module `__funke_job__` (so its `if __name__ == "__main__"` block does
    not run), with its own directory on sys.path (so it can import its neighbours) and sys.argv
    set to `[path, *args]` as if it ran alone. It must define `build(args)`, called with `args`, or a
    module-level `job`; either may be a JobGraph or an ExecutionEnvironment (then built). Or it
    calls `env.execute()` / `execute_async()` as it would run alone (`python job.py`): that job is
    taken there, and the rest of the file does not run (Flink's plan extraction).
    A job file's own argument parser may exit (`--help`); that SystemExit is not caught.
    funke's deprecation warnings about the file's imports and calls are shown (on stderr), as
    Python shows them for a script it runs itself."""
    from funke.common.api.dsl import ExecutionEnvironment

    file = Path(path)
    if not file.is_file():
        what = "is a directory, not a job file" if file.is_dir() else "does not exist"
        raise JobFileError(f"job file {str(path)!r} {what}")
    file = file.resolve()
    _pickle_job_module_by_value()
    _pickle_neighbours_by_value(file.parent)
    directory = str(file.parent)
    saved_argv = sys.argv
    sys.path.insert(0, directory)
    sys.argv = [str(path), *args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", FunkeDeprecationWarning)
            try:
                with capturing():  # a script that calls env.execute() itself: its job is taken there
                    namespace = runpy.run_path(str(file), run_name=JOB_MODULE)
            except JobCaptured as captured:
                return captured.job
            except Exception as exc:  # SystemExit and KeyboardInterrupt pass: they are not errors of the file
                raise JobFileError(f"job file {str(path)!r} raised {_describe(exc)} while loading",
                                   _user_traceback(exc, file)) from exc
            build = namespace.get("build")
            if callable(build):
                origin = "build(args)"
                try:
                    with capturing():
                        job = build(list(args))
                except JobCaptured as captured:
                    job = captured.job
                except Exception as exc:
                    raise _build_error(path, origin, exc, file) from exc
            elif "job" in namespace:
                origin, job = "job", namespace["job"]
            else:
                raise JobFileError(
                    f"job file {str(path)!r} defines neither build(args) nor a module-level `job`: "
                    "define `def build(args: list[str]) -> JobGraph` (see examples/wordcount.py)"
                )
            if isinstance(job, ExecutionEnvironment):
                try:
                    job = job.build()
                except Exception as exc:
                    raise _build_error(path, f"{origin}.build()", exc, file) from exc
            if not isinstance(job, JobGraph):
                raise JobFileError(
                    f"job file {str(path)!r}: {origin} is a {type(job).__name__}, expected a JobGraph "
                    "or an ExecutionEnvironment"
                )
            return job
    finally:
        sys.argv = saved_argv
        try:
            sys.path.remove(directory)
        except ValueError:  # the job file removed it itself
            pass


def _pickle_job_module_by_value() -> None:
    """While runpy runs a job file, the file is the module `__funke_job__` in sys.modules, so
    cloudpickle would pickle the functions it defines at module level *by reference*, and the
    TaskManagers, which cannot import it, would fail to unpickle them. Registering the name
    makes them travel by value, like the functions of `__main__`."""
    _register_by_value(JOB_MODULE)


def _pickle_neighbours_by_value(directory: Path) -> None:
    """Modules and packages beside the job file are not installed on the TaskManagers either:
    functions the job takes from them must travel by value too. (Registering a package covers
    its submodules.)"""
    for entry in sorted(directory.iterdir()):
        if entry.suffix == ".py" and entry.stem.isidentifier():
            _register_by_value(entry.stem)
        elif entry.is_dir() and entry.name.isidentifier() and (entry / "__init__.py").is_file():
            _register_by_value(entry.name)


def _register_by_value(name: str) -> None:
    import cloudpickle

    if name in sys.modules:
        cloudpickle.register_pickle_by_value(sys.modules[name])
        return
    # The registration is by name but wants the module present; a placeholder stands in.
    sys.modules[name] = types.ModuleType(name)
    try:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    finally:
        del sys.modules[name]


def _build_error(path: str | os.PathLike[str], origin: str, exc: Exception, file: Path) -> FunkeError:
    from funke.common.graph.validation import JobGraphInvalid

    if isinstance(exc, JobGraphInvalid):
        return InvalidJobGraph(f"job file {str(path)!r}: {exc}", [str(p) for p in exc.problems])
    return JobFileError(f"job file {str(path)!r}: {origin} raised {_describe(exc)}", _user_traceback(exc, file))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _user_traceback(exc: BaseException, file: Path) -> str:
    """The traceback from the job file's first frame on: the loader's own frames (runpy, this
    module) say nothing to the user."""
    tb = exc.__traceback__
    frames = tb
    while frames is not None and Path(frames.tb_frame.f_code.co_filename) != file:
        frames = frames.tb_next
    if frames is None and not isinstance(exc, SyntaxError):
        frames = tb  # raised before any of the file's code ran: show everything
    # A SyntaxError carries its location itself; without frames only that part is printed.
    return "".join(traceback.format_exception(type(exc), exc, frames))

