"""The seed's socket word count: lines from a TCP server, counted per 2 s batch, printed —
Spark Streaming's

    ssc.socketTextStream("localhost", 1234).flatMap(_.split(" ")).map((_, 1)).reduceByKey(_ + _).print()

Run it on a cluster, with something that writes lines to the port (`nc -lk 1234`):

    funke submit examples/socket_wordcount.py -- --host localhost --port 1234
    funke progress JOB          # its batches: lines, blocks, rates, durations
    funke stop JOB              # the batch in flight finishes; the job ends FINISHED

A receiver (a long-running task in a slot of its own) holds the connection and stores what it
reads every 200 ms as a block in the query's checkpoint before it counts as received; each batch
counts the blocks stored when it is planned, and a batch run again after a failure counts
exactly the same ones. Each batch's counts go to the TaskManagers' logs under Spark Streaming's
"Time: ..." header, or with --output as CSV files committed batch by batch.

`python3 deploy/dev.py socket` runs it end to end on a fresh local cluster, with a small line
server of its own.
"""

from __future__ import annotations

import argparse

from funke import ExecutionEnvironment, JobGraph


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="socket_wordcount", description="Counts the words of lines from a socket.")
    parser.add_argument("--host", default="localhost", help="the line server's host (default localhost)")
    parser.add_argument("--port", type=int, default=1234, help="its port (default 1234)")
    parser.add_argument("--output", help="directory the per-batch counts go to, as CSV; printed when absent")
    parser.add_argument("--trigger", default="2 s", help="the batch interval (default 2 s, as the seed)")
    parser.add_argument("--max-rate", type=int, help="lines a second the receiver takes at most")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of the counting operators")
    opts = parser.parse_args(args)

    # Defined here so that cloudpickle ships them by value (TaskManagers cannot import this file).
    def split(line: str) -> list[str]:
        return line.split(" ")

    def pair(word: str) -> tuple[str, int]:
        return (word, 1)

    def add(a, b) -> tuple[str, int]:
        return (a.word, a.n + b.n)

    env = ExecutionEnvironment("socket word count", parallelism=opts.parallelism)
    counts = (
        env.read_stream.socket_text(opts.host, opts.port, max_rate=opts.max_rate)
        .flat_map(split, schema="word string")
        .map(pair, schema="word string, n int")
        .key_by("word")
        .per_batch()  # each batch's counts on their own, as reduceByKey per batch
        .reduce(add)
    )
    if opts.output:
        counts.write_csv(opts.output)
    else:
        counts.print()
    env.set_trigger(opts.trigger)
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
