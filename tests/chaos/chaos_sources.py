"""Chaos for the sources that are not files: kill -9 TaskManagers under a receiver (the seed's
socket word count), under a Redis Streams query, under a Delta table stream and under a Kafka
query, run after run, and count what was lost or repeated.

    python tests/chaos/chaos_sources.py [--runs 3] [--source socket,redis,delta,kafka] [--rate 100]

socket: the word count (socket_text -> flat_map -> key_by(word).count() -> CSV, 2 s batches) fed
        by a line server; the TaskManager running the receiver is killed, then one running the
        counting tasks (tests/integration/test_receivers.py: socket_kill_run). Tallied: lines
        sent, stored by the receiver (its blocks in the checkpoint), counted by the committed
        batches, counted twice, stored but never counted, and lost in flight (read by the killed
        receiver, or held for it by the kernel, and never stored: a socket acknowledges nothing).
redis:  two stream keys XADD'ed to, read into a Parquet sink and a Redis sink (2 s batches), a
        TaskManager killed at every phase of a batch (tests/integration/test_redis_streams.py:
        redis_kill_run). Tallied per sink: entries of the committed id ranges, found, duplicates,
        lost.
delta:  versions appended to a Delta table (--rate / 20 a second, 10 rows each) streamed into
        another Delta table (2 s batches), a TaskManager killed at every phase of a batch
        (tests/integration/test_delta.py: delta_kill_run). Tallied: rows of the committed version
        ranges, found in the sink table, duplicates, lost.
kafka:  numbered records produced into a 4-partition topic, read into a Parquet sink and into
        another topic (write_kafka, exactly once; 1 s batches), a TaskManager killed at every phase
        of a batch (tests/integration/test_kafka_exactly_once.py: kafka_kill_run). Tallied per
        sink: records of the committed offset ranges, found (the topic's committed records, read
        from its log with the transaction markers applied), duplicates, lost, records left in an
        open transaction; the seconds from each recovery to the output's last stable offset
        passing every record then in an open transaction.

Each run uses a fresh query on one cluster of three TaskManagers (a replacement is started after
each kill, as a supervisor would) and, for redis, a redis-server of its own on loopback; for kafka, a Tansu broker of its own. Not part
of the test suite (it takes minutes). Exit code 0 only if nothing stored was lost or repeated.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.deploy import localcluster  # noqa: E402
from funke.testing import KafkaBroker  # noqa: E402
from tests.integration.test_delta import delta_kill_run  # noqa: E402
from tests.integration.test_kafka_exactly_once import kafka_kill_run  # noqa: E402
from tests.integration.test_receivers import socket_kill_run  # noqa: E402
from tests.integration.test_redis_streams import redis_kill_run  # noqa: E402
from tests.integration.test_streaming import StreamCluster  # noqa: E402
from tests.redisserver import RedisServer  # noqa: E402

SOCKET_SUMS = ("sent", "stored", "counted", "duplicates", "stored_not_counted", "counted_not_stored",
               "lost_in_flight", "batches_miscounted")
REDIS_SUMS = ("kills", "added", "committed", "file_rows", "file_duplicates", "file_lost", "file_beyond",
              "redis_rows", "redis_duplicates", "redis_lost", "redis_beyond")
DELTA_SUMS = ("kills", "added", "committed", "rows", "duplicates", "lost", "beyond")
KAFKA_SUMS = ("kills", "added", "committed", "file_rows", "file_duplicates", "file_lost", "file_beyond",
              "topic_rows", "topic_duplicates", "topic_lost", "topic_beyond", "topic_aborted", "topic_open")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--source", default="socket,redis", help="socket, redis, delta, kafka (comma-separated)")
    p.add_argument("--rate", type=float, default=100, help="lines (socket), entries (redis) or records (kafka) a second")
    p.add_argument("--kills-per-phase", type=int, default=1, help="redis, delta, kafka: kills at each phase of a batch per run")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    if not set(sources) <= {"socket", "redis", "delta", "kafka"}:
        p.error(f"--source: socket, redis, delta and/or kafka, got {args.source!r}")
    results: dict[str, list[dict]] = {s: [] for s in sources}
    ok = True
    with tempfile.TemporaryDirectory(prefix="funke-chaos-sources-") as tmp:
        root = Path(tmp)
        cluster = StreamCluster(root / "cluster")
        redis = RedisServer(root / "redis") if "redis" in sources else None
        kafka = KafkaBroker(root / "kafka") if "kafka" in sources else None
        try:
            for n in range(1, args.runs + 1):
                for source in sources:
                    cluster.restore()
                    run_dir = root / f"{source}-{n}"
                    run_dir.mkdir()
                    if source == "socket":
                        figures = socket_kill_run(cluster, run_dir, rate=args.rate)
                        ok &= (figures["duplicates"] == figures["stored_not_counted"] == figures["counted_not_stored"]
                               == figures["batches_miscounted"] == 0 and figures["in_order"])
                    elif source == "delta":
                        figures = delta_kill_run(cluster, run_dir, rate=max(1.0, args.rate / 20),
                                                 kills_per_phase=args.kills_per_phase)
                        ok &= (figures["committed"] == figures["committed_distinct"] == figures["added"]
                               == figures["rows"] and figures["duplicates"] == figures["lost"] == 0
                               and figures["recorded_batch"] == figures["last_batch"])
                    elif source == "kafka":
                        assert kafka is not None
                        figures = kafka_kill_run(cluster, kafka, run_dir, rate=args.rate,
                                                 kills_per_phase=args.kills_per_phase)
                        ok &= (figures["committed"] == figures["committed_distinct"] == figures["added"]
                               == figures["file_rows"] == figures["topic_rows"]
                               and figures["file_duplicates"] == figures["file_lost"] == figures["topic_duplicates"]
                               == figures["topic_lost"] == figures["topic_open"] == 0)
                    else:
                        assert redis is not None
                        figures = redis_kill_run(cluster, redis.port, run_dir, rate=args.rate,
                                                 kills_per_phase=args.kills_per_phase)
                        ok &= (figures["committed"] == figures["committed_distinct"] == figures["added"]
                               == figures["file_rows"] == figures["redis_rows"]
                               and figures["file_duplicates"] == figures["file_lost"] == figures["redis_duplicates"]
                               == figures["redis_lost"] == 0)
                    results[source].append({"run": n, **figures})
                    print(json.dumps({"source": source, "run": n, **figures}), flush=True)
        finally:
            cluster.client.close()
            localcluster.stop(cluster.dir)
            if redis is not None:
                redis.stop()
            if kafka is not None:
                kafka.stop()
    print()
    if results.get("socket"):
        t = {k: sum(r[k] for r in results["socket"]) for k in SOCKET_SUMS}
        kills = 2 * len(results["socket"])
        print(f"socket word count: {len(results['socket'])} runs, {kills} kills (receiver's TaskManager, counting "
              f"TaskManager); lines sent {t['sent']}, stored {t['stored']}, counted {t['counted']}; counted twice "
              f"{t['duplicates']}, stored but not counted {t['stored_not_counted']}, batches miscounted "
              f"{t['batches_miscounted']}; lost in flight (never stored) {t['lost_in_flight']}")
    if results.get("redis"):
        t = {k: sum(r[k] for r in results["redis"]) for k in REDIS_SUMS}
        print(f"redis streams: {len(results['redis'])} runs, {t['kills']} kills (every phase of a batch); entries "
              f"added {t['added']}, in committed ranges {t['committed']}; file sink found {t['file_rows']}, "
              f"duplicates {t['file_duplicates']}, lost {t['file_lost']}; redis sink found {t['redis_rows']}, "
              f"duplicates {t['redis_duplicates']}, lost {t['redis_lost']}")
    if results.get("delta"):
        t = {k: sum(r[k] for r in results["delta"]) for k in DELTA_SUMS}
        print(f"delta: {len(results['delta'])} runs, {t['kills']} kills (every phase of a batch); rows added "
              f"{t['added']}, in committed version ranges {t['committed']}; sink table found {t['rows']}, duplicates "
              f"{t['duplicates']}, lost {t['lost']}")
    if results.get("kafka"):
        t = {k: sum(r[k] for r in results["kafka"]) for k in KAFKA_SUMS}
        stable = [s for r in results["kafka"] for s in r["stable_after_recovery_s"]]
        print(f"kafka: {len(results['kafka'])} runs, {t['kills']} kills (every phase of a batch); records added "
              f"{t['added']}, in committed offset ranges {t['committed']}; file sink found {t['file_rows']}, "
              f"duplicates {t['file_duplicates']}, lost {t['file_lost']}; output topic committed {t['topic_rows']}, "
              f"duplicates {t['topic_duplicates']}, lost {t['topic_lost']}, aborted {t['topic_aborted']}, left open "
              f"{t['topic_open']}; last stable offset past the open records after a recovery: max "
              f"{max(stable, default=0):.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
