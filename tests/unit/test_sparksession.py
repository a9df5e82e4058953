"""What a TaskManager asks Spark for, per kind of target, and the checks that it got it
(`funke.taskmanager.sparksession`; pure, so no Spark here)."""

from __future__ import annotations

import pytest

from funke.taskmanager import sparksession as ss


def plan(master=None, remote=None, conf=(), environ=None, slots=2):
    return ss.plan(master=master, remote=remote, slots=slots, cores=8, user_conf=tuple(conf),
                   scratch=None if remote else "/scratch/tm", environ=environ or {}, python="/venv/bin/python")


def test_local_mode_gets_funkes_defaults_and_the_users_settings_on_top():
    p = plan(conf=[("spark.scheduler.mode", "FIFO"), ("spark.driver.extraJavaOptions", "-Dx=1")])
    assert p.target == "local[2]" and not p.connect and not p.cluster
    assert p.conf["spark.scheduler.mode"] == "FIFO"  # the user's word wins
    assert p.conf["spark.sql.shuffle.partitions"] == "8"
    assert p.conf["spark.python.worker.faulthandler.enabled"] == "true"
    assert p.conf["spark.local.dir"] == "/scratch/tm/spark"
    assert p.conf["spark.driver.extraJavaOptions"] == f"{ss.DRIVER_JIT_OPTIONS} -Djava.io.tmpdir=/scratch/tm/jvm -Dx=1"
    assert p.environ == {"PYSPARK_PYTHON": "/venv/bin/python"}


@pytest.mark.parametrize("master", [None, "spark://m:7077"])
def test_executors_reach_their_python_workers_over_unix_sockets_unless_the_user_says(master):
    # over TCP a micro-batch's few rows wait for the delayed ACK at every Python stage
    assert plan(master=master).conf["spark.python.unix.domain.socket.enabled"] == "true"
    off = plan(master=master, conf=[("spark.python.unix.domain.socket.enabled", "false")])
    assert off.conf["spark.python.unix.domain.socket.enabled"] == "false"


@pytest.mark.parametrize("master", [None, "spark://m:7077"])
def test_cancelled_jobs_tasks_are_killed_without_interrupting_their_threads_unless_the_user_says(master):
    # an interrupted task thread waiting for its Python worker made Spark restart the Python
    # daemon, which killed the workers of every other task (tests/integration/test_spark_cancel_isolation.py)
    assert plan(master=master).conf["spark.sql.execution.interruptOnCancel"] == "false"
    on = plan(master=master, conf=[("spark.sql.execution.interruptOnCancel", "true")])
    assert on.conf["spark.sql.execution.interruptOnCancel"] == "true"


def test_a_scratch_directory_too_long_for_a_socket_path_keeps_tcp():
    # A socket's path holds 107 bytes: in a deep scratch directory binding it failed and the
    # session did not start (OSError: AF_UNIX path too long).
    deep = "/tmp/" + "d" * 56  # + "/jvm/.<uuid4>.sock" = 108 bytes
    p = ss.plan(master=None, remote=None, slots=2, cores=2, user_conf=(), scratch=deep, environ={},
                python="/venv/bin/python")
    assert p.conf["spark.python.unix.domain.socket.enabled"] == "false"
    assert any("TCP" in note and deep in note for note in p.notes)
    fits = ss.plan(master=None, remote=None, slots=2, cores=2, user_conf=(), scratch=deep[:-1], environ={},
                   python="/venv/bin/python")
    assert fits.conf["spark.python.unix.domain.socket.enabled"] == "true" and not fits.notes
    # a socket directory of the user's own decides instead of the scratch directory
    short = ss.plan(master=None, remote=None, slots=2, cores=2, environ={}, python="/venv/bin/python",
                    user_conf=(("spark.python.unix.domain.socket.dir", "/run/funke"),), scratch=deep)
    assert short.conf["spark.python.unix.domain.socket.enabled"] == "true"


@pytest.mark.parametrize("conf, environ, exported, shown", [
    # the setting becomes the variable PySpark sends with every function
    ([("spark.pyspark.python", "/opt/py/bin/python3")], {"PYSPARK_PYTHON": "/x"}, "/opt/py/bin/python3",
     "/opt/py/bin/python3 (spark.pyspark.python)"),
    ([], {"PYSPARK_PYTHON": "/usr/bin/python3.11"}, None, "/usr/bin/python3.11 (PYSPARK_PYTHON)"),
])
def test_the_users_python_for_spark_workers_is_kept(conf, environ, exported, shown):
    p = plan(master="spark://m:7077", conf=conf, environ=environ)
    assert p.environ.get("PYSPARK_PYTHON") == exported  # never the TaskManager's own interpreter
    assert any(shown in note for note in p.notes)


def test_a_clusters_executors_dial_the_driver_at_the_taskmanagers_address():
    assert ss.plan(master="spark://m:7077", remote=None, slots=2, cores=2, user_conf=(), scratch=None, environ={},
                   python="p", host="10.0.0.7").conf["spark.driver.host"] == "10.0.0.7"
    assert "spark.driver.host" not in ss.plan(master=None, remote=None, slots=2, cores=2, user_conf=(), scratch=None,
                                              environ={}, python="p", host="10.0.0.7").conf  # local mode
    assert ss.plan(master="spark://m:7077", remote=None, slots=2, cores=2, user_conf=(("spark.driver.host", "h"),),
                   scratch=None, environ={}, python="p", host="10.0.0.7").conf["spark.driver.host"] == "h"


def test_a_standalone_master_gets_one_core_per_slot_unless_the_user_says():
    p = plan(master="spark://m:7077", slots=3)
    assert p.cluster and p.standalone
    assert p.conf["spark.cores.max"] == "3" and p.conf["spark.sql.shuffle.partitions"] == "3"
    assert plan(master="spark://m:7077", conf=[("spark.cores.max", "6")]).conf["spark.cores.max"] == "6"
    assert "spark.cores.max" not in plan(master="yarn").conf  # only standalone takes every core


def test_spark_connect_gets_only_the_users_settings():
    p = plan(remote="sc://host:15002", conf=[("spark.sql.ansi.enabled", "false")])
    assert p.connect and not p.cluster
    assert p.conf == {"spark.sql.ansi.enabled": "false"}  # no FAIR, UI or local dirs pushed
    assert p.environ == {}  # the server's workers run the server's Python


def test_a_setting_the_connect_server_cannot_change_fails_the_start_naming_it():
    p = plan(remote="sc://host:15002", conf=[("spark.executor.memory", "4g"), ("spark.sql.ansi.enabled", "false"),
                                             ("spark.scheduler.mode", "FAIR")])
    with pytest.raises(ss.SparkStartError) as e:
        ss.check_connect_conf(p, lambda key: key.startswith("spark.sql."))
    assert "spark.executor.memory, spark.scheduler.mode" in str(e.value) and "--conf" in str(e.value)
    ss.check_connect_conf(plan(remote="sc://h:1", conf=[("spark.sql.x", "1")]), lambda key: True)


def test_a_connect_server_without_fair_scheduling_is_warned_about():
    assert ss.connect_warnings("FAIR") == []
    [warning] = ss.connect_warnings("FIFO")
    assert "spark.scheduler.mode=FAIR" in warning
    assert ss.connect_warnings(None)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_executors_are_awaited_on_a_cluster_master():
    clock = FakeClock()
    counts = iter([0, 0, 2])
    assert ss.await_executors(plan(master="spark://m:7077"), lambda: next(counts), timeout_s=5,
                              sleep=clock.sleep, clock=clock) == 2
    assert clock.now == pytest.approx(0.4)


def test_no_executor_within_the_timeout_is_a_clear_start_error():
    clock = FakeClock()
    with pytest.raises(ss.SparkStartError) as e:
        ss.await_executors(plan(master="spark://m:7077", slots=4), lambda: 0, timeout_s=3,
                           sleep=clock.sleep, clock=clock)
    message = str(e.value)
    assert "spark://m:7077" in message and "no executor within 3 s" in message and "4 core(s)" in message
    assert clock.now >= 3


def test_local_mode_and_connect_have_no_executors_to_wait_for():
    never = lambda: pytest.fail("asked for executors")  # noqa: E731
    assert ss.await_executors(plan(), never, timeout_s=1) == 0
    assert ss.await_executors(plan(remote="sc://h:1"), never, timeout_s=1) == 0


def test_the_class_data_archive_is_mapped_by_the_driver_before_the_users_java_options():
    p = ss.plan(master=None, remote=None, slots=2, cores=2, user_conf=(("spark.driver.extraJavaOptions", "-Dx=1"),),
                scratch="/scratch/tm", environ={}, python="p", jvm_archive="-XX:SharedArchiveFile=/cache/a.jsa")
    assert p.conf["spark.driver.extraJavaOptions"] == (
        f"{ss.DRIVER_JIT_OPTIONS} -Djava.io.tmpdir=/scratch/tm/jvm -XX:SharedArchiveFile=/cache/a.jsa -Dx=1")
    assert any("class-data archive" in note for note in p.notes)
    # no archive: nothing more than before
    assert plan().conf["spark.driver.extraJavaOptions"] == f"{ss.DRIVER_JIT_OPTIONS} -Djava.io.tmpdir=/scratch/tm/jvm"
    # a Connect server's JVM is not ours to start
    connect = ss.plan(master=None, remote="sc://h:15002", slots=2, cores=2, user_conf=(), scratch=None, environ={},
                      python="p", jvm_archive="-XX:SharedArchiveFile=/cache/a.jsa")
    assert connect.conf == {}


def test_the_drivers_optimising_compiler_waits_for_really_hot_code_on_every_classic_target():
    for p in (plan(), plan(master="spark://m:7077"), plan(master="yarn")):
        options = p.conf["spark.driver.extraJavaOptions"].split()
        assert "-XX:Tier4InvocationThreshold=50000" in options and "-XX:Tier4BackEdgeThreshold=400000" in options
        assert not any(o.startswith("-XX:TieredStopAtLevel") for o in options)  # C2 stays: steady state needs it
    # the user's own settings come last, so they win
    p = plan(conf=[("spark.driver.extraJavaOptions", "-XX:Tier4InvocationThreshold=5000")])
    assert p.conf["spark.driver.extraJavaOptions"].split()[-1] == "-XX:Tier4InvocationThreshold=5000"
    assert "spark.driver.extraJavaOptions" not in plan(remote="sc://h:15002").conf


@pytest.mark.parametrize(("message", "stopped"), [
    ("(java.lang.IllegalStateException) Cannot call methods on a stopped SparkContext.\nThis stopped SparkContext "
     "was created at ...", True),
    ("Job 3 cancelled because SparkContext was shut down", True),
    ("[NO_ACTIVE_SESSION] No active Spark session found. Please create a new Spark session before running the "
     "code.", False),  # the session is closed, the server runs: a new session, no wait
    ("row 7 failed on purpose", False),
])
def test_a_failure_that_says_the_connect_server_is_shutting_down_is_told_apart(message, stopped):
    assert ss.server_stopped(message) is stopped


NETWORK_DEFAULTS = {  # from heartbeat.interval 1 s and heartbeat.timeout 5 s, funke's defaults
    "spark.network.timeout": "10000ms", "spark.network.timeoutInterval": "5000ms",
    "spark.executor.heartbeatInterval": "2500ms", "spark.shuffle.io.connectionCreationTimeout": "5000ms",
    "spark.shuffle.io.retryWait": "1000ms", "spark.rpc.askTimeout": "120s"}


@pytest.mark.parametrize("master", ["spark://m:7077", "yarn", "k8s://https://api:6443"])
def test_a_cluster_masters_network_timeouts_follow_funkes_heartbeats(master):
    p = plan(master=master)
    assert {k: p.conf[k] for k in NETWORK_DEFAULTS} == NETWORK_DEFAULTS
    assert any("after 10 s (spark.network.timeout, from heartbeat.timeout 5 s)" in n for n in p.notes)
    slow = ss.plan(master=master, remote=None, slots=2, cores=8, user_conf=(), scratch=None, environ={}, python="p",
                   heartbeat_interval_s=3.0, heartbeat_timeout_s=30.0).conf
    assert (slow["spark.network.timeout"], slow["spark.network.timeoutInterval"], slow["spark.executor.heartbeatInterval"],
            slow["spark.shuffle.io.connectionCreationTimeout"], slow["spark.shuffle.io.retryWait"]) == \
        ("60000ms", "30000ms", "10000ms", "30000ms", "3000ms")


def test_local_mode_and_spark_connect_keep_sparks_network_timeouts():
    for p in (plan(), plan(remote="sc://h:15002")):
        assert not set(NETWORK_DEFAULTS) & set(p.conf)


def test_the_users_network_settings_win_and_a_users_timeout_is_the_base_of_the_others():
    p = plan(master="spark://m:7077", conf=[("spark.shuffle.io.retryWait", "5s"), ("spark.rpc.askTimeout", "30s")])
    assert p.conf["spark.shuffle.io.retryWait"] == "5s" and p.conf["spark.rpc.askTimeout"] == "30s"
    assert p.conf["spark.network.timeout"] == "10000ms"
    p = plan(master="spark://m:7077", conf=[("spark.network.timeout", "2min")])
    assert p.conf["spark.network.timeout"] == "2min"
    # Spark requires the interval and the executors' heartbeat under the user's timeout too
    assert p.conf["spark.network.timeoutInterval"] == "60000ms" and p.conf["spark.executor.heartbeatInterval"] == "10000ms"
    assert not any("spark.network.timeout" in n for n in p.notes)
    p = plan(master="spark://m:7077", conf=[("spark.network.timeout", "3")])  # a bare number: seconds
    assert (p.conf["spark.network.timeoutInterval"], p.conf["spark.executor.heartbeatInterval"],
            p.conf["spark.shuffle.io.connectionCreationTimeout"]) == ("1500ms", "1000ms", "3000ms")
    p = plan(master="spark://m:7077", conf=[("spark.network.timeout", "soon")])  # Spark says what is wrong
    assert not (set(NETWORK_DEFAULTS) - {"spark.network.timeout"}) & set(p.conf)
