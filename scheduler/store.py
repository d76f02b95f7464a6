"""The state store: SQLite through aiosqlite, WAL mode, schema versioned with `PRAGMA user_version`.

Every change of a node's state is written in one transaction with the events that explain it, before
anything acts on it: after a crash the store is the truth. Migrations are an append-only list of SQL
scripts; a store newer than this program is refused rather than guessed at.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from probes.health import NodeEvent, NodeHealth, NodeState
from scheduler.errors import StoreError

MIGRATIONS: tuple[str, ...] = (
    # 1: nodes, probe results, events
    """
    CREATE TABLE nodes (
        name        TEXT PRIMARY KEY,
        health      TEXT NOT NULL,
        reasons     TEXT NOT NULL,          -- JSON list
        since       REAL,
        admin       TEXT,                   -- drained | isolated | NULL
        admin_reason TEXT NOT NULL DEFAULT '',
        admin_since REAL,
        admin_by    TEXT NOT NULL DEFAULT '',
        pending     TEXT,
        good_streak INTEGER NOT NULL DEFAULT 0,
        boot_id     TEXT,
        last_probe  REAL
    );
    CREATE TABLE probe_results (
        id          INTEGER PRIMARY KEY,
        node        TEXT NOT NULL,
        time        REAL NOT NULL,
        error       TEXT,                   -- why there is no report
        report      TEXT                    -- JSON (ProbeReport.to_json)
    );
    CREATE INDEX probe_results_node_time ON probe_results (node, time);
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY,
        time        REAL NOT NULL,
        kind        TEXT NOT NULL,
        node        TEXT,
        job         TEXT,
        message     TEXT NOT NULL,
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_node ON events (node, id);
    CREATE INDEX events_job ON events (job, id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
PROBE_HISTORY_PER_NODE = 50


@dataclass(frozen=True)
class StoredEvent:
    id: int
    time: float
    kind: str
    node: str | None
    job: str | None
    message: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": self.time,
            "kind": self.kind,
            "node": self.node,
            "job": self.job,
            "message": self.message,
            "data": self.data,
        }


@dataclass(frozen=True)
class StoredProbe:
    node: str
    time: float
    error: str | None
    report: dict[str, Any] | None


class Store:
    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> Store:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = await aiosqlite.connect(str(path), timeout=10, isolation_level=None)
            db.row_factory = sqlite3.Row
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {path}: {exc}") from exc
        store = cls(db, path)
        try:
            await store._migrate()
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _migrate(self) -> None:
        db = self._db
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA busy_timeout=10000")
            await db.execute("PRAGMA foreign_keys=ON")
            async with db.execute("PRAGMA user_version") as cur:
                row = await cur.fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this ftconsole ({SCHEMA_VERSION}); "
                    "upgrade ftconsole"
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                await db.executescript(
                    f"BEGIN IMMEDIATE;\n{MIGRATIONS[number - 1]}\nPRAGMA user_version = {number};\nCOMMIT;"
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot prepare {self.path}: {exc}") from exc

    async def schema_version(self) -> int:
        async with self._db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    # -- nodes -------------------------------------------------------------------------------------------

    async def node_health(self, name: str) -> NodeHealth | None:
        async with self._db.execute("SELECT * FROM nodes WHERE name = ?", (name,)) as cur:
            row = await cur.fetchone()
        return _health_from_row(row) if row else None

    async def all_node_health(self) -> dict[str, NodeHealth]:
        async with self._db.execute("SELECT * FROM nodes") as cur:
            rows = await cur.fetchall()
        return {row["name"]: _health_from_row(row) for row in rows}

    async def save_nodes(
        self,
        changes: Iterable[tuple[NodeHealth, Sequence[NodeEvent]]],
        probes: Iterable[StoredProbe] = (),
    ) -> None:
        """Write node states with their events (and the probe results behind them) in one transaction."""
        async with self._transaction("write node state"):
            for health, events in changes:
                await self._db.execute(_UPSERT_NODE, _health_row(health))
                for ev in events:
                    await self._db.execute(
                        "INSERT INTO events (time, kind, node, job, message, data) VALUES (?, ?, ?, NULL, ?, ?)",
                        (ev.time, ev.kind, ev.node, ev.message, json.dumps(ev.data)),
                    )
            for p in probes:
                await self._db.execute(
                    "INSERT INTO probe_results (node, time, error, report) VALUES (?, ?, ?, ?)",
                    (p.node, p.time, p.error, json.dumps(p.report) if p.report is not None else None),
                )
                await self._db.execute(
                    "DELETE FROM probe_results WHERE node = ? AND id NOT IN "
                    "(SELECT id FROM probe_results WHERE node = ? ORDER BY id DESC LIMIT ?)",
                    (p.node, p.node, PROBE_HISTORY_PER_NODE),
                )

    @contextlib.asynccontextmanager
    async def _transaction(self, what: str) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; any exception rolls the whole transaction back."""
        try:
            await self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot {what} in {self.path}: {exc}") from exc
        try:
            yield
            await self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                await self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot {what} in {self.path}: {exc}") from exc
            raise

    async def latest_probes(self) -> dict[str, StoredProbe]:
        sql = (
            "SELECT p.node, p.time, p.error, p.report FROM probe_results p "
            "JOIN (SELECT node, MAX(id) AS id FROM probe_results GROUP BY node) last ON p.id = last.id"
        )
        async with self._db.execute(sql) as cur:
            rows = await cur.fetchall()
        return {
            r[0]: StoredProbe(node=r[0], time=r[1], error=r[2], report=json.loads(r[3]) if r[3] else None) for r in rows
        }

    # -- events ------------------------------------------------------------------------------------------

    async def events(self, *, node: str | None = None, job: str | None = None, limit: int = 100) -> list[StoredEvent]:
        where, args = [], []
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if job is not None:
            where.append("job = ?")
            args.append(job)
        sql = "SELECT id, time, kind, node, job, message, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        async with self._db.execute(sql, (*args, limit)) as cur:
            rows = await cur.fetchall()
        return [
            StoredEvent(id=r[0], time=r[1], kind=r[2], node=r[3], job=r[4], message=r[5], data=json.loads(r[6]))
            for r in reversed(list(rows))
        ]


_UPSERT_NODE = """
INSERT INTO nodes (name, health, reasons, since, admin, admin_reason, admin_since, admin_by, pending,
                   good_streak, boot_id, last_probe)
VALUES (:name, :health, :reasons, :since, :admin, :admin_reason, :admin_since, :admin_by, :pending,
        :good_streak, :boot_id, :last_probe)
ON CONFLICT (name) DO UPDATE SET
    health = excluded.health, reasons = excluded.reasons, since = excluded.since, admin = excluded.admin,
    admin_reason = excluded.admin_reason, admin_since = excluded.admin_since, admin_by = excluded.admin_by,
    pending = excluded.pending, good_streak = excluded.good_streak, boot_id = excluded.boot_id,
    last_probe = excluded.last_probe
"""


def _health_row(h: NodeHealth) -> dict[str, Any]:
    return {
        "name": h.node,
        "health": h.health.value,
        "reasons": json.dumps(list(h.reasons)),
        "since": h.since,
        "admin": h.admin.value if h.admin else None,
        "admin_reason": h.admin_reason,
        "admin_since": h.admin_since,
        "admin_by": h.admin_by,
        "pending": h.pending.value if h.pending else None,
        "good_streak": h.good_streak,
        "boot_id": h.boot_id,
        "last_probe": h.last_probe,
    }


def _health_from_row(row: sqlite3.Row) -> NodeHealth:
    return NodeHealth(
        node=row["name"],
        health=NodeState(row["health"]),
        reasons=tuple(json.loads(row["reasons"])),
        since=row["since"],
        admin=NodeState(row["admin"]) if row["admin"] else None,
        admin_reason=row["admin_reason"],
        admin_since=row["admin_since"],
        admin_by=row["admin_by"],
        pending=NodeState(row["pending"]) if row["pending"] else None,
        good_streak=row["good_streak"],
        boot_id=row["boot_id"],
        last_probe=row["last_probe"],
    )
