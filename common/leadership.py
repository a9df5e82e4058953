"""Leader election on a lease: who leads the cluster, under which epoch, and when a standby may
take over.

Owns the rules every high-availability backend applies to the one lease record it keeps (a file,
a ZooKeeper node): a contender takes an absent, released or expired lease (or one whose holder is
known to be dead) with the next epoch; the holder renews it; a leader that finds the lease held
by someone else, or that could not renew it before it expired, has lost leadership. The epoch is
the fencing token: it grows by one with every new leader, and whatever a leader writes or sends
carries it, so what a deposed leader still does can be told apart and refused.

Sans-IO: the backend reads the current lease (under its own lock, so that reading, deciding and
writing are one atomic step), says whether the holder's process is known to be gone, passes the
time in, and writes the lease `step` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_LEASE_S = 3.0


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str  # the contender: unique per process life (host, pid, start time)
    epoch: int  # the fencing token
    address: str  # where the leader serves clients and TaskManagers (leader retrieval)
    renewed_at: float  # wall-clock seconds
    duration_s: float
    released: bool = False  # the leader stepped down (graceful stop): no need to wait for expiry
    since: float = 0.0  # when this epoch began

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.duration_s

    def valid(self, now: float) -> bool:
        return not self.released and now < self.expires_at


@dataclass(frozen=True, slots=True)
class Granted:
    """This contender leads from now on, with this epoch."""
    epoch: int


@dataclass(frozen=True, slots=True)
class Revoked:
    """This contender led and does not any more."""
    epoch: int
    reason: str


Change = Granted | Revoked


class Contender:
    """One JobManager's view of the election: whether it leads, and under which epoch."""

    def __init__(self, holder: str, address: str, duration_s: float = DEFAULT_LEASE_S):
        if duration_s <= 0:
            raise ValueError(f"the lease duration must be positive, got {duration_s}")
        self.holder = holder
        self.address = address
        self.duration_s = duration_s
        self.epoch: int | None = None  # the epoch this contender leads with; None: standby
        self._valid_until = 0.0  # our own lease's end, as far as we know

    def leads(self, now: float) -> bool:
        """Whether this contender may act as leader at `now`: it won, and its last renewal has not
        expired (a leader that cannot reach the store must stop acting before a standby may
        start)."""
        return self.epoch is not None and now < self._valid_until

    @property
    def valid_until(self) -> float:
        """When this contender's leadership ends unless renewed (0: it does not lead)."""
        return self._valid_until if self.epoch is not None else 0.0

    def expire(self, now: float) -> list[Change]:
        """Between rounds: a leader whose last renewal has run out stops leading now, even if it
        cannot reach the store to find out who leads instead."""
        if self.epoch is not None and now >= self._valid_until:
            return [self._lose("the lease ran out before it could be renewed")]
        return []

    def step(self, current: Lease | None, now: float, holder_gone: bool = False, last_epoch: int = 0
             ) -> tuple[Lease | None, list[Change]]:
        """One round: `current` is the lease as read; `last_epoch`: the highest epoch the store
        has seen granted (a lease that cannot be read still spent its epoch). Returns the lease to
        write (None: write nothing) and what changed for this contender."""
        changes: list[Change] = []
        if self.epoch is not None:
            if current is None or current.holder != self.holder or current.epoch != self.epoch:
                who = "nobody" if current is None else f"epoch {current.epoch}"
                changes.append(self._lose(f"the lease is held by {who} now"))
            elif now >= self._valid_until:
                changes.append(self._lose(f"the lease expired {now - self._valid_until:.1f} s before it was renewed"))
            else:
                renewed = replace(current, renewed_at=now, duration_s=self.duration_s, address=self.address)
                self._valid_until = renewed.expires_at
                return renewed, changes
        free = current is None or not current.valid(now) or holder_gone
        if not free:
            return None, changes
        lease, granted = self.grant(max(current.epoch if current is not None else 0, last_epoch), now)
        return lease, changes + granted

    def grant(self, last_epoch: int, now: float) -> tuple[Lease, list[Change]]:
        """Lead from `now` with the epoch after `last_epoch`. For a backend whose store decides
        the winner itself (ZooKeeper's latch: the oldest contender leads), once it has."""
        lease = Lease(self.holder, last_epoch + 1, self.address, now, self.duration_s, since=now)
        self.epoch = lease.epoch
        self._valid_until = lease.expires_at
        return lease, [Granted(lease.epoch)]

    def outraced(self) -> None:
        """The grant of the last round did not happen: another contender wrote that epoch's
        lease first (the store creates each epoch's lease once). Stand by, as if never granted."""
        self.epoch = None
        self._valid_until = 0.0

    def renew(self, now: float) -> list[Change]:
        """The store confirmed at `now` that this contender still leads (its ZooKeeper session
        and leader node are alive): act for another lease from then. A renewal that comes too
        late ends the leadership instead."""
        if self.epoch is None:
            return []
        if now >= self._valid_until:
            return [self._lose(f"the lease expired {now - self._valid_until:.1f} s before it was renewed")]
        self._valid_until = now + self.duration_s
        return []

    def lose(self, reason: str) -> list[Change]:
        """The store says this contender does not lead (any more)."""
        return [self._lose(reason)] if self.epoch is not None else []

    def release(self, current: Lease | None, now: float) -> tuple[Lease | None, list[Change]]:
        """Step down (graceful stop): the lease is marked released, so a standby takes over at
        its next check instead of waiting for expiry. Writes nothing if we do not hold it."""
        if self.epoch is None:
            return None, []
        epoch = self.epoch
        changes: list[Change] = [self._lose("the JobManager stepped down")]
        if current is None or current.holder != self.holder or current.epoch != epoch:
            return None, changes
        return replace(current, released=True, renewed_at=now), changes

    def next_check(self, now: float, current: Lease | None) -> float:
        """When to run the next round: a leader renews three times per lease; a standby looks
        again at the current lease's expiry, and at least as often as a leader renews."""
        period = self.duration_s / 3
        if self.epoch is not None:
            return now + period
        if current is not None and current.valid(now):
            return min(current.expires_at, now + period)
        return now + period

    def _lose(self, reason: str) -> Revoked:
        epoch, self.epoch = self.epoch, None
        self._valid_until = 0.0
        assert epoch is not None
        return Revoked(epoch, reason)
