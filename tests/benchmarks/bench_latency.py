"""Latency on a warm local cluster: submit -> RUNNING and submit -> FINISHED.

    python tests/benchmarks/bench_latency.py [--runs 5] [--taskmanagers 2] [--slots 2]

Starts a local cluster (JobManager + TaskManagers with PySpark), warms it with one word count,
then measures, as medians over --runs runs:
  - a one-vertex no-op job: submit -> RUNNING, submit -> FINISHED (scheduling and deployment only);
  - a count per key of 1 000 rows from the job itself (from_collection -> key_by -> count ->
    collect, p=2): one exchange of rows the driver handed over;
  - the word-count example over examples/data: submit -> RUNNING, submit -> FINISHED.
Times are taken by the client from the job's own status history (JobManager clock) and from the
moment SubmitJob was sent. Not a test: timing assertions do not belong in the suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.deploy.client import JobManagerClient  # noqa: E402
from funke.deploy.jobfile import load_job_file  # noqa: E402
from funke.common.api.dsl import ExecutionEnvironment  # noqa: E402
from funke.deploy import localcluster  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402


def _running_and_end(client: JobManagerClient, job_id: str, sent: float) -> tuple[float, float]:
    for _ in client.watch(job_id):
        pass
    details = client.get_job(job_id)
    final = job_pb2.JobStatus.Name(details.status)
    if final != "JOB_STATUS_FINISHED":
        raise SystemExit(f"job {job_id} ended {final}: {details.failure.message}")
    stamps = {job_pb2.JobStatus.Name(t.to_status): t.timestamp.seconds + t.timestamp.nanos / 1e9
              for t in details.status_history}
    return stamps["JOB_STATUS_RUNNING"] - sent, stamps["JOB_STATUS_FINISHED"] - sent


def one_vertex_job():
    env = ExecutionEnvironment("one vertex", parallelism=1)
    env.from_range(10).discard()
    return env.build()


def collection_count_job():
    env = ExecutionEnvironment("collection count", parallelism=2)
    env.from_collection([[f"key-{i % 50}", i] for i in range(1000)], "k string, v bigint").key_by("k").count().collect()
    return env.build()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--taskmanagers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    wordcount = load_job_file(REPO / "examples" / "wordcount.py", ["--parallelism", "2"])
    with tempfile.TemporaryDirectory(prefix="funke-bench-") as d:
        t0 = time.time()
        info = localcluster.start(localcluster.ClusterSpec(d, args.taskmanagers, args.slots))
        started = time.time() - t0
        try:
            with info.client() as client:
                _running_and_end(client, client.submit(wordcount), time.time())  # warm-up
                rows = []
                for name, job in (("one-vertex job (range -> discard, p=1)", one_vertex_job()),
                                  ("collection -> count per key (p=2)", collection_count_job()),
                                  ("word count example (p=2)", wordcount)):
                    running, finished = [], []
                    for _ in range(args.runs):
                        sent = time.time()
                        r, f = _running_and_end(client, client.submit(job), sent)
                        running.append(r)
                        finished.append(f)
                    rows.append((name, statistics.median(running), statistics.median(finished)))
        finally:
            localcluster.stop(d)
    print(f"local cluster: {args.taskmanagers} TaskManagers x {args.slots} slots, started in {started:.1f} s; "
          f"median of {args.runs} runs on a warm cluster")
    print(f"{'job':42} {'submit->RUNNING':>16} {'submit->FINISHED':>17}")
    for name, r, f in rows:
        print(f"{name:42} {r * 1000:13.0f} ms {f * 1000:14.0f} ms")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(
            [{"job": name, "submit_to_running_ms": r * 1000, "submit_to_finished_ms": f * 1000, "runs": args.runs}
             for name, r, f in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
