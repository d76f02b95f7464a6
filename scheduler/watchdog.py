"""Watching running jobs for seed 001's hang: the loop hands over each read of run status (`observe`), and on
each tick `check` runs the detectors of `scheduler.decide.detect` over every running job and writes what changed:
a `SuspectedHung` condition and a `job_hung` alert when a job goes quiet for its hang window, the alert
resolved (with an event) once its I/O moves again or the attempt is over.

When each rank's I/O counters last changed is kept in memory: after a scheduler restart the window starts
again from the first read (a late alert rather than a false one). The GPU utilisation samples are the
probes' (`ClusterService.gpu_samples`, which survive a restart through the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ftconsole.scheduler.decide.detect import Hung, hung
from ftconsole.scheduler.decide.jobs import Condition, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.reconcile import HUNG_PREFIX, MAX_HANG_RESTARTS, hang_restarts
from ftconsole.scheduler.evidence import record
from ftconsole.scheduler.executor import QUIET_READ_S
from ftconsole.scheduler.logwatch import SCAN_EVERY_S, LogWatch
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.detectspec import HangAction
from ftconsole.scheduler.ssh.runs import RunStatus

log = logging.getLogger("ftconsole.scheduler")

HUNG_ALERT = "job_hung"
HANG_SAMPLES = 4  # I/O samples at least per hang window (a quiet node's reads: `read_every`)
EVIDENCE_TIMEOUT_S = 20.0  # a hang's evidence not gathered by then: the job is flagged without it
Gather = Callable[[Job, Sequence[Run]], Awaitable[Any]]  # -> scheduler.evidence.Evidence


def same_records(now: Sequence[Any], then: Sequence[Any]) -> bool:
    """The same records, one by one (the store gives the records it kept while nobody wrote)."""
    return len(now) == len(then) and all(a is b for a, b in zip(now, then, strict=True))


def current_runs(jobs: Mapping[int, Job], held: Sequence[Run]) -> dict[int, list[Run]]:
    """Each job's launching runs of its current attempt, in one pass over the runs (not one per job)."""
    out: dict[int, list[Run]] = {}
    for r in held:
        job = jobs.get(r.job)
        if job is not None and r.attempt == job.attempt and r.launch:
            out.setdefault(r.job, []).append(r)
    return out


Key = tuple[int, int, int]  # (job, attempt, rank)


class Watchdog:
    def __init__(self, service: ClusterService, *, clock: Callable[[], float]) -> None:
        self.service = service
        self.store = service.store
        self.clock = clock
        self._io: dict[Key, tuple[int, float]] = {}  # a rank's I/O counters, and since when they read so
        self._moved: set[Key] = set()  # ranks whose counters changed between two reads of this process
        self._flagged: dict[tuple[int, int], float] = {}  # (job, attempt) suspected hung -> its quiet since
        self._seeded = False
        self._windows: dict[int, float] = {}  # running job -> its hang window, as of the last check
        # the running jobs and held runs as the store gave them at the last check (the same records while nobody
        # wrote), by id and each job's current launching runs
        self._listing: list[Job] = []
        self._held: list[Run] = []
        self._jobs: dict[int, Job] = {}
        self._current: dict[int, list[Run]] = {}
        self._due = float("-inf")  # the first time a job may be quiet for its window, as of the last pass
        self.logs = LogWatch(service.store, clock=clock)  # stragglers, error lines, slow iterations
        # a suspected hang's evidence (`scheduler.evidence.gather`), gathered before the job is flagged so that
        # the alert names the rank that stands out; `poke` wakes the loop once it is in
        self.gather: Gather | None = None
        self.poke: Callable[[], None] = lambda: None
        self._gathering: dict[tuple[int, int], asyncio.Task[Any]] = {}

    def observe(self, observed: Mapping[str, Sequence[tuple[Run, RunStatus]]], now: float) -> None:
        """A read of run status: any change of a rank's I/O counters starts a new quiet period."""
        for pairs in observed.values():
            for run, status in pairs:
                self.logs.observe(run, status, now)
                key = (run.job, run.attempt, run.rank)
                if status.io is None:
                    if self._io.pop(key, None) is not None:  # not readable (or not running): nothing known
                        self._due = now
                    continue
                last = self._io.get(key)
                if last is None or last[0] != status.io:
                    self._io[key] = (status.io, now)
                    self._due = now  # a quiet period starts (or the first): the next check judges afresh
                    if last is not None:
                        self._moved.add(key)

    def read_every(self, runs: Sequence[Run]) -> float:
        """How often the node of these runs is read when its channel says nothing changed: the I/O samples and
        the log scans come with reads, so a job whose hang window is short is read every quarter of it, a log
        written since its last scan within `SCAN_EVERY_S`; the others every `QUIET_READ_S` (and at each tick
        where no channel watches them)."""
        windows = [self._windows[r.job] / HANG_SAMPLES for r in runs if r.job in self._windows]
        scans = [SCAN_EVERY_S] if self.logs.wants(runs) else []
        return min([QUIET_READ_S, *windows, *scans])

    def quiet_since(self, runs: Sequence[Run]) -> float | None:
        """When the I/O of these ranks last changed (the latest of them); None when one was not read."""
        since = [self._io.get((r.job, r.attempt, r.rank)) for r in runs]
        if not since or any(s is None for s in since):
            return None
        return max(s[1] for s in since if s is not None)

    async def check(self) -> None:
        now = self.clock()
        listing = await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
        held = await self.store.runs(held=True)
        if not self._seeded:  # alerts raised before a restart: cleared like ours once their job's I/O moves
            self._seeded = True
            running = {j.id: j for j in listing}
            for alert in await self.store.alerts(limit=10_000):
                job = running.get(alert.job) if alert.kind == HUNG_ALERT and alert.job is not None else None
                if job is not None:
                    self._flagged[(job.id, job.attempt)] = float("-inf")
        if not (same_records(listing, self._listing) and same_records(held, self._held)):  # written since
            self._listing, self._held = listing, held
            self._jobs = {j.id: j for j in listing}
            live = {(r.job, r.attempt, r.rank) for r in held}
            self._current = current_runs(self._jobs, held)
            for key in [k for k in self._io if k not in live]:
                del self._io[key]
                self._moved.discard(key)
            self._windows = {j.id: w for j in listing if (w := j.spec.hang_window) is not None}
            self._due = now  # judged afresh
        # nothing read or written since the last pass, and no job quiet for its window by now: the pass would find
        # what it found then (each job's verdict depends on its I/O, the clock and, once due, its GPUs)
        if self._flagged or self._gathering or now >= self._due:
            await self._judge(now)
        await self.logs.check(self._jobs, self._current, now)

    async def _judge(self, now: float) -> None:
        """Flag the jobs quiet for their hang window (with their evidence), clear those that moved again; and
        when the next job may be due (`_due`)."""
        jobs, current = self._jobs, self._current
        self._due = float("inf")
        samples = await self.service.gpu_samples()
        for job_id, attempt in list(self._flagged):
            job = jobs.get(job_id)
            if job is None or job.attempt != attempt or job.stop_reason is not None:
                await self._clear(job_id, attempt, now, "the attempt is over")
        for over in [k for k in self._gathering if jobs.get(k[0]) is None or jobs[k[0]].attempt != k[1]]:
            self._gathering.pop(over).cancel()
        for job in jobs.values():
            window = self._windows.get(job.id)
            if window is None or job.stop_reason is not None:
                continue
            runs = current.get(job.id, [])
            if not runs or any(r.state != "running" for r in runs):
                continue  # a run read running again is a write: judged afresh then
            quiet = self.quiet_since(runs)
            flagged = self._flagged.get((job.id, job.attempt))
            if (
                flagged is None
                and (quiet is None or now - quiet < window)
                and (job.id, job.attempt) not in self._gathering
            ):
                if quiet is not None:  # not quiet for its window: not hung (detect.hung) until then
                    self._due = min(self._due, quiet + window)
                continue  # (not read yet: its first read is an observation, which brings the next pass)
            self._due = now  # quiet for its window: judged at every pass (its GPUs' samples move)
            util = {f"{r.node}:{g}": samples.get(f"{r.node}:{g}", ()) for r in runs for g in r.gpus}
            verdict = hung(quiet, util, now, window)
            if verdict is None:
                gathering = self._gathering.pop((job.id, job.attempt), None)
                if gathering is not None:
                    gathering.cancel()  # it moved again while its evidence was gathered
            if verdict is not None and flagged is None:
                found = self._evidence(job, runs)
                if found is not None:
                    await self._flag(job, runs, verdict, window, now, *found)
            elif (
                verdict is None
                and flagged is not None
                and quiet is not None
                and quiet > flagged
                and self._stirred(runs)
            ):
                await self._clear(job.id, job.attempt, now, f"I/O resumed at {_clock(quiet)}")

    def _evidence(self, job: Job, runs: Sequence[Run]) -> tuple[Any, str] | None:
        """(the evidence or None, why none) to flag the job with now; None: gathering, flag it later."""
        if self.gather is None:
            return None, ""
        key = (job.id, job.attempt)
        task = self._gathering.get(key)
        if task is None:
            task = asyncio.create_task(asyncio.wait_for(self.gather(job, runs), EVIDENCE_TIMEOUT_S))
            task.add_done_callback(lambda _: self.poke())
            self._gathering[key] = task
            return None
        if not task.done():
            return None
        del self._gathering[key]
        if task.cancelled():
            return None, "its gathering was cancelled"
        exc = task.exception()
        if exc is not None:
            why = f"not gathered within {EVIDENCE_TIMEOUT_S:g}s" if isinstance(exc, TimeoutError) else str(exc)
            log.warning("job %s: no hang evidence: %s", job.id, why)
            return None, why
        return task.result(), ""

    async def close(self) -> None:
        tasks = list(self._gathering.values())
        self._gathering.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def _stirred(self, runs: Sequence[Run]) -> bool:
        """A rank's I/O changed between two reads (not merely read for the first time)."""
        return any((r.job, r.attempt, r.rank) in self._moved for r in runs)

    async def _flag(
        self, job: Job, runs: Sequence[Run], verdict: Hung, window: float, now: float, found: Any, why_none: str
    ) -> None:
        """Flag the job hung, with the rank that stands out when its evidence (`found`) names one."""
        outputs = [r.output_at for r in runs if r.output_at is not None]
        # output.log's mtime: the last line, or the start of a job that never printed
        last = f"; output.log last written {format_duration(round(now - max(outputs)))} ago" if outputs else ""
        what = f"{HUNG_PREFIX}: {verdict.describe(window)} (quiet since {_clock(verdict.io_since)}){last}"
        hint = "if it waits on purpose, set hang_detect: off or a longer window in its spec"
        restart = job.spec.hang_action is HangAction.RESTART
        if restart and hang_restarts(await self.store.attempts(job.id)) >= MAX_HANG_RESTARTS:
            restart = False
            hint = f"not restarted: {MAX_HANG_RESTARTS} hang restarts in a row already; {hint}"
        action = "; stopping it to restart (hang_action restart)" if restart else ""
        first = min(runs, key=lambda r: r.rank)  # no rank stands out: the shell opens on rank 0's node
        standout = ""  # the verdict of the evidence, for the alert
        if found is not None:
            named = found.verdict
            standout = f"; {named.reason} (evidence: ftconsole debug {job.id})"
            first = next((r for r in sorted(runs, key=lambda r: r.rank) if r.node == named.node), first)
        elif why_none:
            standout = f"; no evidence: {why_none}"
        named = found.verdict if found is not None else None
        if restart and named is not None and named.hardware and named.node:  # before the stop: never back there
            why = f"job {job.id}: its hang's evidence points to the node's hardware: {named.reason}"
            await self.service.isolate([named.node], reason=why, by="scheduler")
            action += f"; {named.node} isolated: the evidence points to its hardware"
        async with self.store.jobs_tx(f"flag job {job.id} hung") as tx:
            data: dict[str, Any] = {"attempt": job.attempt, "alert": HUNG_ALERT, "rank": first.rank, "node": first.node}
            if found is not None:
                data["verdict"] = found.to_json()["verdict"]
                await record(tx, job.id, {**found.to_json(), "suspected_hung": True})
            await tx.event(now, Condition.SUSPECTED_HUNG, f"attempt {job.attempt} {what}{standout}{action}",
                           job=job.id, node=first.node, data=data)  # fmt: skip
            await tx.alert(now, HUNG_ALERT, "warning",
                           f"job {job.id} ({job.name}, {job.owner}) {what}{standout}; {hint}", job=job.id,
                           once=True)  # fmt: skip
            if restart:
                await tx.update_job(job.id, expect=[JobStatus.RUNNING], stop_requested=now, stop_reason=StopReason.HUNG,
                                    stop_by="scheduler", message=what)  # fmt: skip
                await tx.event(now, Condition.STOPPING, f"{what}; stopping the ranks", job=job.id)
        self._flagged[(job.id, job.attempt)] = verdict.io_since
        log.warning("job %s: %s", job.id, what)

    async def _clear(self, job_id: int, attempt: int, now: float, why: str) -> None:
        async with self.store.jobs_tx(f"clear the hang of job {job_id}") as tx:
            await tx.resolve_job_alerts(job_id, HUNG_ALERT, now=now, why=why)
            await tx.event(now, Condition.SUSPECTED_HUNG, f"attempt {attempt} no longer suspected hung: {why}",
                           job=job_id)  # fmt: skip
        del self._flagged[(job_id, attempt)]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
