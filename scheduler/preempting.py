"""Carrying out what `decide/preemption.py` chooses, in the placement pass: each job preempted is stopped as
a reschedule is (StopReason.PREEMPTED), all in one transaction with its events: the checkpoint signal owed to
its ranks when it has `checkpoint_resume` (the executor sends it, after a crash too), the Stopping event on it,
a Preempting event on the job it makes room for. Once its ranks are down, recovery queues it again at the
front, with attempt result `preempted` (no retry spent: `reconcile.recover`). The waiting job starts through
placement, as any job does, once their GPUs are free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from ftconsole.scheduler.decide import preemption
from ftconsole.scheduler.decide.jobs import Condition, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.placement import ClusterState, Decision, JobRequest, Priority
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.values import format_duration
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")


class Preempter:
    def __init__(self, store: Store, config: ClusterConfig, *, clock: Callable[[], float], poke: Callable[[], None]):
        self.store = store
        self.config = config
        self.clock = clock
        self._poke = poke

    async def preempt(
        self,
        state: ClusterState,
        queue: Sequence[JobRequest],
        decisions: Sequence[Decision],
        allow_degraded: Collection[str],
    ) -> dict[str, str]:
        """Stop the jobs that the waiting jobs of this pass preempt; for each such waiting job, what it waits
        for ("preempting job 7 (normal, 4 GPUs)"). Nothing is read when no running job is preemptible."""
        jobs = {
            j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True) if j.spec.preemptible
        }
        if not jobs:
            return {}
        now = self.clock()
        held = await self.store.runs(held=True)
        running = await self._running(jobs, held)
        min_runtime = self.config.scheduler.preempt_min_runtime
        chosen = preemption.choose(
            state, queue, decisions, running, now, min_runtime=min_runtime, allow_degraded=allow_degraded
        )
        priority = {r.id: r.priority for r in queue}
        notes = {}
        for p in chosen:
            for victim in p.new:
                job = jobs[int(victim)]
                runs = [r for r in held if r.job == job.id and r.attempt == job.attempt]
                await self._stop(job, runs, running[victim], p.job_id, priority[p.job_id], now)
            shown = [f"job {v} ({jobs[int(v)].priority}, {running[v].gpus} GPUs)" for v in p.victims]
            notes[p.job_id] = "preempting " + ", ".join(shown)
        return notes

    async def _running(self, jobs: dict[int, Job], held: Sequence[Run]) -> dict[str, preemption.Running]:
        attempts = await self.store.running_attempts()
        out = {}
        for job in jobs.values():
            attempt = attempts.get(job.id)
            if attempt is None or job.stop_reason not in (None, StopReason.PREEMPTED):
                continue  # being stopped for another reason: not counted either way
            resume = job.spec.fault_tolerance.checkpoint_resume
            out[str(job.id)] = preemption.Running(
                job_id=str(job.id),
                priority=Priority.parse(job.priority),
                gpus=sum(len(r.gpus) for r in held if r.job == job.id),
                started=attempt.started if attempt.started is not None else attempt.created,
                preemptible=True,
                grace=resume.grace_period if resume is not None else None,
                stopping=job.stop_reason is StopReason.PREEMPTED,
            )
        return out

    async def _stop(
        self, job: Job, runs: Sequence[Run], victim: preemption.Running, by: str, level: Priority, now: float
    ) -> None:
        resume = job.spec.fault_tolerance.checkpoint_resume
        cause = f"preempted by job {by} ({level.label})"
        if resume is not None:
            how = (
                f"{resume.signal} to every rank to save a checkpoint, stopped after grace_period "
                f"{format_duration(resume.grace_period)}"
            )
        else:
            how = f"stopped (SIGTERM, SIGKILL after {format_duration(self.config.scheduler.stop_grace)})"
        lost = victim.lost(now) / 3600
        text = f"{cause}: {how}, then queued again at the front ({lost:.2f} GPU-hours lost; no retry spent)"
        try:
            async with self.store.jobs_tx(f"preempt job {job.id} for job {by}") as tx:
                if resume is not None:
                    launched = [r for r in runs if r.launch and r.active and r.state in ("starting", "running")]
                    await tx.owe_checkpoint(launched, resume.signal, now=now, deadline=now + resume.grace_period)
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    unstopped=True,  # a user's stop, or any other, asked meanwhile wins
                    stop_requested=now,
                    stop_reason=StopReason.PREEMPTED,
                    stop_by="scheduler",
                    message=cause,
                )
                data = {"attempt": job.attempt, "preempted_by": int(by), "lost_gpu_s": round(victim.lost(now))}
                await tx.event(now, Condition.STOPPING, text, job=job.id, data=data)
                what = f"preempting job {job.id} ({job.owner}, project {job.project}, {victim.gpus} GPUs)"
                await tx.event(now, "Preempting", f"{what} to start: {lost:.2f} GPU-hours lost", job=int(by))
        except Conflict:
            return
        log.warning("job %s: %s", job.id, text)
        self._poke()
