"""Apache Flink itself (PyFlink's local mini cluster) on the two workloads funke is measured on: the
batch word count of bench_wordcount.py and the streaming query of bench_streaming.py.

    python tests/benchmarks/bench_pyflink.py [--parts wordcount,streaming] [--mb 512] [--runs 3]
        [--cores 2] [--parallelism 1,2] [--warm-up 20] [--seconds 40] [--latency-seconds 20]
        [--latency-rate 1000] [--latency-bundle-ms 10] [--python-mode process]
        [--pyflink-venv DIR] [--wordcount-json FILE] [--json FILE]

PyFlink (PyPI apache-flink) is installed by this script into its own virtual environment under
--pyflink-venv (the same default as bench_windows.py --pyflink, never into funke's) and runs in a
subprocess of it, with its own JVM (Java 11 or 17 on PATH or JAVA_HOME). When it cannot be
installed or run, the script prints why (pip's or the job's error) and exits 1.

wordcount: the corpus of bench_wordcount.py (`make_corpus(--mb)`, cached under .funke/bench/), read
  with the filesystem connector's `raw` format (a row per line), grouped by word and counted, and
  written as CSV by the filesystem connector; Table API in batch execution mode, parallelism
  --cores (Flink's adaptive batch scheduler, on by default as Spark's adaptive execution is, runs
  the final aggregate and the sink at the parallelism their input's size calls for: 1 here, with
  the words pre-aggregated per subtask). Two rows:
    python udtf  the tokeniser of bench_wordcount.py (`words`, its source passed to the job as is)
                 as a Python table function (LATERAL TABLE): one Python call per line, as funke's
                 and PySpark's flat_map;
    sql          Flink's built-in `REGEXP_EXTRACT_ALL(LOWER(line), '[a-z]+', 0)` unnested (the same
                 pattern, in Java): no Python in the loop.
  One long-lived Python process (a warm JVM, as bench_wordcount keeps a warm SparkSession); each
  INSERT is one job on a mini cluster PyFlink's local executor starts for it, which the time
  includes. One warm-up run of each, then --runs runs alternating; wall time from execute_sql to
  the job's end, median per row. Every run's output is checked against a reference count made in
  Python with `words` (total words, distinct words and every word's count; exit 1 if they differ).
  --wordcount-json: bench_wordcount.py's --json of the same corpus and cores, to print funke's and
  PySpark's medians beside Flink's and the ratios (their median / Flink's).
streaming: a `datagen` source -> the `bucketed` function of bench_streaming.py as a Python scalar
  function (value -> value, bucket, doubled) -> count and sum per bucket -> sink; Table API in
  streaming mode at each --parallelism (default 1 and --cores).
  - sustained rows/s: the source unthrottled (rows-per-second 10^9, as bench_windows.py: a
    rate-limited source measures the limiter), to a blackhole sink, for two aggregates: a 1 s
    tumbling processing-time window per bucket (the counterpart of funke's per-batch aggregate)
    and a running GROUP BY bucket (an update per row). The figure is what the source sent per
    second (its numRecordsOut over the subtasks, from the mini cluster's REST API, asked twice a
    second apart since the API answers with its previous fetch) over --seconds after --warm-up
    seconds; with backpressure that is the most the job takes.
  - latency: the source limited to --latency-rate rows/s, the running GROUP BY, and per row the
    time from its generation to the aggregate's update leaving for the sink: LOCALTIMESTAMP taken
    right after the source (passed through the Python function with the value, or the planner
    would compute it after the Python step) and LOCALTIMESTAMP after the aggregate, to a `print`
    sink whose lines the script reads; p50/p99 over --latency-seconds, after --warm-up seconds
    from the first rows. The rate-limited datagen source emits each second's rows in one burst
    (rate / parallelism rows per subtask), so the rows come as a 1 s micro-batch would: p50 is
    about half the time a burst takes to pass the Python step and the aggregate, p99 nearly all
    of it. Compare it with funke's batch p50/p99 at 1 000 rows/s and a 1 s trigger (a batch of
    the same rows), knowing that a micro-batch row also waits for its trigger. The Python step
    flushes every python.fn-execution.bundle.time (--latency-bundle-ms, default 10 ms, the
    low-latency setting); at Flink's default, 1000 ms, the figure depends on the phase between
    the source's bursts and that timer, anywhere from tens of ms to a second from run to run.
    With the 1 s window a row would wait for its window's end (0.5 s on average) by design, so
    latency is measured on the running aggregate only.
--python-mode: python.execution-mode, `process` (Flink's default: Beam workers, Python in its own
  processes) and/or `thread` (pemja, Python embedded in the JVM), comma-separated.

Caveats: the source is datagen's random kind (values 0..10^9): its sequence kind holds the whole
range in memory and fails at large ranges. The mini cluster runs in one JVM with default memory;
Flink's Python operators buffer up to a bundle (100 000 rows or 1 s), counted as sent by the
source. The machine's cores are shared: read the load average beside the figures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_streaming import bucketed, percentile  # noqa: E402
from tests.benchmarks.bench_wordcount import WORD, make_corpus, words  # noqa: E402

# the functions the jobs run, their source as in the other benches (the PyFlink venv has no funke)
FUNCTIONS = (f"import re\nWORD = re.compile({WORD.pattern!r})\n\n" + inspect.getsource(words) + "\n"
             + inspect.getsource(bucketed))

PREAMBLE = r"""
import os, sys, sysconfig
if sys.argv[1] == "thread":  # pemja's interpreter in the JVM finds this venv's packages through PYTHONPATH
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [sysconfig.get_paths()["purelib"],
                                                             os.environ.get("PYTHONPATH")]))
"""

# ------------------------------------------------------------------------------------ word count

BATCH = PREAMBLE + r"""
import time
mode, corpus, out, cores = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from pyflink.table import DataTypes, EnvironmentSettings, TableEnvironment
from pyflink.table.udf import udtf
""" + FUNCTIONS + r"""

@udtf(result_types=[DataTypes.STRING()])
def tokens(line):
    return words(line)


t = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
t.get_config().set("parallelism.default", str(cores))
t.get_config().set("python.execution-mode", mode)
t.create_temporary_function("tokens", tokens)
t.execute_sql(f"CREATE TABLE lines (line STRING) WITH ('connector' = 'filesystem', 'path' = '{corpus}', 'format' = 'raw')")
QUERIES = {
    "python udtf": "SELECT word, COUNT(*) FROM lines, LATERAL TABLE(tokens(line)) AS T(word) GROUP BY word",
    "sql": f"SELECT word, COUNT(*) FROM lines CROSS JOIN UNNEST(REGEXP_EXTRACT_ALL(LOWER(line), '{WORD.pattern}', 0)) "
           "AS T(word) GROUP BY word",
}
print("READY", flush=True)
for n, line in enumerate(sys.stdin):
    target = f"{out}/run-{n}"
    t.execute_sql(f"CREATE TEMPORARY TABLE counted_{n} (word STRING, n BIGINT) "
                  f"WITH ('connector' = 'filesystem', 'path' = '{target}', 'format' = 'csv')")
    started = time.time()
    t.execute_sql(f"INSERT INTO counted_{n} " + QUERIES[line.strip()]).wait()
    print(f"DONE {time.time() - started} {target}", flush=True)
"""

VARIANTS = ("python udtf", "sql")


class Failed(Exception):
    """PyFlink could not be installed or a job of it failed: the message says why."""


def why(stderr: str) -> str:
    """The root causes Java and Python name in `stderr`, then its end."""
    causes = [x.strip() for x in stderr.splitlines() if x.lstrip().startswith("Caused by:")]
    return "\n".join(causes[-4:] + [stderr.strip()[-1500:]])


def pyflink_python(venv: Path) -> tuple[Path, str]:
    """The venv's python with apache-flink installed (installed here when missing) and the Flink
    version, or Failed saying why (no Java, no venv, pip's error)."""
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not Path(java).exists():
        raise Failed("no Java: PyFlink runs its mini cluster in a JVM (Java 11 or 17 on PATH or JAVA_HOME)")
    version = subprocess.run([str(java), "-version"], capture_output=True, text=True)
    if version.returncode:
        raise Failed(f"`{java} -version` failed: {version.stderr.strip()}")
    python = venv / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode:
            raise Failed(f"could not make a virtual environment at {venv}: {made.stderr.strip()[-800:]}")
    have = subprocess.run([str(python), "-c", "import pyflink"], capture_output=True)
    if have.returncode:
        print(f"installing apache-flink into {venv} ...", file=sys.stderr)
        installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "apache-flink"], capture_output=True,
                                   text=True, timeout=1800)
        if installed.returncode:
            raise Failed(f"pip install apache-flink failed: {installed.stderr.strip()[-1500:]}")
    got = subprocess.run([str(python), "-c", "from pyflink.version import __version__; print(__version__)"],
                         capture_output=True, text=True)
    if got.returncode:
        raise Failed(f"pyflink does not import: {got.stderr.strip()[-1500:]}")
    print(f"PyFlink {got.stdout.strip()} in {venv}; {version.stderr.splitlines()[0]}", file=sys.stderr)
    return python, got.stdout.strip()


def count_file(path: Path) -> Counter:
    counts: Counter = Counter()
    with open(path) as f:
        for line in f:
            counts.update(words(line))
    return counts


def reference(corpus: Path, cores: int) -> Counter:
    """The word count made in Python with the tokeniser, one file per process."""
    total: Counter = Counter()
    with ProcessPoolExecutor(cores) as pool:
        for counts in pool.map(count_file, sorted(corpus.glob("*.txt"))):
            total.update(counts)
    return total


def read_counts(out: Path) -> Counter:
    counts: Counter = Counter()
    for f in out.rglob("*"):
        if f.is_file() and not any(part.startswith((".", "_")) for part in f.relative_to(out).parts):
            for line in f.read_text().splitlines():
                word, n = line.rsplit(",", 1)
                counts[word] += int(n)
    return counts


def check(variant: str, out: Path, expected: Counter) -> None:
    got = read_counts(out)
    if got == expected:
        return
    wrong = sorted(w for w in set(got) | set(expected) if got.get(w) != expected.get(w))
    raise Failed(f"PyFlink's {variant} word count differs from the reference: {sum(got.values()):,} words and "
                 f"{len(got):,} distinct (expected {sum(expected.values()):,} and {len(expected):,}); "
                 f"{len(wrong):,} words differ, e.g. " + ", ".join(f"{w!r}: {got.get(w)} != {expected.get(w)}"
                                                                for w in wrong[:5]))


def kill_group(proc: subprocess.Popen) -> None:
    """Ends a child this script started in its own session, with what it started (the JVM)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Batch:
    """One long-lived PyFlink process, a job per line on its stdin."""

    def __init__(self, python: Path, mode: str, corpus: Path, out: Path, cores: int, log: Path):
        self.log = log
        self.err = open(log, "w")
        # its own process group: the JVM and Python workers it starts go with it (kill_group)
        self.proc = subprocess.Popen([str(python), "-c", BATCH, mode, str(corpus), str(out), str(cores)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     start_new_session=True)
        self.expect("READY")

    def expect(self, word: str) -> list[str]:
        # the JVM writes to the same stdout: skip what is not ours
        for line in self.proc.stdout:
            if line.startswith(word):
                return line.split()
        self.proc.wait(timeout=60)
        raise Failed(f"the PyFlink word count failed (exit {self.proc.returncode}):\n{why(self.log.read_text())}")

    def run(self, variant: str) -> tuple[float, Path]:
        self.proc.stdin.write(variant + "\n")
        self.proc.stdin.flush()
        line = self.expect("DONE")
        return float(line[1]), Path(line[2])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)
        self.err.close()


def wordcount(python: Path, flink: str, args, root: Path) -> list[dict]:
    started = time.time()
    corpus = make_corpus(args.mb)
    size = sum(f.stat().st_size for f in corpus.glob("*.txt"))
    print(f"corpus: {size / 2**20:.0f} MiB in 16 files ({time.time() - started:.1f} s to prepare)", file=sys.stderr)
    started = time.time()
    expected = reference(corpus, args.cores)
    print(f"reference count in Python: {sum(expected.values()):,} words, {len(expected):,} distinct "
          f"({time.time() - started:.1f} s)", file=sys.stderr)
    rows = []
    for mode in args.python_mode:
        variants = VARIANTS if mode == args.python_mode[0] else ("python udtf",)  # sql runs no Python
        batch = Batch(python, mode, corpus, root / f"wc-{mode}", args.cores, root / f"wc-{mode}.log")
        try:
            times: dict[str, list[float]] = {v: [] for v in variants}
            print(f"warm-up ({mode} mode) ...", file=sys.stderr)
            for v in variants:
                seconds, out = batch.run(v)
                check(v, out, expected)
                print(f"warm-up {v}: {seconds:.1f} s", file=sys.stderr)
            for i in range(args.runs):
                for v in variants:
                    seconds, out = batch.run(v)
                    check(v, out, expected)
                    shutil.rmtree(out, ignore_errors=True)
                    times[v].append(seconds)
                print(f"run {i + 1}: " + ", ".join(f"{v} {times[v][-1]:.1f} s" for v in variants), file=sys.stderr)
        finally:
            batch.close()
        for v in variants:
            rows.append({"workload": "wordcount", "engine": "pyflink", "flink": flink, "variant": v,
                         "python_mode": mode if v != "sql" else "none", "parallelism": args.cores, "runs": args.runs,
                         "corpus_mib": round(size / 2**20), "words": sum(expected.values()),
                         "distinct_words": len(expected), "median_s": statistics.median(times[v]), "runs_s": times[v]})
    if args.wordcount_json:
        theirs = json.loads(Path(args.wordcount_json).read_text())
        if theirs.get("corpus_mib") != round(size / 2**20) or theirs.get("cores") != args.cores:
            print(f"note: {args.wordcount_json} is of {theirs.get('corpus_mib')} MiB on {theirs.get('cores')} cores, "
                  f"this run {round(size / 2**20)} MiB on {args.cores}", file=sys.stderr)
        for row in rows:
            row["funke_median_s"], row["pyspark_median_s"] = theirs["funke_median_s"], theirs["pyspark_median_s"]
            row["funke_ratio"] = theirs["funke_median_s"] / row["median_s"]
            row["pyspark_ratio"] = theirs["pyspark_median_s"] / row["median_s"]
    return rows


# ------------------------------------------------------------------------------------ streaming

STREAM = PREAMBLE + r"""
import json, re, socket, time, urllib.request
mode, measure, query, par = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
warm_up, seconds, rate, bundle_ms = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
from pyflink.table import DataTypes, EnvironmentSettings, Row, TableEnvironment
from pyflink.table.udf import udf
""" + FUNCTIONS + r"""
FIELDS = [DataTypes.FIELD("value", DataTypes.BIGINT()), DataTypes.FIELD("bucket", DataTypes.INT()),
          DataTypes.FIELD("doubled", DataTypes.BIGINT())]


@udf(result_type=DataTypes.ROW(FIELDS))
def py_bucketed(value):
    return Row(*bucketed(value))


@udf(result_type=DataTypes.ROW(FIELDS + [DataTypes.FIELD("gen", DataTypes.TIMESTAMP(3))]))
def py_bucketed_stamped(value, gen):
    # the same function; the row's generation time passes through it, so that it is taken before
    # the Python step (the planner computes what a Python call does not need after it)
    return Row(*bucketed(value), gen)


probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
t = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
config = t.get_config()
config.set("parallelism.default", str(par))
config.set("python.execution-mode", mode)
config.set("rest.address", "127.0.0.1")
config.set("rest.port", str(port))
config.set("metrics.fetcher.update-interval", "500")  # the REST API's counters, fresh
if bundle_ms:
    config.set("python.fn-execution.bundle.time", bundle_ms)
t.create_temporary_function("bucketed", py_bucketed)
t.create_temporary_function("bucketed_stamped", py_bucketed_stamped)
per_second = rate if measure == "latency" else 10**9  # 10^9: unthrottled
t.execute_sql(f'''CREATE TABLE src (v BIGINT, pt AS PROCTIME()) WITH ('connector' = 'datagen',
  'rows-per-second' = '{per_second}', 'fields.v.kind' = 'random', 'fields.v.min' = '0', 'fields.v.max' = '1000000000')''')
if measure == "latency":
    t.execute_sql("CREATE TEMPORARY VIEW mapped AS SELECT r.`value` AS `value`, r.bucket AS bucket, "
                  "r.doubled AS doubled, r.gen AS gen FROM (SELECT bucketed_stamped(v, LOCALTIMESTAMP) AS r FROM src)")
    t.execute_sql("CREATE TABLE sink (bucket INT, n BIGINT, total BIGINT, gen TIMESTAMP(3), arrived TIMESTAMP(3)) "
                  "WITH ('connector' = 'print', 'print-identifier' = 'LATENCY')")
    insert = ("INSERT INTO sink SELECT bucket, n, total, gen, LOCALTIMESTAMP FROM (SELECT bucket, COUNT(*) AS n, "
              "SUM(doubled) AS total, LAST_VALUE(gen) AS gen FROM mapped GROUP BY bucket)")
else:
    t.execute_sql("CREATE TEMPORARY VIEW mapped AS SELECT r.`value` AS `value`, r.bucket AS bucket, "
                  "r.doubled AS doubled, pt FROM (SELECT bucketed(v) AS r, pt FROM src)")
    t.execute_sql("CREATE TABLE sink (bucket INT, n BIGINT, total BIGINT) WITH ('connector' = 'blackhole')")
    insert = {"window": "INSERT INTO sink SELECT bucket, COUNT(*), SUM(doubled) FROM TABLE(TUMBLE(TABLE mapped, "
                        "DESCRIPTOR(pt), INTERVAL '1' SECOND)) GROUP BY window_start, window_end, bucket",
              "running": "INSERT INTO sink SELECT bucket, COUNT(*), SUM(doubled) FROM mapped GROUP BY bucket"}[query]
job = t.execute_sql(insert)
client = job.get_job_client()
base = f"http://127.0.0.1:{port}/jobs/{client.get_job_id()}"


def status():
    return str(client.get_job_status().result()).rsplit(".", 1)[-1]


def running():
    now = status()
    if now != "RUNNING":
        client.get_job_execution_result().result()  # raises the job's failure
        raise SystemExit(f"the PyFlink job is {now}")


while status() in ("INITIALIZING", "CREATED"):  # the warm-up counts from RUNNING
    time.sleep(0.2)
running()


def get(url):
    return json.load(urllib.request.urlopen(url, timeout=60))


def counted(source, metric):
    # a counter summed over the subtasks of the source's vertex (source=True) or of the
    # aggregate's. The REST API answers with what it fetched at the request before (then fetches
    # anew): asked twice, a second apart.
    running()
    vertex = next(v["id"] for v in get(base)["vertices"] if v["name"].startswith("Source") == source)
    url = f"{base}/vertices/{vertex}/metrics"
    for _ in range(60):
        names = [m["id"] for m in get(url) if re.fullmatch(metric, m["id"])]
        if len(names) == par:
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"{metric} is not in the REST API: {get(url)}")
    get(f"{url}?get={','.join(names)}")
    time.sleep(1.0)
    return sum(int(float(m["value"])) for m in get(f"{url}?get={','.join(names)}"))


def source_rows():
    return counted(True, r"\d+\.Source__.+\.numRecordsOut")


# the warm-up counts from the first rows into the aggregate (the Python workers start slowly on a
# loaded machine); the script counts its latencies from the sink's first rows as well
deadline = time.time() + 300
while counted(False, r"\d+\.numRecordsIn") == 0:
    if time.time() > deadline:
        raise SystemExit("no row reached the aggregate in 300 s")
if measure == "latency":
    time.sleep(warm_up + seconds + 2)
    running()
    result = {}
else:
    time.sleep(warm_up)
    first, began = source_rows(), time.time()
    time.sleep(seconds)
    last, ended = source_rows(), time.time()
    result = {"rows": last - first, "rows_per_s": round((last - first) / (ended - began))}
client.cancel().result()
print("DONE " + json.dumps(result), flush=True)
"""

PRINTED = re.compile(r"LATENCY(?::\d+)?> \+[IU]\[.*, (\S+), (\S+)\]$")


def stream(python: Path, mode: str, measure: str, query: str, par: int, args, bundle_ms: str = "") -> tuple[dict, str]:
    seconds = args.latency_seconds if measure == "latency" else args.seconds
    proc = subprocess.Popen([str(python), "-c", STREAM, mode, measure, query, str(par), str(args.warm_up),
                             str(seconds), str(args.latency_rate), bundle_ms], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.warm_up + seconds + 600)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise Failed(f"the PyFlink streaming job ({measure}, {query}, parallelism {par}) did not end in time")
    line = next((x for x in stdout.splitlines() if x.startswith("DONE ")), None)
    if line is None:
        raise Failed(f"the PyFlink streaming job ({measure}, {query}, parallelism {par}) failed "
                     f"(exit {proc.returncode}):\n{why(stderr)}")
    return json.loads(line[5:]), stdout


def latencies(printed: str, warm_up: float) -> list[float]:
    """Per row printed by the sink (+I/+U: a row counted), arrival - generation in ms, for the rows
    arriving --warm-up seconds after the first one."""
    times = [(datetime.fromisoformat(m[1]), datetime.fromisoformat(m[2]))
             for m in (PRINTED.match(x) for x in printed.splitlines()) if m]
    start = min((a for _, a in times), default=None)
    return [(a - g).total_seconds() * 1000 for g, a in times if (a - start).total_seconds() >= warm_up]


def streaming(python: Path, flink: str, args) -> list[dict]:
    rows = []
    common = {"workload": "streaming", "engine": "pyflink", "flink": flink}
    for mode in args.python_mode:
        for query in ("window", "running"):
            for par in args.parallelism:
                got, _ = stream(python, mode, "sustained", query, par, args)
                row = {**common, "measure": "sustained", "python_mode": mode,
                       "query": {"window": "tumbling 1 s window", "running": "running group by"}[query],
                       "parallelism": par, "rows_per_s": got["rows_per_s"], "rows": got["rows"]}
                print(f"sustained, {row['query']}, {mode} mode, parallelism {par}: {got['rows_per_s']:,} rows/s",
                      file=sys.stderr)
                rows.append(row)
        for bundle_ms in args.latency_bundle_ms:
            for par in args.parallelism:
                _, printed = stream(python, mode, "latency", "running", par, args, bundle_ms)
                ms = latencies(printed, args.warm_up)
                if len(ms) < 10:
                    raise Failed(f"the latency job printed {len(ms)} rows after its warm-up: not measurable")
                row = {**common, "measure": "latency", "python_mode": mode, "query": "running group by",
                       "python_bundle": f"{bundle_ms} ms", "parallelism": par, "offered_rate": args.latency_rate,
                       "p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99), "rows": len(ms)}
                print(f"latency at {args.latency_rate:,} rows/s, {mode} mode, bundle {bundle_ms} ms, parallelism "
                      f"{par}: p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms over {len(ms):,} rows",
                      file=sys.stderr)
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------ main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="wordcount,streaming")
    p.add_argument("--mb", type=int, default=512, help="word count corpus size (bench_wordcount's default)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cores", type=int, default=2, help="the word count's parallelism")
    p.add_argument("--parallelism", default="", help="streaming parallelisms, comma-separated (default: 1 and --cores)")
    p.add_argument("--warm-up", type=float, default=20, help="streaming: seconds not measured after the job starts")
    p.add_argument("--seconds", type=float, default=40, help="streaming: seconds the sustained rate is measured over")
    p.add_argument("--latency-seconds", type=float, default=20)
    p.add_argument("--latency-rate", type=int, default=1000)
    p.add_argument("--latency-bundle-ms", default="10",
                   help="python.fn-execution.bundle.time values for the latency runs, comma-separated (Flink's "
                        "default, 1000, makes the figure depend on the phase of the source's bursts)")
    p.add_argument("--python-mode", default="process", help="python.execution-mode values: process, thread")
    p.add_argument("--pyflink-venv", default=str(Path(tempfile.gettempdir()) / "funke-bench-pyflink"))
    p.add_argument("--wordcount-json", help="bench_wordcount.py's --json, for the ratios")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - {"wordcount", "streaming"}:
        p.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.parallelism = [int(x) for x in args.parallelism.split(",")] if args.parallelism else sorted({1, args.cores})
    args.latency_bundle_ms = [str(int(x)) for x in args.latency_bundle_ms.split(",") if x]
    args.python_mode = args.python_mode.split(",")
    if unknown := set(args.python_mode) - {"process", "thread"}:
        p.error(f"unknown python modes: {', '.join(sorted(unknown))}")
    rows: list[dict] = []
    try:
        python, flink = pyflink_python(Path(args.pyflink_venv))
        with tempfile.TemporaryDirectory(prefix="funke-bench-pyflink-") as tmp:
            if "wordcount" in parts:
                rows += wordcount(python, flink, args, Path(tmp))
            if "streaming" in parts:
                rows += streaming(python, flink, args)
    except Failed as e:
        print(f"PyFlink: {e}", file=sys.stderr)
        return 1
    for r in rows:
        if r["workload"] == "wordcount":
            print(f"word count, {r['corpus_mib']} MiB, PyFlink {r['flink']} {r['variant']}"
                  + (f" ({r['python_mode']} mode)" if r["variant"] != "sql" else "")
                  + f", parallelism {r['parallelism']}, median of {r['runs']}: {r['median_s']:.1f} s"
                  + (f"; funke {r['funke_median_s']:.1f} s (funke / PyFlink {r['funke_ratio']:.2f}), PySpark "
                     f"{r['pyspark_median_s']:.1f} s (PySpark / PyFlink {r['pyspark_ratio']:.2f})"
                     if "funke_ratio" in r else ""))
        elif r["measure"] == "sustained":
            print(f"streaming sustained, PyFlink {r['flink']} ({r['python_mode']} mode), {r['query']}, parallelism "
                  f"{r['parallelism']}: {r['rows_per_s']:,} rows/s")
        else:
            print(f"streaming latency (generation -> sink), PyFlink {r['flink']} ({r['python_mode']} mode), "
                  f"{r['offered_rate']:,} rows/s, {r['query']}, Python bundle {r['python_bundle']}, parallelism "
                  f"{r['parallelism']}: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
