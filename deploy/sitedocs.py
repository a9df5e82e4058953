"""The generated parts of the documentation site (`docs/`, built with MkDocs): each is made from
the code it describes, so a page cannot drift from it.

A page asks for a part with a marker line, `<!-- generated: NAME -->`; `docs/hooks.py` replaces
each marker with `render(NAME)` when the site is built. The parts:

    diagram:<section>     a state machine of `funke.common.states` (the sections of
                          `funke.deploy.docs`): Mermaid and a table
    cluster-options       the cluster configuration keys (`funke.common.configuration`)
    restart-options       the restart strategies' keys and defaults (`funke.common.graph.restart`)
    job-options           the job options (`streamingjob.OPTIONS`, the translator's keys)
    rest-endpoints        the REST API's routes (`funke.jobmanager.rest`)
    grpc-services         the gRPC services, methods and messages (`proto/funke/v1`)
    metrics               the Prometheus metrics (`jobmanager.metrics`, `taskmanager.metrics`)
    cli                   `funke --help` and every command's help (`funke.deploy.cli.parser`)
    exit-codes            the commands' exit codes and the refusals that exit 2 (`funke.deploy.cli.exitcodes`)
    python-api            the DSL's public methods and their docstrings (`funke.common.api.dsl`)
    exchanges             how the DSL's exchanges become JobEdges (`funke.common.api.translate`)
    operator-catalogue    every operator kind and its configuration keys (`funke.common.graph.operators`)
    conformance-scenarios the scenarios of `funke conformance` (`funke.deploy.conformance`)

Where the code holds names and defaults but not what they mean (configuration keys, REST
routes), the meaning is written here, and the part fails to render when the code accepts a key
or serves a route this module does not describe, or the other way round: a build with a missing
or stale entry fails rather than publishing it.

`python -m funke.deploy.sitedocs NAME` prints one part.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from importlib import resources

MARKER = re.compile(r"^<!-- generated: ([a-z0-9:_-]+) -->$", re.M)


class DocsError(Exception):
    """A generated part that cannot be made, or whose hand-written half no longer matches the code."""


def expand(markdown: str, where: str = "page") -> str:
    """`markdown` with every marker replaced by its part."""
    def part(match: re.Match[str]) -> str:
        try:
            return render(match.group(1))
        except DocsError as exc:
            raise DocsError(f"{where}: {exc}") from None
    return MARKER.sub(part, markdown)


def render(name: str) -> str:
    kind, _, arg = name.partition(":")
    if kind == "diagram":
        return state_diagram(arg)
    maker = PARTS.get(name)
    if maker is None:
        raise DocsError(f"no generated part {name!r} (known: diagram:<section>, {', '.join(PARTS)})")
    return maker()


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`{text}`"


# ---------------------------------------------------------------------------------------------
# State machines
# ---------------------------------------------------------------------------------------------


def state_diagram(section: str) -> str:
    """The Mermaid diagram of `section`'s transition table, and the same table as text."""
    from funke.common.states import render_mermaid
    from funke.deploy.docs import SECTIONS

    table = SECTIONS.get(section)
    if table is None:
        raise DocsError(f"no state table {section!r} (known: {', '.join(SECTIONS)})")
    states = list(table)
    rows = [(_code(s.value), ", ".join(_code(t.value) for t in sorted(table[s], key=states.index)) or "(terminal)")
            for s in states]
    return (f"```mermaid\n{render_mermaid(table)}\n```\n\n"
            f"{_table(('state', 'may go to'), rows)}\n\nThe first state is `{states[0].value}`.")


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterOption:
    key: str
    meaning: str
    field: str = ""  # the ClusterConfiguration field whose default is shown
    default: str = ""  # shown instead, where the default is resolved elsewhere
    aliases: tuple[str, ...] = ()


CLUSTER_OPTIONS: tuple[ClusterOption, ...] = (
    ClusterOption("restart-strategy.type", "the cluster's default restart strategy (`none`, `fixed-delay`, "
                  "`failure-rate`, `exponential-delay`; see the table below); a job's own setting wins",
                  default="none", aliases=("restart-strategy",)),
    ClusterOption("restart-strategy.*", "the restart strategy's options (the table below)",
                  default="(the strategy's)"),
    ClusterOption("jobmanager.execution.failover-strategy", "`region` or `full`", "failover_strategy"),
    ClusterOption("slot.request.timeout", "how long a job may wait for slots the cluster does not have",
                  "slot_request_timeout_s"),
    ClusterOption("slot.idle.timeout", "how long a slot no task of a job runs in stays the job's, idle, for the "
                  "regions it schedules next (a batch job's consumers take their producers' slots); at once back "
                  "while the job waits for slots (Flink: 50 s)", "slot_idle_timeout_s"),
    ClusterOption("heartbeat.interval", "how often a TaskManager heartbeats; suited to one machine (Flink: 10 s)",
                  "heartbeat_interval_s"),
    ClusterOption("heartbeat.timeout", "a TaskManager silent this long is lost (Flink: 50 s); one whose "
                  "heartbeat stream breaks is lost at once", "heartbeat_timeout_s"),
    ClusterOption("cluster.evenly-spread-out-slots", "spread slots over TaskManagers instead of filling one first",
                  "evenly_spread_out_slots"),
    ClusterOption("cluster.registration.probe-timeout", "how long the JobManager waits for its call back to a "
                  "registering TaskManager's address", "registration_probe_timeout_s"),
    ClusterOption("task.cancellation.timeout", "a task that does not confirm its cancellation within this is given "
                  "up: FAILED (in a failover, so the restart goes ahead; in a cancel, the job ends FAILED). Flink "
                  "kills the TaskManager instead", "cancellation_timeout_s"),
    ClusterOption("funke.data-dir", "result partitions and collected rows (any Spark URI). `funke cluster start` "
                  "uses `<cluster dir>/data` unless given `--data-dir`", default="~/.funke/data"),
    ClusterOption("funke.io.allowed-paths", "comma-separated directories or URI prefixes; when set, every source and "
                  "sink path of a job must lie under one of them", default="(anywhere)"),
    ClusterOption("funke.io.allowed-hosts", "comma-separated host names or addresses; when set, every socket and "
                  "Redis source and sink of a job must name one of them (the JobManager connects to Redis sources "
                  "to plan batches, the TaskManagers to every one)", default="(any)"),
    ClusterOption("funke.job.max-subtasks", "the most subtasks (all vertices' parallelisms together) one job may "
                  "have", "max_subtasks"),
    ClusterOption("funke.testing.mutant", "test only: a deliberate defect (`skip-initializing`: executions go "
                  "DEPLOYING → RUNNING), so that `funke conformance` can be seen to catch one", default="(none)"),
    ClusterOption("high-availability.type", "`none`; `filesystem`: leader election and job stores in files, for the "
                  "JobManagers of one machine; `zookeeper`: on a ZooKeeper quorum, for several hosts",
                  "high_availability", aliases=("high-availability",)),
    ClusterOption("high-availability.storageDir", "a local directory (or `file://`) for the HA files (with "
                  "`zookeeper`: the records too large for a node); needed with both", default="(none)"),
    ClusterOption("high-availability.cluster-id", "the cluster's subdirectory of the storage directory and its node "
                  "under the ZooKeeper root", "ha_cluster_id"),
    ClusterOption("high-availability.filesystem.lease-duration", "how long a silent leader keeps the lease before a "
                  "standby takes over", "ha_lease_s"),
    ClusterOption("high-availability.zookeeper.quorum", "`host:port[,host:port…]`; needed with `zookeeper`",
                  default="(none)"),
    ClusterOption("high-availability.zookeeper.path.root", "the root node of every cluster's nodes",
                  "ha_zookeeper_root"),
    ClusterOption("high-availability.zookeeper.client.session-timeout", "how long a leader that stopped answering "
                  "keeps its place before a standby takes over (the server bounds it between 2 and 20 of its "
                  "ticks; Flink's default is 60 s)", "ha_zookeeper_session_s"),
    ClusterOption("security.auth.token-file", "the clients' token (generated by the JobManager when missing)",
                  default="`<default cluster dir>/security/client.token`"),
    ClusterOption("security.auth.cluster-token-file", "the TaskManagers' token (generated by the JobManager when "
                  "missing)", default="`<default cluster dir>/security/cluster.token`"),
    ClusterOption("security.ssl.enabled", "TLS on every gRPC port; needs the three PEM files below", "ssl_enabled",
                  aliases=("security.ssl.internal.enabled",)),
    ClusterOption("security.ssl.certificate", "PEM: this process's certificate chain", default="(none)"),
    ClusterOption("security.ssl.key", "PEM: its private key (0600)", default="(none)"),
    ClusterOption("security.ssl.ca-certificate", "PEM: the authority peers' certificates chain to", default="(none)"),
    ClusterOption("security.ssl.mutual-authentication", "servers require callers' certificates too", "ssl_mutual"),
    ClusterOption("security.insecure", "serve off loopback without TLS (`--insecure`)", "insecure"),
    ClusterOption("rest.bind-port", "the REST API and dashboard: a port or a range (the first free one; `0`: any)",
                  "rest_ports", aliases=("rest.port",)),
    ClusterOption("rest.bind-address", "the address the REST API and dashboard bind", default="(the JobManager's "
                  "`--host`)", aliases=("rest.address",)),
    ClusterOption("metrics.reporter.prom.port", "each process's Prometheus endpoint: a port or a range (the first "
                  "free one)", "metrics_ports"),
    ClusterOption("metrics.reporter.prom.host", "the address the Prometheus endpoint binds; off loopback, like the "
                  "gRPC ports, TLS or `--insecure`", default="(the process's `--host`)"),
    ClusterOption("jobmanager.max-active-jobs", "jobs submitted and not yet ended; one more is RESOURCE_EXHAUSTED",
                  "max_active_jobs"),
    ClusterOption("jobmanager.watch.max-streams-per-client", "open WatchJob streams per client host",
                  "watch_streams_per_client"),
    ClusterOption("jobmanager.watch.max-streams", "open WatchJob streams in all", "watch_streams_total"),
    ClusterOption("jobstore.max-capacity", "ended jobs kept for `funke list/status/result`: at most this many (the "
                  "oldest go first, with their collected rows)", "jobstore_max_capacity"),
    ClusterOption("jobstore.expiration-time", "… at most this long", "jobstore_expiration_s"),
    ClusterOption("jobstore.cache-size", "… at most this many bytes of compressed details", "jobstore_cache_bytes"),
)


def accepted_cluster_keys() -> set[str]:
    """Every key `parse_configuration` accepts, read from its code: the keys of the tables it
    looks keys up in, the keys it compares with, and `prefix*` for the prefixes it accepts."""
    from funke.common import configuration

    tree = ast.parse(inspect.getsource(configuration.parse_configuration))
    keys: set[str] = set()
    tests = [n.test for n in ast.walk(tree) if isinstance(n, ast.If)]  # `if key ...` / `elif key ...`
    for node in (n for test in tests for n in ast.walk(test)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "key":
            for comparator in node.comparators:
                if isinstance(comparator, ast.Constant) and isinstance(comparator.value, str):
                    keys.add(comparator.value)
                elif isinstance(comparator, ast.Tuple):
                    keys.update(e.value for e in comparator.elts if isinstance(e, ast.Constant))
                elif isinstance(comparator, ast.Name):
                    keys.update(getattr(configuration, comparator.id))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "key"):
            keys.update(f"{a.value}*" for a in node.args if isinstance(a, ast.Constant))
    if not keys:
        raise DocsError("found no configuration keys in funke.common.configuration.parse_configuration")
    return keys


def _shown_default(option: ClusterOption, defaults: object) -> str:
    from funke.common.durations import format_duration

    if option.default:
        return option.default if option.default.startswith(("(", "`")) else _code(option.default)
    value = getattr(defaults, option.field)
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = format_duration(value)
    elif isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        text = f"{value[0]}-{value[1]}" if value[0] != value[1] else str(value[0])
    elif hasattr(value, "value"):  # an enum
        text = str(value.value)
    else:
        text = str(value)
    return _code(text) if text else "(none)"


def cluster_options() -> str:
    from funke.common.configuration import ClusterConfiguration

    documented = {k for o in CLUSTER_OPTIONS for k in (o.key, *o.aliases)}
    accepted = accepted_cluster_keys()
    if documented != accepted:
        raise DocsError("the cluster options described in funke.deploy.sitedocs.CLUSTER_OPTIONS are not the keys "
                        "funke.common.configuration accepts: "
                        f"not described: {sorted(accepted - documented)}; not accepted: {sorted(documented - accepted)}")
    names = {f.name for f in fields(ClusterConfiguration)}
    stale = [o.key for o in CLUSTER_OPTIONS if o.field and o.field not in names]
    if stale:
        raise DocsError(f"options whose ClusterConfiguration field is gone: {stale}")
    defaults = ClusterConfiguration()
    rows = []
    for o in CLUSTER_OPTIONS:
        key = _code(o.key.replace("*", "<type>.<option>")) + "".join(f" (or {_code(a)})" for a in o.aliases)
        rows.append((key, _shown_default(o, defaults), o.meaning))
    return _table(("key", "default", "meaning"), rows)


def restart_options() -> str:
    from funke.common.durations import format_duration
    from funke.common.graph.restart import DEFAULTS, TYPE_KEY

    rows = []
    for key, default in DEFAULTS.items():
        strategy = key.split(".")[1]
        if default is None:
            shown = "(no limit)"
        elif isinstance(default, float) and not key.endswith(("multiplier", "factor")):
            shown = _code(format_duration(default))
        else:
            shown = _code(str(default))
        rows.append((_code(strategy), _code(key), shown))
    return (f"`{TYPE_KEY}` names the strategy; `none` has no options.\n\n"
            + _table(("strategy", "key", "default"), rows))


@dataclass(frozen=True)
class JobOption:
    key: str
    default: str
    meaning: str


def _job_options() -> tuple[JobOption, ...]:
    from funke.common.api import translate
    from funke.common.durations import format_duration
    from funke.common.graph import jobgraph
    from funke.common.graph import streamingjob as sj
    from funke.common.streaming.eventtime import POLICIES, WATERMARK_POLICY

    query_defaults = {f.name: f.default for f in fields(sj.QuerySettings)}
    return (
        JobOption(sj.TRIGGER, sj.TRIGGERS[0], _one_of(sj.TRIGGERS) + ": micro-batches at an interval, everything available now in batches within the per-trigger "
                  "limits, or everything available now in one batch (`set_trigger`)"),
        JobOption(sj.INTERVAL, format_duration(sj.DEFAULT_INTERVAL_MS / 1000),
                  "the processing-time trigger's interval (Flink duration syntax)"),
        JobOption(sj.CHECKPOINT, f"<data dir>/{sj.CHECKPOINTS}/<job name>",
                  "where the query's offset and commit logs, state and receiver blocks live (a local path or "
                  "`file://` URI; `set_checkpoint_location`)"),
        JobOption(sj.CONCURRENT_JOBS, str(query_defaults["concurrent_jobs"]),
                  "batches run at once (Spark's `spark.streaming.concurrentJobs`); a query with keyed state "
                  "runs one at a time"),
        JobOption(sj.RETAIN, str(sj.DEFAULT_RETAIN), "log entries (and state versions) kept (Spark's "
                  "`minBatchesToRetain`)"),
        JobOption(sj.BACKPRESSURE, str(query_defaults["backpressure"]).lower(),
                  "receivers take records at the rate batches keep up with (Spark's "
                  "`spark.streaming.backpressure.enabled`)"),
        JobOption(sj.OUTPUT_MODE, sj.ALL_OUTPUT_MODES[0], _one_of(sj.ALL_OUTPUT_MODES) + ": what a batch emits (`set_output_mode`)"),
        JobOption(WATERMARK_POLICY, POLICIES[0], _one_of(POLICIES) + ": the query's watermark follows the slowest or the fastest watermarked input "
                  "(`set_watermark_policy`)"),
        JobOption(translate.BATCH_SHUFFLE_MODE, "`BLOCKING` for BATCH jobs, `PIPELINED` for STREAMING jobs",
                  _one_of(jobgraph.SHUFFLE_MODES) + ": the result partition type of every "
                  "exchange (honoured for STREAMING jobs too)"),
        JobOption(translate.OPERATOR_CHAINING, "true", "`false`: every operator becomes its own JobVertex "
                  "(`disable_operator_chaining`)"),
        JobOption(translate.COMBINERS, "true", "`false`: no partial aggregate at the end of a keyed aggregate's "
                  "producer chain"),
        JobOption(jobgraph.EXCHANGE_IN_MEMORY_MAX_BYTES, str(jobgraph.DEFAULT_EXCHANGE_IN_MEMORY_MAX_BYTES),
                  "a bounded job's producer whose output Spark estimates at no more bytes collects it as Arrow and "
                  "writes one Parquet file per consumer itself, as a micro-batch's does; above it (or `0`), Spark's "
                  "distributed writer"),
    )


def job_options() -> str:
    from funke.common.graph.streamingjob import OPTIONS

    options = _job_options()
    missing = sorted(set(OPTIONS) - {o.key for o in options})
    if missing:
        raise DocsError(f"streaming options not described in funke.deploy.sitedocs: {missing}")
    return _table(("key", "default", "meaning"), [(_code(o.key), o.default if "`" in o.default else _code(o.default),
                                                   o.meaning) for o in options])


def _one_of(values: object) -> str:
    shown = [_code(str(v)) for v in values]  # type: ignore[attr-defined]
    return ", ".join(shown[:-1]) + " or " + shown[-1]


# ---------------------------------------------------------------------------------------------
# REST API
# ---------------------------------------------------------------------------------------------

REST_ENDPOINTS: dict[tuple[str, str], str] = {
    ("GET", "/"): "the dashboard; `/?token=<client token>` trades the token for the login cookie",
    ("GET", "/web/{name}"): "the dashboard's scripts and style sheet (`app.js` and the ES modules it imports, "
                           "`style.css`; no data)",
    ("POST", "/login"): '`{"token": "..."}` → 204 with the login cookie (HttpOnly, SameSite=Strict)',
    ("GET", "/config"): "refresh interval, time zone, version and features (no web submission), for the dashboard",
    ("GET", "/overview"): "TaskManagers, slots total and available, jobs by state, the data directory, the leader "
                          "(with high availability), the JobManager's metrics URL",
    ("GET", "/taskmanagers"): "every TaskManager: address, slots, time since its last heartbeat, resources (its "
                              "metrics URL in `resources.metrics`)",
    ("GET", "/taskmanagers/{tm}"): "one TaskManager, with its slots",
    ("GET", "/jobs"): "job ids and states",
    ("GET", "/jobs/overview"): "every job: name, state, start, end, duration, tasks per state",
    ("GET", "/jobs/{jid}"): "state, timestamps per state, vertices with task counts, records/bytes read and "
                            "written and each operator's records in and out, plan",
    ("GET", "/jobs/{jid}/plan"): "the job graph: vertices and edges with ship strategy and distribution pattern",
    ("GET", "/jobs/{jid}/exceptions"): "the exception history, root cause first",
    ("GET", "/jobs/{jid}/subtasktimes"): "every attempt's states as time segments",
    ("GET", "/jobs/{jid}/vertices/{vid}"): "a vertex's subtasks, each its current attempt: state, TaskManager, slot, "
                                           "duration, records and bytes, each operator's records, state history, "
                                           "failure",
    ("GET", "/jobs/{jid}/vertices/{vid}/subtasktimes"): "a vertex's subtasks' states as time segments",
    ("GET", "/jobs/{jid}/vertices/{vid}/metrics"): "Flink's metric identifiers of a vertex (`<subtask>.numRecordsIn`, "
                                                   "`<subtask>.<operator>.numRecordsOut`, ...); with "
                                                   "`?get=id,...` those with their values",
    ("GET", "/jobs/{jid}/vertices/{vid}/subtasks/{index}/attempts/{attempt}"): "one attempt of a subtask, as above",
    ("GET", "/jobs/{jid}/batches"): "a streaming query's recent batches: id, time, input rows, rates, duration, "
                                    "keyed state (keys, bytes on disk), watermark and late rows",
    ("GET", "/jobs/{jid}/progress"): "a streaming query's id and its last 100 progress records (Structured "
                                     "Streaming's keys)",
    ("PATCH", "/jobs/{jid}"): "`?mode=cancel` → 202: cancel the job",
    ("POST", "/jobs/{jid}/stop"): '`{"drain": false}` → 202: stop a streaming query gracefully (`funke stop`)',
    ("POST", "/jobs/{jid}/rescale"): '`{"parallelism": 4, "vertices": [...]}` → 202: rescale a running streaming '
                                     "query live (`funke rescale`)",
}


def rest_endpoints() -> str:
    from funke.jobmanager.rest import _PUBLIC, RestServer

    app = RestServer(lambda: None, "-").app  # builds the routes; serves nothing
    served = [(r.method, r.resource.canonical) for r in app.router.routes()]
    missing = [f"{m} {p}" for m, p in served if (m, p) not in REST_ENDPOINTS]
    stale = [f"{m} {p}" for (m, p) in REST_ENDPOINTS if (m, p) not in served]
    if missing or stale:
        raise DocsError(f"REST routes not described in funke.deploy.sitedocs.REST_ENDPOINTS: {missing}; "
                        f"described but not served: {stale}")
    def public(path: str) -> bool:  # the route serves a path that needs no token
        pattern = re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)) + "$")
        return any(pattern.match(p) for p in _PUBLIC)

    rows = [(m, _code(p), "no" if public(p) else "client token", REST_ENDPOINTS[(m, p)]) for m, p in served]
    return _table(("method", "path", "needs", "answers"), rows)


# ---------------------------------------------------------------------------------------------
# gRPC API
# ---------------------------------------------------------------------------------------------

PROTO_FILES = ("jobmanager.proto", "cluster.proto", "jobgraph.proto", "job.proto", "ha.proto")
# Which process serves each service of funke.v1
SERVED_BY = {"JobManager": "JobManager", "ResourceManager": "JobManager", "JobMaster": "JobManager",
             "TaskExecutor": "TaskManager"}


@dataclass
class ProtoField:
    name: str
    type: str
    comment: str


@dataclass
class ProtoMessage:
    name: str
    comment: str
    fields: list[ProtoField]


@dataclass
class ProtoFile:
    header: str
    rpc_comments: dict[str, str]  # "Service.Method" -> the comment above it
    messages: dict[str, ProtoMessage]


_FIELD = re.compile(r"^(?P<type>(?:optional |repeated )?(?:map<[^>]+>|[\w.]+))\s+(?P<name>\w+)\s*=\s*\d+\s*;\s*"
                    r"(?://\s?(?P<comment>.*))?$")


def parse_proto(text: str) -> ProtoFile:
    """The comments of a .proto file, for what the descriptors do not keep: the file's header,
    the comment above each rpc, and each message's fields with their comments."""
    header: list[str] = []
    pending: list[str] = []
    rpc_comments: dict[str, str] = {}
    messages: dict[str, ProtoMessage] = {}
    service = ""
    stack: list[ProtoMessage | None] = []  # open blocks: a message, or None (oneof, service, enum)
    started = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("//"):
            comment = line[2:].strip()
            (pending if started else header).append(comment)
            continue
        if not line:
            if not started and header:
                started = True
            pending = []
            continue
        started = True
        if line.startswith("service "):
            service = line.split()[1]
            stack.append(None)
        elif line.startswith("rpc "):
            rpc_comments[f"{service}.{line.split()[1].split('(')[0]}"] = " ".join(pending)
        elif line.startswith("message "):
            message = ProtoMessage(line.split()[1], " ".join(pending), [])
            messages[message.name] = message
            if not line.endswith("}"):  # `message Empty {}` opens no block
                stack.append(message)
        elif line.startswith(("oneof ", "enum ")) and not line.endswith("}"):
            stack.append(None)
        elif line.startswith("}"):
            if stack:
                stack.pop()
        elif stack:
            match = _FIELD.match(line)
            owner = next((m for m in reversed(stack) if m is not None), None)
            if match is not None and owner is not None:  # a oneof's fields are its message's
                comment = " ".join([*pending, match.group("comment") or ""]).strip()
                owner.fields.append(ProtoField(match.group("name"), match.group("type"), comment))
        pending = []
    return ProtoFile(" ".join(header), rpc_comments, messages)


def _proto_text(name: str) -> str:
    return resources.files("funke.v1").joinpath(name).read_text()


def grpc_services() -> str:
    from funke.common.security import SERVICE_REALMS
    from funke.v1 import cluster_pb2, jobmanager_pb2

    out: list[str] = []
    services = [s for module in (jobmanager_pb2, cluster_pb2) for s in module.DESCRIPTOR.services_by_name.values()]
    parsed = {name: parse_proto(_proto_text(name)) for name in ("jobmanager.proto", "cluster.proto")}
    unserved = [s.name for s in services if s.name not in SERVED_BY]
    if unserved:
        raise DocsError(f"services without a process in funke.deploy.sitedocs.SERVED_BY: {unserved}")
    realm_words = {"open": "none", "client": "client token", "cluster": "cluster token",
                   "registration": "the JobManager's registration token"}
    rows = [(_code(s.full_name), SERVED_BY[s.name], realm_words[SERVICE_REALMS[s.full_name].value],
             str(len(s.methods))) for s in services]
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection

    health = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    for name, where in ((health, "every process"), (reflection.SERVICE_NAME, "JobManager")):
        rows.append((_code(name), where, realm_words[SERVICE_REALMS[name].value], ""))
    out.append(_table(("service", "served by", "token", "methods"), rows))
    for s in services:
        proto = parsed[s.file.name.rsplit("/", 1)[-1]]
        out.append(f"\n### {s.name}\n")
        rows = []
        for m in s.methods:
            if f"{s.name}.{m.name}" not in proto.rpc_comments:
                raise DocsError(f"{s.file.name}: rpc {s.name}.{m.name} not found in the .proto text")
            request = ("stream " if m.client_streaming else "") + m.input_type.name
            response = ("stream " if m.server_streaming else "") + m.output_type.name
            rows.append((_code(m.name), _code(request), _code(response), proto.rpc_comments[f"{s.name}.{m.name}"]))
        out.append(_table(("method", "request", "response", "what it does"), rows))
    out.append("\n### Messages of the client API\n")
    out.append("The request and response messages defined in `funke/v1/jobmanager.proto` (the job graph, job "
               "details and summaries are in `jobgraph.proto` and `job.proto`).\n")
    jm = parsed["jobmanager.proto"]
    for name, message in jm.messages.items():
        descriptor = jobmanager_pb2.DESCRIPTOR.message_types_by_name.get(name)
        if descriptor is None:
            raise DocsError(f"jobmanager.proto: message {name} is not in the generated descriptors")
        wanted = [f.name for f in descriptor.fields]
        if wanted != [f.name for f in message.fields]:
            raise DocsError(f"jobmanager.proto: {name}'s fields read from the text {[f.name for f in message.fields]} "
                            f"are not the descriptor's {wanted}")
        out.append(f"\n**{name}**" + (f": {message.comment}" if message.comment else "") + "\n")
        if message.fields:
            out.append(_table(("field", "type", ""), [(_code(f.name), _code(f.type), f.comment) for f in message.fields]))
        else:
            out.append("(no fields)")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


class _NoJobs:
    """What the JobManager's collector reads, for a cluster with nothing in it: it then yields
    every family it has, without samples."""

    class rm:  # noqa: N801
        @staticmethod
        def overview() -> object:
            return type("Overview", (), {"task_managers": (), "slots_total": 0, "slots_free": 0})()

    jobs: dict = {}


def metrics() -> str:
    from funke.jobmanager.metrics import JobManagerCollector
    from funke.taskmanager.metrics import LABELS, OPERATOR_LABELS, TaskMetrics

    rows = []
    for family in JobManagerCollector(lambda: _NoJobs()).collect():  # type: ignore[arg-type, return-value]
        labels = "`job_id`, `job_name`" if "_job_" in family.name else ""
        rows.append((_code(family.name), "JobManager", labels, family.documentation))
    for family in TaskMetrics("-", lambda: (0, 0, 0)).collect():
        labels = ", ".join(_code(label) for label in (OPERATOR_LABELS if "_job_task_operator_" in family.name else
                                                      LABELS)) if "_job_task_" in family.name else ""
        rows.append((_code(family.name), "TaskManager", labels, family.documentation))
    return _table(("metric", "process", "labels", "meaning"), rows)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _help_environment() -> Iterator[None]:
    """Help text as on a 100-column terminal, without defaults read from this environment."""
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "FUNKE_JOBMANAGER")}
    os.environ["COLUMNS"] = "100"
    os.environ.pop("FUNKE_JOBMANAGER", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _help_of(parse: Callable[[list[str]], object]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        parse(["--help"])
    return buffer.getvalue()


def exit_codes() -> str:
    """The exit codes of `funke` commands, and the JobManager's refusals that exit 2."""
    from funke.deploy.cli.exitcodes import CODES, REFUSALS

    codes = _table(("code", "meaning"), [(str(code), meaning) for code, meaning in CODES])
    refusals = _table(("status code", "the request is refused for"),
                      [(_code(code.name), meaning) for code, meaning in REFUSALS.items()])
    return (f"{codes}\n\nA refusal is a gRPC status code with which the JobManager turns a request down "
            f"before doing anything; the message says why:\n\n{refusals}\n\nAny other status code "
            "(`DATA_LOSS`, `INTERNAL`, `UNKNOWN`, ...) means the JobManager tried and failed: exit 1. The "
            "`cluster` commands refuse in the same way (exit 2) what does not fit the other flags or the "
            "cluster directory's state: `cluster start` while a cluster runs there, `cluster kill` or "
            "`cluster add-taskmanager` of a name that is not running or is, `cluster add-jobmanager` on a "
            "cluster without high availability; a process that does not start is exit 1.")


def cli() -> str:
    from funke.deploy.cli.parser import build_parser
    from funke.jobmanager.main import parse_args as jobmanager_args
    from funke.taskmanager.main import build_parser as taskmanager_parser

    out: list[str] = []

    def block(title: str, text: str) -> None:
        out.append(f"\n### `{title}`\n\n```text\n{text.rstrip()}\n```")

    with _help_environment():
        parser = build_parser()
        block("funke", parser.format_help())
        for name, sub in _subcommands(parser):
            if name == "jobmanager":
                block("funke jobmanager", _help_of(jobmanager_args))
            elif name == "taskmanager":
                block("funke taskmanager", _help_of(lambda argv: taskmanager_parser().parse_args(argv)))
            elif name == "cluster":
                block("funke cluster", sub.format_help())
                for action, cluster_sub in _subcommands(sub):
                    block(f"funke cluster {action}", cluster_sub.format_help())
            else:
                block(f"funke {name}", sub.format_help())
    return "\n".join(out).lstrip("\n")


def _call(name: str, function: Callable[..., object]) -> str:
    """`name(a, b=1, *, c=None)`: the parameters without `self` and without annotations."""
    shown, keyword_only = [], False
    for p in list(inspect.signature(function).parameters.values())[1:]:
        if p.kind is p.VAR_POSITIONAL:
            shown.append(f"*{p.name}")
            keyword_only = True
            continue
        if p.kind is p.VAR_KEYWORD:
            shown.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            shown.append("*")
            keyword_only = True
        shown.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return f"{name}({', '.join(shown)})"


def python_api() -> str:
    """Every public method of the DSL's classes, with the first paragraph of its docstring."""
    from funke.common.api import dsl

    classes = (
        ("ExecutionEnvironment", dsl.ExecutionEnvironment, "the job: its configuration, its sources, `build()`"),
        ("env.read_stream", dsl.StreamReader, "stream sources (a streaming query)"),
        ("Every operator", dsl._OperatorHandle, "per-operator settings, on every stream and sink"),
        ("DataStream", dsl.DataStream, "transforms, exchanges and sinks"),
        ("KeyedStream", dsl.KeyedStream, "after `key_by(...)`"),
        ("WindowedStream", dsl.WindowedStream, "after `window(...)` or `session_window(...)`"),
        ("WindowedDataStream", dsl.WindowedDataStream, "a window's result"),
    )
    out = []
    for title, cls, about in classes:
        rows = []
        for name, member in cls.__dict__.items():
            if name.startswith("_") or not callable(member):
                continue
            doc = (inspect.getdoc(member) or "").split("\n\n")[0].replace("\n", " ")
            rows.append((_code(_call(name, member)), doc))
        if not rows:
            raise DocsError(f"{cls.__name__} has no public methods")
        out.append(f"### {title}\n\n{about[0].upper()}{about[1:]}.\n\n" + _table(("method", "what it does"), rows))
    return "\n\n".join(out)


def exchanges() -> str:
    """How each DSL exchange is wired as a JobEdge (`funke.common.api.translate`)."""
    from funke.common.api import translate

    calls = {"FORWARD": "forward()", "HASH": "key_by(...)", "REBALANCE": "rebalance()", "RESCALE": "rescale()",
             "BROADCAST": "broadcast()"}
    wiring = translate._EXCHANGE_WIRING
    unknown = [k.name for k in wiring if k.name not in calls]
    if unknown:
        raise DocsError(f"exchanges without a DSL call in funke.deploy.sitedocs.exchanges: {unknown}")
    rows = [(_code(calls[kind.name]), _code(pattern.value), _code(partitioner.value))
            for kind, (pattern, partitioner) in wiring.items()]
    return _table(("call", "distribution pattern", "partitioner"), rows)


def operator_catalogue() -> str:
    """Every operator kind a JobVertex chain may hold (`funke.common.graph.operators.CATALOGUE`)."""
    from funke.common.graph.operators import CATALOGUE, VARIADIC

    rows = []
    for kind, spec in CATALOGUE.items():
        inputs = "any (1 or more)" if spec.arity == VARIADIC else str(spec.arity)
        keys = ", ".join(_code(k) + (" (required)" if k in spec.required else "") for k in spec.keys) or "–"
        rows.append((_code(kind), spec.role.value, inputs, spec.function.value, keys))
    return _table(("kind", "role", "inputs", "function", "configuration keys"), rows)


def conformance_scenarios() -> str:
    from funke.deploy.conformance import SCENARIOS

    rows = [(_code(s.name), s.about + (" (with `--destructive`)" if s.destructive else ""), _code(s.expected))
            for s in SCENARIOS]
    return _table(("scenario", "what it checks", "the job's path"), rows)


PARTS: dict[str, Callable[[], str]] = {
    "conformance-scenarios": conformance_scenarios,
    "python-api": python_api,
    "exchanges": exchanges,
    "operator-catalogue": operator_catalogue,
    "cluster-options": cluster_options,
    "restart-options": restart_options,
    "job-options": job_options,
    "rest-endpoints": rest_endpoints,
    "grpc-services": grpc_services,
    "metrics": metrics,
    "cli": cli,
    "exit-codes": exit_codes,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    try:
        print(render(argv[0]))
    except DocsError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
