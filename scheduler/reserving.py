"""Reservations for the scheduler's callers (issue 30): admins keep nodes for a user, a project or maintenance
over a window (`reserve`, `unreserve`); anyone lists them (`reservations`). What they mean for placement is
decide/reservations.py, applied each pass by `placing.Placer` (`placement_inputs`, `reserved_for`). Part of
`Scheduler` (jobops.py).
"""

from __future__ import annotations

import re
from typing import Any

from ftconsole.scheduler.decide import placement
from ftconsole.scheduler.decide.jobs import JobStatus
from ftconsole.scheduler.decide.placement_index import Catalog, FreeView
from ftconsole.scheduler.decide.requests import node_slot
from ftconsole.scheduler.decide.reservations import Reservation, overlapping
from ftconsole.scheduler.errors import NotFound, PermissionDenied, UsageError
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.sharing import Sharing, undeclared_project
from ftconsole.scheduler.spec.config import format_duration

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Reserving(Sharing):
    """Part of `Scheduler` (jobops.py): reservations (what else the scheduler gives it: `Sharing`'s)."""

    service: ClusterService

    async def reservations(self) -> list[dict[str, Any]]:
        """Every reservation kept, by start, with its state (planned, active, ended); anyone may look."""
        now = self.clock()
        return [r.to_json(now) for r in await self.store.reservations()]

    async def reserve(
        self,
        caller: Caller,
        name: str,
        *,
        start: float | None,
        end: float,
        nodes: str | None = None,
        spec: str | None = None,
        count: int | None = None,
        user: str | None = None,
        project: str | None = None,
        maintenance: bool = False,
        reason: str = "",
    ) -> dict[str, Any]:
        """Keep nodes (a node set, or `count` nodes of a named spec, chosen now) from `start` (None: now) to `end`
        for a user, a project or maintenance (admins only). A node is in one reservation at a time. Its JSON, with
        `running`: the jobs running now on its nodes that would still run when it starts (they are not stopped)."""
        if not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} may not reserve nodes: that is for admins ({self._admins()})")
        now = self.clock()
        start = now if start is None else start
        if not _NAME.fullmatch(name or ""):
            raise UsageError(f"a reservation's name: letters, digits, . _ -, at most 64; not {name!r}")
        if end <= start or end <= now:
            raise UsageError("a reservation must end after it starts, and after now")
        if sum((user is not None, project is not None, maintenance)) != 1:
            raise UsageError("a reservation is for one of: a user (--user), a project (--project), or maintenance")
        if project is not None and project not in self.config.projects:
            why = undeclared_project(project, self.config.projects, "a reservation for a project", "reserve for a user")
            raise UsageError(why)
        kept = await self.store.reservations()
        if any(r.name == name for r in kept):
            raise UsageError(f"there is a reservation {name} already: delete it first, or choose another name")
        if (nodes is None) == (spec is None):
            raise UsageError("reserve nodes by a node set (--nodes) or by a count of a spec (--spec with --count)")
        busy = {n for r in kept if r.start < end and start < r.end for n in r.nodes}  # in another one meanwhile
        chosen = frozenset(n.name for n in self.service.select(nodes)) if nodes is not None else None
        if chosen is None:
            chosen = await self._pick(str(spec), count, busy)
        new = Reservation(name, chosen, start, end, user, project, maintenance, reason.strip(),
                                       caller.user, now)  # fmt: skip
        clash = overlapping(new, kept)
        if clash:
            shared = sorted(new.nodes & clash[0].nodes)
            raise UsageError(
                f"{', '.join(shared[:4])} {'is' if len(shared) == 1 else 'are'} in reservation "
                f"{clash[0].describe(now)} then: a node is in one reservation at a time"
            )
        running = await self._running_into(new)
        async with self.store.jobs_tx(f"reserve {name}") as tx:
            await tx.reserve(new)
            why = f": {new.reason}" if new.reason else ""
            text = f"reservation {new.describe(now)} on {','.join(sorted(new.nodes))} made by {caller.user}{why}"
            await tx.event(now, "Reservation", text)
        self._poke()
        return {**new.to_json(now), "running": running}

    async def unreserve(self, caller: Caller, name: str) -> dict[str, Any]:
        """Give a reservation's nodes back (admins only); its jobs waiting for it can then never start."""
        if not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} may not delete reservations: that is for admins ({self._admins()})")
        now = self.clock()
        found = next((r for r in await self.store.reservations() if r.name == name), None)
        if found is None:
            raise NotFound(f"no reservation {name}")
        async with self.store.jobs_tx(f"delete reservation {name}") as tx:
            await tx.reserve(None, name=name)
            await tx.event(now, "Reservation", f"reservation {found.describe(now)} deleted by {caller.user}")
        self._poke()
        return found.to_json(now)

    async def _pick(self, spec: str, count: int | None, busy: set[str]) -> frozenset[str]:
        """`count` usable nodes that can hold the spec, outside other reservations of the window: the ones with
        the most GPUs free now first, then by name."""
        named = self.config.specs.get(spec)
        if named is None:
            defined = ", ".join(sorted(self.config.specs)) or "none"
            raise UsageError(f"spec {spec!r} is not defined in the cluster config (defined: {defined})")
        if count is None or count < 1:
            raise UsageError("reserving by spec needs --count, at least 1")
        views = await self.service.nodes(extras=False)
        slots = tuple(node_slot(v.to_json(), self.config.runtime_for(v.node.pool)) for v in views)
        catalog = Catalog(slots, [p for p, pool in self.config.pools.items() if pool.schedule_degraded])
        request = placement.JobRequest(
            id="(reservation)",
            submitted_at=0.0,
            nodes=count,
            pool=named.pool,
            candidates=(placement.Candidate(spec, named.gpus_per_node, named.gpu_model),),
        )
        candidates = [n for n in catalog.eligible(request, request.candidates[0]) if n not in busy]
        if len(candidates) < count:
            raise UsageError(
                f"only {len(candidates)} usable node(s) can hold spec {spec} outside other reservations of that "
                f"window: not {count}"
            )
        held = await self.store.runs(held=True)
        free = FreeView.current(catalog, [placement.Allocation(str(r.job), r.node, r.gpus) for r in held])
        return frozenset(sorted(candidates, key=lambda n: (-len(free.free[n]), n))[:count])

    async def _running_into(self, r: Reservation) -> list[dict[str, Any]]:
        """The jobs running on the reservation's nodes that may still run at its start (no max_runtime, or one
        that ends after it): they are not stopped; an admin decides."""
        now = self.clock()
        jobs = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING])}
        out: dict[int, dict[str, Any]] = {}
        for run in await self.store.runs(held=True):
            job = jobs.get(run.job)
            if job is None or run.node not in r.nodes or job.id in out:
                continue
            ends = job.deadline
            if ends is None or ends > r.start:
                until = "no max_runtime" if ends is None else f"ends in {format_duration(max(0, ends - now))}"
                out[job.id] = {"id": job.id, "node": run.node, "owner": job.owner, "ends": ends, "why": until}
        return list(out.values())
