"""The state store: SQLite through aiosqlite, WAL mode, schema versioned with `PRAGMA user_version`.

Every change of a node's state is written in one transaction with the events that explain it, before
anything acts on it: after a crash the store is the truth. Migrations are an append-only list of SQL
scripts; a store newer than this program is refused rather than guessed at.

The schema and its migrations are in `scheduler.store.schema`, the records and their row mappings in
`scheduler.store.records`, the writes of a jobs transaction (and the alert writes) in `scheduler.store.jobtx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from ftconsole.probes.health import FAULT_STATES as FAULT_STATES  # what counts as a fault: part of its API
from ftconsole.probes.health import NodeEvent, NodeHealth, is_fault
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.errors import NotFound, StoreError, UsageError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.files import STATE_DIR_MODE, _private_store_files
from ftconsole.scheduler.store.files import STORE_FILE as STORE_FILE  # where the store lives: part of its API
from ftconsole.scheduler.store.jobtx import CheckpointSignal, JobTx, _auto_resolve, _insert_alert
from ftconsole.scheduler.store.jobtx import (
    Conflict as Conflict,  # raised by the store's conditional writes: part of its API
)
from ftconsole.scheduler.store.records import (
    _UPSERT_NODE,
    AutoResolve,
    JobActivity,
    NewAlert,
    StoredAlert,
    StoredEvent,
    StoredProbe,
    _alert_from_row,
    _attempt_from_row,
    _health_from_row,
    _health_row,
    _job_from_row,
    _run_from_row,
)
from ftconsole.scheduler.store.schema import MIGRATIONS, SCHEMA_VERSION
from ftconsole.scheduler.store.sharingreads import SharingReads

PROBE_HISTORY_PER_NODE = 50
ALERT_STATES = ("open", "acknowledged", "resolved")
OPEN_ALERT_STATES = ("open", "acknowledged")

log = logging.getLogger("ftconsole.scheduler")


class Store(SharingReads):
    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._writing = asyncio.Lock()  # one connection: transactions must not interleave
        self._specs: dict[str, JobSpec] = {}  # spec JSON -> parsed (specs never change once stored)
        self._stamp = 0.0  # the last `jobs.updated` stamp handed out (see `_next_stamp`)
        self.cluster_id = ""  # random, made with the store: run folders on the nodes are keyed by it
        # reads of jobs, runs, attempts and checkpoint signals kept until the next write, ours or another
        # process's (see `_kept_read`, `refresh`): a tick asks for the running jobs and the held runs in each of
        # its steps, and rebuilding their records was most of its CPU
        self._generation = 0
        self._data_version: int | None = None  # as of the last `refresh`
        self._kept: dict[tuple[Any, ...], tuple[int, Any]] = {}

    @classmethod
    async def open(cls, path: Path) -> Store:
        try:
            path.parent.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
            changes = _private_store_files(path)
            if changes:
                log.warning("permissions tightened (the store is private): %s", "; ".join(changes))
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
        """BEGIN IMMEDIATE ... COMMIT; any exception rolls the whole transaction back. The kept reads are
        forgotten when it begins (reads inside it see its writes) and when it ends, committed or not."""
        async with self._writing:
            try:
                await self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot {what} in {self.path}: {exc}") from exc
            self.forget()
            try:
                yield
                await self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    await self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"cannot {what} in {self.path}: {exc}") from exc
                raise
            finally:
                self.forget()

    def forget(self) -> None:
        """Drop the kept reads: after a write of ours."""
        self._generation += 1
        self._kept.clear()

    async def refresh(self) -> None:
        """Drop the kept reads if another process wrote since they were read (SQLite's `data_version`, which
        moves with every commit of another connection): each tick asks, and a quiet cluster's tick then builds
        no records again."""
        async with self._db.execute("PRAGMA data_version") as cur:
            row = await cur.fetchone()
        version = row[0] if row is not None else None
        if version != self._data_version:
            self._data_version = version
            self.forget()

    async def _kept_read(self, key: tuple[Any, ...], read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, or what it gave last for `key` when nothing was written since. A read under way when a
        transaction begins is not kept: it may have read before or after the write."""
        generation = self._generation
        kept = self._kept.get(key)
        if kept is not None and kept[0] == generation:
            return kept[1]
        value = await read()
        if generation == self._generation:
            self._kept[key] = (generation, value)
        return value

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

    async def probe_history(self) -> list[StoredProbe]:
        """Every probe result kept (`PROBE_HISTORY_PER_NODE` per node), oldest first."""
        async with self._db.execute("SELECT node, time, error, report FROM probe_results ORDER BY id") as cur:
            rows = await cur.fetchall()
        return [StoredProbe(node=r[0], time=r[1], error=r[2], report=json.loads(r[3]) if r[3] else None) for r in rows]

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

    async def owners(self, *, since: float) -> list[str]:
        """The owners of the jobs that are active, or ended at `since` or later (deleted ones too)."""
        cur = await self._db.execute(
            "SELECT DISTINCT owner FROM jobs WHERE ended IS NULL OR ended >= ? ORDER BY owner", (since,)
        )
        return [row[0] for row in await cur.fetchall()]

    async def jobs(
        self, *, statuses: Iterable[JobStatus] | None = None, deleted: bool = False, ended_since: float | None = None
    ) -> list[Job]:
        """Jobs by id; `ended_since`: only those that ended at or after that time."""
        wanted = None if statuses is None else tuple(statuses)
        key = ("jobs", wanted, deleted, ended_since)
        return list(await self._kept_read(key, lambda: self._jobs(wanted, deleted, ended_since)))

    async def _jobs(self, statuses: Iterable[JobStatus] | None, deleted: bool, ended_since: float | None) -> list[Job]:
        sql = "SELECT * FROM jobs WHERE deleted <= ?"
        args: list[Any] = [1 if deleted else 0]
        if statuses is not None:
            wanted = [s.value for s in statuses]
            sql += f" AND status IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        if ended_since is not None:
            sql += " AND ended >= ?"
            args.append(ended_since)
        async with self._db.execute(sql + " ORDER BY id", args) as cur:
            rows = await cur.fetchall()
        return [self._job_from_row(r) for r in rows]

    async def private_jobs(self, *, except_uid: int) -> frozenset[int]:
        """The ids of the jobs with access `none` that `except_uid` did not submit (deleted ones too): the jobs
        hidden from that user's listings. One query on two columns; no spec is read."""
        sql = "SELECT id FROM jobs WHERE access = 'none' AND uid != ?"
        async with self._db.execute(sql, (except_uid,)) as cur:
            rows = await cur.fetchall()
        return frozenset(int(r[0]) for r in rows)

    async def job(self, job_id: int) -> Job | None:
        async with self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)) as cur:
            row = await cur.fetchone()
        return self._job_from_row(row) if row else None

    async def array_tasks(self, array_id: int) -> list[Job]:
        """The tasks of an array (deleted ones too), by index."""
        sql = "SELECT * FROM jobs WHERE array_id = ? ORDER BY array_index"
        async with self._db.execute(sql, (array_id,)) as cur:
            rows = await cur.fetchall()
        return [self._job_from_row(r) for r in rows]

    async def array_task(self, array_id: int, index: int) -> Job | None:
        sql = "SELECT * FROM jobs WHERE array_id = ? AND array_index = ?"
        async with self._db.execute(sql, (array_id, index)) as cur:
            row = await cur.fetchone()
        return self._job_from_row(row) if row else None

    def _job_from_row(self, row: sqlite3.Row) -> Job:
        spec = self._specs.get(row["spec"])
        if spec is None:
            if len(self._specs) > 50_000:
                self._specs.clear()
            spec = self._specs[row["spec"]] = JobSpec.from_stored(json.loads(row["spec"]))
        return _job_from_row(row, spec)

    async def attempts(self, job_id: int | None) -> list[Attempt]:
        """A job's attempts; None: every job's (by job, then number)."""
        sql, args = ("SELECT * FROM attempts ORDER BY job, number", ()) if job_id is None else (
            "SELECT * FROM attempts WHERE job = ? ORDER BY number", (job_id,))  # fmt: skip
        async with self._db.execute(sql, args) as cur:
            rows = await cur.fetchall()
        return [_attempt_from_row(r) for r in rows]

    async def running_attempts(self) -> dict[int, Attempt]:
        """The current attempt of every running job, by job id, in one query."""
        return dict(await self._kept_read(("running_attempts",), self._running_attempts))

    async def _running_attempts(self) -> dict[int, Attempt]:
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
        return list(await self._kept_read(("runs", job, held), lambda: self._runs(job, held)))

    async def _runs(self, job: int | None, held: bool | None) -> list[Run]:
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

    async def evidence(self, job: int) -> dict[str, Any] | None:
        """The newest evidence document kept of a job (`JobTx.evidence`), or None."""
        async with self._db.execute("SELECT data FROM evidence WHERE job = ? ORDER BY id DESC LIMIT 1", (job,)) as cur:
            row = await cur.fetchone()
        return None if row is None else dict(json.loads(row[0]))

    async def checkpoint_signals(self, *, owed: bool = True, job: int | None = None) -> list[CheckpointSignal]:
        """The checkpoint signals still owed (`owed`), or all of them; of one job, or of every job."""
        return list(await self._kept_read(("checkpoint_signals", owed, job), lambda: self._checkpoints(owed, job)))

    async def _checkpoints(self, owed: bool, job: int | None) -> list[CheckpointSignal]:
        sql = "SELECT * FROM checkpoint_signals WHERE " + ("outcome IS NULL" if owed else "1")
        args: list[Any] = []
        if job is not None:
            sql += " AND job = ?"
            args.append(job)
        async with self._db.execute(sql + " ORDER BY job, attempt, rank", args) as cur:
            rows = await cur.fetchall()
        return [CheckpointSignal(**dict(r)) for r in rows]

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

    async def alerts_after(self, after: int, *, limit: int = 500) -> list[StoredAlert]:
        """The oldest `limit` alerts with an id above `after`, in any state, oldest first (what a notify target
        has still to get)."""
        async with self._db.execute("SELECT * FROM alerts WHERE id > ? ORDER BY id LIMIT ?", (after, limit)) as cur:
            rows = await cur.fetchall()
        return [_alert_from_row(r) for r in rows]

    async def newest_alert_id(self) -> int:
        """The id of the newest alert stored (0: none yet)."""
        async with self._db.execute("SELECT COALESCE(MAX(id), 0) FROM alerts") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def notify_cursors(self) -> dict[str, int]:
        """Per notify target, the alert id up to which every alert is done for it (see `set_notify_cursor`)."""
        async with self._db.execute("SELECT target, alert FROM notify_cursors") as cur:
            return {target: int(alert) async for target, alert in cur}

    async def set_notify_cursor(self, target: str, alert: int, *, now: float) -> None:
        """Every alert up to id `alert` is done for `target`; a cursor only moves forward."""
        async with self._transaction(f"record the notifications sent to {target}"):
            await self._db.execute(
                "INSERT INTO notify_cursors (target, alert, updated) VALUES (?, ?, ?) ON CONFLICT (target) DO UPDATE "
                "SET alert = MAX(alert, excluded.alert), updated = excluded.updated",
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

    async def fault_events(self, *, since: float) -> dict[str, list[StoredEvent]]:
        """Each node's faults (`is_fault` events) at `since` or later, oldest first: its recent fault history."""
        sql = (
            "SELECT id, time, kind, node, job, message, data FROM events "
            "WHERE kind IN ('isolated', 'state-changed') AND time >= ? AND node IS NOT NULL ORDER BY id"
        )  # the partial index events_faults
        out: dict[str, list[StoredEvent]] = {}
        async with self._db.execute(sql, (since,)) as cur:
            async for r in cur:
                data = json.loads(r[6])
                if is_fault(r[2], data):
                    event = StoredEvent(id=r[0], time=r[1], kind=r[2], node=r[3], job=r[4], message=r[5], data=data)
                    out.setdefault(r[3], []).append(event)
        return out


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
