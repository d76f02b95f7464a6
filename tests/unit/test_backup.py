"""`ftconsole state backup` and `state restore` (scheduler/store/backup.py): a backup taken while another connection
writes is one commit's store and passes SQLite's integrity check; what a careful tool refuses (a file in the way,
the store itself, a store on PostgreSQL, a restore while a scheduler runs, a file that is no ftconsole store or is
of a newer schema, a damaged one); a restore keeps the old store aside and gives job ids after its last. And the
sweep's choice of the runs to fence after a restore (scheduler/sweeping.py `stray_runs`)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftconsole.cli import build_parser, main
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.runstatus import NodeRun, RunStatus
from ftconsole.scheduler.errors import StoreError, UsageError
from ftconsole.scheduler.serve.lock import LOCK_NAME, StateLock
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store import backup as backup_module
from ftconsole.scheduler.store.backup import (
    BadStoreFile,
    backup_file,
    backup_store,
    check_file,
    pg_dump_command,
    pg_restore_command,
    restore_file,
)
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.schema import SCHEMA_VERSION
from ftconsole.scheduler.sweeping import stray_runs

SPEC = JobSpec.from_json({"name": "w", "command": "true"})


def new_job(name: str = "w") -> Job:
    return Job(id=0, name=name, owner="ann", uid=1000, spec=SPEC, status=JobStatus.QUEUED, priority="normal",
               project="default", access="none", submitted=time.time())  # fmt: skip


async def make_store(path: Path, jobs: int = 2) -> str:
    """A store with `jobs` jobs, each with its event; its cluster id."""
    async with await Store.open(path) as store, store.jobs_tx("fill") as tx:
        for _ in range(jobs):
            job_id = await tx.add_job(new_job())
            await tx.event(time.time(), "Written", "one of a pair", job=job_id)
        return store.cluster_id


def config(tmp_path: Path, state: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\nnodes:\n  - name: n1\n{state}")
    return path


def damage_index(path: Path, marker: bytes, replacement: bytes) -> None:
    """Overwrite `marker` in the store's `jobs_status` index page: its rows no longer match the table's."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs_status'").fetchone()[0]
    data = bytearray(path.read_bytes())
    at = data.find(marker, (root - 1) * page_size, root * page_size)
    assert at >= 0
    data[at : at + len(marker)] = replacement
    path.write_bytes(bytes(data))


def crashed_after_writes(path: Path) -> None:
    """Three more jobs committed by a process that dies before SQLite moves them from the -wal into the store."""
    code = (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA wal_autocheckpoint=0')\n"
        "for _ in range(3):\n"
        '    db.execute("INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted) '
        "SELECT 'later', owner, uid, spec, status, priority, project, access, submitted FROM jobs LIMIT 1\")\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)


# -- backup ------------------------------------------------------------------------------------------------------


async def test_a_backup_while_another_connection_writes_is_whole_and_of_one_commit(tmp_path: Path) -> None:
    """Each write adds a job and its event in one transaction: every copy has as many of one as of the other."""
    source = tmp_path / "state" / "state.db"
    await make_store(source)
    with sqlite3.connect(source) as db:  # some bulk, so that a copy takes a while
        db.executemany("INSERT INTO events (time, kind, message) VALUES (?, 'Bulk', ?)",
                       ((time.time(), "x" * 200) for _ in range(20_000)))  # fmt: skip
    commits = 0
    stop = asyncio.Event()

    async def writer() -> None:
        nonlocal commits
        async with await Store.open(source) as store:
            while not stop.is_set():
                async with store.jobs_tx("write") as tx:
                    job_id = await tx.add_job(new_job())
                    await tx.event(time.time(), "Written", "one of a pair", job=job_id)
                commits += 1
                await asyncio.sleep(0)

    task = asyncio.create_task(writer())
    overlapped = 0
    try:
        while commits < 5:
            await asyncio.sleep(0.01)
        for n in range(8):
            before = commits
            facts = await backup_store(source, tmp_path / f"copy{n}.db")
            overlapped += commits > before  # the writer went on while the copy ran
            with sqlite3.connect(tmp_path / f"copy{n}.db") as db:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
                jobs = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
                pairs = db.execute("SELECT COUNT(*) FROM events WHERE kind = 'Written'").fetchone()[0]
                assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file, no -wal
            assert jobs == pairs == facts.rows["jobs"] and 2 + before <= jobs
            assert facts.rows["events"] == pairs + 20_000 and facts.schema_version == SCHEMA_VERSION
    finally:
        stop.set()
        await task
    assert overlapped, "the writer never wrote while a backup ran"
    assert {p.name for p in tmp_path.iterdir()} == {"state", *(f"copy{n}.db" for n in range(8))}  # no .tmp left
    assert all(os.stat(tmp_path / f"copy{n}.db").st_mode & 0o777 == 0o600 for n in range(8))


def test_the_cli_backs_up_without_the_state_dirs_lock_and_reports_the_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster_id = asyncio.run(make_store(tmp_path / "state" / "state.db", jobs=3))
    target = tmp_path / "b.db"
    with StateLock(tmp_path / "state"):  # a scheduler runs: the backup goes on beside it
        assert main(["--config", str(config(tmp_path)), "state", "backup", str(target), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done == {"file": str(target), "bytes": target.stat().st_size, "schema_version": SCHEMA_VERSION,
                    "cluster_id": cluster_id, "rows": {"jobs": 3, "runs": 0, "events": 3}, "integrity": "ok",
                    "source": str(tmp_path / "state" / "state.db")}  # fmt: skip
    assert main(["--config", str(config(tmp_path)), "state", "backup", str(target), "--force"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"backed up {tmp_path / 'state' / 'state.db'} to {target}: ") and "integrity ok" in out


@pytest.mark.parametrize(
    ("target", "force", "message"),
    [
        ("b.db", False, "exists: give another name, or --force"),
        ("b.db.tmp", False, None),  # b.db.tmp in the way of b.db's: see the next row
        ("state/state.db", True, "is the store or one of the scheduler's files"),
        ("state/state.db-wal", True, "is the store or one of the scheduler's files"),
        ("state/../state/state.db-shm", True, "is the store or one of the scheduler's files"),
        ("state/scheduler.lock", True, "is the store or one of the scheduler's files"),
        ("link.db", True, "is the store or one of the scheduler's files"),  # a symbolic link to the store
        ("state", True, "is a folder"),
        ("nowhere/b.db", False, "no folder"),
    ],
)
async def test_a_backup_refuses_what_it_must_not_write(
    tmp_path: Path, target: str, force: bool, message: str | None
) -> None:
    source = tmp_path / "state" / "state.db"
    await make_store(source)
    (tmp_path / "b.db").write_text("an older backup")
    (tmp_path / "link.db").symlink_to(source)
    (tmp_path / "state" / "scheduler.lock").touch()
    before = source.read_bytes()
    if message is None:  # a FILE.tmp left by an interrupted backup: refused, then replaced with --force
        (tmp_path / "c.db.tmp").write_text("left over")
        with pytest.raises(UsageError, match=r"c\.db\.tmp exists \(left by an interrupted backup\?\)"):
            backup_file(source, tmp_path / "c.db")
        backup_file(source, tmp_path / "c.db", force=True)
        assert check_file(tmp_path / "c.db").rows["jobs"] == 2 and not (tmp_path / "c.db.tmp").exists()
        return
    with pytest.raises(UsageError, match=message):
        backup_file(source, tmp_path / target, force=force)
    assert source.read_bytes() == before and (tmp_path / "b.db").read_text() == "an older backup"
    backup_file(source, tmp_path / "b.db", force=True)  # --force replaces an older backup
    assert check_file(tmp_path / "b.db").rows["jobs"] == 2


async def test_a_copy_that_fails_its_check_replaces_nothing(tmp_path: Path) -> None:
    source = tmp_path / "state" / "state.db"
    await make_store(source)
    damage_index(source, b"queued", b"qXeued")
    (tmp_path / "b.db").write_text("the last good backup")
    with pytest.raises(StoreError, match=r"fails its check .*integrity check: .*missing from index jobs_status"):
        backup_file(source, tmp_path / "b.db", force=True)
    assert (tmp_path / "b.db").read_text() == "the last good backup" and not (tmp_path / "b.db.tmp").exists()


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_a_store_on_postgresql_is_refused_naming_pg_dump_or_pg_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    url = "postgresql://ft:s3cret@db.example:5432/ftstate?sslmode=require"
    path = config(tmp_path, f"state: {{url: '{url}'}}\n")
    assert main(["--config", str(path), "state", command, str(tmp_path / "ft.dump")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "s3cret" not in err and "the store is on PostgreSQL (postgresql://ft:***@db.example:5432/ftstate" in err
    if command == "backup":
        assert (f"pg_dump --format=custom '--dbname=postgresql://ft@db.example:5432/ftstate?sslmode=require' "
                f"--file={tmp_path / 'ft.dump'}") in err  # fmt: skip
    else:
        assert "stop every scheduler on it" in err and "pg_restore --clean --if-exists" in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ft@db/ftstate", "--dbname=postgresql://ft@db/ftstate"),
        ("postgresql://ft:pw@db:5433/ftstate", "--dbname=postgresql://ft@db:5433/ftstate"),
        ("postgres://ft:p#w/x@db/ftstate", "--dbname=postgres://ft@db/ftstate"),
        ("postgresql://db/ftstate?password=pw&sslmode=verify-full", "'--dbname=postgresql://db/ftstate?sslmode=verify-full'"),
        ("postgresql://db/ftstate?password=pw", "--dbname=postgresql://db/ftstate"),
    ],
)  # fmt: skip
def test_the_postgresql_commands_never_hold_the_password(url: str, shown: str) -> None:
    dump, restore = pg_dump_command(url, "/b/ft.dump"), pg_restore_command(url, "my dump")
    assert dump == f"pg_dump --format=custom {shown} --file=/b/ft.dump"
    assert restore == f"pg_restore --clean --if-exists --no-owner --single-transaction {shown} 'my dump'"
    assert "pw" not in dump + restore


def test_the_backup_knows_the_lock_files_name() -> None:
    assert backup_module.LOCK_FILE == LOCK_NAME  # the store does not import the daemon's lock: a copy of its name


def test_state_copy_is_still_parsed_as_before() -> None:
    args = build_parser().parse_args(["state", "copy", "--to", "postgresql://ft@db/x", "--from", "s.db"])
    assert (args.func.__name__, args.to, args.source) == ("cmd_state", "postgresql://ft@db/x", "s.db")


# -- restore -----------------------------------------------------------------------------------------------------


async def test_a_restore_keeps_the_old_store_aside_and_gives_job_ids_after_its_last(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cluster_id = await make_store(state / "state.db", jobs=2)
    backup_file(state / "state.db", tmp_path / "b.db")
    crashed_after_writes(state / "state.db")  # jobs 3..5, unknown to the backup, still in the store's -wal
    old_wal = (state / "state.db-wal").read_bytes()
    restored = restore_file(tmp_path / "b.db", state, now=time.mktime((2025, 3, 4, 5, 6, 7, 0, 0, -1)))
    aside = state / "state.db.before-restore-20250304T050607"
    assert restored.moved == [str(aside), f"{aside}-wal", f"{aside}-shm"]
    assert (aside.with_name(aside.name + "-wal")).read_bytes() == old_wal  # its last commits went with it
    assert not (state / "state.db-wal").exists() and not (state / "state.db.restoring").exists()
    assert (restored.last_job, restored.next_job, restored.carried) == (2, 6, True)
    assert os.stat(state / "state.db").st_mode & 0o777 == 0o600
    with sqlite3.connect(f"file:{aside}?mode=ro", uri=True) as db:  # the old store, whole
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 5
    async with await Store.open(state / "state.db") as store:
        assert store.cluster_id == cluster_id and [j.id for j in await store.jobs()] == [1, 2]
        async with store.jobs_tx("a new job") as tx:
            assert await tx.add_job(new_job("new")) == 6
    # into an empty state_dir (a new disk): nothing to move aside, and no later ids to know of
    fresh = restore_file(tmp_path / "b.db", tmp_path / "fresh")
    assert (fresh.moved, fresh.last_job, fresh.next_job, fresh.carried) == ([], 2, 3, False)


def test_the_cli_restore_refuses_while_a_scheduler_holds_the_state_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(make_store(tmp_path / "state" / "state.db"))
    backup_file(tmp_path / "state" / "state.db", tmp_path / "b.db")
    before = (tmp_path / "state" / "state.db").read_bytes()
    with StateLock(tmp_path / "state"):
        assert main(["--config", str(config(tmp_path)), "state", "restore", str(tmp_path / "b.db")]) == 1
    assert f"already running: another scheduler (pid {os.getpid()}) already runs on" in capsys.readouterr().err
    assert (tmp_path / "state" / "state.db").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "state").iterdir() if "before-restore" in p.name) == []
    assert main(["--config", str(config(tmp_path)), "state", "restore", str(tmp_path / "b.db")]) == 0
    out = capsys.readouterr().out
    assert f"restored {tmp_path / 'b.db'} as {tmp_path / 'state' / 'state.db'}: " in out
    assert "the old store is kept, moved aside: " in out and "next: start the scheduler" in out


def _plain_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")


def _newer(path: Path) -> None:
    asyncio.run(make_store(path))
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.execute("PRAGMA journal_mode=DELETE")


def _damaged(path: Path) -> None:
    asyncio.run(make_store(path))
    damage_index(path, b"queued", b"qXeued")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("state_dir: /x\n"), r"is not a readable SQLite database: file is not a database"),
        (_plain_sqlite, r"is an SQLite database but no ftconsole store \(it has no cluster id\)"),
        (_newer, rf"has schema version {SCHEMA_VERSION + 1}, newer than this ftconsole's \({SCHEMA_VERSION}\)"),
        (_damaged, r"fails SQLite's integrity check: .*missing from index jobs_status"),
        (lambda p: p.mkdir(), r"is not a plain file"),
        (lambda p: None, r"no such file"),
    ],
)
def test_a_restore_refuses_a_file_that_is_no_usable_backup(tmp_path: Path, make, message: str) -> None:
    state = tmp_path / "state"
    asyncio.run(make_store(state / "state.db"))
    before = sorted(p.name for p in state.iterdir())
    make(tmp_path / "given.db")
    with pytest.raises(BadStoreFile, match=message):
        restore_file(tmp_path / "given.db", state)
    assert sorted(p.name for p in state.iterdir()) == before  # nothing moved, nothing left


async def test_a_restore_refuses_the_store_itself_and_another_clusters_store_without_force(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await make_store(state / "state.db")
    with pytest.raises(UsageError, match="is the store itself"):
        restore_file(state / "state.db", state)
    other = await make_store(tmp_path / "other" / "state.db")
    backup_file(tmp_path / "other" / "state.db", tmp_path / "other.db")
    with pytest.raises(UsageError, match=rf"is a store of cluster {other}, the one in .* of cluster "):
        restore_file(tmp_path / "other.db", state)
    restored = restore_file(tmp_path / "other.db", state, force=True)
    assert restored.backup.cluster_id == other and not restored.carried  # another cluster's ids mean nothing here


# -- what the sweep fences after a restore ------------------------------------------------------------------------


def found(job: int, attempt: int, state: str = "running", token: str | None = "old") -> NodeRun:
    return NodeRun(str(job), str(attempt), "0", RunStatus(state=state, pid=100 + job, token=token))


def held(job: int, attempt: int, state: str = "running", token: str | None = "old", node: str = "n1") -> Run:
    return Run(job, attempt, 0, node, (0,), f"/r/{job}/{attempt}/0", True, state=state, token=token)


@pytest.mark.parametrize(
    ("on_node", "in_store", "strays"),
    [
        ([found(1, 1)], [held(1, 1)], []),  # the store's own run
        ([found(1, 1)], [], [(1, 1)]),  # unknown to the store (started after its backup): killed
        ([found(1, 1)], [held(1, 1, node="n2")], [(1, 1)]),  # the store has it on another node
        ([found(1, 1)], [held(1, 1, state="exited")], [(1, 1)]),  # the store says it ended
        ([found(1, 1, state="exited")], [], []),  # ended on the node: nothing to kill
        ([found(1, 1, state="orphaned")], [], [(1, 1)]),  # its supervisor is dead, its processes are not
        # a new job given the same id (a restored store): its run, not yet started, must not shield the old one
        ([found(1, 1)], [held(1, 1, state="intent", token="new")], [(1, 1)]),
        ([found(1, 1)], [held(1, 1, token="new")], [(1, 1)]),
        ([found(1, 1, token=None)], [held(1, 1, token="new")], []),  # no token to tell: the path decides
        ([found(1, 1)], [held(1, 1, token=None)], []),
    ],
)
def test_the_runs_fenced_are_those_the_store_does_not_hold_by_path_and_token(
    on_node: list[NodeRun], in_store: list[Run], strays: list[tuple[int, int]]
) -> None:
    assert [(int(f.job), int(f.attempt)) for f in stray_runs(on_node, in_store, "n1")] == strays
