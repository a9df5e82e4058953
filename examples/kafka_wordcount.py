"""Running word count from one Kafka topic into another, exactly once: each record's value is a
line of text; every batch writes the words it saw with their new totals to --output, one record
per word (key: the word, value: its total), in one Kafka transaction per batch.

Run it on a cluster with:

    funke submit examples/kafka_wordcount.py -- --bootstrap 127.0.0.1:9092 --input lines --output totals
    funke progress JOB          # its micro-batches, with each partition's offsets and lag
    funke stop JOB              # the batch in flight finishes and commits

Each batch's offsets are logged in the query's checkpoint before it runs and read with assign +
seek, never through a consumer group; the JobMaster commits a batch's records together with a
marker naming the batch, so a batch run again after a failure writes nothing twice, and a
consumer reading `read_committed` sees every total once. The keyed counts live in the
checkpoint: a query stopped and started again goes on counting. Without a broker at hand,
`funke.testing.KafkaBroker` starts one (add `--end-offsets fetch` for it: docs/streaming/kafka.md).
"""

from __future__ import annotations

import argparse
import re

from funke import ExecutionEnvironment, JobGraph

# Anything that is not a letter separates words (as in examples/wordcount.py).
NON_LETTERS = re.compile(r"[\W\d_]+")


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="kafka_wordcount", description="Counts the words of a Kafka topic's "
                                     "lines into another topic, exactly once.")
    parser.add_argument("--bootstrap", required=True, help="the brokers, host:port[,host:port...]")
    parser.add_argument("--input", required=True, help="the topic of lines")
    parser.add_argument("--output", required=True, help="the topic the totals go to (key: word, value: total)")
    parser.add_argument("--starting", choices=("earliest", "latest"), default="earliest",
                        help="where a new query starts reading (default earliest)")
    parser.add_argument("--end-offsets", choices=("list", "fetch"), default="list",
                        help="how a partition's end is asked for: list (Kafka) or fetch (the Tansu test broker)")
    parser.add_argument("--trigger", default="1 s", help="the batch interval (default 1 s)")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (offsets and counts)")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of every operator")
    opts = parser.parse_args(args)

    # Defined here so that cloudpickle ships the function by value (see streaming_wordcount.py).
    def words(line: str | None) -> list[str]:
        return [w for w in NON_LETTERS.split((line or "").lower()) if w]

    env = ExecutionEnvironment("kafka word count", parallelism=opts.parallelism)
    (env.read_stream.kafka(opts.bootstrap, opts.input, starting=opts.starting, end_offsets=opts.end_offsets)
        .select("CAST(value AS STRING) AS line")
        .flat_map(words, schema="word string")
        .key_by("word")
        .count()                                   # a running count: every batch so far
        .select("word AS key", "CAST(count AS STRING) AS value")
        .write_kafka(opts.bootstrap, opts.output, key="key", value="value"))
    env.set_output_mode("update").set_trigger(opts.trigger)
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
