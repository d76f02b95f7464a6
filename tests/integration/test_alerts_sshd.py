"""Alerts end to end on real sshd nodes, through the scheduler's API socket: a failed job raises one, a node that
goes down raises one and resolves it when it is back, a changed host key raises a critical one; ack, resolve,
probe, drain and resume over the socket, and who may do which."""

from __future__ import annotations

import asyncio
import os
import pwd
from collections.abc import Callable
from typing import Any

import pytest

from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.store.records import NewAlert
from tests.integration.test_scheduler_sshd import (
    WAIT,
    as_nobody,
    finished,
    job,
    poll,
    running,
    write_config,
)
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def alerts_until(
    client: ApiClient, done: Callable[[list[dict[str, Any]]], bool], what: str, **args: Any
) -> list[dict[str, Any]]:
    return await poll(lambda: client.call("alerts", **args), done, what)


async def test_failed_job_raises_an_alert_its_owner_acks_and_resolves(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        ok = await client.call("submit", spec=job("fine", "true"))
        failing = await client.call("submit", spec=job("crashy", "sh -c 'echo boom >&2; exit 7'"))
        assert (await finished(client, ok["id"]))["status"] == "succeeded"
        shown = await finished(client, failing["id"])
        assert shown["status"] == "error" and shown["open_alerts"] == 1

        (alert,) = await client.call("alerts")  # the job that succeeded raised nothing
        assert (alert["kind"], alert["severity"], alert["job"], alert["node"]) == (
            "job_failed",
            "error",
            shown["id"],
            None,
        )
        assert alert["message"] == f"job {shown['id']} (crashy, root) failed: {shown['message']}"
        assert "exited with code 7" in alert["message"]
        assert (alert["state"], alert["acked_by"], alert["resolved_by"]) == ("open", None, None)

        (acked,) = await client.call("ack", alerts=[alert["id"]])
        assert (acked["state"], acked["acked_by"]) == ("acknowledged", "root") and acked["acked_at"] is not None
        assert (await client.call("show", job=shown["id"]))["open_alerts"] == 1  # acknowledged is still open
        (resolved,) = await client.call("resolve", alerts=[alert["id"]])
        assert (resolved["state"], resolved["resolved_by"]) == ("resolved", "root")
        assert resolved["resolved_at"] >= acked["acked_at"]

        assert await client.call("alerts") == []
        assert [a["state"] for a in await client.call("alerts", all=True)] == ["resolved"]
        listed = {j["id"]: j for j in await client.call("jobs")}
        assert listed[shown["id"]]["open_alerts"] == 0
        kinds = [e["kind"] for e in await client.call("events", job=shown["id"])]
        assert kinds[-2:] == ["alert-acknowledged", "alert-resolved"]

        with pytest.raises(NotFound, match="no alert 999"):
            await client.call("ack", alerts=[999])
        with pytest.raises(UsageError, match="give at least one alert id"):
            await client.call("resolve", alerts=[])


async def test_unreachable_node_raises_one_alert_resolved_when_it_is_back(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    # the loop's own sweeps must not race this test's probes: a sweep in flight on node02 when it goes down
    # fails there as "agent" (its connection cut mid-command) and raises the alert before the probes below
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    async with running(loaded) as (scheduler, client):

        async def first_sweep() -> asyncio.Future[None] | None:
            return scheduler.loop._first_probe

        started = await poll(first_sweep, lambda f: f is not None, "the loop's start")
        assert started is not None
        await asyncio.wait_for(asyncio.shield(started), WAIT)  # the loop's first sweep is over
        assert {o["name"]: o["state"] for o in await client.call("probe", nodeset=None)} == {
            "node01": "healthy",
            "node02": "healthy",
        }
        cluster.down("node02")
        for _ in range(3):  # every probe sees it down; only the first transition raises an alert
            (outcome,) = await client.call("probe", nodeset="node02")
            assert outcome["state"] == "unreachable" and outcome["error"]["kind"] == "unreachable"
        (alert,) = await client.call("alerts")
        assert (alert["kind"], alert["severity"], alert["node"], alert["job"]) == (
            "node_unreachable",
            "error",
            "node02",
            None,
        )
        assert alert["message"].startswith("node02 is unreachable: unreachable: ")
        nodes = {n["name"]: n for n in await client.call("nodes")}
        assert (nodes["node02"]["faults"], nodes["node01"]["faults"]) == (1, 0)
        await client.call("ack", alerts=[alert["id"]])

        cluster.up("node02")
        scheduler.transport.forget("node02")  # SSHPool: no backoff wait, as after an operator's fix
        states = []
        for _ in range(int(WAIT / 0.2)):  # recover_after: 2 good probes in a row
            (outcome,) = await client.call("probe", nodeset="node02")
            states.append(outcome["state"])
            if outcome["state"] == "healthy":
                break
            await asyncio.sleep(0.2)
        assert states[-1] == "healthy", states
        (closed,) = await client.call("alerts", all=True)
        assert (closed["id"], closed["state"], closed["acked_by"], closed["resolved_by"]) == (
            alert["id"],
            "resolved",
            "root",
            "ftconsole",
        )
        events = await client.call("events", node="node02")
        (resolved_event,) = [e for e in events if e["kind"] == "alert-resolved"]
        assert resolved_event["message"].endswith("resolved by ftconsole: node02 is healthy again")
        assert (await client.call("nodes", nodeset="node02"))[0]["faults"] == 1


async def test_changed_host_key_raises_one_critical_alert(sshd_cluster, tmp_path) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    cluster.change_host_key("node01")
    async with ClusterService.open(load_config(cluster.write_config(tmp_path / "cluster.yaml"))) as svc:
        for _ in range(2):
            outcomes = {o.node.name: o for o in await svc.probe()}
            assert outcomes["node01"].failure is not None and outcomes["node01"].failure.kind == "host-key-changed"
        alerts = await svc.store.alerts()
    assert sorted((a.node, a.kind, a.severity) for a in alerts) == [
        ("node01", "host_key", "critical"),
        ("node01", "node_unreachable", "error"),
    ]
    key = next(a for a in alerts if a.kind == "host_key")
    assert "host key changed" in key.message and key.message.startswith("node01: ")


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_who_may_ack_resolve_probe_drain_and_resume(sshd_cluster, tmp_path, sock_dir, shared_run_root) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=4)
    # nobody's job runs as nobody, whose home does not exist: its run folders go in a folder of its own
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"run_root": shared_run_root})
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (scheduler, client):
        private = await client.call("submit", spec=job("private", "false"))
        shared = await client.call("submit", spec=job("shared", "false", access="read-write"))
        theirs = (await as_nobody(path, "submit", spec=job("theirs", "false")))["result"]
        for submitted in (private, shared, theirs):
            assert (await finished(client, submitted["id"]))["status"] == "error"
        await alerts_until(client, lambda a: len(a) == 3, "three job_failed alerts")
        await scheduler.store.save_nodes([], alerts=[NewAlert(1.0, "node_unhealthy", "error", "x", node="node01")])
        by_job = {a["job"]: a["id"] for a in await client.call("alerts")}
        node_alert = by_job.pop(None)

        refused = await as_nobody(path, "ack", alerts=[by_job[private["id"]]])  # a private job's: as if none
        assert refused["error"]["type"] == "NotFound"
        assert refused["error"]["message"] == f"no alert {by_job[private['id']]}"
        refused = await as_nobody(path, "resolve", alerts=[node_alert])
        assert refused["error"]["type"] == "PermissionDenied"
        assert f"may not resolve alert {node_alert} (node_unhealthy on node01)" in refused["error"]["message"]
        assert "alerts about nodes are for admins (root)" in refused["error"]["message"]
        # one refusal refuses the whole request: the alert it may act on is left alone too
        both = await as_nobody(path, "ack", alerts=[by_job[theirs["id"]], by_job[private["id"]]])
        assert both["error"]["type"] == "NotFound"
        assert {a["state"] for a in await client.call("alerts")} == {"open"}

        acked = (await as_nobody(path, "ack", alerts=[by_job[theirs["id"]], by_job[shared["id"]]]))["result"]
        nobody = pwd.getpwuid(65534).pw_name
        assert [(a["state"], a["acked_by"]) for a in acked] == [("acknowledged", nobody)] * 2
        assert (await as_nobody(path, "resolve", alerts=[by_job[theirs["id"]]]))["result"][0]["state"] == "resolved"
        assert (await as_nobody(path, "ack", alerts=[12345]))["error"]["type"] == "NotFound"
        (resolved,) = await client.call("resolve", alerts=[node_alert])  # root is an admin
        assert resolved["resolved_by"] == "root"

        # nodes: anyone may probe; drain and resume are for admins
        (probed,) = (await as_nobody(path, "probe", nodeset="node01"))["result"]
        assert probed["name"] == "node01" and probed["state"] == "healthy"
        for op, args in (("drain", {"nodeset": "node01", "reason": "x"}), ("resume", {"nodeset": "node01"})):
            refused = await as_nobody(path, op, **args)
            assert refused["error"]["type"] == "PermissionDenied"
            assert refused["error"]["message"] == f"{nobody} may not {op} nodes: that is for admins (root)"
        (drained,) = await client.call("drain", nodeset="node01", reason="fan alarm")
        assert (drained["name"], drained["state"], drained["admin_reason"], drained["admin_by"]) == (
            "node01",
            "drained",
            "fan alarm",
            "root",
        )
        assert drained["held"] == [] and drained["faults"] == 0
        with pytest.raises(UsageError, match="drain needs a reason"):
            await client.call("drain", nodeset="node01", reason=" ")
        with pytest.raises(NotFound, match="node09"):
            await client.call("drain", nodeset="node09", reason="x")
        (resumed,) = await client.call("resume", nodeset="node01")
        assert resumed["state"] == "healthy" and resumed["admin"] is None


async def test_nodes_show_the_gpus_runs_hold(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=4)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        submitted = await client.call("submit", spec=job("holder", "sleep 300", gpus_per_node=2))
        (view,) = await poll(lambda: client.call("nodes"), lambda views: bool(views[0]["held"]), "GPUs held")
        assert view["held"] == [{"gpu": 0, "job": submitted["id"]}, {"gpu": 1, "job": submitted["id"]}]
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])
        assert (await client.call("nodes"))[0]["held"] == []
