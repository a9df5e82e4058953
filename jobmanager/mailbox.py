"""The JobManager's main thread, Flink-style: every state change runs here, one at a time.

All components (dispatcher, resource manager, job masters) live on one asyncio loop. Events from
gRPC handlers, timers and executor callbacks enter through `Mailbox.run`; an event that causes
another (a released slot serving another job's request) is queued behind the current one instead
of re-entering a component half-way through an update. No locks are needed anywhere.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, TypeVar

log = logging.getLogger("funke.jobmanager")
T = TypeVar("T")


class Mailbox:
    def __init__(self) -> None:
        self._queue: deque[Callable[[], object]] = deque()
        self._draining = False

    def run(self, letter: Callable[[], object]) -> None:
        """Process `letter` now, or after the one being processed."""
        self._queue.append(letter)
        if not self._draining:
            self._drain()

    def call(self, letter: Callable[[], T]) -> T:
        """Process `letter` now and return its result (only from outside the mailbox, e.g. a
        gRPC handler); letters it causes run before this returns."""
        if self._draining:
            raise RuntimeError("Mailbox.call from inside the mailbox; use run()")
        self._draining = True
        try:
            return letter()
        finally:
            try:
                self._drain_queue()
            finally:
                self._draining = False

    def _drain(self) -> None:
        self._draining = True
        try:
            self._drain_queue()
        finally:
            self._draining = False

    def _drain_queue(self) -> None:
        while self._queue:
            letter = self._queue.popleft()
            try:
                letter()
            except Exception:  # one bad letter must not stop the JobManager
                log.exception("error in the JobManager main thread")
