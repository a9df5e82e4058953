"""A standalone ZooKeeper server on loopback: for the tests of the `zookeeper` high-availability
backend, the leader-kill benchmark, and `funke cluster start --ha zookeeper` on a machine
without a ZooKeeper of its own.

Runs the server of the Debian package `zookeeper` (`/usr/share/java/zookeeper.jar`; another
jar or class path through $FUNKE_ZOOKEEPER_CLASSPATH) with its data, configuration and log in
one directory. The process is ours: `stop()` ends it by its pid and nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
INSTALL_HINT = "install the Debian package `zookeeper` (apt-get install zookeeper), or set FUNKE_ZOOKEEPER_CLASSPATH"


class ZooKeeperUnavailable(Exception):
    """No ZooKeeper server could be started here; the message says why and what to install."""


def classpath() -> str | None:
    configured = os.environ.get("FUNKE_ZOOKEEPER_CLASSPATH")
    if configured:
        return configured
    return DEBIAN_JAR if Path(DEBIAN_JAR).is_file() else None


@dataclass
class ZooKeeperServer:
    process: subprocess.Popen
    address: str  # 127.0.0.1:port, the quorum to configure
    dir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)

    def __enter__(self) -> ZooKeeperServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ruok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


def prepare(dir: str | os.PathLike[str], tick_ms: int = 200) -> tuple[list[str], str]:
    """The command that runs a server with its files in `dir` on a free loopback port, and the
    address it will serve on. A short tick lets clients ask for session timeouts down to 2
    ticks (0.4 s by default)."""
    java = shutil.which("java") or (os.path.join(os.environ["JAVA_HOME"], "bin", "java")
                                    if os.environ.get("JAVA_HOME") else None)
    cp = classpath()
    if cp is None:
        raise ZooKeeperUnavailable(f"no ZooKeeper server on this machine: {INSTALL_HINT}")
    if java is None:
        raise ZooKeeperUnavailable("ZooKeeper needs Java: install it or set JAVA_HOME")
    root = Path(dir).resolve()
    (root / "data").mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = root / "zoo.cfg"
    config.write_text(
        f"tickTime={tick_ms}\ndataDir={root / 'data'}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
        f"minSessionTimeout={2 * tick_ms}\nmaxSessionTimeout={600 * tick_ms}\n"
        "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat\nmaxClientCnxns=0\n")
    return ([java, "-Xmx256m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false", "-cp", cp,
             MAIN_CLASS, str(config)], f"127.0.0.1:{port}")


def wait_ready(address: str, process: subprocess.Popen, timeout: float = 60) -> bool:
    """Whether the server at `address` answers within `timeout` (False at once if it exited)."""
    port = int(address.rpartition(":")[2])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if _ruok(port):
            return True
        time.sleep(0.1)
    return False


def start(dir: str | os.PathLike[str], tick_ms: int = 200, timeout: float = 60, attempts: int = 3) -> ZooKeeperServer:
    """Start a server with its files in `dir` (see `prepare`); returns once it answers."""
    root = Path(dir).resolve()
    last = ""
    for _ in range(attempts):
        argv, address = prepare(root, tick_ms)
        with open(root / "zookeeper.log", "ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=root, start_new_session=True)
        server = ZooKeeperServer(process, address, root)
        if wait_ready(address, process, timeout):
            return server
        server.stop()  # the port was taken meanwhile, or it failed: try another
        last = (root / "zookeeper.log").read_text(errors="replace")[-2000:]
    raise ZooKeeperUnavailable(f"the ZooKeeper server did not start; the end of its log:\n{last}")
