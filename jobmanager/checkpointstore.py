"""A streaming job's checkpoint location on disk: its metadata, offset log and commit log, the
lock that keeps two runs off one checkpoint, and purging old entries.

Owns the files of one checkpoint directory (the formats and the recovery rule are
`funke.common.streaming.checkpoint`'s):

    <checkpoint>/metadata          the query id, written once, kept across runs
    <checkpoint>/offsets/<batch>   the write-ahead log: one file per batch, written before it runs
    <checkpoint>/commits/<batch>   one file per batch committed to every sink
    <checkpoint>/sources/<source>/seen   a file source's seen-files log (JSON list, in order)
    <checkpoint>/.run.lock         flock'ed by the run that uses the checkpoint (SPARK-26425:
                                   a second run on the same checkpoint is refused)

Every write is atomic (temporary file, fsync, rename): a reader sees an entry whole or not at
all, and leftover temporary files (`.<name>.<pid>.tmp`, a writer killed mid-write) are ignored.
An entry is written once: writing a batch's entry again with other content is an error (a
re-run batch reuses its logged entry; it never logs anew).

Blocking I/O: the JobMaster calls it from an executor thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar

from funke.common import ids
from funke.common.streaming.checkpoint import (
    CheckpointError,
    CommitEntry,
    OffsetEntry,
    RecoveryPlan,
    commit_entry_bytes,
    metadata_bytes,
    offset_entry_bytes,
    parse_commit_entry,
    parse_metadata,
    parse_offset_entry,
    plan_recovery,
    to_purge,
)
from funke.runtime.hafilesystem import read_file, write_atomically

METADATA = "metadata"
OFFSETS = "offsets"
COMMITS = "commits"
SOURCES = "sources"
LOCK = ".run.lock"
DEFAULT_MIN_BATCHES_TO_RETAIN = 100  # Structured Streaming's spark.sql.streaming.minBatchesToRetain


T = TypeVar("T")


class CheckpointInUse(CheckpointError):
    """Another run holds the checkpoint."""


@dataclass(frozen=True, slots=True)
class Resumption:
    """What a run starting on this checkpoint goes on from."""
    query_id: str
    plan: RecoveryPlan
    logged: tuple[OffsetEntry, ...]  # the entries of plan.rerun, in order
    last_ends: dict  # per source, where the last logged batch ended ({} if none was logged)
    last: OffsetEntry | None = None  # the last logged entry (its watermark goes on)
    last_commit: CommitEntry | None = None  # the last commit entry (the event times seen by then)


class CheckpointStore:
    """One checkpoint directory, held by one run from `open()` until `close()`."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.offsets_dir = os.path.join(self.root, OFFSETS)
        self.commits_dir = os.path.join(self.root, COMMITS)
        self._lock_fd: int | None = None

    # -------------------------------------------------------------- the run's hold

    def open(self, holder: str) -> Resumption:
        """Take the checkpoint for one run (`holder` names it in the refusal another run gets),
        creating it if new; returns where the run goes on from. Raises CheckpointInUse, or
        CheckpointError for a checkpoint that cannot be used (naming the files)."""
        for d in (self.root, self.offsets_dir, self.commits_dir):
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file where a directory must be
                raise CheckpointError(f"the checkpoint location {self.root}: {d} is not a directory (a file is in "
                                      "its place)") from None
        fd = os.open(os.path.join(self.root, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
            os.close(fd)
            raise CheckpointInUse(f"the checkpoint {self.root} is in use by {other}: two runs of a query cannot "
                                  "share a checkpoint; stop that one first, or give this one its own") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode()[:200], 0)
            resumption = self._resume()
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        return resumption

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None

    def _resume(self) -> Resumption:
        path = os.path.join(self.root, METADATA)
        data = read_file(path)
        if data is None:
            query_id = str(uuid.uuid4())
            write_atomically(path, metadata_bytes(query_id))
        else:
            query_id = parse_metadata(data, path)
        offsets, commits = self.offset_ids(), self.commit_ids()
        plan = plan_recovery(offsets, commits)
        logged = tuple(self.read_offsets(b) for b in plan.rerun)
        last_commit = None
        if commits:  # the commit log names batches: their offset entries must be readable
            last_commit = self.read_commit(commits[-1])
        last = self.read_offsets(offsets[-1]) if offsets else None
        last_ends = {name: r.end for name, r in last.sources.items()} if last is not None else {}
        return Resumption(query_id, plan, logged, last_ends, last, last_commit)

    # -------------------------------------------------------------- the logs

    @staticmethod
    def _ids(directory: str) -> list[int]:
        """Batch ids of the entries in a log directory; other names (temporary files, strangers)
        are ignored."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isascii() and n.isdigit() and len(n) < 19)

    def offset_ids(self) -> list[int]:
        return self._ids(self.offsets_dir)

    def commit_ids(self) -> list[int]:
        return self._ids(self.commits_dir)

    @staticmethod
    def _read(directory: str, batch_id: int, parse: Callable[[bytes, int, str], T]) -> T:
        path = os.path.join(directory, str(batch_id))
        data = read_file(path)
        if data is None:
            raise CheckpointError(f"{path} is missing")
        return parse(data, batch_id, path)

    def read_offsets(self, batch_id: int) -> OffsetEntry:
        return self._read(self.offsets_dir, batch_id, parse_offset_entry)

    def read_commit(self, batch_id: int) -> CommitEntry:
        return self._read(self.commits_dir, batch_id, parse_commit_entry)

    def _write_once(self, path: str, data: bytes) -> None:
        self._require_held()
        existing = read_file(path)
        if existing is not None:
            if existing == data:
                return
            raise CheckpointError(f"{path} exists with other content: a batch's entry is written once")
        write_atomically(path, data)

    def write_offsets(self, entry: OffsetEntry) -> None:
        """The write-ahead log entry of a batch, before the batch runs."""
        self._write_once(os.path.join(self.offsets_dir, str(entry.batch_id)), offset_entry_bytes(entry))

    def write_commit(self, entry: CommitEntry) -> None:
        if not os.path.exists(os.path.join(self.offsets_dir, str(entry.batch_id))):
            raise CheckpointError(f"batch {entry.batch_id} has no offset log entry: it cannot be committed")
        self._write_once(os.path.join(self.commits_dir, str(entry.batch_id)), commit_entry_bytes(entry))

    # -------------------------------------------------------------- per-source logs

    def _source_log(self, source: str) -> str:
        ids.require_path_id(source, "source name")
        return os.path.join(self.root, SOURCES, source, "seen")

    def seen_files(self, source: str) -> list[str]:
        """A file source's seen-files log: every file it took, in the order taken."""
        data = read_file(self._source_log(source))
        if data is None:
            return []
        try:
            names = json.loads(data)
        except ValueError:
            raise CheckpointError(f"{self._source_log(source)}: not readable JSON") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CheckpointError(f"{self._source_log(source)}: expected a list of file names")
        return names

    def add_seen_files(self, source: str, names: list[str]) -> None:
        """Append to a file source's seen-files log, durably, before an offset entry uses them."""
        self._require_held()
        if not names:
            return
        path = self._source_log(source)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomically(path, json.dumps(self.seen_files(source) + list(names)).encode())

    def purge(self, retain: int = DEFAULT_MIN_BATCHES_TO_RETAIN) -> int:
        """Delete the entries older than the last `retain` committed batches; how many went."""
        self._require_held()
        commits = self.commit_ids()
        if not commits:
            return 0
        offsets, old_commits = to_purge(self.offset_ids(), commits, commits[-1], retain)
        for directory, batch_ids in ((self.commits_dir, old_commits), (self.offsets_dir, offsets)):
            for b in batch_ids:  # killed half-way, older entries stay behind: recovery reads past them
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, str(b)))
        return len(offsets) + len(old_commits)

    def _require_held(self) -> None:
        if self._lock_fd is None:
            raise CheckpointError(f"the checkpoint {self.root} is not held by this run (open() it first)")
