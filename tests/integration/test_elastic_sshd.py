"""Elastic jobs resized on real sshd nodes: scale out (waiting for nodes, then growing), scale in, refusals.

The job is a real process per rank that prints its WORLD_SIZE and RANK and, on SIGTERM, "saves a
checkpoint" and exits 0, as a training script would; each resize replaces the attempt by one of the new size.
"""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import finished, job, log_of, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

WORKER = (
    'sh -c \'echo start world=$WORLD_SIZE rank=$RANK; trap "echo saved checkpoint; exit 0" TERM; '
    "while true; do sleep 0.1; done'"
)


def up(attempt: int, size: int) -> Any:
    """The job runs attempt `attempt` with `size` ranks, all running."""

    def check(shown: dict[str, Any]) -> bool:
        runs = [r for a in shown["attempts"] if a["number"] == attempt for r in a["runs"]]
        return shown["attempt"] == attempt and len(runs) == size and all(r["state"] == "running" for r in runs)

    return check


async def test_scale_out_waits_for_nodes_then_grows_and_scale_in_keeps_rank_0(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        blocker = await client.call("submit", spec=job("blocker", "sleep 60", gpus_per_node=2, workdir="/tmp"))
        await until(client, blocker["id"], up(1, 1), "the blocker to run")
        elastic = {"elastic": {"min_nodes": 1, "max_nodes": 3}}
        spec = job("grow", WORKER, mode="pytorch", nodes=2, gpus_per_node=2, workdir="/tmp", fault_tolerance=elastic)
        jid = (await client.call("submit", spec=spec))["id"]
        first = await until(client, jid, up(1, 2), "attempt 1 on two nodes")
        assert first["elastic"] == {"min_nodes": 1, "max_nodes": 3}
        rank0 = first["attempts"][0]["runs"][0]["node"]

        # scale out: the third node is held by the blocker, so the job runs on at its size and says why
        scaled = await client.call("scale", job=jid, nodes=3)
        assert (scaled["nodes"], scaled["attempt"]) == (3, 1)
        waiting = await until(client, jid, lambda j: "waits for nodes" in j["message"], "the scale out to wait")
        assert waiting["message"].startswith("scale out 2 -> 3 waits for nodes"), waiting["message"]
        assert waiting["attempt"] == 1 and waiting["status"] == "running"

        await client.call("stop", jobs=[blocker["id"]])  # the node frees up: the job grows at once
        grown = await until(client, jid, lambda j: up(2, 3)(j) and not j["message"], "attempt 2 on three nodes")
        old, new = grown["attempts"]
        assert old["result"] == "resized" and old["ended"] is not None
        assert all(r["state"] == "exited" and r["exit_code"] == 0 for r in old["runs"])
        assert [r["node"] for r in new["runs"]][:2] == [r["node"] for r in old["runs"]]  # it kept its nodes
        for rank in (0, 1):
            assert "saved checkpoint" in await log_of(client, jid, rank, 1)  # SIGTERM, then a clean exit
        for rank in (0, 1, 2):
            assert f"start world=3 rank={rank}" in await log_of(client, jid, rank, 2)
        kinds = [c["type"] for c in grown["conditions"]]
        assert kinds.count("Scaling") >= 3, kinds  # asked, attempt 2 placed, attempt 1 down

        # scale in: the first rank stays where it was
        await client.call("scale", job=jid, nodes=1)
        shrunk = await until(client, jid, up(3, 1), "attempt 3 on one node")
        assert shrunk["attempts"][2]["runs"][0]["node"] == rank0
        assert "start world=1 rank=0" in await log_of(client, jid, 0, 3)
        nodes = {n["name"]: n for n in await client.call("nodes")}
        holders = {name: n.get("held") for name, n in nodes.items()}
        assert sum(1 for held in holders.values() if held) == 1, holders  # the two others are free again

        await client.call("stop", jobs=[jid])
        ended = await finished(client, jid)
        assert ended["status"] == "stopped"


async def test_scale_refusals_name_the_problem(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        plain = await client.call("submit", spec=job("plain", "sleep 30", mode="pytorch", nodes=2, workdir="/tmp"))
        with pytest.raises(UsageError, match=f"job {plain['id']} is not elastic"):
            await client.call("scale", job=plain["id"], nodes=1)
        elastic = {"elastic": {"min_nodes": 1}}
        spec = job("small", "sleep 30", mode="pytorch", nodes=2, workdir="/tmp", fault_tolerance=elastic)
        jid = (await client.call("submit", spec=spec))["id"]
        with pytest.raises(UsageError, match=r"scales from 1 to 2 nodes .* not to 3"):
            await client.call("scale", job=jid, nodes=3)
        with pytest.raises(UsageError, match="whole number of nodes"):
            await client.call("scale", job=jid, nodes="two")
        queued = await client.call("scale", job=jid, nodes=1)  # queued behind `plain`: placed at the new size
        assert queued["nodes"] == 1
        await client.call("stop", jobs=[plain["id"]])
        shown = await until(client, jid, up(1, 1), "the job to start on one node")
        assert [c["type"] for c in shown["conditions"]][:2] == ["Pending", "Scaling"]
        await client.call("stop", jobs=[jid])
        assert (await finished(client, jid))["status"] == "stopped"
        with pytest.raises(UsageError, match="only a queued or running job can be scaled"):
            await client.call("scale", job=jid, nodes=2)


async def test_an_elastic_job_starts_on_the_free_nodes_and_grows_back(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        blocker = await client.call("submit", spec=job("blocker", "sleep 60", workdir="/tmp"))
        await until(client, blocker["id"], up(1, 1), "the blocker to run")
        fixed = {"elastic": {"min_nodes": 1, "grow": False}}
        spec = job("fixed", WORKER, mode="pytorch", nodes=2, workdir="/tmp", fault_tolerance=fixed)
        fixed_id = (await client.call("submit", spec=spec))["id"]
        small = await until(client, fixed_id, up(1, 1), "the job to start on the one free node")
        placed = next(c["message"] for c in small["conditions"] if c["type"] == "Creating")
        assert "1 of 2 nodes (elastic): scale it to grow" in placed, placed
        assert small["nodes"] == 2  # what it asks for; it runs on one
        await client.call("stop", jobs=[fixed_id])
        await finished(client, fixed_id)

        growing = {"elastic": {"min_nodes": 1}}
        spec = job("grows", WORKER, mode="pytorch", nodes=2, workdir="/tmp", fault_tolerance=growing)
        jid = (await client.call("submit", spec=spec))["id"]
        await until(client, jid, up(1, 1), "the job to start small")
        waiting = await until(client, jid, lambda j: "waits for nodes" in j["message"], "it to wait for a node")
        assert waiting["message"].startswith("scale out 1 -> 2 waits for nodes: needs 1 node"), waiting["message"]
        settled = await client.call("scale", job=jid, nodes=1)  # the size it has: nothing to wait for any more
        assert (settled["nodes"], settled["attempt"], settled["message"]) == (1, 1, "")
        await client.call("scale", job=jid, nodes=2)
        await until(client, jid, lambda j: "waits for nodes" in j["message"], "it to wait again")
        await client.call("stop", jobs=[blocker["id"]])
        grown = await until(client, jid, lambda j: up(2, 2)(j) and not j["message"], "it to grow to two nodes")
        assert "start world=2 rank=1" in await log_of(client, jid, 1, 2)
        assert grown["attempts"][0]["result"] == "resized"
        await client.call("stop", jobs=[jid])
        assert (await finished(client, jid))["status"] == "stopped"


async def test_a_resize_survives_a_scheduler_restart(sshd_cluster, tmp_path, sock_dir) -> None:
    """The scheduler stops while the old attempt is going down; the next one finishes the resize from the store."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    slow = WORKER.replace('trap "echo saved', 'trap "sleep 1; echo saved')
    assert slow != WORKER
    spec = job("slow", slow, mode="pytorch", nodes=2, workdir="/tmp", fault_tolerance={"elastic": {"min_nodes": 1}})
    async with running(loaded) as (_, client):
        jid = (await client.call("submit", spec=spec))["id"]
        await until(client, jid, up(1, 2), "attempt 1 on two nodes")
        await client.call("scale", job=jid, nodes=1)
        resizing = await until(client, jid, lambda j: j["attempt"] == 2, "the resize to be recorded")
        assert resizing["attempts"][1]["runs"][0]["state"] == "intent"  # waiting for attempt 1 to go down
    async with running(loaded) as (_, client):  # a new scheduler on the same store
        done = await until(client, jid, up(2, 1), "attempt 2 started by the next scheduler")
        assert done["attempts"][0]["result"] == "resized"
        assert "start world=1 rank=0" in await log_of(client, jid, 0, 2)
        assert "saved checkpoint" in await log_of(client, jid, 1, 1)
        await client.call("stop", jobs=[jid])
        assert (await finished(client, jid))["status"] == "stopped"
