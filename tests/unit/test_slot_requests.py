"""The SlotManager's requests: all-or-nothing bulks, and independent requests served in parts."""

from __future__ import annotations

from funke.common.graph.executiongraph import SlotId
from funke.common.scheduling import slotmanager as sm
from funke.common.scheduling.slotsharing import SlotRequest


def _allocated(actions: list) -> list[tuple[str, int, int]]:
    return [(a.job_id, a.request_id, len(a.slots)) for a in actions if isinstance(a, sm.SlotsAllocated)]


def _manager(slots: int) -> sm.SlotManager:
    manager = sm.SlotManager(heartbeat_timeout_s=1e9)
    if slots:
        manager.register("tm-1", "", slots, {}, 0.0)
    return manager


def test_an_independent_request_is_served_in_parts_in_its_turn():
    manager = _manager(3)
    independent = SlotRequest(1, 5, (("default", 5),), independent=True)
    bulk = SlotRequest(1, 2, (("default", 2),))
    assert _allocated(manager.request_slots("a", [independent], 60.0, 0.0)) == [("a", 1, 3)]
    assert _allocated(manager.request_slots("b", [bulk], 60.0, 0.0)) == []  # no slot free
    # each freed slot goes to the older request, until its last part is served
    assert _allocated(manager.release_slot(SlotId("tm-1", 0), "a", "done", 1.0)) == [("a", 1, 1)]
    assert _allocated(manager.release_slot(SlotId("tm-1", 1), "a", "done", 1.0)) == [("a", 1, 1)]
    assert [p.request_id for p in manager.pending_requests("a")] == []
    # then the bulk of two waits for two free slots at once
    assert _allocated(manager.release_slot(SlotId("tm-1", 2), "a", "done", 1.0)) == []
    assert _allocated(manager.release_slot(SlotId("tm-1", 0), "a", "done", 1.0)) == [("b", 1, 2)]
    assert manager.free_slots == 0 and not manager.has_pending_requests("b")


def test_cancelling_an_independent_request_cancels_its_unserved_part():
    manager = _manager(2)
    manager.request_slots("a", [SlotRequest(7, 4, (("default", 4),), independent=True)], 60.0, 0.0)
    assert manager.has_pending_requests("a")
    manager.cancel_request("a", 7)
    assert not manager.has_pending_requests("a")
    assert _allocated(manager.release_slot(SlotId("tm-1", 0), "a", "done", 1.0)) == []
    assert manager.free_slots == 1


def test_an_independent_request_waits_for_resources_only_while_there_is_no_slot_at_all():
    """It needs one slot to make progress: more parts than the cluster has slots is no reason to
    fail it (a bulk of as many slots is unfulfillable and times out)."""
    manager = _manager(0)
    actions = manager.request_slots("a", [SlotRequest(1, 4, (("default", 4),), independent=True)], 10.0, 0.0)
    (waiting,) = [a for a in actions if isinstance(a, sm.WaitingForResources)]
    assert waiting.message.startswith("job needs 1 slot ") and "no TaskManager is registered" in waiting.message
    _, actions = manager.register("tm-1", "", 2, {}, 1.0)
    assert _allocated(actions) == [("a", 1, 2)]
    assert [a.message for a in actions if isinstance(a, sm.WaitingForResources)] == [""]
    assert [a for a in manager.check(100.0) if isinstance(a, sm.SlotRequestFailed)] == []  # it waits for slots
    manager.request_slots("b", [SlotRequest(1, 4, (("default", 4),))], 10.0, 100.0)
    (failed,) = [a for a in manager.check(111.0) if isinstance(a, sm.SlotRequestFailed)]
    assert failed.job_id == "b"
