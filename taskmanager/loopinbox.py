"""Callbacks for the TaskManager's event loop from other threads (task threads): run on the loop
in the order they were posted; a burst wakes the loop once, and each loop turn runs a bounded
number of them, so heartbeats and RPCs go in between."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("funke.taskmanager")

PER_TURN = 128


class LoopInbox:
    def __init__(self) -> None:
        self._inbox: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._lock = threading.Lock()
        self._drain_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called on `loop`'s thread."""
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def post(self, callback: Callable[..., None], *args: Any) -> None:
        """From any thread: run `callback(*args)` on the loop, after everything posted before it."""
        if self._loop is None:
            return
        self._inbox.append((callback, args))
        self._wake()

    def _wake(self) -> None:
        assert self._loop is not None
        with self._lock:
            if self._drain_pending:
                return  # the pending drain takes this one too: one wake-up per burst
            self._drain_pending = True
        try:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._drain)
            else:
                self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            pass  # loop closed: the process is exiting and nobody is left to tell

    def _drain(self) -> None:
        with self._lock:
            # Cleared before draining: whatever is posted from now on wakes another drain, so
            # nothing is left behind (at worst a drain finds the inbox empty).
            self._drain_pending = False
        inbox = self._inbox
        for _ in range(min(len(inbox), PER_TURN)):
            callback, args = inbox.popleft()
            try:
                callback(*args)
            except Exception:  # one task's bug must not strand the callbacks behind it
                log.exception("callback %r failed", callback)
        if inbox:
            self._wake()  # the rest on the next turn: heartbeats and RPCs go in between
