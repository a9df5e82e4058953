"""Partition availability on a TaskManager: a gate must never count a stale producer attempt."""

from __future__ import annotations

from funke.taskmanager.inputgates import PartitionAvailability
from funke.v1 import cluster_pb2


def gate(start: int, stop: int, *, uniform: int | None = None, attempts: list[int] | None = None):
    m = cluster_pb2.InputGateDeploymentDescriptor(input_index=0, data_set_id="d", partition_start=start,
                                                  partition_end=stop, schema='{"type":"struct","fields":[]}')
    if attempts is not None:
        m.producer_attempts.extend(attempts)
    else:
        m.uniform_attempt = uniform
    return m


def update(registry: PartitionAvailability, index: int, attempt: int) -> None:
    registry.update("job", [cluster_pb2.PartitionInfoUpdate(data_set_id="d", partition_index=index,
                                                            producer_attempt=attempt, schema="")])


def test_a_gate_waiting_for_attempt_one_does_not_count_a_remembered_attempt_zero():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    update(registry, 1, 0)  # both partitions' first attempts were announced to this TaskManager
    woken = []
    g, waits = registry.open_gate("job", gate(0, 2, uniform=-2), lambda: woken.append(True))  # waits for attempt 1
    assert waits, "attempt 0 is stale: the producers were restarted"
    update(registry, 0, 1)
    assert not woken
    update(registry, 1, 1)
    assert woken == [True]
    assert registry.snapshot("job", g).attempts == (1, 1)


def test_listed_attempts_wait_for_the_named_attempt_per_partition():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    update(registry, 1, 2)
    woken = []
    g, waits = registry.open_gate("job", gate(0, 2, attempts=[-2, -2]), lambda: woken.append(True))
    # partition 0 remembers attempt 0 (stale, attempt 1 awaited); partition 1 already has attempt 2
    assert waits
    update(registry, 0, 1)
    assert woken == [True]
    assert registry.snapshot("job", g).attempts == (1, 2)


def test_first_attempts_still_count_as_before():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    g, waits = registry.open_gate("job", gate(0, 1, uniform=-1), lambda: None)  # -1: waiting for attempt 0
    assert not waits
    assert registry.snapshot("job", g).attempts == (0,)
