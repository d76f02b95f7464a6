"""The rules of a cluster that teams share (issue 30), for the scheduler's callers: GPU usage over a period
(`usage`, like sreport), the quotas an admin changes at run time (`set_quota`) and the ones a submit must fit
(`_within_quota`), a new job's dependencies (`_dependency`), and what an array's id names (`targets`).
Placement applies them each pass (`placing.Placer`: `by_dependencies`, `held_by_quotas`, `take`,
`fair_factors`); the rules themselves are pure (decide/dependencies.py, quotas.py, fairshare.py, usage.py,
arrays.py). Part of `Scheduler` (jobops.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Collection, Iterable
from typing import Any

from ftconsole.scheduler.decide import dependencies, fairshare, goodput, quotas, report, usage
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.decide.usage import Usage
from ftconsole.scheduler.errors import NotFound, PermissionDenied, UsageError
from ftconsole.scheduler.loop import Loop
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec import arrayspec
from ftconsole.scheduler.spec.config import ClusterConfig, QuotaSettings
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.spec.sharingspec import DEFAULT_QUEUED_JOBS
from ftconsole.scheduler.store.db import Store

GOODPUT_WINDOW_S = 7 * 86400.0  # `cluster` and the console give the cluster's goodput over this much of the past
GOODPUT_EVERY_S = 60.0  # summed again this often


def undeclared_project(project: str, declared: Collection[str], what: str, instead: str) -> str:
    """Why `what` (a quota, a reservation) cannot be for `project`: it is not declared in the config. Without
    declared projects a job's `project:` is a label anyone may write, so nothing is keyed on it (issue 40)."""
    if declared:
        return f"project {project!r} is not declared in the cluster config (projects: {', '.join(sorted(declared))})"
    return (
        f"{what} needs projects declared in the cluster config (projects:), and none are: a job's project is then "
        f"a label anyone may write; declare the projects, or {instead}"
    )


class Sharing:
    """Part of `Scheduler` (jobops.py): usage, quotas and dependencies."""

    _goodput_kept: tuple[float, dict[str, Any]] | None = None

    store: Store
    loop: Loop
    config: ClusterConfig
    clock: Callable[[], float]

    def is_admin(self, caller: Caller) -> bool:
        raise NotImplementedError  # Scheduler's

    async def hidden_jobs(self, caller: Caller) -> frozenset[int]:
        raise NotImplementedError  # Scheduler's

    def _admins(self) -> str:
        raise NotImplementedError  # Scheduler's

    def _poke(self) -> None:
        raise NotImplementedError  # Scheduler's

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        raise NotImplementedError  # Scheduler's

    def _check(self, caller: Caller, job: Job, verb: str, *, write: bool) -> None:
        raise NotImplementedError  # Scheduler's

    def may_see(self, caller: Caller, job: Job) -> bool:
        raise NotImplementedError  # Scheduler's

    async def cluster_goodput(self) -> dict[str, Any]:
        """The cluster's goodput over the last `GOODPUT_WINDOW_S` (decide/goodput.py), summed again at most every
        `GOODPUT_EVERY_S`."""
        now = self.clock()
        kept = self._goodput_kept
        if kept is not None and now - kept[0] < GOODPUT_EVERY_S:
            return dict(kept[1])
        since = now - GOODPUT_WINDOW_S
        _, _, found = await self.window(since, now, now, "project")  # its whole days from the day sums
        doc = {**found.to_json(), "text": found.describe(), "since": since, "until": now}
        self._goodput_kept = (now, doc)
        return dict(doc)

    async def targets_of(self, caller: Caller, refs: Iterable[int | str], verb: str) -> list[Job]:
        """`targets` of each of `refs`, in order; the plain ids of jobs that are no array's read 500 to a query
        (a stop of a thousand queued jobs is two reads, not a thousand)."""
        refs = list(refs)
        plain = sorted({int(str(r).strip()) for r in refs if str(r).strip().isdigit()})
        found = {j.id: j for j in await self.store.jobs_by_id(plain)} if len(plain) > 1 else {}
        out: list[Job] = []
        for ref in refs:
            text = str(ref).strip()
            job = found.get(int(text)) if text.isdigit() else None
            if job is None or job.array_id == job.id or job.deleted or not self.may_see(caller, job):
                out += await self.targets(caller, ref, verb)  # one at a time: an array, or what it refuses
                continue
            self._check(caller, job, verb, write=True)
            out.append(job)
        return out

    async def targets(self, caller: Caller, ref: int | str, verb: str) -> list[Job]:
        """The jobs a stop, delete or priority change names: `12` the whole array when job 12 is an array's
        first task (its id names the array, as in Slurm), its tasks that are not deleted; `12[7]` one task; any
        other id its job. The caller must be allowed to `verb` each one."""
        job = await self._job(caller, ref, verb, write=True)
        if job.array_id != job.id or arrayspec.ref(str(ref)) is not None:
            return [job]
        tasks = [t for t in await self.store.array_tasks(job.id) if not t.deleted]
        for task in tasks:
            self._check(caller, task, verb, write=True)
        return tasks

    async def usage(self, caller: Caller, *, since: float, until: float | None, by: str) -> dict[str, Any]:
        """GPU-hours per user or project (`by`) in [since, until) (until: now), like sreport: every job's, the
        deleted ones too (sums only: no job is named)."""
        now = self.clock()
        until = now if until is None else until
        if since >= until:
            raise UsageError("since must be before until")
        try:
            rows, good, all_good = await self.window(since, until, now, by)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        total = usage.Usage(sum(u.gpu_seconds for u in rows.values()), sum(u.jobs for u in rows.values()))
        order = sorted(rows, key=lambda k: (-rows[k].gpu_seconds, k))  # most used first
        shown = {k: {**rows[k].to_json(), **good.get(k, goodput.Goodput()).to_json()} for k in order}
        return {"since": since, "until": until, "by": by, "rows": shown, "total": {**total.to_json(),
                **all_good.to_json()}, "quotas": await self._quota_json(by)}  # fmt: skip

    async def shares(self) -> dict[str, Any]:
        """How the cluster is shared (Slurm's `sshare`, with sreport's sums): each account's fair-share standing
        (`fairshare.standing`; null where fair share is off), the GPU-hours and goodput of each project and user
        over the last day and week, and the quotas with what each uses now. Sums only: no job is named."""
        now = self.clock()
        placer = self.loop.placer
        fair = self.config.scheduler.fairshare
        standing = None
        if fair is not None:
            declared = self.config.projects
            used = await placer.decayed_usage()
            queued = {fairshare.account(j.project, j.owner, declared)
                      for j in await self.store.jobs(statuses=[JobStatus.QUEUED])}  # fmt: skip
            rows = fairshare.standing(used, queued, fair.shares, fair.default_share, by_user=not declared)
            standing = {"half_life_s": fair.half_life, "by_user": not declared, "accounts": [r.to_json() for r in rows]}
        spans: dict[str, Any] = {}
        for name, span in (("day", 86400.0), ("week", 7 * 86400.0)):
            for by in ("project", "user"):
                rows_, good, _ = await self.window(now - span, now, now, by)
                spans.setdefault(name, {})[by] = {
                    key: {**rows_[key].to_json(), **good.get(key, goodput.Goodput()).to_json()} for key in sorted(rows_)
                }
        quotas_ = {by: await self._quota_json(by) for by in ("project", "user")}
        return {"now": now, "fairshare": standing, **spans, "quotas": quotas_}

    async def window(
        self, since: float, until: float, now: float, by: str
    ) -> tuple[dict[str, Usage], dict[str, goodput.Goodput], goodput.Goodput]:
        """Usage and goodput per user or project (`by`) in [since, until), and the whole goodput: the window's
        whole UTC days from the day sums of the jobs rolled into them (scheduler/retention.py), the rest from
        runs: the jobs not rolled yet over the whole window, the rolled ones over the parts of days at its edges
        (decide/report.py). A month costs its days and its last hour's jobs, not its 80,000 jobs."""
        days = report.whole_days(since, until)
        edges = [(since, until)] if days is None else [(since, days[0]), (days[1], until)]
        owners, runs = await self.store.unrolled_runs(since, until)
        parts = [report.Part(owners, runs, since, until)]
        span = await self.store.rolled_span()
        for start, end in edges:
            if start < end:
                owners, runs = await self.store.rolled_runs(start, end, span)
                parts.append(report.Part(owners, runs, start, end, rolled=True))
        attempts, signals = await self.store.attempts_of(sorted({r.job for p in parts for r in p.runs}))
        marks = goodput.checkpoint_times(signals)
        rows, good, total = await asyncio.to_thread(report.window_sums, parts, attempts, marks, by, now, days)
        for day in await self.store.history_days(*days) if days is not None else []:
            key = day.owner if by == "user" else day.project
            was = rows.get(key, usage.Usage())
            rows[key] = usage.Usage(was.gpu_seconds + day.gpu_seconds, was.jobs + day.jobs)
            kept = goodput.Goodput(day.useful, day.rework, day.downtime, day.saved)
            good[key] = good.get(key, goodput.Goodput()) + kept
            total = total + kept
        return rows, good, total

    async def _quota_json(self, by: str) -> dict[str, Any]:
        """Per project or user (`by`) with limits: its limits and what it uses now ({} without quotas)."""
        placer = self.loop.placer
        use = await placer.quota_use()
        if not use and not await placer.quotas_on():
            return {}
        config = self.config.quotas
        named = set() if config is None else set(config.projects if by == "project" else config.users)
        named |= {name for kind, name in await self.store.quota_limits() if kind == by}
        names = sorted(named | {name for kind, name in use if kind == by})
        period = config.period if config is not None else QuotaSettings().period
        out = {}
        for name in names:
            limits = self.loop.placer.quota_limits((by, name))
            if limits is None:
                continue
            now = use.get((by, name), quotas.InUse())
            out[name] = {"limits": {k: v for k, v in dataclasses.asdict(limits).items() if v is not None},
                         "in_use": dataclasses.asdict(now), "period_s": period}  # fmt: skip
        return out

    async def set_quota(self, caller: Caller, kind: str, name: str, limits: dict[str, Any] | None) -> dict[str, Any]:
        """Set some of a project's or user's quota limits (admins only; the others stay as they are), over the
        config's; None: back to the config's. Takes effect at the next placement pass."""
        if not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} may not change quotas: that is for admins ({self._admins()})")
        if kind not in ("project", "user") or not name or any(c.isspace() for c in name):
            raise UsageError(f"a quota is of a project or a user, by name: not {kind!r} {name!r}")
        if kind == "project" and name not in self.config.projects:
            raise UsageError(undeclared_project(name, self.config.projects, "a project's quota", "set the user's"))
        if limits is not None:
            known = {f.name for f in dataclasses.fields(quotas.Limits)}
            unknown = sorted(set(limits) - known)
            if unknown or not limits:
                raise UsageError(f"quota limits are {', '.join(sorted(known))}: not {', '.join(unknown) or 'none'}")
            for key, value in limits.items():
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                    raise UsageError(f"quota {key}: a number of 0 or more, or null for no limit; not {value!r}")
                if value is not None and key != "gpu_hours" and not float(value).is_integer():
                    raise UsageError(f"quota {key}: a whole number, not {value!r}")
            limits = {k: (v if v is None or k == "gpu_hours" else int(v)) for k, v in limits.items()}
            await self.loop.placer.quotas_on()
            current = self.loop.placer.quota_limits((kind, name))  # the limits not given stay as they are
            limits = {**(dataclasses.asdict(current) if current is not None else {}), **limits}
        now = self.clock()
        async with self.store.jobs_tx(f"set the quota of {kind} {name}") as tx:
            await tx.quota(kind, name, limits, caller.user, now)
            said = "the config's again" if limits is None else json.dumps(limits, sort_keys=True)
            await tx.event(now, "Quota", f"quota of {kind} {name} set by {caller.user}: {said}")
        self._poke()
        await self.loop.placer.quotas_on()
        found = self.loop.placer.quota_limits((kind, name))
        return {"kind": kind, "name": name, "limits": None if found is None else dataclasses.asdict(found),
                "set": limits is not None}  # fmt: skip

    async def _within_quota(self, user: str, spec: JobSpec, *, count: int = 1) -> None:
        """Refuse a job (`count` jobs: an array's tasks) whose project or user would have more than its quota of
        queued jobs; called inside the transaction that writes it. Where no quota applies (no `quotas`, none set
        by an admin), a user still has at most DEFAULT_QUEUED_JOBS (Slurm's MaxSubmitJobs), counted from an index:
        the quotas' own count reads the whole queue."""
        placer = self.loop.placer
        if await placer.quotas_on():
            queued = {k: u.queued_jobs for k, u in (await placer.quota_use()).items()}
            why = quotas.submit_refusal(spec.project, user, placer.quota_limits, queued, count=count)
        else:
            cap = quotas.Limits(queued_jobs=DEFAULT_QUEUED_JOBS)
            mine = {("user", user): await self.store.queued_count(user)}
            users_only = lambda key: cap if key[0] == "user" else None  # noqa: E731
            why = quotas.submit_refusal(spec.project, user, users_only, mine, count=count)
            why = why and f"{why} (quotas.default_user.queued_jobs)"
        if why is not None:
            raise UsageError(f"job {spec.name} refused: {why}")

    async def _dependency(self, caller: Caller, spec: JobSpec) -> dependencies.Waits | None:
        """Refuse an `after:` that names a job the caller cannot see (or none), or that can never be met; else
        what it waits for (None: nothing)."""
        if spec.after is None:
            return None
        hidden = await self.hidden_jobs(caller)
        statuses = await self.loop.placer.statuses({i for ids in spec.after.as_map().values() for i in ids})
        for kind, ids in spec.after.as_map().items():
            for job_id in ids:
                if statuses.get(job_id) is None or job_id in hidden:
                    raise NotFound(f"job {spec.name}: after.{kind}: no job {job_id}")
        found = dependencies.state(spec.after.as_map(), statuses)
        if isinstance(found, dependencies.Never):
            raise UsageError(f"job {spec.name}: its dependency can never be met: {found.reason}")
        return found
