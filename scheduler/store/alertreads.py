"""The store's alerts: read, acknowledged and resolved, and the notify targets' cursors. Part of `Store` (db.py);
raised and resolved by the loop through `JobTx`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.store.engine import Engine
from ftconsole.scheduler.store.jobtx import JobTx
from ftconsole.scheduler.store.records import StoredAlert, _alert_from_row

OPEN_ALERT_STATES = ("open", "acknowledged")


class AlertReads:
    _db: Engine
    _transaction: Callable[[str], AbstractAsyncContextManager[None]]
    jobs_tx: Callable[[str], AbstractAsyncContextManager[JobTx]]

    async def alerts(
        self, *, states: Iterable[str] = OPEN_ALERT_STATES, limit: int = 200, job: int | None = None
    ) -> list[StoredAlert]:
        """The newest `limit` alerts in these states (oldest first); `job`: only that job's."""
        wanted = list(states)
        sql = f"SELECT * FROM alerts WHERE state IN ({','.join('?' * len(wanted))})"
        args: list[Any] = [*wanted]
        if job is not None:
            sql += " AND job = ?"
            args.append(job)
        rows = await self._db.fetchall(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))
        return [_alert_from_row(r) for r in reversed(list(rows))]

    async def alerts_after(self, after: int, *, limit: int = 500) -> list[StoredAlert]:
        """The oldest `limit` alerts with an id above `after`, in any state, oldest first (what a notify target
        has still to get)."""
        rows = await self._db.fetchall("SELECT * FROM alerts WHERE id > ? ORDER BY id LIMIT ?", (after, limit))
        return [_alert_from_row(r) for r in rows]

    async def newest_alert_id(self) -> int:
        """The id of the newest alert stored (0: none yet)."""
        row = await self._db.fetchone("SELECT COALESCE(MAX(id), 0) FROM alerts")
        return int(row[0]) if row else 0

    async def notify_cursors(self) -> dict[str, int]:
        """Per notify target, the alert id up to which every alert is done for it (see `set_notify_cursor`)."""
        rows = await self._db.fetchall("SELECT target, alert FROM notify_cursors")
        return {target: int(alert) for target, alert in rows}

    async def set_notify_cursor(self, target: str, alert: int, *, now: float) -> None:
        """Every alert up to id `alert` is done for `target`; a cursor only moves forward."""
        async with self._transaction(f"record the notifications sent to {target}"):
            await self._db.execute(
                "INSERT INTO notify_cursors (target, alert, updated) VALUES (?, ?, ?) ON CONFLICT (target) DO UPDATE "
                "SET alert = CASE WHEN excluded.alert > notify_cursors.alert THEN excluded.alert "
                "ELSE notify_cursors.alert END, updated = excluded.updated",
                (target, alert, now),
            )

    async def alerts_by_id(self, ids: Iterable[int | str]) -> list[StoredAlert]:
        """These alerts, in the order given; NotFound names the ids that do not exist."""
        wanted = [_alert_id(i) for i in ids]
        if not wanted:
            return []
        found: dict[int, StoredAlert] = {}
        for chunk in _chunks(list(dict.fromkeys(wanted))):
            sql = f"SELECT * FROM alerts WHERE id IN ({','.join('?' * len(chunk))})"
            found.update((r["id"], _alert_from_row(r)) for r in await self._db.fetchall(sql, chunk))
        missing = [str(i) for i in wanted if i not in found]
        if missing:
            raise NotFound(f"no alert {', '.join(missing)}")
        return [found[i] for i in wanted]

    async def ack_alerts(self, ids: Iterable[int | str], *, by: str, now: float) -> list[StoredAlert]:
        """Acknowledge open alerts (one event each); the others are left as they are. NotFound: unknown ids."""
        return await self._set_alerts(ids, "acknowledged", by=by, now=now)

    async def resolve_alerts(self, ids: Iterable[int | str], *, by: str, now: float) -> list[StoredAlert]:
        """Resolve open or acknowledged alerts (one event each); resolved ones stay as they are."""
        return await self._set_alerts(ids, "resolved", by=by, now=now)

    async def _set_alerts(self, ids: Iterable[int | str], state: str, *, by: str, now: float) -> list[StoredAlert]:
        wanted = await self.alerts_by_id(ids)
        async with self.jobs_tx(f"mark alerts {state}") as tx:
            for alert in wanted:
                await tx.set_alert_state(alert.id, state, by=by, now=now)
        return await self.alerts_by_id(a.id for a in wanted)

    async def open_node_alerts(self) -> dict[str, set[str]]:
        """The kinds of alert open or acknowledged per node."""
        sql = "SELECT DISTINCT node, kind FROM alerts WHERE node IS NOT NULL AND state IN ('open', 'acknowledged')"
        out: dict[str, set[str]] = {}
        for node, kind in await self._db.fetchall(sql):
            out.setdefault(node, set()).add(kind)
        return out


def _alert_id(value: Any) -> int:
    try:
        return int(str(value).strip().removeprefix("#"))
    except ValueError:
        raise UsageError(f"not an alert id: {value!r} (alert ids are numbers, as `ftconsole alerts` shows)") from None


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
