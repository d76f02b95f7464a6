"""Moving a store from SQLite to PostgreSQL (`ftconsole state copy`): every row of every table, ids and cluster id
kept, in one transaction on the target.

The source is opened as the scheduler opens it (migrated to this ftconsole's schema first, as a start of the
scheduler would), the target too (its schema made). The target must hold no store yet, or an empty one: a copy
never merges two stores. The rows go table by table, each table after those its foreign keys name, in batches
of one statement each, every value turned into its column's type on PostgreSQL (SQLite keeps whatever it is
given: an id written as text, a time as an integer); then each identity column's sequence is set past the
highest id, so the next job gets the id after the last one copied. The cluster id is copied with the `meta`
table: the run folders on the nodes are keyed by it, so the scheduler on the new store re-adopts the runs still
running and fences nothing of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.store.db import Store

MAX_PARAMETERS = 30_000  # per statement (PostgreSQL's limit is 32,767)
SKIPPED = ("ftconsole_store",)  # the target's own bookkeeping (postgres.py): not a table of the store's


@dataclass(frozen=True)
class Copied:
    source: str
    target: str
    cluster_id: str
    rows: dict[str, int]  # table -> rows copied, in the order copied


async def copy_store(source: Path, target: str) -> Copied:
    """Copy the SQLite store at `source` into the PostgreSQL database at `target` (a URL); StoreError says what
    is wrong: no source, a target that holds a store with jobs or nodes already, a row PostgreSQL refuses."""
    if not source.exists():
        raise StoreError(f"no store at {source}: nothing to copy")
    async with await Store.open(source) as src, await Store.open(target) as dst:
        tables = await _tables(src)
        busy = {t: n for t in tables if t != "meta" and (n := await _count(dst, t))}
        if busy:
            held = ", ".join(f"{n} in {t}" for t, n in busy.items())
            raise StoreError(f"{dst._db.where} holds a store already ({held}): copy only into an empty database")
        types = await _column_types(dst)
        rows: dict[str, int] = {}
        async with dst._transaction(f"copy the store of {source}"):  # all of it, or nothing
            await dst._db.execute("DELETE FROM meta")  # the target's own cluster id, made with its schema
            for table in tables:
                rows[table] = await _copy_table(src, dst, table, types.get(table, {}))
            for table, column in await _identities(dst):
                await dst._db.fetchall(
                    f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                    f"(SELECT COALESCE(MAX({column}), 0) + 1 FROM {table}), false)"
                )
        return Copied(str(source), dst._db.where, src.cluster_id, rows)


async def _tables(store: Store) -> list[str]:
    """The source's tables, each after the tables its foreign keys name."""
    names = [r[0] for r in await store._db.fetchall(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]  # fmt: skip
    needs = {t: {r["table"] for r in await store._db.fetchall(f"PRAGMA foreign_key_list({t})")} - {t} for t in names}
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [t for t in names if t not in ordered and needs[t] <= set(ordered)]
        if not ready:
            raise StoreError(f"the tables' foreign keys form a cycle: {sorted(set(names) - set(ordered))}")
        ordered.extend(ready)
    return [t for t in ordered if t not in SKIPPED]


async def _count(store: Store, table: str) -> int:
    row = await store._db.fetchone(f"SELECT COUNT(*) FROM {table}")
    return int(row[0]) if row else 0


async def _column_types(store: Store) -> dict[str, dict[str, str]]:
    rows = await store._db.fetchall(
        "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = "
        "current_schema()"
    )
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        out.setdefault(r[0], {})[r[1]] = r[2]
    return out


async def _identities(store: Store) -> list[tuple[str, str]]:
    rows = await store._db.fetchall(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND is_identity = 'YES' ORDER BY table_name"
    )
    return [(r[0], r[1]) for r in rows]


async def _copy_table(src: Store, dst: Store, table: str, types: dict[str, str]) -> int:
    rows = await src._db.fetchall(f"SELECT * FROM {table}")
    if not rows:
        return 0
    columns = list(rows[0].keys())
    missing = [c for c in columns if c not in types]
    if missing:
        raise StoreError(f"table {table}: the target has no column {', '.join(missing)} (another schema?)")
    quoted = ", ".join(f'"{c}"' for c in columns)
    one = "(" + ", ".join("?" * len(columns)) + ")"
    batch = max(1, MAX_PARAMETERS // len(columns))
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        values: list[Any] = []
        for number, row in enumerate(chunk, start + 1):
            for column in columns:
                values.append(_as(row[column], types[column], table, column, number))
        await dst._db.execute(f"INSERT INTO {table} ({quoted}) VALUES {', '.join([one] * len(chunk))}", values)
    return len(rows)


def _as(value: Any, kind: str, table: str, column: str, number: int) -> Any:
    """`value` as PostgreSQL's column type `kind` takes it (SQLite keeps any value in any column)."""
    if value is None:
        return None
    try:
        if kind in ("bigint", "integer", "smallint"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value} is not a whole number")
            return int(value)
        if kind in ("double precision", "real", "numeric"):
            return float(value)
        if kind == "bytea":
            return value if isinstance(value, bytes) else str(value).encode()
        return value if isinstance(value, str) else str(value)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"table {table}, row {number}, column {column}: {value!r} is no {kind}: {exc}") from exc
