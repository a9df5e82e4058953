"""Process groups of the processes funke's launchers start (each with start_new_session, so a
process's pid is its group's id): signalling one, and telling whether anything of it still runs.
Shared by the local cluster (`localcluster`) and the Spark standalone launcher (`sparkstandalone`);
they only ever pass pids they started or recorded."""

from __future__ import annotations

import os
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
