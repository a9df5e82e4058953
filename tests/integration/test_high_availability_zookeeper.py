"""High availability on the `zookeeper` backend, on a real cluster: the cluster's own ZooKeeper
server (Debian's), two JobManagers contending through its latch, two TaskManagers with PySpark
finding the leader through its leader node. The same scenarios as the filesystem backend's:
kill -9 of the leader mid-job (a dead local leader's latch node is removed at once), and a
leader paused (SIGSTOP) until the server expires its session, the way a leader on another host
that hangs or is cut off is replaced, then fenced out when it wakes."""

from __future__ import annotations

import pytest

from funke.deploy import localcluster
from tests.integration.conftest import funke
from tests.integration.test_failover import corpus  # noqa: F401 (fixture)
from tests.integration.test_high_availability import (  # noqa: F401 (fixtures)
    HaCluster,
    _wait_status,
    ha,
    kill_9_mid_job,
    paused_leader,
    paused_leader_streaming,
    reference,
)

pytestmark = pytest.mark.cluster

SESSION_TIMEOUT = "3 s"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = HaCluster(tmp_path_factory.mktemp("ha-zookeeper"), backend="zookeeper",
                  ha_options={"high-availability.zookeeper.client.session-timeout": SESSION_TIMEOUT})
    yield c
    c.client.close()
    localcluster.stop(c.dir)
    for p in localcluster.status(c.dir).processes:
        assert not p.alive, f"{p.name} survived the stop"


def test_the_cluster_runs_on_its_own_zookeeper(cluster):
    assert cluster.info.high_availability == "zookeeper" and cluster.info.zookeeper is not None
    lease = cluster.lease()
    assert lease is not None and lease.address == localcluster.read_address(cluster.dir)
    assert cluster.client.cluster_overview().leader.epoch == lease.epoch


def test_kill_9_of_the_leader_mid_job_the_standby_finishes_it_with_identical_output(ha, corpus, reference, tmp_path):  # noqa: F811
    kill_9_mid_job(ha, corpus, reference, tmp_path)


def test_a_leader_paused_past_its_session_is_replaced_and_fenced_out(ha, corpus, reference, tmp_path):  # noqa: F811
    took = paused_leader(ha, corpus, reference, tmp_path)
    # Replaced once the server expired the paused leader's session (3 s without a heartbeat,
    # which it sends every second), not sooner: a paused process is not a dead one.
    print(f"paused leader replaced after {took:.2f} s (session timeout {SESSION_TIMEOUT})")
    assert took >= 1.5


def test_a_paused_leaders_streaming_query_is_taken_over_and_the_woken_leader_writes_nothing(ha, tmp_path):
    figures = paused_leader_streaming(ha, tmp_path)
    print(f"SIGSTOP of the leader (ZooKeeper): first batch committed under the new leader after "
          f"{figures['first_commit']:.2f} s")


def test_after_both_jobmanagers_died_add_jobmanager_brings_a_leader_back_on_the_clusters_zookeeper(ha):
    """The cluster's ZooKeeper (its port and the cluster's id are only in <dir>/ha.conf) and the
    TaskManagers run on; `funke cluster add-jobmanager` starts a JobManager that leads there, and
    the TaskManagers register with it on their own."""
    epoch = ha.lease().epoch
    for name in ("jobmanager", "jobmanager-2"):
        localcluster.kill(ha.dir, name)
    added = funke("cluster", "add-jobmanager", "--dir", str(ha.dir))
    assert added.stdout.startswith("jobmanager (pid ") and "it leads (epoch " in added.stdout, added.stdout
    lease, _ = ha.wait_for_new_leader(epoch)
    assert localcluster.leader_name(ha.dir) == "jobmanager"
    ha.restore()  # the other one again, and every TaskManager registered with the leader
    assert ha.client.cluster_overview().leader.epoch == lease.epoch
