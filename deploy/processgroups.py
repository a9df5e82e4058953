"""Process groups of the processes funke's launchers start (each with start_new_session, so a
process's pid is its group's id): signalling one, telling whether anything of it still runs, and
what a pid runs (psutil reads the process table, on Linux and macOS alike).
Shared by the local cluster (`localcluster`) and the Spark standalone launcher (`sparkstandalone`);
they only ever pass pids they started or recorded."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable

import psutil

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # pid == pgid: start_new_session made each process a leader
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: a leader that exited
    stays a zombie until its parent (often init, which may take its time) reaps it."""
    for process in psutil.process_iter(["status"]):
        if process.info["status"] in _GONE:
            continue
        try:
            if os.getpgid(process.pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError):
            continue  # exited while we looked
    return False


def running(pid: int) -> bool:
    """Whether `pid` exists and is no zombie (a process that exited waits as one to be reaped)."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # exists, but not ours to look at


def command_line(pid: int) -> list[str] | None:
    """The command line `pid` runs; None once it is gone (or a zombie) or when it is not ours to read."""
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # a zombie is a NoSuchProcess too
        return None


def wait_gone(pids: Iterable[int], alive: Callable[[int], bool], deadline: float, poll_s: float = 0.1) -> None:
    """Until `deadline` (monotonic): wait for every process and all of its group to be gone.
    `alive` is the caller's own check (each launcher reaps its children its own way)."""
    pids = list(pids)
    while any(alive(pid) or group_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(poll_s)


def kill_what_is_left(pid: int, alive: Callable[[int], bool]) -> str:
    """After the SIGTERM and its grace: SIGKILL the process, or what it left of its group.
    Returns "killed" (the process itself was still running), "left-overs killed" or "stopped"."""
    if alive(pid):
        outcome = "killed"
    elif group_alive(pid):
        outcome = "left-overs killed"
    else:
        return "stopped"
    signal_group(pid, signal.SIGKILL)
    wait_gone([pid], alive, time.monotonic() + 5.0)
    return outcome
