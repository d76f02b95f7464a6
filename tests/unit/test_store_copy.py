"""`ftconsole state copy`: a SQLite store moved to a real PostgreSQL server (tests/pg_server.py), every row, ids
and cluster id kept; an occupied target or a running scheduler refused, nothing written."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from ftconsole.cli import main
from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.serve.lock import StateLock
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.copy import copy_store
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import StoredProbe
from tests.pg_server import PgServer, raw_sql


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.database()


async def fill(path: Path) -> tuple[str, list[int]]:
    """A SQLite store with nodes, jobs, an attempt with its runs, events and an alert: its cluster id, job ids."""
    now = time.time()
    async with await Store.open(path) as store:
        health = NodeHealth("gpu01", health=NodeState.UNHEALTHY, reasons=("ecc",), since=now, last_probe=now)
        event = NodeEvent(now, "gpu01", "state-changed", "healthy -> unhealthy", {"to": "unhealthy"})
        await store.save_nodes([(health, [event])], [StoredProbe("gpu01", now, None, {"checks": []})])
        ids = []
        async with store.jobs_tx("fill") as tx:
            for name in ("train", "eval", "sweep"):
                spec = JobSpec.from_json({"name": name, "command": "sleep 1"})
                job = Job(id=0, name=name, owner="ann", uid=1000, spec=spec, status=JobStatus.QUEUED,
                          priority="normal", project="default", access="none", submitted=now)  # fmt: skip
                ids.append(await tx.add_job(job))
            attempt = Attempt(ids[0], 1, None, 1, 29500, now, started=now, token="t0k3n")
            await tx.add_attempt(attempt, [Run(ids[0], 1, 0, "gpu01", (3,), "/runs/1/1/0", True, state="running")])
            await tx.event(now, "Submitted", "submitted by ann", job=ids[0])
            await tx.alert(now, "job_hung", "warning", "job 1 suspected hung", job=ids[0])
        return store.cluster_id, ids


async def test_every_row_is_copied_with_its_ids_and_the_cluster_id_and_ids_go_on_after_them(
    tmp_path: Path, pg_url: str
) -> None:
    source = tmp_path / "state.db"
    cluster_id, ids = await fill(source)
    copied = await copy_store(source, pg_url)
    assert copied.cluster_id == cluster_id and copied.rows["jobs"] == 3 and copied.rows["runs"] == 1
    with sqlite3.connect(source) as db:
        counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in copied.rows}
    assert copied.rows == counts  # every row of every table
    async with await Store.open(source) as old, await Store.open(pg_url) as new:
        assert new.cluster_id == cluster_id  # the run folders on the nodes stay the new store's own
        assert [(j.id, j.name, j.spec) for j in await new.jobs()] == [(j.id, j.name, j.spec) for j in await old.jobs()]
        assert await new.runs(job=ids[0]) == await old.runs(job=ids[0])
        assert await new.attempts(ids[0]) == await old.attempts(ids[0])
        assert await new.node_health("gpu01") == await old.node_health("gpu01")
        assert [(e.kind, e.message) for e in await new.events(limit=100)] == [
            (e.kind, e.message) for e in await old.events(limit=100)
        ]
        assert [a.message for a in await new.alerts()] == ["job 1 suspected hung"]
        async with new.jobs_tx("one more") as tx:
            spec = JobSpec.from_json({"name": "after", "command": "true"})
            job = Job(id=0, name="after", owner="ann", uid=1000, spec=spec, status=JobStatus.QUEUED,
                      priority="normal", project="default", access="none", submitted=time.time())  # fmt: skip
            assert await tx.add_job(job) == max(ids) + 1  # the sequence goes on after the copied ids


async def test_a_target_that_holds_a_store_is_refused_and_keeps_what_it_had(tmp_path: Path, pg_url: str) -> None:
    source = tmp_path / "state.db"
    await fill(source)
    await copy_store(source, pg_url)
    with pytest.raises(StoreError, match=r"holds a store already \(.*3 in jobs.*\): copy only into an empty database"):
        await copy_store(source, pg_url)
    async with await Store.open(pg_url) as store:
        assert len(await store.jobs()) == 3
    with pytest.raises(StoreError, match="no store at"):
        await copy_store(tmp_path / "none.db", pg_url)


def test_the_command_copies_while_no_scheduler_runs_and_refuses_while_one_does(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    config = tmp_path / "cluster.yaml"
    config.write_text(f"state_dir: {state}\nnodes:\n  - name: n1\n")
    asyncio.run(fill(state / "state.db"))
    assert main(["--config", str(config), "state", "copy", "--to", "sqlite:///x.db"]) == 2
    assert "a postgresql:// URL" in capsys.readouterr().err
    with StateLock(state):  # a scheduler on this state_dir
        assert main(["--config", str(config), "state", "copy", "--to", pg_url]) != 0
    assert "already running" in capsys.readouterr().err
    assert main(["--config", str(config), "state", "copy", "--to", pg_url, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["rows"]["jobs"] == 3 and done["target"] == pg_url


@pytest.fixture
def password_role(pg_server: PgServer) -> Iterator[tuple[str, str, Callable[[], str]]]:
    """A role that must give its password (scram-sha-256 in pg_hba.conf, for it alone), and a maker of empty
    databases it owns: (role, password, new database URL without the password)."""
    role, password = f"ftpw{uuid.uuid4().hex[:8]}", "s3cret#p@ss"
    hba = pg_server.root / "data" / "pg_hba.conf"
    kept = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{kept}")
    admin = pg_server.url()
    asyncio.run(raw_sql(admin, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
    asyncio.run(raw_sql(admin, "SELECT pg_reload_conf()"))

    def database() -> str:
        url = pg_server.database()
        name = url.rsplit("/", 1)[1]
        asyncio.run(raw_sql(admin, f"ALTER DATABASE {name} OWNER TO {role}"))
        return url.replace("postgresql://postgres@", f"postgresql://{role}@")

    try:
        yield role, password, database
    finally:
        hba.write_text(kept)
        asyncio.run(raw_sql(admin, "SELECT pg_reload_conf()"))


def test_the_password_of_the_target_comes_from_pgpassword_or_pgpass_not_the_command_line(
    tmp_path: Path,
    password_role: tuple[str, str, Callable[[], str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--to` without a password: PGPASSWORD gives it, else ~/.pgpass (or PGPASSFILE), as for psql; with none
    the copy is refused by the server. A password written in the URL still works, with a warning that ps shows
    it to every user (and the warning does not show it); the help says so."""
    role, password, database = password_role
    state = tmp_path / "state"
    config = tmp_path / "cluster.yaml"
    config.write_text(f"state_dir: {state}\nnodes:\n  - name: n1\n")
    asyncio.run(fill(state / "state.db"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pgpass of the developer's
    for name in ("PGPASSWORD", "PGPASSFILE", "PGUSER", "PGHOST"):
        monkeypatch.delenv(name, raising=False)

    def copy(url: str) -> int:
        return main(["--config", str(config), "state", "copy", "--to", url, "--json"])

    assert copy(database()) != 0  # no password anywhere
    assert "password authentication failed" in capsys.readouterr().err

    monkeypatch.setenv("PGPASSWORD", password)
    url = database()
    assert copy(url) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["target"] == url and "warning" not in err
    monkeypatch.delenv("PGPASSWORD")

    pgpass = tmp_path / ".pgpass"
    pgpass.write_text(f"127.0.0.1:*:*:{role}:{password}\n")
    pgpass.chmod(0o600)
    assert copy(database()) == 0
    capsys.readouterr()
    pgpass.unlink()

    url = database()
    written = url.replace(f"{role}@", f"{role}:{quote(password, safe='')}@")
    assert copy(written) == 0
    out, err = capsys.readouterr()
    assert "visible to every user of this host (ps, /proc)" in err and "PGPASSWORD" in err
    assert "s3cret" not in err + out and json.loads(out)["target"] == url.replace(f"{role}@", f"{role}:***@")

    with pytest.raises(SystemExit):
        main(["state", "copy", "--help"])
    assert "visible to every user of this host (ps, /proc)" in " ".join(capsys.readouterr().out.split())
