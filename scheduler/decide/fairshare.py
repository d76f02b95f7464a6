"""Fair share (issue 30; Slurm's classic factor): pure, from the runs' GPU time, decayed, against the shares of
the cluster config (`scheduler.fairshare`).

Usage is GPU-seconds that decay with a half-life: a GPU-second used `half_life` ago counts one half, one used
twice that long ago one quarter (a run's whole span, integrated). Two levels, as Slurm's classic formula
`2^(-usage/shares)` at each:

- a project: its share of all the usage (U) against its share of all the shares (S) of the projects that
  count now (those named in `shares`, and any other with usage or a queued job, at `default_share`);
- a user within a project: the user's share of the project's usage against an equal share among the project's
  users that count (with usage or a queued job in it).

A job's factor is the product, in (0, 1]: 1 for one whose project and user used nothing, 0.5 for one whose
project used just its share (and whose user nothing), less for more. Within one priority level, the queue puts
higher factors first, then the older job (placement.queue_key).

Projects count only where the cluster config declares them (`account`, issue 40). Without declared projects a
job's `project:` is a label anyone may write: a fresh name would be a fresh project, at the top factor, and
would dilute every other project's share. So there every job counts under one project (`DEFAULT_PROJECT`) and
the factor has one level (`by_user`): the user's share of all the usage against an equal share among the users
that count.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ftconsole.scheduler.decide.jobs import Job, Run

HORIZON = 10  # half-lives: older usage (less than a thousandth) is left out
DEFAULT_PROJECT = "default"  # what a job counts under when its project is not declared (a spec's default too)


def account(project: str, user: str, declared: Collection[str]) -> tuple[str, str]:
    """The (project, user) a job's usage and factor count under: its project where the config declares it (a
    job may name only those), else `DEFAULT_PROJECT`: with no projects declared, every job (fair share is per
    user); with some, a job queued before they were."""
    return (project, user) if project in declared else (DEFAULT_PROJECT, user)


def decayed_seconds(start: float, end: float, now: float, half_life: float) -> float:
    """The integral over [start, end) of 2^(-(now - t) / half_life): one second now counts 1."""
    if end <= start:
        return 0.0
    k = math.log(2) / half_life
    return (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k


def usage(
    jobs: Mapping[int, Job], runs: Iterable[Run], now: float, half_life: float, *, declared: Collection[str]
) -> dict[tuple[str, str], float]:
    """(project, user) -> its decayed GPU-seconds, the project as `account` counts it (`declared`: the config's
    projects)."""
    out: dict[tuple[str, str], float] = {}
    horizon = now - HORIZON * half_life
    for r in runs:
        if r.started is None or (r.ended is not None and r.ended < horizon):
            continue
        job = jobs.get(r.job)
        if job is None:
            continue
        used = len(r.gpus) * decayed_seconds(max(r.started, horizon), min(r.ended or now, now), now, half_life)
        if used > 0:
            key = account(job.project, job.owner, declared)
            out[key] = out.get(key, 0.0) + used
    return out


@dataclass(frozen=True)
class Factor:
    value: float  # in (0, 1]: higher goes first
    project_ratio: float  # the project's share of the usage over its share of the shares (1: just its share)
    user_ratio: float  # the same for the user within the project (`by_user`: within all the usage)
    by_user: bool = False  # one level: no projects are declared (`factors`)

    def describe(self, project: str, user: str) -> str:
        """What it means, in a few words: "fair share 0.21: project vision used 2.1x its share"; without declared
        projects "fair share 0.25: ann used 2.0x their share"."""
        if self.by_user:
            used = f": {user} used {self.user_ratio:.1f}x their share" if self.user_ratio >= 0.05 else ""
            return f"fair share {self.value:.2f}{used}"
        parts = []
        if self.project_ratio >= 0.05:
            parts.append(f"project {project} used {self.project_ratio:.1f}x its share")
        if self.user_ratio >= 0.05 and self.user_ratio != 1.0:
            parts.append(f"{user} {self.user_ratio:.1f}x theirs in it")
        return f"fair share {self.value:.2f}" + (f": {', '.join(parts)}" if parts else "")


def factors(
    used: Mapping[tuple[str, str], float],
    queued: Iterable[tuple[str, str]],
    shares: Mapping[str, float],
    default_share: float,
    *,
    by_user: bool = False,
) -> dict[tuple[str, str], Factor]:
    """The factor of each (project, user) of `queued` (the queued jobs'), from `used` (`usage`). `by_user` (no
    projects declared: every key's project is `DEFAULT_PROJECT`): one level, the user's within all the usage."""
    wanted = set(queued)
    if by_user:
        return _by_user(used, wanted)
    projects = set(shares) | {p for p, _ in used} | {p for p, _ in wanted}
    total_shares = sum(shares.get(p, default_share) for p in projects)
    total = sum(used.values())
    by_project: dict[str, float] = {}
    users: dict[str, set[str]] = {}
    for (p, u), seconds in used.items():
        by_project[p] = by_project.get(p, 0.0) + seconds
        users.setdefault(p, set()).add(u)
    for p, u in wanted:
        users.setdefault(p, set()).add(u)
    out = {}
    for p, u in wanted:
        share = shares.get(p, default_share) / total_shares if total_shares > 0 else 1.0
        project_ratio = (by_project.get(p, 0.0) / total) / share if total > 0 and share > 0 else 0.0
        mine = by_project.get(p, 0.0)
        user_ratio = (used.get((p, u), 0.0) / mine) * len(users[p]) if mine > 0 else 0.0
        value = 2.0**-project_ratio * 2.0**-user_ratio
        out[(p, u)] = Factor(value, project_ratio, user_ratio)
    return out


def _by_user(used: Mapping[tuple[str, str], float], wanted: set[tuple[str, str]]) -> dict[tuple[str, str], Factor]:
    """Slurm's classic factor at one level: each user's share of all the usage against an equal share among the
    users that count (with usage or a queued job)."""
    total = sum(used.values())
    mine: dict[str, float] = {}
    for (_, u), seconds in used.items():
        mine[u] = mine.get(u, 0.0) + seconds
    users = set(mine) | {u for _, u in wanted}
    out = {}
    for p, u in wanted:
        ratio = (mine.get(u, 0.0) / total) * len(users) if total > 0 else 0.0
        out[(p, u)] = Factor(2.0**-ratio, 0.0, ratio, by_user=True)
    return out


@dataclass(frozen=True)
class Standing:
    """An account's place in fair share (Slurm's `sshare` row): the share of the cluster it is due, the share of
    the decayed usage it took, its decayed GPU-seconds and its factor."""

    project: str
    user: str
    share: float  # of the cluster: its project's share of the shares, split equally among the project's users
    usage: float  # of all the decayed usage
    seconds: float  # decayed GPU-seconds
    factor: Factor

    def to_json(self) -> dict[str, object]:
        return {"project": self.project, "user": self.user, "share": round(self.share, 6),
                "usage": round(self.usage, 6), "gpu_hours": round(self.seconds / 3600.0, 3),
                "factor": round(self.factor.value, 6), "project_ratio": round(self.factor.project_ratio, 4),
                "user_ratio": round(self.factor.user_ratio, 4),
                "text": self.factor.describe(self.project, self.user)}  # fmt: skip


def standing(
    used: Mapping[tuple[str, str], float],
    queued: Iterable[tuple[str, str]],
    shares: Mapping[str, float],
    default_share: float,
    *,
    by_user: bool = False,
) -> list[Standing]:
    """Every account that counts now (with decayed usage or a queued job), by project and user: the same
    figures `factors` weighs."""
    accounts = set(used) | set(queued)
    found = factors(used, accounts, shares, default_share, by_user=by_user)
    total = sum(used.values())
    users: dict[str, set[str]] = {}
    for p, u in accounts:
        users.setdefault(DEFAULT_PROJECT if by_user else p, set()).add(u)
    projects = set(shares) | {p for p, _ in accounts}
    total_shares = sum(shares.get(p, default_share) for p in projects)
    out = []
    for p, u in sorted(accounts):
        if by_user:
            share = 1.0 / len(users[DEFAULT_PROJECT])
        else:
            share = (shares.get(p, default_share) / total_shares if total_shares > 0 else 1.0) / len(users[p])
        seconds = used.get((p, u), 0.0)
        out.append(Standing(p, u, share, seconds / total if total > 0 else 0.0, seconds, found[(p, u)]))
    return out
