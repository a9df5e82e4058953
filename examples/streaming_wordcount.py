"""Streaming word count: the words of text files as they arrive in a directory, counted per
micro-batch (Spark Streaming's `textFileStream(dir).flatMap(split).map((_, 1)).reduceByKey(_ + _)`).

Run it on a cluster with:

    funke submit examples/streaming_wordcount.py -- --input /tmp/incoming --output /tmp/counts
    funke progress JOB          # its micro-batches: rows, rates, durations
    funke stop JOB              # the batch in flight finishes and commits; the job ends FINISHED

Move files into the input directory (write them elsewhere, then rename them in: a file being
written must not be seen half-done). Each batch takes the files that arrived since the last one,
at most --max-files-per-trigger of them, and writes its counts as CSV files into --output; a
file's batch and subtask are in its name (`batch-<n>-<subtask>-part-...csv`), and
`<output>/_funke_sink_log/<n>` lists the files batch n committed. A batch's output appears all
at once or not at all, and never twice, whatever fails: the query's checkpoint (--checkpoint,
default `<data dir>/checkpoints/streaming_word_count`) logs each batch's files before it runs.
Without --output the counts are printed per batch in the TaskManagers' logs.

`python3 deploy/dev.py stream` runs it end to end on a fresh local cluster, feeding it the
corpus of examples/data/ file by file.
"""

from __future__ import annotations

import argparse
import re

from funke import ExecutionEnvironment, JobGraph

# Anything that is not a letter separates words (as in examples/wordcount.py).
NON_LETTERS = re.compile(r"[\W\d_]+")


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="streaming_wordcount", description="Counts words of arriving files.")
    parser.add_argument("--input", required=True, help="the directory files arrive in")
    parser.add_argument("--output", help="directory the per-batch counts go to, as CSV; printed when absent")
    parser.add_argument("--trigger", default="1 s", help="the batch interval (default 1 s)")
    parser.add_argument("--available-now", action="store_true",
                        help="count the files there now, in batches, then finish")
    parser.add_argument("--max-files-per-trigger", type=int, default=2, help="files per batch at most (default 2)")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of every operator")
    opts = parser.parse_args(args)

    # Defined here rather than at module level so that cloudpickle ships the function by value:
    # the TaskManagers cannot import this file as a module.
    def words(line: str) -> list[str]:
        return [w for w in NON_LETTERS.split(line.lower()) if w]

    env = ExecutionEnvironment("streaming word count", parallelism=opts.parallelism)
    counts = (
        env.read_stream.text(opts.input, max_files_per_trigger=opts.max_files_per_trigger)
        .flat_map(words, schema="word string")
        .key_by("word")
        .per_batch()  # each batch's counts on their own (examples/running_wordcount.py: running totals)
        .count()
    )
    if opts.output:
        counts.write_csv(opts.output)
    else:
        counts.print()
    if opts.available_now:
        env.set_trigger(available_now=True)
    else:
        env.set_trigger(opts.trigger)
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
