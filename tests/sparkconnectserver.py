"""A Spark Connect server for tests, run from pip's PySpark in the foreground (what the
package's sbin/start-connect-server.sh would daemonize): started in its own session, its pid
recorded by the caller's object, stopped by that pid's process group, restartable on the same
port (TaskManagers must notice the new server and open new sessions)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from funke.deploy.sparkstandalone import spark_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectServer:
    def __init__(self, dir: Path, *, master: str = "local[2]", conf: dict[str, str] | None = None):
        self.dir = dir
        self.port = free_port()
        self.master = master
        self.conf = {"spark.scheduler.mode": "FAIR", "spark.ui.enabled": "false", **(conf or {})}
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> None:
        self.starts += 1
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / f"connect-{self.starts}.log"
        home = spark_home()
        argv = [os.path.join(home, "bin", "spark-submit"), "--class", SERVER_CLASS, "--name", "funke-test-connect",
                "--master", self.master, "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf", f"spark.connect.grpc.binding.port={self.port}",
                "--conf", f"spark.local.dir={self.dir / 'local'}",
                "--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={self.dir / 'tmp'}"]
        for key, value in self.conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv.append("spark-internal")
        for sub in ("local", "tmp"):
            (self.dir / sub).mkdir(exist_ok=True)
        env = dict(os.environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        self.process = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                                        cwd=self.dir, start_new_session=True)
        deadline = time.monotonic() + timeout
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start:\n{tail}")
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)  # the server we started, and its Python workers
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()
