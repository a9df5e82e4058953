"""The Kafka source's pure planning and its configuration rules (common/streaming/sources/kafka.py,
common/graph/validation.py, env.read_stream.kafka): where a query starts, how far each batch goes
(Spark's split of max_offsets_per_trigger), new partitions and topics of a pattern, data loss as an
error or a counted skip, the ranges a logged batch resolves to and their split over the subtasks,
and every hostile setting refused with its reason."""

from __future__ import annotations

import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.api.translate import translate
from funke.common.graph.streamingjob import stream_sources
from funke.common.graph.validation import ValidationContext, find_problems
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import SOURCE_PLUGINS
from funke.common.streaming import kafkasink
from funke.common.streaming.sources import kafka as k
from funke.common.streaming.sources.kafka import KafkaDataLoss, KafkaObservation, KafkaSource, PartitionRange


def observed(ends, lows=None, initial=None):
    return KafkaObservation(ends, lows or {}, initial)


# ------------------------------------------------------------------------------ starting offsets


def test_initial_offsets_earliest_latest_by_time_and_as_given():
    parts = [("a", 0), ("a", 1), ("b", 0)]
    lows = {("a", 0): 5, ("a", 1): 0, ("b", 0): 2}
    ends = {("a", 0): 50, ("a", 1): 7, ("b", 0): 9}
    assert k.initial_offsets("earliest", parts, lows, ends) == {"a": {"0": 5, "1": 0}, "b": {"0": 2}}
    assert k.initial_offsets("latest", parts, lows, ends) == {"a": {"0": 50, "1": 7}, "b": {"0": 9}}
    by_time = {("a", 0): 20, ("a", 1): None, ("b", 0): -1}  # no record at or after the time: the end
    assert k.initial_offsets({"timestamp": 1_700_000_000_000}, parts, lows, ends, by_time) == \
        {"a": {"0": 20, "1": 7}, "b": {"0": 9}}
    # -2 earliest, -1 latest, partitions not named: earliest
    assert k.initial_offsets({"a": {"0": 30, "1": -1}, "b": {"0": -2}}, parts, lows, ends) == \
        {"a": {"0": 30, "1": 7}, "b": {"0": 2}}
    assert k.initial_offsets({"a": {"1": 3}}, parts, lows, ends) == {"a": {"0": 5, "1": 3}, "b": {"0": 2}}


def test_the_first_batch_reads_from_the_initial_offsets_and_latest_begins_with_an_empty_batch():
    earliest = KafkaSource(("t",), starting="earliest")
    ends = {("t", 0): 10, ("t", 1): 4}
    first = earliest.plan(None, observed(ends, initial={"t": {"0": 0, "1": 1}}))
    assert first == SourceRange(None, {"t": {"0": 10, "1": 4}}, 13)
    latest = KafkaSource(("t",))
    first = latest.plan(None, observed(ends, initial={"t": {"0": 10, "1": 4}}))
    assert first == SourceRange(None, {"t": {"0": 10, "1": 4}}, 0)  # logged: where the query began
    # the next batch goes on from there
    later = latest.plan(first.end, observed({("t", 0): 12, ("t", 1): 4}))
    assert later == SourceRange(first.end, {"t": {"0": 12, "1": 4}}, 2)
    # nothing new: start == end, no batch
    assert latest.plan(later.end, observed({("t", 0): 12, ("t", 1): 4})).end == later.end
    # a pattern that matches no topic yet: no first batch
    assert KafkaSource(pattern="x.*").plan(None, observed({}, initial={})) == SourceRange(None, None, 0)
    with pytest.raises(ValueError, match="initial offsets"):
        earliest.plan(None, observed(ends))


# ------------------------------------------------------------------------------ per-trigger limits


def test_the_limit_is_split_over_the_partitions_by_what_each_holds_as_spark_does():
    begins = {("a", 0): 0, ("a", 1): 100, ("b", 0): 5}
    ends = {("a", 0): 100, ("a", 1): 100, ("b", 0): 6}
    # a: 10 * 100/101 = 9.9 -> 9 (down); b: 0.099 -> 1 (up: small partitions are not starved)
    assert k.rate_limit(10, begins, ends) == {("a", 0): 9, ("a", 1): 100, ("b", 0): 6}
    assert k.rate_limit(1000, begins, ends) == ends  # more than there is: everything
    assert k.rate_limit(5, {("a", 0): 7}, {("a", 0): 7}) == {("a", 0): 7}  # nothing at all


def test_a_limited_source_plans_batches_that_take_everything_once_in_order():
    source = KafkaSource(("t",), max_offsets_per_trigger=30)
    ends = {("t", 0): 100, ("t", 1): 50, ("t", 2): 0}
    start = {"t": {"0": 0, "1": 0, "2": 0}}
    taken = {p: [] for p in range(3)}
    for _ in range(20):
        r = source.plan(start, observed(ends))
        if r.end == start:
            break
        for (t, p), (b, e) in _bounds(r).items():
            taken[p].append((b, e))
        assert 0 < r.rows <= 30 + 3
        start = r.end
    assert start == {"t": {"0": 100, "1": 50, "2": 0}}
    for p, pieces in taken.items():  # contiguous, no gaps, no overlaps
        covered = [o for b, e in pieces for o in range(b, e)]
        assert covered == list(range(ends[("t", p)])), (p, pieces)
    # unlimited (a drain, available-now's targets): everything at once
    assert source.plan({"t": {"0": 0, "1": 0, "2": 0}}, observed(ends), limited=False).rows == 150


def test_a_cap_stops_each_partition_at_the_target_and_new_partitions_wait():
    source = KafkaSource(pattern="t.*")
    start = {"t1": {"0": 5}}
    ends = {("t1", 0): 50, ("t2", 0): 8}
    r = source.plan(start, observed(ends), cap={"t1": {"0": 20}})
    assert r.end == {"t1": {"0": 20}, "t2": {"0": 0}} and r.rows == 15


def _bounds(r: SourceRange):
    return {(x.topic, x.partition): (x.begin, x.end) for x in KafkaSource.partition_ranges(r, None)}


# ------------------------------------------------------------------------------ new partitions, topics


def test_a_pattern_reads_matching_topics_whole_names_only_and_new_ones_from_their_beginning():
    source = KafkaSource(pattern=r"orders-\d+")
    assert source.subscribed(["orders-1", "orders-22", "orders-x", "my-orders-1", "__consumer_offsets",
                              "orders-1-dlq"]) == ["orders-1", "orders-22"]
    assert KafkaSource(pattern=".*").subscribed(["__transaction_state", "a"]) == ["a"]
    start = {"orders-1": {"0": 4}}
    ends = {("orders-1", 0): 6, ("orders-2", 0): 3, ("orders-2", 1): 0}  # orders-2 created since
    r = source.plan(start, observed(ends, lows={("orders-2", 0): 0}))
    assert r.end == {"orders-1": {"0": 6}, "orders-2": {"0": 3, "1": 0}} and r.rows == 5
    assert _bounds(r) == {("orders-1", 0): (4, 6), ("orders-2", 0): (0, 3), ("orders-2", 1): (0, 0)}
    # a listed topic: the missing ones are named
    assert KafkaSource(("a", "b")).missing(["a", "c"]) == ["b"]


# ------------------------------------------------------------------------------ data loss


def test_records_deleted_before_the_query_read_them_fail_it_naming_partition_and_offsets():
    source = KafkaSource(("t",))
    start = {"t": {"0": 10, "1": 3}}
    ends = {("t", 0): 40, ("t", 1): 9}
    with pytest.raises(KafkaDataLoss) as info:
        source.plan(start, observed(ends, lows={("t", 0): 25, ("t", 1): 0}))
    assert "topic 't' partition 0: offsets 10 to 24 were deleted" in str(info.value)
    assert "fail_on_data_loss=False" in str(info.value)
    # allowed: skipped, counted, the range reads from the low watermark on
    lenient = KafkaSource(("t",), fail_on_data_loss=False)
    planned = lenient.plan_batch(start, observed(ends, lows={("t", 0): 25, ("t", 1): 0}))
    assert planned.skipped == {("t", 0): 15}
    assert planned.range == SourceRange(start, {"t": {"0": 40, "1": 9}}, 15 + 6)
    assert len(planned.losses) == 1
    # everything of the partition deleted, nothing new: skipped up to the end
    planned = lenient.plan_batch(start, observed({("t", 0): 40, ("t", 1): 9}, lows={("t", 0): 40}))
    assert planned.skipped == {("t", 0): 30} and planned.range.rows == 6


def test_a_partition_that_is_gone_or_a_topic_created_again_is_data_loss():
    start = {"t": {"0": 10, "1": 3}}
    with pytest.raises(KafkaDataLoss, match="topic 't' partition 1 is gone"):
        KafkaSource(("t",)).plan(start, observed({("t", 0): 10}))
    with pytest.raises(KafkaDataLoss, match="end offset 2 is before offset 10"):
        KafkaSource(("t",)).plan(start, observed({("t", 0): 2, ("t", 1): 3}))
    lenient = KafkaSource(("t",), fail_on_data_loss=False)
    assert lenient.plan(start, observed({("t", 0): 12})).end == {"t": {"0": 12}}  # the gone one dropped
    r = lenient.plan(start, observed({("t", 0): 2, ("t", 1): 3}))
    assert r.end == {"t": {"0": 2, "1": 3}} and r.rows == 0  # goes on from the new end
    assert _bounds(r)[("t", 0)] == (10, 2)  # nothing to read


def test_an_explicit_starting_offset_below_the_low_watermark_is_data_loss_too():
    source = KafkaSource(("t",), starting={"t": {"0": 1}})
    with pytest.raises(KafkaDataLoss, match="offsets 1 to 4 were deleted"):
        source.plan(None, observed({("t", 0): 9}, lows={("t", 0): 5}, initial={"t": {"0": 1}}))


# ------------------------------------------------------------------------------ what tasks read


def test_a_logged_range_resolves_to_the_same_partition_ranges_and_splits_over_the_subtasks():
    r = SourceRange({"b": {"0": 3}, "a": {"1": 7}}, {"a": {"0": 4, "1": 9, "2": 7}, "b": {"0": 3}}, 0)
    ranges = KafkaSource.partition_ranges(r, None)
    assert [x.encode() for x in ranges] == ["a/0/0/4", "a/1/7/9", "a/2/0/7", "b/0/3/3"]
    assert [PartitionRange.decode(x.encode()) for x in ranges] == ranges
    assert KafkaSource.partition_ranges(r, None) == ranges  # a batch run again: the same
    shares = [KafkaSource.share(list(reversed(ranges)), i, 3) for i in range(3)]
    assert [[x.encode() for x in s] for s in shares] == [["a/0/0/4", "b/0/3/3"], ["a/1/7/9"], ["a/2/0/7"]]
    first = SourceRange(None, {"a": {"0": 9, "1": 2}}, 0)
    assert [x.encode() for x in KafkaSource.partition_ranges(first, {"a": {"0": 5}})] == ["a/0/5/9", "a/1/0/2"]
    with pytest.raises(ValueError, match="initial offsets"):
        KafkaSource.partition_ranges(first, None)
    assert KafkaSource.partition_ranges(SourceRange(None, None, 0), None) == []
    for bad in ("a/0/1", "a b/0/1/2", "a/-1/0/2", "a/0/x/2", "../0/0/1"):
        with pytest.raises(ValueError, match="not a Kafka partition range"):
            PartitionRange.decode(bad)


def test_offsets_from_the_log_are_checked():
    assert k.parse_offsets({"t": {"0": 3}}) == {("t", 0): 3}
    for bad in ([], {"t": 3}, {"t": {"x": 1}}, {"t": {"0": -1}}, {"bad topic": {"0": 1}}, {"t": {"0": True}}):
        with pytest.raises(ValueError):
            k.parse_offsets(bad)


def test_the_planning_is_built_from_the_config_by_the_registry():
    planning = SOURCE_PLUGINS["source.kafka"].planning(
        {"bootstrap": "h:9092", "pattern": "a.*", "starting": "earliest", "max_offsets_per_trigger": 7,
         "fail_on_data_loss": False}, 3)
    assert planning == KafkaSource((), "a.*", "earliest", 7, False)


# ------------------------------------------------------------------------------ configuration


def _kafka_problems(context=None, **config):
    env = ExecutionEnvironment("kafka", parallelism=1)
    env._source("source.kafka", "Source: kafka", config).write_parquet("/tmp/out-kafka")
    env.job_type = __import__("funke.common.graph.jobgraph", fromlist=["JobType"]).JobType.STREAMING
    return [str(p) for p in find_problems(translate(env.logical_plan())[0], context)]


def test_bootstrap_hosts_are_checked_each_against_the_allowed_hosts():
    context = ValidationContext(allowed_hosts=("kafka-1.internal", "127.0.0.1"))
    assert _kafka_problems(context, bootstrap="kafka-1.internal:9092,127.0.0.1:9093", topics=["t"]) == []
    problems = _kafka_problems(context, bootstrap="kafka-1.internal:9092,evil.example:9092", topics=["t"])
    assert len(problems) == 1 and "'evil.example' is not a host jobs may connect to here" in problems[0]
    for bad in ("kafka", "kafka:0", "kafka:99999", "a:1,,b:2", "bad host:9092", ":9092", 9092):
        assert any("bootstrap" in p for p in _kafka_problems(None, bootstrap=bad, topics=["t"])), bad
    assert kafkasink.bootstrap_servers("[::1]:9092, h:1") == [("::1", 9092), ("h", 1)]


def test_topics_patterns_startings_and_numbers_are_checked():
    ok = {"bootstrap": "h:9092"}
    cases = [
        ({"topics": ["a b"]}, "must be a Kafka topic name"),
        ({"topics": []}, "non-empty list"),
        ({"topics": ["a", "a"]}, "names a topic twice"),
        ({"topics": ["x" * 250]}, "must be a Kafka topic name"),
        ({"topics": [".."]}, "must be a Kafka topic name"),
        ({"pattern": "("}, "is not a regular expression"),
        ({"pattern": "(a+)+$"}, "exponential time"),
        ({"topics": ["a"], "pattern": "a"}, "exactly one of them"),
        ({}, "exactly one of them"),
        ({"topics": ["a"], "starting": "middle"}, "config 'starting'"),
        ({"topics": ["a"], "starting": {"a": {"x": 1}}}, "is not a partition number"),
        ({"topics": ["a"], "starting": {"a": {"0": -3}}}, "the offset must be an integer from 0"),
        ({"topics": ["a"], "starting": {"b": {"0": 1}}}, "names topics the query does not read: b"),
        ({"pattern": "a.*", "starting": {"b": {"0": 1}}}, "names topics the pattern does not match: b"),
        ({"topics": ["a"], "starting": {"timestamp": -5}}, "one time in milliseconds"),
        ({"topics": ["a"], "max_offsets_per_trigger": 0}, "must be a positive integer"),
        ({"topics": ["a"], "fail_on_data_loss": "no"}, "must be true or false"),
        ({"topics": ["a"], "end_offsets": "guess"}, "must be one of 'list', 'fetch'"),
        ({"topics": ["a"], "value_format": "xml"}, "must be one of 'raw'"),
        ({"topics": ["a"], "value_format": "json"}, "needs config 'value_schema'"),
        ({"topics": ["a"], "value_format": "avro"}, "'value_schema' is needed for value_format 'avro'"),
        ({"topics": ["a"], "value_format": "confluent-avro"}, "needs config 'schema_registry'"),
        ({"topics": ["a"], "schemas": {"1": "\"int\""}}, "is for value_format 'confluent-avro'"),
        ({"topics": ["a"], "value_schema": "a int"}, "value_format 'raw' takes no"),
        ({"topics": ["a"], "options": {"fetch.max.bytes": -1}}, "must be an integer from 0"),
        ({"topics": ["a"], "options": {"funke.timeout.ms": 5}}, "must be from 100"),
        ({"topics": ["a"], "options": {"broker.address.family": "v5"}}, "must be one of any, v4, v6"),
        ({"topics": ["a"], "brokers": "x"}, "unknown config key 'brokers'"),
    ]
    for extra, expected in cases:
        problems = _kafka_problems(None, **ok, **extra)
        assert any(expected in p for p in problems), (extra, problems)
    assert _kafka_problems(None, **ok, pattern=r"orders-\d+", starting={"timestamp": 5},
                           options={"fetch.max.bytes": 1 << 20, "funke.timeout.ms": 5000}) == []


def test_security_settings_and_credentials_are_refused_without_echoing_them():
    problems = _kafka_problems(None, bootstrap="h:9092", topics=["a"],
                               options={"sasl.password": "hunter2-secret"})
    assert any("setting 'sasl.password' is not one a query may give" in p for p in problems), problems
    assert not any("hunter2" in p for p in problems)
    problems = _kafka_problems(None, bootstrap="h:9092", topics=["a"], value_format="confluent-avro",
                               schema_registry="https://user:hunter2@registry.example:8081")
    assert any("must not hold credentials" in p for p in problems) and not any("hunter2" in p for p in problems)
    context = ValidationContext(allowed_hosts=("h",))
    problems = _kafka_problems(context, bootstrap="h:9092", topics=["a"], value_format="confluent-avro",
                               schema_registry="http://registry.example:8081")
    assert any("'registry.example' is not a host jobs may connect to here" in p for p in problems), problems
    assert any("must be an http or https URL" in p for p in _kafka_problems(
        None, bootstrap="h:9092", topics=["a"], value_format="confluent-avro", schema_registry="ftp://r/"))


def test_read_stream_kafka_builds_the_config_and_checks_its_arguments_at_the_call():
    env = ExecutionEnvironment("kafka", parallelism=2)
    env.read_stream.kafka("127.0.0.1:9092", "events", starting={"events": {0: 5}}, max_offsets_per_trigger=100,
                          end_offsets="fetch", value_format="json", value_schema="id bigint, name string",
                          options={"fetch.max.bytes": 1 << 20}).write_parquet("/tmp/out-kafka-api")
    (source,) = stream_sources(env.build())
    assert source.operators[0].kind == "source.kafka" and source.name.startswith("Source: kafka events")
    assert source.operators[0].config == {
        "bootstrap": "127.0.0.1:9092", "topics": ["events"], "starting": {"events": {"0": 5}},
        "max_offsets_per_trigger": 100, "fail_on_data_loss": True, "end_offsets": "fetch", "value_format": "json",
        "value_schema": "id bigint, name string", "options": {"fetch.max.bytes": 1 << 20}}
    reader = ExecutionEnvironment("x").read_stream
    for kwargs, match in [({"topics": "a", "pattern": "b"}, "exactly one"), ({}, "exactly one"),
                          ({"topics": ["a b"]}, "topic name"), ({"pattern": "(x*)*"}, "exponential"),
                          ({"topics": "a", "starting": "now"}, "starting"),
                          ({"topics": "a", "end_offsets": "x"}, "end_offsets"),
                          ({"topics": "a", "value_format": "json"}, "value_schema"),
                          ({"topics": "a", "options": {"security.protocol": "SSL"}}, "not one a query may give")]:
        with pytest.raises(ValueError, match=match):
            reader.kafka("h:9092", **kwargs)
    with pytest.raises(ValueError, match="bootstrap"):
        reader.kafka("no-port", "a")


def test_consumer_settings_read_committed_by_assign_and_pass_only_allowed_options():
    settings = k.consumer_settings({"bootstrap": "h:1", "options": {"fetch.max.bytes": 5, "funke.timeout.ms": 900}},
                                   "task-v-0", fail_on_data_loss=False)
    assert settings["isolation.level"] == "read_committed" and settings["enable.auto.commit"] is False
    assert settings["auto.offset.reset"] == "earliest" and settings["fetch.max.bytes"] == 5
    assert "funke.timeout.ms" not in settings
    assert k.consumer_settings({"bootstrap": "h:1"}, "x")["auto.offset.reset"] == "error"
    assert k.timeout_s({"options": {"funke.timeout.ms": 900}}) == 0.9 and k.timeout_s({}) == 30


def test_the_jobmanager_refuses_a_kafka_query_outside_the_allowed_hosts_listing_every_problem(tmp_path):
    import asyncio

    from funke.common.configuration import ClusterConfiguration
    from funke.common.wire.codec import job_graph_to_proto
    from funke.jobmanager.dispatcher import Dispatcher, DispatcherError

    env = ExecutionEnvironment("kafka elsewhere", parallelism=2)
    env.read_stream.kafka("127.0.0.1:9092,broker.evil.example:9092", "events").write_parquet(str(tmp_path / "out"))
    env.read_stream.kafka("127.0.0.1:9092", pattern="ok-.*").write_parquet(str(tmp_path / "out2"))
    message = job_graph_to_proto(env.build())

    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path / "data"), allowed_hosts=("127.0.0.1",)))
        dispatcher.start()
        try:
            with pytest.raises(DispatcherError) as info:
                await dispatcher.submit(message)
            assert info.value.code == "INVALID_ARGUMENT"
            assert "job graph has 1 problem(s)" in str(info.value), str(info.value)
            assert "'broker.evil.example' is not a host jobs may connect to here" in str(info.value)
            assert not dispatcher.jobs
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())
