"""The store's seam in front of its database: one small interface (`Engine`), on SQLite or on PostgreSQL.

The store's SQL is written once, in the dialect both engines understand: `?` placeholders, `ON CONFLICT`
upserts, no engine's own functions. An engine runs it as it is (SQLite) or with the placeholders numbered
(PostgreSQL, `scheduler.store.postgres`); what cannot be shared (the schema's DDL, how a transaction takes the
write lock, where the schema version is kept, how another process's writes are noticed) lives behind the
interface. Rows come back as the driver makes them (`sqlite3.Row`, `asyncpg.Record`): both are read by column
name or index, give `keys()`, turn into a dict and unpack as a tuple, and the store uses nothing else of them.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import re
import sqlite3
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiosqlite

from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.store.schema import MIGRATIONS
from ftconsole.scheduler.store.turns import Turns

Row = Any  # sqlite3.Row or asyncpg.Record (see the module docstring)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(where: Path | str) -> bool:
    return isinstance(where, str) and where.startswith(POSTGRES_SCHEMES)


ANY_TABLE = "*"  # what `written_table` says of a statement that may change any table (DDL, a script, a rollback)
_WRITE = re.compile(r"\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)
_READ = re.compile(r"\s*(?:SELECT|PRAGMA|BEGIN|COMMIT|SAVEPOINT|RELEASE|WITH\s+\w+\s+AS\s*\(\s*SELECT)\b", re.I)


@functools.lru_cache(maxsize=2048)
def written_table(sql: str) -> str | None:
    """The table a statement writes (`ANY_TABLE`: it may change any); None: it writes none (a read, BEGIN...)."""
    if (write := _WRITE.match(sql)) is not None:
        return write.group(1).lower()
    if _READ.match(sql) is not None and ";" not in sql.rstrip().rstrip(";"):
        return None
    return ANY_TABLE


E = TypeVar("E", bound="Engine")
P = ParamSpec("P")
R = TypeVar("R")


def in_turn(
    method: Callable[Concatenate[E, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[E, P], Coroutine[Any, Any, R]]:
    """A statement method of an engine: sent outside another context's transaction only (`Turns`)."""

    @functools.wraps(method)
    async def wrapper(self: E, /, *args: P.args, **kwargs: P.kwargs) -> R:
        counted = await self.turns.enter()
        try:
            return await method(self, *args, **kwargs)
        finally:
            if counted:
                self.turns.leave()

    return wrapper


class Engine(abc.ABC):
    """One connection to the store's database, and what differs between SQLite and PostgreSQL."""

    kind: str  # SQLite | PostgreSQL, for messages
    where: str  # the file, or the URL without its password: for messages
    errors: tuple[type[BaseException], ...]  # what the driver raises: turned into StoreError at the store's edge
    # the lease epoch every write transaction must find, under the write lock, or fail with NotLeader (PostgreSQL
    # shared by several schedulers: scheduler.serve.leadership); None: none checked (SQLite has one scheduler)
    epoch: int | None = None
    # told the table of each write statement, before it runs and once it has run (the store's kept reads of that
    # table go: `Store._kept_read`); `ANY_TABLE` for a statement that may change any
    on_write: Callable[[str], None] | None = None
    turns: Turns  # whose turn it is on the connection: a transaction's context, or everyone else (each engine's own)

    @contextlib.contextmanager
    def _told(self, sql: str) -> Iterator[None]:
        """Around running `sql`: the table it writes told to `on_write` before it runs and once it ran."""
        table = written_table(sql)
        tell = self.on_write
        if table is None or tell is None:
            yield
            return
        tell(table)
        try:
            yield
        finally:
            tell(table)

    @abc.abstractmethod
    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""

    @abc.abstractmethod
    async def insert(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one INSERT into a table with an `id` key; the id of the row it made."""

    @abc.abstractmethod
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments, in one trip to the database where it can."""

    @abc.abstractmethod
    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[Row]: ...

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetchall(sql, args)
        return rows[0] if rows else None

    async def fetch_plain(self, columns: Sequence[str], rest: str, args: Sequence[Any] = ()) -> list[list[Any]]:
        """`SELECT <columns> <rest>` for many rows of integers, text and NULL, in no particular order (`rest` has no
        ORDER BY): SQLite's hands them over in one piece (`SqliteEngine.fetch_plain`), where a REAL keeps only 15
        significant digits and a BLOB is refused: not for those."""
        return [list(r) for r in await self.fetchall(f"SELECT {', '.join(columns)} {rest}", args)]

    async def begin(self, *, read_only: bool = False) -> bool:
        """Begin a transaction, this context's (`Turns`): the statements of other tasks on this connection wait
        until it ends. A writing one holds the store's write lock until it ends, whatever process writes: the
        store's transactions read, decide and write as if alone. A read-only one reads one snapshot and waits for
        no other process.

        A writing one says, under the lock, whether another connection wrote since `changed_elsewhere` last
        asked or this connection last committed (the store's kept reads from before then go); read-only: False."""
        await self.turns.take()
        try:
            return await self._begin(read_only=read_only)
        except BaseException:
            self.turns.give_back()
            raise

    async def commit(self) -> None:
        """Commit; where the commit fails with the transaction still open, `rollback` must follow."""
        try:
            await self._commit()
        finally:
            if not self.in_transaction:
                self.turns.give_back()

    async def rollback(self) -> None:
        """Roll back the transaction under way, if one is (the database may have ended it on an error), and give
        the connection's turn back in any case."""
        try:
            if self.in_transaction:
                await self._rollback()
        finally:
            self.turns.give_back()

    @abc.abstractmethod
    async def _begin(self, *, read_only: bool) -> bool: ...

    @abc.abstractmethod
    async def _commit(self) -> None: ...

    @abc.abstractmethod
    async def _rollback(self) -> None: ...

    @property
    @abc.abstractmethod
    def in_transaction(self) -> bool: ...

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """How many of the migrations the database has had (0: a new one)."""

    @abc.abstractmethod
    async def migrate(self, number: int) -> None:
        """Run migration `number` (1-based) and record it, in one transaction; nothing if it was run already."""

    @abc.abstractmethod
    async def changed_elsewhere(self) -> bool:
        """Whether another connection committed a write since this was last asked (or since this connection's
        own last commit): a cheap question, asked each tick."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class SqliteEngine(Engine):
    """SQLite through aiosqlite: WAL, a 10 s busy timeout, foreign keys on; `PRAGMA user_version` is the schema
    version and `PRAGMA data_version` says when another connection committed."""

    kind = "SQLite"
    errors = (sqlite3.Error,)

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.where = str(path)
        self._data_version: int | None = None
        self.turns = Turns()

    @classmethod
    async def connect(cls, path: Path, *, read_only: bool = False) -> SqliteEngine:
        """Raises OSError or sqlite3.Error (`connect` says which store). `read_only`: a connection that cannot
        write (the metrics' own)."""
        # isolation_level None: BEGIN and COMMIT are ours
        if read_only:
            db = await aiosqlite.connect(
                f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10, isolation_level=None
            )
        else:
            db = await aiosqlite.connect(str(path), timeout=10, isolation_level=None)
        db.row_factory = sqlite3.Row
        engine = cls(db, path)
        if not read_only:
            try:
                await db.execute("PRAGMA journal_mode=WAL")
                await db.execute("PRAGMA busy_timeout=10000")
                await db.execute("PRAGMA foreign_keys=ON")
            except BaseException:
                await db.close()
                raise
        return engine

    @in_turn
    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._told(sql):
            cur = await self._db.execute(sql, args)
        return cur.rowcount

    @in_turn
    async def insert(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._told(sql):
            cur = await self._db.execute(sql, args)
        assert cur.lastrowid is not None
        return cur.lastrowid

    @in_turn
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._told(sql):
            await self._db.executemany(sql, rows)

    @in_turn
    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return list(await self._db.execute_fetchall(sql, args))  # one trip to aiosqlite's thread

    async def fetch_plain(self, columns: Sequence[str], rest: str, args: Sequence[Any] = ()) -> list[list[Any]]:
        """The rows as one JSON text made inside SQLite: one step of the statement, where a row each is a step
        each, and each step lets go of Python's GIL and may wait for another thread's switch interval (5 ms) to
        get it back: 10,000 rows took 3.5 s beside one busy thread, against 6.5 ms alone."""
        sql = f"SELECT json_group_array(json_array({', '.join(columns)})) {rest}"
        row = await self.fetchone(sql, args)
        return json.loads(row[0]) if row is not None and row[0] else []

    async def _to_the_end(self, sql: str) -> None:
        """Run BEGIN, COMMIT or ROLLBACK to its end, however often the caller is cancelled meanwhile (then the
        cancellation is raised once it has run): aiosqlite runs it in its thread all the same, and whether a
        transaction is left open on the connection must be known before anyone goes on."""
        sent = asyncio.ensure_future(self._db.execute(sql))
        cancelled: asyncio.CancelledError | None = None
        while not sent.done():
            try:
                await asyncio.shield(sent)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            if sql.startswith("BEGIN") and self._db.in_transaction:
                await self._to_the_end("ROLLBACK")  # begun for nobody: ended
            raise cancelled
        sent.result()

    async def _begin(self, *, read_only: bool) -> bool:
        await self._to_the_end("BEGIN" if read_only else "BEGIN IMMEDIATE")
        try:
            return False if read_only else await self.changed_elsewhere()
        except BaseException:
            await self._to_the_end("ROLLBACK")
            raise

    async def _commit(self) -> None:
        await self._to_the_end("COMMIT")

    async def _rollback(self) -> None:
        await self._to_the_end("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    async def schema_version(self) -> int:
        row = await self.fetchone("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def migrate(self, number: int) -> None:
        """Under the write lock, and only if the version read there is still below `number`: two processes that
        open a new or older store at once (`serve` and a CLI) would otherwise both run the same script."""
        await self._db.execute("BEGIN IMMEDIATE")
        try:
            if await self.schema_version() < number:  # another process may have run it meanwhile
                for statement in _statements(MIGRATIONS[number - 1]):
                    await self._db.execute(statement)
                await self._db.execute(f"PRAGMA user_version = {number}")
            await self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                await self._db.execute("ROLLBACK")
            raise

    async def changed_elsewhere(self) -> bool:
        """SQLite's `data_version` moves with every commit of another connection, never with this one's."""
        row = await self.fetchone("PRAGMA data_version")
        version = row[0] if row is not None else None
        changed = version != self._data_version
        self._data_version = version
        return changed

    async def close(self) -> None:
        await self._db.close()


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration script, one at a time (`executescript` would commit the open transaction)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        raise ValueError(f"a migration ends inside a statement: {pending.strip()[:80]!r}")


async def connect(where: Path | str, *, read_only: bool = False, purpose: str = "") -> Engine:
    """An engine for a store file (SQLite) or a `postgresql://` URL; StoreError names it (and `purpose`, such as
    " for metrics") when it cannot be opened. asyncpg is imported only for a URL."""
    if is_postgres(where):
        # imported here: only a PostgreSQL store loads asyncpg
        from ftconsole.scheduler.store.postgres import PostgresEngine, redact

        try:
            return await PostgresEngine.connect(str(where), read_only=read_only)
        except (*PostgresEngine.errors, OSError, ValueError) as exc:
            raise StoreError(f"cannot open {redact(str(where))}{purpose}: {exc}") from exc
    try:
        return await SqliteEngine.connect(Path(where), read_only=read_only)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open {where}{purpose}: {exc}") from exc
