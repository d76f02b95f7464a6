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
import time
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from probes.health import NodeEvent, NodeHealth, NodeState
from scheduler.errors import NotFound, StoreError, UsageError
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
    # 3: who resolved an alert; a run's output heartbeat; a job's last change (the incremental job feed);
    #    how often each node failed (kept with its events, counted from the history so far)
    """
    ALTER TABLE alerts ADD COLUMN resolved_by TEXT;
    CREATE INDEX alerts_job ON alerts (job, state);
    CREATE INDEX alerts_node ON alerts (node, state);
    ALTER TABLE runs ADD COLUMN output_at REAL;             -- mtime of output.log when last read
    ALTER TABLE jobs ADD COLUMN updated REAL NOT NULL DEFAULT 0;
    UPDATE jobs SET updated = MAX(submitted, COALESCE(started, 0), COALESCE(ended, 0), COALESCE(stop_requested, 0));
    CREATE INDEX jobs_updated ON jobs (updated);
    ALTER TABLE nodes ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
    UPDATE nodes SET faults = (
        SELECT COUNT(*) FROM events e WHERE e.node = nodes.name AND (e.kind = 'isolated'
            OR (e.kind = 'state-changed' AND json_extract(e.data, '$.to') IN ('unhealthy', 'unreachable')))
    );
    """,
    # 4: an elastic job's size once scaled (NULL: the spec's `nodes`)
    """
    ALTER TABLE jobs ADD COLUMN scaled_to INTEGER;
    """,
    # 5: run identity: the store's cluster id (run folders are <run_root>/<cluster id>/...), each attempt's
    #    token (the claim of its run folders), and what proves a run alive (boot id, pid start times); when the
    #    scheduler escalated a stop to SIGKILL
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO meta (key, value) VALUES ('cluster_id', lower(hex(randomblob(6))));
    ALTER TABLE attempts ADD COLUMN token TEXT;             -- NULL: an attempt started before schema 5
    ALTER TABLE runs ADD COLUMN boot_id TEXT;
    ALTER TABLE runs ADD COLUMN supervisor_pid INTEGER;
    ALTER TABLE runs ADD COLUMN supervisor_start INTEGER;   -- clock ticks since boot (/proc/<pid>/stat 22)
    ALTER TABLE runs ADD COLUMN pid_start INTEGER;
    ALTER TABLE runs ADD COLUMN kill_sent REAL;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
STORE_FILE = "state.db"  # in state_dir
PROBE_HISTORY_PER_NODE = 50
ALERT_STATES = ("open", "acknowledged", "resolved")
OPEN_ALERT_STATES = ("open", "acknowledged")
FAULT_STATES = ("unhealthy", "unreachable")  # a node event into one of these (or `isolated`) counts as a fault
AUTO = "ftconsole"  # who resolves the alerts that resolve themselves


def read_cluster_id(path: Path) -> str | None:
    """The cluster id of the store at `path` without changing anything; None when there is no store (yet) or it
    predates cluster ids (it gets one on the scheduler's next start)."""
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


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
        self._stamp = 0.0  # the last `jobs.updated` stamp handed out (see `_next_stamp`)
        self.cluster_id = ""  # random, made with the store: run folders on the nodes are keyed by it

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
            async with db.execute("SELECT COALESCE(MAX(updated), 0) FROM jobs") as cur:
                row = await cur.fetchone()
            self._stamp = float(row[0]) if row else 0.0
            async with db.execute("SELECT value FROM meta WHERE key = 'cluster_id'") as cur:
                row = await cur.fetchone()
            if row is None:
                raise StoreError(f"{self.path} has no cluster id: it was not made by ftconsole")
            self.cluster_id = str(row[0])
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
        *,
        alerts: Iterable[NewAlert] = (),
        resolve: Iterable[AutoResolve] = (),
    ) -> None:
        """Write node states with their events (and the probe results behind them) in one transaction.

        With them, the node alerts they cause: each of `alerts` is raised unless one of its kind is still open
        (or acknowledged) for its node, and `resolve` closes the open ones of a kind, with an event each.
        """
        async with self._transaction("write node state"):
            for health, events in changes:
                await self._db.execute(_UPSERT_NODE, _health_row(health))
                for ev in events:
                    await self._db.execute(
                        "INSERT INTO events (time, kind, node, job, message, data) VALUES (?, ?, ?, NULL, ?, ?)",
                        (ev.time, ev.kind, ev.node, ev.message, json.dumps(ev.data)),
                    )
                    if is_fault(ev.kind, ev.data):
                        await self._db.execute("UPDATE nodes SET faults = faults + 1 WHERE name = ?", (ev.node,))
            for r in resolve:
                await _auto_resolve(self._db, r)
            for a in alerts:
                await _insert_alert(self._db, a, once=True)
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
        """A transaction over jobs, attempts, runs, alerts and events: all of it is written, or none.

        Every job it changes (its row, its attempts, runs or alerts) gets `updated` = this transaction's stamp.
        """
        async with self._transaction(what):
            yield JobTx(self._db, self._next_stamp())

    def _next_stamp(self) -> float:
        """A `jobs.updated` stamp: the wall clock, but always above every stamp handed out before (the clock
        may step back). Called only while holding `_writing`."""
        self._stamp = max(time.time(), self._stamp + 1e-6)
        return self._stamp

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
            spec = self._specs[row["spec"]] = JobSpec.from_stored(json.loads(row["spec"]))
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
            where.append("r.job = ?")
            args.append(job)
        if held is not None:
            where.append("r.released = ?")
            args.append(0 if held else 1)
        sql = "SELECT r.*, a.token FROM runs r JOIN attempts a ON a.job = r.job AND a.number = r.attempt"
        sql += " WHERE " + " AND ".join(where) if where else ""
        async with self._db.execute(sql + " ORDER BY r.job, r.attempt, r.rank", args) as cur:
            rows = await cur.fetchall()
        return [_run_from_row(r) for r in rows]

    async def job_activity(self, job_ids: Collection[int] | None = None) -> dict[int, JobActivity]:
        """What the job listing shows beyond the job row, for the given jobs (default: all), in two queries:
        the current attempt's nodes in rank order and its latest output, and the count of unresolved alerts."""
        return await self._activity(*_ids_filter("j.id", job_ids))

    async def _activity(self, where: str, args: Sequence[Any]) -> dict[int, JobActivity]:
        """`where`: a condition on the jobs table as `j` ("1" for all)."""
        runs_sql = (
            "SELECT r.job, r.node, r.output_at FROM runs r JOIN jobs j ON r.job = j.id AND r.attempt = j.attempt "
            f"WHERE {where} ORDER BY r.job, r.rank"
        )
        alerts_sql = (
            "SELECT a.job, COUNT(*) FROM alerts a JOIN jobs j ON a.job = j.id "
            f"WHERE a.state IN ('open', 'acknowledged') AND {where} GROUP BY a.job"
        )
        nodes: dict[int, dict[str, None]] = {}
        output: dict[int, float] = {}
        async with self._db.execute(runs_sql, args) as cur:
            async for job, node, output_at in cur:
                nodes.setdefault(job, {})[node] = None
                if output_at is not None and output_at > output.get(job, float("-inf")):
                    output[job] = output_at
        async with self._db.execute(alerts_sql, args) as cur:
            counts = {job: count async for job, count in cur}
        return {
            job: JobActivity(
                last_output=output.get(job), open_alerts=counts.get(job, 0), node_names=tuple(nodes.get(job, ()))
            )
            for job in nodes.keys() | counts.keys()
        }

    async def jobs_changed(self, since: float | None) -> tuple[float, list[Job], dict[int, JobActivity]]:
        """The jobs changed since a cursor, for a client that follows the job list; returns the next cursor.

        `since` None: every job not deleted. Else every job whose `updated` is at or after `since`, deleted ones
        included (their `deleted` says so), with its activity (`job_activity`). The client calls again with
        the cursor returned. No change is missed: this holds the store's write lock, so no transaction of this
        process is half done while it reads, and the cursor is a stamp taken under that lock, so every later
        transaction gets a stamp above it (`_next_stamp`), which `>=` finds. A job may come back twice; that
        is harmless. (Writers in other processes, such as the CLI while no scheduler runs, stamp with their
        own clock; the state_dir lock keeps them away while a scheduler serves this feed.)
        """
        async with self._writing:
            cursor = self._next_stamp()
            if since is None:
                where, args = "j.deleted = 0", []
            else:
                where, args = "j.updated >= ?", [float(since)]
            async with self._db.execute(f"SELECT * FROM jobs j WHERE {where} ORDER BY j.id", args) as cur:
                rows = await cur.fetchall()
            activity = await self._activity(where, args)
        return cursor, [self._job_from_row(r) for r in rows], activity

    # -- alerts ------------------------------------------------------------------------------------------------

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
        async with self._db.execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit)) as cur:
            rows = await cur.fetchall()
        return [_alert_from_row(r) for r in reversed(list(rows))]

    async def alerts_by_id(self, ids: Iterable[int | str]) -> list[StoredAlert]:
        """These alerts, in the order given; NotFound names the ids that do not exist."""
        wanted = [_alert_id(i) for i in ids]
        if not wanted:
            return []
        found: dict[int, StoredAlert] = {}
        for chunk in _chunks(list(dict.fromkeys(wanted))):
            sql = f"SELECT * FROM alerts WHERE id IN ({','.join('?' * len(chunk))})"
            async with self._db.execute(sql, chunk) as cur:
                found.update((r["id"], _alert_from_row(r)) for r in await cur.fetchall())
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
        async with self._db.execute(sql) as cur:
            async for node, kind in cur:
                out.setdefault(node, set()).add(kind)
        return out

    async def node_faults(self) -> dict[str, int]:
        """How many times each node became unhealthy, unreachable or isolated (per its events)."""
        async with self._db.execute("SELECT name, faults FROM nodes") as cur:
            return {name: faults async for name, faults in cur}


@dataclass(frozen=True)
class StoredAlert:
    id: int
    time: float
    kind: str
    severity: str
    job: int | None
    node: str | None
    message: str
    state: str  # open | acknowledged | resolved
    acked_by: str | None
    acked_at: float | None
    resolved_at: float | None
    resolved_by: str | None
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NewAlert:
    """An alert to raise about a job or a node."""

    time: float
    kind: str  # job_failed | node_unhealthy | node_unreachable | host_key
    severity: str  # error | critical
    message: str
    job: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class AutoResolve:
    """Resolve, as ftconsole, a node's open and acknowledged alerts of one kind; `why` goes in the event."""

    time: float
    node: str
    kind: str
    why: str


@dataclass(frozen=True)
class JobActivity:
    """What a job listing shows beyond the job row (`Store.job_activity`)."""

    last_output: float | None = None  # the latest output.log mtime over the current attempt's runs
    open_alerts: int = 0  # open and acknowledged alerts about the job
    node_names: tuple[str, ...] = ()  # the current attempt's nodes, in rank order, each once

    def to_json(self) -> dict[str, Any]:
        return {"last_output": self.last_output, "open_alerts": self.open_alerts, "node_names": list(self.node_names)}


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
        "scaled_to",
    }
)
_ATTEMPT_COLUMNS = frozenset({"started", "ended", "result", "message", "master_port"})
_RUN_COLUMNS = frozenset(
    {
        "state",
        "pid",
        "exit_code",
        "signal",
        "started",
        "ended",
        "error",
        "stop_sent",
        "released",
        "run_dir",
        "output_at",
        "boot_id",
        "supervisor_pid",
        "supervisor_start",
        "pid_start",
        "kill_sent",
    }
)


class JobTx:
    """The writes of one jobs transaction (see `Store.jobs_tx`). Each write that concerns a job (its row, its
    attempts, runs and alerts) sets the job's `updated` to `stamp`, so the job feed (`jobs_changed`) sees it."""

    def __init__(self, db: aiosqlite.Connection, stamp: float) -> None:
        self._db = db
        self.stamp = stamp
        self._touched: set[int] = set()

    async def _touch(self, job_id: int) -> None:
        if job_id not in self._touched:
            await self._db.execute("UPDATE jobs SET updated = ? WHERE id = ?", (self.stamp, job_id))
            self._touched.add(job_id)

    async def add_job(self, job: Job) -> int:
        cur = await self._db.execute(
            "INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted, cloned_from, "
            "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                self.stamp,
            ),
        )
        assert cur.lastrowid is not None
        self._touched.add(cur.lastrowid)
        return cur.lastrowid

    async def update_job(self, job_id: int, *, expect: Iterable[JobStatus] | None = None, **fields: Any) -> None:
        """Set columns of a job; with `expect`, only while its status is one of those (else `Conflict`)."""
        sql, args = _set_clause("jobs", _JOB_COLUMNS, fields)
        sql += ", updated = ? WHERE id = ?"
        args.extend([self.stamp, job_id])
        if expect is not None:
            wanted = [s.value for s in expect]
            sql += f" AND status IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        cur = await self._db.execute(sql, args)
        if cur.rowcount != 1:
            raise Conflict(f"job {job_id} changed meanwhile (expected status {', '.join(map(str, expect or ()))})")
        self._touched.add(job_id)

    async def add_attempt(self, attempt: Attempt, runs: Iterable[Run]) -> None:
        await self._db.execute(
            "INSERT INTO attempts (job, number, spec_name, gpus_per_node, master_port, created, token) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                attempt.job,
                attempt.number,
                attempt.spec_name,
                attempt.gpus_per_node,
                attempt.master_port,
                attempt.created,
                attempt.token,
            ),
        )
        for r in runs:
            await self._db.execute(
                "INSERT INTO runs (job, attempt, rank, node, gpus, run_dir, launch, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (r.job, r.attempt, r.rank, r.node, json.dumps(list(r.gpus)), r.run_dir, int(r.launch), r.state),
            )
        await self._touch(attempt.job)

    async def update_attempt(self, job_id: int, number: int, **fields: Any) -> None:
        sql, args = _set_clause("attempts", _ATTEMPT_COLUMNS, fields)
        await self._db.execute(sql + " WHERE job = ? AND number = ?", (*args, job_id, number))
        await self._touch(job_id)

    async def update_run(self, run: Run, **fields: Any) -> None:
        sql, args = _set_clause("runs", _RUN_COLUMNS, fields)
        await self._db.execute(
            sql + " WHERE job = ? AND attempt = ? AND rank = ?", (*args, run.job, run.attempt, run.rank)
        )
        await self._touch(run.job)

    async def release_runs(self, job_id: int, *, attempt: int | None = None) -> None:
        """Free the GPUs of a job's runs: every attempt's, or one attempt's (an elastic job's resized one)."""
        if attempt is None:
            await self._db.execute("UPDATE runs SET released = 1 WHERE job = ?", (job_id,))
        else:
            await self._db.execute("UPDATE runs SET released = 1 WHERE job = ? AND attempt = ?", (job_id, attempt))
        await self._touch(job_id)

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
        await _insert_alert(self._db, NewAlert(time, kind, severity, message, job=job, node=node), once=False)
        if job is not None:
            await self._touch(job)

    async def set_alert_state(self, alert_id: int, state: str, *, by: str, now: float) -> bool:
        """Acknowledge (an open alert) or resolve (an open or acknowledged one), with an event; False when it
        was already so (nothing written)."""
        changed = await _set_alert_state(self._db, alert_id, state, by=by, now=now)
        if changed is not None and changed.job is not None:
            await self._touch(changed.job)
        return changed is not None


async def _insert_alert(db: aiosqlite.Connection, alert: NewAlert, *, once: bool) -> None:
    """Insert an alert; with `once`, only when none of its kind is open or acknowledged for its node or job."""
    values: list[Any] = [alert.time, alert.kind, alert.severity, alert.job, alert.node, alert.message]
    sql = "INSERT INTO alerts (time, kind, severity, job, node, message) SELECT ?, ?, ?, ?, ?, ?"
    if once:
        sql += (
            " WHERE NOT EXISTS (SELECT 1 FROM alerts WHERE kind = ? AND node IS ? AND job IS ?"
            " AND state IN ('open', 'acknowledged'))"
        )
        values += [alert.kind, alert.node, alert.job]
    await db.execute(sql, values)


_ALERT_EVENT = {"acknowledged": "alert-acknowledged", "resolved": "alert-resolved"}


async def _set_alert_state(
    db: aiosqlite.Connection, alert_id: int, state: str, *, by: str, now: float, why: str = ""
) -> StoredAlert | None:
    """Move one alert to acknowledged or resolved, with its event; the alert as it was, or None if no change."""
    if state == "acknowledged":
        sql = "UPDATE alerts SET state = ?, acked_by = ?, acked_at = ? WHERE id = ? AND state = 'open'"
    elif state == "resolved":
        sql = (
            "UPDATE alerts SET state = ?, resolved_by = ?, resolved_at = ? WHERE id = ?"
            " AND state IN ('open', 'acknowledged')"
        )
    else:
        raise ValueError(f"cannot set an alert to {state!r}")
    async with db.execute("SELECT * FROM alerts WHERE id = ?", (alert_id,)) as cur:
        row = await cur.fetchone()
    if row is None:
        return None
    cur = await db.execute(sql, (state, by, now, alert_id))
    if cur.rowcount != 1:
        return None
    alert = _alert_from_row(row)
    what = f"job {alert.job}" if alert.job is not None else alert.node
    message = f"alert {alert.id} ({alert.kind}, {what}) {state} by {by}" + (f": {why}" if why else "")
    await db.execute(
        "INSERT INTO events (time, kind, node, job, message, data) VALUES (?, ?, ?, ?, ?, ?)",
        (
            now,
            _ALERT_EVENT[state],
            alert.node,
            None if alert.job is None else str(alert.job),
            message,
            json.dumps({"alert": alert.id, "kind": alert.kind, "by": by}),
        ),
    )
    return alert


async def _auto_resolve(db: aiosqlite.Connection, r: AutoResolve) -> None:
    sql = "SELECT id FROM alerts WHERE node = ? AND kind = ? AND state IN ('open', 'acknowledged') ORDER BY id"
    async with db.execute(sql, (r.node, r.kind)) as cur:
        ids = [row[0] for row in await cur.fetchall()]
    for alert_id in ids:
        await _set_alert_state(db, alert_id, "resolved", by=AUTO, now=r.time, why=r.why)


def is_fault(kind: str, data: dict[str, Any]) -> bool:
    """A node event that counts as a fault: into unhealthy or unreachable, or isolated."""
    return kind == "isolated" or (kind == "state-changed" and data.get("to") in FAULT_STATES)


def _alert_id(value: Any) -> int:
    try:
        return int(str(value).strip().removeprefix("#"))
    except ValueError:
        raise UsageError(f"not an alert id: {value!r} (alert ids are numbers, as `ftconsole alerts` shows)") from None


def _ids_filter(column: str, ids: Collection[int] | None) -> tuple[str, list[Any]]:
    """A WHERE condition for these ids; for none given, or very many, every row (the caller picks)."""
    if ids is None or len(ids) > 500:
        return "1", []
    return f"{column} IN ({','.join('?' * len(ids))})", list(ids)


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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
