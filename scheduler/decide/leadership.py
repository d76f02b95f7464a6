"""Who leads, when several schedulers share one PostgreSQL store: the lease's decisions, pure.

The store holds one lease row: its holder (an id per head node's state_dir, kept there), an epoch (bumped by
each takeover), its expiry by the database server's clock, and the holder's host and API socket (for messages).
The leader renews it every `renew_s`; a standby reads it every `check_s` and takes it (epoch + 1) once the
server's clock is past its expiry, or at once where the lease is its own: a scheduler restarted on the same
state_dir (whose lock proves that the one before it is gone), or one that stopped acting when its renewals went
unanswered and reads that nobody took the lease meanwhile. Its new term starts as after a restart. Every write
transaction of the leader checks its epoch under the store's write lock (`scheduler.store.postgres`), so a
takeover and a late write of the old leader are ordered.

The leader also fences itself by time: a renewal sent at T (its own monotonic clock) makes the lease run until
at least T + lease_s by the server's clock, since the server runs it after T; so until T + lease_s - margin_s
no standby can have taken it, whatever happened to the network since. Past that the leader stops acting (no
tick, no node command, no notification) until it knows better; the epoch check catches any write that is late.

Sans-I/O: `decide(row, me, mine, since_sent, timing)` is the whole policy, tested from a table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ftconsole.scheduler.spec.statespec import LEASE_S

# at the defaults a standby takes over at most lease_s + check_s after the leader's last renewal (12 s)


@dataclass(frozen=True)
class Timing:
    lease_s: float = LEASE_S  # how long a renewal holds the lease, by the server's clock
    renew_s: float = LEASE_S / 4  # how often the leader renews
    check_s: float = 2.0  # how often a standby reads the lease
    margin_s: float = 1.0  # the leader stops acting this long before its lease may run out (clock rates, slack)

    @classmethod
    def of(cls, lease_s: float) -> Timing:
        """The timing of a lease of `lease_s` seconds: renewed 4 times per lease, checked every 2 s (or a fifth
        of a short lease), the margin a tenth of it, at least 0.2 s."""
        return cls(lease_s, lease_s / 4, min(2.0, lease_s / 5), max(0.2, lease_s / 10))

    @property
    def fence_after(self) -> float:
        """Seconds after sending its last successful renewal that the leader stops acting."""
        return self.lease_s - self.margin_s


@dataclass(frozen=True)
class LeaseRow:
    """The lease as read, with the server's clock at the read (both in seconds since the epoch)."""

    holder: str  # "" when nobody ever held it, or the last holder let it go
    epoch: int
    expires: float
    host: str
    socket: str
    now: float  # the server's clock when it was read

    @property
    def expired(self) -> bool:
        return not self.holder or self.expires <= self.now


class Step(enum.Enum):
    RENEW = "renew"  # I lead, within my time: renew the lease
    HOLD = "hold"  # I lead, within my time, and cannot read the lease now: go on, try again
    FENCE = "fence"  # I led, and may no longer: stop acting at once, stand by
    STAND_BY = "stand by"  # another leads (or the lease cannot be read): serve reads, refuse writes
    TAKE_OVER = "take over"  # the lease ran out, was let go, or is mine from before: take it with the next epoch


def fenced(since_sent: float | None, timing: Timing) -> bool:
    """Whether a leader whose last successful renewal was sent `since_sent` seconds ago (by its monotonic clock;
    None: none yet) must stop acting."""
    return since_sent is None or since_sent >= timing.fence_after


def decide(row: LeaseRow | None, me: str, mine: int | None, since_sent: float | None, timing: Timing) -> Step:
    """The next step of the scheduler `me`, which leads with epoch `mine` (None: it stands by); `row`: the lease
    as just read (None: the database did not answer)."""
    if mine is not None:
        if fenced(since_sent, timing):
            return Step.FENCE
        if row is None:
            return Step.HOLD
        if row.holder != me or row.epoch != mine:
            return Step.FENCE  # another took it: its epoch is newer than mine
        return Step.RENEW
    if row is not None and (row.expired or row.holder == me):
        return Step.TAKE_OVER
    return Step.STAND_BY
