"""Receivers: a streaming query's long-running source tasks that take records from outside (a
socket) and store them, in blocks, in the query's checkpoint before they count as received
(Spark Streaming's Receiver, BlockGenerator and write-ahead log).

Owns, for one receiver (one subtask of a receiver source vertex):

- `BlockStore`, its write-ahead log: `<dir>/<seq>.block`, one text file of records (lines) per
  block, written whole under a temporary name and synced, then hard-linked to its number, which
  fails if the number is taken: a number names a whole block or nothing (a receiver killed
  mid-write leaves only a temporary file, ignored), no number is used twice, and a receiver
  started again (or a second one by mistake) goes on after the highest number there is.
- `SocketReceiver`, a thread: connects to host:port, reads lines (UTF-8, "\\n" or "\\r\\n"),
  and every block interval stores what it read as one block. At most `rate` records a second
  (min(max_rate, the JobMaster's backpressure share)), smoothed: past it, the lines of one read
  wait in memory and the thread reads no more until they are taken, so the sender feels TCP's
  backpressure. A connection refused or closed is tried again every
  `RESTART_DELAY_S`, as Spark restarts a receiver. What was read but not yet stored when the
  process dies is lost: a socket acknowledges nothing, so nothing acknowledged is lost.

Which blocks a batch reads is the JobManager's decision (`funke.common.streaming.sources`); the
task's source operator reads exactly those.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from funke.common.streaming.sources import block_file_name, parse_block_file_name

log = logging.getLogger("funke.taskmanager.receiver")

RESTART_DELAY_S = 1.0  # between a lost or refused connection and the next try
CONNECT_TIMEOUT_S = 5.0
READ_CHUNK = 64 * 1024


class BlockStore:
    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        numbers = [n for n in map(parse_block_file_name, os.listdir(directory)) if n is not None]
        self.next_seq = max(numbers, default=-1) + 1
        self.blocks = 0
        self.records = 0

    def store(self, records: list[str]) -> str:
        """Writes one block; returns its file name once it is stored (synced and named)."""
        data = "".join(r + "\n" for r in records).encode("utf-8", errors="replace")
        temporary = os.path.join(self.directory, f".{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            while True:
                name = block_file_name(self.next_seq)
                try:  # the whole block under its number in one step, or not at all
                    os.link(temporary, os.path.join(self.directory, name))
                except FileExistsError:  # someone else's block: take the next number
                    self.next_seq += 1
                    continue
                self.next_seq += 1
                break
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        _sync_directory(self.directory)
        self.blocks += 1
        self.records += len(records)
        return name


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RateLimiter:
    """At most `rate` records a second (None: no limit), with at most a second's worth at once."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._allowance = rate or 0.0
        self._last = clock()

    def set_rate(self, rate: float | None) -> None:
        if rate is not None and self.rate is not None:
            self._allowance = min(self._allowance, rate)
        self.rate = rate

    def take(self, wanted: int) -> int:
        """How many of `wanted` records may be taken now (taken by this call)."""
        if self.rate is None:
            return wanted
        now = self._clock()
        self._allowance = min(self.rate, self._allowance + (now - self._last) * self.rate)
        self._last = now
        taken = max(0, min(wanted, int(self._allowance)))
        self._allowance -= taken
        return taken

    def wait_for_one(self) -> float:
        """Seconds until one more record may be taken."""
        if self.rate is None:
            return 0.0
        return max(0.0, (1 - self._allowance) / self.rate)


class SocketReceiver:
    def __init__(self, host: str, port: int, store: BlockStore, *, block_interval_s: float = 0.2,
                 max_rate: float | None = None, name: str = "receiver"):
        self.host, self.port, self.store = host, port, store
        self.block_interval_s = block_interval_s
        self.max_rate = max_rate
        self.limiter = RateLimiter(max_rate)
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"receiver {name}", daemon=True)
        self._socket: socket.socket | None = None
        self.error: BaseException | None = None  # a failure to store: the receiver stopped
        self.connections = 0

    def start(self) -> None:
        self._thread.start()

    def set_rate(self, backpressure: float | None) -> None:
        """The JobMaster's share for this receiver (None: no backpressure): it takes at most
        min(max_rate, backpressure) records a second."""
        limits = [r for r in (self.max_rate, backpressure) if r is not None]
        self.limiter.set_rate(min(limits) if limits else None)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops receiving; what was read and not yet stored is stored first."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        pending: list[str] = []
        try:
            while not self._stop.is_set():
                try:
                    conn = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
                except OSError as exc:
                    log.info("%s: cannot connect to %s:%d (%s); trying again in %.0f s", self.name, self.host,
                             self.port, exc, RESTART_DELAY_S)
                    self._stop.wait(RESTART_DELAY_S)
                    continue
                self.connections += 1
                log.info("%s: receiving from %s:%d", self.name, self.host, self.port)
                with conn:
                    self._receive(conn, pending)
                self._flush(pending)
                if not self._stop.is_set():
                    log.info("%s: %s:%d closed the connection; connecting again in %.0f s", self.name, self.host,
                             self.port, RESTART_DELAY_S)
                    self._stop.wait(RESTART_DELAY_S)
        except BaseException as exc:  # storing failed: the task sees it and fails
            self.error = exc
            log.error("%s: stopped: %s: %s", self.name, type(exc).__name__, exc)
        finally:
            if self.error is None:
                self._flush(pending)

    def _receive(self, conn: socket.socket, pending: list[str]) -> None:
        """Reads lines into `pending`, storing a block every block interval. Over the rate, the
        lines read and not yet taken wait here (one read's worth at most) and the socket is not
        read meanwhile: the sender is held back by TCP."""
        conn.settimeout(self.block_interval_s)
        partial = b""
        waiting: collections.deque[str] = collections.deque()  # read, not yet taken (rate)
        next_flush = time.monotonic() + self.block_interval_s
        while not self._stop.is_set():
            if waiting:
                n = self.limiter.take(len(waiting))
                pending.extend(waiting.popleft() for _ in range(n))
                if waiting:
                    self._stop.wait(min(self.limiter.wait_for_one(), max(0.0, next_flush - time.monotonic()),
                                        self.block_interval_s) or 0.001)
            else:
                try:
                    chunk = conn.recv(READ_CHUNK)
                except socket.timeout:
                    chunk = None
                except OSError:
                    chunk = b""
                if chunk == b"":  # closed: what was read is taken, rate or not (it is lost otherwise)
                    pending.extend(waiting)
                    if partial:  # the last line, without its newline
                        pending.append(_line(partial))
                    return
                if chunk:
                    *lines, partial = (partial + chunk).split(b"\n")
                    waiting.extend(_line(b) for b in lines)
            if time.monotonic() >= next_flush:
                self._flush(pending)
                next_flush = time.monotonic() + self.block_interval_s
        pending.extend(waiting)  # stopping: what was read is stored

    def _flush(self, pending: list[str]) -> None:
        if pending:
            self.store.store(pending)
            pending.clear()


def _line(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", errors="replace")
