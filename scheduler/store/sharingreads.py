"""The store's reads of what teams sharing a cluster set at run time (issue 30): quota limits an admin set, and
reservations. Part of `Store` (db.py); written through `JobTx.quota` and `JobTx.reserve`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from ftconsole.scheduler.decide.reservations import Reservation
from ftconsole.scheduler.store.records import reservation_from_row


class SharingReads:
    _db: aiosqlite.Connection

    async def _kept_read(self, key: tuple[Any, ...], read: Callable[[], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # Store's

    async def quota_limits(self) -> dict[tuple[str, str], tuple[dict[str, Any], str, float]]:
        """(kind, name) -> (limits, who set them, when): the quotas set at run time (`JobTx.quota`)."""
        return dict(await self._kept_read(("quota_limits",), self._quota_limits))

    async def _quota_limits(self) -> dict[tuple[str, str], tuple[dict[str, Any], str, float]]:
        async with self._db.execute("SELECT kind, name, limits, set_by, set_at FROM quota_limits") as cur:
            return {(k, n): (json.loads(lim), by, at) async for k, n, lim, by, at in cur}

    async def reservations(self) -> list[Reservation]:
        """Every reservation kept (`JobTx.reserve`), by start."""
        return list(await self._kept_read(("reservations",), self._reservations))

    async def _reservations(self) -> list[Reservation]:
        async with self._db.execute("SELECT * FROM reservations ORDER BY start, name") as cur:
            return [reservation_from_row(r) async for r in cur]
