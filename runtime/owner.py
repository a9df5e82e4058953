"""A process that lives only as long as the process that owns it.

An embedded mini cluster (`env.execute()` with no JobManager configured) starts a JobManager and
a TaskManager as children of the user's script or notebook kernel. They must not outlive it, even
when it is killed -9 (no atexit runs then), so each is started with `--owner PID:START`: the pid
of the owner and its start time (pids are reused; the start time tells the owner from a newcomer
with its pid). `watch_owner` polls it and, once it is gone, stops the process the same way
SIGTERM would: gracefully, taking its Spark JVM along.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable

import psutil

log = logging.getLogger("funke.runtime")

POLL_S = 0.5


def owner_token(pid: int) -> str:
    """`PID:START` of a running process (its start time in centiseconds since the epoch)."""
    return f"{pid}:{round(psutil.Process(pid).create_time() * 100)}"


def parse_owner(token: str) -> tuple[int, int]:
    """(pid, start) of an `--owner` value; ValueError naming what is wrong."""
    pid, sep, start = token.partition(":")
    if not sep or not pid.isdigit() or not start.isdigit() or int(pid) <= 0:
        raise ValueError(f"--owner: expected PID:START (as owner_token makes it), got {token!r}")
    return int(pid), int(start)


def owner_argument(text: str) -> str:
    """`--owner`'s argparse type: the text, if it is a `PID:START`."""
    try:
        parse_owner(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def owner_alive(pid: int, start: int) -> bool:
    """Whether the process `pid` that started at `start` still runs (a zombie does not)."""
    try:
        process = psutil.Process(pid)
        return (round(process.create_time() * 100) == start
                and process.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


async def watch_owner(token: str, on_gone: Callable[[], object], poll_s: float = POLL_S) -> None:
    """Call `on_gone` once the owner named by `token` has ended (at once if it already has)."""
    pid, start = parse_owner(token)
    while owner_alive(pid, start):
        await asyncio.sleep(poll_s)
    log.warning("the process that owns this one (pid %d) has ended: stopping", pid)
    on_gone()
