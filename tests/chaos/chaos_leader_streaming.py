"""A paused leader under a streaming query: how long from the SIGSTOP of the leading JobManager to
the first batch committed under the new leader, and whether the woken leader writes anything.

    python tests/chaos/chaos_leader_streaming.py [--rounds 3] [--backend filesystem|zookeeper]

Starts a local cluster with high availability (two JobManagers, two TaskManagers with PySpark)
and, --rounds times, runs `paused_leader_streaming` of tests/integration/test_high_availability.py:
a streaming query (rate source -> Parquet, 500 ms trigger, a checkpoint) commits three batches;
the leader is paused with SIGSTOP (by the pid the cluster recorded) and stays paused while the
standby is elected (the lease expires: 3 s on the file system; ZooKeeper expires the session),
recovers the job and takes the query's checkpoint over (its lease, by the higher leader epoch)
and commits three batches; then the old leader is woken (SIGCONT), must write nothing to the
checkpoint or the sink while three more batches commit, the query is stopped, and the sink must
hold every row of the committed batches exactly once. The woken leader stays as the next round's
standby.

Prints per round the seconds from the SIGSTOP to the new leader's lease, to the job RUNNING
under it, and to the first batch committed under it (its commit entry's time, the JobManager's
clock on this host); then the median and max. Round 1 is cold: the cluster's first query, and
the TaskManagers' first batch of it after the take-over starts new Python workers; later rounds
run on TaskManagers that already ran the query's tasks (warm). Exits 1 if a round fails.
Processes are signalled by the PIDs the cluster recorded; nothing else is touched.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.deploy import localcluster  # noqa: E402
from tests.integration.test_high_availability import HaCluster, paused_leader_streaming  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("filesystem", "zookeeper"), default="filesystem")
    args = parser.parse_args()
    options = {"high-availability.zookeeper.client.session-timeout": "3 s"} if args.backend == "zookeeper" else None
    failed = 0
    figures: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="funke-chaos-leader-stream-") as tmp:
        cluster = HaCluster(Path(tmp) / "cluster", backend=args.backend, ha_options=options)
        try:
            for i in range(1, args.rounds + 1):
                cluster.restore()
                work = Path(tmp) / f"round-{i}"
                work.mkdir()
                try:
                    f = paused_leader_streaming(cluster, work)
                except Exception:  # noqa: BLE001 (a failed round is reported and counted)
                    failed += 1
                    print(f"round {i}: FAILED\n{traceback.format_exc()}", flush=True)
                    continue
                figures.append(f)
                print(f"round {i} ({'cold' if i == 1 else 'warm'}): new leader after {f['elected']:.2f} s, "
                      f"query RUNNING after {f['running']:.2f} s, first batch committed under the new leader "
                      f"after {f['first_commit']:.2f} s; {f['batches']:.0f} batches, {f['rows']:.0f} rows, "
                      f"0 duplicates, 0 lost; the woken leader's refused checkpoint writes logged: "
                      f"{f['refused']:.0f}; the job's failures: {f['failures'] or 'none'}", flush=True)
        finally:
            cluster.client.close()
            localcluster.stop(cluster.dir)
    if figures:
        for key, what in (("elected", "new leader"), ("running", "query RUNNING"),
                          ("first_commit", "first batch committed under the new leader")):
            values = [f[key] for f in figures]
            print(f"SIGSTOP -> {what}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
                  f"({len(values)} rounds, {args.backend})")
    print(f"{len(figures)} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
