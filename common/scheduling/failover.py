"""What a failure means for a job: which tasks restart, whether they may, and after how long.

Owns the failover strategies (Flink's `FailoverStrategy`): `region` restarts the failed tasks'
pipelined regions and the producers of inputs they can no longer count on; `full` restarts the
whole job. `ExecutionFailureHandler` combines the failover strategy with the restart strategy
(`graph/restart.py`) into one `FailureHandling` decision per failure, which the scheduler carries out
(cancelling, resetting and rescheduling are its business). Also owns the exception history the
job keeps for its users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionVertex, FailureInfo, IntermediateResultPartition
from funke.common.graph.jobgraph import FailoverStrategyKind
from funke.common.scheduling.regions import PipelinedRegion, PipelinedRegions
from funke.common.graph.restart import RestartBackoffTimeStrategy, decide

# Flink's web.exception-history-size is 16; the job's root cause is kept apart in `failure`.
EXCEPTION_HISTORY_SIZE = 100


@dataclass(frozen=True, slots=True)
class ExceptionHistoryEntry:
    timestamp: float
    task_name: str
    attempt: ExecutionAttemptId | None
    task_manager_id: str | None
    failure: FailureInfo


@dataclass(frozen=True, slots=True)
class FailureHandling:
    """The decision for one failure. `regions` None: the whole job restarts (a global failover)
    or fails; otherwise these regions restart. `restart` False: the job fails, `suppressed_by`
    names the restart strategy that said no (Flink's description) and `gave_up` says in words
    which of its limits the failure reached (empty when no restart strategy was asked)."""

    restart: bool
    delay_s: float
    regions: tuple[PipelinedRegion, ...] | None
    suppressed_by: str = ""
    gave_up: str = ""

    @property
    def is_global(self) -> bool:
        return self.regions is None


def will_be_available(partition: IntermediateResultPartition) -> bool:
    """An input a restarted consumer can count on: produced already, or its producer is still
    live and will produce it. Flink restarts live producers of unfinished inputs too; only a
    producer that is terminal without a usable partition (lost, failed, cancelled) needs it."""
    return partition.is_available or not partition.producer.state.is_terminal


class ExecutionFailureHandler:
    def __init__(self, kind: FailoverStrategyKind, restart_strategy: RestartBackoffTimeStrategy,
                 regions: PipelinedRegions):
        self.kind = kind
        self.restart_strategy = restart_strategy
        self._regions = regions

    def on_task_failure(self, failed: Sequence[ExecutionVertex], now: float) -> FailureHandling:
        """Tasks failed (or finished producers lost partitions still needed): what restarts."""
        if self.kind is FailoverStrategyKind.FULL:
            return self.on_global_failure(now)
        regions = tuple(self._regions.regions_to_restart(failed, is_available=will_be_available))
        decision = decide(self.restart_strategy, now)
        if not decision.restart:
            return FailureHandling(False, 0.0, None, decision.strategy, decision.gave_up)
        return FailureHandling(True, decision.delay_s, regions)

    def on_global_failure(self, now: float) -> FailureHandling:
        decision = decide(self.restart_strategy, now)
        return FailureHandling(decision.restart, decision.delay_s, None, decision.strategy, decision.gave_up)

    @staticmethod
    def without_restart(suppressed_by: str) -> FailureHandling:
        """A failure that no restart could cure (the restart strategy is not asked)."""
        return FailureHandling(False, 0.0, None, suppressed_by)


def vertices_of(regions: Iterable[PipelinedRegion]) -> set[ExecutionVertex]:
    return {ev for region in regions for ev in region.vertices}
