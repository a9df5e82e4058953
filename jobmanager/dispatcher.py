"""The Dispatcher: accepts jobs, keeps them by id, and hands each to its own JobMaster.

Submission is all-or-nothing: a JobGraph is decoded and validated completely (every problem
reported at once) before anything is created; the ExecutionGraph, slot-sharing plan and regions
are built off the main thread (they are O(P) but not free at P = 10 000), and only then is the job
registered and started.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from funke.common.configuration import ClusterConfiguration
from funke.common.executiongraph import ExecutionGraph
from funke.common.jobgraph import JobGraph
from funke.common.restart import describe_config, restart_strategy_from_config
from funke.common.scheduler import Scheduler
from funke.common.states import JobStatus
from funke.common.validation import find_problems
from funke.common.wire import WireError, job_graph_from_proto
from funke.jobmanager.conversions import DescriptorFactory
from funke.jobmanager.jobmaster import JobMaster
from funke.jobmanager.mailbox import Mailbox
from funke.jobmanager.resourcemanager import ResourceManager
from funke.v1 import cluster_pb2, jobgraph_pb2

log = logging.getLogger("funke.jobmanager")


class DispatcherError(Exception):
    """An error for the client: `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class Dispatcher:
    def __init__(self, config: ClusterConfiguration):
        self.config = config
        self.mailbox = Mailbox()
        self.jobs: dict[str, JobMaster] = {}
        self._reserved: set[str] = set()  # ids of jobs being built
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
            raise DispatcherError("INVALID_ARGUMENT", str(exc)) from None
        problems = find_problems(job)
        if problems:
            listing = "\n".join(f"  - {p}" for p in problems)
            raise DispatcherError("INVALID_ARGUMENT", f"job graph has {len(problems)} problem(s):\n{listing}")
        job_id = job.job_id or uuid.uuid4().hex
        if job_id in self.jobs or job_id in self._reserved:
            raise DispatcherError("ALREADY_EXISTS", f"a job with id {job_id} already exists")
        self._reserved.add(job_id)
        try:
            graph, scheduler, restart = await asyncio.get_running_loop().run_in_executor(
                None, self._build, job, job_id, time.time())
        finally:
            self._reserved.discard(job_id)
        jm = JobMaster(
            graph, scheduler, resource_manager=self.rm, mailbox=self.mailbox, data_dir=self.config.data_dir,
            descriptors=DescriptorFactory(self.config.data_dir, dict(job.configuration.options), message.artifacts),
            restart_description=restart,
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

    def job(self, job_id: str) -> JobMaster:
        jm = self.jobs.get(job_id)
        if jm is None:
            raise DispatcherError("NOT_FOUND", f"no job with id {job_id!r}")
        return jm

    def cancel(self, job_id: str) -> JobStatus:
        jm = self.job(job_id)
        return self.mailbox.call(jm.cancel)

    # ------------------------------------------------------------------ from TaskManagers

    def on_task_states(self, updates: list[cluster_pb2.TaskExecutionState]) -> None:
        def deliver() -> None:
            for update in updates:
                jm = self.jobs.get(update.job_id)
                if jm is not None:
                    jm.on_task_state(update)

        self.mailbox.call(deliver)
