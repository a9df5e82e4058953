"""The JobMaster's side of a streaming query: runs of its micro-batch driver on the job's
long-lived tasks, the batches' flow through them, the sinks' commits, a graceful stop, and the
progress a user watches.

Owns, for one job: the current run (a `StreamDriver` with its checkpoint, and the `BatchFlow` of
the RUNNING attempts it started with), the progress records of every run (the last 100), and the
stop asked for.

A run starts when every task of the job is RUNNING, and ends when any leaves RUNNING (the job
restarts every task of a streaming query on any failure), when the driver ends (a stop, or the
trigger's end), or when the job ends. The next run recovers from the checkpoint: a batch logged
and not committed runs again with exactly its logged ranges. A run that fails (a batch refused, a
commit or a log write failing) fails the job globally, and its restart strategy decides.

Runs on the JobMaster's event loop; blocking file work (the checkpoint, listing source
directories, sink commits) goes to executor threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from funke.common.wire import codec
from funke.common.streaming import microbatch as mb
from funke.common.scheduling.batchflow import BatchFlow, Dispatch, InputRead, Step
from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo
from funke.common.states import JobStatus
from funke.common.streaming.backpressure import RateEstimator
from funke.common.graph.streamingjob import QuerySettings, checkpoint_location, query_settings, sinks, stream_sources
from funke.common.streaming.sources import SOURCES, BatchInput, ReceiverSource
from funke.jobmanager import streaming
from funke.jobmanager.checkpointstore import CheckpointStore
from funke.jobmanager.streamdriver import Output, StreamDriver
from funke.jobmanager.streaming.base import SinkContext, SourceContext, SourceSide
from funke.jobmanager.streaming.submit import submit_problems  # noqa: F401 (the Dispatcher calls it from here)

if TYPE_CHECKING:
    from funke.jobmanager.resourcemanager import ResourceManager

log = logging.getLogger("funke.jobmanager")

PROGRESS_KEPT = mb.PROGRESS_KEPT


class BatchNotRun(Exception):
    """A task did not take a batch, or the batch cannot be handed out."""


class StreamingQuery:
    def __init__(self, graph: ExecutionGraph, *, data_dir: str, resource_manager: "ResourceManager",
                 holder: str, all_running: Callable[[], bool], on_failure: Callable[[FailureInfo], None],
                 on_event: Callable[[mb.Publish], None], on_stop_timeout: Callable[[str], None]):
        self.graph = graph
        self.job_id = graph.job_id
        self.data_dir = data_dir
        self.rm = resource_manager
        self.holder = holder
        self._all_running = all_running  # every current execution of the job is RUNNING
        self.settings: QuerySettings = query_settings(graph.job_graph)
        self.checkpoint_location = checkpoint_location(graph.job_graph, data_dir)
        self.sinks = [v.id for v in sinks(graph.job_graph)]
        self._sink_sides = {v.id: streaming.sink_side(v.operators[-1].kind, SinkContext(
            v.id, v.operators[-1].config, data_dir, graph.job_id)) for v in sinks(graph.job_graph)}
        self.sources = [v.id for v in stream_sources(graph.job_graph)]
        self._on_failure, self._on_event, self._on_stop_timeout = on_failure, on_event, on_stop_timeout
        self.progress: deque[dict[str, Any]] = deque(maxlen=PROGRESS_KEPT)
        self.query_id = ""
        self.runs = 0
        self._run: _Run | None = None
        self._closing: asyncio.Task | None = None
        self.ended = ""  # why the query ended (a stop, the trigger), once its tasks are told to finish
        self._stop: tuple[bool, float] | None = None  # (drain, timeout s) asked for
        self._stop_timer: asyncio.TimerHandle | None = None
        # Backpressure (streaming.backpressure.enabled): per receiver source, its estimator and the
        # rate each of its receivers may take, sent with every batch
        receivers = [v for v in stream_sources(graph.job_graph) if SOURCES[v.operators[0].kind].receiver]
        interval = getattr(self.settings.trigger, "interval_ms", 1000)
        self._estimators = {v.id: RateEstimator(interval) for v in receivers} if self.settings.backpressure else {}
        self._receivers = {v.id: v.parallelism for v in receivers}
        self.rate_limits: dict[str, float] = {}
        # (batch, receiver source) -> the lines each receiver's blocks held, until its progress record
        self.received: dict[tuple[int, str], tuple[int | None, ...]] = {}

    @property
    def running(self) -> bool:
        return self._run is not None

    @property
    def latest_progress(self) -> dict[str, Any] | None:
        return self.progress[-1] if self.progress else None

    # ------------------------------------------------------------------ the job's decisions

    def after_decision(self, status: JobStatus) -> None:
        """Called after every decision of the job: start a run when all tasks are RUNNING, end
        the run when they no longer all are."""
        run = self._run
        if run is not None:
            # A new attempt of any task means one left RUNNING first: the run ended there.
            if status is not JobStatus.RUNNING or not self._all_running():
                self._close_run("the job's tasks are no longer all RUNNING")
            return
        if status is JobStatus.RUNNING and not self.ended and self._all_running():
            self._start_run()

    def on_batch_report(self, attempt: ExecutionAttemptId, batch_id: int, schemas: dict[str, str],
                        input_rows: int | None = None) -> None:
        if self._run is not None:
            self._run.on_report(attempt, batch_id, schemas, input_rows)

    def stop(self, drain: bool, timeout_s: float) -> str:
        """A graceful stop: no new batch; the batches in flight finish and commit (with `drain`,
        the logged ones too, then everything the sources hold now), then the tasks end
        FINISHED. After `timeout_s` the job is cancelled. Returns what will happen, batch by
        batch."""
        if self.ended:
            return f"the query is already ending ({self.ended})"
        if self._stop is not None:
            return "a stop is already under way"
        self._stop = (drain, timeout_s)
        loop = asyncio.get_running_loop()
        self._stop_timer = loop.call_later(timeout_s, self._stop_timed_out)
        deadline = f"; if it has not ended within {timeout_s:g} s, the job is cancelled (CANCELED)"
        coordinator = self._run.driver.coordinator if self._run is not None else None
        if coordinator is not None and not coordinator.finished:
            outlook = coordinator.stop_outlook(drain)
            self._run.driver.stop(drain)  # type: ignore[union-attr]
            return f"stopping: {outlook.describe()}{deadline}"
        # No run now (starting or recovering): the next one stops at once, as its start says.
        if drain:
            return ("stopping once the query's tasks run again: the batches logged and not committed run and commit, "
                    f"then what the sources hold then; then the query ends FINISHED{deadline}")
        n = self.settings.concurrent_jobs
        first = "the first batch logged and not committed (if any) runs and commits" if n == 1 else (
            f"the first {n} batches logged and not committed (if any) run and commit")
        return (f"stopping once the query's tasks run again: {first}, later ones are not run (they stay in the "
                f"offset log for the query's next run); then the query ends FINISHED{deadline}")

    def _stop_timed_out(self) -> None:
        self._stop_timer = None
        if self.ended and self.ended != "stopped":
            return
        drain, timeout = self._stop or (False, 0.0)
        self._on_stop_timeout(f"the graceful stop did not finish within {timeout:g} s; cancelling the job")

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
        flow = BatchFlow(self.graph, self.sinks)
        self.runs += 1
        planners = self._planners
        run_id = str(uuid.uuid4())
        checkpoint = CheckpointStore(self.checkpoint_location)
        run = _Run(self, flow, checkpoint)
        driver = StreamDriver(self.graph.job_graph.name, self.settings.trigger, checkpoint, {}, self.sinks, run,
                              publish=self._publish, concurrent_jobs=self.settings.concurrent_jobs,
                              retain=self.settings.min_batches_to_retain, run_id=run_id)
        run.driver = driver
        self._run = run
        previous = self._closing

        async def begin() -> None:
            if previous is not None:  # the last run lets go of the checkpoint first
                await asyncio.gather(previous, return_exceptions=True)
            driver.planners = await asyncio.get_running_loop().run_in_executor(None, planners, checkpoint)
            await asyncio.get_running_loop().run_in_executor(None, self._make_collect_dirs)
            await driver.start(self.holder)
            assert driver.coordinator is not None
            self.query_id = driver.coordinator.query_id
            if self._stop is not None:
                driver.stop(self._stop[0])

        async def watch() -> None:
            try:
                await begin()
                assert driver.done is not None
                reason = await asyncio.shield(driver.done)
            except asyncio.CancelledError:
                return
            except Exception as exc:
                if self._run is run:
                    self._run = None
                    self._closing = asyncio.get_running_loop().create_task(driver.close())
                    log.warning("job %s: streaming query run failed: %s: %s", self.job_id, type(exc).__name__, exc)
                    self._on_failure(FailureInfo(type(exc).__name__, f"the streaming query failed: {exc}",
                                                 "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
                return
            if reason != "closed" and self._run is run:
                self._end(run, reason)

        run.watcher = asyncio.get_running_loop().create_task(watch(), name=f"stream-run-{self.job_id}")

    def _make_collect_dirs(self) -> None:
        """Every sink side prepares before the query's first batch (blocking)."""
        for side in self._sink_sides.values():
            side.prepare()

    def _planners(self, checkpoint: CheckpointStore) -> dict[str, SourceSide]:
        """Every source's JobManager side, from the registries (blocking: a side may connect)."""
        planners: dict[str, SourceSide] = {}
        for v in stream_sources(self.graph.job_graph):
            op = v.operators[0]
            planning = SOURCES[op.kind].planning(op.config, v.parallelism)
            planners[v.id] = streaming.SOURCES[op.kind](SourceContext(
                v.id, op.config, v.parallelism, planning, self.checkpoint_location, checkpoint))
        return planners

    def _end(self, run: "_Run", reason: str) -> None:
        """The driver ended (a stop, or the trigger's end): every batch it ran is committed; the
        tasks end FINISHED, and with them the job."""
        self.ended = reason
        self._run = None
        self._closing = asyncio.get_running_loop().create_task(run.driver.close())
        log.info("job %s: streaming query ended (%s); finishing its tasks", self.job_id, reason)
        by_tm: dict[str, list] = {}
        for a in run.flow.all_attempts():
            by_tm.setdefault(run.flow.task_managers[(a.vertex_id, a.subtask_index)], []).append(codec.attempt_to_proto(a))
        for tm, attempts in by_tm.items():
            gateway = self.rm.gateway(tm)
            if gateway is not None:
                gateway.finish_tasks(self.job_id, attempts)

    def _close_run(self, why: str) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        log.info("job %s: streaming query run %d closed: %s", self.job_id, self.runs, why)
        if run.watcher is not None:
            run.watcher.cancel()
        run.abandon()
        self._closing = asyncio.get_running_loop().create_task(run.driver.close())

    def _publish(self, event: mb.Publish) -> None:
        if event.kind == "QueryProgress":
            self._describe_sources(event.info)
            self.progress.append(event.info)
            self._estimate_rates(event.info)
        self._on_event(event)

    def _describe_sources(self, record: dict[str, Any]) -> None:
        """A receiver source's entry in a progress record: per receiver, the blocks the batch
        was allocated, the lines they held and their rate (lines a second since the previous
        trigger, as the source's inputRowsPerSecond), and the rate each may take (backpressure);
        a broker's: per key, the entries after the batch's end
        when it was planned (the lag, counted up to streaming.redis.RedisPlanner.LAG_COUNTED)."""
        planners = self._run.driver.planners if self._run is not None else {}
        for source in record.get("sources", ()):
            name = source.get("description")
            planner = planners.get(name)
            if planner is not None:
                planner.describe(source)
            if name not in self._receivers:
                continue
            blocks = ReceiverSource(self._receivers[name])
            span = SourceRange(source.get("startOffset"), source.get("endOffset"))
            lines = self.received.pop((int(record.get("batchId", -1)), name), ())
            rows, per_second = source.get("numInputRows") or 0, source.get("inputRowsPerSecond") or 0.0
            receivers = {}
            for r in range(self._receivers[name]):
                n = lines[r] if r < len(lines) else None
                receivers[str(r)] = {"blocks": len(blocks.blocks(span, r)), "records": n,
                                     # over the same time as the source's rate: since the last trigger
                                     "recordsPerSecond": round(n * per_second / rows, 3) if n and rows else 0.0}
            source["numBlocks"] = sum(r["blocks"] for r in receivers.values())
            source["receivers"] = receivers
            if name in self.rate_limits:
                source["rateLimitPerReceiver"] = round(self.rate_limits[name], 1)
        batch = int(record.get("batchId", -1))
        for key in [k for k in self.received if k[0] < batch - PROGRESS_KEPT]:  # batches that never got a record
            del self.received[key]

    def _estimate_rates(self, record: dict[str, Any]) -> None:
        for source in record.get("sources", ()):
            estimator = self._estimators.get(source.get("description"))
            if estimator is None:
                continue
            rate = estimator.update(int(record.get("batchTime", 0)), int(source.get("numInputRows", 0)),
                                    int(record.get("processingDelayMs", 0)), int(record.get("schedulingDelayMs", 0)))
            if rate is not None:
                name = source["description"]
                self.rate_limits[name] = rate / self._receivers[name]
                self._send_rate_limit(name)

    def _send_rate_limit(self, source: str) -> None:
        """A new backpressure rate goes to the source's receivers at once (as Spark's
        ReceiverTracker sends it), not with the next batch that runs: batches queued behind a
        slow one were planned already."""
        run = self._run
        if run is None:
            return
        by_tm: dict[str, list] = {}
        for subtask in range(self._receivers[source]):
            attempt = ExecutionAttemptId(source, subtask, run.flow.attempts[(source, subtask)])
            by_tm.setdefault(run.flow.task_managers[(source, subtask)], []).append(
                (codec.attempt_to_proto(attempt), self.rate_limits[source]))
        for tm, rates in by_tm.items():
            gateway = self.rm.gateway(tm)
            if gateway is not None:
                gateway.set_rate_limits(self.job_id, rates)


class _Run:
    """One run's BatchRunner: hands each batch to the tasks vertex by vertex and commits it."""

    def __init__(self, query: StreamingQuery, flow: BatchFlow, checkpoint: CheckpointStore):
        self.query, self.flow, self.checkpoint = query, flow, checkpoint
        self.driver: StreamDriver
        self.watcher: asyncio.Task | None = None
        self._batches: dict[int, tuple[asyncio.Future, Output]] = {}
        self._in_threads: set[asyncio.Future] = set()
        # Per TaskManager, the batches through since its last RunBatches: it deletes what its
        # tasks wrote for them when told with the next one (the job's end releases the rest).
        self._released: dict[str, set[int]] = {}

    def abandon(self) -> None:
        for future, _ in self._batches.values():
            if not future.done():
                future.cancel()
        self._batches.clear()

    async def run(self, entry: OffsetEntry, output: Output) -> None:
        batch = await asyncio.get_running_loop().run_in_executor(None, self._batch_input, entry)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batches[entry.batch_id] = (future, output)
        try:
            self._carry_out(entry.batch_id, self.flow.start(batch))
            await future
        finally:
            self._batches.pop(entry.batch_id, None)

    def _batch_input(self, entry: OffsetEntry) -> BatchInput:
        files: dict[str, tuple[str, ...]] = {}
        for name, planner in self.driver.planners.items():
            r = entry.sources.get(name)
            resolved = planner.batch_files(r) if r is not None else None
            if resolved is not None:
                files[name] = resolved
        return BatchInput(entry.batch_id, entry.batch_time_ms, dict(entry.sources), files)

    def on_report(self, attempt: ExecutionAttemptId, batch_id: int, schemas: dict[str, str],
                  input_rows: int | None = None) -> None:
        if batch_id in self._batches:
            self._carry_out(batch_id, self.flow.on_report(attempt, batch_id, schemas, input_rows))

    def _carry_out(self, batch_id: int, steps: list[Step]) -> None:
        future, output = self._batches[batch_id]
        for step in steps:
            if isinstance(step, Dispatch):
                gateway = self.query.rm.gateway(step.task_manager_id)
                if gateway is None:
                    self._refused(batch_id, f"TaskManager {step.task_manager_id} is gone")
                    return
                tasks = [(t.attempt, [(g.input_index, g.attempts, g.schema) for g in t.gates]) for t in step.tasks]
                released = self._released.pop(step.task_manager_id, ())
                request = codec.run_batch_to_proto(self.query.job_id, "", step.batch, tasks, released)
                for vertex, rate in self.query.rate_limits.items():  # as they are now, not when planned
                    request.rate_limits[vertex] = rate
                gateway.run_batch(request, lambda job, attempt, why: self._refused(
                    batch_id, f"task {codec.attempt_from_proto(attempt)} did not take batch {batch_id}: {why}"))
            else:
                if isinstance(step, InputRead) and step.source in self.query._receivers:
                    self.query.received[(batch_id, step.source)] = step.per_subtask
                output(step)
        if not self.flow.in_flight or batch_id not in self.flow.in_flight:
            for tm in set(self.flow.task_managers.values()) - {""}:
                self._released.setdefault(tm, set()).add(batch_id)
            if not future.done():
                future.set_result(None)

    def _refused(self, batch_id: int, why: str) -> None:
        entry = self._batches.get(batch_id)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(BatchNotRun(why))

    async def commit(self, batch_id: int) -> None:
        sides, query_id = self.query._sink_sides, self.query.query_id
        work = [(sides[sink], self.flow.sink_attempts(sink)) for sink in self.query.sinks]

        def commit_all() -> None:
            for side, attempts in work:
                side.commit(batch_id, attempts, query_id)

        future = asyncio.get_running_loop().run_in_executor(None, commit_all)
        self._in_threads.add(future)
        future.add_done_callback(self._in_threads.discard)
        await future

    async def settle(self) -> None:
        await asyncio.gather(*self._in_threads, return_exceptions=True)


def progress_json(records) -> list[str]:
    return [json.dumps(r, sort_keys=True) for r in records]
