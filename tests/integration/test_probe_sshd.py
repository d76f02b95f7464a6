"""Probing a cluster of real OpenSSH sshd nodes: failures, hangs, changed host keys, and the CLI on top."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import load_config
from tests.integration.test_scheduler_sshd import as_nobody, poll, running, write_config
from tests.sshd_cluster import SshdCluster, gpu_data

pytestmark = pytest.mark.sshd
SWEEP_BOUND_S = 60  # only keeps a broken test finite; the assertions are about outcomes, not time


def wrapper_python(root: Path) -> tuple[Path, Path]:
    """A python3 that logs which node ran it: proof of what did (and did not) execute on each node."""
    log = root / "ran.log"
    script = root / "python-logged"
    script.write_text(f'#!/bin/sh\necho "$FTCONSOLE_LAB_NODE" >> {log}\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return script, log


def config_for(cluster: SshdCluster, root: Path, **extra: object) -> Path:
    python, _ = wrapper_python(root)
    nodes = [
        {"name": n.name, "host": n.address, "port": n.port, "pool": "tight" if i == 0 else "default"}
        for i, n in enumerate(cluster.nodes)
    ]
    settings: dict[str, object] = {
        "nodes": nodes,
        "pools": {"default": {}, "tight": {"thresholds": {"disk_cache_gb": 10_000_000}}},
        "ssh": {"python": str(python)},
    }
    for key, value in extra.items():  # callers' settings win (nested dicts merge)
        base = settings.get(key)
        settings[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    return cluster.write_config(root / "cluster.yaml", **settings)


def ran_on(root: Path) -> list[str]:
    log = root / "ran.log"
    return log.read_text().split() if log.exists() else []


async def test_sweep_with_a_failing_a_hung_a_rekeyed_and_a_healthy_node(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(4)
    loaded = load_config(config_for(cluster, tmp_path))
    cluster.hang("node02")
    cluster.change_host_key("node03")

    async with ClusterService.open(loaded) as svc:
        async with asyncio.timeout(SWEEP_BOUND_S):
            outcomes = {o.node.name: o for o in await svc.probe()}
        views = {v.node.name: v.to_json() for v in await svc.nodes()}

    failing, hung, rekeyed, healthy = (outcomes[f"node0{i}"] for i in range(1, 5))

    assert failing.health.state.value == "unhealthy"
    cache = failing.report.check("disk-size cache")  # type: ignore[union-attr]
    assert cache is not None and cache.status.value == "fail" and cache.threshold == 10_000_000
    assert failing.health.reasons == (f"disk-size cache: {cache.message}",)

    assert hung.health.state.value == "unreachable"
    assert hung.failure is not None and hung.failure.kind == "unreachable"
    assert hung.failure.message == "connect timed out after 2s: TCP connects, SSH does not answer"

    assert rekeyed.health.state.value == "unreachable"
    assert rekeyed.failure is not None and rekeyed.failure.kind == "host-key-changed"
    assert "host key changed" in rekeyed.health.reasons[0]

    assert healthy.health.state.value == "healthy" and healthy.report is not None
    assert len(healthy.report.gpus) == 8 and healthy.report.facts.gpu_source == "sim"
    assert healthy.report.gpus[0].name == "NVIDIA H100 80GB HBM3"

    # nothing ran where the host key was refused or the node hung; the agent ran everywhere else
    assert sorted(ran_on(tmp_path)) == ["node01", "node04"]
    # the states were persisted
    assert {n: v["state"] for n, v in views.items()} == {
        "node01": "unhealthy",
        "node02": "unreachable",
        "node03": "unreachable",
        "node04": "healthy",
    }


async def test_gpu_fault_while_running_then_damped_recovery(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=4)
    loaded = load_config(config_for(cluster, tmp_path, pools={"default": {}, "tight": {}}))
    async with ClusterService.open(loaded) as svc:
        (first,) = await svc.probe()
        assert first.health.state.value == "healthy"

        cluster.set_gpus(
            "node01",
            gpu_data(4)
            | {"gpus": [*gpu_data(3)["gpus"], {**gpu_data(1)["gpus"][0], "index": 3, "ecc_uncorrectable": 2}]},
        )
        (broken,) = await svc.probe()
        assert broken.health.state.value == "unhealthy"
        assert broken.health.reasons[0].startswith("gpu-health:") and "3" in broken.health.reasons[0]

        cluster.set_gpus("node01", gpu_data(4))
        (once,) = await svc.probe()
        assert once.health.state.value == "unhealthy"  # one good probe is not enough
        assert once.health.reasons[-1] == "recovering: 1 of 2 probes healthy"
        (twice,) = await svc.probe()
        assert twice.health.state.value == "healthy"

        kinds = [e.kind for e in await svc.events(node="node01")]
        # the fault raised a node_unhealthy alert, which the recovery resolved (with its event)
        assert kinds == ["state-changed", "state-changed", "state-changed", "alert-resolved"]
        (alert,) = await svc.store.alerts(states=("open", "acknowledged", "resolved"))
        assert (alert.kind, alert.node, alert.state, alert.resolved_by) == (
            "node_unhealthy",
            "node01",
            "resolved",
            "ftconsole",
        )
        assert alert.message.startswith("node01 is unhealthy: gpu-health:")


async def test_node_comes_back_after_down_and_up(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    loaded = load_config(config_for(cluster, tmp_path, pools={"default": {}, "tight": {}}, probes={"recover_after": 1}))
    async with ClusterService.open(loaded) as svc:
        cluster.down("node01")
        (down,) = await svc.probe()
        assert down.failure is not None and down.failure.message == "connection refused"
        cluster.up("node01")
        svc.transport.forget("node01")  # type: ignore[attr-defined]  (skip the reconnect backoff)
        (up,) = await svc.probe()
        assert up.health.state.value == "healthy"


async def test_hostile_paths_and_users_never_reach_a_shell(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    hostile_dir = "we ird';$(touch PWNED-dir)`touch PWNED-tick`"
    (cluster["node01"].home / hostile_dir).mkdir()
    loaded = load_config(
        config_for(cluster, tmp_path, pools={"default": {}, "tight": {}}, probes={"cache_dir": f"~/{hostile_dir}"})
    )
    async with ClusterService.open(loaded) as svc:
        (outcome,) = await svc.probe()
    cache = outcome.report.check("disk-size cache")  # type: ignore[union-attr]
    assert cache is not None and cache.status.value == "pass"
    assert hostile_dir in cache.message  # the agent saw the exact path

    hostile_user = "nobody;touch PWNED-user"
    loaded = load_config(config_for(cluster, tmp_path, pools={"default": {}, "tight": {}}, ssh={"user": hostile_user}))
    async with ClusterService.open(loaded) as svc:
        (refused,) = await svc.probe()
    assert refused.failure is not None and refused.failure.kind == "auth"

    leftovers = list(cluster.root.rglob("PWNED*")) + list(Path.home().glob("PWNED*")) + list(Path.cwd().glob("PWNED*"))
    assert leftovers == []


def ftconsole(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FTCONSOLE_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, "-m", "ftconsole.cli", *args], capture_output=True, text=True, timeout=90, env=env
    )


def test_cli_probe_nodes_drain_resume(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    config = config_for(cluster, tmp_path)  # node01 fails disk-size cache

    probe = ftconsole("probe", "--json", config=config)
    assert probe.returncode == 1, probe.stderr  # a node is not healthy
    by_name = {r["name"]: r for r in json.loads(probe.stdout)}
    assert by_name["node01"]["state"] == "unhealthy" and by_name["node02"]["state"] == "healthy"
    assert {c["name"] for c in by_name["node02"]["checks"]} >= {"disk-size root", "gpu-check", "gpu-health"}

    only = ftconsole("probe", "node02", "--json", "--checks", "gpu-check", config=config)
    assert only.returncode == 0 and [c["name"] for c in json.loads(only.stdout)[0]["checks"]] == ["gpu-check"]

    drain = ftconsole("drain", "node02", "--reason", "fan alarm", config=config)
    assert drain.returncode == 0, drain.stderr
    nodes = {n["name"]: n for n in json.loads(ftconsole("nodes", "--json", config=config).stdout)}
    assert nodes["node02"]["state"] == "drained" and nodes["node02"]["admin_reason"] == "fan alarm"
    assert nodes["node02"]["health"] == "healthy" and len(nodes["node02"]["gpus"]) == 8

    assert ftconsole("resume", "node02", config=config).returncode == 0
    table = ftconsole("nodes", config=config)
    assert table.returncode == 0 and "node02  healthy" in table.stdout

    events = json.loads(ftconsole("events", "--json", "--node", "node02", config=config).stdout)
    assert [e["kind"] for e in events] == ["state-changed", "drained", "resumed"]

    missing = ftconsole("drain", "node09", "--reason", "x", config=config)
    assert missing.returncode == 2 and "node09" in missing.stderr and missing.stdout == ""
    no_reason = ftconsole("drain", "node01", "--reason", " ", config=config)
    assert no_reason.returncode == 2 and "reason" in no_reason.stderr


async def test_ssh_config_aliases_and_proxyjump_are_honoured(sshd_cluster, tmp_path: Path) -> None:
    """Nodes named only by an alias: HostName, Port, User, IdentityFile and ProxyJump come from ssh_config."""
    cluster: SshdCluster = sshd_cluster(2)
    bastion, target = cluster["node01"], cluster["node02"]
    ssh_config = tmp_path / "ssh_config"
    # jump hosts are verified the way OpenSSH does: with the ssh config's own known hosts file
    common = f"  User {cluster.user}\n  IdentityFile {cluster.key}\n  UserKnownHostsFile {cluster.known_hosts}\n"
    ssh_config.write_text(
        f"Host bastion\n  HostName {bastion.address}\n  Port {bastion.port}\n{common}"
        f"Host gpu-behind\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump bastion\n{common}"
    )
    config = cluster.write_config(
        tmp_path / "cluster.yaml",
        nodes=[{"name": "gpu-behind"}],
        ssh={"user": None, "identity_file": None, "config_file": str(ssh_config)},
    )
    async with ClusterService.open(load_config(config)) as svc:
        (outcome,) = await svc.probe()
    assert outcome.failure is None, outcome.failure
    assert outcome.health.state.value == "healthy"
    # the agent ran on the target (its simulated GPUs), reached through the bastion
    assert outcome.report is not None and len(outcome.report.gpus) == 8


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_dns_only_probes_never_make_an_ecc_failed_node_healthy(sshd_cluster, tmp_path, sock_dir) -> None:
    """Issue 26: a probe of some checks only, by anyone on the socket, once folded as if the others had passed."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    cluster.set_gpus("node01", gpu_data(1, ecc_uncorrectable=2))
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)

    def still_broken(view: dict[str, Any], alerts: list[dict[str, Any]]) -> None:
        assert (view["state"], view["health"]) == ("unhealthy", "unhealthy"), view["reasons"]
        assert any(r.startswith("gpu-health:") for r in view["reasons"])
        assert [(a["kind"], a["state"]) for a in alerts] == [("node_unhealthy", "open")]

    async with running(loaded) as (_, client):
        (view,) = await poll(lambda: client.call("nodes"), lambda v: v[0]["state"] == "unhealthy", "the ECC fault")
        still_broken(view, await client.call("alerts"))

        for _ in range(2):  # as uid 65534: merged with the loop's own probe of a moment ago
            reply = await as_nobody(loaded.socket_path, "probe", nodeset="node01", checks=["dns"])
            (probed,) = reply["result"]
            assert probed["state"] == "unhealthy" and probed["reused"] is True
        still_broken((await client.call("nodes"))[0], await client.call("alerts"))

        for _ in range(2):  # an admin's dns-only probes run now, and still leave the GPU check's fault in place
            (probed,) = await client.call("probe", nodeset="node01", checks=["dns"])
            assert probed["reused"] is False and [c["name"] for c in probed["checks"]] == ["dns"]
            assert probed["state"] == "unhealthy"
        view = (await client.call("nodes"))[0]
        still_broken(view, await client.call("alerts"))
        assert {c["name"]: c["status"] for c in view["checks"]}["gpu-health"] == "fail"  # kept, not dropped

        refused = await as_nobody(loaded.socket_path, "probe", nodeset="node01", checks=["dns", "no-such-check"])
        assert (
            refused["error"]["type"] == "UsageError" and "unknown checks 'no-such-check'" in refused["error"]["message"]
        )
