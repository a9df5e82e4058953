"""A task's exchanges (funke.taskmanager.exchange) on a real local SparkSession: producers write their
partitions (in memory or by Spark's writer), each row routed to its consumer's subpartition, and
consumers read their subpartition of every partition, however it was written. Tasks run hand-built
TaskDeployments (tests/unit/test_task_runtime.py's helpers); the routing columns alone are
tests/unit/test_routing.py's."""

from __future__ import annotations

import collections
import datetime
import random
import sys
from pathlib import Path

import cloudpickle
import pytest

from funke.common import layout
from funke.common.graph.jobgraph import EXCHANGE_IN_MEMORY_MAX_BYTES
from tests.unit.test_task_runtime import (
    BROADCAST,
    HASH,
    REBALANCE,
    collected,
    deploy,
    finished,
    gate,
    op,
    output,
    partition_rows,
    run,
    written_by,
)
from tests.unit.test_task_runtime import spark  # noqa: F401  (fixtures)

# The functions below are shipped to Python workers; by value, so workers need not import tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---- (a) a two-stage word count ----


def split_words(line):
    return line.split()


def write_corpus(directory: Path, files: int, lines: int, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(150)] + ["flink", "spark", "ünïcode"]
    counts: collections.Counter = collections.Counter()
    directory.mkdir()
    for f in range(files):
        text = []
        for _ in range(lines):
            words = [rng.choice(vocabulary) for _ in range(rng.randint(0, 12))]
            counts.update(words)
            text.append(" ".join(words))
        (directory / f"part-{f}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return counts


def run_word_count(spark, data_dir: Path, corpus: Path, sources: int = 2, counters: int = 2, options=None,
                   precount: bool = False):
    """source.text + flat_map --HASH(word)--> count + sink.collect; with `precount`, as the
    README's word count: source.text + flat_map + count --HASH(word)--> sum of the counts +
    sink.collect. Returns word -> count per counter subtask, and the rows exchanged."""
    source_ops = [op("source.text", path=str(corpus)), op("flat_map", split_words, schema="word string")]
    if precount:
        source_ops.append(op("count", keys=["word"]))
    schemas = set()
    total_rows = lines_read = 0
    for i in range(sources):
        reports = run(deploy(data_dir, source_ops, vertex="tokenize", subtask=i, parallelism=sources,
                             outputs=[output("words", i, counters, HASH, ["word"])], options=options), spark)
        produced = finished(reports)
        assert [(p.data_set_id, p.partition_index) for p in produced] == [("words", i)]
        schemas.add(produced[0].schema)
        total_rows += produced[0].row_count
        # what it wrote, as reported for the metrics: its rows, and the bytes of its partition;
        # what it read: its source's records, the lines of its files
        io = reports.io[-1]
        assert io.records_out == produced[0].row_count and io.seconds > 0
        assert (io.bytes_out > 0) == (produced[0].row_count > 0) and io.bytes_in == 0
        lines_read += io.records_in
    assert lines_read == sum(len(f.read_text(encoding="utf-8").splitlines()) for f in corpus.iterdir())
    (schema,) = schemas
    count_ops = [op("aggregate", keys=["word"], aggregations=["sum(`count`) as `count`"]) if precount
                 else op("count", keys=["word"]), op("sink.collect")]
    per_subtask = []
    records_in = 0
    for i in range(counters):
        reports = run(deploy(data_dir, count_ops, vertex="count", subtask=i, parallelism=counters,
                             inputs=[gate("words", range(sources), subpartition=i, schema=schema)], options=options),
                      spark)
        finished(reports)
        per_subtask.append({r["word"]: r["count"] for r in collected(data_dir, "count", i)})
        # rows read: its own subpartition of every producer's partition, from the Parquet footers
        records_in += reports.io[-1].records_in
        assert reports.io[-1].records_out == len(per_subtask[-1])  # the rows its sink wrote
    assert records_in == total_rows  # every row went to exactly one counter, and was counted once
    return per_subtask, total_rows


@pytest.mark.parametrize("limit, precount, writer", [
    (None, True, "memory"),  # counted per word before the exchange: a small output, by Spark's estimate
    ("0", True, "spark"),    # unless the job's limit is 0
    (None, False, "spark"),  # flat_map's words themselves: more rows than Spark's estimate foresees
])
def test_two_stage_word_count_matches_counter_exactly(spark, tmp_path, limit, precount, writer):
    # A small output is collected and written by the task itself; either way the counts and the
    # metrics are the same.
    expected = write_corpus(tmp_path / "corpus", files=3, lines=400, seed=7)
    options = {EXCHANGE_IN_MEMORY_MAX_BYTES: limit} if limit is not None else None
    per_subtask, total_rows = run_word_count(spark, tmp_path / "data", tmp_path / "corpus", options=options,
                                             precount=precount)
    for i in range(2):
        assert written_by(layout.partition_dir(str(tmp_path / "data"), "job1", "words", i, 0)) == writer
    # HASH routing: every word is counted by exactly one subtask, and both got some.
    assert all(per_subtask) and not set(per_subtask[0]) & set(per_subtask[1])
    merged = collections.Counter()
    for counts in per_subtask:
        merged.update(counts)
    assert merged == expected
    if precount:  # a row per word and producer subtask
        assert len(expected) <= total_rows < sum(expected.values())
    else:  # a row per word in the text
        assert total_rows == sum(expected.values())


# ---- (b) empty shares, empty subpartitions, unsplit partitions ----


def test_empty_file_share_and_empty_subpartition_still_work(spark, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "only.txt").write_text("same same\nsame\n")
    # one file for two source subtasks: subtask 1 reads nothing; one word: one subpartition empty
    per_subtask, total_rows = run_word_count(spark, tmp_path / "data", corpus)
    assert sorted(per_subtask, key=len) == [{}, {"same": 3}]
    assert total_rows == 3


def test_a_partition_written_unsplit_is_subpartition_zero(spark, tmp_path):
    # POINTWISE 2 -> 3: producer 1 feeds only consumer 2, so it writes one unsplit partition,
    # while consumer 2's gate still names subpartition 0 of it.
    rows = op("source.collection", rows=[[1], [2], [3], [4]], schema="n int")  # subtask 1 of 2: 3, 4
    produced = finished(run(deploy(tmp_path, [rows], vertex="p", subtask=1, parallelism=2,
                                   outputs=[output("ds", 1, 1, REBALANCE)]), spark))
    finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", subtask=2, parallelism=3,
                        inputs=[gate("ds", range(1, 2), subpartition=0, schema=produced[0].schema)]), spark))
    assert sorted(r["n"] for r in collected(tmp_path, "c", 2)) == [3, 4]


def k_and_v(n):
    return (n % 3, n)


@pytest.mark.parametrize("source, writer", [
    # rows from the driver of plain types: handed to Spark as Arrow, which Spark sizes: small
    (op("source.collection", rows=[[k % 3, k] for k in range(12)], schema="k int, v int"), "memory"),
    # with a date column: handed over as Python objects, which Spark cannot size: its writer
    (op("source.collection", rows=[[k % 3, k, "2024-01-02"] for k in range(12)], schema="k int, v int, d date"),
     "spark"),
    # a range of 12: Spark knows it is small, so the task collects and writes it
    (op("source.range", k_and_v, end=12, schema="k bigint, v bigint"), "memory"),
])
def test_several_outputs_are_routed_by_their_own_partitioner(spark, tmp_path, source, writer):
    rows = source
    produced = finished(run(deploy(tmp_path, [rows], outputs=[
        output("hashed", 0, 2, HASH, ["k"]), output("spread", 0, 2, REBALANCE), output("everyone", 0, 1, BROADCAST),
    ]), spark))
    assert [(p.data_set_id, p.row_count) for p in produced] == [("hashed", 12), ("spread", 12), ("everyone", 12)]
    assert len({p.schema for p in produced}) == 1
    hashed = partition_rows(tmp_path, "hashed", 0)
    assert sorted(r["v"] for r in hashed) == list(range(12))
    sub_of_key = {}
    for r in hashed:
        assert sub_of_key.setdefault(r["k"], r["_sub"]) == r["_sub"]  # one key, one subpartition
    spread = partition_rows(tmp_path, "spread", 0)
    assert sorted(r["v"] for r in spread) == list(range(12))
    assert {r["_sub"] for r in spread} == {0, 1}
    assert sorted(r["v"] for r in partition_rows(tmp_path, "everyone", 0)) == list(range(12))
    assert "_sub" not in partition_rows(tmp_path, "everyone", 0)[0]
    for data_set in ("hashed", "spread", "everyone"):
        assert written_by(layout.partition_dir(str(tmp_path), "job1", data_set, 0, 0)) == writer


def k_v_and_day(n):
    return (n % 3, n, datetime.date(2024, 1, 2))


def hundredfold(n):
    return [(n % 3, n * 100 + i) for i in range(100)]


@pytest.mark.parametrize("chain, writer", [
    # a function that multiplies its rows, whose output Spark estimates at its input's size
    ([op("source.range", end=12), op("flat_map", hundredfold, schema="k bigint, v bigint")], "spark"),
    # the same, then a row per key: the output is no larger than the keys
    ([op("source.range", end=12), op("flat_map", hundredfold, schema="k bigint, v bigint"),
      op("combine", keys=["k"], aggregations=["count(1) as n"])], "memory"),
    # a generator in SQL, which Spark also estimates at its input's size
    ([op("source.range", end=12), op("select", exprs=["id % 3 as k", "explode(sequence(1, 100)) as v"])], "spark"),
])
def test_an_output_that_may_have_more_rows_than_spark_foresees_is_not_collected(spark, tmp_path, chain, writer):
    produced = finished(run(deploy(tmp_path, chain, outputs=[output("ds", 0, 2, HASH, ["k"])]), spark))
    assert written_by(layout.partition_dir(str(tmp_path), "job1", "ds", 0, 0)) == writer
    rows = partition_rows(tmp_path, "ds", 0)
    assert len(rows) == produced[0].row_count == (3 if writer == "memory" else 1200)


def test_a_consumer_reads_partitions_written_either_way_together(spark, tmp_path):
    # producer 0's output is small by Spark's estimate (a range), producer 1's is not (rows from
    # the driver with a date column): its consumers read the one's files and the other's
    # directories as one input
    small = op("source.range", k_v_and_day, end=40, schema="k bigint, v bigint, d date")
    unknown = op("source.collection", rows=[[k % 3, k, "2024-01-02"] for k in range(40, 60)],
                 schema="k bigint, v bigint, d date")
    schemas = set()
    for i, source in enumerate((small, unknown)):
        produced = finished(run(deploy(tmp_path, [source], vertex=f"p{i}",  # each source's whole share
                                       outputs=[output("ds", i, 2, HASH, ["k"])]), spark))
        schemas.add(produced[0].schema)
    assert [written_by(layout.partition_dir(str(tmp_path), "job1", "ds", i, 0)) for i in range(2)] == ["memory", "spark"]
    (schema,) = schemas
    seen, keys = [], []
    for c in range(2):
        reports = run(deploy(tmp_path, [op("sink.collect")], vertex="c", subtask=c, parallelism=2,
                             inputs=[gate("ds", range(2), subpartition=c, schema=schema)]), spark)
        finished(reports)
        rows = collected(tmp_path, "c", c)
        assert reports.io[-1].records_in == len(rows)  # its subpartition of both, from the footers
        seen += [(r["k"], r["v"]) for r in rows]
        keys.append({r["k"] for r in rows})
    assert sorted(seen) == sorted((k % 3, k) for k in range(60))  # every row once
    assert not keys[0] & keys[1]  # both producers route a key to the same consumer


def test_a_consumer_reads_the_same_rows_in_the_same_order_from_memory_and_from_the_files(spark, tmp_path, monkeypatch):
    # A restarted consumer (another TaskManager, or this one after a restart) reads the files its
    # first attempt read from memory: what it computes, and so a sink's bytes, must not change.
    from funke.taskmanager import batchexchange

    sizes = (5, 300, 40)  # Spark's reader would take the files largest first
    for i, n in enumerate(sizes):
        produced = finished(run(deploy(tmp_path, [op("source.range", k_and_v, end=n, schema="k bigint, v bigint")],
                                       vertex=f"p{i}", outputs=[output("ds", i, 1)]), spark))
        assert written_by(layout.partition_dir(str(tmp_path), "job1", "ds", i, 0)) == "memory"

    def consume(attempt: int) -> list[tuple[int, int]]:
        finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", attempt=attempt,
                            inputs=[gate("ds", range(3), subpartition=0, schema=produced[0].schema)]), spark))
        return [(r["k"], r["v"]) for r in collected(tmp_path, "c", 0, attempt=attempt)]

    from_memory = consume(0)
    monkeypatch.setattr(batchexchange, "_LOCAL", batchexchange._LocalPartitions())  # a process that wrote none
    assert batchexchange.local_table([layout.partition_dir(str(tmp_path), "job1", "ds", 0, 0) + "/sub-0.parquet"]) is None
    from_files = consume(1)
    assert from_files == from_memory
    assert sorted(from_memory) == sorted(k_and_v(n) for size in sizes for n in range(size))


def test_rows_after_producers_that_had_none_for_a_consumer_are_not_lost(spark, tmp_path, monkeypatch):
    # PySpark's createDataFrame drops the rows that follow empty Arrow record batches: the
    # subpartitions of producers that had no rows for this consumer must not hide the others'.
    from funke.taskmanager import batchexchange

    for i, n in enumerate((0, 0, 3, 0, 2)):
        produced = finished(run(deploy(tmp_path, [op("source.range", k_and_v, end=n, schema="k bigint, v bigint")],
                                       vertex=f"p{i}", outputs=[output("ds", i, 1)]), spark))
    for attempt, local in enumerate((True, False)):
        if not local:
            monkeypatch.setattr(batchexchange, "_LOCAL", batchexchange._LocalPartitions())
        finished(run(deploy(tmp_path, [op("sink.collect")], vertex="c", attempt=attempt,
                            inputs=[gate("ds", range(5), subpartition=0, schema=produced[0].schema)]), spark))
        assert sorted((r["k"], r["v"]) for r in collected(tmp_path, "c", 0, attempt=attempt)) == \
            sorted([k_and_v(n) for n in range(3)] + [k_and_v(n) for n in range(2)]), f"local: {local}"
