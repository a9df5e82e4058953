"""Receivers: how many lines a second a socket receiver takes, stores and a query counts, on the
given cores.

    python tests/benchmarks/bench_receivers.py [--cores 2] [--seconds 15] [--json FILE]

A local cluster of one TaskManager with --cores slots (Spark local[cores]): the receiver holds
a slot of its own, the query's other tasks share the rest. A sender on loopback writes lines
(about 45 bytes, 5 words each) at each rate of the sweep, in a chunk every 10 ms; two queries,
each at a 1 s trigger, for --seconds per rate:

  - receive:      socket_text -> discard (every block read by Spark, no Python per line: the
                  receiver and the block reads alone);
  - word count:   the seed's program, socket_text -> flat_map(split) -> map((w, 1)) ->
                  key_by(word).reduce(+) (a Python function per line and per word).

A rate is sustained when the sender could write at it (a receiver that falls behind stops
reading, and TCP holds the sender back), every line sent was counted by the query's batches
within 3 intervals of the sender stopping, and the batches kept up (median batch duration at
most the interval). Printed per query: the sweep, the highest rate sustained, and the batch
durations p50/p99 at that rate. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SWEEP = (10_000, 25_000, 50_000, 100_000, 150_000, 200_000, 300_000, 400_000, 600_000, 800_000)
WARM_UP_BATCHES = 2
TICK_S = 0.01
WORDS = ("spark", "flink", "stream", "batch", "slot", "vertex", "block", "receiver", "offset", "commit", "region")


def split(line):
    return line.split(" ")


def pair(word):
    return (word, 1)


def add(a, b):
    return (a.word, a.n + b.n)


class Sender:
    """A loopback server that writes `rate` lines a second to the first connection, in one
    chunk per tick, until stopped; `sent` counts the lines the kernel took."""

    def __init__(self, rate: int):
        self.rate = rate
        self.sent = 0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._stop, self._closed = threading.Event(), threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(5)) for i in range(997)]
        self._pool = [(line + "\n").encode() for line in lines]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._server.settimeout(0.5)
        conn = None
        while not self._stop.is_set() and conn is None:
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, OSError):
                continue
        if conn is None:
            return
        with conn:
            self.started_at = next_at = time.monotonic()
            due = 0.0
            i = 0
            while not self._stop.is_set():
                due += self.rate * TICK_S
                n = int(due) - self.sent
                if n > 0:
                    chunk = b"".join(self._pool[(i + k) % len(self._pool)] for k in range(n))
                    i += n
                    try:
                        conn.sendall(chunk)  # blocks while the receiver does not read
                    except OSError:
                        break
                    self.sent += n
                next_at += TICK_S
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.stopped_at = time.monotonic()
            # keep the connection: the receiver reads what is in flight
            while not self._closed.is_set():
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + 30
        while self.stopped_at is None and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def achieved(self) -> float:
        if self.started_at is None or self.stopped_at is None:
            return 0.0
        return self.sent / max(1e-9, self.stopped_at - self.started_at)

    def close(self) -> None:
        self._stop.set()
        self._closed.set()
        self._thread.join(5)
        self._server.close()


def build(query: str, port: int, checkpoint: Path, out: Path):
    from funke.common.api.dsl import ExecutionEnvironment

    env = ExecutionEnvironment(f"bench receiver {query} {port}", parallelism=1)
    lines = env.read_stream.socket_text("127.0.0.1", port)
    if query == "receive":
        lines.discard()
    else:
        (lines.flat_map(split, schema="word string").map(pair, schema="word string, n int")
            .key_by("word").per_batch().reduce(add).write_parquet(str(out)))
    env.set_trigger("1 s").set_checkpoint_location(str(checkpoint))
    return env.build()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--queries", default="receive,wordcount")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import cloudpickle

    from funke.deploy import localcluster
    from funke.deploy.client import JobManagerClient, job_status_name

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict = {"cores": args.cores, "seconds": args.seconds, "sweep_top": SWEEP[-1], "queries": {}}
    with tempfile.TemporaryDirectory(prefix="funke-bench-receivers-") as tmp:
        root = Path(tmp)
        info = localcluster.start(localcluster.ClusterSpec(root / "cluster", 1, args.cores))
        client = info.client(timeout=600)
        runs = 0

        def run(query: str, rate: int) -> dict:
            nonlocal runs
            runs += 1
            sender = Sender(rate)
            try:
                job_id = client.submit(build(query, sender.port, root / f"ck-{runs}", root / f"out-{runs}"))
                deadline = time.time() + 120
                while sender.started_at is None:  # the receiver connected
                    if time.time() > deadline:
                        raise SystemExit(f"the receiver of {job_id} did not connect: {client.get_job(job_id)}")
                    time.sleep(0.05)
                time.sleep(args.seconds)
                sender.stop()
                counted, deadline = 0, time.time() + 3
                while time.time() < deadline:  # the lines in flight: stored and counted
                    records = client.progress(job_id)
                    counted = sum(r["numInputRows"] for r in records)
                    if counted >= sender.sent:
                        break
                    time.sleep(0.1)
                client.cancel(job_id)
                while job_status_name(client.get_job(job_id).status) not in ("CANCELED", "FAILED", "FINISHED"):
                    time.sleep(0.1)
            finally:
                sender.close()
            batches = [r for r in records if r.get("numInputRows", 0) > 0][WARM_UP_BATCHES:]
            d = sorted(r["durationMs"]["triggerExecution"] for r in batches)
            figures = {"rate": rate, "sent": sender.sent, "achieved_per_s": round(sender.achieved),
                       "counted": counted, "batches": len(d),
                       "p50_ms": statistics.median(d) if d else None,
                       "p99_ms": d[min(len(d) - 1, round(0.99 * (len(d) - 1)))] if d else None}
            figures["keeps_up"] = (sender.achieved >= 0.98 * rate and counted == sender.sent
                                   and bool(d) and figures["p50_ms"] <= 1000)
            print(f"{query} at {rate:,} lines/s: {figures}", file=sys.stderr, flush=True)
            return figures

        try:
            print("warm-up ...", file=sys.stderr)
            run("receive", 1000)
            for query in args.queries.split(","):
                sweep, best = [], None
                for rate in SWEEP:
                    figures = run(query, rate)
                    sweep.append(figures)
                    if not figures["keeps_up"]:
                        break
                    best = figures
                results["queries"][query] = {"sweep": sweep, "sustained_lines_per_s": best["rate"] if best else 0,
                                             "at_sustained": best}
        finally:
            client.close()
            localcluster.stop(root / "cluster")
    for query, r in results["queries"].items():
        best = r["at_sustained"]
        top = " (the sweep's top: at least that much)" if r["sustained_lines_per_s"] == SWEEP[-1] else ""
        print(f"{query}: sustained {r['sustained_lines_per_s']:,} lines/s on {args.cores} cores{top}"
              + (f" (batch duration p50 {best['p50_ms']} ms, p99 {best['p99_ms']} ms at a 1 s trigger)" if best else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
