"""The lease of a PostgreSQL store shared by several schedulers (`scheduler.decide.leadership` decides; this reads
and writes it), on a connection of its own: a renewal never waits behind the store's statements.

Times are the server's (`clock_timestamp()`, in seconds since the epoch), never the schedulers': a takeover is
judged by the clock that set the expiry. A takeover runs under the store's write lock, as a write transaction
does, so every write transaction of the old leader either committed before it or finds the new epoch (the
epoch check of `scheduler.store.postgres`) and writes nothing.
"""

from __future__ import annotations

import asyncpg

from ftconsole.scheduler.decide.leadership import LeaseRow
from ftconsole.scheduler.store.postgres import WRITE_LOCK, _connect

_NOW = "extract(epoch FROM clock_timestamp())::double precision"
_COLUMNS = f"holder, epoch, expires, host, socket, {_NOW} AS now"
_READ = f"SELECT {_COLUMNS} FROM ftconsole_lease WHERE one = 1"
_RENEW = (
    f"UPDATE ftconsole_lease SET expires = {_NOW} + $3 WHERE one = 1 AND holder = $1 AND epoch = $2 "
    f"RETURNING {_COLUMNS}"
)
_TAKE = (
    f"UPDATE ftconsole_lease SET holder = $1, epoch = epoch + 1, expires = {_NOW} + $2, host = $3, socket = $4 "
    f"WHERE one = 1 AND (holder = '' OR expires <= {_NOW} OR holder = $1) RETURNING {_COLUMNS}"
)
_LET_GO = f"UPDATE ftconsole_lease SET holder = '', expires = {_NOW} WHERE one = 1 AND holder = $1 AND epoch = $2"


def _row(record: asyncpg.Record | None) -> LeaseRow | None:
    if record is None:
        return None
    return LeaseRow(
        str(record["holder"]),
        int(record["epoch"]),
        float(record["expires"]),
        str(record["host"]),
        str(record["socket"]),
        float(record["now"]),
    )


class LeaseTable:
    """The lease row through one connection (made again when lost). Each call raises the driver's errors,
    OSError or TimeoutError (`errors`) when the server does not answer: the caller decides what that means."""

    errors = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError)

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: asyncpg.Connection | None = None

    async def _live(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await _connect(self._url, read_only=False)
        return self._conn

    def drop(self) -> None:
        """Forget the connection (a statement timed out on it: its state is unknown); the next call connects."""
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def read(self) -> LeaseRow | None:
        return _row(await (await self._live()).fetchrow(_READ))

    async def renew(self, me: str, epoch: int, lease_s: float) -> LeaseRow | None:
        """The lease renewed for `lease_s` more seconds; None (and nothing written) when `me` does not hold
        `epoch` any more."""
        return _row(await (await self._live()).fetchrow(_RENEW, me, epoch, lease_s))

    async def take(self, me: str, lease_s: float, host: str, socket: str) -> LeaseRow | None:
        """The lease taken with the next epoch, when it ran out or was let go (or is `me`'s own, from before it
        fenced itself); None when another holds it. Under the store's write lock."""
        conn = await self._live()
        async with conn.transaction():
            await conn.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")
            return _row(await conn.fetchrow(_TAKE, me, lease_s, host, socket))

    async def let_go(self, me: str, epoch: int) -> None:
        """A leader that stops cleanly lets the lease go: a standby takes it at its next check."""
        await (await self._live()).execute(_LET_GO, me, epoch)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
