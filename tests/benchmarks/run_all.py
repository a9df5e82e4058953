"""The benchmark suite: one command, one table, one JSON file.

    python3 deploy/dev.py bench [--quick] [--update-docs]

Runs, each in its own process, on this machine:
  bench_scheduler.py   scheduler scale (sans-IO core), source -> sink ALL_TO_ALL, P = 4 000 and 10 000,
                       and P = 100 000 once (not with --quick)
  bench_deploy.py      deploying 2 x P no-op tasks to 4 TaskManager processes over gRPC, and 200 000
                       (P = 100 000, BLOCKING) to 8 once (not with --quick)
  bench_wordcount.py   word count over >= 512 MiB, funke vs plain PySpark, same cores
  bench_latency.py     submit -> RUNNING / FINISHED on a warm cluster
  bench_coldstart.py   cold start: `deploy/dev.py demo` step by step (cluster start, word count, whole command)
  bench_streaming.py   streaming: batch durations and sustained rate, funke vs Structured Streaming
  chaos_wordcount.py   kill -9 of a TaskManager -> restarted tasks RUNNING again
  chaos_streaming.py   streaming: kill -9 of a TaskManager at every phase of a batch -> exactly once, recovery
                       onto running TaskManagers (warm) and, with --fresh, onto one started after the kill
  bench_receivers.py   receivers: lines/s a socket receiver and the seed's word count sustain
  chaos_sources.py     socket and Redis Streams sources: kill -9 -> lines / entries lost or repeated
  chaos_leader.py      kill -9 of the leading JobManager (high availability) -> new leader, job RUNNING;
                       on ZooKeeper too, and a paused leader (SIGSTOP, kept paused until the job
                       ended, then woken) replaced by session expiry
then prints the figures beside the goals and Flink's published scheduler figures, and writes all
of it to .funke/bench/results-<time>.json. --update-docs puts the table into docs/benchmarks.md.
--quick: fewer runs and a smaller corpus, to try the suite out (figures not comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / ".funke" / "bench"
DOCS_PAGE = REPO / "docs" / "benchmarks.md"  # the table goes between its <!-- benchmarks:begin/end --> markers

# Flink's published figures for source -> sink ALL_TO_ALL at P = 10 000
# ("Scheduler Performance Improvements in Flink 1.14", flink.apache.org).
FLINK = {
    "job initialization": {"1.14": "627 ms", "1.12": "11 431 ms"},
    "task deployment": {"1.14": "17 183 ms", "1.12": "63 118 ms"},
    "regions to restart": {"1.14": "170 ms", "1.12": "37 195 ms"},
}


def run(script: Path, args: list[str], json_path: Path) -> object:
    print(f"== {script.name} {' '.join(args)}", file=sys.stderr, flush=True)
    started = time.time()
    subprocess.run([sys.executable, str(script), *args, "--json", str(json_path)], check=True, cwd=REPO)
    print(f"   ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    return json.loads(json_path.read_text())


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}, {java}"


def table(results: dict) -> str:
    sched = {(r["p"], r["result_partition_type"], r["step"]): r
             for r in [*results["scheduler"], *results.get("scheduler_large", [])]}
    # the goals of the scheduler's steps per P (issue figures: Flink's large batch jobs run P = 100 000)
    goals = {(10000, "job initialization"): "≤ 500 ms", (100000, "job initialization"): "≤ 2 s, ≤ 300 MiB",
             (10000, "regions to restart"): "≤ 50 ms", (100000, "regions to restart"): "≤ 50 ms",
             (10000, "schedule all subtasks"): "≤ 300 ms", (100000, "schedule all subtasks"): "≤ 3 s",
             (10000, "global failover"): "≤ 300 ms", (100000, "global failover"): "≤ 3 s"}
    deploy = {(r["p"], r.get("task_managers", 4), r["result_partition_type"]): r
              for r in results["deploy"] + results.get("deploy_large", [])}
    wc, latency, chaos = results["wordcount"], results["latency"], results["chaos"]

    def ms(x: float) -> str:
        return f"{x:,.0f} ms".replace(",", " ") if x >= 10 else f"{x:.1f} ms"

    def median(xs: list[float]) -> float:
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else float("nan")

    lines = [
        "| measurement | funke | goal | Flink 1.14 | Flink 1.12 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in sorted({k[0] for k in sched}):
        for kind in ("BLOCKING", "PIPELINED"):
            init = sched[(p, kind, "job initialization")]
            lines.append(f"| job initialization (graph + regions + slot plan), P={p}, {kind} | "
                         f"{ms(init['median_ms'])}, {init['peak_mib']:.0f} MiB | "
                         f"{goals.get((p, 'job initialization'), '')} | {FLINK['job initialization']['1.14'] if p == 10000 else ''} | "
                         f"{FLINK['job initialization']['1.12'] if p == 10000 else ''} |")
    for p in sorted({k[0] for k in sched}):
        for kind in ("BLOCKING", "PIPELINED"):
            r = sched[(p, kind, "regions to restart")]
            lines.append(f"| regions to restart (one sink fails), P={p}, {kind} | {ms(r['median_ms'])} | "
                         f"{goals.get((p, 'regions to restart'), '')} | {FLINK['regions to restart']['1.14'] if p == 10000 else ''} | "
                         f"{FLINK['regions to restart']['1.12'] if p == 10000 else ''} |")
    for p in sorted({k[0] for k in sched}):
        for kind in ("BLOCKING", "PIPELINED"):
            for step in ("build ExecutionGraph", "schedule all subtasks", "global failover"):
                r = sched[(p, kind, step)]
                lines.append(f"| {step}, P={p}, {kind} | {ms(r['median_ms'])}, {r['peak_mib']:.0f} MiB | "
                             f"{goals.get((p, step), '')} |  |  |")
    deploy_goals = {10000: "≤ 8 s", 100000: "≤ 30 s"}
    for (p, task_managers, kind), r in sorted(deploy.items()):
        rate = f"{r['tasks_per_s']:,.0f}".replace(",", " ")
        lines.append(f"| deploy {r['tasks']} no-op tasks to {task_managers} TaskManagers (gRPC) until FINISHED, {kind} | "
                     f"{r['median_s']:.2f} s ({rate} tasks/s) | {deploy_goals.get(p, '')} | "
                     f"{FLINK['task deployment']['1.14'] if p == 10000 else ''} | {FLINK['task deployment']['1.12'] if p == 10000 else ''} |")
    lines.append(f"| word count {wc['corpus_mib']} MiB, {wc['cores']} cores: funke / plain PySpark | "
                 f"{wc['funke_median_s']:.1f} s / {wc['pyspark_median_s']:.1f} s = **{wc['ratio']:.2f}×** | ≤ 1.15× |  |  |")
    for r in latency:
        lines.append(f"| {r['job']}: submit → RUNNING / FINISHED (warm cluster) | "
                     f"{ms(r['submit_to_running_ms'])} / {ms(r['submit_to_finished_ms'])} | "
                     f"{'≤ 200 ms' if 'one-vertex' in r['job'] else ''} |  |  |")
    cold = (results.get("coldstart") or {}).get("summary")
    if cold:
        lines.append(f"| cold start, `deploy/dev.py demo` (2 TaskManagers × 2 slots, setup done): cluster start / word count "
                     f"(submission → result) / whole command, medians | {cold['cluster_start_s']['median']:.1f} s / "
                     f"{cold['job_s']['median']:.1f} s / {cold['process_s']['median']:.1f} s | ≤ 8 s / ≤ 5 s / ≤ 15 s |  |  |")
    lines.append(f"| TaskManager kill -9 → first restarted task RUNNING ({chaos['runs']} runs, restart delay {chaos['restart_delay']}) | "
                 f"median {median(chaos['kill_to_first_restarted_running_s']):.2f} s | ≤ 3 s | detection alone: heartbeat.timeout 50 s |  |")
    lines.append(f"| TaskManager kill -9 → every failed task RUNNING again (incl. recomputing lost partitions) | "
                 f"median {median(chaos['kill_to_all_failed_running_s']):.2f} s |  |  |  |")
    lines.append(f"| chaos runs: finished / identical output | {chaos['finished']} / {chaos['identical']} of {chaos['runs']} | all |  |  |")
    lines += streaming_rows(results.get("streaming"), results.get("chaos_streaming"), results.get("chaos_streaming_fresh"))
    lines += source_rows(results.get("receivers"), results.get("chaos_sources"))
    lines += leader_rows(results["leader"], "filesystem", "kill -9", "≤ 5 s")
    lines += leader_rows(results["leader_zookeeper"], "ZooKeeper", "kill -9", "≤ 8 s")
    lines += leader_rows(results["leader_zookeeper_pause"], "ZooKeeper", "SIGSTOP (session expiry, 6 s)", "≤ 8 s",
                         "`chaos_leader.py --backend zookeeper --kills 10 --pause`: paused until its job ended")
    return "\n".join(lines)


def thousands(n: int) -> str:
    """12 345 678, as the table writes large numbers."""
    return f"{n:,}".replace(",", " ")


def streaming_rows(bench: dict | None, chaos: dict | None, chaos_fresh: dict | None = None) -> list[str]:
    lines = []
    if bench:
        st = bench["structured"]
        for par, side in sorted(bench["funke"].items(), key=lambda kv: int(kv[0])):
            for key, f in side.get("latency", {}).items():
                s = st["latency"][key]
                trigger = (f"100ms trigger after the query ran {bench['settle_s']:g} s" if key.endswith("settled")
                           else f"{key} trigger")
                lines.append(f"| streaming batch duration p50 / p99, 1 000 rows/s, {trigger}: funke (parallelism {par}) "
                             f"vs Structured Streaming | {f['p50_ms']:.0f} / {f['p99_ms']:.0f} ms vs {s['p50_ms']:.0f} / "
                             f"{s['p99_ms']:.0f} ms = **{f['p50_ratio']:.2f}×** | ≤ 1.3× |  |  |")
            ratio = side["throughput_ratio"]
            shown = f"**{ratio:.2f}×**" if ratio is not None else "no ratio (Structured Streaming kept up with none)"
            top = bench.get("sweep_top")

            def at_least(best: int) -> str:  # keeping up with the sweep's top rate: that much or more
                return f"≥ {thousands(best)}" if best == top else thousands(best)

            lines.append(f"| streaming sustained rate, 1 s trigger, {bench['cores']} cores: funke (parallelism {par}) / "
                         f"Structured Streaming | {at_least(side['sustained_rows_per_s'])} / "
                         f"{at_least(st['sustained_rows_per_s'])} rows/s = {shown} | ≥ 0.9× |  |  |")
    if chaos:
        every = [t for times in chaos["recovery_s"].values() for t in times]
        lines.append(f"| streaming: TaskManager kill -9 → first batch committed after recovery, onto TaskManagers already "
                     f"running (warm: SparkSession up) ({len(every)} kills) | "
                     f"median {statistics.median(every):.2f} s, max {max(every):.2f} s |  |  |  |")
    if chaos_fresh:
        every = [t for times in chaos_fresh["recovery_s"].values() for t in times]
        start = chaos_fresh.get("replacement_start_s") or []
        started = (f" (of which the new TaskManager's start: median {statistics.median(start):.2f} s)" if start else "")
        lines.append(f"| streaming: TaskManager kill -9 → first batch committed after recovery, onto a TaskManager started "
                     f"after the kill (fresh: its SparkSession and the query's first batch count) ({len(every)} kills) | "
                     f"median {statistics.median(every):.2f} s, max {max(every):.2f} s{started} |  |  |  |")
    runs = [c for c in (chaos, chaos_fresh) if c]
    if runs:
        t = {k: sum(c["total"][k] for c in runs) for k in ("rows_expected", "duplicates", "lost")}
        lines.append(f"| streaming exactly once through kills at every phase of a batch: rows expected / duplicates / lost | "
                     f"{t['rows_expected']} / {t['duplicates']} / {t['lost']} | 0 duplicates, 0 lost |  |  |")
    return lines


def source_rows(bench: dict | None, chaos: dict | None) -> list[str]:
    """Receivers (bench_receivers.py) and the kill runs of the socket and Redis sources (chaos_sources.py)."""
    lines = []
    what = {"receive": "socket receiver → discard (every block read)", "wordcount": "the seed's socket word count"}
    for query, r in (bench or {}).get("queries", {}).items():
        best = r["at_sustained"]
        at = f" (batch p50 / p99 {best['p50_ms']:.0f} / {best['p99_ms']:.0f} ms)" if best else ""
        best_rate = r["sustained_lines_per_s"]
        shown = f"≥ {thousands(best_rate)}" if best_rate == bench.get("sweep_top") else thousands(best_rate)
        lines.append(f"| {what.get(query, query)}: lines/s sustained, 1 s trigger, {bench['cores']} cores | "
                     f"{shown}{at} |  |  |  |")
    socket_runs = (chaos or {}).get("socket") or []
    if socket_runs:
        t = {k: sum(run[k] for run in socket_runs) for k in ("sent", "stored", "counted", "duplicates",
                                                              "stored_not_counted", "lost_in_flight")}
        lines.append(f"| socket word count, kill -9 of the receiver's and of a counting TaskManager ({len(socket_runs)} runs, "
                     f"{2 * len(socket_runs)} kills): lines stored / counted / counted twice / stored but not counted "
                     f"(lost in flight, never stored) | {t['stored']} / {t['counted']} / {t['duplicates']} / "
                     f"{t['stored_not_counted']} ({t['lost_in_flight']} of {t['sent']} sent) | 0 twice, 0 not counted |  |  |")
    redis_runs = (chaos or {}).get("redis") or []
    if redis_runs:
        t = {k: sum(run[k] for run in redis_runs) for k in ("kills", "committed", "file_duplicates", "file_lost",
                                                             "redis_duplicates", "redis_lost")}
        lines.append(f"| Redis Streams → Parquet and → Redis, kill -9 at every phase of a batch ({len(redis_runs)} runs, "
                     f"{t['kills']} kills): entries / duplicates / lost, file sink; Redis sink | {t['committed']} / "
                     f"{t['file_duplicates']} / {t['file_lost']}; {t['redis_duplicates']} / {t['redis_lost']} | "
                     f"0 duplicates, 0 lost |  |  |")
    return lines


def leader_rows(leader: dict, backend: str, fault: str, goal: str, how: str = "") -> list[str]:
    e, r = leader["elected_s"], leader["running_again_s"]
    how = f" ({how})" if how else ""

    def figures(f: dict) -> str:
        return (f"min {f['min']:.2f} s, " if "min" in f else "") + f"median {f['median']:.2f} s, max {f['max']:.2f} s"

    rows = [
        f"| HA ({backend}): leader {fault}{how} → new leader elected ({leader['kills']} times) | "
        f"{figures(e)} |  | ZooKeeper session timeout: 40–60 s |  |",
        f"| HA ({backend}): leader {fault} → job RUNNING again | {figures(r)} | "
        f"{goal} | 20–60 s (defaults) |  |",
        f"| HA ({backend}, {fault}): jobs FINISHED with identical output / finished subtasks re-run | "
        f"{leader['identical']} of {leader['kills']} / {leader['finished_subtasks_rerun']} of "
        f"{leader['finished_subtasks_before_kill']} | all / 0 |  |  |",
    ]
    if "woken_leaders_acting_on_a_stale_view" in leader:
        rows.append(f"| HA ({backend}, {fault}): woken leaders that wrote TaskManagers off before seeing they "
                    f"were deposed | {leader['woken_leaders_acting_on_a_stale_view']} of {leader['kills']} | 0 |  |  |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer runs, smaller inputs (to try the suite)")
    p.add_argument("--update-docs", action="store_true", help=f"put the table into {DOCS_PAGE.relative_to(REPO)}")
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    quick = args.quick
    results = {
        "machine": machine(),
        "scheduler": run(HERE / "bench_scheduler.py", ["--runs", "2" if quick else "5"], OUT / f"scheduler-{stamp}.json"),
        # P = 100 000 (the size of Flink's large batch jobs): one run, a few minutes with its memory pass
        "scheduler_large": [] if quick else run(HERE / "bench_scheduler.py", ["--p", "100000", "--runs", "1"],
                                                 OUT / f"scheduler-large-{stamp}.json"),
        "deploy": run(HERE / "bench_deploy.py", ["--runs", "1" if quick else "3"], OUT / f"deploy-{stamp}.json"),
        "deploy_large": [] if quick else run(HERE / "bench_deploy.py", ["--p", "100000", "--task-managers", "8", "--types",
                                                                         "BLOCKING", "--runs", "1"],
                                             OUT / f"deploy-large-{stamp}.json"),
        "wordcount": run(HERE / "bench_wordcount.py", ["--mb", "64" if quick else "512", "--runs", "1" if quick else "3"],
                         OUT / f"wordcount-{stamp}.json"),
        "latency": run(HERE / "bench_latency.py", ["--runs", "3" if quick else "5"], OUT / f"latency-{stamp}.json"),
        "coldstart": run(HERE / "bench_coldstart.py", ["--runs", "3" if quick else "5"], OUT / f"coldstart-{stamp}.json"),
        "chaos": run(REPO / "tests" / "chaos" / "chaos_wordcount.py", ["--runs", "3" if quick else "10"],
                     OUT / f"chaos-{stamp}.json"),
        "streaming": run(HERE / "bench_streaming.py", ["--seconds", "8" if quick else "12"], OUT / f"streaming-{stamp}.json"),
        "chaos_streaming": run(REPO / "tests" / "chaos" / "chaos_streaming.py", ["--runs", "1" if quick else "3"],
                               OUT / f"chaos-streaming-{stamp}.json"),
        "chaos_streaming_fresh": run(REPO / "tests" / "chaos" / "chaos_streaming.py",
                                     ["--fresh", "--runs", "1" if quick else "3"], OUT / f"chaos-streaming-fresh-{stamp}.json"),
        "receivers": run(HERE / "bench_receivers.py", ["--seconds", "8" if quick else "15"],
                         OUT / f"receivers-{stamp}.json"),
        "chaos_sources": run(REPO / "tests" / "chaos" / "chaos_sources.py", ["--runs", "1" if quick else "3"],
                             OUT / f"chaos-sources-{stamp}.json"),
        "leader": run(REPO / "tests" / "chaos" / "chaos_leader.py", ["--kills", "3" if quick else "20"],
                      OUT / f"leader-{stamp}.json"),
        "leader_zookeeper": run(REPO / "tests" / "chaos" / "chaos_leader.py",
                                ["--backend", "zookeeper", "--kills", "3" if quick else "10"],
                                OUT / f"leader-zookeeper-{stamp}.json"),
        "leader_zookeeper_pause": run(REPO / "tests" / "chaos" / "chaos_leader.py",
                                      ["--backend", "zookeeper", "--pause", "--kills", "3" if quick else "10"],
                                      OUT / f"leader-zookeeper-pause-{stamp}.json"),
    }
    results["table"] = table(results)
    path = OUT / f"results-{stamp}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"\nfunke benchmarks on {results['machine']}\n")
    print(results["table"])
    print(f"\nall figures: {path}")
    if args.update_docs:
        update_docs(DOCS_PAGE, results["machine"], time.strftime("%Y-%m-%d"), results["table"])
        print(f"{DOCS_PAGE} updated")
    return 0


def update_docs(page: Path, machine: str, date: str, table: str) -> None:
    """Put the suite's table between the page's <!-- benchmarks:begin/end --> markers."""
    text = page.read_text()
    block = (f"<!-- benchmarks:begin -->\nMeasured on {machine}, {date}, with `python3 deploy/dev.py bench`:\n\n"
             f"{table}\n<!-- benchmarks:end -->")
    text, n = re.subn(r"<!-- benchmarks:begin -->.*?<!-- benchmarks:end -->", lambda _: block, text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{page} has no <!-- benchmarks:begin/end --> markers")
    page.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
