"""Several processes opening one new (or older) store at once: one migrates, the others wait for it and go on.

Before migrations ran under the write lock, `serve` and `ftconsole jobs` started together on a fresh state dir
failed one of them nearly every time (`duplicate column name`, `table ... already exists`)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ftconsole.scheduler.store.schema import MIGRATIONS, SCHEMA_VERSION

OPEN = """
import asyncio, sys
from ftconsole.scheduler.store.db import Store

async def main():
    store = await Store.open(sys.argv[1])
    print(await store.schema_version(), store.cluster_id)
    await store.close()

asyncio.run(main())
"""
PROCESSES = 4


def _open_together(path: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(PROCESSES)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@pytest.mark.parametrize("round_", range(3))
def test_processes_that_make_one_new_store_at_once_all_open_it(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "state.db"
    done = _open_together(path)
    assert [p.returncode for p in done] == [0] * PROCESSES, [p.stderr for p in done]
    # one store, one cluster id: every process read the same one
    answers = {p.stdout.strip() for p in done}
    assert len(answers) == 1, answers
    assert answers.pop().split()[0] == str(SCHEMA_VERSION)


def test_processes_that_upgrade_one_older_store_at_once_all_open_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    older = 11
    db = sqlite3.connect(path)
    db.executescript("".join(MIGRATIONS[:older]) + f"PRAGMA user_version = {older};")
    db.execute("INSERT INTO nodes (name, health, reasons) VALUES ('n1', 'healthy', '[]')")
    db.commit()
    db.close()
    done = _open_together(path)
    assert [p.returncode for p in done] == [0] * PROCESSES, [p.stderr for p in done]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT name FROM nodes").fetchall() == [("n1",)]  # migrated once, nothing lost
        assert db.execute("SELECT COUNT(*) FROM meta WHERE key = 'cluster_id'").fetchone()[0] == 1
    finally:
        db.close()
