"""The ZooKeeper HA services (runtime/hazookeeper.py) on a real ZooKeeper server on loopback:
election by the latch, leader retrieval, fencing of every write (by a deposed leader, and by a
leader whose session the server expired), the stores with records too large for a node, and a
dead local leader removed at once instead of after its session timeout."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from kazoo.client import KazooClient

from funke.common.leadership import Contender, Granted, Revoked
from funke.runtime.hafilesystem import Fenced, JobResult, process_identity
from funke.runtime.hazookeeper import INLINE_LIMIT, ZooKeeperHaServices

_clusters = itertools.count(1)


@pytest.fixture
def make(zookeeper, tmp_path):
    """`make()`: HA services of one fresh cluster, one instance (one ZooKeeper session) per
    process it stands for; closed after the test."""
    cluster = f"unit-{os.getpid()}-{next(_clusters)}"
    made: list[ZooKeeperHaServices] = []

    def new(session_timeout_s: float = 3.0) -> ZooKeeperHaServices:
        services = ZooKeeperHaServices(zookeeper, str(tmp_path / "ha"), cluster, "/funke-test", session_timeout_s)
        services.create_dirs()
        made.append(services)
        return services

    yield new
    for services in made:
        services.close()


def test_the_oldest_contender_leads_and_the_leader_node_names_it_for_retrieval(make):
    ha_a, ha_b, reader = make(), make(), make()
    a, b = Contender("a", "127.0.0.1:6123", 2), Contender("b", "127.0.0.1:6124", 2)
    lease, changes = ha_a.contend(a)
    assert changes == [Granted(1)] and lease.holder == "a" and lease.epoch == 1
    assert ha_b.contend(b)[1] == []  # behind a in the latch
    seen = reader.leader()
    assert (seen.holder, seen.epoch, seen.address) == ("a", 1, "127.0.0.1:6123") and seen.valid(time.time())
    # rounds of the leader renew; rounds of the standby change nothing
    assert ha_a.contend(a)[1] == [] and a.leads(time.time())
    assert ha_b.contend(b)[1] == [] and b.epoch is None


def test_a_released_leader_is_followed_at_once_and_its_writes_are_fenced(make):
    ha_a, ha_b = make(), make()
    a, b = Contender("a", "A", 2), Contender("b", "B", 2)
    ha_a.contend(a)
    ha_b.contend(b)
    ha_a.put_job_graph("a", 1, "job-1", b"graph")
    woken = threading.Event()
    ha_b.on_change(woken.set)
    assert ha_a.release(a) == [Revoked(1, "the JobManager stepped down")]
    assert woken.wait(5), "the standby's watch on the contender ahead did not fire"
    lease, changes = ha_b.contend(b)
    assert changes == [Granted(2)] and lease.holder == "b"
    with pytest.raises(Fenced):
        ha_a.put_job_graph("a", 1, "job-2", b"late")
    with pytest.raises(Fenced):
        ha_a.remove_job_graph("a", 1, "job-1")
    assert ha_b.job_graph_ids() == ["job-1"] and ha_b.job_graph("job-1") == b"graph"
    ha_b.put_job_graph("b", 2, "job-2", b"new")
    assert ha_a.job_graph_ids() == ["job-1", "job-2"]


def test_a_leader_whose_session_expired_is_fenced_by_the_store_before_it_knows(make, zookeeper):
    ha_a, ha_b = make(), make()
    a, b = Contender("a", "A", 2), Contender("b", "B", 2)
    ha_a.contend(a)
    ha_b.contend(b)
    # Expire a's session on the server, as a long pause or a partition would: a second client
    # joins the session and closes it.
    session_id, password = ha_a._zk.client_id
    other = KazooClient(zookeeper, client_id=(session_id, password))
    other.start(5)
    other.stop()
    other.close()
    deadline = time.monotonic() + 10
    while ha_b.contend(b)[0] is None or b.epoch is None:
        assert time.monotonic() < deadline, "the standby did not take over the expired leader's place"
        time.sleep(0.05)
    assert b.epoch == 2
    # a still believes it leads (its lease has not run out), yet the store refuses it
    with pytest.raises(Fenced):
        ha_a.put_dirty_result("a", 1, JobResult("job-1", "FINISHED", 1.0, 1))
    assert ha_b.results() == {}
    # its next round tells it, and it queues up behind b with a new latch node
    while True:
        try:
            _, changes = ha_a.contend(a)
            break
        except OSError:  # reconnecting with a new session
            time.sleep(0.05)
    assert [type(c) for c in changes] == [Revoked] and a.epoch is None


def test_the_stores_keep_small_records_in_nodes_and_large_ones_in_files(make, tmp_path):
    ha = make()
    a = Contender("a", "A", 2)
    ha.contend(a)
    big = os.urandom(INLINE_LIMIT + 1000)
    ha.put_job_graph("a", 1, "job-1", big)
    ha.put_history("a", 1, "job-1", [{"from": "CREATED", "to": "RUNNING"}])
    ha.put_progress("a", 1, "job-1", [{"vertex": "v"}])
    blobs = tmp_path / "ha" / ha.base.rsplit("/", 1)[1] / "blobs" / "job-1"
    assert [p.name.split(".")[0] for p in blobs.iterdir()] == ["jobgraphs"]
    assert ha.job_graph("job-1") == big
    # overwriting replaces the file; the old one is removed
    ha.put_job_graph("a", 1, "job-1", big[::-1])
    assert ha.job_graph("job-1") == big[::-1] and len(list(blobs.iterdir())) == 1
    assert ha.history("job-1") == [{"from": "CREATED", "to": "RUNNING"}] and ha.progress("job-1") == [{"vertex": "v"}]
    # a file changed behind our back is not trusted
    (file,) = blobs.iterdir()
    file.write_bytes(b"tampered")
    assert ha.job_graph("job-1") is None
    ha.remove_job_graph("a", 1, "job-1")
    assert ha.job_graph_ids() == [] and ha.history("job-1") == [] and not blobs.exists()
    # results: dirty, then clean; the archive beside them
    ha.put_dirty_result("a", 1, JobResult("job-1", "FAILED", 5.0, 1))
    assert ha.results() == {"job-1": JobResult("job-1", "FAILED", 5.0, 1, clean=False)}
    ha.mark_result_clean("a", 1, "job-1")
    assert ha.results()["job-1"].clean
    ha.put_archive("a", 1, "job-1", b"\x08\x01")
    assert ha.archives() == {"job-1": b"\x08\x01"}
    ha.remove_archive("a", 1, "job-1")
    assert ha.archives() == {}
    for hostile in ("../x", "a/b", "", "x" * 300):
        with pytest.raises(ValueError):
            ha.put_job_graph("a", 1, hostile, b"g")
        with pytest.raises(ValueError):
            ha.job_graph(hostile)


def test_a_stranger_node_in_the_store_is_ignored_not_fatal(make):
    ha = make()
    a = Contender("a", "A", 2)
    ha.contend(a)
    ha._zk.create(ha._path("job-results", "job-x"), b"not a record")
    ha._zk.create(ha._path("jobgraphs", "job-y"), b"Pnot json")
    assert ha.results() == {} and ha.job_graph("job-y") is None


_CONTENDER = textwrap.dedent("""
    import sys, time
    from funke.common.leadership import Contender
    from funke.runtime.hafilesystem import process_identity
    from funke.runtime.hazookeeper import ZooKeeperHaServices
    ha = ZooKeeperHaServices(sys.argv[1], sys.argv[2], sys.argv[3], "/funke-test", 30.0)
    ha.create_dirs()
    c = Contender(process_identity(), "dead:1", 20)
    while c.epoch is None:
        ha.contend(c)
    print("leading", c.epoch, flush=True)
    time.sleep(600)
""")


def test_a_dead_local_leader_is_replaced_at_once_not_after_its_session_timeout(make, zookeeper, tmp_path):
    ha = make()
    cluster = ha.base.rsplit("/", 1)[1]
    process = subprocess.Popen([sys.executable, "-c", _CONTENDER, zookeeper, str(tmp_path / "ha"), cluster],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().split() == ["leading", "1"]
        me = Contender(process_identity(), "me:2", 2)
        assert ha.contend(me)[1] == []  # the leader lives: no takeover
        process.kill()
        process.wait(10)
        killed = time.monotonic()
        while me.epoch is None:
            ha.contend(me)
            time.sleep(0.05)
        took = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        process.stdout.close()
    # the dead leader's session lives on the server for 30 s; its node went at once
    assert me.epoch == 2 and took < 10
    lease = ha.leader()
    assert (lease.holder, lease.epoch, lease.address) == (me.holder, 2, "me:2")


def test_a_stray_latch_node_of_our_own_session_does_not_keep_us_behind_ourselves(make):
    # A create that timed out on our side but was made: the node is ours, ahead of our own.
    ha = make()
    a = Contender("a", "A", 2)
    ha._zk.create(ha._path("latch", "n-"), b'{"holder": "a", "address": "A"}', ephemeral=True, sequence=True)
    lease, changes = ha.contend(a)
    assert changes == [Granted(1)] and lease.holder == "a"
    assert ha._zk.get_children(ha._path("latch")) == [ha._latch.rpartition("/")[2]]


def test_every_contender_is_listed_while_its_latch_node_lives(make):
    """Who takes part, leader first, for `funke cluster status` and `stop`."""
    ha_a, ha_b, reader = make(), make(), make()
    a, b = Contender("a", "A", 2), Contender("b", "B", 2)
    ha_a.contend(a)
    ha_b.contend(b)
    assert reader.contenders() == [("a", "A"), ("b", "B")]
    ha_a.release(a)
    assert reader.contenders() == [("b", "B")]
