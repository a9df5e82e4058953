"""Validation of a submitted JobGraph: every problem at once, each naming what it is about.

Owns the rules a JobGraph must satisfy before the JobManager builds an ExecutionGraph for it.
`validate` never stops at the first problem; `JobGraphInvalid` carries them all, and the
dispatcher returns them as one INVALID_ARGUMENT.
"""

from __future__ import annotations

import posixpath

from collections import Counter, defaultdict
from dataclasses import dataclass

import networkx as nx

from funke.common.jobgraph import (
    MAX_PARALLELISM_LIMIT,
    DistributionPattern,
    JobGraph,
    PartitionerKind,
)
from funke.common.operators import CATALOGUE, VARIADIC, OperatorRole


@dataclass(frozen=True, slots=True)
class Problem:
    subject: str  # e.g. "vertex 'map'", "edge 'e1'", "job"
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


class JobGraphInvalid(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"job graph has {len(problems)} problem(s):\n{listing}")


def validate(job: JobGraph) -> None:
    problems = find_problems(job)
    if problems:
        raise JobGraphInvalid(problems)


def find_problems(job: JobGraph) -> list[Problem]:
    problems: list[Problem] = []
    add = lambda subject, message: problems.append(Problem(subject, message))  # noqa: E731

    if not job.vertices:
        add("job", "has no vertices")

    for kind, ids in (
        ("vertex", [v.id for v in job.vertices]),
        ("data set", [d.id for d in job.data_sets]),
        ("edge", [e.id for e in job.edges]),
    ):
        for ident, n in Counter(ids).items():
            if not ident:
                add(kind, f"{n} {kind}(s) with an empty id")
            elif n > 1:
                add(f"{kind} '{ident}'", f"id is used {n} times")

    vertices = {v.id: v for v in job.vertices}
    data_sets = {d.id: d for d in job.data_sets}

    for d in job.data_sets:
        if d.producer not in vertices:
            add(f"data set '{d.id}'", f"produced by unknown vertex '{d.producer}'")

    consumers_of: dict[str, list[str]] = defaultdict(list)
    inputs_of: dict[str, list] = defaultdict(list)
    for e in job.edges:
        subject = f"edge '{e.id}'"
        if e.data_set not in data_sets:
            add(subject, f"consumes unknown data set '{e.data_set}'")
        else:
            consumers_of[e.data_set].append(e.id)
        if e.consumer not in vertices:
            add(subject, f"leads to unknown vertex '{e.consumer}'")
        else:
            inputs_of[e.consumer].append(e)
        _check_edge_wiring(job, e, vertices, data_sets, add)

    for d in job.data_sets:
        n = len(consumers_of[d.id])
        if n == 0:
            add(f"data set '{d.id}'", "is produced but never consumed")
        elif n > 1:
            add(f"data set '{d.id}'", f"is consumed by {n} edges ({', '.join(consumers_of[d.id])}); "
                "each data set has exactly one consuming edge")

    for v in job.vertices:
        subject = f"vertex '{v.id}'"
        if v.parallelism < 1:
            add(subject, f"parallelism {v.parallelism} is less than 1")
        if v.max_parallelism is not None and not 1 <= v.max_parallelism <= MAX_PARALLELISM_LIMIT:
            add(subject, f"max parallelism {v.max_parallelism} is outside [1, {MAX_PARALLELISM_LIMIT}]")
        elif v.parallelism > v.effective_max_parallelism:
            add(subject, f"parallelism {v.parallelism} exceeds max parallelism {v.effective_max_parallelism}")
        if not v.slot_sharing_group:
            add(subject, "slot-sharing group name is empty")
        if v.co_location_group == "":
            add(subject, "co-location group name is empty (leave it unset for none)")
        _check_chain(v, inputs_of[v.id], bool(job.produced_by(v.id)), add)

    _check_co_location(job, add)
    _check_sink_targets(job, add)
    _check_cycles_and_reachability(job, vertices, data_sets, add)
    _check_configuration(job, add)
    return problems


def _check_edge_wiring(job, e, vertices, data_sets, add) -> None:
    subject = f"edge '{e.id}'"
    if e.partitioner is PartitionerKind.HASH:
        if not e.partition_keys:
            add(subject, "HASH partitioning needs at least one key")
        if e.distribution_pattern is not DistributionPattern.ALL_TO_ALL:
            add(subject, "HASH partitioning needs an ALL_TO_ALL edge")
    if e.partitioner is PartitionerKind.BROADCAST and e.distribution_pattern is not DistributionPattern.ALL_TO_ALL:
        add(subject, "BROADCAST partitioning needs an ALL_TO_ALL edge")
    if e.partitioner is PartitionerKind.FORWARD:
        if e.distribution_pattern is not DistributionPattern.POINTWISE:
            add(subject, "FORWARD partitioning needs a POINTWISE edge")
        d = data_sets.get(e.data_set)
        producer = vertices.get(d.producer) if d else None
        consumer = vertices.get(e.consumer)
        if producer and consumer and producer.parallelism != consumer.parallelism:
            add(subject, (
                f"FORWARD partitioning cannot map parallelism {producer.parallelism} of "
                f"'{producer.id}' onto parallelism {consumer.parallelism} of '{consumer.id}'; "
                "use REBALANCE (rescale), HASH or BROADCAST to change parallelism"
            ))


def _check_chain(v, inputs, produces: bool, add) -> None:
    subject = f"vertex '{v.id}'"
    if not v.operators:
        add(subject, "has no operators")
        return
    last = len(v.operators) - 1
    for i, op in enumerate(v.operators):
        kind = CATALOGUE.get(op.kind)
        where = f"operator {i} '{op.display_name}'"
        if kind is None:
            add(subject, f"{where} has unknown kind '{op.kind}'")
            continue
        if kind.role is OperatorRole.SOURCE and i != 0:
            add(subject, f"{where}: a source can only head a chain")
        if kind.role is OperatorRole.SINK and i != last:
            add(subject, f"{where}: a sink can only end a chain")
        if i > 0 and kind.arity not in (1, VARIADIC):
            add(subject, f"{where} takes {kind.arity} inputs and cannot be chained")
        missing = [k for k in kind.required if k not in op.config]
        if missing:
            add(subject, f"{where} ({op.kind}) is missing config {', '.join(missing)}")
        if kind.needs_function and not op.function:
            add(subject, f"{where} ({op.kind}) needs a function")
    head = CATALOGUE.get(v.operators[0].kind)
    if head is not None:
        n = len(inputs)
        if head.role is OperatorRole.SOURCE and n:
            add(subject, f"source '{v.operators[0].display_name}' cannot have inputs (has {n})")
        elif head.arity == VARIADIC and n == 0:
            add(subject, f"'{v.operators[0].display_name}' needs at least one input")
        elif head.arity > 0 and n != head.arity:
            add(subject, f"'{v.operators[0].display_name}' ({head.kind}) takes {head.arity} input(s), has {n}")
    tail = CATALOGUE.get(v.operators[-1].kind)
    if tail is not None and tail.role is OperatorRole.SINK and produces:
        add(subject, f"ends with sink '{v.operators[-1].display_name}' but produces data sets")
    indexes = sorted(e.input_index for e in inputs)
    if indexes != list(range(len(inputs))):
        add(subject, f"input indexes {indexes} are not 0..{len(inputs) - 1}")


def _check_sink_targets(job: JobGraph, add) -> None:
    """Two file sinks writing into the same directory (or one inside the other) would commit over
    each other's output."""
    targets = []
    for v in job.vertices:
        for op in v.operators:
            kind = CATALOGUE.get(op.kind)
            path = op.config.get("path") if kind is not None and kind.role is OperatorRole.SINK else None
            if isinstance(path, str) and path.strip():
                targets.append((v.id, op.display_name, posixpath.normpath(path.strip()).rstrip("/")))
    for i, (vid, name, path) in enumerate(targets):
        for other_vid, other_name, other in targets[i + 1:]:
            if path == other or other.startswith(path + "/") or path.startswith(other + "/"):
                add(f"vertex '{other_vid}'", f"sink '{other_name}' writes to {other}, which overlaps "
                    f"the target {path} of sink '{name}' in vertex '{vid}'")


def _check_co_location(job: JobGraph, add) -> None:
    groups: dict[str, list] = defaultdict(list)
    for v in job.vertices:
        if v.co_location_group:
            groups[v.co_location_group].append(v)
    for name, members in groups.items():
        parallelisms = {v.parallelism for v in members}
        if len(parallelisms) > 1:
            detail = ", ".join(f"'{v.id}'={v.parallelism}" for v in members)
            add(f"co-location group '{name}'", f"members have different parallelism ({detail})")
        ssgs = {v.slot_sharing_group for v in members}
        if len(ssgs) > 1:
            detail = ", ".join(f"'{v.id}' in '{v.slot_sharing_group}'" for v in members)
            add(f"co-location group '{name}'", f"members are in different slot-sharing groups ({detail})")


def _check_cycles_and_reachability(job: JobGraph, vertices, data_sets, add) -> None:
    g = nx.DiGraph()
    g.add_nodes_from(vertices)
    for e in job.edges:
        d = data_sets.get(e.data_set)
        if d and d.producer in vertices and e.consumer in vertices:
            g.add_edge(d.producer, e.consumer, edge=e.id)
    for component in nx.strongly_connected_components(g):
        if len(component) == 1:
            (only,) = component
            if not g.has_edge(only, only):
                continue
        cycle = nx.find_cycle(g.subgraph(component))
        path = " -> ".join([cycle[0][0]] + [dst for _, dst in cycle])
        add("job", f"cycle: {path}")
    sources = [vid for vid, v in vertices.items() if v.is_source]
    reachable: set[str] = set(sources)
    for s in sources:
        reachable |= nx.descendants(g, s)
    for vid in vertices:
        if vid not in reachable:
            add(f"vertex '{vid}'", "has no path from a source")


def _check_configuration(job: JobGraph, add) -> None:
    from funke.common.restart import RestartStrategyError, restart_strategy_from_config

    cfg = job.configuration
    if cfg.restart_strategy is not None:
        try:
            restart_strategy_from_config(cfg.restart_strategy)
        except RestartStrategyError as exc:
            add("job configuration", str(exc))
    if cfg.slot_request_timeout_s is not None and cfg.slot_request_timeout_s <= 0:
        add("job configuration", f"slot request timeout {cfg.slot_request_timeout_s} s is not positive")
