"""The filesystem HA services (runtime/hafilesystem.py) on real files: election rounds, fencing of
every write, the job graph and job result stores, and a real dead process freeing the lease."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading

import pytest

from funke.common.leadership import Contender, Granted, Revoked
from funke.runtime.hafilesystem import (
    Fenced,
    FileSystemHaServices,
    JobResult,
    holder_gone,
    process_identity,
)


@pytest.fixture
def ha(tmp_path):
    services = FileSystemHaServices(str(tmp_path / "ha"), "cluster-1")
    services.create_dirs()
    return services


def test_the_first_contender_leads_and_the_lease_names_it_for_leader_retrieval(ha):
    a = Contender("a", "127.0.0.1:6123", 3)
    lease, changes = ha.contend(a, now=10.0)
    assert changes == [Granted(1)]
    assert ha.leader() == lease and lease.address == "127.0.0.1:6123" and lease.epoch == 1


def test_a_standby_takes_over_only_after_expiry_and_the_old_leader_is_fenced_out(ha):
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    ha.contend(a, now=0.0)
    ha.put_job_graph("a", 1, "job-1", b"graph")
    assert ha.contend(b, now=2.0)[1] == []
    lease, changes = ha.contend(b, now=3.5)
    assert changes == [Granted(2)] and lease.holder == "b"
    # the deposed leader has not run a round yet: every write it tries is refused
    with pytest.raises(Fenced, match="epoch 2 leads"):
        ha.put_job_graph("a", 1, "job-2", b"late")
    with pytest.raises(Fenced):
        ha.remove_job_graph("a", 1, "job-1")
    with pytest.raises(Fenced):
        ha.put_dirty_result("a", 1, JobResult("job-1", "FAILED", 4.0, 1))
    assert ha.job_graph_ids() == ["job-1"] and ha.results() == {}
    # and its next round tells it
    _, changes = ha.contend(a, now=3.6)
    assert changes == [Revoked(1, "the lease is held by epoch 2 now")]


def test_a_released_lease_is_taken_at_once_and_its_old_holder_cannot_write(ha):
    a, b = Contender("a", "A", 60), Contender("b", "B", 60)
    ha.contend(a, now=0.0)
    assert ha.release(a, now=1.0) == [Revoked(1, "the JobManager stepped down")]
    with pytest.raises(Fenced):
        ha.put_job_graph("a", 1, "job-1", b"x")
    assert ha.contend(b, now=1.5)[1] == [Granted(2)]


def test_the_job_graph_store_keeps_graphs_and_histories_until_removed(ha):
    a = Contender("a", "A", 3)
    ha.contend(a, now=0.0)
    ha.put_job_graph("a", 1, "job-1", b"\x00graph bytes")
    ha.put_history("a", 1, "job-1", [{"to": "CREATED"}, {"to": "RUNNING"}])
    ha.put_progress("a", 1, "job-1", [{"vertex": "v", "subtask": 0, "attempt": 0, "partitions": []}])
    assert ha.job_graph("job-1") == b"\x00graph bytes"
    assert ha.history("job-1") == [{"to": "CREATED"}, {"to": "RUNNING"}]
    assert ha.progress("job-1") == [{"vertex": "v", "subtask": 0, "attempt": 0, "partitions": []}]
    ha.remove_job_graph("a", 1, "job-1")
    assert ha.job_graph_ids() == [] and ha.job_graph("job-1") is None and ha.history("job-1") == []
    assert ha.progress("job-1") == [] and os.listdir(ha.graphs_dir) == []


def test_job_results_go_from_dirty_to_clean(ha):
    a = Contender("a", "A", 3)
    ha.contend(a, now=0.0)
    ha.put_dirty_result("a", 1, JobResult("job-1", "FINISHED", 5.0, 1))
    assert ha.results() == {"job-1": JobResult("job-1", "FINISHED", 5.0, 1, clean=False)}
    assert os.listdir(ha.results_dir) == ["job-1_DIRTY.json"]
    ha.mark_result_clean("a", 1, "job-1")
    assert ha.results() == {"job-1": JobResult("job-1", "FINISHED", 5.0, 1, clean=True)}
    assert os.listdir(ha.results_dir) == ["job-1.json"]


def test_ids_that_are_not_path_ids_never_reach_a_path(ha):
    a = Contender("a", "A", 3)
    ha.contend(a, now=0.0)
    for bad in ("../escape", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ValueError):
            ha.put_job_graph("a", 1, bad, b"x")
    with pytest.raises(ValueError):
        FileSystemHaServices(str(ha.root), "../other")
    assert os.listdir(ha.graphs_dir) == []


def test_strangers_files_in_the_store_are_ignored_and_a_corrupt_lease_is_no_lease(ha):
    (open(os.path.join(ha.graphs_dir, "notes.txt"), "w")).close()
    (open(os.path.join(ha.results_dir, "..json"), "w")).close()
    with open(os.path.join(ha.results_dir, "job-9.json"), "w") as f:
        f.write("{not json")
    os.makedirs(ha.leases_dir, exist_ok=True)
    with open(os.path.join(ha.leases_dir, "7.json"), "w") as f:
        f.write("garbage")
    (open(os.path.join(ha.leases_dir, "notes.txt"), "w")).close()
    assert ha.job_graph_ids() == [] and ha.results() == {} and ha.leader() is None
    # no lease to respect, but its epoch is spent: the next leader's is higher
    assert ha.contend(Contender("a", "A", 3), now=0.0)[1] == [Granted(8)]


def test_writes_are_atomic_no_temporary_file_is_left_behind(ha):
    a = Contender("a", "A", 3)
    ha.contend(a, now=0.0)
    for i in range(5):
        ha.put_history("a", 1, "job-1", [{"n": i}])
    assert sorted(os.listdir(ha.graphs_dir)) == ["job-1.history"]
    assert json.loads(open(os.path.join(ha.graphs_dir, "job-1.history")).read()) == [{"n": 4}]


def test_a_killed_holder_is_recognised_as_gone_and_a_live_one_is_not():
    assert not holder_gone(process_identity())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = process_identity(child.pid)
        assert not holder_gone(identity)
    finally:
        child.kill()
        child.wait()
    assert holder_gone(identity)
    assert not holder_gone("other-host:1:1")  # another host's process: unknown, not gone


def test_concurrent_contenders_in_threads_elect_exactly_one_leader(ha):
    """Each epoch's lease file is created once: of 8 contenders racing for a free lease, one wins."""
    contenders = [Contender(f"c{i}", f"C{i}", 30) for i in range(8)]
    barrier = threading.Barrier(len(contenders))
    granted = []

    def run(c):
        barrier.wait()
        _, changes = ha.contend(c, now=0.0)
        granted.extend(changes)

    threads = [threading.Thread(target=run, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted == [Granted(1)]
    assert sum(c.epoch is not None for c in contenders) == 1


def test_every_contender_is_listed_until_it_releases_falls_silent_or_its_process_is_gone(ha):
    """Who takes part, leader and standbys, for `funke cluster status` and `stop`."""
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    ha.contend(a, now=10.0)
    ha.contend(b, now=10.5)
    assert ha.contenders(now=11.0) == [("a", "A"), ("b", "B")]
    ha.release(b, now=11.0)
    assert ha.contenders(now=11.0) == [("a", "A")]
    assert ha.contenders(now=10.0 + 2 * 3 + 0.5) == []  # not seen for two leases: not counted
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = process_identity(child.pid)
    ha.contend(Contender(holder, "C", 3), now=20.0)
    assert ha.contenders(now=20.0) == [(holder, "C")]
    child.kill()  # ours, by its pid
    child.wait()
    assert ha.contenders(now=20.0) == []  # a process of this host that is gone
    ha.contend(a, now=21.0)  # the next round of a contender forgets it
    assert sorted(os.listdir(ha.contenders_dir)) == [os.path.basename(ha._contender_file("a"))]


_STOPS_MID_WRITE = """
import os, signal, sys
from funke.common.leadership import Contender
from funke.runtime import hafilesystem
services = hafilesystem.FileSystemHaServices(sys.argv[1], "cluster-1", 0.5)
leader = Contender(hafilesystem.process_identity(), "A", 0.5)
services.contend(leader)
write = hafilesystem.write_atomically

def stopped_then_written(path, data):
    os.kill(os.getpid(), signal.SIGSTOP)  # a pause (GC, a frozen VM, SIGSTOP) in the middle of a store write
    write(path, data)

hafilesystem.write_atomically = stopped_then_written
services.put_history(leader.holder, leader.epoch, "job-1", [{"n": 1}])
print("written", flush=True)
"""


def test_a_leader_paused_in_the_middle_of_a_store_write_does_not_keep_a_standby_from_taking_over(ha, tmp_path):
    """A paused leader stays paused: whatever it was doing, its lease runs out and a standby
    takes over; woken up, the one write it had begun lands where nobody takes it for the
    lease, its leadership is over, and every later write of its epoch is refused."""
    import psutil
    import signal
    import time

    services = FileSystemHaServices(os.path.dirname(ha.root), "cluster-1", 0.5)
    child = subprocess.Popen([sys.executable, "-c", _STOPS_MID_WRITE, os.path.dirname(ha.root)],
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline and child.poll() is None, "the leader did not reach its write"
            time.sleep(0.01)
        paused = services.leader()
        assert paused is not None and paused.epoch == 1
        standby = Contender("b", "B", 0.5)
        granted: list = []
        round_ = threading.Thread(target=lambda: granted.extend(
            services.contend(standby, now=paused.expires_at + 0.1)[1]), daemon=True)
        round_.start()
        round_.join(10)
        assert not round_.is_alive(), "the standby's round waited on the paused leader"
        assert granted == [Granted(2)] and services.leader().holder == "b"
    finally:
        os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=30)
    assert out.strip() == "written"
    assert services.leader().epoch == 2 and services.leader().holder == "b"
    with pytest.raises(Fenced):
        services.put_history(paused.holder, 1, "job-1", [{"n": 2}])
    assert services.contend(standby, now=paused.expires_at + 0.2)[1] == []  # b still leads


def test_a_deposed_leaders_late_renewal_does_not_take_the_lease_back(ha):
    """A leader paused between reading its lease and writing the renewal writes it after a
    standby took over: the lease stays the standby's."""
    a, b = Contender("a", "A", 3), Contender("b", "B", 3)
    lease, _ = ha.contend(a, now=0.0)
    assert ha.contend(b, now=5.0)[1] == [Granted(2)]
    renewal = dataclasses.replace(lease, renewed_at=4.0)  # what it decided at 4.0, written at 5.0
    ha.write_lease(renewal)
    assert ha.leader().holder == "b" and ha.leader().epoch == 2
    assert ha.contend(a, now=5.1)[1] == [Revoked(1, "the lease is held by epoch 2 now")]
