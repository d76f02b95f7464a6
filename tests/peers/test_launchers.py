"""Every launch mode against its real launcher, across two sshd test nodes (`make test-peers`).

Each job runs tests/peers/rank_allreduce.py (or tf_worker.py) under the launcher its mode gives it, with the
peer environment's Python (.venv-peers, pinned in requirements.txt) on CPU: gloo for torch, DeepSpeed's CPU
accelerator (``DS_ACCELERATOR=cpu``), TensorFlow's CPU build. The simulated GPUs of the nodes only steer
placement (CUDA_VISIBLE_DEVICES, DeepSpeed's --include). Every rank all-reduces (1, rank, node number), so
each record's sum proves the world size, every rank once and the nodes they ran on; each record also holds the
env the rank saw (the job's env: and our FT_ variables must reach every rank, whichever process started it).
All traffic is on loopback: the nodes are 127.0.0.11 and 127.0.0.12, gloo and the launchers are bound to lo.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.serve.api import ApiClient
from tests.integration.test_scheduler_sshd import log_of, running, write_config
from tests.peers.nodessh import ssh_bin
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

HERE = Path(__file__).resolve().parent
PEERS = HERE.parents[1] / ".venv-peers"
RANK = str(HERE / "rank_allreduce.py")
TF_WORKER = str(HERE / "tf_worker.py")
JOB_WAIT = 180.0  # a job's whole life; torch, DeepSpeed and TensorFlow start slowly on 2 cores
MARK = 'it\'s "quoted" $HOME `id` a;b|c & 2 spaces'  # the job's own env value that must reach every rank
# OpenMPI's session folders (/tmp/ompi.HOST.UID/jf.N/...; N a 16-bit hash of mpirun's pid): the lab's nodes share
# one /tmp and one host name, and the orted of a stopped job leaves its folder behind, so a later mpirun whose pid
# hashes alike failed ("File exists", once in a clean clone's run). Real nodes each have their own /tmp. Each of
# the suite's OpenMPI jobs keeps them in a folder of its own (`ompi_lab`), in one of this run, removed at its end.
OMPI_SESSIONS = Path(tempfile.mkdtemp(prefix="ompi-", dir="/tmp"))
OMPI_SESSIONS.chmod(0o1777)
atexit.register(shutil.rmtree, OMPI_SESSIONS, True)
# Open MPI on the lab: its daemons talk over loopback; and no topology shared through a hole mmapped at a fixed
# address (rtc_hwloc_vmhole none): Open MPI 4.1's orted segfaults in hwloc_shmem_topology_write now and then here
# (a CI run of 2026-11-26), an Open MPI fault that mpirun's users meet as "ORTE was unable to start daemons"
OMPI_LAB = {
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_rtc_hwloc_vmhole": "none",
}


def ompi_lab() -> dict[str, str]:
    """OMPI_LAB, with a session folder for this job alone (mpirun passes it on to the orted it starts)."""
    return {**OMPI_LAB, "OMPI_MCA_orte_tmpdir_base": tempfile.mkdtemp(prefix="j", dir=OMPI_SESSIONS)}


if not (PEERS / "bin" / "deepspeed").exists():
    pytest.exit(f"no peer environment at {PEERS}: run `make test-peers`, which installs it", returncode=2)


async def finished(client: ApiClient, job_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_WAIT
    while time.monotonic() < deadline:
        shown: dict[str, Any] = await client.call("show", job=job_id)
        if shown["status"] not in ("queued", "running"):
            return shown
        await asyncio.sleep(0.5)
    raise AssertionError(f"job {job_id} still {shown['status']} after {JOB_WAIT:g}s: {shown['message']}")


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class Peers:
    """A two-node cluster (4 simulated GPUs each), node-to-node SSH for jobs, a results folder per job."""

    def __init__(self, cluster: SshdCluster, root: Path, sock_dir: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.loaded = write_config(cluster, root, sock_dir)
        self.sock_dir = sock_dir
        self.ssh = ssh_bin(cluster, root / "ssh-bin")
        self.hosts = {n.name: n.address for n in cluster}

    def env(self, results: Path, *first_on_path: Path, **extra: str) -> dict[str, str]:
        results.mkdir(parents=True, exist_ok=True)
        path = ":".join([*(str(p) for p in first_on_path), str(self.ssh), str(PEERS / "bin"), "/usr/bin", "/bin"])
        return {
            "PATH": path,
            "PEER_RESULTS": str(results),
            "PEER_MARK": MARK,
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def spec(self, name: str, mode: str, command: str, env: dict[str, str], **fields: Any) -> dict[str, Any]:
        return {
            "name": name,
            "mode": mode,
            "nodes": 2,
            "gpus_per_node": 2,
            "command": command,
            "workdir": str(self.root),
            "env": env,
            **fields,
        }


@pytest.fixture
def peers(sshd_cluster, tmp_path: Path, sock_dir: Path) -> Peers:
    return Peers(sshd_cluster(2, gpus=4), tmp_path, sock_dir)


def records(results: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(p.read_text()) for p in results.glob("*.json")), key=lambda r: r["rank"])


async def check_job(
    client: ApiClient,
    shown: dict[str, Any],
    results: Path,
    *,
    world: int = 4,
    status: str = "succeeded",
    exit_code: int = 0,
    per_node: int = 2,
) -> list[dict[str, Any]]:
    """The job ended as expected, every rank all-reduced the same sum, and saw the job's env and ours."""
    log = await log_of(client, shown["id"])
    assert (shown["status"], shown["exit_code"]) == (status, exit_code), f"{shown['message']}\n{log[-6000:]}"
    got = records(results)
    assert [r["rank"] for r in got] == list(range(world)), log[-6000:]
    nodes = Counter(r["node"] for r in got)
    assert all(count == per_node for count in nodes.values()) and len(nodes) == world // per_node, nodes
    node_sum = sum(int(r["node"].removeprefix("node")) for r in got)
    for r in got:
        assert r["world"] == world
        assert r["sum"] == [world, sum(range(world)), node_sum]
        assert r["env"]["PEER_MARK"] == MARK, r
        assert r["env"]["FT_JOB_ID"] == str(shown["id"]), r
        assert r["env"]["FT_ATTEMPT"] == "1", r
    return got


# -- pytorch ----------------------------------------------------------------------------------------------------


async def test_pytorch_static_wrapping_in_torch_distributed_run(peers: Peers) -> None:
    results = peers.root / "results"
    async with running(peers.loaded) as (_, client):
        job = await client.call("submit", spec=peers.spec("torch", "pytorch", f"python {RANK}", peers.env(results)))
        shown = await finished(client, job["id"])
        got = await check_job(client, shown, results)
    for r in got:
        assert r["env"]["FT_OUTPUT_DIR"].endswith("/output")
        assert r["env"]["FT_HOSTFILE"].endswith("/hostfile")


async def test_pytorch_users_own_torchrun_with_c10d_is_left_alone(peers: Peers) -> None:
    """The user's torchrun, c10d rendezvous on node01; rank 3 exits 3, which torchrun reports as 1."""
    results = peers.root / "results"
    endpoint = f"{peers.hosts['node01']}:{free_port(peers.hosts['node01'])}"
    command = (
        f"torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint={endpoint} "
        f"--rdzv_id=peers --max_restarts=0 {RANK}"
    )
    async with running(peers.loaded) as (_, client):
        job = await client.call(
            "submit", spec=peers.spec("c10d", "pytorch", command, peers.env(results, PEER_EXIT="3:3"))
        )
        shown = await finished(client, job["id"])
        runs = shown["attempts"][0]["runs"]
        assert all(r["launch"] for r in runs)
        await check_job(client, shown, results, status="error", exit_code=1)


async def test_pytorch_step_in_a_kept_allocation_runs_torch_distributed_run_on_both_nodes(peers: Peers) -> None:
    """`ftconsole run ALLOC --mode pytorch -- python rank_allreduce.py` in a kept allocation (the job `ftconsole
    alloc --keep --nodes 2` submits, with the peers' env: a step's env is the allocation's env.json and its own):
    torch.distributed.run on each node starts one process per slot, all of them all-reduce together."""
    results = peers.root / "results"
    # alloc_cli.allocation_spec's job (the alloc command has no env: option; a step's env comes from the job's)
    spec = peers.spec("alloc", "pytorch", "sleep infinity", peers.env(results), hang_detect="off")
    argv = [str(PEERS / "bin" / "python"), RANK]
    async with running(peers.loaded) as (_, client):
        alloc = int((await client.call("submit", spec=spec))["id"])
        try:
            deadline = time.monotonic() + JOB_WAIT
            while True:  # as `alloc` waits: the job runs and so does every rank it launches
                shown = await client.call("show", job=alloc)
                runs = [r for a in shown["attempts"] if a["number"] == shown["attempt"] for r in a["runs"]]
                if shown["status"] == "running" and runs and all(r["state"] == "running" for r in runs if r["launch"]):
                    break
                assert shown["status"] in ("queued", "running"), shown["message"]
                assert time.monotonic() < deadline, f"allocation {alloc} {shown['status']}: {shown['message']}"
                await asyncio.sleep(0.5)
            step = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ftconsole.cli", "run", str(alloc), "--mode", "pytorch", "--label", "--", *argv,
                env={**os.environ, "FTCONSOLE_CONFIG": str(peers.loaded.file)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                out, err = await asyncio.wait_for(step.communicate(), JOB_WAIT)
            finally:
                if step.returncode is None:  # timed out: Ctrl-C, which cancels the step and stops its processes
                    step.send_signal(signal.SIGINT)
                    await asyncio.wait_for(step.wait(), 30)
            said = f"{out.decode()[-4000:]}\n{err.decode()[-4000:]}"
            assert step.returncode == 0, said
            steps = (await client.call("show", job=alloc))["steps"]
        finally:
            await client.call("stop", jobs=[alloc])
            stopped = await finished(client, alloc)
    assert stopped["status"] == "stopped", stopped["message"]
    slots = {r["node"]: len(r["gpus"]) for r in runs}  # the allocation's GPUs on each node: torchrun's SLOTS
    world = sum(slots.values())
    assert world == 2 * spec["gpus_per_node"] and len(slots) == 2, runs
    got = records(results)
    assert [r["rank"] for r in got] == list(range(world)), said
    nodes = Counter(r["node"] for r in got)
    assert nodes == Counter(slots) and set(nodes) == {"node01", "node02"}, nodes  # one process per slot, each node
    node_sum = sum(int(r["node"].removeprefix("node")) for r in got)
    gpus = {r["node"]: ",".join(str(g) for g in r["gpus"]) for r in runs}
    for r in got:
        assert r["world"] == world
        assert r["sum"] == [world, sum(range(world)), node_sum]
        assert r["env"]["PEER_MARK"] == MARK, r  # the allocation's env: reached every rank of the step
        assert r["env"]["FT_JOB_ID"] == str(alloc), r
        assert r["env"]["FT_HOSTFILE"].endswith("/steps/1/hostfile"), r  # the step's own
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == gpus[r["node"]], r  # the step took all the allocation's GPUs
    (only,) = steps
    assert (only["number"], only["state"], only["mode"], only["exit_code"]) == (1, "succeeded", "pytorch", 0), only
    assert only["argv"] == argv and sorted(r["node"] for r in only["ranks"]) == ["node01", "node02"], only


# -- pytorch-deepspeed --------------------------------------------------------------------------------------------


async def test_deepspeed_runner_over_pdsh_on_gpus_0_1_and_on_gpus_2_3(peers: Peers) -> None:
    """Two jobs at once share the nodes: the second gets GPUs 2,3 of each (issue 15, defect 1); every rank
    of both sees the job's env and ours through DeepSpeed's env file (defect 2); the second's rank 3 exits 3,
    which reaches the job through pdsh -S and the runner."""
    low, high = peers.root / "low", peers.root / "high"
    async with running(peers.loaded) as (_, client):
        first = await client.call(
            "submit",
            spec=peers.spec("ds01", "pytorch-deepspeed", f"deepspeed {RANK}", peers.env(low, DS_ACCELERATOR="cpu")),
        )
        second = await client.call(
            "submit",
            spec=peers.spec(
                "ds23", "pytorch-deepspeed", f"deepspeed {RANK}", peers.env(high, DS_ACCELERATOR="cpu", PEER_EXIT="3:3")
            ),
        )
        shown_low = await finished(client, first["id"])
        shown_high = await finished(client, second["id"])
        assert [r["gpus"] for r in shown_low["attempts"][0]["runs"]] == [[0, 1], [0, 1]]
        assert [r["gpus"] for r in shown_high["attempts"][0]["runs"]] == [[2, 3], [2, 3]]
        got_low = await check_job(client, shown_low, low)
        got_high = await check_job(client, shown_high, high, status="error", exit_code=3)
        log = await log_of(client, second["id"])
    assert "== ftconsole: ssh check ==" in log and "ftconsole: ssh check: node0" in log
    assert {r["env"]["CUDA_VISIBLE_DEVICES"] for r in got_low} == {"0,1"}
    assert {r["env"]["CUDA_VISIBLE_DEVICES"] for r in got_high} == {"2,3"}  # set per node by deepspeed's launch


def job_processes(job_id: int) -> list[int]:
    """The processes on this machine (every node of the lab shares it) whose environment names job `job_id`."""
    mine = f"FT_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_stopped_deepspeed_job_ends_alone_and_leaves_nothing_on_either_node(peers: Peers) -> None:
    """DeepSpeed's runner, on SIGTERM, pkills every DeepSpeed launcher of its user on the job's nodes: a stop of one
    job ended the user's other DeepSpeed jobs there. The runner now gets SIGKILL, and the stopped job's ranks on
    each node end as what it left there: the other job succeeds, and nothing of the stopped one is left."""
    low, high = peers.root / "low", peers.root / "high"
    # the runner's handler takes a second or two: with the suite's 2 s grace period it was SIGKILLed before its pkill
    loaded = write_config(peers.cluster, peers.root / "grace", peers.sock_dir, scheduler={"tick": "0.3s",
                          "stop_grace": "20s"})  # fmt: skip
    async with running(loaded) as (_, client):
        first = await client.call(
            "submit", spec=peers.spec("ds01", "pytorch-deepspeed", f"deepspeed {RANK}",
                                      peers.env(low, DS_ACCELERATOR="cpu", PEER_SLEEP="25")),
        )  # fmt: skip
        second = await client.call(
            "submit", spec=peers.spec("ds23", "pytorch-deepspeed", f"deepspeed {RANK}",
                                      peers.env(high, DS_ACCELERATOR="cpu", PEER_SLEEP="600")),
        )  # fmt: skip
        deadline = time.monotonic() + JOB_WAIT
        while len(list(high.glob("*.json"))) < 4 or len(list(low.glob("*.json"))) < 4:  # both all-reduced
            assert time.monotonic() < deadline, (list(low.iterdir()), list(high.iterdir()))
            await asyncio.sleep(0.5)
        assert job_processes(second["id"]), "the second job runs on the nodes"
        await client.call("stop", jobs=[second["id"]])
        shown_high = await finished(client, second["id"])
        shown_low = await finished(client, first["id"])
        assert shown_high["status"] == "stopped", shown_high["message"]
        await check_job(client, shown_low, low)  # its ranks were not killed with the other's
        deadline = time.monotonic() + 60  # the other node's: SIGTERM, SIGKILL after the stop's grace period
        while (left := job_processes(second["id"])) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert not left, f"processes of the stopped job still run: {left}"
        events = [e["kind"] for e in (await client.call("show", job=second["id"]))["events"]]
    assert "Leftovers" in events  # the second node's ranks, which its launcher started there


# -- horovod (OpenMPI) --------------------------------------------------------------------------------------------


async def test_horovod_mode_mpirun_prefix_with_openmpi(peers: Peers) -> None:
    """The generated mpirun prefix (OpenMPI's mpirun on PATH); rank 2 exits 5, which mpirun passes on."""
    results = peers.root / "results"
    env = peers.env(results, PEER_EXIT="2:5", **ompi_lab())
    async with running(peers.loaded) as (_, client):
        job = await client.call("submit", spec=peers.spec("ompi", "horovod", f"python {RANK}", env))
        shown = await finished(client, job["id"])
        assert [r["launch"] for r in shown["attempts"][0]["runs"]] == [True, False]
        await check_job(client, shown, results, status="error", exit_code=5)


# -- mpich (hydra) ------------------------------------------------------------------------------------------------


async def test_mpich_mode_hydra_reads_the_hostfile(peers: Peers) -> None:
    """Debian's MPICH: `mpirun` on PATH is hydra's (as on an MPICH cluster); it reads HYDRA_HOST_FILE."""
    results = peers.root / "results"
    mpich = peers.root / "mpich-bin"
    mpich.mkdir()
    # a script, not a link: hydra looks for hydra_pmi_proxy beside the mpiexec it was started as
    (mpich / "mpirun").write_text('#!/bin/sh\nexec /usr/bin/mpirun.mpich "$@"\n')
    (mpich / "mpirun").chmod(0o755)
    async with running(peers.loaded) as (_, client):
        env = peers.env(results, mpich, HYDRA_IFACE="lo")
        job = await client.call("submit", spec=peers.spec("hydra", "mpich", f"python {RANK}", env))
        shown = await finished(client, job["id"])
        await check_job(client, shown, results)


# -- tensorflow ---------------------------------------------------------------------------------------------------


async def test_tensorflow_multi_worker_mirrored_strategy_reads_tf_config(peers: Peers) -> None:
    results = peers.root / "results"
    env = peers.env(results, TF_CPP_MIN_LOG_LEVEL="2", CUDA_HOME="")
    async with running(peers.loaded) as (_, client):
        job = await client.call("submit", spec=peers.spec("tf", "tensorflow", f"python {TF_WORKER}", env))
        shown = await finished(client, job["id"])
        await check_job(client, shown, results, world=2, per_node=1)


# -- single ---------------------------------------------------------------------------------------------------------


async def test_single_runs_the_command_as_given(peers: Peers) -> None:
    results = peers.root / "results"
    async with running(peers.loaded) as (_, client):
        spec = peers.spec("one", "single", f"python {RANK}", peers.env(results, PEER_EXIT="0:4"), nodes=1)
        job = await client.call("submit", spec=spec)
        shown = await finished(client, job["id"])
        await check_job(client, shown, results, world=1, per_node=1, status="error", exit_code=4)


# -- the pre-launch SSH check ---------------------------------------------------------------------------------------


async def test_ssh_check_fails_the_attempt_naming_the_node_pair(peers: Peers) -> None:
    """Rank 0's node cannot reach the other (an empty known_hosts): the attempt fails before mpirun runs."""
    empty = peers.root / "empty_known_hosts"
    empty.write_text("")
    broken = ssh_bin(peers.cluster, peers.root / "broken-ssh", known_hosts=empty)
    results = peers.root / "results"
    async with running(peers.loaded) as (_, client):
        job = await client.call(
            "submit", spec=peers.spec("nossh", "horovod", f"python {RANK}", peers.env(results, broken))
        )
        shown = await finished(client, job["id"])
        log = await log_of(client, job["id"])
    runs = shown["attempts"][0]["runs"]
    first, other = runs[0]["node"], runs[1]["node"]
    assert (shown["status"], shown["exit_code"]) == ("error", 255), shown["message"]
    pair = f"ftconsole: ssh check: {first} cannot reach {other} ({peers.hosts[other]}) by SSH without a prompt: "
    assert pair + "Host key verification failed. (ssh exit 255)" in log, log
    assert re.search(rf"mpirun \(OpenMPI\) starts this job's ranks from {first} over SSH as \w+", log), log
    assert "known_hosts" in log and "authorized_keys" in log
    assert "== ftconsole: command ==" not in log  # mpirun never started
    assert not list(results.glob("*.json"))
    # show and the console name the pair too: the run's error quotes the check's last line
    assert shown["message"].startswith(f"rank 0 on {first} exited with code 255 (ssh check exited with code 255: ")
    assert pair in shown["message"], shown["message"]
