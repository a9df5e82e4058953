"""The timer queue of keyed state: (time, key) entries, earliest first — what every keyed
operator that waits on time keeps per key group (Flink's HeapPriorityQueueSet of timers, one per
key group, in HeapKeyedStateBackend): a window aggregate its windows by end, a session aggregate
its sessions by end, drop_duplicates_within_watermark and the interval join their rows by expiry,
a keyed process function its processing-time and event-time timers.

An entry is never taken out when its key changes: the operator that pops it checks it against
the state (`due(until)` yields every entry at or before `until`, and the operator skips the ones
whose key no longer waits for that time), which keeps a push O(log n) and a change of state free.
While the queue is held (`hold()`), what is pushed waits outside the heap until `release()`: a
timer a process function registers while timers fire fires in a later batch, never in the loop
that registered it.

Pure (no clocks: a time is a number the caller gives), and pickled by value into Spark's Python
workers with the keyed operators, so it imports nothing of funke.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["TimerQueue"]


class TimerQueue:
    """(time, key) entries popped in time order (ties by key: keys of one queue compare)."""

    __slots__ = ("_heap", "_held")

    def __init__(self, entries: Iterable[tuple[int, Any]] = ()):
        self._heap: list[tuple[int, Any]] = list(entries)
        heapq.heapify(self._heap)
        self._held: list[tuple[int, Any]] | None = None  # pushed while held

    def push(self, time: int, key: Any) -> None:
        if self._held is not None:
            self._held.append((time, key))
        else:
            heapq.heappush(self._heap, (time, key))

    def due(self, until: int | None) -> Iterator[tuple[int, Any]]:
        """Pops and yields each entry at or before `until`, earliest first (none for None: no
        time yet, as a query before its first watermark)."""
        if until is None:
            return
        heap = self._heap
        while heap and heap[0][0] <= until:
            yield heapq.heappop(heap)

    def hold(self) -> None:
        """From now until `release()`, what is pushed is kept out of `due`."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        for entry in held or ():
            heapq.heappush(self._heap, entry)

    def earliest(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap) + len(self._held or ())
