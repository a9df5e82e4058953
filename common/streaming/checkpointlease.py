"""Who may write a streaming query's checkpoint: the lease one run of the query holds on it, the
lease's epoch (the checkpoint's fencing token), and when another run may take it over.

Two runs of one query must never write one checkpoint (SPARK-26425), yet a run whose process is
paused (SIGSTOP, a hung host, a frozen VM) must not keep the checkpoint from the run that replaced
it: a lock would be held for as long as the pause lasts. So a run holds a lease instead:

- **Taking it** (`claim`): a run takes an absent, released or expired lease, or one whose holder
  is known to be gone (a process of this host that died), and, under high availability, one
  held by an older leader of the same cluster: the leader of a higher epoch takes the
  checkpoint over at once, without waiting for the deposed leader's lease to run out. Anything
  else is refused (`Refused`, naming the run that holds it). Each take gives the next epoch.
- **Which epoch wins**: the lease with the highest epoch is the checkpoint's lease; an older
  epoch's lease, even renewed by its holder after it woke up, is no lease at all.
- **Writing** (`may_write`): a run writes (an offset or commit entry, a seen-files log, a purge,
  a sink's commit) only while the checkpoint's lease is its own with the epoch it took; a write
  of an older epoch is refused.
- **Keeping it** (`renew`): the holder renews its lease; a lease not renewed for `duration_s`
  (its process paused or hung) has expired and may be taken. A holder that finds its lease taken
  over has lost the checkpoint for good: it never takes it back by renewing.

Sans-IO: the store (`funke.jobmanager.checkpointstore`) reads the leases, says whether the
holder's process is known to be gone, passes the time in, and writes the lease returned; this
module owns the rules and the lease's format.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

# How long a lease lasts unless renewed (renewed three times as often). It bounds how long a run
# without high availability waits for a hung holder on another host; a holder that died on this
# host, a released lease and a newer leader's take-over do not wait for it.
DEFAULT_LEASE_S = 10.0
MAX_LEASE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class CheckpointLease:
    epoch: int  # the checkpoint's fencing token: one more with every run that takes it
    holder: str  # the run: its process (host:pid:start) and a token of the run's own
    description: str  # who that is, for the refusal another run gets ("job X on JobManager Y (pid Z)")
    scope: str  # the high-availability cluster whose leader runs the query ("": none)
    leader_epoch: int  # that leader's epoch (0 without high availability)
    renewed_at: float  # wall-clock seconds
    duration_s: float
    released: bool = False  # the run let go of the checkpoint (it ended): nobody waits for expiry

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.duration_s

    def valid(self, now: float) -> bool:
        return not self.released and now < self.expires_at


@dataclass(frozen=True, slots=True)
class Claim:
    """A run that wants the checkpoint."""
    holder: str
    description: str
    scope: str = ""
    leader_epoch: int = 0
    duration_s: float = DEFAULT_LEASE_S


@dataclass(frozen=True, slots=True)
class Taken:
    """The claim wins: write `lease` (a new epoch, created once: of two runs racing, one gets it)."""
    lease: CheckpointLease
    over: str  # whose lease it replaced and why it could ("" for a new or released checkpoint)


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


def claim(current: CheckpointLease | None, c: Claim, now: float, holder_gone: bool = False,
          last_epoch: int = 0) -> Taken | Refused:
    """Whether run `c` may take the checkpoint whose lease is `current` (None: no lease, or one
    that cannot be read), at `now`. `holder_gone`: the holder's process is known to be dead;
    `last_epoch`: the highest epoch seen on the checkpoint (an unreadable lease spent its epoch)."""
    if c.duration_s <= 0:
        raise ValueError(f"the lease duration must be positive, got {c.duration_s}")
    over = ""
    if current is not None and not current.released:
        if c.scope and c.scope == current.scope and c.leader_epoch > current.leader_epoch:
            over = (f"taken over from {current.description} (leader epoch {current.leader_epoch}, deposed by "
                    f"leader epoch {c.leader_epoch})")
        elif holder_gone:
            over = f"taken over from {current.description}, whose process is gone"
        elif not current.valid(now):
            over = (f"taken over from {current.description}, whose lease expired "
                    f"{now - current.expires_at:.1f} s ago (not renewed)")
        else:
            return Refused(_in_use(current, c, now))
    epoch = max(current.epoch if current is not None else 0, last_epoch) + 1
    return Taken(CheckpointLease(epoch, c.holder, c.description, c.scope, c.leader_epoch, now, c.duration_s), over)


def _in_use(current: CheckpointLease, c: Claim, now: float) -> str:
    why = f"its lease (epoch {current.epoch}) runs {current.expires_at - now:.1f} s more unless renewed"
    if current.scope and current.scope == c.scope and c.leader_epoch < current.leader_epoch:
        why = (f"it runs under leader epoch {current.leader_epoch}, and this run's leader (epoch "
               f"{c.leader_epoch}) was deposed")
    return f"in use by {current.description} ({why})"


def may_write(current: CheckpointLease | None, holder: str, epoch: int) -> str | None:
    """None if the run `holder`, which took the checkpoint with `epoch`, may write to it now (the
    checkpoint's lease, `current`, is its own); otherwise why not."""
    if current is None:
        return f"its lease of epoch {epoch} is gone and no lease can be read"
    if current.epoch != epoch or current.holder != holder:
        return (f"it was taken over by {current.description} (lease epoch {current.epoch}); this run's "
                f"lease of epoch {epoch} is over")
    if current.released:
        return f"this run released its lease of epoch {epoch}"
    return None


def renew(current: CheckpointLease | None, holder: str, epoch: int, now: float) -> CheckpointLease | str:
    """The holder's lease renewed at `now`, or why it cannot be (it was taken over: the run has
    lost the checkpoint). A lease that expired without anybody taking it is renewed: nobody
    else wrote meanwhile."""
    reason = may_write(current, holder, epoch)
    if reason is not None:
        return reason
    assert current is not None
    return replace(current, renewed_at=now)


def release(current: CheckpointLease | None, holder: str, epoch: int, now: float) -> CheckpointLease | None:
    """The holder lets go (its run ended): the lease marked released, so the next run takes it at
    once. None: nothing to write (it is not the holder's any more)."""
    if may_write(current, holder, epoch) is not None:
        return None
    assert current is not None
    return replace(current, released=True, renewed_at=now)


def newest(epochs: list[int]) -> int | None:
    """Which epoch's lease is the checkpoint's: the highest (None: there is no lease)."""
    return max(epochs) if epochs else None


def lease_bytes(lease: CheckpointLease) -> bytes:
    return json.dumps(asdict(lease), sort_keys=True).encode()


def parse_lease(data: bytes | None) -> CheckpointLease | None:
    """The lease, or None if there is none or it cannot be read (a stranger's file is no lease:
    the next run takes the checkpoint with an epoch above it)."""
    if not data or len(data) > MAX_LEASE_BYTES:
        return None
    try:
        raw = json.loads(data)
        lease = CheckpointLease(int(raw["epoch"]), str(raw["holder"]), str(raw["description"]), str(raw["scope"]),
                                int(raw["leader_epoch"]), float(raw["renewed_at"]), float(raw["duration_s"]),
                                bool(raw.get("released", False)))
    except (ValueError, KeyError, TypeError):
        return None
    return lease if lease.epoch > 0 else None
