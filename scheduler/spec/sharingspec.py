"""The cluster config's keys for teams sharing a cluster (issue 30): fair share (`scheduler.fairshare`) and quotas
(`quotas`). Part of the cluster config (config.py re-exports them); what they mean is decide/fairshare.py and
decide/quotas.py.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ftconsole.scheduler.spec.specbase import Strict as _Strict
from ftconsole.scheduler.spec.values import PositiveDuration


class FairShare(_Strict):
    """Fair share (decide/fairshare.py): within a priority level, the jobs of projects and users that used less
    of their share of the GPUs go first. Usage decays with `half_life`; `shares` gives declared projects their
    weight (any other project: `default_share`); users of a project share it equally. Without declared projects
    it is per user, and `shares` is refused (ClusterConfig.cross_problems). Recomputed every `every`."""

    half_life: PositiveDuration = 7 * 86400.0
    shares: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    default_share: Annotated[float, Field(gt=0)] = 1.0
    every: PositiveDuration = 60.0


# The most jobs one user may have queued (issue 40), as Slurm's MaxSubmitJobs per user (and its MaxJobCount's
# default): a user's `queued_jobs` wherever `quotas` is given, unless set otherwise (null: no limit). An array of
# MAX_TASKS (10,000) tasks fits, alone. Without `quotas` nothing is counted and no cap applies: quotas count
# each user's jobs by reading the whole queue at every submit (Placer.quota_use), which on by default would
# cost every cluster's submits (4 times slower with 1,000 queued, bench/submit.py).
DEFAULT_QUEUED_JOBS = 10_000


class QuotaLimits(_Strict):
    """The most a project or a user may have (decide/quotas.py); a limit left out is no limit."""

    gpus: int | None = Field(None, ge=0)  # GPUs its running jobs hold at once
    running_jobs: int | None = Field(None, ge=0)
    queued_jobs: int | None = Field(None, ge=0)  # a submit past it is refused
    gpu_hours: float | None = Field(None, ge=0)  # over the last `period`


class UserLimits(QuotaLimits):
    """A user's limits: as a project's, but `queued_jobs` left out is DEFAULT_QUEUED_JOBS (null: no limit)."""

    queued_jobs: int | None = Field(DEFAULT_QUEUED_JOBS, ge=0)


class QuotaSettings(_Strict):
    """Quotas per project and per user (docs/configuration.md, "Quotas"): a project or user not named has the
    default's limits (none without one). A user's queued jobs are DEFAULT_QUEUED_JOBS unless set otherwise.
    Project limits hold for declared projects only (decide/quotas.py, `applies`)."""

    projects: dict[str, QuotaLimits] = Field(default_factory=dict)
    users: dict[str, UserLimits] = Field(default_factory=dict)
    default_project: QuotaLimits | None = None
    default_user: UserLimits | None = Field(default_factory=UserLimits)
    period: PositiveDuration = 7 * 86400.0  # what gpu_hours counts: the GPU-hours of the last period

    def limits(self, key: tuple[str, str]) -> QuotaLimits | None:
        kind, name = key
        if kind == "project":
            return self.projects.get(name, self.default_project)
        return self.users.get(name, self.default_user)
