"""funke's public Python API: the only import paths funke promises to keep.

    from funke import ExecutionEnvironment                  # jobs (PyFlink's StreamExecutionEnvironment)
    from funke.state import KeyedProcessFunction, ValueState  # keyed process functions and their state
    from funke.client import JobManagerClient               # talking to a cluster from Python

Everything else (`funke.common`, `funke.jobmanager`, `funke.taskmanager`, `funke.runtime`,
`funke.deploy`) is funke's inside, free to move between versions. A name here changes only after
a minor version in which it still works and warns (a DeprecationWarning naming its new place),
announced under "Breaking changes" in CHANGELOG.md; `tests/unit/test_public_api.py` holds every
name and signature.

This package is the directory `deploy/public/` of a checkout (the top floor: it stands on
`funke.common.api` and `funke.deploy`), installed as `funke`. Its names load on first use, so
`import funke.common...` in a TaskManager or a Spark worker does not load the client and gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if __name__ != "funke":  # pragma: no cover - only a checkout's editable install can get here
    raise ImportError(f"{__name__} is the public package `funke`: import funke, funke.state or funke.client")

if TYPE_CHECKING:
    from funke.common.api.datastream import DataStream, KeyedStream, WindowedDataStream, WindowedStream
    from funke.common.api.environment import ExecutionEnvironment
    from funke.common.api.handles import CollectSink, DataStreamSink
    from funke.common.api.streamreader import StreamReader
    from funke.common.graph.jobgraph import JobGraph
    from funke.deploy.client import FunkeError
    from funke.deploy.execution import (BatchResult, JobClient, JobExecutionResult, JobFailed, OperatorMetrics,
                                        VertexMetrics)

# Public name -> the module that defines it.
_HOMES = {
    "ExecutionEnvironment": "funke.common.api.environment",
    "DataStream": "funke.common.api.datastream",
    "KeyedStream": "funke.common.api.datastream",
    "WindowedStream": "funke.common.api.datastream",
    "WindowedDataStream": "funke.common.api.datastream",
    "DataStreamSink": "funke.common.api.handles",
    "CollectSink": "funke.common.api.handles",
    "StreamReader": "funke.common.api.streamreader",
    "JobGraph": "funke.common.graph.jobgraph",
    "JobExecutionResult": "funke.deploy.execution",
    "JobClient": "funke.deploy.execution",
    "JobFailed": "funke.deploy.execution",
    "VertexMetrics": "funke.deploy.execution",
    "OperatorMetrics": "funke.deploy.execution",
    "BatchResult": "funke.deploy.execution",
    "FunkeError": "funke.deploy.client",
}

__all__ = sorted(_HOMES) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("funke")
        except PackageNotFoundError:  # a checkout on sys.path without an install
            value = "0+unknown"
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'funke' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(__all__ + ["client", "state"])
