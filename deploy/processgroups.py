"""Process groups of the processes funke's launchers start (each with start_new_session, so a
process's pid is its group's id): signalling one, and telling whether anything of it still runs.
Shared by the local cluster (`localcluster`) and the Spark standalone launcher (`sparkstandalone`);
they only ever pass pids they started or recorded."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # pid == pgid: start_new_session made each process a leader
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: a leader that exited
    stays a zombie until its parent (often init, which may take its time) reaps it."""
    proc = Path("/proc")
    if not (proc / "self").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited while we looked
        # After the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


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
