"""Stopping, deleting and releasing jobs (part of `jobops.Scheduler`): a queued job ends at once (many in one
transaction), a running one is asked to stop (SIGTERM to its ranks, SIGKILL after `scheduler.stop_grace`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide.jobs import Condition, Job, JobStatus, StopReason
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.holding import as_now
from ftconsole.scheduler.loop import request_stop
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import ClusterConfig, SchedulerSettings, format_duration
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict, JobTx

STOP_BATCH = 500  # queued jobs stopped (or deleted) in one transaction


class Stopping:
    """Part of `Scheduler` (jobops.py): stop, delete, release."""

    store: Store
    config: ClusterConfig
    settings: SchedulerSettings
    clock: Callable[[], float]

    def _poke(self) -> None:
        raise NotImplementedError  # Scheduler's

    async def targets_of(self, caller: Caller, refs: Iterable[int | str], verb: str) -> list[Job]:
        raise NotImplementedError  # Scheduler's (sharing.py)

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        raise NotImplementedError  # Scheduler's

    async def stop(self, caller: Caller, job_ids: Iterable[int | str]) -> list[Job]:
        jobs = await self.targets_of(caller, job_ids, "stop")
        return await self._stop_all(caller, jobs, StopReason.STOPPED)

    async def _stop_all(
        self, caller: Caller, jobs: Sequence[Job], reason: StopReason, *, delete: bool = False
    ) -> list[Job]:
        """`_stop` each job; the queued ones STOP_BATCH at a time, in one transaction each (stopping a thousand
        queued tasks of an array is a few writes, not a thousand)."""
        done: dict[int, Job] = {}
        queued = [job for job in jobs if job.status is JobStatus.QUEUED]
        for start in range(0, len(queued), STOP_BATCH):
            batch = queued[start : start + STOP_BATCH]
            now = self.clock()
            try:
                async with self.store.jobs_tx("stop queued jobs") as tx:
                    await self._stop_queued(tx, caller, batch, reason, now, delete=delete)
            except Conflict:  # one of them was placed meanwhile: each on its own, as it is now
                continue
            done.update({job.id: job for job in batch})
        if done:
            self._poke()
            fresh = {job.id: job for job in await self.store.jobs_by_id(list(done))}
            done = {i: fresh.get(i, job) for i, job in done.items()}
        return [
            done[job.id] if job.id in done else await self._stop(caller, job, reason, delete=delete) for job in jobs
        ]

    async def _stop_queued(
        self, tx: JobTx, caller: Caller, jobs: Sequence[Job], reason: StopReason, now: float, *, delete: bool
    ) -> None:
        """Stop these queued jobs, in a few statements whatever their number; `Conflict` if one is no longer
        queued (none is stopped then)."""
        await tx.update_jobs(
            [job.id for job in jobs],
            expect=[JobStatus.QUEUED],
            status=JobStatus.STOPPED,
            ended=now,
            stop_requested=now,
            stop_reason=reason,
            stop_by=caller.user,
            message=f"stopped by {caller.user} before it started",
            **({"deleted": True} if delete else {}),
        )
        events = [(now, Condition.STOPPED.value, f"stopped by {caller.user} while queued", job.id) for job in jobs]
        if delete:
            events += [(now, "Deleted", f"deleted by {caller.user}", job.id) for job in jobs]
        await tx.events(events)

    async def _stop(self, caller: Caller, job: Job, reason: StopReason, *, delete: bool = False) -> Job:
        now = self.clock()
        try:
            async with self.store.jobs_tx("stop a job") as tx:
                if job.status is JobStatus.QUEUED:
                    await self._stop_queued(tx, caller, [job], reason, now, delete=delete)  # its Deleted event too
                elif job.status is JobStatus.RUNNING and job.stop_reason is None:
                    grace = format_duration(self.settings.stop_grace)
                    await request_stop(
                        tx,
                        job,
                        now,
                        reason,
                        caller.user,
                        f"stop requested by {caller.user}; SIGKILL after {grace}",
                        **({"deleted": True} if delete else {}),
                    )
                elif delete:
                    await tx.update_job(job.id, deleted=True)
                if delete and job.status is not JobStatus.QUEUED:
                    await tx.event(now, "Deleted", f"deleted by {caller.user}", job=job.id)
        except Conflict:  # it changed state meanwhile (placed, or finished): act on what it is now
            fresh = await self.store.job(job.id)
            assert fresh is not None
            return await self._stop(caller, fresh, reason, delete=delete)
        self._poke()
        fresh = await self.store.job(job.id)
        assert fresh is not None
        return fresh

    async def delete(self, caller: Caller, job_ids: Iterable[int | str]) -> list[Job]:
        """Hide jobs from every listing; a queued or running one is stopped first (its record and events stay)."""
        jobs = await self.targets_of(caller, job_ids, "delete")
        return await self._stop_all(caller, jobs, StopReason.STOPPED, delete=True)

    async def release(self, caller: Caller, job_ids: Iterable[int | str]) -> list[Job]:
        """Release what the jobs named hold: a queued job's hold (`hold`: it may be placed again), or the GPUs a
        failed job holds for debugging (`debug.hold_nodes`) before their time is over, its run folders staying for
        the rest of the retention. An array's id: each of its tasks that holds either. Refused, with nothing
        released, when one job named on its own holds neither."""
        refs = list(job_ids)
        jobs = await self.targets_of(caller, refs, "release")
        now = self.clock()
        held = [job for job in jobs if job.status is JobStatus.QUEUED and job.held_by is not None]
        debugging = [job for job in jobs if _debug_until(job, self.config, now) is not None]
        arrays = {job.array_id for job in jobs if job.array_id is not None}
        whole = {int(text) for text in (str(r).strip() for r in refs) if text.isdigit() and int(text) in arrays}
        holding = {job.id for job in held} | {job.id for job in debugging}
        for job in jobs:  # one named on its own (not as one of an array's tasks) that holds nothing is refused
            if job.array_id not in whole and job.id not in holding:
                raise UsageError(f"job {job.ref} is {job.status.value} and {_holds_nothing(job, self.config)}: "
                                 "nothing to release")  # fmt: skip
        if not held and not debugging:
            raise UsageError("none of the jobs named holds anything: nothing to release")
        await self.release_holds(caller, held)
        if debugging:
            async with self.store.jobs_tx("release a job's held GPUs") as tx:
                for job in debugging:
                    await tx.update_job(job.id, expect=[JobStatus.ERROR], debug_released=now)
                    await tx.event(now, "Released", f"GPUs held for debugging released by {caller.user}", job=job.id)
            self._poke()
        return await as_now(self.store, jobs)

    async def release_holds(self, caller: Caller, jobs: Sequence[Job]) -> None:
        raise NotImplementedError  # Scheduler's (holding.py)


def _debug_until(job: Job, config: ClusterConfig, now: float) -> float | None:
    """Until when a failed job holds its GPUs for debugging; None: it holds none now."""
    until = debugenv.held_until(job, config.debug)
    return until if until is not None and until > now else None


def _holds_nothing(job: Job, config: ClusterConfig) -> str:
    until = debugenv.held_until(job, config.debug)
    return "holds no GPUs for debugging" if until is None else "held its GPUs until " + _clock(until)


def _clock(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
