"""How a `funke` command ends: its exit code, and an error line on stderr.

    0  the command did what was asked (for submit and watch: the job FINISHED)
    1  it ran, but the outcome is not success (the job FAILED or was CANCELED, a cluster did
       not start, the JobManager went away while a job was being followed, keyed state that is
       there cannot be read, ...)
    2  it could not run: bad usage, a job file that does not load, an invalid job graph, an
       unknown job id, a checkpoint without what was asked of it, or no JobManager at the
       address (nothing answers, or what answers is not a JobManager)
"""

from __future__ import annotations

import sys

from funke.deploy.client import FunkeError


EXIT_OK, EXIT_UNSUCCESSFUL, EXIT_USAGE = 0, 1, 2


class UsageError(FunkeError):
    """The command line itself is wrong."""


def print_error(message: str) -> None:
    print(f"funke: {message}", file=sys.stderr, flush=True)
