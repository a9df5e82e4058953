"""The REST API and the Prometheus metrics against a live cluster: Flink's JSON shapes for a
finished word count and a failed job, 404s, the token, cancelling, and the metrics of the
JobManager and the TaskManagers parsed with prometheus_client's parser, the records in and out
equal to the word count's own numbers."""

from __future__ import annotations

import collections
import json
import re
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from funke.common.api.dsl import ExecutionEnvironment
from tests.integration.conftest import wait_for, wait_for_end

pytestmark = pytest.mark.cluster

SEPARATORS = re.compile(r"[\W\d_]+")


class Rest:
    def __init__(self, cluster) -> None:
        self.url = (cluster.dir / "jobmanager.url").read_text().strip().rstrip("/")
        self.token = (cluster.dir / "security" / "client.token").read_text().strip()

    def call(self, path: str, method: str = "GET", body: dict | None = None, token: str | None = "",
             headers: dict | None = None) -> tuple[int, dict]:
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token or self.token}"
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            h["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else {}

    def get(self, path: str) -> dict:
        status, body = self.call(path)
        assert status == 200, (path, status, body)
        return body


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("rest-corpus")
    lines = [" ".join(f"w{(i * 7 + j) % 41}".replace("w", "word") for j in range(i % 6 + 1)) for i in range(300)]
    (d / "part-0.txt").write_text("\n".join(lines[:150]) + "\n")
    (d / "part-1.txt").write_text("\n".join(lines[150:]) + "\n")
    counts = collections.Counter(w for line in lines for w in SEPARATORS.split(line.lower()) if w)
    return str(d / "*.txt"), counts


@pytest.fixture(scope="module")
def finished_word_count(spark_cluster, corpus):
    pattern, counts = corpus
    client = spark_cluster.client

    def words(line: str) -> list[str]:  # local: shipped by value
        return [w for w in SEPARATORS.split(line.lower()) if w]

    # The example's word count at parallelism 1, its count kept in a vertex of its own behind the
    # HASH exchange (at parallelism 1 it would chain to the source): the shapes of an exchange.
    env = ExecutionEnvironment("word count", parallelism=1)
    env.read_text(pattern).flat_map(words, schema="word string").key_by("word").count().start_new_chain().collect()
    job_id = client.submit(env.build())
    _, details = wait_for_end(client, job_id)
    return job_id, details, counts


def test_the_cluster_shapes(spark_cluster):
    rest = Rest(spark_cluster)
    overview = rest.get("/overview")
    assert overview["taskmanagers"] == 2 and overview["slots-total"] == 4
    assert set(overview) >= {"slots-available", "jobs-running", "jobs-finished", "jobs-cancelled", "jobs-failed",
                             "flink-version"}
    assert overview["metrics"].startswith("http://127.0.0.1:") and overview["metrics"].endswith("/metrics")
    config = rest.get("/config")
    assert config["refresh-interval"] > 0 and config["features"]["web-submit"] is False
    tms = rest.get("/taskmanagers")["taskmanagers"]
    assert sorted(t["id"] for t in tms) == ["tm-1", "tm-2"]
    assert all(t["slotsNumber"] == 2 and t["timeSinceLastHeartbeat"] >= 0 for t in tms)
    one = rest.get("/taskmanagers/tm-1")
    assert one["id"] == "tm-1" and len(one["slots"]) == 2
    assert rest.call("/taskmanagers/tm-9")[0] == 404


def test_a_finished_word_count_in_flinks_shapes(spark_cluster, finished_word_count):
    job_id, details, counts = finished_word_count
    rest = Rest(spark_cluster)
    assert {"id": job_id, "status": "FINISHED"} in rest.get("/jobs")["jobs"]
    listed = {j["jid"]: j for j in rest.get("/jobs/overview")["jobs"]}[job_id]
    assert listed["state"] == "FINISHED" and listed["tasks"]["finished"] == listed["tasks"]["total"] == 2
    assert listed["end-time"] >= listed["start-time"] > 0 and listed["duration"] == listed["end-time"] - listed["start-time"]
    job = rest.get(f"/jobs/{job_id}")
    assert job["state"] == "FINISHED" and not job["isStoppable"]
    assert set(job["timestamps"]) >= {"CREATED", "RUNNING", "FINISHED"}
    source, sink = job["vertices"]
    assert [source["status"], sink["status"]] == ["FINISHED", "FINISHED"]
    # records: the source's chain emits each distinct word once (parallelism 1, a combiner), the
    # counting vertex reads exactly those
    assert source["metrics"]["write-records"] == len(counts)
    assert sink["metrics"]["read-records"] == len(counts)
    # each operator of the chains: the source's lines, the words, one row per distinct word
    words = sum(counts.values())
    assert [(o["name"], o["metrics"]["read-records"], o["metrics"]["write-records"]) for v in (source, sink)
            for o in v["operators"]] == [("Source: text", 300, 300), ("FlatMap", 300, words),
                                         ("Combine (Count)", words, len(counts)), ("Count", len(counts), len(counts)),
                                         ("Sink: Collect", len(counts), len(counts))]
    assert sink["metrics"]["write-records"] == len(counts)  # the records its sink wrote
    plan = rest.get(f"/jobs/{job_id}/plan")["plan"]
    assert plan == job["plan"] and [n["id"] for n in plan["nodes"]] == [source["id"], sink["id"]]
    [edge] = plan["nodes"][1]["inputs"]
    assert edge["id"] == source["id"] and edge["ship_strategy"] == "HASH" and edge["distribution-pattern"] == "ALL_TO_ALL"
    vertex = rest.get(f"/jobs/{job_id}/vertices/{sink['id']}")
    [sub] = vertex["subtasks"]
    assert sub["status"] == "FINISHED" and sub["taskmanager-id"] in ("tm-1", "tm-2") and sub["host"]
    attempt = rest.get(f"/jobs/{job_id}/vertices/{sink['id']}/subtasks/0/attempts/{sub['attempt']}")
    assert [h["to"] for h in attempt["history"]][-1] == "FINISHED"
    assert attempt["metrics"]["read-records"] == len(counts) and attempt["metrics"]["read-bytes"] > 0
    times = rest.get(f"/jobs/{job_id}/subtasktimes")
    assert {(a["vertex"], a["subtask"]) for a in times["attempts"]} == {(source["id"], 0), (sink["id"], 0)}
    for a in times["attempts"]:
        assert a["states"][0]["state"] == "CREATED" and a["states"][-1]["state"] == "FINISHED"
        assert all(s["start"] <= s["end"] for s in a["states"])
    assert rest.get(f"/jobs/{job_id}/vertices/{sink['id']}/subtasktimes")["subtasks"][0]["timestamps"]["FINISHED"] > 0
    assert rest.get(f"/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"] == []
    for missing in (f"/jobs/{job_id}/vertices/nope", f"/jobs/{job_id}/vertices/{sink['id']}/subtasks/0/attempts/9",
                    "/jobs/no-such-job", "/jobs/no-such-job/plan"):
        status, body = rest.call(missing)
        assert status == 404 and body["errors"], (missing, status, body)
    assert rest.call(f"/jobs/{job_id}/vertices/{sink['id']}/subtasks/x/attempts/0")[0] == 400


def test_the_metrics_of_every_process_count_the_word_counts_records(spark_cluster, finished_word_count):
    job_id, details, counts = finished_word_count
    rest = Rest(spark_cluster)
    jobmanager = scrape(rest.get("/overview")["metrics"])
    assert jobmanager["funke_jobmanager_numRegisteredTaskManagers"][0].value == 2
    assert jobmanager["funke_jobmanager_taskSlotsTotal"][0].value == 4
    assert "process_resident_memory_bytes" in jobmanager
    records_in = collections.Counter()
    records_out = collections.Counter()
    for tm in rest.get("/taskmanagers")["taskmanagers"]:
        metrics = scrape(tm["resources"]["metrics"])
        assert metrics["funke_taskmanager_taskSlotsTotal"][0].value == 2
        for sample in metrics.get("funke_taskmanager_job_task_numRecordsIn", []):
            if sample.labels["job_id"] == job_id:
                assert sample.labels["tm_id"] == tm["id"] and sample.labels["task_name"]
                records_in[sample.labels["vertex_id"]] += sample.value
        for sample in metrics.get("funke_taskmanager_job_task_numRecordsOut", []):
            if sample.labels["job_id"] == job_id:
                records_out[sample.labels["vertex_id"]] += sample.value
    source, sink = (v.id for v in details.vertices)
    assert records_out[source] == len(counts) and records_in[sink] == len(counts)
    assert records_in[source] == 300  # a source's records in are the records it read: the corpus's lines
    assert records_out[sink] == len(counts)  # a sink's records out are the records it wrote
    # per operator of each chain, Flink's operator metrics
    operators = {}
    for tm in rest.get("/taskmanagers")["taskmanagers"]:
        metrics = scrape(tm["resources"]["metrics"])
        for name in ("numRecordsIn", "numRecordsOut"):
            for sample in metrics.get(f"funke_taskmanager_job_task_operator_{name}", []):
                if sample.labels["job_id"] == job_id:
                    key = (sample.labels["vertex_id"], sample.labels["operator_name"])
                    operators.setdefault(key, {})[name] = sample.value
    words = sum(counts.values())
    assert operators == {
        (source, "Source: text"): {"numRecordsIn": 300, "numRecordsOut": 300},
        (source, "FlatMap"): {"numRecordsIn": 300, "numRecordsOut": words},
        (source, "Combine (Count)"): {"numRecordsIn": words, "numRecordsOut": len(counts)},
        (sink, "Count"): {"numRecordsIn": len(counts), "numRecordsOut": len(counts)},
        (sink, "Sink: Collect"): {"numRecordsIn": len(counts), "numRecordsOut": len(counts)},
    }


def test_a_streaming_word_counts_keyed_vertex_counts_its_records_batch_by_batch(spark_cluster, tmp_path):
    """The running word count's keyed vertex (`Count -> Sink: Parquet`, behind the exchange at
    parallelism 2): its records in and out grow with every batch, per vertex, per subtask and per
    operator, in Flink's shapes (/jobs/:jid, /jobs/:jid/vertices/:vid and its /metrics)."""
    rest = Rest(spark_cluster)
    client = spark_cluster.client
    incoming, staging = tmp_path / "incoming", tmp_path / "staging"
    incoming.mkdir()
    staging.mkdir()

    def words(line: str) -> list[str]:  # local: shipped by value
        return [w for w in SEPARATORS.split(line.lower()) if w]

    env = ExecutionEnvironment("rest running word count", parallelism=2)
    (env.read_stream.text(str(incoming)).flat_map(words, schema="word string").key_by("word").count()
        .write_parquet(str(tmp_path / "out")))
    env.set_output_mode("update").set_trigger("200 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    job_id = client.submit(env.build())
    texts = ["to be or not to be\nthat is the question\n", "be quick\nor be dead\n"]
    seen_words, changed = 0, 0
    try:
        for n, text in enumerate(texts):
            (staging / f"{n}.txt").write_text(text)
            (staging / f"{n}.txt").rename(incoming / f"{n}.txt")  # arrives whole
            batch_words = [w for line in text.splitlines() for w in words(line)]
            seen_words += len(batch_words)
            changed += len(set(batch_words))  # update mode: each word the batch saw, with its new total

            def keyed_vertex() -> dict | None:
                job = rest.get(f"/jobs/{job_id}")
                [vertex] = [v for v in job["vertices"] if v["name"] == "Count -> Sink: Parquet"]
                m = vertex["metrics"]
                return vertex if (m["read-records"], m["write-records"]) == (seen_words, changed) else None

            vertex = wait_for(f"the keyed vertex to have counted batch {n}'s records", keyed_vertex, timeout=180)
            assert [(o["name"], o["metrics"]["read-records"], o["metrics"]["write-records"])
                    for o in vertex["operators"]] == [("Count", seen_words, changed),
                                                      ("Sink: Parquet", changed, changed)]
            subtasks = rest.get(f"/jobs/{job_id}/vertices/{vertex['id']}")["subtasks"]
            assert sum(s["metrics"]["read-records"] for s in subtasks) == seen_words
            assert sum(s["metrics"]["write-records"] for s in subtasks) == changed
            assert sum(s["operators"][0]["metrics"]["write-records"] for s in subtasks) == changed
            # Flink's metric ids: "<subtask>.<metric>" and "<subtask>.<operator>.<metric>"
            listed = {m["id"] for m in rest.get(f"/jobs/{job_id}/vertices/{vertex['id']}/metrics")}
            wanted = ["0.Count.numRecordsIn", "1.Count.numRecordsIn", "0.Sink__Parquet.numRecordsOut",
                      "1.Sink__Parquet.numRecordsOut", "0.numRecordsIn", "1.numRecordsIn"]
            assert set(wanted) <= listed, sorted(listed)
            values = {m["id"]: int(m["value"]) for m in
                      rest.get(f"/jobs/{job_id}/vertices/{vertex['id']}/metrics?get={','.join(wanted)}")}
            assert values[wanted[0]] + values[wanted[1]] == seen_words == values[wanted[4]] + values[wanted[5]]
            assert values[wanted[2]] + values[wanted[3]] == changed
        status, body = rest.call(f"/jobs/{job_id}/vertices/{vertex['id']}/metrics?get=" + "x" * 5000)
        assert status == 400 and body["errors"]
    finally:
        client.cancel(job_id)


def test_a_running_job_its_cancel_and_the_job_metrics(spark_cluster, tmp_path):
    rest = Rest(spark_cluster)
    env = ExecutionEnvironment("rest waits", parallelism=1)
    env.from_range(0, 4).map(lambda r: (time.sleep(60), r)[1:], schema="id bigint").collect()
    job_id = spark_cluster.client.submit(env.build())
    wait_for("the job to run", lambda: rest.get(f"/jobs/{job_id}")["state"] == "RUNNING", timeout=120)
    metrics = scrape(rest.get("/overview")["metrics"])
    mine = [s for s in metrics["funke_jobmanager_job_numRestarts"] if s.labels["job_id"] == job_id]
    assert mine and mine[0].labels["job_name"] == "rest waits" and mine[0].value == 0
    assert [s.value for s in metrics["funke_jobmanager_job_uptime"] if s.labels["job_id"] == job_id][0] >= 0
    assert metrics["funke_jobmanager_numRunningJobs"][0].value >= 1
    # a cancel needs the token; with it: 202, then the job ends CANCELED
    assert rest.call(f"/jobs/{job_id}?mode=cancel", "PATCH", token=None)[0] == 401
    assert rest.call(f"/jobs/{job_id}?mode=cancel", "PATCH", token="w" * 64)[0] == 401
    assert rest.call(f"/jobs/{job_id}?mode=stop", "PATCH")[0] == 400
    assert rest.call(f"/jobs/{job_id}/stop", "POST", body={"drain": False})[0] == 409  # not a streaming query
    assert rest.call(f"/jobs/{job_id}/rescale", "POST", body={"parallelism": 2})[0] == 409  # nor here
    assert rest.call(f"/jobs/{job_id}/rescale", "POST", body={"parallelism": 0})[0] == 400
    assert rest.call(f"/jobs/{job_id}/rescale", "POST", body={"parallelism": 2, "vertices": "v"})[0] == 400
    assert rest.call("/jobs/no-such-job/rescale", "POST", body={"parallelism": 2})[0] == 404
    assert rest.call(f"/jobs/{job_id}?mode=cancel", "PATCH") == (202, {})
    wait_for("the cancellation", lambda: rest.get(f"/jobs/{job_id}")["state"] == "CANCELED", timeout=120)


def test_a_failed_jobs_exceptions_root_cause_first(spark_cluster):
    rest = Rest(spark_cluster)
    env = ExecutionEnvironment("rest fails", parallelism=1)

    def explode(row):
        raise ValueError(f"row {row} is not welcome")

    env.from_range(0, 3).map(explode, schema="id bigint").collect()
    job_id = spark_cluster.client.submit(env.build())
    wait_for_end(spark_cluster.client, job_id)
    job = rest.get(f"/jobs/{job_id}")
    assert job["state"] == "FAILED" and job["failure"]["exception"]
    exceptions = rest.get(f"/jobs/{job_id}/exceptions")
    assert "is not welcome" in exceptions["root-exception"]
    [entry, *_] = exceptions["exceptionHistory"]["entries"]
    assert "ValueError" in entry["stacktrace"] and "is not welcome" in entry["stacktrace"]
    assert entry["taskName"] and entry["taskManagerId"] in ("tm-1", "tm-2") and entry["location"]


def test_the_api_asks_for_the_token_and_reads_no_file_a_request_names(spark_cluster):
    rest = Rest(spark_cluster)
    for path in ("/overview", "/jobs", "/taskmanagers", "/jobs/x/plan"):
        status, body = rest.call(path, token=None)
        assert status == 401 and "client token" in body["errors"][0]
    status, _ = rest.call("/overview", token="x" * 64)
    assert status == 401
    # logging in trades the token for an HttpOnly cookie; a wrong one is refused
    assert rest.call("/login", "POST", body={"token": "x" * 64}, token=None)[0] == 401
    request = urllib.request.Request(rest.url + "/login", data=json.dumps({"token": rest.token}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 204
        cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    assert rest.call("/overview", token=None, headers={"Cookie": value})[0] == 200
    # a change by cookie from another origin is refused (CSRF)
    assert rest.call("/jobs/x?mode=cancel", "PATCH", token=None,
                     headers={"Cookie": value, "Origin": "http://evil.example"})[0] == 403
    # the dashboard's assets are public and fixed; nothing else is served from disk
    for path in ("/web/..%2f..%2fsecurity%2fclient.token", "/web/index.html", "/web/%2e%2e/rest.py", "/../etc/passwd"):
        status, _ = rest.call(path, token=None)
        assert status in (401, 404), (path, status)
    with urllib.request.urlopen(rest.url + "/", timeout=30) as response:
        page = response.read().decode()
        assert response.status == 200 and "/web/app.js" in page and rest.token not in page
    # the ES modules app.js imports load before anyone logs in, as JavaScript (a module script
    # served as anything else is refused by the browser)
    for module in ("app.js", "router.js", "palette.js"):
        with urllib.request.urlopen(f"{rest.url}/web/{module}", timeout=30) as response:
            assert response.status == 200 and response.headers["Content-Type"].startswith("application/javascript")


def test_grpc_server_reflection_lists_the_api_to_a_client_with_the_token(spark_cluster):
    """What grpcurl's `list` and `describe` do, through the reflection service."""
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with spark_cluster.channel() as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"funke.v1.JobManager", "funke.v1.ResourceManager", "funke.v1.JobMaster", "grpc.health.v1.Health"} <= services
        described = database.FindFileContainingSymbol("funke.v1.JobManager")
        assert "SubmitJob" in {m.name for s in described.service for m in s.method}
    with grpc.insecure_channel(spark_cluster.address) as bare:
        with pytest.raises(grpc.RpcError) as info:
            list(ProtoReflectionDescriptorDatabase(bare).get_services())
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
