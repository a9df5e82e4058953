"""Graceful stop under a backlog: how long `funke stop` and `funke stop --drain` take when a
streaming query's processing falls behind its trigger.

    python tests/benchmarks/bench_stop_backlog.py [--rate 100] [--row-ms 4] [--trigger-ms 500]
                                                  [--backlog-seconds 15] [--json FILE]

A local cluster of one TaskManager with two slots. The query: a rate source (--rate rows a
second) -> a Python map that waits --row-ms per row -> Parquet, parallelism 1, a --trigger-ms
processing-time trigger: every batch costs its fixed overhead (tasks, Spark, the commit) plus
its rows, so batches of one interval's rows fall behind the trigger, while batches that take
everything available keep up. After the first batch the query runs --backlog-seconds, then the
`funke stop` CLI is run (as a user would, in a process of its own) and timed until it returns;
then a second query, the same, is stopped with `--drain`.

Printed per mode: the batches logged and not committed when the stop came (read from the
checkpoint), the batches committed during the stop, the seconds `funke stop` took, the status
it reported and its exit code, and the batches the next run would run again (logged and not
committed after the stop). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def slow_map(row_ms: float):
    def through(value):
        time.sleep(row_ms / 1000)
        return value
    return through


def backlog_job(name: str, rate: int, row_ms: float, trigger_ms: int, out: Path, checkpoint: Path):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(name, parallelism=1)
    env.read_stream.rate(rate).select("value").map(slow_map(row_ms), schema="value bigint").write_parquet(str(out))
    env.set_trigger(f"{trigger_ms} ms").set_checkpoint_location(str(checkpoint))
    return env.build()


def logs(checkpoint: Path) -> tuple[list[int], list[int]]:
    """(offset log ids, commit log ids) of a checkpoint."""
    def ids(d: Path) -> list[int]:
        return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if d.is_dir() else []
    return ids(checkpoint / "offsets"), ids(checkpoint / "commits")


def measure(client, info, args, root: Path, drain: bool) -> dict:
    from funke.deploy.client import job_status_name

    mode = "stop --drain" if drain else "stop"
    checkpoint, out = root / f"ck-{int(drain)}", root / f"out-{int(drain)}"
    job_id = client.submit(backlog_job(f"backlog {mode}", args.rate, args.row_ms, args.trigger_ms, out, checkpoint))
    deadline = time.time() + 180
    while not client.progress(job_id):
        if time.time() > deadline:
            raise SystemExit(f"job {job_id} committed no batch within 180 s: {client.get_job(job_id)}")
        time.sleep(0.2)
    time.sleep(args.backlog_seconds)
    offsets, commits = logs(checkpoint)
    ahead = len(set(offsets) - set(commits))
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(info.dir))
    command = [sys.executable, "-m", "funke.deploy.cli", "stop", job_id, "--jobmanager", info.address,
               "--timeout", str(args.stop_timeout)] + (["--drain"] if drain else [])
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    took = time.monotonic() - began
    status = job_status_name(client.get_job(job_id).status)
    offsets_after, commits_after = logs(checkpoint)
    said = next((line for line in done.stdout.splitlines() if line.startswith(f"job {job_id}: ")), "")
    return {"mode": mode, "logged_ahead_at_stop": ahead, "committed_before_stop": len(commits),
            "committed_during_stop": len(set(commits_after) - set(commits)), "stop_seconds": round(took, 1),
            "status": status, "exit_code": done.returncode,
            "left_for_next_run": len(set(offsets_after) - set(commits_after)),
            "cli_said": said.partition(": ")[2]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=100, help="rows a second (default 100)")
    p.add_argument("--row-ms", type=float, default=4.0, help="the map's time per row in ms (default 4)")
    p.add_argument("--trigger-ms", type=int, default=500, help="the trigger interval in ms (default 500)")
    p.add_argument("--backlog-seconds", type=float, default=15.0, help="how long the query runs before the stop (default 15)")
    p.add_argument("--stop-timeout", type=float, default=600.0, help="funke stop --timeout (default 600)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    import cloudpickle

    from funke.deploy import localcluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results = []
    with tempfile.TemporaryDirectory(prefix="funke-bench-stop-") as tmp:
        root = Path(tmp)
        info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, 2))
        client = info.client(timeout=600)
        try:
            for drain in (False, True):
                r = measure(client, info, args, root, drain)
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
        finally:
            client.close()
            localcluster.stop(root / "cluster")
    print(f"rate {args.rate} rows/s, {args.row_ms:g} ms a row, {args.trigger_ms} ms trigger, "
          f"stopped after {args.backlog_seconds:g} s")
    print(f"{'mode':14} {'logged ahead':>12} {'committed during stop':>21} {'seconds':>8} {'status':>9} "
          f"{'exit':>4} {'left for next run':>17}")
    for r in results:
        print(f"{r['mode']:14} {r['logged_ahead_at_stop']:>12} {r['committed_during_stop']:>21} "
              f"{r['stop_seconds']:>8} {r['status']:>9} {r['exit_code']:>4} {r['left_for_next_run']:>17}")
        print(f"  the CLI said: {r['cli_said']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
