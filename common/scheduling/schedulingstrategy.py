"""Which pipelined regions a job schedules, and when (Flink's SchedulingStrategy).

Owns the two strategies and nothing else; the scheduler asks them and does the scheduling:

- `EagerSchedulingStrategy` (STREAMING jobs): every region at once, as one bulk slot request (all
  slots or none), and a restarted set of regions again as one bulk.
- `PipelinedRegionSchedulingStrategy` (BATCH jobs): a region once all of its blocking inputs are
  finished, one slot request per region; when partitions finish, the regions consuming them that
  became ready.

Both answer in region index order, so that scheduling is deterministic.
"""

from __future__ import annotations

from typing import Iterable, Protocol

from funke.common.graph.executiongraph import ConsumedPartitionGroup
from funke.common.graph.jobgraph import JobType
from funke.common.scheduling.regions import PipelinedRegion, PipelinedRegions


class SchedulingStrategy(Protocol):
    # True: the regions scheduled together are one bulk (one slot request, all or nothing).
    one_bulk: bool

    def initial_regions(self) -> list[PipelinedRegion]:
        """What to schedule when the job starts (and after a global restart)."""
        ...

    def regions_ready_after(self, completed: Iterable[ConsumedPartitionGroup]) -> list[PipelinedRegion]:
        """Regions whose inputs became complete with `completed` groups of partitions."""
        ...

    def regions_to_restart(self, regions: Iterable[PipelinedRegion]) -> list[PipelinedRegion]:
        """Of the regions a failover reset, those to schedule now."""
        ...


def _ready(region: PipelinedRegion) -> bool:
    return all(group.all_finished for group in region.blocking_inputs)


def _ordered(regions: Iterable[PipelinedRegion]) -> list[PipelinedRegion]:
    return sorted({r.index: r for r in regions}.values(), key=lambda r: r.index)


class EagerSchedulingStrategy:
    one_bulk = True

    def __init__(self, regions: PipelinedRegions):
        self._regions = regions

    def initial_regions(self) -> list[PipelinedRegion]:
        return list(self._regions.regions)

    def regions_ready_after(self, completed: Iterable[ConsumedPartitionGroup]) -> list[PipelinedRegion]:
        return []  # everything was scheduled at the start

    def regions_to_restart(self, regions: Iterable[PipelinedRegion]) -> list[PipelinedRegion]:
        return _ordered(regions)


class PipelinedRegionSchedulingStrategy:
    one_bulk = False

    def __init__(self, regions: PipelinedRegions):
        self._regions = regions

    def initial_regions(self) -> list[PipelinedRegion]:
        # Each consumed group asked once: the P one-subtask regions of an ALL_TO_ALL consumer
        # share one (what a global restart of a batch job walks).
        finished: dict[int, bool] = {}
        ready = []
        for region in self._regions.regions:
            for group in region.blocking_inputs:
                done = finished.get(id(group))
                if done is None:
                    done = finished[id(group)] = group.all_finished
                if not done:
                    break
            else:
                ready.append(region)
        return ready

    def regions_ready_after(self, completed: Iterable[ConsumedPartitionGroup]) -> list[PipelinedRegion]:
        completed = list(completed)
        if len(completed) == 1:  # a partition finished its group: its consumers' regions, in order already
            (group,) = completed
            return [r for r in self._regions.consumer_regions_of(group)
                    if len(r.blocking_inputs) == 1 and r.blocking_inputs[0] is group or _ready(r)]
        candidates: dict[int, PipelinedRegion] = {}
        for group in completed:
            for region in self._regions.consumer_regions_of(group):
                candidates[region.index] = region
        return [r for r in _ordered(candidates.values()) if _ready(r)]

    def regions_to_restart(self, regions: Iterable[PipelinedRegion]) -> list[PipelinedRegion]:
        return [r for r in _ordered(regions) if _ready(r)]


def scheduling_strategy(job_type: JobType, regions: PipelinedRegions) -> SchedulingStrategy:
    if job_type is JobType.STREAMING:
        return EagerSchedulingStrategy(regions)
    return PipelinedRegionSchedulingStrategy(regions)
