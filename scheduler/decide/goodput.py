"""Goodput: the share of a job's GPU time that did useful work, against the time lost to failures, in the sense
of the effective training time ratio that large training reports use (Meta's Llama 3 report; ByteDance's
ByteRobust reports 97 %). Pure, from the store's attempts, runs and checkpoint signals.

Per job, in GPU-seconds (a run holds its GPUs from its start to its end, as in decide/usage.py):
- useful: the GPU time of the attempts that did their work (the one that succeeded or still runs, one a user
  stopped or that reached its max_runtime, an elastic job's attempt replaced by a resize) and, of an attempt that
  failed, its part up to its last checkpoint: when its ranks got the checkpoint signal (`checkpoint_resume`),
  from which the next attempt resumed.
- rework: of an attempt that failed (it ended the job `error`, or was requeued, restarted in place, shrunk,
  or preempted), its GPU time after its last checkpoint, all of it without one: work done
  again, or never kept. ftconsole knows of a checkpoint only through its signal: a job that saves checkpoints
  by itself loses, as far as this count goes, its whole failed attempt.
- downtime: from such an attempt's end to the next attempt's start (queued again, a restart's backoff, the
  start itself), times the GPUs the next attempt holds: the time the job stood still.
- goodput = useful / (useful + rework + downtime); None for a job that used no GPU time. `saved`, part of
  useful: what checkpoints kept of failed attempts (what recovery saved).
A user's, a project's and the cluster's: the sums over their jobs. In a window [since, until), only the parts
of the spans inside it count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ftconsole.scheduler.decide.jobs import Attempt, Run
from ftconsole.scheduler.decide.usage import GROUPINGS, Owned, overlap

# attempt results that end an attempt as a failure: the job went on with a new one, or ended `error`
FAILED_RESULTS = frozenset({"requeued", "restarted", "shrunk", "preempted", "error"})


class Signalled(Protocol):
    """A checkpoint signal as the store keeps it (store.jobtx.CheckpointSignal)."""

    @property
    def job(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def done(self) -> float | None: ...


@dataclass(frozen=True)
class Goodput:
    useful: float = 0.0  # GPU-seconds
    rework: float = 0.0
    downtime: float = 0.0
    saved: float = 0.0  # of `useful`: the part of failed attempts that their checkpoint kept (what recovery saved)

    @property
    def lost(self) -> float:
        return self.rework + self.downtime

    @property
    def ratio(self) -> float | None:
        total = self.useful + self.lost
        return self.useful / total if total > 0 else None

    def __add__(self, other: Goodput) -> Goodput:
        return Goodput(
            self.useful + other.useful,
            self.rework + other.rework,
            self.downtime + other.downtime,
            self.saved + other.saved,
        )

    def to_json(self) -> dict[str, float | None]:
        ratio = self.ratio
        return {
            "goodput": None if ratio is None else round(ratio, 4),
            "useful_gpu_hours": round(self.useful / 3600, 4),
            "lost_gpu_hours": round(self.lost / 3600, 4),
            "rework_gpu_hours": round(self.rework / 3600, 4),
            "downtime_gpu_hours": round(self.downtime / 3600, 4),
            "saved_gpu_hours": round(self.saved / 3600, 4),
        }

    def describe(self) -> str:
        """'96.2% (useful 41.0 GPU-h; lost 1.6: 1.2 redone, 0.4 standing still)'."""
        ratio = self.ratio
        if ratio is None:
            return "-"
        text = f"{round(ratio, 4):.1%} (useful {self.useful / 3600:.1f} GPU-h"  # the JSON's `goodput`, shown
        if self.lost <= 0:
            return text + "; nothing lost)"
        redone, still = self.rework / 3600, self.downtime / 3600
        kept = f"; {self.saved / 3600:.1f} kept by checkpoints" if self.saved > 0 else ""
        return f"{text}; lost {self.lost / 3600:.1f}: {redone:.1f} redone, {still:.1f} standing still{kept})"


def job_goodput(
    attempts: Sequence[Attempt],
    runs: Iterable[Run],
    checkpoints: Mapping[int, float],
    since: float,
    until: float,
    now: float,
) -> Goodput:
    """One job's goodput in [since, until): its `attempts`, its `runs` (every attempt's), `checkpoints` (attempt
    number -> when its ranks got the checkpoint signal, the first time)."""
    by_attempt: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_attempt[r.attempt].append(r)
    useful = rework = downtime = saved = 0.0
    ordered = sorted(attempts, key=lambda a: a.number)
    for i, attempt in enumerate(ordered):
        mine = [r for r in by_attempt.get(attempt.number, []) if r.started is not None]
        failed = attempt.result in FAILED_RESULTS
        saved_until = checkpoints.get(attempt.number) if failed else None
        for r in mine:
            start = r.started if r.started is not None else now
            end = r.ended if r.ended is not None else now
            gpus = len(r.gpus)
            if not failed:
                useful += gpus * overlap(start, end, since, until)
                continue
            cut = start if saved_until is None else min(max(saved_until, start), end)
            kept = gpus * overlap(start, cut, since, until)
            useful += kept
            saved += kept
            rework += gpus * overlap(cut, end, since, until)
        if failed and i + 1 < len(ordered):
            nxt = ordered[i + 1]
            ended = max((r.ended for r in mine if r.ended is not None), default=attempt.ended)
            starts = [r.started for r in by_attempt.get(nxt.number, []) if r.started is not None]
            resumed = min(starts) if starts else (None if nxt.ended is not None else now)  # still starting: now
            if ended is not None and resumed is not None and resumed > ended:
                gpus = sum(len(r.gpus) for r in by_attempt.get(nxt.number, []))
                downtime += gpus * overlap(ended, resumed, since, until)
    return Goodput(useful, rework, downtime, saved)


def checkpoint_times(signals: Iterable[Signalled]) -> dict[tuple[int, int], float]:
    """(job, attempt) -> when its ranks first got the checkpoint signal, from the store's checkpoint signals
    (those `signalled`, with their `done` time)."""
    out: dict[tuple[int, int], float] = {}
    for s in signals:
        if s.outcome == "signalled" and s.done is not None:
            key = (s.job, s.attempt)
            out[key] = min(out.get(key, s.done), s.done)
    return out


def goodput_by(
    jobs: Mapping[int, Owned],
    attempts: Iterable[Attempt],
    runs: Iterable[Run],
    checkpoints: Mapping[tuple[int, int], float],
    grouping: str,
    since: float,
    until: float,
    now: float,
) -> tuple[dict[str, Goodput], Goodput]:
    """User or project (`grouping`) -> the goodput of its jobs in the window; and the cluster's."""
    if grouping not in GROUPINGS:
        raise ValueError(f"goodput by {grouping!r}: by one of {', '.join(GROUPINGS)}")
    out: dict[str, Goodput] = {}
    total = Goodput()
    for job_id, found in per_job(attempts, runs, checkpoints, since, until, now).items():
        job = jobs.get(job_id)
        if job is None:
            continue
        key = job.owner if grouping == "user" else job.project
        out[key] = out.get(key, Goodput()) + found
        total = total + found
    return out, total


def per_job(
    attempts: Iterable[Attempt],
    runs: Iterable[Run],
    checkpoints: Mapping[tuple[int, int], float],
    since: float,
    until: float,
    now: float,
) -> dict[int, Goodput]:
    """Job id -> its goodput in the window, for the jobs with GPU time in it."""
    by_job_attempts: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_job_attempts[a.job].append(a)
    by_job_runs: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_job_runs[r.job].append(r)
    marks: dict[int, dict[int, float]] = defaultdict(dict)
    for (job_id, number), t in checkpoints.items():
        marks[job_id][number] = t
    out = {}
    for job_id, mine in by_job_runs.items():
        found = job_goodput(by_job_attempts.get(job_id, []), mine, marks.get(job_id, {}), since, until, now)
        if found.useful + found.lost > 0:
            out[job_id] = found
    return out


def total(per: Mapping[int, Goodput]) -> Goodput:
    return sum(per.values(), Goodput())
