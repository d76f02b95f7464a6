"""The writes of one jobs transaction (`JobTx`, handed out by `Store.jobs_tx`) and the column allow-lists of its
updates; with them, the alert writes that it and `Store.save_nodes` share: raise an alert, acknowledge or resolve
one (with its event), resolve a node's alerts of a kind automatically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.reservations import Reservation
from ftconsole.scheduler.decide.stepplan import JobStep
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.store.engine import Engine
from ftconsole.scheduler.store.records import AutoResolve, NewAlert, StoredAlert, _alert_from_row

AUTO = "ftconsole"  # who resolves the alerts that resolve themselves


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
        "debug_released",
        "excluded",
        "array_id",
        "held_by",
        "held_at",
        "held_admin",
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
        "fault",
    }
)


@dataclass(frozen=True)
class CheckpointSignal:
    """The checkpoint signal owed to one rank (schema 9): written in the transaction of the decision that owes it,
    sent by the executor until the rank's node says it got it (`signalled`), the run ends first (`ended`), or
    `deadline` passes (`late`: its grace period is over and the stop goes out). A scheduler that starts after a
    crash sends the ones still owed: at least once (a crash after the node took it, before the outcome was
    written, sends it again)."""

    job: int
    attempt: int
    rank: int
    signal: str
    asked: float
    deadline: float
    tries: int = 0
    outcome: str | None = None  # signalled | ended | late; None: still owed
    done: float | None = None
    error: str | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job, self.attempt, self.rank)


_INSERT_JOB = (
    "INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted, cloned_from, array_id, "
    "array_index, held_by, held_at, held_admin, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class JobTx:
    """The writes of one jobs transaction (see `Store.jobs_tx`). Each write that concerns a job (its row, its
    attempts, runs and alerts) sets the job's `updated` to `stamp`, so the job feed (`jobs_changed`) sees it."""

    def __init__(self, db: Engine, stamp: float) -> None:
        self._db = db
        self.stamp = stamp
        self._touched: set[int] = set()

    async def _touch(self, job_id: int) -> None:
        if job_id not in self._touched:
            await self._db.execute("UPDATE jobs SET updated = ? WHERE id = ?", (self.stamp, job_id))
            self._touched.add(job_id)

    async def add_job(self, job: Job) -> int:
        job_id = await self._db.insert(_INSERT_JOB, self._job_row(job, json.dumps(job.spec.to_json())))
        self._touched.add(job_id)
        return job_id

    async def add_tasks(self, job: Job, indexes: Sequence[int]) -> dict[int, int]:
        """An array's tasks (`job` with each index), in one statement but the first: its id names the array, in
        each task's `array_id`. Their ids by index: a task each (10,000 tasks took 4 s, a statement each, every
        other request on the store waiting for the transaction)."""
        spec = json.dumps(job.spec.to_json())
        first = await self._db.insert(_INSERT_JOB, self._job_row(replace(job, array_index=indexes[0]), spec))
        await self._db.execute("UPDATE jobs SET array_id = ? WHERE id = ?", (first, first))
        rest = [self._job_row(replace(job, array_id=first, array_index=index), spec) for index in indexes[1:]]
        if rest:
            await self._db.executemany(_INSERT_JOB, rest)
        rows = await self._db.fetchall("SELECT array_index, id FROM jobs WHERE array_id = ?", (first,))
        ids = {int(index): int(job_id) for index, job_id in rows}
        self._touched.update(ids.values())
        return ids

    def _job_row(self, job: Job, spec: str) -> tuple[Any, ...]:
        return (job.name, job.owner, job.uid, spec, job.status.value, job.priority, job.project, job.access,
                job.submitted, job.cloned_from, job.array_id, job.array_index, job.held_by, job.held_at,
                int(job.held_admin), self.stamp)  # fmt: skip

    async def update_job(
        self, job_id: int, *, expect: Iterable[JobStatus] | None = None, unstopped: bool = False, **fields: Any
    ) -> None:
        """Set columns of a job; with `expect`, only while its status is one of those, with `unstopped` only while
        no stop is asked for it (else `Conflict`)."""
        sql, args = _set_clause("jobs", _JOB_COLUMNS, fields)
        sql += ", updated = ? WHERE id = ?"
        args.extend([self.stamp, job_id])
        if expect is not None:
            wanted = [s.value for s in expect]
            sql += f" AND status IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        if unstopped:
            sql += " AND stop_reason IS NULL"
        if await self._db.execute(sql, args) != 1:
            raise Conflict(f"job {job_id} changed meanwhile (expected status {', '.join(map(str, expect or ()))})")
        self._touched.add(job_id)

    async def update_jobs(self, job_ids: Sequence[int], *, expect: Iterable[JobStatus], **fields: Any) -> None:
        """`update_job` of many jobs with the same columns, in one statement (a stop of a thousand queued jobs):
        all of them while each one's status is one of `expect`, else none (`Conflict`)."""
        if not job_ids:
            return
        sql, args = _set_clause("jobs", _JOB_COLUMNS, fields)
        wanted = [s.value for s in expect]
        sql += (
            f", updated = ? WHERE id IN ({','.join('?' * len(job_ids))}) AND status IN ({','.join('?' * len(wanted))})"
        )
        if await self._db.execute(sql, [*args, self.stamp, *job_ids, *wanted]) != len(set(job_ids)):
            raise Conflict(f"one of {len(job_ids)} jobs changed meanwhile (expected status {', '.join(wanted)})")
        self._touched.update(job_ids)

    async def note(self, notes: Iterable[tuple[int, str]], *, status: JobStatus) -> None:
        """Set the message of each job (id, text) that still has `status` (the others are left as they are), in
        one statement: the wait reasons of a placement pass, one per queued job."""
        rows = [(text, self.stamp, job_id, status.value) for job_id, text in notes]
        if rows:
            await self._db.executemany("UPDATE jobs SET message = ?, updated = ? WHERE id = ? AND status = ?", rows)

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
        """Write these columns of a run. Its `started` and `ended` are written once (a later value is ignored):
        the usage ledger folds a run in once it has ended (store/ledger.py), and one that ended before it started
        (an intent cancelled) is folded again once it starts."""
        sql, args = _set_clause("runs", _RUN_COLUMNS, fields)
        for column in ("started", "ended"):
            sql = sql.replace(f" {column} = ?", f" {column} = COALESCE({column}, ?)")
        if "started" in fields:
            sql += ", folded = CASE WHEN started IS NULL THEN 0 ELSE folded END"
        await self._db.execute(
            sql + " WHERE job = ? AND attempt = ? AND rank = ?", (*args, run.job, run.attempt, run.rank)
        )
        await self._touch(run.job)

    async def steps_of(self, job_id: int) -> list[JobStep]:
        """The steps of a job, read in this transaction (what a new step's GPUs are chosen against)."""
        rows = await self._db.fetchall("SELECT * FROM steps WHERE job = ? ORDER BY number", (job_id,))
        return [JobStep.from_row(r) for r in rows]

    async def add_step(self, step: JobStep) -> None:
        await self._db.execute(
            "INSERT INTO steps (job, number, attempt, argv, mode, ranks, run_by, started, state, overlap) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (step.job, step.number, step.attempt, json.dumps(list(step.argv)), step.mode,
             json.dumps([{"node": n, "gpus": list(g)} for n, g in step.ranks]), step.run_by, step.started,
             step.state, int(step.overlap)),
        )  # fmt: skip
        await self._touch(step.job)

    async def end_step(self, job_id: int, number: int, state: str, ended: float, *, exit_code: int | None = None,
                       message: str = "") -> bool:  # fmt: skip
        """End a running step (once: a step ended already stays as it ended); whether this ended it."""
        changed = await self._db.execute(
            "UPDATE steps SET state = ?, ended = ?, exit_code = ?, message = ? WHERE job = ? AND number = ? AND "
            "state = 'running'",
            (state, ended, exit_code, message, job_id, number),
        )
        if changed:
            await self._touch(job_id)
        return bool(changed)

    async def release_runs(self, job_id: int, *, attempt: int | None = None) -> None:
        """Free the GPUs of a job's runs: every attempt's, or one attempt's (an elastic job's resized one)."""
        if attempt is None:
            await self._db.execute("UPDATE runs SET released = 1 WHERE job = ?", (job_id,))
        else:
            await self._db.execute("UPDATE runs SET released = 1 WHERE job = ? AND attempt = ?", (job_id, attempt))
        await self._touch(job_id)

    async def requeue(
        self, job_id: int, attempt: int, runs: Iterable[Run], now: float, *, result: str, cause: str, message: str
    ) -> None:
        """A running job queued again at the front of its priority: the runs of `attempt` never sent
        (`intent`) cancelled, its GPUs released, the attempt ended with `result` and `cause`, any stop
        request of the scheduler's own cleared. Raises Conflict when the job is no longer running, or when a
        user's stop (or max_runtime) asks it to end: that wins."""
        row = await self._db.fetchone("SELECT stop_reason FROM jobs WHERE id = ?", (job_id,))
        if row is not None and row[0] in (StopReason.STOPPED, StopReason.EXPIRED, StopReason.IDLE):
            raise Conflict(f"job {job_id} is being stopped ({row[0]}): not queued again")
        for r in runs:
            if r.attempt == attempt and r.state == "intent":
                await self.update_run(r, state="cancelled", ended=now, error=cause)
        await self.release_runs(job_id, attempt=attempt)
        await self.update_attempt(job_id, attempt, ended=now, result=result, message=cause)
        await self.update_job(
            job_id,
            expect=[JobStatus.RUNNING],
            status=JobStatus.QUEUED,
            requeued=True,
            stop_requested=None,
            stop_reason=None,
            stop_by=None,
            message=message,
        )

    async def owe_checkpoint(self, runs: Iterable[Run], signal: str, *, now: float, deadline: float) -> None:
        """The checkpoint `signal` is owed to each of `runs` until `deadline` (a rank owed one already keeps it)."""
        for r in runs:
            await self._db.execute(
                "INSERT INTO checkpoint_signals (job, attempt, rank, signal, asked, deadline) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job, attempt, rank) DO NOTHING",
                (r.job, r.attempt, r.rank, signal, now, deadline),
            )

    async def checkpoint_tried(
        self, owed: CheckpointSignal, *, now: float, signalled: bool, error: str | None = None
    ) -> None:
        """One try of an owed checkpoint signal: the node said the rank got it, or why not (owed still)."""
        await self._db.execute(
            "UPDATE checkpoint_signals SET tries = tries + 1, error = ?, outcome = ?, done = ? "
            "WHERE job = ? AND attempt = ? AND rank = ? AND outcome IS NULL",
            (error, "signalled" if signalled else None, now if signalled else None, *owed.key),
        )

    async def close_checkpoint(self, owed: CheckpointSignal, outcome: str, *, now: float) -> None:
        """No longer owed: the run ended (`ended`), or its grace period is over (`late`)."""
        await self._db.execute(
            "UPDATE checkpoint_signals SET outcome = ?, done = ? WHERE job = ? AND attempt = ? AND rank = ? "
            "AND outcome IS NULL",
            (outcome, now, *owed.key),
        )

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

    async def events(self, rows: Iterable[tuple[float, str, str, int | None]]) -> None:
        """Many events of jobs, (time, kind, message, job), in one statement."""
        await self._db.executemany(
            "INSERT INTO events (time, kind, node, job, message, data) VALUES (?, ?, NULL, ?, ?, '{}')",
            [(time, kind, None if job is None else str(job), message) for time, kind, message, job in rows],
        )

    async def quota(self, kind: str, name: str, limits: dict[str, Any] | None, by: str, time: float) -> None:
        """Set a project's or user's quota limits over the config's; None: back to the config's."""
        if limits is None:
            await self._db.execute("DELETE FROM quota_limits WHERE kind = ? AND name = ?", (kind, name))
            return
        await self._db.execute(
            "INSERT INTO quota_limits (kind, name, limits, set_by, set_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (kind, name) DO UPDATE SET limits = excluded.limits, set_by = excluded.set_by, "
            "set_at = excluded.set_at",
            (kind, name, json.dumps(limits), by, time),
        )

    async def reserve(self, r: Reservation | None, *, name: str = "") -> None:
        """Keep a reservation (a new one: its name is not taken, `overlapping` was checked); None: remove `name`."""
        if r is None:
            await self._db.execute("DELETE FROM reservations WHERE name = ?", (name,))
            return
        await self._db.execute(
            'INSERT INTO reservations (name, nodes, start, end_time, "user", project, maintenance, reason, '
            "created_by, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.name, json.dumps(sorted(r.nodes)), r.start, r.end, r.user, r.project, int(r.maintenance), r.reason,
             r.by, r.created),
        )  # fmt: skip

    async def evidence(self, job: int, attempt: int, time: float, doc: dict[str, Any], *, keep: int) -> int:
        """Keep a job's evidence document (the newest `keep` of each job stay); its id."""
        evidence_id = await self._db.insert(
            "INSERT INTO evidence (job, attempt, time, data) VALUES (?, ?, ?, ?)", (job, attempt, time, json.dumps(doc))
        )
        await self._db.execute(
            "DELETE FROM evidence WHERE job = ? AND id NOT IN (SELECT id FROM evidence WHERE job = ? ORDER BY id DESC "
            "LIMIT ?)",
            (job, job, keep),
        )
        return evidence_id

    async def alert(
        self,
        time: float,
        kind: str,
        severity: str,
        message: str,
        *,
        job: int | None = None,
        node: str | None = None,
        once: bool = False,
    ) -> None:
        """Raise an alert; with `once`, unless one of its kind is open or acknowledged for the same job and node."""
        await _insert_alert(self._db, NewAlert(time, kind, severity, message, job=job, node=node), once=once)
        if job is not None:
            await self._touch(job)

    async def resolve_job_alerts(self, job: int, kind: str, *, now: float, why: str) -> None:
        """Resolve, as ftconsole, the job's open and acknowledged alerts of `kind`, each with its event."""
        sql = "SELECT id FROM alerts WHERE job = ? AND kind = ? AND state IN ('open', 'acknowledged') ORDER BY id"
        ids = [row[0] for row in await self._db.fetchall(sql, (job, kind))]
        for alert_id in ids:
            await _set_alert_state(self._db, alert_id, "resolved", by=AUTO, now=now, why=why)
        if ids:
            await self._touch(job)

    async def set_alert_state(self, alert_id: int, state: str, *, by: str, now: float) -> bool:
        """Acknowledge (an open alert) or resolve (an open or acknowledged one), with an event; False when it
        was already so (nothing written)."""
        changed = await _set_alert_state(self._db, alert_id, state, by=by, now=now)
        if changed is not None and changed.job is not None:
            await self._touch(changed.job)
        return changed is not None


async def _insert_alert(db: Engine, alert: NewAlert, *, once: bool) -> None:
    """Insert an alert; with `once`, only when none of its kind is open or acknowledged for its node or job."""
    if once:  # the transaction holds the write lock: nobody raises one between this read and the insert
        sql = "SELECT 1 FROM alerts WHERE kind = ? AND state IN ('open', 'acknowledged')"
        args: list[Any] = [alert.kind]
        for column, value in (("node", alert.node), ("job", alert.job)):
            sql += f" AND {column} IS NULL" if value is None else f" AND {column} = ?"
            args += [] if value is None else [value]
        if await db.fetchone(sql + " LIMIT 1", args) is not None:
            return
    await db.execute(
        "INSERT INTO alerts (time, kind, severity, job, node, message) VALUES (?, ?, ?, ?, ?, ?)",
        (alert.time, alert.kind, alert.severity, alert.job, alert.node, alert.message),
    )


_ALERT_EVENT = {"acknowledged": "alert-acknowledged", "resolved": "alert-resolved"}


async def _set_alert_state(
    db: Engine, alert_id: int, state: str, *, by: str, now: float, why: str = ""
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
    row = await db.fetchone("SELECT * FROM alerts WHERE id = ?", (alert_id,))
    if row is None:
        return None
    if await db.execute(sql, (state, by, now, alert_id)) != 1:
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


async def _auto_resolve(db: Engine, r: AutoResolve) -> None:
    sql = "SELECT id FROM alerts WHERE node = ? AND kind = ? AND state IN ('open', 'acknowledged') ORDER BY id"
    ids = [row[0] for row in await db.fetchall(sql, (r.node, r.kind))]
    for alert_id in ids:
        await _set_alert_state(db, alert_id, "resolved", by=AUTO, now=r.time, why=r.why)


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
    if isinstance(value, tuple | list):
        return json.dumps(list(value))  # a JSON list column (jobs.excluded)
    return value
