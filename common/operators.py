"""The operator catalogue: every operator kind a JobVertex chain may contain.

Owns the names, roles and arities of operators. The DSL builds OperatorSpecs from it, validation
checks chains against it, and the TaskManager maps each kind to its DataFrame implementation
(`funke.taskmanager.operators`). Adding an operator means one line here and one function there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class OperatorRole(enum.Enum):
    SOURCE = "source"
    TRANSFORM = "transform"
    SINK = "sink"


VARIADIC = -1  # arity of operators taking any number (>= 1) of inputs


@dataclass(frozen=True, slots=True)
class OperatorKind:
    kind: str
    role: OperatorRole
    arity: int  # number of inputs of the head operator; 0 for sources
    required: tuple[str, ...] = ()  # config keys that must be present
    needs_function: bool = False
    commits_output: bool = False  # sinks whose output is committed when the job finishes


def _k(kind: str, role: OperatorRole, arity: int, *required: str, fn: bool = False, commit: bool = False):
    return OperatorKind(kind, role, arity, tuple(required), fn, commit)


S, T, K = OperatorRole.SOURCE, OperatorRole.TRANSFORM, OperatorRole.SINK

CATALOGUE: dict[str, OperatorKind] = {
    o.kind: o
    for o in (
        # sources: subtask i of n reads its share of the input
        _k("source.text", S, 0, "path"),
        _k("source.parquet", S, 0, "path"),
        _k("source.csv", S, 0, "path"),
        _k("source.json", S, 0, "path"),
        _k("source.range", S, 0, "end"),
        _k("source.collection", S, 0, "rows", "schema"),
        # no-op kinds: a chain made only of these finishes without touching Spark (used to
        # measure scheduling and deployment alone)
        _k("source.noop", S, 0),
        # transforms
        _k("map", T, 1, "schema", fn=True),
        _k("flat_map", T, 1, "schema", fn=True),
        _k("filter", T, 1, fn=True),
        _k("select", T, 1, "exprs"),
        _k("where", T, 1, "condition"),
        _k("reduce", T, 1, "keys", fn=True),
        _k("aggregate", T, 1, "keys", "aggregations"),
        _k("count", T, 1, "keys"),
        _k("join", T, 2, "on"),
        _k("union", T, VARIADIC),
        _k("transform", T, 1, fn=True),
        _k("noop", T, VARIADIC),
        # sinks
        _k("sink.parquet", K, 1, "path", commit=True),
        _k("sink.csv", K, 1, "path", commit=True),
        _k("sink.json", K, 1, "path", commit=True),
        _k("sink.text", K, 1, "path", commit=True),
        _k("sink.print", K, 1),
        _k("sink.collect", K, 1, commit=True),
        _k("sink.discard", K, 1),
        _k("sink.noop", K, 1),
    )
}


def operator_role(kind: str) -> OperatorRole | None:
    op = CATALOGUE.get(kind)
    return op.role if op else None


NOOP_KINDS = frozenset({"source.noop", "noop", "sink.noop"})
