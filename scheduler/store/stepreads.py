"""The store's reads of steps (`ftconsole run JOB -- CMD`): a job's, for `show`, and those still running, which a
scheduler that starts finds to take back or end. Part of `Store` (db.py); written through `JobTx.add_step` and
`JobTx.end_step`."""

from __future__ import annotations

from ftconsole.scheduler.decide.stepplan import JobStep
from ftconsole.scheduler.store.engine import Engine


class StepReads:
    _db: Engine

    async def steps(self, job: int) -> list[JobStep]:
        """The steps of a job, by number."""
        rows = await self._db.fetchall("SELECT * FROM steps WHERE job = ? ORDER BY number", (job,))
        return [JobStep.from_row(r) for r in rows]

    async def running_steps(self) -> list[JobStep]:
        """Every step not ended yet, of any job."""
        rows = await self._db.fetchall("SELECT * FROM steps WHERE state = 'running' ORDER BY job, number")
        return [JobStep.from_row(r) for r in rows]

    async def step_ends(self, jobs: list[int]) -> dict[int, float]:
        """job -> when its last ended step ended (jobs without one left out), one query for all of them."""
        if not jobs:
            return {}
        marks = ",".join("?" * len(jobs))
        rows = await self._db.fetchall(
            f"SELECT job, MAX(ended) FROM steps WHERE job IN ({marks}) AND ended IS NOT NULL GROUP BY job", jobs
        )
        return {int(job): float(ended) for job, ended in rows}
