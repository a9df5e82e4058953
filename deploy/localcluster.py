"""A local multi-process cluster: one JobManager and N TaskManagers on this machine.

Owns the layout of a cluster directory and the lifecycle of the processes recorded in it:

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

Every process is started in its own session (`start_new_session`), so its pid is also its
process-group id: stopping signals the group, which takes the PySpark JVM a TaskManager started
along with it. Only pids read from our pid files are ever signalled, and only after checking
that the pid still runs a funke process of that kind (pids are reused once a process is gone).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from funke.common.configuration import ConfigurationError, parse_config_lines, parse_configuration
from funke.common.leadership import Lease
from funke.runtime.hafilesystem import holder_gone, process_identity
from funke.deploy.processgroups import kill_what_is_left, signal_group, wait_gone
from funke.deploy import zookeeperserver
from funke.runtime import security
from funke.deploy.client import FunkeError, JobManagerClient
from funke.common.security import plaintext_problem
from funke.runtime.rpc import WILDCARD_HOSTS, advertised_host
from funke.runtime.security import ClientCredentials, default_cluster_dir
from funke.runtime.haservices import HaServices, ha_services as _configured_services
from funke.v1 import jobmanager_pb2

__all__ = [
    "ADDRESS_FILE",
    "ClusterError",
    "ClusterInfo",
    "ClusterStatus",
    "ProcessInfo",
    "credentials",
    "default_cluster_dir",
    "prepare_security",
    "security_options",
    "read_address",
    "start",
    "status",
    "stop",
]

ADDRESS_FILE = "jobmanager.address"
HA_CONF = "ha.conf"
TASKMANAGER_OPTIONS = "taskmanager.options"
JOBMANAGER_OPTIONS = "jobmanager.options"
JOBMANAGERS_DIR = "jobmanagers"  # with high availability: each JobManager's own address and URL
STANDALONE_DIR = "spark-standalone"
STANDALONE_EXECUTOR_MEMORY_MB = 512
STANDALONE_URLS = "urls.json"
HA_CLUSTER_ID = "default"
JOBMANAGER = "jobmanager"
ZOOKEEPER = "zookeeper"
HA_MODES = ("none", "filesystem", "zookeeper")
TLS_MODES = ("none", "tls", "mtls")  # plaintext; TLS; mutual TLS (every caller shows a certificate too)
_TLS_MODE_FILE = "mode"  # in security/tls/: which of TLS_MODES the material is for
# What each kind of process runs: the marker its command line must hold to be ours.
_MODULES = {JOBMANAGER: "funke.jobmanager.main", "tm": "funke.taskmanager.main",
            ZOOKEEPER: zookeeperserver.MAIN_CLASS}


def _kind(name: str) -> str:
    if name == ZOOKEEPER:
        return ZOOKEEPER
    return JOBMANAGER if name == JOBMANAGER or name.startswith(JOBMANAGER + "-") else "tm"


def is_jobmanager(name: str) -> bool:
    return _kind(name) == JOBMANAGER


def _jobmanager_files(root: Path, name: str, ha: bool) -> tuple[Path, Path]:
    """Where JobManager `name` writes its address and dashboard URL once it serves. Without
    high availability the one JobManager's are the cluster's (`jobmanager.address`); with it
    each JobManager's own, beside the others', never where a client looks for the leader."""
    if ha:
        return root / JOBMANAGERS_DIR / f"{name}.address", root / JOBMANAGERS_DIR / f"{name}.url"
    return root / ADDRESS_FILE, root / f"{JOBMANAGER}.url"


_LOG_TAIL_LINES = 30
_POLL_S = 0.1


class ClusterError(Exception):
    """Starting, stopping or inspecting a local cluster failed; the message says why and, for a
    process that died, ends with the tail of its log."""


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
class ClusterInfo:
    dir: Path
    address: str
    jobmanager: ProcessInfo  # the leader, with high availability
    taskmanagers: tuple[ProcessInfo, ...]
    slots_per_taskmanager: int
    data_dir: str
    standbys: tuple[ProcessInfo, ...] = ()
    high_availability: str = "none"
    zookeeper_quorum: str = ""  # with ZooKeeper: the quorum every process uses
    zookeeper: ProcessInfo | None = None  # the cluster's own ZooKeeper server, if it started one
    spark_master: str = ""  # the cluster's own Spark standalone master, if it started one
    dashboard_url: str = ""  # the leader's web dashboard and REST API

    def client(self, **kw: object) -> JobManagerClient:
        """A client of this cluster's JobManager (with its tokens, and TLS if it runs with it);
        keyword arguments go to JobManagerClient."""
        return JobManagerClient(self.address, credentials=credentials(self.dir), **kw)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    dir: Path
    processes: tuple[ProcessInfo, ...]  # jobmanager first, then TaskManagers by number
    address: str | None
    overview: jobmanager_pb2.ClusterOverview | None  # None: no JobManager answered
    error: str = ""  # why there is no overview, if a JobManager should have answered
    high_availability: str = "none"
    lease: Lease | None = None  # with high availability: the lease as written

    @property
    def running(self) -> bool:
        return bool(self.processes) and all(p.alive for p in self.processes) and self.overview is not None


@dataclass(slots=True)
class _Started:
    """What start() launched so far, so that a failure stops exactly that."""

    dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


def credentials(dir: str | os.PathLike[str]) -> ClientCredentials:
    """What a client of the cluster recorded in `dir` presents: its client token and, if it
    runs with TLS, its CA and client certificate."""
    return ClientCredentials.for_cluster(Path(dir).expanduser().resolve())


def _client(root: Path, address: str, timeout: float) -> JobManagerClient:
    return JobManagerClient(address, timeout=timeout, credentials=credentials(root))


def prepare_security(dir: str | os.PathLike[str], tls: str = "none", host: str | None = None,
                     tls_hosts: Sequence[str] = ()) -> Path:
    """The cluster's tokens (kept across restarts; generated the first time) and, with TLS, a
    fresh certificate authority and certificates for this machine's names and addresses and
    `tls_hosts`. Returns the security directory (what a process on another host needs of it:
    see the README's Security section)."""
    root = Path(dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    if tls not in TLS_MODES:
        raise ClusterError(f"TLS {tls!r}: expected one of {', '.join(TLS_MODES)}")
    folder = root / security.SECURITY_DIR
    try:
        security.ensure_token(folder / security.CLIENT_TOKEN, "client token file")
        security.ensure_token(folder / security.CLUSTER_TOKEN, "cluster token file")
    except security.SecurityError as exc:
        raise ClusterError(f"the cluster's secrets: {exc}") from None
    tls_dir = folder / security.TLS_DIR
    if tls == "none":
        shutil.rmtree(tls_dir, ignore_errors=True)  # a client must not try TLS with a plaintext cluster
        return folder
    advertised = advertised_host(host, None) if host in WILDCARD_HOSTS else None
    security.generate_tls(tls_dir, [*security.local_host_names(host, advertised), *tls_hosts])
    (tls_dir / _TLS_MODE_FILE).write_text(tls + "\n")
    return folder


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
    mode_file = Path(dir).expanduser() / security.SECURITY_DIR / security.TLS_DIR / _TLS_MODE_FILE
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
    _, url_file = _jobmanager_files(root, _leader_name(root) if ha else JOBMANAGER, ha)
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


# --------------------------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------------------------


def start(
    dir: str | os.PathLike[str],
    taskmanagers: int,
    slots: int,
    port: int = 0,
    data_dir: str | None = None,
    dynamic: Iterable[str] = (),
    no_spark: bool = False,
    timeout: float = 120,
    ha: str = "none",
    jobmanagers: int = 1,
    zookeeper_quorum: str | None = None,
    ha_options: Mapping[str, str] | None = None,
    host: str | None = None,
    taskmanager_options: Sequence[str] = (),
    spark_workers: int = 0,
    tls: str = "none",
    insecure: bool = False,
    tls_hosts: Sequence[str] = (),
) -> ClusterInfo:
    """Start a JobManager and `taskmanagers` TaskManagers with `slots` slots each, recorded in
    `dir`. Returns once the JobManager serves and every TaskManager is registered; otherwise
    stops whatever it started and raises ClusterError. `dynamic` holds `KEY=VALUE` entries for
    the JobManager's configuration (its -D flags). With `ha="filesystem"` or `"zookeeper"`,
    `jobmanagers` JobManagers contend for leadership (one leads, the others stand by); jobs a
    stopped HA cluster suspended are recovered when it starts again on the same directory.
    ZooKeeper: the quorum given, else a ZooKeeper server of the cluster's own (process
    `zookeeper`); `ha_options` are more high-availability.* keys for every process. `host`: the
    address every process binds (default 127.0.0.1; 0.0.0.0 for other machines to reach them);
    `taskmanager_options`: more flags for every TaskManager (`--spark-master URL`,
    `--spark-conf K=V`...), kept for TaskManagers started later with `start_taskmanager`.
    `spark_workers` > 0: a Spark standalone Master and that many Workers from pip's PySpark
    (`funke.deploy.sparkstandalone`, recorded in <dir>/spark-standalone), enough cores for every
    slot, and the TaskManagers run their Spark stages there instead of in local mode.

    Every process gets the cluster's tokens (<dir>/security); `tls="tls"` or `"mtls"` makes a
    certificate authority and certificates for this machine and serves every gRPC port with
    TLS (mutual: every caller shows a certificate too); the processes' certificate names this
    machine and `tls_hosts` (other machines whose TaskManagers use it). Off loopback (`host`
    0.0.0.0, say) plaintext is refused unless `insecure`."""
    if ha not in HA_MODES:
        raise ClusterError(f"high availability {ha!r}: expected one of {', '.join(HA_MODES)}")
    if zookeeper_quorum and ha != "zookeeper":
        raise ClusterError("a ZooKeeper quorum is only used with high availability zookeeper (--ha zookeeper)")
    if jobmanagers < 1 or (jobmanagers > 1 and ha == "none"):
        raise ClusterError(f"{jobmanagers} JobManagers: more than one needs high availability (--ha filesystem)"
                           if jobmanagers > 1 else f"a cluster needs at least one JobManager, got {jobmanagers}")
    if taskmanagers < 0:
        raise ClusterError(f"the number of TaskManagers must be 0 or more, got {taskmanagers}")
    if slots < 1:
        raise ClusterError(f"each TaskManager needs at least 1 slot, got {slots}")
    root = Path(dir).expanduser().resolve()
    for sub in (root, root / "log", root / "pids"):
        sub.mkdir(parents=True, exist_ok=True)
    alive = [p for p in _recorded(root) if p.alive]
    if alive:
        listing = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
        recover = ""
        if (root / HA_CONF).is_file() and not any(is_jobmanager(p.name) for p in alive):
            recover = (f"; its JobManagers are gone: start one again with `funke cluster add-jobmanager --dir "
                       f"{root}` (the TaskManagers and the jobs stay), or")
        raise ClusterError(
            f"a cluster recorded in {root} is still running: {listing}{recover}; stop it with "
            f"`funke cluster stop --dir {root}`"
        )
    _forget(root)  # pid files of dead processes and a stale address must not mislead anyone
    problem = plaintext_problem("the cluster", host or "127.0.0.1", tls != "none", insecure)
    if problem is not None:
        raise ClusterError(problem.replace("pass --insecure", "pass --insecure (or --tls)"))
    prepare_security(root, tls, host, tls_hosts)
    ha_conf = root / HA_CONF
    ha_conf.unlink(missing_ok=True)
    if spark_workers < 0:
        raise ClusterError(f"the number of Spark workers must be 0 or more, got {spark_workers}")
    if spark_workers and (no_spark or any(o in ("--spark-master", "--spark-remote") for o in taskmanager_options)):
        raise ClusterError("a Spark standalone cluster of its own is one Spark target; --no-spark, "
                           "--spark-master and --spark-remote are others")
    host_args = ["--host", host, *(["--insecure"] if insecure else [])] if host else []
    tm_options = [*host_args, *taskmanager_options, *(["--no-spark"] if no_spark else [])]
    data = data_dir or str(root / "data")
    if "://" not in data:
        # The processes run in the cluster dir; a relative path meant the caller's cwd.
        data = str(Path(data).expanduser().resolve())

    started = _Started(root)
    deadline = time.monotonic() + timeout
    ok = False
    spark_master = ""
    try:
        if spark_workers:
            spark_master = _start_standalone(root, spark_workers, taskmanagers * slots, taskmanagers, host,
                                             max(deadline - time.monotonic(), 1))
            tm_options += ["--spark-master", spark_master]
            if not any(o.startswith("spark.executor.memory=") for o in taskmanager_options):
                # room for every TaskManager's executor on every Worker
                tm_options += ["--spark-conf", f"spark.executor.memory={STANDALONE_EXECUTOR_MEMORY_MB}m"]
        (root / TASKMANAGER_OPTIONS).write_text(json.dumps(tm_options))
        if ha == "zookeeper" and not zookeeper_quorum:
            zookeeper_quorum = _start_zookeeper(started, deadline)
        if ha != "none":
            _write_ha_conf(root, ha, zookeeper_quorum, ha_options or {})
            (root / JOBMANAGERS_DIR).mkdir(exist_ok=True)
        ha_args = ["--config", str(ha_conf)] if ha != "none" else []
        jm_options = ["--data-dir", data, *host_args]
        for entry in dynamic:
            jm_options += ["-D", entry]
        (root / JOBMANAGER_OPTIONS).write_text(json.dumps(jm_options))
        jm_names = [JOBMANAGER] + [f"{JOBMANAGER}-{i}" for i in range(2, jobmanagers + 1)]
        for i, name in enumerate(jm_names):
            address_file, url_file = _jobmanager_files(root, name, ha != "none")
            jm_args = ["--port", str(port if i == 0 else 0), "--address-file", str(address_file),
                       "--rest-url-file", str(url_file), *jm_options, *ha_args, *security_options(root)]
            _launch(started, name, jm_args)
        for name in jm_names:
            _wait_for_address(started, _jobmanager_files(root, name, ha != "none")[0], deadline)
        address = _wait_for_leader(started, root, deadline) if ha != "none" else read_address(root) or ""

        tm_names = [f"tm-{i}" for i in range(1, taskmanagers + 1)]
        for name in tm_names:
            tm_args = ["--jobmanager", address, "--slots", str(slots), "--id", name, *tm_options, *ha_args,
                       *security_options(root)]
            _launch(started, name, tm_args)

        with _client(root, address, timeout=5) as client:
            try:
                client.wait_until_ready(max(deadline - time.monotonic(), 0.1))
            except FunkeError as exc:
                _fail(started, JOBMANAGER, f"the JobManager at {address} did not become ready: {exc}")
            _wait_for_registrations(started, client, tm_names, deadline)
        ok = True
        lead = _leader_name(root) if ha != "none" else JOBMANAGER
        return ClusterInfo(
            dir=root,
            address=address,
            jobmanager=_info(root, lead, started.processes[lead].pid, True),
            taskmanagers=tuple(_info(root, n, started.processes[n].pid, True) for n in tm_names),
            slots_per_taskmanager=slots,
            data_dir=data,
            standbys=tuple(_info(root, n, started.processes[n].pid, True) for n in jm_names if n != lead),
            high_availability=ha,
            zookeeper_quorum=zookeeper_quorum or "",
            zookeeper=(_info(root, ZOOKEEPER, started.processes[ZOOKEEPER].pid, True)
                       if ZOOKEEPER in started.processes else None),
            spark_master=spark_master,
            dashboard_url=dashboard_url(root) or "",
        )
    finally:
        if not ok:  # includes KeyboardInterrupt: never leave half a cluster behind
            stop(root)


def _start_standalone(root: Path, workers: int, cores: int, taskmanagers: int, host: str | None,
                      timeout: float) -> str:
    """The cluster's own Spark standalone Master and Workers; the Master's URL. Workers get
    enough cores for every slot between them, and memory for one executor of each TaskManager."""
    from funke.deploy import sparkstandalone
    from funke.runtime.rpc import advertised_host

    memory_mb = max(1024, STANDALONE_EXECUTOR_MEMORY_MB * max(taskmanagers, 1))
    try:
        info = sparkstandalone.start(root / STANDALONE_DIR, workers, host=advertised_host(host or "127.0.0.1", None),
                                     cores_per_worker=max(1, -(-cores // workers)), memory=f"{memory_mb}m",
                                     timeout=timeout)
    except sparkstandalone.StandaloneError as exc:
        raise ClusterError(f"the Spark standalone cluster did not start: {exc}") from None
    (root / STANDALONE_DIR / STANDALONE_URLS).write_text(
        json.dumps({"master_url": info.master_url, "web_url": info.web_url}))
    return info.master_url


def standalone_urls(dir: str | os.PathLike[str]) -> tuple[str, str] | None:
    """The master URL and web UI of the cluster's own Spark standalone cluster, if it has one."""
    try:
        urls = json.loads((Path(dir).expanduser().resolve() / STANDALONE_DIR / STANDALONE_URLS).read_text())
        return str(urls["master_url"]), str(urls["web_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stop_standalone(root: Path, timeout: float) -> list[tuple[ProcessInfo, str]]:
    if not (root / STANDALONE_DIR / "pids").is_dir():
        return []
    from funke.deploy import sparkstandalone

    pids = {}
    for f in (root / STANDALONE_DIR / "pids").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pids[f.stem] = int(f.read_text().split()[0])
    outcomes = sparkstandalone.stop(root / STANDALONE_DIR, timeout)
    (root / STANDALONE_DIR / STANDALONE_URLS).unlink(missing_ok=True)
    return [(ProcessInfo(f"spark-{name}", pids.get(name, 0), False, root / STANDALONE_DIR / "log" / f"{name}.log"),
             outcome) for name, outcome in outcomes.items()]


def _write_ha_conf(root: Path, ha: str, quorum: str | None, options: Mapping[str, str]) -> None:
    entries = {"high-availability.type": ha, "high-availability.storageDir": str(root / "ha"),
               # One ZooKeeper may serve many clusters: each has its own nodes.
               "high-availability.cluster-id": HA_CLUSTER_ID if ha == "filesystem" else _cluster_id(root)}
    if quorum:
        entries["high-availability.zookeeper.quorum"] = quorum
    entries.update(options)
    text = "".join(f"{k}: {v}\n" for k, v in entries.items())
    try:
        parse_configuration(parse_config_lines(text, HA_CONF))
    except ConfigurationError as exc:
        raise ClusterError(str(exc)) from None
    (root / HA_CONF).write_text(text)


def _cluster_id(root: Path) -> str:
    return "local-" + hashlib.sha256(str(root).encode()).hexdigest()[:12]


def _start_zookeeper(started: _Started, deadline: float) -> str:
    """The cluster's own ZooKeeper server (data kept in <dir>/zookeeper across restarts of the
    cluster); its address once it answers."""
    try:
        argv, address = zookeeperserver.prepare(started.dir / ZOOKEEPER)
    except zookeeperserver.ZooKeeperUnavailable as exc:
        raise ClusterError(f"{exc}; or give the quorum of a running ZooKeeper (--zookeeper-quorum)") from None
    _launch(started, ZOOKEEPER, argv)
    if not zookeeperserver.wait_ready(address, started.processes[ZOOKEEPER], max(deadline - time.monotonic(), 1)):
        _check_alive(started)
        _fail(started, ZOOKEEPER, f"the ZooKeeper server at {address} did not answer")
    return address


def start_taskmanager(dir: str | os.PathLike[str], name: str, slots: int, no_spark: bool = False,
                      timeout: float = 120) -> ProcessInfo:
    """Start one more TaskManager (or a replacement with a dead one's name) in a running cluster
    and return once it is registered."""
    root = Path(dir).expanduser().resolve()
    address = read_address(root)
    if address is None:
        raise ClusterError(f"no running cluster recorded in {root}")
    alive = [p for p in _recorded(root) if p.name == name and p.alive]
    if alive:
        raise ClusterError(f"{name} (pid {alive[0].pid}) is still running")
    started = _Started(root)
    args = ["--jobmanager", address, "--slots", str(slots), "--id", name, *_taskmanager_options(root),
            *security_options(root)]
    args += ["--no-spark"] if no_spark and "--no-spark" not in args else []
    if (root / HA_CONF).is_file():
        args += ["--config", str(root / HA_CONF)]
    _launch(started, name, args, again="funke cluster add-taskmanager")
    with _client(root, address, timeout=5) as client:
        _wait_for_registrations(started, client, [name], time.monotonic() + timeout)
    return _info(root, name, started.processes[name].pid, True)


def _taskmanager_options(root: Path) -> list[str]:
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
    running = {p.name for p in _recorded(root) if p.alive}
    n = 1
    while (name := JOBMANAGER if n == 1 else f"{JOBMANAGER}-{n}") in running:
        n += 1
    return name


def start_jobmanager(dir: str | os.PathLike[str], name: str | None = None, data_dir: str | None = None,
                     dynamic: Iterable[str] = (), timeout: float = 60) -> ProcessInfo:
    """Start a JobManager (a replacement with a dead one's name, one more standby, or the first
    again after every JobManager died: `next_jobmanager_name` if `name` is None) in a
    high-availability cluster whose other processes may run on; with the flags the cluster's
    JobManagers were started with (`data_dir` and `dynamic` override and add). Returns once it
    serves, as leader or standby."""
    root = Path(dir).expanduser().resolve()
    if not (root / HA_CONF).is_file():
        raise ClusterError(f"the cluster in {root} runs without high availability: it has one JobManager "
                           f"(start it again with `funke cluster start --dir {root}` once it is stopped)")
    name = name or next_jobmanager_name(root)
    if not is_jobmanager(name):
        raise ClusterError(f"{name!r} is no JobManager name: jobmanager or jobmanager-<suffix>")
    recorded = _recorded(root)
    alive = [p for p in recorded if p.name == name and p.alive]
    if alive:
        raise ClusterError(f"{name} (pid {alive[0].pid}) is still running")
    if any(p.name == ZOOKEEPER and not p.alive for p in recorded):
        raise ClusterError(f"the cluster's own ZooKeeper server is not running: no JobManager can be elected; "
                           f"stop the cluster (`funke cluster stop --dir {root}`) and start it again (jobs are kept)")
    options = _jobmanager_options(root)
    if data_dir is not None:
        options = _without_flag(options, "--data-dir") + ["--data-dir", data_dir]
    elif "--data-dir" not in options:
        options += ["--data-dir", str(root / "data")]
    for entry in dynamic:
        options += ["-D", entry]
    started = _Started(root)
    (root / JOBMANAGERS_DIR).mkdir(exist_ok=True)
    address_file, url_file = _jobmanager_files(root, name, True)
    address_file.unlink(missing_ok=True)
    args = ["--port", "0", "--address-file", str(address_file), "--rest-url-file", str(url_file), *options,
            "--config", str(root / HA_CONF), *security_options(root)]
    _launch(started, name, args, again="funke cluster add-jobmanager")
    _wait_for_address(started, address_file, time.monotonic() + timeout)
    return _info(root, name, started.processes[name].pid, True)


def _jobmanager_options(root: Path) -> list[str]:
    """The flags the cluster's JobManagers were started with (`start(data_dir=, host=, dynamic=)`)."""
    try:
        options = json.loads((root / JOBMANAGER_OPTIONS).read_text())
    except (OSError, ValueError):
        return []
    return [str(o) for o in options] if isinstance(options, list) else []


def _without_flag(args: list[str], flag: str) -> list[str]:
    """`args` without `flag VALUE`."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        else:
            out.append(arg)
    return out


def kill(dir: str | os.PathLike[str], name: str, signum: int = signal.SIGKILL) -> int:
    """SIGKILL a recorded process and everything it started (its session: for a TaskManager,
    the Spark JVM and Python workers too), as if its machine died; or send it `signum` (SIGTERM:
    a graceful stop, SIGSTOP: a long pause). Returns the pid."""
    root = Path(dir).expanduser().resolve()
    for p in _recorded(root):
        if p.name == name and p.alive:
            signal_group(p.pid, signum)
            return p.pid
    raise ClusterError(f"no running process named {name} in {root}")


def _launch(started: _Started, name: str, args: Sequence[str], again: str = "") -> None:
    """Start a funke process (`python -m <module> args`), or the ZooKeeper server (`args` is its
    whole command). `again`: what starts a process that may have run before under this name (a
    replacement of a dead one): its log goes on after a line saying so, keeping what the earlier
    process wrote (how it died); otherwise the log starts empty."""
    command = list(args) if _kind(name) == ZOOKEEPER else [sys.executable, "-m", _MODULES[_kind(name)], *args]
    log_path = started.dir / "log" / f"{name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # log lines must reach the file as they happen
    with open(log_path, "ab" if again else "wb") as log:
        if again and log.tell() > 0:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n===== {stamp} {name} started again ({again}); what is above is the earlier "
                      f"process's =====\n".encode())
            log.flush()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            # The cluster dir, not the caller's cwd: whatever a process writes beside itself
            # (Spark's scratch files) stays inside the cluster's directory.
            cwd=started.dir, env=env, start_new_session=True,
        )
    started.processes[name] = process
    _pid_file(started.dir, name).write_text(f"{process.pid}\n")


def _wait_for_address(started: _Started, address_file: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        _check_alive(started)
        try:
            address = address_file.read_text().strip()
        except FileNotFoundError:
            address = ""
        if address:
            return address
        time.sleep(_POLL_S)
    name = address_file.stem if address_file.name != ADDRESS_FILE else JOBMANAGER
    _fail(started, name, f"{name} did not write its address in time")
    raise AssertionError("unreachable")


def _wait_for_leader(started: _Started, root: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        _check_alive(started)
        address = read_address(root)
        if address:
            return address
        time.sleep(_POLL_S)
    _fail(started, JOBMANAGER, "no JobManager was elected leader in time")
    raise AssertionError("unreachable")


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
        time.sleep(_POLL_S)


def leader_name(dir: str | os.PathLike[str]) -> str:
    """With high availability: the recorded JobManager that leads (`jobmanager` if none)."""
    return _leader_name(Path(dir).expanduser().resolve())


def _leader_name(root: Path, lease: Lease | None = None) -> str:
    """The recorded JobManager that holds the lease (by its pid), else `jobmanager`."""
    lease = leader(root) if lease is None else lease
    if lease is not None:
        pid = lease.holder.split(":")[1] if lease.holder.count(":") >= 2 else ""
        for p in _recorded(root):
            if is_jobmanager(p.name) and str(p.pid) == pid:
                return p.name
    return JOBMANAGER


def _wait_for_registrations(started: _Started, client: JobManagerClient, names: list[str], deadline: float) -> None:
    missing = set(names)
    last_error = ""
    while True:
        _check_alive(started)
        try:
            overview = client.cluster_overview()
            missing = set(names) - {tm.id for tm in overview.task_managers}
            last_error = ""
        except FunkeError as exc:
            last_error = str(exc)
        if not missing and not last_error:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    if last_error:
        _fail(started, JOBMANAGER, f"the JobManager stopped answering: {last_error}")
    first = sorted(missing, key=_order)[0]
    _fail(started, first,
          f"TaskManager(s) {', '.join(sorted(missing, key=_order))} did not register in time")


def _check_alive(started: _Started) -> None:
    for name, process in started.processes.items():
        code = process.poll()
        if code is not None:
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            _fail(started, name, f"{name} {how} during startup")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _fail(started: _Started, name: str, message: str) -> None:
    log = started.dir / "log" / f"{name}.log"
    tail = _tail(log)
    detail = f"\n--- last lines of {log} ---\n{tail}" if tail else f" (its log {log} is empty)"
    raise ClusterError(f"{message}{detail}")


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# stop
# --------------------------------------------------------------------------------------------


def stop(dir: str | os.PathLike[str], timeout: float = 15) -> list[tuple[ProcessInfo, str]]:
    """Stop the processes recorded in `dir`: SIGTERM to each process group (TaskManagers first,
    as Flink's stop-cluster does), SIGKILL to what is left after `timeout` seconds. Returns
    each recorded process with what happened to it ("stopped", "killed", "not running").
    With high availability, JobManagers of this machine that joined the cluster without this
    launcher (the HA services know them; see `status`) are stopped too, by their pid once it is
    checked to be that very JobManager; one on another machine is left to its machine.
    Removes the pid files and the address file; an empty or unknown dir is not an error."""
    root = Path(dir).expanduser().resolve()
    recorded = _recorded(root)
    outcome: dict[str, str] = {p.name: "not running" for p in recorded if not p.alive}
    live = [p for p in recorded if p.alive]
    deadline = time.monotonic() + timeout
    taskmanagers = [p for p in live if _kind(p.name) == "tm"]
    # Standbys before the leader: a standby must not take over the jobs the leader suspends.
    lease = leader(root) if _ha_reachable(root, recorded) else None
    lead = _leader_name(root, lease)
    joined = _joined_jobmanagers(root, recorded, lease)
    standbys = [p for p in live if is_jobmanager(p.name) and p.name != lead]
    jobmanager = [p for p in live if p.name == lead]
    joined_standbys = [(p, h) for p, h in joined if not (lease is not None and h == lease.holder)]
    joined_leader = [(p, h) for p, h in joined if lease is not None and h == lease.holder]
    # The cluster's ZooKeeper last: the leader records the suspension of its jobs there.
    zookeeper = [p for p in live if p.name == ZOOKEEPER]
    spark: list[tuple[ProcessInfo, str]] = []
    for group, others in ((taskmanagers, []), (standbys, joined_standbys), (jobmanager, joined_leader),
                          (zookeeper, [])):
        for p in group:
            signal_group(p.pid, signal.SIGTERM)
        for p, holder in others:
            outcome[p.name] = _stop_joined(p, holder, signal.SIGTERM)
        # The JobManager gets at least a moment even when the TaskManagers used up the time.
        _wait_gone(group, max(deadline, time.monotonic() + 2.0))
        wait_gone((p.pid for p, _ in others if outcome[p.name] == "stopping"), _alive,
                  max(deadline, time.monotonic() + 2.0), _POLL_S)
        if group is taskmanagers:  # their Spark applications are over: the Workers and Master go
            spark = _stop_standalone(root, max(deadline - time.monotonic(), 5.0))
    for p in live:
        # A process that ended may have left children (a TaskManager's Spark JVM) behind.
        outcome[p.name] = {"killed": f"killed (still running after {timeout:g} s)",
                           "left-overs killed": "stopped (left-over child processes killed)",
                           "stopped": "stopped"}[kill_what_is_left(p.pid, _alive)]
    for p, holder in joined:
        if outcome[p.name] == "stopping":
            outcome[p.name] = _stop_joined(p, holder, signal.SIGKILL) if _alive(p.pid) else "stopped"
    _forget(root)
    for key in [k for k in _services if k[0] == str(root)]:
        _services.pop(key).close()  # a ZooKeeper session to a server that is gone now
    return [(p, outcome[p.name]) for p in recorded] + [(p, outcome[p.name]) for p, _ in joined] + spark


def _stop_joined(p: ProcessInfo, holder: str, signum: int) -> str:
    """Signal a JobManager that joined the cluster without this launcher, if it is still the
    process the HA services name (host, pid and start time) and runs a funke JobManager."""
    if p.host != socket.gethostname():
        return f"on {p.host}: not stopped from here"
    if process_identity(p.pid) != holder or not _runs_a_jobmanager(p.pid):
        return "not running"
    try:
        os.kill(p.pid, signum)  # this process alone: it did not start in a group of ours
    except ProcessLookupError:
        return "stopped"
    if signum == signal.SIGKILL:
        wait_gone([p.pid], _alive, time.monotonic() + 5.0, _POLL_S)
        return "killed (still running after the timeout)"
    return "stopping"






def _wait_gone(processes: Sequence[ProcessInfo], deadline: float) -> None:
    wait_gone((p.pid for p in processes), _alive, deadline, _POLL_S)


def _forget(root: Path) -> None:
    pids = root / "pids"
    if pids.is_dir():
        for f in pids.glob("*.pid"):
            f.unlink(missing_ok=True)
    (root / ADDRESS_FILE).unlink(missing_ok=True)
    for f in [*root.glob(f"{JOBMANAGER}-*.address"), *root.glob(f"{JOBMANAGER}*.url"),
              *(root / JOBMANAGERS_DIR).glob("*.address"), *(root / JOBMANAGERS_DIR).glob("*.url")]:
        f.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------


def status(dir: str | os.PathLike[str], timeout: float = 5) -> ClusterStatus:
    """The processes recorded in `dir`, whether each is alive, and the JobManager's overview.
    With high availability also every JobManager the HA services know that this launcher did
    not start (`ProcessInfo.recorded` False: one that joined by hand), after the recorded ones."""
    root = Path(dir).expanduser().resolve()
    recorded = _recorded(root)
    ha = ha_mode(root)
    # No cluster recorded, or its own ZooKeeper is down: no leader to ask for (asking would wait).
    ask = ha == "none" or _ha_reachable(root, recorded)
    lease = leader(root) if ha != "none" and ask else None
    joined = [p for p, _ in _joined_jobmanagers(root, recorded, lease)] if ha != "none" and ask else []
    processes = tuple(recorded + joined)
    address = read_address(root) if ask else None
    overview, error = None, ""
    jm_alive = any(is_jobmanager(p.name) and p.alive for p in processes)
    if address and jm_alive:
        try:
            with _client(root, address, timeout) as client:
                overview = client.cluster_overview()
        except FunkeError as exc:
            error = str(exc)
    elif processes and not jm_alive:
        error = ("no JobManager is running; start one again with `funke cluster add-jobmanager` (the "
                 "TaskManagers and the stored jobs wait for it)" if ha != "none" else "the JobManager is not running")
    elif jm_alive:
        error = ("no JobManager leads right now (an election is under way)" if ha != "none"
                 else "the JobManager has not written its address yet")
    return ClusterStatus(root, processes, address, overview, error, ha, lease)


# --------------------------------------------------------------------------------------------
# pid files and process checks
# --------------------------------------------------------------------------------------------


def _ha_reachable(root: Path, recorded: Sequence[ProcessInfo]) -> bool:
    """Whether the cluster's HA services are worth asking: a cluster is recorded, and its own
    ZooKeeper server (if it has one) runs. Asking one that is down would wait for it."""
    return (root / HA_CONF).is_file() and bool(recorded) and not any(
        p.name == ZOOKEEPER and not p.alive for p in recorded)


def _joined_jobmanagers(root: Path, recorded: Sequence[ProcessInfo],
                        lease: Lease | None) -> list[tuple[ProcessInfo, str]]:
    """The JobManagers taking part in the cluster's election that are not recorded here (started
    by hand with the cluster's ha.conf, here or on another machine), each with its holder
    identity. Named `jobmanager-pid<pid>` (`@<host>` when on another machine)."""
    services = ha_services(root) if _ha_reachable(root, recorded) else None
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
        alive = not local or (process_identity(pid) == holder and _runs_a_jobmanager(pid))
        if local and not alive:
            continue
        name = f"{JOBMANAGER}-pid{pid}" + ("" if local else f"@{host}")
        found.append((ProcessInfo(name, pid, alive, _log_of(pid) if local else Path("-"), recorded=False,
                                  address=address, host=host), holder))
    return found


def _runs_a_jobmanager(pid: int) -> bool:
    """Whether `pid` runs a funke JobManager (`python -m funke.jobmanager.main`, `funke jobmanager`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _MODULES[JOBMANAGER].encode() in argv or (
        b"jobmanager" in argv and any(a.endswith(b"funke") or a == b"funke.deploy.cli" for a in argv))


def _log_of(pid: int) -> Path:
    """Where a process writes its log (its stderr, if that is a file), else "-"."""
    with contextlib.suppress(OSError):
        target = os.readlink(f"/proc/{pid}/fd/2")
        if target.startswith("/") and Path(target).is_file():
            return Path(target)
    return Path("-")


def _pid_file(root: Path, name: str) -> Path:
    return root / "pids" / f"{name}.pid"


def _info(root: Path, name: str, pid: int, alive: bool) -> ProcessInfo:
    return ProcessInfo(name, pid, alive, root / "log" / f"{name}.log")


def _order(name: str) -> tuple[int, int]:
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


def _recorded(root: Path) -> list[ProcessInfo]:
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
        found.append(_info(root, name, pid, _alive(pid) and _is_ours(pid, name)))
    return sorted(found, key=lambda p: _order(p.name))


def _alive(pid: int) -> bool:
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
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_ours(pid: int, name: str) -> bool:
    """Whether `pid` still runs the funke process the pid file named: a session leader (we
    started it with start_new_session) running our module. Without /proc, the session-leader
    check alone has to do."""
    try:
        if os.getpgid(pid) != pid:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    module = _MODULES[_kind(name)]
    if not Path("/proc/self").exists():
        return True  # no procfs (macOS): the session-leader check is all we have
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return module.encode() in cmdline
