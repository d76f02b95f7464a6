"""The lab cluster: in-process nodes over real SSH, its files, its layout, and the background server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from ftconsole import lab as labmod
from ftconsole.lab import (
    BUILTIN_LAYOUT,
    LabCluster,
    LabPaths,
    PidLock,
    lab_down,
    lab_status,
    lab_up,
    load_layout,
    parse_layout,
    pid_alive,
    plan_nodes,
    render_gpus,
)
from ftconsole.scheduler.errors import ConfigError, LabError
from ftconsole.scheduler.spec.config import load_config

CONFIG_LAB = Path(__file__).resolve().parents[2] / "config" / "lab.yaml"
TIMEOUT = 20.0


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[LabCluster]:
    async with LabCluster(tmp_path / "lab", nodes=2) as cluster:
        yield cluster


@dataclass(frozen=True)
class Ran:
    exit_status: int | None
    exit_signal: str | None
    stdout: str
    stderr: str


async def run(cluster: LabCluster, node: str, command: str, **kwargs: Any) -> Ran:
    async with asyncio.timeout(TIMEOUT), asyncssh.connect(**cluster.connect_options(node)) as conn:
        done = await conn.run(command, **kwargs)
    signal = done.exit_signal[0] if done.exit_signal else None
    return Ran(done.exit_status, signal, str(done.stdout or ""), str(done.stderr or ""))


async def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# -- sessions ---------------------------------------------------------------------------------------------


async def test_each_node_has_its_own_home_and_gpus(lab: LabCluster) -> None:
    for node in lab.nodes:
        result = await run(lab, node.name, "echo $HOME $FTCONSOLE_SIM_GPUS $FTCONSOLE_LAB_NODE; pwd")
        assert result.exit_status == 0, result.stderr
        first, cwd = result.stdout.splitlines()
        assert first.split() == [str(node.home), str(node.gpus_path), node.name]
        assert cwd == str(node.home)
        assert (node.home / "cache").is_dir()


async def test_shared_home_gives_every_node_the_same_home(tmp_path: Path) -> None:
    layout = parse_layout(BUILTIN_LAYOUT + "shared_home: true\n")
    async with LabCluster(tmp_path / "lab", layout, nodes=2) as cluster:
        shared = cluster.paths.shared_home
        assert shared == cluster.lab_dir / "home" and cluster.info().shared_home is True
        seen = []
        for node in cluster.nodes:
            result = await run(cluster, node.name, "echo $HOME $FTCONSOLE_LAB_NODE $FTCONSOLE_SIM_GPUS; pwd")
            assert result.exit_status == 0, result.stderr
            first, cwd = result.stdout.splitlines()
            seen.append(first.split())
            assert cwd == str(shared) and node.home == shared
        assert seen == [[str(shared), n.name, str(n.gpus_path)] for n in cluster.nodes]  # GPUs stay the node's
        assert (shared / "cache").is_dir()
        assert not (cluster.lab_dir / "nodes" / "lab01" / "home").exists()
        await run(cluster, "lab01", "echo from-lab01 > ~/note")
        assert (await run(cluster, "lab02", "cat ~/note")).stdout == "from-lab01\n"
    async with LabCluster(tmp_path / "lab2", nodes=2, shared_home=True) as overridden:  # the layout says false
        assert {n.home for n in overridden.nodes} == {overridden.paths.shared_home}
    async with LabCluster(tmp_path / "lab3", layout, nodes=2, shared_home=False) as own:
        assert [n.home for n in own.nodes] == [own.lab_dir / "nodes" / n.name / "home" for n in own.nodes]


async def test_stdin_reaches_the_command_with_its_eof(lab: LabCluster) -> None:
    result = await run(lab, "lab01", "cat", input="x")
    assert (result.exit_status, result.stdout) == (0, "x")
    big = await run(lab, "lab01", "wc -c", input="y" * 1_000_000)
    assert big.stdout.strip() == "1000000"


async def test_exit_status_signal_and_stderr(lab: LabCluster) -> None:
    result = await run(lab, "lab02", "echo out; echo err >&2; exit 3")
    assert (result.exit_status, result.stdout, result.stderr) == (3, "out\n", "err\n")
    killed = await run(lab, "lab02", "kill -TERM $$")
    assert killed.exit_signal == "TERM"


async def test_client_env_is_passed_but_not_over_the_nodes_own(lab: LabCluster) -> None:
    result = await run(lab, "lab01", "echo $FOO $HOME", env={"FOO": "bar", "HOME": "/elsewhere"})
    assert result.stdout.split() == ["bar", str(lab.node("lab01").home)]


async def test_pty_sessions(lab: LabCluster) -> None:
    result = await run(lab, "lab01", "tty; echo $TERM", term_type="xterm")
    tty, term = result.stdout.split()
    assert tty.startswith("/dev/pts/") and term == "xterm"
    async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab01")) as conn:
        shell = await conn.create_process(term_type="xterm")  # `ssh node`: an interactive login shell
        shell.stdin.write("echo hi-$FTCONSOLE_LAB_NODE; exit 5\n")
        completed = await shell.wait()
    assert completed.exit_status == 5
    assert "hi-lab01" in str(completed.stdout)


async def test_gpus_json_follows_the_layout_and_may_be_edited_while_running(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab") as cluster:  # the default layout: 8 nodes
        assert [n.name for n in cluster.nodes] == [f"lab0{i}" for i in range(1, 9)]
        h100 = cluster.node("lab01").gpus()
        assert h100["driver_version"] == "550.54.15" and h100["load"] == "jobs"  # its jobs' GPUs read busy
        assert [g["name"] for g in h100["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
        faulty = cluster.node("lab07").gpus()["gpus"]
        assert len(faulty) == 4 and faulty[0]["name"] == "NVIDIA A100-SXM4-40GB"
        assert [g["ecc_uncorrectable"] for g in faulty] == [0, 0, 3, 0]
        cluster.node("lab03").update_gpu(1, temperature=99)
        result = await run(cluster, "lab03", 'cat "$FTCONSOLE_SIM_GPUS"')
        assert json.loads(result.stdout)["gpus"][1]["temperature"] == 99


async def test_unknown_client_key_is_refused(lab: LabCluster, tmp_path: Path) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    options = {**lab.connect_options("lab01"), "client_keys": [stranger]}
    with pytest.raises(asyncssh.PermissionDenied):
        async with asyncio.timeout(TIMEOUT), asyncssh.connect(**options):
            pass
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with (
            asyncio.timeout(TIMEOUT),
            asyncssh.connect(**{**lab.connect_options("lab01"), "known_hosts": str(empty)}),
        ):
            pass


async def test_disconnect_hangs_up_on_the_command_but_not_on_a_detached_process(lab: LabCluster) -> None:
    async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab02")) as conn:
        detached = await conn.run("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
        process = await conn.create_process("echo $$; exec sleep 300")
        attached = int(await process.stdout.readline())
    detached_pid = int(str(detached.stdout))
    assert await wait_until(lambda: not pid_alive(attached)), "the command of a closed session still runs"
    assert pid_alive(detached_pid), "a detached process was killed with its session"
    await lab.stop()
    assert await wait_until(lambda: not pid_alive(detached_pid)), "lab stop left a node process running"


async def test_a_lab_started_with_sighup_ignored_still_hangs_up_on_a_closed_sessions_command(tmp_path: Path) -> None:
    """A process started with SIGHUP ignored (nohup, a CI runner) passed SIG_IGN on to every command of the lab's
    sessions (an ignored signal survives exec), so a closed session's command ran on: the suite failed so under CI
    and passed from a terminal. As sshd does, a session's command now starts with SIGHUP at its default."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        async with LabCluster(tmp_path / "lab", nodes=1) as lab:
            async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab01")) as conn:
                process = await conn.create_process("echo $$; exec sleep 300")
                attached = int(await process.stdout.readline())
            assert await wait_until(lambda: not pid_alive(attached)), "the command of a closed session still runs"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


async def test_a_node_taken_off_the_network_keeps_its_detached_processes(lab: LabCluster) -> None:
    detached = await run(lab, "lab02", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    pid, port = int(detached.stdout), lab.node("lab02").port
    await lab.stop_node("lab02")
    assert lab.info().node("lab02").up is False
    with pytest.raises(OSError):
        await run(lab, "lab02", "true")
    assert pid_alive(pid)
    await lab.start_node("lab02")
    assert lab.node("lab02").port == port
    assert (await run(lab, "lab02", "echo back")).stdout == "back\n"  # same host key: known_hosts still valid
    await lab.stop_node("lab02", kill=True)
    assert await wait_until(lambda: not pid_alive(pid)), "a crashed node's process still runs"
    assert (await run(lab, "lab01", "echo up")).stdout == "up\n"


async def test_two_labs_cannot_share_a_folder(lab: LabCluster) -> None:
    with pytest.raises(LabError, match="in use by another lab server"):
        async with LabCluster(lab.lab_dir, nodes=1):
            pass


# -- files ------------------------------------------------------------------------------------------------


async def test_cluster_yaml_is_ready_to_use(lab: LabCluster) -> None:
    loaded = load_config(lab.config_path)
    nodes = loaded.cluster.node_list()
    assert [(n.name, n.host, n.port) for n in nodes] == [(n.name, "127.0.0.1", n.port) for n in lab.nodes]
    assert {n.pool for n in nodes} == {"h100", "a100"} and set(loaded.cluster.pools) == {"h100", "a100"}
    ssh = loaded.cluster.ssh
    assert ssh.identity_file == str(lab.paths.client_key) and ssh.known_hosts == str(lab.paths.known_hosts)
    assert ssh.config_file is None and ssh.user == lab.user
    assert loaded.state_dir == lab.paths.state_dir
    assert loaded.cluster.probes.cache_dir == "~/cache"
    assert loaded.cluster.probes.thresholds.disk_root_gb == 1
    hosts = lab.paths.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in hosts] == [f"[127.0.0.1]:{n.port}" for n in lab.nodes]


async def test_keys_and_ports_are_kept_across_restarts(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=2) as first:
        keys = [n.host_key_path.read_bytes() for n in first.nodes]
        ports = [n.port for n in first.nodes]
        client = first.paths.client_key.read_bytes()
    async with LabCluster(tmp_path / "lab", nodes=2) as second:
        assert [n.host_key_path.read_bytes() for n in second.nodes] == keys
        assert second.paths.client_key.read_bytes() == client
        assert [n.port for n in second.nodes] == ports
        assert (await run(second, "lab02", "echo ok")).stdout == "ok\n"


async def test_many_nodes_in_one_process(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=120) as cluster:
        assert cluster.nodes[0].name == "lab001" and cluster.nodes[-1].name == "lab120"
        picked = cluster.nodes[::20]
        results = await asyncio.gather(*(run(cluster, n.name, "echo $FTCONSOLE_LAB_NODE") for n in picked))
        assert [r.stdout.strip() for r in results] == [n.name for n in picked]


# -- the layout -------------------------------------------------------------------------------------------


def test_config_lab_yaml_matches_the_builtin_layout() -> None:
    from_file, builtin = load_layout(CONFIG_LAB), parse_layout(BUILTIN_LAYOUT)
    assert plan_nodes(from_file) == plan_nodes(builtin)
    assert from_file == builtin


def test_node_count_renames_nodes_and_faults_follow_the_number() -> None:
    layout = load_layout(CONFIG_LAB)
    three = plan_nodes(layout, 3)
    assert [(n.name, n.pool, n.gpus) for n in three] == [
        ("lab01", "h100", 8),
        ("lab02", "h100", 8),
        ("lab03", "a100", 4),
    ]
    many = plan_nodes(layout, 256)
    assert many[0].name == "lab001" and many[-1].name == "lab256"
    assert [n.pool for n in many].count("h100") == 128
    faulty = [n.name for n in many if n.faults]
    assert faulty == ["lab007"]
    assert render_gpus(many[6])["gpus"][2]["ecc_uncorrectable"] == 3
    with pytest.raises(LabError):
        plan_nodes(layout, 0)


def test_layout_with_an_unknown_key_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "lab.yaml"
    bad.write_text(
        "nodes:\n"
        "  - name: lab[01-02]\n"
        "    pool: h100\n"
        "    gpus: 8\n"
        "    gpu_modle: NVIDIA H100 80GB HBM3\n"
        "    memory_mib: 81559\n"
    )
    with pytest.raises(ConfigError) as err:
        load_layout(bad)
    text = str(err.value)
    assert f"{bad}:5: nodes[0].gpu_modle: unknown key" in text
    assert "nodes[0].gpu_model" in text  # and the missing one


def test_layout_cross_checks_name_their_lines(tmp_path: Path) -> None:
    bad = tmp_path / "lab.yaml"
    bad.write_text(
        "nodes:\n"
        "  - {name: 'lab[01-02]', pool: p, gpus: 2, gpu_model: G, memory_mib: 1}\n"
        "faults:\n"
        "  lab09: {unhealthy: {gpu: 0}}\n"
        "  lab02:\n"
        "    temperature: {gpu: 5, celsius: 90}\n"
        "cluster:\n"
        "  probes: {intervall: 5s}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_layout(bad)
    text = str(err.value)
    assert f"{bad}:4: faults.lab09: no node lab09 in nodes" in text
    assert f"{bad}:6: faults.lab02.temperature.gpu: lab02 has 2 GPUs" in text
    assert f"{bad}:8: cluster.probes.intervall: unknown key" in text


# -- the background server --------------------------------------------------------------------------------


def test_lab_up_status_down_in_the_background(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    assert lab_status(lab_dir) is None
    try:
        info = lab_up(lab_dir, None, nodes=3, timeout=30)
        assert [n.name for n in info.nodes] == ["lab01", "lab02", "lab03"] and info.all_up
        assert info.pid != os.getpid() and pid_alive(info.pid)
        assert json.loads((lab_dir / "lab.json").read_text())["pid"] == info.pid
        assert load_config(info.config_path).cluster.node_list()[2].port == info.nodes[2].port

        again = lab_up(lab_dir, None, timeout=30)
        assert again.pid == info.pid
        with pytest.raises(LabError, match="runs 3 nodes, not 4"):
            lab_up(lab_dir, None, nodes=4)

        status = lab_status(lab_dir)
        assert status is not None and status.pid == info.pid and all(n.up for n in status.nodes)
        assert asyncio.run(_remote_node_name(info.config_path, info.nodes[1].port)) == "lab02"
    finally:
        stopped = lab_down(lab_dir, timeout=10)
    assert stopped is True
    assert not pid_alive(info.pid)
    assert lab_status(lab_dir) is None and not (lab_dir / "lab.json").exists()
    assert labmod.find_lab_processes(lab_dir) == []
    assert lab_down(lab_dir) is False


async def _remote_node_name(config: Path, port: int) -> str:
    data = yaml.safe_load(config.read_text())
    options: dict[str, Any] = {
        "port": port,
        "username": data["ssh"]["user"],
        "known_hosts": data["ssh"]["known_hosts"],
        "client_keys": [data["ssh"]["identity_file"]],
        "agent_path": None,
        "config": [],
    }
    async with asyncio.timeout(TIMEOUT), asyncssh.connect("127.0.0.1", **options) as conn:
        result = await conn.run("echo $FTCONSOLE_LAB_NODE")
    return str(result.stdout).strip()


def test_lab_up_reports_a_server_that_fails_to_start(tmp_path: Path) -> None:
    paths = LabPaths.of(tmp_path / "lab")
    paths.root.mkdir(parents=True)
    lock = PidLock(paths.lock)
    lock.acquire()  # as if another server held the folder
    try:
        with pytest.raises(LabError, match="exited during start-up") as err:
            lab_up(paths.root, None, nodes=1, timeout=30)
        assert "in use by another lab server" in str(err.value)
    finally:
        lock.release()
        lab_down(paths.root)


def test_lab_down_without_a_lab(tmp_path: Path) -> None:
    assert lab_down(tmp_path / "nothing") is False
    assert lab_status(tmp_path / "nothing") is None
