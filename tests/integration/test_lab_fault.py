"""Faults injected into lab nodes (`ftconsole lab fault`, `LabCluster.fault`), checked by what they really do.

A real lab each time (a background server in a temporary folder, or one in this process); real SSH to its
nodes, real processes on them, real probes; every wait bounded; the lab healed and stopped in `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from ftconsole import cli
from ftconsole.lab import (
    Fault,
    FaultKind,
    LabCluster,
    LabInfo,
    NodeState,
    control,
    find_lab_processes,
    lab_down,
    lab_fault,
    lab_status,
    lab_up,
    pid_alive,
)
from ftconsole.scheduler.errors import LabError, NotFound, UsageError
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import load_config

TIMEOUT = 20.0  # the most any one wait may take
SILENT = 0.5  # how long a hung node must stay silent (a banner on loopback takes milliseconds)


def ftconsole(lab_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ftconsole ARGS` as a user runs it, with the lab folder in FTCONSOLE_LAB_DIR."""
    return subprocess.run(
        [sys.executable, "-m", "ftconsole.cli", *args],
        env={**os.environ, "FTCONSOLE_LAB_DIR": str(lab_dir), "TERM": "dumb"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def fault_cli(lab_dir: Path, node: str, *options: str) -> dict[str, Any]:
    done = ftconsole(lab_dir, "lab", "fault", node, *options, "--json")
    assert done.returncode == 0, f"lab fault {node} {options}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return dict(json.loads(done.stdout))


@pytest.fixture
def background_lab(tmp_path: Path) -> Iterator[LabInfo]:
    """A background lab of 2 nodes (lab01: 8 GPUs, lab02: 4), healed and stopped afterwards."""
    lab_dir = tmp_path / "lab"
    info = lab_up(lab_dir, None, nodes=2, timeout=30)
    try:
        yield info
    finally:
        try:
            for node in info.nodes:
                with contextlib.suppress(LabError):
                    lab_fault(lab_dir, node.name, Fault.heal(), timeout=TIMEOUT)
        finally:
            lab_down(lab_dir, timeout=10)
    assert find_lab_processes(lab_dir) == [], "lab down left a process of a node"


def connect_options(info: LabInfo, node: str) -> dict[str, Any]:
    ssh = yaml.safe_load(info.config_path.read_text())["ssh"]
    return {
        "host": "127.0.0.1",
        "port": info.node(node).port,
        "username": ssh["user"],
        "known_hosts": ssh["known_hosts"],
        "client_keys": [ssh["identity_file"]],
        "agent_path": None,
        "config": [],
    }


async def ssh_run(info: LabInfo, node: str, command: str, timeout: float = TIMEOUT) -> str:
    async with asyncio.timeout(timeout), asyncssh.connect(**connect_options(info, node)) as conn:
        done = await conn.run(command, check=True)
    return str(done.stdout)


async def start_sleeper(info: LabInfo, node: str) -> int:
    """A `sleep 300` started through `node` in a session of its own (as a run supervisor is): its pid."""
    return int(await ssh_run(info, node, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"))


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return None


async def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def banner(port: int, timeout: float) -> bytes:
    """What the port sends in the first `timeout` seconds after a TCP connect (b"" when nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            return sock.recv(64)
        except TimeoutError:
            return b""


async def probe(info: LabInfo, node: str) -> dict[str, Any]:
    """Probe `node` now through the project's probe API (what `ftconsole probe NODE --json` prints)."""
    async with asyncio.timeout(TIMEOUT), ClusterService.open(load_config(info.config_path)) as service:
        (outcome,) = await service.probe(node)
    return dict(outcome.to_json())


def cli_main(*args: str) -> tuple[int, str, str]:
    """`ftconsole ARGS` in this process (the same code as the command): exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's errors
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


# -- through the command line, against the background lab -------------------------------------------------


async def test_kill_drops_connections_refuses_new_ones_and_kills_the_nodes_processes(background_lab: LabInfo) -> None:
    info = background_lab
    detached = await start_sleeper(info, "lab02")
    port = info.node("lab02").port
    async with asyncio.timeout(TIMEOUT), asyncssh.connect(**connect_options(info, "lab02")) as conn:
        attached = await conn.create_process("echo $$; exec sleep 300")
        attached_pid = int(await attached.stdout.readline())

        report = fault_cli(info.lab_dir, "lab02", "--kill")

        await conn.wait_closed()  # dropped by the node, not by us
    assert report["fault"] == "kill" and report["state"] == "down"
    assert {detached, attached_pid} <= set(report["processes"])
    assert "lab02 killed" in report["message"] and "new ones refused" in report["message"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()
    with pytest.raises(OSError):
        await ssh_run(info, "lab02", "true")
    assert await wait_until(lambda: not pid_alive(detached) and not pid_alive(attached_pid)), "a process survived"
    assert find_lab_processes(info.lab_dir, "lab02") == []
    assert (await ssh_run(info, "lab01", "echo up")) == "up\n", "the other node went down too"
    status = lab_status(info.lab_dir)
    assert status is not None and status.node("lab02").state == "down" and status.node("lab02").up is False

    healed = fault_cli(info.lab_dir, "lab02", "--heal")
    assert healed["state"] == "up" and "back up" in healed["message"]
    assert (await ssh_run(info, "lab02", "echo $FTCONSOLE_LAB_NODE")) == "lab02\n"  # same port, same host key


async def test_with_a_shared_home_kill_and_hang_act_only_on_their_nodes_processes(tmp_path: Path) -> None:
    """Every node's HOME is <lab>/home, so their processes share a folder: faults go by FTCONSOLE_LAB_NODE."""
    lab_dir = tmp_path / "lab"
    info = lab_up(lab_dir, None, nodes=2, timeout=30, shared_home=True)
    try:
        assert info.shared_home is True and json.loads((lab_dir / "lab.json").read_text())["shared_home"] is True
        homes = [await ssh_run(info, n, "echo $HOME; pwd") for n in ("lab01", "lab02")]
        assert homes == [f"{lab_dir / 'home'}\n" * 2] * 2
        with pytest.raises(LabError, match="runs with one home shared by its nodes"):
            lab_up(lab_dir, None, shared_home=False)
        survivor, doomed = await start_sleeper(info, "lab01"), await start_sleeper(info, "lab02")
        assert all(os.readlink(f"/proc/{pid}/cwd") == str(lab_dir / "home") for pid in (survivor, doomed))

        hung = fault_cli(lab_dir, "lab01", "--hang")
        assert survivor in hung["processes"] and doomed not in hung["processes"]
        assert await wait_until(lambda: proc_state(survivor) == "T")
        assert proc_state(doomed) in ("S", "R"), "a hang of lab01 stopped a process of lab02"
        assert fault_cli(lab_dir, "lab01", "--heal")["processes"] == [survivor]

        killed = fault_cli(lab_dir, "lab02", "--kill")
        assert doomed in killed["processes"] and survivor not in killed["processes"]
        assert await wait_until(lambda: not pid_alive(doomed)), "lab02's process survived its node's death"
        assert pid_alive(survivor) and proc_state(survivor) in ("S", "R"), "lab02's death ended a process of lab01"
        assert find_lab_processes(lab_dir, "lab02") == [] and survivor in find_lab_processes(lab_dir, "lab01")
        assert (await ssh_run(info, "lab01", "echo up")) == "up\n"
    finally:
        with contextlib.suppress(LabError):
            lab_fault(lab_dir, "lab02", Fault.heal(), timeout=TIMEOUT)
        lab_down(lab_dir, timeout=10)
    assert not pid_alive(survivor) and find_lab_processes(lab_dir) == [], "lab down left a process of a node"


async def test_hang_freezes_ssh_and_stops_the_nodes_processes_until_heal(background_lab: LabInfo) -> None:
    info = background_lab
    sleeper = await start_sleeper(info, "lab01")
    port = info.node("lab01").port
    async with asyncio.timeout(TIMEOUT), asyncssh.connect(**connect_options(info, "lab01")) as conn:
        report = fault_cli(info.lab_dir, "lab01", "--hang")
        assert report["fault"] == "hang" and report["state"] == "hung"
        assert sleeper in report["processes"] and "1 connection held open" in report["message"]

        assert await wait_until(lambda: proc_state(sleeper) == "T"), f"state {proc_state(sleeper)}, not stopped"
        assert banner(port, SILENT) == b"", "a hung node's port sent something"  # TCP accepted, nothing answers
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(SILENT), asyncssh.connect(**connect_options(info, "lab01")):
                pass
        open_run = asyncio.ensure_future(conn.run("echo still-here", check=True))
        done, _ = await asyncio.wait([open_run], timeout=SILENT)
        assert not done, "a command on an open connection of a hung node was answered"
        assert (await ssh_run(info, "lab02", "echo up")) == "up\n", "the other node hung too"

        healed = fault_cli(info.lab_dir, "lab01", "--heal")
        assert healed["state"] == "up" and sleeper in healed["processes"]
        assert "answering again" in healed["message"] and "1 process continued" in healed["message"]
        assert str((await open_run).stdout) == "still-here\n"  # the open connection goes on where it stopped
    assert await wait_until(lambda: proc_state(sleeper) in ("S", "R")), f"state {proc_state(sleeper)} after heal"
    assert banner(port, TIMEOUT).startswith(b"SSH-")
    assert (await ssh_run(info, "lab01", "echo back")) == "back\n"


async def test_gpu_ecc_makes_the_next_probe_unhealthy_and_heal_clears_it(background_lab: LabInfo) -> None:
    info = background_lab
    report = fault_cli(info.lab_dir, "lab02", "--gpu-ecc", "3")
    assert report["fault"] == "gpu-ecc" and report["gpu"] == 3 and report["ecc_uncorrectable"] == [0, 0, 0, 1]
    gpus = json.loads((info.lab_dir / "nodes" / "lab02" / "gpus.json").read_text())["gpus"]
    assert [g["ecc_uncorrectable"] for g in gpus] == [0, 0, 0, 1]

    sick = ftconsole(info.lab_dir, "--config", str(info.config_path), "probe", "lab02")
    assert sick.returncode == 1, sick.stderr  # a probed node is not healthy
    assert "unhealthy" in sick.stdout and "GPU 3: 1 uncorrectable ECC errors" in sick.stdout, sick.stdout

    again = lab_fault(info.lab_dir, "lab02", Fault.gpu_ecc(3), timeout=TIMEOUT)
    assert again.ecc_uncorrectable == (0, 0, 0, 2)  # one more error each time, as a real counter
    assert any("GPU 3: 2 uncorrectable ECC" in r for r in (await probe(info, "lab02"))["reasons"])
    healed = lab_fault(info.lab_dir, "lab02", Fault.heal(), timeout=TIMEOUT)
    assert healed.ecc_uncorrectable == (0, 0, 0, 0) and "2 uncorrectable ECC errors cleared" in healed.message
    checked = await probe(info, "lab02")  # the GPU passes at once; the node's state follows its hysteresis
    assert [c["status"] for c in checked["checks"] if c["name"] == "gpu-health"] == ["pass"], checked["checks"]
    assert [g["ecc_uncorrectable"] for g in checked["gpus"]] == [0, 0, 0, 0]
    assert "recovering: 1 of 2 probes healthy" in checked["reasons"]  # probes.recover_after: 2
    well = await probe(info, "lab02")
    assert (well["state"], well["reasons"]) == ("healthy", [])


async def test_reboot_kills_the_nodes_processes_and_comes_back_with_a_new_boot_id(background_lab: LabInfo) -> None:
    info = background_lab
    before = await probe(info, "lab02")
    sleeper = await start_sleeper(info, "lab02")
    fault_cli(info.lab_dir, "lab02", "--gpu-ecc", "1")
    report = fault_cli(info.lab_dir, "lab02", "--reboot")
    assert report["fault"] == "reboot" and report["state"] == "up" and sleeper in report["processes"], report
    assert "lab02 rebooted: " in report["message"] and report["ecc_uncorrectable"] == [0, 0, 0, 0]
    assert await wait_until(lambda: not pid_alive(sleeper)), "a process of the node outlived its reboot"
    after = await probe(info, "lab02")  # it answers at once, with another boot id, and the scheduler says so
    assert after["facts"]["boot_id"] and after["facts"]["boot_id"] != before["facts"]["boot_id"]
    assert (await ssh_run(info, "lab02", "echo back")) == "back\n"


async def test_bad_input_is_refused_with_what_is_wrong(background_lab: LabInfo, tmp_path: Path) -> None:
    lab_dir = background_lab.lab_dir
    unknown = ftconsole(lab_dir, "lab", "fault", "lab09", "--kill")  # one as a process, the rest in this one
    assert unknown.returncode == 2 and "ftconsole: not found: no node 'lab09' in the lab" in unknown.stderr
    cases = [
        (("lab09", "--kill"), 2, "no node 'lab09' in the lab"),
        (("lab02", "--gpu-ecc", "4"), 2, "lab02 has 4 GPUs (0-3): no GPU 4"),
        (("lab02", "--gpu-ecc", "-1"), 2, "GPU index -1 is negative"),
        (("lab02", "--gpu-ecc", "two"), 2, "invalid int value: 'two'"),
        (("lab02", "--kill", "--hang"), 2, "argument --hang: not allowed with argument --kill"),
        (("lab02",), 2, "one of the arguments --kill --hang --gpu-ecc --reboot --heal is required"),
    ]
    for args, code, message in cases:
        status, out, err = cli_main("lab", "fault", "--dir", str(lab_dir), *args)
        assert (status, out) == (code, ""), (args, status, out, err)
        assert message in err, (args, err)

    status, out, _ = cli_main("lab", "fault", "--dir", str(lab_dir), "lab02", "--kill")
    assert status == 0 and out.startswith("lab02 killed: ")
    status, _, err = cli_main("lab", "fault", "--dir", str(lab_dir), "lab02", "--hang")
    assert status == 1 and "ftconsole: lab: lab02 is down: a dead node cannot hang" in err

    status, _, err = cli_main("lab", "fault", "--dir", str(tmp_path / "no-lab"), "lab01", "--heal")
    assert status == 1 and f"no lab is running in {tmp_path / 'no-lab'}" in err
    with pytest.raises(LabError, match="no lab is running"):
        lab_fault(tmp_path / "no-lab", "lab01", Fault.kill())
    with pytest.raises(NotFound, match="lab09"):  # the Python API raises what the CLI prints
        lab_fault(lab_dir, "lab09", Fault.kill())


def test_the_control_socket_is_private_and_refuses_bad_requests(background_lab: LabInfo) -> None:
    path = background_lab.lab_dir / "lab.sock"
    assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o600
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendall(b"nonsense\n")
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["error"]["type"] == "UsageError" and "bad request" in reply["error"]["message"]
    with pytest.raises(UsageError, match="unknown fault 'explode'"):
        control.call(path, {"op": "fault", "node": "lab01", "fault": {"kind": "explode"}}, TIMEOUT)
    with pytest.raises(UsageError, match="unknown op 'reboot'"):
        control.call(path, {"op": "reboot"}, TIMEOUT)
    assert lab_fault(background_lab.lab_dir, "lab01", Fault.heal()).message == "lab01 was healthy: nothing to heal"


async def test_lab_down_ends_a_hung_nodes_stopped_processes(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    info = lab_up(lab_dir, None, nodes=1, timeout=30)
    try:
        sleeper = await start_sleeper(info, "lab01")
        lab_fault(lab_dir, "lab01", Fault.hang(), timeout=TIMEOUT)
        assert await wait_until(lambda: proc_state(sleeper) == "T")
    finally:
        started = time.monotonic()
        lab_down(lab_dir, timeout=10)
    assert time.monotonic() - started < 5, "lab down waited on the stopped processes"
    assert not pid_alive(sleeper) and find_lab_processes(lab_dir) == []
    assert not (lab_dir / "lab.sock").exists()


# -- in this process: LabCluster.fault --------------------------------------------------------------------


async def test_in_process_faults_freeze_and_resume_an_open_session(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=2) as lab:
        node = lab.node("lab02")
        try:
            async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab02")) as conn:
                cat = await conn.create_process("echo $$; exec cat")
                pid = int(await cat.stdout.readline())

                hung = await lab.fault("lab02", Fault.hang())
                assert (hung.fault.kind, hung.state, node.state) == (FaultKind.HANG, NodeState.HUNG, NodeState.HUNG)
                assert pid in hung.processes and node.listening is False
                assert await wait_until(lambda: proc_state(pid) == "T")
                cat.stdin.write("ping\n")
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(SILENT):
                        await cat.stdout.readline()

                healed = await lab.fault("lab02", Fault.heal())
                assert healed.state is NodeState.UP and healed.processes == (pid,)
                async with asyncio.timeout(TIMEOUT):
                    assert await cat.stdout.readline() == "ping\n"  # what waited in the frozen connection
                cat.stdin.write_eof()
                assert (await cat.wait()).exit_status == 0

            killed = await lab.fault("lab02", Fault.kill())
            assert killed.state is NodeState.DOWN and lab.info().node("lab02").state == "down"
            with pytest.raises(OSError):
                async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab02")):
                    pass
            with pytest.raises(LabError, match="cannot hang"):
                await lab.fault("lab02", Fault.hang())
            with pytest.raises(UsageError, match="no GPU 8"):
                await lab.fault("lab01", Fault.gpu_ecc(8))
            with pytest.raises(NotFound):
                await lab.fault("lab03", Fault.heal())
            nothing = await lab.fault("lab01", Fault.heal())
            assert nothing.message == "lab01 was healthy: nothing to heal"
        finally:
            await lab.fault("lab02", Fault.heal())
        async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab02")) as conn:
            assert str((await conn.run("echo back", check=True)).stdout) == "back\n"


async def test_a_hung_node_can_be_killed_and_healed(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=1) as lab:
        try:
            async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab01")) as conn:
                process = await conn.create_process("echo $$; exec sleep 300")
                attached = int(await process.stdout.readline())
                await lab.fault("lab01", Fault.hang())
                assert await wait_until(lambda: proc_state(attached) == "T")
                started = time.monotonic()
                killed = await lab.fault("lab01", Fault.kill())
                assert time.monotonic() - started < 2.0, "the kill waited on the frozen session"
                assert killed.processes == (attached,) and killed.state is NodeState.DOWN
                assert await wait_until(lambda: not pid_alive(attached))
                await conn.wait_closed()
            healed = await lab.fault("lab01", Fault.heal())
            assert healed.state is NodeState.UP and healed.processes == ()
        finally:
            await lab.fault("lab01", Fault.heal())
        async with asyncio.timeout(TIMEOUT), asyncssh.connect(**lab.connect_options("lab01")) as conn:
            assert str((await conn.run("echo back", check=True)).stdout) == "back\n"


def test_a_lab_folder_deeper_than_a_socket_path_may_be(tmp_path: Path) -> None:
    lab_dir = tmp_path / ("deep" * 30) / "lab"  # lab.sock's path is over the kernel's 107 bytes
    assert len(str(lab_dir / "lab.sock")) > 107
    lab_up(lab_dir, None, nodes=1, timeout=30)
    try:
        assert lab_fault(lab_dir, "lab01", Fault.gpu_ecc(0)).ecc_uncorrectable[0] == 1
    finally:
        with contextlib.suppress(LabError):
            lab_fault(lab_dir, "lab01", Fault.heal())
        lab_down(lab_dir)
