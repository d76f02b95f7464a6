"""What the scheduler reads in running jobs' logs (seeds 001 and 003): each rank's epoch, error lines, and
iteration times, from the job's `progress:` and `performance:` patterns.

The node scans output.log itself (supervisor `_scan`: only the bytes written since the last scan, at most
its last 256 KiB, the patterns given a CPU budget), in the status read the loop makes anyway, every
`SCAN_EVERY_S` per run at most and only once the log was written since (its `output_at` moved); only the
matches come back. `check` turns them into conditions and alerts:
- `job_straggler` (seed 001's last-epoch case): the ranks' latest epochs more than `progress.max_lag` apart
  for `progress.window`; resolved once they are within it again;
- `job_rank_error`: a rank's log showed an error line (`progress.errors`) and the rank still ran
  `progress.window` later: something broke that the job did not notice;
- `job_slow` (seed 003's performance detection): `performance.iterations` iterations in a row of one rank
  with end-to-end time over `performance.ratio` times the hardware time; resolved by a faster one.
State is kept in memory: after a scheduler restart the last 256 KiB of each log are scanned again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ftconsole.scheduler.decide.detect import diverged, slow
from ftconsole.scheduler.decide.jobs import Condition, Job, Run
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.detectspec import SlowAction
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.ssh.runs import RunStatus
from ftconsole.scheduler.store.db import Store

log = logging.getLogger("ftconsole.scheduler")

SCAN_EVERY_S = 10.0  # how often one run's log is scanned
PROGRESS_KEPT = 256  # the latest epochs seen per run, with when
STRAGGLER_ALERT, SLOW_ALERT, RANK_ERROR_ALERT = "job_straggler", "job_slow", "job_rank_error"
Key = tuple[int, int, int]  # (job, attempt, rank)
Attempt = tuple[int, int]  # (job, attempt)


def patterns(spec: JobSpec) -> dict[str, str]:
    """What to look for in the logs of a job with this spec: name -> regex."""
    out = {}
    if spec.progress.enabled:
        out["progress"] = spec.progress.pattern
        if spec.progress.errors:
            out["errors"] = spec.progress.errors
    if spec.performance is not None:
        out["performance"] = spec.performance.pattern
    return out


Reschedule = Callable[[Job, Sequence[Run], str | None, str], Awaitable[str]]


class LogWatch:
    def __init__(self, store: Store, *, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        # performance.action reschedule: (job, its runs, the one slow rank's node, what) -> what was done
        self.reschedule: Reschedule | None = None
        self._jobs: dict[int, Job] = {}  # the running jobs, as of the last check
        self._offset: dict[Key, int] = {}  # how far each run's log has been scanned
        self._scanned_at: dict[Key, float] = {}
        self._scanned_output: dict[Key, float | None] = {}  # the run's output_at when it was last scanned
        self._epochs: dict[Attempt, dict[int, int]] = {}  # each rank's latest epoch (rank as the log says)
        self._where: dict[Attempt, dict[int, tuple[int, str]]] = {}  # log rank -> (our rank, node) it came from
        self._apart_since: dict[Attempt, float] = {}
        self._ratios: dict[Key, deque[float]] = {}  # e2e / hardware time of each iteration, oldest first
        # (time seen, epoch) each time a run's log showed a new epoch, for the console's curves (PROGRESS_KEPT)
        self._progress: dict[Key, deque[tuple[float, int]]] = {}
        self._error: dict[Key, tuple[float, str]] = {}  # the first error line a rank logged, and when it was seen
        self._raised: set[tuple[str, int, int]] = set()  # (alert kind, job, attempt) raised and not cleared
        self._told: set[Key] = set()  # runs whose scan failed (a bad or slow pattern): said once

    def scans(self, runs: Iterable[Run]) -> dict[str, Any]:
        """The scans due in a read of these runs: run folder -> {"from": offset, "patterns": ...}."""
        now = self.clock()
        out: dict[str, Any] = {}
        for r, wanted in self._scans_due(runs, now):
            key = (r.job, r.attempt, r.rank)
            self._scanned_at[key] = now
            self._scanned_output[key] = r.output_at
            out[r.run_dir] = {"from": self._offset.get(key, 0), "patterns": wanted}
        return out

    def wants(self, runs: Iterable[Run]) -> bool:
        """A scan of one of these runs is due (a quiet node's read brings it: `Watchdog.read_every`)."""
        return any(True for _ in self._scans_due(runs, self.clock()))

    def _scans_due(self, runs: Iterable[Run], now: float) -> Iterator[tuple[Run, dict[str, str]]]:
        """The runs whose log has patterns to look for, was written since its last scan, and was not scanned in
        the last SCAN_EVERY_S; each with its patterns."""
        for r in runs:
            job = self._jobs.get(r.job)
            if job is None or r.attempt != job.attempt or not r.launch or r.state != "running" or not r.run_dir:
                continue
            wanted = patterns(job.spec)
            key = (r.job, r.attempt, r.rank)
            if not wanted or now - self._scanned_at.get(key, float("-inf")) < SCAN_EVERY_S:
                continue
            if key in self._scanned_output and self._scanned_output[key] == r.output_at:
                continue  # nothing written since its last scan
            yield r, wanted

    def observe(self, run: Run, status: RunStatus, now: float) -> None:
        scan = status.scan
        if scan is None:
            return
        key = (run.job, run.attempt, run.rank)
        if isinstance(scan.get("to"), int):
            self._offset[key] = scan["to"]
        if scan.get("error") and key not in self._told:
            self._told.add(key)
            log.warning("job %s rank %s: log scan: %s", run.job, run.rank, scan["error"])
        matches = scan.get("matches") or {}
        for m in matches.get("progress") or []:
            try:
                rank, epoch = int(m.get("rank") or run.rank), int(m["epoch"])
                self._epochs.setdefault((run.job, run.attempt), {})[rank] = epoch
                self._where.setdefault((run.job, run.attempt), {})[rank] = (run.rank, run.node)
            except (KeyError, TypeError, ValueError):
                continue
            seen = self._progress.setdefault(key, deque(maxlen=PROGRESS_KEPT))
            if not seen or seen[-1][1] != epoch:
                seen.append((now, epoch))
        errors = matches.get("errors") or []
        if errors and key not in self._error:
            self._error[key] = (now, str(errors[0].get("line", "")))
        for m in matches.get("performance") or []:
            try:
                hw, e2e = float(m["hw"]), float(m["e2e"])
            except (KeyError, TypeError, ValueError):
                continue
            if hw > 0:
                self._ratios.setdefault(key, deque(maxlen=64)).append(e2e / hw)

    def progress(self, job: int, attempt: int) -> dict[int, dict[str, list[Any]]]:
        """Each rank's epochs as its log showed them (when seen, the epoch) and its latest iteration times over
        the hardware's (`performance:`), for the running attempt."""
        out: dict[int, dict[str, list[Any]]] = {}
        for (j, a, rank), seen in self._progress.items():
            if (j, a) == (job, attempt):
                out.setdefault(rank, {})["epochs"] = [[round(t, 3), e] for t, e in seen]
        for (j, a, rank), ratios in self._ratios.items():
            if (j, a) == (job, attempt):
                out.setdefault(rank, {})["ratios"] = [round(r, 3) for r in ratios]
        return out

    async def check(self, jobs: Mapping[int, Job], current: Mapping[int, Sequence[Run]], now: float) -> None:
        """`current`: each job's launching runs of its current attempt."""
        self._jobs = dict(jobs)
        live = {(j.id, j.attempt) for j in jobs.values() if j.stop_reason is None}
        for kind, job_id, attempt in sorted(self._raised):
            if (job_id, attempt) not in live and kind != RANK_ERROR_ALERT:  # an error line stays the operator's
                async with self.store.jobs_tx(f"clear {kind} of job {job_id}") as tx:
                    await tx.resolve_job_alerts(job_id, kind, now=now, why="the attempt is over")
        self._forget(live)
        for job in jobs.values():
            if (job.id, job.attempt) not in live:
                continue
            runs = current.get(job.id, ())
            await self._stragglers(job, now)
            await self._errors(job, runs, now)
            await self._slow(job, runs, now)

    async def _stragglers(self, job: Job, now: float) -> None:
        at = (job.id, job.attempt)
        verdict = diverged(self._epochs.get(at, {}), job.spec.progress.max_lag)
        if verdict is None:
            self._apart_since.pop(at, None)
            await self._clear(STRAGGLER_ALERT, job, now, "the ranks are within max_lag again")
            return
        since = self._apart_since.setdefault(at, now)
        window = job.spec.progress.window
        if now - since >= window:
            lasted = format_duration(round(now - since))
            what = f"{verdict.describe()}, for {lasted} (progress.window {format_duration(window)})"
            behind = min(verdict.epochs, key=lambda re: (re[1], re[0]))[0]  # the rank furthest behind
            focus = self._where.get(at, {}).get(behind)
            await self._raise(STRAGGLER_ALERT, Condition.STRAGGLING, job, now, what, "warning", focus)

    async def _errors(self, job: Job, runs: Sequence[Run], now: float) -> None:
        for r in runs:
            seen = self._error.get((r.job, r.attempt, r.rank))
            if seen is None or r.state != "running" or now - seen[0] < job.spec.progress.window:
                continue
            what = (
                f"rank {r.rank} on {r.node} logged an error and still runs {format_duration(job.spec.progress.window)} "
                f"later: {seen[1]}"
            )
            await self._raise(RANK_ERROR_ALERT, "RankError", job, now, what, "error", (r.rank, r.node))
            return

    async def _slow(self, job: Job, runs: Sequence[Run], now: float) -> None:
        perf = job.spec.performance
        if perf is None:
            return
        found = []
        focus: tuple[int, str] | None = None
        for r in runs:
            verdict = slow(list(self._ratios.get((r.job, r.attempt, r.rank), ())), perf.ratio, perf.iterations)
            if verdict is not None:
                found.append(f"rank {r.rank} on {r.node}: {verdict.describe()}")
                focus = focus or (r.rank, r.node)
        if found:
            what = "slow: " + "; ".join(found)
            done = None
            if perf.action is SlowAction.RESCHEDULE and self.reschedule is not None and self._due(SLOW_ALERT, job):
                culprit = focus[1] if focus is not None and len(found) == 1 else None  # one slow rank: its node
                done = await self.reschedule(job, runs, culprit, what)
            await self._raise(SLOW_ALERT, Condition.SLOW, job, now, what + (f"; {done}" if done else ""), "warning",
                              focus)  # fmt: skip
        elif any(self._ratios.get((r.job, r.attempt, r.rank)) for r in runs):
            await self._clear(SLOW_ALERT, job, now, "an iteration within the ratio again")

    def _due(self, kind: str, job: Job) -> bool:
        """Whether `kind` is yet to be raised for the job's attempt."""
        return (kind, job.id, job.attempt) not in self._raised

    async def _raise(
        self, kind: str, event: str, job: Job, now: float, what: str, severity: str, focus: tuple[int, str] | None
    ) -> None:
        """The condition (its data: the attempt, and the rank and node that stand out, where one does) and
        the alert, once per attempt."""
        mark = (kind, job.id, job.attempt)
        if mark in self._raised:
            return
        self._raised.add(mark)
        data: dict[str, Any] = {"attempt": job.attempt, "alert": kind}
        if focus is not None:
            data.update(rank=focus[0], node=focus[1])
        async with self.store.jobs_tx(f"raise {kind} for job {job.id}") as tx:
            await tx.event(now, event, f"attempt {job.attempt} {what}", job=job.id, node=data.get("node"), data=data)
            text = f"job {job.id} ({job.name}, {job.owner}): {what}"
            await tx.alert(now, kind, severity, text, job=job.id, once=True)
        log.warning("job %s: %s", job.id, what)

    async def _clear(self, kind: str, job: Job, now: float, why: str) -> None:
        mark = (kind, job.id, job.attempt)
        if mark not in self._raised:
            return
        self._raised.discard(mark)
        async with self.store.jobs_tx(f"clear {kind} of job {job.id}") as tx:
            await tx.resolve_job_alerts(job.id, kind, now=now, why=why)

    def _forget(self, live: set[Attempt]) -> None:
        tables = (self._offset, self._scanned_at, self._scanned_output, self._ratios, self._error, self._progress)
        for table in tables:
            for key in [k for k in table if (k[0], k[1]) not in live]:
                del table[key]
        for at in [a for a in self._epochs if a not in live]:
            del self._epochs[at]
            self._where.pop(at, None)
        for at in [a for a in self._apart_since if a not in live]:
            del self._apart_since[at]
        self._raised = {m for m in self._raised if (m[1], m[2]) in live}
        self._told = {k for k in self._told if (k[0], k[1]) in live}
