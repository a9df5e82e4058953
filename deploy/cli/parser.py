"""The `funke` command line: its commands, their flags and the checks of their values."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from funke.deploy import localcluster
from funke.deploy.cli.cluster import (
    cmd_cluster_add_jobmanager,
    cmd_cluster_add_taskmanager,
    cmd_cluster_kill,
    cmd_cluster_secrets,
    cmd_cluster_start,
    cmd_cluster_status,
    cmd_cluster_stop,
)
from funke.deploy.cli.jobs import (
    cmd_cancel,
    cmd_conformance,
    cmd_list,
    cmd_progress,
    cmd_rescale,
    cmd_result,
    cmd_state,
    cmd_status,
    cmd_stop,
    cmd_submit,
    cmd_watch,
)


def _version() -> str:
    """The installed distribution's version (CHANGELOG.md says what each brought)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("funke")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="funke",
        description="Run and inspect funke jobs: a Flink-style job-graph runtime on PySpark.",
        epilog="JobManager address: --jobmanager, else $FUNKE_JOBMANAGER, else the local cluster's "
               "address file, else 127.0.0.1:6123. Exit codes: 0 success, 1 the job or cluster did not "
               "succeed, 2 usage error, bad job, unknown job, unreachable JobManager, or a request the "
               "JobManager refused (nothing was done), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"funke {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str,
                jobmanager: bool = True, **kwargs: Any) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=help, allow_abbrev=False, **kwargs)
        p.set_defaults(handler=handler)
        if jobmanager:
            p.add_argument("--jobmanager", metavar="HOST:PORT", help="the JobManager to talk to")
            p.add_argument("--token-file", metavar="FILE", help="the cluster's client token (default: "
                           "$FUNKE_TOKEN_FILE, else <cluster dir>/security/client.token)")
            p.add_argument("--tls-ca", metavar="PEM", help="speak TLS, trusting this CA (default: $FUNKE_TLS_CA, "
                           "else <cluster dir>/security/tls/ca.pem if the cluster runs with TLS)")
            p.add_argument("--tls-cert", metavar="PEM", help="this client's certificate, for mutual TLS "
                           "(default: $FUNKE_TLS_CERT)")
            p.add_argument("--tls-key", metavar="PEM", help="its private key (default: $FUNKE_TLS_KEY)")
        return p

    cluster = commands.add_parser("cluster", help="start, stop or inspect a local multi-process cluster",
                                  description="A local cluster: one JobManager and N TaskManager processes.")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    dir_help = "the cluster directory (default: $FUNKE_CLUSTER_DIR or ~/.funke/cluster)"
    start = cluster_commands.add_parser("start", help="start a JobManager and TaskManagers", allow_abbrev=False)
    start.set_defaults(handler=cmd_cluster_start)
    start.add_argument("--taskmanagers", type=_non_negative_int, default=2, metavar="N", help="default: 2")
    start.add_argument("--slots", type=_positive_int, default=2, metavar="S", help="slots per TaskManager (default: 2)")
    start.add_argument("--dir", help=dir_help)
    start.add_argument("--port", type=_port, default=0, help="the JobManager's port (default: 0, a free one)")
    start.add_argument("--data-dir", help="the JobManager's data dir (default: <dir>/data)")
    start.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                       help="JobManager configuration, e.g. -D restart-strategy.type=fixed-delay")
    start.add_argument("--host", help="the address every process binds (default: 127.0.0.1; 0.0.0.0 lets other "
                       "machines reach them, advertising this machine's address)")
    spark = start.add_mutually_exclusive_group()
    spark.add_argument("--no-spark", action="store_true", help="TaskManagers without Spark (no-op jobs only)")
    spark.add_argument("--spark-master", metavar="URL",
                       help="the TaskManagers' Spark master, e.g. spark://host:7077 (default: local[<slots>] each)")
    spark.add_argument("--spark-remote", metavar="URL",
                       help="a Spark Connect server (sc://host:15002) for every TaskManager instead")
    spark.add_argument("--spark", choices=["local", "standalone"], default="local",
                       help="'standalone': start a Spark standalone master and workers from pip's PySpark for "
                       "the TaskManagers' Spark stages (default: local, each TaskManager its own local[<slots>])")
    start.add_argument("--workers", type=_positive_int, metavar="N",
                       help="with --spark standalone: how many Spark workers (default: 2)")
    start.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                       help="Spark configuration for every TaskManager (repeatable)")
    start.add_argument("--timeout", type=float, default=120, help="seconds to wait for startup (default: 120)")
    tls = start.add_mutually_exclusive_group()
    tls.add_argument("--tls", action="store_true", help="serve every gRPC port with TLS: a certificate authority "
                     "for this cluster and certificates for this machine are made in <dir>/security/tls")
    tls.add_argument("--mtls", action="store_true", help="mutual TLS: as --tls, and every caller (TaskManagers, "
                     "the JobManager, clients) shows a certificate the cluster's CA signed")
    start.add_argument("--tls-host", action="append", default=[], metavar="HOST",
                       help="with --tls/--mtls: another name or address the processes' certificate is valid for "
                       "(a machine whose TaskManagers use it; repeatable)")
    tls.add_argument("--insecure", action="store_true", help="with --host off loopback: serve without TLS anyway "
                     "(tokens, jobs and data cross the network in the clear)")
    start.add_argument("--ha", choices=list(localcluster.HA_MODES), default="none",
                       help="high availability: 'filesystem' elects a leader among the JobManagers through a "
                            "lease in <dir>/ha and keeps jobs there across JobManager failures; 'zookeeper' does "
                            "so on ZooKeeper (default: none)")
    start.add_argument("--zookeeper-quorum", metavar="HOST:PORT[,...]",
                       help="with --ha zookeeper: the ZooKeeper to use (default: start one for the cluster, "
                            "from the Debian package zookeeper)")
    start.add_argument("--jobmanagers", type=_positive_int, default=1, metavar="N",
                       help="JobManagers to start: one leads, the others stand by (needs --ha; default: 1)")
    secrets = cluster_commands.add_parser(
        "secrets", help="make the cluster's tokens (and with --tls/--mtls its certificates) without starting "
        "anything, e.g. to copy them to the hosts of a cluster across machines", allow_abbrev=False)
    secrets.set_defaults(handler=cmd_cluster_secrets)
    secrets.add_argument("--dir", help=dir_help)
    secrets_tls = secrets.add_mutually_exclusive_group()
    secrets_tls.add_argument("--tls", action="store_true", help="a certificate authority and certificates too")
    secrets_tls.add_argument("--mtls", action="store_true", help="as --tls, marked for mutual TLS")
    secrets.add_argument("--host", help="the address this machine's processes bind (for the certificate)")
    secrets.add_argument("--tls-host", action="append", default=[], metavar="HOST",
                         help="another name or address the processes' certificate is valid for (repeatable)")
    stop = cluster_commands.add_parser("stop", help="stop the cluster's processes", allow_abbrev=False)
    stop.set_defaults(handler=cmd_cluster_stop)
    stop.add_argument("--dir", help=dir_help)
    stop.add_argument("--timeout", type=float, default=15, help="seconds before SIGKILL (default: 15)")
    kill = cluster_commands.add_parser("kill", help="SIGKILL one of the cluster's processes (and what it started), "
                                       "as if its machine died", allow_abbrev=False)
    kill.set_defaults(handler=cmd_cluster_kill)
    kill.add_argument("name", metavar="NAME", help="tm-1, jobmanager, ... (see funke cluster status)")
    kill.add_argument("--dir", help=dir_help)
    add_jm = cluster_commands.add_parser(
        "add-jobmanager", help="start a JobManager in a high-availability cluster: a dead one again, one more "
        "standby, or the first again after every JobManager died (the TaskManagers and stored jobs wait for it)",
        allow_abbrev=False)
    add_jm.set_defaults(handler=cmd_cluster_add_jobmanager)
    add_jm.add_argument("name", metavar="NAME", nargs="?", help="e.g. jobmanager-3 (default: the first of "
                        "jobmanager, jobmanager-2, ... not running)")
    add_jm.add_argument("--dir", help=dir_help)
    add_jm.add_argument("--timeout", type=float, default=60,
                        help="seconds to wait for it to serve and for a leader (default: 60)")
    add = cluster_commands.add_parser("add-taskmanager", help="start a TaskManager in the running cluster (a new "
                                      "one, or a dead one again), with the cluster's TaskManager options",
                                      allow_abbrev=False)
    add.set_defaults(handler=cmd_cluster_add_taskmanager)
    add.add_argument("name", metavar="NAME", help="e.g. tm-3")
    add.add_argument("--slots", type=_positive_int, default=2, metavar="S", help="default: 2")
    add.add_argument("--dir", help=dir_help)
    add.add_argument("--timeout", type=float, default=120, help="seconds to wait for its registration (default: 120)")
    status = cluster_commands.add_parser("status", help="the cluster's processes and slots", allow_abbrev=False)
    status.set_defaults(handler=cmd_cluster_status)
    status.add_argument("--dir", help=dir_help)
    status.add_argument("--json", action="store_true")

    # Their arguments are passed through untouched (main dispatches before parsing); listed
    # here for the help text.
    commands.add_parser("jobmanager", help="run a JobManager process (see `funke jobmanager --help`)", add_help=False)
    commands.add_parser("taskmanager", help="run a TaskManager process (see `funke taskmanager --help`)", add_help=False)

    submit = command("submit", cmd_submit, "submit a job file and, unless --detach, follow it to its end")
    submit.add_argument("--detach", action="store_true", help="print the job id and return at once")
    submit.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    submit.add_argument("file", help="a Python file defining build(args) or a module-level `job`")
    submit.add_argument("job_args", nargs=argparse.REMAINDER,
                        help="arguments for the job's build(args); put them after `--` if they clash with ours")

    p = command("list", cmd_list, "list the jobs")
    p.add_argument("--json", action="store_true")
    p = command("status", cmd_status, "a job's status, history, subtasks and failures")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")
    p = command("watch", cmd_watch, "print a job's events until it ends (exit 0 if it FINISHED)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p = command("cancel", cmd_cancel, "cancel a job")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")
    p = command("stop", cmd_stop, "stop a streaming query gracefully: no new batch; the batches in flight finish "
                "and commit, later logged ones are not run (they wait in the offset log for the next run); the job "
                "ends FINISHED (exit 0), or, not done within --timeout, is cancelled: CANCELED (exit 1)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--drain", action="store_true",
                   help="run the logged batches too, then process everything the sources hold now")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="cancel the job if it has not ended by then: CANCELED, exit 1 (default 60)")
    p.add_argument("--detach", action="store_true", help="return at once instead of following the job to its end")
    p.add_argument("--json", action="store_true")
    p = command("rescale", cmd_rescale, "change a running streaming query's parallelism live: its batch in flight "
                "commits, then it runs on under the same job id at the new parallelism from its checkpoint (keyed "
                "state moves by key group); prints the pause between the last batch before and the first after")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--parallelism", "-p", type=int, required=True, help="the new parallelism")
    p.add_argument("--vertex", action="append", default=[], metavar="VERTEX",
                   help="rescale only this vertex (repeat for several; default every vertex but receivers)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="how long the batch in flight may take to commit (default 60; later, it runs again after)")
    p.add_argument("--detach", action="store_true", help="return at once instead of waiting for the first batch after")
    p.add_argument("--json", action="store_true")
    p = command("progress", cmd_progress, "a streaming query's recent micro-batches (the last 100)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true", help="Structured Streaming's progress records, as JSON")
    p = command("result", cmd_result, "the rows a job collected (FINISHED, or a streaming query's committed batches)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--vertex", help="the collect sink's vertex id (needed when the job has several)")
    p.add_argument("--json", action="store_true")
    p = command("state", cmd_state, "a streaming query's keyed state after its last committed batch, as rows: a "
                "running query's from the JobManager (JOB), or any query's from its checkpoint (--checkpoint), with "
                "no cluster")
    p.add_argument("job", metavar="JOB", nargs="?", help="a running query's job id")
    p.add_argument("--checkpoint", metavar="PATH", help="read the state from this checkpoint location instead (a "
                   "stopped, finished or failed query's; no JobManager is asked)")
    p.add_argument("--batch", type=int, metavar="N", help="with --checkpoint: the state after committed batch N "
                   "(one the checkpoint keeps; default: the last)")
    p.add_argument("--operator", metavar="VERTEX", help="the keyed operator's vertex id (needed when there are several)")
    p.add_argument("--key", action="append", default=[], metavar="VALUE",
                   help="only this key (repeat for each key column, in order; compared as text)")
    p.add_argument("--limit", type=int, default=0, help="rows at most (default 1000)")
    p.add_argument("--json", action="store_true")
    p = command("conformance", cmd_conformance,
                "run scenario jobs on the cluster and check every job and task moves only along the legal "
                "paths of the state machines (exit 0 only if every scenario passes)")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run only these scenarios")
    p.add_argument("--list", action="store_true", help="list the scenarios and their expected paths")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--junit", metavar="FILE", help="also write the outcome as JUnit XML")
    p.add_argument("--destructive", action="store_true",
                   help="also run the scenarios that stop a TaskManager (they need --kill-command)")
    p.add_argument("--kill-command", metavar="CMD", help="a shell command that kills TaskManager {taskmanager}, "
                   "e.g. 'funke cluster kill {taskmanager}' for a local cluster")
    p.add_argument("--restore-command", metavar="CMD", help="a shell command that starts it again, e.g. "
                   "'funke cluster add-taskmanager {taskmanager}'")
    return parser


def _int_arg(check: Callable[[int], bool], what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{what}, got {value}")
        return value
    return parse


_positive_int = _int_arg(lambda v: v >= 1, "must be at least 1")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


_non_negative_int = _int_arg(lambda v: v >= 0, "must be 0 or more")


_port = _int_arg(lambda v: 0 <= v <= 65535, "must be a port number (0-65535)")


def _key_value(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text
