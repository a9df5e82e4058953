"""Cluster configuration (common/configuration.py): Flink's keys, typed values, every problem listed."""

from __future__ import annotations

import pytest

from funke.common.configuration import ConfigurationError, parse_config_lines, parse_configuration


def test_high_availability_keys_are_flinks_and_every_problem_is_listed():
    config = parse_configuration({
        "high-availability.type": "filesystem",
        "high-availability.storageDir": "file:///var/funke/ha",
        "high-availability.cluster-id": "/prod-1",
        "high-availability.filesystem.lease-duration": "2 s",
    })
    assert config.ha_enabled and config.high_availability == "filesystem"
    assert config.ha_storage_dir == "/var/funke/ha" and config.ha_cluster_id == "prod-1"
    assert config.ha_lease_s == 2.0
    assert not parse_configuration({}).ha_enabled
    with pytest.raises(ConfigurationError) as info:
        parse_configuration({"high-availability": "zookeeper", "high-availability.cluster-id": "../x",
                             "high-availability.storageDir": "hdfs://nn/ha"})
    text = str(info.value)
    assert "zookeeper needs high-availability.zookeeper.quorum" in text
    assert "high-availability.cluster-id" in text
    assert "needs a local directory" in text
    with pytest.raises(ConfigurationError, match="needs high-availability.storageDir"):
        parse_configuration({"high-availability": "filesystem"})
    with pytest.raises(ConfigurationError, match="expected one of none, filesystem"):
        parse_configuration({"high-availability": "etcd"})


def test_zookeeper_keys_are_flinks_and_a_bad_quorum_or_root_is_named():
    config = parse_configuration({
        "high-availability": "zookeeper",
        "high-availability.storageDir": "/var/funke/ha",
        "high-availability.zookeeper.quorum": "zk-1:2181, zk-2:2181,[::1]:2181",
        "high-availability.zookeeper.path.root": "/flink/prod/",
        "high-availability.zookeeper.client.session-timeout": "8000",
    })
    assert config.high_availability == "zookeeper"
    assert config.ha_zookeeper_quorum == "zk-1:2181,zk-2:2181,[::1]:2181"
    assert config.ha_zookeeper_root == "/flink/prod" and config.ha_zookeeper_session_s == 8.0
    assert parse_configuration({}).ha_zookeeper_session_s == 6.0  # Flink's 60 s is what we beat
    with pytest.raises(ConfigurationError) as info:
        parse_configuration({
            "high-availability": "zookeeper", "high-availability.storageDir": "/ha",
            "high-availability.zookeeper.quorum": "zk-1:2181,zk-2",
            "high-availability.zookeeper.path.root": "/a/../b",
            "high-availability.zookeeper.client.session-timeout": "0 s",
        })
    problems = info.value.problems
    assert len(problems) == 3, problems
    assert any("zookeeper.quorum: expected host:port" in p and "zk-2" in p for p in problems)
    assert any("path.root" in p for p in problems)
    assert any("session-timeout" in p for p in problems)
    for bad in ("", "zk:0", "zk:70000", "zk:21a", "zk/x:2181", "a:1,,b:2", "zk\n:2181"):
        with pytest.raises(ConfigurationError):
            parse_configuration({"high-availability.zookeeper.quorum": bad})


def test_allowed_hosts_are_host_names_and_confine_the_hosts_of_socket_and_redis_sources_and_sinks():
    from funke.common.api.dsl import ExecutionEnvironment
    from funke.common.graph.validation import ValidationContext, find_problems

    config = parse_configuration({"funke.io.allowed-hosts": " Redis.internal , 127.0.0.1"})
    assert config.allowed_hosts == ("redis.internal", "127.0.0.1")
    assert parse_configuration({}).allowed_hosts == ()
    with pytest.raises(ConfigurationError, match="funke.io.allowed-hosts: must be a host name"):
        parse_configuration({"funke.io.allowed-hosts": "ok.host, bad host/.."})
    with pytest.raises(ConfigurationError, match="expected host names, got none"):
        parse_configuration({"funke.io.allowed-hosts": " , "})

    context = ValidationContext(allowed_hosts=config.allowed_hosts)
    env = ExecutionEnvironment("hosts", parallelism=1)
    lines = env.read_stream.socket_text("127.0.0.1", 9999)
    lines.write_redis("out", host="REDIS.internal")
    env.read_stream.redis("in", host="10.1.2.3").write_redis("copy", host="elsewhere.example")
    problems = [str(p) for p in find_problems(env.build(), context)]
    assert len(problems) == 2, problems  # the two hosts not allowed, each named; case does not matter
    assert any("'10.1.2.3' is not a host jobs may connect to here" in p for p in problems), problems
    assert any("'elsewhere.example'" in p and "funke.io.allowed-hosts: redis.internal, 127.0.0.1" in p
               for p in problems), problems
    assert find_problems(env.build(), ValidationContext()) == []  # no list: any host


def test_a_hash_inside_a_value_is_kept_and_a_comment_after_a_blank_is_dropped():
    text = (
        "# the whole line is a comment\n"
        "high-availability.storageDir: /data/#1   # where the HA metadata lives\n"
        "rest.address: localhost#not-a-comment\n"
        "heartbeat.timeout: 50 s # Flink's syntax\n"
    )
    assert parse_config_lines(text, "ha.conf") == {
        "high-availability.storageDir": "/data/#1",
        "rest.address": "localhost#not-a-comment",
        "heartbeat.timeout": "50 s",
    }


def test_a_quoted_value_keeps_its_hash_and_its_quotes_are_removed():
    text = (
        "a: \"x # y\"  # a comment after the quotes\n"
        "b: 'it''s #2'\n"
        "c: \"tab\\there\"\n"
        "d:\n"
    )
    assert parse_config_lines(text) == {"a": "x # y", "b": "it's #2", "c": "tab\there", "d": ""}


def test_every_bad_line_of_a_configuration_file_is_named_with_its_number():
    text = "no separator here\nok: 1\nq: \"unclosed\nr: 'a' trailing\n"
    with pytest.raises(ConfigurationError) as err:
        parse_config_lines(text, "ha.conf")
    assert err.value.problems == [
        "ha.conf:1: expected 'key: value', got 'no separator here'",
        "ha.conf:3: the quoted value '\"unclosed' has no closing \"",
        "ha.conf:4: unexpected 'trailing' after the quoted value",
    ]


def test_slot_idle_timeout_takes_flinks_key_and_syntax():
    assert parse_configuration({}).slot_idle_timeout_s == 10.0
    assert parse_configuration({"slot.idle.timeout": "50 s"}).slot_idle_timeout_s == 50.0
    assert parse_configuration({"slot.idle.timeout": "1500 ms"}).slot_idle_timeout_s == 1.5
    with pytest.raises(ConfigurationError, match="slot.idle.timeout: must be positive"):
        parse_configuration({"slot.idle.timeout": "0 s"})
