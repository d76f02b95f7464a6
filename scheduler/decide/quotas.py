"""Quotas per project and per user (issue 30): pure, from what each uses now and the config's limits.

A limit is one of: `gpus` (most GPUs its running jobs hold at once), `running_jobs`, `queued_jobs` (a submit
past it is refused), `gpu_hours` (most GPU-hours over the last `period`, as `ftconsole usage` counts them). A
project's limits are `quotas.projects[name]`, else `quotas.default_project`; a user's likewise. A job must fit
both its project's and its user's.

A project's limits apply only to a project the cluster config declares (`applies`, issue 40): without declared
projects a job's `project:` is a label anyone may write, and a new name would escape every project limit, so
only its user's apply (the config refuses project limits there: spec/config.py).

A user's `queued_jobs` is 10,000 unless the config says otherwise (spec/sharingspec.py, DEFAULT_QUEUED_JOBS: as
Slurm's MaxSubmitJobs), so that no one user's submits fill the store (issue 40).

`hold_back` walks the queue in its order and keeps back each job that would take its project or user past a
limit, counting the jobs before it as if they started (so that one pass never places past a limit, whatever it
places); the jobs kept back wait, saying which quota, and hold no one else back. Next pass, with what really
started, counts again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

Key = tuple[str, str]  # ("project", name) or ("user", name)


@dataclass(frozen=True)
class Limits:
    gpus: int | None = None
    running_jobs: int | None = None
    queued_jobs: int | None = None
    gpu_hours: float | None = None


@dataclass
class InUse:
    gpus: int = 0
    running_jobs: int = 0
    queued_jobs: int = 0
    gpu_hours: float = 0.0


@dataclass(frozen=True)
class Queued:
    """A queued job as quotas see it, in queue order."""

    id: str
    project: str
    user: str
    gpus: int  # what it holds once started: nodes x GPUs per node (its largest candidate)

    def scopes(self) -> tuple[Key, Key]:
        return (("project", self.project), ("user", self.user))


def applies(key: Key, declared: Collection[str]) -> bool:
    """Whether limits may hold for `key`: a user's always; a project's where the config declares it
    (`declared`), never for a name a user made up."""
    kind, name = key
    return kind == "user" or name in declared


def _n(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count:,} {what}s"


def describe(key: Key) -> str:
    return f"{key[0]} {key[1]}"


def over(key: Key, limits: Limits, used: InUse, ahead: InUse, gpus: int) -> str | None:
    """Why a job of `gpus` GPUs cannot start now under `limits`, with what is `used` now and what the jobs
    ahead of it in this pass would take (`ahead`); None: it can."""
    who = describe(key)
    if limits.gpu_hours is not None and used.gpu_hours >= limits.gpu_hours:
        return f"{who} used its quota of {limits.gpu_hours:g} GPU-hours ({used.gpu_hours:.1f})"
    if limits.running_jobs is not None and used.running_jobs + ahead.running_jobs + 1 > limits.running_jobs:
        taken = _taken(used.running_jobs, ahead.running_jobs)
        return f"{who} is at its quota of {_n(limits.running_jobs, 'running job')}{taken}"
    if limits.gpus is not None and used.gpus + ahead.gpus + gpus > limits.gpus:
        return f"{who} is at its quota of {_n(limits.gpus, 'GPU')}{_taken(used.gpus, ahead.gpus)}"
    return None


def _taken(used: int, ahead: int) -> str:
    parts = ([f"{used} in use"] if used else []) + ([f"{ahead} for jobs ahead of it"] if ahead else [])
    return f" ({', '.join(parts)})" if parts else ""


class Gate:
    """The quotas as a placement pass meets the queue, one job at a time in queue order: a job past a quota
    waits (`hold` says why), one within them counts as started for the jobs after it."""

    def __init__(self, limits_of: Callable[[Key], Limits | None], in_use: Mapping[Key, InUse]) -> None:
        self.limits_of = limits_of
        self.in_use = in_use
        self.ahead: dict[Key, InUse] = {}

    def hold(self, job: Queued) -> str | None:
        scopes = [(k, lim) for k in job.scopes() if (lim := self.limits_of(k)) is not None]
        found = (over(k, lim, self.in_use.get(k, NONE), self.ahead.get(k, NONE), job.gpus) for k, lim in scopes)
        why = next((w for w in found if w is not None), None)
        if why is not None:
            return why
        for k, _ in scopes:  # counted as if it started: the jobs after it see it
            taken = self.ahead.setdefault(k, InUse())
            taken.gpus += job.gpus
            taken.running_jobs += 1
        return None


def hold_back(
    queue: Iterable[Queued], limits_of: Callable[[Key], Limits | None], in_use: Mapping[Key, InUse]
) -> dict[str, str]:
    """Job id -> why it waits, for the queued jobs (in queue order) that would go past a quota."""
    gate = Gate(limits_of, in_use)
    return {job.id: why for job in queue if (why := gate.hold(job)) is not None}


NONE = InUse()


def submit_refusal(
    project: str, user: str, limits_of: Callable[[Key], Limits | None], queued: Mapping[Key, int], count: int = 1
) -> str | None:
    """Why `count` new jobs (an array's tasks; 1) cannot even be queued (their project or user would have more
    than `queued_jobs` queued), or None."""
    for key in (("project", project), ("user", user)):
        limits = limits_of(key)
        if limits is not None and limits.queued_jobs is not None and queued.get(key, 0) + count > limits.queued_jobs:
            quota = _n(limits.queued_jobs, "queued job")
            if count == 1:
                return f"{describe(key)} is at its quota of {quota}"
            now = queued.get(key, 0)
            return (
                f"{describe(key)} has a quota of {quota} ({now:,} queued now): the array's {count:,} tasks would "
                "pass it"
            )
    return None
