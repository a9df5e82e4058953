"""Leader kills on a high-availability cluster: how fast a standby takes over, and whether every
job still ends FINISHED with the output of a clean run.

    python tests/chaos/chaos_leader.py [--kills 20]            # the failover benchmark
    python tests/chaos/chaos_leader.py --jepsen [--seconds 60]  # kill the leader every few seconds
    python tests/chaos/chaos_leader.py --backend zookeeper --kills 10 [--pause]

Starts a local cluster with `high-availability: filesystem` (or `zookeeper`, on a ZooKeeper
server of the cluster's own), two JobManagers (leader and standby) and two TaskManagers with
PySpark, runs a slow word count once without faults (the reference), then:

- benchmark (default): --kills times, submit the word count, wait until its tasks run, kill -9
  the leader (its whole process group), and measure from the kill to the new leader's lease
  (elected) and to the job's CREATED -> RUNNING under the new epoch (its own status history, the
  JobManager's clock); then wait for FINISHED, compare the output with the reference byte for byte,
  count the subtasks that had FINISHED before the kill and ran again after it (attempt numbers),
  and start the killed JobManager again as the next standby.
- --pause: SIGSTOP the leader instead of killing it: a process that stops answering without
  dying, as a leader on a host that hangs or is cut off. No dead-process shortcut applies, so the
  standby takes over only when the lease expires (filesystem) or the ZooKeeper server expires the
  session (`--session-timeout`). The paused leader stays paused while the new leader recovers and
  finishes the job (the TaskManagers and clients must find the new leader on their own, as with a
  hung host); then it is woken (SIGCONT), must find itself deposed and stand by, and is the next
  round's standby. Counted too: woken leaders that acted on their stale view before noticing
  (their log says a TaskManager was lost after the wake).
- --jepsen: for --seconds, keep jobs running and kill the leader every --every seconds (the
  killed one restarted as standby); then every job must end FINISHED with the reference output.

Prints the figures (median, max) and exits 1 if any job did not end FINISHED with identical output.
Processes are killed by the PIDs the cluster recorded; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import cloudpickle  # noqa: E402

from funke.common.api.dsl import ExecutionEnvironment  # noqa: E402
from funke.deploy import localcluster  # noqa: E402
from funke.deploy.client import JobManagerClient  # noqa: E402
from funke.v1 import job_pb2  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
SEPARATORS = re.compile(r"[\W\d_]+")
FINISHED = job_pb2.EXECUTION_STATE_FINISHED


def make_corpus(d: Path) -> str:
    rng = random.Random(11)
    vocabulary = ["".join(rng.choices("abcdefghij", k=rng.randint(3, 6))) for _ in range(1500)]
    for n in range(4):
        lines = [" ".join(rng.choices(vocabulary, k=rng.randint(1, 12))) for _ in range(1200)]
        (d / f"in-{n}.txt").write_text("\n".join(lines) + "\n")
    return str(d / "*.txt")


def slow_word_count(corpus: str, out: Path, seconds_per_stage: float):
    line_delay = seconds_per_stage / 1200
    row_delay = seconds_per_stage / 375

    def words(line):
        time.sleep(line_delay)
        return [w for w in SEPARATORS.split(line) if w]

    def slowly(row):
        time.sleep(row_delay)
        return row

    env = ExecutionEnvironment("slow word count", parallelism=4)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="200 ms")
    (env.read_text(corpus)
        .flat_map(words, schema="word string")
        .key_by("word").count()
        .map(slowly, schema="word string, count bigint")
        .write_csv(str(out), mode="overwrite"))
    return env.build()


def read_output(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())} if out.is_dir() else {}


def status(details) -> str:
    return job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")


def stamp(t) -> float:
    return t.timestamp.seconds + t.timestamp.nanos / 1e9


class Cluster:
    def __init__(self, root: Path, backend: str = "filesystem", options: dict[str, str] | None = None):
        self.root = root
        self.backend = backend
        localcluster.start(localcluster.ClusterSpec(root, 2, 2, ha=backend, jobmanagers=2, ha_options=options))
        self.client = JobManagerClient(localcluster.read_address(root) or "127.0.0.1:1", timeout=10,
                                       credentials=localcluster.credentials(root), failover_timeout=120, leader=lambda: localcluster.read_address(root))

    def epoch(self) -> int:
        lease = localcluster.leader(self.root)
        return lease.epoch if lease is not None else 0

    def kill_leader(self, signum: int = signal.SIGKILL) -> tuple[str, int, float]:
        epoch = self.epoch()
        name = localcluster.leader_name(self.root)
        localcluster.kill(self.root, name, signum)
        return name, epoch, time.time()

    def elected_after(self, epoch: int, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lease = localcluster.leader(self.root)
            if lease is not None and lease.epoch > epoch and lease.valid(time.time()):
                return lease.since
            time.sleep(0.02)
        raise SystemExit(f"no new leader within {timeout} s of killing epoch {epoch}")

    def restart(self, name: str) -> None:
        localcluster.start_jobmanager(self.root, name)

    def wake(self, name: str) -> int:
        """SIGCONT to a paused JobManager; returns where its log stood (what it logs from now on
        is after the wake)."""
        log = self.root / "log" / f"{name}.log"
        size = log.stat().st_size
        localcluster.kill(self.root, name, signal.SIGCONT)
        return size

    def stood_down(self, name: str, epoch: int, since: int, timeout: float = 60) -> bool:
        """Wait until the woken JobManager says it lost `epoch`; whether it had acted on its
        stale view first (a TaskManager lost, tasks failed, before it knew it was deposed)."""
        log = self.root / "log" / f"{name}.log"
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_bytes()[since:].decode(errors="replace")
            lost_at = text.find(f"lost leadership (epoch {epoch})")
            if lost_at >= 0:
                break
            if time.monotonic() >= deadline:
                raise SystemExit(f"{name}, woken, did not step down from epoch {epoch} within {timeout} s")
            time.sleep(0.1)
        acted = re.search(r"TaskManager \S+ lost:|TaskManagerLost", text)
        if acted is not None:
            print(f"  {name} woke and acted on its stale view before stepping down: {text[acted.start():][:200]!r}")
        return acted is not None

    def wait_end(self, job_id: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                s = status(self.client.get_job(job_id))
            except Exception:
                s = ""
            if s in ("FINISHED", "FAILED", "CANCELED"):
                return s
            time.sleep(0.1)
        return "TIMEOUT"

    def wait_tasks_running(self, job_id: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            details = self.client.get_job(job_id)
            if any(s.current.state == job_pb2.EXECUTION_STATE_RUNNING for v in details.vertices for s in v.subtasks):
                return
            time.sleep(0.05)
        raise SystemExit(f"job {job_id}: no task running within {timeout} s")


def _first_time(client: JobManagerClient, job_id: str, times_of, what: str, timeout: float = 120) -> float:
    """Poll the job until `times_of(details)` names a moment; the earliest one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            details = client.get_job(job_id)
        except Exception:  # no leader answers yet
            time.sleep(0.02)
            continue
        times = times_of(details)
        if times:
            return min(times)
        time.sleep(0.02)
    raise SystemExit(f"job {job_id}: {what} not within {timeout} s")


def running_again(client: JobManagerClient, job_id: str, epoch_before: int) -> float:
    """When the job was RUNNING under a leader after `epoch_before`."""
    return _first_time(client, job_id, lambda d: [
        stamp(t) for t in d.status_history
        if t.leader_epoch > epoch_before and t.to_status == job_pb2.JOB_STATUS_RUNNING], "RUNNING again")


def tasks_running_again(client: JobManagerClient, job_id: str) -> float:
    """When the first task of the run after the kill was RUNNING (attempts of a later run are
    numbered from 1000 up)."""
    return _first_time(client, job_id, lambda d: [
        stamp(t) for v in d.vertices for s in v.subtasks if s.current.id.attempt_number >= 1000
        for t in s.current.history if t.to_state == job_pb2.EXECUTION_STATE_RUNNING], "a task RUNNING again")


def benchmark(c: Cluster, corpus: str, work: Path, reference: dict[str, bytes], kills: int, pause: bool) -> dict:
    elected, running, tasks, rerun, finished_before, identical, stale = [], [], [], 0, 0, 0, 0
    for i in range(kills):
        out = work / f"run-{i}"
        job_id = c.client.submit(slow_word_count(corpus, out, 2.0))
        c.wait_tasks_running(job_id)
        time.sleep(random.uniform(0.5, 5.0))  # kill at different moments of the job
        done = {(v.id, s.subtask_index): s.current.id.attempt_number for v in c.client.get_job(job_id).vertices
                for s in v.subtasks if s.current.state == FINISHED}
        name, epoch, killed_at = c.kill_leader(signal.SIGSTOP if pause else signal.SIGKILL)
        try:  # a paused leader stays paused until the job is done: a hung host does not come back on cue
            elected.append(c.elected_after(epoch) - killed_at)
            running.append(running_again(c.client, job_id, epoch) - killed_at)
            tasks.append(tasks_running_again(c.client, job_id) - killed_at)
            end = c.wait_end(job_id)
        finally:
            if pause:
                woke = c.wake(name)
        if pause:
            stale += c.stood_down(name, epoch, woke)
        details = c.client.get_job(job_id)
        after = {(v.id, s.subtask_index): s.current.id.attempt_number for v in details.vertices for s in v.subtasks}
        again = sum(1 for key, attempt in done.items() if after.get(key) != attempt)
        finished_before += len(done)
        rerun += again
        same = end == "FINISHED" and read_output(out) == reference
        identical += same
        print(f"{'pause' if pause else 'kill'} {i + 1}/{kills}: {name} (epoch {epoch}) -> elected {elected[-1]:.2f} s, RUNNING again "
              f"{running[-1]:.2f} s, first task RUNNING {tasks[-1]:.2f} s, {end}, output {'identical' if same else 'DIFFERENT'}, "
              f"{again}/{len(done)} finished subtasks re-run", flush=True)
        if not pause:  # a woken leader stands by already
            c.restart(name)
    return {
        "kills": kills, "identical": identical,
        "elected_s": _figures(elected), "running_again_s": _figures(running), "tasks_running_again_s": _figures(tasks),
        "finished_subtasks_before_kill": finished_before, "finished_subtasks_rerun": rerun,
        **({"woken_leaders_acting_on_a_stale_view": stale} if pause else {}),
    }


def _figures(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "all": [round(v, 3) for v in values]}


def jepsen(c: Cluster, corpus: str, work: Path, reference: dict[str, bytes], seconds: float, every: float) -> dict:
    jobs: list[tuple[str, Path]] = []
    kills = 0
    end = time.monotonic() + seconds
    next_kill = time.monotonic() + every
    while time.monotonic() < end:
        if sum(1 for j, _ in jobs if status(c.client.get_job(j)) not in ("FINISHED", "FAILED", "CANCELED")) < 2:
            out = work / f"job-{len(jobs)}"
            jobs.append((c.client.submit(slow_word_count(corpus, out, 1.0)), out))
        if time.monotonic() >= next_kill:
            name, epoch, _ = c.kill_leader()
            kills += 1
            c.elected_after(epoch)
            c.restart(name)
            print(f"killed {name} (epoch {epoch}); {len(jobs)} job(s) submitted so far", flush=True)
            next_kill = time.monotonic() + every
        time.sleep(0.2)
    results = [(job_id, c.wait_end(job_id), read_output(out) == reference) for job_id, out in jobs]
    bad = [(j, s) for j, s, same in results if s != "FINISHED" or not same]
    for job_id, s in bad:
        print(f"job {job_id}: {s}, output {'identical' if s == 'FINISHED' else 'not compared'} (WRONG)")
    return {"seconds": seconds, "kills": kills, "jobs": len(jobs), "identical": len(jobs) - len(bad)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--jepsen", action="store_true", help="kill the leader every --every s for --seconds s")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--every", type=float, default=5)
    p.add_argument("--backend", choices=["filesystem", "zookeeper"], default="filesystem")
    p.add_argument("--pause", action="store_true", help="SIGSTOP the leader instead of kill -9 (a hung host)")
    p.add_argument("--session-timeout", default="6 s",
                   help="zookeeper: high-availability.zookeeper.client.session-timeout (default: 6 s, the default)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    options = ({"high-availability.zookeeper.client.session-timeout": args.session_timeout}
               if args.backend == "zookeeper" else {})
    with tempfile.TemporaryDirectory(prefix="funke-chaos-leader-") as d:
        root = Path(d)
        (root / "corpus").mkdir()
        corpus = make_corpus(root / "corpus")
        c = Cluster(root / "cluster", args.backend, options)
        try:
            ref_out = root / "reference"
            ref = c.client.submit(slow_word_count(corpus, ref_out, 0.2))
            if c.wait_end(ref) != "FINISHED":
                raise SystemExit("the reference run did not finish")
            reference = read_output(ref_out)
            if args.jepsen:
                result = jepsen(c, corpus, root, reference, args.seconds, args.every)
                ok = result["identical"] == result["jobs"]
                print(f"{result['kills']} leader kills in {args.seconds:g} s; {result['identical']}/{result['jobs']} "
                      f"jobs FINISHED with identical output")
            else:
                result = benchmark(c, corpus, root, reference, args.kills, args.pause)
                result.update(backend=args.backend, fault="SIGSTOP" if args.pause else "kill -9",
                              session_timeout=args.session_timeout if args.backend == "zookeeper" else None)
                ok = result["identical"] == result["kills"]
                e, r, t = result["elected_s"], result["running_again_s"], result["tasks_running_again_s"]
                print(f"{result['kills']} leader {'pauses' if args.pause else 'kills'} ({args.backend}): "
                      f"{result['identical']}/{result['kills']} jobs "
                      f"FINISHED with identical output; {result['fault']} -> new leader elected min {e['min']:.2f} s, "
                      f"median {e['median']:.2f} s, max {e['max']:.2f} s; -> job RUNNING again min {r['min']:.2f} s, "
                      f"median {r['median']:.2f} s, max {r['max']:.2f} s; -> first task RUNNING again median "
                      f"{t['median']:.2f} s, max {t['max']:.2f} s; finished subtasks re-run "
                      f"{result['finished_subtasks_rerun']} of {result['finished_subtasks_before_kill']}"
                      + (f"; woken leaders that acted on a stale view: {result['woken_leaders_acting_on_a_stale_view']}"
                         if args.pause else ""))
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=2))
        finally:
            c.client.close()
            localcluster.stop(c.root)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
