"""Cluster configuration: Flink's key names, typed values, defaults, and one error listing every
bad entry.

Owns the options a JobManager reads from `-D key=value` flags or the text of a `key: value` file
(the flat format of Flink's flink-conf.yaml; the JobManager reads the file). Durations use Flink's syntax ("5 s", "500 ms"; a bare
number is milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from funke.common import ids
from funke.common.jobgraph import FailoverStrategyKind, RestartStrategyConfig
from funke.common.leadership import DEFAULT_LEASE_S
from funke.common.restart import RestartStrategyError, parse_duration, restart_strategy_from_config
from funke.common.slotmanager import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from funke.common.states import TESTING_MUTANTS


DEFAULT_ZOOKEEPER_SESSION_S = 6.0


class ConfigurationError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("bad configuration:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True, slots=True)
class ClusterConfiguration:
    data_dir: str = ""
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    slot_request_timeout_s: float = 300.0  # Flink's slot.request.timeout
    evenly_spread_out_slots: bool = False
    restart_strategy: RestartStrategyConfig | None = None  # None: no restarts (Flink without checkpointing)
    failover_strategy: FailoverStrategyKind = FailoverStrategyKind.REGION
    cancellation_timeout_s: float = 180.0  # Flink's task.cancellation.timeout
    # How long registration waits for the JobManager's call back to a TaskManager's address.
    registration_probe_timeout_s: float = 5.0
    # Test only: a deliberate defect, so that conformance checks can be seen to catch one
    # ("skip-initializing": executions go DEPLOYING -> RUNNING, which the specification forbids).
    testing_mutant: str = ""
    # Where jobs may read and write files; empty: anywhere the processes may (Flink's behaviour).
    allowed_paths: tuple[str, ...] = ()
    # Which hosts jobs' socket and Redis sources and sinks may connect to; empty: any.
    allowed_hosts: tuple[str, ...] = ()
    max_subtasks: int = 100_000  # all vertices' parallelisms of one job together
    # Terminal jobs kept for `funke list/status/result` (Flink's jobstore.* keys).
    jobstore_max_capacity: int = 1000
    jobstore_expiration_s: float = 3600.0
    jobstore_cache_bytes: int = 50 * 1024 * 1024
    # High availability (Flink's keys): "none"; "filesystem" (leader election and the job
    # stores in files under <storageDir>/<cluster-id>, for the JobManagers of one machine); or
    # "zookeeper" (election, leader retrieval and the stores' small records on a ZooKeeper
    # quorum under <path.root>/<cluster-id>; large records as files under storageDir).
    high_availability: str = "none"
    ha_storage_dir: str = ""
    ha_cluster_id: str = "default"
    ha_lease_s: float = DEFAULT_LEASE_S  # how long a leader's silence lasts before a standby takes over
    ha_zookeeper_quorum: str = ""  # host:port,host:port
    ha_zookeeper_root: str = "/funke"
    # Flink's default is 60 s: the time a crashed leader's node lingers (a local leader known
    # dead is removed at once).
    ha_zookeeper_session_s: float = DEFAULT_ZOOKEEPER_SESSION_S

    @property
    def ha_enabled(self) -> bool:
        return self.high_availability != "none"


_DURATIONS = {
    "heartbeat.interval": "heartbeat_interval_s",
    "heartbeat.timeout": "heartbeat_timeout_s",
    "slot.request.timeout": "slot_request_timeout_s",
    "task.cancellation.timeout": "cancellation_timeout_s",
    "cluster.registration.probe-timeout": "registration_probe_timeout_s",
    "jobstore.expiration-time": "jobstore_expiration_s",
    "high-availability.filesystem.lease-duration": "ha_lease_s",
    "high-availability.zookeeper.client.session-timeout": "ha_zookeeper_session_s",
}
HA_MODES = ("none", "filesystem", "zookeeper")
# key -> (field, smallest, largest)
_INTEGERS = {
    "funke.job.max-subtasks": ("max_subtasks", 1, 10_000_000),
    "jobstore.max-capacity": ("jobstore_max_capacity", 1, 2**31 - 1),
    "jobstore.cache-size": ("jobstore_cache_bytes", 0, 2**63 - 1),
}


def parse_configuration(entries: Mapping[str, str], base: ClusterConfiguration | None = None) -> ClusterConfiguration:
    config = base or ClusterConfiguration()
    problems: list[str] = []
    changes: dict[str, object] = {}
    restart_options: dict[str, str] = {}
    restart_type: str | None = None
    for key, value in entries.items():
        value = str(value).strip()
        if key in _DURATIONS:
            try:
                seconds = parse_duration(value)
                if seconds <= 0:
                    raise RestartStrategyError(f"must be positive, got {value!r}")
                changes[_DURATIONS[key]] = seconds
            except RestartStrategyError as exc:
                problems.append(f"{key}: {exc}")
        elif key == "cluster.evenly-spread-out-slots":
            if value.lower() not in ("true", "false"):
                problems.append(f"{key}: expected true or false, got {value!r}")
            else:
                changes["evenly_spread_out_slots"] = value.lower() == "true"
        elif key in ("restart-strategy.type", "restart-strategy"):
            restart_type = value
        elif key.startswith("restart-strategy."):
            restart_options[key] = value
        elif key == "jobmanager.execution.failover-strategy":
            try:
                changes["failover_strategy"] = FailoverStrategyKind(value.lower())
            except ValueError:
                problems.append(f"{key}: expected 'region' or 'full', got {value!r}")
        elif key in _INTEGERS:
            name, low, high = _INTEGERS[key]
            if not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
                problems.append(f"{key}: expected an integer from {low} to {high}, got {value!r}")
            else:
                changes[name] = int(value)
        elif key == "funke.io.allowed-paths":
            from funke.common.validation import path_problem

            paths = tuple(p.strip().rstrip("/") or "/" for p in value.split(",") if p.strip())
            bad = [f"{problem}" for p in paths if (problem := path_problem(p, sink=True)) is not None
                   and "filesystem root" not in problem]
            if bad:
                problems.append(f"{key}: " + "; ".join(bad))
            else:
                changes["allowed_paths"] = paths
        elif key == "funke.io.allowed-hosts":
            from funke.common.validation import host_problem

            hosts = tuple(h.strip().lower() for h in value.split(",") if h.strip())
            bad = [problem for h in hosts if (problem := host_problem(h)) is not None]
            if bad or not hosts:
                problems.append(f"{key}: " + ("; ".join(bad) if bad else "expected host names, got none"))
            else:
                changes["allowed_hosts"] = hosts
        elif key == "funke.testing.mutant":
            if value not in TESTING_MUTANTS:
                problems.append(f"{key}: expected one of {', '.join(TESTING_MUTANTS)}, got {value!r}")
            else:
                changes["testing_mutant"] = value
        elif key == "funke.data-dir":
            changes["data_dir"] = value
        elif key in ("high-availability", "high-availability.type"):
            mode = value.lower()
            if mode not in HA_MODES:
                problems.append(f"{key}: expected one of {', '.join(HA_MODES)}, got {value!r}")
            else:
                changes["high_availability"] = mode
        elif key == "high-availability.storageDir":
            if value.startswith("file://"):
                value = value[len("file://"):]
            if not value or ids.has_control_characters(value):
                problems.append(f"{key}: expected a directory, got {ids.echo(value)}")
            elif "://" in value:
                problems.append(f"{key}: the filesystem backend needs a local directory (or file://), "
                                f"got {ids.echo(value)}")
            else:
                changes["ha_storage_dir"] = value
        elif key == "high-availability.cluster-id":
            # Flink writes it as a path ("/default"); here it names one directory.
            problem = ids.path_id_problem(value.strip("/"), key)
            if problem is not None:
                problems.append(problem)
            else:
                changes["ha_cluster_id"] = value.strip("/")
        elif key == "high-availability.zookeeper.quorum":
            problem = quorum_problem(value)
            if problem is not None:
                problems.append(f"{key}: {problem}")
            else:
                changes["ha_zookeeper_quorum"] = value.replace(" ", "")
        elif key == "high-availability.zookeeper.path.root":
            parts = value.strip("/").split("/")
            bad = [p for part in parts if (p := ids.path_id_problem(part, key)) is not None]
            if bad:
                problems.append(bad[0])
            else:
                changes["ha_zookeeper_root"] = "/" + "/".join(parts)
        else:
            problems.append(f"unknown key {key!r}")
    if restart_type is not None or restart_options:
        cfg = RestartStrategyConfig(restart_type or (config.restart_strategy.kind if config.restart_strategy else "none"),
                                    restart_options)
        try:
            restart_strategy_from_config(cfg)
            changes["restart_strategy"] = cfg
        except RestartStrategyError as exc:
            problems.append(f"restart strategy: {exc}")
    mode = changes.get("high_availability", config.high_availability)
    if mode != "none" and not changes.get("ha_storage_dir", config.ha_storage_dir):
        problems.append(f"high-availability: {mode} needs high-availability.storageDir")
    if (mode == "zookeeper" and not changes.get("ha_zookeeper_quorum", config.ha_zookeeper_quorum)
            and "high-availability.zookeeper.quorum" not in entries):  # a bad one is named above
        problems.append("high-availability: zookeeper needs high-availability.zookeeper.quorum (host:port,...)")
    if problems:
        raise ConfigurationError(problems)
    return replace(config, **changes)


def quorum_problem(value: str) -> str | None:
    """What is wrong with a ZooKeeper connect string `host:port,host:port`, or None."""
    servers = [s.strip() for s in value.split(",")]
    if not value.strip() or not all(servers):
        return f"expected host:port[,host:port...], got {ids.echo(value)}"
    for server in servers:
        host, sep, port = server.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
            return f"expected host:port with a port from 1 to 65535, got {ids.echo(server)}"
        if not all(c.isascii() and (c.isalnum() or c in ".-_:") for c in host):
            return f"not a host name or address: {ids.echo(host)}"
    return None


def parse_config_lines(text: str, source: str = "configuration") -> dict[str, str]:
    """`key: value` per line; `#` starts a comment. `source` names the text in errors (the
    caller reads the file: this module does no I/O)."""
    entries: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ConfigurationError([f"{source}:{n}: expected 'key: value', got {line!r}"])
        entries[key.strip()] = value.strip()
    return entries


def parse_key_values(pairs: list[str]) -> dict[str, str]:
    """`-D key=value` flags."""
    entries: dict[str, str] = {}
    bad = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            bad.append(f"expected key=value, got {pair!r}")
        entries[key.strip()] = value.strip()
    if bad:
        raise ConfigurationError(bad)
    return entries
