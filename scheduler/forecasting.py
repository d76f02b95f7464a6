"""The queue's expected starts as the scheduler's passes would make them (decide/forecast.py), from the same
inputs as a pass: the queue in its order, the dependencies, quotas and array limits, the queue depth, the
reservations, the nodes as last probed and what holds their GPUs. `jobs --start` and the console's timeline.

The walk forward runs in a worker thread, so requests go on being answered meanwhile; its answer is kept for
`FRESH_S`, then until the jobs change or `KEEP_S` pass, and two askers at once wait for one walk. It is a read:
it folds no usage and keeps no note of the pass's (a standby answers it too).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ftconsole.scheduler.decide import forecast as forecasting
from ftconsole.scheduler.decide import queuedepth
from ftconsole.scheduler.decide.jobs import JobStatus
from ftconsole.scheduler.spec import begin

if TYPE_CHECKING:
    from ftconsole.scheduler.jobops import Scheduler

KEEP_S = 15.0  # an answer is kept this long, or until the jobs change,
FRESH_S = 5.0  # and this long whatever changes: each walk is a fraction of a second of the machine's
LISTED = 1_000  # the most queued jobs with no expected start listed, with why; the rest are counted
UNLISTED = "past the queue depth, or held back by a quota or an array's limit: each job's message says which"


class Forecaster:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._lock = asyncio.Lock()
        self._kept: tuple[int, float, dict[str, Any]] | None = None  # (jobs version, when, answer)

    async def starts(self) -> dict[str, Any]:
        """{"now", "until", "complete", "queued": [{"id", "start", "end", "nodes", "message"}] in queue order (the
        planned ones first, then those that wait for something else with their reason), "beyond": {"count",
        "message", "ids"} (the jobs past the queue depth, and those past LISTED), "running": [{"id", "end"}],
        "nodes": {node: its pool}}: every job, private ones too (`PictureOps.forecast` leaves out what a caller may
        not see, and the unlisted ids, which it counts)."""
        s = self.scheduler
        async with self._lock:
            version = s.store.version(("jobs",))
            kept = self._kept
            if kept is not None and s.clock() - kept[1] < (KEEP_S if kept[0] == version else FRESH_S):
                return kept[2]
            answer = await self._walk()
            self._kept = (version, answer["now"], answer)
            return answer

    async def _walk(self) -> dict[str, Any]:
        s = self.scheduler
        placer = s.loop.placer
        version = s.store.version(("jobs",))  # before the read, as a pass's: what it keeps of the queue is shared
        queued = await s.store.jobs(statuses=[JobStatus.QUEUED])
        running = await s.store.jobs(statuses=[JobStatus.RUNNING])
        now = s.clock()
        ready, waiting, never = await placer.by_dependencies(queued, (version, len(queued)))
        # as a pass counts them (Placer.place), without its write (a standby answers this too)
        taken = await placer.take(ready, (version, len(queued), len(ready)), fold=False)
        # those that wait only for their begin: time join the forecast then: the first to come, as many as a pass
        # plans (`scheduler.queue_depth`), so that an array of 10,000 tasks with a begin: costs what 500 jobs do
        times = {job.id: begin.begin_at(job.spec.begin, job.submitted) for job, _ in waiting
                 if job.spec.begin is not None and job.spec.after is None and job.held_by is None}  # fmt: skip
        coming = dict(sorted(times.items(), key=lambda item: (item[1], item[0]))[: s.settings.queue_depth])
        waiting = [(job, why) for job, why in waiting if job.id not in coming]
        state, requests, by_id, unplaceable = await placer.placement_inputs(
            [*taken.taken, *(job for job in queued if job.id in coming)]
        )
        found = await asyncio.to_thread(
            forecasting.forecast, state, requests, now,
            urgent_cap=s.settings.urgent_cap, allow_degraded=placer.degraded_ok,
            arrivals={str(i): t for i, t in coming.items()},
        )  # fmt: skip
        planned = [
            {"id": by_id[e.job_id][0].id, **e.to_json(), "message": e.reason or by_id[e.job_id][0].message}
            for e in found.jobs
        ]
        # those that wait for something else, with why: at most LISTED (a quota may hold back arrays of 10,000)
        other = [*waiting, *never, *unplaceable, *taken.held]
        rest: list[dict[str, Any]] = [
            {"id": job.id, "start": None, "end": None, "nodes": [], "message": why or job.message}
            for job, why in other[:LISTED]
        ]
        unlisted = [job.id for job in taken.beyond] + [job.id for job, _ in other[LISTED:]]
        later = queuedepth.beyond(s.settings.queue_depth) if len(other) <= LISTED else UNLISTED
        beyond = {"count": len(unlisted), "message": later, "ids": unlisted}
        return {
            "now": now,
            "until": found.until,
            "complete": found.complete,
            "queued": planned + rest,
            # past the queue depth (no pass looks at them, so neither does the forecast) or LISTED: counted
            "beyond": beyond,
            "running": [{"id": job.id, "end": job.deadline} for job in running],
            "nodes": {node.name: node.pool for node in s.service.all_nodes},  # what the timeline groups by
        }
