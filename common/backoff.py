"""Exponential backoff without jitter: the one policy of every wait between retries (a
TaskManager registering or reporting, the JobManager retrying a store write, a job's clean-up or
a call to a TaskManager).

Pure: it only says how long to wait; the caller sleeps (or starts a timer). `delay(n)` is the
wait before retry n (0-based), for a caller that counts its retries; `delays()` the waits one
after the other, for a loop:

    delays = BACKOFF.delays()
    while True:
        try:
            return attempt()
        except OSError:
            await asyncio.sleep(next(delays))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before retry `n` (0-based) is start * 2**n, at most `cap`."""

    start_s: float = 0.2
    cap_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.start_s <= self.cap_s:
            raise ValueError(f"a backoff starts above 0 and at most at its cap, got {self.start_s} s and "
                             f"{self.cap_s} s")

    def delay(self, retries: int) -> float:
        # The exponent is bounded: past 32 doublings every wait is the cap anyway.
        return min(self.start_s * 2 ** min(retries, 32), self.cap_s)

    def delays(self) -> Iterator[float]:
        """delay(0), delay(1), ... without end."""
        return (self.delay(n) for n in itertools.count())
