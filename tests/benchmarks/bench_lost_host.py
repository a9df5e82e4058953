"""A host that drops off the network under a Spark standalone cluster spread over hosts: how long
the healthy host's job takes, with the Spark network timeouts a TaskManager derives from funke's
heartbeats (the default) and with Spark's own (`--spark-timeouts spark`: what a TaskManager asked
for before it derived them).

    sudo python tests/benchmarks/bench_lost_host.py [--spark-timeouts derived|spark] [--no-cut]
        [--seconds 12] [--json FILE]

Layout (network namespaces, `tests/netns.py`; nothing leaves the machine): the JobManager and the
Spark Master in the root namespace; hosts h0 and h1 each run a Spark Worker (2 cores) and a
TaskManager (2 slots) whose Spark application has an executor on both Workers (the Master spreads
an application's cores out), so each TaskManager's Spark stages read and shuffle across both
hosts. A word count (a slow flat_map, then a keyed count: a Spark shuffle inside each task and a
funke exchange between them) runs; 3 s after its first task runs, h1's link goes down and stays
down. funke gives tm-1 up after heartbeat.timeout (5 s) and runs its tasks on tm-0; what the
figure measures is how long tm-0's Spark stages then wait for the executor on h1.

Prints the job's duration (submit to FINISHED), when tm-1 was lost after the cut, whether the
counts are exact, and how many task attempts failed.

Measured on 2 busy cores (2026-12-07): no cut 24.5 s; cut with Spark's timeouts 69.2 and 89.1 s
(tm-0's executor on h1 given up 77 s after the cut: "worker lost: Not receiving heartbeat for 60
seconds", the Master's spark.worker.timeout, before the driver's own 120 s); cut with the derived
ones 49.5 and 45.5 s (given up 11 s after the cut: "Executor heartbeat timed out after 11850 ms";
the rest is the lost executor's share of the work run again on the executor left).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import cloudpickle  # noqa: E402

from funke.common.api.dsl import ExecutionEnvironment  # noqa: E402
from funke.deploy import localcluster, sparkstandalone  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402
from tests import netns  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORDS = re.compile(r"[a-z]+")
# Spark's own defaults of the settings a TaskManager derives (taskmanager/sparksession.network_conf).
SPARK_DEFAULTS = {"spark.network.timeout": "120s", "spark.network.timeoutInterval": "60s",
                  "spark.executor.heartbeatInterval": "10s", "spark.shuffle.io.connectionCreationTimeout": "120s",
                  "spark.shuffle.io.retryWait": "5s", "spark.rpc.askTimeout": "120s"}


def slow_word_count(corpus: Path, out: Path, seconds: float):
    delay = seconds / 400

    def words(line):
        time.sleep(delay)
        return WORDS.findall(line)

    env = ExecutionEnvironment("word count across hosts", parallelism=2)
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    (env.read_text(str(corpus))
        .flat_map(words, schema="word string")
        .key_by("word").count()
        .write_csv(str(out), mode="overwrite"))
    return env.build()


def wait_for(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def registered(client, name: str):
    return next((t for t in client.cluster_overview().task_managers if t.id == name), None)


def run(args: argparse.Namespace, net: netns.Network, work: Path) -> dict:
    spark_dir = work / "spark"
    master = sparkstandalone.start(spark_dir, workers=0, host=net.root_address)
    try:
        return _run(args, net, work, master)
    finally:
        sparkstandalone.stop(master)


def _run(args: argparse.Namespace, net: netns.Network, work: Path, master: sparkstandalone.StandaloneInfo) -> dict:
    for i, host in enumerate(net.hosts):  # a Worker per host, bound to its address
        folder = work / f"worker-{i}"
        for sub in ("log", "work", "local", "tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        command = sparkstandalone.worker_command(master.master_url, host.address, 2, "2g", folder / "work", 0)
        net.popen(i, command, stdout=open(folder / "log" / "worker.log", "wb"), stderr=subprocess.STDOUT,
                  env=sparkstandalone.environment(folder, host.address), cwd=folder)
    sparkstandalone.wait_for_workers(master.web_url, len(net.hosts), timeout=120)

    root = work / "cluster"
    info = localcluster.start(localcluster.ClusterSpec(
        root, 0, 2, host=net.root_address, tls="mtls", tls_hosts=[h.address for h in net.hosts]))
    client = info.client()
    try:
        spark_conf = ["spark.executor.memory=512m"]
        if args.spark_timeouts == "spark":
            spark_conf += [f"{k}={v}" for k, v in SPARK_DEFAULTS.items()]
        for i, host in enumerate(net.hosts):
            argv = [sys.executable, "-m", "funke.taskmanager.main", "--jobmanager", info.address, "--id", f"tm-{i}",
                    "--slots", "2", "--host", host.address, "--no-warm-up", "--spark-master", master.master_url,
                    *[a for c in spark_conf for a in ("--spark-conf", c)], *localcluster.security_options(root)]
            net.popen(i, argv, stdout=open(work / f"tm-{i}.log", "w"), stderr=subprocess.STDOUT, cwd=REPO,
                      env=dict(os.environ, PYTHONUNBUFFERED="1"))
        for i in range(len(net.hosts)):
            wait_for(f"tm-{i} to register", lambda i=i: registered(client, f"tm-{i}"), timeout=180)
        spread = {a["name"]: sorted(e.host for e in sparkstandalone.application_executors(master.web_url, a["id"]))
                  for a in sparkstandalone.master_state(master.web_url)["activeapps"]}
        print(f"executors per TaskManager's application: {spread}", flush=True)

        corpus = work / "corpus"
        corpus.mkdir()
        lines = [" ".join(f"word{(i * 7 + j) % 53}" for j in range(i % 9 + 1)) for i in range(800)]
        for n in range(4):
            (corpus / f"part-{n}.txt").write_text("\n".join(lines[n::4]) + "\n")
        expected = collections.Counter(w for line in lines for w in WORDS.findall(line))
        out = work / "counts"
        submitted = time.monotonic()
        job_id = client.submit(slow_word_count(corpus, out, args.seconds))

        def running():
            details = client.get_job(job_id)
            return [s for v in details.vertices for s in v.subtasks
                    if job_pb2.ExecutionState.Name(s.current.state).endswith("RUNNING")]

        wait_for("a running task", running, timeout=180)
        lost_after = None
        if not args.no_cut:
            time.sleep(3.0)
            net.cut(1)
            cut_at, cut_epoch = time.monotonic(), time.time()
            wait_for("tm-1 to be lost", lambda: registered(client, "tm-1") is None, timeout=60)
            lost_after = time.monotonic() - cut_at
            print(f"tm-1 lost {lost_after:.1f} s after the cut", flush=True)
        final = wait_for("the job's end", lambda: (d := client.get_job(job_id)) and job_pb2.JobStatus.Name(
            d.status) in ("JOB_STATUS_FINISHED", "JOB_STATUS_FAILED") and d, timeout=900)
        took = time.monotonic() - submitted
        status = job_pb2.JobStatus.Name(final.status).removeprefix("JOB_STATUS_")
        counts: collections.Counter = collections.Counter()
        if status == "FINISHED":
            for f in sorted(out.iterdir()):
                for row in f.read_text().splitlines()[1:]:
                    word, n = row.split(",")
                    counts[word] += int(n)
        placed = sorted({e.task_manager_id for e in final.exceptions if e.task_name})
        result = {"spark_timeouts": args.spark_timeouts, "cut": not args.no_cut, "status": status,
                  "failed_on": placed, "cut_at_epoch": round(cut_epoch, 1) if not args.no_cut else None,
                  "job_s": round(took, 1), "tm_lost_after_cut_s": round(lost_after, 1) if lost_after else None,
                  "exact": counts == expected, "failures": len([e for e in final.exceptions if e.task_name])}
        print(json.dumps(result), flush=True)
        return result
    finally:
        client.close()
        net.restore(1) if not args.no_cut else None
        localcluster.stop(root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spark-timeouts", choices=["derived", "spark"], default="derived")
    parser.add_argument("--no-cut", action="store_true", help="no host is lost: the job's own duration")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long the flat_map sleeps in all")
    parser.add_argument("--json", help="append the result to this file")
    parser.add_argument("--keep", help="copy the logs (TaskManagers', Workers', the cluster's) into this directory")
    args = parser.parse_args()
    if (reason := netns.available()) is not None:
        raise SystemExit(f"network namespaces are not available here: {reason}")
    with tempfile.TemporaryDirectory(prefix="funke-bench-lost-host-") as tmp, netns.Network(hosts=2) as net:
        try:
            result = run(args, net, Path(tmp))
        finally:
            if args.keep:
                import shutil

                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).rglob("*.log"):
                    shutil.copy(log, keep / str(log.relative_to(tmp)).replace("/", "_"))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0 if result["status"] == "FINISHED" else 1


if __name__ == "__main__":
    sys.exit(main())
