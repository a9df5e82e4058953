"""The Dispatcher: accepts jobs, keeps them by id, and hands each to its own JobMaster.

Submission is all-or-nothing: a JobGraph is decoded and validated completely (every problem
reported at once, against this cluster's data directory and limits) before anything is created;
the ExecutionGraph, slot-sharing plan and regions are built off the main thread (they are O(P)
but not free at P = 10 000), and only then is the job registered and started.

A job that reaches a terminal status leaves its JobMaster behind: the dispatcher keeps a compact
archive of it in the `JobStore` (Flink's ExecutionGraphInfoStore) until it is evicted by count,
age or size, and then deletes what the job left in the data directory. A job suspended by a live
rescale is not an end: the rescale's core (`funke.common.scheduling.rescale`, kept by the JobMaster)
says to start its next run at the new parallelism, and the Dispatcher does (`rescale`,
`_continue_rescaled`).

With high availability (`ha` set: this Dispatcher is the leader's, for one epoch) a job is
written to the job graph store before it starts, each of its status changes to its history
there, and when it ends globally its result (dirty, then clean once its job graph is removed)
and its archive; `recover` starts every job the store holds and shows the archived ones. A job
id with a recorded result is never run again.
"""

from __future__ import annotations

import contextlib

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import uuid
from typing import Callable

from funke.common import ids
from funke.common.backoff import Backoff
from funke.common.configuration import ClusterConfiguration
from funke.common.graph.executiongraph import ExecutionGraph
from funke.common.graph.jobgraph import JobGraph
from funke.common.graph.restart import describe_config, restart_strategy_from_config
from funke.common.scheduling import rescale as rs
from funke.common.scheduling.scheduler import FinishedSubtask, Scheduler
from funke.common.states import EXECUTION_STATE_TRANSITIONS, TESTING_MUTANTS, JobStatus
from funke.common.graph.streamingjob import CHECKPOINT, checkpoint_location, is_streaming_query, rescaled
from funke.common.graph.validation import Problem, ValidationContext, describe_problems, find_problems
from funke.common.wire.codec import (DeploymentEncoder, WireError, job_graph_from_proto, job_graph_to_proto,
                                     job_status_from_proto)
from funke.common.graph.executiongraph import Incarnation
from funke.runtime import gcpolicy
from funke.runtime.hafilesystem import Fenced, JobResult
from funke.runtime.haservices import cluster_scope
from funke.runtime.security import Tls
from funke.jobmanager import committer, datadir, deltatables, streamquery
from funke.jobmanager import highavailability as hamod
from funke.jobmanager.highavailability import HaContext
from funke.jobmanager.jobmaster import JobMaster
from funke.jobmanager.jobstore import ArchivedJob, JobStore, archive
from funke.jobmanager.mailbox import Mailbox
from funke.jobmanager.resourcemanager import ResourceManager
from funke.v1 import cluster_pb2, ha_pb2, job_pb2, jobgraph_pb2, jobmanager_pb2

log = logging.getLogger("funke.jobmanager")

Job = JobMaster | ArchivedJob
PROGRESS_INTERVAL_S = 0.05
STOP_WRITES_TIMEOUT_S = 10.0
# A job's data clean-up that failed is tried again, backing off from 0.2 s to 30 s.
CLEANUP_BACKOFF = Backoff(0.2, 30.0)


class DispatcherError(Exception):
    """An error for the client: `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class Dispatcher:
    def __init__(self, config: ClusterConfiguration, ha: HaContext | None = None, tls: Tls | None = None):
        self.config = config
        self.ha = ha
        self.tls = tls  # what this JobManager serves with and presents when it calls TaskManagers
        self.results: dict[str, JobResult] = {}  # with HA: every job the result store knows ended
        self._runs: dict[str, list[dict]] = {}  # with HA: each job's run records, kept in its history
        self._writes: set[asyncio.Future] = set()
        self._progress_due: set[str] = set()  # jobs whose finished subtasks are to be recorded
        self._progress_dirty: set[str] = set()  # ... and more finished since that record was taken
        self._progress_at: dict[str, float] = {}  # when each job's were last recorded (monotonic)
        self.mailbox = Mailbox()
        self.jobs: dict[str, JobMaster] = {}  # jobs that have not ended on this JobManager
        self.store = JobStore(config.jobstore_max_capacity, config.jobstore_expiration_s, config.jobstore_cache_bytes)
        self._reserved: set[str] = set()  # ids of jobs being built
        self._deleting: set[str] = set()  # ids of evicted jobs whose data is being deleted
        self._validation = ValidationContext(
            data_dir=config.data_dir, allowed_paths=config.allowed_paths, max_subtasks=config.max_subtasks,
            allowed_hosts=config.allowed_hosts)
        self.rm = ResourceManager(
            config, self.mailbox,
            job_master=self.jobs.get,
            running_job_masters=lambda: [jm for jm in self.jobs.values() if not jm.status.is_terminal],
            session=f"e{ha.epoch}." if ha is not None else f"{secrets.token_hex(3)}.",
            leader_epoch=ha.epoch if ha is not None else 0,
            tls=tls,
            leadership=ha,
        )

    def start(self) -> None:
        self.rm.start()

    async def stop(self, cause: str = "JobManager shut down") -> None:
        """Suspend every job that has not ended (with HA it stays in the job graph store for the
        next leader) and let the TaskManagers go."""
        for jm in list(self.jobs.values()):
            if not jm.status.is_terminal:
                self.mailbox.call(lambda jm=jm: jm.suspend(cause))
        if self.ha is not None:
            await asyncio.sleep(0)  # let the suspensions' letters queue their writes
            # What a leader records (a job's end, a suspension) is done before it steps down.
            if self._writes:
                await asyncio.wait(list(self._writes), timeout=STOP_WRITES_TIMEOUT_S)
            await self.ha.flush()
        await self.rm.stop()
        # Its jobs leave with it, archived or not (a leader that lost leadership drops them
        # suspended): the collector's thresholds go back to those of no running job.
        gcpolicy.running_subtasks(0)

    # ------------------------------------------------------------------ high availability

    def leader_info(self) -> jobmanager_pb2.LeaderInfo | None:
        if self.ha is None:
            return None
        lease = self.ha.lease()
        info = jobmanager_pb2.LeaderInfo(high_availability=self.config.high_availability, epoch=self.ha.epoch,
                                         job_manager=self.ha.job_manager)
        if lease is not None and lease.epoch == self.ha.epoch:
            info.address = lease.address
            info.since.FromNanoseconds(int(lease.since * 1e9))
        return info

    async def recover(self) -> list[str]:
        """As the new leader: show the archived jobs, finish what a leader left half-done (a job
        with a result whose graph is still stored), sweep the data directory of jobs nobody owns,
        and start every stored job again. Returns the ids of the jobs started."""
        ha = self.ha
        assert ha is not None
        services = ha.services
        self.results = await ha.read(services.results)
        archives = await ha.read(services.archives)
        graph_ids = await ha.read(services.job_graph_ids)
        now = time.time()
        for job_id, data in sorted(archives.items()):
            entry = _archived_from_bytes(job_id, data)
            if entry is not None:
                self._forget(self.store.put(entry, now))
        keep = set(graph_ids) | set(archives)
        await asyncio.get_running_loop().run_in_executor(None, datadir.sweep, self.config.data_dir, keep)
        started = []
        for job_id in graph_ids:
            if job_id in self.results:  # ended, but its clean-up was cut short
                self._spawn(self._finish_in_store(job_id, None, await self._leftover_cleanup(job_id)))
                continue
            try:
                if await self._recover_job(job_id):
                    started.append(job_id)
            except Exception:
                log.exception("job %s: recovering it from the job graph store failed; it stays there", job_id)
        if started:
            log.info("recovered %d job(s) from the job graph store: %s", len(started), ", ".join(started))
        return started

    async def _leftover_cleanup(self, job_id: str):
        """The data clean-up of a job whose end a dead leader recorded but did not clean up."""
        ha = self.ha
        assert ha is not None
        data = await ha.read(ha.services.job_graph, job_id)
        try:
            targets = committer.sink_targets(self.config.data_dir, job_id,
                                             job_graph_from_proto(jobgraph_pb2.JobGraph.FromString(data or b"")))
        except Exception:  # unreadable: its sink staging stays; the rest is still removed
            targets = []
        keep = self.results[job_id].status == JobStatus.FINISHED.value
        return lambda: committer.cleanup_job(self.config.data_dir, job_id, targets, keep)

    async def _recover_job(self, job_id: str) -> bool:
        ha = self.ha
        assert ha is not None
        data = await ha.read(ha.services.job_graph, job_id)
        records = await ha.read(ha.services.history, job_id)
        if data is None:
            return False
        message = jobgraph_pb2.JobGraph.FromString(data)
        job = job_graph_from_proto(message)
        problems = find_problems(job, self._validation)
        if problems or job.job_id != job_id:
            log.error("job %s in the job graph store is not valid here; not recovered: %s", job_id,
                      describe_problems(problems) if problems else f"it names itself {job.job_id}")
            return False
        story = hamod.read_story(records)
        incarnation, run = hamod.next_incarnation(story, ha.epoch, ha.job_manager, time.time(), None)
        self._runs[job_id] = story.runs + [run]
        recorded = hamod.read_progress(await ha.read(ha.services.progress, job_id))
        finished = await asyncio.get_running_loop().run_in_executor(
            None, hamod.outputs_still_there, self.config.data_dir, job, recorded)
        if recorded:
            log.info("job %s: %d of %d finished subtask(s) recorded by the earlier leader still have their "
                     "output", job_id, len(finished), len(recorded))
        # The new run's record (its attempt numbers) is stored before any of its tasks exists.
        await ha.write(ha.services.put_history, job_id, self._records(job_id, incarnation.earlier_history))
        await self.start_job(job, message.artifacts, incarnation=incarnation, persist=None, restore=finished)
        return True

    def _records(self, job_id: str, transitions) -> list[dict]:
        return self._runs.get(job_id, []) + [hamod.transition_record(h) for h in transitions]

    def _spawn(self, coroutine) -> None:
        future = asyncio.ensure_future(coroutine)
        self._writes.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future) -> None:
        self._writes.discard(future)
        exc = None if future.cancelled() else future.exception()
        if isinstance(exc, Fenced):
            log.info("high availability: a write was refused, this JobManager no longer leads: %s", exc)
        elif exc is not None:
            log.error("high availability: writing to the store failed: %s", exc, exc_info=exc)

    def _on_progress(self, jm: JobMaster) -> None:
        """A subtask finished: record the job's finished subtasks. One record per job is written
        at a time, each of all that finished until it is taken, at least PROGRESS_INTERVAL_S
        apart; a subtask that finished after the last record written runs again after a
        failover."""
        if self.ha is None:
            return
        if jm.job_id in self._progress_due:  # a record is being written or waits: it gets this too
            self._progress_dirty.add(jm.job_id)
            return
        self._progress_due.add(jm.job_id)
        wait = self._progress_at.get(jm.job_id, -PROGRESS_INTERVAL_S) + PROGRESS_INTERVAL_S - time.monotonic()
        if wait <= 0:
            self._record_progress(jm)
        else:
            asyncio.get_running_loop().call_later(wait, lambda: self.mailbox.run(lambda: self._record_progress(jm)))

    def _record_progress(self, jm: JobMaster) -> None:
        ha = self.ha
        if ha is None or self.jobs.get(jm.job_id) is not jm or jm.status.is_terminal:
            self._progress_due.discard(jm.job_id)
            self._progress_dirty.discard(jm.job_id)
            return
        self._progress_dirty.discard(jm.job_id)
        self._progress_at[jm.job_id] = time.monotonic()
        progress = [hamod.progress_record(f) for f in jm.scheduler.finished_subtasks()]
        future = asyncio.ensure_future(ha.write(ha.services.put_progress, jm.job_id, progress))
        self._writes.add(future)

        def written(f: asyncio.Future) -> None:
            self._written(f)
            self._progress_due.discard(jm.job_id)
            if jm.job_id in self._progress_dirty:
                self._progress_dirty.discard(jm.job_id)
                self.mailbox.run(lambda: self._on_progress(jm))

        future.add_done_callback(written)

    def _on_status(self, jm: JobMaster) -> None:
        if self.ha is not None:
            self._spawn(self.ha.write(self.ha.services.put_history, jm.job_id,
                                      self._records(jm.job_id, jm.graph.status_history())))

    async def _finish_in_store(self, job_id: str, entry: ArchivedJob | None, cleanup=None,
                               after: asyncio.Future | None = None) -> None:
        """A globally terminal job: its result (dirty), its archive, its data cleaned up (once
        `after`, its streaming query's closing, is done), its job graph removed, its result
        clean. Each step is idempotent, so a new leader finishes what a dead one began."""
        ha = self.ha
        assert ha is not None
        services = ha.services
        if entry is not None:
            await ha.write_until_done(services.put_dirty_result, self.results[job_id])
            await ha.write_until_done(services.put_archive, job_id, _archived_to_bytes(entry))
        if cleanup is not None and not await self._clean_up(job_id, cleanup, after):
            raise Fenced(f"epoch {ha.epoch} lost leadership before job {job_id} was cleaned up; the next "
                         "leader cleans it up")
        await ha.write_until_done(services.remove_job_graph, job_id)
        await ha.write_until_done(services.mark_result_clean, job_id)

    async def _clean_up(self, job_id: str, cleanup: Callable[[], None], after: asyncio.Future | None = None) -> bool:
        """Run a job's data clean-up (off the loop) until it succeeds; each run redoes only what
        is still there. First waits for `after` (a streaming query's closing: its last commit,
        whose staging the clean-up removes, has ended). False if this JobManager stopped leading
        first (the next leader cleans up: the job's graph stays in the store until then)."""
        if after is not None:
            await asyncio.wait([after])  # its outcome is the query's to report
        delays = CLEANUP_BACKOFF.delays()
        while True:
            try:
                await asyncio.get_running_loop().run_in_executor(None, cleanup)
                return True
            except Exception as exc:
                if self.ha is not None and not self.ha.leads():
                    return False
                delay = next(delays)
                log.warning("cleaning up job %s: %s; trying again in %.1f s", job_id, exc, delay)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ client API

    async def submit(self, message: jobgraph_pb2.JobGraph) -> str:
        active = sum(1 for jm in self.jobs.values() if not jm.status.is_terminal) + len(self._reserved)
        if active >= self.config.max_active_jobs:
            raise DispatcherError("RESOURCE_EXHAUSTED", f"the JobManager already has {active} jobs that have not "
                                  f"ended, its limit (jobmanager.max-active-jobs: {self.config.max_active_jobs}); "
                                  "submit again once some have ended")
        try:
            job = job_graph_from_proto(message)
        except WireError as exc:
            raise DispatcherError("INVALID_ARGUMENT", describe_problems(
                [Problem("on the wire", p) for p in exc.problems])) from None
        problems = find_problems(job, self._validation)
        problems += await self._storage_problems(job)
        if problems:
            raise DispatcherError("INVALID_ARGUMENT", describe_problems(problems))
        pinned = await self._pin_delta_versions(job)
        return await self.start_job(pinned, message.artifacts, persist=message if pinned is job else True)

    async def _storage_problems(self, job: JobGraph) -> list[Problem]:
        """What only the file system shows about a streaming query (its stream directories and
        checkpoint location) and about the Delta tables a job reads and writes, looked at in an
        executor thread, before anything of the job exists."""
        loop = asyncio.get_running_loop()
        problems = []
        if deltatables.uses_delta(job):
            problems += await loop.run_in_executor(None, deltatables.submit_problems, job, self._validation)
        if not is_streaming_query(job):
            return problems
        return problems + await loop.run_in_executor(None, streamquery.submit_problems, job, self._validation)

    async def _pin_delta_versions(self, job: JobGraph) -> JobGraph:
        """The job with its bounded Delta reads pinned to a table version (`deltatables.pin_versions`)."""
        if not deltatables.uses_delta(job):
            return job
        try:
            return await asyncio.get_running_loop().run_in_executor(None, deltatables.pin_versions, job)
        except (ValueError, OSError) as exc:
            raise DispatcherError("INVALID_ARGUMENT", describe_problems([Problem("Delta source", str(exc))])) from None

    async def start_job(self, job: JobGraph, artifacts=(), *, incarnation: Incarnation | None = None,
                        persist: jobgraph_pb2.JobGraph | None | bool = True,
                        restore: list[FinishedSubtask] | None = None, replacing: JobMaster | None = None) -> str:
        """Build and start a job that passed validation (the second half of `submit`; `artifacts`
        are the wire form the TaskManagers get; `replacing`: the suspended JobMaster of a rescaled
        job, whose place this run takes). With HA the job graph is stored first (`persist`:
        the message as submitted, True to encode `job`, None for a job recovered from the store)."""
        job_id = job.job_id or uuid.uuid4().hex
        if self.ha is not None and not self.ha.leads():
            raise DispatcherError("UNAVAILABLE", f"this JobManager no longer leads the cluster; "
                                  f"{self.ha.leader_address() or 'a new leader is being elected'}")
        recorded = self.results.get(job_id)
        if recorded is not None:
            raise DispatcherError("ALREADY_EXISTS", f"a job with id {job_id} already ran and ended "
                                  f"{recorded.status} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(recorded.ended_at))} "
                                  "(recorded in the job result store, so it is never run again); "
                                  "submit it under a new id")
        if (job_id in self.jobs and self.jobs[job_id] is not replacing) or job_id in self._reserved:
            raise DispatcherError("ALREADY_EXISTS", f"a job with id {job_id} already exists")
        if job_id in self._deleting:
            raise DispatcherError("ALREADY_EXISTS", f"a job with id {job_id} ended and its data is being deleted; "
                                  "submit it again in a moment, or under a new id")
        ended = self.store.get(job_id)
        if ended is not None:
            raise DispatcherError("ALREADY_EXISTS", f"a job with id {job_id} already ran and ended "
                                  f"{ended.status.value}; submit it under a new id")
        self._reserved.add(job_id)
        try:
            graph, scheduler, restart = await asyncio.get_running_loop().run_in_executor(
                None, self._build, job, job_id, time.time(), incarnation or self._first_run())
            if self.ha is not None and persist is not None:
                await self._store_job_graph(job, job_id, persist)
        except DispatcherError:
            raise
        except Fenced as exc:
            raise DispatcherError("UNAVAILABLE", f"job {job_id} was not started: this JobManager no longer "
                                  f"leads the cluster ({exc})") from None
        except OSError as exc:
            raise DispatcherError("UNAVAILABLE", f"job {job_id} was not started: the high-availability store "
                                  f"cannot be reached ({exc}); submit it again") from None
        except Exception as exc:  # validation let through what the ExecutionGraph cannot take: a bug
            log.exception("job %s: building its ExecutionGraph failed", job_id)
            raise DispatcherError("INTERNAL", f"the JobManager could not build job {job_id}: "
                                  f"{type(exc).__name__}: {str(exc)[:500]}") from None
        finally:
            self._reserved.discard(job_id)
        options = dict(job.configuration.options)
        if is_streaming_query(job):  # its tasks know where the checkpoint is (receivers store blocks there)
            with contextlib.suppress(ValueError):  # one the query cannot use fails it where it is opened
                options[CHECKPOINT] = checkpoint_location(job, self.config.data_dir)
        jm = JobMaster(
            graph, scheduler, resource_manager=self.rm, mailbox=self.mailbox, data_dir=self.config.data_dir,
            descriptors=DeploymentEncoder(self.config.data_dir, options, artifacts),
            restart_description=restart, on_terminal=self._archive, on_status=self._on_status,
            on_progress=self._on_progress, lease_scope=cluster_scope(self.config) if self.ha is not None else "",
            rescales=replacing.rescales if replacing is not None else None,
        )
        self.jobs[job_id] = jm
        self._count_subtasks()
        if restore:
            self.mailbox.call(lambda: jm.restore(restore, "finished under an earlier leader; its output is taken over"))
        self.mailbox.call(jm.start)
        return job_id

    def _first_run(self) -> Incarnation:
        if self.ha is None:
            return Incarnation()
        return Incarnation(self.ha.epoch, self.ha.job_manager)

    async def _store_job_graph(self, job: JobGraph, job_id: str, persist) -> None:
        """Into the job graph store before the job starts: a leader that dies a moment later
        leaves it for the next one."""
        assert self.ha is not None
        message = job_graph_to_proto(job) if persist is True else persist
        if message.job_id != job_id:
            copy = jobgraph_pb2.JobGraph()
            copy.CopyFrom(message)
            copy.job_id = job_id
            message = copy
        await self.ha.write(self.ha.services.put_job_graph, job_id, message.SerializeToString())

    def _build(self, job: JobGraph, job_id: str, now: float,
               incarnation: Incarnation = Incarnation()) -> tuple[ExecutionGraph, Scheduler, str]:
        cfg = job.configuration
        restart_cfg = cfg.restart_strategy if cfg.restart_strategy is not None else self.config.restart_strategy
        with gcpolicy.paused():  # all of it lives as long as the job: nothing for the collector to find
            graph = ExecutionGraph(job, job_id, now, incarnation)
            scheduler = Scheduler(
                graph,
                restart_strategy=restart_strategy_from_config(restart_cfg),
                failover_strategy=cfg.failover_strategy or self.config.failover_strategy,
                slot_request_timeout_s=cfg.slot_request_timeout_s or self.config.slot_request_timeout_s,
                cancellation_timeout_s=self.config.cancellation_timeout_s,
                slot_idle_timeout_s=self.config.slot_idle_timeout_s,
                execution_transitions=TESTING_MUTANTS.get(self.config.testing_mutant, EXECUTION_STATE_TRANSITIONS),
            )
        return graph, scheduler, describe_config(restart_cfg)

    def job(self, job_id: str) -> Job:
        """A running job's JobMaster, or an ended job's archive."""
        jm = self.jobs.get(job_id)
        if jm is not None:
            return jm
        self._expire()
        ended = self.store.get(job_id)
        if ended is None:
            raise DispatcherError("NOT_FOUND", f"no job with id {ids.echo(job_id)} (ended jobs are kept for "
                                  f"{self.config.jobstore_expiration_s:g} s, at most "
                                  f"{self.config.jobstore_max_capacity} of them)")
        return ended

    def cancel(self, job_id: str) -> JobStatus:
        job = self.job(job_id)
        if isinstance(job, ArchivedJob):
            return job.status
        return self.mailbox.call(job.cancel)

    def stop_query(self, job_id: str, drain: bool, timeout_s: float) -> tuple[JobStatus, str]:
        """A streaming query's graceful stop: (the job's status now, what happens)."""
        job = self.job(job_id)
        if isinstance(job, ArchivedJob):
            return job.status, f"the job already ended {job.status.value}"
        if job.query is None:
            raise DispatcherError("FAILED_PRECONDITION", f"job {job_id} is not a streaming query; "
                                  "a bounded job ends by itself (cancel it to stop it now)")
        message = self.mailbox.call(lambda: job.stop(drain, timeout_s))
        return job.status, message

    async def rescale(self, job_id: str, parallelism: int, vertex_ids: list[str],
                      timeout_s: float) -> jobmanager_pb2.RescaleJobResponse:
        """A running streaming query at another parallelism: checked whole (the new graph
        validated, the slots it needs there) before anything changes. Once its graph is valid
        the rescale is REQUESTED and has a story (`funke.common.scheduling.rescale`, kept by the
        JobMaster); this shell carries out its actions (`_continue_rescaled`, `_archive`)."""
        asked = time.time()
        job = self.job(job_id)
        if isinstance(job, ArchivedJob) or job.query is None:
            what = f"ended {job.status.value}" if isinstance(job, ArchivedJob) else "is not a streaming query"
            raise DispatcherError("FAILED_PRECONDITION", f"job {job_id} {what}; rescale takes a running streaming query "
                                  "(a bounded job or a stopped query is submitted again at the parallelism wanted)")
        if job.rescale is not None:
            raise DispatcherError("FAILED_PRECONDITION", f"job {job_id} is being rescaled already")
        if job.status is not JobStatus.RUNNING or job.query.ended or job.query.stopping:
            ending = (" and its query is ending" if job.query.ended
                      else " and its query is stopping" if job.query.stopping else "")
            raise DispatcherError("FAILED_PRECONDITION", f"job {job_id} is {job.status.value}{ending}; "
                                  "rescale a running query")
        new_job, problems = rescaled(job.graph.job_graph, parallelism, vertex_ids)
        if not problems:
            problems = [p.message for p in find_problems(new_job, self._validation)]
        if problems:
            raise DispatcherError("INVALID_ARGUMENT", "cannot rescale job " + job_id + ": " + "; ".join(problems))
        before = {v.id: v.parallelism for v in job.graph.job_graph.vertices}
        after = {v.id: v.parallelism for v in new_job.vertices}
        last = job.query.latest_progress
        last_batch = int(last["batchId"]) if last else -1
        if after == before:
            return jobmanager_pb2.RescaleJobResponse(message=f"job {job_id} already runs at that parallelism; "
                                                     "nothing changes", parallelism=after, last_batch_id=last_batch)
        # a vertex cut off a chain at parallelism 1 (`streamingjob.rescaled`) is new
        changed = ", ".join(f"{v} {before[v]} -> {after[v]}" if v in before else f"{v} (new) {after[v]}"
                            for v in after if after[v] != before.get(v))
        rescale = rs.Rescale(job_id, f"rescaled: {changed}", after, dataclasses.replace(new_job, job_id=job_id),
                             timeout_s, asked, last_batch)
        self.mailbox.call(lambda: job.begin_rescale(rescale))
        try:
            # built off the loop, as at submit: the slots the new graph needs
            _, scheduler, _ = await asyncio.get_running_loop().run_in_executor(None, self._build, new_job, job_id,
                                                                                time.time())
        except BaseException as exc:
            self._refuse(job, rescale, f"its graph could not be built: {type(exc).__name__}: {exc}")
            raise
        if self.jobs.get(job_id) is not job or job.status is not JobStatus.RUNNING or job.query.ended \
                or job.query.stopping:
            why = f"job {job_id} changed while its rescale was checked (it is {job.status.value} now); ask again"
            self._refuse(job, rescale, why)
            raise DispatcherError("FAILED_PRECONDITION", why)
        needed, held = scheduler.plan.required_slots(), job.scheduler.plan.required_slots()
        free = self.rm.slots.free_slots
        if needed > free + held:
            why = (f"job {job_id} at the new parallelism needs {needed} slots; it holds {held} and the cluster has "
                   f"{free} free: add TaskManagers first")
            self._refuse(job, rescale, why)
            raise DispatcherError("RESOURCE_EXHAUSTED", why)
        stopping = self.mailbox.call(lambda: job.rescale_accepted(time.time()))
        log.info("job %s: rescaling (%s) after batch %d", job_id, changed, last_batch)
        return jobmanager_pb2.RescaleJobResponse(
            message=f"rescaling ({changed}): {stopping}; then it runs again at the new parallelism from its "
                    "checkpoint, under the same id", parallelism=after, last_batch_id=last_batch)

    def _refuse(self, job: JobMaster, rescale: rs.Rescale, why: str) -> None:
        """A rescale the cluster cannot run: FAILED in its story, the job goes on as it was (one
        that ended meanwhile already failed it)."""
        if rescale.active:
            self.mailbox.call(lambda: job.on_rescale(rs.Refused(why, time.time(), "rescale-refused")))

    def _rescale_goes_on(self, jm: JobMaster) -> bool:
        """The job ended with a rescale under way: what the rescale does (True: the job runs
        again at its new parallelism, this JobMaster answering for it until the next one
        replaces it; False: it is archived as it ended)."""
        last = jm.graph.status_machine.history[-1] if jm.graph.status_machine.history else None
        cause = last.cause if last is not None else ""
        sid = (last.stimulus_id if last is not None else "") or f"job-{jm.status.value.lower()}"
        event = (rs.JobSuspended(cause, time.time(), sid) if jm.status is JobStatus.SUSPENDED
                 else rs.JobEnded(jm.status, cause, time.time(), sid))
        goes_on = False
        for action in jm.on_rescale(event):  # StartNextRun, or ArchiveJob (what `_archive` does next)
            if isinstance(action, rs.StartNextRun):
                self._spawn(self._continue_rescaled(jm, action.job_graph))
                goes_on = True
        return goes_on

    async def _continue_rescaled(self, jm: JobMaster, new_job: JobGraph) -> None:
        """The next run of a job suspended for a rescale: the same id, the graph at the new
        parallelism, the status history, rescale stories and progress records carried on,
        attempt numbers above the last run's; the query goes on from its checkpoint."""
        job_id = jm.job_id
        if jm.query is not None:
            await jm.query.close()  # its run let go of the checkpoint
        inc = jm.graph.incarnation
        highest = max((ev.current_execution.attempt_number for ev in jm.graph.execution_vertices()),
                      default=inc.first_attempt_number)
        first_attempt = (highest // hamod.ATTEMPT_STRIDE + 1) * hamod.ATTEMPT_STRIDE  # above every attempt so far
        incarnation = Incarnation(inc.leader_epoch, inc.job_manager, tuple(jm.graph.status_history()),
                                  first_attempt, jm.graph.status_machine.created_at)
        if self.ha is not None:
            self._runs[job_id] = self._runs.get(job_id, []) + [
                hamod.run_record(self.ha.epoch, self.ha.job_manager, first_attempt, time.time())]
        try:
            await self.start_job(new_job, jm.descriptors.artifacts, incarnation=incarnation,
                                 persist=True if self.ha is not None else None, replacing=jm)
        except Exception as exc:
            log.error("job %s: its run at the new parallelism could not start (%s); it stays SUSPENDED", job_id, exc)
            failed = exc
            for action in self.mailbox.call(lambda: jm.on_rescale(rs.StartFailed(str(failed), time.time(),
                                                                                  "next-run-not-started"))):
                if isinstance(action, rs.ArchiveJob):
                    self._archive(jm)
            return
        carried = self.jobs.get(job_id)
        if carried is not None and carried.query is not None and jm.query is not None:
            both = list(jm.query.progress) + list(carried.query.progress)  # oldest first; the newest kept
            carried.query.progress.clear()
            carried.query.progress.extend(both)

    def query_progress(self, job_id: str) -> jobmanager_pb2.QueryProgress:
        job = self.job(job_id)
        if isinstance(job, ArchivedJob):  # kept with the job (recovered archives keep the latest only)
            latest = job.details().latest_progress_json
            records = list(job.progress) or ([latest] if latest else [])
            query_id = json.loads(records[0]).get("id", "") if records else ""
            return jobmanager_pb2.QueryProgress(query_id=query_id, progress_json=records)
        if job.query is None:
            raise DispatcherError("FAILED_PRECONDITION", f"job {job_id} is not a streaming query: it has no "
                                  "micro-batch progress")
        q = job.query
        return jobmanager_pb2.QueryProgress(query_id=q.query_id, checkpoint_location=q.checkpoint_location,
                                            progress_json=[json.dumps(r, sort_keys=True) for r in q.progress])

    def summaries(self) -> list[job_pb2.JobSummary]:
        """Every job this JobManager knows, oldest first."""
        self._expire()
        summaries = [a.summary for a in self.store.jobs()] + [jm.summary() for jm in self.jobs.values()]
        summaries.sort(key=lambda m: (m.created_at.seconds, m.created_at.nanos))
        return summaries

    def cluster_overview(self) -> jobmanager_pb2.ClusterOverview:
        """TaskManagers and slots, jobs by status, the leader (what GetClusterOverview and the
        REST API's /overview answer)."""
        overview = self.rm.overview()
        overview.jobs_by_status.update(self.counts_by_status())
        leader = self.leader_info()
        if leader is not None:
            overview.leader.CopyFrom(leader)
        return overview

    def counts_by_status(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for status in [a.status for a in self.store.jobs()] + [jm.status for jm in self.jobs.values()]:
            counts[status.value] = counts.get(status.value, 0) + 1
        return counts

    # ------------------------------------------------------------------ ended jobs

    def _archive(self, jm: JobMaster) -> None:
        """The job ended: keep its details, let go of its JobMaster (graph, functions, artifacts)."""
        if self.jobs.get(jm.job_id) is not jm:
            return
        if jm.rescale is not None and self._rescale_goes_on(jm):
            return  # not an end: the job runs again at its new parallelism
        progress = tuple(json.dumps(r, sort_keys=True) for r in jm.query.progress) if jm.query is not None else ()
        entry = archive(jm.details(), jm.summary(), jm.status, jm.sequence, jm.collect_vertices, time.time(),
                        progress)
        del self.jobs[jm.job_id]
        self._count_subtasks()
        self._progress_at.pop(jm.job_id, None)
        if self.ha is not None and jm.status.is_globally_terminal:
            self.results[jm.job_id] = JobResult(jm.job_id, jm.status.value, time.time(), self.ha.epoch)
            self._spawn(self._finish_in_store(jm.job_id, entry, jm.pending_cleanup, jm.query_closed))
        elif jm.pending_cleanup is not None:
            self._spawn(self._clean_up(jm.job_id, jm.pending_cleanup, jm.query_closed))
        self._forget(self.store.put(entry, time.time()))

    def _count_subtasks(self) -> None:
        gcpolicy.running_subtasks(sum(j.graph.number_of_vertices() for j in self.jobs.values()))

    def _expire(self) -> None:
        self._forget(self.store.expire(time.time()))

    def _forget(self, evicted: list[ArchivedJob]) -> None:
        for entry in evicted:
            log.info("job %s (%s) evicted from the job store; its collected rows are deleted",
                     entry.job_id, entry.status.value)
            self._deleting.add(entry.job_id)  # its id is not reused until the deletion is done
            if self.ha is not None:
                self._spawn(self.ha.write(self.ha.services.remove_archive, entry.job_id))
            future = asyncio.get_running_loop().run_in_executor(
                None, committer.remove_job_data, self.config.data_dir, entry.job_id)
            future.add_done_callback(lambda f, job_id=entry.job_id: self._deleted(job_id, f))

    def _deleted(self, job_id: str, future: asyncio.Future) -> None:
        self._deleting.discard(job_id)
        if future.exception() is not None:
            log.warning("deleting the data of evicted job %s: %s", job_id, future.exception())

    # ------------------------------------------------------------------ from TaskManagers

    def on_task_states(self, updates: list[cluster_pb2.TaskExecutionState]) -> None:
        def deliver() -> None:
            # each job's reports as one event (a TaskManager's call carries hundreds under load),
            # in the order they came
            by_job: dict[str, list[cluster_pb2.TaskExecutionState]] = {}
            for update in updates:
                by_job.setdefault(update.job_id, []).append(update)
            for job_id, reports in by_job.items():
                jm = self.jobs.get(job_id)
                if jm is None:
                    continue
                try:
                    jm.on_task_states(reports)
                except Exception:  # one job's bad reports must not keep the rest of the batch from their jobs
                    log.exception("job %s: task reports could not be applied", jm.job_id)

        self.mailbox.call(deliver)


def _archived_to_bytes(entry: ArchivedJob) -> bytes:
    return ha_pb2.ArchivedJob(details=entry.details(), summary=entry.summary, sequence=entry.sequence,
                              collect_vertices=list(entry.collect_vertices),
                              archived_at=entry.archived_at).SerializeToString()


def _archived_from_bytes(job_id: str, data: bytes) -> ArchivedJob | None:
    try:
        m = ha_pb2.ArchivedJob.FromString(data)
        status = job_status_from_proto(m.details.status)
    except Exception as exc:  # a torn or foreign file: the job's result still refuses its id
        log.warning("job %s: its archive in the HA store cannot be read (%s); not shown", job_id, exc)
        return None
    return archive(m.details, m.summary, status, m.sequence, tuple(m.collect_vertices), m.archived_at)
