"""Fixtures of the store's tests on both engines: `store_at` says where a test's stores live, a SQLite file in
tmp_path or a fresh database on the session's PostgreSQL server (`tests/pg_server.py`), and the tests that
take it run once on each. The PostgreSQL ones skip, with the reason, where PostgreSQL is not installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.pg_server import PgServer, pg_server_fixture  # noqa: F401  (provides the session's `pg_server` fixture)

StoreAt = Callable[..., Path | str]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> StoreAt:
    """`store_at(name="state")`: where the test's store `name` lives (the same name: the same store)."""
    if request.param == "sqlite":
        return lambda name="state": tmp_path / f"{name}.db"
    server: PgServer = request.getfixturevalue("pg_server")
    made: dict[str, str] = {}

    def at(name: str = "state") -> str:
        if name not in made:
            made[name] = server.database()
        return made[name]

    return at
