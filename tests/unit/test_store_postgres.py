"""The store on PostgreSQL (`state: {url: postgresql://...}`), against a real server the tests start
(tests/pg_server.py), beyond the store suite that runs on both engines (tests/unit/test_store*.py): the schema is
SQLite's, the write lock spans processes, another process's write is seen and one's own is not counted twice, a
lost connection is a StoreError, the metrics read it, and `config check` names the server's version. Without
PostgreSQL installed the tests that need a server skip, saying why."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from ftconsole.cli import main
from ftconsole.scheduler.decide.jobs import JobStatus
from ftconsole.scheduler.errors import ConfigError, Problem, StoreError
from ftconsole.scheduler.serve import metrics
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict
from ftconsole.scheduler.store.postgres import PostgresEngine, numbered, redact
from ftconsole.scheduler.store.schema import SCHEMA_VERSION
from tests.pg_server import PgServer, raw_sql
from tests.unit.test_jobs import make_job
from tests.unit.test_metrics import fill

# -- pure: placeholders, URLs, the config key ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        ("SELECT * FROM jobs WHERE id = ?", "SELECT * FROM jobs WHERE id = $1"),
        ("UPDATE t SET a = ?, b = ? WHERE c IN (?,?)", "UPDATE t SET a = $1, b = $2 WHERE c IN ($3,$4)"),
        ("SELECT '?' FROM t WHERE a = ? AND \"b?\" = ?", "SELECT '?' FROM t WHERE a = $1 AND \"b?\" = $2"),
        ("SELECT 1", "SELECT 1"),
    ],
)
def test_placeholders_are_numbered_outside_quotes(sql: str, want: str) -> None:
    assert numbered(sql) == want


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("postgresql://ft@db:5432/ft", "postgresql://ft@db:5432/ft"),
        ("postgresql://ft:s3cret@db:5432/ft", "postgresql://ft:***@db:5432/ft"),
        ("postgres://ft:p%40ss@db/ft?sslmode=require", "postgres://ft:***@db/ft?sslmode=require"),
        ("postgresql://ft@db/ft?password=s3cret&sslmode=require", "postgresql://ft@db/ft?password=***&sslmode=require"),
        ("postgresql://db/ft", "postgresql://db/ft"),
        ("postgresql://ft@db:5432,db2:5433/ft?sslmode=verify-full&target_session_attrs=read-write", None),
        ("postgresql://ft@db/ft?passfile=/etc/ftconsole/pgpass", None),  # a path, not a secret
        # the client key's password (libpq's and asyncpg's sslpassword)
        ("postgresql://ft@db/ft?sslmode=verify-full&sslkey=/k.pem&sslpassword=k3y",
         "postgresql://ft@db/ft?sslmode=verify-full&sslkey=/k.pem&sslpassword=***"),
        ("postgresql://ft@db/ft?sslpassword=k3y", "postgresql://ft@db/ft?sslpassword=***"),
        # a parameter's name percent-encoded is the same parameter to asyncpg (parse_qs decodes it)
        ("postgresql://ft@db/ft?pass%77ord=s3cret", "postgresql://ft@db/ft?pass%77ord=***"),
        ("postgresql://ft@db/ft?%73slpassword=k3y&PASSWORD=x", "postgresql://ft@db/ft?%73slpassword=***&PASSWORD=***"),
        # percent-encoded user names and passwords: the user as given, none of the password
        ("postgresql://ann%40corp:p%3A%2Fss@db/ft", "postgresql://ann%40corp:***@db/ft"),
        ("postgresql://ann%40corp@db/ft", None),
        ("postgresql://%61nn:%73%33cret@db/ft", "postgresql://%61nn:***@db/ft"),
        ("postgresql://ft:@db/ft", "postgresql://ft:***@db/ft"),
        ("postgresql://:s3cret@db/ft", "postgresql://:***@db/ft"),
        # a password with a character that a URL's parser reads as its end: none of it shows in any reading
        ("postgresql://ft:pa#ss@db:5432/ft", "postgresql://ft:***@db:5432/ft"),
        ("postgresql://ft:#s3cret@db/ft?sslmode=require", "postgresql://ft:***@db/ft?sslmode=require"),
        ("postgresql://ft:p@ss@db/ft", "postgresql://ft:***@db/ft"),
        ("postgresql://ft:pa?ss@db/ft", "postgresql://ft:***@db/ft"),
        ("postgresql://ft:pa?x=1@db/ft", "postgresql://ft:***@db/ft"),
        ("postgresql://ft:pa/ss@db/ft?sslmode=require", "postgresql://ft:***@db/ft?sslmode=require"),
        ("postgresql://ft@db/ft?password=a#b&sslmode=require", "postgresql://ft@db/ft?password=***&sslmode=require"),
        ("postgresql://db?password=s3cret@x", "postgresql://db?password=***"),
        ("postgresql://db/ft?user=ann@corp&password=s3cret", "postgresql://db/ft?user=ann@corp&password=***"),
    ],
)  # fmt: skip
def test_a_url_is_shown_without_its_password(url: str, want: str | None) -> None:
    assert redact(url) == (url if want is None else want)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://ftconsole@db.example:5432/ftconsole", None),
        ("postgres://ft@/ft?host=/run/postgresql", None),
        ("sqlite:///var/lib/ftconsole/state.db", "give a PostgreSQL URL"),
        ("mysql://ft@db/ft", "give a PostgreSQL URL"),
        ("db.example:5432", "give a PostgreSQL URL"),
        ("postgresql://", "give a PostgreSQL URL"),
        ("postgresql://ft@db:99999/ft", "is not a URL"),
        (5432, "give a PostgreSQL URL"),
        # the problem never shows a password (config check prints it)
        ("mysql://ft:s3cret@db/ft", "give a PostgreSQL URL"),
        ("postgresql://ft:s3cret@db:99999/ft", "is not a URL"),
        ("sqlite:///x?password=s3cret", "give a PostgreSQL URL"),
    ],
)
def test_the_state_url_must_be_postgresql(tmp_path: Path, url: object, problem: str | None) -> None:
    if problem is None:
        assert ClusterConfig.model_validate({"state": {"url": url}}).state is not None
        return
    found = config_problem(tmp_path, f"nodes: [{{name: n1}}]\nstate:\n  url: {json.dumps(url)}\n")
    assert (found.line, found.path) == (3, "state.url") and problem in found.message
    assert "s3cret" not in found.message, found.message


def config_problem(tmp_path: Path, text: str) -> Problem:
    """The one problem a cluster config of `text` has, as `config check` reports it (with its line)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    data, marks = yamlfile.load(path)
    with pytest.raises(ConfigError) as caught:
        yamlfile.validate(ClusterConfig, data, str(path), marks)
    (found,) = caught.value.problems
    return found


# -- on a real server -----------------------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.database()


async def test_the_schema_is_sqlites_with_postgresqls_types(pg_url: str, tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "state.db"), await Store.open(pg_url) as store:
        assert await store.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(tmp_path / "state.db") as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        sqlite = {
            (t, c[1]): c[2] for t in tables if t != "sqlite_sequence" for c in db.execute(f"PRAGMA table_info({t})")
        }
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    rows = await raw_sql(
        pg_url,
        "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = 'public' "
        "AND table_name NOT IN ('ftconsole_store', 'ftconsole_lease')",  # PostgreSQL's own: no SQLite twin
    )
    postgres = {(t, c): kind for t, c, kind in rows}
    assert postgres.keys() == sqlite.keys()
    same = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text"}
    assert {k: same[v] for k, v in sqlite.items()} == postgres
    found = {r[0] for r in await raw_sql(pg_url, "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
    assert indexes <= found


async def test_a_version_2_store_is_migrated_with_its_history(pg_url: str) -> None:
    """Migrations 3 and 5 use SQLite functions that PostgreSQL spells its own way (the faults counted from the
    events' JSON, a job's last change, the cluster id): on PostgreSQL too they keep every row and fill the new
    columns."""
    engine = await PostgresEngine.connect(pg_url)
    try:
        for number in (1, 2):
            await engine.migrate(number)
        spec = json.dumps(make_job().spec.to_json())
        await engine.execute(
            "INSERT INTO jobs (name, owner, uid, spec, status, priority, project, access, submitted, started, ended) "
            "VALUES ('old', 'ann', 1000, ?, 'error', 'normal', 'default', 'none', 10.0, 20.0, 30.0)",
            (spec,),
        )
        await engine.execute("INSERT INTO nodes (name, health, reasons) VALUES ('gpu01', 'healthy', '[]')")
        for to in ("unreachable", "healthy", "unhealthy"):
            await engine.execute(
                "INSERT INTO events (time, kind, node, message, data) VALUES (1.0, 'state-changed', 'gpu01', '', ?)",
                (json.dumps({"to": to}),),
            )
        await engine.execute("INSERT INTO events (time, kind, node, message) VALUES (2.0, 'isolated', 'gpu01', 'x')")
    finally:
        await engine.close()
    async with await Store.open(pg_url) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        assert len(store.cluster_id) == 12 and int(store.cluster_id, 16) >= 0
        (job,) = await store.jobs()
        assert (job.name, job.status.value, job.scaled_to) == ("old", "error", None)
        assert await store.node_faults() == {"gpu01": 3}
        assert [j.id for j in (await store.jobs_changed(29.0))[1]] == [job.id]  # updated: its latest own time
        assert (await store.jobs_changed(30.5))[1] == []


async def test_two_processes_opening_a_new_database_at_once_make_one_store(pg_url: str) -> None:
    a, b = await asyncio.wait_for(asyncio.gather(Store.open(pg_url), Store.open(pg_url)), 60)
    try:
        assert a.cluster_id == b.cluster_id and await a.schema_version() == SCHEMA_VERSION
    finally:
        await a.close()
        await b.close()


async def test_two_processes_write_one_at_a_time_and_a_conditional_write_sees_the_other(pg_url: str) -> None:
    async with await Store.open(pg_url) as a, await Store.open(pg_url) as b:
        assert a.cluster_id == b.cluster_id
        async with a.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(status=JobStatus.QUEUED))
        entered = asyncio.Event()
        order: list[str] = []

        async def first() -> None:
            async with a.jobs_tx("place") as tx:
                entered.set()
                await asyncio.sleep(0.3)  # b's transaction waits for the write lock meanwhile
                await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING, attempt=1)
                order.append("a")

        async def second() -> None:
            await entered.wait()
            with pytest.raises(Conflict):  # it read after a's commit: the job is no longer queued
                async with b.jobs_tx("stop") as tx:
                    order.append("b")
                    await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.STOPPED)

        await asyncio.wait_for(asyncio.gather(first(), second()), 30)
        assert order == ["a", "b"]
        assert (await b.job(job_id)).status is JobStatus.RUNNING  # type: ignore[union-attr]


async def test_refresh_counts_another_processs_writes_not_its_own(pg_url: str, monkeypatch) -> None:
    async with await Store.open(pg_url) as store, await Store.open(pg_url) as other:
        async with store.jobs_tx("submit") as tx:
            await tx.add_job(make_job())
        queries: list[object] = []
        real = store._jobs

        async def counting(*args):  # type: ignore[no-untyped-def]
            queries.append(args)
            return await real(*args)

        monkeypatch.setattr(store, "_jobs", counting)
        await store.refresh()
        await store.jobs()
        await store.refresh()  # its own write was counted at its commit: nothing to read again
        await store.jobs()
        assert len(queries) == 1
        async with other.jobs_tx("urgent") as tx:
            await tx.update_job(1, priority="urgent")
        await store.refresh()
        assert [j.priority for j in await store.jobs()] == ["urgent"] and len(queries) == 2


async def test_a_lost_connection_fails_its_transaction_whole_and_the_next_one_connects_again(pg_url: str) -> None:
    kill = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'ftconsole' AND datname = current_database()"
    )
    async with await Store.open(pg_url) as store:
        with pytest.raises(StoreError, match=r"cannot submit in postgresql://postgres@127\.0\.0\.1:"):
            async with store.jobs_tx("submit") as tx:
                await tx.add_job(make_job())
                await raw_sql(pg_url, kill)  # the server restarted, the network broke...
                await tx.add_job(make_job())  # never written alone, outside the transaction
        assert await store.jobs() == []  # a new connection: nothing of the transaction was kept
        async with store.jobs_tx("submit again") as tx:
            await tx.add_job(make_job())
        await raw_sql(pg_url, kill)  # lost between transactions: the next read connects again
        await asyncio.sleep(0.2)
        assert len(await store.jobs(statuses=[JobStatus.RUNNING])) == 1


async def test_a_missing_database_is_refused_naming_it(pg_server: PgServer) -> None:
    with pytest.raises(StoreError, match=r"cannot open postgresql://postgres@127\.0\.0\.1:\d+/nowhere: .*nowhere"):
        await Store.open(pg_server.url("nowhere"))


async def test_the_metrics_read_a_postgresql_store_and_cannot_write(pg_url: str) -> None:
    async with await Store.open(pg_url) as store:
        await fill(store)
        counts = await metrics.StoreCounts.open(store.path)
        try:
            got = await counts.counts()
            assert got.jobs == {"queued": 3, "running": 1, "error": 1, "succeeded": 1}
            assert got.restarts == {"restarted": 2, "requeued": 1, "shrunk": 1}
            with pytest.raises(Exception, match="read-only transaction"):
                await counts._db.execute("DELETE FROM jobs")
        finally:
            await counts.close()


def test_config_check_names_the_server_and_its_version(pg_url: str, tmp_path: Path, capsys) -> None:
    config = tmp_path / "cluster.yaml"
    (tmp_path / "known_hosts").touch()  # config check refuses a strict known_hosts that does not exist
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nssh: {{known_hosts: known_hosts}}\n"
        f"state:\n  url: {pg_url}\nnodes:\n  - name: n1\n"
    )
    assert main(["--config", str(config), "config", "check"]) == 0
    out = capsys.readouterr().out
    assert "state: PostgreSQL 1" in out and f"{pg_url} (no store there yet" in out
    assert "cluster id: none yet" in out
    asyncio.run(_open_and_close(pg_url))
    assert main(["--config", str(config), "config", "check", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state"]["engine"] == "postgresql" and got["state"]["url"] == pg_url
    assert len(got["cluster_id"]) == 12 and got["state"]["server_version"].split(".")[0].isdigit()


def test_config_check_says_when_the_server_cannot_be_reached(tmp_path: Path, capsys) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("state:\n  url: postgresql://ft:s3cret@127.0.0.1:1/ft\nnodes:\n  - name: n1\n")
    assert main(["--config", str(config), "config", "check"]) == 2
    err = capsys.readouterr().err
    assert f"{config}:2: state.url: cannot reach the PostgreSQL server of postgresql://ft:***@127.0.0.1:1/ft" in err
    assert "s3cret" not in err


async def _open_and_close(url: str) -> None:
    async with await Store.open(url):
        pass
