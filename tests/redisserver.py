"""A real redis-server on loopback for the Redis Streams tests and the chaos script: started on a
free port with nothing saved to disk, stopped by its pid (never by name)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


class RedisServerMissing(RuntimeError):
    pass


class RedisServer:
    def __init__(self, directory: Path, timeout: float = 20):
        binary = os.environ.get("FUNKE_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            raise RedisServerMissing("redis-server is not installed: install the Debian package redis-server "
                                     "(python3 deploy/dev.py test does, as root)")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._log = open(self.directory / "redis.log", "w")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory), "--protected-mode", "yes"],
            stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start: {(self.directory / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
