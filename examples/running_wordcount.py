"""Running word count: every word's count since the query began, over text files as they arrive
in a directory (Structured Streaming's `groupBy("word").count()` on a file stream, Flink's
`keyBy(word).sum(1)`). The counts are keyed state kept in the query's checkpoint, so a stopped
query started again, even at another parallelism, goes on counting where it left off.

Run it on a cluster with:

    funke submit examples/running_wordcount.py -- --input /tmp/incoming --output /tmp/totals
    funke progress JOB          # its micro-batches
    funke stop JOB              # the batch in flight finishes and commits

Move files into the input directory (write them elsewhere, then rename them in). With the default
--mode update, each batch writes the words it saw with their new totals as Parquet into --output
(read the newest row per word for the current totals); with --mode complete each batch writes
every word's total. `<output>/_funke_sink_log/<n>` lists the files batch n committed. Without
--output the totals are printed per batch in the TaskManagers' logs.
"""

from __future__ import annotations

import argparse
import re

from funke import ExecutionEnvironment, JobGraph

# Anything that is not a letter separates words (as in examples/wordcount.py).
NON_LETTERS = re.compile(r"[\W\d_]+")


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="running_wordcount", description="Counts words of arriving files, "
                                     "every word's count since the start.")
    parser.add_argument("--input", required=True, help="the directory files arrive in")
    parser.add_argument("--output", help="directory the totals go to, as Parquet; printed when absent")
    parser.add_argument("--mode", choices=("update", "complete"), default="update",
                        help="update: each batch writes the words it changed; complete: every word (default update)")
    parser.add_argument("--trigger", default="1 s", help="the batch interval (default 1 s)")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (where the counts are kept)")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of every operator")
    opts = parser.parse_args(args)

    # Defined here so that cloudpickle ships the function by value (see streaming_wordcount.py).
    def words(line: str) -> list[str]:
        return [w for w in NON_LETTERS.split(line.lower()) if w]

    env = ExecutionEnvironment("running word count", parallelism=opts.parallelism)
    totals = (
        env.read_stream.text(opts.input)
        .flat_map(words, schema="word string")
        .key_by("word")
        .count()  # a running count: the word's count over every batch so far
    )
    if opts.output:
        totals.write_parquet(opts.output)
    else:
        totals.print()
    env.set_output_mode(opts.mode).set_trigger(opts.trigger)
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
