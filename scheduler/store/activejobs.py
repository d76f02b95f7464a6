"""The active jobs (queued and running, deleted ones too), kept up to date by reading only the jobs written since
the last read: with a deep queue (80,000 queued tasks), every write to a job made the next placement pass read the
whole queue again (0.7 s in the store's one thread, every other request waiting behind it); now a stop of 1,000 of
them makes it read those 1,000.

Every write of this process to a job stamps its `updated` (`JobTx`; the stamps only grow, `Store._next_stamp`), so
the jobs written since a read are those stamped at or after the stamp then, or after the stamp of a transaction
still open then (its rows may not all be written yet). A write of another process, or a transaction rolled back,
makes the store forget every kept read (`Store.forget`): the next read is a whole one again.

Part of `Store` (db.py), as `HistoryStore` is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.store.engine import ANY_TABLE, Engine

ACTIVE = frozenset(s for s in JobStatus if s.active)
_ACTIVE_SQL = ",".join(f"'{s.value}'" for s in sorted(ACTIVE))


class ActiveJobs:
    """Part of `Store` (db.py): the active jobs, read incrementally."""

    _db: Engine
    _stamp: float
    _generation: int
    _wrote_at: dict[str, int]

    def _job_from_row(self, row: Any) -> Job:
        raise NotImplementedError  # Store's

    def _init_active(self) -> None:
        self._open_stamps: list[float] = []  # the stamps of the jobs transactions open now
        self._active: dict[int, Job] = {}
        self._active_list: list[Job] = []
        self._active_views: dict[tuple[frozenset[JobStatus], bool], list[Job]] = {}  # of _active_list, by status
        self._requeued_view: tuple[list[Job], list[Job]] | None = None  # (of which _active_list, its requeued jobs)
        self._active_cursor: float | None = None  # read the jobs stamped at or after this next; None: read all
        self._active_at = -1  # the generation when it was last read
        self._active_whole_at = -1  # ... and when it was last read whole
        # the read under way: done when it ends, and the transaction it is part of (None: none)
        self._active_reading: tuple[asyncio.Future[None], object | None] | None = None

    @contextlib.contextmanager
    def _open_stamp(self, stamp: float) -> Iterator[None]:
        """While a jobs transaction with this stamp is open (its rows may be written after a read began)."""
        self._open_stamps.append(stamp)
        try:
            yield
        finally:
            self._open_stamps.remove(stamp)

    async def active_jobs(self, statuses: frozenset[JobStatus] = ACTIVE, *, deleted: bool = True) -> list[Job]:
        """The queued and running jobs of `statuses` (deleted ones too, unless not `deleted`), by id: a list kept
        while no job changes (a tick asks for them many times), not to be changed."""
        jobs = await self._all_active()
        key = (statuses, deleted)
        view = self._active_views.get(key) if jobs is self._active_list else None
        if view is None:
            view = await asyncio.to_thread(_view, jobs, statuses, deleted)  # 100,000 jobs: off the loop
            if jobs is self._active_list:
                self._active_views[key] = view
        return view

    def _merged(self, rows: list[Any], found: dict[int, Job] | None) -> tuple[dict[int, Job], list[Job]]:
        """The active jobs by id, `rows` read into `found` (None: they are all of them), and in id order."""
        if found is None:
            found = {int(r["id"]): self._job_from_row(r) for r in rows}
        else:
            for r in rows:
                job = self._job_from_row(r)
                if job.status in ACTIVE:
                    found[job.id] = job
                else:
                    found.pop(job.id, None)
        return found, sorted(found.values(), key=lambda j: j.id)

    async def requeued_jobs(self) -> list[Job]:
        """The queued jobs queued again after a fault (`scheduler.queue_timeout` watches them), kept as the other
        views are: a tick asks for them, and most of a deep queue never was requeued."""
        jobs = await self._all_active()
        kept = self._requeued_view
        if kept is None or kept[0] is not jobs:
            kept = self._requeued_view = (jobs, [j for j in jobs if j.status is JobStatus.QUEUED and j.requeued])
        return kept[1]

    async def _all_active(self) -> list[Job]:
        """The active jobs, read again where a job was written since: by one caller at a time, the others taking
        what it read where no job was written meanwhile (once the wait notes of 80,000 new tasks were written,
        the placement pass and a request read all 80,000 rows at once, 3 s each)."""
        turns = self._db.turns
        written = self._wrote_at.get
        while True:
            # what was read inside a transaction under way may not be committed yet: asked again after each wait
            await turns.outside()
            if self._active_at >= 0 and max(written(ANY_TABLE, 0), written("jobs", 0)) <= self._active_at:
                return self._active_list
            reading = self._active_reading
            if reading is None or reading[1] is not turns.whose():  # a transaction reads for itself
                break
            await asyncio.shield(reading[0])
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._active_reading = (done, turns.whose())
        try:
            return await self._read_active()
        finally:
            done.set_result(None)
            if self._active_reading is not None and self._active_reading[0] is done:
                self._active_reading = None

    async def _read_active(self) -> list[Job]:
        written = self._wrote_at.get
        self._active_views.clear()
        generation = self._generation
        whole = self._active_cursor is None or written(ANY_TABLE, 0) > self._active_whole_at
        self._stamp = max(self._stamp, time.time())  # every later stamp is above it
        cursor = min([self._stamp, *self._open_stamps])
        if whole:
            rows = await self._db.fetchall(f"SELECT * FROM jobs WHERE status IN ({_ACTIVE_SQL})")
        else:
            rows = await self._db.fetchall("SELECT * FROM jobs WHERE updated >= ?", (self._active_cursor,))
        # the jobs built from their rows and put in order in a worker thread (a submit of 10,000 tasks: 10,000 rows,
        # and the queue's 100,000 in order): the requests that come meanwhile are answered between its turns
        found, listed = await asyncio.to_thread(self._merged, rows, None if whole else dict(self._active))
        self._active, self._active_cursor = found, cursor
        self._active_list = listed
        self._active_views.clear()
        self._active_at = generation if written(ANY_TABLE, 0) <= generation else -1
        if whole:
            self._active_whole_at = generation
        return self._active_list


def _view(jobs: list[Job], statuses: frozenset[JobStatus], deleted: bool) -> list[Job]:
    """The jobs of `statuses`, the deleted ones too where `deleted`."""
    return [j for j in jobs if j.status in statuses and (deleted or not j.deleted)]
