"""The repair climbs under way in this process (scheduler/repair.py is the ladder itself): what `nodes` shows of a
node being repaired, the automatic repairs of each node in the last day, and the count of each step's results.
Kept by `ClusterService` (`repairs`), apart from the ladder, which needs the service."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger("ftconsole.scheduler")

DAY_S = 86400.0


@dataclass(frozen=True)
class Climb:
    """A repair under way: its node, who started it and why, the step it is on and since when."""

    node: str
    by: str
    why: str  # what the node was, and by whom: drained or isolated (never the reason: it may name a private job)
    started: float
    step: str = "waiting"
    since: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "since": self.since, "started": self.started, "by": self.by, "why": self.why}


class Repairs:
    """The climbs under way in this process, the automatic ones of each node in the last day, and the count of
    each step's results (`ftconsole_node_repairs_total`)."""

    def __init__(self) -> None:
        self.climbs: dict[str, Climb] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._auto: dict[str, collections.deque[float]] = {}
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()  # (step, result)

    def start(self, node: str, *, by: str, why: str, now: float, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Climb the ladder for `node` (`work`, in the background), known in `climbs` until it ends."""
        self.climbs[node] = Climb(node, by, why, now, since=now)
        task = asyncio.create_task(work())
        self._tasks[node] = task
        task.add_done_callback(lambda t: self._ended(node, t))

    def auto_room(self, node: str, now: float, per_day: int) -> bool:
        """Whether the scheduler may start another automatic repair of `node` now (and count it, if so)."""
        times = self._auto.setdefault(node, collections.deque())
        while times and now - times[0] >= DAY_S:
            times.popleft()
        if len(times) >= per_day:
            return False
        times.append(now)
        return True

    def step(self, node: str, step: str, now: float) -> None:
        climb = self.climbs.get(node)
        if climb is not None:
            self.climbs[node] = replace(climb, step=step, since=now)

    def _ended(self, node: str, task: asyncio.Task[None]) -> None:
        self.climbs.pop(node, None)
        self._tasks.pop(node, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("repair of %s failed", node, exc_info=task.exception())

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
