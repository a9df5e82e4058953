"""High availability on a local file system: the lease that elects the leader, leader retrieval,
the job graph store and the job result store (`high-availability: filesystem`).

Owns the files under `<high-availability.storageDir>/<high-availability.cluster-id>/`:

    leader/leases/<epoch>.json    the lease of each epoch (the fencing token): holder, leader
                                  address, renewal. Created once, by the contender that wins the
                                  epoch (a hard link of a complete file: of two racing, one gets
                                  it); then rewritten only by its holder. The lease is the one of
                                  the highest epoch; the older ones go once a new epoch begins
    leader/contenders/<digest>.json  each contending JobManager (holder, address, last round):
                                  who takes part, leader and standbys, for `funke cluster status`
    jobgraphs/<job id>.jobgraph   a submitted JobGraph (its wire form, artifacts included), kept
                                  until the job is globally terminal
    jobgraphs/<job id>.history    the job's status transitions so far, across leaders (JSON)
    jobgraphs/<job id>.progress   the job's finished subtasks as last recorded (JSON): what a new
                                  leader takes over instead of running it again
    job-results/<job id>_DIRTY.json  a terminal job whose clean-up is not done yet (Flink's
                                  naming); renamed to <job id>.json once it is
    archive/<job id>.archived     what `funke list/status` show of a terminal job (protobuf)

Every write is atomic (temporary file, fsync, rename, fsync of the directory): a reader sees the
old content or the new, never a torn file. Every write of a leader is fenced: it checks that the
lease is still its own with the epoch it was granted, and refuses (`Fenced`) otherwise, so a
deposed leader that has not noticed yet changes nothing.

No process ever waits for another: there is no lock. A lock held by a leader that is paused (a
stop signal, a frozen VM, a long GC) in the middle of a write would keep every standby from
taking over for as long as the pause lasts. Instead each epoch's lease is a file of its own, so
what a paused leader writes when it wakes (the renewal it had decided on) is never taken for
the lease of a later epoch. The price: a leader paused between its fencing check and the rename
of one store write lands that one write after its successor took over. Each store write holds a
whole record (a job's graph, history, progress or result), written again whole by whoever leads
next, so such a write is what the deposed leader knew when it paused, superseded by the next
write of its successor.

What to decide lives in `funke.common.leadership`; this module does the I/O. It is meant for the
JobManagers of one machine (or a file system with working hard links and rename); several hosts use
ZooKeeper.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator

import psutil

from funke.common import ids
from funke.common.leadership import DEFAULT_LEASE_S, Change, Contender, Granted, Lease

LEASES_DIR = "leases"
_OLD_EPOCHS_KEPT = 2  # the lease files of the epochs just before the current one stay, for a reader
_SUFFIX_GRAPH = ".jobgraph"
_SUFFIX_HISTORY = ".history"
_SUFFIX_ARCHIVE = ".archived"
_SUFFIX_PROGRESS = ".progress"
_DIRTY = "_DIRTY.json"
_CLEAN = ".json"
MAX_RECORD_BYTES = 64 * 1024 * 1024  # a JobGraph with artifacts is capped well below this by gRPC
# A contender not seen for this many lease durations is not counted (rounds come three times per
# lease), and its record goes after this many.
_SILENT_AFTER = 2
_FORGOTTEN_AFTER = 10


class Fenced(Exception):
    """A write by a contender that does not hold the lease (any more) with its epoch."""


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: str
    status: str  # the JobStatus value
    ended_at: float
    epoch: int  # the leader that recorded it
    clean: bool = False  # the job's clean-up (job graph removed, ...) is done


def process_identity(pid: int | None = None) -> str:
    """`host:pid:start` for this (or another local) process: unique for the process's life, so a
    reused pid is not mistaken for the holder."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"


def _start_ticks(pid: int) -> str:
    """When process `pid` started (seconds since the epoch, as psutil reads it), "?" if unknown."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return "?"


def holder_gone(holder: str) -> bool:
    """Whether the lease holder is a process of this host that no longer exists, or exited and
    waits to be reaped (a kill -9 of the leader frees the lease at once instead of after it
    expires). Unknown: False."""
    host, _, rest = holder.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or start in ("", "?"):
        return False
    return _start_ticks(int(pid_text)) != start or _zombie(int(pid_text))


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    # one name per writer: a process's executor threads may write the same file at once
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
    _write_synced(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), data)
    os.replace(tmp, path)
    _fsync_dir(directory)


def _write_synced(fd: int, data: bytes) -> None:
    """Write all of `data` to the new file `fd`, sync it to disk and close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def create_once(path: str, data: bytes) -> bool:
    """Create `path` with `data`, whole and at once, unless it exists (False): a hard link of a
    written and synced temporary file, which never replaces what is there (where
    `write_atomically`'s rename would). Of two writers racing for one name, exactly one wins."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}."
                                  f"{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        _write_synced(fd, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(directory)
    return True


def read_file(path: str) -> bytes | None:
    """A file's content (at most MAX_RECORD_BYTES), or None if it is missing or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_RECORD_BYTES + 1)[:MAX_RECORD_BYTES]


def json_records(data: bytes | None) -> list[dict]:
    """A stored JSON list of records (history, progress); what cannot be read counts as none."""
    try:
        value = json.loads(data) if data else []
    except ValueError:
        return []
    return [t for t in value if isinstance(t, dict)] if isinstance(value, list) else []


def job_result_from_json(job_id: str, data: bytes | None, clean: bool | None = None) -> JobResult | None:
    """A stored job result (None if unreadable); `clean` overrides the stored flag."""
    try:
        raw = json.loads(data or b"")
        return JobResult(job_id, str(raw["status"]), float(raw["ended_at"]), int(raw["epoch"]),
                         clean=bool(raw.get("clean", False)) if clean is None else clean)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def lease_to_json(lease: Lease) -> bytes:
    return json.dumps(asdict(lease), sort_keys=True).encode()


def lease_from_json(data: bytes | None) -> Lease | None:
    """The lease, or None if there is none or it cannot be read (a stranger's file: treated as no
    lease, so it is overwritten by the next leader rather than blocking the cluster)."""
    if not data:
        return None
    try:
        raw = json.loads(data)
        return Lease(holder=str(raw["holder"]), epoch=int(raw["epoch"]), address=str(raw["address"]),
                     renewed_at=float(raw["renewed_at"]), duration_s=float(raw["duration_s"]),
                     released=bool(raw.get("released", False)), since=float(raw.get("since", 0.0)))
    except (ValueError, KeyError, TypeError):
        return None


class FileSystemHaServices:
    """The HA services of one cluster on a local directory, for one process (a contender, a
    TaskManager or a client: the latter two only read the lease)."""

    def __init__(self, storage_dir: str, cluster_id: str = "default", lease_duration_s: float = DEFAULT_LEASE_S):
        ids.require_path_id(cluster_id, "high-availability.cluster-id")
        self.lease_duration_s = lease_duration_s
        self.root = os.path.join(os.path.abspath(storage_dir), cluster_id)
        self.leader_dir = os.path.join(self.root, "leader")
        self.contenders_dir = os.path.join(self.leader_dir, "contenders")
        self.leases_dir = os.path.join(self.leader_dir, LEASES_DIR)
        self.graphs_dir = os.path.join(self.root, "jobgraphs")
        self.results_dir = os.path.join(self.root, "job-results")
        self.archive_dir = os.path.join(self.root, "archive")

    def create_dirs(self) -> None:
        for d in (self.leader_dir, self.contenders_dir, self.leases_dir, self.graphs_dir, self.results_dir, self.archive_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)

    def on_change(self, callback: Callable[[], None]) -> None:
        """ZooKeeper wakes the election when the leader goes; a lease file is polled instead."""

    def close(self) -> None:
        """Nothing to close: every call opens and closes its own files."""

    # ------------------------------------------------------------------ leader election

    def _lease_path(self, epoch: int) -> str:
        return os.path.join(self.leases_dir, f"{epoch}.json")

    def _epochs(self) -> list[int]:
        """Every epoch with a lease file, highest first."""
        return sorted((int(n[:-5]) for n in _names(self.leases_dir) if n.endswith(".json") and n[:-5].isdigit()),
                      reverse=True)

    def _current(self) -> tuple[Lease | None, int]:
        """The lease of the highest epoch (None if there is none or it cannot be read: a
        stranger's file is no lease, and the next leader's epoch is above it), and that epoch."""
        for _ in range(3):  # a new epoch's old ones can go between the listing and the read
            epochs = self._epochs()
            if not epochs:
                return None, 0
            data = read_file(self._lease_path(epochs[0]))
            if data is not None:
                lease = lease_from_json(data)
                return (lease if lease is not None and lease.epoch == epochs[0] else None), epochs[0]
        return None, epochs[0]

    def leader(self) -> Lease | None:
        """Leader retrieval: the current lease as written (check `valid(now)` for a live leader)."""
        return self._current()[0]

    def write_lease(self, lease: Lease) -> None:
        """Renew (or release) a lease its holder leads with. Only that epoch's file changes: a
        holder deposed since it decided to renew writes where nobody reads the current lease."""
        write_atomically(self._lease_path(lease.epoch), lease_to_json(lease))

    def _create_lease(self, lease: Lease) -> bool:
        """Begin `lease.epoch`: its file is created with the lease in it, complete, at once, unless
        another contender created it first (False)."""
        path = self._lease_path(lease.epoch)
        os.makedirs(self.leases_dir, mode=0o700, exist_ok=True)
        if not create_once(path, lease_to_json(lease)):
            return False
        for epoch in self._epochs():
            if epoch < lease.epoch - _OLD_EPOCHS_KEPT:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._lease_path(epoch))
        return True

    def contend(self, contender: Contender, now: float | None = None) -> tuple[Lease | None, list[Change]]:
        """One election round for `contender`: returns the lease as it stands after the round and
        what changed for the contender (granted, revoked)."""
        current, last_epoch = self._current()
        t = time.time() if now is None else now
        gone = current is not None and current.holder != contender.holder and holder_gone(current.holder)
        new, changes = contender.step(current, t, gone, last_epoch)
        if new is not None:
            if not any(isinstance(c, Granted) for c in changes):
                self.write_lease(new)
                current = new
            elif self._create_lease(new):
                current = new
            else:  # another contender won this epoch between our read and our write
                contender.outraced()
                changes = [c for c in changes if not isinstance(c, Granted)]
                current = self.leader()
        self._announce(contender, t)
        return current, changes

    def release(self, contender: Contender, now: float | None = None) -> list[Change]:
        new, changes = contender.release(self.leader(), time.time() if now is None else now)
        if new is not None:
            self.write_lease(new)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._contender_file(contender.holder))
        return changes

    # ------------------------------------------------------------------ who contends

    def _contender_file(self, holder: str) -> str:
        return os.path.join(self.contenders_dir, hashlib.sha256(holder.encode()).hexdigest()[:24] + ".json")

    def _announce(self, contender: Contender, now: float) -> None:
        """Say that `contender` takes part (each round), and forget the contenders that are
        gone. Not fenced and not synced: it only tells people who runs."""
        record = json.dumps({"holder": contender.holder, "address": contender.address, "seen_at": now,
                             "duration_s": contender.duration_s}).encode()
        path = self._contender_file(contender.holder)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(record)
            os.replace(tmp, path)
        except FileNotFoundError:  # the directory of an older layout: made on the next start
            return
        for holder, _, seen, duration, name in self._contender_records():
            if holder != contender.holder and (holder_gone(holder) or now - seen > _FORGOTTEN_AFTER * duration):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.contenders_dir, name))

    def _contender_records(self) -> list[tuple[str, str, float, float, str]]:
        found = []
        for name in _names(self.contenders_dir):
            if not name.endswith(".json"):
                continue
            try:
                raw = json.loads(read_file(os.path.join(self.contenders_dir, name)) or b"")
                found.append((str(raw["holder"]), str(raw["address"]), float(raw["seen_at"]),
                              float(raw["duration_s"]), name))
            except (ValueError, KeyError, TypeError):
                continue
        return found

    def contenders(self, now: float | None = None) -> list[tuple[str, str]]:
        """Every JobManager taking part in the election now (leader and standbys): (holder,
        address), in holder order. One that has not been seen for a few lease durations, or a
        process of this host that is gone, is left out."""
        t = time.time() if now is None else now
        return sorted((holder, address) for holder, address, seen, duration, _ in self._contender_records()
                      if t - seen <= _SILENT_AFTER * duration and not holder_gone(holder))

    @contextlib.contextmanager
    def _fenced(self, holder: str, epoch: int) -> Iterator[None]:
        """Write only while the lease is `holder`'s with `epoch` (see the module's note on a
        leader paused inside the write)."""
        current = self.leader()
        if current is None or current.holder != holder or current.epoch != epoch or current.released:
            now_leading = "nobody" if current is None else f"epoch {current.epoch}"
            raise Fenced(f"the lease of epoch {epoch} is not held any more ({now_leading} leads)")
        yield

    # ------------------------------------------------------------------ job graph store

    def _job_path(self, directory: str, job_id: str, suffix: str) -> str:
        ids.require_path_id(job_id, "job id", ids.MAX_JOB_ID_LENGTH)
        return os.path.join(directory, job_id + suffix)

    def put_job_graph(self, holder: str, epoch: int, job_id: str, job_graph: bytes) -> None:
        path = self._job_path(self.graphs_dir, job_id, _SUFFIX_GRAPH)
        with self._fenced(holder, epoch):
            write_atomically(path, job_graph)

    def put_history(self, holder: str, epoch: int, job_id: str, history: list[dict]) -> None:
        path = self._job_path(self.graphs_dir, job_id, _SUFFIX_HISTORY)
        with self._fenced(holder, epoch):
            write_atomically(path, json.dumps(history).encode())

    def put_progress(self, holder: str, epoch: int, job_id: str, progress: list[dict]) -> None:
        path = self._job_path(self.graphs_dir, job_id, _SUFFIX_PROGRESS)
        with self._fenced(holder, epoch):
            write_atomically(path, json.dumps(progress).encode())

    def progress(self, job_id: str) -> list[dict]:
        return json_records(read_file(self._job_path(self.graphs_dir, job_id, _SUFFIX_PROGRESS)))

    def job_graph_ids(self) -> list[str]:
        return sorted(n[:-len(_SUFFIX_GRAPH)] for n in _names(self.graphs_dir)
                      if n.endswith(_SUFFIX_GRAPH) and ids.is_path_id(n[:-len(_SUFFIX_GRAPH)], ids.MAX_JOB_ID_LENGTH))

    def job_graph(self, job_id: str) -> bytes | None:
        return read_file(self._job_path(self.graphs_dir, job_id, _SUFFIX_GRAPH))

    def history(self, job_id: str) -> list[dict]:
        return json_records(read_file(self._job_path(self.graphs_dir, job_id, _SUFFIX_HISTORY)))

    def remove_job_graph(self, holder: str, epoch: int, job_id: str) -> None:
        paths = [self._job_path(self.graphs_dir, job_id, s) for s in (_SUFFIX_GRAPH, _SUFFIX_HISTORY, _SUFFIX_PROGRESS)]
        with self._fenced(holder, epoch):
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            _fsync_dir(self.graphs_dir)

    # ------------------------------------------------------------------ job result store

    def put_dirty_result(self, holder: str, epoch: int, result: JobResult) -> None:
        path = self._job_path(self.results_dir, result.job_id, _DIRTY)
        with self._fenced(holder, epoch):
            write_atomically(path, json.dumps(asdict(result)).encode())

    def mark_result_clean(self, holder: str, epoch: int, job_id: str) -> None:
        dirty = self._job_path(self.results_dir, job_id, _DIRTY)
        clean = self._job_path(self.results_dir, job_id, _CLEAN)
        with self._fenced(holder, epoch):
            data = read_file(dirty)
            if data is None:
                return
            try:
                raw = json.loads(data)
                raw["clean"] = True
                write_atomically(clean, json.dumps(raw).encode())
            except ValueError:
                pass
            os.unlink(dirty)
            _fsync_dir(self.results_dir)

    def results(self) -> dict[str, JobResult]:
        """Every job result, clean ones winning over a leftover dirty one."""
        found: dict[str, JobResult] = {}
        for name in sorted(_names(self.results_dir), key=lambda n: n.endswith(_DIRTY), reverse=True):
            job_id = name[:-len(_DIRTY)] if name.endswith(_DIRTY) else name[:-len(_CLEAN)] if name.endswith(_CLEAN) else ""
            if not ids.is_path_id(job_id, ids.MAX_JOB_ID_LENGTH):
                continue
            result = job_result_from_json(job_id, read_file(os.path.join(self.results_dir, name)),
                                          clean=not name.endswith(_DIRTY))
            if result is not None:
                found[job_id] = result
        return found

    # ------------------------------------------------------------------ archive of terminal jobs

    def put_archive(self, holder: str, epoch: int, job_id: str, data: bytes) -> None:
        path = self._job_path(self.archive_dir, job_id, _SUFFIX_ARCHIVE)
        with self._fenced(holder, epoch):
            write_atomically(path, data)

    def archives(self) -> dict[str, bytes]:
        found = {}
        for name in _names(self.archive_dir):
            job_id = name[:-len(_SUFFIX_ARCHIVE)]
            if name.endswith(_SUFFIX_ARCHIVE) and ids.is_path_id(job_id, ids.MAX_JOB_ID_LENGTH):
                data = read_file(os.path.join(self.archive_dir, name))
                if data is not None:
                    found[job_id] = data
        return found

    def remove_archive(self, holder: str, epoch: int, job_id: str) -> None:
        path = self._job_path(self.archive_dir, job_id, _SUFFIX_ARCHIVE)
        with self._fenced(holder, epoch):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _names(directory: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
