"""Expected starts on real sshd nodes (`forecast` op, `ftconsole jobs --start`): a job running under its time
limit on one of two nodes; a two-node job queued behind it is expected when that limit ends, and a job without
a time limit after that one; what another user may not see is left out."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import forecasting
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve.daemon import Operations
from tests.integration.test_scheduler_sshd import as_nobody, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd
ROOT = Caller(uid=0, gid=0, pid=os.getpid(), user="root")


async def cli(config: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ftconsole.cli", *args, env={**os.environ, "FTCONSOLE_CONFIG": str(config)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_expected_starts_follow_the_time_limits(sshd_cluster: Any, tmp_path: Path, sock_dir: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)  # another user reaches the socket
    async with running(loaded) as (_, client):
        first = await client.call("submit", spec=job("first", "sleep 300", gpus_per_node=2, max_runtime="1h"))
        first = await until(client, first["id"], lambda j: j["status"] == "running", "the first job to run")
        both = await client.call(
            "submit", spec=job("both", "sleep 300", mode="pytorch", nodes=2, gpus_per_node=2, max_runtime="10m")
        )
        endless = await client.call("submit", spec=job("endless", "sleep 300", gpus_per_node=2))
        found = await poll(
            lambda: client.call("forecast"),
            lambda d: [e["id"] for e in d["queued"]] == [both["id"], endless["id"]],
            "both queued jobs in the forecast",
        )
        limit = first["started"] + 3600
        assert found["running"] == [{"id": first["id"], "end": pytest.approx(limit)}]
        head, after = found["queued"]
        assert head["start"] == pytest.approx(limit, abs=61) and head["nodes"] == ["node01", "node02"]
        assert head["end"] == pytest.approx(head["start"] + 600)
        assert after["start"] == pytest.approx(head["end"], abs=61) and after["end"] is None
        assert len(after["nodes"]) == 1 and found["complete"]
        assert found["nodes"] == {"node01": "default", "node02": "default"}  # each node's pool
        assert found["beyond"]["count"] == 0 and "ids" not in found["beyond"]  # none past the queue depth
        # the job that was running is not used for a backfill of the endless one: it waits, as a pass decides
        shown = await client.call("show", job=endless["id"])
        assert shown["status"] == "queued"

        code, out, err = await cli(loaded.file, "jobs", "--start")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].split()[:3] == ["ID", "NAME", "OWNER"] and "START" in lines[0]
        rows = {line.split()[0]: line for line in lines[1:]}
        assert set(rows) == {str(both["id"]), str(endless["id"])}
        assert "node[01-02]" in rows[str(both["id"])]
        code, out, _ = await cli(loaded.file, "jobs", "--start", "--json")
        assert code == 0 and [e["id"] for e in json.loads(out)["queued"]] == [both["id"], endless["id"]]

        # a job that waits for its begin: time joins the forecast then; short enough to go before the head's start
        soon = await client.call(
            "submit", spec=job("soon", "sleep 300", gpus_per_node=2, max_runtime="10m", begin="+30m")
        )
        found = await poll(
            lambda: client.call("forecast"),
            lambda d: any(e["id"] == soon["id"] and e["start"] for e in d["queued"]),
            "the job with begin: in the forecast",
        )
        mine = next(e for e in found["queued"] if e["id"] == soon["id"])
        assert mine["start"] == pytest.approx(soon["submitted"] + 1800, abs=61) and mine["nodes"] == ["node02"]
        assert [e["start"] for e in found["queued"][:2]] == [head["start"], after["start"]]  # the others as before

        # another user sees none of these private jobs (access: none, the default), nor their times
        theirs = (await as_nobody(loaded.socket_path, "forecast"))["result"]
        assert theirs["queued"] == [] and theirs["running"] == []
        await client.call("stop", jobs=[first["id"], both["id"], endless["id"], soon["id"]])


async def test_asking_for_expected_starts_writes_nothing(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forecast is a read, which a standby answers too: it takes the queue as a pass does, but folds no usage
    into the ledger (a pass's write) and leaves the pass's notes of reserved nodes alone. Of the jobs that wait for
    something else, it lists at most LISTED and counts the rest."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    fair = {"fairshare": {"half_life": "1h", "every": "0.1s"}}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=fair)
    async with ClusterService.open(loaded) as service:
        scheduler = Scheduler(service)
        ops = Operations(scheduler)
        await scheduler.submit(ROOT, job("waits", "true", gpus_per_node=1))
        scheduler.loop.placer._kept_off = {999: "the pass's"}
        assert await service.store.read_ledger() is None
        for name in ("after-1", "after-2"):
            await scheduler.submit(ROOT, job(name, "true", gpus_per_node=1, after={"ok": [1]}))
        monkeypatch.setattr(forecasting, "LISTED", 1)
        found = await ops(ROOT, "forecast", {})
        assert [e["id"] for e in found["queued"]] == [1, 2]  # planned, then one of the two waiting for job 1
        assert found["beyond"] == {"count": 1, "message": forecasting.UNLISTED}
        assert await service.store.read_ledger() is None
        assert scheduler.loop.placer._kept_off == {999: "the pass's"}
