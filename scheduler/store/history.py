"""The store's side of history retention (`history:` in the config; the pruning itself is `scheduler.retention`):
which ended jobs, old events and resolved alerts may go, and their removal in small transactions, each with what
must outlive them: the per-day sums of what the pruned jobs used (`history_days`) and the count of what was
pruned (`pruned`, with the restarts of the pruned attempts, so that the metrics' counters never go down).

Part of `Store` (db.py), as `AlertReads` is. The SQL is the dialect both engines read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.decide.reconcile import PREEMPTED, REQUEUED, RESTARTED, SHRUNK
from ftconsole.scheduler.store.engine import Engine
from ftconsole.scheduler.store.jobtx import CheckpointSignal, Conflict
from ftconsole.scheduler.store.records import _attempt_from_row, _run_from_row

ENDED = tuple(s.value for s in JobStatus if not s.active)
ACTIVE = tuple(s.value for s in JobStatus if s.active)
RESTART_RESULTS = (RESTARTED, REQUEUED, SHRUNK, PREEMPTED)
DAY_S = 86400.0


@dataclass(frozen=True)
class DaySum:
    """What the rolled jobs (ended, and summed per day) of one (user, project) used on one UTC day; `jobs`: those
    that first used GPUs that day, so that a job is counted once however many days it ran."""

    day: float
    owner: str
    project: str
    gpu_seconds: float = 0.0
    jobs: int = 0
    useful: float = 0.0
    rework: float = 0.0
    downtime: float = 0.0
    saved: float = 0.0


class JobOwner(NamedTuple):
    """Whose a job is, as usage sums read it."""

    owner: str
    project: str


_GPU_LISTS: dict[str, tuple[int, ...]] = {}


def _gpus(text: str) -> tuple[int, ...]:
    """A run's GPU list (a JSON list of indexes), read once per distinct list."""
    found = _GPU_LISTS.get(text)
    if found is None:
        found = tuple(json.loads(text))
        if len(_GPU_LISTS) < 4096:
            _GPU_LISTS[text] = found
    return found


@dataclass(frozen=True)
class Pruning:
    """A batch of ended jobs to prune, with everything their day sums are made of."""

    jobs: list[Job]
    attempts: list[Attempt]
    runs: list[Run]
    signals: list[CheckpointSignal]


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


class HistoryStore:
    """Part of `Store` (db.py): history retention's reads and writes."""

    _db: Engine

    def _transaction(self, what: str) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError  # Store's

    def _job_from_row(self, row: Any) -> Job:
        raise NotImplementedError  # Store's

    async def prunable_jobs(self, before: float, limit: int) -> Pruning:
        """Up to `limit` jobs that ended before `before` and are in the day sums (rolled), oldest first, with their
        attempts, runs and checkpoint signals. Not one whose alert is still open or acknowledged (an on-call person
        still looks at it), nor a task of an array with a task still active or ended since (an array goes whole)."""
        sql = (
            f"SELECT j.* FROM jobs j WHERE j.status IN ({_marks(ENDED)}) AND j.ended < ? AND j.rolled = 1 "
            "AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.job = j.id AND a.state != 'resolved') "
            "AND (j.array_id IS NULL OR NOT EXISTS (SELECT 1 FROM jobs t WHERE t.array_id = j.array_id "
            "AND (t.ended IS NULL OR t.ended >= ?))) ORDER BY j.ended, j.id LIMIT ?"
        )
        return await self._with_parts(await self._db.fetchall(sql, (*ENDED, before, before, limit)))

    async def rollable_jobs(self, before: float, limit: int) -> Pruning:
        """Up to `limit` jobs that ended before `before` and are not in the day sums yet, with their attempts, runs
        and checkpoint signals (what their day sums are made of). In no order: a batch reads its rows from the
        index of the jobs not rolled and stops there (an order would sort every job not rolled, each batch: a
        million after an upgrade)."""
        sql = f"SELECT * FROM jobs WHERE rolled = 0 AND status IN ({_marks(ENDED)}) AND ended < ? LIMIT ?"
        return await self._with_parts(await self._db.fetchall(sql, (*ENDED, before, limit)))

    async def _with_parts(self, rows: Sequence[Any]) -> Pruning:
        jobs = [self._job_from_row(r) for r in rows]
        if not jobs:
            return Pruning([], [], [], [])
        ids = [j.id for j in jobs]
        inside = f"({_marks(ids)})"
        attempts = await self._db.fetchall(f"SELECT * FROM attempts WHERE job IN {inside} ORDER BY job, number", ids)
        runs = await self._db.fetchall(
            "SELECT r.*, a.token FROM runs r JOIN attempts a ON a.job = r.job AND a.number = r.attempt "
            f"WHERE r.job IN {inside} ORDER BY r.job, r.attempt, r.rank",
            ids,
        )
        signals = await self._db.fetchall(f"SELECT * FROM checkpoint_signals WHERE job IN {inside}", ids)
        return Pruning(
            jobs,
            [_attempt_from_row(r) for r in attempts],
            [_run_from_row(r) for r in runs],
            [CheckpointSignal(**dict(r)) for r in signals],
        )

    async def roll_jobs(self, pruning: Pruning, days: Sequence[DaySum]) -> int:
        """Add these ended jobs' day sums (`days`, made of them) and mark them rolled, in one transaction: `usage`
        reads them from their days from now on. Keeps the longest span of a rolled job (`rolled_span` in meta: how
        far back from a window's edge a job that ran across it may have started). The number of jobs rolled."""
        ids = [j.id for j in pruning.jobs]
        if not ids:
            return 0
        span = max((j.ended or 0.0) - (j.started if j.started is not None else (j.ended or 0.0)) for j in pruning.jobs)
        async with self._transaction("roll ended jobs' usage into day sums"):
            rolled = await self._db.execute(
                f"UPDATE jobs SET rolled = 1 WHERE rolled = 0 AND id IN ({_marks(ids)})", ids
            )
            if rolled != len(ids):  # rolled meanwhile (another scheduler on the store): add nothing twice
                raise Conflict(f"{len(ids) - rolled} of {len(ids)} jobs were rolled meanwhile")
            await self._add_days(days)
            await self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('rolled_span', ?) ON CONFLICT (key) DO UPDATE SET value = "
                "excluded.value WHERE CAST(meta.value AS DOUBLE PRECISION) < CAST(excluded.value AS DOUBLE PRECISION)",
                (repr(span),),
            )
        return rolled

    async def _add_days(self, days: Sequence[DaySum]) -> None:
        await self._db.executemany(
            "INSERT INTO history_days (day, owner, project, gpu_seconds, jobs, useful, rework, downtime, saved) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (day, owner, project) DO UPDATE SET "
            "gpu_seconds = history_days.gpu_seconds + excluded.gpu_seconds, "
            "jobs = history_days.jobs + excluded.jobs, useful = history_days.useful + excluded.useful, "
            "rework = history_days.rework + excluded.rework, "
            "downtime = history_days.downtime + excluded.downtime, saved = history_days.saved + excluded.saved",
            [(d.day, d.owner, d.project, d.gpu_seconds, d.jobs, d.useful, d.rework, d.downtime, d.saved)
             for d in days],
        )  # fmt: skip

    async def kept(self, key: str) -> str | None:
        """A value the scheduler keeps across restarts in meta (a learnt fabric baseline: `fabric.<pool>`)."""
        row = await self._db.fetchone("SELECT value FROM meta WHERE key = ?", (key,))
        return str(row[0]) if row is not None else None

    async def keep(self, key: str, value: str) -> None:
        async with self._transaction(f"keep {key}"):
            await self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    async def unkeep(self, key: str) -> None:
        """A value kept in meta no longer kept (none there: nothing to do)."""
        async with self._transaction(f"remove {key}"):
            await self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    async def kept_under(self, prefix: str) -> dict[str, str]:
        """The values kept in meta under keys that start with `prefix` (a repair under way: `repair.climb.<node>`),
        by key. LIKE with its wildcards escaped (`!`, not a backslash, which PostgreSQL's quoting may read), and the
        prefix checked again here: SQLite's LIKE ignores the case of ASCII letters."""
        pattern = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
        rows = await self._db.fetchall("SELECT key, value FROM meta WHERE key LIKE ? ESCAPE '!'", (pattern,))
        return {str(r[0]): str(r[1]) for r in rows if str(r[0]).startswith(prefix)}

    async def rolled_span(self) -> float:
        """The longest span, from start to end, of a job rolled into the day sums (0 before the first)."""
        row = await self._db.fetchone("SELECT value FROM meta WHERE key = 'rolled_span'")
        return float(row[0]) if row is not None else 0.0

    async def prune_jobs(self, pruning: Pruning, now: float) -> int:
        """Remove these jobs (rolled: their day sums stay) with everything of theirs (attempts, runs, checkpoint
        signals, evidence, events, alerts), in one transaction; the number of jobs removed."""
        ids = [j.id for j in pruning.jobs]
        if not ids:
            return 0
        inside = f"({_marks(ids)})"
        restarts: dict[str, int] = {}
        for a in pruning.attempts:
            if a.result in RESTART_RESULTS:
                restarts[f"restarts:{a.result}"] = restarts.get(f"restarts:{a.result}", 0) + 1
        async with self._transaction("prune ended jobs"):
            for table in ("checkpoint_signals", "evidence", "steps", "runs", "attempts", "alerts"):
                await self._db.execute(f"DELETE FROM {table} WHERE job IN {inside}", ids)
            await self._db.execute(f"DELETE FROM events WHERE job IN {inside}", [str(i) for i in ids])
            gone = await self._db.execute(f"DELETE FROM jobs WHERE id IN {inside}", ids)
            await self._count({"jobs": gone, **restarts}, now)
        return gone

    async def prune_events(self, before: float, limit: int, now: float) -> int:
        """Remove up to `limit` events of no job older than `before` (a job's go with it); how many."""
        rows = await self._db.fetchall(
            "SELECT id FROM events WHERE time < ? AND job IS NULL ORDER BY time LIMIT ?", (before, limit)
        )
        return await self._prune_ids("events", [r[0] for r in rows], now)

    async def prune_alerts(self, before: float, limit: int, now: float) -> int:
        """Remove up to `limit` resolved alerts of no job resolved before `before` (a job's go with it)."""
        rows = await self._db.fetchall(
            "SELECT id FROM alerts WHERE state = 'resolved' AND job IS NULL AND resolved_at < ? ORDER BY id LIMIT ?",
            (before, limit),
        )
        return await self._prune_ids("alerts", [r[0] for r in rows], now)

    async def _prune_ids(self, table: str, ids: Sequence[int], now: float) -> int:
        if not ids:
            return 0
        async with self._transaction(f"prune old {table}"):
            gone = await self._db.execute(f"DELETE FROM {table} WHERE id IN ({_marks(ids)})", list(ids))
            await self._count({table: gone}, now)
        return gone

    async def _count(self, counts: Mapping[str, int], now: float) -> None:
        await self._db.executemany(
            "INSERT INTO pruned (what, count, last) VALUES (?, ?, ?) ON CONFLICT (what) DO UPDATE SET "
            "count = pruned.count + excluded.count, last = excluded.last",
            [(what, n, now) for what, n in counts.items() if n],
        )

    async def pruned_counts(self) -> dict[str, int]:
        """What was pruned so far, by kind (jobs, events, alerts, restarts:<result>)."""
        return {str(r[0]): int(r[1]) for r in await self._db.fetchall("SELECT what, count FROM pruned")}

    async def unrolled_runs(self, since: float, until: float) -> tuple[dict[int, JobOwner], list[Run]]:
        """Every run of the jobs not in the day sums yet that may have used GPUs in [since, until) (active ones,
        and those that ended at `since` or later), with their jobs' owners and projects: what `usage` sums from
        the runs themselves. Two indexed reads (`jobs_status`, `jobs_unrolled`): an OR of them would scan the jobs."""
        return await self._usage_runs([
            (f"j.rolled = 0 AND j.status IN ({_marks(ACTIVE)})", list(ACTIVE)),
            (f"j.rolled = 0 AND j.status IN ({_marks(ENDED)}) AND j.ended >= ? "
             "AND (j.started IS NULL OR j.started < ?)", [*ENDED, since, until]),
        ])  # fmt: skip

    async def rolled_runs(self, since: float, until: float, span: float) -> tuple[dict[int, JobOwner], list[Run]]:
        """Every run of the jobs in the day sums that ran in [since, until): ended in [since, until + span) and
        started before `until` (`span`: the longest job rolled, so that none that ran across the window is
        missed), with their jobs' owners and projects. For the part of a window that is not whole days."""
        return await self._usage_runs([(
            f"j.rolled = 1 AND j.status IN ({_marks(ENDED)}) AND j.ended >= ? AND j.ended < ? AND j.started < ?",
            [*ENDED, since, until + span, until],
        )])  # fmt: skip

    async def _usage_runs(self, reads: Sequence[tuple[str, Sequence[Any]]]) -> tuple[dict[int, JobOwner], list[Run]]:
        select = (
            "SELECT r.job, r.attempt, r.rank, r.gpus, r.started, r.ended, j.owner, j.project FROM runs r "
            "JOIN jobs j ON j.id = r.job WHERE "
        )
        found: list[Run] = []
        owners: dict[int, JobOwner] = {}
        for where, args in reads:
            for job, attempt, rank, gpus, started, ended, owner, project in await self._db.fetchall(
                select + where, args
            ):
                found.append(Run(job, attempt, rank, "", _gpus(gpus), "", True, started=started, ended=ended))
                if job not in owners:
                    owners[job] = JobOwner(owner, project)
        found.sort(key=lambda r: (r.job, r.attempt, r.rank))
        return owners, found

    async def jobs_since(self, since: float, statuses: Sequence[JobStatus] | None = None) -> list[Job]:
        """The jobs (not deleted) active now or ended at `since` or later, by id, of `statuses` (None: any): a
        listing of the recent jobs that reads no older history (two indexed reads)."""
        wanted = [s.value for s in statuses] if statuses is not None else [s.value for s in JobStatus]
        active = [s for s in wanted if s in ACTIVE]
        ended = [s for s in wanted if s in ENDED]
        reads: list[tuple[str, list[Any]]] = []  # two indexed reads (an OR of them scans every job)
        if active:
            reads.append((f"status IN ({_marks(active)})", list(active)))
        if ended:
            reads.append((f"status IN ({_marks(ended)}) AND ended >= ?", [*ended, since]))
        rows = [r for where, args in reads for r in await self._db.fetchall(
            f"SELECT * FROM jobs WHERE deleted = 0 AND {where}", args)]  # fmt: skip
        rows.sort(key=lambda r: r["id"])
        return [self._job_from_row(r) for r in rows]

    async def job_statuses(self, ids: Sequence[int]) -> list[tuple[int, str, int | None]]:
        """(id, status, array id) of these jobs and of the tasks of the arrays they name (deleted ones too)."""
        out: list[tuple[int, str, int | None]] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            inside = f"({_marks(chunk)})"
            sql = f"SELECT id, status, array_id FROM jobs WHERE id IN {inside} OR array_id IN {inside}"
            out += [(int(r[0]), str(r[1]), r[2]) for r in await self._db.fetchall(sql, chunk + chunk)]
        return out

    async def node_runs(self, node: str, limit: int) -> list[dict[str, Any]]:
        """The runs that held GPUs of `node`, the newest job first (at most `limit`), each with its job's name,
        owner and status: which jobs had each GPU (the console's node screen). `released IN (0, 1)` lets the
        index on (released, node) find them."""
        sql = (
            "SELECT r.job, r.attempt, r.rank, r.gpus, r.state, r.exit_code, r.signal, r.started, r.ended, "
            "j.name, j.owner, j.status, j.array_id, j.array_index FROM runs r JOIN jobs j ON j.id = r.job "
            "WHERE r.released IN (0, 1) AND r.node = ? ORDER BY r.job DESC, r.attempt DESC, r.rank LIMIT ?"
        )
        keys = ("job", "attempt", "rank", "gpus", "state", "exit_code", "signal", "started", "ended", "name", "owner",
                "status", "array_id", "array_index")  # fmt: skip
        out = []
        for row in await self._db.fetchall(sql, (node, limit)):
            run = dict(zip(keys, tuple(row), strict=True))
            run["gpus"] = json.loads(run["gpus"])
            run["ref"] = run["job"] if run["array_id"] is None else f"{run['array_id']}[{run['array_index']}]"
            out.append(run)
        return out

    async def array_members(self, array_id: int) -> list[tuple[int, int, str, bool]]:
        """(id, index, status, deleted) of each task of an array, by index: what `show` lists of a task's array,
        without reading each task's whole row (an array may hold 10,000 of them)."""
        columns = ("id", "array_index", "status", "deleted")
        rows = await self._db.fetch_plain(columns, "FROM jobs WHERE array_id = ?", (array_id,))
        return sorted(((int(r[0]), int(r[1]), str(r[2]), bool(r[3])) for r in rows), key=lambda r: r[1])

    async def status_counts(self) -> dict[str, int]:
        """How many jobs (not deleted) are in each status: every job counted from the status index, less the
        deleted ones (a partial index); no job row is read (a year of history: a million index entries, 0.13 s,
        where reading the rows took 3.8 s)."""
        found = {
            str(r[0]): int(r[1]) for r in await self._db.fetchall("SELECT status, COUNT(*) FROM jobs GROUP BY status")
        }
        for status, gone in await self._db.fetchall(
            "SELECT status, COUNT(*) FROM jobs WHERE deleted = 1 GROUP BY status"
        ):
            found[str(status)] = found.get(str(status), 0) - int(gone)
        return {status: n for status, n in found.items() if n > 0}

    async def attempts_of(self, ids: Sequence[int]) -> tuple[list[Attempt], list[CheckpointSignal]]:
        """The attempts and the checkpoint signals of these jobs (goodput's inputs; the attempts with what goodput
        reads: their number, end and result)."""
        attempts: list[Attempt] = []
        signals: list[CheckpointSignal] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            inside = f"({_marks(chunk)})"
            rows = await self._db.fetchall(
                f"SELECT job, number, ended, result FROM attempts WHERE job IN {inside} ORDER BY job, number", chunk
            )
            attempts += [Attempt(job, number, None, 0, 0, 0.0, ended=ended, result=result)
                         for job, number, ended, result in rows]  # fmt: skip
            rows = await self._db.fetchall(f"SELECT * FROM checkpoint_signals WHERE job IN {inside}", chunk)
            signals += [CheckpointSignal(**dict(r)) for r in rows]
        return attempts, signals

    async def history_days(self, since: float, until: float) -> list[DaySum]:
        """The day sums of the days that start in [since, until)."""
        rows = await self._db.fetchall(
            "SELECT day, owner, project, gpu_seconds, jobs, useful, rework, downtime, saved FROM history_days "
            "WHERE day >= ? AND day < ? ORDER BY day",
            (since, until),
        )
        return [DaySum(*r) for r in rows]
