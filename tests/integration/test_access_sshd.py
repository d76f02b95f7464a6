"""Who sees and may do what, across real uids (root and uid 65534 over the API socket), on real sshd nodes:
private jobs stay out of every listing, extend is bounded, the urgent cap cannot be dodged or raced, and
predict applies submit's rules."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root"),
]


def started(j: dict[str, Any]) -> bool:
    return any(c["type"] == "Running" for c in j["conditions"])


async def test_a_private_job_is_in_no_listing_of_others(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=3)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        private = await client.call("submit", spec=job("secret", "sleep 300"))  # access: none (the default)
        shared = await client.call("submit", spec=job("open", "sleep 300", access="read-only"))
        failed = await client.call("submit", spec=job("secret-fail", "sh -c 'exit 3'"))  # raises a job_failed alert
        await until(client, private["id"], started, "the private job to run")
        await until(client, shared["id"], started, "the shared job to run")
        await finished(client, failed["id"])
        hidden = {private["id"], failed["id"]}

        ids = {j["id"] for j in (await as_nobody(path, "jobs"))["result"]}
        assert ids == {shared["id"]}
        feed = (await as_nobody(path, "jobs_changed", since=None))["result"]
        assert {j["id"] for j in feed["jobs"]} == {shared["id"]}
        events = (await as_nobody(path, "events", limit=1000))["result"]
        assert events and not any(e["job"] is not None and int(e["job"]) in hidden for e in events)
        assert any(e["job"] == str(shared["id"]) for e in events)
        alerts = (await as_nobody(path, "alerts"))["result"]
        assert not any(a["job"] in hidden for a in alerts)
        (node,) = (await as_nobody(path, "nodes"))["result"]
        held = sorted(node["held"], key=lambda h: h["gpu"])
        assert len(held) == 2  # two GPUs are held: one by the shared job, one by a private job
        assert {h["job"] for h in held} == {shared["id"], None}
        assert next(h for h in held if h["job"] is None)["private"] is True
        gpus = (await as_nobody(path, "cluster"))["result"]["nodes"][0]["gpus"]
        assert {g["job"] for g in gpus if g.get("private")} == {None} and private["id"] not in {g["job"] for g in gpus}

        # the owner (root, also an admin) sees everything
        assert hidden <= {j["id"] for j in await client.call("jobs")}
        assert any(a["job"] == failed["id"] for a in await client.call("alerts"))
        (node,) = await client.call("nodes")
        assert private["id"] in {h["job"] for h in node["held"]}
        await client.call("stop", jobs=[private["id"], shared["id"]])


async def test_extend_is_bounded_by_max_extend_and_the_heads_reservation(
    sshd_cluster, tmp_path, sock_dir, shared_run_root
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    # nobody's job runs as nobody: its run folders go where it may write them
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"max_extend": "1h", "run_root": shared_run_root})
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        long = await client.call("submit", spec=job("long", "sleep 600", max_runtime="10m"))
        await until(client, long["id"], started, "the long job to run")
        head = await client.call("submit", spec=job("head", "true", gpus_per_node=2))  # waits for long's end
        # nobody's short job fits in the gap before the head's reserved start: backfilled
        gap = (await as_nobody(path, "submit", spec=job("gap", "sleep 600", max_runtime="5m")))["result"]
        await until(client, gap["id"], started, "the backfilled job to run")
        assert (await client.call("show", job=head["id"]))["status"] == "queued"

        refused = await as_nobody(path, "extend", job=gap["id"], duration="10m")
        assert refused["error"]["type"] == "PermissionDenied"
        assert f"would delay job {head['id']}, the head of the queue" in refused["error"]["message"]
        ok = (await as_nobody(path, "extend", job=gap["id"], duration="3m"))["result"]
        assert ok["max_runtime_s"] == 8 * 60  # still ends before the head's start
        refused = await as_nobody(path, "extend", job=gap["id"], duration="58m")
        assert "may be extended by 1h in all without an admin" in refused["error"]["message"]
        assert "3m so far" in refused["error"]["message"]
        # an admin may do both
        assert (await client.call("extend", job=gap["id"], duration="2h"))["max_runtime_s"] == 8 * 60 + 7200
        await client.call("stop", jobs=[long["id"], gap["id"], head["id"]])


async def test_the_urgent_cap_counts_per_user_and_two_submits_at_once_cannot_both_pass(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"urgent_cap": 1})
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        first = await as_nobody(path, "submit", spec=job("u1", "sleep 300", priority="urgent", project="a"))
        assert first["result"]["priority"] == "urgent"
        dodge = await as_nobody(path, "submit", spec=job("u2", "sleep 300", priority="urgent", project="b"))
        assert "user nobody already has 1 urgent job(s) running or queued (cap 1)" in dodge["error"]["message"]
        predicted = await as_nobody(path, "predict", spec=job("u3", "true", priority="urgent", project="c"))
        assert "cap 1" in predicted["error"]["message"]
        refused = await as_nobody(path, "predict", spec=job("vip", "true", priority="very-urgent"))
        assert refused["error"]["type"] == "PermissionDenied" and "admins only" in refused["error"]["message"]

        async def urgent(name: str) -> dict[str, Any] | UsageError:
            try:
                return dict(await client.call("submit", spec=job(name, "sleep 300", priority="urgent")))
            except UsageError as exc:
                return exc

        results = await asyncio.gather(*(urgent(f"race{i}") for i in range(4)))
        assert sum(1 for r in results if isinstance(r, dict)) == 1  # root's cap: exactly one of four
        listed = [j for j in await client.call("jobs") if j["priority"] == "urgent" and j["owner"] == "root"]
        assert len(listed) == 1
        await client.call("stop", jobs=[j["id"] for j in await client.call("jobs", status=["queued", "running"])])


async def test_declared_projects_take_only_their_members(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    data = loaded.file.read_text() + "projects:\n  research: {members: [root]}\n  shared: {}\n"
    loaded.file.write_text(data)
    from ftconsole.scheduler.config import load_config

    loaded = load_config(loaded.file)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        refused = await as_nobody(path, "submit", spec=job("x", "true", project="research"))
        assert refused["error"]["type"] == "PermissionDenied" and "not a member of project research" in str(refused)
        unknown = await as_nobody(path, "submit", spec=job("y", "true", project="mine"))
        assert "project 'mine' is not declared" in unknown["error"]["message"]
        ok = await as_nobody(path, "submit", spec=job("z", "true", project="shared"))
        assert ok["result"]["project"] == "shared"
        assert (await client.call("submit", spec=job("r", "true", project="research")))["project"] == "research"
