"""The state store: SQLite (the default: a file in state_dir) or PostgreSQL, behind `scheduler.store.engine`.

Every change of a node's state is written in one transaction with the events that explain it, before
anything acts on it: after a crash the store is the truth. Migrations are an append-only list of SQL
scripts; a store newer than this program is refused rather than guessed at.

The schema and its migrations are in `scheduler.store.schema` (their PostgreSQL DDL in `scheduler.store.postgres`),
the records and their row mappings in `scheduler.store.records`, the writes of a jobs transaction (and the alert
writes) in `scheduler.store.jobtx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from ftconsole.probes.health import FAULT_STATES as FAULT_STATES  # what counts as a fault: part of its API
from ftconsole.probes.health import NodeEvent, NodeHealth, is_fault
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.activejobs import ACTIVE as ACTIVE_STATUSES
from ftconsole.scheduler.store.activejobs import ActiveJobs
from ftconsole.scheduler.store.alertreads import OPEN_ALERT_STATES as OPEN_ALERT_STATES  # part of its API
from ftconsole.scheduler.store.alertreads import AlertReads
from ftconsole.scheduler.store.engine import ANY_TABLE, Engine, Row, connect, is_postgres
from ftconsole.scheduler.store.files import STATE_DIR_MODE, _private_store_files
from ftconsole.scheduler.store.files import STORE_FILE as STORE_FILE  # where the store lives: part of its API
from ftconsole.scheduler.store.history import HistoryStore
from ftconsole.scheduler.store.jobtx import CheckpointSignal, JobTx, _auto_resolve, _insert_alert
from ftconsole.scheduler.store.jobtx import (
    Conflict as Conflict,  # raised by the store's conditional writes: part of its API
)
from ftconsole.scheduler.store.ledger import LedgerStore
from ftconsole.scheduler.store.records import (
    _UPSERT_NODE,
    AutoResolve,
    JobActivity,
    NewAlert,
    StoredEvent,
    StoredProbe,
    _attempt_from_row,
    _health_from_row,
    _health_row,
    _job_from_row,
    _run_from_row,
)
from ftconsole.scheduler.store.schema import MIGRATIONS as MIGRATIONS  # SQLite's: part of its API (tests)
from ftconsole.scheduler.store.schema import SCHEMA_VERSION, newer_store_refusal
from ftconsole.scheduler.store.sharingreads import SharingReads
from ftconsole.scheduler.store.stepreads import StepReads

PROBE_HISTORY_PER_NODE = 50
RECENT_S = 7 * 86400.0  # the jobs a client following the job list starts with: active, or ended this recently
ALERT_STATES = ("open", "acknowledged", "resolved")

log = logging.getLogger("ftconsole.scheduler")

# the tables each kept read reads (see `Store._kept_read`)
_JOBS = frozenset({"jobs"})
_ATTEMPTS = frozenset({"attempts", "jobs"})
_RUNS = frozenset({"runs", "attempts"})
_CHECKPOINTS = frozenset({"checkpoint_signals"})


class Store(SharingReads, StepReads, AlertReads, HistoryStore, LedgerStore, ActiveJobs):
    def __init__(self, db: Engine, path: Path | str) -> None:
        self._db = db
        self.path = path  # the SQLite file, or the PostgreSQL URL (`where` names it in messages)
        self.where = db.where
        self._writing = asyncio.Lock()  # one connection: transactions must not interleave
        self._specs: dict[str, JobSpec] = {}  # spec JSON -> parsed (specs never change once stored)
        # job id -> (its row's values, the record built from them): a job whose row did not change is not built
        # again when a write drops the kept reads (a submit among thousands of queued jobs changes one row)
        self._built: dict[int, tuple[tuple[Any, ...], Job]] = {}
        self._stamp = 0.0  # the last `jobs.updated` stamp handed out (see `_next_stamp`)
        self.cluster_id = ""  # random, made with the store: run folders on the nodes are keyed by it
        # reads of jobs, runs, attempts and checkpoint signals kept until the next write to a table they read,
        # ours or another process's (see `_kept_read`, `_wrote`, `refresh`): a tick asks for the running jobs and
        # the held runs in each of its steps, and rebuilding their records was most of its CPU
        self._generation = 0  # moves with every write
        self._wrote_at: dict[str, int] = {}  # table -> the generation of its last write (ANY_TABLE: of any table)
        self._kept: dict[tuple[Any, ...], tuple[int, frozenset[str], Any]] = {}
        self._kept_of: dict[str, set[tuple[Any, ...]]] = {}  # table -> the keys of the kept reads of it
        # key -> a read begun and not done: (the generation then, its answer, the transaction it is part of or None)
        self._under_way: dict[tuple[Any, ...], tuple[int, asyncio.Future[Any], object | None]] = {}
        self._init_active()
        db.on_write = self._wrote

    @classmethod
    async def open(cls, where: Path | str) -> Store:
        """The store in a SQLite file (made, private, when there is none) or at a `postgresql://` URL."""
        if not is_postgres(where):
            path = Path(where)
            try:
                path.parent.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
                changes = _private_store_files(path)
                if changes:
                    log.warning("permissions tightened (the store is private): %s", "; ".join(changes))
            except OSError as exc:
                raise StoreError(f"cannot open {path}: {exc}") from exc
            where = path
        db = await connect(where)
        store = cls(db, where)
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
            version = await db.schema_version()
            if version > SCHEMA_VERSION:
                raise StoreError(newer_store_refusal(self.where, version))
            for number in range(version + 1, SCHEMA_VERSION + 1):
                await db.migrate(number)
            row = await db.fetchone("SELECT COALESCE(MAX(updated), 0) FROM jobs")
            self._stamp = float(row[0]) if row else 0.0
            row = await db.fetchone("SELECT value FROM meta WHERE key = 'cluster_id'")
            if row is None:
                raise StoreError(f"{self.where} has no cluster id: it was not made by ftconsole")
            self.cluster_id = str(row[0])
        except db.errors as exc:
            raise StoreError(f"cannot prepare {self.where}: {exc}") from exc

    async def schema_version(self) -> int:
        return await self._db.schema_version()

    def fence(self, epoch: int | None) -> None:
        """Check each write transaction against this lease epoch from now on (`Engine.epoch`)."""
        self._db.epoch = epoch

    # -- nodes -------------------------------------------------------------------------------------------

    async def node_health(self, name: str) -> NodeHealth | None:
        row = await self._db.fetchone("SELECT * FROM nodes WHERE name = ?", (name,))
        return _health_from_row(row) if row else None

    async def all_node_health(self) -> dict[str, NodeHealth]:
        rows = await self._db.fetchall("SELECT * FROM nodes")
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
        """BEGIN ... COMMIT holding the store's write lock (`Engine.begin`); any exception rolls the whole
        transaction back. The kept reads of each table it writes are forgotten as it writes (reads inside it see
        its writes); all of them when another process wrote since we last looked, and when it is rolled back."""
        db = self._db
        async with self._writing:
            try:
                if await db.begin():
                    self.forget()
            except db.errors as exc:
                raise StoreError(f"cannot {what} in {self.where}: {exc}") from exc
            try:
                yield
                await db.commit()
            except BaseException as exc:
                self.forget()  # what was read inside it saw writes that are gone
                with contextlib.suppress(*db.errors):  # a connection lost: the server rolled it back
                    await db.rollback()  # and the connection's turn given back, whatever ended the transaction
                if isinstance(exc, db.errors):
                    raise StoreError(f"cannot {what} in {self.where}: {exc}") from exc
                raise

    def version(self, tables: Collection[str]) -> int:
        """A number that moves whenever one of `tables` is written (by this process, or by another as `refresh`
        found): what is derived from their kept reads may be kept as long as it stays the same."""
        written = self._wrote_at.get
        return max(written(ANY_TABLE, 0), *(written(t, 0) for t in tables))

    def forget(self) -> None:
        """Drop every kept read: another process wrote, or a transaction was rolled back."""
        self._wrote(ANY_TABLE)

    def _wrote(self, table: str) -> None:
        """A write to `table` (`ANY_TABLE`: to any) is about to run, or ran: the kept reads of it go (told by the
        engine, `Engine.on_write`, before and after each write statement)."""
        self._generation += 1
        self._wrote_at[table] = self._generation
        if table == ANY_TABLE:
            self._kept.clear()
            self._kept_of.clear()
            return
        for key in self._kept_of.pop(table, ()):  # gone, not only stale: a key read once (a time in it) never piles up
            self._kept.pop(key, None)

    async def refresh(self) -> None:
        """Drop the kept reads if another process wrote since they were read (`Engine.changed_elsewhere`): each
        tick asks, and a quiet cluster's tick then builds no records again."""
        if await self._db.changed_elsewhere():
            self.forget()

    async def _kept_read(self, key: tuple[Any, ...], tables: frozenset[str], read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, or what it gave last for `key` when none of `tables` (those it reads) was written since. A
        read under way when one of them is written is not kept: it may have read before or after the write. It waits
        for another task's transaction to end (what was kept inside it may not be committed: `Turns`), and inside
        a transaction it never joins a read under way outside it (that read waits for the transaction's end)."""
        turns = self._db.turns
        await turns.outside()
        generation = self._generation
        kept = self._kept.get(key)
        if kept is not None and self._unwritten(kept[1], since=kept[0]):
            return kept[2]
        # the same read under way, begun after the last write to its tables: its answer is as fresh as a new one
        # (64 nodes' sweeps asking at once read once)
        mine = turns.whose()  # the transaction this read is part of (None: none)
        while (under_way := self._under_way.get(key)) is not None and self._unwritten(tables, since=under_way[0]):
            if under_way[2] is not mine:
                break  # a read of another transaction, or of none
            try:
                return await asyncio.shield(under_way[1])
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not under_way[1].cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller was cancelled
                # the read's own caller was (a client that went away): the first of those waiting reads again
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._under_way[key] = (generation, answer, mine)
        try:
            value = await read()
        except Exception as exc:
            answer.set_exception(exc)
            answer.exception()  # retrieved: those waiting for it get it; nobody else need
            raise
        except BaseException:
            answer.cancel()  # cancelled: those waiting read for themselves
            raise
        else:
            answer.set_result(value)
        finally:
            if (found := self._under_way.get(key)) is not None and found[1] is answer:
                del self._under_way[key]
        if self._unwritten(tables, since=generation):
            self._kept[key] = (generation, tables, value)
            for table in tables:
                self._kept_of.setdefault(table, set()).add(key)
        return value

    def _unwritten(self, tables: frozenset[str], *, since: int) -> bool:
        """Whether none of `tables` was written after generation `since`."""
        written = self._wrote_at.get
        return written(ANY_TABLE, 0) <= since and all(written(t, 0) <= since for t in tables)

    @contextlib.asynccontextmanager
    async def jobs_tx(self, what: str) -> AsyncIterator[JobTx]:
        """A transaction over jobs, attempts, runs, alerts and events: all of it is written, or none.

        Every job it changes (its row, its attempts, runs or alerts) gets `updated` = this transaction's stamp.
        """
        async with self._transaction(what):
            stamp = self._next_stamp()
            with self._open_stamp(stamp):
                yield JobTx(self._db, stamp)

    def _next_stamp(self) -> float:
        """A `jobs.updated` stamp: the wall clock, but always above every stamp handed out before (the clock
        may step back). Called only while holding `_writing`."""
        self._stamp = max(time.time(), self._stamp + 1e-6)
        return self._stamp

    async def probe_history(self) -> list[StoredProbe]:
        """Every probe result kept (`PROBE_HISTORY_PER_NODE` per node), oldest first."""
        rows = await self._db.fetchall("SELECT node, time, error, report FROM probe_results ORDER BY id")
        return [StoredProbe(node=r[0], time=r[1], error=r[2], report=json.loads(r[3]) if r[3] else None) for r in rows]

    async def latest_probes(self) -> dict[str, StoredProbe]:
        sql = (
            "SELECT p.node, p.time, p.error, p.report FROM probe_results p "
            "JOIN (SELECT node, MAX(id) AS id FROM probe_results GROUP BY node) last ON p.id = last.id"
        )
        rows = await self._db.fetchall(sql)
        return {
            r[0]: StoredProbe(node=r[0], time=r[1], error=r[2], report=json.loads(r[3]) if r[3] else None) for r in rows
        }

    # -- events ------------------------------------------------------------------------------------------

    async def events(
        self, *, node: str | None = None, job: str | None = None, kind: str | None = None, limit: int = 100
    ) -> list[StoredEvent]:
        where, args = [], []
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if job is not None:
            where.append("job = ?")
            args.append(job)
        sql = "SELECT id, time, kind, node, job, message, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        rows = await self._db.fetchall(sql, (*args, limit))
        return [
            StoredEvent(id=r[0], time=r[1], kind=r[2], node=r[3], job=r[4], message=r[5], data=json.loads(r[6]))
            for r in reversed(list(rows))
        ]

    # -- jobs --------------------------------------------------------------------------------------------------

    async def owners(self, *, since: float) -> list[str]:
        """The owners of the jobs that are active, or ended at `since` or later (deleted ones too; `since` taken
        back to the hour: each node's sweep asks, and the answer is kept until a job changes)."""
        since -= since % 3600
        active = tuple(s.value for s in JobStatus if s.active)
        ended = tuple(s.value for s in JobStatus if not s.active)
        sql = (  # two indexed reads (an OR of the two would scan every job)
            f"SELECT owner FROM jobs WHERE status IN ({','.join('?' * len(active))}) UNION "
            f"SELECT owner FROM jobs WHERE status IN ({','.join('?' * len(ended))}) AND ended >= ? ORDER BY owner"
        )

        async def read() -> list[str]:
            return [row[0] for row in await self._db.fetchall(sql, (*active, *ended, since))]

        return list(await self._kept_read(("owners", since), _JOBS, read))

    async def jobs(
        self, *, statuses: Iterable[JobStatus] | None = None, deleted: bool = False, ended_since: float | None = None
    ) -> list[Job]:
        """Jobs by id; `ended_since`: only those that ended at or after that time."""
        wanted = None if statuses is None else tuple(statuses)
        if wanted is not None and ended_since is None and set(wanted) <= ACTIVE_STATUSES:
            return list(await self.active_jobs(frozenset(wanted), deleted=deleted))
        key = ("jobs", wanted, deleted, ended_since)
        return list(await self._kept_read(key, _JOBS, lambda: self._jobs(wanted, deleted, ended_since)))

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
        rows = await self._db.fetchall(sql + " ORDER BY id", args)
        return [self._job_from_row(r) for r in rows]

    async def private_jobs(self, *, except_uid: int) -> frozenset[int]:
        """The ids of the jobs with access `none` that `except_uid` did not submit (deleted ones too): the jobs
        hidden from that user's listings. One query on two columns; no spec is read."""
        sql = "SELECT id FROM jobs WHERE access = 'none' AND uid != ?"
        rows = await self._db.fetchall(sql, (except_uid,))
        return frozenset(int(r[0]) for r in rows)

    async def job(self, job_id: int) -> Job | None:
        row = await self._db.fetchone("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return self._job_from_row(row) if row else None

    async def jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        """The jobs of these ids that exist, by id; a few queries for thousands."""
        out: list[Job] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            sql = f"SELECT * FROM jobs WHERE id IN ({','.join('?' * len(chunk))}) ORDER BY id"
            out += [self._job_from_row(r) for r in await self._db.fetchall(sql, chunk)]
        return out

    async def array_tasks(self, array_id: int) -> list[Job]:
        """The tasks of an array (deleted ones too), by index."""
        sql = "SELECT * FROM jobs WHERE array_id = ? ORDER BY array_index"
        rows = await self._db.fetchall(sql, (array_id,))
        return [self._job_from_row(r) for r in rows]

    async def array_task(self, array_id: int, index: int) -> Job | None:
        sql = "SELECT * FROM jobs WHERE array_id = ? AND array_index = ?"
        row = await self._db.fetchone(sql, (array_id, index))
        return self._job_from_row(row) if row else None

    def _job_from_row(self, row: Row) -> Job:
        values = tuple(row)
        built = self._built.get(row["id"])
        if built is not None and built[0] == values:
            return built[1]
        if len(self._built) > 100_000:
            self._built.clear()
        job = self._new_job(row)
        self._built[row["id"]] = (values, job)
        return job

    def _new_job(self, row: Row) -> Job:
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
        rows = await self._db.fetchall(sql, args)
        return [_attempt_from_row(r) for r in rows]

    async def running_attempts(self) -> dict[int, Attempt]:
        """The current attempt of every running job, by job id, in one query."""
        return dict(await self._kept_read(("running_attempts",), _ATTEMPTS, self._running_attempts))

    async def _running_attempts(self) -> dict[int, Attempt]:
        sql = (
            "SELECT a.* FROM attempts a JOIN jobs j ON a.job = j.id AND a.number = j.attempt WHERE j.status = 'running'"
        )
        rows = await self._db.fetchall(sql)
        return {row["job"]: _attempt_from_row(row) for row in rows}

    async def attempt(self, job_id: int, number: int) -> Attempt | None:
        row = await self._db.fetchone("SELECT * FROM attempts WHERE job = ? AND number = ?", (job_id, number))
        return _attempt_from_row(row) if row else None

    async def runs(self, *, job: int | None = None, held: bool | None = None) -> list[Run]:
        """Runs of one job (every attempt) or of all jobs; `held`: only those whose GPUs are not released."""
        return list(await self._kept_read(("runs", job, held), _RUNS, lambda: self._runs(job, held)))

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
        rows = await self._db.fetchall(sql + " ORDER BY r.job, r.attempt, r.rank", args)
        return [_run_from_row(r) for r in rows]

    async def queued_count(self, owner: str) -> int:
        """How many jobs `owner` has queued (an index lookup: the cap a submit checks, whatever the queue's size)."""
        row = await self._db.fetchone(
            "SELECT COUNT(*) FROM jobs WHERE owner = ? AND status = ?", (owner, JobStatus.QUEUED.value)
        )
        return int(row[0]) if row else 0

    async def evidence(self, job: int) -> dict[str, Any] | None:
        """The newest evidence document kept of a job (`JobTx.evidence`), or None."""
        row = await self._db.fetchone("SELECT data FROM evidence WHERE job = ? ORDER BY id DESC LIMIT 1", (job,))
        return None if row is None else dict(json.loads(row[0]))

    async def checkpoint_signals(self, *, owed: bool = True, job: int | None = None) -> list[CheckpointSignal]:
        """The checkpoint signals still owed (`owed`), or all of them; of one job, or of every job."""
        key = ("checkpoint_signals", owed, job)
        return list(await self._kept_read(key, _CHECKPOINTS, lambda: self._checkpoints(owed, job)))

    async def _checkpoints(self, owed: bool, job: int | None) -> list[CheckpointSignal]:
        sql = "SELECT * FROM checkpoint_signals WHERE " + ("outcome IS NULL" if owed else "1 = 1")
        args: list[Any] = []
        if job is not None:
            sql += " AND job = ?"
            args.append(job)
        rows = await self._db.fetchall(sql + " ORDER BY job, attempt, rank", args)
        return [CheckpointSignal(**dict(r)) for r in rows]

    async def job_activity(self, job_ids: Collection[int] | None = None) -> dict[int, JobActivity]:
        """What the job listing shows beyond the job row, for the given jobs (default: all), in two queries:
        the current attempt's nodes in rank order and its latest output, and the count of unresolved alerts; two
        queries per 500 jobs (never every job's for a long list: the store may hold a year of them)."""
        if job_ids is None:
            return await self._activity("1 = 1", [])
        ids = sorted(job_ids)
        out: dict[int, JobActivity] = {}
        for start in range(0, len(ids), 500):
            out.update(await self._activity(*_ids_filter("j.id", ids[start : start + 500])))
        return out

    async def _activity(self, where: str, args: Sequence[Any]) -> dict[int, JobActivity]:
        """`where`: a condition on the jobs table as `j` ("1 = 1" for all)."""
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
        for job, node, output_at in await self._db.fetchall(runs_sql, args):
            nodes.setdefault(job, {})[node] = None
            if output_at is not None and output_at > output.get(job, float("-inf")):
                output[job] = output_at
        counts = {job: count for job, count in await self._db.fetchall(alerts_sql, args)}
        return {
            job: JobActivity(
                last_output=output.get(job), open_alerts=counts.get(job, 0), node_names=tuple(nodes.get(job, ()))
            )
            for job in nodes.keys() | counts.keys()
        }

    async def jobs_changed(self, since: float | None) -> tuple[float, list[Job], dict[int, JobActivity]]:
        """The jobs changed since a cursor, for a client that follows the job list; returns the next cursor.

        `since` None: every job not deleted that is active or ended in the last `RECENT_S` (no history). Else
        every job whose `updated` is at or after `since`, deleted ones
        included (their `deleted` says so), with its activity (`job_activity`). The client calls again with
        the cursor returned. No change is missed: this holds the store's write lock, so no transaction of this
        process is half done while it reads, and the cursor is a stamp taken under that lock, so every later
        transaction gets a stamp above it (`_next_stamp`), which `>=` finds. A job may come back twice; that
        is harmless. (Writers in other processes, such as the CLI while no scheduler runs, stamp with their
        own clock; the state_dir lock keeps them away while a scheduler serves this feed.)
        """
        async with self._writing:
            cursor = self._next_stamp()
            if since is None:  # the console's first read: the active jobs and those of the last week, no history
                where = "j.deleted = 0 AND (j.status IN ('queued', 'running') OR j.ended >= ?)"
                args = [cursor - RECENT_S]
            else:
                where, args = "j.updated >= ?", [float(since)]
            rows = await self._db.fetchall(f"SELECT * FROM jobs j WHERE {where} ORDER BY j.id", args)
            activity = await self._activity(where, args)
        return cursor, [self._job_from_row(r) for r in rows], activity

    async def node_faults(self) -> dict[str, int]:
        """How many times each node became unhealthy, unreachable or isolated (per its events)."""
        return {name: faults for name, faults in await self._db.fetchall("SELECT name, faults FROM nodes")}

    async def fault_events(self, *, since: float) -> dict[str, list[StoredEvent]]:
        """Each node's faults (`is_fault` events) at `since` or later, oldest first: its recent fault history."""
        sql = (
            "SELECT id, time, kind, node, job, message, data FROM events "
            "WHERE kind IN ('isolated', 'state-changed') AND time >= ? AND node IS NOT NULL ORDER BY time, id"
        )  # the partial index events_faults (in the index's order: by id, SQLite would scan every event)
        out: dict[str, list[StoredEvent]] = {}
        for r in await self._db.fetchall(sql, (since,)):
            data = json.loads(r[6])
            if is_fault(r[2], data):
                event = StoredEvent(id=r[0], time=r[1], kind=r[2], node=r[3], job=r[4], message=r[5], data=data)
                out.setdefault(r[3], []).append(event)
        return out


def _ids_filter(column: str, ids: Collection[int] | None) -> tuple[str, list[Any]]:
    """A WHERE condition for these ids; for none given, or very many, every row (the caller picks); for an empty
    list, no row (`IN ()` is no SQL PostgreSQL reads)."""
    if ids is None or len(ids) > 500:
        return "1 = 1", []
    if not ids:
        return "1 = 0", []
    return f"{column} IN ({','.join('?' * len(ids))})", list(ids)
