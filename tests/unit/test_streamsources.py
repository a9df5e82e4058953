"""Streaming sources' planning and reading rules (common/streaming/sources/): the rate source's rows
are a function of the offsets alone (a replay reads the same rows, timestamps included), and the
file source takes each file once, oldest first, within the per-trigger limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import FilesSource, ListedFile, RateSource


def test_the_rate_source_offers_the_rows_due_by_now_from_its_base_time():
    rate = RateSource(rows_per_second=10, partitions=2)
    first = rate.plan(None, now_ms=5_000)
    assert first == SourceRange(None, {"rows": 1, "baseMs": 5_000}, 1)  # row 0 is due at the base time
    second = rate.plan(first.end, now_ms=6_000)
    assert second == SourceRange({"rows": 1, "baseMs": 5_000}, {"rows": 11, "baseMs": 5_000}, 10)
    assert rate.plan(second.end, now_ms=6_050).rows == 0  # nothing due yet: start == end
    assert rate.plan(second.end, now_ms=6_050).start == rate.plan(second.end, now_ms=6_050).end


def test_rate_rows_are_the_same_on_every_read_and_split_by_partition():
    rate = RateSource(rows_per_second=4, partitions=3)
    r = SourceRange({"rows": 5, "baseMs": 1_000}, {"rows": 12, "baseMs": 1_000}, 7)
    parts = [rate.rows(r, p) for p in range(3)]
    assert sorted(v for p in parts for v, _ in p) == list(range(5, 12))
    assert all(v % 3 == p for p, rows in enumerate(parts) for v, _ in rows)
    assert dict(v for p in parts for v in p)[8] == 1_000 + 8 * 250
    assert [rate.rows(r, p) for p in range(3)] == parts  # a replay


def test_the_rate_limit_and_a_cap_bound_a_batch():
    rate = RateSource(rows_per_second=1000, max_rows_per_trigger=100)
    start = {"rows": 0, "baseMs": 0}
    assert rate.plan(start, now_ms=10_000).end == {"rows": 100, "baseMs": 0}
    assert rate.plan(start, now_ms=10_000, limited=False).end == {"rows": 10_001, "baseMs": 0}
    cap = {"rows": 50, "baseMs": 0}
    assert rate.plan(start, now_ms=10_000, cap=cap).end == cap
    assert rate.latest(start, 2_000) == {"rows": 2_001, "baseMs": 0}


def test_rate_source_settings_and_offsets_are_checked():
    for bad in (dict(rows_per_second=0), dict(rows_per_second=1, partitions=0),
                dict(rows_per_second=1, max_rows_per_trigger=0)):
        with pytest.raises(ValueError):
            RateSource(**bad)
    with pytest.raises(ValueError, match="not a rate source offset"):
        RateSource(1).plan({"rows": "x"}, 0)
    with pytest.raises(ValueError, match="not a rate source offset"):
        RateSource(1).plan({"rows": -1, "baseMs": 0}, 0)


@given(st.integers(1, 5000), st.integers(1, 8), st.lists(st.integers(0, 3000), min_size=1, max_size=12))
def test_consecutive_rate_batches_cover_every_row_once(rows_per_second, partitions, steps):
    rate = RateSource(rows_per_second, partitions)
    now, start, seen = 1_000, None, []
    for step in steps:
        now += step
        r = rate.plan(start, now)
        seen += sorted(v for p in range(partitions) for v, _ in rate.rows(r, p))
        start = r.end if r.end is not None else start
    assert seen == list(range(len(seen)))
    if start is not None:  # every row due since the base (the first batch's time) was read
        assert len(seen) == rate.due(start["baseMs"], now)


def test_the_file_source_takes_new_files_oldest_first_and_never_twice():
    files = FilesSource(max_files_per_trigger=2)
    listing = [ListedFile("b.txt", 20, 1), ListedFile("a.txt", 20, 1), ListedFile("c.txt", 10, 1)]
    seen = files.discover([], listing)
    assert seen == ["c.txt", "a.txt", "b.txt"]
    first = files.plan(None, len(seen))
    assert first == SourceRange(None, 2, 0) and files.files(first, seen) == ["c.txt", "a.txt"]
    second = files.plan(first.end, len(seen))
    assert files.files(second, seen) == ["b.txt"]
    listing.append(ListedFile("d.txt", 5, 1))  # an old modification time: still new to us
    seen += files.discover(seen, listing)
    assert seen[-1] == "d.txt" and files.files(files.plan(second.end, len(seen)), seen) == ["d.txt"]
    assert files.plan(None, 0) == SourceRange(None, None, 0)
    assert files.plan(3, 4, cap=3) == SourceRange(3, 3, 0)


def test_file_source_offsets_are_checked():
    with pytest.raises(ValueError, match="past the 2 files"):
        FilesSource().plan(3, 2)
    with pytest.raises(ValueError, match="not a file source offset"):
        FilesSource().plan("3", 5)
    with pytest.raises(ValueError, match="seen-files log holds 1"):
        FilesSource.files(SourceRange(0, 2), ["x"])
    with pytest.raises(ValueError):
        FilesSource(max_files_per_trigger=0)
