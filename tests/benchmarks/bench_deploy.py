"""Deployment: all 2 x P tasks of source -> sink ALL_TO_ALL, as no-op tasks, deployed over real
gRPC to local TaskManager processes (4 unless --task-managers says otherwise) until every task FINISHED.

    python tests/benchmarks/bench_deploy.py [--p 4000 10000] [--runs 3] [--task-managers 4]
        [--types BLOCKING PIPELINED] [--json FILE]

At Flink's large-batch size: --p 100000 --task-managers 8 --types BLOCKING (200 000 tasks). A
vertex runs at most 32 768 subtasks (Flink's upper bound of max parallelism, MAX_PARALLELISM_LIMIT),
so P above it is split into the fewest equal source -> sink pipelines of one job that stay under
it (P = 100 000: 4 x 25 000, ALL_TO_ALL within each), and the cluster takes 2 x P subtasks per job.

The cluster has P slots, or as many as its TaskManagers may offer (a JobManager takes at most
4 096 per TaskManager, MAX_SLOTS_PER_TASK_MANAGER): then a BATCH job runs in waves, as a Flink batch
job with fewer slots than subtasks does (TaskManagers without Spark: the tasks are no-ops, so what is measured
is the JobManager's scheduling, the deployment RPCs, the TaskManagers running and reporting, and
the JobManager following every task to FINISHED). BATCH (BLOCKING: sinks are deployed once the
sources finished) and STREAMING (PIPELINED: everything at once, sinks waiting for partitions).
The time runs from SubmitJob to the job's FINISHED (from its own status history).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.deploy.client import JobManagerClient  # noqa: E402
from funke.common.graph.jobgraph import (  # noqa: E402
    IntermediateDataSet,
    JobEdge,
    JobGraph,
    JobType,
    JobVertex,
    OperatorSpec,
    ResultPartitionType,
)
from funke.common.graph.jobgraph import MAX_PARALLELISM_LIMIT  # noqa: E402
from funke.deploy import localcluster  # noqa: E402
from funke.jobmanager.services import MAX_SLOTS_PER_TASK_MANAGER  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402

TASKMANAGERS = 4
PARTITION_TYPES = (ResultPartitionType.BLOCKING, ResultPartitionType.PIPELINED)


def pipelines_of(p: int) -> int:
    """How many source -> sink pipelines carry P subtasks per side under the parallelism limit."""
    return -(-p // MAX_PARALLELISM_LIMIT)


def noop_job(p: int, kind: ResultPartitionType) -> JobGraph:
    k = pipelines_of(p)
    if p % k:
        raise SystemExit(f"P={p} is split into {k} pipelines: it must be a multiple of {k}")
    suffix = [""] if k == 1 else [f"-{i}" for i in range(k)]
    vertices, data_sets, edges = [], [], []
    for s in suffix:
        vertices += [JobVertex(f"source{s}", f"Source{s}", p // k, (OperatorSpec("source.noop"),)),
                     JobVertex(f"sink{s}", f"Sink{s}", p // k, (OperatorSpec("noop"), OperatorSpec("sink.noop")))]
        data_sets.append(IntermediateDataSet(f"d{s}", f"source{s}"))
        edges.append(JobEdge(f"e{s}", f"d{s}", f"sink{s}", result_partition_type=kind))
    return JobGraph(
        f"deploy {2 * p} no-op tasks", tuple(vertices), tuple(data_sets), tuple(edges),
        job_type=JobType.STREAMING if kind is ResultPartitionType.PIPELINED else JobType.BATCH,
    )


def deploy_once(client: JobManagerClient, p: int, kind: ResultPartitionType) -> float:
    sent = time.time()
    job_id = client.submit(noop_job(p, kind))
    while True:  # the summary is cheap; following 6 x P events over WatchJob would not be
        summary = next(j for j in client.list_jobs() if j.job_id == job_id)
        if job_pb2.JobStatus.Name(summary.status) in ("JOB_STATUS_FINISHED", "JOB_STATUS_FAILED", "JOB_STATUS_CANCELED"):
            break
        time.sleep(0.02)
    details = client.get_job(job_id)
    status = job_pb2.JobStatus.Name(details.status)
    if status != "JOB_STATUS_FINISHED":
        raise SystemExit(f"P={p} {kind.value}: job ended {status}: {details.failure.message}")
    finished = details.status_history[-1].timestamp
    return finished.seconds + finished.nanos / 1e9 - sent


def run(ps: list[int], runs: int, task_managers: int = TASKMANAGERS,
        kinds: tuple[ResultPartitionType, ...] = PARTITION_TYPES) -> list[dict]:
    rows = []
    for p in ps:
        with tempfile.TemporaryDirectory(prefix="funke-bench-deploy-") as d:
            width = p // pipelines_of(p)  # the slots the job uses at once: its widest vertex
            slots = min(-(-width // task_managers), MAX_SLOTS_PER_TASK_MANAGER)
            if slots * task_managers < width:
                print(f"  P={p}: {task_managers} x {slots} slots, fewer than {width}: the job runs in waves",
                      file=sys.stderr, flush=True)
            dynamic = [f"funke.job.max-subtasks={2 * p}"] if 2 * p > 100_000 else []
            info = localcluster.start(localcluster.ClusterSpec(d, task_managers, slots, no_spark=True,
                                                               dynamic=dynamic, timeout=300))
            try:
                with info.client(timeout=600) as client:
                    for kind in kinds:
                        deploy_once(client, min(p, 200), kind)  # warm-up
                        times = [deploy_once(client, p, kind) for _ in range(runs)]
                        median = statistics.median(times)
                        rows.append({"p": p, "tasks": 2 * p, "task_managers": task_managers, "slots": slots * task_managers,
                                     "result_partition_type": kind.value,
                                     "median_s": median, "tasks_per_s": 2 * p / median, "runs": runs,
                                     "times_s": times})
                        print(f"  P={p:<6} {kind.value:9} {task_managers} TaskManagers {median:6.2f} s  "
                              f"{2 * p / median:7.0f} tasks/s",
                              file=sys.stderr, flush=True)
            finally:
                localcluster.stop(d)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'P':>6}  {'tasks':>6}  {'TMs':>3}  {'results':9} {'submit->FINISHED':>17} {'tasks/s':>9}")
    for r in rows:
        print(f"{r['p']:>6}  {r['tasks']:>6}  {r['task_managers']:>3}  {r['result_partition_type']:9} "
              f"{r['median_s']:15.2f} s {r['tasks_per_s']:9.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--p", type=int, nargs="+", default=[4000, 10000])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--task-managers", type=int, default=TASKMANAGERS, help="TaskManager processes (P slots in all)")
    p.add_argument("--types", nargs="+", choices=[k.value for k in PARTITION_TYPES],
                   default=[k.value for k in PARTITION_TYPES], help="result partition types")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if min(args.p) < 1 or args.runs < 1 or args.task_managers < 1:
        p.error("--p, --runs and --task-managers must be positive")
    rows = run(args.p, args.runs, args.task_managers, tuple(ResultPartitionType(v) for v in args.types))
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
