"""Backing up and restoring the SQLite store: `ftconsole state backup` and `ftconsole state restore`
(docs/operations.md, "Backup and restore").

A backup is SQLite's online backup API (`sqlite3.Connection.backup`) from a read-only connection, run in a thread
off the event loop: every page is copied in one step, inside one read transaction, so the copy is the store as of
one commit while `serve` goes on writing (in WAL mode a reader and the writer never wait for each other). It takes
no lock of the state_dir: it runs beside the scheduler. The copy is written to FILE.tmp (0600), made one
self-contained file (journal mode DELETE: no -wal beside it), checked (`check_file`: SQLite's integrity check, an
ftconsole store, its schema version), and only then renamed to FILE: a failed or interrupted backup never replaces
a good one.

A restore puts a backup in the store's place while no scheduler runs (the caller holds the state_dir's lock): the
backup is checked, copied in beside the store (0600) and checked again; the old store and its -wal and -shm files
are moved aside as `state.db.before-restore-TIME` (kept, never deleted: SQLite opens that name with its own -wal),
and the copy is renamed to state.db. Where the old store can still be read (and is of the same cluster), the
restored one gives job ids after the old one's last: the run folders on the nodes are named by job id, and a new
job must not get the id of one started after the backup, whose folders are still there.

A store on PostgreSQL has its own tools, pg_dump and pg_restore: `pg_dump_command` and `pg_restore_command` spell
them out for the store's URL, its password left out (libpq reads it from PGPASSWORD or ~/.pgpass, as psql does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ftconsole.scheduler.errors import StoreError, UsageError
from ftconsole.scheduler.spec.pgurl import redact
from ftconsole.scheduler.store.files import STATE_DIR_MODE, STORE_FILE, STORE_MODE, read_cluster_id
from ftconsole.scheduler.store.schema import SCHEMA_VERSION

COUNTED = ("jobs", "runs", "events")  # the tables whose rows a backup and a restore report
COMPANIONS = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside a database, named after it
ASIDE = ".before-restore-"  # the old store's name after a restore: state.db.before-restore-20250101T120000
RESTORING = STORE_FILE + ".restoring"  # the copy being restored, beside the store until it is renamed
LOCK_FILE = "scheduler.lock"  # scheduler.serve.lock's, in state_dir (the store does not import the daemon)
MAX_PROBLEMS = 5  # of an integrity check, shown


class BadStoreFile(UsageError):
    """A file given as a backup that is not one this ftconsole can restore."""

    title = "not a usable backup"


class PostgresStore(UsageError):
    """`state backup` or `state restore` asked of a store on PostgreSQL: pg_dump and pg_restore do that."""

    title = "store on PostgreSQL"


@dataclass(frozen=True)
class StoreFacts:
    """What a store file holds, as its check read it."""

    path: str
    bytes: int
    schema_version: int
    cluster_id: str
    rows: dict[str, int]  # of each of COUNTED

    def to_json(self) -> dict[str, object]:
        return {"file": self.path, "bytes": self.bytes, "schema_version": self.schema_version,
                "cluster_id": self.cluster_id, "rows": dict(self.rows), "integrity": "ok"}  # fmt: skip


@dataclass(frozen=True)
class Restored:
    backup: StoreFacts  # the file restored, as checked
    store: str  # where it now is: state_dir/state.db
    moved: list[str]  # the old store's files, moved aside (empty: there was none)
    last_job: int  # the backup's highest job id
    next_job: int  # the id the restored store gives the next job
    carried: bool  # next_job goes on from the old store's ids (higher than the backup's)


# -- backup ------------------------------------------------------------------------------------------------------


async def backup_store(source: Path, target: Path, *, force: bool = False) -> StoreFacts:
    """Back the store at `source` up to `target`, in a thread (the event loop, and the scheduler's writes, go on);
    what the checked copy holds. UsageError: a target refused; StoreError: no store, or a copy that fails its check
    (`target` is then left as it was)."""
    return await asyncio.to_thread(backup_file, source, target, force=force)


def backup_file(source: Path, target: Path, *, force: bool = False) -> StoreFacts:
    """`backup_store`'s work, blocking: copy, check, then rename into place."""
    if not source.is_file():
        raise StoreError(f"no store at {source}: nothing to back up")
    refuse_target(source, target, force=force)
    tmp = target.with_name(target.name + ".tmp")
    _create_private(tmp, replace=force, why="left by an interrupted backup?")
    try:
        _copy(source, tmp)
        try:
            facts = check_file(tmp)
        except BadStoreFile as exc:
            raise StoreError(
                f"the copy of {source} fails its check ({exc}): the store itself may be damaged; {target} is left "
                "as it was"
            ) from exc
        _fsync(tmp)
        _publish(tmp, target, replace=force)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync(target.parent)
    return dataclasses.replace(facts, path=str(target))


def refuse_target(source: Path, target: Path, *, force: bool) -> None:
    """UsageError when `target` must not be written: the store itself or a file of its state_dir that the scheduler
    uses, a folder or another file that is not a plain file, a missing folder, or (without `force`) any file
    that exists."""
    if target.is_dir():
        raise UsageError(f"{target} is a folder: give the backup's file name, such as {target / 'state-DATE.db'}")
    if not target.parent.is_dir():
        raise UsageError(f"{target}: no folder {target.parent}")
    ours = [source, *(source.with_name(source.name + c) for c in COMPANIONS), source.with_name(LOCK_FILE)]
    for path in (target, target.with_name(target.name + ".tmp")):
        if any(_same(path, p) for p in ours):
            raise UsageError(
                f"{target} is the store or one of the scheduler's files in {source.parent}: give a file elsewhere, "
                "best on another disk"
            )
    if target.exists() or target.is_symlink():
        if not target.is_file():
            raise UsageError(f"{target} exists and is not a plain file: give another name")
        if not force:
            raise UsageError(f"{target} exists: give another name, or --force to replace it")


def _same(a: Path, b: Path) -> bool:
    """The same file: one path, however spelled (links, ..), or one inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _create_private(path: Path, *, replace: bool, why: str) -> None:
    """Create `path` empty, 0600 (the store holds every job's spec and env), refusing a file already there unless
    `replace`."""
    try:
        if replace:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, STORE_MODE))
    except FileExistsError:
        raise UsageError(f"{path} exists ({why}): remove it, or give --force") from None
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from exc


def _copy(source: Path, target: Path) -> None:
    """Every page of `source` into the empty database `target`, in one step (one read transaction: the store as
    of one commit), then `target` made one file (journal mode DELETE)."""
    try:
        with (
            contextlib.closing(_read_only(source)) as src,
            contextlib.closing(sqlite3.connect(target, timeout=10)) as dst,
        ):
            src.backup(dst)  # pages=-1: all of it in one step
            dst.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot copy {source} to {target}: {exc}") from exc


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)


def _publish(tmp: Path, target: Path, *, replace: bool) -> None:
    """Rename the checked copy to `target`; without `replace`, never over a file that appeared meanwhile."""
    try:
        if replace:
            os.replace(tmp, target)
            return
        try:
            os.link(tmp, target)  # atomic, and fails where the name exists
        except FileExistsError:
            raise UsageError(f"{target} appeared while the backup ran: give another name, or --force") from None
        except OSError:  # a file system without hard links
            if target.exists():
                raise UsageError(f"{target} exists: give another name, or --force to replace it") from None
            os.replace(tmp, target)
            return
        tmp.unlink()
    except OSError as exc:
        raise StoreError(f"cannot write {target}: {exc}") from exc


def _fsync(path: Path) -> None:
    """The file's data (or a folder's entries) on disk, before a rename or a report counts on it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- check -------------------------------------------------------------------------------------------------------


def check_file(path: Path) -> StoreFacts:
    """What the store file at `path` holds, read without changing it; BadStoreFile when it is no SQLite database,
    fails SQLite's integrity check, is no ftconsole store (no cluster id), or has a schema newer than this
    ftconsole's."""
    if not path.is_file():
        raise BadStoreFile(f"{path}: no such file" if not path.exists() else f"{path} is not a plain file")
    try:
        with contextlib.closing(_read_only(path)) as db:
            problems = [str(r[0]) for r in db.execute(f"PRAGMA integrity_check({MAX_PROBLEMS})")]
            if problems != ["ok"]:
                raise BadStoreFile(f"{path} fails SQLite's integrity check: {'; '.join(problems)}")
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            row = db.execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchone() if "meta" in tables else None
            if version < 1 or row is None:
                raise BadStoreFile(f"{path} is an SQLite database but no ftconsole store (it has no cluster id)")
            if version > SCHEMA_VERSION:
                raise BadStoreFile(
                    f"{path} has schema version {version}, newer than this ftconsole's ({SCHEMA_VERSION}): restore "
                    "it with the ftconsole that made it, or a newer one"
                )
            rows = {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in COUNTED if t in tables}
    except sqlite3.DatabaseError as exc:  # not a database, cannot be opened, or damaged past reading
        raise BadStoreFile(f"{path} is not a readable SQLite database: {exc}") from exc
    return StoreFacts(str(path), path.stat().st_size, version, str(row[0]), rows)


# -- restore -----------------------------------------------------------------------------------------------------


def restore_file(backup: Path, state_dir: Path, *, force: bool = False, now: float | None = None) -> Restored:
    """Put the backup `backup` in place as state_dir's store. The caller holds state_dir's lock (no scheduler runs
    on it). BadStoreFile: the backup is refused; UsageError: it is the store itself, or (without `force`) another
    cluster's store than the one in place."""
    store = state_dir / STORE_FILE
    if any(_same(backup, p) for p in (store, state_dir / RESTORING) if p.exists()):
        raise UsageError(f"{backup} is the store itself: give a backup file")
    facts = check_file(backup)
    current = read_cluster_id(store)
    if current is not None and current != facts.cluster_id and not force:
        raise UsageError(
            f"{backup} is a store of cluster {facts.cluster_id}, the one in {state_dir} of cluster {current}: the "
            "runs on the nodes are kept under their store's cluster id, so the restored store would not see the "
            f"ones of {current}. Give --force to restore it all the same"
        )
    # job ids go on after the old store's (same cluster): a new job then never takes the id, and the run
    # folders on the nodes, of a job started after the backup
    old_last = _last_job_id(store) if current == facts.cluster_id else None
    tmp = state_dir / RESTORING
    state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)  # a new disk's: private, as the scheduler's
    _create_private(tmp, replace=True, why="")  # ours: left by an interrupted restore, under the same lock
    try:
        _copy(backup, tmp)
        check_file(tmp)
        last = _last_job_id(tmp) or 0
        after = old_last if old_last is not None and old_last > last else last
        if after > last:
            _go_on_after(tmp, after)
        _fsync(tmp)
        moved = _move_aside(store, time.time() if now is None else now)
        os.replace(tmp, store)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync(state_dir)
    return Restored(facts, str(store), moved, last, after + 1, after > last)


def _last_job_id(path: Path) -> int | None:
    """The highest job id the store at `path` gave (AUTOINCREMENT's counter, or its highest row); None when it
    cannot be read."""
    if not path.is_file():
        return None
    try:
        with contextlib.closing(_read_only(path)) as db:
            counter = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
            top = db.execute("SELECT MAX(id) FROM jobs").fetchone()
    except sqlite3.Error:
        return None
    return max(int(counter[0]) if counter and counter[0] is not None else 0, int(top[0]) if top and top[0] else 0)


def _go_on_after(path: Path, last: int) -> None:
    """Make the store at `path` give job ids after `last` (SQLite's AUTOINCREMENT counter, `sqlite_sequence`)."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10)) as db, db:  # one transaction
            if db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone() is None:
                db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (last,))
            else:
                db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs' AND seq < ?", (last, last))
    except sqlite3.Error as exc:
        raise StoreError(f"cannot set the next job id of {path}: {exc}") from exc


def _move_aside(store: Path, now: float) -> list[str]:
    """Rename the store and its companions (-wal, -shm, -journal: a -wal may hold its last commits) to
    state.db.before-restore-TIME[-wal...], so the old store stays whole and can be opened, or restored, again."""
    found = [p for p in (store, *(store.with_name(store.name + c) for c in COMPANIONS)) if p.exists()]
    if not found:
        return []
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
    for n in range(1, 100):
        aside = store.with_name(f"{store.name}{ASIDE}{stamp}" + (f"-{n}" if n > 1 else ""))
        if not any(aside.with_name(aside.name + c).exists() for c in ("", *COMPANIONS)):
            break
    else:
        raise StoreError(f"cannot find a free name for the old store beside {store}")
    moved = []
    for path in found:
        new = aside.with_name(aside.name + path.name[len(store.name) :])
        try:
            os.rename(path, new)
        except OSError as exc:
            raise StoreError(f"cannot move {path} aside to {new}: {exc}") from exc
        moved.append(str(new))
    return moved


# -- PostgreSQL --------------------------------------------------------------------------------------------------


def pg_dump_command(url: str, file: str) -> str:
    """The pg_dump command line that backs the store at `url` up into `file` (custom format: pg_restore reads it)."""
    return shlex.join(["pg_dump", "--format=custom", f"--dbname={_no_password(url)}", f"--file={file}"])


def pg_restore_command(url: str, file: str) -> str:
    """The pg_restore command line that puts the pg_dump `file` back as the store at `url` (its tables replaced,
    all of it or nothing)."""
    return shlex.join(["pg_restore", "--clean", "--if-exists", "--no-owner", "--single-transaction",
                       f"--dbname={_no_password(url)}", file])  # fmt: skip


def _no_password(url: str) -> str:
    """`url` redacted (`redact`), then without what it left of its passwords (`:***` after the user, a
    `password=***` parameter): libpq reads the password where psql does (PGPASSWORD, ~/.pgpass), and the command
    runs as shown."""
    shown = redact(url)
    scheme, sep, rest = shown.partition("://")
    user, at, host = rest.partition(":***@")
    if at and "/" not in user:
        rest = f"{user}@{host}"
    path, question, query = rest.partition("?")
    kept = [pair for pair in query.split("&") if not pair.endswith("=***")]
    return f"{scheme}{sep}{path}" + (f"?{'&'.join(kept)}" if question and kept else "")
