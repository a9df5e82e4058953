"""Hypothesis against a live JobManager: mutated JobGraphs, raw bytes and hostile ids on every
RPC of the three services it serves, thousands of cases within CI time.

The cluster (a JobManager and two TaskManagers without Spark) lives in a sandbox whose every
level around the data directory holds canary files. After the run:

- no answer was UNKNOWN, INTERNAL, DATA_LOSS or RESOURCE_EXHAUSTED (a message too long to
  carry), and none timed out (the JobManager never hung);
- every call that did not present its service's token (none, a wrong one, the other service's:
  the clients' token on the TaskManagers' services and back) was UNAUTHENTICATED;
- no file outside the data directory was created, changed or deleted (the canary tree; the
  cluster confines jobs with funke.io.allowed-paths, so a sink aimed at a canary is refused);
- the JobManager logged no ERROR or CRITICAL (what it swallows to keep serving: an exception
  while applying a task report, an action that raised);
- the JobManager still serves and still runs a job to FINISHED;
- once the surviving jobs are cancelled, every job is terminal within a deadline and every slot
  is free again;
- the JobManager's resident memory grew by less than a bound.

The status-code distribution, case count and RSS figures are printed and written to
`api-fuzz.json` in `artifacts_dir("fuzz")` ($FUNKE_TEST_ARTIFACTS/fuzz, else in the temporary
directory). The fixed regressions behind each kind of case are in
`test_hostile_input.py`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import random
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from funke.runtime import security
from funke.deploy.client import job_status_name
from funke.runtime.security import read_token
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.jobgraph import IntermediateDataSet, JobEdge, JobGraph, JobType, JobVertex, OperatorSpec
from funke.common.wire.codec import job_graph_to_proto
from funke.v1 import cluster_pb2, jobgraph_pb2, jobmanager_pb2
from tests.integration.conftest import artifacts_dir, client_of, funke

pytestmark = pytest.mark.cluster

CASES = int(os.environ.get("FUNKE_FUZZ_CASES", "10000"))
RSS_GROWTH_LIMIT_MIB = 300
# RESOURCE_EXHAUSTED too: no request here comes near the message limit, so it can only be an
# answer whose message echoes too much to fit in gRPC's trailing metadata.
FORBIDDEN_CODES = {"UNKNOWN", "INTERNAL", "DATA_LOSS", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED"}
SUMMARY = artifacts_dir("fuzz") / "api-fuzz.json"

SERVICES = {
    "funke.v1.JobManager": ["SubmitJob", "ListJobs", "GetJob", "CancelJob", "WatchJob", "GetClusterOverview",
                            "GetJobResult", "GetKeyedState", "RescaleJob"],
    "funke.v1.ResourceManager": ["RegisterTaskManager", "Heartbeat"],
    "funke.v1.JobMaster": ["UpdateTaskExecutionState"],
}
REALMS = {"funke.v1.JobManager": "client", "funke.v1.ResourceManager": "cluster", "funke.v1.JobMaster": "cluster"}
STREAMING_RESPONSE = {"WatchJob", "Heartbeat"}
STREAMING_REQUEST = {"Heartbeat"}


# ------------------------------------------------------------------------------ the sandbox


class Sandbox:
    """sandbox/{canary0, a/{canary1, b/{canary2, data/, in/, out/}}, cluster/}: the data directory
    sits three levels deep, with canaries beside it at every level above."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "a" / "b" / "data"
        self.inputs = root / "a" / "b" / "in"
        self.out = root / "a" / "b" / "out"
        self.cluster = root / "cluster"
        for d in (self.data, self.inputs, self.out, self.cluster):
            d.mkdir(parents=True)
        for i, level in enumerate([root, root / "a", root / "a" / "b"]):
            (level / f"canary{i}.txt").write_text(f"canary {i}\n")
            (level / f"canary{i}").mkdir()
            (level / f"canary{i}" / "nested.txt").write_text("nested\n")
        (self.out / "existing").mkdir()
        (self.out / "existing" / "part-0.csv").write_text("a,b\n")
        (self.inputs / "text.txt").write_text("to be or not to be\n")

    def snapshot(self) -> dict[str, str]:
        """Everything outside the data directory (and the cluster's own logs): path -> digest."""
        seen: dict[str, str] = {}
        for path in sorted(self.root.rglob("*")):
            if path == self.data or self.data in path.parents or path == self.cluster or self.cluster in path.parents:
                continue
            rel = str(path.relative_to(self.root))
            if path.is_symlink():
                seen[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        return seen


# ------------------------------------------------------------------------------ seed graphs


def seed_graphs(box: Sandbox) -> list[bytes]:
    """Valid graphs to mutate: what users submit (word counts, a join, sinks into the allowed
    directory) and no-op pipelines that really run on Spark-less TaskManagers."""
    graphs: list[JobGraph] = []
    env = ExecutionEnvironment("word count", job_type="batch", parallelism=2)
    (env.read_text(str(box.inputs / "*.txt")).flat_map(lambda line: line.split(), schema="word string")
        .key_by("word").count().collect())
    graphs.append(env.build())
    env = ExecutionEnvironment("word count to csv", job_type="batch", parallelism=2)
    env.set_restart_strategy("fixed-delay", attempts=2, delay="10 ms")
    (env.read_text(str(box.inputs / "*.txt")).flat_map(lambda line: line.split(), schema="word string")
        .key_by("word").count().write_csv(str(box.out / "counts"), mode="overwrite"))
    graphs.append(env.build())
    env = ExecutionEnvironment("join", job_type="streaming", parallelism=2)
    left = env.from_collection([(1, "a"), (2, "b")], "k int, v string")
    right = env.from_range(0, 10).select("id as k", "id * 2 as w")
    left.join(right, on="k").write_parquet(str(box.out / "joined"), mode="overwrite")
    graphs.append(env.build())
    for job_type, p in ((JobType.BATCH, 3), (JobType.STREAMING, 2)):
        graphs.append(JobGraph(
            f"noop {job_type.value}",
            (JobVertex("src", "Source", p, (OperatorSpec("source.noop"),)),
             JobVertex("mid", "Map", p, (OperatorSpec("noop"),)),
             JobVertex("sink", "Sink", p, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
            (IntermediateDataSet("src.out0", "src"), IntermediateDataSet("mid.out0", "mid")),
            (JobEdge("src->mid", "src.out0", "mid"), JobEdge("mid->sink", "mid.out0", "sink")),
            job_type=job_type))
    return [job_graph_to_proto(g).SerializeToString() for g in graphs]


# ------------------------------------------------------------------------------ hostile values


def hostile_strings(box: Sandbox) -> list[str]:
    return [
        "", " ", ".", "..", "../..", "../../..", "/", "a/b", "a\\b", "\x00", "x\x00y", "\n", "\t", "line\nbreak",
        "x" * 70, "y" * 5000, "z" * 200_000, "é", "\U0001f600", "\u202e", "%s%n", "${jndi:ldap://x}", "-rf",
        str(box.data), str(box.data.parent), str(box.root), str(box.root / "canary0"), str(box.root / "canary0.txt"),
        str(box.out), str(box.out / "existing"), str(box.out / "x" / ".." / ".." / ".."), "out/relative",
        f"file://{box.data}", "hdfs://", "file:///", "s3a://bucket/key",
        "src", "sink", "mid", "src.out0", "default", "source.noop", "noop", "sink.noop", "sink.csv", "source.text",
        "source.range", "map", "count", "join", "error", "overwrite", "append", "region", "full", "fixed-delay",
        "failure-rate", "exponential-delay", "none", "attempts", "delay", "1 s", "1e999",
    ]


def hostile_json(box: Sandbox) -> list[str]:
    paths = [str(box.data), str(box.root / "canary0"), str(box.out / "existing"), "", "/", "..", "rel",
             str(box.out / "new"), str(box.data / "jobs"), str(box.data.parent)]
    docs = ['{"end": 1e999}', '{"end": -1e999}', '{"end": NaN}', '{"end": Infinity}', '{"end": 1e308}',
            '{"end": 99999999999999999999999}', '{"end": "10"}', '{"end": 10, "step": 0}', "[]", "null", "{",
            '{"rows": ' + "[" * 5000 + "]" * 5000 + "}", '{"schema": ""}', '{"schema": "x int", "a": 1}',
            '{"keys": []}', '{"keys": [""]}', '{"on": ["k"], "how": "cross"}', '{"exprs": []}',
            '{"options": {"header": {"deep": 1}}}', '{"mode": "append", "path": "/tmp/x"}', '{"\\u0000": 1}']
    for path in paths:
        docs.append(json.dumps({"path": path, "mode": "overwrite"}))
        docs.append(json.dumps({"path": path}))
    return docs


INTS = {
    FD.TYPE_INT32: [-(2**31), -1, 0, 1, 2, 3, 7, 64, 1000, 40000, 2**31 - 1],
    FD.TYPE_INT64: [-(2**63), -1, 0, 1, 5, 2**40, 2**63 - 1],
    FD.TYPE_UINT64: [0, 1, 2**64 - 1],
    FD.TYPE_ENUM: [-1, 0, 1, 2, 3, 4, 5, 99, 2**31 - 1],
}
DOUBLES = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-9, 0.5, 3.0, 1e300]


class Mutator:
    """Random structural mutations of a protobuf message, through reflection: every field of
    every nested message can be reached, whatever the schema grows into."""

    def __init__(self, box: Sandbox, rng: random.Random):
        self.strings = hostile_strings(box)
        self.json = hostile_json(box)
        self.rng = rng

    def slots(self, msg, out: list) -> list:
        for field in msg.DESCRIPTOR.fields:
            repeated = field.is_repeated
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if is_map:
                out.append(("map", msg, field))
            elif field.message_type is not None:
                if repeated:
                    out.append(("repeated", msg, field))
                    for sub in getattr(msg, field.name):
                        self.slots(sub, out)
                else:
                    out.append(("message", msg, field))
                    if msg.HasField(field.name):
                        self.slots(getattr(msg, field.name), out)
            else:
                out.append(("repeated_scalar" if repeated else "scalar", msg, field))
        return out

    def value(self, field):
        r = self.rng
        if field.type == FD.TYPE_STRING:
            if field.name == "config_json" and r.random() < 0.7:
                return r.choice(self.json)
            if r.random() < 0.15:
                return "".join(r.choice("ab./\\\x00\n é-_") for _ in range(r.randint(0, 12)))
            return r.choice(self.strings)
        if field.type == FD.TYPE_BYTES:
            return r.choice([b"", b"\x80\x05junk", os.urandom(r.randint(1, 64)), b"x" * 100_000])
        if field.type == FD.TYPE_DOUBLE:
            return r.choice(DOUBLES)
        if field.type == FD.TYPE_BOOL:
            return r.random() < 0.5
        return r.choice(INTS[field.type])

    def mutate(self, msg) -> str:
        r = self.rng
        kind, owner, field = r.choice(self.slots(msg, []))
        name = field.name
        if kind == "scalar":
            setattr(owner, name, self.value(field))
        elif kind == "repeated_scalar":
            items = getattr(owner, name)
            if items and r.random() < 0.3:
                del items[r.randrange(len(items))]
            else:
                items.append(self.value(field))
        elif kind == "map":
            entries = getattr(owner, name)
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is None:
                entries[self.value(field.message_type.fields_by_name["key"])] = self.value(value_field)
            else:
                entries.clear()
        elif kind == "repeated":
            items = getattr(owner, name)
            choice = r.random()
            if items and choice < 0.35:
                del items[r.randrange(len(items))]
            elif items and choice < 0.7:
                items.add().CopyFrom(items[r.randrange(len(items))])
            elif choice < 0.85:
                items.add()
            else:
                del items[:]
        else:
            owner.ClearField(name)
        return f"{kind}:{field.full_name}"


# ------------------------------------------------------------------------------ the cluster


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory):
    box = Sandbox(tmp_path_factory.mktemp("fuzz-sandbox"))
    funke("cluster", "start", "--taskmanagers", "2", "--slots", "2", "--no-spark", "--dir", str(box.cluster),
          "--data-dir", str(box.data),
          "-D", "slot.request.timeout=2 s", "-D", "heartbeat.timeout=2 s", "-D", "task.cancellation.timeout=5 s",
          "-D", "jobstore.max-capacity=100", "-D", "funke.job.max-subtasks=5000",
          "-D", f"funke.io.allowed-paths={box.inputs},{box.out}", timeout=120)
    address = (box.cluster / "jobmanager.address").read_text().strip()
    pid = int((box.cluster / "pids" / "jobmanager.pid").read_text())
    try:
        yield box, address, pid
    finally:
        funke("cluster", "stop", "--dir", str(box.cluster), timeout=60)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Caller:
    """Raw calls to the JobManager: requests as bytes, answers counted by status code. Each
    service is called with its own token (the client's, or the TaskManagers'); `unauthenticated`
    calls present none, a wrong one, or the other service's, and count apart."""

    def __init__(self, cluster_dir: Path, address: str):
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self.tokens = {realm: read_token(cluster_dir / "security" / f"{realm}.token") for realm in ("client", "cluster")}
        self.channels = {realm: security.channel(address, token, None, options) for realm, token in self.tokens.items()}
        self.bare = security.channel(address, None, None, options)
        self.unauthenticated: collections.Counter[str] = collections.Counter()
        self.codes: collections.Counter[str] = collections.Counter()
        self.by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.forbidden: list[str] = []
        self.accepted: list[str] = []
        self.samples: dict[str, list[str]] = collections.defaultdict(list)  # a few answers per code

    def close(self) -> None:
        for channel in (*self.channels.values(), self.bare):
            channel.close()

    def call_without(self, service: str, method: str, body: bytes | list[bytes], token: str | None) -> None:
        """A call presenting `token` (None: none) where it is not the service's: must be refused."""
        metadata = [("authorization", f"Bearer {token}")] if token is not None else None
        path = f"/{service}/{method}"
        try:
            if method in STREAMING_REQUEST:
                list(self.bare.stream_stream(path)(iter(body), timeout=20, metadata=metadata))
            elif method in STREAMING_RESPONSE:
                list(self.bare.unary_stream(path)(body, timeout=20, metadata=metadata))
            else:
                self.bare.unary_unary(path)(body, timeout=20, metadata=metadata)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        self.unauthenticated[code] += 1
        if code != "UNAUTHENTICATED":
            self.forbidden.append(f"unauthenticated {method} ({'no token' if token is None else 'wrong token'}): {code}")

    def call(self, kind: str, service: str, method: str, body: bytes | list[bytes]) -> bytes | None:
        path = f"/{service}/{method}"
        result: bytes | None = None
        channel = self.channels[REALMS[service]]
        try:
            if method in STREAMING_REQUEST:
                stream = channel.stream_stream(path)(iter(body), timeout=20)
                for _ in stream:
                    pass
            elif method in STREAMING_RESPONSE:
                stream = channel.unary_stream(path)(body, timeout=20)
                for _ in stream:  # the snapshot is enough: a live job's stream would go on
                    stream.cancel()
                    break
            else:
                result = channel.unary_unary(path)(body, timeout=20)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
            if code == "CANCELLED" and method in STREAMING_RESPONSE:
                code = "OK"  # our own cancel after the first event
            if code in FORBIDDEN_CODES:
                self.forbidden.append(f"{kind} {method}: {code}: {(exc.details() or '')[:300]}")
            if len(self.samples[code]) < 3:
                self.samples[code].append(f"{method}: {(exc.details() or '')[:200]}")
        self.codes[code] += 1
        self.by_kind[kind][code] += 1
        return result


# ------------------------------------------------------------------------------ the cases


def raw_bodies(seeds: list[bytes], rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.3:
        return os.urandom(rng.randint(0, 256))
    seed = bytearray(rng.choice(seeds))
    if choice < 0.6:
        return bytes(seed[: rng.randrange(len(seed))])  # truncated
    for _ in range(rng.randint(1, 8)):  # bit flips
        i = rng.randrange(len(seed))
        seed[i] ^= 1 << rng.randrange(8)
    return bytes(seed)


def test_no_request_hurts_the_jobmanager(fuzz_cluster):
    box, address, pid = fuzz_cluster
    seeds = seed_graphs(box)
    caller = Caller(box.cluster, address)
    client = client_of(box.cluster, address)
    before_tree = box.snapshot()

    # Warm up (imports, first jobs, caches) before the memory baseline.
    for seed in seeds:
        caller.call("warm-up", "funke.v1.JobManager", "SubmitJob",
                    jobmanager_pb2.SubmitJobRequest(job_graph=jobgraph_pb2.JobGraph.FromString(seed)).SerializeToString())
    time.sleep(1.0)
    rss_before = rss_mib(pid)
    started = time.time()
    counter = {"cases": 0}

    @settings(max_examples=CASES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(["graph"] * 6 + ["bulk"] + ["raw"] * 2 + ["ids"] * 2 + ["taskmanager"]
                                + ["unauthenticated"]),
           seed=st.integers(0, 2**32 - 1))
    def case(kind: str, seed: int) -> None:
        counter["cases"] += 1
        rng = random.Random(seed)
        mutator = Mutator(box, rng)
        if kind == "graph":
            graph = jobgraph_pb2.JobGraph.FromString(rng.choice(seeds))
            for _ in range(rng.randint(1, 4)):
                mutator.mutate(graph)
            answer = caller.call(kind, "funke.v1.JobManager", "SubmitJob",
                                 jobmanager_pb2.SubmitJobRequest(job_graph=graph).SerializeToString())
            if answer is not None:
                caller.accepted.append(jobmanager_pb2.SubmitJobResponse.FromString(answer).job_id)
        elif kind == "bulk":
            graph = jobgraph_pb2.JobGraph.FromString(rng.choice(seeds))
            bulk_mutation(graph, rng, mutator)
            answer = caller.call(kind, "funke.v1.JobManager", "SubmitJob",
                                 jobmanager_pb2.SubmitJobRequest(job_graph=graph).SerializeToString())
            if answer is not None:
                caller.accepted.append(jobmanager_pb2.SubmitJobResponse.FromString(answer).job_id)
        elif kind == "raw":
            service = rng.choice(list(SERVICES))
            method = rng.choice(SERVICES[service])
            body = raw_bodies(seeds, rng)
            caller.call(kind, service, method, [body, body] if method in STREAMING_REQUEST else body)
        elif kind == "ids":
            known = caller.accepted[-20:] or ["none"]
            job_id = rng.choice(known + mutator.strings[:30])
            method = rng.choice(["GetJob", "CancelJob", "WatchJob", "GetJobResult", "ListJobs", "GetClusterOverview",
                                 "GetKeyedState", "RescaleJob"])
            request = {
                "GetJob": lambda: jobmanager_pb2.GetJobRequest(job_id=job_id),
                "CancelJob": lambda: jobmanager_pb2.CancelJobRequest(job_id=job_id),
                "WatchJob": lambda: jobmanager_pb2.WatchJobRequest(job_id=job_id),
                "GetJobResult": lambda: jobmanager_pb2.GetJobResultRequest(job_id=job_id,
                                                                           vertex_id=rng.choice(mutator.strings)),
                "GetKeyedState": lambda: jobmanager_pb2.GetKeyedStateRequest(
                    job_id=job_id, vertex_id=rng.choice(mutator.strings), key=rng.sample(mutator.strings, 2),
                    limit=rng.choice([0, 1, -1, 2**31 - 1])),
                "RescaleJob": lambda: jobmanager_pb2.RescaleJobRequest(
                    job_id=job_id, parallelism=rng.choice([0, 1, 3, -5, 2**31 - 1]),
                    vertex_id=rng.sample(mutator.strings, 2), timeout_seconds=rng.choice([0, -1.0, 1e300, 5.0])),
                "ListJobs": lambda: jobmanager_pb2.ListJobsRequest(),
                "GetClusterOverview": lambda: jobmanager_pb2.GetClusterOverviewRequest(),
            }[method]()
            caller.call(kind, "funke.v1.JobManager", method, request.SerializeToString())
        elif kind == "unauthenticated":
            service = rng.choice(list(SERVICES))
            method = rng.choice(SERVICES[service])
            body = raw_bodies(seeds, rng) if rng.random() < 0.5 else jobmanager_pb2.SubmitJobRequest(
                job_graph=jobgraph_pb2.JobGraph.FromString(rng.choice(seeds))).SerializeToString()
            other = caller.tokens["cluster" if REALMS[service] == "client" else "client"]
            token = rng.choice([None, other, other[:-1] + "0", "x" * 64, "", " ", "Bearer", "x" * 5000])
            caller.call_without(service, method, [body, body] if method in STREAMING_REQUEST else body, token)
        else:
            taskmanager_case(caller, mutator, rng)

    case()
    fuzz_seconds = time.time() - started

    # The JobManager still serves and still runs a job.
    client.wait_until_ready(10)
    probe = client.submit(JobGraph("probe", (JobVertex("src", "S", 1, (OperatorSpec("source.noop"),)),
                                             JobVertex("sink", "K", 1, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
                                   (IntermediateDataSet("src.out0", "src"),), (JobEdge("e", "src.out0", "sink"),)))
    probe_events = list(client.watch(probe))
    probe_status = job_status_name(client.get_job(probe).status)

    # Cancel what still runs or waits; then everything must end and give its slots back.
    for summary in client.list_jobs():
        if job_status_name(summary.status) not in ("FINISHED", "CANCELED", "FAILED", "SUSPENDED"):
            client.cancel(summary.job_id)
    deadline = time.time() + 60
    while time.time() < deadline:
        jobs = client.list_jobs()
        overview = client.cluster_overview()
        live = [j.job_id for j in jobs if job_status_name(j.status) not in ("FINISHED", "CANCELED", "FAILED", "SUSPENDED")]
        real = [tm for tm in overview.task_managers if tm.id in ("tm-1", "tm-2")]
        if not live and len(real) == 2 and all(tm.slots_free == tm.slots_total for tm in overview.task_managers):
            break
        time.sleep(0.25)
    rss_after = rss_mib(pid)
    after_tree = box.snapshot()
    # What the JobManager swallowed to keep serving (an exception while applying a task report,
    # an action that raised) is logged at ERROR or CRITICAL: none may have happened.
    errors = [line for line in (box.cluster / "log" / "jobmanager.log").read_text(errors="replace").splitlines()
              if " ERROR " in line or " CRITICAL " in line]

    summary = {
        "cases": counter["cases"], "seconds": round(fuzz_seconds, 1), "status_codes": dict(caller.codes.most_common()),
        "by_kind": {k: dict(v.most_common()) for k, v in caller.by_kind.items()},
        "unauthenticated_calls": dict(caller.unauthenticated),
        "jobs_accepted": len(caller.accepted), "jobmanager_rss_mib": {"before": round(rss_before, 1),
                                                                       "after": round(rss_after, 1)},
        "forbidden": caller.forbidden[:20], "jobmanager_errors_logged": errors[:20],
        "sample_answers": dict(caller.samples),
    }
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))

    assert counter["cases"] >= min(CASES, 1000)
    assert not caller.forbidden, caller.forbidden[:10]
    assert not errors, errors[:10]
    assert probe_status == "FINISHED", probe_events[-1:]
    assert not live, f"jobs still not terminal 60 s after cancelling them: {live[:10]}"
    assert len(real) == 2, [tm.id for tm in overview.task_managers]
    held = {tm.id: (tm.slots_free, tm.slots_total) for tm in overview.task_managers if tm.slots_free != tm.slots_total}
    assert not held, f"slots still held with every job terminal: {held}"
    assert after_tree == before_tree, {k: (before_tree.get(k), after_tree.get(k))
                                       for k in set(before_tree) | set(after_tree) if before_tree.get(k) != after_tree.get(k)}
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_MIB, (rss_before, rss_after)
    assert set(caller.unauthenticated) == {"UNAUTHENTICATED"}, caller.unauthenticated
    caller.close()
    client.close()


WIDE = ["\U0001f600" * 300, "\u00e9" * 300, "x" * 300, "\u5e74" * 150]


def bulk_mutation(graph, rng: random.Random, mutator: Mutator) -> None:
    """Many problems at once, in wide characters: the answer must still fit gRPC's limits."""
    choice = rng.random()
    template = graph.vertices[rng.randrange(len(graph.vertices))]
    if choice < 0.4:  # hundreds of vertices with long, wide names and groups
        for i in range(rng.choice([50, 300, 1200])):
            v = graph.vertices.add()
            v.CopyFrom(template)
            v.id = f"{rng.choice(WIDE)[:150]}{i}" if rng.random() < 0.5 else f"v{i}"
            v.slot_sharing_group = rng.choice(WIDE)
            v.name = rng.choice(WIDE) * 3
    elif choice < 0.7:  # a long chain of operators with bad configurations
        for i in range(rng.choice([60, 200])):
            op = template.operators.add(kind=rng.choice(["map", "sink.csv", "teleport"]), name=rng.choice(WIDE))
            op.config_json = rng.choice(mutator.json)
    else:  # many edges to nowhere
        for i in range(rng.choice([100, 2500])):
            graph.edges.add(id=f"{rng.choice(WIDE)[:100]}-{i}", data_set_id=rng.choice(WIDE), consumer_vertex_id="x")


def taskmanager_case(caller: Caller, mutator: Mutator, rng: random.Random) -> None:
    """What a rogue or broken TaskManager can send: registrations, heartbeats, task reports."""
    strings = mutator.strings
    choice = rng.random()
    if choice < 0.3:
        request = cluster_pb2.RegisterTaskManagerRequest(
            task_manager_id=rng.choice([f"fuzz-tm-{rng.randint(1, 3)}"] + strings),
            address=rng.choice(["127.0.0.1:9", "localhost:1", "nohost", ":1", "[::1]:9"] + strings[:20]),
            number_of_slots=rng.choice(INTS[FD.TYPE_INT32]),
            registration_token=rng.choice(["", "t" * 64, "short"] + strings[:20]))
        if rng.random() < 0.3:
            request.resources[rng.choice(strings)] = rng.choice(strings)
        caller.call("taskmanager", "funke.v1.ResourceManager", "RegisterTaskManager", request.SerializeToString())
    elif choice < 0.5:
        beats = [cluster_pb2.HeartbeatRequest(task_manager_id=rng.choice(["fuzz-tm-1"] + strings),
                                              registration_id=rng.choice(strings)).SerializeToString()
                 for _ in range(rng.randint(1, 3))]
        caller.call("taskmanager", "funke.v1.ResourceManager", "Heartbeat", beats)
    else:
        request = cluster_pb2.UpdateTaskExecutionStateRequest()
        for _ in range(rng.randint(1, 5)):
            update = request.updates.add(
                job_id=rng.choice((caller.accepted[-10:] or ["x"]) + strings[:10]),
                state=rng.choice(INTS[FD.TYPE_ENUM]), task_manager_id=rng.choice(["tm-1", "fuzz-tm-1"] + strings[:10]))
            update.attempt.vertex_id = rng.choice(["src", "mid", "sink", "source-text"] + strings[:10])
            update.attempt.subtask_index = rng.choice(INTS[FD.TYPE_INT32])
            update.attempt.attempt_number = rng.choice(INTS[FD.TYPE_INT32])
            if rng.random() < 0.3:
                update.failure.exception_type = rng.choice(strings)
                update.failure.message = rng.choice(strings)
                update.failure.traceback = "t" * rng.choice([0, 10, 1_000_000])
            if rng.random() < 0.3:
                update.produced.add(data_set_id=rng.choice(strings), partition_index=rng.choice(INTS[FD.TYPE_INT32]),
                                    schema=rng.choice(strings))
        caller.call("taskmanager", "funke.v1.JobMaster", "UpdateTaskExecutionState", request.SerializeToString())
