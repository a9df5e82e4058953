"""A JobManager claims its data directory: one JobManager per directory, and what jobs of an
earlier JobManager left behind is swept at start-up, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys


from funke.jobmanager import datadir


def test_the_sweep_removes_job_directories_only(tmp_path):
    data = tmp_path / "data"
    for job in ("a1b2", "other-job"):
        (data / "jobs" / job / "partitions" / "d" / "p0" / "a0").mkdir(parents=True)
    (data / "jobs" / "not a job id").mkdir()
    (data / "jobs" / "stray-file").write_text("x")
    (data / "elsewhere.txt").write_text("keep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    os.symlink(outside, data / "jobs" / "linked")  # a job id, but a link: not followed, not removed
    claim = datadir.claim(str(data))
    try:
        assert sorted(claim.swept) == ["a1b2", "other-job"]
        assert sorted(claim.left_alone) == ["linked", "not a job id", "stray-file"]
        assert sorted(p.name for p in (data / "jobs").iterdir()) == ["linked", "not a job id", "stray-file"]
        assert (outside / "precious").read_text() == "keep" and (data / "elsewhere.txt").read_text() == "keep"
    finally:
        claim.release()


def test_a_second_jobmanager_on_the_same_data_directory_is_refused(tmp_path):
    data = tmp_path / "data"
    (data / "jobs" / "running-job").mkdir(parents=True)
    claim = datadir.claim(str(data), sweep=False)
    try:
        other = subprocess.run(
            [sys.executable, "-c", "import sys; from funke.jobmanager import datadir\n"
             "try:\n    datadir.claim(sys.argv[1])\nexcept datadir.DataDirInUse as e:\n    print(e); sys.exit(3)",
             str(data)], capture_output=True, text=True, timeout=60)
        assert other.returncode == 3, other.stderr
        assert "in use by another JobManager" in other.stdout and f"pid {os.getpid()}" in other.stdout
        assert (data / "jobs" / "running-job").is_dir()  # the second one swept nothing
    finally:
        claim.release()
    again = datadir.claim(str(data))  # released: the next JobManager may take it
    again.release()


def test_a_data_directory_that_is_not_local_is_neither_locked_nor_swept():
    claim = datadir.claim("hdfs://namenode:8020/funke")
    assert claim.lock_fd is None and claim.swept == []


def test_a_jobs_directory_that_is_a_link_is_not_followed(tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "home"
    (elsewhere / "projects").mkdir(parents=True)
    data.mkdir()
    os.symlink(elsewhere, data / "jobs")
    claim = datadir.claim(str(data))
    try:
        assert claim.swept == [] and (elsewhere / "projects").is_dir()
    finally:
        claim.release()
