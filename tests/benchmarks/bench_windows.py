"""Event-time windows: funke vs Structured Streaming (and PyFlink when it installs), same query, same
cores, one side after the other.

    python tests/benchmarks/bench_windows.py [--rate 100000] [--keys 100000] [--seconds 100] [--cores 2]
                                             [--pyflink] [--json FILE]

The query: the rate source at --rate rows/s, key = value % --keys, event time = the row's
timestamp, except every 20th row (5 %), whose time is 2 minutes earlier: late, since the
watermark trails the latest event time by 10 s. A tumbling 1-minute window count per key in
append mode (each window emitted once, when the watermark passes its end), to a discarding
sink. funke: `with_watermark("ts", "10 s").key_by("k").window("ts", "1 min").count()` on a
local cluster (one TaskManager, --cores slots, parallelism --cores), the late rows counted;
Structured Streaming: `withWatermark("ts", "10 seconds").groupBy(window("ts", "1 minute"),
"k").count()` to the noop sink, RocksDB state store with changelog checkpointing, local[--cores],
--cores shuffle partitions (its late rows are dropped, counted in numRowsDroppedByWatermark).
Each runs --seconds (long enough for windows to close and leave the state: at least 75 s); the
first 3 batches are warm-up. Printed per side: rows/s processed (median of
processedRowsPerSecond), batch p50/p99 (triggerExecution), the state's keys and bytes on disk at
the end, late rows counted; then the ratios.

--pyflink: the same query on PyFlink's local mini cluster (apache-flink, installed by this script
into its own virtual environment under --pyflink-venv, never into funke's): Flink SQL, a
`datagen` sequence with the same 5 % late rows and a 10 s watermark, a 1-minute TUMBLE count per
key to a blackhole sink, parallelism --cores. The source runs unthrottled (datagen's rate limit
emits in bursts here, which would measure the limiter), so its figure is the most rows/s the job
takes: what its source sent per second after a 20 s warm-up (numRecordsOut from the mini
cluster's REST API). Flink has no batches: no p50. When it cannot be installed or run, the
script says why and goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_state import du, figures, run_funke, stop  # noqa: E402

LATE_EVERY = 20  # every 20th row is 2 minutes late: 5 %

STRUCTURED = r"""
import json, os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
cores, rate, seconds, root, keys = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
late_every = int(sys.argv[6])
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master(f"local[{cores}]").appName("structured windows")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(cores))
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
         .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
events = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", cores).load()
          .select((F.col("value") % keys).cast("string").alias("k"),
                  F.expr(f"CASE WHEN value % {late_every} = 0 THEN timestamp - INTERVAL 2 MINUTES ELSE timestamp END")
                  .alias("ts")))
counts = events.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "1 minute"), "k").count()
q = (counts.writeStream.outputMode("append").format("noop").trigger(processingTime="1 second")
     .option("checkpointLocation", f"{root}/checkpoint").start())
time.sleep(seconds)
records = [json.loads(p.json) for p in q.recentProgress]
q.stop()
print("DONE " + json.dumps(records), flush=True)
"""


def structured(cores: int, rate: int, seconds: float, root: Path, keys: int) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", STRUCTURED, str(cores), str(rate), str(seconds), str(root), str(keys),
                          str(LATE_EVERY)], capture_output=True, text=True, timeout=seconds + 600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("DONE ")), None)
    if line is None:
        raise SystemExit(f"Structured Streaming failed:\n{out.stderr[-3000:]}")
    return [r for r in json.loads(line[5:]) if r.get("numInputRows", 0) > 0]


def window_job(rate: int, checkpoint: Path, parallelism: int, keys: int):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"bench windows {rate}", parallelism=parallelism)
    (env.read_stream.rate(rate)
        .select(f"CAST(value % {keys} AS STRING) AS k",
                f"CASE WHEN value % {LATE_EVERY} = 0 THEN timestamp - INTERVAL 2 MINUTES ELSE timestamp END AS ts")
        .with_watermark("ts", "10 s")
        .key_by("k").window("ts", "1 min").count()
        .discard())
    env.set_output_mode("append").set_trigger("1 s").set_checkpoint_location(str(checkpoint))
    return env.build()


def late_rows(records: list[dict]) -> int:
    """Late rows over the records: funke's numLateRows, Structured Streaming's rows dropped by
    the watermark."""
    return sum(r.get("numLateRows", 0) + sum(op.get("numRowsDroppedByWatermark", 0)
                                              for op in r.get("stateOperators", [])) for r in records)


# ------------------------------------------------------------------------------------ PyFlink

PYFLINK = r"""
import json, socket, sys, time, urllib.request
from pyflink.table import EnvironmentSettings, TableEnvironment
cores, rate, seconds, keys, late_every = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
t = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
t.get_config().set("parallelism.default", str(cores))
t.get_config().set("rest.address", "127.0.0.1")
t.get_config().set("rest.port", str(port))
t.get_config().set("metrics.fetcher.update-interval", "500")  # the REST API's counters, fresh
t.execute_sql(f'''CREATE TABLE src (v BIGINT, ts AS CASE WHEN MOD(v, {late_every}) = 0
    THEN LOCALTIMESTAMP - INTERVAL '2' MINUTE ELSE LOCALTIMESTAMP END,
    WATERMARK FOR ts AS ts - INTERVAL '10' SECOND)
  WITH ('connector' = 'datagen', 'rows-per-second' = '1000000000', 'fields.v.kind' = 'random',
        'fields.v.min' = '0', 'fields.v.max' = '1000000000')''')
t.execute_sql("CREATE TABLE sink (k STRING, n BIGINT) WITH ('connector' = 'blackhole')")
job = t.execute_sql(f'''INSERT INTO sink SELECT CAST(MOD(v, {keys}) AS STRING) AS k, COUNT(*) AS n
  FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
  GROUP BY window_start, window_end, CAST(MOD(v, {keys}) AS STRING)''')
jid = str(job.get_job_client().get_job_id())
base = f"http://127.0.0.1:{port}/jobs/{jid}"


def rows_out():
    # the source's numRecordsOut, summed over its subtasks (its chain pre-aggregates what it sends
    # on). The REST API answers with what it fetched at the request before (then fetches anew):
    # asked twice, a second apart, the second answer is fresh.
    vertex = next(v["id"] for v in json.load(urllib.request.urlopen(base))["vertices"] if v["name"].startswith("Source"))
    names = ",".join(f"{i}.Source__src[1].numRecordsOut" for i in range(cores))
    urllib.request.urlopen(f"{base}/vertices/{vertex}/metrics?get={names}").read()
    time.sleep(1.0)
    got = json.load(urllib.request.urlopen(f"{base}/vertices/{vertex}/metrics?get={names}"))
    return sum(int(float(m["value"])) for m in got)


time.sleep(20)  # warm-up (its first seconds stall while the JVM compiles), as the others' first batches
first, began = rows_out(), time.time()
time.sleep(max(5.0, seconds - 20))
last, ended = rows_out(), time.time()
state = json.load(urllib.request.urlopen(base))["state"]
job.get_job_client().cancel().result()
print("DONE " + json.dumps({"rows_per_s": round((last - first) / (ended - began)), "state": state}), flush=True)
"""


def pyflink(venv: Path, cores: int, rate: int, seconds: float, keys: int) -> dict:
    """The query on PyFlink's mini cluster, or why it could not run."""
    python = venv / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode:
            return {"error": f"could not make a virtual environment: {made.stderr[-500:]}"}
    have = subprocess.run([str(python), "-c", "import pyflink"], capture_output=True)
    if have.returncode:
        installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "apache-flink"], capture_output=True,
                                   text=True, timeout=1800)
        if installed.returncode:
            return {"error": f"pip install apache-flink failed: {installed.stderr.strip()[-800:]}"}
    out = subprocess.run([str(python), "-c", PYFLINK, str(cores), str(rate), str(seconds), str(keys), str(LATE_EVERY)],
                         capture_output=True, text=True, timeout=seconds + 600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("DONE ")), None)
    if line is None:
        return {"error": f"the PyFlink job failed: {out.stderr.strip()[-1500:]}"}
    # datagen unthrottled (its rate limiter emits in bursts gated on checkpoints here): the rows
    # its source sent per second after a 20 s warm-up, as fast as the job takes them
    return {**json.loads(line[5:]), "offered_rows_per_s": "unthrottled"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=100)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--pyflink", action="store_true", help="also run the query on PyFlink (installs apache-flink)")
    p.add_argument("--pyflink-venv", default=str(Path(tempfile.gettempdir()) / "funke-bench-pyflink"))
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    import cloudpickle

    from funke.deploy import localcluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict = {"cores": args.cores, "rate": args.rate, "keys": args.keys, "seconds": args.seconds,
                     "late_share": 1 / LATE_EVERY}
    with tempfile.TemporaryDirectory(prefix="funke-bench-windows-") as tmp:
        root = Path(tmp)
        ss_records = structured(args.cores, args.rate, args.seconds, root / "ss", args.keys)
        ss = {**figures(ss_records, root / "ss" / "checkpoint"), "late_rows": late_rows(ss_records)}
        print(f"Structured Streaming: {ss}", file=sys.stderr)
        info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, args.cores))
        client = info.client(timeout=600)
        try:
            job_id, records = run_funke(client, window_job(args.rate, root / "funke", args.cores, args.keys),
                                        args.seconds)
            stop(client, job_id)
        finally:
            client.close()
            localcluster.stop(root / "cluster")
        fk = {**figures(records), "late_rows": late_rows(records), "state_on_disk_bytes": du(root / "funke" / "state")}
        print(f"funke: {fk}", file=sys.stderr)
        results.update(funke=fk, structured_rocksdb=ss)
        if args.pyflink:
            results["pyflink"] = pyflink(Path(args.pyflink_venv), args.cores, args.rate, args.seconds, args.keys)
            print(f"PyFlink: {results['pyflink']}", file=sys.stderr)
    if fk.get("batches") and ss.get("batches"):
        print(f"tumbling 1-minute window count over {args.keys:,} keys, {args.rate:,} rows/s offered, 5 % late "
              f"({args.cores} cores, {args.seconds:g} s): funke {fk['rows_per_s']} rows/s, p50 {fk['p50_ms']} ms, p99 "
              f"{fk['p99_ms']} ms, {fk.get('state_on_disk_bytes')} bytes of state, {fk['late_rows']} late rows counted; "
              f"Structured Streaming (RocksDB) {ss['rows_per_s']} rows/s, p50 {ss['p50_ms']} ms, p99 {ss['p99_ms']} ms, "
              f"{ss.get('state_on_disk_bytes')} bytes of state, {ss['late_rows']} late rows dropped; rows/s ratio "
              f"{fk['rows_per_s'] / ss['rows_per_s']:.2f}, p50 ratio {fk['p50_ms'] / ss['p50_ms']:.2f}")
    else:
        print(f"windows: {results}")
    if "pyflink" in results:
        print(f"PyFlink: {results['pyflink']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
