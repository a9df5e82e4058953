"""How a `funke` command ends: its exit code, and an error line on stderr.

    0    the command did what was asked (for submit and watch: the job FINISHED)
    1    it ran, but the outcome is not success (the job FAILED or was CANCELED, a cluster did
         not start, the JobManager went away while a job was being followed, the JobManager
         failed at what was asked: DATA_LOSS, INTERNAL, ...; keyed state in a checkpoint that
         cannot be read)
    2    it could not run: bad usage, a job file that does not load, an invalid job graph, an
         unknown job id, a checkpoint without what `funke state --checkpoint` asks of it, no
         JobManager at the address, or a refusal: the JobManager (or the cluster directory)
         turned the request down before doing anything (`REFUSALS`)
    130  interrupted (Ctrl-C)

`CODES` and `REFUSALS` are the table docs/getting-started.md shows (`funke.deploy.sitedocs`
renders it from here); `main` in `funke.deploy.cli` and `exit_code_of` apply it.
"""

from __future__ import annotations

import sys

import grpc

from funke.deploy.client import FunkeError


EXIT_OK, EXIT_UNSUCCESSFUL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# The exit codes and what each means, as the documentation shows them.
CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done; for `submit` and `watch`: the job FINISHED"),
    (EXIT_UNSUCCESSFUL, "it ran, but the outcome is not success: the job FAILED or was CANCELED (`submit`, "
                        "`watch`, `stop`), a cluster did not start, `cluster status` found it not running, "
                        "a conformance scenario failed, `rescale` saw no batch at the new parallelism, the "
                        "JobManager went away while `submit` or `watch` followed a job (the message says "
                        "what that means for the job), or it failed at what was asked (DATA_LOSS: the "
                        "rows or state are there but cannot be read, also by `state --checkpoint`; "
                        "INTERNAL, UNKNOWN, ...)"),
    (EXIT_USAGE, "it could not run: bad usage, a job file that does not load, an invalid job graph, an "
                 "unknown job id, a checkpoint location without what `state --checkpoint` asks for (no "
                 "checkpoint, operator or kept batch of that name), no JobManager at the address (nothing "
                 "answers there, or what answers is not a JobManager, e.g. a TaskManager's port, or a standby), a client the cluster does not "
                 "let in, or a refusal (below): nothing was done"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); `submit` leaves the job running and says how to find it"),
)

# The status codes with which the JobManager refuses a request before it does anything: exit 2,
# like any command that could not run. Any other code (DATA_LOSS, INTERNAL, UNKNOWN, ...) means
# the JobManager tried and failed: exit 1. (A JobManager that does not answer, is a standby, is no
# JobManager or does not let the client in is told apart by the client's errors: exit 2 too.)
REFUSALS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "an argument the request does not take: `state` without `--operator` "
                                      "on a query with several keyed operators, `rescale -p` above the max "
                                      "parallelism, `result` without `--vertex` on a job with several collect "
                                      "sinks, a `--limit`, `--key` or `--timeout` out of range, an invalid job "
                                      "graph (`submit`)",
    grpc.StatusCode.NOT_FOUND: "no such job, collect sink (`result --vertex`) or keyed operator "
                               "(`state --operator`), or none at all where one is needed",
    grpc.StatusCode.FAILED_PRECONDITION: "the job's state does not allow it: `result` of a bounded job that has "
                                         "not FINISHED, `rescale` of anything but a running streaming query, "
                                         "`stop` or `progress` of a running bounded job, `state` of a bounded "
                                         "job or of a query that has ended",
    grpc.StatusCode.ALREADY_EXISTS: "a job id that is taken (`submit` of a job graph that names its id)",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "no room: too many jobs that have not ended (`submit`), not enough slots "
                                        "for the new parallelism (`rescale`), too many open `watch` streams, a "
                                        "message over the size limit",
    grpc.StatusCode.OUT_OF_RANGE: "a value outside the range the request takes",
    grpc.StatusCode.PERMISSION_DENIED: "a request this client may not make",
}


class UsageError(FunkeError):
    """The command line itself is wrong."""


def exit_code_of(error: FunkeError) -> int:
    """2 when the JobManager refused the request (a status code of `REFUSALS`), else 1."""
    return EXIT_USAGE if error.code in REFUSALS else EXIT_UNSUCCESSFUL


def print_error(message: str) -> None:
    print(f"funke: {message}", file=sys.stderr, flush=True)
