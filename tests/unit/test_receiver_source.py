"""The receiver source's rules (common/streaming/sources/): stored blocks named by their numbers,
counted up to the first missing; each batch allocated every block stored when it is planned, per
receiver; a range that replays to the same blocks."""

from __future__ import annotations

import pytest

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import ReceiverSource, block_file_name, parse_block_file_name, stored_blocks


def test_block_names_are_their_numbers_and_only_blocks_parse():
    assert block_file_name(7) == "000000000007.block"
    assert parse_block_file_name("000000000007.block") == 7
    for other in (".000000000007.block.tmp", "7.block", "000000000007-3.block", "notes.txt"):
        assert parse_block_file_name(other) is None
    with pytest.raises(ValueError):
        block_file_name(-1)


def test_stored_blocks_are_found_by_number_and_a_batch_takes_them_up_to_the_first_missing():
    names = [block_file_name(1), block_file_name(0), ".tmp-x", block_file_name(3)]
    stored = stored_blocks(names)
    assert stored == {0: block_file_name(0), 1: block_file_name(1), 3: block_file_name(3)}
    assert ReceiverSource(1).plan(None, {0: stored}) == SourceRange(None, {"0": 2}, 0)  # 3 waits for 2
    # blocks before the retained batches were purged: numbering goes on from the offset
    assert ReceiverSource(1).plan({"0": 40}, {0: {40, 41, 43}}) == SourceRange({"0": 40}, {"0": 42}, 0)


def test_each_batch_is_allocated_every_block_stored_when_it_is_planned_per_receiver():
    source = ReceiverSource(2)
    assert source.plan(None, {}) == SourceRange(None, None, 0)
    first = source.plan(None, {0: {0, 1}, 1: {0}})
    assert first == SourceRange(None, {"0": 2, "1": 1}, 0)  # rows: counted by the tasks that read them
    assert list(source.blocks(first, 0)) == [0, 1] and list(source.blocks(first, 1)) == [0]
    second = source.plan(first.end, {0: {0, 1, 2}, 1: {0}})
    assert second == SourceRange({"0": 2, "1": 1}, {"0": 3, "1": 1}, 0)
    assert list(source.blocks(second, 0)) == [2] and list(source.blocks(second, 1)) == []
    # a draining stop or available-now: up to what was stored when it was asked
    capped = source.plan(first.end, {0: set(range(5)), 1: {0, 1}}, cap={"0": 4, "1": 1})
    assert capped.end == {"0": 4, "1": 1}
    assert source.latest(first.end, {0: {0, 1, 2}, 1: {0, 1}}) == {"0": 3, "1": 2}


def test_offsets_that_cannot_be_are_refused():
    source = ReceiverSource(1)
    assert source.plan({"0": 5}, {0: {0}}) == SourceRange({"0": 5}, {"0": 5}, 0)  # nothing new yet
    for bad in ({"0": -1}, {"0": "x"}, ["0"], {"0": True}):
        with pytest.raises(ValueError):
            source.plan(bad, {0: {0}})
    with pytest.raises(ValueError):
        ReceiverSource(0)
