"""Cold start: the README's first command, `python3 deploy/dev.py demo`, timed step by step.

    python tests/benchmarks/bench_coldstart.py [--runs 5] [--json FILE]

Each run is the whole command in a process of its own (a fresh local cluster of a JobManager
and 2 TaskManagers x 2 slots, the word count, the check, the cluster's stop), as a user runs it
once the setup is done. The demo prints where its wall time went; this collects, over the runs, the
median, min and max of: the cluster's start (every TaskManager registered), the latest Spark
session ready, the word count from submission to the result in hand, the demo's own wall time
and the whole command's (with the setup check and the cluster's stop); and
the machine's load average before each run (on a shared machine the figures move with it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CLUSTER = re.compile(r"^  cluster start: ([\d.]+) s")
TASKMANAGER = re.compile(r"^  (\S+): process started ([\d.]+|-)( s)?, Spark session ready ([\d.]+|-)( s)?, registered ([\d.]+) s")
JOB = re.compile(r"^  job: .*result checked ([\d.]+) s \(([\d.]+) s from submission to result\)")
WALL = re.compile(r"^wall time: ([\d.]+) s in all")


def parse(output: str) -> dict[str, float]:
    """The demo's figures from its output (seconds since the demo started)."""
    figures: dict[str, float] = {}
    spark_ready = []
    for line in output.splitlines():
        if m := CLUSTER.match(line):
            figures["cluster_start_s"] = float(m.group(1))
        elif m := TASKMANAGER.match(line):
            if m.group(4) != "-":
                spark_ready.append(float(m.group(4)))
        elif m := JOB.match(line):
            figures["job_s"] = float(m.group(2))
            figures["demo_s"] = float(m.group(1))
        elif (m := WALL.match(line)) and "demo_s" not in figures:
            figures["demo_s"] = float(m.group(1))
    if spark_ready:
        figures["spark_ready_s"] = max(spark_ready)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    runs = []
    for n in range(1, args.runs + 1):
        load = os.getloadavg()[0]
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(REPO / "deploy" / "dev.py"), "demo"], cwd=REPO, capture_output=True,
                              text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        figures = parse(done.stdout)
        if done.returncode != 0 or "demo_s" not in figures:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"run {n}: the demo failed (exit {done.returncode})")
        figures.update(run=n, load=round(load, 2), process_s=round(time.monotonic() - started, 2))
        runs.append(figures)
        print(json.dumps(figures), flush=True)
    print()
    print(f"{'step (seconds since the demo started)':40} {'median':>7} {'min':>7} {'max':>7}")
    summary = {}
    for key, label in (("cluster_start_s", "cluster start (2 TaskManagers registered)"),
                       ("spark_ready_s", "latest Spark session ready"),
                       ("job_s", "word count: submission -> result"),
                       ("demo_s", "the demo's wall time (to the result)"),
                       ("process_s", "the whole command (and the stop)")):
        values = [r[key] for r in runs if key in r]
        if values:
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            print(f"{label:40} {summary[key]['median']:7.2f} {min(values):7.2f} {max(values):7.2f}")
    loads = [r["load"] for r in runs]
    print(f"load average before the runs: {min(loads):.2f} - {max(loads):.2f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
