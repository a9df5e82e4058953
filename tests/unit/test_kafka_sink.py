"""The Kafka sink's pure rules (`funke.common.streaming.kafkasink`) and how a job graph states
it: `write_kafka`'s arguments, the operator's validation (bootstrap hosts within
funke.io.allowed-hosts, Kafka's topic names, the columns, the guarantee), in a streaming query
and in a bounded job, and the names and marker offsets that make a batch's commit happen once.
The sink against a real broker is tests/integration/test_kafka_sink.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from funke.common import layout
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.api.translate import translate
from funke.common.graph.operators import CATALOGUE
from funke.common.graph.streamingjob import is_streaming_query, sinks
from funke.common.graph.validation import ValidationContext, find_problems
from funke.common.streaming import kafkasink


def _graph(env: ExecutionEnvironment):
    return translate(env.logical_plan())[0]


def _with_sink_config(job, **changes):
    """The job with its Kafka sink's config changed as given (None: the key removed)."""
    vertices = []
    for v in job.vertices:
        ops = []
        for op in v.operators:
            if op.kind == kafkasink.KAFKA_SINK:
                config = {**op.config, **changes}
                op = dataclasses.replace(op, config={k: c for k, c in config.items() if c is not None})
            ops.append(op)
        vertices.append(dataclasses.replace(v, operators=tuple(ops)))
    return dataclasses.replace(job, vertices=tuple(vertices))


def _messages(job, context: ValidationContext | None = None) -> list[str]:
    return [str(p) for p in find_problems(job, context)]


def test_write_kafka_records_a_committing_sink_with_its_settings_in_a_streaming_query_and_a_bounded_job():
    env = ExecutionEnvironment("into kafka", parallelism=2)
    env.read_stream.rate(5).select("CAST(value AS STRING) AS value", "CAST(value % 3 AS STRING) AS k") \
        .write_kafka("127.0.0.1:9092,[::1]:9093", "out.topic-1", key="k")
    job = env.build()
    assert is_streaming_query(job)
    (sink,) = sinks(job)
    assert sink.operators[-1].kind == "sink.kafka"
    assert sink.operators[-1].config == {"bootstrap": "127.0.0.1:9092,[::1]:9093", "topic": "out.topic-1",
                                         "value": "value", "guarantee": "exactly_once", "key": "k"}
    assert CATALOGUE["sink.kafka"].commits_output  # a bounded job's is committed when it FINISHED

    bounded = ExecutionEnvironment("bounded into kafka")
    bounded.from_collection([("a",), ("b",)], "v string").write_kafka("broker:9092", "t", value="v",
                                                                      guarantee="at_least_once")
    job = bounded.build()  # allowed: unlike write_redis, a bounded job may write Kafka
    assert not is_streaming_query(job)
    assert sinks(job)[0].operators[-1].config == {"bootstrap": "broker:9092", "topic": "t", "value": "v",
                                                  "guarantee": "at_least_once"}


@pytest.mark.parametrize("kwargs, match", [
    ({"bootstrap": "no-port", "topic": "t"}, "bootstrap 'no-port' is not 'host:port'"),
    ({"bootstrap": "", "topic": "t"}, "bootstrap must be bootstrap servers"),
    ({"bootstrap": "h:1", "topic": "a b"}, "topic 'a b' is not a Kafka topic name"),
    ({"bootstrap": "h:1", "topic": ".."}, "is not a Kafka topic name"),
    ({"bootstrap": "h:1", "topic": "t", "value": ""}, "the column must be a non-empty name"),
    ({"bootstrap": "h:1", "topic": "t", "guarantee": "exactly-once"}, "guarantee must be one of"),
])
def test_write_kafka_refuses_what_cannot_be_a_kafka_sink_at_the_line_that_says_it(kwargs, match):
    env = ExecutionEnvironment("bad kafka sink")
    with pytest.raises(ValueError, match=match):
        env.read_stream.rate(5).select("CAST(value AS STRING) AS value").write_kafka(**kwargs)


def test_validation_names_every_problem_of_a_kafka_sink_a_client_sent():
    env = ExecutionEnvironment("kafka sink checked at submit", parallelism=1)
    env.read_stream.rate(5).select("CAST(value AS STRING) AS value").write_kafka("127.0.0.1:9092", "out")
    good = _graph(env)
    assert _messages(good) == []
    hostile = _with_sink_config(good, bootstrap="127.0.0.1:9092,evil host:1", topic="../x" * 100, value=None,
                                key=7, guarantee="maybe", extra=1)
    messages = " | ".join(_messages(hostile))
    assert "(sink.kafka) is missing config value" in messages, messages
    assert "config 'bootstrap'" in messages and "must be a host name or IP address" in messages, messages
    assert "config 'topic'" in messages and "topic name of 400 characters" in messages, messages
    assert "config 'key' column name must be a string" in messages, messages
    assert "config 'guarantee' must be one of 'exactly_once', 'at_least_once'" in messages, messages
    assert "unknown config key 'extra'" in messages, messages


def test_a_kafka_sinks_bootstrap_hosts_must_each_be_allowed_hosts():
    env = ExecutionEnvironment("allowed hosts", parallelism=1)
    env.read_stream.rate(5).select("CAST(value AS STRING) AS value") \
        .write_kafka("Kafka.internal:9092,10.9.9.9:9092", "out")
    job = _graph(env)
    context = ValidationContext(allowed_hosts=("kafka.internal", "127.0.0.1"))
    messages = _messages(job, context)
    assert len(messages) == 1 and "'10.9.9.9' is not a host jobs may connect to here" in messages[0], messages
    assert "funke.io.allowed-hosts: kafka.internal, 127.0.0.1" in messages[0]
    allowed = _with_sink_config(job, bootstrap="KAFKA.internal:9092,[127.0.0.1]:9093")
    assert _messages(allowed, context) == []
    assert _messages(job, ValidationContext()) == []  # no list: any host


def test_a_bootstrap_list_is_host_port_pairs_with_ipv6_in_brackets():
    assert kafkasink.bootstrap_servers(" a.example:9092 , [::1]:9093,10.0.0.1:1") == [
        ("a.example", 9092), ("::1", 9093), ("10.0.0.1", 1)]
    for bad in ["a", "a:", ":1", "a:0", "a:65536", "::1:9092", "a:1,", "a:+1", "a:\u0661", None, 9092,
                "a:1," * 100, "x" * 5000]:
        with pytest.raises(ValueError):
            kafkasink.bootstrap_servers(bad)


def test_topic_names_follow_kafkas_rule():
    for good in ["t", "a.b_c-D9", "x" * 249]:
        assert kafkasink.topic_problem(good) is None, good
    for bad in ["", ".", "..", "a/b", "a b", "ä", "x" * 250, None, 5, "t\n"]:
        assert kafkasink.topic_problem(bad) is not None, bad


def test_the_marker_says_a_batch_is_in_once_the_groups_offset_is_above_its_id():
    assert kafkasink.transactional_id("q-1", "sink") == "funke-q-1-sink"
    assert kafkasink.marker_group("q-1", "sink") == "funke-sink-q-1-sink"
    assert kafkasink.marker_offset(0) == 1 and kafkasink.marker_offset(41) == 42
    assert not kafkasink.is_in(None, 0)
    assert kafkasink.is_in(1, 0) and not kafkasink.is_in(1, 1)
    assert kafkasink.is_in(42, 41) and kafkasink.is_in(42, 3) and not kafkasink.is_in(42, 42)
    with pytest.raises(ValueError):
        kafkasink.marker_offset(-1)
    with pytest.raises(ValueError):
        kafkasink.marker_offset(True)
    assert json.loads(kafkasink.marker_metadata("q-1", "sink", 7)) == {
        "funke": "sink.kafka", "owner": "q-1", "sink": "sink", "batch": 7}


def test_a_kafka_sink_stages_under_its_jobs_directory_and_refuses_ids_that_are_not_path_components():
    assert layout.kafka_sink_dir("/data", "job1", "v1") == "/data/jobs/job1/kafka/v1"
    assert layout.sink_target("/data", "job1", "v1", "sink.kafka", {}) == "/data/jobs/job1/kafka/v1"
    with pytest.raises(ValueError):
        layout.kafka_sink_dir("/data", "job1", "../v1")


def test_a_querys_sink_sides_are_prepared_with_its_id_and_all_closed_when_one_fails_to(tmp_path):
    """The query shell prepares the sinks once a run holds the checkpoint (a Kafka sink's
    transactional id needs the query's id) and closes them when the run ends."""
    from funke.jobmanager.streaming import KafkaSink
    from funke.jobmanager.streaming.base import SinkSide
    from funke.jobmanager.streaming.sides import SinkSides

    env = ExecutionEnvironment("two sinks", parallelism=1)
    rows = env.read_stream.rate(5).select("CAST(value AS STRING) AS value")
    rows.write_kafka("127.0.0.1:9092", "out")
    rows.write_parquet(str(tmp_path / "out"))
    job = env.build()
    sides = SinkSides(job, str(tmp_path / "data"), "job1")
    assert sorted(type(s).__name__ for s in sides.sides.values()) == ["FileSink", "KafkaSink"]
    assert isinstance(next(s for s in sides.sides.values() if isinstance(s, KafkaSink)), KafkaSink)

    class Recording(SinkSide):
        def __init__(self, context, fail_close=False):
            super().__init__(context)
            self.prepared, self.closed, self.fail_close = [], False, fail_close

        def prepare(self, query_id=""):
            self.prepared.append(query_id)

        def close(self):
            self.closed = True
            if self.fail_close:
                raise OSError("the broker is gone")

    first, second = (Recording(s.context, fail_close=i == 0) for i, s in enumerate(sides.sides.values()))
    sides.sides = {"a": first, "b": second}
    sides.prepare("query-1")
    assert first.prepared == second.prepared == ["query-1"]
    sides.close()
    assert first.closed and second.closed
