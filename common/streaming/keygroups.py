"""Key groups (Flink's KeyGroupRangeAssignment): which key group a key hash falls in, which key
groups a subtask owns, and which subtask (subpartition of an exchange) a key hash is routed to.

A keyed operator's state is split into `max_parallelism` key groups; a key's group is
`pmod(hash(keys), max_parallelism)`, with Spark's `hash` (Murmur3, the same on every host), and
subtask i of n owns the contiguous range of groups whose `group * n // max_parallelism` is i. The
exchange into a keyed operator routes rows the same way, so a subtask receives exactly the keys of
its groups, and a query restored at another parallelism finds each group's state whole. The max
parallelism is fixed once a query has state (`funke.common.streaming.state` keeps it with the
state).

The arithmetic on an already computed hash, for the JobManager (reading a checkpoint's state), the
TaskManager and tests. The Spark columns that compute the same on every row, and that must agree
with these functions (tests/unit/test_routing.py checks that they do), are
`funke.taskmanager.routing.key_group_column` and `subpartition_column`.

Pure: numbers in, numbers out; imports nothing of funke.
"""

from __future__ import annotations

__all__ = ["key_group_of", "key_group_range", "subpartition_of", "subtask_of_key_group"]


def key_group_of(key_hash: int, max_parallelism: int) -> int:
    """The key group of a key whose hash is `key_hash` (Spark's `pmod`: never negative)."""
    return key_hash % max_parallelism


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> range:
    """The key groups subtask `subtask` of `parallelism` owns (Flink's range assignment)."""
    if not 1 <= parallelism <= max_parallelism or not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of {parallelism} with {max_parallelism} key groups")
    return range(-(-subtask * max_parallelism // parallelism), -(-(subtask + 1) * max_parallelism // parallelism))


def subtask_of_key_group(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns `key_group` (the inverse of key_group_range)."""
    return key_group * parallelism // max_parallelism


def subpartition_of(key_hash: int, subpartitions: int, key_groups: int = 0) -> int:
    """The subpartition of a HASH exchange a row whose key hash is `key_hash` goes to: into a
    keyed operator (`key_groups` at least `subpartitions`: the consumer's max parallelism), the
    subtask that owns the key's group; otherwise (`key_groups` 0) the hash modulo the number of
    consumers."""
    if key_groups >= subpartitions:
        return subtask_of_key_group(key_group_of(key_hash, key_groups), key_groups, subpartitions)
    return key_hash % subpartitions
