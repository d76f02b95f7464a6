"""History retention (`history:` in the config), like Slurm's PurgeJobAfter and PurgeEventAfter: what ended long
ago leaves the store, so that a year of running does not make every read slower.

While `serve` leads, every `ROLL_EVERY_S` (the first time `FIRST_S` after it starts), what each job that ended
more than `ROLL_AFTER_S` ago used is added to the per-day sums of its user and project (`history_days`:
GPU-seconds, jobs and goodput per UTC day) and the job is marked rolled: `usage` reads a window's whole days from
these sums and sums only its edges and the jobs not rolled yet from their runs, so that a month's report costs its
days, not its jobs (as `sreport` reads Slurm's rollup tables). Every `EVERY_S`, the pruner then removes:

- rolled jobs that ended more than `history.jobs` ago, with their attempts, runs, checkpoint signals, evidence,
  events and alerts; not a job with an alert still open or acknowledged, nor a task of an array with a task
  still active or ended since (an array goes whole). Their day sums stay: a report over any span still adds up,
  to the day;
- events of no job (a node's) older than `history.events`, and resolved alerts of no job resolved before then.

It works `BATCH` rows to a transaction and lets the event loop go between them (the sums are made in a worker
thread), so requests and ticks go on while a year's backlog is pruned; each removal is counted in the store
(`pruned`: the `ftconsole_history_pruned_total` metric, and the restarts of pruned attempts that
`ftconsole_restarts_total` keeps counting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable

from ftconsole.scheduler.decide import goodput, usage
from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.spec.config import HistorySettings
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.history import DAY_S, DaySum, Pruning
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")

FIRST_S = 60.0  # after the scheduler starts: recovery and the first placement go first
EVERY_S = 600.0  # between prunings
ROLL_EVERY_S = 60.0  # between rolls of the ended jobs into the day sums
# a job is rolled this long after it ended: what its runs' last reads may still change has settled by then, and
# `usage` sums the jobs ended since from their runs
ROLL_AFTER_S = 3600.0
BATCH = 200  # jobs (or events, alerts) to a transaction
PAUSE_S = 0.05  # between transactions: requests and ticks go first


def day_sums(pruning: Pruning, now: float) -> list[DaySum]:
    """What the jobs of `pruning` used, per UTC day and (user, project): GPU-seconds, the jobs that first used GPUs
    that day, and goodput (decide/goodput.py). Pure."""
    runs: dict[int, list[Run]] = defaultdict(list)
    for r in pruning.runs:
        runs[r.job].append(r)
    attempts = defaultdict(list)
    for a in pruning.attempts:
        attempts[a.job].append(a)
    marks: dict[int, dict[int, float]] = defaultdict(dict)
    for (job_id, number), t in goodput.checkpoint_times(pruning.signals).items():
        marks[job_id][number] = t
    sums: dict[tuple[float, str, str], list[float]] = {}
    for job in pruning.jobs:
        mine = [r for r in runs.get(job.id, []) if r.started is not None]
        if not mine:
            continue
        first = min(r.started or 0.0 for r in mine)
        last = max(r.ended if r.ended is not None else (job.ended or now) for r in mine)
        day = first - first % DAY_S
        counted = False  # the job counts once, on the first day it used GPUs
        while day < last:
            used = sum(usage.run_gpu_seconds(r, day, day + DAY_S, job.ended or now) for r in mine)
            good = goodput.job_goodput(attempts[job.id], mine, marks[job.id], day, day + DAY_S, job.ended or now)
            if used > 0 or good.useful + good.lost > 0:
                into = sums.setdefault((day, job.owner, job.project), [0.0] * 6)
                first_use = used > 0 and not counted
                counted = counted or first_use
                for i, value in enumerate((used, 1 if first_use else 0, good.useful, good.rework, good.downtime,
                                           good.saved)):  # fmt: skip
                    into[i] += value
            day += DAY_S
    return [
        DaySum(day, owner, project, v[0], int(v[1]), v[2], v[3], v[4], v[5])
        for (day, owner, project), v in sorted(sums.items())
    ]


class Pruner:
    def __init__(self, store: Store, settings: HistorySettings, *, clock: Callable[[], float]) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    async def run(self, stop: asyncio.Event) -> None:
        """Roll every `ROLL_EVERY_S` and prune every `EVERY_S` until `stop`; a failure is logged and tried again
        next time."""
        wait, pruned_at = FIRST_S, None
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
                return
            except TimeoutError:
                pass
            wait = ROLL_EVERY_S
            try:
                if pruned_at is None or self.clock() - pruned_at >= EVERY_S:
                    pruned_at = self.clock()
                    await self.prune()
                else:
                    await self.roll()
            except StoreError as exc:
                log.warning("history retention: %s; trying again in %.0f s", exc, ROLL_EVERY_S)

    async def roll(self) -> int:
        """Add the jobs that ended more than `ROLL_AFTER_S` ago to the day sums, `BATCH` to a transaction (after
        an upgrade, the whole history once); how many."""
        done = 0
        now = self.clock()
        while (rolling := await self.store.rollable_jobs(now - ROLL_AFTER_S, BATCH)).jobs:
            days = await asyncio.to_thread(day_sums, rolling, now)
            with contextlib.suppress(Conflict):  # another scheduler on the store rolled some: read again
                done += await self.store.roll_jobs(rolling, days)
            await asyncio.sleep(PAUSE_S)
        if done:
            log.info("usage: %d ended job(s) added to the day sums", done)
        return done

    async def prune(self) -> dict[str, int]:
        """One round: the jobs ended lately rolled (`roll`), then everything past its age, `BATCH` to a
        transaction; how many of each kind went."""
        done = {"jobs": 0, "events": 0, "alerts": 0}
        await self.roll()
        now = self.clock()
        if self.settings.jobs:
            before = now - self.settings.jobs
            while (pruning := await self.store.prunable_jobs(before, BATCH)).jobs:
                gone = await self.store.prune_jobs(pruning, now)
                done["jobs"] += gone
                if not gone:
                    break
                await asyncio.sleep(PAUSE_S)
        if self.settings.events:
            before = now - self.settings.events
            while (gone := await self.store.prune_events(before, BATCH, now)) > 0:
                done["events"] += gone
                await asyncio.sleep(PAUSE_S)
            while (gone := await self.store.prune_alerts(before, BATCH, now)) > 0:
                done["alerts"] += gone
                await asyncio.sleep(PAUSE_S)
        if any(done.values()):
            log.info("history retention: pruned %s", ", ".join(f"{n} {kind}" for kind, n in done.items() if n))
        return done
