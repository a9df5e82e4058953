"""A Spark standalone cluster on this machine: one Master and N Workers, run from the jars of the
pip-installed PySpark, so that a SparkSession (and later funke's Spark stages) can run its
executors in other processes than the driver, as on a real cluster.

Owns the layout of a cluster directory and the lifecycle of the processes recorded in it:

    <dir>/pids/<name>.pid     one per process: master, worker-1 .. worker-N
    <dir>/log/<name>.log      each process's stdout and stderr (Spark logs to stderr)
    <dir>/work/<name>/        a Worker's work dir: <app-id>/<executor-id>/ per executor, with its
                              stdout and stderr; also the executor's (and its Python workers') cwd
    <dir>/local/              SPARK_LOCAL_DIRS: the executors' block manager and shuffle files
    <dir>/tmp/                java.io.tmpdir of Master and Workers, TMPDIR of all they start

The processes run in the foreground (`bin/spark-class <main class>`, not sbin/start-*.sh, which
the pip package does not ship and which would daemonize them out of our reach). Each is started
in its own session, so its pid is also its process group: a Worker's executors and their Python
workers are in the Worker's group, and stopping signals the group. Only pids we started (or read
from our pid files, after checking they still run Spark's Master or Worker) are ever signalled.

What the Master's web UI tells (Spark 4.x, `GET <web_url>/json/`): `url`, `status`, `workers`
(each with `id`, `host`, `webuiaddress`, `cores`, `coresused`, `memory`, `state`: ALIVE or
DEAD; dead workers stay listed for a while), `activeapps` / `completedapps` (each with `id`,
`name`, `cores` = the cores granted right now, `state`). Which executors an application has is not
in there: each Worker's own `GET <webuiaddress>/json/` lists its `executors` (`id`, `appid`,
`memory`, `appdesc`), without their cores.

The Python that executors run for UDFs is the *driver's* choice: PySpark sends its
$PYSPARK_PYTHON (default `python3`) with every Python function, so a driver must set
PYSPARK_PYTHON to an interpreter that has pyspark's dependencies (pyarrow for Arrow UDFs). The
PYSPARK_PYTHON given to the Workers here does not change that.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from funke.deploy.processgroups import command_line, kill_what_is_left, running, signal_group, wait_gone

__all__ = [
    "Executor",
    "ProcessInfo",
    "StandaloneError",
    "StandaloneInfo",
    "application_executors",
    "environment",
    "free_port",
    "master_command",
    "master_state",
    "recorded_processes",
    "spark_home",
    "start",
    "stop",
    "wait_for_executors",
    "wait_for_workers",
    "worker_command",
    "worker_port",
    "workers_by_name",
]

MASTER = "master"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The heap of the Master and Workers themselves (executors get what the application asks for).
DAEMON_MEMORY = "256m"
_LOG_TAIL_LINES = 30
_POLL_S = 0.2
_WORKER_LOG_HEAD_BYTES = 64 * 1024
_STARTING_WORKER = re.compile(r"Starting Spark worker \S+:(\d+) ")

# The processes this Python process started, by pid: asking their Popen whether they run also
# reaps them, so an exited one does not linger as a zombie that looks alive.
_children: dict[int, subprocess.Popen[bytes]] = {}


class StandaloneError(Exception):
    """Starting, stopping or asking a standalone cluster failed; the message says what was seen
    and, for a process that died or did not come up, ends with the tail of its log."""


class _Timeout(StandaloneError):
    """Waiting ran out of time (as opposed to a process dying meanwhile)."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    name: str  # "master", "worker-1", ...
    pid: int
    log: Path


@dataclass(frozen=True, slots=True)
class StandaloneInfo:
    dir: Path
    master_url: str  # spark://host:port, what a SparkSession's master is set to
    web_url: str  # http://host:port, the Master's web UI (and its JSON at /json/)
    processes: tuple[ProcessInfo, ...]  # the master first, then worker-1 .. worker-N

    @property
    def workers(self) -> tuple[ProcessInfo, ...]:
        return tuple(p for p in self.processes if p.name != MASTER)


@dataclass(frozen=True, slots=True)
class Executor:
    """One executor of an application, as the Worker running it lists it."""

    app_id: str
    executor_id: int
    worker_id: str  # the Master's id of the Worker: worker-<date>-<host>-<port>
    host: str
    memory_mb: int


@dataclass(slots=True)
class _Started:
    """What start() launched so far, so that a failure stops exactly that."""

    dir: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# commands and environment
# --------------------------------------------------------------------------------------------


def spark_home() -> str:
    """The directory of the pip-installed PySpark, which is a complete SPARK_HOME (bin/, jars/).
    pyspark is imported here, not at module import, so that this module stays cheap to import."""
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (it may be taken before it is used: start() checks
    that the Master really serves where it was told to)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def master_command(host: str, port: int, webui_port: int) -> list[str]:
    """The command that runs a Master in the foreground, listening on host:port for Workers and
    drivers and serving its web UI on host:webui_port. Fixed ports (Spark's defaults are 7077
    and 8080) would collide with any other cluster on the machine: give free ones."""
    return [os.path.join(spark_home(), "bin", "spark-class"), MASTER_CLASS,
            "--host", host, "--port", str(port), "--webui-port", str(webui_port)]


def worker_command(master_url: str, host: str, cores: int, memory: str, work_dir: str | os.PathLike[str],
                   webui_port: int) -> list[str]:
    """The command that runs a Worker in the foreground that offers `cores` cores and `memory`
    (e.g. "1g") to the Master at `master_url` and runs its executors in `work_dir`. Its own RPC
    port is a random free one; `webui_port` 0 means the same for its web UI (the Master's JSON
    tells where it ended up: `workers[].webuiaddress`)."""
    return [os.path.join(spark_home(), "bin", "spark-class"), WORKER_CLASS,
            "--host", host, "--cores", str(cores), "--memory", memory,
            "--work-dir", str(work_dir), "--webui-port", str(webui_port), master_url]


def environment(scratch_dir: str | os.PathLike[str], host: str = "127.0.0.1") -> dict[str, str]:
    """The environment for the Master and Workers: this process's environment without any
    SPARK_* or PYSPARK_* variable of the caller's (another installation's SPARK_HOME or
    SPARK_CONF_DIR must not leak in), plus

    SPARK_HOME          the pip PySpark, whose spark-class and jars we run
    SPARK_LOCAL_IP      `host`: without it Spark binds the web UIs to 0.0.0.0, and a machine
                        whose hostname resolves to loopback makes it pick another interface
    SPARK_LOCAL_DIRS    <scratch>/local: where a Worker puts its executors' block manager and
                        shuffle files (default /tmp)
    SPARK_WORKER_DIR    <scratch>/work: the Worker's default work dir (we also pass --work-dir)
    SPARK_LOG_DIR       <scratch>/log: read only by sbin/spark-daemon.sh; our logs go there too
    SPARK_DAEMON_JAVA_OPTS / TMPDIR   <scratch>/tmp as java.io.tmpdir of Master and Workers and
                        as TMPDIR of what they start (Python workers use it; executor JVMs take
                        java.io.tmpdir from the application's spark.executor.extraJavaOptions)
    SPARK_DAEMON_MEMORY the heap of Master and Workers (the default is 1g each)
    SPARK_MASTER_OPTS   spark.port.maxRetries=0: a Master whose port was taken meanwhile fails
                        instead of quietly serving on the next port, where nobody looks;
                        spark.master.rest.enabled=false: no REST submission server, whose fixed
                        port (6066) another Master on the machine holds, and which would then keep
                        ours STANDBY (funke's TaskManagers are drivers of their own)
    PYSPARK_PYTHON      this interpreter, for anything on the Workers that starts Python
                        without being told which; UDFs run the driver's PYSPARK_PYTHON instead

    JAVA_HOME is passed on if set; otherwise spark-class runs the `java` on PATH."""
    root = Path(scratch_dir).expanduser().resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_HOME=spark_home(),
        SPARK_LOCAL_IP=host,
        SPARK_LOCAL_DIRS=str(root / "local"),
        SPARK_WORKER_DIR=str(root / "work"),
        SPARK_LOG_DIR=str(root / "log"),
        SPARK_DAEMON_JAVA_OPTS=f"-Djava.io.tmpdir={shlex.quote(str(root / 'tmp'))}",
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_MASTER_OPTS="-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false",
        TMPDIR=str(root / "tmp"),
        PYSPARK_PYTHON=sys.executable,
    )
    return env


# --------------------------------------------------------------------------------------------
# what the Master and Workers say
# --------------------------------------------------------------------------------------------


def _get_json(url: str, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; bad JSON a ValueError
        raise StandaloneError(f"{url} did not answer with JSON: {exc}") from None


def master_state(web_url: str, timeout: float = 5) -> dict:
    """The Master's status as its web UI serves it at <web_url>/json/ (see the module docstring
    for the fields used here)."""
    return _get_json(web_url.rstrip("/") + "/json/", timeout)


def _alive_workers(state: dict) -> list[dict]:
    return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def _describe_workers(state: dict) -> str:
    workers = state.get("workers", [])
    if not workers:
        return "no workers registered"
    return "; ".join(f"{w.get('id')} {w.get('state')} ({w.get('cores')} cores, {w.get('coresused')} used)"
                     for w in workers)


def wait_for_workers(web_url: str, n: int, timeout: float = 60) -> list[dict]:
    """Poll the Master until at least `n` of its workers are ALIVE; returns the ALIVE ones (the
    Master's `workers[]` entries). Raises StandaloneError, naming what it saw last, if that does
    not happen within `timeout` seconds."""
    return _wait_for_workers(web_url, n, timeout, lambda: None)


def _wait_for_workers(web_url: str, n: int, timeout: float, check: Callable[[], None]) -> list[dict]:
    deadline = time.monotonic() + timeout
    seen = "no answer yet"
    while True:
        check()
        try:
            state = master_state(web_url, timeout=max(min(5.0, deadline - time.monotonic()), 0.5))
            alive = _alive_workers(state)
            if len(alive) >= n:
                return alive
            seen = f"{len(alive)} ALIVE: {_describe_workers(state)}"
        except StandaloneError as exc:
            seen = str(exc)
        if time.monotonic() >= deadline:
            raise _Timeout(f"expected {n} ALIVE worker(s) at {web_url} within {timeout:g} s; "
                                  f"last saw {seen}")
        time.sleep(_POLL_S)


def worker_port(log: Path) -> int | None:
    """The RPC port the Worker that writes `log` serves on, from its first lines ("Starting
    Spark worker HOST:PORT with ..."); None when it has not said yet."""
    try:
        with open(log, errors="replace") as f:
            head = f.read(_WORKER_LOG_HEAD_BYTES)
    except OSError:
        return None
    found = _STARTING_WORKER.search(head)
    return int(found.group(1)) if found else None


def workers_by_name(state: dict, workers: Sequence[ProcessInfo]) -> dict[str, dict]:
    """The Master's entry (`workers[]`, ALIVE or DEAD) of each of our `workers` that registered,
    by name. The Master names a Worker `worker-<date>-<host>-<port>`, and a Worker's log tells its
    port; with several entries for one port (a Worker that registered again), the last wins."""
    by_port: dict[int, dict] = {}
    for entry in state.get("workers", []):
        port = str(entry.get("id", "")).rpartition("-")[2]
        if port.isdigit():
            by_port[int(port)] = entry
    found = {}
    for w in workers:
        port = worker_port(w.log)
        if port is not None and port in by_port:
            found[w.name] = by_port[port]
    return found


def _application_id(state: dict, app: str) -> str | None:
    """The id of the running application `app` names (its id, else its name), None if none
    runs. A name shared by several running applications is an error: say which is meant."""
    active = state.get("activeapps", [])
    if any(a.get("id") == app for a in active):
        return app
    named = [a.get("id") for a in active if a.get("name") == app]
    if len(named) > 1:
        raise StandaloneError(f"{len(named)} running applications are named {app!r} "
                              f"({', '.join(named)}): give the application id")
    return named[0] if named else None


def application_executors(web_url: str, app: str, timeout: float = 5) -> list[Executor]:
    """The executors that the running application `app` (its id, or its appName) has right now,
    one entry per executor with the Worker it runs on; empty if no such application runs. Asks
    the Master which application and Workers there are, then each ALIVE Worker's own JSON for its
    executors (the Master's JSON does not say where an application's executors are)."""
    state = master_state(web_url, timeout)
    app_id = _application_id(state, app)
    if app_id is None:
        return []
    found: list[Executor] = []
    for worker in _alive_workers(state):
        listing = _get_json(worker["webuiaddress"].rstrip("/") + "/json/", timeout)
        for executor in listing.get("executors", []):
            if executor.get("appid") == app_id:
                found.append(Executor(app_id, int(executor["id"]), worker["id"], worker["host"],
                                      int(executor.get("memory", 0))))
    return sorted(found, key=lambda e: e.executor_id)


def wait_for_executors(web_url: str, app: str, n: int, timeout: float = 60) -> list[Executor]:
    """Poll until the running application `app` has at least `n` executors (an application gets
    its executors some time after its SparkContext started); returns them. Raises
    StandaloneError, naming what it saw last, if that does not happen within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    seen = "no answer yet"
    while True:
        try:
            executors = application_executors(web_url, app)
            if len(executors) >= n:
                return executors
            listing = ", ".join(f"executor {e.executor_id} on {e.worker_id}" for e in executors)
            seen = f"{len(executors)}: {listing}" if executors else "none (or no running application by that id or name)"
        except StandaloneError as exc:
            seen = str(exc)
        if time.monotonic() >= deadline:
            raise StandaloneError(f"expected {n} executor(s) of {app!r} at {web_url} within {timeout:g} s; "
                                  f"last saw {seen}")
        time.sleep(_POLL_S)


# --------------------------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------------------------


def start(dir: str | os.PathLike[str], workers: int, host: str = "127.0.0.1", cores_per_worker: int = 1,
          memory: str = "1g", timeout: float = 120) -> StandaloneInfo:
    """Start a Master and `workers` Workers (`cores_per_worker` cores and `memory` each), all on
    `host`, recorded in `dir`. Returns once the Master serves and every Worker is registered and
    ALIVE; otherwise stops whatever it started and raises StandaloneError with the logs' tails."""
    if workers < 0:
        raise StandaloneError(f"the number of workers must be 0 or more, got {workers}")
    if cores_per_worker < 1:
        raise StandaloneError(f"each worker needs at least 1 core, got {cores_per_worker}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise StandaloneError("Spark needs Java 17 or newer: install it or set JAVA_HOME")
    root = Path(dir).expanduser().resolve()
    for sub in ("log", "pids", "work", "local", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    running = [p for p in _recorded(root) if _alive(p.pid) and _is_ours(p.pid, p.name)]
    if running:
        listing = ", ".join(f"{p.name} (pid {p.pid})" for p in running)
        raise StandaloneError(f"a standalone cluster recorded in {root} is still running: {listing}")
    for f in (root / "pids").glob("*.pid"):
        f.unlink()  # pid files of dead processes must not mislead a later stop

    port, webui_port = free_port(host), free_port(host)
    master_url, web_url = f"spark://{host}:{port}", f"http://{host}:{webui_port}"
    started = _Started(root, environment(root, host))
    deadline = time.monotonic() + timeout
    ok = False
    try:
        _launch(started, MASTER, master_command(host, port, webui_port))
        _wait_for_master(started, web_url, master_url, deadline)
        names = [f"worker-{i}" for i in range(1, workers + 1)]
        for name in names:
            _launch(started, name, worker_command(master_url, host, cores_per_worker, memory,
                                                  root / "work" / name, 0))
        try:
            _wait_for_workers(web_url, workers, max(deadline - time.monotonic(), 0.1),
                              lambda: _check_alive(started))
        except _Timeout as exc:  # all still run, but not all registered: show what they said
            _fail(started, names, str(exc))
        ok = True
        return StandaloneInfo(root, master_url, web_url,
                              tuple(_info(root, name, p.pid) for name, p in started.processes.items()))
    finally:
        if not ok:  # includes KeyboardInterrupt: never leave half a cluster behind
            stop(StandaloneInfo(root, master_url, web_url,
                                tuple(_info(root, name, p.pid) for name, p in started.processes.items())), 10)


def _launch(started: _Started, name: str, command: Sequence[str]) -> None:
    log_path = started.dir / "log" / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # The cluster dir, not the caller's cwd: anything written beside a process stays here.
            cwd=started.dir, env=started.env, start_new_session=True,
        )
    _children[process.pid] = process
    started.processes[name] = process
    (started.dir / "pids" / f"{name}.pid").write_text(f"{process.pid}\n")


def _wait_for_master(started: _Started, web_url: str, master_url: str, deadline: float) -> None:
    """Until the Master's web UI answers as the Master at `master_url`. Our Master exits if a
    port was taken since free_port() (SPARK_MASTER_OPTS), but until it does, whoever took the
    web UI port may answer: a UI answering for another URL is not ours."""
    last = ""
    while time.monotonic() < deadline:
        _check_alive(started)
        try:
            state = master_state(web_url, timeout=2)
        except StandaloneError as exc:
            last = str(exc)
        else:
            if state.get("url") != master_url:
                _fail(started, [MASTER], f"the web UI at {web_url} is the Master at {state.get('url')}, "
                                         f"not ours at {master_url} (was the port taken?)")
            if state.get("status") == "ALIVE":
                return
            last = f"the Master's status is {state.get('status')}"
        time.sleep(_POLL_S)
    _fail(started, [MASTER], f"the Master did not serve at {web_url} in time ({last})")


def _check_alive(started: _Started) -> None:
    for name, process in started.processes.items():
        code = process.poll()
        if code is not None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            _fail(started, [name], f"{name} {how} during startup")


def _fail(started: _Started, names: Sequence[str], message: str) -> None:
    details = []
    for name in names:
        log = started.dir / "log" / f"{name}.log"
        tail = _tail(log)
        details.append(f"\n--- last lines of {log} ---\n{tail}" if tail else f"\n({log} is empty)")
    raise StandaloneError(message + "".join(details))


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# stop
# --------------------------------------------------------------------------------------------


def stop(cluster: StandaloneInfo | str | os.PathLike[str], timeout: float = 15) -> dict[str, str]:
    """Stop a cluster: the processes of `cluster` (a StandaloneInfo, or a directory whose pid
    files say which). SIGTERM to each Worker's process group (its executors and their Python
    workers are in it), then to the Master's, and SIGKILL to whatever still runs after `timeout`
    seconds. Returns what happened to each process by name ("stopped", "killed ...", "not
    running"). Removes the pid files; an empty or unknown directory is not an error."""
    if isinstance(cluster, StandaloneInfo):
        root, processes = cluster.dir, list(cluster.processes)
    else:
        root = Path(cluster).expanduser().resolve()
        processes = _recorded(root)
    outcome = _stop(processes, timeout)
    for p in processes:
        (root / "pids" / f"{p.name}.pid").unlink(missing_ok=True)
    return outcome


def _stop(processes: Sequence[ProcessInfo], timeout: float) -> dict[str, str]:
    outcome: dict[str, str] = {}
    live = []
    for p in processes:
        if not _alive(p.pid):
            outcome[p.name] = "not running"
        elif not _is_ours(p.pid, p.name):
            outcome[p.name] = f"not running (pid {p.pid} now runs something else: left alone)"
        else:
            live.append(p)
    deadline = time.monotonic() + timeout
    # Workers before the Master, as sbin/stop-all.sh does: a Master that goes first makes its
    # Workers try to reconnect rather than stop their executors.
    for group in ([p for p in live if p.name != MASTER], [p for p in live if p.name == MASTER]):
        for p in group:
            signal_group(p.pid, signal.SIGTERM)
        # The Master gets a moment even when the Workers used up the time.
        _wait_gone(group, max(deadline, time.monotonic() + 2.0))
    for p in live:
        # A process that ended may have left some of its group behind (an executor, a Python worker).
        outcome[p.name] = {"killed": f"killed (still running after {timeout:g} s)",
                           "left-overs killed": "stopped (left-over processes of its group killed)",
                           "stopped": "stopped"}[kill_what_is_left(p.pid, _alive)]
    for p in processes:
        if not _alive(p.pid):  # reaped: from now on the pid may be anyone's
            _children.pop(p.pid, None)
    return outcome




def _wait_gone(processes: Sequence[ProcessInfo], deadline: float) -> None:
    wait_gone((p.pid for p in processes), _alive, deadline)




# --------------------------------------------------------------------------------------------
# pid files and process checks
# --------------------------------------------------------------------------------------------


def _info(root: Path, name: str, pid: int) -> ProcessInfo:
    return ProcessInfo(name, pid, root / "log" / f"{name}.log")


def _recorded(root: Path) -> list[ProcessInfo]:
    """The processes named by the pid files in `root`, the master first."""
    found = []
    for f in (root / "pids").glob("*.pid") if (root / "pids").is_dir() else ():
        try:
            pid = int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # unreadable: not something we can safely signal
        found.append(_info(root, f.stem, pid))
    return sorted(found, key=lambda p: (p.name != MASTER, len(p.name), p.name))


def recorded_processes(dir: str | os.PathLike[str]) -> list[tuple[ProcessInfo, bool]]:
    """The Master and Workers recorded in `dir` (the master first), each with whether it still
    runs: its pid alive and still Spark's Master or Worker that we started (pids are reused)."""
    return [(p, _alive(p.pid) and _is_ours(p.pid, p.name))
            for p in _recorded(Path(dir).expanduser().resolve())]


def _alive(pid: int) -> bool:
    if pid in _children:  # ours: poll() reaps it once it has exited
        return _children[pid].poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but not ours to signal; _is_ours decides
    return running(pid)


def _is_ours(pid: int, name: str) -> bool:
    """Whether `pid` still runs what its name says: a session leader (we started it with
    start_new_session) whose command line holds the Master's or Worker's main class (pids are
    reused once a process is gone)."""
    try:
        if os.getpgid(pid) != pid:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return (MASTER_CLASS if name == MASTER else WORKER_CLASS) in (command_line(pid) or [])
