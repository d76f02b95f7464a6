"""The checkpoint signal (seed 002's checkpoint_resume, and a failed attempt's `dump`): a job stopped with it
owes it to each rank that can take one, until the rank has it, ends, or its grace period is over. What is owed
is written first (schema: checkpoint_signals), so a scheduler that crashes between deciding and sending sends it
after its restart; each try's outcome is written with one Checkpoint event per job.

`checkpoints_due` decides (pure); `CheckpointSignals` carries it out each tick through the executor's `send`
(one signal to one rank's node, as the job's user).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.reconcile import dumps
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import CheckpointSignal

log = logging.getLogger("ftconsole.scheduler")

SIGNAL_RETRY_S = 1.0  # an owed checkpoint signal that did not get through is sent again this long after


class CheckpointSignals:
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float],
        send: Callable[[Job, CheckpointSignal, Run], Awaitable[str | None]],
    ) -> None:
        self.store = store
        self.clock = clock
        self._send = send  # one owed signal to its rank: None when its node says the rank got it, else why not
        self._tried: dict[tuple[int, int, int], float] = {}  # owed checkpoint signal -> its last try

    async def carry_out(self) -> None:
        """Send the checkpoint signals owed (`CheckpointSignal`), each to its rank's node as the job's user, and
        write each outcome; owe the signal first to the ranks a stop decision owes it to that have no row yet (a
        failed attempt's `dump`, decided in the loop's own transaction; or a crash before the row was written).
        One that does not get through is sent again `SIGNAL_RETRY_S` later, until it does, the run ends or its
        grace period is over (see `checkpoints_due`)."""
        now = self.clock()
        jobs = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)}
        due = checkpoints_due(jobs, await self.store.runs(held=True), await self.store.checkpoint_signals(), now)
        if due.owe or due.close:
            async with self.store.jobs_tx("record the checkpoint signals owed") as tx:
                for runs, signal, deadline in due.owe:
                    await tx.owe_checkpoint(runs, signal, now=now, deadline=deadline)
                for owed, outcome in due.close:
                    await tx.close_checkpoint(owed, outcome, now=now)
                    if outcome == "late":
                        why = f": {owed.error}" if owed.error else ""
                        text = f"{owed.signal} did not reach rank {owed.rank} within its grace period ({owed.tries} "
                        await tx.event(now, "Checkpoint", f"{text}tries{why}); stopping it", job=owed.job)
        owed_now = {o.key for o, _ in due.send}
        self._tried = {k: t for k, t in self._tried.items() if k in owed_now}
        last = self._tried
        sending = [(o, r) for o, r in due.send if now - last.get(o.key, -SIGNAL_RETRY_S) >= SIGNAL_RETRY_S]
        if not sending:
            return
        await afailpoint("checkpoint.before_signal")
        for owed, _ in sending:
            last[owed.key] = now
        tried = await asyncio.gather(*(self._send(jobs[o.job], o, r) for o, r in sending))
        await self._record(sending, tried)

    async def _record(self, sent: Sequence[tuple[CheckpointSignal, Run]], tried: Sequence[str | None]) -> None:
        """Each try's outcome, with one Checkpoint event per job: the first try of its ranks (as many as got it),
        and each later one that got through."""
        now = self.clock()
        by_job: dict[int, list[tuple[CheckpointSignal, Run, str | None]]] = defaultdict(list)
        for (owed, run), error in zip(sent, tried, strict=True):
            by_job[owed.job].append((owed, run, error))
        async with self.store.jobs_tx("record checkpoint signals sent") as tx:
            for job_id, outcomes in by_job.items():
                for owed, _, error in outcomes:
                    await tx.checkpoint_tried(owed, now=now, signalled=error is None, error=error)
                first = [(o, r, e) for o, r, e in outcomes if o.tries == 0]
                if first:
                    got = sum(1 for _, _, e in first if e is None)
                    text = f"{first[0][0].signal} sent to {got} of {len(first)} rank(s)"
                    failed = [f"rank {o.rank} on {r.node}: {e}" for o, r, e in first if e is not None]
                    if failed:
                        text += f"; not yet to {'; '.join(failed)} (sent again until its grace period is over)"
                    await tx.event(now, "Checkpoint", text, job=job_id)
                for owed, run, _ in (x for x in outcomes if x[0].tries and x[2] is None):
                    text = f"{owed.signal} sent to rank {owed.rank} on {run.node} (try {owed.tries + 1})"
                    await tx.event(now, "Checkpoint", text, job=job_id)
        for (owed, run), error in zip(sent, tried, strict=True):
            if error is not None:
                log.warning("job %s: %s to rank %s on %s: %s", owed.job, owed.signal, owed.rank, run.node, error)


@dataclasses.dataclass(frozen=True)
class CheckpointsDue:
    owe: list[tuple[list[Run], str, float]]  # runs owed the signal with no row yet: (runs, signal, deadline)
    close: list[tuple[CheckpointSignal, str]]  # owed ones no longer owed: (row, "ended" | "late")
    send: list[tuple[CheckpointSignal, Run]]  # to send now (those of `owe` too)


def checkpoints_due(
    jobs: dict[int, Job], held: Sequence[Run], owed: Sequence[CheckpointSignal], now: float
) -> CheckpointsDue:
    """What to do about checkpoint signals (pure). A running job stopped with the checkpoint signal first
    (`reconcile.dumps`: rescheduled with checkpoint_resume, or a failed attempt's ranks left running with `dump`)
    owes it, until the end of its grace period, to each rank of its current attempt that can take one (launched,
    starting or running, no stop sent yet); a row owed whose rank has ended (or been stopped) is closed `ended`,
    one whose grace period is over `late`; the others are sent."""
    known = {o.key for o in owed}
    runs = {(r.job, r.attempt, r.rank): r for r in held}
    out = CheckpointsDue([], [], [])
    for job in jobs.values():
        resume = job.spec.fault_tolerance.checkpoint_resume
        if job.stop_requested is None or resume is None or not dumps(job):
            continue
        deadline = job.stop_requested + resume.grace_period
        missing = [r for r in held if r.job == job.id and r.attempt == job.attempt and _signalable(r)
                   and (r.job, r.attempt, r.rank) not in known]  # fmt: skip
        if missing and now < deadline:
            out.owe.append((missing, resume.signal, deadline))
            out.send.extend(
                (CheckpointSignal(r.job, r.attempt, r.rank, resume.signal, now, deadline), r) for r in missing
            )
    for o in owed:
        run = runs.get(o.key)
        if run is None or o.job not in jobs or not _signalable(run):
            out.close.append((o, "ended"))
        elif now >= o.deadline:
            out.close.append((o, "late"))
        else:
            out.send.append((o, run))
    return out


def _signalable(run: Run) -> bool:
    """A rank that can take the checkpoint signal: started by ftconsole, not ended, not being stopped."""
    return run.launch and run.active and run.state in ("starting", "running") and run.stop_sent is None
