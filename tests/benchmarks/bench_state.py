"""Keyed state: funke's state store and stateful queries vs Structured Streaming's, same query, same
cores, one side after the other.

    python tests/benchmarks/bench_state.py [--parts store,count,python,rescale] [--cores 2] [--json FILE]

Parts:
  store    the store alone, in one process: 1,000,000 keys (a running count's state: a string key
           and a bigint), each version updating 1 % of them, written as funke writes a version
           (an Arrow delta per key group, a snapshot every 10th version) and as RocksDB would hold
           it (rocksdict, RocksDB's Python binding: a WriteBatch per version, then a checkpoint of
           the database, as Structured Streaming's RocksDB provider uploads one per version):
           ms per version, bytes written per version, bytes on disk, and loading the whole state
           again from the files.
  count    a running count over 1,000,000 distinct keys: the rate source at --rate rows/s, key =
           value % 1,000,000, `key_by(k).count()` in update mode to a discarding sink; funke on a
           local cluster (one TaskManager, --cores slots, parallelism --cores) vs Structured
           Streaming `groupBy(k).count()` in update mode to the noop sink with the RocksDB state
           store and changelog checkpointing (local[--cores], --cores shuffle partitions). Runs
           --seconds each (the first 3 batches are warm-up), prints per side the rows/s processed
           (the median of processedRowsPerSecond), batch p50/p99 (triggerExecution), checkpoint
           bytes written per batch and the state on disk at the end, and the ratios.
  python   a Python function per key keeping a count per key in state, --py-keys keys (10,000) at --py-rate
           rows/s: funke's `key_by(k).process(fn)` (one call per key and batch, Arrow batches of
           many keys into the worker) vs `groupBy(k).applyInPandasWithState` (a pandas DataFrame
           per key); rows/s processed and batch p50, and the ratio.
  python-sweep  the python part's query at rising offered rates (--sweep, rows/s), --sweep-seconds
           each, until a side falls behind: the highest rate each keeps up with at the 1 s trigger
           (median batch duration <= 1 s), and the ratio.
  rescale  the running count's query with 1,000,000 keys at parallelism 2 on 2 TaskManagers x 2
           slots, rescaled live to 4 (`client.rescale`): the pause from the last batch committed
           before to the first committed after, from the progress records, with the first
           batch's own duration.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEYS = 1_000_000
WARM_UP_BATCHES = 3


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


# ------------------------------------------------------------------------------------ store

def bench_store(root: Path, versions: int = 20, touched: float = 0.01) -> dict:
    import random

    import pyarrow as pa

    from funke.common.streaming.keygroups import key_group_range
    from funke.taskmanager.operators.keyedstate import store

    rng = random.Random(7)
    groups = 128
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    keys = [f"key-{i}" for i in range(KEYS)]
    by_group: dict[int, list[str]] = {}
    for k in keys:
        by_group.setdefault(hash(k) % groups, []).append(k)
    funke_root = root / "funke-store"
    # version 0 -> 1: every key written once (the first batch that saw them), then 1 % per version
    timings, written = [], []
    for version in range(versions):
        chosen = keys if version == 0 else rng.sample(keys, int(KEYS * touched))
        changes: dict[int, dict] = {}
        for k in chosen:
            changes.setdefault(hash(k) % groups, {})[k] = ([k], [version + 1])
        before = du(funke_root)
        began = time.perf_counter()
        at = store.StateStore(str(funke_root), version, 1, schema, 100)
        with store.no_gc():  # as the operators run a batch
            for g in key_group_range(groups, 1, 0):
                state = at.load(g)
                mine = changes.get(g, {})
                for k, (key, _) in mine.items():  # read-modify-write, as a running count does
                    held = state.get(k)
                    mine[k] = (key, [(held[1][0] if held else 0) + 1])
                state.update(mine)
                state.commit()
        timings.append((time.perf_counter() - began) * 1000)
        written.append(du(funke_root) - before)
    store._loaded().clear()
    began = time.perf_counter()
    with store.no_gc():
        loaded = sum(len(store.load_held(str(funke_root), g, versions, 1).rows) for g in range(groups))
    funke_load_ms = (time.perf_counter() - began) * 1000
    assert loaded == KEYS, loaded
    funke = {"first_version_ms": round(timings[0]), "version_ms_p50": round(statistics.median(timings[1:])),
             "version_ms_mean": round(statistics.mean(timings[1:])),
             "bytes_per_version_p50": int(statistics.median(written[1:])), "on_disk_bytes": du(funke_root),
             "load_all_ms": round(funke_load_ms)}

    from rocksdict import Checkpoint, Options, Rdict, WriteBatch

    rng = random.Random(7)
    db_path, checkpoints = root / "rocksdb", root / "rocksdb-checkpoints"
    checkpoints.mkdir(parents=True)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(db_path), options)
    timings, written = [], []
    for version in range(versions):
        chosen = keys if version == 0 else rng.sample(keys, int(KEYS * touched))
        began = time.perf_counter()
        batch = WriteBatch(raw_mode=True)
        for k in chosen:  # read-modify-write, as a running count does
            key = k.encode()
            held = db.get(key)
            batch.put(key, ((int.from_bytes(held, "little") if held else 0) + 1).to_bytes(8, "little"))
        db.write(batch)
        db.flush()  # a checkpoint holds what is flushed: the version's SST files
        target = checkpoints / str(version + 1)
        Checkpoint(db).create_checkpoint(str(target))
        timings.append((time.perf_counter() - began) * 1000)
        # what a version adds (Spark uploads the SST files new since the last version): files
        # in this checkpoint that were not in the previous one
        previous = {f.name for f in (checkpoints / str(version)).iterdir()} if version else set()
        written.append(sum(f.stat().st_size for f in target.iterdir() if f.name not in previous or
                           not f.name.endswith(".sst")))
        if version >= 2:
            shutil.rmtree(checkpoints / str(version - 1))
    db.close()
    began = time.perf_counter()
    again = Rdict(str(checkpoints / str(versions)), Options(raw_mode=True))
    count = sum(1 for _ in again.keys())
    rocks_load_ms = (time.perf_counter() - began) * 1000
    again.close()
    assert count == KEYS, count
    rocks = {"first_version_ms": round(timings[0]), "version_ms_p50": round(statistics.median(timings[1:])),
             "version_ms_mean": round(statistics.mean(timings[1:])),
             "bytes_per_version_p50": int(statistics.median(written[1:])), "on_disk_bytes": du(db_path),
             "load_all_ms": round(rocks_load_ms)}
    return {"keys": KEYS, "versions": versions, "touched": touched, "funke": funke, "rocksdb": rocks}


# ------------------------------------------------------------------- Structured Streaming side

STRUCTURED = r"""
import json, os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
part, cores, rate, seconds, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
keys = int(sys.argv[6])
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master(f"local[{cores}]").appName("structured state")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(cores))
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
         .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
ck = f"{root}/checkpoint"
source = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", cores).load()
          .select((F.col("value") % keys).cast("string").alias("k")))
if part == "count":
    query = source.groupBy("k").count()
else:
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def counted(key, frames, state):
        n = state.get[0] if state.exists else 0
        for frame in frames:
            n += len(frame)
        state.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    query = source.groupBy("k").applyInPandasWithState(counted, "k string, n long", "n long", "update",
                                                       GroupStateTimeout.NoTimeout)
q = (query.writeStream.outputMode("update").format("noop").trigger(processingTime="1 second")
     .option("checkpointLocation", ck).start())
time.sleep(seconds)
records = [json.loads(p.json) for p in q.recentProgress]
q.stop()
print("DONE " + json.dumps(records), flush=True)
"""


def structured(part: str, cores: int, rate: int, seconds: float, root: Path, keys: int) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", STRUCTURED, part, str(cores), str(rate), str(seconds), str(root),
                          str(keys)], capture_output=True, text=True, timeout=seconds + 600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("DONE ")), None)
    if line is None:
        raise SystemExit(f"Structured Streaming ({part}) failed:\n{out.stderr[-3000:]}")
    return [r for r in json.loads(line[5:]) if r.get("numInputRows", 0) > 0]


# ------------------------------------------------------------------------------------ funke side

def counting_job(rate: int, checkpoint: Path, parallelism: int, keys: int = KEYS):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"bench state count {rate}", parallelism=parallelism)
    (env.read_stream.rate(rate)
        .select(f"CAST(value % {keys} AS STRING) AS k")
        .key_by("k").count()
        .discard())
    env.set_output_mode("update").set_trigger("1 s").set_checkpoint_location(str(checkpoint))
    return env.build()


class PythonCount:
    """funke's side of the `python` part: a count per key kept in a ValueState."""
    from funke.common.api.state import ValueState
    state = (ValueState("n", "bigint"),)
    del ValueState

    def process(self, k, rows, ctx):
        n = (ctx.state.n.value() or 0) + len(rows)
        ctx.state.n.update(n)
        return [(k, n)]


def python_job(rate: int, checkpoint: Path, parallelism: int, keys: int):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"bench state python {rate}", parallelism=parallelism)
    (env.read_stream.rate(rate)
        .select(f"CAST(value % {keys} AS STRING) AS k")
        .key_by("k").process(PythonCount(), schema="k string, n bigint")
        .discard())
    env.set_output_mode("update").set_trigger("1 s").set_checkpoint_location(str(checkpoint))
    return env.build()


def run_funke(client, job, seconds: float) -> tuple[str, list[dict]]:
    from funke.deploy.client import job_status_name

    job_id = client.submit(job)
    deadline = time.time() + 300
    while job_status_name(client.get_job(job_id).status) != "RUNNING" or not client.progress(job_id):
        if time.time() > deadline:
            raise SystemExit(f"funke job {job_id} did not run a batch: {client.get_job(job_id)}")
        time.sleep(0.2)
    time.sleep(seconds)
    records = client.progress(job_id)
    return job_id, [r for r in records if r.get("numInputRows", 0) > 0]


def stop(client, job_id: str) -> None:
    from funke.deploy.client import job_status_name

    client.cancel(job_id)
    while job_status_name(client.get_job(job_id).status) not in ("CANCELED", "FAILED", "FINISHED"):
        time.sleep(0.1)


def figures(records: list[dict], checkpoint: Path | None = None) -> dict:
    measured = records[WARM_UP_BATCHES:]
    if not measured:
        return {"batches": 0}
    d = [r["durationMs"]["triggerExecution"] for r in measured]
    state = [op for r in measured for op in r.get("stateOperators", [])]
    out = {"batches": len(measured), "rows_per_s": round(statistics.median(r["processedRowsPerSecond"] for r in measured)),
           "p50_ms": statistics.median(d), "p99_ms": percentile(d, 0.99),
           "keys": max((op.get("numRowsTotal", 0) for op in state), default=0)}
    written = [op.get("checkpointBytesWritten") or (op.get("customMetrics") or {}).get("rocksdbBytesCopied")
               for op in state]
    written = [w for w in written if w is not None]
    if written:
        out["checkpoint_bytes_per_batch_p50"] = int(statistics.median(written))
    on_disk = [op.get("stateOnDiskBytes") for op in state if op.get("stateOnDiskBytes") is not None]
    if on_disk:
        out["state_on_disk_bytes"] = on_disk[-1]
    elif checkpoint is not None:
        out["state_on_disk_bytes"] = du(checkpoint / "state")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="store,count,python,rescale")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--rate", type=int, default=100_000, help="rows/s of the count part")
    p.add_argument("--py-rate", type=int, default=10_000, help="rows/s of the python part")
    p.add_argument("--py-keys", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--sweep", default="1000,2000,5000,10000,20000,40000,80000,160000")
    p.add_argument("--sweep-seconds", type=float, default=25)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    parts = args.parts.split(",")
    sys.path.insert(0, str(REPO))
    import cloudpickle

    from funke.deploy import localcluster
    from funke.deploy.client import rescale_pause

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict = {"cores": args.cores}
    with tempfile.TemporaryDirectory(prefix="funke-bench-state-") as tmp:
        root = Path(tmp)
        if "store" in parts:
            import importlib.util

            if importlib.util.find_spec("rocksdict") is None:  # only this part needs it
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", "rocksdict"], check=True)
            results["store"] = s = bench_store(root / "store")
            for side in ("funke", "rocksdb"):
                f = s[side]
                print(f"store, {KEYS:,} keys, 1 % changed per version ({side}): first version {f['first_version_ms']} ms, "
                      f"then {f['version_ms_p50']} ms (mean {f['version_ms_mean']} ms, snapshots included) and "
                      f"{f['bytes_per_version_p50']:,} bytes per version, "
                      f"{f['on_disk_bytes']:,} bytes on disk, all keys loaded again in {f['load_all_ms']} ms")
        if "count" in parts or "python" in parts or "python-sweep" in parts:
            info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, args.cores))
            client = info.client(timeout=600)
            try:
                if "count" in parts:
                    ss = figures(structured("count", args.cores, args.rate, args.seconds, root / "ss-count", KEYS),
                                 root / "ss-count" / "checkpoint")
                    print(f"running count, Structured Streaming (RocksDB): {ss}", file=sys.stderr)
                    job_id, records = run_funke(client, counting_job(args.rate, root / "funke-count", args.cores),
                                                args.seconds)
                    stop(client, job_id)
                    fk = figures(records)
                    print(f"running count, funke: {fk}", file=sys.stderr)
                    results["count"] = {"rate": args.rate, "funke": fk, "structured_rocksdb": ss}
                if "python" in parts:
                    ss = figures(structured("python", args.cores, args.py_rate, args.seconds, root / "ss-python",
                                            args.py_keys))
                    print(f"python state, applyInPandasWithState: {ss}", file=sys.stderr)
                    job_id, records = run_funke(client, python_job(args.py_rate, root / "funke-python", args.cores,
                                                                   args.py_keys), args.seconds)
                    stop(client, job_id)
                    fk = figures(records)
                    print(f"python state, funke process(): {fk}", file=sys.stderr)
                    results["python"] = {"rate": args.py_rate, "keys": args.py_keys, "funke": fk, "structured": ss}
                if "python-sweep" in parts:
                    sweep = [int(x) for x in args.sweep.split(",")]
                    kept: dict[str, int] = {}
                    seen: dict[str, dict] = {"funke": {}, "structured": {}}
                    for side in ("structured", "funke"):
                        kept[side] = 0
                        for n, rate in enumerate(sweep):
                            if side == "structured":
                                f = figures(structured("python", args.cores, rate, args.sweep_seconds,
                                                       root / f"ss-sweep-{rate}", args.py_keys))
                            else:
                                job_id, records = run_funke(client, python_job(rate, root / f"funke-sweep-{rate}",
                                                                               args.cores, args.py_keys),
                                                            args.sweep_seconds)
                                stop(client, job_id)
                                f = figures(records)
                            seen[side][rate] = f
                            ok = f.get("batches", 0) >= 3 and f["p50_ms"] <= 1000
                            print(f"python state at {rate} rows/s, {side}: {'keeps up' if ok else 'falls behind'} {f}",
                                  file=sys.stderr)
                            if not ok:
                                break
                            kept[side] = rate
                    results["python_sweep"] = {"keys": args.py_keys, "sustained": kept, "runs": seen,
                                               "sweep_top": sweep[-1]}
            finally:
                client.close()
                localcluster.stop(root / "cluster")
        if "rescale" in parts:
            info = localcluster.start(localcluster.ClusterSpec(root / "cluster-rescale", 2, 2))
            client = info.client(timeout=600)
            try:
                rate = max(args.rate // 4, 10_000)
                job_id, records = run_funke(client, counting_job(rate, root / "funke-rescale", 2), 0)
                while max((op["numRowsTotal"] for r in client.progress(job_id) for op in r.get("stateOperators", [])),
                          default=0) < KEYS:
                    time.sleep(0.5)
                time.sleep(5)
                answer = client.rescale(job_id, 4)
                pause = None
                while pause is None:
                    time.sleep(0.1)
                    pause = rescale_pause(client.progress(job_id), answer.last_batch_id)
                first = next(r for r in client.progress(job_id) if r["batchId"] == pause["first_batch_after"])
                before = [r["durationMs"]["triggerExecution"] for r in client.progress(job_id)
                          if r["batchId"] <= pause["last_batch_before"]][-5:]
                time.sleep(10)
                after = [r["durationMs"]["triggerExecution"] for r in client.progress(job_id)
                         if r["batchId"] > pause["first_batch_after"]]
                stop(client, job_id)
                results["rescale"] = {"keys": KEYS, "rate": rate, **pause,
                                      "first_batch_ms": first["durationMs"]["triggerExecution"],
                                      "batch_ms_before_p50": statistics.median(before) if before else None,
                                      "batch_ms_after_p50": statistics.median(after) if after else None}
            finally:
                client.close()
                localcluster.stop(root / "cluster-rescale")
    if "count" in results:
        c = results["count"]
        fk, ss = c["funke"], c["structured_rocksdb"]
        print(f"running count over {KEYS:,} keys at {c['rate']:,} rows/s offered ({args.cores} cores): funke "
              f"{fk.get('rows_per_s')} rows/s, p50 {fk.get('p50_ms')} ms, p99 {fk.get('p99_ms')} ms, "
              f"{fk.get('checkpoint_bytes_per_batch_p50')} checkpoint bytes/batch, {fk.get('state_on_disk_bytes')} "
              f"bytes of state; Structured Streaming (RocksDB) {ss.get('rows_per_s')} rows/s, p50 {ss.get('p50_ms')} ms, "
              f"p99 {ss.get('p99_ms')} ms, {ss.get('checkpoint_bytes_per_batch_p50')} bytes copied/batch, "
              f"{ss.get('state_on_disk_bytes')} bytes of state; rows/s ratio "
              f"{fk['rows_per_s'] / ss['rows_per_s']:.2f}, p50 ratio {fk['p50_ms'] / ss['p50_ms']:.2f}"
              if fk.get("batches") and ss.get("batches") else f"running count: {c}")
    if "python" in results:
        c = results["python"]
        fk, ss = c["funke"], c["structured"]
        print(f"Python state per key ({c['keys']:,} keys, {c['rate']:,} rows/s offered): funke process() "
              f"{fk.get('rows_per_s')} rows/s, p50 {fk.get('p50_ms')} ms; applyInPandasWithState "
              f"{ss.get('rows_per_s')} rows/s, p50 {ss.get('p50_ms')} ms; rows/s ratio "
              f"{fk['rows_per_s'] / ss['rows_per_s']:.2f}" if fk.get("batches") and ss.get("batches")
              else f"python state: {c}")
    if "python_sweep" in results:
        c = results["python_sweep"]
        fk, ss = c["sustained"]["funke"], c["sustained"]["structured"]
        print(f"Python state per key ({c['keys']:,} keys), highest rate kept up with at a 1 s trigger: funke process() "
              f"{fk:,} rows/s, applyInPandasWithState {ss:,} rows/s"
              + (f", ratio {fk / ss:.1f}" if ss else " (Structured Streaming kept up with none of the sweep)")
              + (" (funke kept up with the sweep's top: at least that)" if fk == c["sweep_top"] else ""))
    if "rescale" in results:
        r = results["rescale"]
        print(f"rescale 2 -> 4 with {KEYS:,} keys: pause {r['pause_ms']} ms (batch {r['last_batch_before']} committed "
              f"before, batch {r['first_batch_after']} after, which took {r['first_batch_ms']} ms; batches took "
              f"{r['batch_ms_before_p50']} ms before, {r['batch_ms_after_p50']} ms after)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
