"""JobGraph validation reports every problem at once, each naming its vertex, edge or data set."""

from __future__ import annotations

import pytest

from funke.common.graph.jobgraph import (
    DistributionPattern as DP,
    IntermediateDataSet,
    JobConfiguration,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorSpec,
    PartitionerKind as PK,
    RestartStrategyConfig,
)
from funke.common.graph.validation import JobGraphInvalid, find_problems, validate

SRC = (OperatorSpec("source.range", config={"end": 10}),)
NOOP = (OperatorSpec("noop"),)
SINK = (OperatorSpec("sink.discard"),)


def v(id, p=2, ops=NOOP, **kw):
    return JobVertex(id=id, name=id, parallelism=p, operators=ops, **kw)


def chain(*vertices, pattern=DP.ALL_TO_ALL, partitioner=PK.REBALANCE):
    data_sets, edges = [], []
    for a, b in zip(vertices, vertices[1:]):
        data_sets.append(IntermediateDataSet(f"{a.id}-out", a.id))
        edges.append(JobEdge(f"{a.id}->{b.id}", f"{a.id}-out", b.id, pattern, partitioner))
    return JobGraph("j", tuple(vertices), tuple(data_sets), tuple(edges))


def messages(job):
    return [str(p) for p in find_problems(job)]


def test_a_valid_pipeline_has_no_problems():
    validate(chain(v("src", ops=SRC), v("map"), v("sink", ops=SINK)))


def test_cycle_is_reported_with_its_path():
    job = chain(v("src", ops=SRC), v("a"), v("b"), v("c", ops=SINK))
    # close a loop b -> a, and a self-loop on c
    job = JobGraph("j", job.vertices[:3] + (v("c"),),
                   job.data_sets + (IntermediateDataSet("b-back", "b"),),
                   job.edges + (JobEdge("b->a", "b-back", "a", input_index=1),))
    msgs = messages(job)
    cycle = [m for m in msgs if m.startswith("job: cycle:")]
    assert len(cycle) == 1
    path = cycle[0].removeprefix("job: cycle: ").split(" -> ")
    assert path[0] == path[-1] and set(path) == {"a", "b"}


def test_every_problem_is_listed_at_once():
    job = JobGraph(
        "bad",
        vertices=(
            v("src", ops=SRC),
            v("src", ops=SRC),  # duplicate id
            v("zero", p=0),  # parallelism < 1
            v("huge", p=300, max_parallelism=200),  # parallelism > max parallelism
            v("orphan"),  # not a source, no inputs
        ),
        data_sets=(IntermediateDataSet("d1", "src"), IntermediateDataSet("d2", "ghost")),
        edges=(
            JobEdge("e1", "d1", "zero", DP.POINTWISE, PK.FORWARD),  # forward across parallelism 2 -> 0
            JobEdge("e2", "d2", "huge"),  # data set of unknown vertex
            JobEdge("e3", "nope", "nobody"),  # unknown data set and vertex
        ),
    )
    with pytest.raises(JobGraphInvalid) as err:
        validate(job)
    msgs = [str(p) for p in err.value.problems]
    expected_fragments = [
        "vertex 'src': id is used 2 times",
        "vertex 'zero': parallelism 0 is less than 1",
        "vertex 'huge': parallelism 300 exceeds max parallelism 200",
        "data set 'd2': produced by unknown vertex 'ghost'",
        "edge 'e3': consumes unknown data set 'nope'",
        "edge 'e3': leads to unknown vertex 'nobody'",
        "edge 'e1': FORWARD partitioning cannot map parallelism 2 of 'src' onto parallelism 0 of 'zero'",
        "vertex 'orphan': has no path from a source",
    ]
    for fragment in expected_fragments:
        assert any(fragment in m for m in msgs), f"missing {fragment!r} in {msgs}"
    assert str(err.value).startswith(f"job graph has {len(msgs)} problem(s):")


def test_forward_needs_equal_parallelism_and_pointwise():
    job = chain(v("src", p=4, ops=SRC), v("sink", p=3, ops=SINK), pattern=DP.POINTWISE, partitioner=PK.FORWARD)
    assert any("FORWARD partitioning cannot map parallelism 4" in m for m in messages(job))
    job = chain(v("src", p=4, ops=SRC), v("sink", p=4, ops=SINK), pattern=DP.ALL_TO_ALL, partitioner=PK.FORWARD)
    assert any("FORWARD partitioning needs a POINTWISE edge" in m for m in messages(job))


def test_pointwise_rebalance_rescales_between_any_parallelisms():
    validate(chain(v("src", p=4, ops=SRC), v("sink", p=3, ops=SINK), pattern=DP.POINTWISE, partitioner=PK.REBALANCE))


def test_hash_needs_keys_and_all_to_all():
    job = chain(v("src", ops=SRC), v("sink", ops=SINK), pattern=DP.POINTWISE, partitioner=PK.HASH)
    msgs = messages(job)
    assert any("HASH partitioning needs at least one key" in m for m in msgs)
    assert any("HASH partitioning needs an ALL_TO_ALL edge" in m for m in msgs)


def test_co_location_members_need_equal_parallelism_and_slot_sharing_group():
    job = chain(
        v("src", p=2, ops=SRC, co_location_group="it"),
        v("sink", p=3, ops=SINK, co_location_group="it", slot_sharing_group="other"),
    )
    msgs = messages(job)
    assert any("co-location group 'it': members have different parallelism ('src'=2, 'sink'=3)" in m for m in msgs)
    assert any("co-location group 'it': members are in different slot-sharing groups" in m for m in msgs)


def test_operator_chains_are_checked_against_the_catalogue():
    job = chain(
        v("src", ops=(OperatorSpec("source.range", config={"end": 1}), OperatorSpec("source.text", config={"path": "x"}))),
        v("mid", ops=(OperatorSpec("teleport"), OperatorSpec("map"), OperatorSpec("sink.print"), OperatorSpec("noop"))),
        v("sink", ops=SINK),
    )
    msgs = messages(job)
    for fragment in [
        "vertex 'src': operator 1 'source.text': a source can only head a chain",
        "vertex 'mid': operator 0 'teleport' has unknown kind 'teleport'",
        "vertex 'mid': operator 1 'map' (map) is missing config schema",
        "vertex 'mid': operator 1 'map' (map) needs a function",
        "vertex 'mid': operator 2 'sink.print': a sink can only end a chain",
    ]:
        assert any(fragment in m for m in msgs), f"missing {fragment!r} in {msgs}"


def test_an_elided_exchange_holds_only_behind_a_producer_at_parallelism_1():
    count = OperatorSpec("count", config={"keys": ["k"], "elided_hash_exchange": True})
    assert messages(chain(v("one", p=1, ops=(SRC[0], count, SINK[0])))) == []
    msgs = messages(chain(
        v("two", p=2, ops=(SRC[0], count, SINK[0])),
        v("head", p=1, ops=(count, SINK[0])),
        v("odd", p=1, ops=(OperatorSpec("count", config={"keys": ["k"], "elided_hash_exchange": "yes"}), SINK[0])),
        partitioner=PK.HASH))
    for fragment in [
        "vertex 'two': operator 1 'count' (count): config 'elided_hash_exchange' holds only at parallelism 1 "
        "(the vertex has 2)",
        "vertex 'head': operator 0 'count' (count): config 'elided_hash_exchange' marks an operator chained",
        "vertex 'odd': operator 0 'count' (count): config 'elided_hash_exchange' must be true, got 'yes'",
    ]:
        assert any(fragment in m for m in msgs), f"missing {fragment!r} in {msgs}"
    other = OperatorSpec("map", config={"schema": "k int", "elided_hash_exchange": True}, function=b"f")
    assert any("unknown config key 'elided_hash_exchange'" in m for m in messages(chain(v("m", p=1, ops=(SRC[0], other)))))


def test_join_needs_two_inputs_and_a_source_none():
    src = v("src", ops=SRC)
    join = v("join", ops=(OperatorSpec("join", config={"on": ["k"]}),))
    job = chain(src, join)
    assert any("'join' (join) takes 2 input(s), has 1" in m for m in messages(job))


def test_data_set_needs_exactly_one_consumer():
    job = chain(v("src", ops=SRC), v("sink", ops=SINK))
    job = JobGraph("j", job.vertices, job.data_sets + (IntermediateDataSet("unused", "src"),), job.edges)
    assert any("data set 'unused': is produced but never consumed" in m for m in messages(job))


def test_bad_restart_strategy_is_a_problem():
    job = chain(v("src", ops=SRC), v("sink", ops=SINK))
    job = JobGraph("j", job.vertices, job.data_sets, job.edges,
                   configuration=JobConfiguration(restart_strategy=RestartStrategyConfig("sometimes")))
    assert any(m.startswith("job configuration:") and "sometimes" in m for m in messages(job))


def test_file_sinks_writing_into_the_same_or_a_nested_directory_are_a_problem():
    def csv(path):
        return (OperatorSpec("sink.csv", config={"path": path}),)

    src = v("src", ops=SRC)
    a, b, c, d = v("a", ops=csv("/out/counts")), v("b", ops=csv("/out/counts/")), v("c", ops=csv("/out/counts/x")), \
        v("d", ops=csv("/out/counts2"))
    data_sets = [IntermediateDataSet(f"src-{n}", "src") for n in "abcd"]
    edges = [JobEdge(f"src->{n}", f"src-{n}", n, DP.ALL_TO_ALL, PK.REBALANCE) for n in "abcd"]
    msgs = messages(JobGraph("j", (src, a, b, c, d), tuple(data_sets), tuple(edges)))
    overlaps = [m for m in msgs if "overlaps" in m]
    assert len(overlaps) == 3, msgs  # a~b, a~c, b~c; d is a sibling, not nested
    assert any(m.startswith("vertex 'c'") and "/out/counts/x" in m and "vertex 'a'" in m for m in overlaps), overlaps


# ---------------------------------------------------------------------------------------------
# Hostile input: every field is checked (issue: ids into paths, empty sink paths, non-finite
# numbers, unbounded fields)
# ---------------------------------------------------------------------------------------------

from funke.common.graph.jobgraph import Artifact  # noqa: E402
from funke.common.graph.validation import (  # noqa: E402
    MAX_LISTING_CHARS,
    ValidationContext,
    describe_problems,
)


def csv_job(path: object = "/out/counts", mode: object = "error", **sink_config) -> JobGraph:
    src = v("src", ops=(OperatorSpec("source.text", config={"path": "/in/*.txt"}),))
    sink = v("sink", ops=(OperatorSpec("sink.csv", config={"path": path, "mode": mode, **sink_config}),))
    return chain(src, sink)


def with_ids(job_id="", vertex="src", data_set="src-out", edge="src->sink"):
    src = v(vertex, ops=SRC)
    sink = v("sink", ops=SINK)
    return JobGraph("j", (src, sink), (IntermediateDataSet(data_set, vertex),),
                    (JobEdge(edge, data_set, "sink"),), job_id=job_id)


@pytest.mark.parametrize("bad", ["..", "../..", "a/b", "a\\b", "a\x00b", "new\nline", "tab\tbed", ".x", "x" * 201])
def test_ids_that_would_leave_a_path_are_problems(bad):
    assert any(m.startswith("job:") and "job id" in m for m in messages(with_ids(job_id=bad)))
    assert any(m.startswith("vertex ") and ("may only contain" in m or "longer than" in m)
               for m in messages(with_ids(vertex=bad)))
    assert any(m.startswith("data set ") and ("may only contain" in m or "longer than" in m)
               for m in messages(with_ids(data_set=bad)))
    assert "longer than 64" in " ".join(messages(with_ids(job_id="j" * 65)))


def test_edge_ids_may_read_like_the_dsl_writes_them_but_not_hold_control_characters():
    assert messages(with_ids(edge="src->sink#1")) == []
    assert any(m.startswith("edge ") and "control characters" in m for m in messages(with_ids(edge="a\nb")))


@pytest.mark.parametrize("path, fragment", [
    ("", "is empty"), ("   ", "is empty"), ("/out/x\x00y", "control characters"), ("out/counts", "is relative"),
    ("/", "filesystem root"), ("/out/../..", "normal form"), ("/out//x", "normal form"), (7, "must be a path string"),
    (["/a", "/b"], "must be a path string"), (None, "must be a path string"), ("hdfs://nn/", "filesystem root"),
])
def test_sink_paths_must_be_absolute_normal_and_not_a_root(path, fragment):
    msgs = messages(csv_job(path))
    assert any("config 'path'" in m and fragment in m for m in msgs), msgs


@pytest.mark.parametrize("path", [7, [], ["/a"], None, "", "relative/*.txt", {"p": 1}])
def test_source_paths_must_be_one_absolute_path_or_uri(path):
    src = v("src", ops=(OperatorSpec("source.text", config={"path": path}),))
    assert any("config 'path'" in m for m in messages(chain(src, v("sink", ops=SINK))))


def test_globs_and_uris_are_fine_sources():
    for path in ("/in/*.txt", "hdfs://nn/in/part-*", "file:///in/x", "s3a://bucket/key/"):
        src = v("src", ops=(OperatorSpec("source.text", config={"path": path}),))
        assert messages(chain(src, v("sink", ops=SINK))) == [], path


@pytest.mark.parametrize("mode", ["append", "", "OVERWRITE", None, 1])
def test_sink_modes_other_than_error_and_overwrite_are_problems(mode):
    assert any("config 'mode'" in m for m in messages(csv_job(mode=mode)))


def test_a_sink_may_not_write_into_over_or_around_the_data_directory():
    context = ValidationContext(data_dir="/srv/funke/data")
    for target in ("/srv/funke/data", "/srv/funke/data/jobs/x", "/srv/funke", "/srv", "file:///srv/funke/data/x"):
        assert any("data directory" in m for m in messages_in(csv_job(target), context)), target
    assert not any("data directory" in m for m in messages_in(csv_job("/srv/funke/out"), context))


def test_allowed_paths_confine_sources_and_sinks():
    context = ValidationContext(allowed_paths=("/sandbox/in", "/sandbox/out"))
    assert messages_in(chain(v("src", ops=(OperatorSpec("source.text", config={"path": "/sandbox/in/*.txt"}),)),
                             v("sink", ops=(OperatorSpec("sink.csv", config={"path": "/sandbox/out/x"}),))),
                       context) == []
    msgs = messages_in(csv_job("/sandbox/outside"), context)
    assert any("funke.io.allowed-paths" in m and "/sandbox/outside" in m for m in msgs)
    assert any("funke.io.allowed-paths" in m and "/in/*.txt" in m for m in msgs)  # the source too


def messages_in(job, context):
    return [str(p) for p in find_problems(job, context)]


def test_non_finite_numbers_and_out_of_range_integers_are_problems():
    for config in ({"end": float("inf")}, {"end": float("nan")}, {"end": 2**63}, {"end": True}, {"end": "10"},
                   {"end": 10, "step": 0}):
        src = v("src", ops=(OperatorSpec("source.range", config=config),))
        assert messages(chain(src, v("sink", ops=SINK))), config
    src = v("src", ops=(OperatorSpec("source.range", config={"end": 10, "start": -(2**63)}),))
    assert messages(chain(src, v("sink", ops=SINK))) == []


def test_unknown_config_keys_and_functions_where_none_is_taken_are_problems():
    src = v("src", ops=(OperatorSpec("source.range", config={"end": 1, "ned": 2}),))
    sel = v("sel", ops=(OperatorSpec("select", config={"exprs": ["a"]}, function=b"not for select"),))
    msgs = messages(chain(src, sel, v("sink", ops=SINK)))
    assert any("unknown config key 'ned'" in m for m in msgs)
    assert any("(select) takes no function" in m for m in msgs)


def test_a_nan_slot_request_timeout_and_an_attempts_count_beyond_32_bits_are_problems():
    base = chain(v("src", ops=SRC), v("sink", ops=SINK))
    for timeout in (float("nan"), float("inf"), -1.0, 0.0, 1e12):
        job = JobGraph("j", base.vertices, base.data_sets, base.edges,
                       configuration=JobConfiguration(slot_request_timeout_s=timeout))
        assert any("slot request timeout" in m for m in messages(job)), timeout
    job = JobGraph("j", base.vertices, base.data_sets, base.edges, configuration=JobConfiguration(
        restart_strategy=RestartStrategyConfig("fixed-delay", {"attempts": str(10**23)})))
    assert any("does not fit in 32 bits" in m for m in messages(job))


def test_artifacts_need_unique_plain_names_and_bounded_content():
    base = chain(v("src", ops=SRC), v("sink", ops=SINK))
    job = JobGraph("j", base.vertices, base.data_sets, base.edges, artifacts=(
        Artifact("lib.zip", b"x"), Artifact("lib.zip", b"y"), Artifact("", b""), Artifact("../evil.py", b""),
        Artifact("ok.txt", b"", uri="relative/uri")))
    msgs = messages(job)
    for fragment in ("artifact 'lib.zip': name is used 2 times", "artifact '': name is empty",
                     "artifact '../evil.py': name '../evil.py' may only contain", "artifact 'ok.txt': uri"):
        assert any(fragment in m for m in msgs), (fragment, msgs)


def test_huge_fields_are_refused_and_quoted_short():
    huge = "x" * (1 << 20)
    base = chain(v("src", ops=SRC), v("sink", ops=SINK))
    job = JobGraph(huge, base.vertices, base.data_sets, base.edges, job_id=huge,
                   configuration=JobConfiguration(options={huge: "v", "k": huge}))
    msgs = messages(job)
    assert len(msgs) >= 3
    assert all(len(m) < 400 for m in msgs), [len(m) for m in msgs]


def test_a_job_too_big_for_the_cluster_is_a_problem_that_names_the_limit():
    job = chain(v("src", p=30000, ops=SRC, max_parallelism=30000), v("sink", p=30000, ops=SINK, max_parallelism=30000))
    assert any("60,000 subtasks" in m and "funke.job.max-subtasks" in m
               for m in messages_in(job, ValidationContext(max_subtasks=50_000)))
    fat = (OperatorSpec("source.range", config={"end": 1}, function=b"f" * (2 * 1024 * 1024)),
           OperatorSpec("map", config={"schema": "x int"}, function=b"g"))
    assert any("would ship" in m for m in messages(chain(v("src", p=1000, ops=fat), v("sink", p=1, ops=SINK))))


def test_thousands_of_problems_make_a_message_grpc_can_carry():
    vertices = tuple(v(f"v{i}", p=0) for i in range(900))
    problems = find_problems(JobGraph("j", vertices))
    assert len(problems) > 1000
    message = describe_problems(problems)
    assert len(message) < MAX_LISTING_CHARS + 200
    assert message.startswith(f"job graph has {len(problems)} problem(s):") and "more problem(s)" in message


def test_with_allowed_paths_a_source_cannot_reach_out_through_braces_dots_or_escapes():
    """Hadoop expands {a,b} (which may hold '/') before it resolves '..': textual normalisation
    cannot follow that, so such locations are refused under an allow-list."""
    context = ValidationContext(allowed_paths=("/sandbox/in",))
    for path in ("/sandbox/in/{./x,.}./{./y,.}./secret/passwd.txt", "/sandbox/in/../secret", "/sandbox/in/./x",
                 "/sandbox/in/a\\\\{b}"):
        src = v("src", ops=(OperatorSpec("source.text", config={"path": path}),))
        assert any("funke.io.allowed-paths does not allow" in m for m in messages_in(chain(src, v("sink", ops=SINK)), context)), path
    for path in ("/sandbox/in/*.txt", "/sandbox/in/[ab]*/part-?.csv"):
        src = v("src", ops=(OperatorSpec("source.text", config={"path": path}),))
        assert messages_in(chain(src, v("sink", ops=SINK)), context) == [], path


def test_a_source_may_not_read_the_data_directory():
    context = ValidationContext(data_dir="/srv/funke/data")
    src = v("src", ops=(OperatorSpec("source.parquet", config={"path": "/srv/funke/data/jobs/other/collect/sink"}),))
    assert any("holds other jobs' data" in m for m in messages_in(chain(src, v("sink", ops=SINK)), context))


@pytest.mark.parametrize("value, ok", [("0", True), ("8388608", True), (str(1 << 30), True), ("", False),
                                       ("-1", False), ("1e6", False), ("8 MiB", False), (str((1 << 30) + 1), False),
                                       ("٣", False)])
def test_the_in_memory_exchange_limit_is_a_whole_number_of_bytes(value, ok):
    from funke.common.graph.jobgraph import EXCHANGE_IN_MEMORY_MAX_BYTES, exchange_in_memory_max_bytes

    base = chain(v("src", ops=SRC), v("sink", ops=SINK))
    job = JobGraph("j", base.vertices, base.data_sets, base.edges,
                   configuration=JobConfiguration(options={EXCHANGE_IN_MEMORY_MAX_BYTES: value}))
    problems = [m for m in messages(job) if EXCHANGE_IN_MEMORY_MAX_BYTES in m]
    if ok:
        assert problems == [] and exchange_in_memory_max_bytes({EXCHANGE_IN_MEMORY_MAX_BYTES: value}) == int(value)
    else:
        assert len(problems) == 1 and "whole number of bytes from 0 to 1073741824" in problems[0], problems
    assert exchange_in_memory_max_bytes({}) == 8 * 1024 * 1024  # unset: the default
