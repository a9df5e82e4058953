"""What a TaskManager is started with (`TaskExecutorConfig`, from the command line in `main.py`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from funke.common.configuration import ClusterConfiguration
from funke.common.scheduling.slotmanager import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from funke.runtime import security
from funke.taskmanager import sparksession


@dataclass(frozen=True, slots=True)
class TaskExecutorConfig:
    task_manager_id: str
    jobmanager_address: str = "127.0.0.1:6123"
    number_of_slots: int = 2
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # what the JobManager dials, when not `host` (NAT, containers)
    port: int = 0  # 0: any free port; the bound one is registered
    spark_master: str | None = None  # None: local[<slots>]
    spark_remote: str | None = None  # a Spark Connect URL instead of a local/cluster master
    spark_conf: tuple[tuple[str, str], ...] = ()
    # On a cluster master: how long to wait for the first executor before refusing to start.
    spark_executor_timeout_s: float = sparksession.DEFAULT_EXECUTOR_TIMEOUT_S
    data_dir: str | None = None  # overrides the JobManager's data dir for this TaskManager
    use_spark: bool = True  # False: no SparkSession, only no-op chains run
    warm_up: bool = True  # run Spark's first jobs right after start (taskmanager/warmup.py)
    # High availability: find the leader through the configured HA services (the lease file,
    # ZooKeeper's leader node) instead of `jobmanager_address`.
    ha: ClusterConfiguration | None = None
    # What it presents to the JobManager (the cluster token), and TLS for serving and calling.
    cluster_token: str = ""
    tls: security.Tls | None = None
    # Prometheus metrics: where to serve them (None: not at all), the first free port of the range
    metrics_host: str | None = None
    metrics_ports: tuple[int, int] = (9249, 9348)
    # Its own heartbeat.interval / heartbeat.timeout (-D, --config): a cluster master's network
    # timeouts are derived from them (sparksession.network_conf) before the JobManager tells its own.
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S


def process_started_at() -> float:
    """When this process started (epoch seconds): from /proc, so the interpreter's own start and
    the imports count; the time of the call where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()
