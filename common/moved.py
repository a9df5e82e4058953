"""Module paths of 0.2.0 that moved in 0.3.0, kept importable for one more minor version.

0.3.0 grouped `funke.common`'s flat modules into floors (`funke.common.dsl` became
`funke.common.api.dsl`, `funke.common.codec` `funke.common.wire.codec`, ...) and said nothing of
it, so every job file written for 0.2.0 failed with ModuleNotFoundError. Each old path here
imports the module at its new path (the same module object: its classes are the same classes)
and warns with a DeprecationWarning that names the public import to use instead, or the new
path where the public API has no equivalent. 0.5.0 removes them.

The table is data; `install()` (called by `funke.common` on import) puts a finder for exactly
these names on `sys.meta_path`. No I/O: a name is looked up in the table and imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "FunkeDeprecationWarning", "install"]

REMOVED_IN = "0.5.0"

_DSL = "from funke import ExecutionEnvironment (and DataStream, KeyedStream, ...)"
_JOB_GRAPH = "from funke import JobGraph"
_CODEC = "from funke.client import job_graph_to_proto, job_graph_from_proto"

# 0.2.0 path -> (where the module is now, the public import that replaces it or None).
MOVED: dict[str, tuple[str, str | None]] = {
    "funke.common.dsl": ("funke.common.api.dsl", _DSL),
    "funke.common.jobgraph": ("funke.common.graph.jobgraph", _JOB_GRAPH),
    "funke.common.codec": ("funke.common.wire.codec", _CODEC),
    "funke.common.jobviews": ("funke.common.wire.jobviews", None),
    "funke.common.operators": ("funke.common.graph.operators", None),
    "funke.common.validation": ("funke.common.graph.validation", None),
    "funke.common.restart": ("funke.common.graph.restart", None),
    "funke.common.streamingjob": ("funke.common.graph.streamingjob", None),
    "funke.common.executiongraph": ("funke.common.graph.executiongraph", None),
    "funke.common.deployment": ("funke.common.graph.deployment", None),
    "funke.common.scheduler": ("funke.common.scheduling.scheduler", None),
    "funke.common.schedulingstrategy": ("funke.common.scheduling.schedulingstrategy", None),
    "funke.common.failover": ("funke.common.scheduling.failover", None),
    "funke.common.deploymentfactory": ("funke.common.scheduling.deploymentfactory", None),
    "funke.common.regions": ("funke.common.scheduling.regions", None),
    "funke.common.slotmanager": ("funke.common.scheduling.slotmanager", None),
    "funke.common.slotsharing": ("funke.common.scheduling.slotsharing", None),
    "funke.common.batchflow": ("funke.common.scheduling.batchflow", None),
    "funke.common.backpressure": ("funke.common.streaming.backpressure", None),
    "funke.common.checkpoint": ("funke.common.streaming.checkpoint", None),
    "funke.common.microbatch": ("funke.common.streaming.microbatch", None),
    "funke.common.streamsources": ("funke.common.streaming.sources", None),
    "funke.common.inputgates": ("funke.common.task.inputgates", None),
    "funke.common.taskexecutorstate": ("funke.common.task.taskexecutorstate", None),
    "funke.common.combine": ("funke.common.aggregates", None),
}


class FunkeDeprecationWarning(DeprecationWarning):
    """A funke name or path that still works and goes in a coming minor version. `funke submit`
    shows these for the job file it loads (Python shows DeprecationWarnings only in __main__)."""


def message(old: str) -> str:
    new, public = MOVED[old]
    instead = (f"use the public API: {public}" if public is not None
               else f"it is {new} now, inside funke (not a public API: it may move again)")
    return f"{old} moved in funke 0.3.0 and this path goes in {REMOVED_IN}; {instead}"


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 2 skips this frame; warnings skips importlib's own frames, so the warning
        # points at the line that imported the old path.
        warnings.warn(message(spec.name), FunkeDeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        moved = MOVED.get(fullname)
        if moved is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(moved[0]))


def install() -> None:
    """Make the 0.2.0 paths importable (once per interpreter)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
