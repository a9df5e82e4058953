"""Validation of a submitted JobGraph: every problem at once, each naming what it is about.

Owns the rules a JobGraph must satisfy before the JobManager builds an ExecutionGraph for it,
covering every field: ids and names (`ids.py`), the wiring, chains against the operator
catalogue, each operator's configuration against the types its kind declares (paths, modes,
finite numbers, schemas, column lists), sizes, artifacts and the job configuration.
`validate` never stops at the first problem; `JobGraphInvalid` carries them all, and the
dispatcher returns them as one INVALID_ARGUMENT.

What depends on the cluster (its data directory, the directories jobs may read and write, how
many subtasks a job may have) comes in a `ValidationContext`; without one (the client checking
its own graph) only the graph itself is checked.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping

import networkx as nx

from funke.common import ids
from funke.common.graph.jobgraph import (
    MAX_PARALLELISM_LIMIT,
    DistributionPattern,
    JobGraph,
    PartitionerKind,
    exchange_in_memory_max_bytes,
)
from funke.common.graph.operators import (
    CATALOGUE,
    ELIDED_EXCHANGE,
    JOIN_TYPES,
    SINK_MODES,
    VARIADIC,
    FunctionUse,
    OperatorRole,
    Value,
)
from funke.common.streaming import kafkasink
from funke.common.streaming.eventtime import MAX_DELAY_MS
from funke.common.streaming.sources.delta import DELTA_KINDS, DELTA_MODES, parse_timestamp
from funke.common.streaming.sources.delta import config_problems as delta_config_problems
from funke.common.streaming.sources import avro, kafka
from funke.common.streaming.state import state_specs_problem

# Sizes a job graph may have. They keep one request from holding the JobManager's memory or
# loop: a JobGraph is decoded, validated and expanded into an ExecutionGraph on submission.
MAX_VERTICES = 1000
MAX_OPERATORS_PER_VERTEX = 1000
MAX_EDGES = 2000
DEFAULT_MAX_SUBTASKS = 100_000  # all vertices' parallelisms together (cluster key funke.job.max-subtasks)
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # one operator's configuration, as JSON
MAX_FUNCTION_BYTES = 64 * 1024 * 1024  # one pickled function
MAX_ARTIFACTS = 100
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024  # all artifacts' contents together
# Each subtask's deployment carries its vertex's functions and configuration, and the artifacts:
# what a job ships to its subtasks in all is bounded, since the JobManager builds it.
MAX_DEPLOYMENT_BYTES = 1024 * 1024 * 1024
MAX_OPTIONS = 1000  # job options, restart strategy options, Spark options of one operator
MAX_OPTION_VALUE_LENGTH = 64 * 1024
MAX_PATH_LENGTH = 4096
MAX_PARTITION_KEYS = 100
MAX_STREAM_KEYS = 1000  # a Redis Streams source's keys
MAX_STREAM_KEY_LENGTH = 1024
MAX_TIMEOUT_S = 365 * 24 * 3600.0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
# What one INVALID_ARGUMENT lists: gRPC carries the message in trailing metadata (8 KiB by
# default on the client), so a graph with ten thousand problems names the first ones and counts
# the rest.
MAX_LISTED_PROBLEMS = 40
MAX_LISTING_CHARS = 6000

_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
# a DNS name (labels of letters, digits and hyphens), an IPv4 address, or an IPv6 one
_HOST = re.compile(r"(?=.{1,253}\Z)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
                   r"|(?=[^:]*:)[0-9A-Fa-f:.]{2,45}")


@dataclass(frozen=True, slots=True)
class Problem:
    subject: str  # e.g. "vertex 'map'", "edge 'e1'", "job"
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass(frozen=True, slots=True)
class ValidationContext:
    """What the cluster adds to the rules. `data_dir`: no sink may write into it, over it or
    around it. `allowed_paths`: if given, every source and sink path lies under one of them
    (cluster key funke.io.allowed-paths). `allowed_hosts`: if given, every host a socket, Redis or
    Kafka source or sink connects to is one of them (cluster key funke.io.allowed-hosts)."""

    data_dir: str = ""
    allowed_paths: tuple[str, ...] = ()
    max_subtasks: int = DEFAULT_MAX_SUBTASKS
    allowed_hosts: tuple[str, ...] = ()  # lower case; empty: any host (cluster key funke.io.allowed-hosts)


class JobGraphInvalid(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(describe_problems(problems))


def describe_problems(problems: list[Problem]) -> str:
    """The message listing problems: the first ones, within a size gRPC carries, and a count of
    the rest."""
    lines: list[str] = []
    size = 0
    for p in problems[:MAX_LISTED_PROBLEMS]:
        line = f"  - {p}"
        if size + len(line) > MAX_LISTING_CHARS:
            break
        lines.append(line)
        size += len(line) + 1
    rest = len(problems) - len(lines)
    if rest:
        lines.append(f"  - ... and {rest} more problem(s)")
    return f"job graph has {len(problems)} problem(s):\n" + "\n".join(lines)


def validate(job: JobGraph, context: ValidationContext | None = None) -> None:
    problems = find_problems(job, context)
    if problems:
        raise JobGraphInvalid(problems)


def q(ident: object) -> str:
    """An id as messages quote it: 'map' for a sane one, a shortened repr for anything else."""
    if isinstance(ident, str) and len(ident) <= ids.ECHO_LIMIT and ident.isprintable() and "'" not in ident:
        return f"'{ident}'"
    return ids.echo(ident)


def find_problems(job: JobGraph, context: ValidationContext | None = None) -> list[Problem]:
    problems: list[Problem] = []
    add: Callable[[str, str], None] = lambda subject, message: problems.append(Problem(subject, message))  # noqa: E731

    _check_job_fields(job, context, add)
    if len(job.vertices) > MAX_VERTICES or len(job.edges) > MAX_EDGES or len(job.data_sets) > MAX_EDGES:
        # Counted, not checked one by one: a graph this size is refused for its size alone.
        return problems

    for kind, ids_, check in (
        ("vertex", [v.id for v in job.vertices], lambda x: ids.path_id_problem(x, "id")),
        ("data set", [d.id for d in job.data_sets], lambda x: ids.path_id_problem(x, "id")),
        ("edge", [e.id for e in job.edges], lambda x: ids.label_problem(x, "id")),
    ):
        for ident, n in Counter(ids_).items():
            if not ident:
                add(kind, f"{n} {kind}(s) with an empty id")
                continue
            problem = check(ident)
            if problem is not None:
                add(f"{kind} {q(ident)}", problem)
            if n > 1:
                add(f"{kind} {q(ident)}", f"id is used {n} times")

    vertices = {v.id: v for v in job.vertices}
    data_sets = {d.id: d for d in job.data_sets}

    for d in job.data_sets:
        if d.producer not in vertices:
            add(f"data set {q(d.id)}", f"produced by unknown vertex {q(d.producer)}")

    consumers_of: dict[str, list[str]] = defaultdict(list)
    inputs_of: dict[str, list] = defaultdict(list)
    for e in job.edges:
        subject = f"edge {q(e.id)}"
        if e.data_set not in data_sets:
            add(subject, f"consumes unknown data set {q(e.data_set)}")
        else:
            consumers_of[e.data_set].append(e.id)
        if e.consumer not in vertices:
            add(subject, f"leads to unknown vertex {q(e.consumer)}")
        else:
            inputs_of[e.consumer].append(e)
        _check_edge_wiring(job, e, vertices, data_sets, add)

    for d in job.data_sets:
        n = len(consumers_of[d.id])
        if n == 0:
            add(f"data set {q(d.id)}", "is produced but never consumed")
        elif n > 1:
            add(f"data set {q(d.id)}", f"is consumed by {n} edges ({', '.join(q(e) for e in consumers_of[d.id][:10])}); "
                "each data set has exactly one consuming edge")

    subtasks = 0
    for v in job.vertices:
        subject = f"vertex {q(v.id)}"
        _check_vertex_fields(v, subject, add)
        if isinstance(v.parallelism, int) and not isinstance(v.parallelism, bool):
            subtasks += max(v.parallelism, 0)
        _check_chain(v, inputs_of[v.id], bool(job.produced_by(v.id)), add)
        for i, op in enumerate(v.operators[:MAX_OPERATORS_PER_VERTEX]):
            _check_operator(v, i, op, context, add)

    artifact_bytes = sum(len(a.content) for a in job.artifacts if isinstance(a.content, (bytes, bytearray)))
    shipped = 0
    heaviest = None
    for v in job.vertices:
        if not _is_int(v.parallelism) or v.parallelism < 1:
            continue
        payload = artifact_bytes + sum(_payload(op) for op in v.operators[:MAX_OPERATORS_PER_VERTEX])
        shipped += payload * v.parallelism
        if heaviest is None or payload * v.parallelism > heaviest[1] * heaviest[2]:
            heaviest = (v.id, payload, v.parallelism)
    if shipped > MAX_DEPLOYMENT_BYTES and heaviest is not None:
        vid, payload, p = heaviest
        add("job", f"its deployments would ship {shipped:,} bytes in all (functions, configuration and artifacts "
            f"go to every subtask; vertex {q(vid)}: {payload:,} bytes to each of {p} subtasks); at most "
            f"{MAX_DEPLOYMENT_BYTES:,}")

    limit = context.max_subtasks if context is not None else DEFAULT_MAX_SUBTASKS
    if subtasks > limit:
        add("job", f"has {subtasks:,} subtasks in all; this cluster takes at most {limit:,} per job "
            "(funke.job.max-subtasks)")

    _check_co_location(job, add)
    _check_sink_targets(job, add)
    _check_cycles_and_reachability(job, vertices, data_sets, add)
    _check_configuration(job, add)
    _check_artifacts(job, add)
    _check_streaming_query(job, context, add)
    return problems


def _check_streaming_query(job: JobGraph, context: ValidationContext | None, add) -> None:
    from funke.common.graph.streamingjob import CHECKPOINT, query_problems

    for problem in query_problems(job):
        add("streaming query", problem)
    options = job.configuration.options
    location = options.get(CHECKPOINT, "").strip() if isinstance(options, Mapping) else ""
    if location:
        problem = path_problem(location, sink=True, context=context)
        if problem is not None:
            add("streaming query", f"option {CHECKPOINT} {problem}")
        else:
            _check_sinks_beside_the_checkpoint(job, location, add)


def _check_sinks_beside_the_checkpoint(job: JobGraph, location: str, add) -> None:
    """A sink writing into, over or around the query's checkpoint location would put its batch
    files and manifests among the offset and commit logs (and a checkpoint inside a sink's
    target among its output). The default location is inside the data directory, which no sink
    may overlap already."""
    from funke.common.graph.streamingjob import CHECKPOINT

    for v in job.vertices[:MAX_VERTICES]:
        for i, op in enumerate(v.operators[:MAX_OPERATORS_PER_VERTEX]):
            kind = CATALOGUE.get(op.kind) if isinstance(op.kind, str) else None
            config = op.config if isinstance(op.config, Mapping) else {}
            path = config.get("path") if kind is not None and kind.role is OperatorRole.SINK else None
            if isinstance(path, str) and path.strip() and path_problem(path, sink=True) is None \
                    and _overlaps(path, location):
                add(f"vertex {q(v.id)}", f"operator {i} {q(op.display_name)} ({op.kind}): config 'path' "
                    f"{ids.echo(path)} overlaps the query's checkpoint location {ids.echo(location)} (option "
                    f"{CHECKPOINT}): its batch files and manifests would sit among the checkpoint's offset and "
                    "commit logs; write somewhere else")


# ------------------------------------------------------------------------------ the job itself


def _check_job_fields(job: JobGraph, context: ValidationContext | None, add) -> None:
    if job.job_id:
        problem = ids.job_id_problem(job.job_id)
        if problem is not None:
            add("job", problem)
    problem = ids.name_problem(job.name, "name")
    if problem is not None:
        add("job", problem)
    if not job.vertices:
        add("job", "has no vertices")
    if len(job.vertices) > MAX_VERTICES:
        add("job", f"has {len(job.vertices):,} vertices; at most {MAX_VERTICES:,} are allowed")
    if len(job.edges) > MAX_EDGES:
        add("job", f"has {len(job.edges):,} edges; at most {MAX_EDGES:,} are allowed")
    if len(job.data_sets) > MAX_EDGES:
        add("job", f"has {len(job.data_sets):,} data sets; at most {MAX_EDGES:,} are allowed")


def _check_vertex_fields(v, subject: str, add) -> None:
    problem = ids.name_problem(v.name, "name")
    if problem is not None:
        add(subject, problem)
    if not _is_int(v.parallelism):
        add(subject, f"parallelism must be an integer, got {ids.echo(v.parallelism)}")
        return
    if v.parallelism < 1:
        add(subject, f"parallelism {v.parallelism} is less than 1")
    if v.max_parallelism is not None and (not _is_int(v.max_parallelism)
                                          or not 1 <= v.max_parallelism <= MAX_PARALLELISM_LIMIT):
        add(subject, f"max parallelism {ids.echo(v.max_parallelism)} is outside [1, {MAX_PARALLELISM_LIMIT}]")
    elif v.parallelism > v.effective_max_parallelism:
        add(subject, f"parallelism {v.parallelism} exceeds max parallelism {v.effective_max_parallelism}")
    if not v.slot_sharing_group:
        add(subject, "slot-sharing group name is empty")
    else:
        problem = ids.label_problem(v.slot_sharing_group, "slot-sharing group name")
        if problem is not None:
            add(subject, problem)
    if v.co_location_group == "":
        add(subject, "co-location group name is empty (leave it unset for none)")
    elif v.co_location_group is not None:
        problem = ids.label_problem(v.co_location_group, "co-location group name")
        if problem is not None:
            add(subject, problem)
    if len(v.operators) > MAX_OPERATORS_PER_VERTEX:
        add(subject, f"has {len(v.operators)} operators; a chain has at most {MAX_OPERATORS_PER_VERTEX}")


def _payload(op) -> int:
    function = len(op.function) if isinstance(op.function, (bytes, bytearray)) else 0
    try:
        config = len(json.dumps(op.config, separators=(",", ":"))) if op.config else 0
    except (TypeError, ValueError, RecursionError):
        config = 0  # reported as a problem of its own
    return function + config


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------ wiring


def _check_edge_wiring(job, e, vertices, data_sets, add) -> None:
    subject = f"edge {q(e.id)}"
    if not _is_int(e.input_index) or e.input_index < 0:
        add(subject, f"input index {ids.echo(e.input_index)} is not a non-negative integer")
    keys = e.partition_keys
    if len(keys) > MAX_PARTITION_KEYS:
        add(subject, f"has {len(keys)} partition keys; at most {MAX_PARTITION_KEYS}")
    else:
        for key in keys:
            problem = ids.name_problem(key, "partition key", ids.MAX_LABEL_LENGTH, empty_ok=False)
            if problem is not None:
                add(subject, problem)
        if len(set(keys)) != len(keys):
            add(subject, "a partition key is repeated")
    if e.partitioner is PartitionerKind.HASH:
        if not keys:
            add(subject, "HASH partitioning needs at least one key")
        if e.distribution_pattern is not DistributionPattern.ALL_TO_ALL:
            add(subject, "HASH partitioning needs an ALL_TO_ALL edge")
    elif keys:
        add(subject, f"partition keys are only for HASH partitioning, not {e.partitioner.value}")
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
                f"{q(producer.id)} onto parallelism {consumer.parallelism} of {q(consumer.id)}; "
                "use REBALANCE (rescale), HASH or BROADCAST to change parallelism"
            ))


def _check_chain(v, inputs, produces: bool, add) -> None:
    subject = f"vertex {q(v.id)}"
    if not v.operators:
        add(subject, "has no operators")
        return
    last = len(v.operators) - 1
    for i, op in enumerate(v.operators[:MAX_OPERATORS_PER_VERTEX]):
        kind = CATALOGUE.get(op.kind) if isinstance(op.kind, str) else None
        where = f"operator {i} {q(op.display_name)}"
        if kind is None:
            add(subject, f"{where} has unknown kind {q(op.kind)}")
            continue
        if kind.role is OperatorRole.SOURCE and i != 0:
            add(subject, f"{where}: a source can only head a chain")
        if kind.role is OperatorRole.SINK and i != last:
            add(subject, f"{where}: a sink can only end a chain")
        if i > 0 and kind.arity not in (1, VARIADIC):
            add(subject, f"{where} takes {kind.arity} inputs and cannot be chained")
        if isinstance(op.config, Mapping):
            missing = [k for k in kind.required if k not in op.config]
            if missing:
                add(subject, f"{where} ({op.kind}) is missing config {', '.join(missing)}")
        if kind.needs_function and not op.function:
            add(subject, f"{where} ({op.kind}) needs a function")
    head = CATALOGUE.get(v.operators[0].kind) if isinstance(v.operators[0].kind, str) else None
    if head is not None:
        n = len(inputs)
        if head.role is OperatorRole.SOURCE and n:
            add(subject, f"source {q(v.operators[0].display_name)} cannot have inputs (has {n})")
        elif head.arity == VARIADIC and n == 0:
            add(subject, f"{q(v.operators[0].display_name)} needs at least one input")
        elif head.arity > 0 and n != head.arity:
            add(subject, f"{q(v.operators[0].display_name)} ({head.kind}) takes {head.arity} input(s), has {n}")
    tail = CATALOGUE.get(v.operators[-1].kind) if isinstance(v.operators[-1].kind, str) else None
    if tail is not None and tail.role is OperatorRole.SINK and produces:
        add(subject, f"ends with sink {q(v.operators[-1].display_name)} but produces data sets")
    indexes = sorted(e.input_index for e in inputs if _is_int(e.input_index))
    if indexes != list(range(len(inputs))):
        add(subject, f"input indexes {indexes[:20]} are not 0..{len(inputs) - 1}")


# ------------------------------------------------------------------------------ operators


def _check_operator(v, index: int, op, context: ValidationContext | None, add) -> None:
    subject = f"vertex {q(v.id)}"
    where = f"operator {index} {q(op.display_name)}"
    problem = ids.name_problem(op.name, "name")
    if problem is not None:
        add(subject, f"{where}: {problem}")
    if not isinstance(op.function, (bytes, bytearray)):
        add(subject, f"{where}: function must be bytes (a pickled callable)")
    elif len(op.function) > MAX_FUNCTION_BYTES:
        add(subject, f"{where}: the pickled function has {len(op.function):,} bytes; at most "
            f"{MAX_FUNCTION_BYTES:,} (ship large data as files, not inside a function)")
    kind = CATALOGUE.get(op.kind) if isinstance(op.kind, str) else None
    if kind is None:
        return  # reported with the chain
    if kind.function is FunctionUse.NONE and op.function:
        add(subject, f"{where} ({op.kind}) takes no function")
    config = op.config
    if not isinstance(config, Mapping):
        add(subject, f"{where}: config must be an object, got {type(config).__name__}")
        return
    try:
        size = len(json.dumps(config, allow_nan=False, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError) as exc:
        add(subject, f"{where}: config is not JSON (finite numbers, strings, lists, objects): {ids.echo(str(exc))}")
        return
    if size > MAX_CONFIG_BYTES:
        add(subject, f"{where}: config has {size:,} bytes as JSON; at most {MAX_CONFIG_BYTES:,}")
        return
    for key, value in config.items():
        expected = kind.keys.get(key) if isinstance(key, str) else None
        if expected is None:
            accepted = ", ".join(kind.keys) or "none"
            add(subject, f"{where} ({op.kind}): unknown config key {q(key)} (accepted: {accepted})")
            continue
        problem = _value_problem(expected, value, context)
        if problem is not None:
            add(subject, f"{where} ({op.kind}): config {key!r} {problem}")
    if op.kind in DELTA_KINDS:
        for problem in delta_config_problems(op.kind, config):
            add(subject, f"{where} ({op.kind}): {problem}")
    if op.kind == kafka.KAFKA:
        allowed = context.allowed_hosts if context is not None else ()
        for problem in kafka.config_problems(config) + avro.config_problems(config, allowed):
            add(subject, f"{where} ({op.kind}): {problem}")
    if op.kind == "source.range" and isinstance(config.get("step"), int) and config.get("step") == 0:
        add(subject, f"{where} ({op.kind}): config 'step' must not be 0")
    if kind.function is FunctionUse.OPTIONAL and op.function and "schema" not in config:
        add(subject, f"{where} ({op.kind}) has a function, so it needs config schema (what the function returns)")
    if ELIDED_EXCHANGE in config:
        # Only one subtask on each side makes the left-out HASH exchange a no-op.
        if index == 0:
            add(subject, f"{where} ({op.kind}): config {ELIDED_EXCHANGE!r} marks an operator chained behind its "
                "producer; a chain's head reads its input through the vertex's edge")
        if _is_int(v.parallelism) and v.parallelism != 1:
            add(subject, f"{where} ({op.kind}): config {ELIDED_EXCHANGE!r} holds only at parallelism 1 (the vertex "
                f"has {v.parallelism}): at more subtasks its input must be HASH-partitioned on its keys")


def host_problem(value: object) -> str | None:
    """Why `value` is not a host name or IP address (None if it is)."""
    if not isinstance(value, str) or not _HOST.fullmatch(value):
        return f"must be a host name or IP address, got {ids.echo(value)}"
    return None


def _allowed_host_problem(value: object, context: ValidationContext | None) -> str | None:
    """Why `value` is not a host name, or not one this cluster lets jobs connect to."""
    problem = host_problem(value)
    if problem is None and context is not None and context.allowed_hosts \
            and value.lower() not in context.allowed_hosts:  # type: ignore[union-attr]
        return (f"{ids.echo(value)} is not a host jobs may connect to here "
                f"(funke.io.allowed-hosts: {', '.join(context.allowed_hosts)})")
    return problem


def _stream_key_problem(value: object) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_STREAM_KEY_LENGTH or not value.isprintable():
        return f"must be a printable stream key of 1 to {MAX_STREAM_KEY_LENGTH} characters, got {ids.echo(value)}"
    return None


def _value_problem(expected: Value, value: object, context: ValidationContext | None) -> str | None:
    """Why `value` is not what a config key of type `expected` takes (None if it is)."""
    if expected is Value.SOURCE_PATH:
        return path_problem(value, sink=False, context=context)
    if expected is Value.SINK_PATH:
        return path_problem(value, sink=True, context=context)
    if expected is Value.SINK_MODE:
        if value not in SINK_MODES:
            return f"must be one of {', '.join(repr(m) for m in SINK_MODES)}, got {ids.echo(value)}"
        return None
    if expected is Value.JOIN_TYPE:
        if value not in JOIN_TYPES:
            return f"must be a join type ({', '.join(sorted(JOIN_TYPES))}), got {ids.echo(value)}"
        return None
    if expected in (Value.DDL, Value.SQL):
        return _text_problem(value)
    if expected is Value.SQL_LIST:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            return f"must be a string or a non-empty list of strings, got {ids.echo(value)}"
        return next((p for p in map(_text_problem, items) if p), None)
    if expected is Value.COLUMNS:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            return f"must be a non-empty list of column names, got {ids.echo(value)}"
        if len(items) > MAX_PARTITION_KEYS:
            return f"has {len(items)} columns; at most {MAX_PARTITION_KEYS}"
        return next((p for p in (ids.name_problem(c, "column name", ids.MAX_LABEL_LENGTH, empty_ok=False)
                                 for c in items) if p), None)
    if expected is Value.INT64:
        if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
            return f"must be a 64-bit integer, got {ids.echo(value)}"
        return None
    if expected is Value.POSITIVE_INT:
        if not _is_int(value) or not 1 <= value <= INT64_MAX:
            return f"must be a positive integer, got {ids.echo(value)}"
        return None
    if expected is Value.HOST:
        return _allowed_host_problem(value, context)
    if expected is Value.BOOTSTRAP:
        try:
            servers = kafkasink.bootstrap_servers(value)
        except ValueError as exc:
            return str(exc)
        return next((p for host, _ in servers if (p := _allowed_host_problem(host, context))), None)
    if expected is Value.TOPIC:
        return kafkasink.topic_problem(value)
    if expected is Value.GUARANTEE:
        if value not in kafkasink.GUARANTEES:
            return f"must be one of {', '.join(repr(g) for g in kafkasink.GUARANTEES)}, got {ids.echo(value)}"
        return None
    if expected is Value.URL:
        return avro.registry_url_problem(value, context.allowed_hosts if context is not None else ())
    if expected is Value.BOOLEAN:
        return None if isinstance(value, bool) else f"must be true or false, got {ids.echo(value)}"
    if expected is Value.TOPICS:
        return kafka.topics_problem(value)
    if expected is Value.TOPIC_PATTERN:
        return kafka.pattern_problem(value)
    if expected is Value.KAFKA_STARTING:
        return kafka.starting_problem(value)
    if expected is Value.KAFKA_END_OFFSETS:
        return None if value in kafka.END_OFFSETS else \
            f"must be one of {', '.join(map(repr, kafka.END_OFFSETS))}, got {ids.echo(value)}"
    if expected is Value.VALUE_FORMAT:
        return None if value in kafka.VALUE_FORMATS else \
            f"must be one of {', '.join(map(repr, kafka.VALUE_FORMATS))}, got {ids.echo(value)}"
    if expected is Value.VALUE_SCHEMA:
        return kafka.value_schema_problem(value)
    if expected is Value.KAFKA_OPTIONS:
        return kafka.options_problem(value)
    if expected is Value.PORT:
        if not _is_int(value) or not 1 <= value <= 65535:
            return f"must be a TCP port from 1 to 65535, got {ids.echo(value)}"
        return None
    if expected is Value.STREAM_KEY:
        return _stream_key_problem(value)
    if expected is Value.STREAM_KEYS:
        if not isinstance(value, list) or not value or len(value) > MAX_STREAM_KEYS or len(set(map(str, value))) != len(value):
            return f"must be a non-empty list of at most {MAX_STREAM_KEYS} distinct stream keys, got {ids.echo(value)}"
        return next((p for p in map(_stream_key_problem, value) if p), None)
    if expected is Value.STARTING:
        if value not in ("earliest", "latest"):
            return f"must be 'earliest' or 'latest', got {ids.echo(value)}"
        return None
    if expected is Value.REDIS_DB:
        if not _is_int(value) or not 0 <= value <= 2**31 - 1:
            return f"must be a database number from 0, got {ids.echo(value)}"
        return None
    if expected is Value.OPTIONS:
        return _options_problem(value)
    if expected is Value.STATE_SPECS:
        return state_specs_problem(value)
    if expected is Value.COLUMN:
        return ids.name_problem(value, "column name", ids.MAX_LABEL_LENGTH, empty_ok=False)
    if expected is Value.MILLIS:
        if not _is_int(value) or not 0 <= value <= MAX_DELAY_MS:
            return f"must be a duration in milliseconds from 0 to ten years, got {ids.echo(value)}"
        return None
    if expected is Value.DELTA_MODE:
        if value not in DELTA_MODES:
            return f"must be one of {', '.join(repr(m) for m in DELTA_MODES)}, got {ids.echo(value)}"
        return None
    if expected is Value.VERSION:
        if not _is_int(value) or not 0 <= value <= INT64_MAX:
            return f"must be a table version (an integer from 0), got {ids.echo(value)}"
        return None
    if expected is Value.TIMESTAMP:
        try:
            parse_timestamp(value)
        except ValueError as exc:
            return str(exc)
        return None
    if expected is Value.TRUE:
        return None if value is True else f"must be true, got {ids.echo(value)}"
    if expected is Value.ROWS:
        if not isinstance(value, (list, str)):
            return f"must be a list of rows, got {type(value).__name__}"
        return None
    raise AssertionError(f"no check for {expected}")  # a catalogue type without a rule here


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty string, got {ids.echo(value)}"
    if "\x00" in value:
        return "contains a NUL character"
    return None


def _options_problem(value: object) -> str | None:
    if not isinstance(value, Mapping):
        return f"must be an object, got {type(value).__name__}"
    if len(value) > MAX_OPTIONS:
        return f"has {len(value)} entries; at most {MAX_OPTIONS}"
    for key, item in value.items():
        problem = ids.label_problem(key, "option name")
        if problem is not None:
            return problem
        if isinstance(item, float) and not math.isfinite(item):
            return f"option {q(key)} is not a finite number"
        if not isinstance(item, (str, int, float, bool)):
            return f"option {q(key)} must be a string, number or boolean, got {type(item).__name__}"
        if isinstance(item, str) and (len(item) > MAX_OPTION_VALUE_LENGTH or "\x00" in item):
            return f"option {q(key)} is longer than {MAX_OPTION_VALUE_LENGTH} characters or contains NUL"
    return None


def path_problem(value: object, *, sink: bool, context: ValidationContext | None = None) -> str | None:
    """Why `value` is not a usable source (sink=False) or sink (sink=True) location, or None.

    Locations are absolute paths or URIs with a scheme (the DSL makes relative paths absolute on
    the client: a relative path would mean a different place on each machine). No control
    characters. A sink target must be written in normal form (no `.`/`..` segments, no `//`), not
    be a filesystem root, and must not overlap the cluster's data directory; with
    funke.io.allowed-paths set, every location lies under one of them."""
    if not isinstance(value, str):
        return f"must be a path string, got {type(value).__name__}"
    if not value.strip():
        return "is empty"
    if len(value) > MAX_PATH_LENGTH:
        return f"is longer than {MAX_PATH_LENGTH} characters"
    if ids.has_control_characters(value):
        return f"{ids.echo(value)} contains control characters"
    uri = _URI.fullmatch(value)
    if uri is None and not value.startswith("/"):
        return (f"{ids.echo(value)} is relative; give an absolute path or a URI such as "
                "file:///data/in or hdfs://nn/data/in (the DSL makes relative paths absolute)")
    inner = value if uri is None else "/" + uri.group(2).partition("/")[2]
    if sink:
        trimmed = inner.rstrip("/") or "/"
        if posixpath.normpath(trimmed) != trimmed:
            return f"{ids.echo(value)} is not in normal form (no '.', '..' or '//' segments)"
        if trimmed == "/":
            return f"{ids.echo(value)} is a filesystem root; write into a directory of its own"
    if context is not None:
        if sink and context.data_dir and _overlaps(value, context.data_dir):
            return (f"{ids.echo(value)} overlaps the cluster's data directory {context.data_dir}; "
                    "write somewhere else")
        if not sink and context.data_dir and _under(value, context.data_dir):
            return f"{ids.echo(value)} lies in the cluster's data directory, which holds other jobs' data"
        if context.allowed_paths:
            # Hadoop expands {a,b} alternatives (which may hold '/') before it resolves '..', and
            # '\' escapes glob characters: no textual check could follow that, so with an
            # allow-list a location may only use '*', '?' and '[...]' within one directory level.
            segments = inner.split("/")
            if any(c in value for c in "{}\\") or ".." in segments or "." in segments:
                return (f"{ids.echo(value)} uses '{{', '}}', '\\', '.' or '..', which funke.io.allowed-paths "
                        "does not allow (they could reach outside the allowed directories)")
            if not any(_under(value, root) for root in context.allowed_paths):
                allowed = ", ".join(context.allowed_paths)
                return f"{ids.echo(value)} is outside the directories jobs may use here (funke.io.allowed-paths: {allowed})"
    return None


def _comparable(location: str) -> tuple[str, str]:
    """(filesystem, normalised path) of a location: file:// URIs and plain paths are the same
    filesystem; other URIs are their scheme and authority."""
    if location.startswith("file://"):
        location = location[len("file://"):]
        location = "/" + location.partition("/")[2] if not location.startswith("/") else location
    uri = _URI.fullmatch(location)
    if uri is None:
        return "", posixpath.normpath(location) if location.startswith("/") else posixpath.normpath("/" + location)
    authority, _, path = uri.group(2).partition("/")
    return f"{uri.group(1).lower()}://{authority}", posixpath.normpath("/" + path)


def _under(location: str, root: str) -> bool:
    (fs, path), (root_fs, root_path) = _comparable(location), _comparable(root)
    return fs == root_fs and (path == root_path or path.startswith(root_path.rstrip("/") + "/"))


def _overlaps(a: str, b: str) -> bool:
    return _under(a, b) or _under(b, a)


# ------------------------------------------------------------------------------ whole-graph rules


def _check_sink_targets(job: JobGraph, add) -> None:
    """Two file sinks writing into the same directory (or one inside the other) would commit over
    each other's output."""
    targets = []
    for v in job.vertices:
        for op in v.operators[:MAX_OPERATORS_PER_VERTEX]:
            kind = CATALOGUE.get(op.kind) if isinstance(op.kind, str) else None
            config = op.config if isinstance(op.config, Mapping) else {}
            path = config.get("path") if kind is not None and kind.role is OperatorRole.SINK else None
            if isinstance(path, str) and path.strip():
                targets.append((v.id, op.display_name, posixpath.normpath(path.strip()).rstrip("/")))
    for i, (vid, name, path) in enumerate(targets):
        for other_vid, other_name, other in targets[i + 1:]:
            if path == other or other.startswith(path + "/") or path.startswith(other + "/"):
                add(f"vertex {q(other_vid)}", f"sink {q(other_name)} writes to {ids.echo(other)[1:-1]}, which overlaps "
                    f"the target {ids.echo(path)[1:-1]} of sink {q(name)} in vertex {q(vid)}")


def _check_co_location(job: JobGraph, add) -> None:
    groups: dict[str, list] = defaultdict(list)
    for v in job.vertices:
        if v.co_location_group:
            groups[v.co_location_group].append(v)
    for name, members in groups.items():
        parallelisms = {v.parallelism for v in members}
        if len(parallelisms) > 1:
            detail = ", ".join(f"{q(v.id)}={v.parallelism}" for v in members[:20])
            add(f"co-location group {q(name)}", f"members have different parallelism ({detail})")
        ssgs = {v.slot_sharing_group for v in members}
        if len(ssgs) > 1:
            detail = ", ".join(f"{q(v.id)} in {q(v.slot_sharing_group)}" for v in members[:20])
            add(f"co-location group {q(name)}", f"members are in different slot-sharing groups ({detail})")


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
        path = " -> ".join(q(x)[1:-1] for x in [cycle[0][0]] + [dst for _, dst in cycle][:50])
        add("job", f"cycle: {path}")
    sources = [vid for vid, v in vertices.items() if v.is_source]
    reachable: set[str] = set(sources)
    for s in sources:
        reachable |= nx.descendants(g, s)
    for vid in vertices:
        if vid not in reachable:
            add(f"vertex {q(vid)}", "has no path from a source")


def _check_configuration(job: JobGraph, add) -> None:
    from funke.common.graph.restart import RestartStrategyError, restart_strategy_from_config

    cfg = job.configuration
    subject = "job configuration"
    if cfg.restart_strategy is not None:
        options = cfg.restart_strategy.options
        if isinstance(options, Mapping) and len(options) > MAX_OPTIONS:
            add(subject, f"restart strategy has {len(options)} options; at most {MAX_OPTIONS}")
        else:
            try:
                restart_strategy_from_config(cfg.restart_strategy)
            except RestartStrategyError as exc:
                add(subject, ids.echo(str(exc), 300)[1:-1] if len(str(exc)) > 300 else str(exc))
    timeout = cfg.slot_request_timeout_s
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
            add(subject, f"slot request timeout {ids.echo(timeout)} is not a finite number of seconds")
        elif timeout <= 0:
            add(subject, f"slot request timeout {timeout} s is not positive")
        elif timeout > MAX_TIMEOUT_S:
            add(subject, f"slot request timeout {timeout:g} s is longer than a year")
    options = cfg.options
    if not isinstance(options, Mapping):
        add(subject, "options must be a mapping of strings")
    elif len(options) > MAX_OPTIONS:
        add(subject, f"has {len(options)} options; at most {MAX_OPTIONS}")
    else:
        for key, value in options.items():
            problem = ids.label_problem(key, "option name")
            if problem is None and (not isinstance(value, str) or len(value) > MAX_OPTION_VALUE_LENGTH
                                    or ids.has_control_characters(value)):
                problem = (f"option {q(key)}: value must be printable text of at most "
                           f"{MAX_OPTION_VALUE_LENGTH} characters")
            if problem is not None:
                add(subject, problem)
        try:
            exchange_in_memory_max_bytes(options)
        except ValueError as e:
            add(subject, str(e))


def _check_artifacts(job: JobGraph, add) -> None:
    if len(job.artifacts) > MAX_ARTIFACTS:
        add("job", f"has {len(job.artifacts)} artifacts; at most {MAX_ARTIFACTS}")
        return
    total = 0
    for name, n in Counter(a.name for a in job.artifacts).items():
        problem = ids.path_id_problem(name, "name")
        if problem is not None:
            add(f"artifact {q(name)}", problem)
        if n > 1:
            add(f"artifact {q(name)}", f"name is used {n} times")
    for a in job.artifacts:
        if not isinstance(a.content, (bytes, bytearray)):
            add(f"artifact {q(a.name)}", "content must be bytes")
            continue
        total += len(a.content)
        if a.uri:
            problem = path_problem(a.uri, sink=False)
            if problem is not None:
                add(f"artifact {q(a.name)}", f"uri {problem}")
    if total > MAX_ARTIFACT_BYTES:
        add("job", f"artifacts hold {total:,} bytes; at most {MAX_ARTIFACT_BYTES:,}")


# A value type without a rule in `_value_problem` fails at import, not on the first request.
for _value in Value:
    _value_problem(_value, None, None)
del _value
