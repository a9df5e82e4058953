"""Partition availability on a TaskManager: a gate must never count a stale producer attempt."""

from __future__ import annotations

from funke.common.graph.deployment import Available, Awaiting, InputGateDeployment, PartitionUpdate
from funke.common.task.inputgates import PartitionAvailability

SCHEMA = '{"type":"struct","fields":[]}'


def gate(start: int, stop: int, *, uniform=None, producers=None) -> InputGateDeployment:
    return InputGateDeployment(0, "d", range(start, stop), None, uniform,
                               tuple(producers) if producers is not None else None, SCHEMA)


def update(registry: PartitionAvailability, index: int, attempt: int) -> list:
    return registry.update("job", [PartitionUpdate("d", index, attempt, "")])


def test_a_gate_waiting_for_attempt_one_does_not_count_a_remembered_attempt_zero():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    update(registry, 1, 0)  # both partitions' first attempts were announced to this TaskManager
    woken = []
    g, waits = registry.open_gate("job", gate(0, 2, uniform=Awaiting(1)), lambda: woken.append(True))
    assert waits, "attempt 0 is stale: the producers were restarted"
    assert update(registry, 0, 1) == []
    fired = update(registry, 1, 1)
    assert len(fired) == 1
    fired[0]()
    assert woken == [True]
    assert registry.snapshot("job", g).attempts == (1, 1)


def test_listed_attempts_wait_for_the_named_attempt_per_partition():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    update(registry, 1, 2)
    g, waits = registry.open_gate("job", gate(0, 2, producers=[Awaiting(1), Awaiting(1)]), lambda: None)
    # partition 0 remembers attempt 0 (stale, attempt 1 awaited); partition 1 already has attempt 2
    assert waits
    assert update(registry, 0, 0) == []  # late news of the stale attempt changes nothing
    assert len(update(registry, 0, 1)) == 1
    assert registry.snapshot("job", g).attempts == (1, 2)


def test_first_attempts_still_count_as_before():
    registry = PartitionAvailability()
    update(registry, 0, 0)
    g, waits = registry.open_gate("job", gate(0, 1, uniform=Awaiting(0)), lambda: None)
    assert not waits
    assert registry.snapshot("job", g).attempts == (0,)


def test_the_deployments_attempt_and_the_recorded_one_the_newer_is_read():
    registry = PartitionAvailability()
    update(registry, 0, 1)
    update(registry, 1, 0)
    g, waits = registry.open_gate("job", gate(0, 2, producers=[Awaiting(1), Available(2)]), lambda: None)
    assert not waits and registry.snapshot("job", g).attempts == (1, 2)


def test_a_superseded_producer_attempt_is_not_counted_even_when_its_news_comes_late():
    registry = PartitionAvailability()
    registry.supersede("job", "d", 0, 2)  # attempt 2 of the producer is deployed here
    g, waits = registry.open_gate("job", gate(0, 1, uniform=Awaiting(2)), lambda: None)
    assert waits
    assert update(registry, 0, 1) == []
    assert len(update(registry, 0, 2)) == 1


def test_a_closed_gate_is_never_called_back():
    registry = PartitionAvailability()
    g, waits = registry.open_gate("job", gate(0, 1, uniform=Awaiting(0)), lambda: None)
    registry.close([g])
    assert update(registry, 0, 0) == []


def test_gates_over_one_range_share_a_read_until_the_record_changes():
    registry = PartitionAvailability()
    n = 20
    gates = [registry.open_gate("job", gate(0, n, uniform=Awaiting(0)), lambda: None)[0] for _ in range(3)]
    for p in range(n):
        update(registry, p, 0)
    first, second = registry.snapshot("job", gates[0]), registry.snapshot("job", gates[1])
    assert first.attempts == (0,) * n and first.unavailable == ()
    assert second.attempts is first.attempts, "the second consumer reads the first one's view"
    registry.release("job", "d", 1, 0)  # partition 1 is released before the third reads it
    third = registry.snapshot("job", gates[2])
    assert third.attempts == (0, -1) + (0,) * (n - 2) and third.unavailable == (1,)
    update(registry, 1, 1)  # a newer attempt of partition 1 becomes available
    assert registry.snapshot("job", gates[2]).attempts == (0, 1) + (0,) * (n - 2)


def test_a_uniformly_available_gate_reads_its_attempt_everywhere():
    registry = PartitionAvailability()
    for n in (4, 40):  # read directly, and through a shared view
        g, waits = registry.open_gate("job", gate(0, n, uniform=Available(3)), lambda: None)
        assert not waits
        s = registry.snapshot("job", g)
        assert s.attempts == (3,) * n and s.unavailable == ()
