"""The job's slots, as Flink's slot pool keeps them: a slot no task of the job runs in any more
stays the job's, idle, for the regions it schedules next (a batch job's consumers take the slots
their producers left), and goes back to the SlotManager after the idle timeout, at once while
the job waits for slots, and when the job ends. A global failover that will restart keeps every
slot bound to its group and restarts into them; a job that gives up hands everything back."""

from __future__ import annotations

from funke.common.graph.deployment import TaskReport
from funke.common.graph.executiongraph import ExecutionAttemptId, ExecutionGraph, FailureInfo, SlotId
from funke.common.graph.jobgraph import FailoverStrategyKind, JobGraph
from funke.common.graph.restart import FixedDelayRestartBackoffTimeStrategy, NoRestartBackoffTimeStrategy
from funke.common.scheduling import scheduler as s
from funke.common.scheduling import slotmanager as sm
from funke.common.states import ExecutionState, JobStatus
from tests.conformance.graphs import (ALL_TO_ALL, BLOCKING, PIPELINED, connect, job_graph, sink, source,
                                      source_sink_all_to_all)

E = ExecutionState
J = JobStatus
JOB = "job"
IDLE_S = 10.0


class Cluster:
    """A scheduler whose actions go to a real SlotManager; what else they say is kept to look at."""

    def __init__(self, job: JobGraph, slots: dict[str, int], restarts: bool = True,
                 failover: FailoverStrategyKind = FailoverStrategyKind.FULL):
        strategy = FixedDelayRestartBackoffTimeStrategy(3, 0.0) if restarts else NoRestartBackoffTimeStrategy()
        self.scheduler = s.Scheduler(ExecutionGraph(job, JOB, 0.0), restart_strategy=strategy,
                                     failover_strategy=failover, slot_idle_timeout_s=IDLE_S)
        self.slots = sm.SlotManager(heartbeat_timeout_s=1e9)
        for tm, n in slots.items():
            self.slots.register(tm, "", n, {}, 0.0)
        self.actions: list = []  # everything since the last `take`
        self.running: dict[ExecutionAttemptId, SlotId] = {}  # deployed, not reported ended

    @classmethod
    def running(cls, job: JobGraph, slots: dict[str, int], restarts: bool = True) -> "Cluster":
        """Started, every task deployed RUNNING, the actions so far forgotten."""
        cluster = cls(job, slots, restarts)
        cluster.apply(cluster.scheduler.start(0.0))
        cluster.run_all()
        cluster.take(object)
        return cluster

    def apply(self, actions: list) -> None:
        queue = list(actions)
        while queue:
            a = queue.pop(0)
            self.actions.append(a)
            answers: list = []
            if isinstance(a, s.RequestSlots):
                answers = self.slots.request_slots(JOB, a.requests, a.timeout_s, 0.0)
            elif isinstance(a, s.ReleaseSlot):
                answers = self.slots.release_slot(a.slot, JOB, a.cause, 0.0)
            elif isinstance(a, s.CancelSlotRequest):
                self.slots.cancel_request(JOB, a.request_id)
            elif isinstance(a, s.DeployTask):
                self.running[a.attempt] = a.slot
            allocations = [(x.request_id, x.slots) for x in answers if isinstance(x, sm.SlotsAllocated)]
            if allocations:
                queue += self.scheduler.on_allocations(allocations, 0.0)

    def take(self, kind: type) -> list:
        """The actions of `kind` not taken yet (`object`: all of them)."""
        taken = [a for a in self.actions if isinstance(a, kind)]
        self.actions = [a for a in self.actions if not isinstance(a, kind)]
        return taken

    def report(self, attempts, state: ExecutionState) -> None:
        attempts = list(attempts)
        self.apply(self.scheduler.on_task_states([TaskReport(JOB, a, state) for a in attempts], 0.0))
        if state.is_terminal:
            for a in attempts:
                self.running.pop(a, None)

    def run_all(self) -> None:
        self.report(self.running, E.RUNNING)

    def fail(self, vertex_id: str, index: int) -> None:
        (attempt,) = [a for a in self.running if (a.vertex_id, a.subtask_index) == (vertex_id, index)]
        self.running.pop(attempt)
        self.apply(self.scheduler.on_task_state(attempt, E.FAILED, 0.0, failure=FailureInfo("Boom", "it broke")))

    def cancel_all(self) -> None:
        self.report([a.attempt for a in self.take(s.CancelTask)], E.CANCELED)

    def restart(self) -> None:
        self.fire("restart")

    def fire(self, kind: str) -> None:
        (timer,) = [a for a in self.take(s.StartTimer) if a.timer.kind == kind]
        self.apply(self.scheduler.on_timer(timer.timer, timer.at))

    def held(self) -> set[SlotId]:
        """What the SlotManager says the job holds."""
        return {SlotId(tm.task_manager_id, i) for tm in self.slots.task_managers.values()
                for i, holder in enumerate(tm.slots) if holder == JOB}


def test_a_global_failover_keeps_the_slots_and_restarts_into_them():
    cluster = Cluster.running(source_sink_all_to_all(3, PIPELINED), {"tm-1": 2, "tm-2": 1})
    before = {(a.vertex_id, a.subtask_index): slot for a, slot in cluster.running.items()}
    assert len(before) == 6 and len(cluster.held()) == 3
    cluster.fail("sink", 1)
    cluster.cancel_all()
    assert cluster.scheduler.status is J.RESTARTING
    assert cluster.take(s.ReleaseSlot) == [] and len(cluster.held()) == 3  # still the job's
    cluster.restart()
    assert cluster.take(s.RequestSlots) == []
    after = {(a.vertex_id, a.subtask_index): slot for a, slot in cluster.running.items() if a.attempt_number == 1}
    assert after == before  # every subtask again in its group's slot
    cluster.scheduler.validate_state()


def test_a_failover_that_gives_up_hands_every_slot_back():
    cluster = Cluster.running(source_sink_all_to_all(3, PIPELINED), {"tm-1": 3}, restarts=False)
    cluster.fail("source", 0)
    cluster.cancel_all()
    assert cluster.scheduler.status is J.FAILED
    assert len(cluster.take(s.ReleaseSlot)) == 3 and cluster.held() == set()
    cluster.scheduler.validate_state()


def test_kept_slots_the_restarted_job_does_not_need_yet_go_back_at_the_restart():
    """BLOCKING, the sinks in their own slot-sharing group: after the restart only the sources
    run, so the sinks' kept slots go back; the sinks ask again once the sources finished."""
    job = job_graph("two groups", [source("src", 2, slot_sharing_group="a"), sink("snk", 2, slot_sharing_group="b")],
                    [connect("src", "snk", ALL_TO_ALL, BLOCKING)])
    cluster = Cluster(job, {"tm-1": 2})
    cluster.apply(cluster.scheduler.start(0.0))
    cluster.report(list(cluster.running), E.FINISHED)  # the sources finish, the sinks deploy
    assert {a.vertex_id for a in cluster.running} == {"snk"}
    cluster.run_all()
    cluster.take(object)
    cluster.fail("snk", 0)
    cluster.cancel_all()
    assert cluster.take(s.ReleaseSlot) == [] and len(cluster.held()) == 2
    cluster.restart()
    released = cluster.take(s.ReleaseSlot)
    assert [r.cause for r in released] == ["not needed by the restarted job yet"] * 2
    assert sorted(a.vertex_id for a in cluster.running) == ["src", "src"]  # deployed into the slots freed
    cluster.report(list(cluster.running), E.FINISHED)
    assert sorted(a.vertex_id for a in cluster.running) == ["snk", "snk"]
    cluster.scheduler.validate_state()


def test_a_kept_slot_on_a_lost_task_manager_is_asked_for_again():
    cluster = Cluster.running(source_sink_all_to_all(2, PIPELINED), {"tm-1": 1, "tm-2": 1})
    cluster.fail("sink", 0)
    cluster.cancel_all()
    assert cluster.scheduler.status is J.RESTARTING
    cluster.slots.lose("tm-2", "heartbeat timeout", 0.0)
    cluster.apply(cluster.scheduler.on_task_manager_lost("tm-2", "heartbeat timeout", 0.0))
    assert [slot.task_manager_id for slot in cluster.scheduler.slots.slot_of.values()] == ["tm-1"]
    cluster.slots.register("tm-3", "", 1, {}, 0.0)
    cluster.restart()
    (request,) = [r for a in cluster.take(s.RequestSlots) for r in a.requests]
    assert request.count == 1  # only the lost one
    deployed = {slot.task_manager_id for a, slot in cluster.running.items() if a.attempt_number == 1}
    assert deployed == {"tm-1", "tm-3"}
    cluster.scheduler.validate_state()


def _blocking(p: int) -> JobGraph:
    return job_graph("two groups", [source("src", p, slot_sharing_group="a"), sink("snk", p, slot_sharing_group="b")],
                     [connect("src", "snk", ALL_TO_ALL, BLOCKING)])


def test_a_finished_producers_slot_stays_idle_until_the_timeout_hands_it_back():
    cluster = Cluster(_blocking(3), {"tm-1": 3})
    cluster.apply(cluster.scheduler.start(0.0))
    sources = sorted(cluster.running, key=lambda a: a.subtask_index)
    cluster.take(object)
    cluster.report(sources[:2], E.FINISHED)  # the sinks wait for the third
    assert cluster.take(s.ReleaseSlot) == [] and len(cluster.held()) == 3
    (timer,) = [a for a in cluster.actions if isinstance(a, s.StartTimer)]
    assert (timer.timer.kind, timer.at) == ("slot-idle", IDLE_S)  # one timer for the pool, not one per slot
    cluster.scheduler.validate_state()
    cluster.fire("slot-idle")
    released = cluster.take(s.ReleaseSlot)
    assert [r.cause for r in released] == [f"idle for {IDLE_S:g} s"] * 2 and len(cluster.held()) == 1
    cluster.report(sources[2:], E.FINISHED)  # then the sinks ask for slots again
    assert sorted(a.vertex_id for a in cluster.running) == ["snk"] * 3
    cluster.scheduler.validate_state()


def test_a_slot_freed_while_the_job_waits_for_slots_goes_back_to_serve_the_wait():
    """Three regions on two slots: the third waits at the SlotManager, so the slot the first
    leaves is not kept idle (the SlotManager gives it to the waiting request, in its turn)."""
    cluster = Cluster(_blocking(3), {"tm-1": 2})
    cluster.apply(cluster.scheduler.start(0.0))
    first = sorted(cluster.running, key=lambda a: a.subtask_index)[0]
    assert len(cluster.running) == 2 and cluster.scheduler.slots.requests
    cluster.take(object)
    cluster.report([first], E.FINISHED)
    (released,) = cluster.take(s.ReleaseSlot)
    assert released.cause == "src (1/3) FINISHED"
    assert sorted(a.subtask_index for a in cluster.running) == [1, 2]  # the third got it
    assert not cluster.scheduler.slots.idle
    cluster.scheduler.validate_state()


def test_idle_slots_on_a_lost_task_manager_are_gone_and_the_job_ending_hands_back_the_rest():
    cluster = Cluster(_blocking(4), {"tm-1": 2, "tm-2": 2})
    cluster.apply(cluster.scheduler.start(0.0))
    sources = sorted(cluster.running, key=lambda a: a.subtask_index)
    cluster.report([a for a in sources if cluster.running[a].task_manager_id == "tm-1"], E.FINISHED)
    cluster.report([a for a in sources if cluster.running.get(a, SlotId("", 0)).task_manager_id == "tm-2"][:1],
                   E.FINISHED)
    assert sorted(slot.task_manager_id for slot in cluster.scheduler.slots.idle) == ["tm-1", "tm-1", "tm-2"]
    cluster.take(object)
    cluster.slots.lose("tm-1", "heartbeat timeout", 0.0)
    cluster.apply(cluster.scheduler.on_task_manager_lost("tm-1", "heartbeat timeout", 0.0))
    assert [slot.task_manager_id for slot in cluster.scheduler.slots.idle] == ["tm-2"]
    cluster.scheduler.validate_state()
    cluster.apply(cluster.scheduler.cancel(1.0))
    cluster.cancel_all()  # what the failover and the cancel asked to cancel
    assert cluster.scheduler.status is J.CANCELED and cluster.held() == set()
    cluster.scheduler.validate_state()
