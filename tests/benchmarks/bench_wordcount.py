"""End to end: word count over a generated corpus, funke vs. the same pipeline in plain PySpark.

    python tests/benchmarks/bench_wordcount.py [--mb 512] [--runs 3] [--cores 2] [--json FILE]

The corpus (deterministic, Zipf-distributed words, 16 files) is generated once and cached under
.funke/bench/. Both sides run the same pipeline with the same Python tokeniser — read text files,
flat_map lines to words (a Python function, through mapInArrow), group by word and count, write
CSV — on the same number of cores with the same Spark settings:
  funke:   a local cluster of one TaskManager with --cores slots (Spark local[cores]), parallelism
           --cores, submitted through the client; wall time from submit to FINISHED;
  PySpark: one process, local[cores], the DataFrame pipeline written directly.
Runs alternate (funke, PySpark, funke, ...) after one warm-up run of each; the medians and their
ratio funke / PySpark are printed. Both outputs are checked to hold the same counts.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".funke" / "bench"

WORD = re.compile(r"[a-z]+")


def words(line: str) -> list[str]:
    """The tokeniser both sides use."""
    return WORD.findall(line.lower())


def make_corpus(mb: int, seed: int = 20261122) -> Path:
    import numpy as np

    d = CACHE / f"corpus-{mb}mb-{seed}"
    done = d / "_COMPLETE"
    if done.exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocabulary = np.array(["".join(rng.choice(letters, size=n)) for n in rng.integers(2, 10, size=50_000)])
    ranks = np.arange(1, len(vocabulary) + 1)
    weights = 1.0 / ranks
    weights /= weights.sum()
    per_file = mb * 2**20 // 16
    for n in range(16):
        with open(d / f"part-{n:02d}.txt", "w") as f:
            written = 0
            while written < per_file:
                chosen = vocabulary[rng.choice(len(vocabulary), size=(20_000, 12), p=weights)]
                block = "\n".join(" ".join(row) for row in chosen) + "\n"
                f.write(block)
                written += len(block)
    done.write_text("ok")
    return d


def funke_job(corpus: Path, out: Path, parallelism: int):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment("bench word count", parallelism=parallelism)
    (env.read_text(str(corpus / "*.txt"))
        .flat_map(words, schema="word string")
        .key_by("word").count()
        .write_csv(str(out), mode="overwrite"))
    return env.build()


PYSPARK_PROGRAM = r"""
import sys, time, re, os
os.environ["PYSPARK_PYTHON"] = sys.executable
corpus, out, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
from pyspark.sql import SparkSession
import pyarrow as pa
spark = (SparkSession.builder.master(f"local[{cores}]").appName("plain pyspark word count")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(cores)).config("spark.scheduler.mode", "FAIR")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
WORD = re.compile(r"[a-z]+")
def flat_map(batches):
    schema = pa.schema([("word", pa.string())])
    for batch in batches:
        out = []
        for line in batch.column(0).to_pylist():
            out.extend(WORD.findall(line.lower()))
        yield pa.RecordBatch.from_pydict({"word": out}, schema=schema)
print("READY", flush=True)
for line in sys.stdin:
    started = time.time()
    df = spark.read.text(corpus + "/*.txt")
    df.mapInArrow(flat_map, "word string").groupBy("word").count().write.mode("overwrite").option("header", "true").csv(out)
    print(f"DONE {time.time() - started}", flush=True)
"""


class PlainPySpark:
    """One long-lived PySpark process (a warm SparkSession, as the funke TaskManager has)."""

    def __init__(self, corpus: Path, out: Path, cores: int):
        self.proc = subprocess.Popen([sys.executable, "-c", PYSPARK_PROGRAM, str(corpus), str(out), str(cores)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "READY"

    def run(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "DONE", line
        return float(line[1])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def read_counts(out: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in out.iterdir():
        if f.name.startswith(("_", ".")) or not f.name.endswith(".csv"):
            continue
        lines = f.read_text().splitlines()
        for line in lines[1:]:
            word, n = line.rsplit(",", 1)
            counts[word] = counts.get(word, 0) + int(n)
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=512)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import tempfile

    import cloudpickle

    from funke.deploy.client import JobManagerClient
    from funke.deploy import localcluster
    from funke.v1 import job_pb2

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = time.time()
    corpus = make_corpus(args.mb)
    size = sum(f.stat().st_size for f in corpus.glob("*.txt"))
    print(f"corpus: {size / 2**20:.0f} MiB in 16 files ({time.time() - started:.1f} s to prepare)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="funke-bench-wc-") as tmp:
        tmp_path = Path(tmp)
        info = localcluster.start(localcluster.ClusterSpec(tmp_path / "cluster", 1, args.cores))
        client = info.client(timeout=600)
        plain = PlainPySpark(corpus, tmp_path / "plain-out", args.cores)
        funke_out = tmp_path / "funke-out"

        def run_funke() -> float:
            job = funke_job(corpus, funke_out, args.cores)
            t = time.time()
            job_id = client.submit(job)
            for _ in client.watch(job_id):
                pass
            elapsed = time.time() - t
            details = client.get_job(job_id)
            if job_pb2.JobStatus.Name(details.status) != "JOB_STATUS_FINISHED":
                raise SystemExit(f"funke job ended {job_pb2.JobStatus.Name(details.status)}: {details.failure.message}")
            return elapsed

        try:
            print("warm-up ...", file=sys.stderr)
            run_funke()
            plain.run()
            assert read_counts(funke_out) == read_counts(tmp_path / "plain-out"), "the two word counts differ"
            times: dict[str, list[float]] = {"funke": [], "pyspark": []}
            for i in range(args.runs):
                times["funke"].append(run_funke())
                times["pyspark"].append(plain.run())
                print(f"run {i + 1}: funke {times['funke'][-1]:.1f} s, PySpark {times['pyspark'][-1]:.1f} s", file=sys.stderr)
        finally:
            plain.close()
            client.close()
            localcluster.stop(tmp_path / "cluster")
    funke_median, plain_median = statistics.median(times["funke"]), statistics.median(times["pyspark"])
    result = {"corpus_mib": round(size / 2**20), "cores": args.cores, "runs": args.runs,
              "funke_median_s": funke_median, "pyspark_median_s": plain_median,
              "ratio": funke_median / plain_median, "funke_s": times["funke"], "pyspark_s": times["pyspark"]}
    print(f"word count, {result['corpus_mib']} MiB, {args.cores} cores, median of {args.runs} alternated runs: "
          f"funke {funke_median:.1f} s, plain PySpark {plain_median:.1f} s, ratio {result['ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
