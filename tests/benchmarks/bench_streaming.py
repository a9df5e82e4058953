"""Streaming: funke's micro-batches vs. plain Structured Streaming, the same query on the same cores.

    python tests/benchmarks/bench_streaming.py [--cores 2] [--seconds 12] [--settle 50] [--json FILE]

The query: a rate source -> a Python function per row (value -> value, bucket, doubled) -> a
per-batch aggregate by bucket (count, sum) -> Parquet.
  funke:      a local cluster of one TaskManager with --cores slots (Spark local[cores]), at each
              --parallelism (default 1 and --cores: one subtask per vertex, whose Spark work
              spreads over the TaskManager's cores, and one per slot);
              `map` then `key_by("bucket").per_batch().aggregate(...)`, `write_parquet`; at
              parallelism 1 one vertex (no exchange between single subtasks), or two with
              --keep-exchange;
  Structured: one process, local[cores], `readStream.format("rate")` -> `mapInArrow` with the
              same function -> `foreachBatch` that aggregates the batch and appends Parquet
              (Structured Streaming's way to aggregate per batch).
Each configuration runs for --seconds, one side after the other (never both at once); the first
3 batches are warm-up and not counted. Printed per side:
  - batch duration p50/p99 (durationMs.triggerExecution of the progress records) at 1 000 rows/s
    with a 100 ms and a 1 s trigger, and the ratio funke / Structured;
  - the same at the 100 ms trigger once the query has run for --settle seconds ("settled"; 0: not
    measured): a new query's batches get faster over its first 30-50 s, as the JVM compiles
    what they run (the same with HotSpot's default compiler thresholds instead of the
    TaskManager's), so the first seconds do not show the query's steady state; the batches
    counted are those that begin after the settling time, on both sides;
  - where a batch's time goes (p50 of each part of durationMs), and for funke where its addBatch
    goes, vertex by vertex (the records' vertexDurationsMs): when the vertex's tasks were sent the
    batch and when its last report came back (ms from the batch's first dispatch), how long its
    slowest subtask ran the batch (TaskIo.seconds: planning, Spark jobs, exchange files), and the
    rest (RPC hops, the wait for a task thread);
  - sustained throughput: the highest rate of the sweep each keeps up with at a 1 s trigger
    (median batch duration <= the interval, and for funke no batch waiting longer than one
    interval behind another), and the ratio funke / Structured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WARM_UP_BATCHES = 3
SETTLED = "100ms settled"  # the latency key of the 100 ms trigger measured after --settle seconds
SWEEP = (10_000, 50_000, 100_000, 200_000, 400_000, 600_000, 800_000, 1_000_000, 1_250_000, 1_600_000, 2_000_000,
         2_500_000, 3_200_000, 4_000_000)


def bucketed(value):
    """The Python function both sides run per row."""
    return (value, value % 64, value * 2)


STRUCTURED_PROGRAM = r"""
import json, os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
cores, root = int(sys.argv[1]), sys.argv[2]
from pyspark.sql import SparkSession, functions as F
import pyarrow as pa
spark = (SparkSession.builder.master(f"local[{cores}]").appName("plain structured streaming")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(cores)).config("spark.scheduler.mode", "FAIR")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
SCHEMA = pa.schema([("value", pa.int64()), ("bucket", pa.int32()), ("doubled", pa.int64())])
def bucketed(value):
    return (value, value % 64, value * 2)
def per_row(batches):
    for batch in batches:
        rows = [bucketed(v) for v in batch.column(0).to_pylist()]
        yield pa.RecordBatch.from_pylist([dict(zip(("value", "bucket", "doubled"), r)) for r in rows], schema=SCHEMA)
print("READY", flush=True)
for n, line in enumerate(sys.stdin):
    rate, interval_ms, seconds, settle = (int(x) for x in line.split())
    out, ck = f"{root}/out-{n}", f"{root}/ck-{n}"
    def write(df, batch_id):
        (df.groupBy("bucket").agg(F.count(F.lit(1)).alias("n"), F.sum("doubled").alias("total"))
           .write.mode("append").parquet(out))
    q = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", cores).load()
         .select("value").mapInArrow(per_row, "value long, bucket int, doubled long")
         .writeStream.trigger(processingTime=f"{interval_ms} milliseconds").option("checkpointLocation", ck)
         .foreachBatch(write).start())
    mark = -1
    if settle:
        time.sleep(settle)
        mark = q.lastProgress["batchId"] if q.lastProgress else -1
    time.sleep(seconds)
    records = [r for r in (json.loads(p.json) for p in q.recentProgress) if r["batchId"] > mark]
    q.stop()
    print("DONE " + json.dumps(records), flush=True)
"""


class Structured:
    """One long-lived Structured Streaming process (a warm SparkSession, as the TaskManager has)."""

    def __init__(self, cores: int, root: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", STRUCTURED_PROGRAM, str(cores), str(root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "READY"

    def run(self, rate: int, interval_ms: int, seconds: float, settle: float = 0) -> list[dict]:
        """The progress records of the batches with rows that began after `settle` seconds."""
        self.proc.stdin.write(f"{rate} {interval_ms} {int(seconds)} {int(settle)}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.startswith("DONE "), line
        return [r for r in json.loads(line[5:]) if r.get("numInputRows", 0) > 0]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def funke_job(rate: int, interval_ms: int, out: Path, checkpoint: Path, parallelism: int,
              keep_exchange: bool = False):
    """The query; at parallelism 1 its aggregate chains to the source (no exchange between single
    subtasks) unless `keep_exchange` starts a new chain there, as before that rule."""
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"bench stream {rate} {interval_ms}", parallelism=parallelism)
    aggregate = (env.read_stream.rate(rate)
                 .select("value")
                 .map(bucketed, schema="value bigint, bucket int, doubled bigint")
                 .key_by("bucket").per_batch().aggregate("count(1) as n", "sum(doubled) as total"))
    if keep_exchange:
        aggregate.start_new_chain()
    aggregate.write_parquet(str(out))
    env.set_trigger(f"{interval_ms} ms").set_checkpoint_location(str(checkpoint))
    return env.build()


def trigger_text(key: str, settle_s: float | None) -> str:
    """"100ms trigger", or for the settled measurement "100ms trigger, after 50 s"."""
    if key == SETTLED:
        return f"100ms trigger, after {settle_s:g} s" if settle_s else "100ms trigger, settled"
    return f"{key} trigger"


def measured(records: list[dict]) -> list[dict]:
    return records[WARM_UP_BATCHES:]


def durations(records: list[dict]) -> list[int]:
    return [r["durationMs"]["triggerExecution"] for r in measured(records)]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def keeps_up(records: list[dict], interval_ms: int) -> bool:
    batches = measured(records)
    if len(batches) < 3:
        return False
    if statistics.median(durations(records)) > interval_ms:
        return False
    delays = [r["schedulingDelayMs"] for r in batches[-5:] if "schedulingDelayMs" in r]
    return not delays or max(delays) <= 2 * interval_ms


def side_figures(records: list[dict]) -> dict:
    d = durations(records)
    figures = {"batches": len(d), "p50_ms": statistics.median(d) if d else None,
               "p99_ms": percentile(d, 0.99) if d else None, "phases_p50_ms": phases(records)}
    per_vertex = vertices(records)
    if per_vertex:
        figures["vertices_p50_ms"] = per_vertex
    return figures


def vertices(records: list[dict]) -> dict[str, dict[str, float]]:
    """funke's addBatch vertex by vertex: the p50 of each part of vertexDurationsMs."""
    batches = [r["vertexDurationsMs"] for r in measured(records) if r.get("vertexDurationsMs")]
    names = sorted({v for b in batches for v in b}, key=lambda v: statistics.median(
        b[v].get("dispatchedMs", 0) for b in batches if v in b))
    out = {}
    for v in names:
        parts = [b[v] for b in batches if v in b]
        out[v] = {k: statistics.median(p[k] for p in parts if k in p)
                  for k in ("dispatchedMs", "taskMs", "overheadMs", "reportedMs") if any(k in p for p in parts)}
    return out


def phases(records: list[dict]) -> dict[str, float]:
    """Where a batch's time goes: the p50 of each part of durationMs (both engines name theirs as
    Structured Streaming does: latestOffset, walCommit, addBatch, commitOffsets, ...), with what
    the parts leave out of triggerExecution as `other`."""
    batches = measured(records)
    names = sorted({k for r in batches for k in r["durationMs"] if k != "triggerExecution"})
    out = {k: statistics.median(r["durationMs"].get(k, 0) for r in batches) for k in names} if batches else {}
    if batches:
        out["other"] = statistics.median(r["durationMs"]["triggerExecution"]
                                         - sum(r["durationMs"].get(k, 0) for k in names) for r in batches)
    return out


def sustained(run, name: str, sweep_from: int = 0) -> tuple[int, dict]:
    """The highest rate of the sweep (from `sweep_from` on) `run(rate)` keeps up with at a 1 s
    trigger; None past the top of the sweep would be a figure capped by it: the caller says so."""
    best, sweep = 0, {}
    for rate in (r for r in SWEEP if r >= sweep_from):
        records = run(rate)
        ok = keeps_up(records, 1000)
        d = durations(records)
        sweep[rate] = {"keeps_up": ok, "p50_ms": statistics.median(d) if d else None,
                       "rows": sum(r["numInputRows"] for r in measured(records))}
        print(f"{rate} rows/s, 1 s trigger, {name}: {'keeps up' if ok else 'falls behind'} "
              f"(p50 {statistics.median(d) if d else '-'} ms)", file=sys.stderr)
        if not ok:
            break
        best = rate
    return best, sweep


def _phase_text(parts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in parts.items() if v) or "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--seconds", type=float, default=12)
    p.add_argument("--settle", type=float, default=50,
                   help="also measure the 100 ms trigger after the query ran this long (0: do not)")
    p.add_argument("--parallelism", default="",
                   help="funke's parallelisms to measure, comma-separated (default: 1 and --cores)")
    p.add_argument("--sweep-from", type=int, default=0,
                   help="start the throughput sweep at this rate (rows/s); lower rates are not measured")
    p.add_argument("--no-latency", action="store_true", help="measure the sustained rates only")
    p.add_argument("--no-sustained", action="store_true", help="measure the batch durations only")
    p.add_argument("--keep-exchange", action="store_true",
                   help="keep the aggregate in a vertex of its own at parallelism 1 (its HASH exchange, as "
                        "before funke chained across exchanges between single subtasks)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    parallelisms = [int(x) for x in args.parallelism.split(",")] if args.parallelism else sorted({1, args.cores})
    sys.path.insert(0, str(REPO))
    import cloudpickle

    from funke.deploy import localcluster
    from funke.deploy.client import JobManagerClient, job_status_name

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict = {"cores": args.cores, "seconds": args.seconds, "sweep_top": SWEEP[-1], "structured": {}, "funke": {}}
    with tempfile.TemporaryDirectory(prefix="funke-bench-stream-") as tmp:
        root = Path(tmp)
        info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, args.cores))
        client = info.client(timeout=600)
        structured = Structured(args.cores, root / "structured")
        runs = 0

        def run_funke(rate: int, interval_ms: int, parallelism: int, settle: float = 0) -> list[dict]:
            nonlocal runs
            runs += 1
            job_id = client.submit(funke_job(rate, interval_ms, root / f"funke-out-{runs}", root / f"funke-ck-{runs}",
                                             parallelism, args.keep_exchange))
            deadline = time.time() + 120
            while job_status_name(client.get_job(job_id).status) != "RUNNING" or not client.progress(job_id):
                if time.time() > deadline:
                    raise SystemExit(f"funke job {job_id} did not run a batch: {client.get_job(job_id)}")
                time.sleep(0.1)
            mark = -1
            if settle:
                time.sleep(settle)
                mark = max((r["batchId"] for r in client.progress(job_id)), default=-1)
            time.sleep(args.seconds)
            records = [r for r in client.progress(job_id) if r["batchId"] > mark]
            client.cancel(job_id)  # as Structured Streaming's stop(): the batch in flight is dropped
            while job_status_name(client.get_job(job_id).status) not in ("CANCELED", "FAILED", "FINISHED"):
                time.sleep(0.1)
            return [r for r in records if r.get("numInputRows", 0) > 0]

        try:
            print("warm-up ...", file=sys.stderr)
            run_funke(1000, 1000, parallelisms[0])
            structured.run(1000, 1000, 8)
            for interval_ms in () if args.no_latency else (100, 1000):
                key = f"{interval_ms}ms"
                results["structured"].setdefault("latency", {})[key] = side_figures(
                    structured.run(1000, interval_ms, args.seconds))
                print(f"1000 rows/s, {interval_ms} ms trigger, structured: {results['structured']['latency'][key]}",
                      file=sys.stderr)
                for par in parallelisms:
                    figures = side_figures(run_funke(1000, interval_ms, par))
                    figures["p50_ratio"] = figures["p50_ms"] / results["structured"]["latency"][key]["p50_ms"]
                    results["funke"].setdefault(str(par), {}).setdefault("latency", {})[key] = figures
                    print(f"1000 rows/s, {interval_ms} ms trigger, funke p={par}: {figures}", file=sys.stderr)
            if args.settle and not args.no_latency:
                key = SETTLED
                results["structured"]["latency"][key] = side_figures(structured.run(1000, 100, args.seconds, args.settle))
                print(f"1000 rows/s, 100 ms trigger after {args.settle:g} s, structured: "
                      f"{results['structured']['latency'][key]}", file=sys.stderr)
                for par in parallelisms:
                    figures = side_figures(run_funke(1000, 100, par, args.settle))
                    figures["p50_ratio"] = figures["p50_ms"] / results["structured"]["latency"][key]["p50_ms"]
                    results["funke"][str(par)]["latency"][key] = figures
                    print(f"1000 rows/s, 100 ms trigger after {args.settle:g} s, funke p={par}: {figures}",
                          file=sys.stderr)
                results["settle_s"] = args.settle
            if args.no_sustained:
                parallelisms_swept: list[int] = []
            else:
                parallelisms_swept = parallelisms
                best, sweep = sustained(lambda rate: structured.run(rate, 1000, args.seconds), "structured",
                                        args.sweep_from)
                results["structured"].update(sustained_rows_per_s=best, sweep=sweep)
            for par in parallelisms_swept:
                best, sweep = sustained(lambda rate: run_funke(rate, 1000, par), f"funke p={par}", args.sweep_from)
                side = results["funke"].setdefault(str(par), {})
                side.update(sustained_rows_per_s=best, sweep=sweep)
                side["throughput_ratio"] = (best / results["structured"]["sustained_rows_per_s"]
                                            if results["structured"]["sustained_rows_per_s"] else None)
        finally:
            structured.close()
            client.close()
            localcluster.stop(root / "cluster")
    s = results["structured"]
    for par, side in results["funke"].items():
        for key, f in side.get("latency", {}).items():
            st = s["latency"][key]
            print(f"batch duration at 1000 rows/s, {trigger_text(key, results.get('settle_s'))}: funke (parallelism {par}) "
                  f"p50 {f['p50_ms']} ms / "
                  f"p99 {f['p99_ms']} ms; Structured Streaming p50 {st['p50_ms']} ms / p99 {st['p99_ms']} ms; "
                  f"p50 ratio {f['p50_ratio']:.2f}")
            print(f"  where a batch's time goes (p50 ms): funke {_phase_text(f['phases_p50_ms'])}; "
                  f"Structured Streaming {_phase_text(st['phases_p50_ms'])}")
            if f.get("vertices_p50_ms"):
                print("  funke's addBatch by vertex (p50 ms; sent/done: from the batch's first dispatch):")
                print(f"    {'vertex':<24} {'sent':>6} {'task':>7} {'hops':>6} {'done':>6}")
                for vertex, part in f["vertices_p50_ms"].items():
                    cells = [f"{part[k]:.0f}" if k in part else "-" for k in ("dispatchedMs", "taskMs", "overheadMs",
                                                                               "reportedMs")]
                    print(f"    {vertex:<24} {cells[0]:>6} {cells[1]:>7} {cells[2]:>6} {cells[3]:>6}")
        if "sustained_rows_per_s" not in side:
            continue
        ratio = side["throughput_ratio"]
        capped = [name for name, best in (("funke", side["sustained_rows_per_s"]),
                                          ("Structured Streaming", s["sustained_rows_per_s"])) if best == SWEEP[-1]]
        print(f"sustained at a 1 s trigger ({args.cores} cores): funke (parallelism {par}) "
              f"{side['sustained_rows_per_s']:,} rows/s, Structured Streaming {s['sustained_rows_per_s']:,} rows/s, "
              + (f"ratio {ratio:.2f}" if ratio is not None else "no ratio (Structured Streaming kept up with none)")
              + (f" ({' and '.join(capped)} kept up with the sweep's top: at least that much)" if capped else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
