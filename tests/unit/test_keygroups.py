"""Key groups (funke.common.streaming.keygroups): which groups a subtask owns, which group a key hash
falls in, and which subpartition of an exchange a key hash is routed to. That the Spark columns
compute the same is tests/unit/test_routing.py's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funke.common.streaming.keygroups import key_group_of, key_group_range, subpartition_of, subtask_of_key_group

INT32 = st.integers(-2**31, 2**31 - 1)  # Spark's hash is an int


@pytest.mark.parametrize("groups,parallelism", [(128, 1), (128, 2), (128, 3), (128, 7), (10, 10), (4096, 100)])
def test_the_subtasks_key_group_ranges_cover_every_group_once_and_agree_with_the_routing(groups, parallelism):
    owner = {}
    for subtask in range(parallelism):
        for g in key_group_range(groups, parallelism, subtask):
            assert g not in owner
            owner[g] = subtask
    assert sorted(owner) == list(range(groups))
    # the exchange sends group g to subtask g * n // groups: the same subtask that owns it
    assert all(subtask_of_key_group(g, groups, parallelism) == s for g, s in owner.items())


def test_a_parallelism_above_the_key_groups_is_refused():
    with pytest.raises(ValueError):
        key_group_range(4, 5, 0)


@pytest.mark.parametrize("subtask", [-1, 3])
def test_a_subtask_outside_the_parallelism_is_refused(subtask):
    with pytest.raises(ValueError):
        key_group_range(128, 3, subtask)


def test_a_negative_hash_falls_in_a_group_as_spark_pmod_puts_it():
    assert key_group_of(-1, 128) == 127
    assert key_group_of(-128, 128) == 0
    assert key_group_of(-2**31, 128) == 0
    assert key_group_of(2**31 - 1, 128) == 127


@given(INT32, st.integers(1, 4096), st.data())
def test_a_hash_routed_into_a_keyed_operator_reaches_the_subtask_that_owns_its_group(key_hash, groups, data):
    parallelism = data.draw(st.integers(1, groups))
    subtask = subpartition_of(key_hash, parallelism, groups)
    assert 0 <= subtask < parallelism
    assert key_group_of(key_hash, groups) in key_group_range(groups, parallelism, subtask)


@given(INT32, st.integers(2, 1000))
def test_a_hash_exchange_without_key_groups_is_the_hash_modulo_the_consumers(key_hash, consumers):
    assert subpartition_of(key_hash, consumers) == key_hash % consumers
    assert 0 <= subpartition_of(key_hash, consumers) < consumers
