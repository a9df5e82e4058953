"""High availability on a real cluster: two JobManagers (a leader and a standby, filesystem
backend) and two TaskManagers with PySpark, started by `localcluster` and hurt by PID: kill -9
of the leader mid-job, SIGTERM of the only JobManager, a leader paused past its lease, and a
deposed leader's calls at a TaskManager. Output is compared byte for byte with a clean run.
`HaCluster` and the kill scenarios serve the ZooKeeper backend's tests too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import grpc
import pytest

from funke.common.wire.codec import job_graph_to_proto
from funke.common.api.dsl import ExecutionEnvironment
from funke.deploy import localcluster
from funke.deploy.client import JobAlreadyExists, JobManagerClient
from funke.v1 import cluster_pb2, cluster_pb2_grpc, job_pb2
from tests.integration.conftest import REPO, secured_channel, wait_cleaned_up
from tests.integration.test_failover import corpus, read_output, slow_word_count  # noqa: F401 (fixture)

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

JOBMANAGERS = ("jobmanager", "jobmanager-2")
TASKMANAGERS = ("tm-1", "tm-2")


class HaCluster:
    def __init__(self, dir: Path, backend: str = "filesystem", ha_options: dict[str, str] | None = None):
        self.dir = dir
        self.info = localcluster.start(localcluster.ClusterSpec(dir, len(TASKMANAGERS), 2, ha=backend, jobmanagers=2,
                                                                ha_options=ha_options))
        self.client = self.follower()

    def follower(self) -> JobManagerClient:
        """A client that follows the leader, as the CLI does for an HA cluster."""
        return JobManagerClient(localcluster.read_address(self.dir) or "127.0.0.1:1", timeout=10, failover_timeout=120,
                                credentials=localcluster.credentials(self.dir),
                                leader=lambda: localcluster.read_address(self.dir))

    def lease(self):
        return localcluster.leader(self.dir)

    def restore(self) -> None:
        """Both JobManagers alive, a leader elected, every TaskManager registered with it."""
        alive = {p.name for p in localcluster.status(self.dir).processes if p.alive}
        for name in JOBMANAGERS:
            if name not in alive:
                localcluster.start_jobmanager(self.dir, name)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                registered = {tm.id for tm in self.client.cluster_overview().task_managers}
            except Exception:
                registered = set()
            if registered >= set(TASKMANAGERS):
                return
            time.sleep(0.2)
        raise AssertionError(f"TaskManagers did not come back: {registered}")

    def kill_leader(self, signum: int = signal.SIGKILL) -> tuple[str, int, float]:
        """Signal the leading JobManager; returns its name, the epoch it led and when."""
        lease = self.lease()
        name = localcluster.leader_name(self.dir)
        localcluster.kill(self.dir, name, signum)
        return name, lease.epoch, time.time()

    def wait_for_new_leader(self, old_epoch: int, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lease = self.lease()
            if lease is not None and lease.epoch > old_epoch and lease.valid(time.time()):
                return lease, time.time()
            time.sleep(0.05)
        # what the lease and the recorded processes were, to tell a standby that never took over
        # from a leader that went on renewing
        processes = [(p.name, p.pid, p.alive) for p in localcluster.status(self.dir).processes]
        raise AssertionError(f"no leader after epoch {old_epoch} within {timeout} s: lease {self.lease()}, "
                             f"processes {processes}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = HaCluster(tmp_path_factory.mktemp("ha-cluster"))
    yield c
    c.client.close()
    pids = {p.name: p.pid for p in localcluster.status(c.dir).processes}
    localcluster.stop(c.dir)
    for p in localcluster.status(c.dir).processes:
        assert not p.alive, f"{p.name} survived the stop"
    assert pids


@pytest.fixture
def ha(cluster):
    cluster.restore()
    yield cluster


@pytest.fixture(scope="module")
def reference(cluster, corpus, tmp_path_factory) -> dict[str, bytes]:  # noqa: F811
    out = tmp_path_factory.mktemp("ha-reference") / "counts"
    cluster.restore()
    job_id = cluster.client.submit(slow_word_count(corpus, out, seconds_per_stage=0.3))
    assert _wait_status(cluster.client, job_id, "FINISHED", 240)
    return read_output(out)


def _status(details) -> str:
    return job_pb2.JobStatus.Name(details.status).removeprefix("JOB_STATUS_")


def _wait_status(client: JobManagerClient, job_id: str, wanted: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _status(client.get_job(job_id))
        if status == wanted:
            return True
        if status in ("FAILED", "CANCELED", "FINISHED") and status != wanted:
            raise AssertionError(f"job {job_id} ended {status}, not {wanted}:\n{client.get_job(job_id)}")
        time.sleep(0.1)
    return False


def _wait_running_under(client: JobManagerClient, job_id: str, epoch: int, timeout: float = 60) -> float:
    """When the job was RUNNING again under leader `epoch`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            details = client.get_job(job_id)
        except Exception:
            time.sleep(0.05)
            continue
        for t in details.status_history:
            if t.leader_epoch == epoch and t.to_status == job_pb2.JOB_STATUS_RUNNING:
                return t.timestamp.seconds + t.timestamp.nanos / 1e9
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} not RUNNING under epoch {epoch} within {timeout} s")


def _history(details) -> list[tuple[str, str, int]]:
    return [(job_pb2.JobStatus.Name(t.from_status).removeprefix("JOB_STATUS_"),
             job_pb2.JobStatus.Name(t.to_status).removeprefix("JOB_STATUS_"), t.leader_epoch)
            for t in details.status_history]


def _attempts(details) -> dict[tuple[str, int], int]:
    return {(v.id, s.subtask_index): s.current.id.attempt_number for v in details.vertices for s in v.subtasks}


def _some_task_running(client: JobManagerClient, job_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        details = client.get_job(job_id)
        states = {s.current.state for v in details.vertices for s in v.subtasks}
        if job_pb2.EXECUTION_STATE_RUNNING in states:
            return
        time.sleep(0.1)
    raise AssertionError("no task of the job started running")


# ---------------------------------------------------------------------------- kill -9 of the leader


def test_kill_9_of_the_leader_mid_job_the_standby_finishes_it_with_identical_output(ha, corpus, reference, tmp_path):  # noqa: F811
    kill_9_mid_job(ha, corpus, reference, tmp_path)


def kill_9_mid_job(ha: HaCluster, corpus, reference, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "counts"
    job_id = ha.client.submit(slow_word_count(corpus, out, seconds_per_stage=3.0))
    done = _finished_subtasks(ha.client, job_id)
    time.sleep(1.0)  # the leader has recorded them by then
    name, epoch, killed_at = ha.kill_leader()
    lease, elected_at = ha.wait_for_new_leader(epoch)
    running_at = _wait_running_under(ha.client, job_id, lease.epoch)
    assert _wait_status(ha.client, job_id, "FINISHED", 300)
    assert read_output(out) == reference
    wait_cleaned_up(out, ha.dir / "data", job_id)  # by the new leader, what either leader's run left
    history = _history(ha.client.get_job(job_id))
    # The old leader's run, SUSPENDED for it (said by the new leader), then the new leader's run.
    assert ("RUNNING", "SUSPENDED", epoch) in history, history
    assert ("CREATED", "RUNNING", lease.epoch) in history and history[-1] == ("RUNNING", "FINISHED", lease.epoch)
    assert history.index(("RUNNING", "SUSPENDED", epoch)) < history.index(("CREATED", "RUNNING", lease.epoch))
    details = ha.client.get_job(job_id)
    suspended = next(t for t in details.status_history if t.to_status == job_pb2.JOB_STATUS_SUSPENDED)
    assert f"epoch {epoch}" in suspended.cause and "lost leadership" in suspended.cause
    # What had finished a second before the kill was taken over, not run again (same attempt).
    after = _attempts(details)
    assert done and all(after[key] == attempt for key, attempt in done.items()), (done, after)
    # Every subtask either ran again under the new leader (attempts from 1000 up), or was taken
    # over as it finished under the old one: its TaskManager, slot and timeline as they were,
    # finished before the kill. Judged from what the new leader shows, not from when this test
    # last looked before the kill (a subtask may finish between that look and the kill).
    taken_over = 0
    for v in details.vertices:
        for s in v.subtasks:
            current = s.current
            if current.id.attempt_number >= 1000:
                continue
            taken_over += 1
            path = [job_pb2.ExecutionState.Name(t.to_state).removeprefix("EXECUTION_STATE_") for t in current.history]
            finished_at = current.history[-1].timestamp.ToNanoseconds() / 1e9
            assert path[-1] == "FINISHED" and "RUNNING" in path, (v.id, s.subtask_index, path)
            assert finished_at < killed_at, (v.id, s.subtask_index, finished_at, killed_at)
            assert current.task_manager_id in TASKMANAGERS and current.HasField("slot_index"), current
            assert "taken over" in current.history[-1].cause, current.history[-1].cause
    assert taken_over >= len(done)
    print(f"kill -9 of {name} (epoch {epoch}): new leader epoch {lease.epoch} after "
          f"{elected_at - killed_at:.2f} s, job RUNNING again after {running_at - killed_at:.2f} s, "
          f"{taken_over} finished subtasks taken over")


def _finished_subtasks(client: JobManagerClient, job_id: str, timeout: float = 120) -> dict[tuple[str, int], int]:
    """Once some subtask of the job FINISHED (and others still run): the finished ones' attempts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        details = client.get_job(job_id)
        done = {(v.id, s.subtask_index): s.current.id.attempt_number for v in details.vertices for s in v.subtasks
                if s.current.state == job_pb2.EXECUTION_STATE_FINISHED}
        if done:
            return done
        time.sleep(0.05)
    raise AssertionError("no subtask of the job finished")


# ---------------------------------------------------------------------------- SIGTERM: SUSPENDED, then recovered


def test_sigterm_of_the_only_jobmanager_suspends_the_job_and_a_restart_recovers_it(ha, corpus, reference, tmp_path):  # noqa: F811
    standby = next(n for n in JOBMANAGERS if n != localcluster.leader_name(ha.dir))
    localcluster.kill(ha.dir, standby)
    out = tmp_path / "counts"
    job_id = ha.client.submit(slow_word_count(corpus, out, seconds_per_stage=3.0))
    _some_task_running(ha.client, job_id)
    name, epoch, _ = ha.kill_leader(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(p.alive for p in localcluster.status(ha.dir).processes if p.name == name):
        assert time.monotonic() < deadline, f"{name} did not stop on SIGTERM"
        time.sleep(0.1)
    services = localcluster.ha_services(ha.dir)
    assert services.job_graph_ids() == [job_id]  # kept for the next leader
    stored = [r for r in services.history(job_id) if "to" in r]
    assert stored[-1]["to"] == "SUSPENDED" and stored[-1]["epoch"] == epoch, stored
    assert job_id not in services.results()
    lease = services.leader()
    assert lease.released, "a JobManager stopping gracefully releases its lease"

    localcluster.start_jobmanager(ha.dir, name)
    lease, _ = ha.wait_for_new_leader(epoch)
    assert _wait_status(ha.client, job_id, "FINISHED", 300)
    assert read_output(out) == reference
    wait_cleaned_up(out, ha.dir / "data", job_id)  # by the new leader, what either leader's run left
    history = _history(ha.client.get_job(job_id))
    assert ("RUNNING", "SUSPENDED", epoch) in history and history[-1] == ("RUNNING", "FINISHED", lease.epoch)
    # the result and the graph's removal are written after the job ended, off the JobManager's loop
    deadline = time.monotonic() + 30
    while services.job_graph_ids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert services.job_graph_ids() == [] and services.results()[job_id].status == "FINISHED"


# ---------------------------------------------------------------------------- ended jobs stay ended


def fails_at_once(out: Path):
    def boom(row):
        raise RuntimeError("fails on purpose")

    env = ExecutionEnvironment("fails at once", parallelism=1)
    env.set_restart_strategy("none")
    env.from_collection([(1,)], "x bigint").map(boom, schema="x bigint").write_csv(str(out))
    return env.build()


def small_count(out: Path):
    env = ExecutionEnvironment("small count", parallelism=2)
    (env.from_collection([(w,) for w in "a b a c b a".split()], "word string")
        .key_by("word").count().write_csv(str(out)))
    return env.build()


def test_finished_and_failed_jobs_are_not_run_again_after_failovers_and_their_ids_stay_taken(ha, tmp_path):
    finished = ha.client.submit(small_count(tmp_path / "finished"))
    failed = ha.client.submit(fails_at_once(tmp_path / "failed"))
    assert _wait_status(ha.client, finished, "FINISHED", 120)
    assert _wait_status(ha.client, failed, "FAILED", 120)
    before = {job_id: ha.client.get_job(job_id) for job_id in (finished, failed)}
    written = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "finished").iterdir()}
    # Their ends are recorded in the job result store (written off the loop, a moment after the
    # status changed: a leader killed before that leaves the job to be run again, as in Flink,
    # which is not what this test is about).
    services = localcluster.ha_services(ha.dir)
    deadline = time.monotonic() + 30
    while not {finished, failed} <= set(services.results()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {finished, failed} <= set(services.results())
    # A leadership flap right after: the leader is killed, the standby takes over, then that
    # one is killed too and the first, restarted, takes over again.
    for _ in range(2):
        _, epoch, _ = ha.kill_leader()
        ha.wait_for_new_leader(epoch)
        ha.restore()
    for job_id, old in before.items():
        now = ha.client.get_job(job_id)
        assert _status(now) == _status(old), (now.failure, _history(now))
        assert _history(now) == _history(old)  # no new run, under any leader
        assert _attempts(now) == _attempts(old)
    listed = {j.job_id: job_pb2.JobStatus.Name(j.status) for j in ha.client.list_jobs()}
    assert listed[finished] == "JOB_STATUS_FINISHED" and listed[failed] == "JOB_STATUS_FAILED"
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "finished").iterdir()} == written
    again = job_graph_to_proto(fails_at_once(tmp_path / "failed-again"))
    again.job_id = failed
    with pytest.raises(JobAlreadyExists, match="already ran and ended FAILED"):
        ha.client.submit(again)


# ---------------------------------------------------------------------------- fencing


def test_a_leader_paused_past_its_lease_is_deposed_and_the_taskmanagers_refuse_its_calls(ha, corpus, reference, tmp_path):  # noqa: F811
    paused_leader(ha, corpus, reference, tmp_path)


def paused_leader(ha: HaCluster, corpus, reference, tmp_path) -> float:  # noqa: F811
    """SIGSTOP of the leader mid-job: a standby takes over once the leader's lease (file) or
    session (ZooKeeper) ran out; the job finishes with identical output; the leader, woken up,
    knows it was deposed, and what it would send is refused by every TaskManager. Returns the
    seconds from the pause to the new leader."""
    out = tmp_path / "counts"
    job_id = ha.client.submit(slow_word_count(corpus, out, seconds_per_stage=2.0))
    _some_task_running(ha.client, job_id)
    name, epoch, paused_at = ha.kill_leader(signal.SIGSTOP)
    log_path = ha.dir / "log" / f"{name}.log"
    try:
        lease, elected_at = ha.wait_for_new_leader(epoch)
        _wait_running_under(ha.client, job_id, lease.epoch)
    finally:
        woke_at = log_path.stat().st_size
        localcluster.kill(ha.dir, name, signal.SIGCONT)
    assert _wait_status(ha.client, job_id, "FINISHED", 300)
    assert read_output(out) == reference
    # The paused leader woke up deposed: it stands by and says why.
    log = log_path.read_text()
    deadline = time.monotonic() + 10
    while f"lost leadership (epoch {epoch})" not in log and time.monotonic() < deadline:
        time.sleep(0.2)
        log = log_path.read_text()
    assert f"lost leadership (epoch {epoch})" in log
    # ... without acting on what it saw when it woke (every TaskManager silent for as long as it
    # slept, their heartbeat streams gone): those TaskManagers are the new leader's now.
    since_wake = log_path.read_bytes()[woke_at:].decode(errors="replace")
    acted = [line for line in since_wake.splitlines() if " lost: " in line and "TaskManager" in line
             or "TaskManagerLost" in line]
    assert not acted, acted
    # What a deposed leader sends carries the token of a registration that is over, and names a
    # registration of its epoch: every TaskManager refuses it. (The token is the deposed leader's
    # alone; the cluster's own token stands in for it here, and is refused all the same.)
    overview = ha.client.cluster_overview()
    assert overview.leader.epoch == lease.epoch
    for tm in overview.task_managers:
        with secured_channel(ha.dir, tm.address, "cluster") as channel:
            stub = cluster_pb2_grpc.TaskExecutorStub(channel)
            deployment = cluster_pb2.TaskDeploymentDescriptor(job_id=job_id, task_name="stale (1/1)")
            deployment.attempt.vertex_id, deployment.attempt.attempt_number = "stale", 0
            with pytest.raises(grpc.RpcError) as refused:
                stub.SubmitTasks(cluster_pb2.SubmitTasksRequest(
                    tasks=[deployment], registration_id=f"{tm.id}#e{epoch}.1"), timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    return elected_at - paused_at


# ---------------------------------------------------------------------------- the CLI follows the leader

SLOW_COLLECT = '''
import time
from funke.common.api.dsl import ExecutionEnvironment


def build(args):
    def slowly(row):
        time.sleep(0.02)
        return row

    env = ExecutionEnvironment("slow squares", parallelism=2)
    env.generate(300, lambda i: (i, i * i), "n bigint, square bigint") \\
        .map(slowly, schema="n bigint, square bigint").collect()
    return env.build()
'''


def test_funke_submit_follows_the_job_to_the_new_leader_and_prints_its_result(ha, tmp_path):
    job_file = tmp_path / "slow_squares.py"
    job_file.write_text(SLOW_COLLECT)
    env = dict(os.environ, FUNKE_CLUSTER_DIR=str(ha.dir))
    env.pop("FUNKE_JOBMANAGER", None)
    process = subprocess.Popen([sys.executable, "-m", "funke.deploy.cli", "submit", str(job_file), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        job_id = ""
        while not job_id and time.monotonic() < deadline:  # the job exists and runs: then kill
            running = [j for j in ha.client.list_jobs() if j.name == "slow squares"
                       and j.status == job_pb2.JOB_STATUS_RUNNING and j.tasks_per_state.get("RUNNING")]
            job_id = running[0].job_id if running else ""
            time.sleep(0.1)
        assert job_id, "the submitted job did not start running"
        _, epoch, _ = ha.kill_leader()
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, (stderr[-2000:], ha.client.get_job(job_id).failure, ha.client.get_job(job_id).exceptions)
    outcome = json.loads(stdout)
    assert outcome["job_id"] == job_id and outcome["status"] == "FINISHED", outcome
    rows = sorted((r["n"], r["square"]) for r in outcome["rows"])
    assert rows == [(n, n * n) for n in range(300)]
    history = _history(ha.client.get_job(job_id))
    assert ("RUNNING", "SUSPENDED", epoch) in history and history[-1][2] > epoch


def test_kill_9_of_the_leader_under_a_running_aggregate_the_query_goes_on_with_exact_state(ha, tmp_path):
    """A stateful streaming query (running totals per key, in keyed state) and kill -9 of the
    leading JobManager: the new leader recovers the job, the query goes on from its checkpoint,
    and after every committed batch of both leaders the totals equal a direct count."""
    from tests.integration.test_keyed_state import batch_ends, check_every_batch, running_job

    out, checkpoint = tmp_path / "totals", tmp_path / "checkpoint"
    job_id = ha.client.submit(running_job(out, checkpoint, "update", keyed_parallelism=2).build())
    deadline = time.monotonic() + 180
    while len(batch_ends(checkpoint) if (checkpoint / "commits").exists() else {}) < 3:
        assert time.monotonic() < deadline, "three batches did not commit within 180 s"
        time.sleep(0.2)
    before = max(batch_ends(checkpoint))
    name, epoch, killed_at = ha.kill_leader()
    lease, _ = ha.wait_for_new_leader(epoch)
    _wait_running_under(ha.client, job_id, lease.epoch)
    while max(batch_ends(checkpoint)) < before + 3:
        assert time.monotonic() < deadline + 180, "the recovered query did not commit three more batches"
        time.sleep(0.2)
    ha.client.stop(job_id, timeout_s=60)
    assert _wait_status(ha.client, job_id, "FINISHED", 120)
    history = _history(ha.client.get_job(job_id))
    assert ("RUNNING", "SUSPENDED", epoch) in history and history[-1] == ("RUNNING", "FINISHED", lease.epoch), history
    assert check_every_batch(out, checkpoint, "update") >= before + 4


# ---------------------------------------------------------------------------- a paused leader's streaming query


def _committed_under(checkpoint: Path) -> dict[int, tuple[int, bytes]]:
    """The commit log as on disk: batch -> (the lease epoch its entry says it was written under,
    0 if it says none; its bytes)."""
    found = {}
    for path in (checkpoint / "commits").iterdir() if (checkpoint / "commits").exists() else ():
        if path.name.isdigit():
            data = path.read_bytes()
            body = json.loads(data.partition(b"\n")[2] or b"{}")
            found[int(path.name)] = (int(body.get("leaseEpoch", 0)), data)
    return found


def _entries(checkpoint: Path) -> dict[str, bytes]:
    """Every offset and commit entry, by path under the checkpoint."""
    return {f"{log}/{p.name}": p.read_bytes() for log in ("offsets", "commits") for p in (checkpoint / log).iterdir()
            if p.name.isdigit()}


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP) right now."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


def _query_leader(ha: HaCluster, checkpoint: Path, timeout: float = 60) -> tuple[str, int, int]:
    """The JobManager that leads and runs the query now: (name, pid, leader epoch), once the
    checkpoint's lease is held by the leader's process under its epoch (a leadership change
    just before, on a loaded machine, would make the pause hit a standby)."""
    from funke.jobmanager.checkpointstore import CheckpointStore

    deadline = time.monotonic() + timeout
    while True:
        lease, held = ha.lease(), CheckpointStore(str(checkpoint)).lease()
        name = localcluster.leader_name(ha.dir, lease) if lease is not None else ""
        pid = next((p.pid for p in localcluster.status(ha.dir).processes if p.name == name and p.alive), None)
        if (lease is not None and held is not None and pid is not None and held.leader_epoch == lease.epoch
                and held.holder.split(":")[1] == str(pid) and lease.valid(time.time())):
            return name, pid, lease.epoch
        assert time.monotonic() < deadline, f"the query's checkpoint lease {held} is not the leader's {lease}"
        time.sleep(0.1)


def paused_leader_streaming(ha: HaCluster, tmp_path: Path, timeout: float = 180) -> dict:
    """SIGSTOP of the leader while it runs a streaming query with a checkpoint: the new leader
    takes the query over and commits batches while the old one stays paused (its hold on the
    checkpoint, a lease, is taken over by the higher leader epoch); woken (SIGCONT), the old
    leader writes nothing to the checkpoint or the sink: every entry after the take-over is the
    new leader's, and the sink has every row of the committed batches exactly once. Returns the
    figures: seconds from the SIGSTOP to the new leader's lease, to the job RUNNING under it,
    and to the first batch committed under it (its commit log entry's time); and the job's
    failures (restarts) as the new leader shows them."""
    from tests.integration.test_streaming import assert_exactly_once, rate_job

    out, checkpoint = tmp_path / "values", tmp_path / "checkpoint"
    job_id = ha.client.submit(rate_job("paused leader query", out, checkpoint, rows_per_second=40,
                                       trigger="500 ms").build())
    deadline = time.monotonic() + timeout
    while len(_committed_under(checkpoint)) < 3:
        assert time.monotonic() < deadline, f"three batches did not commit within {timeout} s"
        time.sleep(0.1)
    name, pid, epoch = _query_leader(ha, checkpoint)
    localcluster.kill(ha.dir, name, signal.SIGSTOP)
    paused_at = time.time()
    log_path = ha.dir / "log" / f"{name}.log"
    before = _committed_under(checkpoint)  # all the old leader's: it is paused now
    old_epochs = {e for e, _ in before.values()}
    try:
        lease, elected_at = ha.wait_for_new_leader(epoch)
        running_at = _wait_running_under(ha.client, job_id, lease.epoch)
        # Batches committed while the old leader is paused are the new leader's, under a lease
        # epoch above the old run's.
        deadline = time.monotonic() + timeout
        while len(new := {b: e for b, (e, _) in _committed_under(checkpoint).items() if b not in before}) < 3:
            assert time.monotonic() < deadline, (
                f"the new leader committed {sorted(new)} within {timeout} s; job "
                f"{_status(ha.client.get_job(job_id))}: {ha.client.get_job(job_id).failure.message[:2000]}")
            time.sleep(0.1)
        assert _stopped(pid), f"{name} (pid {pid}) is not paused any more"
        first = min(new)
        first_committed_at = json.loads(_committed_under(checkpoint)[first][1].partition(b"\n")[2])["committedAtMs"] / 1000
        assert min(new.values()) > max(old_epochs), (new, old_epochs)
        taken_over = _entries(checkpoint)
        woke_at = log_path.stat().st_size
    finally:
        localcluster.kill(ha.dir, name, signal.SIGCONT)
    # Woken, the old leader finds itself deposed ...
    deadline = time.monotonic() + 30
    while f"lost leadership (epoch {epoch})" not in log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{name} did not notice it lost leadership"
        time.sleep(0.2)
    # ... and, while the new leader commits three more batches, writes nothing to the checkpoint:
    # every entry there at the take-over is as it was, and every one since is the new leader's.
    last = max(_committed_under(checkpoint))
    deadline = time.monotonic() + timeout
    while max(_committed_under(checkpoint)) < last + 3:
        assert time.monotonic() < deadline, "the new leader did not go on committing after the old one woke"
        time.sleep(0.1)
    now = _entries(checkpoint)
    changed = [k for k, data in taken_over.items() if k in now and now[k] != data]
    assert not changed, f"entries rewritten after the take-over: {changed}"
    late = {b: e for b, (e, _) in _committed_under(checkpoint).items() if b not in before and e in old_epochs}
    assert not late, f"commit log entries written under the old leader's lease after the take-over: {late}"
    since_wake = log_path.read_bytes()[woke_at:].decode(errors="replace")
    assert "streaming query paused leader query (id" not in since_wake  # it started no run of its own
    ha.client.stop(job_id, timeout_s=60)
    assert _wait_status(ha.client, job_id, "FINISHED", 120)
    rows, duplicates, lost = assert_exactly_once(out, checkpoint)
    commits = sorted(_committed_under(checkpoint))
    from funke.jobmanager import streamsinks

    assert streamsinks.committed_batches(str(out)) == list(range(commits[-1] + 1)) and commits[0] == 0
    details = ha.client.get_job(job_id)
    history = _history(details)
    assert ("RUNNING", "SUSPENDED", epoch) in history and history[-1] == ("RUNNING", "FINISHED", lease.epoch), history
    return {"failures": [f"{e.failure.exception_type}: {e.failure.message[:160]}" for e in details.exceptions],
            "elected": elected_at - paused_at, "running": running_at - paused_at,
            "first_commit": first_committed_at - paused_at, "batches": float(len(commits)), "rows": float(rows),
            "refused": float(since_wake.count("CheckpointFenced"))}


def test_a_paused_leaders_streaming_query_is_taken_over_and_the_woken_leader_writes_nothing(ha, tmp_path):
    figures = paused_leader_streaming(ha, tmp_path)
    print(f"SIGSTOP of the leader: new leader after {figures['elected']:.2f} s, query RUNNING after "
          f"{figures['running']:.2f} s, first batch committed under the new leader after {figures['first_commit']:.2f} s "
          f"({figures['batches']:.0f} batches, {figures['rows']:.0f} rows exactly once)")
