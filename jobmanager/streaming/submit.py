"""What keeps a streaming query from starting that only the file system shows, checked at
submit (blocking I/O, for the Dispatcher to run off its event loop, before anything of the job is
created): a source that watches a directory (`SourcePlugin.watches_directory`) whose directory
does not exist or is not one, a checkpoint location that is not a directory or cannot be
made, and a keyed operator whose max parallelism is not the one its checkpointed state has."""

from __future__ import annotations

import os
import stat
from typing import Mapping

from funke.common import ids
from funke.common.graph.jobgraph import JobGraph
from funke.common.graph.streamingjob import (
    CHECKPOINT,
    RUNNING_KINDS,
    checkpoint_location,
    local_path,
    stream_sources,
)
from funke.common.streaming import state
from funke.common.graph.validation import MAX_VERTICES, Problem, ValidationContext, path_problem, q
from funke.common.streaming.sources import SOURCE_PLUGINS


def submit_problems(job: JobGraph, context: ValidationContext) -> list[Problem]:
    """What keeps a streaming query from starting that only the file system shows: a stream file
    source whose directory does not exist or is not one (Spark refuses such a query at its
    start; polled, it would run forever finding nothing), and a checkpoint location that is not
    a directory or cannot be made. Blocking I/O, for the Dispatcher to run off its event loop at
    submit, before anything of the job is created. Only locations that passed validation are
    looked at (a path a client may not use is not probed)."""
    if len(job.vertices) > MAX_VERTICES:
        return []
    problems: list[Problem] = []
    for v in stream_sources(job):
        op = v.operators[0]
        path = op.config.get("path") if isinstance(op.config, Mapping) else None
        if not SOURCE_PLUGINS[op.kind].watches_directory or not isinstance(path, str) or path_problem(path, sink=False,
                                                                                        context=context):
            continue
        where = f"operator 0 {q(op.display_name)} ({op.kind}): config 'path'"
        try:
            problem = _directory_problem(local_path(path))
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            problems.append(Problem(f"vertex {q(v.id)}", f"{where} {problem}"))
    options = job.configuration.options if isinstance(job.configuration.options, Mapping) else {}
    option = options.get(CHECKPOINT, "").strip() if isinstance(options.get(CHECKPOINT, ""), str) else ""
    if option and path_problem(option, sink=True, context=context) is not None:
        return problems  # validation said why
    try:
        location = checkpoint_location(job, context.data_dir)
    except ValueError as exc:
        problems.append(Problem("streaming query", f"option {CHECKPOINT}: {exc}"))
        return problems
    problem = _checkpoint_problem(location)
    if problem is not None:
        problems.append(Problem("streaming query", f"option {CHECKPOINT}: {problem}" if option else
                                f"{problem} (the default location, under the data directory, by job name)"))
        return problems
    problems += _key_group_problems(job, location)
    return problems


def _key_group_problems(job: JobGraph, location: str) -> list[Problem]:
    """A keyed operator whose max parallelism differs from the key groups its checkpointed state
    was written in (Flink refuses such a restore too: the key groups are the unit of state)."""
    problems = []
    for v in job.vertices:
        if not v.operators or v.operators[0].kind not in RUNNING_KINDS or not ids.is_path_id(v.id):
            continue
        try:
            with open(os.path.join(state.operator_dir(location, v.id), state.METADATA)) as f:
                recorded = f.read(4096)
        except FileNotFoundError:
            continue  # no state yet
        except OSError as exc:
            problems.append(Problem(f"vertex {q(v.id)}", f"its keyed state in the checkpoint cannot be read: {exc}"))
            continue
        problem = state.key_groups_problem(recorded, v.id, v.effective_max_parallelism)
        if problem is not None:
            problems.append(Problem(f"vertex {q(v.id)}", problem))
    return problems


def _shown(path: str) -> str:
    return ids.echo(path, 300)


def _directory_problem(directory: str) -> str | None:
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return (f"{_shown(directory)} does not exist; a stream file source watches a directory for new files: "
                "create it first")
    except NotADirectoryError:
        return f"{_shown(directory)} does not exist (a part of its path is a file)"
    except OSError as exc:
        return f"{_shown(directory)} cannot be read by the JobManager: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{_shown(directory)} is not a directory; a stream file source watches a directory for new files"
    if not os.access(directory, os.R_OK | os.X_OK):
        return f"{_shown(directory)} cannot be listed by the JobManager (permission denied)"
    return None


def _checkpoint_problem(location: str) -> str | None:
    location = os.path.abspath(location)
    if os.path.lexists(location):
        if os.path.isdir(location):
            return None
        what = "a file" if os.path.isfile(location) else "something other than a directory"
        return f"the checkpoint location {_shown(location)} is {what}, not a directory"
    parent = location
    while parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
        if os.path.isdir(parent):
            return None
        if os.path.lexists(parent):
            return f"the checkpoint location {_shown(location)} cannot be made: {_shown(parent)} is a file"
    return None
