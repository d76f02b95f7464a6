"""Reservations (Slurm's `scontrol create reservation`): nodes kept for a user, a project or maintenance over a
window. Pure: which nodes a queued job may use now, or why it waits, or why it never can.

A reservation holds a set of nodes (given as a node set, or a count of a spec's nodes chosen when it is made)
from `start` to `end`, for a user, a project, or maintenance (for no job at all).

A job that names no reservation (`reservation:` absent) keeps out of reserved nodes: it may not start on a
node whose reservation runs now, nor on one whose reservation starts before the job would end (now plus its
`max_runtime`; a job without one never ends, so it keeps out of every reservation to come). Placement and
backfill see those nodes as not there for it, and its message says why when they are what it lacks.

A job that names one (`reservation: NAME`) runs only on that reservation's nodes and only within its window,
and only when the reservation is for its user or its project: before the window it waits, saying when it
starts; once the window is over, or when the reservation is gone or for maintenance, it can never start. A
project's reservation takes only jobs whose project the cluster config declares (`declared`; issue 40): without
declared projects a job's `project:` is a label anyone may write, so naming one proves nothing (and such a
reservation is refused when made: reserving.py).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: frozenset[str]
    start: float
    end: float
    user: str | None = None  # for this user's jobs
    project: str | None = None  # for this project's jobs
    maintenance: bool = False  # for no job: the nodes are down for work on them
    reason: str = ""
    by: str = ""
    created: float = 0.0

    def who(self) -> str:
        if self.maintenance:
            return "maintenance"
        if self.user is not None:
            return f"user {self.user}"
        return f"project {self.project}"

    def describe(self, now: float) -> str:
        """'maint-1 (maintenance, 14:00-18:00)'."""
        return f"{self.name} ({self.who()}, {_clock(self.start, now)}-{_clock(self.end, now)})"

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "name": self.name,
            "nodes": sorted(self.nodes),
            "start": self.start,
            "end": self.end,
            "user": self.user,
            "project": self.project,
            "maintenance": self.maintenance,
            "reason": self.reason,
            "by": self.by,
            "created": self.created,
            "state": "active" if self.start <= now < self.end else "ended" if now >= self.end else "planned",
        }


@dataclass(frozen=True)
class Allowed:
    """The nodes the job may use (None: any), and what keeps it off the others ("" when nothing does)."""

    nodes: frozenset[str] | None
    note: str = ""


@dataclass(frozen=True)
class Waits:
    reason: str


@dataclass(frozen=True)
class Never:
    reason: str


def allowed(
    named: str | None,
    owner: str,
    project: str,
    max_runtime: float | None,
    reservations: Iterable[Reservation],
    now: float,
    all_nodes: Collection[str],
    declared: Collection[str],
) -> Allowed | Waits | Never:
    """Where a queued job may start now (`declared`: the config's projects); see the module docstring."""
    live = [r for r in reservations if r.end > now]
    if named is not None:
        found = next((r for r in live if r.name == named), None)
        if found is None:
            return Never(f"reservation {named} is over, or there is none")
        refusal = refused(found, owner, project, declared)
        if refusal is not None:
            return Never(refusal)
        if now < found.start:
            return Waits(f"waiting for reservation {found.describe(now)} to start")
        return Allowed(found.nodes)
    ends = None if max_runtime is None else now + max_runtime
    kept = [r for r in live if r.start <= now or ends is None or r.start < ends]
    if not kept:
        return Allowed(None)
    out = frozenset().union(*(r.nodes for r in kept))
    held = [r for r in kept if r.nodes & set(all_nodes)]
    if not held:
        return Allowed(None)
    parts = []
    for r in held:
        when = "reserved" if r.start <= now else "it would run into"
        parts.append(f"{when} {r.describe(now)} on {_names(r.nodes)}")
    return Allowed(frozenset(all_nodes) - out, f"not on reserved nodes: {'; '.join(parts)}")


def refused(r: Reservation, owner: str, project: str, declared: Collection[str]) -> str | None:
    """Why a job of `owner` in `project` may not use `r` (None: it may); `declared`: the config's projects."""
    if r.maintenance:
        return f"reservation {r.name} is for maintenance: no job runs in it"
    if r.user is not None and r.user != owner:
        return f"reservation {r.name} is for user {r.user}, not {owner}"
    if r.project is not None and r.project != project:
        return f"reservation {r.name} is for project {r.project}, not {project}"
    if r.project is not None and r.project not in declared:
        return (
            f"reservation {r.name} is for project {r.project}, which the cluster config does not declare (projects): "
            "naming it proves nothing"
        )
    return None


def overlapping(new: Reservation, others: Iterable[Reservation]) -> list[Reservation]:
    """The reservations that share a node with `new` during its window (a node is in one reservation at a time)."""
    return [r for r in others if r.nodes & new.nodes and r.start < new.end and new.start < r.end]


def _names(nodes: Collection[str], most: int = 4) -> str:
    shown = sorted(nodes)
    text = ",".join(shown[:most])
    return text + f",... ({len(shown)} nodes)" if len(shown) > most else text


def _clock(t: float, now: float) -> str:
    """'14:00' today, else '2026-11-27 14:00'."""
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(t))
