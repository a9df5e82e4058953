"""Schema files served over HTTP, for the tests of funke's Schema Registry client
(funke.runtime.avrovalues.SchemaRegistry): a directory laid out as the paths of Confluent's REST API
(`schemas/ids/<id>`, `subjects/<subject>/versions/latest`, each file the JSON body Confluent's
registry answers) served by Python's own `http.server` as a real process on a free loopback port,
stopped by its pid.

This is NOT a Schema Registry, and the tests do not call it one. No registry installs from the
package registries this project can use: Karapace (Aiven's Confluent-compatible registry, in
Python) is not published on PyPI (`pip download karapace`: "No matching distribution"), and
Confluent's own is a JVM service from Confluent's Maven repository. What a file server shows of
the client is real HTTP: schemas fetched by id and cached, a 404 (without Confluent's error body),
a redirect (http.server answers one for a directory without its slash), a server that is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


class SchemaFileServer:
    def __init__(self, directory: Path, timeout: float = 20):
        self.root = Path(directory) / "files"
        self.root.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(directory) / "http.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(self.root),
                 str(self.port)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"http.server did not start on {self.url}: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def add_schema(self, schema_id: int, schema: str, **extra: object) -> None:
        """GET /schemas/ids/<schema_id> answers {"schema": schema, ...extra} (Confluent's body)."""
        self._write(self.root / "schemas" / "ids" / str(schema_id), {"schema": schema, **extra})

    def add_latest(self, subject: str, schema_id: int, schema: str, version: int = 1) -> None:
        """GET /subjects/<subject>/versions/latest answers Confluent's body for that version."""
        self.add_version(subject, "latest", schema_id, schema, version)

    def add_version(self, subject: str, path_version: int | str, schema_id: int, schema: str,
                    version: int | None = None, **extra: object) -> None:
        """GET /subjects/<subject>/versions/<path_version> answers Confluent's body."""
        self._write(self.root / "subjects" / subject / "versions" / str(path_version),
                    {"subject": subject, "version": version if version is not None else path_version,
                     "id": schema_id, "schema": schema, **extra})

    @staticmethod
    def _write(path: Path, body: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body))

    def requests(self, path: str) -> int:
        """How many GET requests for `path` the server has logged."""
        return sum(f'"GET {path} HTTP' in line for line in self.log_path.read_text().splitlines())

    def stop(self) -> None:
        """Stops the server by its pid (idempotent)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
