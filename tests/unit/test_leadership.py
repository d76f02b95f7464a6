"""The lease of several schedulers on one PostgreSQL store (scheduler.decide.leadership): its decisions from a
table, pure; then against the real server of tests/pg_server.py: two schedulers contending for the lease (exactly
one leads, the other takes over when it runs out), a write with a stale epoch fails whole, and a standby writes
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from ftconsole.scheduler.decide.leadership import LeaseRow, Step, Timing, decide, fenced
from ftconsole.scheduler.errors import Fenced, FtError, NotLeader
from ftconsole.scheduler.executor import Executor
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, load_config
from ftconsole.scheduler.store.db import Store
from tests.pg_server import PgServer, raw_sql
from tests.tcp_proxy import TcpRelay
from tests.unit.test_jobs import make_job
from tests.unit.test_store_postgres import config_problem

T = Timing(lease_s=10.0, renew_s=2.5, check_s=2.0, margin_s=1.0)  # fences 9 s after its last renewal was sent
ME, OTHER = "me", "other"


def lease(holder: str = OTHER, epoch: int = 3, expires: float = 110.0, now: float = 100.0) -> LeaseRow:
    return LeaseRow(holder, epoch, expires, "head-b", "/run/ft.sock", now)


CASES = [
    # (what, the lease as read (None: no answer), my epoch (None: standing by), seconds since my renewal was sent, step)
    ("a standby, another's lease running", lease(), None, None, Step.STAND_BY),
    ("a standby, the database silent", None, None, None, Step.STAND_BY),
    ("a standby, the lease ran out", lease(expires=99.0), None, None, Step.TAKE_OVER),
    ("a standby, the lease runs out this instant", lease(expires=100.0), None, None, Step.TAKE_OVER),
    ("a standby, nobody ever led", lease(holder="", epoch=0, expires=0.0), None, None, Step.TAKE_OVER),
    ("a standby, the lease let go", lease(holder="", expires=100.0), None, None, Step.TAKE_OVER),
    # restarted on the same state_dir (its lock: the one before is gone), or fenced and nobody took it since
    ("a standby finds its own old lease still running", lease(holder=ME), None, None, Step.TAKE_OVER),
    ("a leader within its time", lease(holder=ME), 3, 2.5, Step.RENEW),
    ("a leader, the database silent, within its time", None, 3, 5.0, Step.HOLD),
    ("a leader, the database silent, its time out", None, 3, 9.0, Step.FENCE),
    ("a leader whose renewals did not answer for long, the row still its", lease(holder=ME), 3, 9.5, Step.FENCE),
    ("a leader that never renewed", lease(holder=ME), 3, None, Step.FENCE),
    ("a leader whose lease another took", lease(holder=OTHER, epoch=4), 3, 1.0, Step.FENCE),
    ("a leader finds a newer epoch of its own id", lease(holder=ME, epoch=4), 3, 1.0, Step.FENCE),
    ("a leader whose row expired on the server (late renewal)", lease(holder=ME, expires=99.0), 3, 2.0, Step.RENEW),
]


@pytest.mark.parametrize(("what", "row", "mine", "since", "step"), CASES, ids=[c[0] for c in CASES])
def test_the_next_step(what: str, row: LeaseRow | None, mine: int | None, since: float | None, step: Step) -> None:
    assert decide(row, ME, mine, since, T) is step


@pytest.mark.parametrize(("since", "out"), [(None, True), (0.0, False), (8.99, False), (9.0, True), (30.0, True)])
def test_a_leader_fences_itself_before_its_lease_can_run_out(since: float | None, out: bool) -> None:
    assert fenced(since, T) is out


def test_the_default_timing_takes_over_within_15_s() -> None:
    t = Timing.of(10.0)
    assert (t.lease_s, t.renew_s, t.check_s, t.margin_s) == (10.0, 2.5, 2.0, 1.0)
    assert t.lease_s + t.check_s <= 15  # the last renewal's lease, then a standby's next check
    assert t.fence_after < t.lease_s and t.renew_s * 3 < t.fence_after  # two renewals may fail before it fences
    short = Timing.of(2.0)
    assert short.check_s == 0.4 and short.margin_s == 0.2


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ({"url": "postgresql://ft@db/ft", "lease": "4s"}, None),
        (
            {"url": "postgresql://ft@db/ft", "lease": "1s"},
            "must be at least 2s (a duration such as 30s, 5m, 2h), not 1s",
        ),
        ({"lease": "10s"}, "SQLite in state_dir, has one scheduler and no lease"),
    ],
)
def test_the_lease_setting(tmp_path, state: dict[str, str], problem: str | None) -> None:
    if problem is None:
        assert ClusterConfig.model_validate({"state": state}).state.lease == 4.0  # type: ignore[union-attr]
        return
    found = config_problem(tmp_path, f"nodes: [{{name: n1}}]\nstate: {json.dumps(state)}\n")
    assert found.line == 2 and found.path.startswith("state") and problem in found.message


# -- against a real PostgreSQL server ------------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.database()


def leadership(url: str, host: str, lease_s: float = 2.0):  # type: ignore[no-untyped-def]
    from ftconsole.scheduler.serve.leadership import Leadership
    from ftconsole.scheduler.store.lease import LeaseTable

    return Leadership(LeaseTable(url), host=host, socket=f"/run/{host}.sock", timing=Timing.of(lease_s))


async def test_two_schedulers_contend_exactly_one_leads_and_the_other_takes_over_when_it_runs_out(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with await Store.open(pg_url):  # the lease's table is made with the store
        pass
    a, b = leadership(pg_url, "head-a"), leadership(pg_url, "head-b")
    try:
        steps = await asyncio.wait_for(asyncio.gather(a.step(), b.step()), 30)
        assert sorted(s.value for s in steps) == ["stand by", "take over"]
        leader, standby = (a, b) if a.leading() else (b, a)
        assert leader.leading() and not standby.leading() and leader.epoch == 1 and standby.epoch is None
        for _ in range(3):  # renewals keep it; the standby keeps standing by
            assert await asyncio.wait_for(leader.step(), 10) is Step.RENEW
            assert await asyncio.wait_for(standby.step(), 10) is Step.STAND_BY
        assert standby.to_json() == {
            "role": "standby",
            "epoch": None,
            "leader": {"host": leader.host, "socket": leader.socket, "epoch": 1},
        }
        assert "the leader is on " + leader.host in standby.refusal("submit")
        # the leader goes silent (dead, or cut off): by its own clock it stops acting before the lease runs out
        await asyncio.sleep(leader.timing.fence_after)
        assert not leader.leading()
        await asyncio.sleep(leader.timing.margin_s + 0.1)
        assert await asyncio.wait_for(standby.step(), 10) is Step.TAKE_OVER
        assert standby.leading() and standby.epoch == 2
        # the old leader comes back: its epoch is stale, it stands by and says why
        assert await asyncio.wait_for(leader.step(), 10) is Step.FENCE
        assert leader.epoch is None and not leader.leading()
        assert f"the lease is held by {standby.host}, socket {standby.socket}, with epoch 2: my epoch 1 is stale" in (
            caplog.text
        )
        assert await asyncio.wait_for(leader.step(), 10) is Step.STAND_BY
        rows = await raw_sql(pg_url, "SELECT holder, epoch, host FROM ftconsole_lease")
        assert rows == [(standby.me, 2, standby.host)]
    finally:
        await a.table.close()
        await b.table.close()


async def test_a_write_with_a_stale_epoch_fails_whole_and_a_standby_writes_nothing(pg_url: str) -> None:
    async with await Store.open(pg_url) as old, await Store.open(pg_url) as new:
        a, b = leadership(pg_url, "head-a", lease_s=10.0), leadership(pg_url, "head-b", lease_s=10.0)
        try:
            assert await a.step() is Step.TAKE_OVER
            old.fence(a.epoch)
            async with old.jobs_tx("submit") as tx:
                await tx.add_job(make_job())
            await raw_sql(pg_url, "UPDATE ftconsole_lease SET expires = 0")  # as if a's renewals stopped long ago
            assert await b.step() is Step.TAKE_OVER and b.epoch == 2
            new.fence(b.epoch)
            with pytest.raises(NotLeader, match="does not hold the lease"):
                async with old.jobs_tx("submit") as tx:
                    await tx.add_job(make_job())
            new.fence(-1)  # a standby
            with pytest.raises(NotLeader):
                async with new.jobs_tx("submit") as tx:
                    await tx.add_job(make_job())
            assert await raw_sql(pg_url, "SELECT count(*) FROM jobs") == [(1,)]
            new.fence(b.epoch)  # the leader writes; the old one's connection is fine after its refusal
            async with new.jobs_tx("submit") as tx:
                await tx.add_job(make_job())
            assert len(await old.jobs()) == 2
        finally:
            await a.table.close()
            await b.table.close()


async def test_a_takeover_waits_for_a_write_transaction_under_way_which_commits_whole(pg_url: str) -> None:
    async with await Store.open(pg_url) as old:
        a, b = leadership(pg_url, "head-a", lease_s=10.0), leadership(pg_url, "head-b", lease_s=10.0)
        try:
            assert await a.step() is Step.TAKE_OVER
            old.fence(a.epoch)
            await raw_sql(pg_url, "UPDATE ftconsole_lease SET expires = 0")
            order: list[str] = []
            async with old.jobs_tx("submit") as tx:  # holds the write lock: the takeover waits for its commit
                taking = asyncio.create_task(b.step())
                await asyncio.sleep(0.5)
                assert not taking.done()
                await tx.add_job(make_job())
                order.append("written")
            assert await asyncio.wait_for(taking, 10) is Step.TAKE_OVER
            assert await raw_sql(pg_url, "SELECT count(*) FROM jobs") == [(1,)] and order == ["written"]
        finally:
            await a.table.close()
            await b.table.close()


async def test_a_fenced_executor_sends_no_node_command() -> None:
    """The loop's one seam to the nodes (`Executor._ask`) asks `may_act` first: a command not sent raises Fenced
    (no FtError: the loop records nothing of it), and the command's coroutine is closed, never run."""
    ran: list[str] = []

    async def command() -> str:
        ran.append("sent")
        return "answer"

    async def ask(name: str, work: Any, heartbeat: bool = True) -> Any:
        return await work

    fake = SimpleNamespace(may_act=lambda: False, tracker=SimpleNamespace(ask=ask))
    node = SimpleNamespace(name="gpu01")
    work = command()
    with pytest.raises(Fenced, match="gpu01: not sent"):
        await Executor._ask(fake, node, work)  # type: ignore[arg-type]
    assert ran == [] and work.cr_frame is None  # closed
    assert not isinstance(Fenced("x"), FtError)
    fake.may_act = lambda: True
    assert await Executor._ask(fake, node, command()) == "answer"  # type: ignore[arg-type]
    assert ran == ["sent"]


@pytest.mark.parametrize(
    ("cluster", "text"),
    [
        ({}, ""),
        ({"leadership": {"role": "leader", "epoch": 2, "leader": None}}, ""),
        ({"leadership": {"role": "standby", "epoch": None, "leader": None}}, " · standby (no leader now)"),
        (
            {"leadership": {"role": "standby", "leader": {"host": "head-a", "socket": "/s", "epoch": 2}}},
            " · standby (leader: head-a, /s)",
        ),
    ],
)
def test_the_console_says_it_is_on_a_standby(cluster: dict[str, Any], text: str) -> None:
    from ftconsole.tui.views import _standby_text

    assert _standby_text(cluster) == text


async def test_a_leader_cut_off_from_the_database_stops_acting_before_a_standby_takes_over(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The network between the leader and the database is cut (a TCP relay that stops relaying and leaves its
    connections open, as a partition does: the leader's statements go unanswered). The leader stops acting by its
    own clock, and only later does the standby, on the server's clock, take the lease. The network mended, the
    old leader reads who leads now and stands by."""
    caplog.set_level(logging.INFO, logger="ftconsole.daemon")
    async with await Store.open(pg_url):
        pass
    port = urlsplit(pg_url).port
    loop = asyncio.get_running_loop()
    async with TcpRelay(int(port or 0)) as relay:
        a = leadership(pg_url.replace(f":{port}/", f":{relay.port}/"), "head-a")  # a 2 s lease
        b = leadership(pg_url, "head-b")
        stop = asyncio.Event()
        try:
            assert await a.step() is Step.TAKE_OVER
            runs = [asyncio.create_task(a.run(stop)), asyncio.create_task(b.run(stop))]
            await asyncio.sleep(1.0)  # a renews, b stands by
            assert a.leading() and not b.leading()
            relay.cut()
            cut = loop.time()
            await asyncio.wait_for(a.wait_lost(), 10)
            a_stopped = loop.time()
            assert not b.leading()  # a stopped first
            await asyncio.wait_for(b.wait_leading(stop), 10)
            b_leads = loop.time()
            assert a_stopped - cut < a.timing.lease_s and a_stopped < b_leads and b.epoch == 2
            relay.mend()
            deadline = loop.time() + 20
            while "standing by: head-b leads" not in caplog.text:
                assert loop.time() < deadline, "the old leader never read the lease again"
                await asyncio.sleep(0.1)
            assert not a.leading() and b.leading() and a.epoch is None and a.row is not None and a.row.epoch == 2
            stop.set()
            await asyncio.wait_for(asyncio.gather(*runs), 20)
        finally:
            stop.set()
            relay.mend()
            await a.table.close()
            await b.table.close()


def head_config(root: Path, sock_dir: Path, name: str, url: str) -> LoadedConfig:
    """A head node's config on the shared store: its own state_dir and socket, one node that is never reached."""
    (root / name).mkdir()
    config = {
        "state_dir": str(root / name / "state"),
        "nodes": [{"name": "n1", "host": "127.0.0.1", "port": 1}],
        "api": {"socket": str(sock_dir / f"{name}.sock")},
        "state": {"url": url},
    }
    (root / name / "cluster.yaml").write_text(yaml.safe_dump(config))
    return load_config(root / name / "cluster.yaml")


async def test_a_scheduler_started_here_on_a_standby_refuses_changes_naming_the_leader(
    pg_url: str, tmp_path: Path, sock_dir: Path
) -> None:
    """The console or the CLI with no scheduler of its own starts one in its process (`scheduler_here`); on a
    standby, what it asks is answered as the standby's API answers it: the refusal names the leader."""
    from ftconsole.scheduler.serve.client import scheduler_here

    async with leader_serving(tmp_path, sock_dir, pg_url) as leader_conf:
        async with scheduler_here(head_config(tmp_path, sock_dir, "head-b", pg_url)) as here:
            status = await asyncio.wait_for(here.call("status"), 30)
            assert status["leadership"]["role"] == "standby"
            assert status["leadership"]["leader"]["socket"] == str(leader_conf.socket_path)
            with pytest.raises(NotLeader, match=f"the leader is on .*, socket {leader_conf.socket_path}"):
                await here.call("submit", spec={"name": "j", "command": "true"})
            # only the leader acts on the nodes: a standby's debug would run py-spy there as the SSH account
            with pytest.raises(NotLeader, match=f"socket {leader_conf.socket_path}"):
                await here.call("debug", job=1)
        assert await raw_sql(pg_url, "SELECT count(*) FROM jobs") == [(0,)]


@contextlib.asynccontextmanager
async def leader_serving(tmp_path: Path, sock_dir: Path, pg_url: str) -> AsyncIterator[LoadedConfig]:
    """`serve` of head-a in this process, leading on the store (probes off); stopped on the way out."""
    from ftconsole.scheduler.serve.daemon import serve

    leader_conf = head_config(tmp_path, sock_dir, "head-a", pg_url)
    stop = asyncio.Event()
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    leader = asyncio.create_task(serve(leader_conf, stop, ready=ready.set_result, probe=False))
    try:
        await asyncio.wait_for(asyncio.shield(ready), 30)
        yield leader_conf
    finally:
        stop.set()
        await asyncio.wait_for(leader, 30)


async def test_the_console_on_a_standby_head_node_says_so_and_refuses_changes_naming_the_leader(
    pg_url: str, tmp_path: Path, sock_dir: Path
) -> None:
    """The console with no scheduler serving its state_dir runs one embedded: on a standby, its cluster view says
    "standby (leader: ...)" and a change made from it is refused naming the leader."""
    from ftconsole.tui.app import ConsoleApp
    from ftconsole.tui.views import ClusterView

    async with leader_serving(tmp_path, sock_dir, pg_url) as leader_conf:
        app = ConsoleApp(head_config(tmp_path, sock_dir, "head-b", pg_url), refresh_s=0.2)
        async with app.run_test(size=(160, 40)) as pilot:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while "leadership" not in (app.feed.cluster or {}):
                assert loop.time() < deadline, "timed out waiting for the console's cluster view"
                if app.client is not None:
                    await app.refresh_data("cluster")
                await pilot.pause(0.1)
            assert app.scheduler_mode == "embedded"
            summary = str(app.query_one("#cluster", ClusterView).summary(app.feed, 0.0))
            assert f"· standby (leader: {app.feed.cluster['leadership']['leader']['host']}, " in summary
            assert f"{leader_conf.socket_path})" in summary
            with pytest.raises(NotLeader, match=f"socket {leader_conf.socket_path}"):
                await app.client.call("submit", spec={"name": "j", "command": "true"})
        assert await raw_sql(pg_url, "SELECT count(*) FROM jobs") == [(0,)]


def test_the_lease_holder_id_is_kept_in_state_dir(tmp_path: Path, sock_dir: Path) -> None:
    """A scheduler restarted on the same state_dir is the same holder (it takes its lease back at once); another
    head node's state_dir is another."""
    from ftconsole.scheduler.serve.leadership import HOLDER_FILE, holder_id

    a = head_config(tmp_path, sock_dir, "head-a", "postgresql://x@127.0.0.1/db")
    b = head_config(tmp_path, sock_dir, "head-b", "postgresql://x@127.0.0.1/db")
    for loaded in (a, b):
        loaded.state_dir.mkdir(mode=0o700)
    first = holder_id(a, "vm")
    assert first.startswith("vm/") and holder_id(a, "vm") == first
    assert holder_id(b, "vm") != first
    assert (a.state_dir / HOLDER_FILE).stat().st_mode & 0o777 == 0o600
