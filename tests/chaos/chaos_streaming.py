"""Chaos for streaming queries: kill -9 a TaskManager (with its Spark JVM) at each phase of a
micro-batch, again and again, and check the file sink holds every input row exactly once.

    python tests/chaos/chaos_streaming.py [--runs 3] [--kills-per-phase 1] [--rows-per-second 200] [--fresh]

Each run is one streaming query (rate source -> a Python map that waits --row-delay per row ->
Parquet sink, parallelism 2, 1 s trigger, fixed-delay restarts). For every phase of a batch in
turn it waits for the listener event that opens the phase and kills a TaskManager that runs the
query's tasks, at once. Where the query runs again decides what recovery costs, so there are two
modes:

    warm (default)  three TaskManagers of two slots, and after each recovery a new one is added,
                    as a supervisor would; the query restarts on TaskManagers that are already
                    running, idle or running the query, with a SparkSession up (and warmed up if
                    their CPUs were idle long enough)
    --fresh         two TaskManagers of one slot, one subtask each, and no spare: the killed one
                    is replaced by a TaskManager started right after the kill, which has never
                    run the query; its process, SparkSession and the query's first batch on it
                    (cold: the JVM's first queries, the first Python workers) are part of the
                    recovery, and its start (kill -> registered) is shown apart

The phases:

    BatchCompleted            between batches: the next batch's offsets are not logged yet
    BatchSubmitted            the batch's offsets are logged (WAL), its tasks have not run it
    OutputOperationStarted    its sinks are writing
    OutputOperationCompleted  its sinks have written; the sink commit and the commit entry follow

Before each kill the query has caught up (a batch started within one interval of its time), so
that the figure is what recovery costs and not a backlog: the first batch of a cold start, or the
rows that piled up during the previous recovery.

Then the query is stopped gracefully, and the sink's committed batches (their manifests) are
compared with the rows the commit log's last offsets hold. Prints per phase the kills and the
time from each kill until the first batch committed after the query ran again (recovery: the
kill noticed, every task restarted, the query's next run started from the checkpoint and its
first batch committed), and per run the rows
expected and found, duplicates and losses. Not part of the test suite (it takes minutes).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.deploy import localcluster  # noqa: E402
from tests.integration.test_streaming import (  # noqa: E402
    PHASES,
    Events,
    StreamCluster,
    committed_rows,
    rate_job,
    read_values,
    wait_status,
)
from funke.jobmanager.checkpointstore import CheckpointStore  # noqa: E402


def task_managers_of(client, job_id: str) -> list[str]:
    return sorted({s.current.task_manager_id for v in client.get_job(job_id).vertices for s in v.subtasks
                   if s.current.task_manager_id})


def caught_up(client, job_id: str, interval_ms: int = 1000, timeout: float = 300) -> int:
    """Until a batch started within one trigger interval of its time (the query keeps up);
    returns its id."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        progress = client.progress(job_id)
        if progress and progress[-1].get("schedulingDelayMs", interval_ms + 1) <= interval_ms:
            return int(progress[-1]["batchId"])
        time.sleep(0.2)
    raise SystemExit(f"query {job_id} did not catch up within {timeout:.0f} s: {client.progress(job_id)[-1:]}")


def tally(out: Path, checkpoint: Path) -> dict:
    store = CheckpointStore(str(checkpoint))
    commits = store.commit_ids()
    (end,) = [r.end for r in store.read_offsets(commits[-1]).sources.values()]
    expected = int(end["rows"])
    values = [v for rows in committed_rows(out, read_values).values() for v in rows]
    counts = collections.Counter(values)
    return {"batches": len(commits), "rows_expected": expected, "rows_found": len(values),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "lost": len(set(range(expected)) - set(counts)),
            "beyond": len(set(counts) - set(range(expected)))}


class FreshCluster:
    """Two TaskManagers of one slot: a query of parallelism 2 has a subtask on each, and a
    killed one can only be replaced by a TaskManager started after the kill."""

    def __init__(self, dir: Path):
        self.dir = dir
        self.info = localcluster.start(localcluster.ClusterSpec(dir, 2, 1))
        self.client = self.info.client()
        self.started = 0

    def restore(self) -> None:
        registered = {tm.id for tm in self.client.cluster_overview().task_managers}
        for _ in range(2 - len(registered)):
            self.add_taskmanager()

    def add_taskmanager(self) -> str:
        self.started += 1
        name = f"tm-fresh-{self.started}"
        localcluster.start_taskmanager(self.dir, name, 1)
        return name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fresh", action="store_true",
                   help="replace the killed TaskManager by one started after the kill, which never ran the query")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kills-per-phase", type=int, default=1)
    p.add_argument("--rows-per-second", type=int, default=100)
    p.add_argument("--row-delay", type=float, default=0.005,
                   help="seconds the map waits per row, so that a batch's tasks take a while (default 0.005: 0.25 s a batch)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    recovery: dict[str, list[float]] = {kind: [] for kind, _ in PHASES}
    replacement_start: list[float] = []  # --fresh: kill -> the new TaskManager registered
    runs = []
    with tempfile.TemporaryDirectory(prefix="funke-chaos-stream-") as tmp:
        root = Path(tmp)
        cluster = FreshCluster(root / "cluster") if args.fresh else StreamCluster(root / "cluster")
        client = cluster.client
        try:
            for n in range(1, args.runs + 1):
                cluster.restore()
                out, checkpoint = root / f"out-{n}", root / f"checkpoint-{n}"
                slow = root / "slow"
                slow.write_text(str(args.row_delay))
                job_id = client.submit(rate_job(f"chaos stream {n}", out, checkpoint, rows_per_second=args.rows_per_second,
                                                slow_marker=slow, trigger="1 s").build())
                events = Events(client, job_id)
                batch = events.wait("BatchCompleted", timeout=180)
                kills = 0
                for _ in range(args.kills_per_phase):
                    for kind, _ in PHASES:
                        # from a query that keeps up: what recovery costs, not the backlog of a
                        # cold start or of the kill before
                        batch = max(batch, caught_up(client, job_id))
                        batch = events.wait(kind, min_batch=batch + 1, timeout=180)
                        victim = task_managers_of(client, job_id)[0]
                        killed_at = time.time()
                        localcluster.kill(cluster.dir, victim)
                        kills += 1
                        if args.fresh:  # the query cannot run again before it has registered
                            cluster.add_taskmanager()
                            replacement_start.append(time.time() - killed_at)
                        batch = events.wait_recovered(timeout=300)
                        recovery[kind].append(time.time() - killed_at)
                        if not args.fresh:
                            cluster.add_taskmanager()
                client.stop(job_id, timeout_s=120)
                status = wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED"))
                events.drain()
                figures = {"run": n, "status": status, "kills": kills, **tally(out, checkpoint)}
                runs.append(figures)
                print(json.dumps(figures), flush=True)
        finally:
            client.close()
            localcluster.stop(cluster.dir)
    print()
    print(f"recovery onto {'a TaskManager started after the kill (fresh)' if args.fresh else 'running TaskManagers (warm)'}")
    print(f"{'phase killed at':28} {'kills':>5} {'recovery median s':>18} {'max s':>7}")
    for kind, times in recovery.items():
        if times:
            print(f"{kind:28} {len(times):5d} {statistics.median(times):18.2f} {max(times):7.2f}")
    every = [t for times in recovery.values() for t in times]
    print(f"{'all':28} {len(every):5d} {statistics.median(every):18.2f} {max(every):7.2f}")
    if replacement_start:
        print(f"{'  of which: new TaskManager':28} {len(replacement_start):5d} {statistics.median(replacement_start):18.2f} "
              f"{max(replacement_start):7.2f}   (kill -> registered, its SparkSession up)")
    total = {k: sum(r[k] for r in runs) for k in ("kills", "rows_expected", "rows_found", "duplicates", "lost", "beyond")}
    finished = sum(r["status"] == "FINISHED" for r in runs)
    print(f"runs {len(runs)}, FINISHED {finished}; kills {total['kills']}; rows expected {total['rows_expected']}, "
          f"found {total['rows_found']}, duplicates {total['duplicates']}, lost {total['lost']}, "
          f"beyond the committed offsets {total['beyond']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": "fresh" if args.fresh else "warm", "runs": runs,
                                               "recovery_s": recovery, "replacement_start_s": replacement_start,
                                               "total": total}, indent=2))
    ok = finished == len(runs) and total["duplicates"] == total["lost"] == total["beyond"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
