"""The JobManager's claim on its data directory, and the sweep of what no live job owns.

Owns two things done once, at start-up, before the JobManager accepts a job:

- **The claim.** A local data directory is locked (`flock` on `<data dir>/.jobmanager.lock`, held
  for the life of the process): a second JobManager pointed at the same directory refuses to
  start instead of sweeping away the first one's running jobs. A non-local data directory
  (hdfs://, s3a://) cannot be locked this way; such a JobManager does not sweep.
- **The sweep.** Without high availability no job outlives its JobManager, so at start-up every
  job directory under `<data dir>/jobs/` is an orphan of an earlier JobManager (a crash leaves
  result partitions, cancel markers and collected rows behind). They are removed; nothing
  outside `<data dir>/jobs/` is touched, and entries whose names are not job ids are left alone
  and reported. With high availability the JobManagers of a cluster share the data directory
  (the lease, not the lock, says who acts): the new leader sweeps once it leads, keeping the jobs
  the HA stores still own (`sweep(data_dir, keep)`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from urllib.parse import urlparse
from dataclasses import dataclass, field

from funke.common import ids, layout

log = logging.getLogger("funke.jobmanager")

LOCK_FILE = ".jobmanager.lock"


class DataDirInUse(Exception):
    """Another JobManager holds the data directory."""


@dataclass
class DataDirClaim:
    data_dir: str
    lock_fd: int | None = None  # held open while the process lives
    swept: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _local(data_dir: str) -> str | None:
    if "://" not in data_dir:
        return os.path.abspath(data_dir)
    if data_dir.startswith("file://"):
        return os.path.abspath(urlparse(data_dir).path or "/")
    return None


def claim(data_dir: str, *, sweep: bool = True) -> DataDirClaim:
    """Lock a local data directory and sweep its orphaned job directories. Raises DataDirInUse
    if another process holds it."""
    result = DataDirClaim(data_dir)
    local = _local(data_dir)
    if local is None:
        log.info("data dir %s is not local: not locked, orphaned job data is not swept", data_dir)
        return result
    os.makedirs(local, exist_ok=True)
    fd = os.open(os.path.join(local, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise DataDirInUse(f"data dir {local} is in use by another JobManager{holder}; give this one its own "
                           "--data-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    result.lock_fd = fd
    if sweep:
        _sweep(local, result)
    return result


def sweep(data_dir: str, keep: set[str] | frozenset[str] = frozenset()) -> DataDirClaim:
    """Remove the job directories of a local data directory except those in `keep` (no lock)."""
    result = DataDirClaim(data_dir)
    local = _local(data_dir)
    if local is not None:
        _sweep(local, result, keep)
    return result


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def _sweep(local: str, result: DataDirClaim, keep: set[str] | frozenset[str] = frozenset()) -> None:
    jobs = layout.jobs_dir(local)
    if os.path.islink(jobs):
        # Following it would sweep whatever directory it points to.
        log.warning("%s is a symbolic link: not swept", jobs)
        result.left_alone.append("jobs")
        return
    try:
        entries = list(os.scandir(jobs))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name in keep:
            continue
        if not ids.is_path_id(entry.name, ids.MAX_JOB_ID_LENGTH) or entry.is_symlink() or not entry.is_dir():
            result.left_alone.append(entry.name)
            continue
        path = layout.job_dir(local, entry.name)
        if not layout.is_within(jobs, path) or os.path.realpath(path) != os.path.join(os.path.realpath(jobs), entry.name):
            result.left_alone.append(entry.name)
            continue
        shutil.rmtree(path, ignore_errors=True)
        result.swept.append(entry.name)
    if result.swept:
        log.info("removed what %d job(s) of an earlier JobManager left in %s", len(result.swept), jobs)
    if result.left_alone:
        log.warning("left %d entr(y/ies) in %s alone: not job directories (%s)", len(result.left_alone), jobs,
                    ", ".join(ids.echo(n, 40) for n in result.left_alone[:5]))
