"""A live rescale of a streaming query, as one sans-IO state machine: from the request to the next
run of the same job at the new parallelism (Flink rescales by stopping with a savepoint and
submitting again; here the job goes on under its id, from its checkpoint).

Owns, for one rescale: its state under `RESCALE_STATE_TRANSITIONS` (`funke.common.states`) and its
story (every transition with its time, cause and stimulus: what `funke status` shows), what it
changes (the job graph at the new parallelism, the parallelism per vertex, the cause the job is
suspended with) and the stop's timeout. Its shells carry out its actions and decide nothing: the
Dispatcher (checks the request, starts the next run, archives a job that does not go on), the
JobMaster (stops the query keeping its tasks, suspends the job) and, through the JobMaster, the
StreamingQuery (stops as it is told).

Sans-IO: `handle(event)` takes what happened, with its time (`now`, seconds since the epoch, as
every story) and a `stimulus_id` naming what caused it, and returns actions. `ROWS` is the whole
behaviour as data: (event, state) -> the states entered; an event the current state has no row
for raises `IllegalTransition` and changes nothing. No clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from funke.common.states import (
    RESCALE_STATE_TRANSITIONS,
    IllegalTransition,
    JobStatus,
    RescaleState,
    StateMachine,
    Transition,
)

R = RescaleState


# ------------------------------------------------------------------------------------ events in


@dataclass(frozen=True, slots=True)
class Accepted:
    """The Dispatcher checked the cluster can run the job at the new parallelism (its slots)."""
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The Dispatcher found it cannot (too few slots, the job changed meanwhile): nothing changes."""
    reason: str
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class QueryStopped:
    """The query's stop ended: every batch it ran is committed, its tasks still run."""
    reason: str
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class StopTimedOut:
    """The stop's timeout passed before the batches in flight committed."""
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class JobSuspended:
    """The job (this run of it) is SUSPENDED: by the rescale, or by the JobManager stopping."""
    cause: str
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class JobEnded:
    """The job (this run of it) ended FINISHED, CANCELED or FAILED."""
    status: JobStatus
    cause: str
    now: float
    stimulus_id: str

    def __post_init__(self) -> None:
        if not self.status.is_globally_terminal:
            raise ValueError(f"JobEnded takes a globally terminal status, not {self.status.value} "
                             "(a suspended job is JobSuspended)")


@dataclass(frozen=True, slots=True)
class NextRunRunning:
    """Every task of the next run is RUNNING and its query runs again."""
    now: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The next run could not be started (its graph could not be built, the store refused it)."""
    reason: str
    now: float
    stimulus_id: str


Event = Accepted | Refused | QueryStopped | StopTimedOut | JobSuspended | JobEnded | NextRunRunning | StartFailed


# ------------------------------------------------------------------------------------ actions out


@dataclass(frozen=True, slots=True)
class StopQuery:
    """The JobMaster: stop the query at a batch boundary, keeping its tasks (they are cancelled
    with the suspended job); answer QueryStopped, or StopTimedOut after `timeout_s`."""
    timeout_s: float
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class SuspendJob:
    """The JobMaster: suspend the job with this cause; answer JobSuspended."""
    cause: str
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class StartNextRun:
    """The Dispatcher: start the next run of the job, `job_graph` (same id, new parallelism), from
    its checkpoint; answer NextRunRunning (from the next JobMaster) or StartFailed."""
    job_graph: Any  # a JobGraph: carried, never read here
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class ArchiveJob:
    """The Dispatcher: the job does not go on at the new parallelism; keep it as it ended."""
    stimulus_id: str


Action = StopQuery | SuspendJob | StartNextRun | ArchiveJob


# (event, the state it finds) -> the states it enters, in order. JobSuspended while STOPPING (the
# JobManager suspended the job first) goes through SUSPENDED to STARTING: the next run starts all
# the same. While REQUESTED nothing has stopped yet: a job that ends then, suspended or not, ends.
ROWS: Mapping[tuple[type, RescaleState], tuple[RescaleState, ...]] = {
    (Accepted, R.REQUESTED): (R.STOPPING,),
    (Refused, R.REQUESTED): (R.FAILED,),
    (JobSuspended, R.REQUESTED): (R.FAILED,),
    (JobEnded, R.REQUESTED): (R.FAILED,),
    (QueryStopped, R.STOPPING): (R.SUSPENDED,),
    (StopTimedOut, R.STOPPING): (R.SUSPENDED,),
    (JobSuspended, R.STOPPING): (R.SUSPENDED, R.STARTING),
    (JobEnded, R.STOPPING): (R.FAILED,),
    (JobSuspended, R.SUSPENDED): (R.STARTING,),
    (NextRunRunning, R.STARTING): (R.RUNNING,),
    (StartFailed, R.STARTING): (R.FAILED,),
    (JobSuspended, R.STARTING): (R.FAILED,),
    (JobEnded, R.STARTING): (R.FAILED,),
}

# Suffix of the suspension's cause when the stop timed out (the next run runs that batch again).
TIMED_OUT = " (its batch in flight did not commit in time; the new run runs it again)"


class Rescale:
    """One live rescale of job `job_id`: `cause` is what the job is suspended with ("rescaled:
    v 2 -> 4"), `parallelism` the vertices' parallelism after it, `job_graph` the graph the
    next run runs; `last_batch_id` the last batch the query committed when it was asked."""

    def __init__(self, job_id: str, cause: str, parallelism: Mapping[str, int], job_graph: Any,
                 timeout_s: float, now: float, last_batch_id: int = -1):
        self.job_id = job_id
        self.cause = cause
        self.parallelism = dict(parallelism)
        self.job_graph = job_graph
        self.timeout_s = timeout_s
        self.last_batch_id = last_batch_id
        self.machine: StateMachine[RescaleState] = StateMachine(
            f"rescale of job {job_id} ({cause})", RESCALE_STATE_TRANSITIONS, R.REQUESTED, now)
        self.failure = ""  # why it FAILED

    @property
    def state(self) -> RescaleState:
        return self.machine.state

    @property
    def active(self) -> bool:
        """Not over: neither RUNNING at the new parallelism nor FAILED."""
        return bool(RESCALE_STATE_TRANSITIONS[self.machine.state])

    @property
    def requested_at(self) -> float:
        return self.machine.created_at

    @property
    def history(self) -> list[Transition[RescaleState]]:
        return self.machine.history

    def handle(self, event: Event) -> list[Action]:
        if not event.stimulus_id:
            raise ValueError(f"{type(event).__name__} names no stimulus_id")
        path = ROWS.get((type(event), self.machine.state))
        if path is None:
            # no row: refused, nothing changes (the first state it would enter, for the message)
            wanted = next((p[0] for (kind, _), p in ROWS.items() if kind is type(event)), self.machine.state)
            raise IllegalTransition(self.machine.entity, self.machine.state, wanted,
                                    f"{type(event).__name__} [{event.stimulus_id}]", tuple(self.machine.history))
        sid = event.stimulus_id
        for state in path:
            self.machine.transition(state, event.now, self._cause(event, state), sid)
        match event, self.machine.state:
            case Accepted(), R.STOPPING:
                return [StopQuery(self.timeout_s, sid)]
            case QueryStopped(), R.SUSPENDED:
                return [SuspendJob(self.cause, sid)]
            case StopTimedOut(), R.SUSPENDED:
                return [SuspendJob(self.cause + TIMED_OUT, sid)]
            case _, R.STARTING:
                return [StartNextRun(self.job_graph, sid)]
            case Refused(), R.FAILED:
                return []  # the job goes on as it was
            case _, R.FAILED:
                return [ArchiveJob(sid)]
        return []

    def _cause(self, event: Event, state: RescaleState) -> str:
        match event, state:
            case Accepted(), _:
                return "the query stops at a batch boundary: the batches in flight commit, its tasks are kept"
            case QueryStopped(reason=reason), _:
                return f"the query {reason}: every batch it ran is committed"
            case StopTimedOut(), _:
                return (f"the batches in flight did not commit within {self.timeout_s:g} s: suspended all the "
                        "same; the next run runs them again")
            case JobSuspended(cause=cause), R.SUSPENDED:
                return f"the job was suspended: {cause}"
            case _, R.STARTING:
                return "the next run of the job starts at the new parallelism, from its checkpoint"
            case NextRunRunning(), _:
                return "every task of the next run is RUNNING; the query goes on from its checkpoint"
        self.failure = self._failure(event)
        return self.failure

    def _failure(self, event: Event) -> str:
        when = {R.REQUESTED: "while it was checked", R.STOPPING: "while its query was stopping",
                R.STARTING: "before its next run ran"}.get(self.machine.state, "")
        match event:
            case Refused(reason=reason):
                return f"refused: {reason}"
            case StartFailed(reason=reason):
                return f"the next run could not start ({reason}); the job stays SUSPENDED"
            case JobSuspended(cause=cause):
                return f"the job was SUSPENDED {when}: {cause}"
            case JobEnded(status=status, cause=cause):
                return f"the job ended {status.value} {when}: {cause}"
        return type(event).__name__
