"""Deployment: all 2 x P tasks of source -> sink ALL_TO_ALL, as no-op tasks, deployed over real
gRPC to 4 local TaskManager processes until every task FINISHED.

    python tests/benchmarks/bench_deploy.py [--p 4000 10000] [--runs 3] [--json FILE]

The cluster has P slots (4 TaskManagers without Spark: the tasks are no-ops, so what is measured
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
from funke.deploy import localcluster  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402

TASKMANAGERS = 4


def noop_job(p: int, kind: ResultPartitionType) -> JobGraph:
    return JobGraph(
        f"deploy {2 * p} no-op tasks",
        (JobVertex("source", "Source", p, (OperatorSpec("source.noop"),)),
         JobVertex("sink", "Sink", p, (OperatorSpec("noop"), OperatorSpec("sink.noop")))),
        (IntermediateDataSet("d", "source"),),
        (JobEdge("e", "d", "sink", result_partition_type=kind),),
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


def run(ps: list[int], runs: int) -> list[dict]:
    rows = []
    for p in ps:
        with tempfile.TemporaryDirectory(prefix="funke-bench-deploy-") as d:
            slots = -(-p // TASKMANAGERS)
            info = localcluster.start(localcluster.ClusterSpec(d, TASKMANAGERS, slots, no_spark=True))
            try:
                with info.client(timeout=600) as client:
                    for kind in (ResultPartitionType.BLOCKING, ResultPartitionType.PIPELINED):
                        deploy_once(client, min(p, 200), kind)  # warm-up
                        times = [deploy_once(client, p, kind) for _ in range(runs)]
                        median = statistics.median(times)
                        rows.append({"p": p, "tasks": 2 * p, "result_partition_type": kind.value,
                                     "median_s": median, "tasks_per_s": 2 * p / median, "runs": runs,
                                     "times_s": times})
                        print(f"  P={p:<6} {kind.value:9} {median:6.2f} s  {2 * p / median:7.0f} tasks/s",
                              file=sys.stderr, flush=True)
            finally:
                localcluster.stop(d)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'P':>6}  {'tasks':>6}  {'results':9} {'submit->FINISHED':>17} {'tasks/s':>9}")
    for r in rows:
        print(f"{r['p']:>6}  {r['tasks']:>6}  {r['result_partition_type']:9} {r['median_s']:15.2f} s {r['tasks_per_s']:9.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--p", type=int, nargs="+", default=[4000, 10000])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = run(args.p, args.runs)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
