"""Scheduler scale: the JobManager's sans-IO core on source -> sink ALL_TO_ALL, the topology of
Flink's scheduler benchmarks (apache/flink-benchmarks), BLOCKING (BATCH) and PIPELINED (STREAMING).

For P in --p (default 4000 and 10000; 100000 works, with a few GiB of memory), median wall and CPU
time of --runs runs (default 5), and the peak memory each step itself allocates (tracemalloc,
started after the step's set-up, in a separate pass so tracing does not distort the times), of:

  build ExecutionGraph       ExecutionGraph(job) alone
  job initialization         ExecutionGraph + pipelined regions + slot-sharing plan (Scheduler(...))
  schedule all subtasks      start() until all 2P subtasks are DEPLOYING with P slots available
                             (BLOCKING: includes the P source FINISHED reports that release the sinks)
  regions to restart         the regions to restart when one sink subtask fails (inputs finished)
  global failover            full failover of the running job: the failure, a CANCELED report of
                             every other running subtask (PIPELINED: 2P-1; BLOCKING: the P-1 sinks,
                             the sources had finished), the restart and redeploying all 2P subtasks
                             (restart delay 0; BLOCKING: with the P source FINISHED reports again)

Run alone: python tests/benchmarks/bench_scheduler.py [--p 4000 10000 100000] [--runs 5]
    [--types BLOCKING PIPELINED] [--steps 'global failover' ...] [--no-memory] [--json FILE]

As in the JobManager (runtime/gcpolicy.py), the ExecutionGraph and the Scheduler are built with
Python's cycle collector paused, each decision (an event and carrying out its actions) runs with
it paused, and between decisions it runs with the thresholds the JobManager sets for a running
job of 2 x P subtasks (rarer collections from 10 000 subtasks on).
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
from funke.common.graph.deployment import TaskReport  # noqa: E402
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo  # noqa: E402
from funke.common.graph.jobgraph import FailoverStrategyKind, JobGraph, ResultPartitionType  # noqa: E402
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy  # noqa: E402
from funke.common.states import ExecutionState  # noqa: E402
from funke.runtime import gcpolicy  # noqa: E402
from tests.conformance.graphs import source_sink_all_to_all  # noqa: E402

E = ExecutionState
PARTITION_TYPES = (ResultPartitionType.BLOCKING, ResultPartitionType.PIPELINED)
STEPS = ("build ExecutionGraph", "job initialization", "schedule all subtasks", "regions to restart", "global failover")
JOB = "bench"
REPORTS_PER_CALL = 100


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
        # by the action's type, as the JobMaster dispatches; other actions need nothing here
        self._handlers: dict[type, Callable[[object, deque], None]] = {
            s.RequestSlots: self._request, s.ReleaseSlot: self._release, s.CancelSlotRequest: self._cancel_request,
            s.DeployTask: self._deploy, s.CancelTask: self._cancel, s.StartTimer: self._timer,
        }

    def decide(self, event: Callable[[], list]) -> None:
        """One decision: the event and carrying out its actions, with the collector paused as
        the JobMaster runs a decision (the actions are freed before it could walk them)."""
        with gcpolicy.paused():
            self.apply(event())

    def apply(self, actions: list) -> None:
        queue = deque(actions)
        handlers = self._handlers
        while queue:
            a = queue.popleft()
            handler = handlers.get(type(a))
            if handler is not None:
                handler(a, queue)

    def _request(self, a: s.RequestSlots, queue: deque) -> None:
        queue.extend(self._slot_actions(self.slots.request_slots(JOB, a.requests, a.timeout_s, 0.0)))

    def _release(self, a: s.ReleaseSlot, queue: deque) -> None:
        queue.extend(self._slot_actions(self.slots.release_slot(a.slot, JOB, a.cause, 0.0)))

    def _cancel_request(self, a: s.CancelSlotRequest, queue: deque) -> None:
        self.slots.cancel_request(JOB, a.request_id)

    def _deploy(self, a: s.DeployTask, queue: deque) -> None:
        self.deploying.append(a.attempt)

    def _cancel(self, a: s.CancelTask, queue: deque) -> None:
        self.cancelled.append(a.attempt)

    def _timer(self, a: s.StartTimer, queue: deque) -> None:
        self.timers.append(a)

    def _slot_actions(self, actions: list) -> list:
        # what the SlotManager served in one pass reaches the job as one event, as the
        # ResourceManager hands it over
        served = [(a.request_id, a.slots) for a in actions if isinstance(a, sm.SlotsAllocated)]
        return self.scheduler.on_allocations(served, 0.0) if served else []

    def report(self, attempts: list[ExecutionAttemptId], state: ExecutionState) -> None:
        """Reports in calls of REPORTS_PER_CALL, as a TaskManager sends what its tasks did since its
        last call (one task a call would be the worst case; under load a call carries hundreds)."""
        for start in range(0, len(attempts), REPORTS_PER_CALL):
            reports = [TaskReport(JOB, a, state) for a in attempts[start:start + REPORTS_PER_CALL]]
            self.decide(lambda: self.scheduler.on_task_states(reports, 0.0))


def new_scheduler(job: JobGraph, failover=FailoverStrategyKind.REGION) -> s.Scheduler:
    with gcpolicy.paused():  # as the JobManager's dispatcher builds a job
        return s.Scheduler(ExecutionGraph(job, JOB, 0.0), restart_strategy=FixedDelayRestartBackoffTimeStrategy(1000, 0.0),
                           failover_strategy=failover)


def new_graph(job: JobGraph) -> ExecutionGraph:
    with gcpolicy.paused():
        return ExecutionGraph(job, JOB, 0.0)


def schedule_all(scheduler: s.Scheduler, p: int) -> Driver:
    """start() until every subtask is DEPLOYING (BLOCKING: sources finish to release the sinks)."""
    driver = Driver(scheduler, p)
    driver.decide(lambda: scheduler.start(0.0))
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
    driver.decide(lambda: scheduler.on_task_state(sink, E.FAILED, 0.0, failure=FailureInfo("Boom", "a sink failed")))
    driver.report([a for a in driver.cancelled], E.CANCELED)
    (timer,) = [t for t in driver.timers if t.timer.kind == "restart"]
    before = len(driver.deploying)
    driver.decide(lambda: scheduler.on_timer(timer.timer, timer.at))
    if len(driver.deploying) - before < 2 * p:  # BLOCKING: sinks again wait for the sources
        driver.report(driver.deploying[before:], E.FINISHED)
    assert len(driver.deploying) - before == 2 * p


def measure(p: int, kind: ResultPartitionType, step: str, timer: Callable[[Callable[[], object]], object]) -> object:
    """Carry out one step under `timer`; the set-up (a running job for the last two) is outside it."""
    gcpolicy.running_subtasks(2 * p)  # the collector's thresholds as the JobManager sets them for this job
    job = source_sink_all_to_all(p, kind)
    if step == "build ExecutionGraph":
        return timer(lambda: new_graph(job))
    if step == "job initialization":
        return timer(lambda: new_scheduler(job))
    if step == "schedule all subtasks":
        scheduler = new_scheduler(job)
        return timer(lambda: schedule_all(scheduler, p))
    if step == "regions to restart":
        scheduler, _ = running_job(p, kind)
        failed = [scheduler.graph.vertices["sink"].task_vertices[p // 2]]
        return timer(lambda: scheduler.regions.regions_to_restart(failed))
    if step == "global failover":
        scheduler, driver = running_job(p, kind, FailoverStrategyKind.FULL)
        return timer(lambda: global_failover(scheduler, driver, p))
    raise ValueError(step)


class Timed:
    """Wall time and CPU time of this process (ms): on a shared machine the CPU time says what
    the step costs, the wall time what it took."""

    def __init__(self) -> None:
        self.wall_ms = self.cpu_ms = 0.0

    def __call__(self, fn: Callable[[], object]) -> object:
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        value = fn()
        self.cpu_ms = (time.process_time() - cpu) * 1000.0
        self.wall_ms = (time.perf_counter() - wall) * 1000.0
        return value


class Traced:
    """Peak memory (MiB) the step itself allocated: tracing starts after the set-up, so what the
    set-up built does not count (tracemalloc slows Python down, hence a pass of its own)."""

    def __init__(self) -> None:
        self.peak_mib = 0.0

    def __call__(self, fn: Callable[[], object]) -> object:
        gc.collect()
        tracemalloc.start()
        try:
            value = fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.peak_mib = peak / 2**20
        return value


def run(ps: list[int], kinds: list[ResultPartitionType], steps: list[str], runs: int, memory: bool) -> list[dict]:
    rows = []
    for p in ps:
        for kind in kinds:
            for step in steps:
                walls, cpus = [], []
                for _ in range(runs):
                    timed = Timed()
                    value = measure(p, kind, step, timed)
                    del value
                    walls.append(timed.wall_ms)
                    cpus.append(timed.cpu_ms)
                peak = None
                if memory:
                    traced = Traced()
                    value = measure(p, kind, step, traced)
                    del value
                    peak = traced.peak_mib
                row = {"p": p, "result_partition_type": kind.value, "step": step,
                       "median_ms": statistics.median(walls), "min_ms": min(walls),
                       "median_cpu_ms": statistics.median(cpus), "peak_mib": peak, "runs": runs}
                rows.append(row)
                print(f"  {format_row(row)}", file=sys.stderr, flush=True)
    return rows


def format_row(r: dict) -> str:
    peak = f"{r['peak_mib']:8.1f} MiB" if r["peak_mib"] is not None else f"{'-':>8} MiB"
    return (f"{r['p']:>6}  {r['result_partition_type']:9}  {r['step']:24} {r['median_ms']:9.1f} ms "
            f"{r['median_cpu_ms']:9.1f} ms {peak}")


def print_table(rows: list[dict]) -> None:
    print(f"{'P':>6}  {'results':9}  {'step':24} {'median wall':>12} {'median CPU':>12} {'peak memory':>12}")
    for r in rows:
        print(format_row(r))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--p", type=int, nargs="+", default=[4000, 10000], help="parallelisms, e.g. 10000 100000")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--types", nargs="+", choices=[k.value for k in PARTITION_TYPES],
                   default=[k.value for k in PARTITION_TYPES], help="result partition types")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS), metavar="STEP",
                   help=f"steps to measure, of: {', '.join(repr(s) for s in STEPS)}")
    p.add_argument("--no-memory", action="store_true", help="skip the peak memory pass")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if any(n < 1 for n in args.p) or args.runs < 1:
        p.error("--p and --runs must be positive")
    print("the cycle collector as in the JobManager (runtime/gcpolicy.py): paused while the graph and the scheduler "
          f"are built; thresholds {gcpolicy.LARGE_JOBS_THRESHOLDS} from {gcpolicy.LARGE_JOBS_SUBTASKS} subtasks on, "
          f"else {gcpolicy.DEFAULT_THRESHOLDS}")
    kinds = [ResultPartitionType(v) for v in args.types]
    rows = run(args.p, kinds, [s for s in STEPS if s in args.steps], args.runs, not args.no_memory)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
