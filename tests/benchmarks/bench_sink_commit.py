"""A streaming file sink's commit (jobmanager/streamsinks.py) as its target fills up.

    python tests/benchmarks/bench_sink_commit.py [--files 1000 100000] [--commits 30]

A query's file sink adds a file per subtask and batch to its target: 864 000 a day at a 100 ms
trigger. For each --files, a target holding that many committed files, then --commits commits of
one staged file each, timed (p50, ms): as the first commit of a run does (the target listed for an
interrupted commit's files) and as every later one does (not listed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from funke.jobmanager import streamsinks


def commit_p50_ms(files: int, commits: int, leftovers: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="funke-bench-commit-") as tmp:
        target = os.path.join(tmp, "out")
        os.makedirs(target)
        for i in range(files):
            open(os.path.join(target, f"batch-{i}-0-part-00000.parquet"), "wb").close()
        times = []
        for batch in range(files, files + commits):
            staged = streamsinks.staging_dir(target, "job", batch, 0, 0)
            os.makedirs(staged)
            open(os.path.join(staged, "part-00000.parquet"), "wb").close()
            began = time.perf_counter()
            streamsinks.commit_batch(target, "job", batch, {0: 0}, leftovers=leftovers)
            times.append((time.perf_counter() - began) * 1000.0)
        return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, nargs="+", default=[1000, 100_000])
    p.add_argument("--commits", type=int, default=30)
    args = p.parse_args()
    if any(n < 0 for n in args.files) or args.commits < 1:
        p.error("--files must be 0 or more and --commits positive")
    print(f"{'files in target':>16} {'listed (first commit of a run)':>32} {'not listed (the others)':>25}")
    for files in args.files:
        listed, unlisted = commit_p50_ms(files, args.commits, True), commit_p50_ms(files, args.commits, False)
        print(f"{files:>16,} {listed:>29.2f} ms {unlisted:>22.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
