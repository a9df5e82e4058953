"""The timer queue of keyed state (`funke.common.streaming.timers`), against a naive model: a
sorted list of what was pushed, popped from the front."""

from __future__ import annotations

import random

import pytest

from funke.common.streaming.timers import TimerQueue


def test_due_pops_the_entries_at_or_before_a_time_earliest_first_and_keeps_the_rest():
    q = TimerQueue([(30, ("c",)), (10, ("a",)), (20, ("b",))])
    q.push(10, ("z",))
    assert list(q.due(20)) == [(10, ("a",)), (10, ("z",)), (20, ("b",))]
    assert len(q) == 1 and q.earliest() == 30
    assert list(q.due(29)) == [] and list(q.due(None)) == []  # no time yet: nothing is due
    assert list(q.due(30)) == [(30, ("c",))] and q.earliest() is None and len(q) == 0


def test_what_is_pushed_while_held_is_not_due_until_released():
    q = TimerQueue([(5, "a"), (7, "b")])
    q.hold()
    fired = []
    for at, key in q.due(100):
        fired.append((at, key))
        q.push(at + 1, key)  # a timer registered while timers fire (a process function's on_timer)
    assert fired == [(5, "a"), (7, "b")] and len(q) == 2 and list(q.due(100)) == []
    q.release()
    assert list(q.due(100)) == [(6, "a"), (8, "b")]


def test_a_partial_iteration_pops_only_what_it_yielded():
    q = TimerQueue([(1, "a"), (2, "b"), (3, "c")])
    for at, _ in q.due(10):
        if at == 2:
            break
    assert list(q.due(10)) == [(3, "c")]


@pytest.mark.parametrize("seed", range(20))
def test_against_a_sorted_list(seed):
    """Random pushes, holds, releases and pops: the queue yields what the model says, in order."""
    rng = random.Random(seed)
    initial = [(rng.randrange(50), f"k{rng.randrange(8)}") for _ in range(rng.randrange(20))]
    q, model, held = TimerQueue(initial), sorted(initial), None
    for _ in range(200):
        op = rng.random()
        if op < 0.5:
            entry = (rng.randrange(100), f"k{rng.randrange(8)}")
            q.push(*entry)
            if held is None:
                model.append(entry)
                model.sort()
            else:
                held.append(entry)
        elif op < 0.6 and held is None:
            q.hold()
            held = []
        elif op < 0.7 and held is not None:
            q.release()
            model = sorted(model + held)
            held = None
        else:
            until = rng.choice([None, rng.randrange(100)])
            expected = [] if until is None else [e for e in model if e[0] <= until]
            model = model[len(expected):]
            assert list(q.due(until)) == expected
        assert len(q) == len(model) + len(held or ())
        assert q.earliest() == (model[0][0] if model else None)
