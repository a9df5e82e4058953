"""What a local cluster's directory says: the files `funke cluster status`, `stop` and every
client read, and nothing that starts a process (that is `funke.deploy.localcluster`).

The layout of a cluster directory:

    <dir>/jobmanager.address     host:port, written by the JobManager once it serves
    <dir>/jobmanager.url         its web dashboard and REST API (http(s)://host:port/)
    <dir>/pids/<name>.pid        one per process: jobmanager, tm-1 .. tm-N
    <dir>/log/<name>.log         each process's stdout and stderr
    <dir>/data/                  the JobManager's data dir unless another is given
    <dir>/security/              the cluster's secrets (0700): client.token, cluster.token and,
                                 with TLS, tls/ (see funke.runtime.security)

    <dir>/jobmanager.options     the flags every JobManager of the cluster is started with
                                 (host, data dir, -D entries), for JobManagers started later

With high availability (`ha="filesystem"` or `"zookeeper"`, several JobManagers: `jobmanager`,
`jobmanager-2`, ...) the cluster directory also holds:

    <dir>/ha.conf                the high-availability.* keys every process is started with
    <dir>/ha/                    the HA storage directory (lease, job graphs, results, archive;
                                 with ZooKeeper the records too large for a node)
    <dir>/jobmanagers/<name>.address, <name>.url   each JobManager's own address and dashboard
    <dir>/zookeeper/             with ZooKeeper and no quorum given: the data of the cluster's
                                 own ZooKeeper server (process `zookeeper`, stopped last)

and no `jobmanager.address` or `jobmanager.url`: any JobManager may be a standby, so the
JobManager address is the leader's, looked up in the HA services whenever it is asked for
(`read_address`, `leader`). A JobManager that joined the cluster without this launcher (started
by hand with its ha.conf) is found there too (`status`, `stop`).

Reading it: the JobManager address (`read_address`; with high availability the leader's, from the
HA services its ha.conf configures), the dashboard, the TLS mode and tokens a client presents, the
processes recorded in pids/ and whether each still runs (a pid is taken for ours only while it
runs a funke process of that kind: pids are reused once a process is gone), and `status`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from funke.common.configuration import ConfigurationError, parse_config_lines, parse_configuration
from funke.common.leadership import Lease
from funke.deploy import zookeeperserver
from funke.deploy.client import FunkeError, JobManagerClient
from funke.deploy.processgroups import command_line, running
from funke.runtime import security
from funke.runtime.hafilesystem import holder_gone, process_identity
from funke.runtime.haservices import HaServices, ha_services as _configured_services
from funke.runtime.security import ClientCredentials
from funke.v1 import jobmanager_pb2

ADDRESS_FILE = "jobmanager.address"


HA_CONF = "ha.conf"


TASKMANAGER_OPTIONS = "taskmanager.options"


JOBMANAGER_OPTIONS = "jobmanager.options"


JOBMANAGERS_DIR = "jobmanagers"  # with high availability: each JobManager's own address and URL


STANDALONE_DIR = "spark-standalone"


STANDALONE_URLS = "urls.json"


HA_CLUSTER_ID = "default"


JOBMANAGER = "jobmanager"


ZOOKEEPER = "zookeeper"


HA_MODES = ("none", "filesystem", "zookeeper")


TLS_MODES = ("none", "tls", "mtls")  # plaintext; TLS; mutual TLS (every caller shows a certificate too)


TLS_MODE_FILE = "mode"  # in security/tls/: which of TLS_MODES the material is for


# What each kind of process runs: the marker its command line must hold to be ours.
MODULES = {JOBMANAGER: "funke.jobmanager.main", "tm": "funke.taskmanager.main",
            ZOOKEEPER: zookeeperserver.MAIN_CLASS}


def kind_of(name: str) -> str:
    if name == ZOOKEEPER:
        return ZOOKEEPER
    return JOBMANAGER if name == JOBMANAGER or name.startswith(JOBMANAGER + "-") else "tm"


def is_jobmanager(name: str) -> bool:
    return kind_of(name) == JOBMANAGER


def jobmanager_files(root: Path, name: str, ha: bool) -> tuple[Path, Path]:
    """Where JobManager `name` writes its address and dashboard URL once it serves. Without
    high availability the one JobManager's are the cluster's (`jobmanager.address`); with it
    each JobManager's own, beside the others', never where a client looks for the leader."""
    if ha:
        return root / JOBMANAGERS_DIR / f"{name}.address", root / JOBMANAGERS_DIR / f"{name}.url"
    return root / ADDRESS_FILE, root / f"{JOBMANAGER}.url"


POLL_S = 0.1


class ClusterError(Exception):
    """Starting, stopping or inspecting a local cluster failed; the message says why and, for a
    process that died, ends with the tail of its log."""


class ClusterRefused(ClusterError):
    """Refused before anything was started, stopped or written: what was asked does not fit the
    flags' other values, the cluster's state (one runs already, none runs, a process of that name
    is alive or is not) or its setup (no high availability). `funke` exits 2 for it, 1 for
    any other ClusterError."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    name: str  # "jobmanager", "tm-1", ...
    pid: int
    alive: bool
    log: Path
    # False: a JobManager the HA services know but this launcher did not start (its pid file is
    # not in <dir>/pids): one started by hand, here or (`host`) on another machine.
    recorded: bool = True
    address: str = ""  # for such a JobManager: the address it serves
    host: str = ""  # ... and its host


@dataclass(frozen=True, slots=True)
class StandaloneStatus:
    """The cluster's own Spark standalone cluster (`--spark standalone`) as its Master tells it."""

    master_url: str
    web_url: str
    # The Master's entry for each of our Workers that registered (`workers[]` of its JSON: `state`
    # ALIVE or DEAD, `cores`, `coresused`, ...), by process name (`spark-worker-1`, ...).
    workers: dict[str, dict]
    workers_alive: int = 0  # ALIVE at the Master, ours or not
    workers_known: int = 0  # every Worker the Master lists, DEAD ones too
    error: str = ""  # why the Master's web UI told nothing (then `workers` is empty)


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    dir: Path
    # zookeeper, jobmanager(s), TaskManagers by number, then the Spark standalone Master and Workers
    processes: tuple[ProcessInfo, ...]
    address: str | None
    overview: jobmanager_pb2.ClusterOverview | None  # None: no JobManager answered
    error: str = ""  # why there is no overview, if a JobManager should have answered
    high_availability: str = "none"
    lease: Lease | None = None  # with high availability: the lease as written
    standalone: StandaloneStatus | None = None  # the cluster's own Spark standalone cluster, if any

    @property
    def running(self) -> bool:
        return bool(self.processes) and all(p.alive for p in self.processes) and self.overview is not None


def credentials(dir: str | os.PathLike[str]) -> ClientCredentials:
    """What a client of the cluster recorded in `dir` presents: its client token and, if it
    runs with TLS, its CA and client certificate."""
    return ClientCredentials.for_cluster(Path(dir).expanduser().resolve())


def client_of(root: Path, address: str, timeout: float) -> JobManagerClient:
    return JobManagerClient(address, timeout=timeout, credentials=credentials(root))


def security_options(dir: str | os.PathLike[str]) -> list[str]:
    """The -D flags every process of the cluster starts with: its token files and TLS (for a
    JobManager or TaskManager started by hand to join it)."""
    root = Path(dir).expanduser().resolve()
    folder = root / security.SECURITY_DIR
    entries = [f"security.auth.token-file={folder / security.CLIENT_TOKEN}",
               f"security.auth.cluster-token-file={folder / security.CLUSTER_TOKEN}"]
    generated = security.GeneratedTls(folder / security.TLS_DIR)
    if generated.ca.exists():
        entries += generated.config_entries(mutual=tls_mode(root) == "mtls")
    return [arg for entry in entries for arg in ("-D", entry)]


def tls_mode(dir: str | os.PathLike[str]) -> str:
    """How the cluster recorded in `dir` was started: "none", "tls" or "mtls"."""
    mode_file = Path(dir).expanduser() / security.SECURITY_DIR / security.TLS_DIR / TLS_MODE_FILE
    try:
        mode = mode_file.read_text().strip()
    except OSError:
        return "none"
    return mode if mode in TLS_MODES else "tls"


def dashboard_url(dir: str | os.PathLike[str]) -> str | None:
    """The web dashboard of the cluster recorded in `dir` (with high availability: the
    leader's), if it is known."""
    root = Path(dir).expanduser().resolve()
    ha = ha_mode(root) != "none"
    _, url_file = jobmanager_files(root, leader_name(root) if ha else JOBMANAGER, ha)
    try:
        return url_file.read_text().strip() or None
    except OSError:
        return None


def read_address(dir: str | os.PathLike[str]) -> str | None:
    """The JobManager address recorded in a cluster directory, if any; with high availability
    the current leader's (None while none is elected)."""
    services = ha_services(dir)
    if services is not None:
        lease = services.leader()
        return lease.address if lease is not None and lease.valid(time.time()) else None
    try:
        text = (Path(dir) / ADDRESS_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text or None


_services: dict[tuple[str, str], HaServices] = {}


def close_ha_services(dir: str | os.PathLike[str]) -> None:
    """Close this process's HA services of the cluster in `dir` (a stopped cluster's ZooKeeper
    session would otherwise go on trying a server that is gone)."""
    root = str(Path(dir).expanduser().resolve())
    for key in [k for k in _services if k[0] == root]:
        _services.pop(key).close()


def ha_services(dir: str | os.PathLike[str]) -> HaServices | None:
    """The HA services of a cluster started with high availability (as its ha.conf says), else
    None. One instance per cluster and configuration in this process (one ZooKeeper session)."""
    root = Path(dir).expanduser().resolve()
    try:
        text = (root / HA_CONF).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    key = (str(root), text)
    if key not in _services:
        for old in [k for k in _services if k[0] == key[0]]:  # the cluster was started anew
            _services.pop(old).close()
        try:
            config = parse_configuration(parse_config_lines(text, str(root / HA_CONF)))
        except ConfigurationError as exc:
            raise ClusterError(f"the cluster's {HA_CONF} is not usable: {exc}") from None
        services = _configured_services(config)
        if services is None:
            return None
        _services[key] = services
    return _services[key]


def ha_mode(dir: str | os.PathLike[str]) -> str:
    """The high-availability backend of the cluster recorded in `dir` ("none" without)."""
    try:
        text = (Path(dir).expanduser() / HA_CONF).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return "none"
    try:
        entries = parse_config_lines(text)
    except ConfigurationError:
        return "none"
    return (entries.get("high-availability.type") or entries.get("high-availability") or "none").lower()


def leader(dir: str | os.PathLike[str]) -> Lease | None:
    services = ha_services(dir)
    return services.leader() if services is not None else None


def standalone_urls(dir: str | os.PathLike[str]) -> tuple[str, str] | None:
    """The master URL and web UI of the cluster's own Spark standalone cluster, if it has one."""
    try:
        urls = json.loads((Path(dir).expanduser().resolve() / STANDALONE_DIR / STANDALONE_URLS).read_text())
        return str(urls["master_url"]), str(urls["web_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def taskmanager_options(root: Path) -> list[str]:
    """The flags the cluster's TaskManagers were started with (`start(taskmanager_options=...)`)."""
    try:
        options = json.loads((root / TASKMANAGER_OPTIONS).read_text())
    except (OSError, ValueError):
        return []
    return [str(o) for o in options] if isinstance(options, list) else []


def next_jobmanager_name(dir: str | os.PathLike[str]) -> str:
    """The first of `jobmanager`, `jobmanager-2`, ... that does not run now (a dead one's name
    first: its log goes on)."""
    root = Path(dir).expanduser().resolve()
    running = {p.name for p in recorded_processes(root) if p.alive}
    n = 1
    while (name := JOBMANAGER if n == 1 else f"{JOBMANAGER}-{n}") in running:
        n += 1
    return name


def jobmanager_options(root: Path) -> list[str]:
    """The flags the cluster's JobManagers were started with (`start(data_dir=, host=, dynamic=)`)."""
    try:
        options = json.loads((root / JOBMANAGER_OPTIONS).read_text())
    except (OSError, ValueError):
        return []
    return [str(o) for o in options] if isinstance(options, list) else []


def wait_for_leader(dir: str | os.PathLike[str], timeout: float) -> Lease | None:
    """The lease of the cluster's leader once one is elected (None after `timeout` seconds). A
    lease still held by a process of this host that is gone (a killed leader's ZooKeeper node
    lives until its session expires) is not a leader: the wait goes on past it."""
    deadline = time.monotonic() + timeout
    while True:
        lease = leader(dir)
        if lease is not None and lease.valid(time.time()) and not holder_gone(lease.holder):
            return lease
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def leader_name(dir: str | os.PathLike[str], lease: Lease | None = None) -> str:
    """With high availability: the recorded JobManager that holds the lease (`lease`, else the
    one written), found by its pid; else `jobmanager`."""
    root = Path(dir).expanduser().resolve()
    lease = leader(root) if lease is None else lease
    if lease is not None:
        pid = lease.holder.split(":")[1] if lease.holder.count(":") >= 2 else ""
        for p in recorded_processes(root):
            if is_jobmanager(p.name) and str(p.pid) == pid:
                return p.name
    return JOBMANAGER


def status(dir: str | os.PathLike[str], timeout: float = 5) -> ClusterStatus:
    """The processes recorded in `dir`, whether each is alive, and the JobManager's overview.
    With high availability also every JobManager the HA services know that this launcher did
    not start (`ProcessInfo.recorded` False: one that joined by hand), after the recorded ones."""
    root = Path(dir).expanduser().resolve()
    recorded = recorded_processes(root)
    ha = ha_mode(root)
    # No cluster recorded, or its own ZooKeeper is down: no leader to ask for (asking would wait).
    ask = ha == "none" or ha_reachable(root, recorded)
    lease = leader(root) if ha != "none" and ask else None
    joined = [p for p, _ in joined_jobmanagers(root, recorded, lease)] if ha != "none" and ask else []
    processes = tuple(recorded + joined)
    address = read_address(root) if ask else None
    overview, error = None, ""
    jm_alive = any(is_jobmanager(p.name) and p.alive for p in processes)
    if address and jm_alive:
        try:
            with client_of(root, address, timeout) as client:
                overview = client.cluster_overview()
        except FunkeError as exc:
            error = str(exc)
    elif processes and not jm_alive:
        error = ("no JobManager is running; start one again with `funke cluster add-jobmanager` (the "
                 "TaskManagers and the stored jobs wait for it)" if ha != "none" else "the JobManager is not running")
    elif jm_alive:
        error = ("no JobManager leads right now (an election is under way)" if ha != "none"
                 else "the JobManager has not written its address yet")
    spark, standalone = standalone_status(root)
    return ClusterStatus(root, processes + spark, address, overview, error, ha, lease, standalone)


SPARK_PREFIX = "spark-"  # the names of the Spark standalone processes in status and stop: spark-master, ...


def standalone_status(root: Path, timeout: float = 2) -> tuple[tuple[ProcessInfo, ...], StandaloneStatus | None]:
    """The Spark standalone Master and Workers that `funke cluster start --spark standalone`
    started (recorded in <dir>/spark-standalone/pids), each alive or dead by its pid, and what the
    Master's web UI says of them (its JSON; a Worker whose process runs may be DEAD there, cut off
    from the Master). Nothing when the cluster has none."""
    folder = root / STANDALONE_DIR
    if not (folder / "pids").is_dir():
        return (), None
    from funke.deploy import sparkstandalone

    recorded = sparkstandalone.recorded_processes(folder)
    processes = tuple(ProcessInfo(SPARK_PREFIX + p.name, p.pid, alive, p.log) for p, alive in recorded)
    urls = standalone_urls(root)
    if not recorded or urls is None:
        return processes, None
    master_url, web_url = urls
    if not any(alive for p, alive in recorded if p.name == sparkstandalone.MASTER):
        return processes, StandaloneStatus(master_url, web_url, {}, error="the Master is not running")
    try:
        state = sparkstandalone.master_state(web_url, timeout)
    except sparkstandalone.StandaloneError as exc:
        return processes, StandaloneStatus(master_url, web_url, {}, error=str(exc))
    workers = sparkstandalone.workers_by_name(state, [p for p, _ in recorded if p.name != sparkstandalone.MASTER])
    listed = state.get("workers", [])
    return processes, StandaloneStatus(
        master_url, web_url, {SPARK_PREFIX + name: entry for name, entry in workers.items()},
        sum(1 for w in listed if w.get("state") == "ALIVE"), len(listed))


def ha_reachable(root: Path, recorded: Sequence[ProcessInfo]) -> bool:
    """Whether the cluster's HA services are worth asking: a cluster is recorded, and its own
    ZooKeeper server (if it has one) runs. Asking one that is down would wait for it."""
    return (root / HA_CONF).is_file() and bool(recorded) and not any(
        p.name == ZOOKEEPER and not p.alive for p in recorded)


def joined_jobmanagers(root: Path, recorded: Sequence[ProcessInfo],
                        lease: Lease | None) -> list[tuple[ProcessInfo, str]]:
    """The JobManagers taking part in the cluster's election that are not recorded here (started
    by hand with the cluster's ha.conf, here or on another machine), each with its holder
    identity. Named `jobmanager-pid<pid>` (`@<host>` when on another machine)."""
    services = ha_services(root) if ha_reachable(root, recorded) else None
    if services is None:
        return []
    try:
        contenders = services.contenders()
    except OSError:
        return []
    if lease is not None and not any(holder == lease.holder for holder, _ in contenders):
        contenders.append((lease.holder, lease.address))  # a leader of a backend that lists none
    ours = {p.pid for p in recorded if is_jobmanager(p.name) and p.alive}
    here = socket.gethostname()
    found: list[tuple[ProcessInfo, str]] = []
    for holder, address in contenders:
        host, _, rest = holder.partition(":")
        pid_text = rest.partition(":")[0]
        pid = int(pid_text) if pid_text.isdigit() else 0
        if host == here and pid in ours:
            continue
        local = host == here
        alive = not local or (process_identity(pid) == holder and runs_a_jobmanager(pid))
        if local and not alive:
            continue
        name = f"{JOBMANAGER}-pid{pid}" + ("" if local else f"@{host}")
        found.append((ProcessInfo(name, pid, alive, _log_of(pid) if local else Path("-"), recorded=False,
                                  address=address, host=host), holder))
    return found


def runs_a_jobmanager(pid: int) -> bool:
    """Whether `pid` runs a funke JobManager (`python -m funke.jobmanager.main`, `funke jobmanager`)."""
    argv = command_line(pid) or []
    return MODULES[JOBMANAGER] in argv or (
        "jobmanager" in argv and any(a.endswith("funke") or a == "funke.deploy.cli" for a in argv))


def _log_of(pid: int) -> Path:
    """Where a process writes its log (its stderr, if that is a file), else "-"."""
    try:
        for f in psutil.Process(pid).open_files():
            if f.fd == 2 and f.path.startswith("/") and Path(f.path).is_file():
                return Path(f.path)
    except psutil.Error:
        pass
    return Path("-")


def pid_file(root: Path, name: str) -> Path:
    return root / "pids" / f"{name}.pid"


def process_info(root: Path, name: str, pid: int, alive: bool) -> ProcessInfo:
    return ProcessInfo(name, pid, alive, root / "log" / f"{name}.log")


def process_order(name: str) -> tuple[int, int]:
    """zookeeper, jobmanager, jobmanager-2, ... first, then tm-1, tm-2, ..., tm-10 in numeric order."""
    if name == ZOOKEEPER:
        return (-1, 0)
    if name == JOBMANAGER:
        return (0, 0)
    if is_jobmanager(name):
        number = name.rpartition("-")[2]
        return (0, int(number) if number.isdigit() else 0)
    number = name.rpartition("-")[2]
    return (1, int(number)) if number.isdigit() else (2, 0)


def recorded_processes(root: Path) -> list[ProcessInfo]:
    pids = root / "pids"
    if not pids.is_dir():
        return []
    found: list[ProcessInfo] = []
    for f in pids.glob("*.pid"):
        try:
            pid = int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # unreadable: not something we can safely signal
        name = f.stem
        found.append(process_info(root, name, pid, pid_alive(pid) and _is_ours(pid, name)))
    return sorted(found, key=lambda p: process_order(p.name))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        # Reap it if it is our own child (start() and stop() in one process, as in the demo),
        # so that an exited child does not look alive as a zombie.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but not ours to signal; _is_ours decides
    return running(pid)


def _is_ours(pid: int, name: str) -> bool:
    """Whether `pid` still runs the funke process the pid file named: a session leader (we
    started it with start_new_session) running our module."""
    try:
        if os.getpgid(pid) != pid:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return MODULES[kind_of(name)] in (command_line(pid) or [])
