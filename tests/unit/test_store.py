"""The state store: schema versioning, node state written with its events, probe history pruning. The tests that
take `store_at` run on SQLite and on PostgreSQL (tests/unit/conftest.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState
from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store import db as store_mod
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import StoredProbe
from ftconsole.scheduler.store.schema import SCHEMA_VERSION
from tests.pg_server import raw_sql
from tests.unit.conftest import StoreAt


async def test_fresh_store_is_migrated_and_reopens(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        assert await store.schema_version() == SCHEMA_VERSION
    async with await Store.open(store_at()) as store:
        assert await store.schema_version() == SCHEMA_VERSION


async def test_a_sqlite_store_is_made_in_its_folder_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "s" / "state.db"
    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_newer_schema_is_refused(store_at: StoreAt) -> None:
    where = store_at()
    if isinstance(where, Path):
        await raw_sql(where, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    else:
        async with await Store.open(where):  # made, then marked newer
            pass
        await raw_sql(where, "UPDATE ftconsole_store SET schema_version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="written by a newer ftconsole"):
        await Store.open(where)


async def test_node_round_trip_with_events(store_at: StoreAt) -> None:
    h = NodeHealth(
        "gpu01",
        health=NodeState.UNHEALTHY,
        reasons=("gpu-health: GPU 2 has 3 uncorrectable ECC errors",),
        since=10.0,
        admin=NodeState.DRAINED,
        admin_reason="ticket 7",
        admin_since=11.0,
        admin_by="alice",
        pending=NodeState.HEALTHY,
        good_streak=1,
        boot_id="b",
        last_probe=12.0,
    )
    events = [NodeEvent(10.0, "gpu01", "state-changed", "healthy -> unhealthy", {"to": "unhealthy"})]
    async with await Store.open(store_at()) as store:
        await store.save_nodes([(h, events)], [StoredProbe("gpu01", 12.0, None, {"checks": []})])
        assert await store.node_health("gpu01") == h
        assert await store.node_health("nope") is None
        (ev,) = await store.events(node="gpu01")
        assert (ev.kind, ev.message, ev.data) == ("state-changed", "healthy -> unhealthy", {"to": "unhealthy"})
        assert (await store.latest_probes())["gpu01"].report == {"checks": []}


async def test_failed_write_leaves_nothing_half_done(store_at: StoreAt) -> None:
    bad = NodeEvent(1.0, "n", "state-changed", "x", {"unserialisable": object()})
    async with await Store.open(store_at()) as store:
        with pytest.raises(TypeError):
            await store.save_nodes([(NodeHealth("n", health=NodeState.HEALTHY), [bad])])
        # neither the node nor any event was written, and the store still works
        assert await store.node_health("n") is None
        assert await store.events() == []
        await store.save_nodes([(NodeHealth("n"), [])])
        assert await store.node_health("n") is not None


async def test_probe_history_is_bounded_per_node(store_at: StoreAt, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "PROBE_HISTORY_PER_NODE", 3)
    async with await Store.open(store_at()) as store:
        for t in range(6):
            await store.save_nodes([], [StoredProbe("a", float(t), "down", None), StoredProbe("b", float(t), None, {})])
        latest = await store.latest_probes()
        assert latest["a"].time == 5.0 and latest["a"].error == "down" and latest["b"].report == {}
    assert await raw_sql(store_at(), "SELECT COUNT(*) FROM probe_results WHERE node = 'a'") == [(3,)]


async def test_a_version_2_store_is_migrated_with_its_history(tmp_path: Path) -> None:
    """A store written by an earlier release: migrations 3 and 4 keep every row and fill the new columns."""
    path = tmp_path / "state.db"
    spec = json.dumps(JobSpec.from_json({"name": "old", "command": "true"}).to_json())
    with sqlite3.connect(path) as db:
        for script in store_mod.MIGRATIONS[:2]:
            db.executescript(script)
        db.execute("PRAGMA user_version = 2")
        db.execute(
            "INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted, started, ended) "
            "VALUES ('old', 'ann', 1000, ?, 'error', 'normal', 'default', 'none', 10.0, 20.0, 30.0)",
            (spec,),
        )
        db.execute("INSERT INTO nodes (name, health, reasons) VALUES ('gpu01', 'healthy', '[]')")
        for to in ("unreachable", "healthy", "unhealthy"):
            db.execute(
                "INSERT INTO events (time, kind, node, message, data) VALUES (1.0, 'state-changed', 'gpu01', '', ?)",
                (json.dumps({"to": to}),),
            )
        db.execute("INSERT INTO events (time, kind, node, message) VALUES (2.0, 'isolated', 'gpu01', 'x')")
        db.execute(
            "INSERT INTO alerts (time, kind, severity, job, message, state, acked_by, acked_at) "
            "VALUES (5.0, 'job_failed', 'error', 1, 'failed', 'acknowledged', 'bob', 6.0)"
        )
    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION == 20
        assert len(store.cluster_id) == 12  # made by the migration: run folders are keyed by it
        (job,) = await store.jobs()
        assert (job.name, job.status.value) == ("old", "error")
        assert (job.scaled_to, job.size) == (None, 1)  # never scaled: the spec's size
        assert await store.node_faults() == {"gpu01": 3}
        (alert,) = await store.alerts()
        assert (alert.state, alert.acked_by, alert.acked_at, alert.resolved_by) == ("acknowledged", "bob", 6.0, None)
        assert (await store.job_activity())[job.id].open_alerts == 1
        cursor, jobs, _ = await store.jobs_changed(29.0)  # updated was filled from the job's own times
        assert [j.id for j in jobs] == [job.id] and cursor > 30.0
        assert (await store.jobs_changed(30.5))[1] == []
        assert await store.quota_limits() == {}  # migration 11: none set yet
        async with store.jobs_tx("set a quota") as tx:
            await tx.quota("project", "vision", {"gpus": 8}, "root", 40.0)
        assert await store.quota_limits() == {("project", "vision"): ({"gpus": 8}, "root", 40.0)}
        async with store.jobs_tx("set it again") as tx:
            await tx.quota("project", "vision", {"gpus": 4, "gpu_hours": None}, "ann", 41.0)
        assert await store.quota_limits() == {("project", "vision"): ({"gpus": 4, "gpu_hours": None}, "ann", 41.0)}
        async with store.jobs_tx("clear it") as tx:
            await tx.quota("project", "vision", None, "ann", 42.0)
        assert await store.quota_limits() == {}
    with sqlite3.connect(path) as db:
        indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"jobs_updated", "alerts_job", "alerts_node"} <= indexes
        assert "output_at" in {row[1] for row in db.execute("PRAGMA table_info(runs)")}


async def test_every_store_has_its_own_cluster_id_kept_across_opens(store_at: StoreAt) -> None:
    async with await Store.open(store_at("a")) as a, await Store.open(store_at("b")) as b:
        first = a.cluster_id
        assert len(first) == 12 and b.cluster_id and first != b.cluster_id
    async with await Store.open(store_at("a")) as again:
        assert again.cluster_id == first


async def test_notify_cursors_move_forward_only(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        assert await store.notify_cursors() == {} and await store.newest_alert_id() == 0
        await store.set_notify_cursor("webhook", 5, now=1.0)
        await store.set_notify_cursor("webhook", 3, now=2.0)  # a late writer never moves it back
        await store.set_notify_cursor("command", 0, now=2.0)
        assert await store.notify_cursors() == {"webhook": 5, "command": 0}
    async with await Store.open(store_at()) as store:  # kept across restarts
        assert await store.notify_cursors() == {"webhook": 5, "command": 0}


async def test_alerts_after_an_id_oldest_first_in_any_state(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("alerts") as tx:
            for i in range(5):
                await tx.alert(float(i), "node_unreachable", "error", f"n{i} is unreachable", node=f"n{i}")
        await store.resolve_alerts([2], by="ann", now=9.0)
        assert [a.id for a in await store.alerts_after(1)] == [2, 3, 4, 5]
        assert [a.id for a in await store.alerts_after(1, limit=2)] == [2, 3]
        assert await store.alerts_after(5) == [] and await store.newest_alert_id() == 5


async def test_a_checkpoint_signal_owed_is_kept_until_tried_through_or_closed(store_at: StoreAt) -> None:
    runs = [Run(7, 1, rank, f"n{rank}", (0,), f"/r/7/1/{rank}", True, "running") for rank in range(3)]
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("decide") as tx:
            await tx.owe_checkpoint(runs, "SIGUSR1", now=10.0, deadline=70.0)
            await tx.owe_checkpoint(runs[:1], "SIGUSR2", now=11.0, deadline=71.0)  # owed once: the first stands
        owed = await store.checkpoint_signals()
        assert [(o.key, o.signal, o.asked, o.deadline, o.tries, o.outcome) for o in owed] == [
            ((7, 1, r), "SIGUSR1", 10.0, 70.0, 0, None) for r in range(3)
        ]
        async with store.jobs_tx("tries") as tx:
            await tx.checkpoint_tried(owed[0], now=12.0, signalled=False, error="no answer")
            await tx.checkpoint_tried(owed[1], now=12.0, signalled=True)
            await tx.close_checkpoint(owed[2], "late", now=80.0)
        (left,) = await store.checkpoint_signals()
        assert (left.key, left.tries, left.error, left.outcome) == ((7, 1, 0), 1, "no answer", None)
        done = {o.rank: (o.outcome, o.done, o.tries) for o in await store.checkpoint_signals(owed=False, job=7)}
        assert done == {0: (None, None, 1), 1: ("signalled", 12.0, 1), 2: ("late", 80.0, 0)}
    async with await Store.open(store_at()) as store:  # a scheduler after a crash finds it owed
        assert [o.key for o in await store.checkpoint_signals()] == [(7, 1, 0)]


async def test_evidence_keeps_the_newest_documents_of_each_job(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        assert await store.evidence(7) is None
        for n in range(5):
            async with store.jobs_tx("keep evidence") as tx:
                await tx.evidence(7, 1, float(n), {"n": n}, keep=3)
                await tx.evidence(8, 1, float(n), {"n": 10 + n}, keep=3)
        assert (await store.evidence(7), await store.evidence(8)) == ({"n": 4}, {"n": 14})
        kept = await raw_sql(store_at(), "SELECT job, data FROM evidence ORDER BY id")
        got = [(job, json.loads(data)["n"]) for job, data in kept]
        assert got == [(7, 2), (8, 12), (7, 3), (8, 13), (7, 4), (8, 14)]


async def test_plain_rows_come_back_whole_in_one_piece_on_both_engines(store_at: StoreAt) -> None:
    """`fetch_plain` (SQLite: one JSON text made in the database, not a step per row): numbers, text with quotes,
    backslashes and non-ASCII, NULL; no row at all; the same on PostgreSQL (rows as they are)."""
    async with await Store.open(store_at()) as store:
        db = store._db
        texts = ["plain", 'it\'s "quoted" \\ and\nnew', "ünïcødé ✓", ""]
        await db.execute("CREATE TABLE plain_t (n INTEGER, x REAL, t TEXT)")
        for i, text in enumerate(texts):
            await db.execute("INSERT INTO plain_t (n, x, t) VALUES (?, ?, ?)", (i, i + 0.5, text))
        await db.execute("INSERT INTO plain_t (n, x, t) VALUES (?, NULL, NULL)", (99,))
        rows = await db.fetch_plain(("n", "x", "t"), "FROM plain_t WHERE n >= ?", (0,))
        assert sorted(rows, key=lambda r: r[0]) == [[i, i + 0.5, t] for i, t in enumerate(texts)] + [[99, None, None]]
        assert await db.fetch_plain(("n", "t"), "FROM plain_t WHERE n < ?", (0,)) == []


async def test_an_arrays_members_are_listed_by_index(store_at: StoreAt) -> None:
    from ftconsole.scheduler.decide.jobs import JobStatus
    from tests.unit.test_jobs import make_job

    async with await Store.open(store_at()) as store:
        ids: list[int] = []
        async with store.jobs_tx("submit") as tx:
            for index in [5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10]:  # written out of order
                queued = make_job(status=JobStatus.QUEUED, started=None, attempt=0, array_index=index)
                ids.append(await tx.add_job(queued if not ids else make_job(
                    status=JobStatus.QUEUED, started=None, attempt=0, array_id=ids[0], array_index=index)))  # fmt: skip
            await tx._db.execute("UPDATE jobs SET array_id = ? WHERE id = ?", (ids[0], ids[0]))
        by_index = dict(zip([5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10], ids, strict=True))
        members = await store.array_members(ids[0])
    assert [m[:2] for m in members] == [(by_index[i], i) for i in range(12)]
    assert {(m[2], m[3]) for m in members} == {("queued", False)}
