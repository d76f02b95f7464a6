"""The state store: schema versioning, node state written with its events, probe history pruning."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from probes.health import NodeEvent, NodeHealth, NodeState
from scheduler import store as store_mod
from scheduler.errors import StoreError
from scheduler.store import SCHEMA_VERSION, Store, StoredProbe


async def test_fresh_store_is_migrated_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "s" / "state.db"
    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION
    async with await Store.open(path) as store:
        assert await store.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this ftconsole"):
        await Store.open(path)


async def test_node_round_trip_with_events(tmp_path: Path) -> None:
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
    async with await Store.open(tmp_path / "state.db") as store:
        await store.save_nodes([(h, events)], [StoredProbe("gpu01", 12.0, None, {"checks": []})])
        assert await store.node_health("gpu01") == h
        assert await store.node_health("nope") is None
        (ev,) = await store.events(node="gpu01")
        assert (ev.kind, ev.message, ev.data) == ("state-changed", "healthy -> unhealthy", {"to": "unhealthy"})
        assert (await store.latest_probes())["gpu01"].report == {"checks": []}


async def test_failed_write_leaves_nothing_half_done(tmp_path: Path) -> None:
    bad = NodeEvent(1.0, "n", "state-changed", "x", {"unserialisable": object()})
    async with await Store.open(tmp_path / "state.db") as store:
        with pytest.raises(TypeError):
            await store.save_nodes([(NodeHealth("n", health=NodeState.HEALTHY), [bad])])
        # neither the node nor any event was written, and the store still works
        assert await store.node_health("n") is None
        assert await store.events() == []
        await store.save_nodes([(NodeHealth("n"), [])])
        assert await store.node_health("n") is not None


async def test_probe_history_is_bounded_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "PROBE_HISTORY_PER_NODE", 3)
    async with await Store.open(tmp_path / "state.db") as store:
        for t in range(6):
            await store.save_nodes([], [StoredProbe("a", float(t), "down", None), StoredProbe("b", float(t), None, {})])
        latest = await store.latest_probes()
        assert latest["a"].time == 5.0 and latest["a"].error == "down" and latest["b"].report == {}
    with sqlite3.connect(tmp_path / "state.db") as db:
        assert db.execute("SELECT COUNT(*) FROM probe_results WHERE node = 'a'").fetchone()[0] == 3
