"""The store's reads of what teams sharing a cluster set at run time (issue 30): quota limits an admin set, and
reservations. Part of `Store` (db.py); written through `JobTx.quota` and `JobTx.reserve`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from ftconsole.scheduler.decide.reservations import Reservation
from ftconsole.scheduler.store.engine import Engine
from ftconsole.scheduler.store.records import reservation_from_row


class SharingReads:
    _db: Engine

    async def _kept_read(self, key: tuple[Any, ...], tables: frozenset[str], read: Callable[[], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # Store's

    async def quota_limits(self) -> dict[tuple[str, str], tuple[dict[str, Any], str, float]]:
        """(kind, name) -> (limits, who set them, when): the quotas set at run time (`JobTx.quota`)."""
        return dict(await self._kept_read(("quota_limits",), frozenset({"quota_limits"}), self._quota_limits))

    async def _quota_limits(self) -> dict[tuple[str, str], tuple[dict[str, Any], str, float]]:
        rows = await self._db.fetchall("SELECT kind, name, limits, set_by, set_at FROM quota_limits")
        return {(k, n): (json.loads(lim), by, at) for k, n, lim, by, at in rows}

    async def reservations(self) -> list[Reservation]:
        """Every reservation kept (`JobTx.reserve`), by start."""
        return list(await self._kept_read(("reservations",), frozenset({"reservations"}), self._reservations))

    async def _reservations(self) -> list[Reservation]:
        rows = await self._db.fetchall("SELECT * FROM reservations ORDER BY start, name")
        return [reservation_from_row(r) for r in rows]
