"""What counting each operator's records costs a micro-batch: the same StreamTask chain run batch
after batch with the counting (`funke.taskmanager.recordcounts`) and with it stubbed out,
alternating in one process (one SparkSession, so that both see the same JVM and load).

    python tests/benchmarks/bench_recordcounts.py [--batches 80] [--rows 100] [--chain one|exchange|keyed|where]

Chains (bench_streaming's query, and one that needs an observation):
  one       rate -> select -> map -> per-batch aggregate -> Parquet, one vertex (bench_streaming at
            parallelism 1)
  exchange  rate -> select -> map into an exchange (bench_streaming's first vertex with
            --keep-exchange)
  keyed     per-batch aggregate -> Parquet over that exchange (its second vertex), the batches of
            one producer task read by each variant in turn
  where     rate -> where -> select -> flat_map -> select -> per-batch aggregate -> Parquet: the
            where's and the flat_map's records need an observation each (what follows them does
            not pass every record on)
Printed per variant: the p50 and mean of the batches' TaskIo.seconds (planning, Spark jobs,
exchange files, counting), the first 10 batches of each left out as warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bucketed(value):
    return (value, value % 64, value * 2)


def words(value):
    return [value, value]


class _NoCounting:
    """ChainCounter's interface, counting nothing."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def reads(self, inputs):
        pass

    def emitted(self, index, df):
        return df

    def operators(self, *args):
        return ()


class _Batches:
    def __init__(self) -> None:
        self.io: list = []
        self.produced: list = []
        self._cond = threading.Condition()

    def __call__(self, batch_id, produced, input_rows=None, io=None) -> None:
        with self._cond:
            self.io.append(io)
            self.produced.append(produced)
            self._cond.notify_all()

    def wait(self, n: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.io) >= n, 120):
                raise SystemExit(f"batch {n - 1} did not end within 120 s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=80, help="batches per variant")
    p.add_argument("--rows", type=int, default=100, help="rows per batch (bench_streaming: 100 at 1000 rows/s, 100 ms)")
    p.add_argument("--chain", choices=("one", "exchange", "keyed", "where"), default="one")
    args = p.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.path.insert(0, str(REPO))
    import cloudpickle
    from pyspark.sql import SparkSession

    from funke.common.streaming.checkpoint import SourceRange
    from funke.common.streaming.sources import BatchInput
    from funke.taskmanager import task as taskmod
    from tests.unit.test_task_runtime import Reports, deploy, gate, op, output

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = (SparkSession.builder.master("local[2]").appName("bench record counts")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    counter = taskmod.ChainCounter
    rate = op("source.rate", rows_per_second=1000)
    mapped = op("map", bucketed, schema="value bigint, bucket int, doubled bigint")
    aggregate = op("aggregate", keys=["bucket"], aggregations=["count(1) AS n", "sum(doubled) AS total"])
    with tempfile.TemporaryDirectory(prefix="funke-bench-counts-") as tmp:
        outs: list = []
        if args.chain == "one":
            ops = [rate, op("select", exprs=["value"]), mapped, aggregate, op("sink.parquet", path=f"{tmp}/out")]
        elif args.chain in ("exchange", "keyed"):
            ops, outs = [rate, op("select", exprs=["value"]), mapped], [output("ds", 0)]
        else:
            ops = [rate, op("where", condition="value % 5 <> 0"), op("select", exprs=["value"]),
                   op("flat_map", words, schema="value bigint"),
                   op("select", exprs=["value", "value % 64 AS bucket", "value * 2 AS doubled"]), aggregate,
                   op("sink.parquet", path=f"{tmp}/out")]

        def start(vertex: str, chain: list, outputs: list) -> tuple:
            deployment, _ = deploy(tmp, chain, vertex=vertex, outputs=outputs)
            batches = _Batches()
            task = taskmod.StreamTask(deployment, spark, Reports(), batches)
            threading.Thread(target=task.run, daemon=True).start()
            return vertex, task, batches

        keyed = [aggregate, op("sink.parquet", path=f"{tmp}/out")]
        producer = start("rate", ops, outs) if args.chain == "keyed" else None
        tasks = {variant: start(("agg-" if producer else "rate-") + variant.replace(" ", "-"),
                                keyed if producer else ops, [] if producer else outs)
                 for variant in ("counted", "not counted")}
        for k in range(2 * args.batches):
            variant = "counted" if k % 2 == 0 else "not counted"
            vertex, task, batches = tasks[variant]
            n = len(batches.io)
            rows = SourceRange({"rows": args.rows * k, "baseMs": 0} if k else None,
                               {"rows": args.rows * (k + 1), "baseMs": 0}, args.rows)
            if producer is None:
                taskmod.ChainCounter = counter if variant == "counted" else _NoCounting
                task.give_batch(BatchInput(k, 0, {vertex: rows}))
            else:  # the producer counted always; the variant's keyed task reads its batch
                taskmod.ChainCounter = counter
                producer[1].give_batch(BatchInput(k, 0, {"rate": rows}))
                producer[2].wait(k + 1)
                taskmod.ChainCounter = counter if variant == "counted" else _NoCounting
                schema = producer[2].produced[-1][0].schema
                task.give_batch(BatchInput(k, 0), (gate("ds", range(0, 1), attempts=[0], schema=schema),))
            batches.wait(n + 1)
        for variant, (_, task, batches) in tasks.items():
            ms = [io.seconds * 1000 for io in batches.io[10:]]
            print(f"{args.chain}, {variant}: {len(ms)} batches of {args.rows} rows, task p50 "
                  f"{statistics.median(ms):.1f} ms, mean {statistics.mean(ms):.1f} ms")
            task.finish()
        if producer is not None:
            producer[1].finish()
        print("operators of the last counted batch (in, out):",
              [(o.records_in, o.records_out) for o in tasks["counted"][2].io[-1].operators])
    return 0


if __name__ == "__main__":
    sys.exit(main())
