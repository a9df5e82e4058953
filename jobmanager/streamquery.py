"""The JobMaster's side of a streaming query: the asyncio shell of one run's sans-IO core
(`funke.common.scheduling.queryrun.QueryRun`). It carries out what the core decides — asks the
sources, writes the checkpoint's logs, resolves a batch's input, sends batches, rate limits and
the end to the TaskManagers, commits the sinks, keeps the timer — and feeds back what happened,
each event naming its stimulus; it starts a run when every task of the job is RUNNING and closes
it when any leaves RUNNING (any failure restarts every task) or the job ends.

Owns, for one job: the current run (its core, its hold on the checkpoint, the sources' JobManager
sides, the I/O under way), the progress records of every run (the last 100), what the query
carries from run to run (rate estimates and limits), and the stop asked for. The next run
recovers from the checkpoint; a run that fails (a batch refused, a commit or log write failing)
fails the job globally, and its restart strategy decides. Blocking work goes to executor
threads, and closing a run waits for it: nothing of a run writes after its checkpoint is let go.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo, TaskIo
from funke.common.graph.streamingjob import (
    QuerySettings,
    checkpoint_location,
    event_time_settings,
    query_settings,
    sinks,
    stream_sources,
)
from funke.common.scheduling import queryrun as qr
from funke.common.states import JobStatus
from funke.common.streaming import microbatch as mb
from funke.common.streaming import progress
from funke.common.streaming.checkpoint import CommitEntry, OffsetEntry
from funke.common.streaming.sources import SOURCE_PLUGINS
from funke.common.wire import codec
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streaming.sides import SinkSides, SourceSides
from funke.jobmanager.streaming.state import describe_operators
from funke.jobmanager.streaming.submit import submit_problems  # noqa: F401 (the Dispatcher calls it from here)

if TYPE_CHECKING:
    from funke.jobmanager.resourcemanager import ResourceManager

log = logging.getLogger("funke.jobmanager")

PROGRESS_KEPT = mb.PROGRESS_KEPT


class BatchNotRun(Exception):
    """A task did not take a batch, or the batch cannot be handed out."""


class _RunIO:
    """One run: its core, its hold on the checkpoint, the sources' sides, the I/O under way."""

    def __init__(self, core: qr.QueryRun, checkpoint: CheckpointStore):
        self.core, self.checkpoint = core, checkpoint
        self.sources = SourceSides({})
        self.tasks: set[asyncio.Task] = set()
        # Blocking work under way in threads: a cancelled step's thread runs on, and closing
        # the run waits for it.
        self.threads: set[asyncio.Future] = set()
        self.timer: asyncio.TimerHandle | None = None


class StreamingQuery:
    def __init__(self, graph: ExecutionGraph, *, data_dir: str, resource_manager: "ResourceManager",
                 holder: str, all_running: Callable[[], bool], on_failure: Callable[[FailureInfo], None],
                 on_event: Callable[[mb.Publish], None], on_stop_timeout: Callable[[str, bool], None],
                 on_ended: Callable[[str, bool], None] = lambda reason, tasks_kept: None,
                 clock: Callable[[], float] = time.time, leader_epoch: int = 0, lease_scope: str = ""):
        self.graph = graph
        self.job_id = graph.job_id
        self.data_dir = data_dir
        self.rm = resource_manager
        self.holder = holder
        # Under high availability: the leader's epoch and cluster, with which a run takes the
        # checkpoint's lease (a newer leader takes it over from a deposed one at once).
        self.leader_epoch, self.lease_scope = leader_epoch, lease_scope
        self._all_running = all_running  # every current execution of the job is RUNNING
        self._clock = clock
        self.settings: QuerySettings = query_settings(graph.job_graph)
        self.event_time = event_time_settings(graph.job_graph)
        self.checkpoint_location = checkpoint_location(graph.job_graph, data_dir)
        self.sinks = [v.id for v in sinks(graph.job_graph)]
        self._sink_sides = SinkSides(graph.job_graph, data_dir, graph.job_id)
        self.sources = [v.id for v in stream_sources(graph.job_graph)]
        self._on_failure, self._on_event, self._on_stop_timeout = on_failure, on_event, on_stop_timeout
        # The query ended (every batch it ran committed): (why, whether its tasks were kept
        # running: a live rescale's stop, after which the JobMaster suspends the job).
        self._on_ended = on_ended
        self.progress: deque[dict[str, Any]] = deque(maxlen=PROGRESS_KEPT)
        self.query_id = ""
        self.runs = 0
        self._run: _RunIO | None = None
        self._closing: asyncio.Task | None = None
        self.ended = ""  # why the query ended (a stop, the trigger), once its tasks are told to finish
        self._stop: tuple[bool, float, bool] | None = None  # (drain, timeout s, keep the tasks) asked for
        self._stop_timer: asyncio.TimerHandle | None = None
        # Receiver sources (their receivers each), and what the query carries from run to run:
        # backpressure's estimators and rate limits (streaming.backpressure.enabled), and what
        # each receiver read of batches not recorded yet
        self._receivers = {v.id: v.parallelism for v in stream_sources(graph.job_graph)
                           if SOURCE_PLUGINS[v.operators[0].kind].receiver}
        self._carried = qr.Carried()

    @property
    def running(self) -> bool:
        return self._run is not None

    @property
    def latest_progress(self) -> dict[str, Any] | None:
        return self.progress[-1] if self.progress else None

    @property
    def rate_limits(self) -> dict[str, float]:
        """Per receiver source, the rate each of its receivers may take (records/s)."""
        return self._carried.rate_limits

    @property
    def received(self) -> dict[tuple[int, str], tuple[int | None, ...]]:
        """(batch, receiver source) -> the lines each receiver's blocks held, until its record."""
        return self._carried.received

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # ------------------------------------------------------------------ the job's decisions

    def after_decision(self, status: JobStatus) -> None:
        """Called after every decision of the job: start a run when all tasks are RUNNING, end
        the run when they no longer all are."""
        if self._run is not None:
            # A new attempt of any task means one left RUNNING first: the run ended there.
            if status is not JobStatus.RUNNING or not self._all_running():
                self._close_run("the job's tasks are no longer all RUNNING")
            return
        if status is JobStatus.RUNNING and not self.ended and self._all_running():
            self._start_run()

    def on_batch_report(self, attempt: ExecutionAttemptId, batch_id: int, schemas: dict[str, str],
                        input_rows: int | None = None, io: TaskIo | None = None) -> None:
        if self._run is not None:
            self._handle(self._run, qr.BatchWritten(
                attempt, batch_id, schemas, input_rows, self._now(), f"report-{attempt}-{batch_id}",
                io.state if io is not None else None, dict(io.event_time) if io is not None else {},
                io.late_rows if io is not None else 0, io.seconds if io is not None else None))

    @property
    def stopping(self) -> bool:
        """A stop was asked for."""
        return self._stop is not None

    def stop(self, drain: bool, timeout_s: float, keep_tasks: bool = False) -> str:
        """A graceful stop: no new batch; the batches in flight finish and commit (with `drain`,
        the logged ones too, then everything the sources hold now), then the tasks end
        FINISHED (with `keep_tasks`, a live rescale's stop, they go on: the JobMaster suspends
        the job). After `timeout_s` the JobMaster is told (`on_stop_timeout`). Returns what
        will happen, batch by batch."""
        if self.ended:
            return f"the query is already ending ({self.ended})"
        if self._stop is not None:
            return "a stop is already under way"
        self._stop = (drain, timeout_s, keep_tasks)
        self._stop_timer = asyncio.get_running_loop().call_later(timeout_s, self._stop_timed_out)
        deadline = f"; if it has not ended within {timeout_s:g} s, the job is cancelled (CANCELED)"
        run = self._run
        outlook = run.core.stop_outlook(drain) if run is not None else None
        if run is not None and outlook is not None:
            self._handle(run, qr.StopRequested(drain, self._now(), "stop-drain" if drain else "stop", keep_tasks))
            return f"stopping: {outlook.describe()}{deadline}"
        # No run now (starting or recovering): the next one stops at once, as its start says.
        outlook_text = qr.stop_before_run(drain, self.settings.concurrent_jobs)
        return f"stopping once the query's tasks run again: {outlook_text}{deadline}"

    def _stop_timed_out(self) -> None:
        self._stop_timer = None
        if self.ended and self.ended != "stopped":
            return
        drain, timeout, keep_tasks = self._stop or (False, 0.0, False)
        self._on_stop_timeout(f"the graceful stop did not finish within {timeout:g} s", keep_tasks)

    async def close(self) -> None:
        """The job ended (or this JobManager stopped it): abandon the run."""
        if self._stop_timer is not None:
            self._stop_timer.cancel()
            self._stop_timer = None
        self._close_run("the job ended")
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)

    # ------------------------------------------------------------------ runs

    def _start_run(self) -> None:
        self.runs += 1
        core = qr.QueryRun(self.graph, self.settings.trigger, self.sources, self.sinks, receivers=self._receivers,
                           backpressure=self.settings.backpressure, concurrent_jobs=self.settings.concurrent_jobs,
                           run_id=str(uuid.uuid4()), name=self.graph.job_graph.name, carried=self._carried,
                           watermark_delays=self.event_time.delays, watermark_policy=self.event_time.policy,
                           no_data_batches=self.event_time.stateful, retain=self.settings.min_batches_to_retain)
        run = _RunIO(core, CheckpointStore(self.checkpoint_location))
        self._run = run
        self._spawn(run, "start", self._begin(run, self._closing))

    async def _begin(self, run: _RunIO, previous: asyncio.Task | None) -> None:
        """Build the sources' sides, prepare the sinks, take the checkpoint, start the core."""
        if previous is not None:  # the last run lets go of the checkpoint first
            await asyncio.gather(previous, return_exceptions=True)
        run.sources = await self._blocking(run, SourceSides.open, self.graph.job_graph, self.checkpoint_location,
                                           run.checkpoint)
        resumption = await self._blocking(run, lambda: run.checkpoint.open(
            self.holder, leader_epoch=self.leader_epoch, scope=self.lease_scope))
        self._spawn(run, "lease", self._keep_lease(run))
        # Once the run holds the checkpoint: a sink may fence the query's earlier runs (a Kafka
        # sink's init_transactions), which a run that is not the query's must not do.
        await self._blocking(run, self._sink_sides.prepare, resumption.query_id)
        # what the keyed operators are, beside their state: read from the checkpoint alone later
        await self._blocking(run, describe_operators, self.checkpoint_location, self.graph.job_graph)
        self.query_id = resumption.query_id
        plan = resumption.plan
        log.info("streaming query %s (id %s, run %s): starting at batch %d%s", self.graph.job_graph.name,
                 resumption.query_id, run.core.run_id, plan.next_batch_id,
                 f", running batch(es) {list(plan.rerun)} again" if plan.rerun else "")
        self._handle(run, qr.RunStarted(resumption.query_id, plan.next_batch_id, tuple(resumption.logged),
                                        dict(resumption.last_ends), self._now(), f"run-started-{self.runs}",
                                        resumption.last, resumption.last_commit))
        if self._stop is not None:  # asked while no run was there
            self._handle(run, qr.StopRequested(self._stop[0], self._now(), "stop-asked-before-the-run",
                                               self._stop[2]))

    async def _keep_lease(self, run: _RunIO) -> None:
        """Renew the run's lease on the checkpoint, three times per lease: a run that finds it
        taken over (it was paused, and another run of the query goes on) fails."""
        while True:
            await asyncio.sleep(run.checkpoint.lease_s / 3)
            await self._blocking(run, run.checkpoint.renew)

    def _close_run(self, why: str) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        log.info("job %s: streaming query run %d closed: %s", self.job_id, self.runs, why)
        self._closing = asyncio.get_running_loop().create_task(self._let_go(run))

    async def _let_go(self, run: _RunIO) -> None:
        """Abandon a run: pending I/O is cancelled and waited for, the checkpoint let go; what
        was logged and not committed runs again in the next run."""
        if run.timer is not None:
            run.timer.cancel()
        for task in list(run.tasks):
            task.cancel()
        await asyncio.gather(*run.tasks, return_exceptions=True)
        await asyncio.gather(*run.threads, return_exceptions=True)
        await self._blocking(run, self._sink_sides.close)  # ends what a sink has open (a transaction)
        await self._blocking(run, run.checkpoint.close)
        await self._blocking(run, run.sources.close)

    def _fail(self, run: _RunIO, exc: BaseException, what: str = "") -> None:
        if self._run is not run:
            return
        log.error("streaming query %s failed%s: %s: %s", self.graph.job_graph.name, f" ({what})" if what else "",
                  type(exc).__name__, exc)
        self._run = None
        self._closing = asyncio.get_running_loop().create_task(self._let_go(run))
        self._on_failure(FailureInfo(type(exc).__name__, f"the streaming query failed: {exc}",
                                     "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))

    # ------------------------------------------------------------------ the core's actions

    def _handle(self, run: _RunIO, event: qr.Event) -> None:
        if self._run is not run:
            return  # a run closed meanwhile: what it still hears changes nothing
        try:
            actions = run.core.handle(event)
        except Exception as exc:  # a wrong answer or a bug: this run cannot go on
            self._fail(run, exc)
            return
        for action in actions:
            if self._run is not run:
                return
            log.debug("job %s: %s (stimulus %s)", self.job_id, type(action).__name__, action.stimulus_id)
            self._carry_out(run, action)

    def _spawn(self, run: _RunIO, what: str, work: Awaitable[qr.Event | None]) -> None:
        async def step() -> None:
            try:
                event = await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail(run, exc, what)
                return
            if event is not None:
                self._handle(run, event)

        task = asyncio.get_running_loop().create_task(step(), name=f"stream-{self.job_id}-{what}")
        run.tasks.add(task)
        task.add_done_callback(run.tasks.discard)

    async def _blocking(self, run: _RunIO, fn: Callable[..., Any], *args: Any) -> Any:
        future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        run.threads.add(future)
        future.add_done_callback(run.threads.discard)
        return await future

    def _carry_out(self, run: _RunIO, action: qr.Action) -> None:
        match action:
            case qr.QueryOffsets(batch_id=b):
                self._spawn(run, f"offsets-{b}", self._query(run, action))
            case qr.CaptureTargets():
                self._spawn(run, "targets", self._targets(run, action))
            case qr.WriteOffsetLog(entry=entry):
                self._spawn(run, f"wal-{entry.batch_id}", self._log(run, entry))
            case qr.ResolveBatchInput(entry=entry):
                self._spawn(run, f"run-{entry.batch_id}", self._resolve(run, entry))
            case qr.RunTasks():
                self._run_tasks(run, action)
            case qr.CommitSinks(batch_id=b):
                self._spawn(run, f"commit-{b}", self._commit(run, action))
            case qr.WriteCommitLog(entry=entry):
                self._spawn(run, f"commit-log-{entry.batch_id}", self._record(run, entry))
            case qr.SetTimer(at_ms=at):
                if run.timer is not None:
                    run.timer.cancel()
                delay = max(0.0, at / 1000 - self._clock())
                run.timer = asyncio.get_running_loop().call_later(delay, self._tick, run, at)
            case qr.Publish():
                if action.kind == "QueryProgress":
                    progress.add_source_details(action.info, run.sources.progress_details())  # a broker's lag
                    self.progress.append(action.info)
                self._on_event(action)
            case qr.SendRateLimits(task_manager_id=tm):
                gateway = self.rm.gateway(tm)
                if gateway is not None:
                    gateway.set_rate_limits(self.job_id, [(codec.attempt_to_proto(a), r) for a, r in action.rates])
            case qr.SendFinish(task_manager_id=tm):
                gateway = self.rm.gateway(tm)
                if gateway is not None:
                    gateway.finish_tasks(self.job_id, [codec.attempt_to_proto(a) for a in action.attempts])
            case qr.Terminate(reason=reason):
                # every batch it ran is committed; the tasks were told to finish, and the job ends with them
                self.ended = reason
                self._run = None
                self._closing = asyncio.get_running_loop().create_task(self._let_go(run))
                kept = self._stop is not None and self._stop[2]
                log.info("job %s: streaming query ended (%s); %s", self.job_id, reason,
                         "its tasks kept for a rescale" if kept else "finishing its tasks")
                self._on_ended(reason, kept)

    def _tick(self, run: _RunIO, at: int) -> None:
        now = max(self._now(), at)
        self._handle(run, qr.Tick(now, f"tick-{now}"))

    def _run_tasks(self, run: _RunIO, action: qr.RunTasks) -> None:
        batch_id = action.batch.batch_id
        gateway = self.rm.gateway(action.task_manager_id)
        if gateway is None:
            self._refused(run, batch_id, f"TaskManager {action.task_manager_id} is gone")
            return
        tasks = [(t.attempt, [(g.input_index, g.attempts, g.schema) for g in t.gates]) for t in action.tasks]
        request = codec.run_batch_to_proto(self.job_id, "", action.batch, tasks, action.released)
        gateway.run_batch(request, lambda job, attempt, why: self._refused(
            run, batch_id, f"task {codec.attempt_from_proto(attempt)} did not take batch {batch_id}: {why}"))

    def _refused(self, run: _RunIO, batch_id: int, why: str) -> None:
        if batch_id in run.core.in_flight:  # a batch through already needs nothing more of it
            self._fail(run, BatchNotRun(why), f"run-{batch_id}")

    async def _query(self, run: _RunIO, action: qr.QueryOffsets) -> qr.Event:
        ranges = await self._blocking(run, lambda: run.sources.plan(action.starts, self._now(), action.limited,
                                                                    action.caps))
        return qr.OffsetsAnswered(action.batch_id, ranges, self._now(), f"offsets-answered-{action.batch_id}")

    async def _targets(self, run: _RunIO, action: qr.CaptureTargets) -> qr.Event:
        latest = await self._blocking(run, lambda: run.sources.latest(action.starts, self._now()))
        return qr.TargetsCaptured(latest, self._now(), "targets-captured")

    async def _log(self, run: _RunIO, entry: OffsetEntry) -> qr.Event:
        await self._blocking(run, run.checkpoint.write_offsets, entry)
        return qr.OffsetsLogged(entry.batch_id, self._now(), f"offsets-logged-{entry.batch_id}")

    async def _resolve(self, run: _RunIO, entry: OffsetEntry) -> qr.Event:
        resolved = await self._blocking(run, run.sources.batch_files, entry)
        return qr.BatchInputResolved(entry.batch_id, resolved, self._now(), f"input-resolved-{entry.batch_id}")

    async def _commit(self, run: _RunIO, action: qr.CommitSinks) -> qr.Event:
        await self._blocking(run, self._sink_sides.commit, action.batch_id, action.attempts, self.query_id,
                             run.checkpoint.check)
        return qr.SinksCommitted(action.batch_id, self._now(), f"sinks-committed-{action.batch_id}")

    async def _record(self, run: _RunIO, entry: CommitEntry) -> qr.Event:
        await self._blocking(run, run.checkpoint.write_commit, entry)
        purged = await self._blocking(run, run.sources.purge, run.checkpoint, self.settings.min_batches_to_retain)
        if purged:
            log.debug("streaming query %s: purged %d old log entries and blocks", self.graph.job_graph.name, purged)
        return qr.CommitLogged(entry.batch_id, self._now(), f"commit-logged-{entry.batch_id}")
