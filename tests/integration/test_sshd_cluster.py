"""The sshd test cluster itself, checked with the system ssh client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.spec.config import load_config
from tests.sshd_cluster import (
    SSHD_MISSING,
    SshdCluster,
    gpu_data,
    pci_bus_id,
    pid_alive,
    sshd_available,
    sshd_cluster_fixture,  # noqa: F401  (the `sshd_cluster` fixture)
)

pytestmark = pytest.mark.sshd


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_nodes_have_their_own_home_and_gpu_file(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=2, gpus=[8, 4])
    assert cluster.names == ["node01", "node02"]
    assert [n.address for n in cluster] == ["127.0.0.11", "127.0.0.12"]
    for node, gpus in zip(cluster, (8, 4), strict=True):
        result = cluster.run(node, _sh("echo $HOME $FTCONSOLE_SIM_GPUS $FTCONSOLE_LAB_NODE; ls $HOME"))
        assert result.returncode == 0, result.stderr
        first, listing = result.stdout.split("\n", 1)
        assert first.split() == [str(node.home), str(node.gpus_file), node.name]
        assert listing.split() == ["cache"]
        data = json.loads(cluster.run(node, _sh('cat "$FTCONSOLE_SIM_GPUS"'), check=True).stdout)
        # each GPU gets its node's PCI address (the driver's Xid lines name a GPU by it; the nodes share a kernel)
        addresses = [pci_bus_id(node, i) for i in range(gpus)]
        assert [g.pop("pci_bus_id") for g in data["gpus"]] == addresses and len(set(addresses)) == gpus
        assert data == gpu_data(gpus)
        assert data["driver_version"] == "550.54.15"
        assert {g["name"] for g in data["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    # argv survives quoting: no shell word splitting of the arguments
    result = cluster.run("node01", ["printf", "%s|", "a b", "$HOME", "it's"], check=True)
    assert result.stdout == "a b|$HOME|it's|"
    known = cluster.known_hosts.read_text().splitlines()
    assert known == [n.host_key_line() for n in cluster]
    assert known[0].startswith(f"[127.0.0.11]:{cluster['node01'].port} ssh-ed25519 AAAA")


def test_write_config_is_a_valid_cluster_config(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(count=2, gpus=2)
    path = cluster.write_config(
        tmp_path / "cluster.yaml", ssh={"command_timeout": "5s"}, probes={"thresholds": {"disk_root_gb": 2}}
    )
    loaded = load_config(path).cluster
    assert loaded.ssh.command_timeout == 5.0
    assert loaded.ssh.connect_timeout == 2.0
    assert loaded.ssh.identity_file == str(cluster.key)
    assert loaded.ssh.config_file is None
    assert loaded.probes.thresholds.disk_root_gb == 2
    assert loaded.probes.thresholds.disk_cache_gb == 1
    assert loaded.probes.thresholds.gpus_expected is None
    assert loaded.probes.cache_dir == "~/cache"
    assert [(n.name, n.host, n.port, n.user) for n in loaded.node_list()] == [
        (n.name, n.address, n.port, cluster.user) for n in cluster
    ]
    assert load_config(path).state_dir == cluster.state_dir


def test_hang_and_unhang(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=1, gpus=1)
    cluster.hang("node01")
    start = time.monotonic()
    result = cluster.run("node01", ["true"], connect_timeout=1, timeout=10)
    assert result.returncode == 255
    assert time.monotonic() - start < 5
    assert "timed out" in result.stderr.lower(), result.stderr
    cluster.unhang("node01")
    assert cluster.run("node01", ["echo", "ok"], connect_timeout=2).stdout == "ok\n"


def test_hang_with_sessions_freezes_running_processes(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=1, gpus=1)
    tick = cluster["node01"].home / "tick"
    loop = "while :; do date +%s%N > $HOME/tick.new; mv $HOME/tick.new $HOME/tick; sleep 0.02; done"
    cluster.run("node01", _sh(f"setsid nohup sh -c '{loop}' </dev/null >/dev/null 2>&1 &"), check=True)
    deadline = time.monotonic() + 5
    while not tick.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    cluster.hang("node01", sessions=True)
    frozen = tick.read_text()
    time.sleep(0.2)
    assert tick.read_text() == frozen
    cluster.unhang("node01")
    deadline = time.monotonic() + 5
    while tick.read_text() == frozen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tick.read_text() != frozen


def test_down_kills_detached_processes_and_up_restores(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=2, gpus=1)
    node = cluster["node01"]
    port = node.port
    started = cluster.run(
        node, _sh("setsid nohup sleep 300 </dev/null >/dev/null 2>&1 & echo $!"), check=True, timeout=10
    )
    pid = int(started.stdout)
    assert pid_alive(pid)
    cluster.down(node)
    assert not pid_alive(pid)
    result = cluster.run(node, ["true"], connect_timeout=1, timeout=10)
    assert result.returncode == 255
    assert "refused" in result.stderr.lower(), result.stderr
    # the other node is untouched
    assert cluster.run("node02", ["echo", "ok"], check=True).stdout == "ok\n"
    cluster.up(node)
    assert node.port == port
    assert cluster.run(node, _sh("echo $FTCONSOLE_LAB_NODE"), check=True).stdout == "node01\n"


def test_changed_host_key_is_refused(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=1, gpus=1)
    before = cluster.known_hosts.read_text()
    cluster.change_host_key("node01")
    assert cluster.known_hosts.read_text() == before
    result = cluster.run("node01", ["true"], timeout=10)
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr or "Host key verification failed" in (
        result.stderr
    ), result.stderr


def test_set_gpus_is_seen_on_the_node(sshd_cluster) -> None:
    cluster: SshdCluster = sshd_cluster(count=1, gpus=2)
    data = gpu_data(2)
    data["gpus"][1].update(healthy=False, ecc_uncorrectable=3)
    cluster.set_gpus("node01", data)
    shown = json.loads(cluster.run("node01", _sh('cat "$FTCONSOLE_SIM_GPUS"'), check=True).stdout)
    assert [g.pop("pci_bus_id") for g in shown["gpus"]] == ["00000001:18:00.0", "00000001:19:00.0"]
    assert shown == data


def test_stop_is_idempotent_and_kills_everything(tmp_path: Path) -> None:
    if not sshd_available():
        pytest.skip(SSHD_MISSING)
    with SshdCluster(tmp_path, 1, gpus=1) as cluster:
        started = cluster.run("node01", _sh("setsid nohup sleep 300 </dev/null >/dev/null 2>&1 & echo $!"))
        pid = int(started.stdout)
        cluster.hang("node01")  # stop() must continue a stopped sshd before terminating it
        proc = cluster["node01"].proc
        assert proc is not None
    assert proc.returncode is not None
    assert not pid_alive(pid)
    cluster.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        cluster.up("node01")
