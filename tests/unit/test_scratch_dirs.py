"""The TaskManager's Spark scratch directories (`<temp>/funke-taskmanager-<pid>`): what a killed
TaskManager left is removed by the next one, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys

from funke.taskmanager.sparkruntime import scratch_dir_of, sweep_scratch_dirs


def test_only_the_scratch_directories_of_dead_taskmanagers_are_swept(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = scratch_dir_of(str(tmp_path), child.pid)  # a pid that ran and is gone
    live = scratch_dir_of(str(tmp_path), os.getpid())
    os.makedirs(os.path.join(dead, "spark", "blockmgr-1"))
    os.makedirs(live)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, scratch_dir_of(str(tmp_path), 999999999))  # a link under our name: not followed
    for name in ("funke-taskmanager-", "funke-taskmanager-abc", "funke-taskmanager-0123", "other-1"):
        (tmp_path / name).mkdir()

    assert sweep_scratch_dirs(str(tmp_path)) == [dead]
    assert not os.path.exists(dead)
    assert os.path.isdir(live) and (target / "keep").exists()
    assert sorted(os.listdir(tmp_path)) == sorted([
        os.path.basename(live), "elsewhere", "funke-taskmanager-999999999", "funke-taskmanager-",
        "funke-taskmanager-abc", "funke-taskmanager-0123", "other-1"])


def test_a_missing_temp_directory_sweeps_nothing(tmp_path):
    assert sweep_scratch_dirs(str(tmp_path / "absent")) == []
