"""The pre-launch SSH check against a real sshd (issue 25): it connects the way the launcher is told to.

The test node listens on a high port of 127.0.0.11 and takes only the cluster's client key, with its host key in
the cluster's known_hosts: plain ``ssh 127.0.0.11`` cannot get in (port 22, no key), the launcher's settings can.
The check runs here as the job's first node would run it (``python3 -c SOURCE ...``, as `plan_launch` plans it),
with an environment of its own: a HOME and an Open MPI sysconfdir of the test's, no launcher variable of ours.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.launcher import LaunchInput, NodeAssignment, plan_launch
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

CLOSED_PORT = 1  # nothing listens there on 127.0.0.11: refused at once
CHECK_TIMEOUT = 60  # seconds for one run of the check (it gives up on a peer after 10)


def check_argv(mode: str, argv: tuple[str, ...], node: str) -> tuple[str, ...]:
    """The check `plan_launch` plans for rank 0 of a two-node job whose second node is the sshd `node`; the first
    node is this machine (DeepSpeed's runner reaches it too: there it shares the sshd's address)."""
    first = NodeAssignment("gpu00", node if mode == "pytorch-deepspeed" else "127.0.0.10")
    inp = LaunchInput(job_id="j-1", attempt=1, mode=mode, argv=argv, env={}, workdir="/tmp", master_port=29500,
                      nodes=(first, NodeAssignment("node01", node)), run_root="/tmp/runs")  # fmt: skip
    check = plan_launch(inp).ssh_check
    assert check is not None
    return check


def run_check(check: tuple[str, ...], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PRTE_", "OPAL_", "HYDRA_", "PDSH_"))}
    full = base | {"HOME": str(root / "home"), "OPAL_SYSCONFDIR": str(root / "sysconf")} | env
    return subprocess.run([sys.executable, *check[1:]], env=full, capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT)  # fmt: skip


def ssh_options(cluster: SshdCluster, port: int | None) -> str:
    """ssh options that reach the node: no config file of this machine's, the cluster's key and known_hosts."""
    words = ["-F", "none", "-i", str(cluster.key), "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o",
             "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none"]  # fmt: skip
    return " ".join(words + ([] if port is None else ["-p", str(port)]))


@pytest.fixture
def world(sshd_cluster: Any, tmp_path: Path) -> tuple[SshdCluster, Path]:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    for folder in ("home/.openmpi", "sysconf", "bin"):
        (tmp_path / folder).mkdir(parents=True)
    return cluster, tmp_path


def test_plain_ssh_cannot_reach_the_node(world: tuple[SshdCluster, Path]) -> None:
    """What the check did before: plain ssh to port 22, the job refused though mpirun would get in."""
    cluster, root = world
    node = cluster["node01"]
    done = run_check(check_argv("horovod", ("python3", "t.py"), node.address), root, {})
    assert done.returncode == 255, done.stdout
    assert done.stderr.splitlines()[-1].startswith(f"ftconsole: ssh check: gpu00 cannot reach node01 ({node.address})")


@pytest.mark.parametrize(
    "how",
    ["OMPI_MCA_plm_rsh_args", "mpirun --mca", "mca-params.conf", "ssh config file", "agent script"],
)
def test_mpirun_told_how_to_connect_passes_the_check(how: str, world: tuple[SshdCluster, Path]) -> None:
    cluster, root = world
    node = cluster["node01"]
    options = ssh_options(cluster, node.port)
    env: dict[str, str] = {}
    argv: tuple[str, ...] = ("python3", "t.py")
    if how == "OMPI_MCA_plm_rsh_args":
        env["OMPI_MCA_plm_rsh_args"] = options
    elif how == "mpirun --mca":
        argv = ("mpirun", "-np", "2", "--mca", "plm_rsh_args", options, "python3", "t.py")
    elif how == "mca-params.conf":
        (root / "home" / ".openmpi" / "mca-params.conf").write_text(f"# mine\nplm_rsh_args = {options}\n")
    elif how == "ssh config file":  # as ~/.ssh/config would: its port and timeout, none of ours over them
        config = root / "ssh_config"
        config.write_text(f"Host {node.address}\n  Port {node.port}\n  IdentityFile {cluster.key}\n"
                          f"  UserKnownHostsFile {cluster.known_hosts}\n  IdentitiesOnly yes\n"
                          "  ConnectTimeout 7\n")  # fmt: skip
        env["OMPI_MCA_plm_rsh_args"] = f"-F {config}"
    else:  # another agent: run as mpirun would run it, AGENT HOST COMMAND
        agent = root / "bin" / "agent"
        agent.write_text(f'#!/bin/sh\nexec {shlex.join(["ssh", "-o", "BatchMode=yes", *options.split()])} "$@"\n')
        agent.chmod(0o755)
        env["OMPI_MCA_plm_rsh_agent"] = str(agent)
    done = run_check(check_argv("horovod", argv, node.address), root, env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("ftconsole: ssh check: gpu00 reaches node01 by SSH as mpirun (OpenMPI) does: ")
    assert ("ConnectTimeout=5" in done.stdout) is (how not in ("ssh config file", "agent script")), done.stdout


def test_mpirun_told_a_wrong_way_fails_naming_the_pair(world: tuple[SshdCluster, Path]) -> None:
    cluster, root = world
    node = cluster["node01"]
    env = {"OMPI_MCA_plm_rsh_args": ssh_options(cluster, CLOSED_PORT)}
    done = run_check(check_argv("horovod", ("python3", "t.py"), node.address), root, env)
    assert done.returncode == 255
    first, last = done.stderr.splitlines()[0], done.stderr.splitlines()[-1]
    assert last.startswith(f"ftconsole: ssh check: gpu00 cannot reach node01 ({node.address}) by SSH without a prompt")
    assert "Connection refused" in last
    assert f"-p {CLOSED_PORT} -o ConnectTimeout=5 HOST true' (plm_rsh_args from OMPI_MCA_plm_rsh_args)" in first


def test_deepspeed_pdsh_told_how_to_connect_passes_and_fails_without(world: tuple[SshdCluster, Path]) -> None:
    """DeepSpeed's runner: --ssh_port becomes pdsh's ``-p``, the rest comes from PDSH_SSH_ARGS_APPEND."""
    cluster, root = world
    node = cluster["node01"]
    check = check_argv("pytorch-deepspeed", ("deepspeed", "--ssh_port", str(node.port), "t.py"), node.address)
    done = run_check(check, root, {"PDSH_SSH_ARGS_APPEND": ssh_options(cluster, None)})
    assert (done.returncode, done.stderr) == (0, "")
    assert f"-p {node.port} -2 -a -x HOST true" in done.stdout
    done = run_check(check, root, {})  # the port alone: no key, no known host
    assert done.returncode == 255
    assert done.stderr.splitlines()[-1].startswith(f"ftconsole: ssh check: gpu00 cannot reach itself ({node.address})")
    port = shlex.join(["-p", str(node.port)])
    assert f"'ssh -o BatchMode=yes -oConnectTimeout=10 {port} -2 -a -x HOST true'" in done.stderr


def test_hydra_told_how_to_connect_passes(world: tuple[SshdCluster, Path]) -> None:
    cluster, root = world
    node = cluster["node01"]
    env = {"HYDRA_LAUNCHER_EXTRA_ARGS": ssh_options(cluster, node.port)}
    done = run_check(check_argv("mpich", ("python3", "t.py"), node.address), root, env)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    env = {"HYDRA_LAUNCHER_EXTRA_ARGS": ssh_options(cluster, CLOSED_PORT)}
    done = run_check(check_argv("mpich", ("python3", "t.py"), node.address), root, env)
    assert done.returncode == 255 and "Connection refused" in done.stderr.splitlines()[-1]
