"""A real PostgreSQL server in a temporary folder, for the store's tests on PostgreSQL.

`PgServer` runs `initdb`, then `pg_ctl start` with the server listening on 127.0.0.1 (a free port) and on a
Unix socket in its folder, never on another address; `stop()` stops it (`pg_ctl stop -m immediate`) and removes
the folder. `database()` makes a fresh database and returns its URL (`postgresql://postgres@127.0.0.1:PORT/NAME`),
so one server serves a whole test session and each test gets its own database.

PostgreSQL refuses to run as root, and the tests run as root in CI: as root, initdb and the server run as
`nobody` (`runuser`), in a folder owned by it. The binaries are looked for on PATH, then in Debian's
/usr/lib/postgresql/<version>/bin; `find_bin_dir` says why not when there are none. Every wait has a timeout.

    with PgServer.start() as server:
        url = server.database()

or, in a test, the session-scoped `pg_server` fixture (import `pg_server_fixture` into the test module or a
conftest).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

PG_MISSING = "PostgreSQL is not installed (no pg_ctl on PATH or in /usr/lib/postgresql/*/bin): apt install postgresql"
TIMEOUT_S = 60
USER = "postgres"  # the server's superuser (initdb -U), whom the URLs name


def find_bin_dir() -> Path | None:
    """The folder with initdb, pg_ctl and createdb; None when PostgreSQL is not installed."""
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # the newest version first
    for folder in candidates:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "createdb")):
            return folder
    return None


class PgServer:
    def __init__(self, bin_dir: Path, root: Path, port: int) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.port = port
        self._names = itertools.count(1)
        self.durable = False

    @classmethod
    def start(cls, bin_dir: Path | None = None, *, durable: bool = False) -> PgServer:
        """A server of its own in a temporary folder. `durable`: with fsync and synchronous commits, as a real
        one (the benchmarks'); without, faster (the tests')."""
        found = bin_dir or find_bin_dir()
        if found is None:
            raise RuntimeError(PG_MISSING)
        root = Path(tempfile.mkdtemp(prefix="ftpg-", dir="/tmp"))  # short: the socket's path is limited
        server = cls(found, root, _free_port())
        server.durable = durable
        try:
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.chown(root, nobody.pw_uid, nobody.pw_gid)
            server._as_owner(
                ["initdb", "-D", str(root / "data"), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-locale", "-N"]
            )
            server._start_server()
        except BaseException:
            server.stop()
            raise
        return server

    def _start_server(self) -> None:
        for tries in range(3):  # the free port may have been taken meanwhile: another one
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c max_connections=200"
            if not self.durable:
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            try:
                self._as_owner(
                    ["pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"), "-o", options,
                     "-w", "-t", str(TIMEOUT_S), "start"]
                )  # fmt: skip
                return
            except subprocess.CalledProcessError:
                if tries == 2:
                    raise RuntimeError(f"PostgreSQL did not start:\n{self.log()}") from None
                self.port = _free_port()

    def _as_owner(self, argv: list[str]) -> None:
        """Run a PostgreSQL tool as the folder's owner (`nobody` when the tests run as root)."""
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "nobody", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=TIMEOUT_S, cwd=self.root)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database on this server: its URL."""
        name = f"t{next(self._names)}"
        createdb = [str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name]
        subprocess.run(createdb, check=True, capture_output=True, timeout=TIMEOUT_S)
        return self.url(name)

    def pids(self) -> list[int]:
        """The server's processes (the postmaster and its children), for their CPU time."""
        try:
            main = int((self.root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        out = [main]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == main:
                        out.append(int(entry.name))
        return out

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        if (self.root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._as_owner(["pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "-t", "30", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def raw_sql(where: Path | str, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a store's database behind the store's back (a SQLite file or a PostgreSQL URL), with
    the store's `?` placeholders; its rows. What a test reads or breaks directly."""
    if isinstance(where, Path):
        with contextlib.closing(sqlite3.connect(where)) as db, db:
            return [tuple(row) for row in db.execute(sql, args).fetchall()]
    import asyncpg

    from ftconsole.scheduler.store.postgres import numbered

    conn = await asyncpg.connect(where, timeout=TIMEOUT_S)
    try:
        return [tuple(row) for row in await conn.fetch(numbered(sql), *args)]
    finally:
        await conn.close()


@pytest.fixture(scope="session", name="pg_server")
def pg_server_fixture() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole session (it takes about a second to start); skips, saying why, where
    PostgreSQL is not installed. Import it into a conftest or test module to use it."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip(PG_MISSING)
    with PgServer.start(bin_dir) as server:
        yield server
