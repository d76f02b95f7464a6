"""The state store: SQLite through aiosqlite, WAL mode, schema versioned with `PRAGMA user_version`.

Every change of a node's state is written in one transaction with the events that explain it, before
anything acts on it: after a crash the store is the truth. Migrations are an append-only list of SQL
scripts; a store newer than this program is refused rather than guessed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from probes.health import NodeEvent, NodeHealth, NodeState
from scheduler.errors import StoreError
from scheduler.jobs import Attempt, Job, JobStatus, Run, StopReason
from scheduler.jobspec import JobSpec

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
    # 2: jobs, their attempts, the runs (one per rank: node, GPUs, run folder, state), alerts
    """
    CREATE TABLE jobs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused, even after delete
        name        TEXT NOT NULL,
        owner       TEXT NOT NULL,
        uid         INTEGER NOT NULL,
        spec        TEXT NOT NULL,          -- JSON (JobSpec.to_json)
        status      TEXT NOT NULL,          -- queued | running | error | stopped | expired | succeeded
        priority    TEXT NOT NULL,          -- normal | urgent | very-urgent (changeable while queued)
        project     TEXT NOT NULL,
        access      TEXT NOT NULL,
        submitted   REAL NOT NULL,
        started     REAL,
        ended       REAL,
        attempt     INTEGER NOT NULL DEFAULT 0,
        requeued    INTEGER NOT NULL DEFAULT 0,
        extra_runtime REAL NOT NULL DEFAULT 0,
        stop_requested REAL,
        stop_reason TEXT,                   -- stopped | expired | error
        stop_by     TEXT,
        message     TEXT NOT NULL DEFAULT '',
        exit_code   INTEGER,
        deleted     INTEGER NOT NULL DEFAULT 0,
        cloned_from INTEGER
    );
    CREATE INDEX jobs_status ON jobs (status);
    CREATE TABLE attempts (
        job         INTEGER NOT NULL REFERENCES jobs (id),
        number      INTEGER NOT NULL,
        spec_name   TEXT,
        gpus_per_node INTEGER NOT NULL,
        master_port INTEGER NOT NULL,
        created     REAL NOT NULL,
        started     REAL,
        ended       REAL,
        result      TEXT,
        message     TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (job, number)
    );
    CREATE TABLE runs (
        job         INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        rank        INTEGER NOT NULL,
        node        TEXT NOT NULL,
        gpus        TEXT NOT NULL,          -- JSON list of GPU indexes held
        run_dir     TEXT NOT NULL,
        launch      INTEGER NOT NULL,
        state       TEXT NOT NULL,          -- intent | prepared | starting | running | exited | failed | lost | absent
        pid         INTEGER,
        exit_code   INTEGER,
        signal      TEXT,
        started     REAL,
        ended       REAL,
        error       TEXT,
        stop_sent   REAL,
        released    INTEGER NOT NULL DEFAULT 0,   -- 1: its GPUs are free again
        PRIMARY KEY (job, attempt, rank),
        FOREIGN KEY (job, attempt) REFERENCES attempts (job, number)
    );
    CREATE INDEX runs_held ON runs (released, node);
    CREATE TABLE alerts (
        id          INTEGER PRIMARY KEY,
        time        REAL NOT NULL,
        kind        TEXT NOT NULL,
        severity    TEXT NOT NULL,
        job         INTEGER,
        node        TEXT,
        message     TEXT NOT NULL,
        state       TEXT NOT NULL DEFAULT 'open',   -- open | acknowledged | resolved
        acked_by    TEXT,
        acked_at    REAL,
        resolved_at REAL,
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX alerts_state ON alerts (state, id);
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
        return dataclasses.asdict(self)


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
        self._writing = asyncio.Lock()  # one connection: transactions must not interleave
        self._specs: dict[str, JobSpec] = {}  # spec JSON -> parsed (specs never change once stored)

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
        async with self._writing:
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

    @contextlib.asynccontextmanager
    async def jobs_tx(self, what: str) -> AsyncIterator[JobTx]:
        """A transaction over jobs, attempts, runs, alerts and events: all of it is written, or none."""
        async with self._transaction(what):
            yield JobTx(self._db)

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

    # -- jobs --------------------------------------------------------------------------------------------------

    async def jobs(self, *, statuses: Iterable[JobStatus] | None = None, deleted: bool = False) -> list[Job]:
        sql = "SELECT * FROM jobs WHERE deleted <= ?"
        args: list[Any] = [1 if deleted else 0]
        if statuses is not None:
            wanted = [s.value for s in statuses]
            sql += f" AND status IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        async with self._db.execute(sql + " ORDER BY id", args) as cur:
            rows = await cur.fetchall()
        return [self._job_from_row(r) for r in rows]

    async def job(self, job_id: int) -> Job | None:
        async with self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)) as cur:
            row = await cur.fetchone()
        return self._job_from_row(row) if row else None

    def _job_from_row(self, row: sqlite3.Row) -> Job:
        spec = self._specs.get(row["spec"])
        if spec is None:
            if len(self._specs) > 50_000:
                self._specs.clear()
            spec = self._specs[row["spec"]] = JobSpec.from_json(json.loads(row["spec"]))
        return _job_from_row(row, spec)

    async def attempts(self, job_id: int) -> list[Attempt]:
        async with self._db.execute("SELECT * FROM attempts WHERE job = ? ORDER BY number", (job_id,)) as cur:
            rows = await cur.fetchall()
        return [_attempt_from_row(r) for r in rows]

    async def running_attempts(self) -> dict[int, Attempt]:
        """The current attempt of every running job, by job id, in one query."""
        sql = (
            "SELECT a.* FROM attempts a JOIN jobs j ON a.job = j.id AND a.number = j.attempt WHERE j.status = 'running'"
        )
        async with self._db.execute(sql) as cur:
            rows = await cur.fetchall()
        return {row["job"]: _attempt_from_row(row) for row in rows}

    async def attempt(self, job_id: int, number: int) -> Attempt | None:
        async with self._db.execute("SELECT * FROM attempts WHERE job = ? AND number = ?", (job_id, number)) as cur:
            row = await cur.fetchone()
        return _attempt_from_row(row) if row else None

    async def runs(self, *, job: int | None = None, held: bool | None = None) -> list[Run]:
        """Runs of one job (every attempt) or of all jobs; `held`: only those whose GPUs are not released."""
        where, args = [], []
        if job is not None:
            where.append("job = ?")
            args.append(job)
        if held is not None:
            where.append("released = ?")
            args.append(0 if held else 1)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
        async with self._db.execute(sql + " ORDER BY job, attempt, rank", args) as cur:
            rows = await cur.fetchall()
        return [_run_from_row(r) for r in rows]

    async def alerts(self, *, states: Iterable[str] = ("open", "acknowledged"), limit: int = 200) -> list[StoredAlert]:
        wanted = list(states)
        sql = f"SELECT * FROM alerts WHERE state IN ({','.join('?' * len(wanted))}) ORDER BY id DESC LIMIT ?"
        async with self._db.execute(sql, (*wanted, limit)) as cur:
            rows = await cur.fetchall()
        return [_alert_from_row(r) for r in reversed(list(rows))]


@dataclass(frozen=True)
class StoredAlert:
    id: int
    time: float
    kind: str
    severity: str
    job: int | None
    node: str | None
    message: str
    state: str
    acked_by: str | None
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Conflict(StoreError):
    """A conditional write found the row changed since it was read (e.g. a job stopped while being placed)."""

    title = "conflict"


_JOB_COLUMNS = frozenset(
    {
        "status",
        "priority",
        "started",
        "ended",
        "attempt",
        "requeued",
        "extra_runtime",
        "stop_requested",
        "stop_reason",
        "stop_by",
        "message",
        "exit_code",
        "deleted",
    }
)
_ATTEMPT_COLUMNS = frozenset({"started", "ended", "result", "message"})
_RUN_COLUMNS = frozenset(
    {"state", "pid", "exit_code", "signal", "started", "ended", "error", "stop_sent", "released", "run_dir"}
)


class JobTx:
    """The writes of one jobs transaction (see `Store.jobs_tx`)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def add_job(self, job: Job) -> int:
        cur = await self._db.execute(
            "INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted, cloned_from) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job.name,
                job.owner,
                job.uid,
                json.dumps(job.spec.to_json()),
                job.status.value,
                job.priority,
                job.project,
                job.access,
                job.submitted,
                job.cloned_from,
            ),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    async def update_job(self, job_id: int, *, expect: Iterable[JobStatus] | None = None, **fields: Any) -> None:
        """Set columns of a job; with `expect`, only while its status is one of those (else `Conflict`)."""
        sql, args = _set_clause("jobs", _JOB_COLUMNS, fields)
        sql += " WHERE id = ?"
        args.append(job_id)
        if expect is not None:
            wanted = [s.value for s in expect]
            sql += f" AND status IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        cur = await self._db.execute(sql, args)
        if cur.rowcount != 1:
            raise Conflict(f"job {job_id} changed meanwhile (expected status {', '.join(map(str, expect or ()))})")

    async def add_attempt(self, attempt: Attempt, runs: Iterable[Run]) -> None:
        await self._db.execute(
            "INSERT INTO attempts (job, number, spec_name, gpus_per_node, master_port, created) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                attempt.job,
                attempt.number,
                attempt.spec_name,
                attempt.gpus_per_node,
                attempt.master_port,
                attempt.created,
            ),
        )
        for r in runs:
            await self._db.execute(
                "INSERT INTO runs (job, attempt, rank, node, gpus, run_dir, launch, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (r.job, r.attempt, r.rank, r.node, json.dumps(list(r.gpus)), r.run_dir, int(r.launch), r.state),
            )

    async def update_attempt(self, job_id: int, number: int, **fields: Any) -> None:
        sql, args = _set_clause("attempts", _ATTEMPT_COLUMNS, fields)
        await self._db.execute(sql + " WHERE job = ? AND number = ?", (*args, job_id, number))

    async def update_run(self, run: Run, **fields: Any) -> None:
        sql, args = _set_clause("runs", _RUN_COLUMNS, fields)
        await self._db.execute(
            sql + " WHERE job = ? AND attempt = ? AND rank = ?", (*args, run.job, run.attempt, run.rank)
        )

    async def release_runs(self, job_id: int) -> None:
        await self._db.execute("UPDATE runs SET released = 1 WHERE job = ?", (job_id,))

    async def event(
        self,
        time: float,
        kind: str,
        message: str,
        *,
        job: int | None = None,
        node: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        await self._db.execute(
            "INSERT INTO events (time, kind, node, job, message, data) VALUES (?, ?, ?, ?, ?, ?)",
            (time, kind, node, None if job is None else str(job), message, json.dumps(data or {})),
        )

    async def alert(
        self, time: float, kind: str, severity: str, message: str, *, job: int | None = None, node: str | None = None
    ) -> None:
        await self._db.execute(
            "INSERT INTO alerts (time, kind, severity, job, node, message) VALUES (?, ?, ?, ?, ?, ?)",
            (time, kind, severity, job, node, message),
        )


def _set_clause(table: str, allowed: frozenset[str], fields: dict[str, Any]) -> tuple[str, list[Any]]:
    unknown = set(fields) - allowed
    if unknown or not fields:
        raise ValueError(f"cannot set {sorted(unknown) or 'nothing'} on {table}")
    args = [_column_value(v) for v in fields.values()]
    return f"UPDATE {table} SET " + ", ".join(f"{k} = ?" for k in fields), args


def _column_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, Enum):
        return value.value
    return value


R = TypeVar("R")


def _record(cls: type[R], row: sqlite3.Row, **converted: Any) -> R:
    """A record dataclass from a row: columns named like its fields, those needing conversion given."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: row[k] for k in names.intersection(row.keys())}, **converted})


def _job_from_row(row: sqlite3.Row, spec: JobSpec) -> Job:
    return _record(
        Job,
        row,
        spec=spec,
        status=JobStatus(row["status"]),
        requeued=bool(row["requeued"]),
        stop_reason=StopReason(row["stop_reason"]) if row["stop_reason"] else None,
        deleted=bool(row["deleted"]),
    )


def _attempt_from_row(row: sqlite3.Row) -> Attempt:
    return _record(Attempt, row)


def _run_from_row(row: sqlite3.Row) -> Run:
    return _record(
        Run, row, gpus=tuple(json.loads(row["gpus"])), launch=bool(row["launch"]), released=bool(row["released"])
    )


def _alert_from_row(row: sqlite3.Row) -> StoredAlert:
    return _record(StoredAlert, row, data=json.loads(row["data"]))


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
