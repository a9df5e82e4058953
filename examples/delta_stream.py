"""A Delta table streamed into another: each batch reads the rows the commits since the last
batch appended to --input, counts them per key, and appends the counts to --output, a Delta
table that deltalake, Polars or DuckDB read while the query runs.

Run it on a cluster with:

    funke submit examples/delta_stream.py -- --input /tmp/orders --output /tmp/order_counts --key customer
    funke stop JOB              # the batch in flight finishes and commits; the job ends FINISHED

--input must be a Delta table already (write it with deltalake, Spark or another funke job). Each
batch is committed to --output once, as one Delta transaction that records the query's id and
the batch id: a batch run again after a failure adds nothing. `python -c "import deltalake;
print(deltalake.DeltaTable('/tmp/order_counts').to_pandas())"` shows what was committed.
"""

from __future__ import annotations

import argparse

from funke import ExecutionEnvironment


def build(args: list[str]) -> ExecutionEnvironment:
    parser = argparse.ArgumentParser(prog="delta_stream", description="Counts a Delta table's new rows per key.")
    parser.add_argument("--input", required=True, help="the Delta table to read as a stream")
    parser.add_argument("--output", required=True, help="the Delta table the counts are appended to")
    parser.add_argument("--key", required=True, help="the column to count by")
    parser.add_argument("--trigger", default="2 s", help="the batch interval (default 2 s)")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--parallelism", type=int, default=2)
    opts = parser.parse_args(args)

    env = ExecutionEnvironment("delta stream", parallelism=opts.parallelism)
    (env.read_stream.delta(opts.input)
        .key_by(opts.key).per_batch().count()      # each batch's new rows on their own
        .write_delta(opts.output, mode="append"))
    env.set_trigger(opts.trigger)
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    return env
