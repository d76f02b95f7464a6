"""The scheduler's job operations: what callers ask for (submit, stop, delete, clone, priority, extend, scale,
alerts, node actions), each checked against the job's owner, its `access` and the admins, and written with its
event in one transaction; what a job's ranks say on their nodes (logs, launch files, a hang's evidence) is
`scheduler.rankreads`'. The control loop that carries the jobs out is `scheduler.loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Any

from pydantic import ValidationError

from ftconsole.scheduler import debugenv, nodegate, repair
from ftconsole.scheduler.decide import elastic, goodput, placement, reservations
from ftconsole.scheduler.decide.jobs import (
    TERMINAL,
    Attempt,
    Condition,
    Job,
    JobStatus,
    Run,
)
from ftconsole.scheduler.decide.requests import job_request, urgent_scope
from ftconsole.scheduler.errors import NotFound, PermissionDenied, UsageError
from ftconsole.scheduler.holding import Holding
from ftconsole.scheduler.loop import Loop
from ftconsole.scheduler.nodeops import ClusterService, NodeView, ProbeOutcome
from ftconsole.scheduler.rankreads import RankReads
from ftconsole.scheduler.redaction import redact, redact_decision, redact_json, redact_outcome
from ftconsole.scheduler.reserving import Reserving
from ftconsole.scheduler.rules import Caller, Rules
from ftconsole.scheduler.spec import arrayspec, begin
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.jobspec import Access, JobSpec
from ftconsole.scheduler.stepping import StepBook, Stepping
from ftconsole.scheduler.stopping import Stopping
from ftconsole.scheduler.store.jobtx import Conflict, JobTx
from ftconsole.scheduler.store.records import JobActivity, StoredAlert, StoredEvent
from ftconsole.scheduler.submitting import GroupCommit

log = logging.getLogger("ftconsole.scheduler")

MIN_TICK_GAP_S = 0.2


class Scheduler(RankReads, Reserving, Holding, Stopping, Stepping):
    def __init__(self, service: ClusterService, *, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.store = service.store
        self.transport = service.transport
        self.config = service.config
        self.settings = service.config.scheduler
        self.clock = clock
        self.loop = Loop(service, clock=clock, poke=self._poke)
        self.rules = Rules(service, placer=self.loop.placer)
        self.submits: GroupCommit[tuple[int, int | None]] = GroupCommit(self.store, "submit a job")
        self._changed = asyncio.Event()
        self._nodes = {n.name: n for n in service.all_nodes}
        self._gathers = {}
        self.steps_book = StepBook()  # stepping.py; a reload's new scheduler takes it over

    # ============================================================ permissions

    def is_admin(self, caller: Caller) -> bool:
        return self.rules.is_admin(caller)

    def may_see(self, caller: Caller, job: Job) -> bool:
        return self.rules.may_see(caller, job)

    async def hidden_jobs(self, caller: Caller) -> frozenset[int]:
        """The jobs this caller may not read (`may_see`): left out of its listings, and redacted (`redact`) where
        a text about something else names them (a node's reasons, a node's events and alerts, a prediction)."""
        if self.is_admin(caller):
            return frozenset()
        return await self.store.private_jobs(except_uid=caller.uid)

    def redact_job(self, job: Job, hidden: Collection[int]) -> Job:
        """A job the caller may read, its message redacted: a queued job's "blocked behind job N" may name a job
        the caller may not read; so may `cloned_from` (an admin's clone of a private job), then null."""
        message = redact(job.message, hidden)
        cloned_from = None if job.cloned_from in hidden else job.cloned_from
        if message == job.message and cloned_from == job.cloned_from:
            return job
        return dataclasses.replace(job, message=message, cloned_from=cloned_from)

    def _check(self, caller: Caller, job: Job, verb: str, *, write: bool) -> None:
        """Refuse a caller who may not `verb` the job. A job it may not see at all (`may_see`: another's, with
        `access: none`) reads as one that does not exist: the same NotFound, whatever the verb, so that neither its
        existence nor its owner is told (as a dependency on it says "no job N")."""
        if self.is_admin(caller) or caller.uid == job.uid:
            return
        if not self.may_see(caller, job):
            raise NotFound(f"no job {job.id}")
        if job.access == Access.READ_WRITE.value or (job.access == Access.READ_ONLY.value and not write):
            return
        allowed = {"none": "nothing", "read-only": "read only"}.get(job.access, job.access)
        raise PermissionDenied(
            f"{caller.user} may not {verb} job {job.id}: it belongs to {job.owner} and its access for others is "
            f"{job.access!r} ({allowed}); ask {job.owner} or an admin"
        )

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        task = arrayspec.ref(str(job_id))  # 12[7]: a task of an array
        job = await (self.store.array_task(*task) if task is not None else self.store.job(_job_id(job_id)))
        # a deleted job can still be looked at, not acted on; one the caller may not see is as one that is not
        if job is None or (job.deleted and write) or not self.may_see(caller, job):
            raise NotFound(f"no job {job_id}")
        self._check(caller, job, verb, write=write)
        return job

    async def visible(self, caller: Caller, job_id: int | str) -> Job:
        """A job the caller may see (NotFound otherwise, as for one that is not)."""
        return await self._job(caller, job_id, "see", write=False)

    # ============================================================ operations

    async def submit(
        self,
        caller: Caller,
        spec: JobSpec | dict[str, Any],
        *,
        cloned_from: int | None = None,
        hold: bool = False,
        allocation: bool = False,
    ) -> Job:
        """Queue a job (an array: its tasks); with `hold`, held from the start (holding.py), as `sbatch -H` does;
        `allocation` (`ftconsole alloc`): with the cluster's idle rules (`Rules.allocation`)."""
        spec = _spec(spec)
        if allocation:
            spec = self.rules.allocation(spec)
        now = self.clock()
        self.rules.admissible(caller, spec, spec.priority.value)
        await self._dependency(caller, spec)
        if spec.reservation is not None:  # one it may never use is refused now (UsageError), not left to wait
            await self.loop.placer.reserved_for(spec, caller.user, now)
        indexes: tuple[int | None, ...] = (None,) if spec.array is None else arrayspec.parse(spec.array).indexes
        job = Job(
            id=0,
            name=spec.name,
            owner=caller.user,
            uid=caller.uid,
            spec=spec,
            status=JobStatus.QUEUED,
            priority=spec.priority.value,
            project=spec.project,
            access=spec.access.value,
            submitted=now,
            cloned_from=cloned_from,
            held_by=caller.user if hold else None,
            held_at=now if hold else None,
            held_admin=hold and self.is_admin(caller),
        )
        how = f"cloned from job {cloned_from}" if cloned_from else "submitted"

        async def write(tx: JobTx) -> tuple[int, int | None]:
            # checked and written at once; an array's tasks count one each
            await self.rules.within_cap(caller.user, spec.project, spec.priority.value, count=len(indexes))
            await self._within_quota(caller.user, spec, count=len(indexes))
            held = ", held: not placed until released" if hold else ""
            if spec.array is None:
                job_id = await tx.add_job(job)
                await tx.event(now, Condition.PENDING, f"{how} by {caller.user}{held}", job=job_id)
                return job_id, None
            # an array: its first task's id names it, and every task knows it
            tasks = [i for i in indexes if i is not None]
            ids = await tx.add_tasks(job, tasks)
            first = ids[tasks[0]]
            await tx.events(
                (now, Condition.PENDING, f"{how} by {caller.user} (task {index} of array {first}){held}", ids[index])
                for index in tasks
            )
            return ids[tasks[-1]], first

        job_id, first = await self.submits.write(write)  # with the submits that arrive meanwhile (group commit)
        self._poke()
        if first is None:
            return dataclasses.replace(job, id=job_id)
        return dataclasses.replace(job, id=first, array_id=first, array_index=indexes[0])

    async def jobs(
        self,
        caller: Caller,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        owner: str | None = None,
        spec: str | None = None,
        output: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Job]:
        """Every job, newest last; filters combine (status: any of; name, output: substring; since, until: the
        jobs that were in the system at some time of [since, until): submitted before `until`, not ended before
        `since`)."""
        if since is not None and until is not None and since >= until:
            raise UsageError("since must be before until")
        statuses = None
        if status:
            try:
                statuses = [JobStatus(s) for s in status]
            except ValueError:
                raise UsageError(
                    f"unknown status in {', '.join(status)} (one of {', '.join(s.value for s in JobStatus)})"
                ) from None
        out = []
        # with `since`, the jobs active or ended since, read as such: a listing of the recent ones reads no history
        found = await (self.store.jobs(statuses=statuses) if since is None else self.store.jobs_since(since, statuses))
        for job in found:
            if not self.may_see(caller, job):
                continue
            if name and name not in job.name:
                continue
            if owner and job.owner != owner:
                continue
            if spec and spec not in [r.spec for r in job.spec.gpu_request]:
                continue
            if output and output not in (job.spec.output or ""):
                continue
            if until is not None and job.submitted >= until:
                continue
            if since is not None and job.ended is not None and job.ended < since:
                continue
            out.append(job)
        hidden = await self.hidden_jobs(caller)
        return [self.redact_job(job, hidden) for job in out]

    async def show(self, caller: Caller, job_id: int | str) -> dict[str, Any]:
        job = await self._job(caller, job_id, "see", write=False)
        now = self.clock()
        # the reads asked for at once: they queue together for the store's one thread (or connection), instead of
        # each waiting anew behind a placement pass's reads and writes (a deep queue right after a submit)
        attempts, runs, events, active, hidden, (tasks, steps) = await asyncio.gather(
            self.store.attempts(job.id),
            self.store.runs(job=job.id),
            self.store.events(job=str(job.id), limit=1000),
            self.store.job_activity([job.id]),
            self.hidden_jobs(caller),  # named in a message of this job ("blocked behind job N")
            asyncio.gather(self._tasks(job), self.store.steps(job.id)),
        )
        if {a.number for a in attempts} - {r.attempt for r in runs}:
            # an attempt is written with its runs: these came from a kept read made before it was, so they are read
            # again, now that the attempts are
            runs = await self.store.runs(job=job.id)
        activity = active.get(job.id, JobActivity())
        # the runs as read above, not as a second query found them a moment later: show agrees with itself
        outputs = [r.output_at for r in runs if r.attempt == job.attempt and r.output_at is not None]
        activity = dataclasses.replace(activity, last_output=max(outputs) if outputs else None)
        conditions = {c.value for c in Condition}
        job = self.redact_job(job, hidden)
        shown = [redact_json(e.to_json(), hidden) for e in events]
        return {
            **job.to_json(now),
            **activity.to_json(),
            "spec": job.spec.to_json(),
            "attempts": [
                {
                    **redact_json(a.to_json(), hidden),
                    "runs": [redact_json(r.to_json(), hidden) for r in runs if r.attempt == a.number],
                }
                for a in attempts
            ],
            "conditions": [
                {"type": e["kind"], "time": e["time"], "message": e["message"]}
                for e in shown
                if e["kind"] in conditions
            ],
            "events": shown,
            "debug": debugenv.view(job, self.config.debug, self.settings, now),
            "tasks": tasks,
            "goodput": await self._goodput(job, attempts, runs, now),
            "env_until": debugenv.env_until(job, self.config.debug, self.settings),
            "steps": [s.to_json() for s in steps],
        }

    async def _goodput(self, job: Job, attempts: Sequence[Attempt], runs: Sequence[Run], now: float) -> Any:
        """The job's goodput over its life: useful GPU time against the time lost to failures (decide/goodput.py)."""
        marks = goodput.checkpoint_times(await self.store.checkpoint_signals(owed=False, job=job.id))
        found = goodput.job_goodput(attempts, runs, {n: t for (_, n), t in marks.items()}, -math.inf, math.inf, now)
        return {**found.to_json(), "text": found.describe()}

    async def _tasks(self, job: Job) -> list[dict[str, Any]] | None:
        """A task's array: each task's index, id and status (None for a job that is no array's)."""
        if job.array_id is None:
            return None
        return [
            {"index": index, "id": id_, "ref": f"{job.array_id}[{index}]", "status": status, "deleted": deleted}
            for id_, index, status, deleted in await self.store.array_members(job.array_id)
        ]

    async def clone(self, caller: Caller, job_id: int | str) -> Job:
        job = await self._job(caller, job_id, "clone", write=False)
        return await self.submit(caller, job.spec, cloned_from=job.id)

    async def set_priority(self, caller: Caller, job_id: int | str, level: str) -> Job:
        """A queued job's priority; an array's (`12`): that of each of its queued tasks. The job (an array: its
        first task) as it is now."""
        try:
            label = placement.Priority.parse(level).label
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        jobs = await self.targets(caller, job_id, "change the priority of")
        changing = [j for j in jobs if j.status is JobStatus.QUEUED] if len(jobs) > 1 else jobs
        if len(jobs) > 1 and not changing:
            raise UsageError(f"array {job_id} has no queued task: the priority can only change while it is queued")
        for job in changing:
            if job.status is not JobStatus.QUEUED:
                raise UsageError(
                    f"job {job.ref} is {job.status.value}: the priority can only change while it is queued"
                )
            if label != job.priority:
                self.rules.admissible(caller, job.spec, label)
        now = self.clock()
        moved = [j for j in changing if j.priority != label]
        array = len(jobs) > 1
        try:
            async with self.store.jobs_tx("change a priority") as tx:
                if moved:
                    await self.rules.within_cap(moved[0].owner, moved[0].project, label, count=len(moved))
                changed = 0
                for job in changing:
                    try:
                        await tx.update_job(job.id, expect=[JobStatus.QUEUED], priority=label)
                    except Conflict:
                        if not array:
                            raise
                        continue  # a task that started since it was read keeps its priority, as a running one does
                    changed += 1
                    text = f"priority {job.priority} -> {label} by {caller.user}"
                    await tx.event(now, "Priority", text, job=job.id)
                if not changed:
                    raise Conflict(f"array {job_id}: every queued task started meanwhile")
        except Conflict:
            what = f"array {job_id} has no queued task left" if array else f"job {job_id} started meanwhile"
            raise UsageError(f"{what}: the priority can only change while it is queued") from None
        self._poke()
        return await self._fresh(jobs[0].id)

    async def extend(self, caller: Caller, job_id: int | str, seconds: float) -> Job:
        if seconds <= 0:
            raise UsageError("extend needs a positive duration, such as 30m or 2h")
        job = await self._job(caller, job_id, "extend", write=True)
        if job.spec.max_runtime is None:
            raise UsageError(f"job {job.id} has no max_runtime: there is nothing to extend")
        if not job.status.active or job.stop_reason is not None:
            raise UsageError(f"job {job.id} is {job.status.value}{' and stopping' if job.stop_reason else ''}")
        now = self.clock()
        if not self.is_admin(caller):
            await self.rules.extend_allowed(job, seconds, now)
        limit = format_duration((job.max_runtime or 0) + seconds)
        async with self.store.jobs_tx("extend a job") as tx:
            await tx.update_job(
                job.id, expect=[JobStatus.QUEUED, JobStatus.RUNNING], extra_runtime=job.extra_runtime + seconds
            )
            await tx.event(
                now, "Extended", f"max_runtime +{format_duration(seconds)} (now {limit}) by {caller.user}", job=job.id
            )
        return await self._fresh(job.id)

    async def scale(self, caller: Caller, job_id: int | str, nodes: int) -> Job:
        """Resize an elastic job to `nodes` nodes (see `scheduler.decide.elastic`): a queued one is placed at that size,
        a running one gets a new attempt of that size once the nodes are there (the loop does it)."""
        job = await self._job(caller, job_id, "scale", write=True)
        problem = elastic.scale_problem(job, nodes)
        if problem is not None:
            raise UsageError(problem)
        if nodes == job.size:
            return job
        now = self.clock()
        how = elastic.direction(job.size, nodes)
        queued = job.status is JobStatus.QUEUED
        when = "it is placed at that size" if queued else "a new attempt replaces the current one"
        try:
            async with self.store.jobs_tx("scale a job") as tx:
                # a running job's message is about the size it asked for until now (e.g. why it waits to grow)
                cleared: dict[str, Any] = {} if queued else {"message": ""}
                await tx.update_job(job.id, expect=[JobStatus.QUEUED, JobStatus.RUNNING], scaled_to=nodes, **cleared)
                await tx.event(
                    now,
                    Condition.SCALING,
                    f"{how} by {caller.user}: {when}",
                    job=job.id,
                    data={"from": job.size, "to": nodes, "by": caller.user},
                )
        except Conflict:
            raise UsageError(f"job {job.id} ended meanwhile: it cannot be scaled") from None
        self._poke()
        return await self._fresh(job.id)

    async def job_events(self, caller: Caller, job_id: int | str, *, limit: int = 100) -> list[StoredEvent]:
        job = await self._job(caller, job_id, "see", write=False)
        return await self.store.events(job=str(job.id), limit=limit)  # redacted by the caller (`redact_json`)

    # -- alerts -----------------------------------------------------------------------------------------------

    async def ack(self, caller: Caller, alert_ids: Iterable[int | str]) -> list[StoredAlert]:
        """Acknowledge alerts: someone is on it (they stay listed until resolved)."""
        alerts = await self._alerts_for(caller, alert_ids, "acknowledge")
        return await self.store.ack_alerts([a.id for a in alerts], by=caller.user, now=self.clock())

    async def resolve(self, caller: Caller, alert_ids: Iterable[int | str]) -> list[StoredAlert]:
        """Resolve alerts: the problem is over (node alerts also resolve themselves once the node is well)."""
        alerts = await self._alerts_for(caller, alert_ids, "resolve")
        return await self.store.resolve_alerts([a.id for a in alerts], by=caller.user, now=self.clock())

    async def _alerts_for(self, caller: Caller, alert_ids: Iterable[int | str], verb: str) -> list[StoredAlert]:
        """The alerts, once the caller may act on every one of them (else nothing is changed).

        Admins may act on any alert; on a job's alert, whoever may change the job; node alerts are for admins.
        """
        alerts = await self.store.alerts_by_id(alert_ids)
        if self.is_admin(caller):
            return alerts
        for alert in alerts:
            if alert.job is None:
                raise PermissionDenied(
                    f"{caller.user} may not {verb} alert {alert.id} ({alert.kind} on {alert.node}): alerts about "
                    f"nodes are for admins ({self._admins()})"
                )
            job = await self.store.job(alert.job)
            if job is not None and not self.may_see(caller, job):  # left out of its listings: as if there were none
                raise NotFound(f"no alert {alert.id}")
            if job is None:
                raise NotFound(f"alert {alert.id} is about job {alert.job}, which does not exist")
            self._check(caller, job, f"{verb} alert {alert.id} of", write=True)
        return alerts

    def _admins(self) -> str:
        return ", ".join(["root", *self.config.admins])

    # -- nodes ------------------------------------------------------------------------------------------------

    async def probe(
        self, caller: Caller, nodeset: str | None, *, checks: Sequence[str] | None = None
    ) -> list[ProbeOutcome]:
        """Probe nodes now, reading every node's container runtimes anew. An admin's probe runs at once; anyone
        else's is merged with the loop's (`ClusterService.probe_shared`: a node probed in the last PROBE_REUSE_S
        answers with that result). Some checks only (`checks`) never make a node's health better (issue 26)."""
        if self.is_admin(caller):
            outcomes = await self.service.probe(nodeset, checks=checks, fresh=True)
        else:
            outcomes = await self.service.probe_shared(nodeset, checks=checks)
        self._poke()
        hidden = await self.hidden_jobs(caller)  # an isolated node's reasons name the job it failed under
        return [redact_outcome(o, hidden) for o in outcomes] if hidden else outcomes

    async def drain(self, caller: Caller, nodeset: str, reason: str) -> list[NodeView]:
        """Take nodes out of scheduling (admins only); the running jobs there go on."""
        self._admin_only(caller, "drain")
        healths = await self.service.drain(nodeset, reason=reason, by=caller.user)
        return await self.service.nodes([h.node for h in healths])

    async def resume(self, caller: Caller, nodeset: str, *, test: bool = False) -> list[NodeView]:
        """Put drained or isolated nodes back (admins only); with `test`, only those that pass their node tests
        (each view then carries its report, `tests`)."""
        self._admin_only(caller, "resume")
        if not test:
            healths = await self.service.resume(nodeset, by=caller.user)
            self._poke()
            return await self.service.nodes([h.node for h in healths])
        tested = await nodegate.operator_resume(self.service, nodeset, by=caller.user)
        self._poke()
        views = await self.service.nodes([h.node for h, _ in tested])
        shown = [tuple({**r.to_json(), "time": report.time} for r in report.results) for _, report in tested]
        return [dataclasses.replace(v, tests=t) for v, t in zip(views, shown, strict=True)]

    async def repair(self, caller: Caller, nodeset: str) -> list[NodeView]:
        """Start the repair ladder on drained or isolated nodes (admins only): repair.py. The views of the nodes,
        each with the step its repair is on."""
        self._admin_only(caller, "repair")
        climbs = await repair.repair(self.service, nodeset, by=caller.user)
        return await self.service.nodes([c.node for c in climbs])

    def _admin_only(self, caller: Caller, verb: str) -> None:
        if not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} may not {verb} nodes: that is for admins ({self._admins()})")

    async def wait(self, caller: Caller, job_id: int | str) -> AsyncIterator[dict[str, Any]]:
        """The job now, then each time its status changes, until it ends."""
        job = await self._job(caller, job_id, "see", write=False)
        hidden = await self.hidden_jobs(caller)
        last: tuple[str, str] | None = None
        while True:
            key = (job.status.value, job.message)
            if key != last:
                yield self.redact_job(job, hidden).to_json(self.clock())
                last = key
            if job.status in TERMINAL:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=self.settings.tick)
            job = await self._fresh(job.id)

    async def _fresh(self, job_id: int) -> Job:
        job = await self.store.job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def _poke(self) -> None:
        """Something changed: wake the loop now and whoever waits on a job."""
        self.loop.wake.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def predict(self, caller: Caller, spec: JobSpec | dict[str, Any]) -> placement.Decision:
        """Would this job start now, on which nodes and GPUs; or its queue position, why, and the jobs ahead.
        The same rules as submit: what submit would refuse, predict refuses."""
        spec = _spec(spec)
        self.rules.admissible(caller, spec, spec.priority.value)
        waits = await self._dependency(caller, spec)
        await self.rules.within_cap(caller.user, spec.project, spec.priority.value)
        early = None if spec.begin is None else begin.waits_for(spec.begin, self.clock(), self.clock())
        if early is not None:
            return placement.Wait("(this job)", early, 0, cause=placement.WaitCause.BEGIN)
        if waits is not None:
            return placement.Wait("(this job)", waits.reason, 0, cause=placement.WaitCause.DEPENDENCY)
        queued, _, _ = await self.loop.placer.by_dependencies(await self.store.jobs(statuses=[JobStatus.QUEUED]))
        placer = self.loop.placer
        state, requests, by_id, _ = await placer.placement_inputs(queued, also=[(spec.project, caller.user)])
        now = self.clock()
        job = job_request(spec, self.config, job_id="(this job)", now=now)
        fair = placer.fair_value(spec.project, caller.user)
        job = dataclasses.replace(job, project=urgent_scope(self.config, caller.user, spec.project), fairshare=fair)
        where = await placer.reserved_for(spec, caller.user, now)
        if isinstance(where, reservations.Waits):
            return placement.Wait(job.id, where.reason, 0, cause=placement.WaitCause.RESERVATION)
        job = placer.within(job, where.nodes, set())
        owners = {i: (j.project, j.owner) for i, (j, _) in by_id.items()} | {job.id: (spec.project, caller.user)}
        held = await placer.held_by_quotas([*requests, job], owners)
        if job.id in held:
            return placement.Wait(job.id, held[job.id], 0, cause=placement.WaitCause.QUOTA)
        requests = [r for r in requests if r.id not in held]
        decision = placement.predict(
            state, requests, job, now, urgent_cap=self.settings.urgent_cap, allow_degraded=placer.degraded_ok
        )
        if isinstance(decision, placement.Wait):
            kept_off = f" ({where.note})" if where.note else ""
            decision = dataclasses.replace(
                decision, reason=decision.reason + kept_off + placer.fair_note(spec.project, caller.user)
            )
        return redact_decision(decision, await self.hidden_jobs(caller))

    # ============================================================ the loop

    @property
    def looping(self) -> bool:
        return self.loop.looping

    async def run(self, stop: asyncio.Event, *, probe: bool = True) -> None:
        """Drive the control loop (`scheduler.loop`) until `stop` is set; and the steps no client follows."""
        steps = asyncio.create_task(self.keep_steps(stop))
        try:
            await self.loop.run(stop, probe=probe)
        finally:
            steps.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await steps

    async def tick(self) -> None:
        await self.loop.tick()


# ================================================================ helpers


def _job_id(value: int | str) -> int:
    try:
        return int(str(value).strip().removeprefix("#"))
    except ValueError:
        raise UsageError(f"not a job id: {value!r} (job ids are numbers, as `ftconsole jobs` shows)") from None


def _spec(spec: JobSpec | dict[str, Any]) -> JobSpec:
    if isinstance(spec, JobSpec):  # a clone: checked again, the rules may have grown since it was stored
        spec = spec.to_json()
    try:
        return JobSpec.from_json(spec)
    except ValidationError as exc:
        raise UsageError(f"invalid job spec: {exc}") from None
