"""What a JobGraph says about its streaming query: which vertices read streams, which write its
output, and the query's settings (trigger, checkpoint location, concurrency, retention), with
every problem named.

A job is a streaming query when a vertex starts with a stream source (`source.rate`,
`source.stream.*`): it runs as micro-batches (`funke.common.streaming.microbatch`). Its settings are job
options:

    streaming.trigger               processing-time (default) | available-now | once
    streaming.trigger.interval      the processing-time interval (default 1 s; Flink duration syntax)
    streaming.checkpoint-location   where its offset and commit logs live (default: under the
                                    JobManager's data directory, by job name)
    streaming.concurrent-jobs       batches run at once (Spark's spark.streaming.concurrentJobs, 1)
    streaming.min-batches-to-retain log entries kept (Spark's minBatchesToRetain, 100)
    streaming.backpressure.enabled  receivers take records at the rate batches keep up with
                                    (Spark's spark.streaming.backpressure.enabled, false)
    streaming.output-mode           what a batch emits (Structured Streaming's output modes):
                                    append (default; each row once: stateless queries, and
                                    each window's result once, when the watermark closes it),
                                    update (the keys a batch changed, with their new totals) or
                                    complete (every key's total, every batch); a query with a
                                    running aggregate must say update or complete
    streaming.watermark-policy      how the query's watermark follows its watermark operators:
                                    min (default: the slowest input) or max (the fastest)

Pure: reads the graph, returns values and problems.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from funke.common.streaming import microbatch as mb
from funke.common.streaming.eventtime import POLICIES, WATERMARK, WATERMARK_POLICY, operator_id, window_problem
from funke.common.streaming.sources import RECEIVER_KINDS, SOURCE_PLUGINS, STREAM_FILE_KINDS  # noqa: F401 (re-exported)
from funke.common.streaming.sources.receiver import SOCKET  # noqa: F401
from funke.common.streaming.sources.rate import RATE  # noqa: F401
from funke.common.streaming.sources.redis import REDIS  # noqa: F401
from funke.common.graph.jobgraph import (
    DistributionPattern,
    IntermediateDataSet,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    PartitionerKind,
    chain_name,
    result_partition_type,
)
from funke.common.graph.operators import CATALOGUE, ELIDED_EXCHANGE, OperatorRole

# The stream sources are the registry's (`funke.common.streaming.sources.SOURCE_PLUGINS`, by operator kind)
STREAM_SOURCE_KINDS = frozenset(SOURCE_PLUGINS)
STREAM_ONLY_SINK_KINDS = frozenset({"sink.foreach_batch", "sink.redis"})

TRIGGER = "streaming.trigger"
INTERVAL = "streaming.trigger.interval"
CHECKPOINT = "streaming.checkpoint-location"
CONCURRENT_JOBS = "streaming.concurrent-jobs"
RETAIN = "streaming.min-batches-to-retain"
BACKPRESSURE = "streaming.backpressure.enabled"
OUTPUT_MODE = "streaming.output-mode"
OPTIONS = (TRIGGER, INTERVAL, CHECKPOINT, CONCURRENT_JOBS, RETAIN, BACKPRESSURE, OUTPUT_MODE, WATERMARK_POLICY)
ALL_OUTPUT_MODES = ("append", "update", "complete")
# Operators whose results span batches (keyed state, `funke.common.streaming.state`): running
# aggregates, whose output mode must be update or complete, deduplicate (bounded jobs have it
# too, without state) and keyed process functions (whose output is what the function emits).
RUNNING_AGGREGATE_KINDS = frozenset({"running_aggregate", "running_reduce"})
WINDOW_KINDS = frozenset({"window_aggregate", "session_aggregate"})  # keyed state per window, closed by the watermark
# operators whose keyed state the watermark bounds (and that need one upstream)
WATERMARKED_KINDS = WINDOW_KINDS | {"deduplicate_within", "interval_join"}
INTERVAL_JOINS = frozenset({"inner", "left", "leftouter", "left_outer"})
RUNNING_KINDS = RUNNING_AGGREGATE_KINDS | WATERMARKED_KINDS | {"deduplicate", "process"}
CHECKPOINTS = "checkpoints"  # under the data directory: default checkpoint locations, by job name
TRIGGERS = ("processing-time", "available-now", "once")
DEFAULT_INTERVAL_MS = 1000
DEFAULT_RETAIN = 100


@dataclass(frozen=True, slots=True)
class EventTimeSettings:
    """A query's event time: per watermark operator ("<vertex>/<index>") its delay in ms, the
    policy over them, and whether a window operator's state waits on the watermark (then a
    watermark that moved runs a batch even without new data)."""
    delays: dict[str, int]
    policy: str = "min"
    stateful: bool = False
    partitioned: dict[str, int | None] = field(default_factory=dict)  # per-partition -> idle timeout ms


def event_time_settings(job: JobGraph) -> EventTimeSettings:
    delays = {operator_id(v.id, i): int(op.config.get("delay_ms", 0))
              for v in job.vertices for i, op in enumerate(v.operators) if op.kind == WATERMARK}
    policy = job.configuration.options.get(WATERMARK_POLICY, "min").strip().lower()
    # operators whose state waits on the watermark: windows, and process functions (event-time timers)
    stateful = any(op.kind in WATERMARKED_KINDS | {"process"} for v in job.vertices for op in v.operators)
    partitioned = {operator_id(v.id, i): _idle_ms(op.config.get("idle_timeout_ms"))
                   for v in job.vertices for i, op in enumerate(v.operators)
                   if op.kind == WATERMARK and op.config.get("per_partition") is True}
    return EventTimeSettings(delays, policy if policy in POLICIES else "min", stateful and bool(delays), partitioned)


def _idle_ms(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class QuerySettings:
    trigger: mb.Trigger
    checkpoint_location: str  # "" : the default under the data directory
    concurrent_jobs: int = 1
    min_batches_to_retain: int = DEFAULT_RETAIN
    backpressure: bool = False


def checkpoint_location(job: JobGraph, data_dir: str) -> str:
    """Where a streaming query's checkpoint is: its option (a local path or file:// URI), or
    `<data dir>/checkpoints/<job name>`, the name made a plain path component."""
    option = job.configuration.options.get(CHECKPOINT, "").strip()
    if option:
        return local_path(option)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job.name).strip(".") or "query"
    return posixpath.join(data_dir, CHECKPOINTS, safe[:200])


def local_path(location: str) -> str:
    """A local directory from a path or a file:// URI (streaming checkpoints and file sources
    are local for now)."""
    if location.startswith("file://"):
        rest = location[len("file://"):]
        return rest if rest.startswith("/") else "/" + rest.partition("/")[2]
    if "://" in location:
        raise ValueError(f"{location}: only local paths and file:// URIs are supported here")
    return location


def stream_sources(job: JobGraph) -> list[JobVertex]:
    """The vertices whose chain starts with a stream source."""
    return [v for v in job.vertices if v.operators and v.operators[0].kind in STREAM_SOURCE_KINDS]


def is_streaming_query(job: JobGraph) -> bool:
    return bool(stream_sources(job))


def sinks(job: JobGraph) -> list[JobVertex]:
    """The vertices whose chain ends in a sink: the query's output operations."""
    return [v for v in job.vertices if v.operators and (k := CATALOGUE.get(v.operators[-1].kind)) is not None
            and k.role is OperatorRole.SINK]


def query_problems(job: JobGraph) -> list[str]:
    """What keeps a job from being a streaming query it says it is (empty: none, or not one)."""
    problems: list[str] = []
    streams = stream_sources(job)
    misplaced = [f"{v.id!r} (operator {i})" for v in job.vertices for i, op in enumerate(v.operators)
                 if op.kind in STREAM_SOURCE_KINDS and (i > 0)]
    if misplaced:
        problems.append(f"a stream source must start its vertex's chain: {', '.join(misplaced)}")
    if not streams:
        stray = [k for k in OPTIONS if k in job.configuration.options]
        if stray:
            problems.append(f"options {', '.join(stray)} are for streaming queries, and this job reads no stream")
        per_batch = [v.id for v in job.vertices if any(op.kind in STREAM_ONLY_SINK_KINDS for op in v.operators)]
        if per_batch:
            problems.append(f"vertices {per_batch} end in a sink of streaming queries (foreach_batch, write_redis), "
                            "and this job reads no stream")
        running = [f"{v.id!r} ({op.kind})" for v in job.vertices for op in v.operators
                   if op.kind in RUNNING_AGGREGATE_KINDS | {"process"}]
        if running:
            problems.append(f"vertices {', '.join(running)} keep state across a streaming query's batches, and this "
                            "job reads no stream (a bounded job's keyed aggregate is count/reduce/aggregate)")
        return problems
    if job.job_type is not JobType.STREAMING:
        problems.append("a job that reads a stream must be a STREAMING job")
    problems += _static_problems(job)
    try:
        query_settings(job)
    except ValueError as exc:
        problems.append(str(exc))
    problems += _state_problems(job)
    problems += _per_partition_problems(job)
    return problems


# The joins of a stream with a static data set (read again for every batch, as Structured
# Streaming's stream-static join): the stream's rows are each joined once, so an outer join keeps
# the stream's side only.
STREAM_LEFT_JOINS = frozenset({"inner", "left", "leftouter", "left_outer", "semi", "leftsemi", "left_semi", "anti",
                               "leftanti", "left_anti"})
STREAM_RIGHT_JOINS = frozenset({"inner", "right", "rightouter", "right_outer"})


def _static_problems(job: JobGraph) -> list[str]:
    """A bounded source in a streaming query is a static data set: read again for every batch,
    it may only meet the stream in a join that emits each stream row's matches once (inner, or
    outer on the stream's side); a static branch that reaches a sink or a union with the stream
    would emit its rows again every batch."""
    producer_of = {d.id: d.producer for d in job.data_sets}
    inputs: dict[str, list[tuple[int, str]]] = {}
    for e in job.edges:
        if e.data_set in producer_of:
            inputs.setdefault(e.consumer, []).append((e.input_index, producer_of[e.data_set]))
    by_id = {v.id: v for v in job.vertices}
    streaming: dict[str, bool] = {}

    def is_streaming(vid: str, seen: frozenset = frozenset()) -> bool:
        if vid not in streaming:
            v = by_id.get(vid)
            if v is None or vid in seen:
                return False
            head = v.operators[0].kind if v.operators else ""
            streaming[vid] = head in STREAM_SOURCE_KINDS or any(
                is_streaming(p, seen | {vid}) for _, p in inputs.get(vid, ()))
        return streaming[vid]

    problems: list[str] = []
    writers = {v.id for v in sinks(job)}
    for v in job.vertices:
        if not is_streaming(v.id):
            if v.id in writers:
                problems.append(f"vertex {v.id!r} writes a static data set in a streaming query: it would be written "
                                "again every batch; join it with the stream instead")
            continue
        sides = [(i, is_streaming(p)) for i, p in sorted(inputs.get(v.id, ()))]
        if not v.operators:
            continue
        if all(s for _, s in sides):
            if v.operators[0].kind == "join" and len(sides) > 1:
                problems.append(f"vertex {v.id!r}: join() of two streams would join only rows that arrive in the "
                                "same batch; use interval_join(other, on, lower, upper) with a time bound (both "
                                "streams with a watermark), whose state the watermarks bound")
            continue
        head = v.operators[0]
        if head.kind != "join":
            problems.append(f"vertex {v.id!r} ({head.kind}) mixes the stream with a static data set: only a join may "
                            "(a union would emit the static rows again every batch)")
            continue
        how = str(head.config.get("how", "inner")).lower()
        stream_left = dict(sides).get(0, False)
        allowed = STREAM_LEFT_JOINS if stream_left else STREAM_RIGHT_JOINS
        if how not in allowed:
            side = "left" if stream_left else "right"
            problems.append(f"vertex {v.id!r}: a {how} join of a stream ({side}) with a static data set would emit "
                            f"the static side's unmatched rows again every batch; use one of "
                            f"{', '.join(sorted(allowed))}")
    return problems


def _state_problems(job: JobGraph) -> list[str]:
    """What keeps the query's running operators (keyed state) from running as they say."""
    from funke.common import aggregates

    problems: list[str] = []
    options = job.configuration.options
    mode = options.get(OUTPUT_MODE, "append").strip().lower()
    if mode not in ALL_OUTPUT_MODES:
        problems.append(f"option {OUTPUT_MODE}: expected one of {', '.join(ALL_OUTPUT_MODES)}, "
                        f"got {options.get(OUTPUT_MODE)!r}")
    running = [(v, i, op) for v in job.vertices for i, op in enumerate(v.operators) if op.kind in RUNNING_KINDS]
    if mode == "complete" and not any(op.kind in RUNNING_AGGREGATE_KINDS for _, _, op in running):
        problems.append(f"option {OUTPUT_MODE}: complete mode emits every key's total, and this query has "
                        "no running aggregate (key_by(...).count()/aggregate(...))")
    if not running:
        return problems
    for v, i, op in running:
        subject = f"operator '{op.display_name}' ({op.kind}) of vertex {v.id!r}"
        if op.kind in RUNNING_AGGREGATE_KINDS and mode not in ("update", "complete"):
            problems.append(
                f"{subject} keeps a total per key across batches, so the query must say what a batch emits: "
                f"set {OUTPUT_MODE} to update (the keys the batch changed) or complete (every key); "
                "append emits each result once, and a running total is never final: for results that are, "
                "aggregate per window of event time (with_watermark(...).key_by(...).window(...)). For a count "
                "of each batch on its own, use key_by(...).per_batch().count()")
        if op.kind in WATERMARKED_KINDS:
            problems += _window_problems(job, v, op, subject, mode)
        if i != 0:
            problems.append(f"{subject} must start its vertex's chain, fed by a HASH exchange on its keys")
            continue
        keys = op.config.get("keys")
        keys = [keys] if isinstance(keys, str) else list(keys or [])
        for e in job.edges:
            if e.consumer == v.id and (e.partitioner.value != "HASH" or list(e.partition_keys) != keys):
                problems.append(f"{subject}: its input {e.id!r} must be HASH-partitioned on its keys {keys}, "
                                f"not {e.partitioner.value} {list(e.partition_keys)}")
        aggregations = op.config.get("aggregations")
        aggregations = [aggregations] if isinstance(aggregations, str) else list(aggregations or [])
        bad = [a for a in aggregations if isinstance(a, str) and aggregates.parse_call(a) is None]
        if bad:
            problems.append(f"{subject}: {', '.join(repr(a) for a in bad)}: {aggregates.RUNNING_ONLY}")
    problems += _window_numbers_problems(job)
    policy = options.get(WATERMARK_POLICY, "min").strip().lower()
    if policy not in POLICIES:
        problems.append(f"option {WATERMARK_POLICY}: expected one of {', '.join(POLICIES)}, "
                        f"got {options.get(WATERMARK_POLICY)!r}")
    concurrent = options.get(CONCURRENT_JOBS, "1").strip()
    if concurrent != "1":
        problems.append(f"option {CONCURRENT_JOBS}: a query with keyed state runs one batch at a time "
                        f"(each batch reads the state the one before it committed), got {concurrent!r}")
    return problems


def _window_numbers_problems(job: JobGraph) -> list[str]:
    """Windows whose numbers cannot be (a slide longer than the size, a size of 0, a row in more
    windows than allowed), in the window operators and their late-data operators alike."""
    problems = []
    for v in job.vertices:
        for op in v.operators:
            if op.kind not in ("window_aggregate", "session_aggregate", "late_rows"):
                continue
            c = op.config
            if op.kind == "session_aggregate" or (op.kind == "late_rows" and "gap_ms" in c):
                size = slide = c.get("gap_ms")
            else:
                size, slide = c.get("size_ms"), c.get("slide_ms")
            if not all(isinstance(x, int) for x in (size, slide)):
                if op.kind == "late_rows":
                    problems.append(f"operator '{op.display_name}' (late_rows) of vertex {v.id!r}: needs size_ms and "
                                    "slide_ms, or gap_ms")
                continue  # the config check names a missing or mistyped number
            problem = window_problem(size, slide, c.get("lateness_ms") or 0)
            if problem:
                problems.append(f"operator '{op.display_name}' ({op.kind}) of vertex {v.id!r}: {problem}")
    return problems


def _window_problems(job: JobGraph, vertex: JobVertex, op, subject: str, mode: str) -> list[str]:
    """A window operator needs a watermark on its time column upstream (else its windows never
    close and its state grows for ever) and an output mode that emits a window once (append) or
    as it changes (update)."""
    problems = []
    if op.kind == "interval_join":
        return _interval_join_problems(job, vertex, op, subject)
    if op.kind in WINDOW_KINDS and mode not in ("append", "update"):
        problems.append(f"{subject}: a window's result is emitted once when the watermark closes it (append) or "
                        f"each batch it changes (update); {OUTPUT_MODE} {mode} would keep every window for ever")
    column = op.config.get("column")
    if not any(o.kind == WATERMARK and o.config.get("column") == column for o in _upstream_operators(job, vertex)):
        problems.append(f"{subject}: no watermark on its time column {column!r} upstream, so its state would never "
                        f"be released and would grow for ever: add with_watermark({column!r}, <delay>) before "
                        "key_by(...)")
    return problems


# operators whose rows keep every column they received (a per-partition watermark after them
# still finds the Kafka source's topic and partition)
_KEEPS_COLUMNS = frozenset({"filter", "where", "watermark", "union", "noop", "deduplicate", "deduplicate_within"})
_PARTITION_COLUMNS = ("topic", "partition")


def _per_partition_problems(job: JobGraph) -> list[str]:
    """A per-partition watermark needs the Kafka source's topic and partition columns on its
    rows: every source upstream is Kafka, and every operator between keeps those columns."""
    problems = []
    for v in job.vertices:
        for i, op in enumerate(v.operators):
            if op.kind != WATERMARK or op.config.get("per_partition") is not True:
                continue
            subject = f"operator '{op.display_name}' (watermark per partition) of vertex {v.id!r}"
            upstream = list(v.operators[:i]) + _upstream_operators(job, v)
            lost = sorted({_drops_partition(o) for o in upstream} - {None})
            if lost:
                problems.append(f"{subject}: a per-partition watermark needs the Kafka source's topic and partition "
                                f"columns on its rows, and {'; '.join(lost)}: put with_watermark(..., "
                                "per_partition=True) right after read_stream.kafka(...)")
    return problems


def _drops_partition(op) -> str | None:
    """Why `op` leaves a per-partition watermark after it without the Kafka source's topic and
    partition columns (None: it keeps them)."""
    if op.kind == "source.kafka" or op.kind in _KEEPS_COLUMNS:
        return None
    name = f"'{op.display_name}' ({op.kind})"
    if CATALOGUE.get(op.kind) is not None and CATALOGUE[op.kind].role is OperatorRole.SOURCE:
        return f"{name} is not a Kafka source"
    if op.kind == "select":
        exprs = [str(e).strip().strip("`").lower() for e in op.config.get("exprs") or ()]
        if "*" in exprs or all(c in exprs for c in _PARTITION_COLUMNS):
            return None
        return f"{name} does not select topic and partition"
    if op.kind in ("map", "flat_map", "process"):
        names = {part.strip().split()[0].strip("`").lower() for part in str(op.config.get("schema") or "").split(",")
                 if part.strip()}
        if all(c in names for c in _PARTITION_COLUMNS):
            return None
        return f"{name} returns no topic and partition columns"
    return f"{name} does not keep the rows' topic and partition"


def _interval_join_problems(job: JobGraph, vertex: JobVertex, op, subject: str) -> list[str]:
    """Both streams need a watermark on their time column (it bounds what each side keeps), the
    bounds an order, and the join a kind whose rows can be emitted once."""
    problems = []
    how = str(op.config.get("how", "inner")).lower()
    if how not in INTERVAL_JOINS:
        problems.append(f"{subject}: a {how} interval join is not supported: inner or left (the left stream's rows "
                        "without a match emitted once their match can no longer arrive)")
    lower, upper = op.config.get("lower_ms"), op.config.get("upper_ms")
    if isinstance(lower, int) and isinstance(upper, int) and lower > upper:
        problems.append(f"{subject}: its lower bound ({lower} ms) is after its upper bound ({upper} ms)")
    producer_of = {d.id: d.producer for d in job.data_sets}
    by_id = {v.id: v for v in job.vertices}
    for e in job.edges:
        if e.consumer != vertex.id or e.data_set not in producer_of or e.input_index not in (0, 1):
            continue
        side, column = ("left", op.config.get("left_time")) if e.input_index == 0 else (
            "right", op.config.get("right_time"))
        producer = by_id.get(producer_of[e.data_set])
        if producer is None:
            continue
        upstream = list(producer.operators) + _upstream_operators(job, producer)
        if not any(o.kind == WATERMARK and o.config.get("column") == column for o in upstream):
            problems.append(f"{subject}: its {side} stream has no watermark on {column!r}, so the rows it keeps would "
                            f"never be released: add with_watermark({column!r}, <delay>) to it")
    return problems


def _upstream_operators(job: JobGraph, vertex: JobVertex) -> list:
    """Every operator of the vertices that feed `vertex`, directly or not."""
    by_id = {v.id: v for v in job.vertices}
    producer_of = {d.id: d.producer for d in job.data_sets}
    producers: dict[str, list[str]] = {}
    for e in job.edges:
        if e.data_set in producer_of:
            producers.setdefault(e.consumer, []).append(producer_of[e.data_set])
    seen, stack, out = {vertex.id}, list(producers.get(vertex.id, ())), []
    while stack:
        vid = stack.pop()
        if vid in seen or vid not in by_id:
            continue
        seen.add(vid)
        out += by_id[vid].operators
        stack += producers.get(vid, ())
    return out


def query_settings(job: JobGraph) -> QuerySettings:
    """The query's settings from the job options (ValueError naming the bad one)."""
    from funke.common.durations import DurationError, parse_duration

    options = job.configuration.options
    kind = options.get(TRIGGER, "processing-time").strip().lower()
    if kind not in TRIGGERS:
        raise ValueError(f"option {TRIGGER}: expected one of {', '.join(TRIGGERS)}, got {options.get(TRIGGER)!r}")
    if INTERVAL in options and kind != "processing-time":
        raise ValueError(f"option {INTERVAL} only applies to the processing-time trigger, not {kind}")
    trigger: mb.Trigger
    if kind == "processing-time":
        interval_ms = DEFAULT_INTERVAL_MS
        if INTERVAL in options:
            try:
                interval_ms = round(parse_duration(options[INTERVAL]) * 1000)
            except DurationError as exc:
                raise ValueError(f"option {INTERVAL}: {exc}") from None
            if interval_ms < 1:
                raise ValueError(f"option {INTERVAL}: must be at least 1 ms, got {options[INTERVAL]!r}")
        trigger = mb.ProcessingTime(interval_ms)
    elif kind == "available-now":
        trigger = mb.AvailableNow()
    else:
        trigger = mb.Once()
    backpressure = options.get(BACKPRESSURE, "false").strip().lower()
    if backpressure not in ("true", "false"):
        raise ValueError(f"option {BACKPRESSURE}: expected true or false, got {options[BACKPRESSURE]!r}")
    return QuerySettings(trigger, options.get(CHECKPOINT, "").strip(),
                         _positive(options, CONCURRENT_JOBS, 1, 64), _positive(options, RETAIN, DEFAULT_RETAIN, 10**6),
                         backpressure == "true")


def _positive(options, key: str, default: int, largest: int) -> int:
    if key not in options:
        return default
    text = options[key].strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= largest:
        raise ValueError(f"option {key}: expected an integer from 1 to {largest}, got {options[key]!r}")
    return int(text)


def rescaled(job: JobGraph, parallelism: int, vertex_ids: list[str] | tuple[str, ...] = ()) -> tuple[JobGraph, list[str]]:
    """The query at another parallelism (`funke rescale`): `vertex_ids` (none: every vertex but
    receiver sources, whose receivers stay as many as the job says) at `parallelism`, each
    keeping the number of key groups it had (its max parallelism made explicit, so its keyed
    state is found whole). Returns the new graph and what keeps it from being one (empty: it
    is; the whole graph is validated again by the caller)."""
    import dataclasses

    problems: list[str] = []
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        return job, [f"parallelism must be a positive integer, got {parallelism!r}"]
    known = {v.id for v in job.vertices}
    unknown = [v for v in vertex_ids if v not in known]
    if unknown:
        problems.append(f"no vertex {', '.join(repr(v)[:140] for v in unknown[:5])} in the job (it has "
                        f"{', '.join(sorted(known))})")
    chosen = set(vertex_ids) if vertex_ids else {
        v.id for v in job.vertices if not (v.operators and v.operators[0].kind in RECEIVER_KINDS)}
    receivers = [v.id for v in job.vertices if v.id in chosen and v.operators and v.operators[0].kind in RECEIVER_KINDS]
    if receivers:
        problems.append(f"vertices {receivers} are receiver sources: their receivers are as many as the job says "
                        "(socket_text(receivers=...)); rescale the vertices after them")
    vertices = []
    for v in job.vertices:
        if v.id not in chosen:
            vertices.append(v)
            continue
        most = v.effective_max_parallelism
        if parallelism > most:
            problems.append(f"vertex {v.id!r}: parallelism {parallelism} exceeds its max parallelism {most} (the "
                            "number of key groups its state is kept in, fixed for the life of the query)")
        vertices.append(dataclasses.replace(v, parallelism=parallelism, max_parallelism=most))
    job = dataclasses.replace(job, vertices=tuple(vertices))
    if parallelism > 1:
        for v in [v for v in job.vertices if v.id in chosen]:
            job = _exchanges_back(job, v, problems)
    return job, problems


def _exchanges_back(job: JobGraph, v: JobVertex, problems: list[str]) -> JobGraph:
    """`job` with vertex `v` (now at more than one subtask) cut before each of its operators
    whose HASH exchange was left out at parallelism 1 (`operators.ELIDED_EXCHANGE`): each cut
    starts a vertex of its own, fed by a HASH exchange on the operator's keys, as the DSL makes
    it at that parallelism. `v` keeps its id (its sources and offsets), the vertex after the last
    cut takes over its data sets; an operator whose place names it in the offset log (a
    watermark: `eventtime.operator_id`) cannot move, and is reported instead."""
    import dataclasses

    cuts = [i for i, op in enumerate(v.operators) if i > 0 and ELIDED_EXCHANGE in op.config]
    if not cuts:
        return job
    moved = [op.display_name for op in v.operators[cuts[0]:] if op.kind == WATERMARK]
    if moved:
        problems.append(f"vertex {v.id!r}: its watermark {', '.join(repr(m) for m in moved)} follows an aggregate "
                        "chained at parallelism 1 and would move to a vertex of its own; stop the query and "
                        "submit it at the new parallelism")
        return job
    taken = {x.id for x in job.vertices} | {d.id for d in job.data_sets} | {e.id for e in job.edges}

    def fresh(base: str) -> str:
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}-{n}"
        taken.add(candidate)
        return candidate

    try:
        partition_type = result_partition_type(job.job_type, job.configuration.options)
    except ValueError as exc:  # a graph from a client that did not translate it
        problems.append(str(exc))
        return job
    pieces: list[JobVertex] = []
    data_sets: list[IntermediateDataSet] = []
    edges: list[JobEdge] = []
    for start, end in zip([0, *cuts], [*cuts, len(v.operators)]):
        operators = tuple(
            dataclasses.replace(op, config={key: value for key, value in op.config.items() if key != ELIDED_EXCHANGE})
            if index == start and start else op for index, op in enumerate(v.operators[start:end], start))
        vertex_id = v.id if not start else fresh(operators[0].kind.replace(".", "-").replace("_", "-"))
        if pieces:
            keys = operators[0].config.get("keys")
            data_set = IntermediateDataSet(fresh(f"{pieces[-1].id}.out0"), pieces[-1].id)
            data_sets.append(data_set)
            edges.append(JobEdge(fresh(f"{pieces[-1].id}->{vertex_id}"), data_set.id, vertex_id,
                                 DistributionPattern.ALL_TO_ALL, PartitionerKind.HASH,
                                 (keys,) if isinstance(keys, str) else tuple(keys or ()), partition_type, 0))
        pieces.append(dataclasses.replace(v, id=vertex_id, name=chain_name([op.display_name for op in operators]),
                                          operators=operators))
    last = pieces[-1].id
    vertices = []
    for x in job.vertices:
        vertices.extend(pieces if x.id == v.id else [x])
    return dataclasses.replace(
        job, vertices=tuple(vertices),
        data_sets=tuple(dataclasses.replace(d, producer=last) if d.producer == v.id else d
                        for d in job.data_sets) + tuple(data_sets),
        edges=job.edges + tuple(edges))
