"""Detectors: pure functions of samples (no SSH, no clock, no store); the loop feeds them and writes what they
find (`scheduler.watchdog`).

Hung jobs (seed 001). A job is suspected hung when, for its whole hang window:
- no process of any of its ranks read or wrote anything: the sum of `/proc/<pid>/io` (rchar, wchar,
  read_bytes, write_bytes) over each rank's process group did not change (any change starts a new period;
  printing to output.log is a write, so a job that logs is never hung), and
- the GPUs it holds did nothing new: for each GPU, the utilisation samples of the probes within the window
  vary less than `UTIL_VARIANCE_MAX` (a stuck NCCL collective spins at a flat 100 %, a deadlocked data
  loader sits at a flat 0 %) and the median of the window's second half is within `UTIL_SHIFT_MAX` of its
  first half's (a slowly rising curve is work, not a hang).
A job without GPUs is judged on its I/O alone. Too few GPU samples in the window (fewer than
`MIN_UTIL_SAMPLES`, or none in its first half: the probes have not watched it long enough) decide nothing
yet: a false alarm costs an operator's night, a late one only minutes.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ftconsole.scheduler.spec.config import format_duration

UTIL_VARIANCE_MAX = 4.0  # %^2: a standard deviation under 2 points of utilisation is flat
UTIL_SHIFT_MAX = 2.0  # points: the window's second half's median this close to its first half's has not moved
MIN_UTIL_SAMPLES = 3  # per GPU within the window, one of them in its first half

Sample = tuple[float, float]  # (time, utilisation %)


@dataclass(frozen=True)
class GpuFlat:
    """One GPU's utilisation over the window: flat (no new work) or not, with the figures."""

    gpu: str  # "node:index"
    samples: int
    median: float
    variance: float
    shift: float

    @property
    def flat(self) -> bool:
        return self.variance < UTIL_VARIANCE_MAX and abs(self.shift) <= UTIL_SHIFT_MAX

    def describe(self) -> str:
        return f"{self.gpu} {self.median:g}% (variance {self.variance:.2g}, median moved {self.shift:+.2g})"


@dataclass(frozen=True)
class Hung:
    """The job looks hung: since `io_since` nothing changed, and every GPU of it (if any) is flat."""

    io_since: float
    gpus: tuple[GpuFlat, ...]

    def describe(self, window: float) -> str:
        if self.gpus:
            util = "GPU utilisation flat: " + "; ".join(g.describe() for g in self.gpus)
        else:
            util = "no GPUs to look at"
        return f"no I/O by any rank for {format_duration(window)} or more; {util}"


def gpu_flat(gpu: str, samples: Sequence[Sample], start: float, end: float) -> GpuFlat | None:
    """The figures of one GPU over [start, end], or None when the samples cannot say (too few, or none in the
    window's first half)."""
    inside = sorted((t, u) for t, u in samples if start <= t <= end)
    middle = start + (end - start) / 2
    first = [u for t, u in inside if t < middle]
    second = [u for t, u in inside if t >= middle]
    if len(inside) < MIN_UTIL_SAMPLES or not first or not second:
        return None
    values = [u for _, u in inside]
    return GpuFlat(
        gpu=gpu,
        samples=len(values),
        median=statistics.median(values),
        variance=statistics.pvariance(values),
        shift=statistics.median(second) - statistics.median(first),
    )


def hung(io_since: float | None, util: Mapping[str, Sequence[Sample]], now: float, window: float) -> Hung | None:
    """Seed 001's verdict for one running job. `io_since`: when the I/O counters of its ranks last changed
    (None: not known, e.g. unreadable); `util`: the utilisation samples of each of its GPUs ("node:index"),
    empty for a job without GPUs."""
    if io_since is None or now - io_since < window:
        return None
    figures = []
    for gpu in sorted(util):
        found = gpu_flat(gpu, util[gpu], now - window, now)
        if found is None or not found.flat:
            return None
        figures.append(found)
    return Hung(io_since, tuple(figures))


# ================================================================ stragglers (seed 001) and slow jobs (seed 003)


@dataclass(frozen=True)
class Diverged:
    """Ranks more than the allowed lag apart: each rank's epoch (the latest its log showed)."""

    epochs: tuple[tuple[int, int], ...]  # (rank, epoch), by rank
    lag: int

    def describe(self) -> str:
        top = max(e for _, e in self.epochs)
        behind = [f"rank {r} at {e}" for r, e in self.epochs if e < top]
        ahead = [str(r) for r, e in self.epochs if e == top]
        return (
            f"ranks {self.lag} epochs apart: {', '.join(behind)}; rank{'s' if len(ahead) > 1 else ''} "
            f"{', '.join(ahead)} at {top}"
        )


def diverged(epochs: Mapping[int, int], max_lag: int) -> Diverged | None:
    """Seed 001's last-epoch case (`Rank:2 Epoch:[48]` vs `Rank:4 Epoch:[49]`): the ranks' latest epochs
    differ by more than `max_lag`. Fewer than two ranks seen decide nothing."""
    if len(epochs) < 2:
        return None
    lag = max(epochs.values()) - min(epochs.values())
    if lag <= max_lag:
        return None
    return Diverged(tuple(sorted(epochs.items())), lag)


@dataclass(frozen=True)
class Slow:
    """The last `iterations` of a rank all took more than `ratio` times their hardware time end to end."""

    ratios: tuple[float, ...]
    ratio: float

    def describe(self) -> str:
        shown = ", ".join(f"{r:.2f}" for r in self.ratios)
        return f"e2e time over {self.ratio:g}x the hardware time for {len(self.ratios)} iterations in a row ({shown})"


def slow(ratios: Sequence[float], ratio: float, iterations: int) -> Slow | None:
    """Seed 003's performance detection over one rank's e2e/hardware time ratios, oldest first."""
    last = tuple(ratios[-iterations:])
    if len(last) < iterations or any(r <= ratio for r in last):
        return None
    return Slow(last, ratio)
