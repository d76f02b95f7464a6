"""Placing jobs on nodes: the loop's place and resize steps (record intent; no I/O to the nodes).

A placement pass reads the nodes as last probed, the GPUs the running jobs hold and the queue, asks
`scheduler.decide.placement` (pure) where each queued job goes, and writes each placed job's attempt with a new token
and its runs as intents (job `running`, condition Creating): their GPUs are held from then on, and the
executor starts them on the next tick. Elastic jobs scaled to a new size get their new attempt the same way
(`scheduler.decide.elastic`). A job that cannot be placed or planned fails alone (`fail`); the queue goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide import arrays, dependencies, elastic, fairshare, placement, quotas, reservations, usage
from ftconsole.scheduler.decide.jobplan import plan_attempt
from ftconsole.scheduler.decide.jobs import Attempt, Condition, Job, JobStatus, Run
from ftconsole.scheduler.decide.requests import job_request, node_slot, urgent_scope
from ftconsole.scheduler.decide.steps import user_root
from ftconsole.scheduler.errors import FtError, SSHError, StoreError, UsageError
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.preempting import Preempter
from ftconsole.scheduler.spec import arrayspec
from ftconsole.scheduler.spec.config import QuotaSettings
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")

ANY_PORT = 29500  # which ranks start a process does not depend on the port: any valid one plans them


QUOTA_HOURS_EVERY_S = 60.0  # quotas' GPU-hours of the period are read again this often


class Placer:
    def __init__(
        self,
        service: ClusterService,
        *,
        clock: Callable[[], float],
        poke: Callable[[], None],
        fail: Callable[[Job, str], Awaitable[None]],
        run_root: Callable[[], str],
        avoided: Callable[[str], Mapping[str, str]] = lambda user: {},
    ) -> None:
        self.service = service
        self.store = service.store
        self.config = service.config
        self.settings = service.config.scheduler
        self.clock = clock
        self._poke = poke
        self._fail = fail
        self._run_root = run_root
        self._avoided = avoided  # user -> the nodes where that user has no account or home, and which it lacks
        self._nodes = {n.name: n for n in service.all_nodes}
        self._used: dict[tuple[str, str], float] = {}  # fair share: fairshare.account -> decayed GPU-seconds
        self._used_at = float("-inf")  # when that was computed (again every fairshare.every)
        self._factors: dict[tuple[str, str], fairshare.Factor] = {}  # of the last pass's queued jobs' accounts
        self._hours: dict[quotas.Key, float] = {}  # quotas: GPU-hours of the last period, per project and user
        self._hours_at = float("-inf")
        self._set_quotas: dict[quotas.Key, tuple[dict[str, Any], str, float]] = {}  # an admin's (`ftconsole quota`)
        self.preempter = Preempter(self.store, self.config, clock=clock, poke=poke)
        self._kept_off: dict[int, str] = {}  # job id -> which reserved nodes it keeps off, as its last pass saw

    @property
    def run_root(self) -> str:
        return self._run_root()

    # ============================================================ resize

    async def resize(self) -> None:
        """Running elastic jobs scaled to a new size get a new attempt of that size (see `scheduler.decide.elastic`);
        the act step then stops the old attempt, and launches the new one once it is down."""
        jobs = [
            j
            for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
            if j.stop_reason is None and elastic.resizes(j)
        ]
        if not jobs:
            return
        held = await self.store.runs(held=True)
        cluster: list[tuple[placement.ClusterState, list[placement.JobRequest]]] = []  # read once, until a resize
        for job in jobs:
            mine = [r for r in held if r.job == job.id]
            current = [r for r in mine if r.attempt == job.attempt]
            if not current or len(current) == job.size or any(r.attempt < job.attempt for r in mine):
                continue  # at its size, or a resize still under way
            try:
                if await self._resize_one(job, current, cluster):
                    cluster.clear()  # it holds more GPUs now
            except (SSHError, StoreError) as exc:
                await self.notes(
                    [(job, f"cannot scale to {job.size} nodes now: {exc}; retrying")], status=JobStatus.RUNNING
                )
            except Exception as exc:
                log.exception("job %s: cannot resize", job.id)
                await self._fail(job, f"ftconsole cannot resize it: {type(exc).__name__}: {exc}")

    async def _resize_one(
        self,
        job: Job,
        current: Sequence[Run],
        cluster: list[tuple[placement.ClusterState, list[placement.JobRequest]]],
    ) -> bool:
        """Record the new attempt of a job being resized (True), or say why it waits (False)."""
        now = self.clock()
        attempt = await self.store.attempt(job.id, job.attempt)
        assert attempt is not None
        how = elastic.direction(len(current), job.size)
        nodes = elastic.kept_nodes(current, job.size)
        if job.size > len(current):
            if not cluster:
                state, requests, _, _ = await self.placement_inputs(await self.store.jobs(statuses=[JobStatus.QUEUED]))
                cluster.append((state, requests))
            decision = self._grow(job, attempt, current, job.size - len(current), now, *cluster[0])
            if isinstance(decision, placement.Wait):
                await self.notes([(job, f"{how} waits for nodes: {decision.reason}")], status=JobStatus.RUNNING)
                return False
            nodes += decision.nodes
        number = job.attempt + 1
        new, runs = self.new_attempt(job, number, attempt.spec_name, attempt.gpus_per_node, nodes, now)
        try:
            async with self.store.jobs_tx("resize a job") as tx:
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    attempt=number,
                    message=f"{how}: attempt {number} starts once attempt {job.attempt} is down",
                )
                await tx.update_attempt(job.id, job.attempt, message=f"replaced by attempt {number} ({how})")
                for r in current:
                    if r.state == "intent":  # never launched: nothing to stop
                        await tx.update_run(r, state="cancelled", ended=now)
                await tx.add_attempt(new, runs)
                await tx.event(
                    now,
                    Condition.SCALING,
                    f"{how}: attempt {number} on {_where(nodes)}; stopping attempt {job.attempt}",
                    job=job.id,
                    data={"nodes": _nodes_json(nodes), "from": len(current), "to": job.size},
                )
        except Conflict:
            return False  # it ended meanwhile
        self._poke()
        return True

    def _grow(
        self,
        job: Job,
        attempt: Attempt,
        current: Sequence[Run],
        count: int,
        now: float,
        state: placement.ClusterState,
        requests: list[placement.JobRequest],
    ) -> placement.Decision:
        """Where the `count` nodes a scale out adds would go now, or why they wait (placement's `predict`)."""
        rank0 = min(current, key=_rank).node
        deadline = job.deadline
        request = elastic.grow_request(
            job_request(job.spec, self.config, job_id=str(job.id), now=now),
            count=count,
            spec_name=attempt.spec_name,
            gpus_per_node=attempt.gpus_per_node,
            gpu_model=next((n.gpu_model for n in state.nodes if n.name == rank0), ""),
            own={r.node for r in current},
            cluster=self._nodes,
            priority=placement.Priority.parse(job.priority),
            now=now,
            remaining=None if deadline is None else deadline - now,
        )
        return placement.predict(state, requests, request, now, allow_degraded=self.degraded_ok)

    # ============================================================ place

    async def place(self) -> None:
        queued = await self.store.jobs(statuses=[JobStatus.QUEUED])
        if not queued:
            return
        now = self.clock()
        queued, waiting = await self._dependencies(queued)
        state, requests, by_id, unplaceable = await self.placement_inputs(queued)
        notes = waiting + [(job, why) for job, why in unplaceable if why]
        held = await self.held_by_quotas(requests, {i: (job.project, job.owner) for i, (job, _) in by_id.items()})
        held |= await self.held_by_arrays(requests, {i: job for i, (job, _) in by_id.items() if i not in held})
        if held:  # they wait, holding no one back: the others are placed as if they were not there
            requests = [r for r in requests if r.id not in held]
            notes += [(by_id[i][0], f"waiting: {why}") for i, why in held.items()]
        for job, why in unplaceable:
            if not why:  # not a config change: the job itself cannot be planned
                await self._fail(job, job.message)
        decisions = placement.plan(
            state, requests, now, urgent_cap=self.settings.urgent_cap, allow_degraded=self.degraded_ok
        )
        preempting = await self.preempter.preempt(state, requests, decisions, self.degraded_ok)
        for decision in decisions:
            job, request = by_id[decision.job_id]
            if isinstance(decision, placement.Wait):
                why = f"{decision.reason}{self._why(job)}{self.fair_note(job.project, job.owner)}"
                if decision.job_id in preempting:
                    why += f"; {preempting[decision.job_id]}"
                notes.append((job, f"waiting (position {decision.position}): {why}"))
                continue
            try:
                await self._start(job, request.candidates[decision.candidate_index], decision, now)
            except StoreError:
                raise  # not this job's trouble
            except Exception as exc:  # this job's trouble alone: it fails, the queue behind it goes on
                log.exception("job %s: cannot be started", job.id)
                await self._fail(job, f"ftconsole cannot start it: {type(exc).__name__}: {exc}")
        await self.notes(notes)

    async def quotas_on(self) -> bool:
        """Whether any quota applies: the config's `quotas`, or limits an admin set (`ftconsole quota`); reads
        the latter for `quota_limits`."""
        self._set_quotas = await self.store.quota_limits()
        return self.config.quotas is not None or bool(self._set_quotas)

    async def quota_use(self) -> dict[quotas.Key, quotas.InUse]:
        """What each project and user uses now: GPUs held by its running jobs, running and queued jobs, and the
        GPU-hours of the last `quotas.period` (read again every minute)."""
        out: dict[quotas.Key, quotas.InUse] = {}
        if not await self.quotas_on():
            return out
        period = self.config.quotas.period if self.config.quotas is not None else QuotaSettings().period
        active = await self.store.jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING], deleted=True)
        by_id = {j.id: j for j in active}
        for job in active:
            for key in (("project", job.project), ("user", job.owner)):
                use = out.setdefault(key, quotas.InUse())
                if job.status is JobStatus.RUNNING:
                    use.running_jobs += 1
                else:
                    use.queued_jobs += 1
        for r in await self.store.runs(held=True):
            holder = by_id.get(r.job)
            if holder is not None and holder.status is JobStatus.RUNNING:
                for key in (("project", holder.project), ("user", holder.owner)):
                    out.setdefault(key, quotas.InUse()).gpus += len(r.gpus)
        now = self.clock()
        if now - self._hours_at >= QUOTA_HOURS_EVERY_S:
            jobs = {j.id: j for j in await self.store.jobs(deleted=True)}
            runs = await self.store.runs()
            by = [(g, await asyncio.to_thread(usage.usage_by, jobs, runs, g, now - period, now, now))  # off the loop
                  for g in usage.GROUPINGS]  # fmt: skip
            self._hours = {(grouping, name): u.gpu_hours for grouping, rows in by for name, u in rows.items()}
            self._hours_at = now
        for key, hours in self._hours.items():
            out.setdefault(key, quotas.InUse()).gpu_hours = hours
        return out

    async def held_by_quotas(
        self, requests: Sequence[placement.JobRequest], owners: Mapping[str, tuple[str, str]]
    ) -> dict[str, str]:
        """Job id -> why it waits, for the queued jobs (these requests; `owners`: id -> (project, user)) that a
        quota holds back."""
        if not requests or not await self.quotas_on():
            return {}
        queue = [
            quotas.Queued(r.id, *owners[r.id], r.nodes * max(c.gpus_per_node for c in r.candidates))
            for r in placement.queue_order(requests)
        ]
        return quotas.hold_back(queue, self.quota_limits, await self.quota_use())

    async def held_by_arrays(self, requests: Sequence[placement.JobRequest], jobs: Mapping[str, Job]) -> dict[str, str]:
        """Job id -> why it waits, for the queued tasks (of `jobs`, by id) whose array runs its most tasks at once
        (`array: ...%N`; decide/arrays.py)."""
        limits = {
            i: limit
            for i, job in jobs.items()
            if job.array_id is not None
            and job.spec.array is not None
            and (limit := arrayspec.parse(job.spec.array).limit) is not None
        }
        if not limits:
            return {}
        running = Counter(j.array_id for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True))
        queue = [
            arrays.Task(r.id, jobs[r.id].array_id or 0, limits[r.id])
            for r in placement.queue_order(requests)
            if r.id in limits
        ]
        return arrays.hold_back(queue, {a: n for a, n in running.items() if a is not None})

    def quota_limits(self, key: quotas.Key) -> quotas.Limits | None:
        """The limits of a project or user: those an admin set (as `quotas_on` last read them), else the
        config's (`quotas`), else None: none. A project the config does not declare has none (`quotas.applies`)."""
        if not quotas.applies(key, self.config.projects):
            return None
        if key in self._set_quotas:
            return quotas.Limits(**self._set_quotas[key][0])
        found = self.config.quotas.limits(key) if self.config.quotas is not None else None
        return None if found is None else quotas.Limits(**found.model_dump())

    async def fair_factors(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], fairshare.Factor]:
        """The fair-share factor of each (project, user) of `wanted` (a job's project as written), counted as
        `fairshare.account` says (per user where no projects are declared); {} where fair share is off. The
        decayed usage is read from the store's runs again every `fairshare.every` (Slurm's PriorityCalcPeriod)."""
        fair = self.settings.fairshare
        if fair is None:
            return {}
        now = self.clock()
        declared = self.config.projects
        if now - self._used_at >= fair.every:
            jobs = {j.id: j for j in await self.store.jobs(deleted=True)}
            runs = await self.store.runs()  # every run a tenth of a second at 100,000: off the event loop
            self._used = await asyncio.to_thread(fairshare.usage, jobs, runs, now, fair.half_life, declared=declared)
            self._used_at = now
        accounts = {w: fairshare.account(*w, declared) for w in wanted}
        self._factors = fairshare.factors(
            self._used, accounts.values(), fair.shares, fair.default_share, by_user=not declared
        )
        return {w: self._factors[a] for w, a in accounts.items()}

    def _fair(self, project: str, user: str) -> tuple[tuple[str, str], fairshare.Factor | None]:
        """The (project, user) fair share counts a job under, and its factor of the last pass (None: none)."""
        key = fairshare.account(project, user, self.config.projects)
        return key, self._factors.get(key) if self.settings.fairshare is not None else None

    def fair_value(self, project: str, user: str) -> float:
        """The factor of the last pass for (project, user): 1 where fair share is off."""
        _, factor = self._fair(project, user)
        return factor.value if factor is not None else 1.0

    def fair_note(self, project: str, user: str) -> str:
        """ "; fair share 0.21: project vision used 2.1x its share" of the last pass, or "" (fair share off)."""
        key, factor = self._fair(project, user)
        return f"; {factor.describe(*key)}" if factor is not None else ""

    async def _dependencies(self, queued: list[Job]) -> tuple[list[Job], list[tuple[Job, str]]]:
        """The queued jobs whose `after:` is met (or who have none), and why the others wait; a job whose
        dependency can never be met ends `error` saying which (decide/dependencies.py)."""
        ready, waiting, never = await self.by_dependencies(queued)
        for job, why in never:
            await self._fail(job, f"its dependency can never be met: {why}")
        return ready, waiting

    async def by_dependencies(
        self, queued: list[Job]
    ) -> tuple[list[Job], list[tuple[Job, str]], list[tuple[Job, str]]]:
        """The queued jobs split by their `after:`: those that may be placed, those that wait for another job
        (not placed, so that they hold nothing back: backfill goes around them), those that never can; with why."""
        if not any(j.spec.after is not None for j in queued):
            return queued, [], []
        statuses = await self.statuses()
        ready, waiting, never = [], [], []
        for job in queued:
            after = job.spec.after
            found = None if after is None else dependencies.state(after.as_map(), statuses)
            if isinstance(found, dependencies.Never):
                never.append((job, found.reason))
            elif isinstance(found, dependencies.Waits):
                waiting.append((job, found.reason))
            else:
                ready.append(job)
        return ready, waiting, never

    async def statuses(self) -> dict[int, JobStatus | None]:
        """Every job's status, deleted ones too: what dependencies are judged by; an array's id stands for all its
        tasks (`dependencies.array_status`)."""
        jobs = await self.store.jobs(deleted=True)
        out: dict[int, JobStatus | None] = {j.id: j.status for j in jobs}
        tasks: dict[int, list[JobStatus]] = {}
        for j in jobs:
            if j.array_id is not None:
                tasks.setdefault(j.array_id, []).append(j.status)
        out |= {array: dependencies.array_status(statuses) for array, statuses in tasks.items()}
        return out

    def _why(self, job: Job) -> str:
        lacks: dict[str, list[str]] = {}
        for node, what in sorted(self._avoided(job.owner).items()):
            lacks.setdefault(what, []).append(node)
        why = "".join(f" (user {job.owner} has {what} on {', '.join(nodes)})" for what, nodes in lacks.items())
        if job.excluded:
            why += f" (not on {', '.join(job.excluded)}: it was slow there)"
        if self._kept_off.get(job.id):
            why += f" ({self._kept_off[job.id]})"
        return why

    @property
    def degraded_ok(self) -> list[str]:
        return [name for name, pool in self.config.pools.items() if pool.schedule_degraded]

    async def placement_inputs(
        self, queued: Sequence[Job], also: Sequence[tuple[str, str]] = ()
    ) -> tuple[
        placement.ClusterState,
        list[placement.JobRequest],
        dict[str, tuple[Job, placement.JobRequest]],
        list[tuple[Job, str]],
    ]:
        """The nodes as last probed, the GPUs the running jobs hold, and the queue, as placement reads them;
        with the queued jobs that cannot be placed at all, and why (an empty why: the job failed to plan, its
        `message` says how)."""
        views = await self.service.nodes(extras=False)
        active = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)}
        allocations = []
        for r in await self.store.runs(held=True):
            holder = active.get(r.job)
            allocations.append(
                placement.Allocation(
                    job_id=str(r.job),
                    node=r.node,
                    gpus=r.gpus,
                    ends_at=holder.deadline if holder else None,
                    project=urgent_scope(self.config, holder.owner, holder.project) if holder else "",
                    priority=placement.Priority.parse(holder.priority) if holder else placement.Priority.NORMAL,
                )
            )
        for hold in await debugenv.holds(self.store, self.config.debug, self.clock()):
            allocations.append(  # a failed job's GPUs, held for debugging (debug.hold_nodes) until `until`
                placement.Allocation(
                    job_id=str(hold.job.id),
                    node=hold.run.node,
                    gpus=hold.run.gpus,
                    ends_at=hold.until,
                    project=urgent_scope(self.config, hold.job.owner, hold.job.project),
                )
            )
        state = placement.ClusterState(
            nodes=tuple(node_slot(v.to_json(), self.config.runtime_for(v.node.pool)) for v in views),
            allocations=tuple(allocations),
        )
        requests, by_id, unplaceable = [], {}, []
        fair = await self.fair_factors([(j.project, j.owner) for j in queued] + list(also))
        kept = await self.store.reservations()
        now = self.clock()
        self._kept_off = {}  # of the jobs queued now only
        for job in queued:
            where = reservations.allowed(job.spec.reservation, job.owner, job.project, job.max_runtime, kept, now,
                                         self._nodes, self.config.projects)  # fmt: skip
            if isinstance(where, reservations.Waits):  # its reservation has not begun: it waits, holding no one
                unplaceable.append((job, where.reason))
                continue
            if isinstance(where, reservations.Never):
                unplaceable.append((dataclasses.replace(job, message=f"it can never start: {where.reason}"), ""))
                continue
            self._kept_off[job.id] = where.note
            try:
                request = job_request(job.spec, self.config, job_id=str(job.id), now=job.submitted)
                request = dataclasses.replace(
                    request,
                    priority=placement.Priority.parse(job.priority),
                    project=urgent_scope(self.config, job.owner, job.project),
                    requeued=job.requeued,
                    nodes=job.size,
                    min_nodes=None if request.min_nodes is None else min(request.min_nodes, job.size),
                    fairshare=fair[(job.project, job.owner)].value if fair else 1.0,
                )
                request = self.within(request, where.nodes, set(self._avoided(job.owner)) | set(job.excluded))
            except FtError as exc:  # the config changed under a queued job (spec removed): say so, keep it
                unplaceable.append((job, str(exc)))
                continue
            except Exception as exc:  # anything else is this job's alone
                log.exception("job %s: cannot be placed", job.id)
                text = f"ftconsole cannot place it: {type(exc).__name__}: {exc}"
                unplaceable.append((dataclasses.replace(job, message=text), ""))
                continue
            requests.append(request)
            by_id[str(job.id)] = (job, request)
        return state, requests, by_id, unplaceable

    def within(
        self, request: placement.JobRequest, reserved: frozenset[str] | None, avoided: set[str]
    ) -> placement.JobRequest:
        """The request kept to the nodes a reservation allows (None: any) and off the `avoided` ones (its user has
        no account there; or it was slow there)."""
        if reserved is None and not avoided:
            return request
        allowed = request.node_names if request.node_names is not None else frozenset(self._nodes)
        if reserved is not None:
            allowed &= reserved
        return dataclasses.replace(request, node_names=allowed - avoided)

    async def reserved_for(self, spec: JobSpec, owner: str, now: float) -> reservations.Allowed | reservations.Waits:
        """Where a job of this spec may go as the reservations stand (predict's); UsageError when it never can."""
        found = reservations.allowed(spec.reservation, owner, spec.project, spec.max_runtime,
                                     await self.store.reservations(), now, self._nodes,
                                     self.config.projects)  # fmt: skip
        if isinstance(found, reservations.Never):
            raise UsageError(f"job {spec.name}: it can never start: {found.reason}")
        return found

    async def notes(self, notes: Sequence[tuple[Job, str]], *, status: JobStatus = JobStatus.QUEUED) -> None:
        """Why jobs wait (their message): queued ones to start, running ones to be resized; in one transaction,
        only the ones that changed."""
        changed = [(job, text) for job, text in notes if job.message != text]
        if not changed:
            return
        async with self.store.jobs_tx("note why jobs wait") as tx:
            # one statement; a job whose status changed meanwhile keeps its message
            await tx.note([(job.id, text) for job, text in changed], status=status)

    async def _start(self, job: Job, candidate: placement.Candidate, decision: placement.Place, now: float) -> None:
        """Record the job's attempt and its runs as intents (their GPUs held from now on); the act step of the
        next tick chooses its master port and starts them."""
        number = job.attempt + 1
        spec_name, gpus = candidate.spec_name, candidate.gpus_per_node
        attempt, runs = self.new_attempt(job, number, spec_name, gpus, decision.nodes, now)
        where = _where(decision.nodes)
        try:
            async with self.store.jobs_tx("place a job") as tx:
                await tx.update_job(
                    job.id, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING, started=now, attempt=number, message=""
                )
                await tx.add_attempt(attempt, runs)
                await tx.event(
                    now,
                    Condition.CREATING,
                    f"attempt {number} placed on {where}"
                    + (f" (spec {candidate.spec_name})" if candidate.spec_name else "")
                    + elastic.placed_small(job, len(decision.nodes)),
                    job=job.id,
                    data={"nodes": _nodes_json(decision.nodes)},
                )
        except Conflict:
            return  # stopped or changed meanwhile
        await afailpoint("place.after_record")
        self._poke()

    def new_attempt(
        self,
        job: Job,
        number: int,
        spec_name: str | None,
        gpus_per_node: int,
        nodes: Sequence[placement.NodeGpus],
        now: float,
    ) -> tuple[Attempt, list[Run]]:
        """Attempt `number` of the job on these nodes (rank order), with a new token, its runs as intents."""
        attempt = Attempt(
            job=job.id,
            number=number,
            spec_name=spec_name,
            gpus_per_node=gpus_per_node,
            master_port=0,  # chosen on its first node right before the launch
            created=now,
            token=secrets.token_hex(8),
        )
        runs = [
            Run(
                job=job.id,
                attempt=number,
                rank=rank,
                node=node,
                gpus=tuple(gpus),
                run_dir=f"{user_root(self.run_root, job.owner)}/{job.id}/{number}/{rank}",
                launch=True,
                token=attempt.token,
            )
            for rank, (node, gpus) in enumerate(nodes)
        ]
        # which ranks start a process does not depend on the port, which is chosen later: plan with any valid one
        planned = plan_attempt(
            job, dataclasses.replace(attempt, master_port=ANY_PORT), runs, nodes=self._nodes, run_root=self.run_root
        )
        launching = {r.rank for r in planned.launching}
        return attempt, [dataclasses.replace(r, launch=r.rank in launching) for r in runs]


def _rank(run: Run) -> int:
    return run.rank


def _where(nodes: Sequence[placement.NodeGpus]) -> str:
    return ", ".join(f"{n}[{','.join(map(str, g))}]" for n, g in nodes)


def _nodes_json(nodes: Sequence[placement.NodeGpus]) -> list[dict[str, Any]]:
    return [{"node": n, "gpus": list(g)} for n, g in nodes]
