"""Scheduler scale: the JobManager's sans-IO core on source -> sink ALL_TO_ALL, the topology of
Flink's scheduler benchmarks (apache/flink-benchmarks), BLOCKING (BATCH) and PIPELINED (STREAMING).

For P in --p (default 4000 and 10000), median of --runs runs (default 5) and peak memory
(tracemalloc, measured in a separate pass so tracing does not distort the times) of:

  build ExecutionGraph       ExecutionGraph(job) alone
  job initialization         ExecutionGraph + pipelined regions + slot-sharing plan (Scheduler(...))
  schedule all subtasks      start() until all 2P subtasks are DEPLOYING with P slots available
                             (BLOCKING: includes the P source FINISHED reports that release the sinks)
  regions to restart         the regions to restart when one sink subtask fails (inputs finished)
  global failover            full failover of the running job: the failure, 2P-1 CANCELED reports,
                             the restart and redeploying all 2P subtasks (restart delay 0)

Run alone: python tests/benchmarks/bench_scheduler.py [--p 4000 10000] [--runs 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.conformance

from funke.common.scheduling import scheduler as s  # noqa: E402
from funke.common.scheduling import slotmanager as sm  # noqa: E402
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo  # noqa: E402
from funke.common.graph.jobgraph import FailoverStrategyKind, JobGraph, ResultPartitionType  # noqa: E402
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy  # noqa: E402
from funke.common.states import ExecutionState  # noqa: E402
from tests.conformance.graphs import source_sink_all_to_all  # noqa: E402

E = ExecutionState
STEPS = ("build ExecutionGraph", "job initialization", "schedule all subtasks", "regions to restart", "global failover")
JOB = "bench"


class Driver:
    """Carries out a scheduler's actions against a SlotManager, as the JobManager shell would."""

    def __init__(self, scheduler: s.Scheduler, p: int):
        self.scheduler = scheduler
        self.slots = sm.SlotManager(heartbeat_timeout_s=1e9)
        for i in range(4):
            self.slots.register(f"tm-{i}", "", p // 4 + (1 if i < p % 4 else 0), {}, 0.0)
        self.deploying: list[ExecutionAttemptId] = []
        self.cancelled: list[ExecutionAttemptId] = []
        self.timers: list[s.StartTimer] = []

    def apply(self, actions: list) -> None:
        queue = deque(actions)
        while queue:
            a = queue.popleft()
            if isinstance(a, s.RequestSlots):
                queue.extend(self._slot_actions(self.slots.request_slots(JOB, a.requests, a.timeout_s, 0.0)))
            elif isinstance(a, s.ReleaseSlot):
                queue.extend(self._slot_actions(self.slots.release_slot(a.slot, JOB, a.cause, 0.0)))
            elif isinstance(a, s.CancelSlotRequest):
                self.slots.cancel_request(JOB, a.request_id)
            elif isinstance(a, s.DeployTask):
                self.deploying.append(a.deployment.attempt)
            elif isinstance(a, s.CancelTask):
                self.cancelled.append(a.attempt)
            elif isinstance(a, s.StartTimer):
                self.timers.append(a)

    def _slot_actions(self, actions: list) -> list:
        out = []
        for a in actions:
            if isinstance(a, sm.SlotsAllocated):
                out.extend(self.scheduler.on_slots_allocated(a.request_id, a.slots, 0.0))
        return out

    def report(self, attempts: list[ExecutionAttemptId], state: ExecutionState) -> None:
        for attempt in attempts:
            self.apply(self.scheduler.on_task_state(attempt, state, 0.0, failure=None))


def new_scheduler(job: JobGraph, failover=FailoverStrategyKind.REGION) -> s.Scheduler:
    return s.Scheduler(ExecutionGraph(job, JOB, 0.0), restart_strategy=FixedDelayRestartBackoffTimeStrategy(1000, 0.0),
                       failover_strategy=failover)


def schedule_all(scheduler: s.Scheduler, p: int) -> Driver:
    """start() until every subtask is DEPLOYING (BLOCKING: sources finish to release the sinks)."""
    driver = Driver(scheduler, p)
    driver.apply(scheduler.start(0.0))
    if len(driver.deploying) < 2 * p:  # BLOCKING: the sinks wait for their inputs
        sources = list(driver.deploying)
        driver.report(sources, E.FINISHED)
    assert len(driver.deploying) == 2 * p, len(driver.deploying)
    return driver


def running_job(p: int, kind: ResultPartitionType, failover=FailoverStrategyKind.REGION) -> tuple[s.Scheduler, Driver]:
    scheduler = new_scheduler(source_sink_all_to_all(p, kind), failover)
    driver = schedule_all(scheduler, p)
    live = [a for a in driver.deploying if scheduler.graph.find_execution(a).state is E.DEPLOYING]
    driver.report(live, E.INITIALIZING)
    driver.report(live, E.RUNNING)
    return scheduler, driver


def global_failover(scheduler: s.Scheduler, driver: Driver, p: int) -> None:
    sink = ExecutionAttemptId("sink", p // 2, 0)
    driver.apply(scheduler.on_task_state(sink, E.FAILED, 0.0, failure=FailureInfo("Boom", "a sink failed")))
    driver.report([a for a in driver.cancelled], E.CANCELED)
    (timer,) = [t for t in driver.timers if t.timer.kind == "restart"]
    before = len(driver.deploying)
    driver.apply(scheduler.on_timer(timer.timer, timer.at))
    if len(driver.deploying) - before < 2 * p:  # BLOCKING: sinks again wait for the sources
        driver.report(driver.deploying[before:], E.FINISHED)
    assert len(driver.deploying) - before == 2 * p


def measure(p: int, kind: ResultPartitionType, step: str) -> tuple[float, object]:
    """Time one step (ms); set-up outside the timed part."""
    job = source_sink_all_to_all(p, kind)
    if step == "build ExecutionGraph":
        return timed(lambda: ExecutionGraph(job, JOB, 0.0))
    if step == "job initialization":
        return timed(lambda: new_scheduler(job))
    if step == "schedule all subtasks":
        scheduler = new_scheduler(job)
        return timed(lambda: schedule_all(scheduler, p))
    if step == "regions to restart":
        scheduler, _ = running_job(p, kind)
        failed = [scheduler.graph.vertices["sink"].task_vertices[p // 2]]
        return timed(lambda: scheduler.regions.regions_to_restart(failed))
    if step == "global failover":
        scheduler, driver = running_job(p, kind, FailoverStrategyKind.FULL)
        return timed(lambda: global_failover(scheduler, driver, p))
    raise ValueError(step)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    gc.collect()
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1000.0, value


def peak_mib(p: int, kind: ResultPartitionType, step: str) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _, value = measure(p, kind, step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del value
    return peak / 2**20


def run(ps: list[int], runs: int) -> list[dict]:
    rows = []
    for p in ps:
        for kind in (ResultPartitionType.BLOCKING, ResultPartitionType.PIPELINED):
            for step in STEPS:
                times = [measure(p, kind, step)[0] for _ in range(runs)]
                rows.append({"p": p, "result_partition_type": kind.value, "step": step,
                             "median_ms": statistics.median(times), "min_ms": min(times),
                             "peak_mib": peak_mib(p, kind, step), "runs": runs})
                print(f"  P={p:<6} {kind.value:9} {step:24} {statistics.median(times):9.1f} ms", file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'P':>6}  {'results':9}  {'step':24} {'median':>10} {'peak memory':>12}")
    for r in rows:
        print(f"{r['p']:>6}  {r['result_partition_type']:9}  {r['step']:24} {r['median_ms']:8.1f} ms {r['peak_mib']:8.1f} MiB")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--p", type=int, nargs="+", default=[4000, 10000])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = run(args.p, args.runs)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
