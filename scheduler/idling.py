"""Idle reclaim: a running job with an `idle_timeout` (an allocation, `ftconsole alloc`: the cluster's
`scheduler.idle_timeout` unless it asks for its own) ends once it has been idle that long, as dstack's
`inactivity_duration` ends a dev environment. An idle allocation is the costliest waste of a shared cluster.

Idle means all of, since the job's start:
- no step running (`ftconsole run`; a step's end counts as work at that time);
- none of its GPUs at or over `scheduler.idle_util_pct` in the probes' samples;
- nobody typing in a shell of its (`ftconsole alloc`, `ftconsole shell JOB`): the terminals of its processes that came
  in over SSH, each last typed at when its atime says (as `w` reads idle times), asked of its nodes only once the
  rest says idle (supervisor action `shells`, as the job's user, at most every `SHELL_CHECK_S`).

`scheduler.idle_warning` before its end the user is warned: a line written on each of its shells' terminals, a
`job_idle` alert (the console's Alerts, the notify targets), an `IdleWarning` event. Work again clears the
warning. At the end: a stop, by "scheduler", its message and event saying for how long it was idle and since when.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ftconsole.scheduler.decide.jobs import Condition, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")

IDLE_ALERT = "job_idle"
SHELL_CHECK_S = 30.0  # how often an idle-looking job's nodes are asked about its shells


class IdleReclaim:
    """Part of the control loop (loop.py `_expire`): warns about, then stops, the jobs idle past their idle_timeout."""

    def __init__(self, store: Store, service: Any, executor: Any, clock: Callable[[], float]) -> None:
        self.store = store
        self.service = service
        self.executor = executor
        self.clock = clock
        self.settings = service.config.scheduler
        # (job, attempt) -> (asked at, last typed; None: a node could not tell, and then it is not reclaimed)
        self._typed: dict[tuple[int, int], tuple[float, float | None]] = {}
        self._blind: set[tuple[int, int]] = set()
        self._warned: set[tuple[int, int]] = set()

    async def check(self, jobs: list[Job], runs: list[Run]) -> None:
        """One look at the running jobs (`jobs`, with their current runs among `runs`)."""
        watched = [j for j in jobs if j.spec.idle_window is not None and j.status is JobStatus.RUNNING]
        live = {(j.id, j.attempt) for j in watched}
        for key in [k for k in self._warned if k not in live]:
            self._warned.discard(key)
            await self._clear(key[0], "the job ended")
        for key in [k for k in self._typed if k not in live]:
            del self._typed[key]
        self._blind &= live
        if not watched:
            return
        now = self.clock()
        samples = await self.service.gpu_samples()
        steps = {(s.job, s.attempt): s for s in await self.store.running_steps()}
        ended = await self.store.step_ends([j.id for j in watched])
        for job in watched:
            if job.stop_requested is not None:
                continue
            current = [r for r in runs if r.job == job.id and r.attempt == job.attempt]
            if not current or any(r.state != "running" for r in current if r.launch):
                continue
            if (job.id, job.attempt) in steps:
                await self._active(job)
                continue
            await self._judge(job, current, now, samples, ended.get(job.id, 0.0))

    async def _judge(self, job: Job, runs: list[Run], now: float, samples: Any, step_end: float) -> None:
        window = job.spec.idle_window
        assert window is not None
        threshold = self.settings.idle_util_pct
        started = min((r.started for r in runs if r.started is not None), default=job.started or now)
        last = max(started, step_end)
        for run in runs:
            for gpu in run.gpus:
                busy = samples.last_at_least(run.node, gpu, threshold, last)  # back to `last` only
                if busy is not None:
                    last = max(last, busy)
        warn_at = window - min(self.settings.idle_warning, window / 2)
        if now - last < warn_at:
            await self._active(job)
            return
        key = (job.id, job.attempt)
        asked, typed = self._typed.get(key, (float("-inf"), 0.0))
        if now - asked >= SHELL_CHECK_S:
            found = await self._shells(job, runs)
            typed = None if found is None else max(found, default=0.0)
            self._typed[key] = (now, typed)
            if typed is None and key not in self._blind:  # said once: never reclaimed on half the evidence
                self._blind.add(key)
                await self._say_blind(job, now)
        if typed is None:
            return
        last = max(last, typed)
        idle = now - last
        if idle < warn_at:
            await self._active(job)
        elif idle >= window:
            await self._end(job, last, now)
        elif key not in self._warned:
            await self._warn(job, runs, last, window, now)

    async def _shells(self, job: Job, runs: list[Run], warn: str | None = None) -> list[float] | None:
        """When each of the job's shells was last typed at, on all its nodes; None when a node could not tell."""
        out: list[float] = []
        for run in runs:
            if run.node not in self.executor.nodes:
                continue
            try:
                ttys = await self.executor.shells_on(job, run.node, warn=warn)
            except FtError as exc:
                log.info("job %s: cannot read its shells on %s: %s", job.id, run.node, exc)
                return None
            if ttys is None:
                return None
            out += ttys.values()
        return out

    async def _say_blind(self, job: Job, now: float) -> None:
        text = (
            "idle reclaim cannot see whether anyone types in its shells (a node did not answer, or does not know its "
            "SSH server: an SSH account that reaches users through sudo); it is not reclaimed while that lasts"
        )
        async with self.store.jobs_tx("say idle reclaim is blind") as tx:
            await tx.event(now, "IdleWarning", text, job=job.id)
        log.warning("job %s: %s", job.id, text)

    async def _active(self, job: Job) -> None:
        if (job.id, job.attempt) in self._warned:
            self._warned.discard((job.id, job.attempt))
            await self._clear(job.id, "it is at work again")

    async def _clear(self, job_id: int, why: str) -> None:
        now = self.clock()
        async with self.store.jobs_tx("clear an idle warning") as tx:
            await tx.resolve_job_alerts(job_id, IDLE_ALERT, now=now, why=why)

    async def _warn(self, job: Job, runs: list[Run], last: float, window: float, now: float) -> None:
        ends = last + window
        text = (
            f"job {job.id} ({job.name}) has been idle since {_clock(last)}: no step, no typing in its shells, its "
            f"GPUs under {self.settings.idle_util_pct:g}%; it ends at {_clock(ends)} (idle_timeout "
            f"{format_duration(window)}) unless it is at work by then"
        )
        self._warned.add((job.id, job.attempt))
        await self._shells(job, runs, warn=text)  # a line in each of its shells
        async with self.store.jobs_tx("warn of an idle job") as tx:
            await tx.event(now, "IdleWarning", text, job=job.id)
            await tx.alert(now, IDLE_ALERT, "warning", f"{text} ({job.owner})", job=job.id, once=True)
        log.info("job %s: %s", job.id, text)

    async def _end(self, job: Job, last: float, now: float) -> None:
        text = (
            f"idle for {format_duration(round(now - last))} (since {_clock(last)}: no step, no typing in its shells, "
            f"its GPUs under {self.settings.idle_util_pct:g}%), past its idle_timeout "
            f"{format_duration(job.spec.idle_window or 0)}"
        )
        try:
            async with self.store.jobs_tx("stop an idle job") as tx:
                await tx.update_job(job.id, expect=[JobStatus.RUNNING], stop_requested=now,
                                    stop_reason=StopReason.IDLE, stop_by="scheduler", message=text)  # fmt: skip
                await tx.event(now, Condition.STOPPING, f"{text}; stopping", job=job.id)
                await tx.resolve_job_alerts(job.id, IDLE_ALERT, now=now, why="the job is stopped")
        except Conflict:
            return
        self._warned.discard((job.id, job.attempt))
        log.warning("job %s: %s", job.id, text)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
