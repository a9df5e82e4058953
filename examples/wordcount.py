"""Word count: the classic first job, over the small corpus in examples/data/.

Run it as a script (on the cluster $FUNKE_JOBMANAGER or `funke cluster start` names, else on an
embedded mini cluster it starts and stops itself):

    python examples/wordcount.py

or submit it to a cluster:

    funke submit examples/wordcount.py
    funke submit examples/wordcount.py --parallelism 4 --output out/wordcount
    funke submit examples/wordcount.py --input 'docs/**/*.md'

Without --output the counts are collected and the client prints them; with --output they are
written as CSV files (with a header) into that directory, replacing what was there.

The job graph has two vertices, as Flink would chain it: "Source: text -> FlatMap -> Combine
(Count)" reads lines, splits them into words and counts them per subtask (a combiner, as Spark's
map-side combine), and "Count -> ..." receives the partial counts hash-partitioned by word and
adds them up.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from funke import ExecutionEnvironment, JobGraph

DEFAULT_INPUT = str(Path(__file__).resolve().parent / "data" / "*.txt")

# Anything that is not a letter separates words: digits, punctuation, apostrophes, underscores.
NON_LETTERS = re.compile(r"[\W\d_]+")


def environment(args: list[str]) -> ExecutionEnvironment:
    parser = argparse.ArgumentParser(prog="wordcount", description="Counts the words of text files.")
    parser.add_argument("--input", default=DEFAULT_INPUT, help="text files to read (a path or glob)")
    parser.add_argument("--output", help="directory for the counts as CSV; collected when absent")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of every operator")
    opts = parser.parse_args(args)

    # Defined here rather than at module level so that cloudpickle ships the function by value:
    # the TaskManagers cannot import this file as a module.
    def words(line: str) -> list[str]:
        return [w for w in NON_LETTERS.split(line.lower()) if w]

    env = ExecutionEnvironment("word count", job_type="batch", parallelism=opts.parallelism)
    counts = (
        env.read_text(opts.input)
        .flat_map(words, schema="word string")
        .key_by("word")
        .count()
    )
    if opts.output:
        counts.write_csv(opts.output, mode="overwrite")
    else:
        counts.collect()
    return env


def build(args: list[str]) -> JobGraph:
    return environment(args).build()


if __name__ == "__main__":
    import sys
    import time

    started = time.perf_counter()
    result = environment(sys.argv[1:]).execute()
    took = time.perf_counter() - started
    if result.sinks:
        top = result.to_pandas().sort_values(["count", "word"], ascending=[False, True])
        print(top.head(20).to_string(index=False))
    print(f"{result.status} in {result.duration_s:.2f} s ({result.job_id}); {took:.2f} s from execute() to the rows")
