"""`funke`: the command line, as a Flink user would expect it (`flink run`, `flink list`, ...).

Owns the commands, how they find the JobManager, how jobs, events, failures and results are
shown to people (text) and to scripts (`--json`), and the exit codes, each concern a module:
`parser` (commands and flags), `render` (text and JSON views), `live` (a job followed while it
runs), `jobs` (the job commands and finding the JobManager), `cluster` (the local cluster's
commands), `exitcodes`; `main` here maps what went wrong to an exit code (`exitcodes` says
what each means):

    0    the command did what was asked (for submit and watch: the job FINISHED)
    1    it ran, but the outcome is not success (the job FAILED or was CANCELED, a cluster did
         not start, the JobManager went away while a job was being followed, the JobManager
         failed at what was asked, ...)
    2    it could not run: bad usage, a job file that does not load, an invalid job graph, an
         unknown job id, no JobManager at the address (nothing answers, or what answers is not
         a JobManager), or the JobManager or the cluster directory refused the request
    130  interrupted

The JobManager address comes from `--jobmanager HOST:PORT`, else $FUNKE_JOBMANAGER, else the
address file of the local cluster (`<cluster dir>/jobmanager.address`; the cluster dir is
$FUNKE_CLUSTER_DIR or ~/.funke/cluster; with high availability the leader, looked up in the
cluster's HA services), else 127.0.0.1:6123.
"""

from __future__ import annotations

import os

# gRPC's core logs a failed TLS handshake at INFO on stderr; the error we raise says it better.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from funke.deploy import localcluster  # noqa: E402
from funke.deploy.cli.cluster import run_process  # noqa: E402
from funke.deploy.cli.exitcodes import (  # noqa: E402
    EXIT_INTERRUPTED,
    EXIT_UNSUCCESSFUL,
    EXIT_USAGE,
    UsageError,
    exit_code_of,
    print_error,
)
from funke.deploy.cli.jobs import collect_sinks, resolve_jobmanager, split_submit_args  # noqa: E402
from funke.deploy.cli.live import JobProgress, follow_job  # noqa: E402
from funke.deploy.cli.parser import build_parser  # noqa: E402
from funke.deploy.cli.render import (  # noqa: E402
    format_duration,
    format_time,
    render_event,
    render_failure,
    render_history,
    render_job_details,
    render_outcome,
    render_progress,
    render_rows,
)
from funke.deploy.client import (  # noqa: E402
    FunkeError,
    InvalidJobGraph,
    JobManagerConnectionLost,
    JobManagerUnavailable,
    JobNotFound,
    NotAJobManager,
    NotAuthenticated,
    SecurityError,
    StandbyJobManager,
)
from funke.deploy.jobfile import JobFileError  # noqa: E402

__all__ = [
    "JobProgress",
    "build_parser",
    "collect_sinks",
    "follow_job",
    "format_duration",
    "format_time",
    "main",
    "render_event",
    "render_failure",
    "render_history",
    "render_job_details",
    "render_outcome",
    "render_progress",
    "render_rows",
    "resolve_jobmanager",
]


_START_HINT = "start one with `funke cluster start`"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("jobmanager", "taskmanager"):
        return run_process(argv[0], argv[1:])
    after_dashes: list[str] = []
    if argv and argv[0] == "submit" and "--" in argv:
        cut = argv.index("--")
        argv, after_dashes = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error or the help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "submit":
            split_submit_args(args, after_dashes)
        return args.handler(args)
    except (NotAJobManager, NotAuthenticated, SecurityError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except StandbyJobManager as exc:  # a JobManager answered: the cluster runs, led elsewhere
        print_error(str(exc))
        return EXIT_USAGE
    except JobManagerUnavailable as exc:
        print_error(str(exc) if exc.tls_hint else f"{exc}; {_START_HINT}")
        return EXIT_USAGE
    except JobManagerConnectionLost as exc:
        print_error(str(exc))
        return EXIT_UNSUCCESSFUL
    except JobNotFound as exc:
        print_error(exc.details)
        return EXIT_USAGE
    except InvalidJobGraph as exc:
        print_error(f"the job graph is invalid ({len(exc.problems)} problem(s)):")
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_USAGE
    except JobFileError as exc:
        print_error(str(exc))
        if exc.user_traceback:
            print(exc.user_traceback.rstrip(), file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except FunkeError as exc:  # refused by the JobManager (2), or failed there (1)
        print_error(str(exc))
        return exit_code_of(exc)
    except localcluster.ClusterRefused as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except localcluster.ClusterError as exc:
        print_error(str(exc))
        return EXIT_UNSUCCESSFUL
    except SystemExit as exc:  # a job file's own argument parser (e.g. its --help)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
