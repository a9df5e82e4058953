"""The JobMaster's shell around a streaming query's micro-batch coordinator: it carries out what
`funke.common.streaming.microbatch.MicroBatchCoordinator` decides — asks the sources, writes the checkpoint's
logs, has the batches run and committed, keeps the timer — and feeds back what happened.

Owns one run of one query: its coordinator, its hold on the checkpoint (`CheckpointStore`), the
sources' JobManager sides (`funke.jobmanager.streaming.base.SourceSide`, built from the registry
by the query: what the sources offer, decided on the JobManager as Spark's driver does), and the
tasks it started for pending I/O.

Everything runs on the event loop that owns the JobMaster (one owner of the state); blocking
file I/O goes to an executor. Running and committing a batch is the `BatchRunner`'s (the
JobMaster's tasks on the TaskManagers). A failure of any step fails the run (`failure`): the
JobMaster then fails the job, its restart strategy restarts it, and the next run recovers from
the checkpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, Awaitable, Callable, Protocol

from funke.common.scheduling.batchflow import InputRead, SinkStarted, SinkWritten, Step
from funke.common.streaming import microbatch as mb
from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.jobmanager.checkpointstore import DEFAULT_MIN_BATCHES_TO_RETAIN, CheckpointStore
from funke.jobmanager.streaming.base import SourceSide

log = logging.getLogger("funke.jobmanager")


Output = Callable[[Step], None]  # what the batch's flow reports: SinkStarted, SinkWritten, InputRead


class BatchRunner(Protocol):
    """Runs and commits batches on the job's tasks."""

    async def run(self, entry: OffsetEntry, output: Output) -> None:
        """Run batch `entry.batch_id` over its ranges; call `output` with the flow's
        `SinkStarted`/`SinkWritten` as each sink begins and ends writing it, and `InputRead` once
        a source's subtasks read it (rows: what they counted, None if they did not); return once
        every sink wrote it."""

    async def commit(self, batch_id: int) -> None:
        """Commit the batch's output on every sink (idempotent)."""

    async def settle(self) -> None:
        """Wait for blocking work still under way (a commit whose caller was cancelled)."""


Publisher = Callable[[mb.Publish], None]


class StreamDriver:
    def __init__(self, name: str, trigger: mb.Trigger, checkpoint: CheckpointStore,
                 planners: dict[str, SourceSide], sinks: list[str], runner: BatchRunner, *,
                 publish: Publisher = lambda event: None, concurrent_jobs: int = 1,
                 retain: int = DEFAULT_MIN_BATCHES_TO_RETAIN, run_id: str = "",
                 clock: Callable[[], float] = time.time,
                 io: concurrent.futures.Executor | None = None):
        self.name, self.trigger, self.checkpoint = name, trigger, checkpoint
        self.planners, self.sinks, self.runner = planners, sinks, runner
        self.publish, self.concurrent_jobs, self.retain = publish, concurrent_jobs, retain
        self.run_id = run_id
        self.clock = clock
        self._io = io
        self.coordinator: mb.MicroBatchCoordinator | None = None
        self.done: asyncio.Future[str] | None = None  # the reason it ended, or the failure
        self._pending: set[asyncio.Task] = set()
        # Blocking work under way in threads: a cancelled step's thread runs on, and `close`
        # waits for it, so that nothing of this run writes after the checkpoint is let go.
        self._in_threads: set[asyncio.Future] = set()
        self._timer: asyncio.TimerHandle | None = None

    def _now(self) -> int:
        return int(self.clock() * 1000)

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        future = asyncio.get_running_loop().run_in_executor(self._io, fn, *args)
        self._in_threads.add(future)
        future.add_done_callback(self._in_threads.discard)
        return await future

    # -------------------------------------------------------------- control

    async def start(self, holder: str) -> None:
        """Take the checkpoint, recover where it says, start the query."""
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        resumption = await self._blocking(self.checkpoint.open, holder)
        self.coordinator = mb.MicroBatchCoordinator(
            resumption.query_id, self.run_id or holder, self.trigger, list(self.planners), self.sinks,
            next_batch_id=resumption.plan.next_batch_id, logged=resumption.logged,
            last_ends=resumption.last_ends, concurrent_jobs=self.concurrent_jobs, name=self.name)
        log.info("streaming query %s (id %s, run %s): starting at batch %d%s", self.name, resumption.query_id,
                 self.coordinator.run_id, resumption.plan.next_batch_id,
                 f", running batch(es) {list(resumption.plan.rerun)} again" if resumption.plan.rerun else "")
        self._handle(mb.Started(self._now()))

    def stop(self, drain: bool = False) -> None:
        self._handle(mb.StopRequested(drain, self._now()))

    async def close(self) -> None:
        """Abandon the run (cancel, failure, JobManager stop): pending I/O is cancelled, the
        checkpoint let go; what was logged and not committed runs again in the next run."""
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await asyncio.gather(*self._in_threads, return_exceptions=True)
        await self.runner.settle()
        await self._blocking(self.checkpoint.close)
        if self.done is not None and not self.done.done():
            self.done.set_result("closed")

    # -------------------------------------------------------------- the coordinator's actions

    def _handle(self, event: mb.Event) -> None:
        if self.coordinator is None or (self.done is not None and self.done.done()):
            return
        try:
            actions = self.coordinator.handle(event)
        except Exception as exc:  # a wrong answer or a bug: this run cannot go on
            self._fail(exc)
            return
        for action in actions:
            self._carry_out(action)

    def _spawn(self, what: str, work: Awaitable[mb.Event | None]) -> None:
        async def step() -> None:
            try:
                event = await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail(exc, what)
                return
            if event is not None:
                self._handle(event)

        task = asyncio.get_running_loop().create_task(step(), name=f"stream-{what}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _carry_out(self, action: mb.Action) -> None:
        match action:
            case mb.QueryOffsets():
                self._spawn(f"offsets-{action.batch_id}", self._query(action))
            case mb.CaptureTargets(starts=starts):
                self._spawn("targets", self._targets(starts))
            case mb.WriteOffsetLog(entry=entry):
                self._spawn(f"wal-{entry.batch_id}", self._log(entry))
            case mb.RunBatch(entry=entry):
                self._spawn(f"run-{entry.batch_id}", self._run(entry))
            case mb.CommitSinks(batch_id=b):
                self._spawn(f"commit-{b}", self._commit(b))
            case mb.WriteCommitLog(entry=entry):
                self._spawn(f"commit-log-{entry.batch_id}", self._record(entry))
            case mb.SetTimer(at_ms=at):
                if self._timer is not None:
                    self._timer.cancel()
                loop = asyncio.get_running_loop()
                delay = max(0.0, at / 1000 - self.clock())
                self._timer = loop.call_later(delay, lambda: self._handle(mb.Tick(max(self._now(), at))))
            case mb.Publish():
                self.publish(action)
            case mb.Terminate(reason=reason):
                if self._timer is not None:
                    self._timer.cancel()
                log.info("streaming query %s ended: %s", self.name, reason)
                assert self.done is not None
                if not self.done.done():
                    self.done.set_result(reason)

    async def _query(self, action: mb.QueryOffsets) -> mb.Event:
        def plan() -> dict[str, SourceRange]:
            now = self._now()
            return {name: p.plan(action.starts.get(name), now, action.limited, (action.caps or {}).get(name))
                    for name, p in self.planners.items()}

        ranges = await self._blocking(plan)
        return mb.OffsetsAnswered(action.batch_id, ranges, self._now())

    async def _targets(self, starts: dict[str, Any]) -> mb.Event:
        def latest() -> dict[str, Any]:
            now = self._now()
            return {name: p.latest(starts.get(name), now) for name, p in self.planners.items()}

        return mb.TargetsCaptured(await self._blocking(latest), self._now())

    async def _log(self, entry: OffsetEntry) -> mb.Event:
        await self._blocking(self.checkpoint.write_offsets, entry)
        return mb.OffsetsLogged(entry.batch_id, self._now())

    async def _run(self, entry: OffsetEntry) -> None:
        def output(step: Step) -> None:
            now = self._now()
            match step:
                case SinkStarted(sink=sink):
                    self._handle(mb.OutputStarted(entry.batch_id, sink, now))
                case SinkWritten(sink=sink):
                    self._handle(mb.OutputCompleted(entry.batch_id, sink, now))
                case InputRead(source=source, rows=rows) if rows is not None:
                    self._handle(mb.InputCounted(entry.batch_id, source, rows, now))

        await self.runner.run(entry, output)
        return None

    async def _commit(self, batch_id: int) -> mb.Event:
        await self.runner.commit(batch_id)
        return mb.SinksCommitted(batch_id, self._now())

    async def _record(self, entry: Any) -> mb.Event:
        await self._blocking(self.checkpoint.write_commit, entry)
        purged = await self._blocking(self._purge)
        if purged:
            log.debug("streaming query %s: purged %d old log entries and blocks", self.name, purged)
        return mb.CommitLogged(entry.batch_id, self._now())

    def _purge(self) -> int:
        """Old log entries, and the received blocks no retained batch reads (blocking)."""
        purged = self.checkpoint.purge(self.retain)
        forgetting = [p for p in self.planners.values() if type(p).forget_before is not SourceSide.forget_before]
        oldest = self.checkpoint.offset_ids() if forgetting else []
        if oldest:
            entry = self.checkpoint.read_offsets(oldest[0])
            for name, planner in self.planners.items():
                if name in entry.sources:
                    purged += planner.forget_before(entry.sources[name].start)
        return purged

    def _fail(self, exc: BaseException, what: str = "") -> None:
        log.error("streaming query %s failed%s: %s: %s", self.name, f" ({what})" if what else "",
                  type(exc).__name__, exc)
        if self._timer is not None:
            self._timer.cancel()
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
