"""A query's source and sink sides as the query shell uses them (jobmanager/streaming/sides.py)."""

from __future__ import annotations

from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.jobmanager.streaming.base import SourceSide
from funke.jobmanager.streaming.sides import SourceSides


class _Side(SourceSide):
    def __init__(self, name: str, fail_close: bool = False):
        self.name, self.fail_close, self.closed = name, fail_close, False

    def plan(self, start, now_ms, limited, cap):
        return SourceRange(start or 0, min((start or 0) + 10, cap) if cap is not None else (start or 0) + 10)

    def batch_files(self, source_range):
        return (f"{self.name}-{source_range.start}",) if self.name == "files" else None

    def close(self):
        self.closed = True
        if self.fail_close:
            raise OSError("connection already gone")


def test_every_source_plans_from_its_own_start_within_its_own_cap():
    sides = SourceSides({"a": _Side("a"), "b": _Side("b")})
    assert sides.plan({"a": 5}, 0, True, {"b": 3}) == {"a": SourceRange(5, 15), "b": SourceRange(0, 3)}
    assert sides.latest({"b": 7}, 0) == {"a": 10, "b": 17}


def test_only_the_sources_that_resolve_a_range_give_the_tasks_files():
    sides = SourceSides({"files": _Side("files"), "rate": _Side("rate")})
    entry = OffsetEntry(4, 0, {"files": SourceRange(2, 3), "rate": SourceRange(0, 9)})
    assert sides.batch_files(entry) == {"files": ("files-2",)}


def test_closing_closes_every_side_even_when_one_fails():
    a, b = _Side("a", fail_close=True), _Side("b")
    SourceSides({"a": a, "b": b}).close()
    assert a.closed and b.closed
