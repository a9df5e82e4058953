"""The TaskManager's connection to the JobManager: registering, heartbeats, losing it, registering
again. Every decision about it is made here; the shell (`taskmanager/taskexecutor.py`) only looks
leases up, makes the calls and keeps the heartbeat stream open.

Sans-IO, like the task core (`taskexecutorstate.py`): `handle(event, now)` takes one event and
returns instructions; `now` is the shell's monotonic clock. The states and their legal changes are
`CONNECTION_STATE_TRANSITIONS` in `states.py` (Flink: RetryingRegistration, the TaskExecutor's
connection to its ResourceManager, the HeartbeatManager's timeout).

Events (what happened):  Start, LeaderFound / NoLeader (with high availability, for an attempt),
                         RegistrationAccepted / RegistrationFailed (the answer to an attempt),
                         LeaseRead (the lease as polled while an attempt waits or heartbeats flow),
                         HeartbeatAnswered, HeartbeatDue, HeartbeatEnded, CallArrived (a JobManager
                         call naming a registration), TimerFired, Stop
Instructions (do this):  LookUpLeader, SendRegistration, AbandonAttempt, StartTimer, Registered
                         (start serving and heartbeating), SendHeartbeat, Lost (forget the tasks),
                         AwaitRegistration (hold a call that overtook our registration's answer), Log

Waits between attempts follow one pure policy (`Backoff`): quick at first (the JobManager is
usually just starting), capped so a restarted JobManager is found again within a couple of
seconds, sooner with high availability (a new leader is elected within a second). A registration
that is lost right after it was made (a JobManager that takes the registration but not the
heartbeat, a standby) is asked again with the same backing off, not in a tight loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from funke.common.backoff import Backoff
from funke.common.states import CONNECTION_STATE_TRANSITIONS, ConnectionState, StateMachine

C = ConnectionState

# Answers to a registration that mean "no", not "not now" (gRPC status code names).
REFUSAL_CODES = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED"})
# Answers to a report that mean "the JobManager will never accept this batch": retrying would stall
# every later report behind it. Everything else (UNAVAILABLE, DEADLINE_EXCEEDED, ...) is a
# JobManager that is restarting or busy, and is retried.
PERMANENT_REPORT_CODES = frozenset({
    "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "UNIMPLEMENTED", "PERMISSION_DENIED",
    "UNAUTHENTICATED", "OUT_OF_RANGE", "ALREADY_EXISTS",
})
# A registration lost within this long after it was made counts as a quick loss: the next
# attempt waits (backing off) instead of following at once.
QUICK_LOSS_S = 1.0
# How long a JobManager call naming a registration not known yet waits for the registration in
# progress (the JobManager deploys the moment it registers us: its calls can overtake its answer).
REGISTRATION_OVERTAKEN_S = 2.0


BACKOFF = Backoff(0.2, 2.0)
HA_BACKOFF = Backoff(0.2, 0.5)


@dataclass(frozen=True, slots=True)
class Registration:
    registration_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    data_dir: str
    leader_epoch: int = 0  # with high availability: the epoch of the leader registered with


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Start:
    pass


@dataclass(frozen=True, slots=True)
class LeaderFound:
    epoch: int
    address: str


@dataclass(frozen=True, slots=True)
class NoLeader:
    pass


@dataclass(frozen=True, slots=True)
class RegistrationAccepted:
    registration: Registration
    address: str  # the JobManager's


@dataclass(frozen=True, slots=True)
class RegistrationFailed:
    code: str  # the gRPC status code's name
    detail: str
    address: str


@dataclass(frozen=True, slots=True)
class LeaseRead:
    epoch: int | None  # None: no live leader named
    address: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatAnswered:
    reregister: bool = False  # the JobManager does not know this registration


@dataclass(frozen=True, slots=True)
class HeartbeatDue:
    pass


@dataclass(frozen=True, slots=True)
class HeartbeatEnded:
    reason: str


@dataclass(frozen=True, slots=True)
class CallArrived:
    registration_id: str


@dataclass(frozen=True, slots=True)
class Timer:
    kind: str  # "retry"
    version: int


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: Timer


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Event = (Start | LeaderFound | NoLeader | RegistrationAccepted | RegistrationFailed | LeaseRead | HeartbeatAnswered
         | HeartbeatDue | HeartbeatEnded | CallArrived | TimerFired | Stop)


# ---------------------------------------------------------------------------------- instructions


@dataclass(frozen=True, slots=True)
class LookUpLeader:
    """Read the lease; answer with LeaderFound or NoLeader."""


@dataclass(frozen=True, slots=True)
class SendRegistration:
    """Register with the JobManager at `address` ("" : the configured one); answer with
    RegistrationAccepted or RegistrationFailed. With `epoch`, poll the lease while it waits."""

    address: str
    epoch: int | None


@dataclass(frozen=True, slots=True)
class AbandonAttempt:
    """Cancel the registration call in flight: its answer will never count."""

    reason: str


@dataclass(frozen=True, slots=True)
class StartTimer:
    timer: Timer
    delay_s: float


@dataclass(frozen=True, slots=True)
class Registered:
    """Registered: serve, tell the task core, start heartbeating."""

    registration: Registration
    first: bool


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    registration: Registration


@dataclass(frozen=True, slots=True)
class Lost:
    """The registration is over: stop heartbeating and serving, forget every task."""

    reason: str


@dataclass(frozen=True, slots=True)
class AwaitRegistration:
    """Hold the call until registered, at most `timeout_s`, before the task core judges it."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class Log:
    level: int
    message: str


Instruction = (LookUpLeader | SendRegistration | AbandonAttempt | StartTimer | Registered | SendHeartbeat | Lost
               | AwaitRegistration | Log)


class Connection:
    """One TaskManager's connection to the JobManager. See the module docstring."""

    def __init__(self, task_manager_id: str, *, ha: bool, now: float = 0.0):
        self.task_manager_id = task_manager_id
        self.ha = ha
        self.backoff = HA_BACKOFF if ha else BACKOFF
        self.machine = StateMachine(f"TaskManager {task_manager_id}'s connection", CONNECTION_STATE_TRANSITIONS,
                                    C.REGISTERING, now)
        self.registration: Registration | None = None
        self.registered_at = 0.0
        self.last_answer = 0.0
        self.attempt_epoch: int | None = None  # the leader's epoch the attempt in flight was sent to
        self.attempt_address = ""
        self.attempt_in_flight = False
        self.retries = 0  # waits so far in this round of attempts
        self.failures = 0  # unanswered or refused attempts in this round (the first is logged louder)
        self.quick_losses = 0
        self.ever_registered = False
        self._timer_seq = 0
        self._timer: Timer | None = None
        self._now = 0.0
        self._out: list[Instruction] = []

    @property
    def state(self) -> ConnectionState:
        return self.machine.state

    def handle(self, event: Event, now: float) -> list[Instruction]:
        self._out = []
        self._now = now
        _HANDLERS[type(event)](self, event)
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ helpers

    @property
    def _attempting(self) -> bool:
        return self.state in (C.REGISTERING, C.REREGISTERING)

    def _go(self, to: ConnectionState, cause: str = "") -> None:
        self.machine.transition(to, self._now, cause)

    def _attempt(self) -> None:
        """The next attempt, now."""
        self._timer = None
        self.attempt_epoch = None
        if self.ha:
            self._out.append(LookUpLeader())
        else:
            self.attempt_in_flight = True
            self._out.append(SendRegistration("", None))

    def _retry_later(self) -> None:
        self._timer_seq += 1
        self._timer = Timer("retry", self._timer_seq)
        self._out.append(StartTimer(self._timer, self.backoff.delay(self.retries)))
        self.retries += 1

    def _new_round(self) -> None:
        self.retries = 0
        self.failures = 0

    # ------------------------------------------------------------------ handlers

    def _on_start(self, e: Start) -> None:
        if self.state is C.REGISTERING and not self.attempt_in_flight and self._timer is None:
            self._new_round()
            self._attempt()

    def _on_leader_found(self, e: LeaderFound) -> None:
        if not self._attempting or self.attempt_in_flight:
            return
        self.attempt_epoch, self.attempt_address = e.epoch, e.address
        self.attempt_in_flight = True
        self._out.append(SendRegistration(e.address, e.epoch))

    def _on_no_leader(self, e: NoLeader) -> None:
        if self._attempting and not self.attempt_in_flight:
            self._retry_later()

    def _on_accepted(self, e: RegistrationAccepted) -> None:
        if not self._attempting or not self.attempt_in_flight:
            return  # an answer to an attempt given up
        self.attempt_in_flight = False
        r = e.registration
        self._go(C.REGISTERED, f"registered as {r.registration_id} with {e.address}")
        self.registration = r
        self.registered_at = self.last_answer = self._now
        first, self.ever_registered = not self.ever_registered, True
        self._out.append(Registered(r, first))
        self._out.append(SendHeartbeat(r))

    def _on_failed(self, e: RegistrationFailed) -> None:
        if not self._attempting or not self.attempt_in_flight:
            return
        self.attempt_in_flight = False
        self.failures += 1
        if e.code in REFUSAL_CODES:
            # The JobManager answered and said no (it cannot reach our address, say): retrying
            # changes nothing until someone acts, so say it every time.
            self._out.append(Log(logging.ERROR, f"TaskManager {self.task_manager_id}: the JobManager at {e.address} "
                                                f"refused the registration: {e.detail}; retrying"))
            self._go(C.REFUSED, f"{e.code}: {e.detail}")
        else:
            # The first miss is normal (JobManager starting); keep the log quiet after that.
            self._out.append(Log(logging.INFO if self.failures == 1 else logging.DEBUG,
                                 f"JobManager at {e.address} does not answer yet ({e.code}: {e.detail}); retrying"))
            self._go(self.state, f"no answer: {e.code}")
        self._retry_later()

    def _on_lease(self, e: LeaseRead) -> None:
        if e.epoch is None:
            return
        if self._attempting and self.attempt_in_flight and self.attempt_epoch is not None \
                and e.epoch != self.attempt_epoch:
            # A leader that hangs (paused, cut off) answers nothing: its successor must not wait
            # for its RPC timeout.
            self.attempt_in_flight = False
            changed = f"a new leader was elected (epoch {e.epoch}, at {e.address})"
            self._out.append(AbandonAttempt(changed))
            self._out.append(Log(logging.INFO, f"TaskManager {self.task_manager_id}: {changed} while registering "
                                               f"with {self.attempt_address}; registering there instead"))
            self._go(self.state, changed)
            self._new_round()
            self._attempt()
        elif self.state is C.REGISTERED and self.registration is not None and e.epoch != self.registration.leader_epoch:
            self._lose(f"a new leader was elected (epoch {e.epoch}, at {e.address})")

    def _on_answered(self, e: HeartbeatAnswered) -> None:
        if self.state is not C.REGISTERED:
            return
        self.last_answer = self._now
        if e.reregister:
            self._lose("the JobManager does not know this registration")

    def _on_heartbeat_due(self, e: HeartbeatDue) -> None:
        if self.state is not C.REGISTERED or self.registration is None:
            return
        silent = self._now - self.last_answer
        if silent > self.registration.heartbeat_timeout_s:
            # A hung JobManager keeps the stream open; its silence is what we can see.
            self._lose(f"no heartbeat answer for {silent:.1f} s (timeout {self.registration.heartbeat_timeout_s:g} s)")
        else:
            self._out.append(SendHeartbeat(self.registration))

    def _on_heartbeat_ended(self, e: HeartbeatEnded) -> None:
        if self.state is C.REGISTERED:
            self._lose(e.reason)

    def _lose(self, reason: str) -> None:
        self._go(C.LOST, reason)
        self.quick_losses = self.quick_losses + 1 if self._now - self.registered_at < QUICK_LOSS_S else 0
        self.registration = None
        self._out.append(Lost(reason))
        self._new_round()
        if self.quick_losses:
            self._timer_seq += 1
            self._timer = Timer("retry", self._timer_seq)
            self._out.append(StartTimer(self._timer, BACKOFF.delay(self.quick_losses - 1)))
        else:
            self._go(C.REREGISTERING, "registering again")
            self._attempt()

    def _on_call(self, e: CallArrived) -> None:
        if not e.registration_id or self.state is C.REGISTERED:
            return
        self._out.append(AwaitRegistration(REGISTRATION_OVERTAKEN_S))

    def _on_timer(self, e: TimerFired) -> None:
        if e.timer != self._timer:
            return  # stale: superseded or cancelled by a change of state
        self._timer = None
        if self.state is C.REFUSED:
            self._go(C.REREGISTERING if self.ever_registered else C.REGISTERING, "asking again")
        elif self.state is C.LOST:
            self._go(C.REREGISTERING, "registering again")
        elif not self._attempting or self.attempt_in_flight:
            return
        self._attempt()

    def _on_stop(self, e: Stop) -> None:
        if self.state is C.STOPPED:
            return
        if self.attempt_in_flight:
            self.attempt_in_flight = False
            self._out.append(AbandonAttempt("the TaskManager is shutting down"))
        self._timer = None
        self.registration = None
        self._go(C.STOPPED, "shutting down")


_HANDLERS = {
    Start: Connection._on_start,
    LeaderFound: Connection._on_leader_found,
    NoLeader: Connection._on_no_leader,
    RegistrationAccepted: Connection._on_accepted,
    RegistrationFailed: Connection._on_failed,
    LeaseRead: Connection._on_lease,
    HeartbeatAnswered: Connection._on_answered,
    HeartbeatDue: Connection._on_heartbeat_due,
    HeartbeatEnded: Connection._on_heartbeat_ended,
    CallArrived: Connection._on_call,
    TimerFired: Connection._on_timer,
    Stop: Connection._on_stop,
}
