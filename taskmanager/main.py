"""The TaskManager process: command line, logging, signals, and the TaskExecutor's event loop.

`funke taskmanager ...` and `python -m funke.taskmanager.main ...` both end up in `main(argv)`.
Logs go to stderr; stdout carries exactly one line, printed once the TaskManager is registered,
which launchers wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from funke.common.configuration import ConfigurationError, bind_host
from funke.runtime import datafs, owner, security
from funke.runtime.configfile import load_configuration
from funke.taskmanager.sparksession import DEFAULT_EXECUTOR_TIMEOUT_S
from funke.taskmanager.taskexecutor import StartupError, TaskExecutor, TaskExecutorConfig

DEFAULT_JOBMANAGER = "127.0.0.1:6123"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {value}")
    return value


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="funke taskmanager",
        description="Run a TaskManager: offers task slots to a JobManager and runs its tasks on PySpark.",
    )
    parser.add_argument("--jobmanager", metavar="HOST:PORT",
                        default=os.environ.get("FUNKE_JOBMANAGER", DEFAULT_JOBMANAGER),
                        help="the JobManager's RPC address (default: $FUNKE_JOBMANAGER or %(default)s)")
    parser.add_argument("--slots", type=_positive_int, default=2, metavar="N",
                        help="number of task slots (default: %(default)s)")
    parser.add_argument("--id", dest="task_manager_id", default=None,
                        help="TaskManager id (default: tm-<hostname>-<pid>)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the TaskExecutor service binds to (default: %(default)s)")
    parser.add_argument("--advertise-host", default=None, metavar="HOST",
                        help="the address the JobManager dials, when it is not --host (behind NAT, in a "
                        "container); with --host 0.0.0.0 and no --advertise-host: this machine's address "
                        "on the route to the JobManager")
    parser.add_argument("--port", type=_port, default=0,
                        help="port of the TaskExecutor service (default: 0, any free port)")
    spark = parser.add_mutually_exclusive_group()
    spark.add_argument("--spark-master", default=None, metavar="URL",
                       help="Spark master for the TaskManager's SparkSession (default: local[<slots>])")
    spark.add_argument("--spark-remote", default=None, metavar="URL",
                       help="use a Spark Connect server (sc://host:port) instead of a local SparkSession")
    spark.add_argument("--no-spark", action="store_true",
                       help="start no SparkSession: only no-op chains can run (benchmarks, fast tests)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="do not run Spark's first jobs at start (then a TaskManager's first tasks start cold)")
    parser.add_argument("--spark-executor-timeout", type=_positive_float, default=DEFAULT_EXECUTOR_TIMEOUT_S,
                        metavar="SECONDS", help="on a cluster master: how long to wait for the first executor "
                        "before refusing to start (default: %(default)g)")
    parser.add_argument("--spark-conf", type=_spark_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")
    parser.add_argument("--data-dir", default=None,
                        help="where result partitions live, overriding the JobManager's data dir")
    parser.add_argument("--config", help="a file of 'key: value' lines, as the JobManager's; the TaskManager "
                        "reads the high-availability.* keys (then it finds the leader itself)")
    parser.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration entry, e.g. -D high-availability.type=filesystem")
    parser.add_argument("--insecure", action="store_true",
                        help="serve on an address other machines can reach without TLS (security.insecure)")
    parser.add_argument("--owner", metavar="PID:START", type=owner.owner_argument,
                        help="stop once this process has ended (an embedded mini cluster's owner: "
                        "funke.runtime.owner)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="log level (default: %(default)s)")
    return parser


def config_from_args(args: argparse.Namespace) -> TaskExecutorConfig:
    """Raises ConfigurationError for a bad --config or -D, SecurityError for a missing or
    unusable cluster token or certificate, or for plaintext off loopback without --insecure."""
    cluster = load_configuration(args.config, args.dynamic)
    ha = cluster.ha_enabled
    tls = security.Tls.from_config(cluster)
    security.check_exposure("the TaskManager", args.host, tls, args.insecure or cluster.insecure)
    metrics_host = bind_host(cluster.metrics_host, args.host)  # where its gRPC service binds, unless told
    security.check_exposure("the TaskManager's metrics", metrics_host, tls, args.insecure or cluster.insecure)
    token_file = security.token_files(cluster)[1]
    if not token_file.exists():
        raise security.SecurityError(
            f"no cluster token at {token_file}: the JobManager writes it when it first starts; start the "
            "JobManager first, or copy its cluster token here, or name the file with "
            "-D security.auth.cluster-token-file=PATH")
    cluster_token = security.read_token(token_file, "cluster token file")
    return TaskExecutorConfig(
        task_manager_id=args.task_manager_id or f"tm-{socket.gethostname()}-{os.getpid()}",
        jobmanager_address=args.jobmanager,
        number_of_slots=args.slots,
        host=args.host,
        advertise_host=args.advertise_host,
        spark_executor_timeout_s=args.spark_executor_timeout,
        port=args.port,
        spark_master=args.spark_master,
        spark_remote=args.spark_remote,
        spark_conf=tuple(args.spark_conf),
        data_dir=args.data_dir,
        use_spark=not args.no_spark,
        warm_up=not args.no_warm_up,
        ha=cluster if ha else None,
        cluster_token=cluster_token,
        tls=tls,
        metrics_host=metrics_host,
        metrics_ports=cluster.metrics_ports,
        heartbeat_interval_s=cluster.heartbeat_interval_s,
        heartbeat_timeout_s=cluster.heartbeat_timeout_s,
    )


async def serve(config: TaskExecutorConfig, owned_by: str = "") -> str:
    """Run a TaskExecutor on the current loop until SIGTERM or SIGINT; returns why it stopped on
    its own ("" when it was asked to)."""

    def announce(executor: TaskExecutor) -> None:
        print(f"TaskManager {executor.id} registered with {executor.jobmanager_address} "
              f"({config.number_of_slots} slots)", flush=True)

    executor = TaskExecutor(config, on_registered=announce)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, executor.stop)
        except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
            pass
    watching = asyncio.create_task(owner.watch_owner(owned_by, executor.stop)) if owned_by else None
    try:
        await executor.run()
    finally:
        if watching is not None:
            watching.cancel()
    return executor.failure


_PY4J_DIR = f"{os.sep}py4j{os.sep}"


def quiet_py4j_retries(record: logging.LogRecord) -> bool:
    """Drops py4j's INFO records about a command it sends again: py4j logs them on the root logger
    (`logging.info`, not its own), with a traceback, e.g. when the JVM went away at shutdown
    just before `SparkSession.stop` (the TaskManager says so itself, in one line)."""
    return not (record.name == "root" and record.levelno < logging.WARNING and _PY4J_DIR in record.pathname)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # gRPC and py4j are chatty at INFO; their problems surface through our own logs.
    for noisy in ("py4j", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet_py4j_retries)
    try:
        config = config_from_args(args)
    except ConfigurationError as exc:
        print(exc, file=sys.stderr)
        return 2
    except security.SecurityError as exc:
        print(f"security: {exc}", file=sys.stderr)
        return 2
    if config.data_dir:
        try:
            datafs.check(config.data_dir)
        except datafs.DataDirError as exc:
            print(f"--data-dir: {exc}", file=sys.stderr)
            return 2
    try:
        failure = asyncio.run(serve(config, args.owner or ""))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 130
    except StartupError as e:
        logging.getLogger("funke.taskmanager").error("TaskManager %s cannot start: %s", config.task_manager_id, e)
        return 1
    except Exception:
        logging.getLogger("funke.taskmanager").exception("TaskManager %s failed", config.task_manager_id)
        return 1
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
