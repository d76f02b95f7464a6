"""The kept debugging environment (seed 003): after a job fails, what stays for `ftconsole shell`.

The run folders of a failed job's last attempt (its env, hostfile, output.log, whatever the command left in
its folder) stay on its nodes until `kept_until`: its end plus its retention (the spec's `debug.retention`, else
the cluster's `debug.retention`, never over `debug.max_retention`), or longer where `scheduler.run_retention`
keeps every ended run longer. With the spec's `debug.hold_nodes`, the GPUs its last attempt held stay held
until `held_until` (at most `debug.max_hold` after the end; `ftconsole release JOB` gives them up earlier, and
so does deleting the job), so that nothing else starts there before someone looked.

`kept_until`, `held_until` and `view` are pure; `failed_lately` and `holds` read the store, for the executor
(the attempts run retention keeps), placement (the GPUs held) and the cluster view.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.spec.config import DebugSettings, SchedulerSettings
from ftconsole.scheduler.store.db import Store


def retention(job: Job, settings: DebugSettings) -> float:
    """How long the job's environment is kept after it failed."""
    asked = job.spec.debug.retention
    return min(settings.retention if asked is None else asked, settings.max_retention)


def kept_until(job: Job, settings: DebugSettings) -> float | None:
    """Until when a failed job's last attempt is kept for debugging (None: the job did not fail, or ran nothing)."""
    if job.status is not JobStatus.ERROR or job.ended is None or job.attempt == 0:
        return None
    return job.ended + retention(job, settings)


def held_until(job: Job, settings: DebugSettings) -> float | None:
    """Until when a failed job's GPUs stay held (None: no hold: not asked, not allowed, released or deleted)."""
    until = kept_until(job, settings)
    if until is None or not job.spec.debug.hold_nodes or job.deleted or job.debug_released is not None:
        return None
    if settings.max_hold <= 0:
        return None
    assert job.ended is not None
    return min(until, job.ended + settings.max_hold)


def env_until(job: Job, debug: DebugSettings, scheduler: SchedulerSettings) -> float | None:
    """Until when the run folders of the job's last attempt are on its nodes at least: the later of its debug
    retention (a failed job) and `scheduler.run_retention` (every ended run); None: forever, or nothing ended."""
    if job.ended is None or job.attempt == 0:
        return None
    if not scheduler.run_retention:
        return None  # run retention off: nothing is ever removed
    until = job.ended + scheduler.run_retention
    debug_until = kept_until(job, debug)
    return until if debug_until is None else max(until, debug_until)


def view(job: Job, debug: DebugSettings, scheduler: SchedulerSettings, now: float) -> dict[str, Any] | None:
    """The `debug` field of a failed job's JSON: until when its environment is kept and its GPUs held."""
    until = kept_until(job, debug)
    if until is None:
        return None
    hold = held_until(job, debug)
    env = env_until(job, debug, scheduler)
    return {
        "kept_until": until,
        "env_until": env,
        "env": "kept" if env is None or now < env else "gone",
        "hold_nodes": job.spec.debug.hold_nodes,
        "held_until": hold if hold is not None and now < hold else None,
        "released": job.debug_released,
    }


@dataclass(frozen=True)
class Hold:
    """The GPUs of one node that a failed job holds for debugging, until `until`."""

    job: Job
    run: Run
    until: float


async def failed_lately(store: Store, settings: DebugSettings, now: float) -> list[Job]:
    """The failed jobs whose environment is still kept (`kept_until` after now): one indexed query, kept by the
    store for a minute while no job changes (every node's sweep asks)."""
    since = now - settings.max_retention
    jobs = await store.jobs(statuses=[JobStatus.ERROR], deleted=True, ended_since=since - since % 60)
    return [j for j in jobs if (kept_until(j, settings) or 0.0) > now]


async def holds(store: Store, settings: DebugSettings, now: float) -> list[Hold]:
    """The GPUs held for debugging now: the runs of each holding job's last attempt."""
    if settings.max_hold <= 0:
        return []
    out: list[Hold] = []
    for job in await failed_lately(store, settings, now):
        until = held_until(job, settings)
        if until is None or until <= now:
            continue
        out.extend(Hold(job, run, until) for run in await store.runs(job=job.id) if run.attempt == job.attempt)
    return out


def kept_attempts(jobs: Iterable[Job]) -> tuple[str, ...]:
    """The "<job>/<attempt>" folders that run retention keeps for these failed jobs."""
    return tuple(sorted(f"{j.id}/{j.attempt}" for j in jobs))


def held_runs(held: Sequence[Hold]) -> list[Run]:
    return [h.run for h in held]
