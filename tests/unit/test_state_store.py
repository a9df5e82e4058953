"""The keyed state store's version object (`funke.taskmanager.operators.keyedstate.store`): reads
see the batch's changes and never a removed key, commit and abort end a version, an aborted
group is read again from the files, and `funke state` reads a version as the workers do."""

from __future__ import annotations

import pyarrow as pa
import pytest

from funke.common.streaming import state
from funke.taskmanager.operators.keyedstate import store

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), (state.REMOVED_COLUMN, pa.bool_())])


@pytest.fixture(autouse=True)
def fresh_worker():
    store._loaded().clear()
    yield
    store._loaded().clear()


def at(root, version: int) -> store.StateStore:
    return store.StateStore(str(root), version, 1, SCHEMA, 100)


def test_reads_see_the_changes_and_never_a_removed_key(tmp_path):
    v = at(tmp_path, 0).load(0)
    v.put(("a",), ["a"], [1])
    v.put(("b",), ["b"], [2])
    v.commit()
    v = at(tmp_path, 1).load(0)
    assert v.get(("a",)) == (["a"], [1])
    v.remove(("a",))
    v.put(("c",), ["c"], [3])
    assert v.get(("a",)) is None and v.get(("c",)) == (["c"], [3])
    assert dict(v.items()) == {("b",): (["b"], [2]), ("c",): (["c"], [3])}
    assert v.unchanged() == [(("b",), (["b"], [2]))]
    v.fold([("a", 5), ("b", 1)], [0], lambda old, row: [(old[0] if old else 0) + row[1]])
    assert v.get(("a",)) == (["a"], [5])  # removed, then written again: a new key, not the removed one
    metrics = v.commit()
    assert (metrics.rows_total, metrics.rows_updated, metrics.rows_removed) == (3, 3, 0)
    assert dict(v.items()) == {("a",): (["a"], [5]), ("b",): (["b"], [3]), ("c",): (["c"], [3])}
    store._loaded().clear()
    assert store.load_held(str(tmp_path), 0, 2, 1).rows == dict(v.items())  # as the files say


def test_a_version_ends_once_committed_or_aborted(tmp_path):
    v = at(tmp_path, 0).load(0)
    v.put(("a",), ["a"], [1])
    v.commit()
    assert v.status == v.COMMITTED
    with pytest.raises(RuntimeError, match="committed, not updating"):
        v.put(("b",), ["b"], [2])
    w = at(tmp_path, 1).load(0)
    w.abort()
    with pytest.raises(RuntimeError, match="aborted"):
        w.commit()


def test_a_failure_in_the_rule_aborts_the_group_and_the_worker_reads_it_again_from_the_files(tmp_path):
    def batch(rows):
        table = pa.table({"k": [r[0] for r in rows] + [None], "n": [r[1] for r in rows] + [None],
                          state.KEY_GROUP_COLUMN: [0] * (len(rows) + 1),
                          store.MARKER_COLUMN: [False] * len(rows) + [True]})
        return iter(table.to_batches())

    def counting(v, rows):
        v.timers("seen", lambda held: [(0, f) for f in held])
        v.fold(rows, [0], lambda old, row: [(old[0] if old else 0) + row[1]])
        return []

    at(tmp_path, 0).each_group(batch([("a", 1)]), ["k", "n"], range(1), counting)
    held = store._loaded()[(str(tmp_path), 0)]
    assert held.version == 1 and "seen" in held.derived

    def failing(v, rows):
        counting(v, rows)
        raise ZeroDivisionError("the rule failed")

    with pytest.raises(ZeroDivisionError):
        at(tmp_path, 1).each_group(batch([("a", 1)]), ["k", "n"], range(1), failing)
    assert (str(tmp_path), 0) not in store._loaded() and not held.derived  # forgotten, lookups too
    at(tmp_path, 1).each_group(batch([("a", 2)]), ["k", "n"], range(1), counting)
    assert store._loaded()[(str(tmp_path), 0)].rows == {("a",): (["a"], [3])}


def test_funke_state_reads_every_window_of_a_key(tmp_path):
    """A window's state key is the user's key and the window's start: two open windows of one
    key are two rows (the JobManager reads a version as the workers do)."""
    from funke.common.graph.jobgraph import JobVertex, OperatorSpec
    from funke.jobmanager.streaming.state import keyed_state_table

    schema = pa.schema([("k", pa.string()), ("__funke_window_start", pa.int64()), ("__funke_partial_0", pa.int64()),
                        (state.REMOVED_COLUMN, pa.bool_())])
    v = store.StateStore(state.operator_dir(str(tmp_path), "v"), 0, 2, schema, 100).load(0)
    for start, n in ((0, 2), (10_000, 5)):
        v.put(("a", start), ["a", start], [n])
    v.commit()
    spec = OperatorSpec("window_aggregate", "w", {"keys": ["k"], "aggregations": ["count(*) AS n"], "size_ms": 10_000})
    table, matching = keyed_state_table(JobVertex("v", "w", 1, (spec,), max_parallelism=1), str(tmp_path), 1, [], 10)
    assert matching == 2
    assert [(r["k"], r["window_start"].timestamp(), r["n"]) for r in table.to_pylist()] == [("a", 0.0, 2),
                                                                                          ("a", 10.0, 5)]
