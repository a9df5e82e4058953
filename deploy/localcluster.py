"""A local multi-process cluster: one JobManager and N TaskManagers on this machine, started,
joined and stopped.

Owns the lifecycle of the processes recorded in a cluster directory (`start` from a
`ClusterSpec`, `start_taskmanager`, `start_jobmanager`, `kill`, `stop`); the directory's layout
and what reads it (addresses, pid files, the HA configuration, `status`) are
`funke.deploy.clusterdir`, whose names this module offers too.

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
from funke.common.security import plaintext_problem
from funke.deploy import zookeeperserver
from funke.deploy.client import FunkeError, JobManagerClient
from funke.deploy.clusterdir import (  # noqa: F401 (the directory's readers, offered here too)
    ADDRESS_FILE,
    HA_CLUSTER_ID,
    HA_CONF,
    HA_MODES,
    JOBMANAGER,
    JOBMANAGER_OPTIONS,
    JOBMANAGERS_DIR,
    MODULES,
    POLL_S,
    STANDALONE_DIR,
    STANDALONE_URLS,
    TASKMANAGER_OPTIONS,
    TLS_MODE_FILE,
    TLS_MODES,
    ZOOKEEPER,
    ClusterError,
    ClusterRefused,
    ClusterStatus,
    ProcessInfo,
    client_of,
    close_ha_services,
    credentials,
    dashboard_url,
    ha_mode,
    ha_reachable,
    ha_services,
    is_jobmanager,
    jobmanager_files,
    jobmanager_options,
    joined_jobmanagers,
    kind_of,
    leader,
    leader_name,
    next_jobmanager_name,
    pid_alive,
    pid_file,
    process_info,
    process_order,
    read_address,
    recorded_processes,
    runs_a_jobmanager,
    security_options,
    standalone_urls,
    status,
    taskmanager_options,
    tls_mode,
    wait_for_leader,
)
from funke.deploy.processgroups import kill_what_is_left, signal_group, wait_gone
from funke.runtime import security
from funke.runtime.hafilesystem import process_identity
from funke.runtime.rpc import WILDCARD_HOSTS, advertised_host
from funke.runtime.security import default_cluster_dir  # noqa: F401 (callers find it here)

__all__ = [
    "ADDRESS_FILE",
    "ClusterError",
    "ClusterRefused",
    "ClusterInfo",
    "ClusterSpec",
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

STANDALONE_EXECUTOR_MEMORY_MB = 512


_LOG_TAIL_LINES = 30


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


@dataclass(slots=True)
class _Started:
    """What start() launched so far, so that a failure stops exactly that."""

    dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


def prepare_security(dir: str | os.PathLike[str], tls: str = "none", host: str | None = None,
                     tls_hosts: Sequence[str] = ()) -> Path:
    """The cluster's tokens (kept across restarts; generated the first time) and, with TLS, a
    fresh certificate authority and certificates for this machine's names and addresses and
    `tls_hosts`. Returns the security directory (what a process on another host needs of it:
    see docs/operations/security.md)."""
    root = Path(dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    if tls not in TLS_MODES:
        raise ClusterRefused(f"TLS {tls!r}: expected one of {', '.join(TLS_MODES)}")
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
    (tls_dir / TLS_MODE_FILE).write_text(tls + "\n")
    return folder


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What `start` starts: `taskmanagers` TaskManagers with `slots` slots each, recorded in `dir`.

    `dynamic`: `KEY=VALUE` entries for the JobManager's configuration (its -D flags). `ha`
    "filesystem" or "zookeeper": `jobmanagers` JobManagers contend for leadership (one leads, the
    others stand by); jobs a stopped HA cluster suspended are recovered when it starts again on
    the same directory. ZooKeeper: `zookeeper_quorum`, else a ZooKeeper server of the cluster's
    own (process `zookeeper`); `ha_options` are more high-availability.* keys for every process.
    `host`: the address every process binds (default 127.0.0.1; 0.0.0.0 for other machines to
    reach them); `taskmanager_options`: more flags for every TaskManager (`--spark-master URL`,
    `--spark-conf K=V`...), kept for TaskManagers started later with `start_taskmanager`.
    `spark_workers` > 0: a Spark standalone Master and that many Workers from pip's PySpark
    (`funke.deploy.sparkstandalone`, recorded in <dir>/spark-standalone), enough cores for every
    slot, and the TaskManagers run their Spark stages there instead of in local mode.

    Every process gets the cluster's tokens (<dir>/security); `tls` "tls" or "mtls" makes a
    certificate authority and certificates for this machine and serves every gRPC port with
    TLS (mutual: every caller shows a certificate too); the processes' certificate names this
    machine and `tls_hosts` (other machines whose TaskManagers use it). Off loopback (`host`
    0.0.0.0, say) plaintext is refused unless `insecure`. `owner`: the processes stop on their own
    once that process has ended (an embedded mini cluster's owner; `funke.runtime.owner`)."""

    dir: str | os.PathLike[str]
    taskmanagers: int
    slots: int
    port: int = 0
    data_dir: str | None = None
    dynamic: Sequence[str] = ()
    no_spark: bool = False
    timeout: float = 120
    ha: str = "none"
    jobmanagers: int = 1
    zookeeper_quorum: str | None = None
    ha_options: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None
    taskmanager_options: Sequence[str] = ()
    spark_workers: int = 0
    tls: str = "none"
    insecure: bool = False
    tls_hosts: Sequence[str] = ()
    owner: str = ""  # `PID:START` (funke.runtime.owner): every process stops once that process ended


def start(spec: ClusterSpec) -> ClusterInfo:
    """Start the cluster `spec` describes. Returns once the JobManager serves and every
    TaskManager is registered; otherwise stops whatever it started and raises ClusterError."""
    _check(spec)
    root = Path(spec.dir).expanduser().resolve()
    for sub in (root, root / "log", root / "pids"):
        sub.mkdir(parents=True, exist_ok=True)
    alive = [p for p in recorded_processes(root) if p.alive]
    if alive:
        listing = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
        recover = ""
        if (root / HA_CONF).is_file() and not any(is_jobmanager(p.name) for p in alive):
            recover = (f"; its JobManagers are gone: start one again with `funke cluster add-jobmanager --dir "
                       f"{root}` (the TaskManagers and the jobs stay), or")
        raise ClusterRefused(
            f"a cluster recorded in {root} is still running: {listing}{recover}; stop it with "
            f"`funke cluster stop --dir {root}`"
        )
    _forget(root)  # pid files of dead processes and a stale address must not mislead anyone
    problem = plaintext_problem("the cluster", spec.host or "127.0.0.1", spec.tls != "none", spec.insecure)
    if problem is not None:
        raise ClusterRefused(problem.replace("pass --insecure", "pass --insecure (or --tls)"))
    prepare_security(root, spec.tls, spec.host, spec.tls_hosts)
    ha_conf = root / HA_CONF
    ha_conf.unlink(missing_ok=True)
    host_args = ["--host", spec.host, *(["--insecure"] if spec.insecure else [])] if spec.host else []
    owned = ["--owner", spec.owner] if spec.owner else []
    # The heartbeat settings too: a TaskManager derives its Spark network timeouts from them.
    heartbeats = [arg for entry in spec.dynamic if entry.strip().startswith("heartbeat.") for arg in ("-D", entry)]
    tm_options = [*host_args, *spec.taskmanager_options, *(["--no-spark"] if spec.no_spark else []), *owned,
                  *heartbeats]
    data = spec.data_dir or str(root / "data")
    if "://" not in data:
        # The processes run in the cluster dir; a relative path meant the caller's cwd.
        data = str(Path(data).expanduser().resolve())

    started = _Started(root)
    quorum = spec.zookeeper_quorum
    deadline = time.monotonic() + spec.timeout
    ok = False
    spark_master = ""
    try:
        if spec.spark_workers:
            spark_master = _start_standalone(root, spec.spark_workers, spec.taskmanagers * spec.slots,
                                             spec.taskmanagers, spec.host, max(deadline - time.monotonic(), 1))
            tm_options += ["--spark-master", spark_master]
            if not any(o.startswith("spark.executor.memory=") for o in spec.taskmanager_options):
                # room for every TaskManager's executor on every Worker
                tm_options += ["--spark-conf", f"spark.executor.memory={STANDALONE_EXECUTOR_MEMORY_MB}m"]
        (root / TASKMANAGER_OPTIONS).write_text(json.dumps(tm_options))
        if spec.ha == "zookeeper" and not quorum:
            quorum = _start_zookeeper(started, deadline)
        if spec.ha != "none":
            _write_ha_conf(root, spec.ha, quorum, spec.ha_options)
            (root / JOBMANAGERS_DIR).mkdir(exist_ok=True)
        ha_args = ["--config", str(ha_conf)] if spec.ha != "none" else []
        jm_options = ["--data-dir", data, *host_args, *owned]
        for entry in spec.dynamic:
            jm_options += ["-D", entry]
        (root / JOBMANAGER_OPTIONS).write_text(json.dumps(jm_options))
        jm_names = [JOBMANAGER] + [f"{JOBMANAGER}-{i}" for i in range(2, spec.jobmanagers + 1)]
        for i, name in enumerate(jm_names):
            address_file, url_file = jobmanager_files(root, name, spec.ha != "none")
            jm_args = ["--port", str(spec.port if i == 0 else 0), "--address-file", str(address_file),
                       "--rest-url-file", str(url_file), *jm_options, *ha_args, *security_options(root)]
            _launch(started, name, jm_args)
        for name in jm_names:
            _wait_for_address(started, jobmanager_files(root, name, spec.ha != "none")[0], deadline)
        address = _wait_for_leader(started, root, deadline) if spec.ha != "none" else read_address(root) or ""

        tm_names = [f"tm-{i}" for i in range(1, spec.taskmanagers + 1)]
        for name in tm_names:
            tm_args = ["--jobmanager", address, "--slots", str(spec.slots), "--id", name, *tm_options,
                       *ha_args, *security_options(root)]
            _launch(started, name, tm_args)

        with client_of(root, address, timeout=5) as client:
            try:
                client.wait_until_ready(max(deadline - time.monotonic(), 0.1))
            except FunkeError as exc:
                _fail(started, JOBMANAGER, f"the JobManager at {address} did not become ready: {exc}")
            _wait_for_registrations(started, client, tm_names, deadline)
        ok = True
        lead = leader_name(root) if spec.ha != "none" else JOBMANAGER
        return ClusterInfo(
            dir=root,
            address=address,
            jobmanager=process_info(root, lead, started.processes[lead].pid, True),
            taskmanagers=tuple(process_info(root, n, started.processes[n].pid, True) for n in tm_names),
            slots_per_taskmanager=spec.slots,
            data_dir=data,
            standbys=tuple(process_info(root, n, started.processes[n].pid, True) for n in jm_names if n != lead),
            high_availability=spec.ha,
            zookeeper_quorum=quorum or "",
            zookeeper=(process_info(root, ZOOKEEPER, started.processes[ZOOKEEPER].pid, True)
                       if ZOOKEEPER in started.processes else None),
            spark_master=spark_master,
            dashboard_url=dashboard_url(root) or "",
        )
    finally:
        if not ok:  # includes KeyboardInterrupt: never leave half a cluster behind
            stop(root)


def _check(spec: ClusterSpec) -> None:
    """The spec's own problems, before anything is started or written."""
    if spec.ha not in HA_MODES:
        raise ClusterRefused(f"high availability {spec.ha!r}: expected one of {', '.join(HA_MODES)}")
    if spec.zookeeper_quorum and spec.ha != "zookeeper":
        raise ClusterRefused("a ZooKeeper quorum is only used with high availability zookeeper (--ha zookeeper)")
    if spec.jobmanagers < 1 or (spec.jobmanagers > 1 and spec.ha == "none"):
        raise ClusterRefused(
            f"{spec.jobmanagers} JobManagers: more than one needs high availability (--ha filesystem)"
            if spec.jobmanagers > 1 else f"a cluster needs at least one JobManager, got {spec.jobmanagers}")
    if spec.taskmanagers < 0:
        raise ClusterRefused(f"the number of TaskManagers must be 0 or more, got {spec.taskmanagers}")
    if spec.slots < 1:
        raise ClusterRefused(f"each TaskManager needs at least 1 slot, got {spec.slots}")
    if spec.spark_workers < 0:
        raise ClusterRefused(f"the number of Spark workers must be 0 or more, got {spec.spark_workers}")
    other_spark = spec.no_spark or any(o in ("--spark-master", "--spark-remote") for o in spec.taskmanager_options)
    if spec.spark_workers and other_spark:
        raise ClusterRefused("a Spark standalone cluster of its own is one Spark target; --no-spark, "
                           "--spark-master and --spark-remote are others")


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


def _write_ha_conf(root: Path, ha: str, quorum: str | None, options: Mapping[str, str] | None) -> None:
    entries = {"high-availability.type": ha, "high-availability.storageDir": str(root / "ha"),
               # One ZooKeeper may serve many clusters: each has its own nodes.
               "high-availability.cluster-id": HA_CLUSTER_ID if ha == "filesystem" else _cluster_id(root)}
    if quorum:
        entries["high-availability.zookeeper.quorum"] = quorum
    entries.update(options or {})
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
        raise ClusterRefused(f"no running cluster recorded in {root}")
    alive = [p for p in recorded_processes(root) if p.name == name and p.alive]
    if alive:
        raise ClusterRefused(f"{name} (pid {alive[0].pid}) is still running")
    started = _Started(root)
    args = ["--jobmanager", address, "--slots", str(slots), "--id", name, *taskmanager_options(root),
            *security_options(root)]
    args += ["--no-spark"] if no_spark and "--no-spark" not in args else []
    if (root / HA_CONF).is_file():
        args += ["--config", str(root / HA_CONF)]
    _launch(started, name, args, again="funke cluster add-taskmanager")
    with client_of(root, address, timeout=5) as client:
        _wait_for_registrations(started, client, [name], time.monotonic() + timeout)
    return process_info(root, name, started.processes[name].pid, True)


def start_jobmanager(dir: str | os.PathLike[str], name: str | None = None, data_dir: str | None = None,
                     dynamic: Iterable[str] = (), timeout: float = 60) -> ProcessInfo:
    """Start a JobManager (a replacement with a dead one's name, one more standby, or the first
    again after every JobManager died: `next_jobmanager_name` if `name` is None) in a
    high-availability cluster whose other processes may run on; with the flags the cluster's
    JobManagers were started with (`data_dir` and `dynamic` override and add). Returns once it
    serves, as leader or standby."""
    root = Path(dir).expanduser().resolve()
    if not (root / HA_CONF).is_file():
        raise ClusterRefused(f"the cluster in {root} runs without high availability: it has one JobManager "
                           f"(start it again with `funke cluster start --dir {root}` once it is stopped)")
    name = name or next_jobmanager_name(root)
    if not is_jobmanager(name):
        raise ClusterRefused(f"{name!r} is no JobManager name: jobmanager or jobmanager-<suffix>")
    recorded = recorded_processes(root)
    alive = [p for p in recorded if p.name == name and p.alive]
    if alive:
        raise ClusterRefused(f"{name} (pid {alive[0].pid}) is still running")
    if any(p.name == ZOOKEEPER and not p.alive for p in recorded):
        raise ClusterRefused(f"the cluster's own ZooKeeper server is not running: no JobManager can be elected; "
                           f"stop the cluster (`funke cluster stop --dir {root}`) and start it again (jobs are kept)")
    options = jobmanager_options(root)
    if data_dir is not None:
        options = _without_flag(options, "--data-dir") + ["--data-dir", data_dir]
    elif "--data-dir" not in options:
        options += ["--data-dir", str(root / "data")]
    for entry in dynamic:
        options += ["-D", entry]
    started = _Started(root)
    (root / JOBMANAGERS_DIR).mkdir(exist_ok=True)
    address_file, url_file = jobmanager_files(root, name, True)
    address_file.unlink(missing_ok=True)
    args = ["--port", "0", "--address-file", str(address_file), "--rest-url-file", str(url_file), *options,
            "--config", str(root / HA_CONF), *security_options(root)]
    _launch(started, name, args, again="funke cluster add-jobmanager")
    _wait_for_address(started, address_file, time.monotonic() + timeout)
    return process_info(root, name, started.processes[name].pid, True)


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
    for p in recorded_processes(root):
        if p.name == name and p.alive:
            signal_group(p.pid, signum)
            return p.pid
    raise ClusterRefused(f"no running process named {name} in {root}")


def _launch(started: _Started, name: str, args: Sequence[str], again: str = "") -> None:
    """Start a funke process (`python -m <module> args`), or the ZooKeeper server (`args` is its
    whole command). `again`: what starts a process that may have run before under this name (a
    replacement of a dead one): its log goes on after a line saying so, keeping what the earlier
    process wrote (how it died); otherwise the log starts empty."""
    command = list(args) if kind_of(name) == ZOOKEEPER else [sys.executable, "-m", MODULES[kind_of(name)], *args]
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
    pid_file(started.dir, name).write_text(f"{process.pid}\n")


def _wait_for_address(started: _Started, address_file: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        _check_alive(started)
        try:
            address = address_file.read_text().strip()
        except FileNotFoundError:
            address = ""
        if address:
            return address
        time.sleep(POLL_S)
    name = address_file.stem if address_file.name != ADDRESS_FILE else JOBMANAGER
    _fail(started, name, f"{name} did not write its address in time")
    raise AssertionError("unreachable")


def _wait_for_leader(started: _Started, root: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        _check_alive(started)
        address = read_address(root)
        if address:
            return address
        time.sleep(POLL_S)
    _fail(started, JOBMANAGER, "no JobManager was elected leader in time")
    raise AssertionError("unreachable")


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
        time.sleep(POLL_S)
    if last_error:
        _fail(started, JOBMANAGER, f"the JobManager stopped answering: {last_error}")
    first = sorted(missing, key=process_order)[0]
    _fail(started, first,
          f"TaskManager(s) {', '.join(sorted(missing, key=process_order))} did not register in time")


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


def stop(dir: str | os.PathLike[str], timeout: float = 15) -> list[tuple[ProcessInfo, str]]:
    """Stop the processes recorded in `dir`: SIGTERM to each process group (TaskManagers first,
    as Flink's stop-cluster does), SIGKILL to what is left after `timeout` seconds. Returns
    each recorded process with what happened to it ("stopped", "killed", "not running").
    With high availability, JobManagers of this machine that joined the cluster without this
    launcher (the HA services know them; see `status`) are stopped too, by their pid once it is
    checked to be that very JobManager; one on another machine is left to its machine.
    Removes the pid files and the address file; an empty or unknown dir is not an error."""
    root = Path(dir).expanduser().resolve()
    recorded = recorded_processes(root)
    outcome: dict[str, str] = {p.name: "not running" for p in recorded if not p.alive}
    live = [p for p in recorded if p.alive]
    deadline = time.monotonic() + timeout
    taskmanagers = [p for p in live if kind_of(p.name) == "tm"]
    # Standbys before the leader: a standby must not take over the jobs the leader suspends.
    lease = leader(root) if ha_reachable(root, recorded) else None
    lead = leader_name(root, lease)
    joined = joined_jobmanagers(root, recorded, lease)
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
        wait_gone((p.pid for p, _ in others if outcome[p.name] == "stopping"), pid_alive,
                  max(deadline, time.monotonic() + 2.0), POLL_S)
        if group is taskmanagers:  # their Spark applications are over: the Workers and Master go
            spark = _stop_standalone(root, max(deadline - time.monotonic(), 5.0))
    for p in live:
        # A process that ended may have left children (a TaskManager's Spark JVM) behind.
        outcome[p.name] = {"killed": f"killed (still running after {timeout:g} s)",
                           "left-overs killed": "stopped (left-over child processes killed)",
                           "stopped": "stopped"}[kill_what_is_left(p.pid, pid_alive)]
    for p, holder in joined:
        if outcome[p.name] == "stopping":
            outcome[p.name] = _stop_joined(p, holder, signal.SIGKILL) if pid_alive(p.pid) else "stopped"
    _forget(root)
    close_ha_services(root)
    return [(p, outcome[p.name]) for p in recorded] + [(p, outcome[p.name]) for p, _ in joined] + spark


def _stop_joined(p: ProcessInfo, holder: str, signum: int) -> str:
    """Signal a JobManager that joined the cluster without this launcher, if it is still the
    process the HA services name (host, pid and start time) and runs a funke JobManager."""
    if p.host != socket.gethostname():
        return f"on {p.host}: not stopped from here"
    if process_identity(p.pid) != holder or not runs_a_jobmanager(p.pid):
        return "not running"
    try:
        os.kill(p.pid, signum)  # this process alone: it did not start in a group of ours
    except ProcessLookupError:
        return "stopped"
    if signum == signal.SIGKILL:
        wait_gone([p.pid], pid_alive, time.monotonic() + 5.0, POLL_S)
        return "killed (still running after the timeout)"
    return "stopping"


def _wait_gone(processes: Sequence[ProcessInfo], deadline: float) -> None:
    wait_gone((p.pid for p in processes), pid_alive, deadline, POLL_S)


def _forget(root: Path) -> None:
    pids = root / "pids"
    if pids.is_dir():
        for f in pids.glob("*.pid"):
            f.unlink(missing_ok=True)
    (root / ADDRESS_FILE).unlink(missing_ok=True)
    for f in [*root.glob(f"{JOBMANAGER}-*.address"), *root.glob(f"{JOBMANAGER}*.url"),
              *(root / JOBMANAGERS_DIR).glob("*.address"), *(root / JOBMANAGERS_DIR).glob("*.url")]:
        f.unlink(missing_ok=True)
