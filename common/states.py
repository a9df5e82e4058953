"""The state machines users rely on: JobStatus and ExecutionState, and for streaming jobs
QueryState and BatchPhase.

Everything that decides which state change is legal lives in this module, as data:
`JOB_STATUS_TRANSITIONS`, `EXECUTION_STATE_TRANSITIONS`, `QUERY_STATE_TRANSITIONS` and
`BATCH_PHASE_TRANSITIONS`; the sets of states the cores act on
(`LIVE_EXECUTION_STATES`, `DEPLOYED_EXECUTION_STATES`, `SCHEDULING_JOB_STATUSES`); how a job's
status follows from its executions (`JOB_STATUS_WHEN_EXECUTIONS_END`); and how a task's report
is read in the light of a stop that was asked for, on the JobManager
(`EXECUTION_REPORT_RESOLUTION`) and on the TaskManager (`TASK_REPORT_RESOLUTION`).
A TaskManager's connection to the JobManager follows `CONNECTION_STATE_TRANSITIONS`, and a live
rescale of a streaming query `RESCALE_STATE_TRANSITIONS` (`funke.common.scheduling.rescale`).
`StateMachine` applies a table to one entity (a job, an execution, a TaskManager's task) and keeps
that entity's story: every transition with its time, cause and the id of the event that caused
it (its stimulus). A rejected transition raises `IllegalTransition`, which names the entity, the
two states, the cause and the whole story, and changes nothing.

The tables follow Flink ("Jobs and Scheduling"; ExecutionState): see docs/concepts/state-machines.md for the diagrams,
which `render_mermaid` generates from these same tables.
"""

from __future__ import annotations

import enum
from typing import Generic, Mapping, NamedTuple, TypeVar


class JobStatus(enum.Enum):
    # Members are singletons compared by identity: hash them by identity too (Enum's own
    # __hash__ is Python code, and these are hashed on every state change).
    __hash__ = object.__hash__
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"
    SUSPENDED = "SUSPENDED"

    @property
    def is_globally_terminal(self) -> bool:
        """The job is done for the whole cluster: clean up everything."""
        return self in _GLOBALLY_TERMINAL_JOB

    @property
    def is_terminal(self) -> bool:
        """Done on this JobManager. SUSPENDED is only locally terminal: another JobManager
        may recover the job from the HA store."""
        return self in _GLOBALLY_TERMINAL_JOB or self is JobStatus.SUSPENDED


_GLOBALLY_TERMINAL_JOB = frozenset({JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED})


class ExecutionState(enum.Enum):
    __hash__ = object.__hash__
    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_EXECUTION


_TERMINAL_EXECUTION = frozenset({ExecutionState.FINISHED, ExecutionState.CANCELED, ExecutionState.FAILED})

_J = JobStatus
_NON_TERMINAL_JOB = [s for s in JobStatus if not s.is_terminal]

# from-state -> the states it may move to. Leaving a terminal state is never legal.
JOB_STATUS_TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    _J.CREATED: frozenset({_J.RUNNING, _J.CANCELLING, _J.FAILING, _J.SUSPENDED}),
    _J.RUNNING: frozenset({_J.FINISHED, _J.FAILING, _J.CANCELLING, _J.SUSPENDED}),
    # FAILING -> RESTARTING only once every task is terminal and the strategy allows a restart.
    _J.FAILING: frozenset({_J.RESTARTING, _J.FAILED, _J.CANCELLING, _J.SUSPENDED}),
    # RESTARTING -> CREATED when the restart is done; RESTARTING -> FAILED if it is impossible.
    _J.RESTARTING: frozenset({_J.CREATED, _J.CANCELLING, _J.FAILED, _J.SUSPENDED}),
    # CANCELLING -> FAILED when tasks could not be cancelled.
    _J.CANCELLING: frozenset({_J.CANCELED, _J.FAILED, _J.SUSPENDED}),
    _J.FINISHED: frozenset(),
    _J.CANCELED: frozenset(),
    _J.FAILED: frozenset(),
    _J.SUSPENDED: frozenset(),
}

_E = ExecutionState
EXECUTION_STATE_TRANSITIONS: Mapping[ExecutionState, frozenset[ExecutionState]] = {
    _E.CREATED: frozenset({_E.SCHEDULED, _E.CANCELED, _E.FAILED}),
    _E.SCHEDULED: frozenset({_E.DEPLOYING, _E.CANCELED, _E.FAILED}),
    # DEPLOYING/INITIALIZING -> FINISHED: short tasks may end before reporting progress.
    _E.DEPLOYING: frozenset({_E.INITIALIZING, _E.FINISHED, _E.CANCELING, _E.FAILED}),
    _E.INITIALIZING: frozenset({_E.RUNNING, _E.FINISHED, _E.CANCELING, _E.FAILED}),
    _E.RUNNING: frozenset({_E.FINISHED, _E.CANCELING, _E.FAILED}),
    _E.CANCELING: frozenset({_E.CANCELED, _E.FAILED}),
    _E.FINISHED: frozenset(),
    _E.CANCELED: frozenset(),
    _E.FAILED: frozenset(),
}

# A TaskManager reports what its task did; the JobManager applies it in the light of what it
# asked for. Once cancellation was requested, a task that still finished or failed ends CANCELED:
# its output is discarded and its failure is not a job failure. Pairs not listed apply as reported.
EXECUTION_REPORT_RESOLUTION: Mapping[tuple[ExecutionState, ExecutionState], ExecutionState] = {
    (_E.CANCELING, _E.FINISHED): _E.CANCELED,
    (_E.CANCELING, _E.FAILED): _E.CANCELED,
}


# Test only: deliberate defects a JobManager can be started with (`funke.testing.mutant`), so that
# the conformance kit can be seen to catch one: the execution table its scheduler is given instead
# of the specification's. "skip-initializing": INITIALIZING reports are dropped (DEPLOYING no longer
# leads there) and DEPLOYING -> RUNNING, which the specification forbids, is taken.
SKIP_INITIALIZING = "skip-initializing"
SKIP_INITIALIZING_EXECUTION_TRANSITIONS: Mapping[ExecutionState, frozenset[ExecutionState]] = {
    **EXECUTION_STATE_TRANSITIONS,
    _E.DEPLOYING: EXECUTION_STATE_TRANSITIONS[_E.DEPLOYING] - {_E.INITIALIZING} | {_E.RUNNING},
}
TESTING_MUTANTS: Mapping[str, Mapping[ExecutionState, frozenset[ExecutionState]]] = {
    SKIP_INITIALIZING: SKIP_INITIALIZING_EXECUTION_TRANSITIONS,
}


def resolve_report(current: ExecutionState, reported: ExecutionState) -> ExecutionState:
    return EXECUTION_REPORT_RESOLUTION.get((current, reported), reported)


# Executions that need their slot-sharing group's slot: scheduled, deployed, or being cancelled.
LIVE_EXECUTION_STATES: frozenset[ExecutionState] = frozenset(
    {_E.SCHEDULED, _E.DEPLOYING, _E.INITIALIZING, _E.RUNNING, _E.CANCELING})
# Executions a TaskManager runs: stopping one takes a cancel call.
DEPLOYED_EXECUTION_STATES: frozenset[ExecutionState] = frozenset({_E.DEPLOYING, _E.INITIALIZING, _E.RUNNING})
# Job statuses in which the scheduler schedules and deploys, and in which a task's failure is a
# new failure. In every other status the job is failing, restarting, cancelling or over.
SCHEDULING_JOB_STATUSES: frozenset[JobStatus] = frozenset({_J.CREATED, _J.RUNNING})


class ExecutionsOutcome(enum.Enum):
    """What a job's executions came to, once none of them runs any more."""
    __hash__ = object.__hash__

    ALL_FINISHED = "every task finished (and the outputs are committed)"
    ENDED_TO_RESTART = "every task ended; the restart strategy allows a restart"
    ENDED = "every task ended; no restart"


# The job status that follows when the executions end, per status the job was in. A status not
# listed does not change on its own (CREATED, RESTARTING: they wait for a timer or a slot).
JOB_STATUS_WHEN_EXECUTIONS_END: Mapping[tuple[JobStatus, ExecutionsOutcome], JobStatus] = {
    (_J.RUNNING, ExecutionsOutcome.ALL_FINISHED): _J.FINISHED,
    (_J.FAILING, ExecutionsOutcome.ENDED_TO_RESTART): _J.RESTARTING,
    (_J.FAILING, ExecutionsOutcome.ENDED): _J.FAILED,
    (_J.CANCELLING, ExecutionsOutcome.ENDED): _J.CANCELED,
    (_J.CANCELLING, ExecutionsOutcome.ENDED_TO_RESTART): _J.CANCELED,
}


class StopRequest(enum.Enum):
    """Who asked a TaskManager's task to stop, if anyone."""
    __hash__ = object.__hash__

    NONE = "none"
    JOBMANAGER = "the JobManager (cancel, or its slot freed)"
    TASKMANAGER = "the TaskManager itself (it is shutting down)"


# On a TaskManager: how a task's own outcome is reported once a stop was asked for. Cancel wins:
# a task the JobManager cancelled that still finished or failed ends CANCELED (its output is
# discarded, its failure is not the job's). A task the TaskManager stopped on its own ends FAILED:
# to the JobManager, which asked for nothing, it is a failure (it keeps its own failure if it had
# one). Pairs not listed are reported as they are.
TASK_REPORT_RESOLUTION: Mapping[tuple[StopRequest, ExecutionState], ExecutionState] = {
    (StopRequest.JOBMANAGER, _E.FINISHED): _E.CANCELED,
    (StopRequest.JOBMANAGER, _E.FAILED): _E.CANCELED,
    (StopRequest.TASKMANAGER, _E.FINISHED): _E.FAILED,
    (StopRequest.TASKMANAGER, _E.CANCELED): _E.FAILED,
}


def resolve_task_report(stop: StopRequest, reported: ExecutionState) -> ExecutionState:
    return TASK_REPORT_RESOLUTION.get((stop, reported), reported)


class QueryState(enum.Enum):
    """A streaming job's query, as Structured Streaming names its states (STOPPING added: a
    graceful stop finishing its batches in flight)."""
    INITIALIZING = "INITIALIZING"
    ACTIVE = "ACTIVE"
    STOPPING = "STOPPING"
    TERMINATED = "TERMINATED"


_Q = QueryState
QUERY_STATE_TRANSITIONS: Mapping[QueryState, frozenset[QueryState]] = {
    _Q.INITIALIZING: frozenset({_Q.ACTIVE, _Q.STOPPING, _Q.TERMINATED}),
    _Q.ACTIVE: frozenset({_Q.STOPPING, _Q.TERMINATED}),
    _Q.STOPPING: frozenset({_Q.TERMINATED}),
    _Q.TERMINATED: frozenset(),
}


class BatchPhase(enum.Enum):
    """One micro-batch of a streaming job, from its trigger to its commit log entry."""
    PLANNING = "PLANNING"  # the sources are asked for their latest offsets
    LOGGING = "LOGGING"  # its ranges are being written to the offset log (the write-ahead log)
    QUEUED = "QUEUED"  # logged; waits for its turn (concurrentJobs, batch order)
    RUNNING = "RUNNING"  # its tasks run it
    COMMITTING = "COMMITTING"  # every sink wrote it; the sinks commit it
    RECORDING = "RECORDING"  # committed; its commit log entry is being written
    COMPLETED = "COMPLETED"
    SKIPPED = "SKIPPED"  # no new data (or a stop came first): nothing logged, nothing run
    DEFERRED = "DEFERRED"  # logged, not run: a stop came first; the next run of the job runs it


_B = BatchPhase
BATCH_PHASE_TRANSITIONS: Mapping[BatchPhase, frozenset[BatchPhase]] = {
    _B.PLANNING: frozenset({_B.LOGGING, _B.SKIPPED}),
    _B.LOGGING: frozenset({_B.QUEUED}),
    _B.QUEUED: frozenset({_B.RUNNING, _B.DEFERRED}),
    _B.RUNNING: frozenset({_B.COMMITTING}),
    _B.COMMITTING: frozenset({_B.RECORDING}),
    _B.RECORDING: frozenset({_B.COMPLETED}),
    _B.COMPLETED: frozenset(),
    _B.SKIPPED: frozenset(),
    _B.DEFERRED: frozenset(),
}


class ConnectionState(enum.Enum):
    """A TaskManager's connection to the JobManager (`task/registration.py`), as Flink's
    TaskExecutor sees its ResourceManager: registering, registered, refused, lost, registering again."""
    __hash__ = object.__hash__
    REGISTERING = "REGISTERING"  # the first registration: an attempt in flight, or the wait before the next
    REGISTERED = "REGISTERED"  # heartbeats flow
    REFUSED = "REFUSED"  # the JobManager answered no (it cannot reach us, a wrong token): back off, ask again
    LOST = "LOST"  # the registration is over (stream ended, silence, a new leader): tasks are forgotten
    REREGISTERING = "REREGISTERING"  # as REGISTERING, after a registration was lost
    STOPPED = "STOPPED"  # the TaskManager shuts down


_C = ConnectionState
# A self-transition is another attempt (no answer, a new leader elected while it waited).
CONNECTION_STATE_TRANSITIONS: Mapping[ConnectionState, frozenset[ConnectionState]] = {
    _C.REGISTERING: frozenset({_C.REGISTERING, _C.REGISTERED, _C.REFUSED, _C.STOPPED}),
    _C.REGISTERED: frozenset({_C.LOST, _C.STOPPED}),
    # REFUSED -> REGISTERING before the first registration, REREGISTERING after one.
    _C.REFUSED: frozenset({_C.REGISTERING, _C.REREGISTERING, _C.STOPPED}),
    _C.LOST: frozenset({_C.REREGISTERING, _C.STOPPED}),
    _C.REREGISTERING: frozenset({_C.REREGISTERING, _C.REGISTERED, _C.REFUSED, _C.STOPPED}),
    _C.STOPPED: frozenset(),
}


class RescaleState(enum.Enum):
    """A live rescale of a streaming query (`funke rescale`), from the request to the next run of
    the job at the new parallelism (`funke.common.scheduling.rescale.Rescale`)."""
    __hash__ = object.__hash__
    REQUESTED = "REQUESTED"  # its graph is valid; the JobManager checks the cluster can run it
    STOPPING = "STOPPING"  # the query stops at a batch boundary: the batches in flight commit
    SUSPENDED = "SUSPENDED"  # they did (or the stop timed out): the job is SUSPENDED
    STARTING = "STARTING"  # the next run of the job, at the new parallelism, is being started
    RUNNING = "RUNNING"  # its tasks all run and the query goes on from its checkpoint: done
    FAILED = "FAILED"  # refused, or the job ended otherwise before its next run ran (the cause says why)


_R = RescaleState
# A rescale fails from every state but SUSPENDED: suspending the job is what its next run starts from.
RESCALE_STATE_TRANSITIONS: Mapping[RescaleState, frozenset[RescaleState]] = {
    _R.REQUESTED: frozenset({_R.STOPPING, _R.FAILED}),
    # STOPPING -> SUSPENDED: the batches committed, the stop timed out, or the JobManager suspended the job.
    _R.STOPPING: frozenset({_R.SUSPENDED, _R.FAILED}),
    _R.SUSPENDED: frozenset({_R.STARTING}),
    _R.STARTING: frozenset({_R.RUNNING, _R.FAILED}),
    _R.RUNNING: frozenset(),
    _R.FAILED: frozenset(),
}


class QueryMode(enum.Enum):
    """Where a streaming query's next batches come from (the micro-batch coordinator's mode,
    beside its public QueryState)."""
    STARTING = "STARTING"  # recovering; no trigger yet
    TRIGGERED = "TRIGGERED"  # processing-time: each tick makes a batch due
    CAPTURING = "CAPTURING"  # available-now: the sources are asked what they hold now
    BOUNDED = "BOUNDED"  # available-now, once: batches back to back up to the offsets captured
    DRAINING = "DRAINING"  # a draining stop: what the sources held at the stop, then the end
    STOPPING = "STOPPING"  # a stop: no new batch, the running ones finish
    ENDED = "ENDED"


_M = QueryMode
QUERY_MODE_TRANSITIONS: Mapping[QueryMode, frozenset[QueryMode]] = {
    _M.STARTING: frozenset({_M.TRIGGERED, _M.CAPTURING, _M.BOUNDED, _M.DRAINING, _M.STOPPING}),
    _M.TRIGGERED: frozenset({_M.DRAINING, _M.STOPPING}),
    _M.CAPTURING: frozenset({_M.BOUNDED, _M.STOPPING}),
    _M.BOUNDED: frozenset({_M.STOPPING, _M.ENDED}),
    _M.DRAINING: frozenset({_M.ENDED}),
    _M.STOPPING: frozenset({_M.ENDED}),
    _M.ENDED: frozenset(),
}


S = TypeVar("S", JobStatus, ExecutionState, QueryState, BatchPhase, ConnectionState, QueryMode, RescaleState)


class Transition(NamedTuple, Generic[S]):
    """One state change of one entity: an immutable record (a named tuple, not a frozen
    dataclass: every schedule, deployment, report and failover makes a few per subtask, and a
    frozen dataclass takes four times as long to build)."""

    from_state: S
    to_state: S
    timestamp: float
    cause: str = ""
    stimulus_id: str = ""  # the event that caused it, e.g. "tm-1:report-17" or "jm:slots-allocated-3"

    def __str__(self) -> str:
        why = f" ({self.cause})" if self.cause else ""
        by = f" [{self.stimulus_id}]" if self.stimulus_id else ""
        return f"{self.from_state.value} -> {self.to_state.value} at {self.timestamp:.3f}{why}{by}"


class IllegalTransition(Exception):
    """A state change the table does not allow. Carries the entity's story."""

    def __init__(self, entity: object, from_state: S, to_state: S, cause: str, history: tuple[Transition, ...]):
        entity = self.entity = str(entity)
        self.from_state = from_state
        self.to_state = to_state
        self.cause = cause
        self.history = history
        story = "\n".join(f"    {t}" for t in history) or "    (no transitions yet)"
        why = f" (cause: {cause})" if cause else ""
        super().__init__(
            f"{entity}: illegal transition {from_state.value} -> {to_state.value}{why}; "
            f"history:\n{story}"
        )


_new_tuple = tuple.__new__


class StateMachine(Generic[S]):
    """The current state of one entity under one transition table, and its story. `entity` names
    it in errors: a string, or an object whose str() does (made only when needed)."""

    __slots__ = ("entity", "table", "state", "created_at", "history")

    def __init__(self, entity: object, table: Mapping[S, frozenset[S]], initial: S, now: float):
        self.entity = entity
        self.table = table
        self.state: S = initial
        self.created_at = now
        self.history: list[Transition[S]] = []

    def can_transition(self, to: S) -> bool:
        return to in self.table[self.state]

    def transition(self, to: S, now: float, cause: str = "", stimulus_id: str = "") -> Transition[S]:
        if to not in self.table[self.state]:
            raise IllegalTransition(self.entity, self.state, to, cause, tuple(self.history))
        # tuple.__new__: every schedule, deployment and report makes one per subtask, and the
        # named tuple's own constructor (a Python function) is 40% of it
        t = _new_tuple(Transition, (self.state, to, now, cause, stimulus_id))
        self.history.append(t)
        self.state = to
        return t

    def timestamp_of(self, state: S) -> float | None:
        """When the entity last entered `state` (Flink's state timestamps)."""
        if self.history:
            for t in reversed(self.history):
                if t.to_state is state:
                    return t.timestamp
            if self.history[0].from_state is state:
                return self.created_at
            return None
        return self.created_at if self.state is state else None

    def path(self) -> list[S]:
        """Every state the entity was in, in order, starting with the initial one."""
        if not self.history:
            return [self.state]
        return [self.history[0].from_state] + [t.to_state for t in self.history]


def job_status_machine(entity: str, now: float) -> StateMachine[JobStatus]:
    return StateMachine(entity, JOB_STATUS_TRANSITIONS, JobStatus.CREATED, now)


def is_legal_path(table: Mapping[S, frozenset[S]], path: list[S]) -> bool:
    return all(b in table[a] for a, b in zip(path, path[1:]))


def render_mermaid(table: Mapping[S, frozenset[S]]) -> str:
    """A Mermaid state diagram of a transition table, for the documentation site (docs/, funke.deploy.sitedocs)."""
    states = list(table)
    lines = ["stateDiagram-v2", f"    [*] --> {states[0].value}"]
    for src in states:
        for dst in sorted(table[src], key=states.index):
            lines.append(f"    {src.value} --> {dst.value}")
    for s in states:
        if not table[s]:
            lines.append(f"    {s.value} --> [*]")
    return "\n".join(lines)
