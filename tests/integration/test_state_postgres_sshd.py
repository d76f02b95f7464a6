"""The scheduler end to end with its state on PostgreSQL (`state: {url: ...}`): `serve` on a real server the test
starts (tests/pg_server.py) and a real sshd node; a job runs to its end across a restart of the scheduler, the
store's rows are in the database, and state_dir holds no store file."""

from __future__ import annotations

import asyncio

import pytest

from ftconsole.scheduler.store.files import STORE_FILE
from tests.integration.test_scheduler_sshd import (
    WAIT,
    _async,
    finished,
    job,
    log_of,
    poll,
    running,
    until,
    write_config,
)
from tests.pg_server import PgServer, pg_server_fixture, raw_sql  # noqa: F401  (provides the `pg_server` fixture)
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_a_job_runs_across_a_restart_with_the_state_on_postgresql(
    sshd_cluster, tmp_path, sock_dir, pg_server: PgServer
) -> None:
    url = pg_server.database()
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, state={"url": url})
    async with running(loaded) as (scheduler, client):
        assert scheduler.store.path == url
        submitted = await client.call("submit", spec=job("survivor", "sh -c 'sleep 2; echo survived'"))
        await until(client, submitted["id"], lambda j: j["status"] == "running", "running")
    await asyncio.sleep(2.5)  # the scheduler is down; the run goes on on its node
    async with running(loaded) as (scheduler, client):
        assert await poll(lambda: _async(scheduler.loop.adopted_s), lambda s: s is not None, "adoption") < WAIT
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert "survived" in await log_of(client, submitted["id"])
    rows = await raw_sql(url, "SELECT status FROM jobs WHERE id = ?", (submitted["id"],))
    assert rows == [("succeeded",)]
    assert not (loaded.state_dir / STORE_FILE).exists()
