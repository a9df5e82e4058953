"""Key-group routing's Spark columns (funke.taskmanager.routing) against the pure arithmetic they stand
for (funke.common.streaming.keygroups), on a real local SparkSession: the exchange into a keyed
operator must send each row to the subtask whose key groups hold its state, for every key and at
every parallelism a query may be rescaled to."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

from funke.common.graph.deployment import ResultPartitionSpec
from funke.common.graph.jobgraph import PartitionerKind, ResultPartitionType
from funke.common.streaming.keygroups import key_group_of, key_group_range, subpartition_of
from funke.taskmanager.routing import key_group_column, key_hash_column, subpartition_column
from tests.unit.test_task_runtime import spark  # noqa: F401  (fixture)

# (max parallelism, parallelism): Flink's default 128 at several parallelisms, as many subtasks as
# groups, a parallelism that does not divide the groups, and Flink's largest max parallelism.
KEYED = [(128, 1), (128, 2), (128, 3), (128, 7), (128, 128), (10, 10), (4096, 100), (32768, 1000), (32768, 32768)]
UNKEYED = [2, 3, 7, 100]  # a HASH exchange into a vertex without key groups: the hash modulo the consumers
KEYS = [["id.n"], ["word"], ["word", "id.n"]]  # a key named with a dot is that column


def _spec(n: int, keys: list[str], key_groups: int = 0, partitioner=PartitionerKind.HASH) -> ResultPartitionSpec:
    return ResultPartitionSpec("ds", 0, n, partitioner, tuple(keys), ResultPartitionType.BLOCKING, key_groups)


def _rows(count: int) -> list[tuple]:
    rng = random.Random(51)
    words = ["", "a", "ß", "日本", "the quick brown fox", None]
    rows = [(rng.choice(words) if i % 3 else f"w{i}", rng.randint(-2**63, 2**63 - 1) if i % 2 else i - count // 2)
            for i in range(count)]
    return rows + [(None, None), ("x", 0), ("x", -1)]


def test_the_routing_columns_compute_what_the_key_group_arithmetic_computes(spark):
    df = spark.createDataFrame(_rows(3000), "word string, `id.n` bigint")
    columns = []
    for i, keys in enumerate(KEYS):
        columns.append(key_hash_column(keys).alias(f"h{i}"))
        for groups, n in KEYED:
            columns.append(key_group_column(keys, groups).alias(f"g{i}_{groups}_{n}"))
            target = subpartition_column(_spec(n, keys, groups))  # None for one consumer: all of it is subpartition 0
            columns.append((target if target is not None else F.lit(0)).alias(f"s{i}_{groups}_{n}"))
        for n in UNKEYED:
            columns.append(subpartition_column(_spec(n, keys)).alias(f"m{i}_{n}"))
    got = df.select(*columns).collect()  # one job for every key, column and parallelism

    for i in range(len(KEYS)):
        hashes = [row[f"h{i}"] for row in got]
        assert len(set(hashes)) > 1000 and min(hashes) < 0 < max(hashes)  # the keys reach negative hashes too
        for groups, n in KEYED:
            reached = set()
            for row, h in zip(got, hashes):
                group, subtask = row[f"g{i}_{groups}_{n}"], row[f"s{i}_{groups}_{n}"]
                assert group == key_group_of(h, groups), (KEYS[i], h, groups)
                assert subtask == subpartition_of(h, n, groups), (KEYS[i], h, groups, n)
                assert group in key_group_range(groups, n, subtask)  # the subtask that owns its state
                reached.add(subtask)
            if n <= 7:
                assert reached == set(range(n))
        for n in UNKEYED:
            assert [row[f"m{i}_{n}"] for row in got] == [subpartition_of(h, n) for h in hashes]


@pytest.mark.parametrize("spec", [
    _spec(1, ["word"], 128),  # one consumer
    _spec(4, ["word"], 128, PartitionerKind.BROADCAST),  # every consumer gets it all
])
def test_a_partition_for_one_consumer_or_for_all_of_them_is_written_unsplit(spec):
    assert subpartition_column(spec) is None


def test_a_hash_exchange_without_keys_is_refused():
    with pytest.raises(ValueError, match="HASH partitioning without keys"):
        subpartition_column(_spec(4, []))


def test_a_rebalance_deals_the_rows_round_robin(spark):
    rebalance = _spec(3, [], 0, PartitionerKind.REBALANCE)
    routed = spark.range(0, 100, 1, 1).select(subpartition_column(rebalance).alias("s"))  # one Spark partition
    assert [r.s for r in routed.collect()] == [i % 3 for i in range(100)]
    assert routed.schema["s"].dataType.simpleString() == "int"
