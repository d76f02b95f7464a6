"""ProxyJump hops (issue 11): the jump host's key is checked against `ssh.known_hosts` with `ssh.host_key_policy`,
like the node's, never against asyncssh's default (~/.ssh/known_hosts). Real OpenSSH sshd nodes on loopback: node01
is the bastion (sshd allows TCP forwarding by default), node02 the node behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftconsole.scheduler.errors import HostKeyError, SSHError, UnreachableError
from ftconsole.scheduler.spec.config import Node, SSHSettings
from ftconsole.scheduler.ssh.transport import SSHPool, _parse_hop
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

BEHIND = Node(name="gpu-behind", host="gpu-behind", port=None, user=None, pool="default")


def setup_jump(
    cluster: SshdCluster, root: Path, monkeypatch: pytest.MonkeyPatch, *, default_known: str = ""
) -> tuple[Path, Path]:
    """An ssh config with `gpu-behind` reached by `ProxyJump bastion` (no UserKnownHostsFile: asyncssh alone
    would use ~/.ssh/known_hosts), a HOME whose ~/.ssh/known_hosts holds `default_known`; returns (ssh config,
    the path the pool's known_hosts will have)."""
    bastion, target = cluster["node01"], cluster["node02"]
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(default_known)
    monkeypatch.setenv("HOME", str(home))
    common = f"  User {cluster.user}\n  IdentityFile {cluster.key}\n"
    ssh_config = root / "ssh_config"
    ssh_config.write_text(
        f"Host bastion\n  HostName {bastion.address}\n  Port {bastion.port}\n{common}"
        f"Host gpu-behind\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump bastion\n{common}"
    )
    return ssh_config, root / "known_hosts"


def pool(ssh_config: Path, known: Path, policy: str = "strict") -> SSHPool:
    settings = SSHSettings.model_validate({"connect_timeout": 10, "command_timeout": 20, "host_key_policy": policy})
    return SSHPool(settings, known_hosts=known, config_file=ssh_config)


def line(cluster: SshdCluster, name: str) -> str:
    return cluster[name].host_key_line() + "\n"


async def test_jump_host_in_configured_known_hosts_connects_and_target_is_checked(
    sshd_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    ssh_config, known = setup_jump(cluster, tmp_path, monkeypatch)  # the default known_hosts is empty
    known.write_text(line(cluster, "node01") + line(cluster, "node02"))
    async with pool(ssh_config, known) as p:
        result = await p.run(BEHIND, ["sh", "-c", 'echo "$FTCONSOLE_LAB_NODE"'])
        again = await p.run(BEHIND, ["true"])
    assert result.ok and result.stdout == "node02\n" and again.ok

    # the target's own key is still checked, against the same file: the hop is trusted, the target is not
    known.write_text(line(cluster, "node01"))
    async with pool(ssh_config, known) as p:
        with pytest.raises(HostKeyError, match="unknown host key: gpu-behind is not in") as info:
            await p.run(BEHIND, ["true"])
    assert not info.value.changed and "jump host" not in info.value.reason

    # the route is the bastion's: with its sshd down the node cannot be reached
    known.write_text(line(cluster, "node01") + line(cluster, "node02"))
    cluster.down("node01")
    async with pool(ssh_config, known) as p:
        with pytest.raises(UnreachableError, match="jump host bastion: connection refused"):
            await p.run(BEHIND, ["true"])


async def test_jump_host_known_only_to_the_default_file_is_refused(
    sshd_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    # ~/.ssh/known_hosts (asyncssh's default) trusts both; the configured file only the target
    ssh_config, known = setup_jump(
        cluster, tmp_path, monkeypatch, default_known=line(cluster, "node01") + line(cluster, "node02")
    )
    known.write_text(line(cluster, "node02"))
    marker = cluster["node02"].home / "ran"
    async with pool(ssh_config, known) as p:
        with pytest.raises(HostKeyError) as info:
            await p.run(BEHIND, ["touch", str(marker)])
    err = info.value
    assert err.node == "gpu-behind" and not err.changed
    assert err.reason.startswith("unknown host key: jump host bastion (ProxyJump to gpu-behind) is not in ")
    assert str(known) in err.reason and not marker.exists()
    assert known.read_text() == line(cluster, "node02")  # strict records nothing

    # accept-new applies to the hop as to the node: its key is recorded in the configured file, then it connects
    async with pool(ssh_config, known, policy="accept-new") as p:
        result = await p.run(BEHIND, ["sh", "-c", 'echo "$FTCONSOLE_LAB_NODE"'])
    assert result.stdout == "node02\n"
    bastion = cluster["node01"]
    recorded = [ln for ln in known.read_text().splitlines() if ln.startswith(f"[{bastion.address}]:{bastion.port} ")]
    assert len(recorded) == 1 and recorded[0].split()[1:] == line(cluster, "node01").split()[1:]


async def test_changed_jump_host_key_is_refused(sshd_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    old = line(cluster, "node01") + line(cluster, "node02")
    ssh_config, known = setup_jump(cluster, tmp_path, monkeypatch)
    known.write_text(old)
    cluster.change_host_key("node01")
    # the new key is trusted by the default file: that must not matter
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(line(cluster, "node01"))
    marker = cluster["node02"].home / "ran"
    for policy in ("strict", "accept-new"):
        async with pool(ssh_config, known, policy=policy) as p:
            with pytest.raises(HostKeyError) as info:
                await p.run(BEHIND, ["touch", str(marker)])
        err = info.value
        assert err.changed, policy
        assert err.reason.startswith("host key changed: the key of jump host bastion (ProxyJump to gpu-behind) ")
        assert not marker.exists()
    assert known.read_text() == old  # accept-new never replaces a changed key


def test_parse_hop() -> None:
    assert _parse_hop("bastion") == (None, "bastion", None)
    assert _parse_hop(" admin@bastion:2222 ") == ("admin", "bastion", 2222)
    assert _parse_hop("u@[::1]:22") == ("u", "::1", 22)
    assert _parse_hop("[fe80::1]") == (None, "fe80::1", None)


async def test_proxyjump_loop_in_the_ssh_config_ends(tmp_path: Path) -> None:
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    async with pool(ssh_config, tmp_path / "known_hosts") as p:
        with pytest.raises(SSHError, match="nests more than 8 deep"):
            await p.run(Node(name="a", host="a", port=None, user=None, pool="default"), ["true"])


async def test_every_hop_of_a_chain_is_checked(sshd_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ProxyJump a,b` and a bastion with a ProxyJump of its own: each hop is checked against ssh.known_hosts."""
    cluster: SshdCluster = sshd_cluster(3)
    outer, inner, target = cluster["node01"], cluster["node02"], cluster["node03"]
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("".join(line(cluster, n) for n in ("node01", "node02", "node03")))
    monkeypatch.setenv("HOME", str(home))
    common = f"  User {cluster.user}\n  IdentityFile {cluster.key}\n"
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host outer\n  HostName {outer.address}\n  Port {outer.port}\n{common}"
        f"Host inner\n  HostName {inner.address}\n  Port {inner.port}\n  ProxyJump outer\n{common}"
        f"Host nested\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump inner\n{common}"
        f"Host chained\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump outer,inner\n{common}"
    )
    known = tmp_path / "known_hosts"
    nodes = [Node(name=h, host=h, port=None, user=None, pool="default") for h in ("nested", "chained")]
    known.write_text("".join(line(cluster, n) for n in ("node01", "node02", "node03")))
    async with pool(ssh_config, known) as p:
        for n in nodes:
            result = await p.run(n, ["sh", "-c", 'echo "$FTCONSOLE_LAB_NODE"'])
            assert result.stdout == "node03\n", n.name
    for missing, hop in (("node01", "outer"), ("node02", "inner")):
        known.write_text("".join(line(cluster, n) for n in ("node01", "node02", "node03") if n != missing))
        async with pool(ssh_config, known) as p:
            for n in nodes:
                with pytest.raises(
                    HostKeyError, match=f"unknown host key: jump host {hop} \\(ProxyJump to {n.name}\\)"
                ):
                    await p.run(n, ["true"])
