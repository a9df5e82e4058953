"""Chaos for Spark's Python daemon: does cancelling one Spark job kill the Python workers of
another job running in the same SparkSession (one TaskManager's)?

    python tests/chaos/chaos_python_daemon.py [--rounds 20] [--slots 2] [--spark-conf K=V ...]

One SparkSession, asked for what a TaskManager asks (`sparksession.plan`, local[slots]). Each
round runs a "victim" Spark job, one Python UDF (mapInArrow) that takes --victim-s seconds,
while an "aggressor" thread submits tagged jobs of --aggressor-partitions Python tasks each and
cancels each by its tag (`interruptTag` and `cancelJobsWithTag`, as taskmanager/task.py's
`_interrupt` does, re-sent until the job returned) a random 0..--max-cancel-ms after its first
task started: the aggressor's Python workers die with its tasks, so its next tasks fork new ones
while they are being cancelled.

Printed: victim rounds, how many of them crashed ("Python worker exited unexpectedly"), the
aggressor jobs cancelled, and how often Spark restarted its Python daemon (PythonWorkerFactory's
"Lost connection to Python daemon" / "daemon unexpectedly quit", counted in the JVM's stderr,
which this script captures into --log). Exit code 0 only if no victim crashed.

The race is narrow (a task must be cancelled while it waits for its worker's pid); these widen
it: `--spark-conf spark.python.worker.reuse=false` (every aggressor task forks a worker),
`--pause-daemon-ms` (the daemon paused and resumed again and again: slow to answer, as on a
loaded machine), `--cpu-hogs`. Spark's default (the interrupts back) against funke's:

    A="--rounds 30 --slots 3 --pause-daemon-ms 50 --aggressor-partitions 40 --aggressor-task-s 0 \
       --max-cancel-ms 300 --spark-conf spark.python.worker.reuse=false"
    python tests/chaos/chaos_python_daemon.py $A --spark-conf spark.sql.execution.interruptOnCancel=true
    python tests/chaos/chaos_python_daemon.py $A

Not part of the test suite (minutes); tests/integration/test_spark_cancel_isolation.py forces
the race once, deterministically.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from funke.taskmanager import sparksession  # noqa: E402

CRASH = "Python worker exited unexpectedly"
RESTART_MARKS = ("Lost connection to Python daemon", "daemon unexpectedly quit")


def victim_udf(seconds: float):
    def run(batches):
        import time as _time
        deadline = _time.monotonic() + seconds
        for batch in batches:
            while _time.monotonic() < deadline:
                _time.sleep(0.02)
            yield batch
    return run


def aggressor_udf(seconds: float):
    def run(batches):
        import time as _time
        for batch in batches:
            _time.sleep(seconds)
            yield batch
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--slots", type=int, default=2, help="local[N], as a TaskManager with N slots")
    p.add_argument("--victim-s", type=float, default=2.0)
    p.add_argument("--aggressor-partitions", type=int, default=4)
    p.add_argument("--aggressor-task-s", type=float, default=1.0, help="how long each aggressor task's UDF takes")
    p.add_argument("--max-cancel-ms", type=float, default=30.0)
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="on top of what a TaskManager asks for (as --spark-conf of a TaskManager)")
    p.add_argument("--log", help="where the JVM's stderr goes (default: a temporary file)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pause-daemon-ms", type=float, default=0.0,
                   help="SIGSTOP Spark's Python daemon this long, again and again (as long running between): a "
                        "daemon slow to answer, as on a loaded machine; widens the race")
    p.add_argument("--cpu-hogs", type=int, default=0,
                   help="busy processes beside it, as on a machine shared with other work (the suite's other clusters)")
    args = p.parse_args()
    user_conf = tuple(tuple(kv.split("=", 1)) for kv in args.spark_conf)

    scratch = tempfile.mkdtemp(prefix="funke-chaos-daemon-")
    for sub in ("spark", "jvm"):
        os.makedirs(os.path.join(scratch, sub))
    log_path = args.log or os.path.join(scratch, "jvm-stderr.log")
    # The JVM inherits fd 2: its log (and the Python daemon's, through it) goes to the file.
    saved_stderr = os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 2)

    plan = sparksession.plan(master=None, remote=None, slots=args.slots, cores=args.slots, user_conf=user_conf,
                             scratch=scratch, environ=os.environ, python=sys.executable)
    os.environ.update(plan.environ)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(plan.target).appName("chaos-python-daemon")
    for key, value in plan.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    sc = spark.sparkContext
    rng = random.Random(args.seed)
    schema = "id long"
    stop = threading.Event()
    counts = {"aggressor_jobs": 0, "aggressor_cancelled": 0, "aggressor_other": 0}

    jvm_tracker = sc._jsc.sc().statusTracker()
    tracker = sc.statusTracker()

    def active_tasks(tag: str) -> int:
        active = 0
        for job_id in jvm_tracker.getJobIdsForTag(tag):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job else ()):
                stage = tracker.getStageInfo(stage_id)
                active += stage.numActiveTasks if stage else 0
        return active

    def aggressor() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            tag = f"aggressor-{n}"
            done = threading.Event()

            def job() -> None:
                spark.addTag(tag)
                sc.addJobTag(tag)
                try:
                    spark.range(args.aggressor_partitions, numPartitions=args.aggressor_partitions) \
                        .mapInArrow(aggressor_udf(args.aggressor_task_s), schema).collect()
                except Exception as e:  # cancelled, as meant
                    key = "aggressor_cancelled" if "cancel" in str(e).lower() else "aggressor_other"
                    counts[key] += 1
                finally:
                    spark.removeTag(tag)
                    sc.removeJobTag(tag)
                    done.set()

            thread = threading.Thread(target=job, daemon=True)
            thread.start()
            counts["aggressor_jobs"] += 1
            # Cancelled once its first task runs (then it sets its Python worker up), after a
            # random delay: the window in which a task is killed while it starts its worker.
            while not done.is_set() and not active_tasks(tag):
                time.sleep(0.001)
            time.sleep(rng.uniform(0, args.max_cancel_ms) / 1000)
            while not done.wait(0.5):  # re-sent until the job returns, as funke's Task does
                spark.interruptTag(tag)
                sc.cancelJobsWithTag(tag)
            thread.join()

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.cpu_hogs)]
    jvm_pid = sc._gateway.proc.pid

    def pauser() -> None:
        pause = args.pause_daemon_ms / 1000
        while not stop.is_set():
            daemons = []
            for child in psutil.Process(jvm_pid).children():
                try:
                    if "pyspark.daemon" in " ".join(child.cmdline()):
                        child.suspend()
                        daemons.append(child)
                except psutil.Error:  # gone, or a zombie
                    pass
            time.sleep(pause)
            for daemon in daemons:
                try:
                    daemon.resume()
                except psutil.Error:
                    pass
            time.sleep(pause)

    # Warm up: the daemon and a first worker exist before the chaos starts.
    spark.range(1, numPartitions=1).mapInArrow(victim_udf(0.0), schema).collect()
    threading.Thread(target=aggressor, daemon=True).start()
    pausing = threading.Thread(target=pauser, daemon=True) if args.pause_daemon_ms > 0 else None
    if pausing is not None:
        pausing.start()
    crashed = other = 0
    try:
        for round_ in range(args.rounds):
            try:
                spark.range(1, numPartitions=1).mapInArrow(victim_udf(args.victim_s), schema).collect()
                outcome = "ok"
            except Exception as e:
                text = str(e)
                if CRASH in text:
                    crashed += 1
                    outcome = "CRASHED"
                else:
                    other += 1
                    outcome = f"failed otherwise: {text.splitlines()[0][:200]}"
            print(f"round {round_ + 1}/{args.rounds}: victim {outcome}", file=os.fdopen(os.dup(saved_stderr), "w"),
                  flush=True)
    finally:
        stop.set()
        if pausing is not None:
            pausing.join()
        for hog in hogs:
            hog.kill()
            hog.wait()
        time.sleep(1.5)
        spark.stop()
        os.dup2(saved_stderr, 2)
        os.close(log_fd)
    with open(log_path, errors="replace") as f:
        text = f.read()
    restarts = sum(text.count(mark) for mark in RESTART_MARKS)
    conf = " ".join(args.spark_conf) or "(a TaskManager's defaults)"
    print(f"conf: {conf}")
    print(f"victim rounds: {args.rounds}, crashed: {crashed}, failed otherwise: {other}")
    print(f"aggressor jobs: {counts['aggressor_jobs']}, cancelled: {counts['aggressor_cancelled']}, "
          f"ended otherwise: {counts['aggressor_other']}")
    print(f"Python daemon restarts (JVM log): {restarts}; worker-connect timeouts: "
          f"{len(re.findall('Timed out while waiting for the Python worker', text))}")
    print(f"JVM log: {log_path}")
    return 0 if crashed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
