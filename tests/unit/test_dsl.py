"""The DSL builds the JobGraph a Flink user expects: chains, edges, ids, names, configuration."""

from __future__ import annotations

import os

import datetime
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import cloudpickle
import pytest

from funke.common.api.dsl import CollectSink, ExecutionEnvironment
from funke.common.graph.jobgraph import (
    Artifact,
    DistributionPattern as DP,
    FailoverStrategyKind,
    JobEdge,
    JobGraph,
    JobType,
    PartitionerKind as PK,
    RestartStrategyConfig,
    ResultPartitionType as RPT,
)
from funke.common.graph.restart import restart_strategy_from_config
from funke.common.graph.validation import validate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"funke_example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wordcount(env: ExecutionEnvironment):
    return (
        env.read_text("data/*.txt")
        .flat_map(lambda line: line.lower().split(), schema="word string")
        .key_by("word")
        .count()
    )


def edge_between(job: JobGraph, producer: str, consumer: str) -> JobEdge:
    (edge,) = [e for e in job.inputs_of(consumer) if job.data_set(e.data_set).producer == producer]
    return edge


def wiring(edge: JobEdge) -> tuple:
    return edge.distribution_pattern, edge.partitioner, edge.partition_keys


def built(env: ExecutionEnvironment) -> JobGraph:
    job = env.build()
    validate(job)  # build() validates; asserting it again keeps the tests honest if that changes
    return job


# ---- chaining ----


def test_wordcount_chains_into_two_vertices_joined_by_one_hash_edge():
    env = ExecutionEnvironment("word count", parallelism=2)
    wordcount(env).collect()
    job = built(env)

    assert [(v.id, v.name, v.parallelism) for v in job.vertices] == [
        ("source-text", "Source: text -> FlatMap -> Combine (Count)", 2),
        ("count", "Count -> Sink: Collect", 2),
    ]
    # the count is combined in the producer's chain and summed after the exchange
    assert [op.kind for op in job.vertex("source-text").operators] == ["source.text", "flat_map", "count"]
    assert [op.kind for op in job.vertex("count").operators] == ["aggregate", "sink.collect"]
    (edge,) = job.edges
    assert wiring(edge) == (DP.ALL_TO_ALL, PK.HASH, ("word",))
    assert edge.result_partition_type is RPT.BLOCKING
    assert (edge.consumer, edge.input_index) == ("count", 0)
    assert job.data_sets[0].id == "source-text.out0" and job.data_sets[0].producer == "source-text"
    assert job.job_type is JobType.BATCH
    assert job.vertex("source-text").operators[2].config == {"keys": ["word"]}
    assert job.vertex("count").operators[0].config == {"keys": ["word"], "aggregations": ["sum(`count`) as `count`"]}


def test_different_parallelism_breaks_the_chain_with_a_rebalance_edge():
    env = ExecutionEnvironment("p", parallelism=2)
    env.from_range(100).map(lambda n: n * 2, schema="n bigint").set_parallelism(3).discard()
    job = built(env)

    # the sink takes the default parallelism again, so it is cut off too
    assert [(v.name, v.parallelism) for v in job.vertices] == [
        ("Source: range", 2), ("Map", 3), ("Sink: Discard", 2),
    ]
    assert [wiring(e) for e in job.edges] == [(DP.ALL_TO_ALL, PK.REBALANCE, ())] * 2


def test_sink_parallelism_one_gets_its_own_vertex():
    env = ExecutionEnvironment("p", parallelism=4)
    wordcount(env).collect().set_parallelism(1)
    job = built(env)

    assert [(v.name, v.parallelism) for v in job.vertices] == [
        ("Source: text -> FlatMap -> Combine (Count)", 4), ("Count", 4), ("Sink: Collect", 1),
    ]
    assert wiring(edge_between(job, "count", "sink-collect")) == (DP.ALL_TO_ALL, PK.REBALANCE, ())


@pytest.mark.parametrize("breaker", [
    lambda sink: sink.disable_chaining(),
    lambda sink: sink.start_new_chain(),
    lambda sink: sink.slot_sharing_group("heavy"),
    lambda sink: sink.co_location_group("together"),
    lambda sink: sink.set_max_parallelism(32),  # the filter's is 64
], ids=["disable_chaining", "start_new_chain", "slot_sharing_group", "co_location_group", "max_parallelism"])
def test_chain_breakers_with_equal_parallelism_give_a_forward_edge(breaker):
    env = ExecutionEnvironment("b", parallelism=2)
    breaker(env.from_range(10).filter(lambda n: n % 2 == 0).set_max_parallelism(64).discard())
    job = built(env)

    assert [v.name for v in job.vertices] == ["Source: range -> Filter", "Sink: Discard"]
    (edge,) = job.edges
    assert wiring(edge) == (DP.POINTWISE, PK.FORWARD, ())


def test_a_max_parallelism_set_once_in_a_chain_belongs_to_the_whole_chain():
    env = ExecutionEnvironment("maxp", parallelism=2)
    env.from_range(10).set_max_parallelism(64).where("id > 1").set_max_parallelism(64).filter(bool).discard()
    (vertex,) = built(env).vertices
    assert vertex.max_parallelism == 64

    # 64 -> unset -> 32: the unset one joins the first chain, the 32 cannot
    env = ExecutionEnvironment("maxp", parallelism=2)
    env.from_range(10).set_max_parallelism(64).where("id > 1").filter(bool).set_max_parallelism(32).discard()
    job = built(env)
    assert [(v.name, v.max_parallelism) for v in job.vertices] == [
        ("Source: range -> Where", 64), ("Filter -> Sink: Discard", 32),
    ]


def test_disable_chaining_isolates_the_operator_on_both_sides_but_start_new_chain_does_not():
    env = ExecutionEnvironment("b")
    env.from_range(10).filter(bool).disable_chaining().where("id > 2").discard()
    assert [v.name for v in built(env).vertices] == ["Source: range", "Filter", "Where -> Sink: Discard"]

    env = ExecutionEnvironment("b")
    env.from_range(10).filter(bool).start_new_chain().where("id > 2").discard()
    assert [v.name for v in built(env).vertices] == ["Source: range", "Filter -> Where -> Sink: Discard"]


def test_slot_sharing_group_is_inherited_so_downstream_operators_stay_chained():
    env = ExecutionEnvironment("ssg")
    env.from_range(10).slot_sharing_group("sources").select("id * 2 as x").discard()
    job = built(env)

    (vertex,) = job.vertices
    assert vertex.name == "Source: range -> Select -> Sink: Discard"
    assert vertex.slot_sharing_group == "sources"


def test_env_wide_chaining_switch_makes_every_operator_a_vertex():
    env = ExecutionEnvironment("nochain").disable_operator_chaining()
    env.from_range(10).where("id > 1").discard()
    job = built(env)

    assert [v.name for v in job.vertices] == ["Source: range", "Where", "Sink: Discard"]
    assert all(wiring(e) == (DP.POINTWISE, PK.FORWARD, ()) for e in job.edges)


def test_an_operator_feeding_two_consumers_heads_no_chain_below_it():
    env = ExecutionEnvironment("fanout")
    numbers = env.from_range(10)
    numbers.where("id > 5").discard()
    numbers.print()
    job = built(env)

    assert [v.name for v in job.vertices] == ["Source: range", "Where -> Sink: Discard", "Sink: Print"]
    assert [d.id for d in job.produced_by("source-range")] == ["source-range.out0", "source-range.out1"]


def test_operators_that_reach_no_sink_are_left_out():
    env = ExecutionEnvironment("lazy")
    numbers = env.from_range(10)
    numbers.map(str, schema="s string")  # never consumed
    numbers.discard()
    job = built(env)

    assert [v.name for v in job.vertices] == ["Source: range -> Sink: Discard"]


def test_a_job_without_sinks_is_rejected_with_the_sinks_it_could_use():
    env = ExecutionEnvironment("nothing")
    env.from_range(10).where("id > 1")
    with pytest.raises(ValueError, match=r"no sinks.*collect\(\)"):
        env.build()


# ---- explicit partitioning ----


@pytest.mark.parametrize("partition, expected", [
    (lambda s: s.rebalance(), (DP.ALL_TO_ALL, PK.REBALANCE, ())),
    (lambda s: s.rescale(), (DP.POINTWISE, PK.REBALANCE, ())),
    (lambda s: s.broadcast(), (DP.ALL_TO_ALL, PK.BROADCAST, ())),
    (lambda s: s.key_by("id", "k"), (DP.ALL_TO_ALL, PK.HASH, ("id", "k"))),
    (lambda s: s.key_by(["id", "k"]), (DP.ALL_TO_ALL, PK.HASH, ("id", "k"))),
], ids=["rebalance", "rescale", "broadcast", "key_by", "key_by-list"])
def test_explicit_partitioning_always_breaks_the_chain(partition, expected):
    env = ExecutionEnvironment("part", parallelism=3)
    partition(env.from_range(10).select("id", "id % 3 as k")).where("k = 1").discard()
    job = built(env)

    assert [v.name for v in job.vertices] == ["Source: range -> Select", "Where -> Sink: Discard"]
    (edge,) = job.edges
    assert wiring(edge) == expected


def test_forward_chains_when_it_can_and_refuses_a_parallelism_change():
    env = ExecutionEnvironment("fwd", parallelism=2)
    env.from_range(10).forward().where("id > 1").discard()
    assert [v.name for v in built(env).vertices] == ["Source: range -> Where -> Sink: Discard"]

    env = ExecutionEnvironment("fwd", parallelism=2)
    env.from_range(10).forward().where("id > 1").set_parallelism(3).discard()
    with pytest.raises(ValueError, match=r"forward\(\) cannot connect .*parallelism 2.*parallelism 3"):
        env.build()


def test_keyed_operators_head_their_chain_with_their_config():
    env = ExecutionEnvironment("keyed")
    pairs = env.from_collection([("a", 1), ("b", 2), ("a", 3)], schema="k string, n int")
    pairs.key_by("k").reduce(lambda x, y: (x[0], x[1] + y[1])).discard()
    pairs.key_by("k").aggregate("sum(n) as total", "max(n) as top").print()
    job = built(env)

    assert [v.name for v in job.vertices] == [
        "Source: collection", "Reduce -> Sink: Discard", "Aggregate -> Sink: Print",
    ]
    assert job.vertex("aggregate").operators[0].config == {
        "keys": ["k"], "aggregations": ["sum(n) as total", "max(n) as top"],
    }
    assert job.vertex("reduce").operators[0].config == {"keys": ["k"]}
    assert all(wiring(e) == (DP.ALL_TO_ALL, PK.HASH, ("k",)) for e in job.edges)


# ---- result partition types ----


def test_streaming_jobs_use_pipelined_exchanges():
    env = ExecutionEnvironment("stream", job_type="streaming", parallelism=2)
    wordcount(env).print()
    job = built(env)

    assert job.job_type is JobType.STREAMING
    assert [e.result_partition_type for e in job.edges] == [RPT.PIPELINED]


@pytest.mark.parametrize("job_type, mode, expected", [
    ("batch", "ALL_EXCHANGES_PIPELINED", RPT.PIPELINED),
    ("streaming", "ALL_EXCHANGES_BLOCKING", RPT.BLOCKING),
])
def test_batch_shuffle_mode_option_overrides_the_partition_type(job_type, mode, expected):
    env = ExecutionEnvironment("mode", job_type=job_type, parallelism=2).set_option("execution.batch-shuffle-mode", mode)
    wordcount(env).print()
    job = built(env)

    assert [e.result_partition_type for e in job.edges] == [expected]
    assert job.configuration.options["execution.batch-shuffle-mode"] == mode


def test_unknown_batch_shuffle_mode_is_rejected_at_build():
    env = ExecutionEnvironment("mode").set_option("execution.batch-shuffle-mode", "ALL_EXCHANGES_HYBRID_FULL")
    wordcount(env).print()
    with pytest.raises(ValueError, match="ALL_EXCHANGES_HYBRID_FULL"):
        env.build()


# ---- multi-input operators ----


def test_join_is_a_two_input_vertex_hash_partitioned_on_the_keys():
    env = ExecutionEnvironment("join", parallelism=2)
    orders = env.from_collection([(1, 10, 2.5)], schema="order_id bigint, customer_id bigint, amount double")
    customers = env.read_csv("customers.csv", schema="customer_id bigint, name string")
    orders.join(customers, on="customer_id", how="left").where("amount > 1").collect()
    job = built(env)

    assert [v.name for v in job.vertices] == [
        "Source: collection", "Source: CSV", "Join -> Where -> Sink: Collect",
    ]
    left, right = job.inputs_of("join")
    assert (job.data_set(left.data_set).producer, left.input_index) == ("source-collection", 0)
    assert (job.data_set(right.data_set).producer, right.input_index) == ("source-csv", 1)
    assert wiring(left) == wiring(right) == (DP.ALL_TO_ALL, PK.HASH, ("customer_id",))
    assert job.vertex("join").operators[0].config == {"on": ["customer_id"], "how": "left"}
    assert job.vertex("source-csv").operators[0].config == {
        "path": os.path.abspath("customers.csv"), "schema": "customer_id bigint, name string", "options": {"header": "true"},
    }


def test_join_hash_partitioning_supersedes_a_rebalance_on_an_input():
    env = ExecutionEnvironment("join")
    a = env.from_collection([(1, "x")], schema="id int, a string")
    b = env.from_collection([(1, "y")], schema="id int, b string")
    a.rebalance().join(b, on=["id"]).discard()
    job = built(env)

    assert all(wiring(e) == (DP.ALL_TO_ALL, PK.HASH, ("id",)) for e in job.edges)


def test_union_inputs_are_numbered_in_call_order():
    env = ExecutionEnvironment("union", parallelism=2)
    first = env.from_range(0, 10).uid("first")
    second = env.from_range(10, 20).uid("second")
    third = env.from_range(20, 30).uid("third").set_parallelism(1)
    second.union(third, first).collect()
    job = built(env)

    (union,) = [v for v in job.vertices if v.operators[0].kind == "union"]
    assert union.name == "Union -> Sink: Collect"
    producers = [job.data_set(e.data_set).producer for e in job.inputs_of(union.id)]
    assert producers == ["second", "third", "first"]
    assert [e.input_index for e in job.inputs_of(union.id)] == [0, 1, 2]
    by_producer = {job.data_set(e.data_set).producer: wiring(e) for e in job.inputs_of(union.id)}
    assert by_producer["third"] == (DP.ALL_TO_ALL, PK.REBALANCE, ())  # parallelism 1 -> 2
    assert by_producer["first"] == (DP.POINTWISE, PK.FORWARD, ())


def test_a_stream_feeding_one_operator_twice_gets_distinct_edges():
    env = ExecutionEnvironment("self")
    numbers = env.from_range(5)
    numbers.union(numbers).discard()
    job = built(env)

    edges = job.inputs_of("union")
    assert [e.input_index for e in edges] == [0, 1]
    assert len({e.id for e in edges}) == 2 and len({e.data_set for e in edges}) == 2


# ---- ids and names ----


def test_uid_becomes_the_vertex_id_and_name_shows_in_the_vertex_name():
    env = ExecutionEnvironment("names", parallelism=2)
    (
        env.read_text("in").uid("lines").name("read lines")
        .flat_map(str.split, schema="word string").name("split")
        .key_by("word").count().uid("counter")
        .write_csv("out", mode="overwrite").name("write counts").uid("not-a-head")
    )
    job = built(env)

    assert [(v.id, v.name) for v in job.vertices] == [
        ("lines", "read lines -> split -> Combine (Count)"),
        ("counter", "Count -> write counts"),
    ]
    assert [op.name for op in job.vertex("counter").operators] == ["Count", "write counts"]
    assert job.vertex("counter").operators[1].config == {
        "path": os.path.abspath("out"), "mode": "overwrite", "options": {"header": "true"},
    }


def test_generated_ids_are_unique_and_avoid_uids():
    env = ExecutionEnvironment("ids")
    env.from_range(1).uid("source-range-2").discard().disable_chaining()
    env.from_range(2).discard().disable_chaining()
    env.from_range(3).discard().disable_chaining()
    job = built(env)

    assert [v.id for v in job.vertices] == [
        "source-range-2", "sink-discard", "source-range", "sink-discard-2", "source-range-3", "sink-discard-3",
    ]


def test_uids_must_be_unique():
    env = ExecutionEnvironment("ids")
    env.from_range(1).uid("numbers").uid("numbers")  # setting it again on the same operator is fine
    with pytest.raises(ValueError, match="uid 'numbers' is already used"):
        env.from_range(2).uid("numbers")


@pytest.mark.parametrize("uid", ["..", "a/b", "my source", "x\n", ".hidden"])
def test_a_uid_must_be_a_plain_path_id_since_it_becomes_the_vertex_id(uid):
    env = ExecutionEnvironment("ids")
    with pytest.raises(ValueError, match="uid .* may only contain|uid .* longer"):
        env.from_range(1).uid(uid)
    with pytest.raises(ValueError, match="artifact name"):
        env.add_artifact(uid, b"")
    with pytest.raises(ValueError, match="control characters|whitespace"):
        env.from_range(1).slot_sharing_group(" group\t")


def test_collect_handle_names_the_vertex_the_sink_runs_in():
    env = ExecutionEnvironment("collect")
    handle = wordcount(env).collect()
    job = built(env)

    assert isinstance(handle, CollectSink)
    assert handle.vertex_id == "source-text"  # one subtask on each side: the count chains to the source
    assert job.vertex(handle.vertex_id).operators[-1].kind == "sink.collect"

    env = ExecutionEnvironment("collect", parallelism=2)
    handle = wordcount(env).collect().set_parallelism(1).uid("results")
    assert handle.vertex_id == "results"  # answered before build() too
    assert [op.kind for op in built(env).vertex("results").operators] == ["sink.collect"]


# ---- functions and configs ----


def test_functions_round_trip_through_cloudpickle_and_compute_the_same():
    offset = 7
    env = ExecutionEnvironment("fns")
    s = env.generate(3, lambda i: (i, f"row {i}"), schema="i bigint, label string")
    s = s.map(lambda n: n + offset, schema="n bigint")
    s = s.flat_map(lambda line: line.split(), schema="w string")
    s = s.filter(lambda w: len(w) > 2)
    s.key_by("w").reduce(lambda a, b: a if a > b else b).discard()
    s.transform(lambda df: ("transformed", df)).discard()
    job = built(env)

    ops = {op.kind: op for v in job.vertices for op in v.operators}
    fn = {kind: cloudpickle.loads(op.function) for kind, op in ops.items() if op.function}
    assert set(fn) == {"source.range", "map", "flat_map", "filter", "reduce", "transform"}
    assert fn["source.range"](2) == (2, "row 2")
    assert fn["map"](1) == 8
    assert fn["flat_map"]("to be or not") == ["to", "be", "or", "not"]
    assert [fn["filter"](w) for w in ("to", "not")] == [False, True]
    assert fn["reduce"]("pear", "apple") == "pear"
    assert fn["transform"]("df") == ("transformed", "df")
    assert ops["source.range"].config == {"start": 0, "end": 3, "step": 1, "schema": "i bigint, label string"}
    assert ops["source.range"].name == "Source: generate"


def test_example_functions_ship_by_value_to_a_process_that_cannot_import_the_job_file():
    module = load_example("wordcount")
    sys.modules[module.__name__] = module  # as a CLI that imports the job file would
    try:
        job = module.build([])
    finally:
        del sys.modules[module.__name__]
    (flat_map,) = [op for op in job.vertex("source-text").operators if op.kind == "flat_map"]
    code = (
        "import sys, cloudpickle; fn = cloudpickle.loads(sys.stdin.buffer.read()); "
        "print(fn(\"It's 4 o'clock, the Clock-maker said.\"))"
    )
    result = subprocess.run([sys.executable, "-c", code], input=flat_map.function,
                            capture_output=True, check=True, cwd="/")
    assert result.stdout.decode().strip() == "['it', 's', 'o', 'clock', 'the', 'clock', 'maker', 'said']"


def test_every_operator_config_is_json_and_collections_are_normalised():
    env = ExecutionEnvironment("json")
    rows = [("a", 1), ["b", 2], {"n": 3, "k": "c"}]
    env.from_collection(rows, schema="k string, n int").discard()
    env.from_collection(["x", "y"], schema="`the word` string").discard()
    env.from_range(2, 10, 3).discard()
    env.read_json("in.json", primitivesAsString=True, samplingRatio=0.5, mode=None).discard()
    env.read_parquet("in.parquet").write_json("out.json", compression="gzip")
    job = built(env)

    configs = [dict(op.config) for v in job.vertices for op in v.operators]
    assert json.loads(json.dumps(configs)) == configs
    assert configs[0] == {"rows": [["a", 1], ["b", 2], ["c", 3]], "schema": "k string, n int"}
    assert [c for c in configs if c.get("schema") == "`the word` string"][0]["rows"] == [["x"], ["y"]]
    assert {"start": 2, "end": 10, "step": 3} in configs
    assert {"path": os.path.abspath("in.json"), "options": {"primitivesAsString": "true", "samplingRatio": "0.5"}} in configs
    assert {"path": os.path.abspath("out.json"), "mode": "error", "options": {"compression": "gzip"}} in configs


@pytest.mark.parametrize("rows, schema, message", [
    ([(1, 2)], "a int", r"row 0 has 2 value\(s\) but the schema has 1 column"),
    ([{"a": 1, "b": 2}], "a int", r"row 0 has columns \['b'\] not in the schema"),
    ([(datetime.date(2024, 1, 1),)], "d date", "row 0 is not JSON-serialisable"),
])
def test_bad_collection_rows_are_rejected_naming_the_row(rows, schema, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ExecutionEnvironment("rows").from_collection(rows, schema=schema)


# ---- user errors ----


@pytest.mark.parametrize("call", [
    lambda s: s.map(lambda x: x),
    lambda s: s.flat_map(lambda x: [x]),
], ids=["map", "flat_map"])
def test_python_functions_without_an_output_schema_ask_for_one(call):
    env = ExecutionEnvironment("schema")
    with pytest.raises(TypeError, match=r"needs the schema of its output.*schema=\""):
        call(env.from_range(3))


@pytest.mark.parametrize("call, error, message", [
    (lambda e: e.from_range(3).join(e.from_range(3), on="id", how="cross"), ValueError, "unknown join type"),
    (lambda e: e.from_range(3).key_by(), ValueError, "one or more column names"),
    (lambda e: e.from_range(3).write_csv("out", mode="append"), ValueError, "unknown write mode"),
    (lambda e: e.from_range(3).set_parallelism(0), ValueError, "positive integer"),
    (lambda e: e.from_range(3).filter("id > 1"), TypeError, "needs a function"),
    (lambda e: e.from_range(3).union(ExecutionEnvironment("other").from_range(1)), ValueError, "different"),
    (lambda e: e.from_range(3).key_by("id").aggregate(), TypeError, "at least one SQL aggregate"),
    (lambda e: e.set_restart_strategy("fixed-delay", attemps=3), ValueError, "unknown option"),
    (lambda e: e.set_failover_strategy("partial"), ValueError, "unknown failover strategy"),
], ids=["join-type", "key_by-empty", "write-mode", "parallelism", "filter-sql", "foreign-env",
        "aggregate-empty", "restart-option", "failover"])
def test_mistakes_fail_at_the_call_that_made_them(call, error, message):
    with pytest.raises(error, match=message):
        call(ExecutionEnvironment("oops"))


# ---- job configuration ----


def test_configuration_settings_land_in_the_job_configuration():
    env = (
        ExecutionEnvironment("configured", parallelism=3)
        .set_restart_strategy("fixed-delay", attempts=2, delay="1 s")
        .set_failover_strategy("full")
        .set_slot_request_timeout(30)
        .set_option("pipeline.name", "nightly")
        .set_option("some.flag", True)
        .add_artifact("helpers.py", b"X = 1\n")
    )
    wordcount(env).collect()
    cfg = built(env).configuration

    assert cfg.restart_strategy == RestartStrategyConfig("fixed-delay", {"attempts": "2", "delay": "1 s"})
    assert cfg.failover_strategy is FailoverStrategyKind.FULL
    assert cfg.slot_request_timeout_s == 30.0
    assert cfg.options == {"pipeline.name": "nightly", "some.flag": "true"}
    assert built(env).artifacts == (Artifact("helpers.py", b"X = 1\n"),)


def test_restart_option_keywords_use_flink_suffixes_and_durations():
    env = ExecutionEnvironment("restart").set_restart_strategy(
        "failure-rate", max_failures_per_interval=3, failure_rate_interval="5 min",
        delay=datetime.timedelta(milliseconds=1500),
    )
    env.from_range(1).discard()
    cfg = built(env).configuration.restart_strategy

    assert cfg == RestartStrategyConfig("failure-rate", {
        "max-failures-per-interval": "3", "failure-rate-interval": "5 min", "delay": "1500 ms",
    })
    assert "maxFailuresPerInterval=3" in restart_strategy_from_config(cfg).describe()


def test_defaults_leave_the_cluster_in_charge():
    env = ExecutionEnvironment("defaults")
    env.from_range(1).discard()
    job = built(env)

    assert job.configuration.restart_strategy is None
    assert job.configuration.slot_request_timeout_s is None
    assert job.configuration.failover_strategy is None  # the cluster default (region) applies
    assert job.vertices[0].parallelism == 1 and job.vertices[0].slot_sharing_group == "default"


# ---- examples and packaging ----


def test_wordcount_example_builds_the_expected_graph():
    module = load_example("wordcount")
    job = module.build([])
    validate(job)
    assert [v.name for v in job.vertices] == ["Source: text -> FlatMap -> Combine (Count)", "Count -> Sink: Collect"]
    source = job.vertex("source-text").operators[0]
    assert source.config["path"].endswith("examples/data/*.txt")
    assert len(list((EXAMPLES / "data").glob("*.txt"))) >= 3

    job = module.build(["--input", "in/*.txt", "--output", "out/wc", "--parallelism", "5"])
    validate(job)
    assert [v.name for v in job.vertices] == ["Source: text -> FlatMap -> Combine (Count)", "Count -> Sink: CSV"]
    assert {v.parallelism for v in job.vertices} == {5}
    assert job.vertex("count").operators[-1].config["path"] == os.path.abspath("out/wc")


def test_join_example_builds_a_valid_graph():
    module = load_example("join")
    for args in ([], ["--orders", "o.csv", "--customers", "c.csv", "--parallelism", "3"]):
        job = module.build(args)
        validate(job)
        assert [v.id for v in job.vertices] == ["orders", "customers", "join", "aggregate"]
        assert job.vertex("aggregate").name == "Aggregate -> Sink: Collect"
        assert [job.data_set(e.data_set).producer for e in job.inputs_of("join")] == ["orders", "customers"]
        assert wiring(job.inputs_of("aggregate")[0]) == (DP.ALL_TO_ALL, PK.HASH, ("name",))


@pytest.mark.parametrize("name", ["wordcount", "join"])
def test_example_graphs_survive_the_wire(name):
    from funke.common.wire.codec import job_graph_from_proto, job_graph_to_proto

    job = load_example(name).build([])
    assert job_graph_from_proto(job_graph_to_proto(job)) == job


@pytest.mark.parametrize("name", ["wordcount", "join"])
def test_examples_say_how_to_run_them(name):
    module = load_example(name)
    assert module.__doc__ and f"funke submit examples/{name}.py" in module.__doc__


def test_importing_the_dsl_pulls_in_neither_spark_nor_the_validator():
    code = (
        "import sys, funke.common.api.dsl; "
        "print(sorted(m for m in ('pyspark', 'networkx', 'cloudpickle') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert result.stdout.strip() == "[]"


def test_relative_local_paths_become_absolute_and_uris_stay():
    env = ExecutionEnvironment("paths")
    env.read_text("data/*.txt").write_text("out/lines")
    env.read_text("hdfs://nn:8020/logs/*.log").write_text("s3a://bucket/out")
    paths = [op.config["path"] for v in env.build().vertices for op in v.operators if "path" in op.config]
    assert sorted(paths) == sorted([os.path.abspath("data/*.txt"), os.path.abspath("out/lines"),
                                    "hdfs://nn:8020/logs/*.log", "s3a://bucket/out"])


def test_combiners_only_where_they_chain_and_can_be_turned_off():
    env = ExecutionEnvironment("shared producer", parallelism=2)
    words = env.from_collection([("a",), ("b",)], "w string")
    words.key_by("w").count().discard()
    words.discard()  # the producer feeds two operators: a combiner could not chain
    assert [op.kind for op in built(env).vertex("source-collection").operators] == ["source.collection"]

    env = ExecutionEnvironment("reduce", parallelism=2)
    env.from_range(10).key_by("id").reduce(lambda a, b: a).discard()
    job = built(env)
    assert [op.kind for op in job.vertices[0].operators] == ["source.range", "reduce"]  # reduce is its own combiner
    assert job.vertices[0].operators[1].function == job.vertices[1].operators[0].function

    env = ExecutionEnvironment("off", parallelism=2).set_option("funke.combiners.enabled", "false")
    env.from_range(10).key_by("id").count().discard()
    assert [op.kind for op in built(env).vertices[1].operators] == ["count", "sink.discard"]

    env = ExecutionEnvironment("aggregate", parallelism=2)
    env.from_range(10).key_by("id").aggregate("max(id) as top").discard()
    assert [op.kind for op in built(env).vertices[0].operators] == ["source.range", "combine"]  # decided on the TaskManager


def test_keyed_per_batch_operators_chain_across_an_exchange_between_single_subtasks():
    """A HASH exchange from one subtask to one moves nothing: the count/reduce/aggregate chains to
    its producer, marked, without a combiner; at any other parallelism, or where it could not
    chain, the exchange stays."""
    env = ExecutionEnvironment("one")
    wordcount(env).write_csv("out", mode="overwrite")
    job = built(env)
    assert [v.name for v in job.vertices] == ["Source: text -> FlatMap -> Count -> Sink: CSV"] and job.edges == ()
    count = job.vertices[0].operators[2]
    assert (count.kind, count.config) == ("count", {"keys": ["word"], "elided_hash_exchange": True})

    env = ExecutionEnvironment("stream one", job_type="streaming")
    (env.read_stream.rate(10).select("value % 3 AS k", "value").key_by("k").per_batch()
        .aggregate("sum(value) AS total").key_by("k").per_batch().reduce(lambda a, b: a).discard())
    assert [[op.kind for op in v.operators] for v in built(env).vertices] == [
        ["source.rate", "select", "aggregate", "reduce", "sink.discard"]]

    kept = []
    env = ExecutionEnvironment("consumer at 2")
    wordcount(env).set_parallelism(2).discard()
    kept.append(env)
    env = ExecutionEnvironment("new chain")
    wordcount(env).start_new_chain().discard()
    kept.append(env)
    env = ExecutionEnvironment("own group")
    wordcount(env).slot_sharing_group("counts").discard()
    kept.append(env)
    env = ExecutionEnvironment("chaining off").set_option("pipeline.operator-chaining.enabled", "false")
    wordcount(env).discard()
    kept.append(env)
    env = ExecutionEnvironment("running", job_type="streaming").set_output_mode("update")
    env.read_stream.rate(10).key_by("value").count().discard()  # keyed state: per key group, behind its exchange
    kept.append(env)
    for env in kept:
        job = built(env)
        assert PK.HASH in [e.partitioner for e in job.edges], env.name
        assert not any("elided_hash_exchange" in op.config for v in job.vertices for op in v.operators), env.name


def test_graphs_the_dsl_builds_at_its_limits_pass_validation():
    """Long chains, the longest uids, non-ASCII names with their own spaces: what the DSL accepts
    the JobManager accepts."""
    env = ExecutionEnvironment("Umsatz\u00a02024 \u5e74\u3000\u5ea6")
    stream = env.from_range(10).uid("s" * 128)
    for i in range(150):
        stream = stream.filter(lambda x: True).name(f"a rather descriptive filter number {i}")
    stream.key_by("id").count().uid("c" * 128).collect()
    job = env.build()
    assert all(len(v.name) <= 1000 for v in job.vertices)
    assert "more)" in job.vertices[0].name and job.vertices[0].name.startswith("Source: range")
    with pytest.raises(ValueError, match="longer than 128"):
        env.from_range(1).uid("u" * 129)
