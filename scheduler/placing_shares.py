"""What the teams sharing the cluster weigh in a placement pass (part of `placing.Placer`): the quotas (the
limits of each project and user, what each uses now) and the fair-share factor of each account
(docs/configuration.md, "Quotas" and "Fair share").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ftconsole.scheduler.decide import fairshare, placement, quotas
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.ledger import MIN_SLOT_S, Ledger, slot_length
from ftconsole.scheduler.spec.config import ClusterConfig, QuotaSettings, SchedulerSettings
from ftconsole.scheduler.store.db import Store

QUOTA_HOURS_EVERY_S = 60.0  # quotas' GPU-hours of the period are read again this often


class SharingWeights:
    """Part of `Placer` (placing.py): quotas and fair share."""

    store: Store
    config: ClusterConfig
    settings: SchedulerSettings
    clock: Callable[[], float]
    _used: dict[tuple[str, str], float]
    _used_at: float
    _factors: dict[tuple[str, str], fairshare.Factor]
    _hours: dict[quotas.Key, float]
    _hours_at: float
    _set_quotas: dict[quotas.Key, tuple[dict[str, Any], str, float]]
    _use: tuple[tuple[int, float], dict[quotas.Key, quotas.InUse]] | None
    _ledger: Ledger | None
    _folded_at: float

    async def quotas_on(self) -> bool:
        """Whether any quota applies: the config's `quotas`, or limits an admin set (`ftconsole quota`); reads
        the latter for `quota_limits`."""
        self._set_quotas = await self.store.quota_limits()
        return self.config.quotas is not None or bool(self._set_quotas)

    async def quota_use(self) -> dict[quotas.Key, quotas.InUse]:
        """What each project and user uses now: GPUs held by its running jobs, running and queued jobs, and the
        GPU-hours of the last `quotas.period` (read again every minute)."""
        if not await self.quotas_on():
            return {}
        version = self.store.version(("jobs", "runs"))
        if (
            self._use is not None
            and self._use[0] == (version, self._hours_at)
            and self.clock() - self._hours_at < QUOTA_HOURS_EVERY_S
        ):
            return self._use[1]
        period = self.config.quotas.period if self.config.quotas is not None else QuotaSettings().period
        active = await self.store.jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING], deleted=True)
        held = await self.store.runs(held=True)
        # a deep queue's 100,000 jobs counted in a worker thread: requests meanwhile are answered between its turns
        out = await asyncio.to_thread(_in_use, active, held)
        now = self.clock()
        if now - self._hours_at >= QUOTA_HOURS_EVERY_S:
            ledger = await self._ledger_now()  # the period's ended runs as the ledger keeps them, not the history
            self._hours = ledger.hours(await self.store.unsettled_usage(), now - period, now)
            self._hours_at = now
        for key, hours in self._hours.items():
            out.setdefault(key, quotas.InUse()).gpu_hours = hours
        self._use = ((version, self._hours_at), out)
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
        declared = self.config.projects
        await self.decayed_usage()
        accounts = {w: fairshare.account(*w, declared) for w in wanted}
        self._factors = fairshare.factors(
            self._used, accounts.values(), fair.shares, fair.default_share, by_user=not declared
        )
        return {w: self._factors[a] for w, a in accounts.items()}

    async def decayed_usage(self) -> Mapping[tuple[str, str], float]:
        """Each account's decayed GPU-seconds, as fair share weighs them (read again when `fairshare.every` has
        passed); {} where fair share is off."""
        fair = self.settings.fairshare
        if fair is None:
            return {}
        now = self.clock()
        if now - self._used_at >= fair.every:
            ledger = await self._ledger_now()  # the ended runs' decayed usage as the ledger keeps it, not the history
            self._used = ledger.usage(await self.store.unsettled_usage(), now, declared=self.config.projects)
            self._used_at = now
        return self._used

    async def refresh_usage(self) -> None:
        """Fold the runs ended since the last time into the usage ledger (decide/ledger.py) when fair share or
        the quotas' hours are due again: a write, so the placement pass's alone (never a standby's, never inside
        another transaction). The config's half-life or quota period changed: built again, once."""
        now = self.clock()
        fair = self.settings.fairshare
        every = min(fair.every, QUOTA_HOURS_EVERY_S) if fair is not None else QUOTA_HOURS_EVERY_S
        if now - self._folded_at < every or (fair is None and not await self.quotas_on()):
            return  # not due, or nobody reads it: the runs ended meanwhile are folded in when it is
        self._folded_at = now
        period = self.config.quotas.period if self.config.quotas is not None else QuotaSettings().period
        self._ledger = await self.store.fold_usage(
            now,
            half_life=fair.half_life if fair is not None else None,
            slot=slot_length(period),
            since=now - period,
            kept=self._ledger,
        )

    async def _ledger_now(self) -> Ledger:
        """The ledger of the last fold; where this scheduler folded none yet (a standby, the first pass), as the
        store has it (read only). The runs it lacks (`Store.unsettled_usage`) are added fresh by its readers."""
        if self._ledger is None:
            self._ledger = await self.store.read_ledger()
        if self._ledger is not None:
            return self._ledger
        fair = self.settings.fairshare
        return Ledger(at=self.clock(), half_life=fair.half_life if fair is not None else None, slot=MIN_SLOT_S, since=0)

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


def _in_use(active: Sequence[Job], held: Sequence[Run]) -> dict[quotas.Key, quotas.InUse]:
    """What each project and user holds now: its running and queued jobs (`active`) and the GPUs of the `held`
    runs of its running ones."""
    out: dict[quotas.Key, quotas.InUse] = {}
    by_id = {j.id: j for j in active}
    for job in active:
        for key in (("project", job.project), ("user", job.owner)):
            use = out.setdefault(key, quotas.InUse())
            if job.status is JobStatus.RUNNING:
                use.running_jobs += 1
            else:
                use.queued_jobs += 1
    for r in held:
        holder = by_id.get(r.job)
        if holder is not None and holder.status is JobStatus.RUNNING:
            for key in (("project", holder.project), ("user", holder.owner)):
                out.setdefault(key, quotas.InUse()).gpus += len(r.gpus)
    return out
