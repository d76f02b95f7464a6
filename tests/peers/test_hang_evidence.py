"""The evidence of a hang from real torch jobs (issue 29): four gloo ranks under torch.distributed.run on two sshd
nodes, one of which stops taking part (tests/peers/hang_rank.py); `debug` names it, with the reason, from what its
processes are doing and their Python stacks (py-spy, sent by the scheduler to the nodes, which lack it).

Each test asks `debug` until the verdict names a rank (a bounded wait: the ranks take a few seconds to start and
reach the hang), then checks the whole verdict and the evidence behind it, and that it was kept with the job."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.serve.api import ApiClient
from tests.integration.test_scheduler_sshd import running, write_config
from tests.peers.test_launchers import Peers, finished

pytestmark = pytest.mark.sshd

HANG = str(Path(__file__).resolve().parent / "hang_rank.py")
VERDICT_WAIT_S = 120.0


@pytest.fixture
def peers(sshd_cluster, tmp_path: Path, sock_dir: Path) -> Peers:
    return Peers(sshd_cluster(2, gpus=4), tmp_path, sock_dir)


async def verdict_naming(
    client: ApiClient, job_id: int, rule: str, world: int = 4, settled: str = ""
) -> dict[str, Any]:
    """`debug` of the job until its verdict names a rank by `rule` with all `world` ranks (the launcher's workers,
    not the launchers still in their rendezvous) looked at and its reason holds `settled` (the others may still be
    on their way into the collective the rank behind never reaches), or fail after VERDICT_WAIT_S with the last
    verdict."""
    deadline = time.monotonic() + VERDICT_WAIT_S
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shown = await client.call("show", job=job_id)
        assert shown["status"] in ("queued", "running"), shown["message"]
        if shown["status"] == "running" and any(r["state"] == "running" for a in shown["attempts"] for r in a["runs"]):
            doc = await client.call("debug", job=job_id)
            verdict = doc["verdict"]
            if (
                verdict["rank"] is not None
                and verdict["rule"] == rule
                and len(doc["ranks"]) == world
                and settled in (verdict.get("reason") or "")
            ):
                return doc
        await asyncio.sleep(1.0)
    raise AssertionError(f"no rank named within {VERDICT_WAIT_S:g}s: {doc.get('verdict')}")


async def hung_job(peers: Peers, how: str, rank: int, rule: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The verdict on a job whose rank `rank` hangs `how`, and the job's events after its stop."""
    env = peers.env(peers.root / "results", PEER_HANG=f"{how}:{rank}")
    async with running(peers.loaded) as (_, client):
        job = await client.call("submit", spec=peers.spec(f"hang-{how}", "pytorch", f"python {HANG}", env))
        doc = await verdict_naming(client, job["id"], rule)
        if os.environ.get("FT_RECORD_EVIDENCE"):  # the unit table's recorded cases (tests/unit/golden/evidence)
            Path(os.environ["FT_RECORD_EVIDENCE"], f"torch-{how}.json").write_text(json.dumps(doc, indent=1) + "\n")
        await client.call("stop", jobs=[job["id"]])
        await finished(client, job["id"])
        kept = await client.call("debug", job=job["id"])  # not running: the evidence kept last
        events = await client.call("events", job=job["id"])
    assert kept["kept"] and kept["verdict"] == doc["verdict"], kept["verdict"]
    for node in peers.cluster:  # the nodes had no py-spy: the scheduler's own was sent and kept by its hash
        assert [p.name[:7] for p in (node.home / ".ftconsole" / "lib").glob("py-spy-*")] == ["py-spy-"], node.name
    return doc, events


def by_rank(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in doc["ranks"]}


async def test_a_stopped_rank_is_named_while_the_others_wait_in_all_reduce(peers: Peers) -> None:
    doc, events = await hung_job(peers, "stop", 1, "stopped")
    verdict, ranks = doc["verdict"], by_rank(doc)
    assert (verdict["rank"], verdict["node"], verdict["rule"]) == (1, "node01", "stopped"), verdict
    assert verdict["reason"].endswith("; ranks 0, 2-3 wait in all_reduce"), verdict
    assert ranks[1]["state"] == "T"
    assert [ranks[r]["collective"] for r in (0, 2, 3)] == ["all_reduce"] * 3, doc["ranks"]
    assert any(e["kind"] == "Evidence" and "rank 1 on node01 is stopped" in e["message"] for e in events)


async def test_a_rank_sleeping_in_its_data_loader_is_named_with_where_it_is(peers: Peers) -> None:
    doc, _ = await hung_job(peers, "load", 2, "behind")
    verdict, ranks = doc["verdict"], by_rank(doc)
    # torch's trace (debug.torch_trace, on in mode pytorch): rank 2's last collective is behind the others'
    assert (verdict["rank"], verdict["node"], verdict["rule"]) == (2, "node02", "behind"), verdict
    assert verdict["reason"].startswith("rank 2 on node02 is behind: its last collective is all_reduce #"), verdict
    assert " in load_batch; ranks 0-1, 3 are in all_reduce #" in verdict["reason"], verdict
    assert ranks[2]["stack"][0]["name"] == "load_batch" and ranks[2]["state"] == "S", ranks[2]
    assert (ranks[2]["cpu"] or 0.0) < 0.25, ranks[2]


async def test_a_rank_in_a_busy_loop_is_named_busy(peers: Peers) -> None:
    doc, _ = await hung_job(peers, "spin", 0, "behind")
    verdict, ranks = doc["verdict"], by_rank(doc)
    assert (verdict["rank"], verdict["node"], verdict["rule"]) == (0, "node01", "behind"), verdict
    assert " in spin (busy: " in verdict["reason"] and "; ranks 1-3 are in all_reduce #" in verdict["reason"], verdict
    assert ranks[0]["cpu"] >= 0.25 and ranks[0]["stack"][0]["name"] == "spin", ranks[0]


async def test_the_hang_alert_names_the_rank_that_stands_out(sshd_cluster, tmp_path: Path, sock_dir: Path) -> None:
    """Hang detection on its own (no I/O for the job's window, the GPUs flat): the job_hung alert is raised once
    the evidence is in, and carries its verdict; the SuspectedHung condition points the shell at that rank."""
    cluster = sshd_cluster(2, gpus=4)
    peers = Peers(cluster, tmp_path, sock_dir)
    peers.loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    env = peers.env(peers.root / "results", PEER_HANG="stop:3")
    async with running(peers.loaded) as (_, client):
        spec = peers.spec("hang-alert", "pytorch", f"python {HANG}", env, hang_detect="4s")
        job = await client.call("submit", spec=spec)
        deadline = time.monotonic() + VERDICT_WAIT_S
        alerts: list[dict[str, Any]] = []
        while not alerts and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            alerts = [a for a in await client.call("alerts") if a["kind"] == "job_hung" and a["job"] == job["id"]]
        assert alerts, f"no job_hung alert within {VERDICT_WAIT_S:g}s"
        shown = await client.call("show", job=job["id"])
        await client.call("stop", jobs=[job["id"]])
        await finished(client, job["id"])
    message = alerts[0]["message"]
    assert "; rank 3 on node02 is stopped (pid " in message and f"(evidence: ftconsole debug {job['id']})" in message
    [hung] = [c for c in shown["conditions"] if c["type"] == "SuspectedHung"]
    assert "rank 3 on node02 is stopped" in hung["message"], hung


async def test_the_ranks_deepspeeds_runner_started_over_ssh_are_looked_at_and_the_one_behind_is_named(
    peers: Peers,
) -> None:
    """deepspeed's runner starts every rank through pdsh and ssh, outside the run's own processes: the evidence
    finds them by the job's environment, on each node, and torch's trace names the one behind."""
    env = peers.env(peers.root / "results", PEER_HANG="load:3", DS_ACCELERATOR="cpu")
    async with running(peers.loaded) as (_, client):
        job = await client.call("submit", spec=peers.spec("hang-ds", "pytorch-deepspeed", f"deepspeed {HANG}", env))
        # ranks 0 and 1 (node01) may be read before they enter all_reduce #4: wait for the three of them in it
        doc = await verdict_naming(client, job["id"], "behind", settled="ranks 0-2 are in all_reduce #")
        await client.call("stop", jobs=[job["id"]])
        await finished(client, job["id"])
    verdict, ranks = doc["verdict"], by_rank(doc)
    assert [(r, ranks[r]["node"]) for r in sorted(ranks)] == [(0, "node01"), (1, "node01"), (2, "node02"),
                                                              (3, "node02")], doc["ranks"]  # fmt: skip
    assert (verdict["rank"], verdict["node"]) == (3, "node02"), verdict
    assert " in load_batch; ranks 0-2 are in all_reduce #" in verdict["reason"], verdict
    assert all(ranks[r]["collectives"] for r in ranks), doc["ranks"]
