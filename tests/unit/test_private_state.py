"""The state_dir and the store are private (issue 11): 0700 (0750 with api.group) and 0600, tightened on start."""

from __future__ import annotations

import grp
import logging
import os
import stat
from pathlib import Path

import pytest

from ftconsole.scheduler.serve.lock import StateLock
from ftconsole.scheduler.store.db import STORE_FILE, Store
from ftconsole.scheduler.store.files import secure_state


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def loose_umask():
    old = os.umask(0o022)  # the usual umask: files 0644 and folders 0755 unless ftconsole says otherwise
    yield
    os.umask(old)


async def test_new_store_and_its_wal_files_are_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert secure_state(state) == []
    assert mode(state) == 0o700
    async with await Store.open(state / STORE_FILE) as store, store.jobs_tx("write something") as tx:
        await tx.event(1.0, "Test", "a write, so the -wal and -shm files exist")
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm"):
        if (state / name).exists():
            assert mode(state / name) == 0o600, name
    assert mode(state / STORE_FILE) == 0o600


async def test_store_opened_alone_is_0600(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "s" / STORE_FILE):
        pass
    assert mode(tmp_path / "s" / STORE_FILE) == 0o600


def test_state_dir_is_0750_where_the_api_group_reaches_the_socket(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    assert secure_state(tmp_path / "state", group=group) == []  # new: nothing to report
    assert mode(tmp_path / "state") == 0o750
    assert (tmp_path / "state").stat().st_gid == os.getgid()


def test_lock_creates_a_private_state_dir(tmp_path: Path) -> None:
    with StateLock(tmp_path / "state"):
        assert mode(tmp_path / "state") == 0o700


async def test_looser_modes_are_tightened_on_start_with_one_log_line(tmp_path: Path, caplog) -> None:
    state = tmp_path / "state"
    async with await Store.open(state / STORE_FILE) as store, store.jobs_tx("write something") as tx:
        await tx.event(1.0, "Test", "x")
    state.chmod(0o755)
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm"):
        (state / name).touch()
        (state / name).chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="ftconsole.scheduler"):
        changes = secure_state(state)
    assert mode(state) == 0o700
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm"):
        assert mode(state / name) == 0o600, name
    assert len(changes) == 4 and f"{state} 0755 -> 0700" in changes
    lines = [r.getMessage() for r in caplog.records if "permissions tightened" in r.getMessage()]
    assert len(lines) == 1 and "0644 -> 0600" in lines[0] and "0755 -> 0700" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ftconsole.scheduler"):
        assert secure_state(state) == []  # nothing more to say on the next start
    assert not caplog.records


@pytest.mark.parametrize(
    ("value", "seconds"), [("off", 0.0), (False, 0.0), (0, 0.0), ("12h", 43200.0), ("2d", 172800.0)]
)
def test_run_retention_is_a_duration_or_off(value, seconds) -> None:
    from ftconsole.scheduler.spec.config import SchedulerSettings

    assert SchedulerSettings().run_retention == 3 * 86400.0
    assert SchedulerSettings(run_retention=value).run_retention == seconds
    with pytest.raises(ValueError, match="duration"):
        SchedulerSettings(run_retention="soon")
