"""Reservations end to end on real sshd nodes: a job that names one waits for its window and runs on its node
only; other jobs keep off reserved nodes, and off those whose reservation they would run into, saying so;
submit and create refuse what can never be; only admins reserve."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def nodes_of(shown: dict[str, Any]) -> list[str]:
    return [r["node"] for a in shown["attempts"] for r in a["runs"]]


async def test_a_reservation_takes_only_its_jobs_in_its_window(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    cli = Cli(loaded.file)
    async with running(loaded) as (_, client):
        whoami = await client.call("whoami")
        start = time.time() + 4
        made = await client.call("reserve", name="team", nodes="node02", start=start, end=start + 3600,
                                 user=whoami["user"], reason="a demo at 14:00")  # fmt: skip
        assert (made["state"], made["nodes"], made["running"]) == ("planned", ["node02"], [])
        with pytest.raises(UsageError, match=r"node02 is in reservation team .* a node is in one reservation at a"):
            await client.call("reserve", name="fix", nodes="node[01-02]", end=start + 60, maintenance=True)
        with pytest.raises(UsageError, match="it can never start: reservation nope is over, or there is none"):
            await client.call("submit", spec=job("lost", "true", reservation="nope"))

        # no max_runtime: it would run into the reservation, so it keeps off node02
        forever = (await client.call("submit", spec=job("forever", "sleep 120")))["id"]
        shown = await until(client, forever, lambda j: j["attempts"] and j["attempts"][0]["started"], "it to run")
        assert nodes_of(shown) == ["node01"]
        # a job of the reservation waits for its window, then runs on its node
        mine = (await client.call("submit", spec=job("mine", "echo in", reservation="team")))["id"]
        waiting = await until(client, mine, lambda j: "waiting for reservation" in j["message"], "its note")
        assert waiting["message"].startswith(f"waiting for reservation team (user {whoami['user']}, "), waiting
        # another job, short enough to end before the window, could use node02 now; one that is not waits, saying so
        other = (await client.call("submit", spec=job("other", "true", max_runtime="2h")))["id"]
        told = await until(client, other, lambda j: "reserved" in j["message"] or "run into" in j["message"], "why")
        assert "it would run into team (user " in told["message"] and "on node02" in told["message"], told["message"]
        done = await finished(client, mine)
        listed = await client.call("reservations")
        await client.call("stop", jobs=[forever, other])
        await finished(client, forever)
        deleted = await client.call("unreserve", name="team")

    assert done["status"] == "succeeded" and nodes_of(done) == ["node02"]
    assert done["attempts"][0]["started"] >= start
    assert [(r["name"], r["state"]) for r in listed] == [("team", "active")]
    assert deleted["name"] == "team"
    text = await asyncio.to_thread(cli, "reservation", "list")
    assert "team" not in text.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_only_admins_reserve_and_a_job_may_not_use_anothers(sshd_cluster: Any, tmp_path: Path,
                                                                   sock_dir: Path) -> None:  # fmt: skip
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        refused = await as_nobody(loaded.socket_path, "reserve", name="mine", nodes="node01", end=time.time() + 60,
                                  user="nobody")  # fmt: skip
        assert refused["error"]["type"] == "PermissionDenied", refused
        await client.call("reserve", name="roots", nodes="node01", end=time.time() + 600, user="root")
        theirs = await as_nobody(loaded.socket_path, "submit", spec=job("theirs", "true", reservation="roots"))
        why = "job theirs: it can never start: reservation roots is for user root, not nobody"
        assert theirs["error"]["message"] == why, theirs
        # the CLI, as an admin: a maintenance window by spec count is refused for want of a spec, said plainly
        cli = Cli(loaded.file)
        said = await asyncio.to_thread(cli, "reservation", "create", "fix", "--spec", "nope", "--count", "1",
                                       "--duration", "1h", "--maintenance", check=2)  # fmt: skip
        assert "spec 'nope' is not defined in the cluster config" in said.stderr
        listed = await asyncio.to_thread(cli.json, "reservation", "list")
    assert [r["name"] for r in listed] == ["roots"]
