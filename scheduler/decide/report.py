"""A usage report over a window (`ftconsole usage`, like Slurm's sreport), from its parts. Pure.

A window [since, until) is read in pieces (scheduler/sharing.py): its whole UTC days from the day sums of the jobs
already rolled into them (scheduler/retention.py), and, from the runs themselves, the jobs not rolled yet over the
whole window and the rolled jobs over the window's edges, the parts of days it cuts. `window_sums` sums the runs'
parts; the day sums are added to its answer as they are. A job's GPU-seconds and goodput are counted in each part
where it ran; the job itself once: where it ran in the window, unless the day sums count it already (they count a
job on the first day it used GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ftconsole.scheduler.decide.goodput import Goodput, per_job
from ftconsole.scheduler.decide.jobs import Attempt, Run
from ftconsole.scheduler.decide.usage import GROUPINGS, Owned, Usage, job_gpu_seconds

DAY_S = 86400.0


@dataclass(frozen=True)
class Part:
    """Jobs' runs (every run of each job) summed over [since, until); `rolled`: jobs the day sums hold."""

    owners: Mapping[int, Owned]
    runs: Sequence[Run]
    since: float
    until: float
    rolled: bool = False


def whole_days(since: float, until: float) -> tuple[float, float] | None:
    """The whole UTC days inside [since, until), as [first day's start, last day's end); None if there is none."""
    first = -(-since // DAY_S) * DAY_S
    last = until // DAY_S * DAY_S
    return (first, last) if first < last else None


def window_sums(
    parts: Sequence[Part],
    attempts: Iterable[Attempt],
    checkpoints: Mapping[tuple[int, int], float],
    grouping: str,
    now: float,
    days: tuple[float, float] | None = None,
) -> tuple[dict[str, Usage], dict[str, Goodput], Goodput]:
    """User or project (`grouping`) -> its usage, and its goodput, in the parts; and the whole goodput. A rolled
    job whose first GPU use falls in `days` (the whole days the day sums cover) is not counted again."""
    if grouping not in GROUPINGS:
        raise ValueError(f"usage by {grouping!r}: by one of {', '.join(GROUPINGS)}")
    attempts = list(attempts)
    seconds: dict[int, float] = {}
    owner_of: dict[int, Owned] = {}
    counted_by_days: set[int] = set()
    good: dict[str, Goodput] = {}
    total = Goodput()
    for part in parts:
        for job_id, used in job_gpu_seconds(part.runs, part.since, part.until, now).items():
            if job_id in part.owners:
                seconds[job_id] = seconds.get(job_id, 0.0) + used
                owner_of[job_id] = part.owners[job_id]
        if part.rolled and days is not None:
            counted_by_days |= _first_used_in(part.runs, days)
        for job_id, found in per_job(attempts, part.runs, checkpoints, part.since, part.until, now).items():
            owned = part.owners.get(job_id)
            if owned is None:
                continue
            key = owned.owner if grouping == "user" else owned.project
            good[key] = good.get(key, Goodput()) + found
            total = total + found
    rows: dict[str, Usage] = {}
    for job_id, used in seconds.items():
        owned = owner_of[job_id]
        key = owned.owner if grouping == "user" else owned.project
        was = rows.get(key, Usage())
        rows[key] = Usage(was.gpu_seconds + used, was.jobs + (0 if job_id in counted_by_days else 1))
    return rows, good, total


def _first_used_in(runs: Iterable[Run], days: tuple[float, float]) -> set[int]:
    """The jobs whose first run started in [days): the day sums count them."""
    first: dict[int, float] = {}
    for r in runs:
        if r.started is not None:
            first[r.job] = min(first.get(r.job, r.started), r.started)
    return {job for job, t in first.items() if days[0] <= t < days[1]}
