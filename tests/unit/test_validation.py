"""JobGraph validation reports every problem at once, each naming its vertex, edge or data set."""

from __future__ import annotations

import pytest

from funke.common.jobgraph import (
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
from funke.common.validation import JobGraphInvalid, find_problems, validate

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
