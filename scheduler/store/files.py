"""The state directory's files: where the store lives and who may read it. The store holds every job's spec and
env, so state_dir is private (0700, or 0750 for `api.group`) and the store and its -wal/-shm files are 0600;
`secure_state` makes them so, and tightens what an earlier ftconsole left looser. `read_cluster_id` reads the
store's cluster id without opening it for writing. `store_location` says where the store is: that file, or the
PostgreSQL database of `state.url`.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import sqlite3
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ftconsole.scheduler.errors import StoreError

if TYPE_CHECKING:
    from ftconsole.scheduler.spec.config import LoadedConfig

STORE_FILE = "state.db"  # in state_dir
STORE_MODE = 0o600  # the store holds every spec and env: only the scheduler's user reads it
STATE_DIR_MODE = 0o700  # 0750 where api.group must reach the socket (its members never read the store)

log = logging.getLogger("ftconsole.scheduler")


def store_location(loaded: LoadedConfig) -> Path | str:
    """Where the store is: `state.url` (PostgreSQL) when the config has one, else state.db in state_dir."""
    state = loaded.cluster.state
    return state.url if state is not None else loaded.state_dir / STORE_FILE


def secure_state(state_dir: Path, *, group: str | None = None, sqlite: bool = True) -> list[str]:
    """Create state_dir and make it and the store private; what was tightened, one phrase each (logged once).

    state_dir is 0700, or 0750 (and owned by `group`) where `group` (api.group) must reach the socket in it;
    the store and its -wal/-shm files are 0600. Modes looser than those (a store made by an earlier ftconsole)
    are tightened; paths owned by another user are left alone (their owner's scheduler tightens them). Not
    `sqlite` (the store is on PostgreSQL): no store file is made, and one left from before is tightened still.
    """
    changes: list[str] = []
    try:
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            state_dir.mkdir(mode=STATE_DIR_MODE)
        info = state_dir.stat()
        want = STATE_DIR_MODE if group is None else 0o750
        if info.st_uid == os.geteuid():
            mode = stat.S_IMODE(info.st_mode)
            if mode != want:
                os.chmod(state_dir, want)
                if mode & ~want:  # tightened (a new folder only gets the group's access: nothing to report)
                    changes.append(f"{state_dir} {mode:04o} -> {want:04o}")
            gid = _group_id(group)
            if gid is not None and info.st_gid != gid:
                try:
                    os.chown(state_dir, -1, gid)
                except PermissionError:
                    log.warning("cannot give %s to group %s (api.group): not a member of it", state_dir, group)
        changes += _private_store_files(state_dir / STORE_FILE, create=sqlite)
    except OSError as exc:
        raise StoreError(f"cannot prepare {state_dir}: {exc}") from exc
    if changes:
        log.warning("permissions tightened (the store and state_dir are private): %s", "; ".join(changes))
    return changes


def _group_id(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None  # the API server says so when it starts


def _private_store_files(path: Path, *, create: bool = True) -> list[str]:
    """Create the store file 0600 when there is none and `create` (SQLite gives its -wal and -shm the store's
    mode) and tighten a store, -wal or -shm file that is looser; what was changed."""
    changes = []
    with contextlib.suppress(FileExistsError):
        if create:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, STORE_MODE))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            info = file.stat()
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if mode & ~STORE_MODE and info.st_uid == os.geteuid():
            os.chmod(file, mode & STORE_MODE)
            changes.append(f"{file} {mode:04o} -> {mode & STORE_MODE:04o}")
    return changes


def read_cluster_id(path: Path) -> str | None:
    """The cluster id of the store at `path` without changing anything; None when there is no store (yet) or it
    predates cluster ids (it gets one on the scheduler's next start)."""
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None
