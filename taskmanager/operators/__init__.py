"""Operator implementations: every kind of the catalogue (`funke.common.graph.operators`) mapped onto
the Spark DataFrame API.

Owns what each operator does to the rows of one subtask, and nothing about deployment, inputs
or outputs (that is `funke.taskmanager.task`). `OPERATORS` maps a kind to its function:

    context.py      RuntimeContext, InputMeter and the helpers every operator shares
    sources.py      (ctx, spec) -> DataFrame                          the subtask's share of the input
    transforms.py   (ctx, spec, inputs: list[DataFrame]) -> DataFrame  a chain's head gets all of the
                                                                      vertex's inputs in input order;
                                                                      a chained operator gets one
    sinks.py        (ctx, spec, df) -> None                           run the pipeline, stage the output
    classic.py      a streaming task's DataFrame calls on classic Spark with few JVM round trips
    udf.py          the Arrow UDF runtime user functions run in (pickled by value to Spark's
                    Python workers) and how their failures are told

Stream sources are looked up in `funke.taskmanager.streaming` first, which adds those that are
not here (and their receivers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from funke.taskmanager.operators.sinks import SINKS
from funke.taskmanager.operators.sources import BATCH_SOURCES
from funke.taskmanager.operators.transforms import TRANSFORMS

__all__ = ["OPERATORS"]


def _registry(*tables: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    merged: dict[str, Callable[..., Any]] = {}
    for table in tables:
        twice = merged.keys() & table.keys()
        assert not twice, f"operator kinds implemented twice: {sorted(twice)}"
        merged.update(table)
    return merged


OPERATORS: dict[str, Callable[..., Any]] = _registry(BATCH_SOURCES, TRANSFORMS, SINKS)
