"""Cluster configuration (common/configuration.py): Flink's keys, typed values, every problem listed."""

from __future__ import annotations

import pytest

from funke.common.configuration import ConfigurationError, parse_configuration


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
    assert "zookeeper is not supported yet" in text
    assert "high-availability.cluster-id" in text
    assert "needs a local directory" in text
    with pytest.raises(ConfigurationError, match="needs high-availability.storageDir"):
        parse_configuration({"high-availability": "filesystem"})
    with pytest.raises(ConfigurationError, match="expected one of none, filesystem"):
        parse_configuration({"high-availability": "etcd"})
