"""common/records.py: quick_init keeps every behaviour of the dataclass's own constructor."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from funke.common.graph.deployment import TaskDeployment
from funke.common.graph.executiongraph import ExecutionAttemptId, SlotId
from funke.common.records import quick_init


def _pair():
    """The same record twice: one with the dataclass's __init__, one with quick_init's."""
    made = []
    for quick in (False, True):
        @dataclasses.dataclass(frozen=True, slots=True, order=True)
        class Record:
            a: int
            b: str = "b"
            c: tuple = dataclasses.field(default_factory=lambda: ("made",))
            d: int = dataclasses.field(default=7, init=False)
            e: tuple = dataclasses.field(default_factory=tuple, init=False)
            f: float = dataclasses.field(default=0.5, kw_only=True)

            def __post_init__(self) -> None:
                if self.a < 0:
                    raise ValueError("a < 0")

        made.append(quick_init(Record) if quick else Record)
    return made


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, "x"), {}), ((1, "x", ("y",)), {"f": 2.5}),
                                          ((), {"a": 3, "c": (), "b": "z"})])
def test_the_quick_constructor_makes_what_the_dataclass_makes(args, kwargs):
    plain, quick = _pair()
    p, q = plain(*args, **kwargs), quick(*args, **kwargs)
    assert dataclasses.astuple(p) == dataclasses.astuple(q)
    assert repr(p).split("(", 1)[1] == repr(q).split("(", 1)[1]
    assert q == quick(*args, **kwargs) and hash(q) == hash(quick(*args, **kwargs))
    assert dataclasses.replace(q, b="r").b == "r" and dataclasses.replace(q, b="r").a == q.a


def test_the_quick_constructor_refuses_what_the_dataclass_refuses():
    plain, quick = _pair()
    for cls in (plain, quick):
        with pytest.raises(TypeError):
            cls()  # a is required
        with pytest.raises(TypeError):
            cls(1, "b", (), 2.0)  # f is keyword-only
        with pytest.raises(TypeError):
            cls(1, d=3)  # d is not a parameter
        with pytest.raises(ValueError, match="a < 0"):
            cls(-1)  # __post_init__ runs
    q = quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.a = 2  # type: ignore[misc]
    assert quick(1).c == ("made",) and quick(1).e == ()  # factories run, for init=False fields too


def test_only_frozen_slotted_dataclasses_are_taken():
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int]

        def __post_init__(self, b: int) -> None:
            pass

    for cls in (Mutable, NoSlots, WithInitVar, int):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_records_the_scheduler_builds_keep_their_behaviour():
    attempt = ExecutionAttemptId("map", 3, 1)
    assert attempt == ExecutionAttemptId("map", 3, 1) and attempt < ExecutionAttemptId("map", 4, 0)
    assert pickle.loads(pickle.dumps(attempt)) == attempt
    d = TaskDeployment("job", "name", attempt, "map (4/8)", 8, SlotId("tm-1", 0), None, (), ())  # type: ignore[arg-type]
    assert d.job_options == {} and d.data_dir == "" and d.streaming is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.data_dir = "/x"  # type: ignore[misc]
    assert dataclasses.replace(d, data_dir="/x").data_dir == "/x"
