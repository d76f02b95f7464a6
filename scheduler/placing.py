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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from ftconsole.scheduler import debugenv, nodegate
from ftconsole.scheduler.decide import (
    arrays,
    dependencies,
    elastic,
    fairshare,
    placement,
    queuedepth,
    quotas,
    reservations,
)
from ftconsole.scheduler.decide.jobplan import plan_attempt
from ftconsole.scheduler.decide.jobs import Attempt, Condition, Job, JobStatus, Run
from ftconsole.scheduler.decide.ledger import Ledger
from ftconsole.scheduler.decide.requests import job_request, node_slot, urgent_scope
from ftconsole.scheduler.decide.steps import user_root
from ftconsole.scheduler.decide.topology import Fabric, placed_note
from ftconsole.scheduler.errors import FtError, SSHError, StoreError, UsageError
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.placing_shares import SharingWeights
from ftconsole.scheduler.preempting import Preempter
from ftconsole.scheduler.spec import arrayspec, begin
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.jobtx import Conflict

log = logging.getLogger("ftconsole.scheduler")

ANY_PORT = 29500  # which ranks start a process does not depend on the port: any valid one plans them


class Placer(SharingWeights):
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
        self._ledger: Ledger | None = None  # what ended runs used, as the store keeps it (decide/ledger.py)
        self._folded_at = float("-inf")  # when the pass last folded the runs ended since into it
        self._set_quotas: dict[quotas.Key, tuple[dict[str, Any], str, float]] = {}  # an admin's (`ftconsole quota`)
        self.preempter = Preempter(self.store, self.config, clock=clock, poke=poke)
        self._kept_off: dict[int, str] = {}  # job id -> which reserved nodes it keeps off, as its last pass saw
        # the queue in its order, kept while the jobs and the fair-share values stay the same (a deep queue is
        # sorted once, not every pass); and what each project and user uses, likewise
        self._order: tuple[tuple[Any, ...], list[list[Job]]] | None = None
        # (the queue order, how many jobs were beyond the depth, their note) when each of them said so: the same
        # order and count are the same jobs, none of them to note again
        self._beyond_noted: tuple[list[list[Job]], int, str] | None = None
        self._use: tuple[tuple[int, float], dict[quotas.Key, quotas.InUse]] | None = None
        self._accounts: tuple[tuple[int, ...], list[tuple[str, str]]] | None = None  # the queue's (project, user)s
        self._after: tuple[tuple[int, ...] | None, bool] | None = None  # whether any queued job has an `after:`

    @property
    def fabric(self) -> Fabric | None:
        """The switches the nodes hang under (`topology:`, or found by discovery): a multi-node job goes under the
        fewest."""
        return self.service.fabric()

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
        request = elastic.grow_request(  # a growing job takes what is free: its topology.wait was its start's
            dataclasses.replace(job_request(job.spec, self.config, job_id=str(job.id), now=now), max_switches=None),
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
        group = None if state.fabric is None else state.fabric.group_nodes(r.node for r in current)
        if group is not None:  # topology.block_sizes: it grows inside the largest group of blocks that holds it
            allowed = request.node_names if request.node_names is not None else frozenset(self._nodes)
            request = dataclasses.replace(request, node_names=frozenset(allowed & group))
        return placement.predict(state, requests, request, now, allow_degraded=self.degraded_ok)

    # ============================================================ place

    async def place(self) -> None:
        version: tuple[int, ...] = (
            self.store.version(("jobs",)),
        )  # before the read: what is derived from it is kept with it
        queued = await self.store.jobs(statuses=[JobStatus.QUEUED])
        if not queued:
            await nodegate.burn_in(self.service, queued=False)  # idle nodes, when nothing waits for them
            return
        now = self.clock()
        version += (len(queued),)
        queued, waiting = await self._dependencies(queued, version)
        # the first queue_depth; the held ones wait, holding no one. Those ready are counted in the version: a job
        # whose begin: time comes is ready at a later pass of the same jobs (what `take` keeps is of those ready)
        taken = await self.take(queued, (*version, len(queued)))
        state, requests, by_id, unplaceable = await self.placement_inputs(taken.taken, record=True)
        notes = waiting + [(job, why) for job, why in unplaceable if why]
        notes += [(job, f"waiting: {why}") for job, why in taken.held]
        later = queuedepth.beyond(self.settings.queue_depth)
        notes += await asyncio.to_thread(self._beyond_notes, taken.beyond, later)  # 100,000 jobs: off the loop
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

    def _beyond_notes(self, beyond: Sequence[Job], later: str) -> list[tuple[Job, str]]:
        """The jobs past the queue depth whose note is not `later` yet: none to look for while the queue's order
        and the count past the depth are those of a pass that found none (a walk over 100,000 jobs a pass)."""
        ordered = self._order[1] if self._order is not None else None
        kept = self._beyond_noted
        if ordered is not None and kept is not None and kept[0] is ordered and kept[1:] == (len(beyond), later):
            return []
        pending = [(job, later) for job in beyond if job.message != later]
        self._beyond_noted = (ordered, len(beyond), later) if ordered is not None and not pending else None
        return pending

    async def take(self, queued: Sequence[Job], version: tuple[int, ...], *, fold: bool = True) -> queuedepth.Walk:
        """The queued jobs (whose dependencies are met) this pass plans: the first `scheduler.queue_depth` in
        queue order that no quota or array limit holds back; with the held ones and the rest (decide/queuedepth).
        `fold`: fold the ended runs into the usage ledger first, a write (the pass's; not a reader's, such as the
        forecast, which a standby answers too)."""
        if self._accounts is None or self._accounts[0] != version:
            self._accounts = (version, await asyncio.to_thread(_accounts, queued))  # a deep queue: off the loop
        if fold:
            await self.refresh_usage()
        fair = await self.fair_factors(self._accounts[1])
        values = {account: f.value for account, f in fair.items()}
        if self._order is None or self._order[0] != (*version, values):
            # a sort of the whole queue (100,000 jobs: 0.1 to 0.7 s) in a worker thread: the requests that come
            # meanwhile are answered between its turns, not after it
            self._order = ((*version, values), await asyncio.to_thread(queuedepth.order, queued, values))
        ordered = self._order[1]
        quota = quotas.Gate(self.quota_limits, await self.quota_use()) if await self.quotas_on() else None
        sizes: dict[tuple[int, int], int | None] = {}  # (its spec, its size) -> its GPUs; None: no request
        limits: dict[int, int | None] = {}  # its spec -> its array's limit

        def gpus(job: Job) -> int | None:
            key = (id(job.spec), job.size)
            if key not in sizes:
                try:
                    request = job_request(job.spec, self.config, job_id=str(job.id), now=job.submitted)
                    sizes[key] = job.size * max(c.gpus_per_node for c in request.candidates)
                except Exception:  # planning it says why (placement_inputs)
                    sizes[key] = None
            return sizes[key]

        def limit(job: Job) -> int | None:
            if id(job.spec) not in limits:
                limits[id(job.spec)] = None if job.spec.array is None else arrayspec.parse(job.spec.array).limit
            return limits[id(job.spec)]

        array_gate = None
        if any(run[0].array_id is not None and limit(run[0]) is not None for run in ordered):
            running = Counter(j.array_id for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True))
            array_gate = arrays.Gate({a: n for a, n in running.items() if a is not None})
        kept = await self.store.reservations()
        now = self.clock()

        def counts(job: Job) -> bool:  # one that waits for its reservation to begin holds no quota and no slot
            if job.spec.reservation is None:
                return True
            where = reservations.allowed(job.spec.reservation, job.owner, job.project, job.max_runtime, kept, now,
                                         self._nodes, self.config.projects)  # fmt: skip
            return isinstance(where, reservations.Allowed)

        return queuedepth.walk(ordered, self.settings.queue_depth, gpus=gpus, quota=quota, limit=limit,
                               array_gate=array_gate, counts=counts)  # fmt: skip

    async def _dependencies(
        self, queued: list[Job], version: tuple[int, ...] | None = None
    ) -> tuple[list[Job], list[tuple[Job, str]]]:
        """The queued jobs whose `after:` is met (or who have none), and why the others wait; a job whose
        dependency can never be met ends `error` saying which (decide/dependencies.py)."""
        ready, waiting, never = await self.by_dependencies(queued, version)
        for job, why in never:
            await self._fail(job, f"its dependency can never be met: {why}")
        return ready, waiting

    async def by_dependencies(
        self, queued: list[Job], version: tuple[int, ...] | None = None
    ) -> tuple[list[Job], list[tuple[Job, str]], list[tuple[Job, str]]]:
        """The queued jobs split by their `after:`: those that may be placed, those that wait for another job, for
        their `begin:` time or for their release from a hold (not placed, so that they hold nothing back: backfill
        goes around them), those that never can; with why."""
        if version is None or self._after is None or self._after[0] != version:  # `version`: of the queue's read
            self._after = (version, await asyncio.to_thread(_any_waits, queued))  # a deep queue: off the loop
        if not self._after[1]:
            return queued, [], []
        now = self.clock()
        statuses = await self.statuses({i for j in queued if j.spec.after for ids in j.spec.after.as_map().values()
                                        for i in ids})  # fmt: skip
        ready, waiting, never = [], [], []
        for job in queued:
            if (held := job.held_note()) is not None:  # held: it waits for its release, holding no one back
                waiting.append((job, held))
                continue
            early = None if job.spec.begin is None else begin.waits_for(job.spec.begin, job.submitted, now)
            if early is not None:  # its begin: time has not come: it waits, holding no one back
                waiting.append((job, early))
                continue
            after = job.spec.after
            found = None if after is None else dependencies.state(after.as_map(), statuses)
            if isinstance(found, dependencies.Never):
                never.append((job, found.reason))
            elif isinstance(found, dependencies.Waits):
                waiting.append((job, found.reason))
            else:
                ready.append(job)
        return ready, waiting, never

    async def statuses(self, named: Collection[int]) -> dict[int, JobStatus | None]:
        """The status of each job `named` (deleted ones too; absent: no such job, or pruned): what dependencies
        are judged by; an array's id stands for all its tasks (`dependencies.array_status`). Read as few columns
        of those jobs only, not of the whole history."""
        rows = await self.store.job_statuses(sorted(named))
        out: dict[int, JobStatus | None] = {i: JobStatus(status) for i, status, _ in rows}
        tasks: dict[int, list[JobStatus]] = {}
        for _, status, array_id in rows:
            if array_id is not None:
                tasks.setdefault(array_id, []).append(JobStatus(status))
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
        self, queued: Sequence[Job], also: Sequence[tuple[str, str]] = (), *, record: bool = False
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
        slots = tuple(node_slot(v.to_json(), self.config.runtime_for(v.node.pool)) for v in views)
        sizes = {slot.name: slot.gpus_total for slot in slots}
        for name, until in self.service.tester.holds().items():  # a node under test: its GPUs are the test's
            gpus = tuple(range(sizes.get(name, 0)))
            allocations.append(placement.Allocation(job_id=f"node test of {name}", node=name, gpus=gpus, ends_at=until))
        state = placement.ClusterState(nodes=slots, allocations=tuple(allocations), fabric=self.fabric)
        requests, by_id, unplaceable = [], {}, []
        fair = await self.fair_factors([(j.project, j.owner) for j in queued] + list(also))
        kept = await self.store.reservations()
        now = self.clock()
        kept_off: dict[int, str] = {}  # of the jobs queued now only
        if record:  # the pass's, whose notes say it (`_why`); not another reader's (predict, the forecast)
            self._kept_off = kept_off
        avoided: dict[str, set[str]] = {}
        for job in queued:
            where = reservations.allowed(job.spec.reservation, job.owner, job.project, job.max_runtime, kept, now,
                                         self._nodes, self.config.projects)  # fmt: skip
            if isinstance(where, reservations.Waits):  # its reservation has not begun: it waits, holding no one
                unplaceable.append((job, where.reason))
                continue
            if isinstance(where, reservations.Never):
                unplaceable.append((dataclasses.replace(job, message=f"it can never start: {where.reason}"), ""))
                continue
            kept_off[job.id] = where.note
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
                if job.owner not in avoided:
                    avoided[job.owner] = set(self._avoided(job.owner))
                request = self.within(request, where.nodes, avoided[job.owner] | set(job.excluded))
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
        changed = await asyncio.to_thread(_changed, notes)  # a deep queue's 100,000 notes: off the loop
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
                    + placed_note(self.fabric, job.spec.topology, [n for n, _ in decision.nodes])
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


def _changed(notes: Sequence[tuple[Job, str]]) -> list[tuple[Job, str]]:
    """The notes that are not their job's message already."""
    return [(job, text) for job, text in notes if job.message != text]


def _any_waits(queued: Sequence[Job]) -> bool:
    """Whether any of the jobs waits for another job (`after:`), for a time (`begin:`) or for its release."""
    return any(j.spec.after is not None or j.spec.begin is not None or j.held_by is not None for j in queued)


def _accounts(queued: Sequence[Job]) -> list[tuple[str, str]]:
    """The (project, user) accounts of the jobs, each once."""
    return list({(j.project, j.owner) for j in queued})


def _rank(run: Run) -> int:
    return run.rank


def _where(nodes: Sequence[placement.NodeGpus]) -> str:
    return ", ".join(f"{n}[{','.join(map(str, g))}]" for n, g in nodes)


def _nodes_json(nodes: Sequence[placement.NodeGpus]) -> list[dict[str, Any]]:
    return [{"node": n, "gpus": list(g)} for n, g in nodes]
