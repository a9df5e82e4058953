"""A streaming job's checkpoint location on disk: its metadata, offset log and commit log, the
lease that keeps two runs off one checkpoint, and purging old entries.

Owns the files of one checkpoint directory (the formats and the recovery rule are
`funke.common.streaming.checkpoint`'s, the lease's rules `funke.common.streaming.checkpointlease`'s):

    <checkpoint>/metadata          the query id, written once, kept across runs
    <checkpoint>/offsets/<batch>   the write-ahead log: one file per batch, written before it runs
    <checkpoint>/commits/<batch>   one file per batch committed to every sink
    <checkpoint>/sources/<source>/seen   a file source's seen-files log (JSON list, in order)
    <checkpoint>/lease/<epoch>     the lease of each run that took the checkpoint (SPARK-26425:
                                   two runs of a query never write one checkpoint). Created once
                                   (a hard link of a complete file: of two runs racing, one gets
                                   the epoch), then rewritten only by its holder (renewal,
                                   release). The checkpoint's lease is the one of the highest
                                   epoch; older ones go once a new epoch begins

A run takes the checkpoint in `open()` (a lease of the next epoch), renews its lease while it
runs (`renew()`, three times per lease), and releases it in `close()`. Another run may take it
once it is released, expired (not renewed: the holder is paused or hung), or held by a process
of this host that is gone, and at once if its leader (high availability) has a higher epoch than
the holder's: a JobManager that was paused never keeps its successor from the query. There is
no lock: nothing a paused process holds blocks anyone.

Every write checks first that the checkpoint's lease is still this run's, with its epoch, and
refuses otherwise (`CheckpointFenced`): a run that was taken over, woken from a pause, writes
nothing. Entries say the lease epoch they were written under (`leaseEpoch`). Every write is
atomic (temporary file, fsync, rename or link): a reader sees an entry whole or not at all, and
leftover temporary files (`.<name>.<pid>....tmp`, a writer killed mid-write) are ignored. An
entry (and the metadata) is written once, with link(): it is created if absent and never
replaced, so a stale writer cannot overwrite what the run that took over wrote; writing a
batch's entry again with other content is an error (a re-run batch reuses its logged entry).

What remains: a run paused between its check of the lease and the write itself (a few system
calls) lands that one write after its successor took over, as the HA file store's leader does
(`funke.runtime.hafilesystem`). For an entry that is at most one entry its successor had not
written yet (link() refuses the rest), made by a run of the same query from the same logs: the
successor runs it as a logged batch, or refuses its own differing entry and the job restarts
from the checkpoint. The seen-files log is rewritten whole (appended to): such a late write
could drop the names its successor appended since; a purge only removes entries every run
agrees are done.

Blocking I/O: the JobMaster calls it from an executor thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar

from funke.common import ids
from funke.common.streaming import checkpointlease as cl
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
from funke.runtime.hafilesystem import create_once, holder_gone, process_identity, read_file, write_atomically

METADATA = "metadata"
OFFSETS = "offsets"
COMMITS = "commits"
SOURCES_DIR = "sources"
LEASE = "lease"
_OLD_EPOCHS_KEPT = 2  # the leases of the epochs just before the current one stay, for a reader
DEFAULT_MIN_BATCHES_TO_RETAIN = 100  # Structured Streaming's spark.sql.streaming.minBatchesToRetain


T = TypeVar("T")
log = logging.getLogger("funke.jobmanager")


class CheckpointInUse(CheckpointError):
    """Another run holds the checkpoint."""


class CheckpointFenced(CheckpointError):
    """A write by a run whose lease on the checkpoint is over (another run took it over)."""


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

    def __init__(self, root: str, lease_s: float = cl.DEFAULT_LEASE_S, clock: Callable[[], float] = time.time):
        self.root = os.path.abspath(root)
        self.offsets_dir = os.path.join(self.root, OFFSETS)
        self.commits_dir = os.path.join(self.root, COMMITS)
        self.lease_dir = os.path.join(self.root, LEASE)
        self.lease_s = lease_s
        self._clock = clock
        self._hold: tuple[str, int, str] | None = None  # (holder, epoch, description) while held
        self._renewed_at = 0.0  # when this run last found its lease its own (or took it)

    # -------------------------------------------------------------- the run's lease

    @property
    def epoch(self) -> int | None:
        """The epoch of this run's lease (None: not held)."""
        return self._hold[1] if self._hold is not None else None

    def open(self, holder: str, *, leader_epoch: int = 0, scope: str = "") -> Resumption:
        """Take the checkpoint for one run (`holder` names it in the refusal another run gets),
        creating it if new; returns where the run goes on from. `leader_epoch` and `scope`: the
        epoch and cluster of the leading JobManager under high availability (a newer leader of the
        same cluster takes the checkpoint over from an older one at once). Raises CheckpointInUse,
        or CheckpointError for a checkpoint that cannot be used (naming the files)."""
        for d in (self.root, self.offsets_dir, self.commits_dir, self.lease_dir):
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file where a directory must be
                raise CheckpointError(f"the checkpoint location {self.root}: {d} is not a directory (a file is in "
                                      "its place)") from None
        identity = f"{process_identity()}/{secrets.token_hex(6)}"
        claim = cl.Claim(identity, holder[:200], scope, leader_epoch, self.lease_s)
        for _ in range(3):  # another run may take the next epoch between our read and our write
            current, last = self._current()
            now = self._clock()
            gone = current is not None and not current.released and _process_gone(current.holder)
            decision = cl.claim(current, claim, now, gone, last)
            if isinstance(decision, cl.Refused):
                raise CheckpointInUse(f"the checkpoint {self.root} is {decision.reason}: two runs of a query cannot "
                                      "share a checkpoint; stop that one first, or give this one its own")
            if self._create_lease(decision.lease):
                break
        else:
            raise CheckpointInUse(f"the checkpoint {self.root} is in use: other runs took it while this one "
                                  f"({holder}) tried to; two runs of a query cannot share a checkpoint")
        if decision.over:
            log.warning("checkpoint %s: %s by %s (lease epoch %d)", self.root, decision.over, holder,
                        decision.lease.epoch)
        self._hold, self._renewed_at = (identity, decision.lease.epoch, holder[:200]), now
        try:
            return self._resume()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let go of the checkpoint: the lease is released, so the next run takes it at once
        (idempotent; a lease taken over meanwhile is left alone)."""
        hold, self._hold = self._hold, None
        if hold is None:
            return
        with contextlib.suppress(OSError):
            released = cl.release(self._lease(hold[1]), hold[0], hold[1], self._clock())
            if released is not None and self._current()[1] == hold[1]:
                write_atomically(self._lease_path(hold[1]), cl.lease_bytes(released))

    def renew(self) -> None:
        """Renew this run's lease (three times per lease duration, by its run). Raises
        CheckpointFenced if it was taken over: the run has lost the checkpoint."""
        hold = self._require_held()
        now = self._clock()
        current, _ = self._current()
        renewed = cl.renew(current, hold[0], hold[1], now)
        if isinstance(renewed, str):
            raise self._fenced(hold, renewed)
        # Only this epoch's file changes: a renewal decided before a take-over lands on a lease
        # that is no longer the checkpoint's.
        write_atomically(self._lease_path(hold[1]), cl.lease_bytes(renewed))
        self._renewed_at = now

    def check(self) -> None:
        """Raises CheckpointFenced unless this run still holds the checkpoint (before anything
        it writes, here or in a sink). A lease that expired without anybody taking it over is
        renewed first."""
        hold = self._require_held()
        current, _ = self._current()
        reason = cl.may_write(current, hold[0], hold[1])
        if reason is not None:
            raise self._fenced(hold, reason)
        if self._clock() >= self._renewed_at + self.lease_s / 2:  # its renewal is late (a pause)
            self.renew()

    def _fenced(self, hold: tuple[str, int, str], reason: str) -> CheckpointFenced:
        return CheckpointFenced(f"the checkpoint {self.root}: this run ({hold[2]}, lease epoch {hold[1]}) may not "
                                f"write to it any more: {reason}")

    def lease(self) -> cl.CheckpointLease | None:
        """The checkpoint's lease as it stands (None: none)."""
        return self._current()[0]

    def _lease_path(self, epoch: int) -> str:
        return os.path.join(self.lease_dir, str(epoch))

    def _lease(self, epoch: int) -> cl.CheckpointLease | None:
        lease = cl.parse_lease(read_file(self._lease_path(epoch)))
        return lease if lease is not None and lease.epoch == epoch else None

    def _current(self) -> tuple[cl.CheckpointLease | None, int]:
        """The lease of the highest epoch (None if it cannot be read: a stranger's file is no
        lease, and the next run's epoch is above it), and that epoch (0: none)."""
        for _ in range(3):  # a new epoch's old leases can go between the listing and the read
            epoch = cl.newest(self._ids(self.lease_dir))
            if epoch is None:
                return None, 0
            data = read_file(self._lease_path(epoch))
            if data is not None:
                lease = cl.parse_lease(data)
                return (lease if lease is not None and lease.epoch == epoch else None), epoch
        return None, epoch

    def _create_lease(self, lease: cl.CheckpointLease) -> bool:
        """Begin `lease.epoch`, unless another run created it first (False)."""
        if not create_once(self._lease_path(lease.epoch), cl.lease_bytes(lease)):
            return False
        for epoch in self._ids(self.lease_dir):
            if epoch < lease.epoch - _OLD_EPOCHS_KEPT:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._lease_path(epoch))
        return True

    def _resume(self) -> Resumption:
        path = os.path.join(self.root, METADATA)
        data = read_file(path)
        if data is None:
            self.check()
            query_id = str(uuid.uuid4())
            if not create_once(path, metadata_bytes(query_id)):  # another run's, just written
                query_id = parse_metadata(read_file(path) or b"", path)
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

    def _write_once(self, path: str, data: Callable[[int], bytes]) -> None:
        """Create an entry (`data(lease epoch)`) unless it exists: the same entry again is fine
        (a write tried again); another is an error."""
        self.check()
        assert self._hold is not None
        content = data(self._hold[1])
        if create_once(path, content):
            return
        existing = read_file(path)
        if existing is not None and _without_epoch(existing) == _without_epoch(content):
            return
        raise CheckpointError(f"{path} exists with other content: a batch's entry is written once")

    def write_offsets(self, entry: OffsetEntry) -> None:
        """The write-ahead log entry of a batch, before the batch runs."""
        self._write_once(os.path.join(self.offsets_dir, str(entry.batch_id)),
                         lambda epoch: offset_entry_bytes(entry, epoch))

    def write_commit(self, entry: CommitEntry) -> None:
        if not os.path.exists(os.path.join(self.offsets_dir, str(entry.batch_id))):
            raise CheckpointError(f"batch {entry.batch_id} has no offset log entry: it cannot be committed")
        self._write_once(os.path.join(self.commits_dir, str(entry.batch_id)),
                         lambda epoch: commit_entry_bytes(entry, epoch))

    # -------------------------------------------------------------- per-source logs

    def _source_log(self, source: str) -> str:
        ids.require_path_id(source, "source name")
        return os.path.join(self.root, SOURCES_DIR, source, "seen")

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
        self.check()
        if not names:
            return
        path = self._source_log(source)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomically(path, json.dumps(self.seen_files(source) + list(names)).encode())

    def purge(self, retain: int = DEFAULT_MIN_BATCHES_TO_RETAIN) -> int:
        """Delete the entries older than the last `retain` committed batches; how many went."""
        self.check()
        commits = self.commit_ids()
        if not commits:
            return 0
        offsets, old_commits = to_purge(self.offset_ids(), commits, commits[-1], retain)
        for directory, batch_ids in ((self.commits_dir, old_commits), (self.offsets_dir, offsets)):
            for b in batch_ids:  # killed half-way, older entries stay behind: recovery reads past them
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, str(b)))
        return len(offsets) + len(old_commits)

    def _require_held(self) -> tuple[str, int, str]:
        if self._hold is None:
            raise CheckpointError(f"the checkpoint {self.root} is not held by this run (open() it first)")
        return self._hold


def _process_gone(holder: str) -> bool:
    """Whether a lease's holder (`host:pid:start/token`) is a process of this host that is gone."""
    return holder_gone(holder.partition("/")[0])


def _without_epoch(data: bytes) -> bytes:
    """An entry as compared when written again: the lease epoch it was written under aside (a
    run whose earlier write of it failed after the link, tried again)."""
    text = data.decode("utf-8", errors="replace")
    header, _, body = text.partition("\n")
    try:
        raw = json.loads(body)
    except ValueError:
        return data
    if isinstance(raw, dict):
        raw.pop("leaseEpoch", None)
    return f"{header}\n{json.dumps(raw, sort_keys=True)}".encode()
