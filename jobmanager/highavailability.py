"""The JobManager's part in high availability: contending for leadership, and what a leader
writes to the HA stores.

Owns three things:

- **The election loop** (`LeaderElection`): rounds of the HA services' `contend` on a thread of
  their own, as often as `Contender.next_check` says (and at once after a gap in the loop: a
  JobManager that was paused learns who leads now before anything else); a watchdog on the event
  loop that stops acting as leader the moment our lease runs out, even if the store cannot be
  reached to learn who leads instead. Granted and revoked leadership are handed to the
  JobManager one at a time, in order, so that taking over never overlaps stepping down. Before
  acting on its own view of time (TaskManagers silent past the heartbeat timeout), a leader
  confirms with the store that it still leads (`confirm`).
- **`HaContext`**: what a leading Dispatcher writes through. Every write carries the leader's
  identity and epoch (the services refuse it, `Fenced`, once that epoch is over) and goes through
  one writer thread, so the writes of a job land in the order they were asked for.
- **The job's story across leaders**: how status transitions and run starts are recorded in the
  store and read back into an `Incarnation` for the next run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from funke.common import layout
from funke.common.backoff import Backoff
from funke.common.graph.executiongraph import Incarnation, LeaderTransition, OperatorIo, SlotId, TaskIo
from funke.common.graph.jobgraph import JobGraph
from funke.common.scheduling.scheduler import FinishedSubtask
from funke.common.leadership import Contender, Granted, Lease, Revoked
from funke.common.states import JOB_STATUS_TRANSITIONS, ExecutionState, JobStatus, Transition
from funke.runtime.hafilesystem import Fenced, process_identity
from funke.runtime.haservices import HaServices
from funke.jobmanager.committer import exists, sink_targets

log = logging.getLogger("funke.jobmanager")

# A recovered run starts its attempts this far above the previous run's (see Incarnation).
ATTEMPT_STRIDE = 1000
_WATCHDOG_S = 0.1
# A watchdog tick this much later than due: the process was paused (or starved); look again at
# who leads at once rather than at the next round.
_GAP_S = 1.0
# A write that must not be lost, while the store cannot be reached: tried again from 0.1 s to 2 s apart.
STORE_WRITE_BACKOFF = Backoff(0.1, 2.0)


async def _still_leading() -> bool:
    return True


def job_manager_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class HaContext:
    """A leading Dispatcher's handle on the HA services: its epoch, and ordered, fenced writes."""

    services: HaServices
    holder: str
    epoch: int
    job_manager: str
    writer: concurrent.futures.Executor
    leads: Callable[[], bool] = lambda: True
    leader_address: Callable[[], str] = lambda: ""
    lease: Callable[[], Lease | None] = lambda: None
    # Whether this epoch still leads, asked of the HA services now (a round of the election).
    confirm: Callable[[], Awaitable[bool]] = _still_leading

    async def write(self, method: Callable[..., Any], *args: Any) -> Any:
        """`method(holder, epoch, *args)` on the writer thread (raises `Fenced` once deposed)."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, method, self.holder, self.epoch, *args)

    async def write_until_done(self, method: Callable[..., Any], *args: Any) -> Any:
        """`write`, tried again while the store cannot be reached and this JobManager still
        leads: for the steps that must not be lost (a job's result), as Flink retries its job
        result store. Raises `Fenced` once deposed."""
        delays = STORE_WRITE_BACKOFF.delays()
        while True:
            try:
                return await self.write(method, *args)
            except Fenced:
                raise
            except OSError as exc:
                if not self.leads():
                    raise Fenced(f"epoch {self.epoch} lost leadership while the store was unreachable") from exc
                delay = next(delays)
                log.warning("high availability: %s failed (%s); trying again in %.1f s",
                            getattr(method, "__name__", "a write"), exc, delay)
                await asyncio.sleep(delay)

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    async def flush(self) -> None:
        """Wait until every write asked for so far is done."""
        await self.read(lambda: None)


# ------------------------------------------------------------------------------ the job's story


def transition_record(h: LeaderTransition) -> dict:
    t = h.transition
    return {"from": t.from_state.value, "to": t.to_state.value, "at": t.timestamp, "cause": t.cause,
            "stimulus": t.stimulus_id, "epoch": h.leader_epoch, "job_manager": h.job_manager}


def run_record(epoch: int, job_manager: str, attempt_base: int, now: float) -> dict:
    return {"run_started": epoch, "job_manager": job_manager, "attempt_base": attempt_base, "at": now}


@dataclass
class StoredStory:
    """A job's records as read from the store."""

    transitions: list[LeaderTransition] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # run_record()s: one per recovery
    created_at: float | None = None


def read_story(records: list[dict]) -> StoredStory:
    story = StoredStory()
    for r in records:
        try:
            if "run_started" in r:
                story.runs.append({"run_started": int(r["run_started"]), "job_manager": str(r["job_manager"]),
                                   "attempt_base": int(r["attempt_base"]), "at": float(r["at"])})
                continue
            t = Transition(JobStatus(r["from"]), JobStatus(r["to"]), float(r["at"]), str(r.get("cause", "")),
                           str(r.get("stimulus", "")))
            story.transitions.append(LeaderTransition(t, int(r.get("epoch", 0)), str(r.get("job_manager", ""))))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring an unreadable job history record: %.200r", r)
    return story


def next_incarnation(story: StoredStory, epoch: int, job_manager: str, now: float,
                     created_at: float | None) -> tuple[Incarnation, dict]:
    """The next run of a job whose story is `story`, under leader `epoch`; and the run record to
    store before it starts. A run the store last saw active ended when its leader did: its job
    moved to SUSPENDED on that leader, which the story says now (a killed leader could not)."""
    earlier = list(story.transitions)
    if earlier:
        last = earlier[-1]
        if JobStatus.SUSPENDED in JOB_STATUS_TRANSITIONS[last.transition.to_state]:  # it had not ended
            gone = Transition(last.transition.to_state, JobStatus.SUSPENDED, now,
                              f"its JobManager {last.job_manager or '?'} (epoch {last.leader_epoch}) lost "
                              f"leadership; recovered by {job_manager} (epoch {epoch})", "ha:recovery")
            earlier.append(LeaderTransition(gone, last.leader_epoch, last.job_manager))
    base = ATTEMPT_STRIDE * (len(story.runs) + 1)
    first_created = created_at if created_at is not None else (
        earlier[0].transition.timestamp if earlier else None)
    return (Incarnation(epoch, job_manager, tuple(earlier), base, first_created),
            run_record(epoch, job_manager, base, now))


def progress_record(f: FinishedSubtask) -> dict:
    record = {"vertex": f.vertex_id, "subtask": f.subtask_index, "attempt": f.attempt_number,
              "partitions": [list(p) for p in f.schemas]}
    if f.history:  # where and when it ran: a new leader shows the attempt as it was
        record["created"] = f.created_at
        record["history"] = [[t.to_state.value, t.timestamp, t.cause[:CAUSE_LIMIT]] for t in f.history]
        if f.slot is not None:
            record["slot"] = [f.slot.task_manager_id, f.slot.slot_index]
        if f.io is not None:
            record["io"] = [f.io.records_in, f.io.records_out, f.io.bytes_in, f.io.bytes_out, f.io.seconds]
            if f.io.operators:  # per operator [in, out], null where not measured
                record["io"].append([[o.records_in, o.records_out] for o in f.io.operators])
    return record


CAUSE_LIMIT = 500  # characters of a transition's cause kept in a progress record


def read_progress(records: list[dict]) -> list[FinishedSubtask]:
    found = []
    for r in records:
        try:
            schemas = tuple((str(d), int(i), str(schema)) for d, i, schema in r["partitions"])
            history, previous = [], ExecutionState.CREATED
            for to, at, cause in r.get("history", ()):
                history.append(Transition(previous, ExecutionState(to), float(at), str(cause)))
                previous = history[-1].to_state
            slot = r.get("slot")
            io = r.get("io")
            found.append(FinishedSubtask(
                str(r["vertex"]), int(r["subtask"]), int(r["attempt"]), schemas,
                SlotId(str(slot[0]), int(slot[1])) if slot else None,
                float(r["created"]) if history else None, tuple(history),
                _task_io(io) if io else None))
        except (KeyError, TypeError, ValueError, IndexError):
            log.warning("ignoring an unreadable progress record: %.200r", r)
    return found


def _task_io(io: list) -> TaskIo:
    """A progress record's `io` (a record written before per-operator counts: five numbers)."""
    operators = tuple(OperatorIo(None if i is None else int(i), None if o is None else int(o))
                      for i, o in (io[5] if len(io) > 5 else ()))
    return TaskIo(int(io[0]), int(io[1]), int(io[2]), int(io[3]), float(io[4]), operators=operators)


def outputs_still_there(data_dir: str, job: JobGraph, finished: list[FinishedSubtask]) -> list[FinishedSubtask]:
    """Of the subtasks an earlier leader saw finish, those whose output is still there: every
    result partition they wrote, and for a file sink its staged output (blocking I/O)."""
    vertices = {v.id: v for v in job.vertices}
    kept = []
    for f in finished:
        vertex = vertices.get(f.vertex_id)
        if vertex is None or not 0 <= f.subtask_index < vertex.parallelism:
            continue
        paths = [layout.partition_dir(data_dir, job.job_id, d, i, f.attempt_number) for d, i, _ in f.schemas]
        for target in sink_targets(data_dir, job.job_id, JobGraph(job.name, (vertex,))):
            paths.append(layout.sink_staging_dir(target, job.job_id, f.subtask_index, f.attempt_number))
        try:
            if all(exists(p) for p in paths):
                kept.append(f)
        except (OSError, ValueError):
            continue
    return kept


# ------------------------------------------------------------------------------ the election


Handler = Callable[[int], Awaitable[None]]


class LeaderElection:
    """This JobManager's contention for leadership. `on_granted(epoch)` and
    `on_revoked(epoch, reason)` run on the event loop, one at a time."""

    def __init__(self, services: HaServices, address: str,
                 on_granted: Handler, on_revoked: Callable[[int, str], Awaitable[None]]):
        self.services = services
        self.contender = Contender(process_identity(), address, services.lease_duration_s)
        self.job_manager = job_manager_name()
        self.lease: Lease | None = None  # as last read
        self.leading_epoch: int | None = None  # the epoch this JobManager acts under
        self._on_granted = on_granted
        self._on_revoked = on_revoked
        self._election_io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="funke-ha-election")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="funke-ha-writer")
        self._changes: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self._wake = asyncio.Event()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.services.on_change(lambda: loop.call_soon_threadsafe(self._wake.set))
        self._tasks = [asyncio.create_task(self._elect(), name="ha-election"),
                       asyncio.create_task(self._watchdog(), name="ha-watchdog"),
                       asyncio.create_task(self._act(), name="ha-leadership")]

    def leads(self) -> bool:
        return self.leading_epoch is not None and time.time() < self.contender.valid_until

    def leader_address(self) -> str:
        lease = self.lease
        return lease.address if lease is not None and lease.valid(time.time()) else ""

    def context(self, epoch: int) -> HaContext:
        return HaContext(self.services, self.contender.holder, epoch, self.job_manager, self.writer,
                         leads=self.leads, leader_address=self.leader_address, lease=lambda: self.lease,
                         confirm=lambda: self.confirm(epoch))

    def describe_leader(self, lease: Lease | None = None) -> str:
        """Who leads, as last seen (or as `lease` says): for a standby's refusals."""
        lease = self.lease if lease is None else lease
        if lease is None or not lease.valid(time.time()):
            return "no leader is elected right now; try again in a moment"
        return f"the leader is {lease.address} (epoch {lease.epoch})"

    async def look_up_leader(self) -> str:
        """`describe_leader`, read from the HA services now if what this JobManager last saw
        names no live leader (it was paused, or its round is late)."""
        lease = self.lease
        if lease is not None and lease.valid(time.time()):
            return self.describe_leader(lease)
        try:  # not on the election's thread: a round may be waiting for the store there
            current = await asyncio.get_running_loop().run_in_executor(None, self.services.leader)
        except OSError:
            current = None
        return self.describe_leader(current) if current is not None else self.describe_leader()

    async def confirm(self, epoch: int) -> bool:
        """Whether this JobManager still leads with `epoch`, as the HA services say now: a round
        of the election, run before a leader acts on what only its own clock tells it (a
        JobManager that was paused finds every TaskManager silent, yet may have been replaced
        meanwhile). False if it does not, or the services cannot be reached to say."""
        if self.leading_epoch != epoch or not self.leads():
            return False
        try:
            await self._round()
        except OSError as exc:
            log.warning("high availability: cannot confirm the leadership of epoch %d (%s)", epoch, exc)
            return False
        return self.contender.epoch == epoch and self.contender.leads(time.time())

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._election_io, fn, *args)

    async def _round(self) -> tuple[Lease | None, list]:
        """One round of the election; what changed goes to the JobManager in order."""
        lease, changes = await self._io(self.services.contend, self.contender)
        self.lease = lease
        for change in changes:
            self._changes.put_nowait(change)
        return lease, changes

    async def _elect(self) -> None:
        ready = False
        while not self._stopped:
            try:
                if not ready:
                    await self._io(self.services.create_dirs)
                    ready = True
                lease, changes = await self._round()
            except OSError as exc:
                log.warning("high availability: cannot reach the HA services (%s); trying again", exc)
                await asyncio.sleep(self.contender.duration_s / 3)
                continue
            if self.contender.epoch is not None and self.leading_epoch is None and not any(
                    isinstance(c, Granted) for c in changes):
                # The watchdog stepped down while a renewal was under way: give the lease up
                # rather than hold it without leading.
                await self._io(self.services.release, self.contender)
            now = time.time()
            self._wake.clear()
            # The next round is due then, or sooner if the services say the leader went.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.02, self.contender.next_check(now, lease) - now))

    async def _watchdog(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            due = loop.time() + _WATCHDOG_S
            await asyncio.sleep(_WATCHDOG_S)
            if loop.time() - due > _GAP_S:  # we were paused: who leads now?
                self._wake.set()
            epoch = self.leading_epoch
            if epoch is not None and time.time() >= self.contender.valid_until:
                self._changes.put_nowait(Revoked(epoch, "the lease ran out before it could be renewed"))

    async def _act(self) -> None:
        while True:
            change = await self._changes.get()
            try:
                if isinstance(change, Granted):
                    if self.leading_epoch is not None:
                        await self._step_down(self.leading_epoch, "a newer epoch was granted")
                    self.leading_epoch = change.epoch
                    log.info("high availability: this JobManager (%s) leads, epoch %d", self.job_manager,
                             change.epoch)
                    await self._on_granted(change.epoch)
                elif change.epoch == self.leading_epoch:
                    await self._step_down(change.epoch, change.reason)
            except Exception:
                log.exception("high availability: handling %s failed", change)

    async def _step_down(self, epoch: int, reason: str) -> None:
        self.leading_epoch = None
        log.warning("high availability: this JobManager lost leadership (epoch %d): %s", epoch, reason)
        await self._on_revoked(epoch, reason)

    async def stop(self, release: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop contending. `release` runs first while still leading (suspend the jobs, record
        it); then the lease is released so a standby takes over at once."""
        self._stopped = True
        for task in self._tasks:
            if task.get_name() != "ha-leadership":
                task.cancel()
        await asyncio.gather(*self._tasks[:2], return_exceptions=True)
        if release is not None and self.leading_epoch is not None:
            await release()
        self._tasks[2].cancel()
        await asyncio.gather(self._tasks[2], return_exceptions=True)
        try:
            await self._io(self.services.release, self.contender)
        except OSError as exc:
            log.warning("high availability: could not release the lease: %s", exc)
        self.writer.shutdown(wait=True)
        await self._io(self.services.close)
        self._election_io.shutdown(wait=False)
