"""A small TCP line server for socket sources (`nc -lk PORT` with a script): it hands out
lines, in order, each once overall, to whoever is connected, at a given rate; a new connection
goes on where the last one stopped (a line written to a connection that broke is gone, as with
any socket). The socket word count demo (`python3 deploy/dev.py socket`) and the tests feed
receivers with it. Binds 127.0.0.1 only."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence


class LineServer:
    """`lines`: what to send, in order; or `make_line(i)` for line i, sent until `finish()`."""

    def __init__(self, lines: Sequence[str] | None = None, rate: float = 100.0, port: int = 0,
                 make_line: Callable[[int], str] | None = None):
        if rate <= 0:
            raise ValueError(f"the rate must be positive, got {rate}")
        if (lines is None) == (make_line is None):
            raise ValueError("give the lines, or a function that makes line i")
        self.lines = list(lines) if lines is not None else []
        self.make_line, self.rate = make_line, rate
        self._finished = lines is not None
        self.sent = 0
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", port))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="line-server", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._finished and self.sent >= len(self.lines)

    def finish(self) -> None:
        """Lines made by `make_line`: send no more after the current one."""
        self._finished = True

    def _next_line(self) -> str | None:
        if self.sent < len(self.lines):
            return self.lines[self.sent]
        if self._finished or self.make_line is None:
            return None
        self.lines.append(self.make_line(self.sent))
        return self.lines[self.sent]

    def _serve(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            with conn:
                next_at = time.monotonic()
                while not self._stop.is_set() and (line := self._next_line()) is not None:
                    try:
                        conn.sendall((line + "\n").encode("utf-8"))
                    except OSError:
                        break
                    self.sent += 1
                    next_at += 1 / self.rate
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                while not self._stop.is_set() and self.done:
                    time.sleep(0.1)  # everything sent: keep the connection, as a quiet server would

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
