"""Key-group routing as Spark columns: which key group each row falls in, and which subpartition of
an exchange (which consumer subtask) each row goes to. For the exchange (`exchange.py`, writing a
task's result partitions) and the keyed operators (`operators/transforms.py`, reading their rows'
key groups): the rule "the exchange routes a row to the subtask that owns its state" holds because
both columns are built here, on one hash, and compute what the pure arithmetic of
`funke.common.streaming.keygroups` computes (tests/unit/test_routing.py checks them against it for
many keys and parallelisms).

Below `operators/` (it imports none of it), so that the operators and the exchange can both use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from funke.common.graph.deployment import ResultPartitionSpec
from funke.common.graph.jobgraph import PartitionerKind

__all__ = ["key_group_column", "key_hash_column", "subpartition_column"]


def key_hash_column(keys: Sequence[str]) -> Column:
    """Spark's Murmur3 hash of a row's keys (an int): the same on every host."""
    # Backticks, as operators.context.column_ref: a key named "a.b" is that column, not field b of a.
    return F.hash(*[F.col("`" + k.replace("`", "``") + "`") for k in keys])


def key_group_column(keys: Sequence[str], max_parallelism: int) -> Column:
    """Each row's key group: `keygroups.key_group_of` of its keys' hash."""
    return F.pmod(key_hash_column(keys), F.lit(max_parallelism)).cast("int")


def subpartition_column(out: ResultPartitionSpec) -> Column | None:
    """Each row's subpartition of a partition that feeds several consumers (None: it is written
    unsplit). HASH: `keygroups.subpartition_of` of its keys' hash; into a keyed operator (the
    partition's `key_groups` at least its subpartitions) the subtask that owns the row's key group.
    REBALANCE, and POINTWISE rescale (one partition split among its consumers): round robin."""
    n = out.num_subpartitions
    if n <= 1 or out.partitioner is PartitionerKind.BROADCAST:
        return None
    if out.partitioner is PartitionerKind.HASH:
        keys = list(out.partition_keys)
        if not keys:
            raise ValueError(f"data set {out.data_set_id!r}: HASH partitioning without keys")
        if out.key_groups >= n:
            # keygroups.subtask_of_key_group: group * n // key_groups
            target = F.floor(key_group_column(keys, out.key_groups) * F.lit(n) / F.lit(out.key_groups))
        else:
            target = F.pmod(key_hash_column(keys), F.lit(n))
    else:
        target = F.pmod(F.monotonically_increasing_id(), F.lit(n))
    return target.cast("int")
