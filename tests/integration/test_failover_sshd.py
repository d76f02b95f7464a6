"""Two head nodes: two `ftconsole serve` on one PostgreSQL store (tests/pg_server.py) and real sshd nodes.

One leads, the other stands by (it answers reads, refuses writes naming the leader, in the CLI too). Jobs are
running, and one more just submitted (being placed or launched), when the leader is killed -9; the standby takes
the lease, re-adopts the runs from the nodes and carries every job to its right end; no rank starts twice (each
start appends its pid to a file on its node, as in test_crash_sshd.py); the old leader, restarted while the new
one leads, stays a standby and says so in its log.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import FtError, NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.store.db import Store
from tests.integration.test_crash_sshd import START, kill, serve
from tests.pg_server import PgServer, pg_server_fixture  # noqa: F401  (provides the `pg_server` fixture)
from tests.sshd_cluster import SshdCluster, pid_alive

pytestmark = pytest.mark.sshd
WAIT = 30.0
LEASE = "3s"  # a standby takes over within 3.6 s of the leader's last renewal (the default, 10 s: within 12 s)

# name -> (spec, the status it must end with, its ranks): each runs across the failover
JOBS: dict[str, tuple[dict[str, Any], str, int]] = {
    "one": ({"command": f"sh -c '{START}; sleep 7'"}, "succeeded", 1),
    "pair": ({"mode": "pytorch", "nodes": 2, "command": f"sh -c '{START}; sleep 7'"}, "succeeded", 2),
    "fails": ({"command": f"sh -c '{START}; sleep 7; exit 3'"}, "error", 1),
}
# submitted just before the kill, on GPUs left free: the leader dies while it places or launches it
LATE: dict[str, tuple[dict[str, Any], str, int]] = {
    "late": ({"command": f"sh -c '{START}; sleep 2'"}, "succeeded", 1),
}


def config(cluster: SshdCluster, root: Path, url: str) -> Path:
    return cluster.write_config(
        root / "cluster.yaml",
        state_dir=str(root / "state"),
        state={"url": url, "lease": LEASE},
        ssh={"python": sys.executable},
        scheduler={"tick": "0.3s", "stop_grace": "1s"},
        api={"socket": str(root / "ft.sock")},
        probes={"interval": "30s"},
    )


async def call(root: Path, op: str, **args: Any) -> Any:
    async with await ApiClient.connect(root / "ft.sock") as client:
        return await client.call(op, **args)


async def role(root: Path) -> dict[str, Any] | None:
    """The `leadership` field of the scheduler's status, or None while it does not answer."""
    try:
        return dict((await call(root, "status"))["leadership"])
    except (TimeoutError, NotRunning, OSError):
        return None


async def until(what: str, check: Any, proc: subprocess.Popen[bytes], root: Path) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {WAIT:g} s\n{(root / 'serve.log').read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            kill(proc)


async def test_the_standby_takes_over_from_a_killed_leader_and_runs_nothing_twice(
    sshd_cluster, tmp_path, pg_server: PgServer
) -> None:
    url = pg_server.database()
    cluster: SshdCluster = sshd_cluster(2, gpus=3)
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    a_conf, b_conf = config(cluster, a_root, url), config(cluster, b_root, url)
    procs = [serve(a_conf, a_root)]
    try:
        await until("a leads", lambda: _is(a_root, "leader"), procs[0], a_root)
        procs.append(serve(b_conf, b_root))
        b = await until("b stands by", lambda: _is(b_root, "standby"), procs[1], b_root)
        assert b["leader"]["socket"] == str(a_root / "ft.sock")
        assert (await call(b_root, "cluster"))["leadership"]["role"] == "standby"  # what the console shows
        # a standby answers reads, refuses writes naming the leader; the CLI exits non-zero
        with pytest.raises(FtError, match=f"standby.*socket {a_root / 'ft.sock'}") as refused:
            await call(b_root, "submit", spec={"name": "nope", "command": "true"})
        assert refused.value.title == "standby"
        cli = subprocess.run(
            [sys.executable, "-m", "ftconsole.cli", "--config", str(b_conf), "stop", "1"],
            capture_output=True, text=True, timeout=WAIT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert cli.returncode != 0 and "is a standby" in cli.stderr, cli.stderr
        ids = {(await call(a_root, "submit", spec={"name": n, **JOBS[n][0]}))["id"]: n for n in JOBS}
        assert sorted(j["id"] for j in await call(b_root, "jobs")) == sorted(ids)  # reads from the store

        async def all_running() -> bool:
            jobs = await call(a_root, "jobs")
            return all(j["status"] == "running" for j in jobs) and all(
                len(list(_starts(cluster, i))) == JOBS[n][2] for i, n in ids.items()
            )

        await until("every job running", all_running, procs[0], a_root)
        late = {(await call(a_root, "submit", spec={"name": n, **LATE[n][0]}))["id"]: n for n in LATE}
        await asyncio.sleep(0.2)  # a tick or so: placed, or its start on the way
        kill(procs[0])  # the leader dies; its runs go on on the nodes
        ids.update(late)
        expected = {**JOBS, **LATE}
        killed = time.monotonic()
        await until("b leads", lambda: _is(b_root, "leader"), procs[1], b_root)
        took = time.monotonic() - killed
        assert took < 3.0 + 0.6 + 6.0, f"took over after {took:.1f} s"  # lease + a check + slack (a busy machine)

        # the old leader restarted while the new one leads: it stands by, refuses writes, says so
        procs[0] = serve(a_conf, a_root)
        a = await until("a stands by", lambda: _is(a_root, "standby"), procs[0], a_root)
        assert a["leader"]["socket"] == str(b_root / "ft.sock") and a["leader"]["epoch"] == 2
        with pytest.raises(FtError, match="is a standby"):
            await call(a_root, "stop", jobs=list(ids))

        async def ended() -> dict[int, str] | None:
            seen = {j["id"]: j["status"] for j in await call(b_root, "jobs")}
            return seen if all(s not in ("queued", "running") for s in seen.values()) else None

        seen = await until("every job ended", ended, procs[1], b_root)
        assert seen == {i: expected[n][1] for i, n in ids.items()}, seen
        for job_id, name in ids.items():
            starts = list(_starts(cluster, job_id))
            assert len(starts) == expected[name][2], f"job {job_id} ({name}): ranks started {starts}"
            assert not any(pid_alive(int(pid)) for pid in starts)
        assert await _is(a_root, "standby")  # still
        log = (a_root / "serve.log").read_text()
        assert "standing by:" in log and "leading: took the lease with epoch 3" not in log
        assert "leading: took the lease with epoch 2" in (b_root / "serve.log").read_text()
        async with await Store.open(url) as store:
            assert await store.runs(held=True) == []
    finally:
        for proc in procs:
            stop(proc)


async def _is(root: Path, want: str) -> dict[str, Any] | None:
    """The scheduler's leadership once it is `want` (a standby: once it has read who leads), else None."""
    got = await role(root)
    return got if got is not None and got["role"] == want and (want == "leader" or got["leader"]) else None


def _starts(cluster: SshdCluster, job_id: int) -> list[str]:
    return [line for h in cluster.homes for f in h.glob(f"starts.{job_id}.*") for line in f.read_text().split()]
