"""The TaskManager's task state reports to the JobManager: queued in the order the task core
made them, sent in batches by one sender, retried with backoff while the JobManager is away.
What becomes of a report is the task core's to decide: delivered (a task that ended is let go),
refused for good (`ReportsRefused`), or made for a registration that is over (dropped: the
JobManager that was lost has written those tasks off)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from funke.common.graph.deployment import TaskReport
from funke.common.task import registration as reg
from funke.common.task import taskexecutorstate as core
from funke.taskmanager.jobmanagergateway import GatewayError, JobManagerGateway

log = logging.getLogger("funke.taskmanager")

BATCH_MAX = 1000
RPC_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class _Queued:
    report: TaskReport
    generation: int


class TaskStateReporter:
    def __init__(self, state: core.TaskExecutorState, handle: Callable[[core.Event], object],
                 stimulus: Callable[[str], str], gateway: Callable[[], JobManagerGateway | None]):
        self._core = state
        self._handle = handle  # feeds the task core an event
        self._stimulus = stimulus
        self._gateway = gateway
        self.outbox: collections.deque[_Queued] = collections.deque()
        self._ready = asyncio.Event()
        self.empty = asyncio.Event()
        self.empty.set()

    def queue(self, report: TaskReport, generation: int) -> None:
        self.outbox.append(_Queued(report, generation))
        self.empty.clear()
        self._ready.set()

    def drop_stale(self) -> None:
        """Reports made for a registration the JobManager has written off go nowhere."""
        generation = self._core.generation
        self.outbox = collections.deque(q for q in self.outbox if q.generation == generation)
        if not self.outbox:
            self.empty.set()

    async def run(self) -> None:
        """The only sender of task states: in order, batched, retried while the JobManager is away."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self.outbox:
                batch = [self.outbox.popleft() for _ in range(min(len(self.outbox), BATCH_MAX))]
                await self._send(batch)
            self.empty.set()

    async def _send(self, batch: list[_Queued]) -> None:
        gateway = self._gateway()
        assert gateway is not None
        retries = 0
        while True:
            generation = self._core.generation
            batch = [q for q in batch if q.generation == generation]
            if not batch:
                return
            try:
                sent = await gateway.update_task_states(
                    [q.report for q in batch], lambda: self._core.generation == generation, RPC_TIMEOUT_S)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are shutting down
                # The call's channel was closed under it, or the JobManager it was for was lost
                # (we follow a new leader): not our end. Whatever is still current goes again.
                log.info("sending %d task state(s) was cut off; retrying", len(batch))
                continue
            except GatewayError as e:
                if e.code in reg.PERMANENT_REPORT_CODES:
                    log.error("the JobManager refused %d task state update(s) (%s); dropping them", len(batch), e)
                    self._handle(core.ReportsRefused(tuple(q.report for q in batch), str(e), self._stimulus("refused")))
                    return
                delay = reg.BACKOFF.delay(retries)
                retries += 1
                log.info("could not report %d task state(s) (%s); retrying in %.1f s", len(batch), e, delay)
                await asyncio.sleep(delay)
                continue
            if sent:
                terminal = tuple(q.report for q in batch if q.report.state.is_terminal)
                if terminal:
                    self._handle(core.ReportsDelivered(terminal, self._stimulus("delivered")))
                return
