"""Upgrades of the store: a store left by each earlier schema version opens in this ftconsole with every row it
held, read back through the store's API, and a store newer than this ftconsole is refused, untouched, saying which
ftconsole reads it. On SQLite and on PostgreSQL (`store_at`, tests/unit/conftest.py).

An old store is made the way the release that had that version made it: its migrations, and no later one, run by
hand (SQLite's `PRAGMA user_version`, PostgreSQL's `ftconsole_store.schema_version` set to the version), then one
row of each kind written in only the columns that version's tables have.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.health import NodeState
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.decide.reservations import Reservation
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store import schema
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.engine import connect
from ftconsole.scheduler.store.jobtx import CheckpointSignal
from ftconsole.scheduler.store.records import StoredProbe
from ftconsole.scheduler.store.schema import MIGRATIONS, RELEASE_OF_SCHEMA, SCHEMA_VERSION, newer_store_refusal
from tests.pg_server import TIMEOUT_S, raw_sql
from tests.unit.conftest import StoreAt

SPEC = JobSpec.from_json({"name": "train", "command": "python train.py", "gpus_per_node": 2})
Written = dict[str, list[dict[str, Any]]]  # what an old store was given: rows by table, in its columns
EVIDENCE = {"verdict": "rank 1 waits in allreduce", "ranks": [{"rank": 0}, {"rank": 1}]}

# What an old store holds: (table, row), written in this order, each in the columns its version has (a table it
# does not have yet is skipped). Every kind of row the store keeps, the job's with a spec as JSON.
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("nodes", {
        "name": "gpu01", "health": "unhealthy", "reasons": json.dumps(["gpu-health: GPU 2 has 3 ECC errors"]),
        "since": 10.0, "admin": "drained", "admin_reason": "ticket 7", "admin_since": 11.0, "admin_by": "alice",
        "good_streak": 0, "boot_id": "boot-a", "last_probe": 12.0,
        "faults": 1, "isolated_passes": 2, "needs_operator": 1,
    }),
    ("probe_results", {"node": "gpu01", "time": 12.0, "error": None, "report": json.dumps({"node": "gpu01"})}),
    ("events", {
        "time": 13.0, "kind": "state-changed", "node": "gpu01", "job": None, "message": "gpu01 unhealthy",
        "data": json.dumps({"to": "unhealthy"}),
    }),
    ("events", {"time": 14.0, "kind": "Submitted", "node": None, "job": "1", "message": "job 1 submitted",
                "data": "{}"}),
    ("jobs", {
        "name": "train", "owner": "ann", "uid": 1000, "spec": json.dumps(SPEC.to_json()), "status": "running",
        "priority": "normal", "project": "default", "access": "none", "submitted": 20.0, "started": 21.0,
        "attempt": 1, "message": "", "updated": 21.5, "excluded": json.dumps(["gpu02"]),
    }),
    ("attempts", {
        "job": 1, "number": 1, "gpus_per_node": 2, "master_port": 29500, "created": 21.0, "started": 21.2,
        "token": "tok-1",
    }),
    ("runs", {
        "job": 1, "attempt": 1, "rank": 0, "node": "gpu01", "gpus": json.dumps([0, 1]), "run_dir": "/runs/1/1/0",
        "launch": 1, "state": "running", "pid": 4242, "started": 21.3, "output_at": 22.0, "boot_id": "boot-a",
        "supervisor_pid": 4241, "supervisor_start": 100, "pid_start": 101,
    }),
    ("alerts", {
        "time": 23.0, "kind": "job_hung", "severity": "error", "job": 1, "node": "gpu01", "message": "job 1 hangs",
        "state": "acknowledged", "acked_by": "bob", "acked_at": 24.0, "data": json.dumps({"window": 600}),
    }),
    ("notify_cursors", {"target": "webhook", "alert": 1, "updated": 25.0}),
    ("checkpoint_signals", {"job": 1, "attempt": 1, "rank": 0, "signal": "SIGUSR1", "asked": 26.0,
                            "deadline": 86.0}),
    ("evidence", {"job": 1, "attempt": 1, "time": 27.0, "data": json.dumps(EVIDENCE)}),
    ("quota_limits", {"kind": "user", "name": "ann", "limits": json.dumps({"gpus": 8}), "set_by": "root",
                      "set_at": 28.0}),
    ("reservations", {
        "name": "maint", "nodes": json.dumps(["gpu01"]), "start": 100.0, "end_time": 200.0, "maintenance": 1,
        "reason": "firmware", "created_by": "root", "created": 29.0,
    }),
)  # fmt: skip


async def columns(where: Path | str, table: str) -> list[str]:
    """The columns `table` has now (none: no such table)."""
    if isinstance(where, Path):
        rows = await raw_sql(where, "SELECT name FROM pragma_table_info(?)", (table,))
    else:
        sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND "
        rows = await raw_sql(where, sql + "table_name = ?", (table,))
    return [r[0] for r in rows]


async def make_store_of_version(where: Path | str, version: int) -> Written:
    """A store as the release with schema `version` left it, holding `ROWS`: the rows written, by table, each in
    the columns its table had."""
    if isinstance(where, Path):
        with sqlite3.connect(where) as db:
            for script in MIGRATIONS[:version]:
                db.executescript(script)
            db.execute(f"PRAGMA user_version = {version}")
        db.close()
    else:
        import asyncpg

        from ftconsole.scheduler.store.postgres import postgres_script

        await (await connect(where)).close()  # the engine's own table (ftconsole_store), at schema version 0
        conn = await asyncpg.connect(where, timeout=TIMEOUT_S)
        try:
            for number in range(1, version + 1):
                await conn.execute(postgres_script(number))
            await conn.execute("UPDATE ftconsole_store SET schema_version = $1", version)
        finally:
            await conn.close()
    written: Written = {}
    for table, row in ROWS:
        has = await columns(where, table)
        if not has:
            continue
        kept = {name: value for name, value in row.items() if name in has}
        names = ", ".join(f'"{name}"' for name in kept)
        await raw_sql(
            where, f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(kept))})", tuple(kept.values())
        )
        written.setdefault(table, []).append(kept)
    return written


ROWS_BY_TABLE = {table: row for table, row in ROWS if table != "events"}


def had(written: Written, table: str, column: str) -> bool:
    """Whether the old store's `table` had `column`."""
    return column in written.get(table, [{}])[0]


def kept(written: Written, table: str, column: str, default: Any = None) -> Any:
    """The value written, or what the migration that added the column fills in."""
    return ROWS_BY_TABLE[table][column] if had(written, table, column) else default


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
async def test_a_store_of_each_earlier_version_is_migrated_with_its_rows(store_at: StoreAt, version: int) -> None:
    where = store_at()
    written = await make_store_of_version(where, version)
    cluster_id = await raw_sql(where, "SELECT value FROM meta WHERE key = 'cluster_id'") if version >= 5 else None

    async with await Store.open(where) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        if cluster_id:
            assert store.cluster_id == cluster_id[0][0]  # the run folders on the nodes are still ours
        else:
            assert len(store.cluster_id) == 12  # made by the migration that brought it
        await check_nodes(store, written)
        if version >= 2:
            await check_jobs(store, written)
        else:
            assert await store.jobs() == [] and await store.alerts() == []
        await check_writes_work(store, first_job=2 if version >= 2 else 1)

    # every value written is still there, in its column
    for table, rows in written.items():
        for row in rows:
            names = ", ".join(f'"{name}"' for name in row)
            assert tuple(row.values()) in await raw_sql(where, f"SELECT {names} FROM {table}"), (table, row)


async def check_nodes(store: Store, written: Written) -> None:
    """Schema 1's rows: a node, its probe, its events."""
    node = (await store.all_node_health())["gpu01"]
    assert (node.health, node.admin, node.admin_by, node.reasons) == (
        NodeState.UNHEALTHY, NodeState.DRAINED, "alice", ("gpu-health: GPU 2 has 3 ECC errors",)
    )  # fmt: skip
    assert (node.boot_id, node.last_probe) == ("boot-a", 12.0)
    passes = kept(written, "nodes", "isolated_passes", 0)
    assert (node.isolated_passes, node.needs_operator) == (passes, had(written, "nodes", "needs_operator"))
    assert await store.node_faults() == {"gpu01": 1}  # counted from its events by the migration that added it
    probe = StoredProbe(node="gpu01", time=12.0, error=None, report={"node": "gpu01"})
    assert await store.probe_history() == [probe]
    (changed,) = await store.events(node="gpu01")
    assert (changed.kind, changed.data) == ("state-changed", {"to": "unhealthy"})
    (submitted,) = await store.events(job="1")
    assert (submitted.kind, submitted.time, submitted.message) == ("Submitted", 14.0, "job 1 submitted")


async def check_jobs(store: Store, written: Written) -> None:
    """Schema 2's rows (a job, its attempt and run, an alert), and those of the tables later versions brought:
    their row where the old store had the table, else none."""
    job = await store.job(1)
    assert job is not None
    assert (job.name, job.owner, job.uid, job.status, job.spec) == ("train", "ann", 1000, JobStatus.RUNNING, SPEC)
    assert (job.submitted, job.started, job.attempt, job.size) == (20.0, 21.0, 1, 1)
    assert job.excluded == (("gpu02",) if had(written, "jobs", "excluded") else ())
    assert (job.scaled_to, job.array_id, job.debug_released) == (None, None, None)
    token = kept(written, "attempts", "token")
    assert await store.attempts(1) == [Attempt(1, 1, None, 2, 29500, 21.0, started=21.2, token=token)]
    (run,) = await store.runs(job=1)
    assert run == Run(
        job=1, attempt=1, rank=0, node="gpu01", gpus=(0, 1), run_dir="/runs/1/1/0", launch=True, state="running",
        pid=4242, started=21.3, output_at=kept(written, "runs", "output_at"), token=token,
        boot_id=kept(written, "runs", "boot_id"), supervisor_pid=kept(written, "runs", "supervisor_pid"),
        supervisor_start=kept(written, "runs", "supervisor_start"), pid_start=kept(written, "runs", "pid_start"),
    )  # fmt: skip
    assert [r.job for r in await store.runs(held=True)] == [1]
    (alert,) = await store.alerts()
    assert (alert.job, alert.state, alert.acked_by, alert.resolved_by) == (1, "acknowledged", "bob", None)
    assert (alert.kind, alert.data) == ("job_hung", {"window": 600})
    assert (await store.job_activity())[1].open_alerts == 1
    _, changed_jobs, _ = await store.jobs_changed(20.5)  # the job feed: its stamp kept, or made from its times
    assert [j.id for j in changed_jobs] == [1]

    assert await store.notify_cursors() == ({"webhook": 1} if "notify_cursors" in written else {})
    owed = [CheckpointSignal(1, 1, 0, "SIGUSR1", 26.0, 86.0)] if "checkpoint_signals" in written else []
    assert await store.checkpoint_signals() == owed
    assert await store.evidence(1) == (EVIDENCE if "evidence" in written else None)
    limits = {("user", "ann"): ({"gpus": 8}, "root", 28.0)} if "quota_limits" in written else {}
    assert await store.quota_limits() == limits
    maint = Reservation("maint", frozenset({"gpu01"}), 100.0, 200.0, maintenance=True, reason="firmware", by="root",
                        created=29.0)  # fmt: skip
    assert await store.reservations() == ([maint] if "reservations" in written else [])


async def check_writes_work(store: Store, *, first_job: int) -> None:
    """The migrated store takes new jobs, after the ones it had."""
    new = Job(0, "next", "ann", 1000, SPEC, JobStatus.QUEUED, "normal", "default", "none", submitted=30.0)
    async with store.jobs_tx("submit") as tx:
        assert await tx.add_job(new) == first_job
    assert [j.id for j in await store.jobs()] == list(range(1, first_job + 1))


async def test_a_store_newer_than_this_ftconsole_is_refused_untouched(store_at: StoreAt) -> None:
    where = store_at()
    async with await Store.open(where) as store, store.jobs_tx("submit") as tx:
        await tx.add_job(Job(0, "kept", "ann", 1000, SPEC, JobStatus.QUEUED, "normal", "default", "none", 1.0))
    newer = SCHEMA_VERSION + 1
    if isinstance(where, Path):
        await raw_sql(where, f"PRAGMA user_version = {newer}")
        version_sql = "PRAGMA user_version"
    else:
        await raw_sql(where, "UPDATE ftconsole_store SET schema_version = ?", (newer,))
        version_sql = "SELECT schema_version FROM ftconsole_store"
    with pytest.raises(StoreError) as refused:
        await Store.open(where)
    assert str(refused.value) == (
        f"{where} was written by a newer ftconsole (store schema {newer}, this one knows up to {SCHEMA_VERSION}): "
        "install the ftconsole that wrote it, or newer; the store is not changed"
    )
    assert await raw_sql(where, version_sql) == [(newer,)]
    assert await raw_sql(where, "SELECT name FROM jobs") == [("kept",)]


def test_every_schema_version_names_the_first_release_that_has_it() -> None:
    """A new migration must say which release brings it; releases never go back as versions go up."""
    assert sorted(RELEASE_OF_SCHEMA) == list(range(1, SCHEMA_VERSION + 1))
    releases = [tuple(int(part) for part in RELEASE_OF_SCHEMA[v].split(".")) for v in sorted(RELEASE_OF_SCHEMA)]
    assert releases == sorted(releases)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {},
            "/s/state.db was written by a newer ftconsole (store schema 99, this one knows up to {known}): "
            "install the ftconsole that wrote it, or newer; the store is not changed",
        ),
        (
            {99: "0.9.0"},
            "/s/state.db was written by ftconsole 0.9.0 or newer (store schema 99, this one knows up to {known}): "
            "install ftconsole 0.9.0 or newer; the store is not changed",
        ),
    ],
)
def test_the_refusal_names_the_release_to_install_where_known(
    monkeypatch: pytest.MonkeyPatch, table: dict[int, str], message: str
) -> None:
    monkeypatch.setattr(schema, "RELEASE_OF_SCHEMA", {**RELEASE_OF_SCHEMA, **table})
    assert newer_store_refusal("/s/state.db", 99) == message.format(known=SCHEMA_VERSION)


# sha256 (first 16 hex digits) of each migration script as it was first written: a store of every version on record
# was made by these very scripts, so one edited afterwards makes new stores differ from upgraded ones. A new script
# adds its line here; none changes.
WRITTEN = {
    1: "6bd6148e29f444a6", 2: "ec54e9d3c0302d2c", 3: "34620b278aa96abc", 4: "7e66934bd520d2ed",
    5: "b2187514fca103d3", 6: "fdf575a905989501", 7: "29487f58db8385ce", 8: "2c3ca9bf886f96b7",
    9: "9e046e37265e6010", 10: "e3491ec43b8037b0", 11: "8c786e2063f1c348", 12: "c606263c872cdc5b",
    13: "9a3e963b38dbfa1a", 14: "60a88ce27d89eb65", 15: "6f6079a600407ad5", 16: "1afc43ed5f3aec9a",
    17: "25aee7acd14f90af", 18: "4ff117e28a124da5", 19: "2b2bd7b92dd41be0", 20: "f59b023e775c9d27",
}  # fmt: skip


def test_no_migration_script_changes_once_written() -> None:
    import hashlib

    found = {i + 1: hashlib.sha256(text.encode()).hexdigest()[:16] for i, text in enumerate(MIGRATIONS)}
    assert {v: found[v] for v in WRITTEN} == WRITTEN, "a migration script was edited: add a new one instead"
    assert set(found) == set(WRITTEN), "a new migration script: add its line to WRITTEN"
