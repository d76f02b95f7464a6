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
    of their share of the GPUs go first. Usage decays with `half_life`; `shares` gives projects their weight
    (any other project: `default_share`); users of a project share it equally. Recomputed every `every`."""

    half_life: PositiveDuration = 7 * 86400.0
    shares: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    default_share: Annotated[float, Field(gt=0)] = 1.0
    every: PositiveDuration = 60.0


class QuotaLimits(_Strict):
    """The most a project or a user may have (decide/quotas.py); a limit left out is no limit."""

    gpus: int | None = Field(None, ge=0)  # GPUs its running jobs hold at once
    running_jobs: int | None = Field(None, ge=0)
    queued_jobs: int | None = Field(None, ge=0)  # a submit past it is refused
    gpu_hours: float | None = Field(None, ge=0)  # over the last `period`


class QuotaSettings(_Strict):
    """Quotas per project and per user (docs/configuration.md, "Quotas"): a project or user not named has the
    default's limits (none without one)."""

    projects: dict[str, QuotaLimits] = Field(default_factory=dict)
    users: dict[str, QuotaLimits] = Field(default_factory=dict)
    default_project: QuotaLimits | None = None
    default_user: QuotaLimits | None = None
    period: PositiveDuration = 7 * 86400.0  # what gpu_hours counts: the GPU-hours of the last period

    def limits(self, key: tuple[str, str]) -> QuotaLimits | None:
        kind, name = key
        if kind == "project":
            return self.projects.get(name, self.default_project)
        return self.users.get(name, self.default_user)
