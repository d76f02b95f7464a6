"""The repair climbs under way (scheduler/repair.py is the ladder itself): what `nodes` shows of a node being
repaired, each climb kept in the store as it goes (so that the next scheduler picks it up), the automatic repairs
of each node in the last day (in the store too: the daily cap holds across restarts), and the count of each step's
results. Kept by `ClusterService` (`repairs`), apart from the ladder, which needs the service.

In the store's `meta` (small values kept across restarts, the same on both engines): `repair.climb.<node>`, the
climb under way on that node (`Climb.to_record`), removed when it ends; `repair.auto.<node>`, the times of the
automatic repairs of that node in the last day."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ftconsole.scheduler.errors import FtError

log = logging.getLogger("ftconsole.scheduler")

DAY_S = 86400.0
CLIMB_KEY = "repair.climb."  # + the node's name: its climb under way
AUTO_KEY = "repair.auto."  # + the node's name: the times of its automatic repairs in the last day


class KeptValues(Protocol):
    """The store's small values kept across restarts (`Store.kept` and its kin, in history.py)."""

    async def kept(self, key: str) -> str | None: ...

    async def keep(self, key: str, value: str) -> None: ...

    async def unkeep(self, key: str) -> None: ...

    async def kept_under(self, prefix: str) -> dict[str, str]: ...


@dataclass(frozen=True)
class Climb:
    """A repair under way: its node, who started it and why, the step it is on and since when; and what a scheduler
    that picks it up after a restart must know: whether a GPU reset was asked (`reset`), the node's boot id before
    its reboot (`boot_id`) and since when its new boot is waited for (`boot_since`: when the reboot was asked, then
    when its command returned), what was done so far (`done`), and whether it was picked up (`picked_up`)."""

    node: str
    by: str
    why: str  # what the node was, and by whom: drained or isolated (never the reason: it may name a private job)
    started: float
    step: str = "waiting"
    since: float = 0.0
    reset: bool = False
    boot_id: str | None = None
    boot_since: float | None = None
    done: tuple[str, ...] = ()
    picked_up: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "since": self.since, "started": self.started, "by": self.by, "why": self.why}

    def to_record(self) -> str:
        """What the store keeps of it (`repair.climb.<node>`), JSON."""
        more = {"reset": self.reset, "boot_id": self.boot_id, "boot_since": self.boot_since, "done": list(self.done)}
        return json.dumps({**self.to_json(), **more, "picked_up": self.picked_up})

    @classmethod
    def from_record(cls, node: str, text: str) -> Climb | None:
        """A climb as the store kept it; None where the record cannot be read (written by hand, or by a version to
        come that wrote it otherwise)."""
        try:
            d = json.loads(text)
            climb = cls(node, str(d["by"]), str(d["why"]), float(d["started"]), str(d["step"]), float(d["since"]),
                        bool(d.get("reset", False)), _text(d.get("boot_id")), _number(d.get("boot_since")),
                        tuple(str(x) for x in d.get("done", ())), bool(d.get("picked_up", False)))  # fmt: skip
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return climb if math.isfinite(climb.started) and math.isfinite(climb.since) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


class Repairs:
    """The climbs under way in this process, kept in the store as they go; the automatic repairs of each node in the
    last day, counted in the store; and the count of each step's results (`ftconsole_node_repairs_total`)."""

    def __init__(self, store: KeptValues) -> None:
        self.store = store
        self.climbs: dict[str, Climb] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()  # (step, result)

    def start(self, climb: Climb, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Climb the ladder for `climb.node` (`work`, in the background), known in `climbs` until it ends."""
        node = climb.node
        self.climbs[node] = climb
        task = asyncio.create_task(work())
        self._tasks[node] = task
        task.add_done_callback(lambda t: self._ended(node, t))

    async def auto_room(self, node: str, now: float, per_day: int) -> bool:
        """Whether the scheduler may start another automatic repair of `node` now (and count it, if so), counted
        from the store: a restart does not start the count again."""
        key = AUTO_KEY + node
        times = [t for t in _times(await self.store.kept(key)) if now - t < DAY_S]
        if len(times) >= per_day:
            return False
        await self.store.keep(key, json.dumps([*times, now]))
        return True

    async def step(self, node: str, step: str, now: float, **changes: Any) -> None:
        """The climb of `node` on to `step`, with what it must remember (`changes`), here and in the store."""
        climb = self.climbs.get(node)
        if climb is not None:
            self.climbs[node] = replace(climb, step=step, since=now, **changes)
            await self.save(node)

    async def save(self, node: str) -> None:
        """The climb of `node` as it is now, in the store: the next scheduler picks it up from there."""
        climb = self.climbs.get(node)
        if climb is not None:
            await self.store.keep(CLIMB_KEY + node, climb.to_record())

    async def stored(self) -> dict[str, Climb | None]:
        """The climbs kept in the store, by node (None: a record that cannot be read)."""
        kept = await self.store.kept_under(CLIMB_KEY)
        return {key[len(CLIMB_KEY) :]: Climb.from_record(key[len(CLIMB_KEY) :], text) for key, text in kept.items()}

    async def forget(self, node: str) -> None:
        """The climb of `node` has ended (or is dropped): its record leaves the store. A store that refuses (a
        scheduler that no longer leads) leaves it there, for the next leader to pick up."""
        try:
            await self.store.unkeep(CLIMB_KEY + node)
        except FtError as exc:
            log.warning("%s: cannot remove the record of its repair: %s", node, exc)

    def _ended(self, node: str, task: asyncio.Task[None]) -> None:
        self.climbs.pop(node, None)
        self._tasks.pop(node, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("repair of %s failed", node, exc_info=task.exception())

    async def close(self) -> None:
        """The climbs stop here (the scheduler stops, or no longer leads); their records stay in the store."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _times(text: str | None) -> list[float]:
    """The times kept under `repair.auto.<node>` (none where there is no list of numbers)."""
    try:
        found = json.loads(text) if text else []
        return [float(t) for t in found] if isinstance(found, list) else []
    except (ValueError, TypeError):
        return []
