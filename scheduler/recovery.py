"""Carrying out what `reconcile.recover` decides for a failed attempt: isolate and requeue, restart in place,
probe first, or give up. The loop calls `Recoverer.after_failure` when a running job's attempt has failed
and every rank of it is down, in place of ending the job `error`.

Every outcome is written in one transaction with its event: the failed attempt ends with result `requeued`
or `restarted` (what the restart limits count), its GPUs are released, and the job is queued again at the
front (`requeued`) or gets its next attempt on the same nodes and GPUs at once; the Restarting condition says
why, where and which attempt. Faulty nodes are isolated before the job is requeued (placement then leaves
them out until an operator resumes them), so the next placement cannot pick them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import Any

from ftconsole.probes.results import PREFLIGHT_CHECKS, CheckStatus
from ftconsole.scheduler.config import format_duration
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.jobs import Attempt, Condition, Finish, Job, JobStatus, Run
from ftconsole.scheduler.jobtx import Conflict
from ftconsole.scheduler.placing import Placer
from ftconsole.scheduler.reconcile import (
    FAULTY,
    REQUEUED,
    RESTARTED,
    GiveUp,
    Health,
    Hold,
    ProbeFirst,
    Requeue,
    RestartInPlace,
    recover,
)
from ftconsole.scheduler.service import ClusterService

log = logging.getLogger("ftconsole.scheduler")


class Outcome(Enum):
    WAIT = "wait"  # to be decided on a later tick (probes asked for); nothing written
    DONE = "done"  # requeued or restarted: written, with the run changes


class Recoverer:
    def __init__(
        self, service: ClusterService, placer: Placer, *, clock: Callable[[], float], poke: Callable[[], None]
    ) -> None:
        self.service = service
        self.store = service.store
        self.placer = placer
        self.clock = clock
        self._poke = poke
        self._probes: dict[tuple[str, ...], asyncio.Task[None]] = {}
        self._checked: set[tuple[int, int]] = set()  # (job, attempt) whose pre-flight passed

    async def after_failure(
        self, job: Job, runs: Sequence[Run], changes: Sequence[tuple[Run, dict[str, Any]]], finish: Finish
    ) -> Finish | Outcome:
        """The job's attempt failed (`finish`: how it would end); its run `changes` are not written yet. The
        Finish to write (maybe with the policy's "error,exiting" message), or DONE (requeued or restarted,
        written here), or WAIT (decided on a later tick, once the probes asked for are in)."""
        now = self.clock()
        health = {
            v.node.name: Health(v.health.state.value, v.health.reasons, v.health.last_probe)
            for v in await self.service.nodes(extras=False)
        }
        decision = recover(job, runs, await self.store.attempts(job.id), health, now)
        if decision is None:
            return finish
        if isinstance(decision, GiveUp):
            log.warning("job %s: %s", job.id, decision.message)
            return Finish(JobStatus.ERROR, decision.message, finish.exit_code)
        if isinstance(decision, ProbeFirst):
            self._probe(decision.nodes)
            return Outcome.WAIT
        if isinstance(decision, Hold):
            if job.message != decision.message:
                with contextlib.suppress(Conflict):
                    async with self.store.jobs_tx(f"note job {job.id} waits to restart") as tx:
                        await tx.update_job(job.id, expect=[JobStatus.RUNNING], message=decision.message)
            return Outcome.WAIT
        if isinstance(decision, Requeue):
            await self._requeue(job, runs, changes, decision, now)
        else:
            await self._restart(job, runs, changes, decision, now)
        return Outcome.DONE

    async def preflight(self, job: Job, attempt: Attempt, fail: Callable[[Job, str], Awaitable[None]]) -> bool:
        """Seed 000's environment pre-check, for a job with `retries`: right before an attempt's first start,
        probe exactly its nodes and log each pre-flight item (`item NAME: pass|fail VALUE THRESHOLD`). True:
        go on. A failing node (an item fails, or the node reads unhealthy or unreachable) is isolated and the
        job queued again at the front (scenarios 1 and 2), or, with its retries used up, fails."""
        if not job.spec.fault_tolerance.retries or (job.id, attempt.number) in self._checked:
            return True
        mine = [r for r in await self.store.runs(job=job.id) if r.attempt == attempt.number]
        if any(r.state != "intent" for r in mine):  # a start was sent (before a restart of ours): too late
            self._checked.add((job.id, attempt.number))
            return True
        nodes = sorted({r.node for r in mine})
        outcomes = await self.service.probe(",".join(nodes))
        now = self.clock()
        failing: dict[str, list[str]] = {}
        with contextlib.suppress(Conflict):
            async with self.store.jobs_tx(f"record the pre-flight of job {job.id}") as tx:
                for o in outcomes:
                    name = o.node.name
                    if o.report is None:
                        why = f"{o.failure.kind}: {o.failure.message}" if o.failure else "no report"
                        failing[name] = [f"unreachable ({why})"]
                        await tx.event(now, "Preflight", f"{name}: no pre-flight ({why})", job=job.id, node=name)
                        continue
                    for check in o.report.checks:
                        if check.name not in PREFLIGHT_CHECKS or check.status is CheckStatus.SKIP:
                            continue
                        text = f"item {check.name}: {check.status.value} {_shown(check.value, check.unit)} " + _shown(
                            check.threshold, check.unit
                        )
                        await tx.event(now, "Preflight", text, job=job.id, node=name)
                        if check.status is CheckStatus.FAIL:
                            failing.setdefault(name, []).append(text)
                    if name not in failing and o.health.state.value in FAULTY:
                        failing[name] = [f"{o.health.state.value}: {'; '.join(o.health.reasons)}"]
        if not failing:
            self._checked.add((job.id, attempt.number))
            return True
        cause = "pre-flight failed: " + "; ".join(f"{n} {', '.join(why)}" for n, why in sorted(failing.items()))
        ft = job.spec.fault_tolerance
        resubmits = sum(a.result == REQUEUED for a in await self.store.attempts(job.id))
        if resubmits >= ft.retries:
            await self.service.isolate(sorted(failing), reason=f"job {job.id} attempt {attempt.number}: {cause}",
                                       by="scheduler")  # fmt: skip
            await fail(job, f"error,exiting: {cause} (resubmitted {resubmits} of {ft.retries} times)")
            return False
        await self._requeue(job, mine, [], Requeue(tuple(sorted(failing)), cause, resubmits + 1, ft.retries), now)
        return False

    def _probe(self, nodes: tuple[str, ...]) -> None:
        """Probe the nodes now (once at a time): the decision waits for their word on the hardware."""
        if nodes in self._probes:
            return

        async def probe() -> None:
            try:
                await self.service.probe(",".join(nodes))
            except FtError as exc:
                log.warning("probe of %s after a failure: %s", ",".join(nodes), exc)
            finally:
                self._probes.pop(nodes, None)
                self._poke()

        self._probes[nodes] = asyncio.create_task(probe())

    async def _requeue(
        self, job: Job, runs: Sequence[Run], changes: Sequence[tuple[Run, dict[str, Any]]], d: Requeue, now: float
    ) -> None:
        where = ", ".join(d.faulty)
        reason = f"job {job.id} attempt {job.attempt}: {d.cause}"
        await self.service.isolate(list(d.faulty), reason=reason, by="scheduler")
        text = (
            f"attempt {job.attempt} failed: {d.cause}; isolated {where}; queued again at the front "
            f"(resubmit {d.number} of {d.limit})"
        )
        try:
            async with self.store.jobs_tx(f"requeue job {job.id}") as tx:
                for r, fields in changes:
                    await tx.update_run(r, **fields)
                for r in runs:
                    if r.state == "intent":  # never sent (a pre-flight failed): nothing of it runs
                        await tx.update_run(r, state="cancelled", ended=now, error=d.cause)
                await tx.update_attempt(job.id, job.attempt, ended=now, result=REQUEUED, message=d.cause)
                await tx.release_runs(job.id, attempt=job.attempt)
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    status=JobStatus.QUEUED,
                    requeued=True,
                    stop_requested=None,
                    stop_reason=None,
                    stop_by=None,
                    message=f"queued again without {where}: {d.cause} (resubmit {d.number} of {d.limit})",
                )
                await tx.event(now, Condition.RESTARTING, text, job=job.id, data=_data(job, d.faulty, "recover"))
        except Conflict:
            return
        log.warning("job %s: %s", job.id, text)
        await afailpoint("recover.after_record")
        self._poke()

    async def _restart(
        self,
        job: Job,
        runs: Sequence[Run],
        changes: Sequence[tuple[Run, dict[str, Any]]],
        d: RestartInPlace,
        now: float,
    ) -> None:
        attempt = await self.store.attempt(job.id, job.attempt)
        assert attempt is not None
        ordered = sorted(runs, key=lambda r: r.rank)
        number = job.attempt + 1
        new, new_runs = self.placer.new_attempt(
            job, number, attempt.spec_name, attempt.gpus_per_node, [(r.node, r.gpus) for r in ordered], now
        )
        nodes = tuple(dict.fromkeys(r.node for r in ordered))
        text = (
            f"attempt {job.attempt} failed: {d.cause}; attempt {number} on {', '.join(nodes)} "
            f"(restart {d.number} of {d.limit})"
        )
        try:
            async with self.store.jobs_tx(f"restart job {job.id}") as tx:
                for r, fields in changes:
                    await tx.update_run(r, **fields)
                await tx.update_attempt(job.id, job.attempt, ended=now, result=RESTARTED, message=d.cause)
                await tx.release_runs(job.id, attempt=job.attempt)
                await tx.add_attempt(new, new_runs)
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    attempt=number,
                    stop_requested=None,
                    stop_reason=None,
                    stop_by=None,
                    message=f"restarted in place (restart {d.number} of {d.limit})",
                )
                nodes_of = tuple(dict.fromkeys(r.node for r in ordered))
                await tx.event(
                    now, Condition.RESTARTING, text, job=job.id, data=_data(job, nodes_of, "recover-in-place")
                )
        except Conflict:
            return
        log.warning("job %s: %s", job.id, text)
        await afailpoint("recover.after_record")
        self._poke()

    async def expire_requeued(self, fail: Callable[[Job, str], Awaitable[None]]) -> None:
        """A job queued again after a hardware fault that has waited `scheduler.queue_timeout` ends `error`:
        the pool is short of healthy capacity (seed 000)."""
        now = self.clock()
        limit = self.service.config.scheduler.queue_timeout
        for job in await self.store.jobs(statuses=[JobStatus.QUEUED]):
            if not job.requeued or not job.attempt:
                continue
            last = await self.store.attempt(job.id, job.attempt)
            if last is None or last.result != REQUEUED or last.ended is None or now - last.ended < limit:
                continue
            waited = format_duration(round(now - last.ended))
            await fail(
                job,
                f"error,exiting: queued again after a hardware fault and waited {waited} for healthy nodes "
                f"(scheduler.queue_timeout {format_duration(limit)}): the pool is short of capacity",
            )

    async def close(self) -> None:
        tasks = list(self._probes.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _shown(value: float | str | None, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = f"{value:g}"
    return f"{value}{' ' + unit.strip() if unit.strip() else ''}"


def _data(job: Job, nodes: Sequence[str], strategy: str) -> dict[str, Any]:
    return {"attempt": job.attempt, "nodes": list(nodes), "strategy": strategy}
