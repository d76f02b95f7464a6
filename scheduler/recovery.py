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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from ftconsole.probes.results import PREFLIGHT_CHECKS, CheckStatus
from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide.jobs import Attempt, Condition, Finish, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.reconcile import (
    FAULTY,
    PREEMPTED,
    REQUEUED,
    RESTARTED,
    SHRUNK,
    GiveUp,
    Health,
    Hold,
    Preempted,
    ProbeFirst,
    Requeue,
    RestartInPlace,
    Shrink,
    recover,
)
from ftconsole.scheduler.decide.reconcile import dumps as reconcile_dumps
from ftconsole.scheduler.decide.topology import by_switch
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.fabric import FabricReport, Way, check, too_few_witnesses
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.placing import Placer
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.faultspec import Strategy
from ftconsole.scheduler.spec.nodetestspec import FabricTest
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")
SHARED = "another job uses it: its traffic may be why"  # a slow node of the bandwidth check left out, not isolated


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
            v.node.name: Health(v.health.state.value, v.health.reasons, v.health.last_probe, v.health.boot_id)
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
        if isinstance(decision, Preempted):
            await self._preempted(job, runs, changes, decision.cause, now)
        elif isinstance(decision, Requeue):
            await self._requeue(job, runs, changes, decision, now)
        elif isinstance(decision, Shrink):
            await self.service.isolate(list(decision.faulty), reason=f"job {job.id}: {decision.cause}", by="scheduler")
            keep = set(decision.keep)
            shown = f"{decision.cause}; isolated {', '.join(decision.faulty)}; elastic: going on"
            await self._restart(job, [r for r in runs if r.node in keep], changes, decision, now, shown)
        else:
            await self._restart(job, runs, changes, decision, now)
        return Outcome.DONE

    async def preflight(self, job: Job, attempt: Attempt, fail: Callable[[Job, str], Awaitable[None]]) -> bool:
        """Seed 000's environment pre-check, for a job with `retries`: right before an attempt's first start,
        probe exactly its nodes and log each pre-flight item (`item NAME: pass|fail VALUE THRESHOLD`). True:
        go on. A failing node (an item fails, or the node reads unhealthy or unreachable; with
        `preflight.bandwidth`, its fabric is slow) is isolated and the job queued again at the front (scenarios 1
        and 2), or, with its retries used up, fails. A slow node that is no evidence of a fault (`_bandwidth`) is
        not isolated: the job is queued again without it."""
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
        spared: dict[str, str] = {}  # slow nodes for this job, no evidence of a fault: why they stay in service
        if not failing and job.spec.preflight.bandwidth and len(nodes) >= 2:
            failing, spared = await self._bandwidth(job, nodes)
        if not failing:
            self._checked.add((job.id, attempt.number))
            return True
        cause = "pre-flight failed: " + "; ".join(f"{n} {', '.join(why)}" for n, why in sorted(failing.items()))
        ft = job.spec.fault_tolerance
        resubmits = sum(a.result == REQUEUED for a in await self.store.attempts(job.id))
        faulty = tuple(sorted(set(failing) - set(spared)))
        if resubmits >= ft.retries:
            if faulty:
                await self.service.isolate(list(faulty), reason=f"job {job.id} attempt {attempt.number}: {cause}",
                                           by="scheduler")  # fmt: skip
            await fail(job, f"error,exiting: {cause} (resubmitted {resubmits} of {ft.retries} times)")
            return False
        await self._requeue(job, mine, [], Requeue(faulty, cause, resubmits + 1, ft.retries), now, without=spared)
        return False

    async def _bandwidth(self, job: Job, names: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
        """The fabric between the job's nodes (`preflight.bandwidth`): an item per node, as the probe's; the slow
        nodes with their line, and those of them that are no evidence of a fault, with why: another job (or a
        failed job kept for debugging) uses it too (its traffic may be why), or it is in service and fewer than
        two partners saw it slow (`too_few_witnesses`: that partner's own link, or a user's traffic aimed at it,
        may be why). Such a node is left out of this job, not isolated; the second kind says so in an event of
        its own. A node that could not take part is no evidence: its item says `error`, and the job goes on."""
        nodes = self.service.select(by_switch(names, self.service.fabric()))  # its ring crosses the
        pool = nodes[0].pool  # fewest switches
        settings = self.service.config.node_tests_for(pool).fabric or FabricTest()
        report = await check(self.service.transport, self.service.config.ssh.python, nodes, settings, pool,
                             self.service.baselines)  # fmt: skip
        now = self.clock()
        self.service.tester.counts.update(("fabric", r.result, "preflight") for r in report.results.values())
        results = report.results
        items = {n: f"item fabric: {r.result} {_fabric_item(report, n)} ({r.summary})" for n, r in results.items()}
        failing = {n: [text] for n, text in items.items() if results[n].result == "fail"}
        others = {r.node for r in await self.store.runs(held=True) if r.job != job.id and r.node in failing}
        holds = await debugenv.holds(self.store, self.service.config.debug, now)
        others |= {h.run.node for h in holds if h.run.job != job.id and h.run.node in failing}
        spared = dict.fromkeys(others, SHARED)
        healths = await self.store.all_node_health()
        for name in sorted(set(failing) - others):
            why = too_few_witnesses(results[name])
            if why is not None and (name not in healths or healths[name].admin is None):  # in service: witnesses
                spared[name] = why
        with contextlib.suppress(Conflict):
            async with self.store.jobs_tx(f"record the bandwidth check of job {job.id}") as tx:
                for name, text in sorted(items.items()):
                    await tx.event(now, "Preflight", text, job=job.id, node=name)
                for name, why in sorted(spared.items()):
                    if why != SHARED:
                        text = f"{name} stays in service, left out of this job only: {why}"
                        await tx.event(now, "Preflight", text, job=job.id, node=name)
        return failing, spared

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
        self,
        job: Job,
        runs: Sequence[Run],
        changes: Sequence[tuple[Run, dict[str, Any]]],
        d: Requeue,
        now: float,
        without: Mapping[str, str] | None = None,
    ) -> None:
        """Isolate `d.faulty` and queue the job again at the front; `without`: nodes it is not placed on again
        (slow for it, but no evidence of a fault: not isolated), with why."""
        without = without or {}
        where = ", ".join(d.faulty)
        if d.faulty:
            reason = f"job {job.id} attempt {job.attempt}: {d.cause}"
            await self.service.isolate(list(d.faulty), reason=reason, by="scheduler")
        isolated = f"isolated {where}; " if d.faulty else ""
        for why in dict.fromkeys(without[n] for n in sorted(without)):  # a phrase per reason, in the nodes' order
            isolated += f"not on {', '.join(sorted(n for n, w in without.items() if w == why))} again ({why}); "
        text = (
            f"attempt {job.attempt} failed: {d.cause}; {isolated}queued again at the front "
            f"(resubmit {d.number} of {d.limit})"
        )
        try:
            async with self.store.jobs_tx(f"requeue job {job.id}") as tx:
                for r, fields in changes:
                    await tx.update_run(r, **fields)
                # runs never sent (a pre-flight failed) are cancelled: nothing of them runs
                await tx.requeue(job.id, job.attempt, runs, now, result=REQUEUED, cause=d.cause,
                                 message=f"queued again: {d.cause} (resubmit {d.number} of {d.limit})")  # fmt: skip
                if without:
                    excluded = tuple(sorted({*job.excluded, *without}))
                    await tx.update_job(job.id, expect=[JobStatus.QUEUED], excluded=excluded)
                await tx.event(now, Condition.RESTARTING, text, job=job.id, data=_data(job, d.faulty, "recover"))
        except Conflict:
            return
        log.warning("job %s: %s", job.id, text)
        await afailpoint("recover.after_record")
        self._poke()

    async def _preempted(
        self, job: Job, runs: Sequence[Run], changes: Sequence[tuple[Run, dict[str, Any]]], cause: str, now: float
    ) -> None:
        text = f"attempt {job.attempt} {cause}; queued again at the front (a preemption spends no retry)"
        try:
            async with self.store.jobs_tx(f"requeue preempted job {job.id}") as tx:
                for r, fields in changes:
                    await tx.update_run(r, **fields)
                await tx.requeue(job.id, job.attempt, runs, now, result=PREEMPTED, cause=cause,
                                 message=f"queued again: {cause}")  # fmt: skip
                await tx.event(now, Condition.RESTARTING, text, job=job.id, data=_data(job, [], "preempted"))
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
        d: RestartInPlace | Shrink,
        now: float,
        cause: str | None = None,
    ) -> None:
        """The next attempt at once on the nodes and GPUs of `runs` (every rank of the failed attempt, or an
        elastic job's survivors); the failed attempt's GPUs are all released."""
        attempt = await self.store.attempt(job.id, job.attempt)
        assert attempt is not None
        ordered = sorted(runs, key=lambda r: r.rank)
        number = job.attempt + 1
        new, new_runs = self.placer.new_attempt(
            job, number, attempt.spec_name, attempt.gpus_per_node, [(r.node, r.gpus) for r in ordered], now
        )
        nodes = tuple(dict.fromkeys(r.node for r in ordered))
        if isinstance(d, Shrink):
            result, strategy, note = SHRUNK, "shrink", f"{len(nodes)} of {job.size} nodes, growing back when free"
            message = f"elastic: on {len(nodes)} of {job.size} nodes after a hardware fault; grows back when free"
        else:
            result, strategy, note = RESTARTED, "recover-in-place", f"restart {d.number} of {d.limit}"
            message = f"restarted in place (restart {d.number} of {d.limit})"
        text = f"attempt {job.attempt} failed: {cause or d.cause}; attempt {number} on {', '.join(nodes)} ({note})"
        try:
            async with self.store.jobs_tx(f"restart job {job.id}") as tx:
                for r, fields in changes:
                    await tx.update_run(r, **fields)
                await tx.update_attempt(job.id, job.attempt, ended=now, result=result, message=d.cause)
                await tx.release_runs(job.id, attempt=job.attempt)
                await tx.add_attempt(new, new_runs)
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    attempt=number,
                    stop_requested=None,
                    stop_reason=None,
                    stop_by=None,
                    message=message,
                )
                await tx.event(now, Condition.RESTARTING, text, job=job.id, data=_data(job, nodes, strategy))
        except Conflict:
            return
        log.warning("job %s: %s", job.id, text)
        await afailpoint("recover.after_record")
        self._poke()

    async def watch(self) -> None:
        """Seed 003's checkpoint resume: a running `checkpoint_resume` job with a node the checks now read
        unhealthy or unreachable gets its checkpoint signal; after its `grace_period` it is stopped, then
        queued again at the front (`recover` on StopReason.RESCHEDULE), the faulty nodes isolated now."""
        jobs = [
            j
            for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
            if j.stop_reason is None and j.spec.fault_tolerance.checkpoint_resume is not None
        ]
        if not jobs:
            return
        health = {v.node.name: v.health for v in await self.service.nodes(extras=False)}
        started = await self.store.running_attempts()
        held = await self.store.runs(held=True)
        for job in jobs:
            attempt = started.get(job.id)
            runs = [r for r in held if r.job == job.id and r.attempt == job.attempt and r.launch and r.active]
            if attempt is None or attempt.started is None or not runs:
                continue  # not running everywhere yet: a start that fails is the failure path's
            sick = sorted({r.node for r in runs if r.node in health and health[r.node].state.value in FAULTY})
            if sick:
                await self._checkpoint(job, runs, sick, {n: health[n].reasons for n in sick})

    async def _checkpoint(self, job: Job, runs: Sequence[Run], sick: Sequence[str], why: dict[str, Any]) -> None:
        resume = job.spec.fault_tolerance.checkpoint_resume
        assert resume is not None
        used = sum(a.result == REQUEUED for a in await self.store.attempts(job.id))
        if used >= resume.max_resumes:
            return  # no resume left: it runs on while it can; if it fails, it ends error
        now = self.clock()
        where = ", ".join(sick)
        cause = "hardware fault: " + "; ".join(f"{n} {'; '.join(why[n]) or 'unhealthy'}" for n in sick)
        await self.service.isolate(list(sick), reason=f"job {job.id} attempt {job.attempt}: {cause}", by="scheduler")
        grace = format_duration(resume.grace_period)
        text = (
            f"{cause}: {resume.signal} to every rank to save a checkpoint, stopped after grace_period {grace}, then "
            f"queued again without {where} (resume {used + 1} of {resume.max_resumes})"
        )
        owed = (runs, resume.signal, now + resume.grace_period)
        await self._reschedule(job, now, cause, text, _data(job, sick, "dump"), checkpoint=owed)

    async def reschedule_slow(self, job: Job, runs: Sequence[Run], slow_node: str | None, what: str) -> str:
        """Seed 003's "reschedule and alert" for a slow job (`performance.action: reschedule`): stopped (the
        checkpoint signal and its grace period first, with checkpoint_resume) and queued again at the front
        (`recover` on StopReason.RESCHEDULE), never again on `slow_node` (the node of the one slow rank; None
        when several were). Spends a resubmit; with none left it only alerts. What was done, for the alert."""
        ft = job.spec.fault_tolerance
        limit = max(ft.retries, ft.checkpoint_resume.max_resumes if ft.checkpoint_resume else 0)
        used = sum(a.result == REQUEUED for a in await self.store.attempts(job.id))
        if used >= limit:
            return f"no resubmit left ({used} of {limit} used): alert only"
        now = self.clock()
        excluded = tuple(sorted({*job.excluded, slow_node} if slow_node else set(job.excluded)))
        without = f" without {slow_node}" if slow_node else ""
        resume = ft.checkpoint_resume
        how = (
            f"{resume.signal} to every rank to save a checkpoint, stopped after grace_period "
            f"{format_duration(resume.grace_period)}"
            if resume
            else "stopped"
        )
        text = f"{what}: {how}, then queued again{without} (resubmit {used + 1} of {limit}; performance.action)"
        data = _data(job, [slow_node] if slow_node else [], "reschedule")
        owed = None if resume is None else (runs, resume.signal, now + resume.grace_period)
        if not await self._reschedule(job, now, what, text, data, checkpoint=owed, excluded=excluded):
            return "it was stopping already"
        return f"rescheduled{without} (resubmit {used + 1} of {limit})"

    async def _reschedule(
        self,
        job: Job,
        now: float,
        message: str,
        text: str,
        data: dict[str, Any],
        *,
        checkpoint: tuple[Sequence[Run], str, float] | None = None,
        **fields: Any,
    ) -> bool:
        """The stop that a requeue follows (StopReason.RESCHEDULE, `recover` requeues once the ranks are down),
        with its Stopping event and, with `checkpoint` (runs, signal, deadline), the checkpoint signal owed to
        those runs, all in one transaction: the executor sends it (`Executor.checkpoints`), after a crash too.
        False when the job was no longer running as it was."""
        try:
            async with self.store.jobs_tx(f"reschedule job {job.id}") as tx:
                if checkpoint is not None:
                    runs, signal, deadline = checkpoint
                    await tx.owe_checkpoint(runs, signal, now=now, deadline=deadline)
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    stop_requested=now,
                    stop_reason=StopReason.RESCHEDULE,
                    stop_by="scheduler",
                    message=message,
                    **fields,
                )
                await tx.event(now, Condition.STOPPING, text, job=job.id, data=data)
        except Conflict:
            return False
        log.warning("job %s: %s", job.id, text)
        self._poke()
        return True

    def stopping_others(self, job: Job) -> str:
        """What befalls the ranks still running when a rank of `job` fails (its Stopping event says it)."""
        resume = job.spec.fault_tolerance.checkpoint_resume
        if resume is None or Strategy.DUMP not in job.spec.fault_tolerance.plan:
            return "stopping the other ranks"
        grace = format_duration(resume.grace_period)
        return f"dump: {resume.signal} to the other ranks to save a checkpoint, stopped after grace_period {grace}"

    def dump(self, job: Job, runs: Sequence[Run]) -> None:
        """Seed 002's `dump`: the ranks of a failed attempt that still run get the checkpoint signal; the loop
        stops them once its `grace_period` is over (`reconcile.dumps`). The decision is the job's stop (reason
        error, `dump` in its strategies), written by the loop; the executor owes the signal to those ranks from it
        and sends it on its next pass (`Executor.checkpoints`), after a crash too. Here: wake it now."""
        if reconcile_dumps(job):
            self._poke()

    async def expire_requeued(self, fail: Callable[[Job, str], Awaitable[None]]) -> None:
        """A job queued again after a hardware fault that has waited `scheduler.queue_timeout` ends `error`:
        the pool is short of healthy capacity (seed 000)."""
        now = self.clock()
        limit = self.service.config.scheduler.queue_timeout
        for job in await self.store.requeued_jobs():
            if not job.attempt:
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


def _fabric_item(report: FabricReport, node: str) -> str:
    """`VALUE THRESHOLD` of a node's fabric item: its fastest stream on the way it failed (out, unless only its
    way in was slow), so that VALUE < THRESHOLD exactly when it failed; and the threshold."""
    way_in = report.results[node].way is Way.IN
    rates = [s.gbps for s in report.streams if (s.dst if way_in else s.src) == node and s.gbps is not None]
    value = max(rates) if rates else None
    shown = "-" if value is None else f"{value:.3g} Gbit/s"
    return f"{shown} {'-' if report.threshold is None else f'{report.threshold:.3g} Gbit/s'}"
