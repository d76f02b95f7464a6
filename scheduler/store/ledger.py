"""The store's side of the usage ledger (decide/ledger.py): it is kept in the store (tables `ledger`,
`ledger_decayed`, `ledger_slots`; schema 17), so that a restart, or the other head node, goes on from it, and each
ended run is folded in once (`runs.folded`), in the transaction that marks it.

Part of `Store` (db.py), as `HistoryStore` is. The SQL is the dialect both engines read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.fairshare import HORIZON
from ftconsole.scheduler.decide.ledger import Key, Ledger
from ftconsole.scheduler.store.engine import Engine

_LIGHT = "SELECT j.owner, j.project, r.gpus, r.started, r.ended FROM runs r JOIN jobs j ON j.id = r.job WHERE "


@dataclass(frozen=True, slots=True)
class LightRun:
    """What one run used, as the ledger reads it."""

    owner: str
    project: str
    gpus: int
    started: float
    ended: float | None


def _light(row: Any) -> LightRun:
    gpus = str(row[2]).strip()
    count = 0 if gpus in ("[]", "") else gpus.count(",") + 1  # a JSON list of indexes
    return LightRun(str(row[0]), str(row[1]), count, float(row[3]), row[4])


class LedgerStore:
    """Part of `Store` (db.py): the usage ledger's reads and writes."""

    _db: Engine

    def _transaction(self, what: str) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError  # Store's

    async def unsettled_usage(self) -> list[LightRun]:
        """The runs the ledger lacks, added fresh by its readers: those started and not ended, and those ended
        and not folded in yet (two indexed reads)."""
        rows = await self._db.fetchall(_LIGHT + "r.ended IS NULL AND r.started IS NOT NULL")
        rows += await self._db.fetchall(_LIGHT + "r.folded = 0 AND r.ended IS NOT NULL AND r.started IS NOT NULL")
        return [_light(r) for r in rows]

    async def read_ledger(self) -> Ledger | None:
        """The ledger as the store has it (None: none yet), read only: a standby's, or a first pass's."""
        meta = await self._db.fetchone("SELECT folds, valued_at, half_life, slot, since FROM ledger")
        if meta is None:
            return None
        half_life = None if meta[2] is None else float(meta[2])
        return await self._ledger_read(int(meta[0]), float(meta[1]), half_life, float(meta[3]), float(meta[4]))

    async def fold_usage(
        self, now: float, *, half_life: float | None, slot: float, since: float, kept: Ledger | None
    ) -> Ledger:
        """The ledger with every ended run folded in, valued at `now`, its slots from `since` on (the quota
        period's start): `kept` (what this process had) where no run ended since and nobody else folded; else
        the runs ended since are folded in and marked, in one transaction. It is built again from the runs of
        its windows where it was written for another half-life or slot, or never (the first start of this
        version): that reads what fair share's horizon and the quota period hold, once."""
        if kept is not None and kept.half_life == half_life and kept.slot == slot and since >= kept.since:
            row = await self._db.fetchone("SELECT folds FROM ledger")
            if row is not None and int(row[0]) == kept.folds and not await self._unfolded():
                kept.trim(since)
                return kept
        async with self._transaction("fold ended runs into the usage ledger"):
            meta = await self._db.fetchone("SELECT folds, valued_at, half_life, slot, since FROM ledger")
            fresh = meta is None or meta[2] != half_life or meta[3] != slot or since < meta[4]
            if fresh:
                folds = 0 if meta is None else int(meta[0])
                ledger = await self._ledger_built(now, half_life, slot, since, folds=folds)
                touched: set[tuple[Key, float]] | None = None  # all of it is written
            else:
                assert meta is not None
                if kept is not None and kept.folds == int(meta[0]):
                    ledger = kept.copy()  # `kept` stays as it was should the transaction fail
                else:
                    ledger = await self._ledger_read(int(meta[0]), float(meta[1]), half_life, slot, float(meta[4]))
                rows = await self._db.fetchall(
                    _LIGHT + "r.folded = 0 AND r.ended IS NOT NULL AND r.started IS NOT NULL"
                )
                touched = ledger.fold([_light(r) for r in rows], now, since)
            await self._db.execute("UPDATE runs SET folded = 1 WHERE folded = 0 AND ended IS NOT NULL")
            ledger.folds += 1
            await self._ledger_write(ledger, touched)
        return ledger

    async def _unfolded(self) -> bool:
        return await self._db.fetchone("SELECT 1 FROM runs WHERE folded = 0 AND ended IS NOT NULL LIMIT 1") is not None

    async def _ledger_built(
        self, now: float, half_life: float | None, slot: float, since: float, *, folds: int
    ) -> Ledger:
        """A ledger made again from the ended runs of its windows (the decay's horizon, the quota period)."""
        start = since
        if half_life is not None:
            start = min(start, now - HORIZON * half_life)  # older usage counts less than a thousandth
        rows = await self._db.fetchall(_LIGHT + "r.ended >= ? AND r.started IS NOT NULL", (start,))
        ledger = Ledger(at=now, half_life=half_life, slot=slot, since=since, folds=folds)
        await asyncio.to_thread(ledger.fold, [_light(r) for r in rows], now, since)  # off the loop: many rows
        return ledger

    async def _ledger_read(self, folds: int, at: float, half_life: float | None, slot: float, since: float) -> Ledger:
        ledger = Ledger(at=at, half_life=half_life, slot=slot, since=since, folds=folds)
        for owner, project, used in await self._db.fetchall("SELECT owner, project, gpu_seconds FROM ledger_decayed"):
            ledger.decayed[(str(owner), str(project))] = float(used)
        for kind, name, start, used in await self._db.fetchall(
            "SELECT kind, name, slot_start, gpu_seconds FROM ledger_slots"
        ):
            ledger.slots.setdefault((str(kind), str(name)), {})[float(start)] = float(used)
        return ledger

    async def _ledger_write(self, ledger: Ledger, touched: set[tuple[Key, float]] | None) -> None:
        """Write the ledger: its header and decayed usage whole, the slots `touched` (None: all of them, the
        others gone), and drop the slots that end before its `since`."""
        await self._db.execute("DELETE FROM ledger")
        await self._db.execute(
            "INSERT INTO ledger (one, folds, valued_at, half_life, slot, since) VALUES (1, ?, ?, ?, ?, ?)",
            (ledger.folds, ledger.at, ledger.half_life, ledger.slot, ledger.since),
        )
        await self._db.execute("DELETE FROM ledger_decayed")
        await self._db.executemany(
            "INSERT INTO ledger_decayed (owner, project, gpu_seconds) VALUES (?, ?, ?)",
            [(owner, project, used) for (owner, project), used in ledger.decayed.items()],
        )
        if touched is None:
            await self._db.execute("DELETE FROM ledger_slots")
            touched = {(key, start) for key, kept in ledger.slots.items() for start in kept}
        else:
            await self._db.execute("DELETE FROM ledger_slots WHERE slot_start + ? <= ?", (ledger.slot, ledger.since))
        written: Sequence[tuple[str, str, float, float]] = [
            (kind, name, start, ledger.slots[(kind, name)][start])
            for (kind, name), start in sorted(touched)
            if start in ledger.slots.get((kind, name), {})
        ]
        await self._db.executemany(
            "INSERT INTO ledger_slots (kind, name, slot_start, gpu_seconds) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (kind, name, slot_start) DO UPDATE SET gpu_seconds = excluded.gpu_seconds",
            written,
        )
