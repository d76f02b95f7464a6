"""The usage ledger: what ended runs used, kept as fair share and the quotas read it, so that neither reads the
history again (pure; the store keeps it, store/ledger.py).

Fair share weighs decayed GPU-seconds (fairshare.py) and the quotas the GPU-hours of their period (quotas.py).
Both used to sum every run of their window again each minute: at a busy cluster's rate, 70 days of runs for a
7-day half-life. Like Slurm, which adds what ran since its last pass to the usage it keeps, decayed, the ledger
folds in each run once, when it has ended:

- `decayed`: per (user, project), the decayed GPU-seconds of the folded runs, valued at `at`; valued at a later
  time they are only multiplied by 2^(-elapsed / half_life), so a fold costs the runs that ended since;
- `slots`: per quota key (`("user", name)` or `("project", name)`), the folded runs' GPU-seconds in slots of
  `slot` seconds (a 720th of the quota period, a minute at least). A window's sum takes its whole slots and the
  part of the slot at its far end in proportion: off by at most what that slot's runs used beyond the window's
  start, a 720th of the period at most.

Runs still going, and those ended since the last fold, are not in it: their part is added fresh each time
(`usage`, `hours`). Only the placement pass folds (a write); a standby reads the ledger as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from ftconsole.scheduler.decide import fairshare
from ftconsole.scheduler.decide.usage import overlap

SLOTS_PER_PERIOD = 720  # a 30-day period: hours
MIN_SLOT_S = 60.0

Key = tuple[str, str]  # ("user", name) | ("project", name): a quota's key


def slot_length(period: float) -> float:
    """The slot of a quota period: a 720th of it in whole minutes, a minute at least."""
    return max(MIN_SLOT_S, math.floor(period / SLOTS_PER_PERIOD / MIN_SLOT_S) * MIN_SLOT_S)


@dataclass
class Ledger:
    at: float  # when `decayed` is valued
    half_life: float | None  # None: fair share is off, nothing decayed is kept
    slot: float  # the slots' length, seconds
    since: float  # slots that end before this are dropped (the quota period's start at the last fold)
    folds: int = 0  # how many folds wrote it (the store's count: another head's fold shows as a different one)
    decayed: dict[tuple[str, str], float] = field(default_factory=dict)  # (owner, project) -> GPU-seconds at `at`
    slots: dict[Key, dict[float, float]] = field(default_factory=dict)  # key -> slot start -> GPU-seconds

    def copy(self) -> Ledger:
        return dataclasses.replace(self, decayed=dict(self.decayed), slots={k: dict(v) for k, v in self.slots.items()})

    def decay(self, now: float) -> dict[tuple[str, str], float]:
        """`decayed` valued at `now` (later than `at`)."""
        if self.half_life is None or now <= self.at:
            return dict(self.decayed)
        factor = 2.0 ** (-(now - self.at) / self.half_life)
        return {k: v * factor for k, v in self.decayed.items()}

    def fold(self, rows: Iterable[Any], now: float, since: float) -> set[tuple[Key, float]]:
        """Fold in these ended runs (the store's light rows: owner, project, gpus, started, ended), value the
        decayed usage at `now`, drop the slots that end before `since`; the (key, slot) pairs that changed."""
        self.decayed = self.decay(now)
        self.at = now
        touched: set[tuple[Key, float]] = set()
        for r in rows:
            if r.ended is None or r.gpus <= 0 or r.ended <= r.started:
                continue
            if self.half_life is not None:
                used = r.gpus * fairshare.decayed_seconds(r.started, min(r.ended, now), now, self.half_life)
                if used > 0:
                    self.decayed[(r.owner, r.project)] = self.decayed.get((r.owner, r.project), 0.0) + used
            first = max(r.started, since)
            start = math.floor(first / self.slot) * self.slot
            while start < r.ended:
                seconds = r.gpus * overlap(r.started, r.ended, start, start + self.slot)
                if seconds > 0:
                    for key in (("user", r.owner), ("project", r.project)):
                        kept = self.slots.setdefault(key, {})
                        kept[start] = kept.get(start, 0.0) + seconds
                        touched.add((key, start))
                start += self.slot
        self.trim(since)
        return touched

    def trim(self, since: float) -> None:
        """Drop the slots that end before `since`, and keys left with none."""
        self.since = max(self.since, since)
        for key in list(self.slots):
            kept = {s: v for s, v in self.slots[key].items() if s + self.slot > self.since}
            if kept:
                self.slots[key] = kept
            else:
                del self.slots[key]

    def usage(self, others: Iterable[Any], now: float, *, declared: Collection[str]) -> dict[tuple[str, str], float]:
        """Fair share's decayed usage at `now` per account (fairshare.account; `declared`: the config's projects):
        the folded runs' and that of `others` (light rows of the runs not folded in: running, or ended since)."""
        out: dict[tuple[str, str], float] = {}
        if self.half_life is None:
            return out
        for (owner, project), used in self.decay(now).items():
            key = fairshare.account(project, owner, declared)
            out[key] = out.get(key, 0.0) + used
        for r in others:
            end = now if r.ended is None else min(r.ended, now)
            used = r.gpus * fairshare.decayed_seconds(r.started, end, now, self.half_life)
            if used > 0:
                key = fairshare.account(r.project, r.owner, declared)
                out[key] = out.get(key, 0.0) + used
        return out

    def hours(self, others: Iterable[Any], since: float, now: float) -> dict[Key, float]:
        """The quotas' GPU-hours of [since, now) per key: the folded runs' slots (the one at `since` in proportion)
        and the part in the window of `others` (light rows of the runs not folded in: running, or ended since)."""
        out: dict[Key, float] = {}
        for key, kept in self.slots.items():
            seconds = 0.0
            for start, used in kept.items():
                if start >= since:
                    seconds += used
                elif start + self.slot > since:
                    seconds += used * (start + self.slot - since) / self.slot
            if seconds > 0:
                out[key] = seconds / 3600.0
        for r in others:
            seconds = r.gpus * overlap(r.started, now if r.ended is None else r.ended, since, now)
            if seconds > 0:
                for key in (("user", r.owner), ("project", r.project)):
                    out[key] = out.get(key, 0.0) + seconds / 3600.0
        return out
