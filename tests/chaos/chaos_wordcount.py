"""Chaos: kill a random TaskManager (SIGKILL, with its Spark JVM) at a random moment of a running
word count, N times, and check every run still FINISHES with output identical to a clean run.

    python tests/chaos/chaos_wordcount.py [--runs 20] [--seed 1] [--restart-delay "200 ms"]

Prints one line per run and then: runs / finished / identical output; the median time from a kill
until the restart is running (the first new attempt reached RUNNING); and the median time until
every task that failed because of the kill runs again (which includes recomputing partitions
that were lost with the TaskManager).
The killed TaskManager is started again at once under the same id, as a supervisor would.
Not part of the test suite (it takes minutes); it uses the same job as tests/integration/test_failover.py.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import cloudpickle  # noqa: E402

from funke.deploy.client import JobManagerClient  # noqa: E402
from funke.common.api.dsl import ExecutionEnvironment  # noqa: E402
from funke.deploy import localcluster  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TASKMANAGERS = ("tm-1", "tm-2", "tm-3")


def make_corpus(d: Path, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices("abcdefghij", k=rng.randint(3, 6))) for _ in range(1500)]
    for n in range(8):
        lines = [" ".join(rng.choices(vocabulary, k=rng.randint(1, 12))) for _ in range(1200)]
        (d / f"in-{n}.txt").write_text("\n".join(lines) + "\n")
    return str(d / "*.txt")


def word_count(corpus: str, out: Path, restart_delay: str, seconds_per_stage: float):
    line_delay = seconds_per_stage / 2400
    row_delay = seconds_per_stage / 375

    def words(line):
        time.sleep(line_delay)
        return line.split()

    def slowly(row):
        time.sleep(row_delay)
        return row

    env = ExecutionEnvironment("chaos word count", parallelism=4)
    env.set_restart_strategy("fixed-delay", attempts=50, delay=restart_delay)
    (env.read_text(corpus)
        .flat_map(words, schema="word string")
        .key_by("word").count()
        .map(slowly, schema="word string, count bigint")
        .write_csv(str(out), mode="overwrite"))
    return env.build()


def seconds(ts) -> float:
    return ts.seconds + ts.nanos / 1e9


def state(value: int) -> str:
    return job_pb2.ExecutionState.Name(value).removeprefix("EXECUTION_STATE_")


def recovery_times(details, victim: str, killed_at: float) -> tuple[float | None, float | None]:
    """(kill -> the first restarted attempt RUNNING, kill -> every subtask whose attempt failed on
    the victim has a newer attempt RUNNING). The second includes recomputing lost inputs: a
    consumer restarted after its producers' partitions were lost runs only once they ran again."""
    first, latest = None, 0.0
    for vertex in details.vertices:
        for sub in vertex.subtasks:
            attempts = list(sub.prior_attempts) + [sub.current]
            for i, ex in enumerate(attempts):
                ran = [seconds(t.timestamp) for t in ex.history if state(t.to_state) in ("RUNNING", "FINISHED")]
                if ex.id.attempt_number > 0 and ran and seconds(ex.created_at) >= killed_at:
                    first = min(first, min(ran)) if first is not None else min(ran)
                if ex.task_manager_id == victim and state(ex.state) == "FAILED" and seconds(ex.history[-1].timestamp) >= killed_at:
                    running = [seconds(t.timestamp) for later in attempts[i + 1:] for t in later.history
                               if state(t.to_state) in ("RUNNING", "FINISHED")]
                    if not running:
                        return (first - killed_at if first else None), None
                    latest = max(latest, min(running))
    return (first - killed_at if first else None), (latest - killed_at if latest else None)


def read_output(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def run_job(client: JobManagerClient, job) -> tuple[str, str]:
    job_id = client.submit(job)
    for _ in client.watch(job_id):
        pass
    return job_id, job_pb2.JobStatus.Name(client.get_job(job_id).status).removeprefix("JOB_STATUS_")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--restart-delay", default="200 ms", help="fixed-delay restart strategy delay")
    p.add_argument("--seconds-per-stage", type=float, default=4.0)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="funke-chaos-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "corpus").mkdir()
        corpus = make_corpus(tmp_path / "corpus", args.seed)
        cluster_dir = tmp_path / "cluster"
        info = localcluster.start(localcluster.ClusterSpec(cluster_dir, len(TASKMANAGERS), 2))
        client = info.client()
        try:
            reference_out = tmp_path / "reference"
            _, status = run_job(client, word_count(corpus, reference_out, args.restart_delay, 0.5))
            assert status == "FINISHED", status
            reference = read_output(reference_out)
            finished = identical = 0
            restarts: list[float] = []
            recoveries: list[float] = []
            for n in range(1, args.runs + 1):
                out = tmp_path / f"run-{n}"
                job_id = client.submit(word_count(corpus, out, args.restart_delay, args.seconds_per_stage))
                time.sleep(rng.uniform(0.5, 2.5 * args.seconds_per_stage))
                details = client.get_job(job_id)
                live = sorted({s.current.task_manager_id for v in details.vertices for s in v.subtasks
                               if state(s.current.state) in ("DEPLOYING", "INITIALIZING", "RUNNING")})
                victim = rng.choice(live or list(TASKMANAGERS))
                killed_at = time.time()
                localcluster.kill(cluster_dir, victim)
                while victim in {tm.id for tm in client.cluster_overview().task_managers}:
                    time.sleep(0.02)
                localcluster.start_taskmanager(cluster_dir, victim, 2)
                for _ in client.watch(job_id):
                    pass
                details = client.get_job(job_id)
                status = job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")
                same = status == "FINISHED" and read_output(out) == reference
                finished += status == "FINISHED"
                identical += same
                restarted_in, took = recovery_times(details, victim, killed_at)
                if restarted_in is not None:
                    restarts.append(restarted_in)
                if took is not None:
                    recoveries.append(took)
                restarted = sum(s.current.id.attempt_number > 0 for v in details.vertices for s in v.subtasks)
                print(f"run {n:3}: killed {victim} {'(idle)' if victim not in live else ''}-> {status}, "
                      f"output {'identical' if same else 'DIFFERENT'}, {restarted} subtask(s) re-run, "
                      f"first restarted task RUNNING after {'-' if restarted_in is None else f'{restarted_in:.2f} s'}, "
                      f"all failed tasks after {'-' if took is None else f'{took:.2f} s'}", flush=True)
        finally:
            client.close()
            localcluster.stop(cluster_dir)
    print(f"\nruns / finished / identical output: {args.runs} / {finished} / {identical}")
    if restarts:
        print(f"kill -> first restarted task RUNNING: median {statistics.median(restarts):.2f} s, "
              f"max {max(restarts):.2f} s (restart delay {args.restart_delay}; the loss is noticed when "
              f"the TaskManager's heartbeat stream breaks)")
    if recoveries:
        print(f"kill -> every failed task RUNNING again: median {statistics.median(recoveries):.2f} s, "
              f"max {max(recoveries):.2f} s (includes recomputing partitions lost with the TaskManager)")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({
            "runs": args.runs, "finished": finished, "identical": identical, "restart_delay": args.restart_delay,
            "kill_to_first_restarted_running_s": sorted(restarts), "kill_to_all_failed_running_s": sorted(recoveries),
        }, indent=2))
    return 0 if finished == identical == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
