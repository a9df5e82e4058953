"""Keyed state fenced by run (issue 50, items 5 and 11): a state file's name carries the token of
the query run that wrote it, the commit log names the run that committed each batch, and a
version is read only from that run's files. What a deposed attempt writes, before or after the
batch ran again elsewhere, is never read; a version a committed batch wrote that is not there
fails the batch (never an empty state); "no state yet" comes from the commit log, not from an
empty directory. Pure rules first, then the workers' reads and writes (without Spark), then the
query run's core (the lineage in every batch and every commit entry)."""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pytest

from funke.common.graph.executiongraph import SlotId
from funke.common.graph.jobgraph import JobType, JobVertex, OperatorSpec
from funke.common.scheduling import queryrun as qr
from funke.common.streaming import checkpoint
from funke.common.streaming import microbatch as mb
from funke.common.streaming.checkpoint import CommitEntry, commit_entry_bytes, parse_commit_entry, CheckpointError
from funke.common.streaming.state import (
    LEGACY,
    LoadPlan,
    MissingState,
    OperatorLineage,
    StateLineage,
    files_to_delete,
    load_plan,
    run_token,
)
from funke.common.wire import codec
from funke.common.streaming.sources import BatchInput
from funke.taskmanager.operators import keyedstate
from funke.taskmanager.operators.keyedstate import store
from tests.conformance.graphs import ALL_TO_ALL, PIPELINED, connect, execution_graph, job_graph
from tests.unit.test_keyed_state import OUT, STATE, batch_of, forget_workers_memory
from tests.unit.test_queryrun import _batch, _of, _record

A, B, Z = "a" * 16, "b" * 16, "c" * 16  # three runs' tokens


def deltas(token: str, versions) -> list[str]:
    return [f"{v}.{token}.delta" for v in versions]


# ---------------------------------------------------------------------------- which files make a version


def test_a_version_is_read_only_from_the_files_of_the_run_that_committed_it():
    # run A committed batches 0..11 (versions 1..12); it also wrote versions 13 and 14 before it was
    # deposed, and a zombie of it wrote version 15 later still; run B ran batches 12..14 again
    names = deltas(A, range(1, 16)) + [f"10.{A}.snapshot"] + deltas(B, range(13, 16)) + [f"15.{A}.delta.9.9.tmp"]
    lineage = OperatorLineage(((0, A), (12, B)), 0)
    plan = load_plan(names, 15, lineage)
    assert plan == LoadPlan(10, (11, 12, 13, 14, 15))
    assert plan.files == (f"10.{A}.snapshot", f"11.{A}.delta", f"12.{A}.delta", f"13.{B}.delta", f"14.{B}.delta",
                          f"15.{B}.delta")
    # a snapshot of the committed run is used as it is; one of the deposed run is not
    names += [f"20.{A}.snapshot"] + deltas(B, range(16, 21))
    assert load_plan(names, 20, lineage).files[0] == f"10.{A}.snapshot"


def test_a_version_a_committed_batch_wrote_must_be_there_and_no_state_yet_comes_from_the_lineage():
    committed = OperatorLineage(((0, A),), 0)  # the operator has state since batch 0
    with pytest.raises(MissingState, match=rf"version 5 .*needs 5\.{A}\.delta, 4\.{A}\.delta, 3\.{A}\.delta and 2 "):
        load_plan([], 5, committed)  # nothing at all where committed state must be: not an empty state
    with pytest.raises(MissingState, match=rf"needs 25\.{A}\.delta.* and 3 more"):
        load_plan(deltas(A, range(1, 20)), 25, committed)  # stops looking at the snapshot that is not there
    # no committed batch wrote the operator's state: empty, whatever files a failed attempt left
    assert load_plan(deltas(A, range(1, 4)), 3, OperatorLineage(((0, A),), None)) == LoadPlan(None, ())
    # it began at batch 3: version 3 is empty, version 4 is batch 3's delta
    began = OperatorLineage(((0, A),), 3)
    assert load_plan([], 3, began) == LoadPlan(None, ())
    assert load_plan(deltas(A, [4]), 4, began) == LoadPlan(None, (4,))
    with pytest.raises(MissingState):
        load_plan([], 4, began)


def test_state_funke_0_3_0_wrote_loads_as_it_did_and_the_runs_after_it_go_on_from_it():
    legacy = [f"{v}.delta" for v in range(1, 13)] + ["10.snapshot"]
    lineage = OperatorLineage(((0, ""), (12, A)), -1)  # 0.3.0 committed batches 0..11; run A from 12
    plan = load_plan(legacy + deltas(A, [13, 14]), 14, lineage)
    assert plan == LoadPlan(10, (11, 12, 13, 14))
    assert plan.files == ("10.snapshot", "11.delta", "12.delta", f"13.{A}.delta", f"14.{A}.delta")
    assert load_plan([], 12, lineage) == LoadPlan(None, ())  # 0.3.0's rule: a group without files was empty
    with pytest.raises(MissingState):  # a version a fenced run committed is not
        load_plan(legacy, 13, lineage)
    assert load_plan(legacy, 12) == LoadPlan(10, (11, 12))  # no lineage: read as 0.3.0 read it


def test_retention_keeps_the_committed_lineage_loadable_whichever_attempt_deletes():
    # run A committed batches 0..28; its attempt of batch 29 wrote version 30 (and its snapshot)
    # and was deposed; run B ran batch 29 again
    committed = OperatorLineage(((0, A), (29, B)), 0)
    zombie = OperatorLineage(((0, A),), 0)
    names = deltas(A, range(1, 31)) + [f"{v}.{A}.snapshot" for v in (10, 20, 30)] + deltas(B, [30]) + [
        f"30.{B}.snapshot", f"3.{A}.delta.77.1.tmp"]
    for retain in (1, 5, 15):
        for who in (committed, zombie):
            gone = files_to_delete(names, 30, retain, who)
            kept = [n for n in names if n not in gone]
            for version in range(30 - retain, 31):  # the version read (29) and retain - 1 before it
                load_plan(kept, version, committed)  # raises if something it needs went
        assert files_to_delete(names, 30, retain, committed) == files_to_delete(names, 30, retain, zombie)
    # retain 1 used to count from the version written: the deposed attempt's own snapshot 30 would
    # have been the floor, and everything before it gone, version 29 (which B re-reads) included
    assert f"29.{A}.delta" not in files_to_delete(names, 30, 1, zombie)
    assert files_to_delete(names, 30, 5, committed) == sorted(deltas(A, range(1, 20)) + [f"10.{A}.snapshot",
                                                                                       f"3.{A}.delta.77.1.tmp"])


def test_the_lineage_records_each_runs_first_batch_and_each_operators_and_forgets_what_no_retained_batch_reads():
    lineage = StateLineage().with_run(0, A)
    assert lineage.operator("agg") == OperatorLineage(((0, A),), None)  # no state yet
    lineage = lineage.committed(0, ["agg"], retain=100)
    assert lineage.operators == {"agg": 0}
    lineage = lineage.committed(1, ["agg", "dedup"], retain=100)  # a vertex new to the job starts here
    assert lineage.operators == {"agg": 0, "dedup": 1}
    run_b = lineage.with_run(2, B)
    assert run_b.token(2) == A and run_b.token(3) == B and run_b.token(0) is None
    assert lineage.with_run(2, B).with_run(2, Z).runs == ((0, A), (2, Z))  # a run that committed nothing is gone
    for batch in range(2, 200):
        run_b = run_b.committed(batch, ["agg"], retain=10)
    assert run_b.runs == ((2, B),) and run_b.operators == {"agg": 0}  # 'dedup' left the job
    many = StateLineage()
    for batch in range(300):
        many = many.with_run(batch, run_token(f"run-{batch}")).committed(batch, ["agg"], retain=100)
    assert len(many.runs) == 121 and many.token(300) == run_token("run-299")  # retain + 2 snapshot intervals + 1
    assert StateLineage.from_json(json.loads(json.dumps(many.to_json()))) == many


@pytest.mark.parametrize("raw, says", [
    ([], "must be an object"),
    ({"runs": [[0, "xyz"]]}, "16 hex digits"),
    ({"runs": [[-1, A]]}, "16 hex digits"),
    ({"runs": [[True, A]]}, "16 hex digits"),
    ({"runs": [[3, A], [2, B]]}, "ascending"),
    ({"operators": {"../etc": 0}}, "invalid vertex id"),
    ({"operators": {"agg": -2}}, "integer >= -1"),
    ({"operators": []}, "must be an object"),
])
def test_a_lineage_from_a_file_or_a_request_is_checked(raw, says):
    with pytest.raises(ValueError, match=says):
        StateLineage.from_json(raw)


def test_commit_entries_and_batches_carry_the_lineage_and_old_entries_have_none():
    lineage = StateLineage(((0, ""), (5, A)), {"agg": -1, "w": 7})
    entry = CommitEntry(9, 1234, {"wm": 5}, lineage)
    assert parse_commit_entry(commit_entry_bytes(entry), 9) == entry
    # "v2": funke 0.3.0, which reads only "v1" entries, refuses the checkpoint instead of looking for
    # the state by the old file names (finding none, it would go on from an empty state)
    assert commit_entry_bytes(entry).startswith(b"v2\n") and commit_entry_bytes(CommitEntry(9, 1)).startswith(b"v1\n")
    with pytest.raises(CheckpointError, match="expected 'v1' \\(written by a newer funke"):
        checkpoint._header_and_body(commit_entry_bytes(entry), "commits/9")
    old = b'v1\n{"batchId": 3, "committedAtMs": 17}'  # as funke 0.3.0 wrote it
    assert parse_commit_entry(old, 3).state is None
    with pytest.raises(CheckpointError, match="malformed"):
        parse_commit_entry(b'v1\n{"batchId": 3, "committedAtMs": 17, "stateLineage": {"runs": "x"}}', 3)
    batch = BatchInput(9, 100, state=lineage)
    assert codec.batch_from_proto(codec.run_batch_to_proto("job", "", batch, [])).state == lineage
    assert codec.batch_from_proto(codec.run_batch_to_proto("job", "", BatchInput(9, 100), [])).state is None
    wrong = codec.run_batch_to_proto("job", "", batch, [])
    wrong.state_lineage_json = '{"runs": [[0, "zz"]]}'
    with pytest.raises(ValueError, match="state lineage does not decode"):
        codec.batch_from_proto(wrong)


# ---------------------------------------------------------------------------- in a worker


def run_batch(root, batch_id, rows, lineage: OperatorLineage, mode="complete"):
    aggregates = [("count", ("p0",)), ("avg", ("p1_sum", "p1_count"))]
    fn = keyedstate.running_aggregate_batches(str(root), ["word"], aggregates, batch_id, mode, 100, STATE, OUT,
                                              range(8), lineage)
    out = pa.Table.from_batches(list(fn(iter([batch_of(rows, range(8))]))), schema=OUT)
    return {r["word"]: (r["count"], r["mean"]) for r in out.to_pylist()}


def test_a_deposed_attempts_state_written_after_the_batch_ran_again_is_never_read(tmp_path):
    forget_workers_memory()
    run_batch(tmp_path, 0, [("a", 1)], OperatorLineage(((0, A),), None))  # run A: batch 0, committed
    committed_a = OperatorLineage(((0, A),), 0)
    rerun = OperatorLineage(((0, A), (1, B)), 0)
    # Run A's attempt of batch 1 is paused mid-batch; run B runs batch 1 again (its input was made
    # by non-deterministic code: other rows) and commits it
    run_batch(tmp_path, 1, [("a", 10), ("b", 1)], rerun)
    held_by_b = dict(store._loaded())
    # the paused attempt wakes up and writes its version 2 after B's, in a worker of its own
    forget_workers_memory()
    assert run_batch(tmp_path, 1, [("a", 99), ("z", 1)], committed_a) == {"a": (2, 50.0), "z": (1, 1.0)}
    assert len(list(tmp_path.glob(f"kg-*/2.{A}.delta"))) == 8 and len(list(tmp_path.glob(f"kg-*/2.{B}.delta"))) == 8
    expected = {"a": (3, 12 / 3), "b": (2, 1.5)}  # batch 0, B's batch 1, batch 2
    # batch 2 in the worker that holds what the zombie wrote, in a fresh one, and in B's
    for worker in (dict(store._loaded()), {}, held_by_b):
        store._loaded().clear()
        store._loaded().update(worker)
        assert run_batch(tmp_path, 2, [("a", 1), ("b", 2)], rerun) == expected


def test_state_a_committed_batch_wrote_that_this_host_cannot_see_fails_the_batch_instead_of_starting_empty(tmp_path):
    forget_workers_memory()
    host_a, host_b = tmp_path / "a", tmp_path / "b"  # one checkpoint path, two disks
    run_batch(host_a, 0, [("a", 1), ("b", 2)], OperatorLineage(((0, A),), None))
    run_batch(host_a, 1, [("a", 3)], OperatorLineage(((0, A),), 0))
    forget_workers_memory()  # the host's TaskManager is gone; the query goes on on another host
    with pytest.raises(MissingState) as missing:
        run_batch(host_b, 2, [("a", 5)], OperatorLineage(((0, A), (2, B)), 0))
    text = str(missing.value)
    assert "cannot be loaded" in text and f"2.{A}.delta" in text and "same path" in text, text
    assert not any(host_b.glob("kg-*/3.*")), "nothing of the batch was written"


def test_a_worker_without_a_lineage_reads_and_writes_files_as_funke_0_3_0_did(tmp_path):
    forget_workers_memory()
    run_batch(tmp_path, 0, [("a", 1)], LEGACY)
    assert sorted(p.name for p in tmp_path.glob("kg-*/*")) == ["1.delta"] * 8
    # a run of this version goes on from that state, and writes its own files fenced
    lineage = OperatorLineage(((0, ""), (1, A)), -1)
    forget_workers_memory()
    assert run_batch(tmp_path, 1, [("a", 3)], lineage) == {"a": (2, 2.0)}
    assert sorted({p.name for p in tmp_path.glob("kg-*/*")}) == ["1.delta", f"2.{A}.delta"]


# ---------------------------------------------------------------------------- the query run's core


def keyed_graph():
    job = job_graph("q", [
        JobVertex("src", "src", 2, (OperatorSpec("source.rate", config={}),)),
        JobVertex("sink", "sink", 1, (OperatorSpec("running_aggregate", config={"keys": ["k"]}),
                                      OperatorSpec("sink.discard"))),
    ], [connect("src", "sink", ALL_TO_ALL, PIPELINED)], JobType.STREAMING)
    graph = execution_graph(job)
    for ejv in graph.vertices.values():
        for ev in ejv.task_vertices:
            ev.current_execution.slot = SlotId(f"tm-{ev.subtask_index % 2}", 0)
    return graph


def test_every_batch_carries_the_runs_token_and_every_commit_entry_the_lineage_the_next_run_goes_on_from():
    run = qr.QueryRun(keyed_graph(), mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-1", retain=100)
    run.handle(qr.RunStarted("query-1", 0, (), {}, 500, "run-started-1"))
    entries = []
    for b in range(2):
        run.handle(qr.Tick(1000 * (b + 1), f"tick-{b}"))
        out = _batch(run, b, 1000 * (b + 1))
        states = [a.batch.state for a in _of(out, qr.RunTasks)]
        assert states == [StateLineage(((0, run_token("run-1")),), {"sink": 0} if b else {})] * 3, states
        recorded = _record(run, b, 1000 * (b + 1) + 500)
        entries += [a.entry for a in _of(out + recorded, qr.WriteCommitLog)]
    assert [e.state for e in entries] == [StateLineage(((0, run_token("run-1")),), {"sink": 0})] * 2
    # the next run (a failure restarted every task) goes on from the last entry with its own token
    second = qr.QueryRun(keyed_graph(), mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-2")
    second.handle(qr.RunStarted("query-1", 2, (), {"src": 20}, 5000, "run-started-2", last_commit=entries[-1]))
    second.handle(qr.Tick(6000, "tick-6000"))
    out = _batch(second, 2, 6000)
    state = _of(out, qr.RunTasks)[0].batch.state
    assert all(a.batch.state == state for a in _of(out, qr.RunTasks))
    assert state == StateLineage(((0, run_token("run-1")), (2, run_token("run-2"))), {"sink": 0})
    assert state.operator("sink").token(2) == run_token("run-1") and state.token(3) == run_token("run-2")
    # a checkpoint whose last entry funke 0.3.0 wrote: its files as they are, then this run's
    third = qr.QueryRun(keyed_graph(), mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-3")
    third.handle(qr.RunStarted("query-1", 2, (), {}, 5000, "run-started-3", last_commit=CommitEntry(1, 10)))
    assert third.lineage == StateLineage(((0, ""), (2, run_token("run-3"))), {"sink": -1})


# ---------------------------------------------------------------------------- reading a checkpoint alone


def test_a_checkpoint_alone_gives_the_state_after_each_committed_batch_it_keeps_and_says_what_it_lacks(tmp_path):
    from funke.common.streaming import state
    from funke.common.streaming.checkpoint import OffsetEntry
    from funke.jobmanager.checkpointstore import CheckpointStore
    from funke.jobmanager.streaming.state import NoSuchState, checkpoint_state, describe_operators
    from tests.unit.test_keyed_state import KEY, ROWS

    root = tmp_path / "checkpoint"
    store = CheckpointStore(str(root))
    store.open("a test")
    vertex = JobVertex("dedup", "first of each id", 1, (OperatorSpec("deduplicate", config={"keys": ["id"]}),),
                       max_parallelism=4)
    describe_operators(str(root), job_graph("q", [vertex], [], JobType.STREAMING))
    ops = state.operator_dir(str(root), "dedup")

    def dedup(batch_id, ids, lineage):
        fn = keyedstate.deduplicate_batches(ops, ["id"], batch_id, 100, KEY, ROWS, range(4), lineage)
        batch = pa.RecordBatch.from_arrays([
            pa.array(ids + [None] * 4, pa.int64()), pa.array(["p"] * len(ids) + [None] * 4, pa.string()),
            pa.array([i % 4 for i in ids] + list(range(4)), pa.int32()), pa.array([False] * len(ids) + [True] * 4),
        ], names=["id", "payload", state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])
        list(fn(iter([batch])))

    lineage = StateLineage().with_run(0, A)
    for b, ids in enumerate([[1, 2], [3], [2, 5]]):
        dedup(b, ids, lineage.operator("dedup"))
        store.write_offsets(OffsetEntry(b, 0))
        lineage = lineage.committed(b, ["dedup"], 100)
        store.write_commit(CommitEntry(b, 0, {}, lineage))
    dedup(3, [7], lineage.operator("dedup"))  # batch 3 ran, never committed: not shown
    dedup(2, [9], StateLineage().with_run(2, Z).operator("dedup"))  # nor what another run wrote of batch 2
    store.close()

    def ids(shown):
        return sorted(r["id"] for r in shown.table.to_pylist())

    last = checkpoint_state(str(root))
    assert (last.vertex_id, last.batch_id, ids(last), last.matching) == ("dedup", 2, [1, 2, 3, 5], 4)
    assert ids(checkpoint_state(str(root), batch_id=0)) == [1, 2]
    one = checkpoint_state(str(root), "dedup", 1, ("3",))
    assert ids(one) == [3] and one.matching == 1
    for ask, says in [
        (dict(checkpoint=str(tmp_path / "nowhere")), "is not a directory"),
        (dict(checkpoint=str(tmp_path)), "not a streaming query's checkpoint"),
        (dict(vertex_id="../dedup"), "no keyed operator '../dedup' (it has dedup)"),
        (dict(batch_id=3), "batch 3 is not a committed batch the checkpoint"),
        (dict(key=("1", "2")), "2 key values given"),
    ]:
        with pytest.raises(NoSuchState, match=re.escape(says)):
            checkpoint_state(**{"checkpoint": str(root), **ask})
    description = os.path.join(ops, state.OPERATOR_DESCRIPTION)
    with open(description, "w") as f:
        f.write('{"kind": "rm -rf", "config": {}}')
    with pytest.raises(NoSuchState, match="description in the checkpoint cannot be read"):
        checkpoint_state(str(root))
    os.remove(description)  # a checkpoint funke 0.3.0 ran last
    with pytest.raises(NoSuchState, match="has no description in the checkpoint"):
        checkpoint_state(str(root))
