"""A deterministic measure of work for complexity checks: Python lines executed.

Wall time is noise on a shared machine; the number of executed lines of Python is not. A
quadratic loop over P elements shows as about 4x the lines when P doubles, a linear one as about
2x (loops inside C functions are not counted, which is why tests compare growth, not totals).
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def lines_executed(fn: Callable[[], Any]) -> int:
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def call(frame, event, arg):
        return local

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def growth(build: Callable[[int], Callable[[], Any]], p: int) -> float:
    """Lines executed by `build(2p)()` divided by those of `build(p)()`: about 2 when linear."""
    return lines_executed(build(2 * p)) / lines_executed(build(p))
