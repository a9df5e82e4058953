"""The transition bookkeeping of one job's executions, for its scheduler: the one place an
execution moves from state to state, with everything that move changes besides its state.

`ExecutionTransitions._transition_all` moves executions through the execution table (the
specification's, or the one a test injects) and carries out each move's effects (`EFFECTS`, worked
out once per pair of states): the state counts the job's progress is read from, the TaskManagers
that run consumers of a result, the live executions of each slot-sharing group (and its slot when
the last one ends), the partitions an attempt leaves as garbage, the ExecutionStateChanged (and,
deploying, the DeployTask) action. `_transition` is its single entry (a report moves one
execution), `_transition_all` the bulk one (scheduling, deploying, cancelling thousands), so a new
effect is added once. A job status moves through `_job_transition`.

`Scheduler` is an `ExecutionTransitions`: what this reads of it and calls on it is declared on the
class below.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from funke.common.graph.deployment import PartitionRef
from funke.common.graph.executiongraph import Execution, ExecutionGraph, ExecutionVertex, FailureInfo, new_attempts
from funke.common.scheduling.actions import (
    Action,
    DeployTask,
    ExecutionStateChanged,
    JobStatusChanged,
    ReleasePartitions,
    Timer,
)
from funke.common.scheduling.deploymentfactory import TaskDeploymentFactory
from funke.common.scheduling.slotallocator import ExecutionSlotAllocator
from funke.common.scheduling.slotsharing import ExecutionSlotSharingGroup, SlotSharingPlan
from funke.common.states import (
    DEPLOYED_EXECUTION_STATES,
    LIVE_EXECUTION_STATES,
    SCHEDULING_JOB_STATUSES,
    ExecutionState,
    IllegalTransition,
    JobStatus,
    Transition,
)

__all__ = ["EFFECTS", "Effects", "ExecutionTransitions"]

E = ExecutionState
_LIVE = LIVE_EXECUTION_STATES
_DEPLOYED = DEPLOYED_EXECUTION_STATES
_DEPLOYED_OR_CANCELING = DEPLOYED_EXECUTION_STATES | {E.CANCELING}
_TERMINAL = frozenset(state for state in E if state.is_terminal)


class Effects(NamedTuple):
    """What an execution's move from one state to another changes besides its state, worked out
    once per pair of states: a transition happens six times per subtask and attempt."""

    deployed: int  # +1 it now runs on its TaskManager (consumers there are told of partitions), -1 no longer
    live: int  # +1 it now needs its slot-sharing group's slot, -1 no longer
    terminal: bool
    finished: bool
    garbage: bool  # it ended without finishing after it could have written partitions: release them


def _effects(before: ExecutionState, to: ExecutionState) -> Effects:
    step = lambda a, b: (b and not a) - (a and not b)  # noqa: E731
    terminal = to in _TERMINAL
    return Effects(step(before in _DEPLOYED, to in _DEPLOYED), step(before in _LIVE, to in _LIVE), terminal,
                   to is E.FINISHED, terminal and to is not E.FINISHED and before in _DEPLOYED_OR_CANCELING)


EFFECTS = {(a, b): _effects(a, b) for a in E for b in E}
_new_tuple = tuple.__new__


class ExecutionTransitions:
    """The transition bookkeeping (see the module docstring); `Scheduler` is one."""

    # set by `_init_transitions`
    execution_transitions: Mapping[ExecutionState, frozenset[ExecutionState]]
    state_counts: dict[ExecutionState, int]  # of current executions
    _total: int
    _non_terminal: int
    _finished: int
    _garbage: dict[str, list[PartitionRef]]
    _task_managers_used: set[str]
    # the scheduler's
    graph: ExecutionGraph
    plan: SlotSharingPlan
    slots: ExecutionSlotAllocator
    deployments: TaskDeploymentFactory
    _stimulus: str  # the id of the event being handled
    _out: list[Action]  # the event's actions

    @property
    def status(self) -> JobStatus:
        return self.graph.status

    def _keeps_slots(self) -> bool:
        """Whether a group's slot stays the group's when its last execution ends."""
        raise NotImplementedError

    def _start_timer(self, kind: str, at: float) -> Timer:
        raise NotImplementedError

    def _init_transitions(self, table: Mapping[ExecutionState, frozenset[ExecutionState]]) -> None:
        """After the graph, the slot-sharing plan, the slot allocator and the deployment factory."""
        # Which execution transitions are legal: the specification's table, or (test only) a
        # deliberately defective one (`states.TESTING_MUTANTS`) the conformance kit must catch.
        self.execution_transitions = table
        self._total = total = self.graph.number_of_vertices()  # the graph's shape never changes
        self.state_counts = {E.CREATED: total}
        self._non_terminal = total  # current executions not in a terminal state
        self._finished = 0  # current executions FINISHED
        self._garbage = {}  # TaskManager -> partitions this event made garbage
        self._task_managers_used = set()
        # what every move reads, in one attribute (none of them is ever replaced)
        self._books = (table, self.state_counts, self.plan.by_job_vertex, self.slots.usage, self.slots.slot_of)

    def _transition(self, execution: Execution, to: ExecutionState, now: float, cause: str,
                    failure: FailureInfo | None = None, keep_slot: bool = False) -> None:
        """One execution's move: `_transition_all` of one."""
        self._transition_all((execution,), to, now, cause, failure, keep_slot)

    def _transition_all(self, executions: Iterable[Execution], to: ExecutionState, now: float, cause: str,
                        failure: FailureInfo | None = None, keep_slot: bool = False, *, deploy: bool = False,
                        then: Callable[[Execution], None] | None = None) -> None:
        """Move each of `executions` to `to`, in order, and carry out what each move changes besides
        its state (`EFFECTS`): the one place that does, for one execution (a report) as for
        thousands (scheduling a region, deploying, cancelling a job). The hot path of every
        schedule, deployment, report and failover: what a move changes is looked up once per state
        it leaves, and the executions leaving one state share its transition record. If a move is
        illegal, IllegalTransition (with the execution's story); the moves before it are made.

        `failure`: the executions' failure. `keep_slot`: a group's slot its last execution leaves
        stays the group's (the failure handling decides). `deploy` (SCHEDULED -> DEPLOYING): each
        goes into its group's slot and gets its deployment. `then(ex)`: after each move."""
        table, counts, by_vertex, usage, slot_of = self._books
        stimulus, out = self._stimulus, self._out.append
        failing = to is E.FAILED
        if deploy:
            used = self._task_managers_used
            vertex_deployment, gates = self.deployments.vertex_deployment, self.deployments.gates
            last_vertex, plan = None, None  # executions of one job vertex come together
        last: ExecutionState | None = None  # the first move looks its effects up (and makes `t`)
        for ex in executions:
            before = ex.state  # an Execution is its own state machine
            if before is not last:
                if to not in table[before]:
                    raise IllegalTransition(ex, before, to, cause, tuple(ex.history))
                last = before
                deployed, live, terminal, finished, garbage = EFFECTS[before, to]
                # tuple.__new__: the named tuple's own constructor is a Python function, a third of the cost
                t = _new_tuple(Transition, (before, to, now, cause, stimulus))
            vertex = ex.vertex
            if deploy:
                ejv = vertex.job_vertex
                slot = ex.slot = slot_of[by_vertex[ejv.id][vertex.subtask_index]]
                tm = slot.task_manager_id
                used.add(tm)
                t = _new_tuple(Transition, (before, to, now, f"deploying to {tm}/slot-{slot.slot_index}",  # str(slot)
                                            stimulus))
            else:
                slot = ex.slot
                tm = slot.task_manager_id if slot is not None else None
            ex.history.append(t)
            ex.state = to
            if vertex.current_execution is ex:
                counts[before] -= 1
                counts[to] = counts.get(to, 0) + 1
            if failure is not None:
                ex.failure = failure
            if deployed and tm and vertex.consumed_partition_groups:
                self.deployments.consumer_moved(ex, tm, deployed)
            if live:
                group = by_vertex[vertex.job_vertex.id][vertex.subtask_index]
                usage[group] = usage.get(group, 0) + live
            name = vertex.name
            out(_new_tuple(ExecutionStateChanged, (ex.attempt_id, name, t, tm, ex.failure if failing else None)))
            if deploy:
                if ejv is not last_vertex:
                    last_vertex, plan = ejv, vertex_deployment(ejv)
                out(_new_tuple(DeployTask, (plan, ex.attempt_id, name, slot,
                                            gates(vertex) if vertex.consumed_partition_groups else (), stimulus)))
            if terminal:
                self._non_terminal -= 1
                if finished:
                    self._finished += 1
                elif garbage and tm and vertex.produced_partitions:
                    # whatever this attempt wrote is garbage: nobody will ever be told to read it
                    # (one ReleasePartitions per TaskManager and event, at its end: `_release_garbage`)
                    refs = self._garbage.get(tm)
                    if refs is None:
                        refs = self._garbage[tm] = []
                    number = ex.attempt_number
                    refs += [PartitionRef(p.result.id, p.partition_index, number) for p in vertex.produced_partitions]
            if live < 0 and not keep_slot and usage[group] == 0 and group in slot_of and not self._keeps_slots():
                self._free_group_slot(group, f"{name} {to.value}", now)
            if then is not None:
                then(ex)

    def _free_if_unused(self, vertex: ExecutionVertex, now: float) -> None:
        group = self.plan.group_of(vertex)
        if not self.slots.usage.get(group) and group in self.slots.slot_of and not self._keeps_slots():
            self._free_group_slot(group, f"{vertex.name} {vertex.state.value}", now)

    def _free_group_slot(self, group: ExecutionSlotSharingGroup, cause: str, now: float) -> None:
        """No task of `group` runs in its slot any more: it goes back, or to the job's slot pool
        (`ExecutionSlotAllocator.free`), whose idle timer starts with its first slot."""
        if self.slots.free(group, cause, keep_idle=self.status in SCHEDULING_JOB_STATUSES, out=self._out):
            self._start_timer("slot-idle", now + self.slots.idle_timeout_s)

    def _job_transition(self, to: JobStatus, now: float, cause: str) -> None:
        t = self.graph.status_machine.transition(to, now, cause, self._stimulus)
        self._out.append(JobStatusChanged(t))

    def _reset_all(self, vertices: list[ExecutionVertex], now: float) -> None:
        """A new attempt for each of `vertices` (their current ones all ended), in order."""
        counts: dict[ExecutionState, int] = {}
        for ev in vertices:
            state = ev.current_execution.state
            counts[state] = counts.get(state, 0) + 1
        new_attempts(vertices, now)
        for ev in vertices:
            for partition in ev.produced_partitions:  # the attempt consumers wait for changed
                for group in partition.consumed_partition_groups:
                    group.version += 1
        state_counts = self.state_counts
        for state, n in counts.items():
            state_counts[state] -= n
        state_counts[E.CREATED] = state_counts.get(E.CREATED, 0) + len(vertices)
        self._non_terminal += len(vertices)
        self._finished -= counts.get(E.FINISHED, 0)

    def _release_garbage(self) -> None:
        """Tell each TaskManager which partitions of ended attempts it may delete (made garbage
        by this event's transitions), in one action per TaskManager."""
        for tm, refs in self._garbage.items():
            self._out.append(ReleasePartitions(tm, tuple(refs)))
        self._garbage = {}

    def _validate_counts(self, vertices: Sequence[ExecutionVertex]) -> None:
        """The state counts agree with the executions; AssertionError naming the first disagreement."""
        states: dict[ExecutionState, int] = {}
        for ev in vertices:
            states[ev.state] = states.get(ev.state, 0) + 1
        kept = {state: n for state, n in self.state_counts.items() if n}
        assert kept == states, f"state counts {kept} disagree with the graph {states}"
        finished = states.get(E.FINISHED, 0)
        assert self._finished == finished, f"_finished={self._finished}, the graph has {finished} FINISHED"
        non_terminal = sum(n for state, n in states.items() if not state.is_terminal)
        assert self._non_terminal == non_terminal, f"_non_terminal={self._non_terminal}, the graph has {non_terminal}"
