"""GPU usage over a period (issue 30's history, like Slurm's sreport): pure, from the store's jobs and runs.

A rank's run holds its GPUs from its start to its end (to `now` while it runs); its GPU-seconds in a window
[since, until) are its GPU count times the part of that span inside the window. A job's usage is its runs',
every attempt's; a user's or a project's, their jobs'. Runs that never started (intents cancelled before their
start) used nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ftconsole.scheduler.decide.jobs import Run

GROUPINGS = ("user", "project")


class Owned(Protocol):
    """Whose a job is (a `Job`, or the store's lighter record of it)."""

    @property
    def owner(self) -> str: ...
    @property
    def project(self) -> str: ...


@dataclass(frozen=True)
class Usage:
    gpu_seconds: float = 0.0
    jobs: int = 0  # jobs that used GPUs in the window

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    def to_json(self) -> dict[str, float | int]:
        seconds = round(self.gpu_seconds, 1)  # the hours from the seconds shown, so that the two agree
        return {"gpu_hours": round(seconds / 3600.0, 4), "gpu_seconds": seconds, "jobs": self.jobs}


def overlap(start: float, end: float, since: float, until: float) -> float:
    """How long [start, end) and [since, until) share (0 if nothing)."""
    return max(0.0, min(end, until) - max(start, since))


def run_gpu_seconds(run: Run, since: float, until: float, now: float) -> float:
    if run.started is None:
        return 0.0
    end = run.ended if run.ended is not None else now
    return len(run.gpus) * overlap(run.started, end, since, until)


def job_gpu_seconds(runs: Iterable[Run], since: float, until: float, now: float) -> dict[int, float]:
    """Job id -> its GPU-seconds in the window (jobs with none left out)."""
    out: dict[int, float] = {}
    for r in runs:
        used = run_gpu_seconds(r, since, until, now)
        if used > 0:
            out[r.job] = out.get(r.job, 0.0) + used
    return out


def usage_by(
    jobs: Mapping[int, Owned], runs: Iterable[Run], grouping: str, since: float, until: float, now: float
) -> dict[str, Usage]:
    """User or project (`grouping`) -> its usage in the window, most used first."""
    if grouping not in GROUPINGS:
        raise ValueError(f"usage by {grouping!r}: by one of {', '.join(GROUPINGS)}")
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    for job_id, used in job_gpu_seconds(runs, since, until, now).items():
        job = jobs.get(job_id)
        if job is None:
            continue
        key = job.owner if grouping == "user" else job.project
        seconds[key] = seconds.get(key, 0.0) + used
        counts[key] = counts.get(key, 0) + 1
    order = sorted(seconds, key=lambda k: (-seconds[k], k))
    return {k: Usage(seconds[k], counts[k]) for k in order}
