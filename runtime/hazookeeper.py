"""High availability on ZooKeeper: the latch that elects the leader, leader retrieval, the job
graph store and the job result store (`high-availability: zookeeper`), for JobManagers on
several hosts.

Owns the nodes under `<high-availability.zookeeper.path.root>/<high-availability.cluster-id>`:

    latch/n-<sequence>      one ephemeral sequential node per contending JobManager (its holder
                            identity and address); the oldest leads
    leader                  ephemeral, the leader's lease record: holder, epoch, address, since
                            (leader retrieval for TaskManagers and clients)
    epoch                   the last epoch granted (the fencing token's counter)
    jobgraphs/<job id>      a submitted JobGraph until the job is globally terminal
    histories/<job id>      the job's status transitions across leaders
    progress/<job id>       the job's finished subtasks as last recorded
    job-results/<job id>    the final status of a terminal job, `clean` once its clean-up is done
    archive/<job id>        what `funke list/status` show of a terminal job

and, under `<high-availability.storageDir>/<cluster-id>/blobs/<job id>/`, the records too large for
a node (ZooKeeper's limit is 1 MB): the node then holds a pointer (file name, size, SHA-256) to
a file written beside the others, as Flink keeps its JobGraphs.

Election: a contender whose latch node is the oldest takes the leader node with the next epoch
in one transaction (its latch node still there, the epoch counter unchanged since read), and
leads as long as its session lives. It acts for at most `lease_duration_s` (two thirds of the
session timeout) past the last round that saw its session alive, so a leader cut off from
ZooKeeper stops before the server expires its session and lets a standby in. A latch node whose
holder is a process of this host known to be dead is deleted at once instead of lingering for a
session timeout (the rule the file backend applies to its lease).

Fencing: every write of a leader is one transaction that also checks its latch node, so once
its session ended (or it stepped down) nothing it still sends changes the store (`Fenced`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any, Callable, Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, KazooException, NodeExistsError, NoNodeError,
                              NotEmptyError, RolledBackError, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from funke.common import ids
from funke.common.configuration import DEFAULT_ZOOKEEPER_SESSION_S
from funke.common.leadership import Change, Contender, Lease
from funke.runtime.hafilesystem import (MAX_RECORD_BYTES, Fenced, JobResult, holder_gone, job_result_from_json,
                                       json_records, read_file, write_atomically)

log = logging.getLogger("funke.ha")
# kazoo's reconnect warnings go where the process sends its logs, never to a CLI user's terminal
# through logging's last-resort handler.
logging.getLogger("kazoo").addHandler(logging.NullHandler())

INLINE_LIMIT = 256 * 1024  # larger records go to a file under storageDir
_INLINE, _POINTER = b"I", b"P"
_LATCH_PREFIX = "n-"
_CONNECT_TIMEOUT_S = 10.0
_GRAPHS, _HISTORIES, _PROGRESS, _RESULTS, _ARCHIVE = "jobgraphs", "histories", "progress", "job-results", "archive"


class HaUnavailable(OSError):
    """ZooKeeper cannot be reached, or did not answer in time."""


def lease_duration(session_timeout_s: float) -> float:
    """How long a leader acts past the last round that saw its session alive: well inside the
    session timeout, after which the server lets a standby in."""
    return session_timeout_s * 2 / 3


class ZooKeeperHaServices:
    """The HA services of one cluster on a ZooKeeper quorum, for one process (a contender, a
    TaskManager or a client: the latter two only read the leader node). Thread-safe: the
    election and the writes run on threads of their own."""

    def __init__(self, quorum: str, storage_dir: str, cluster_id: str = "default", root: str = "/funke",
                 session_timeout_s: float = DEFAULT_ZOOKEEPER_SESSION_S):
        ids.require_path_id(cluster_id, "high-availability.cluster-id")
        self.quorum = quorum
        self.base = f"{root.rstrip('/')}/{cluster_id}"
        self.blob_root = os.path.join(os.path.abspath(storage_dir), cluster_id, "blobs")
        self.session_timeout_s = session_timeout_s
        self.lease_duration_s = lease_duration(session_timeout_s)
        self._op_timeout_s = max(0.5, self.lease_duration_s / 3)
        self._zk = KazooClient(hosts=quorum, timeout=session_timeout_s,
                               connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0))
        self._connect_lock = threading.Lock()
        self._started = False
        self._latch: str | None = None  # our latch node, in session `_latch_session`
        self._latch_session: int | None = None
        self._lead: tuple[Contender, int, str] | None = None  # (contender, epoch, its latch node)
        self._wake: Callable[[], None] | None = None

    # ------------------------------------------------------------------ connection

    def _path(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    @contextlib.contextmanager
    def _unavailable(self) -> Iterator[None]:
        """ZooKeeper's connection errors as HaUnavailable (an OSError, as a file backend's)."""
        try:
            yield
        except (KazooTimeoutError, KazooException) as exc:
            if isinstance(exc, (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError)):
                raise
            raise HaUnavailable(f"ZooKeeper at {self.quorum}: {type(exc).__name__} {exc}".rstrip()) from exc

    def _connect(self) -> None:
        with self._connect_lock:
            if not self._started:
                self._zk.start(timeout=min(_CONNECT_TIMEOUT_S, self.session_timeout_s * 2))
                self._started = True
                negotiated = self._zk._session_timeout / 1000 if self._zk._session_timeout else self.session_timeout_s
                if negotiated < self.session_timeout_s:
                    log.warning("ZooKeeper granted a session timeout of %.1f s instead of %.1f s",
                                negotiated, self.session_timeout_s)
                    self.session_timeout_s = negotiated
                    self.lease_duration_s = lease_duration(negotiated)

    def _wait(self, result: Any) -> Any:
        return result.get(timeout=self._op_timeout_s)

    def _get(self, path: str, watch: Callable[..., None] | None = None) -> tuple[bytes, Any] | None:
        try:
            return self._wait(self._zk.get_async(path, watch=watch))
        except NoNodeError:
            return None

    def _children(self, path: str) -> list[str]:
        try:
            return self._wait(self._zk.get_children_async(path))
        except NoNodeError:
            return []

    def _session(self) -> int:
        return self._zk.client_id[0] if self._zk.client_id else 0

    def create_dirs(self) -> None:
        with self._unavailable():
            self._connect()
            for part in ("latch", _GRAPHS, _HISTORIES, _PROGRESS, _RESULTS, _ARCHIVE):
                self._wait(self._zk.ensure_path_async(self._path(part)))
            with contextlib.suppress(NodeExistsError):
                self._wait(self._zk.create_async(self._path("epoch"), b"0"))
        os.makedirs(self.blob_root, mode=0o700, exist_ok=True)

    def on_change(self, callback: Callable[[], None]) -> None:
        """`callback()` (on a ZooKeeper thread) whenever the contender ahead of ours goes: the
        moment to run the next election round instead of waiting for it."""
        self._wake = callback

    def _fire(self, _event: Any = None) -> None:
        wake = self._wake
        if wake is not None:
            wake()

    def close(self) -> None:
        with self._connect_lock:
            if self._started:
                with contextlib.suppress(Exception):
                    self._zk.stop()
                self._started = False
            with contextlib.suppress(Exception):
                self._zk.close()

    # ------------------------------------------------------------------ leader election

    def _lease(self, data: bytes, now: float) -> Lease | None:
        """The leader node's record as a lease seen alive at `now` (the node lives as long as
        its holder's session)."""
        try:
            raw = json.loads(data)
            return Lease(holder=str(raw["holder"]), epoch=int(raw["epoch"]), address=str(raw["address"]),
                         renewed_at=now, duration_s=self.lease_duration_s, since=float(raw.get("since", 0.0)))
        except (ValueError, KeyError, TypeError):
            return None

    def leader(self) -> Lease | None:
        """Leader retrieval: the leader node as a lease valid for a while from now, or None (no
        leader elected, or ZooKeeper unreachable)."""
        try:
            with self._unavailable():
                self._connect()
                found = self._get(self._path("leader"))
        except HaUnavailable as exc:
            log.debug("no leader known: %s", exc)
            return None
        return self._lease(found[0], time.time()) if found is not None else None

    def contend(self, contender: Contender, now: float | None = None) -> tuple[Lease | None, list[Change]]:
        """One election round for `contender`: returns the leader's lease as it stands after the
        round and what changed for the contender (granted, revoked)."""
        t = time.time() if now is None else now
        with self._unavailable():
            self._connect()
            contender.duration_s = min(contender.duration_s, self.lease_duration_s)
            session = self._session()
            mine = self._join(contender, session)
            children = sorted((c for c in self._children(self._path("latch")) if c.startswith(_LATCH_PREFIX)),
                              key=lambda c: c[len(_LATCH_PREFIX):])
            if mine not in children:  # deleted under us: join again next round
                self._latch = None
                ahead = children
            else:
                ahead = children[:children.index(mine)]
            ahead = [c for c in ahead if not self._remove_if_dead(c, contender.holder)]
            found = self._get(self._path("leader"))
            current = self._lease(found[0], t) if found is not None else None
            if contender.epoch is not None:
                lead = self._lead
                ours = (current is not None and lead is not None and current.holder == contender.holder
                        and current.epoch == contender.epoch == lead[1] and lead[2] == self._latch
                        and found is not None and found[1].ephemeralOwner == session)
                if ours:
                    changes = contender.renew(t)
                    if changes:  # renewed too late: no longer ours to write with
                        self._lead = None
                    return current, changes
                self._lead = None
                who = "nobody" if current is None else f"epoch {current.epoch}"
                return current, contender.lose(f"the leader node is held by {who} now (or our session ended)")
            if ahead or self._latch is None:
                if ahead:  # wake up when the contender just ahead goes
                    self._wait(self._zk.exists_async(self._path("latch", ahead[-1]), watch=self._fire))
                return current, []
            return self._take(contender, t, found, current)

    def contenders(self) -> list[tuple[str, str]]:
        """Every JobManager taking part in the election now (its latch node lives): (holder,
        address), oldest (the leader, once elected) first."""
        found = []
        with self._unavailable():
            self._connect()
            children = sorted((c for c in self._children(self._path("latch")) if c.startswith(_LATCH_PREFIX)),
                              key=lambda c: c[len(_LATCH_PREFIX):])
            for name in children:
                node = self._get(self._path("latch", name))
                try:
                    raw = json.loads(node[0]) if node is not None else None
                    if raw is not None:
                        found.append((str(raw["holder"]), str(raw["address"])))
                except (ValueError, KeyError, TypeError):
                    continue  # a stranger's node
        return found

    def _join(self, contender: Contender, session: int) -> str:
        """Our latch node in this session (created if missing); its name."""
        if self._latch is not None and self._latch_session == session:
            if self._wait(self._zk.exists_async(self._latch)) is not None:
                return self._latch.rpartition("/")[2]
        data = json.dumps({"holder": contender.holder, "address": contender.address}).encode()
        self._latch = self._wait(self._zk.create_async(self._path("latch", _LATCH_PREFIX), data,
                                                       ephemeral=True, sequence=True))
        self._latch_session = session
        return self._latch.rpartition("/")[2]

    def _remove_if_dead(self, name: str, holder: str) -> bool:
        """Delete a latch node ahead of ours whose holder is a dead process of this host (or a
        stray of our own session); whether it is gone."""
        path = self._path("latch", name)
        found = self._get(path)
        if found is None:
            return True
        try:
            theirs = str(json.loads(found[0])["holder"])
        except (ValueError, KeyError, TypeError):
            return False  # a stranger's node: not ours to judge
        if theirs == holder:
            # Ours from an earlier round whose create timed out on our side but was made: a
            # stray of this session that would keep us behind ourselves forever.
            if found[1].ephemeralOwner != self._session():
                return False
            log.info("high availability: removing a stray latch node of this JobManager (%s)", name)
        elif not holder_gone(theirs):
            return False
        else:
            log.info("high availability: removing the latch node of %s, a process that is gone", theirs)
        with contextlib.suppress(NoNodeError, BadVersionError):
            self._wait(self._zk.delete_async(path, version=found[1].version))
        return True

    def _take(self, contender: Contender, t: float, found: tuple[bytes, Any] | None,
              current: Lease | None) -> tuple[Lease | None, list[Change]]:
        """We are the oldest contender: the leader node and the next epoch are ours, in one
        transaction that holds only while our latch node and the epoch counter are as read."""
        assert self._latch is not None
        counter = self._get(self._path("epoch"))
        try:
            last = int(counter[0]) if counter is not None else 0
        except ValueError:
            last = 0
        lease, changes = contender.grant(last, t)
        record = {"holder": lease.holder, "epoch": lease.epoch, "address": lease.address, "since": lease.since}
        tx = self._zk.transaction()
        tx.check(self._latch, 0)
        if counter is None:
            tx.create(self._path("epoch"), str(lease.epoch).encode())
        else:
            tx.set_data(self._path("epoch"), str(lease.epoch).encode(), version=counter[1].version)
        if found is not None:  # a dead leader's node that outlived its latch node
            tx.delete(self._path("leader"), version=found[1].version)
        tx.create(self._path("leader"), json.dumps(record).encode(), ephemeral=True)
        failure = _failure(self._wait(tx.commit_async()))
        if failure is not None:
            contender.lose("lost the race for the leader node")
            log.info("high availability: taking the leader node failed (%s); trying again", failure)
            return current, []
        self._lead = (contender, lease.epoch, self._latch)
        return lease, changes

    def release(self, contender: Contender, now: float | None = None) -> list[Change]:
        """Step down (graceful stop) or stop contending: the leader node (if ours) and our latch
        node go at once, so the next contender takes over without waiting for a timeout."""
        changes = contender.lose("the JobManager stepped down")
        lead, self._lead = self._lead, None
        latch, self._latch = self._latch, None
        if not self._started:
            return changes
        with self._unavailable():
            if lead is not None:
                found = self._get(self._path("leader"))
                if found is not None and found[1].ephemeralOwner == self._session():
                    with contextlib.suppress(NoNodeError, BadVersionError):
                        self._wait(self._zk.delete_async(self._path("leader"), version=found[1].version))
            if latch is not None:
                with contextlib.suppress(NoNodeError):
                    self._wait(self._zk.delete_async(latch))
        return changes

    # ------------------------------------------------------------------ fenced writes

    def _fenced(self, holder: str, epoch: int, ops: Callable[[Any], None]) -> None:
        """`ops(transaction)` committed together with a check that our latch node is still
        there, by a leader that still leads with `epoch`; Fenced otherwise."""
        with self._unavailable(), self._as_leader(holder, epoch) as latch:
            tx = self._zk.transaction()
            tx.check(latch, 0)
            ops(tx)
            results = self._wait(tx.commit_async())
        failure = _failure(results)
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise Fenced(f"the latch node of epoch {epoch} is gone: it does not lead any more")
        if failure is not None:
            raise failure

    def _job_node(self, parent: str, job_id: str) -> str:
        ids.require_path_id(job_id, "job id", ids.MAX_JOB_ID_LENGTH)
        return self._path(parent, job_id)

    @contextlib.contextmanager
    def _as_leader(self, holder: str, epoch: int) -> Iterator[str]:
        """A write's reads and its transaction, by `holder` leading with `epoch` (yields its
        latch node): a session that ended under them ends that leadership (Fenced), not just
        this call."""
        lead = self._lead
        if lead is None or lead[0].holder != holder or lead[1] != epoch or not lead[0].leads(time.time()):
            raise Fenced(f"epoch {epoch} does not lead any more")
        try:
            yield lead[2]
        except SessionExpiredError as exc:
            raise Fenced(f"the ZooKeeper session of epoch {epoch} expired: it does not lead any more") from exc

    def _put(self, holder: str, epoch: int, parent: str, job_id: str, data: bytes) -> None:
        path = self._job_node(parent, job_id)
        payload, blob = self._encode(job_id, parent, epoch, data)
        try:
            with self._unavailable(), self._as_leader(holder, epoch):
                old = self._get(path)

            def ops(tx: Any) -> None:
                if old is None:
                    tx.create(path, payload)
                else:
                    tx.set_data(path, payload, version=old[1].version)

            self._fenced(holder, epoch, ops)
        except BaseException:
            if blob is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(blob)
            raise
        if old is not None:
            self._drop_blob(job_id, old[0])

    def _value(self, path: str) -> bytes | None:
        with self._unavailable():
            self._connect()
            found = self._get(path)
        return self._decode(path, found[0]) if found is not None else None

    def _remove(self, holder: str, epoch: int, paths: list[str], job_id: str, kinds: tuple[str, ...]) -> None:
        with self._unavailable(), self._as_leader(holder, epoch):
            present = [p for p in paths if self._wait(self._zk.exists_async(p)) is not None]
        if present:
            self._fenced(holder, epoch, lambda tx: [tx.delete(p) for p in present])
        self._drop_blobs(job_id, kinds)

    # ------------------------------------------------------------------ large records as files

    def _encode(self, job_id: str, kind: str, epoch: int, data: bytes) -> tuple[bytes, str | None]:
        if len(data) <= INLINE_LIMIT:
            return _INLINE + data, None
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"a record of {len(data)} bytes is larger than {MAX_RECORD_BYTES}")
        directory = os.path.join(self.blob_root, job_id)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        name = f"{kind}.{epoch}.{uuid.uuid4().hex[:12]}"
        path = os.path.join(directory, name)
        write_atomically(path, data)
        pointer = {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return _POINTER + json.dumps(pointer).encode(), path

    def _decode(self, path: str, payload: bytes) -> bytes | None:
        if payload[:1] == _INLINE:
            return payload[1:]
        if payload[:1] != _POINTER:
            log.warning("ignoring the unreadable record %s", path)
            return None
        try:
            pointer = json.loads(payload[1:])
            name, digest = str(pointer["file"]), str(pointer["sha256"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring the unreadable pointer record %s", path)
            return None
        job_id = path.rpartition("/")[2]
        if not ids.is_path_id(name):
            log.warning("ignoring the pointer record %s: %s is not a file name", path, ids.echo(name))
            return None
        data = read_file(os.path.join(self.blob_root, job_id, name))
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            log.warning("the file %s that %s points to is missing or changed", name, path)
            return None
        return data

    def _drop_blob(self, job_id: str, old_payload: bytes) -> None:
        if old_payload[:1] != _POINTER:
            return
        try:
            name = str(json.loads(old_payload[1:])["file"])
        except (ValueError, KeyError, TypeError):
            return
        if ids.is_path_id(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.blob_root, job_id, name))

    def _drop_blobs(self, job_id: str, kinds: tuple[str, ...]) -> None:
        directory = os.path.join(self.blob_root, job_id)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.partition(".")[0] in kinds:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only once empty

    # ------------------------------------------------------------------ job graph store

    def put_job_graph(self, holder: str, epoch: int, job_id: str, job_graph: bytes) -> None:
        self._put(holder, epoch, _GRAPHS, job_id, job_graph)

    def put_history(self, holder: str, epoch: int, job_id: str, history: list[dict]) -> None:
        self._put(holder, epoch, _HISTORIES, job_id, json.dumps(history).encode())

    def put_progress(self, holder: str, epoch: int, job_id: str, progress: list[dict]) -> None:
        self._put(holder, epoch, _PROGRESS, job_id, json.dumps(progress).encode())

    def _job_ids(self, parent: str) -> list[str]:
        """The job ids with a node under `parent` (a stranger's node name is left out)."""
        with self._unavailable():
            self._connect()
            names = self._children(self._path(parent))
        return sorted(n for n in names if ids.is_path_id(n, ids.MAX_JOB_ID_LENGTH))

    def _records(self, parent: str) -> dict[str, bytes]:
        """Every job's readable record under `parent`."""
        found = {job_id: self._value(self._path(parent, job_id)) for job_id in self._job_ids(parent)}
        return {job_id: data for job_id, data in found.items() if data is not None}

    def job_graph_ids(self) -> list[str]:
        return self._job_ids(_GRAPHS)

    def job_graph(self, job_id: str) -> bytes | None:
        return self._value(self._job_node(_GRAPHS, job_id))

    def history(self, job_id: str) -> list[dict]:
        return json_records(self._value(self._job_node(_HISTORIES, job_id)))

    def progress(self, job_id: str) -> list[dict]:
        return json_records(self._value(self._job_node(_PROGRESS, job_id)))

    def remove_job_graph(self, holder: str, epoch: int, job_id: str) -> None:
        paths = [self._job_node(parent, job_id) for parent in (_GRAPHS, _HISTORIES, _PROGRESS)]
        self._remove(holder, epoch, paths, job_id, (_GRAPHS, _HISTORIES, _PROGRESS))

    # ------------------------------------------------------------------ job result store

    def put_dirty_result(self, holder: str, epoch: int, result: JobResult) -> None:
        self._put(holder, epoch, _RESULTS, result.job_id, json.dumps(asdict(result)).encode())

    def mark_result_clean(self, holder: str, epoch: int, job_id: str) -> None:
        result = job_result_from_json(job_id, self._value(self._job_node(_RESULTS, job_id)))
        if result is not None and not result.clean:
            cleaned = JobResult(result.job_id, result.status, result.ended_at, result.epoch, clean=True)
            self._put(holder, epoch, _RESULTS, job_id, json.dumps(asdict(cleaned)).encode())

    def results(self) -> dict[str, JobResult]:
        found = {job_id: job_result_from_json(job_id, data) for job_id, data in self._records(_RESULTS).items()}
        return {job_id: result for job_id, result in found.items() if result is not None}

    # ------------------------------------------------------------------ archive of terminal jobs

    def put_archive(self, holder: str, epoch: int, job_id: str, data: bytes) -> None:
        self._put(holder, epoch, _ARCHIVE, job_id, data)

    def archives(self) -> dict[str, bytes]:
        return self._records(_ARCHIVE)

    def remove_archive(self, holder: str, epoch: int, job_id: str) -> None:
        self._remove(holder, epoch, [self._job_node(_ARCHIVE, job_id)], job_id, (_ARCHIVE,))


def _failure(results: list[Any]) -> Exception | None:
    """The error that rolled a transaction back (None: it committed)."""
    errors = [r for r in results if isinstance(r, Exception)]
    real = [e for e in errors if not isinstance(e, RolledBackError)]
    return (real or errors or [None])[0]
