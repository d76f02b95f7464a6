"""Holding queued jobs (part of `jobops.Scheduler`), as Slurm's `scontrol hold` and `release` do: a held job stays
queued, keeps its priority and its submit time, and is not placed until it is released; meanwhile it holds nothing
back (backfill goes around it, it counts towards no quota and no queue depth: `Placer.by_dependencies`).

Who: whoever may stop the job (its owner, an admin, anyone where its `access` is read-write) may hold it and
release it; a hold an admin made is released by an admin only (Slurm's admin hold against its user hold). An
array's id holds or releases each of its queued tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import PermissionDenied, UsageError
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict

HOLD_BATCH = 500  # jobs held (or released) in one transaction


class Holding:
    """Part of `Scheduler` (jobops.py): hold, and the release of a hold."""

    store: Store
    clock: Callable[[], float]

    def _poke(self) -> None:
        raise NotImplementedError  # Scheduler's

    def is_admin(self, caller: Caller) -> bool:
        raise NotImplementedError  # Scheduler's

    async def targets_of(self, caller: Caller, refs: Iterable[int | str], verb: str) -> list[Job]:
        raise NotImplementedError  # Scheduler's (sharing.py)

    async def hold(self, caller: Caller, refs: Iterable[int | str]) -> list[Job]:
        """Hold the queued jobs named (an array: its queued tasks); the jobs as they are now. Refused when none of
        them is queued. A job held already stays held as it was, unless an admin holds it now: then it is an
        admin's hold."""
        jobs = await self.targets_of(caller, refs, "hold")
        queued = [j for j in jobs if j.status is JobStatus.QUEUED]
        if not queued:
            raise UsageError(f"{_named(jobs)}: only a queued job can be held")
        admin = self.is_admin(caller)
        wanted = [j for j in queued if j.held_by is None or (admin and not j.held_admin)]
        how = f"held by {caller.user}" + (", an admin" if admin else "")
        await self._set_holds(wanted, "hold jobs", "Held", how, held_by=caller.user, admin=admin)
        return await as_now(self.store, jobs)

    async def release_holds(self, caller: Caller, jobs: Sequence[Job]) -> None:
        """Release these held queued jobs; refused, with none released, when an admin's hold is among them and the
        caller is no admin."""
        if not self.is_admin(caller):
            for job in jobs:
                if job.held_admin:
                    raise PermissionDenied(
                        f"job {job.ref} was held by {job.held_by}, an admin: only an admin may release it"
                    )
        await self._set_holds(jobs, "release held jobs", "Released", f"hold released by {caller.user}",
                              held_by=None, admin=False)  # fmt: skip

    async def _set_holds(
        self, jobs: Sequence[Job], what: str, kind: str, message: str, *, held_by: str | None, admin: bool
    ) -> None:
        """Write the hold (held_by None: its release) of these jobs, still queued, HOLD_BATCH to a transaction, each
        with its event; a job placed meanwhile is left as it is now (its batch is written job by job then)."""
        for start in range(0, len(jobs), HOLD_BATCH):
            batch = jobs[start : start + HOLD_BATCH]
            try:
                await self._write_holds(batch, what, kind, message, held_by, admin)
            except Conflict:  # one of them left the queue meanwhile: each on its own, those still queued
                for job in batch:
                    try:
                        await self._write_holds([job], what, kind, message, held_by, admin)
                    except Conflict:
                        continue
        if jobs:
            self._poke()

    async def _write_holds(
        self, jobs: Sequence[Job], what: str, kind: str, message: str, held_by: str | None, admin: bool
    ) -> None:
        now = self.clock()
        async with self.store.jobs_tx(what) as tx:
            await tx.update_jobs(
                [j.id for j in jobs],
                expect=[JobStatus.QUEUED],
                held_by=held_by,
                held_at=None if held_by is None else now,
                held_admin=admin,
            )
            await tx.events([(now, kind, message, j.id) for j in jobs])


async def as_now(store: Store, jobs: Sequence[Job]) -> list[Job]:
    """The jobs as the store has them now, in the same order: 500 to a query (an array of 10,000 tasks is 20
    reads, not 10,000)."""
    now = {j.id: j for j in await store.jobs_by_id([j.id for j in jobs])}
    return [now.get(j.id, j) for j in jobs]


def _named(jobs: Sequence[Job]) -> str:
    """The jobs, as a refusal names them: `job 12 is running`, or how many of each status."""
    if len(jobs) == 1:
        return f"job {jobs[0].ref} is {jobs[0].status.value}"
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.status.value] = counts.get(job.status.value, 0) + 1
    return "the jobs named are " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
