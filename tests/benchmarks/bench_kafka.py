"""Kafka: the source's ingest rate against confluent-kafka's own, end-to-end latency, and the
exactly-once sink's cost, on a local cluster and a Tansu broker (funke.testing.KafkaBroker).

    python tests/benchmarks/bench_kafka.py [--cores 2] [--records 2000000] [--rate 10000]
                                           [--seconds 20] [--sink-records 200000] [--sink-repeats 3]
                                           [--skip a,b,c] [--json FILE]

(a) ingest: a 4-partition topic pre-filled with --records small records (8-byte keys, ~16-byte
    values); funke's pass-through query Kafka -> Parquet (available-now, parallelism --cores, one
    TaskManager with --cores slots) in rows/s, from its first batch's start to its last batch's
    commit; against one confluent-kafka consumer in one process reading the same topic (assign
    every partition at 0, consume(num_messages=10000) until every record came); and the ratio
    funke / consumer (the issue's goal: >= 0.8).
(b) latency: records produced at --rate a second for --seconds into a topic a running query reads
    (100 ms trigger) into Parquet; per record, from its Kafka timestamp (the producer's create
    time) to the commit of the batch that took it (its commit-log entry's committedAtMs); p50,
    p99 and max, the first 3 s left out (warm-up).
(c) the exactly-once sink's cost: a topic pre-filled with --sink-records records copied by an
    available-now query into another topic with write_kafka, guarantee exactly_once and
    at_least_once alternating, --sink-repeats times each after one warm-up run (each into a fresh
    topic), rows/s as in (a) (the median), and the ratio.
No timing assertions: figures for the issue and the docs. The two sides never run at once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def fill(bootstrap: str, topic: str, n: int) -> float:
    """n records into the topic's partitions round robin; returns the seconds it took."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 500000})
    started = time.monotonic()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, key=b"%08d" % (i % 100000000), value=b"record-%010d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise SystemExit(f"{topic}: records not delivered within 300 s")
    return time.monotonic() - started


def consumer_rate(bootstrap: str, topic: str, n: int) -> float:
    """rows/s of one confluent-kafka consumer reading the topic's n records from the start."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-direct", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got, started, deadline = 0, time.monotonic(), time.monotonic() + 600
        while got < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic}: the consumer read {got} of {n} records in 600 s")
            for m in consumer.consume(num_messages=10000, timeout=1):
                if m.error() is None:
                    _ = m.value()
                    got += 1
        return n / (time.monotonic() - started)
    finally:
        consumer.close()


def _ms(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


def wait_finished(client, job_id: str, timeout: float = 900) -> None:
    from funke.deploy.client import job_status_name

    deadline = time.time() + timeout
    while (status := job_status_name(client.get_job(job_id).status)) not in ("FINISHED", "FAILED", "CANCELED"):
        if time.time() > deadline:
            raise SystemExit(f"job {job_id} did not finish within {timeout} s")
        time.sleep(0.2)
    if status != "FINISHED":
        raise SystemExit(f"job {job_id} ended {status}: {client.get_job(job_id).failure.message[:2000]}")


def query_rate(client, job_id: str, checkpoint: Path) -> tuple[float, int, int]:
    """(rows/s from the first batch's start to the last commit, rows, batches) of a finished query."""
    from funke.jobmanager.checkpointstore import CheckpointStore

    records = [r for r in client.progress(job_id) if r.get("numInputRows", 0) > 0]
    store = CheckpointStore(str(checkpoint))
    last = store.read_commit(store.commit_ids()[-1]).committed_at_ms
    rows = sum(r["numInputRows"] for r in records)
    return rows / ((last - _ms(records[0]["timestamp"])) / 1000), rows, len(records)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--records", type=int, default=2_000_000, help="(a): records pre-filled")
    p.add_argument("--max-offsets", type=int, default=500_000, help="(a), (c): max_offsets_per_trigger")
    p.add_argument("--rate", type=int, default=10_000, help="(b): records a second")
    p.add_argument("--seconds", type=float, default=20, help="(b): how long records are produced")
    p.add_argument("--sink-records", type=int, default=200_000, help="(c): records copied per guarantee")
    p.add_argument("--sink-repeats", type=int, default=3, help="(c): runs per guarantee (the median is shown)")
    p.add_argument("--skip", default="", help="parts to leave out: a, b and/or c (comma-separated)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    sys.path.insert(0, str(REPO))
    import cloudpickle
    import pyarrow.parquet as pq

    from funke.common.api.dsl import ExecutionEnvironment
    from funke.deploy import localcluster
    from funke.jobmanager import streamsinks
    from funke.jobmanager.checkpointstore import CheckpointStore
    from funke.testing import KafkaBroker

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict = {"cores": args.cores, "load_1min": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="funke-bench-kafka-") as tmp:
        root = Path(tmp)
        broker = KafkaBroker(root / "broker")
        info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, args.cores))
        client = info.client(timeout=600)
        opts = broker.source_options
        try:
            if "a" not in skip:
                topic = "ingest"
                broker.create_topic(topic, PARTITIONS)
                print(f"(a) filling {topic} with {args.records} records ...", file=sys.stderr)
                filled = fill(broker.bootstrap, topic, args.records)
                direct = consumer_rate(broker.bootstrap, topic, args.records)
                env = ExecutionEnvironment("bench kafka ingest", parallelism=args.cores)
                (env.read_stream.kafka(broker.bootstrap, topic, starting="earliest",
                                       max_offsets_per_trigger=args.max_offsets, **opts)
                    .write_parquet(str(root / "ingest-out")))
                env.set_trigger(available_now=True).set_checkpoint_location(str(root / "ingest-ck"))
                job_id = client.submit(env.build())
                wait_finished(client, job_id)
                rate, rows, batches = query_rate(client, job_id, root / "ingest-ck")
                if rows != args.records:
                    raise SystemExit(f"(a) the query read {rows} records, not {args.records}")
                results["ingest"] = {"records": args.records, "fill_s": round(filled, 1),
                                     "consumer_rows_per_s": round(direct), "funke_rows_per_s": round(rate),
                                     "batches": batches, "ratio": round(rate / direct, 3)}
                print(f"(a) {results['ingest']}", file=sys.stderr)
            if "b" not in skip:
                from confluent_kafka import Producer

                topic, out, checkpoint = "latency", root / "latency-out", root / "latency-ck"
                broker.create_topic(topic, PARTITIONS)
                env = ExecutionEnvironment("bench kafka latency", parallelism=args.cores)
                (env.read_stream.kafka(broker.bootstrap, topic, starting="earliest", **opts)
                    .select("timestamp", "partition", "offset").write_parquet(str(out)))
                env.set_trigger("100 ms").set_checkpoint_location(str(checkpoint))
                job_id = client.submit(env.build())
                while not client.progress(job_id):  # running: its first (empty) batch done
                    time.sleep(0.1)
                producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
                sent, started = 0, time.monotonic()
                print(f"(b) producing {args.rate} records/s for {args.seconds:g} s ...", file=sys.stderr)
                while (elapsed := time.monotonic() - started) < args.seconds:
                    due = int(elapsed * args.rate)
                    for i in range(sent, due):
                        producer.produce(topic, value=b"record-%010d" % i, partition=i % PARTITIONS)
                    sent = max(sent, due)
                    producer.poll(0)
                    time.sleep(0.002)
                if producer.flush(60):
                    raise SystemExit("(b) records not delivered within 60 s")
                del producer  # its connections closed before the broker stops
                store = CheckpointStore(str(checkpoint))
                deadline = time.time() + 180
                def taken() -> int:  # the records the committed batches took (the topic began empty)
                    commits = store.commit_ids() if (checkpoint / "commits").exists() else []
                    if not commits:
                        return 0
                    (r,) = store.read_offsets(commits[-1]).sources.values()
                    return sum(int(o) for parts in (r.end or {}).values() for o in parts.values())

                while taken() < sent:  # (the progress records kept are the recent ones only)
                    if time.time() > deadline:
                        raise SystemExit(f"(b) the query took {taken()} of {sent} records in 180 s")
                    time.sleep(0.2)
                client.stop(job_id, timeout_s=60)
                wait_finished(client, job_id)
                first_ms = None
                latencies = []
                for b in streamsinks.committed_batches(str(out)):
                    committed = store.read_commit(b).committed_at_ms
                    for f in streamsinks.committed_files(str(out), b):
                        for ts in pq.read_table(out / f, columns=["timestamp"]).column(0).to_pylist():
                            ms = ts.timestamp() * 1000
                            first_ms = ms if first_ms is None else min(first_ms, ms)
                            latencies.append((ms, committed - ms))
                kept = [lat for ms, lat in latencies if ms >= first_ms + 3000]
                batches = [r for r in client.progress(job_id) if r.get("numInputRows", 0) > 0]  # the recent ones
                results["latency"] = {"rate": args.rate, "seconds": args.seconds, "records": len(latencies),
                                      "measured": len(kept), "p50_ms": round(percentile(kept, 0.5)),
                                      "p99_ms": round(percentile(kept, 0.99)), "max_ms": round(max(kept)),
                                      "batches": len(streamsinks.committed_batches(str(out))),
                                      "batch_p50_ms": statistics.median(r["durationMs"]["triggerExecution"]
                                                                        for r in batches)}
                print(f"(b) {results['latency']}", file=sys.stderr)
            if "c" not in skip:
                topic = "sinkin"
                broker.create_topic(topic, PARTITIONS)
                print(f"(c) filling {topic} with {args.sink_records} records ...", file=sys.stderr)
                fill(broker.bootstrap, topic, args.sink_records)
                results["sink"] = {"records": args.sink_records, "repeats": args.sink_repeats}
                runs: dict[str, list[float]] = {"exactly_once": [], "at_least_once": []}
                for n in range(-1, args.sink_repeats):  # alternating, so a load change hits both sides
                    for guarantee in ("exactly_once", "at_least_once") if n >= 0 else ("at_least_once",):
                        target, checkpoint = f"sinkout-{guarantee}-{n}", root / f"sink-ck-{guarantee}-{n}"
                        broker.create_topic(target, PARTITIONS)
                        env = ExecutionEnvironment(f"bench kafka sink {guarantee} {n}", parallelism=args.cores)
                        (env.read_stream.kafka(broker.bootstrap, topic, starting="earliest",
                                               max_offsets_per_trigger=args.max_offsets, **opts)
                            .select("key", "value").write_kafka(broker.bootstrap, target, key="key",
                                                                guarantee=guarantee))
                        env.set_trigger(available_now=True).set_checkpoint_location(str(checkpoint))
                        job_id = client.submit(env.build())
                        wait_finished(client, job_id)
                        rate, rows, batches = query_rate(client, job_id, checkpoint)
                        if n < 0:  # a warm-up (the cluster's first query when (a) and (b) are skipped)
                            continue
                        runs[guarantee].append(rate)
                        print(f"(c) {guarantee} run {n + 1}: {rate:.0f} rows/s, {batches} batch(es)", file=sys.stderr)
                for guarantee, rates in runs.items():
                    results["sink"][guarantee] = {"rows_per_s": round(statistics.median(rates)),
                                                  "runs": [round(r) for r in rates]}
                s = results["sink"]
                s["ratio"] = round(s["exactly_once"]["rows_per_s"] / s["at_least_once"]["rows_per_s"], 3)
        finally:
            client.close()
            localcluster.stop(root / "cluster")
            broker.stop()
    results["load_1min_after"] = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load (1 min) {results['load_1min']:.2f} before, "
          f"{results['load_1min_after']:.2f} after; one TaskManager with {args.cores} slots")
    if "ingest" in results:
        i = results["ingest"]
        print(f"(a) ingest of {i['records']} records (Kafka -> Parquet, available-now, {i['batches']} batches): "
              f"funke {i['funke_rows_per_s']} rows/s; one confluent-kafka consumer {i['consumer_rows_per_s']} "
              f"rows/s; ratio {i['ratio']:.2f} (goal >= 0.8)")
    if "latency" in results:
        lat = results["latency"]
        print(f"(b) latency at {lat['rate']} records/s, 100 ms trigger, Kafka timestamp -> batch commit "
              f"({lat['measured']} records after the first 3 s, {lat['batches']} batches): p50 {lat['p50_ms']} ms, "
              f"p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms (batch duration p50 of the recent batches {lat['batch_p50_ms']} ms)")
    if "sink" in results:
        s = results["sink"]
        print(f"(c) write_kafka of {s['records']} records (available-now, median of {s['repeats']} runs each, "
              f"alternating): exactly_once {s['exactly_once']['rows_per_s']} rows/s {s['exactly_once']['runs']}, "
              f"at_least_once {s['at_least_once']['rows_per_s']} rows/s {s['at_least_once']['runs']}; "
              f"ratio {s['ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
