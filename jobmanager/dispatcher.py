"""The Dispatcher: accepts jobs, keeps them by id, and hands each to its own JobMaster.

Submission is all-or-nothing: a JobGraph is decoded and validated completely (every problem
reported at once, against this cluster's data directory and limits) before anything is created;
the ExecutionGraph, slot-sharing plan and regions are built off the main thread (they are O(P)
but not free at P = 10 000), and only then is the job registered and started.

A job that reaches a terminal status leaves its JobMaster behind: the dispatcher keeps a compact
archive of it in the `JobStore` (Flink's ExecutionGraphInfoStore) until it is evicted by count,
age or size, and then deletes what the job left in the data directory.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from funke.common import ids
from funke.common.configuration import ClusterConfiguration
from funke.common.executiongraph import ExecutionGraph
from funke.common.jobgraph import JobGraph
from funke.common.restart import describe_config, restart_strategy_from_config
from funke.common.scheduler import Scheduler
from funke.common.states import JobStatus
from funke.common.validation import Problem, ValidationContext, describe_problems, find_problems
from funke.common.codec import DeploymentEncoder, WireError, job_graph_from_proto
from funke.jobmanager import committer
from funke.jobmanager.jobmaster import JobMaster
from funke.jobmanager.jobstore import ArchivedJob, JobStore, archive
from funke.jobmanager.mailbox import Mailbox
from funke.jobmanager.resourcemanager import ResourceManager
from funke.v1 import cluster_pb2, job_pb2, jobgraph_pb2

log = logging.getLogger("funke.jobmanager")

Job = JobMaster | ArchivedJob


class DispatcherError(Exception):
    """An error for the client: `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class Dispatcher:
    def __init__(self, config: ClusterConfiguration):
        self.config = config
        self.mailbox = Mailbox()
        self.jobs: dict[str, JobMaster] = {}  # jobs that have not ended on this JobManager
        self.store = JobStore(config.jobstore_max_capacity, config.jobstore_expiration_s, config.jobstore_cache_bytes)
        self._reserved: set[str] = set()  # ids of jobs being built
        self._deleting: set[str] = set()  # ids of evicted jobs whose data is being deleted
        self._validation = ValidationContext(
            data_dir=config.data_dir, allowed_paths=config.allowed_paths, max_subtasks=config.max_subtasks)
        self.rm = ResourceManager(
            config, self.mailbox,
            job_master=self.jobs.get,
            running_job_masters=lambda: [jm for jm in self.jobs.values() if not jm.status.is_terminal],
        )

    def start(self) -> None:
        self.rm.start()

    async def stop(self) -> None:
        for jm in list(self.jobs.values()):
            if not jm.status.is_terminal:
                self.mailbox.call(lambda jm=jm: jm.suspend("JobManager shut down"))
        await self.rm.stop()

    # ------------------------------------------------------------------ client API

    async def submit(self, message: jobgraph_pb2.JobGraph) -> str:
        try:
            job = job_graph_from_proto(message)
        except WireError as exc:
            raise DispatcherError("INVALID_ARGUMENT", describe_problems(
                [Problem("on the wire", p) for p in exc.problems])) from None
        problems = find_problems(job, self._validation)
        if problems:
            raise DispatcherError("INVALID_ARGUMENT", describe_problems(problems))
        return await self.start_job(job, message.artifacts)

    async def start_job(self, job: JobGraph, artifacts=()) -> str:
        """Build and start a job that passed validation (the second half of `submit`; `artifacts`
        are the wire form the TaskManagers get)."""
        job_id = job.job_id or uuid.uuid4().hex
        if job_id in self.jobs or job_id in self._reserved:
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
                None, self._build, job, job_id, time.time())
        except Exception as exc:  # validation let through what the ExecutionGraph cannot take: a bug
            log.exception("job %s: building its ExecutionGraph failed", job_id)
            raise DispatcherError("INTERNAL", f"the JobManager could not build job {job_id}: "
                                  f"{type(exc).__name__}: {str(exc)[:500]}") from None
        finally:
            self._reserved.discard(job_id)
        jm = JobMaster(
            graph, scheduler, resource_manager=self.rm, mailbox=self.mailbox, data_dir=self.config.data_dir,
            descriptors=DeploymentEncoder(self.config.data_dir, dict(job.configuration.options), artifacts),
            restart_description=restart, on_terminal=self._archive,
        )
        self.jobs[job_id] = jm
        self.mailbox.call(jm.start)
        return job_id

    def _build(self, job: JobGraph, job_id: str, now: float) -> tuple[ExecutionGraph, Scheduler, str]:
        cfg = job.configuration
        restart_cfg = cfg.restart_strategy if cfg.restart_strategy is not None else self.config.restart_strategy
        graph = ExecutionGraph(job, job_id, now)
        scheduler = Scheduler(
            graph,
            restart_strategy=restart_strategy_from_config(restart_cfg),
            failover_strategy=cfg.failover_strategy or self.config.failover_strategy,
            slot_request_timeout_s=cfg.slot_request_timeout_s or self.config.slot_request_timeout_s,
            cancellation_timeout_s=self.config.cancellation_timeout_s,
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

    def summaries(self) -> list[job_pb2.JobSummary]:
        """Every job this JobManager knows, oldest first."""
        self._expire()
        summaries = [a.summary for a in self.store.jobs()] + [jm.summary() for jm in self.jobs.values()]
        summaries.sort(key=lambda m: (m.created_at.seconds, m.created_at.nanos))
        return summaries

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
        entry = archive(jm.details(), jm.summary(), jm.status, jm.sequence, jm.collect_vertices, time.time())
        del self.jobs[jm.job_id]
        self._forget(self.store.put(entry, time.time()))

    def _expire(self) -> None:
        self._forget(self.store.expire(time.time()))

    def _forget(self, evicted: list[ArchivedJob]) -> None:
        for entry in evicted:
            log.info("job %s (%s) evicted from the job store; its collected rows are deleted",
                     entry.job_id, entry.status.value)
            self._deleting.add(entry.job_id)  # its id is not reused until the deletion is done
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
            for update in updates:
                jm = self.jobs.get(update.job_id)
                if jm is None:
                    continue
                try:
                    jm.on_task_state(update)
                except Exception:  # one bad report must not keep the rest of the batch from their jobs
                    log.exception("job %s: a task report could not be applied", jm.job_id)

        self.mailbox.call(deliver)
