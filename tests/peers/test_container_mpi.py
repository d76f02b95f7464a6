"""The MPI hybrid model of issue 17: mpirun on the host, each MPI process in a container, on two nodes.

A job with `image` in mode horovod (Debian's OpenMPI) or mpich (Debian's MPICH, hydra) on two sshd test nodes
with two simulated GPUs each: four MPI processes. mpirun starts each through the attempt's container.py
(scheduler/node/container_exec.py) in the podman lab's image (tests/podman_lab.py; one case in the docker lab's,
tests/docker_lab.py), where tests/peers/mpi_rank.py
calls the MPI library itself: MPI_Init must reach the launcher's PMI server on the host from inside the
container, and MPI_Allreduce must cross containers and nodes. Each process records what it saw, and the node
its runtime client ran on; what is checked is what exists: the records, the containers podman lists, the
processes left on the nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.docker_lab import docker_lab_fixture  # noqa: F401  (the fixture)
from tests.integration.test_containers_sshd import image_job, lab_config
from tests.integration.test_scheduler_sshd import log_of, running
from tests.peers.nodessh import ssh_bin
from tests.peers.test_launchers import MARK, finished, ompi_lab, records
from tests.podman_lab import PodmanLab, podman_lab_fixture  # noqa: F401  (the fixture)
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

HERE = Path(__file__).resolve().parent
RANK = HERE / "mpi_rank.py"
WAIT = 60.0


def mpi_job(name: str, mode: str, lab: Any, cluster: SshdCluster, root: Path, slots: int, **env: str) -> dict[str, Any]:
    """MPI processes of mpi_rank.py on 2 nodes, `slots` (GPUs) per node, in the image of `lab` (podman's or
    docker's); all on loopback."""
    results = root / "results"
    results.mkdir(exist_ok=True)
    path = [str(ssh_bin(cluster, root / "ssh-bin")), "/usr/bin", "/bin"]
    if mode == "mpich":  # hydra's mpirun first on PATH, as on an MPICH cluster (a script: hydra finds its proxy)
        (root / "mpich-bin").mkdir(exist_ok=True)
        (root / "mpich-bin" / "mpirun").write_text('#!/bin/sh\nexec /usr/bin/mpirun.mpich "$@"\n')
        (root / "mpich-bin" / "mpirun").chmod(0o755)
        path.insert(0, str(root / "mpich-bin"))
    job_env = {
        "PATH": ":".join(path),
        "PEER_RESULTS": str(results),
        "PEER_MARK": MARK,  # quotes, $, backquotes: passed by name into every container
        **ompi_lab(),
        "HYDRA_IFACE": "lo",
        **env,
    }
    return image_job(
        name, f"/usr/bin/python3 {RANK}", lab, mode=mode, nodes=2, gpus_per_node=slots, workdir=str(root),
        output=str(results), env=job_env, mounts=[{"from": str(HERE), "to": str(HERE), "readonly": True}],
    )  # fmt: skip


def client_pids(prefix: str) -> list[int]:
    """The podman clients (`podman run ... --name PREFIX...`) running on this machine (every test node)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            named = b"--name" in argv[:-1] and argv[argv.index(b"--name") + 1].startswith(prefix.encode())
            if named and b"run" in argv:
                out.append(int(entry.name))
    return out


async def until(what: str, check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout:g}s: {what}")


# OpenMPI with one process per node: two test nodes are one machine with one host name, and OpenMPI names its
# shared-memory segments by host name, job and local rank (vader_segment.<host>...), so two processes of local
# rank 0 on two test nodes would share one segment (a crash no real cluster sees). MPICH's names differ per
# process: with two per node it also checks two containers on one node meeting through the host's /dev/shm.
@pytest.mark.parametrize(
    ("mode", "slots", "runtime"), [("horovod", 1, "podman"), ("mpich", 2, "podman"), ("horovod", 1, "docker")]
)
async def test_mpi_processes_all_reduce_across_two_nodes_each_in_its_container(
    mode: str, slots: int, runtime: str, sshd_cluster, request, tmp_path: Path, sock_dir: Path
) -> None:
    lab = request.getfixturevalue(f"{runtime}_lab")
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = lab_config(cluster, lab, tmp_path, sock_dir, runtime=runtime)
    spec = mpi_job("mpi-image", mode, lab, cluster, tmp_path, slots)
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await finished(client, job_id)
        log = await log_of(client, job_id)
    assert (shown["status"], shown["exit_code"]) == ("succeeded", 0), (shown["message"], log[-6000:])
    runs = shown["attempts"][0]["runs"]
    assert [r["launch"] for r in runs] == [True, False]  # mpirun on the first node starts every process
    gpus = {r["node"]: r["gpus"] for r in runs}
    assert f"image {lab.image} is on this node: not pulled" in log, log

    world = 2 * slots
    got = records(tmp_path / "results")
    assert [r["rank"] for r in got] == list(range(world)), log[-6000:]
    # the launcher's daemon of each node: hydra numbers its proxies from 0; OpenMPI's mpirun is daemon 0 and
    # starts an orted on every host of the hostfile that is not its own host name (here: both), from 1
    daemons = sorted(Counter(r["node"] for r in got).items())
    assert [count for _, count in daemons] == [slots, slots], got
    token = got[0]["container"].rsplit("-p", 1)[0]
    for r in got:
        assert r["size"] == world and r["sum"] == [world, sum(range(world))], r  # every process, both nodes
        assert r["container"] == f"{token}-p{r['rank']}", r  # one container per MPI process, named by the token
        index = [daemon for daemon, _ in daemons].index(r["node"])
        assert index == r["rank"] // slots, r  # by slot, in the hostfile's order
        node = runs[index]["node"]
        assert r["marker"] == lab.marker, r  # the image's own file: the process ran in the image
        env = r["env"]
        assert env["PEER_MARK"] == MARK and env["FT_JOB_ID"] == str(job_id), r
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(slots)), r  # from 0 inside
        if runtime == "podman":
            cdi = sorted(int(k.removeprefix("FTLAB_CDI_GPU_")) for k in env if k.startswith("FTLAB_CDI_GPU_"))
            assert cdi == sorted(gpus[node]), r  # its node's GPUs, by CDI
        else:  # --runtime nvidia: its node's GPUs by their host indexes
            assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(map(str, gpus[node])), r
        assert "ssh-bin" not in env.get("PATH", ""), r  # the image's PATH, not the host's
    assert lab.containers("ft-") == []  # each container was removed when its process ended


async def sleeping_job(client: Any, lab: PodmanLab, cluster: SshdCluster, root: Path) -> tuple[int, str]:
    """A job whose two processes (one per node: OpenMPI, see above) sleep after their all-reduce: its id and
    its containers' prefix, once both containers run."""
    spec = mpi_job("mpi-sleeps", "horovod", lab, cluster, root, 1, PEER_SLEEP="600")
    job_id = (await client.call("submit", spec=spec))["id"]
    results = root / "results"
    await until("two records", lambda: len(list(results.glob("*.json"))) == 2)
    prefix = records(results)[0]["container"].rsplit("-p", 1)[0]
    assert sorted(lab.containers(prefix)) == [f"{prefix}-p0", f"{prefix}-p1"]
    return job_id, prefix


async def nothing_left(lab: PodmanLab, prefix: str) -> None:
    """No container of the job's attempt in the lab's store, no runtime client naming one, no MPI process."""
    await until("no container left", lambda: lab.containers(prefix) == [])
    await until("no process of the job left", lambda: not client_pids(prefix) and not _running(RANK))


async def test_a_stopped_mpi_job_leaves_no_container_and_no_process_on_any_node(
    sshd_cluster, podman_lab, tmp_path: Path, sock_dir: Path
) -> None:
    """A stop: the supervisor's SIGTERM to mpirun, which passes it to every process, the runtime clients, which
    pass it to their containers."""
    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    async with running(lab_config(cluster, lab, tmp_path, sock_dir)) as (_, client):
        job_id, prefix = await sleeping_job(client, lab, cluster, tmp_path)
        first = Path((await client.call("show", job=job_id))["attempts"][0]["runs"][0]["run_dir"])
        assert (first / f"{prefix}-p0.cid").is_file()  # the first node's read counts that container's I/O
        await client.call("stop", jobs=[job_id])
        shown = await finished(client, job_id)
        assert shown["status"] == "stopped", shown["message"]
        await nothing_left(lab, prefix)


async def test_a_killed_runtime_client_leaves_no_container_behind(
    sshd_cluster, podman_lab, tmp_path: Path, sock_dir: Path
) -> None:
    """SIGKILL of the podman client of MPI rank 1 (on node02): its container would run on under conmon, where
    mpirun cannot reach it; the reaper container.py left behind removes it. mpirun then ends the job."""
    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    async with running(lab_config(cluster, lab, tmp_path, sock_dir)) as (_, client):
        job_id, prefix = await sleeping_job(client, lab, cluster, tmp_path)
        victims = await until("rank 1's client", lambda: client_pids(f"{prefix}-p1"))
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        await until("rank 1's container removed", lambda: f"{prefix}-p1" not in lab.containers(prefix))
        shown = await finished(client, job_id)
        assert shown["status"] == "error", shown["message"]  # mpirun saw a process killed, and ended the job
        await nothing_left(lab, prefix)
    daemons = [json.loads((tmp_path / "results" / f"{r}.json").read_text())["node"] for r in (0, 1)]
    assert daemons[0] != daemons[1]  # rank 1 ran on the other node


def _running(script: Path) -> list[int]:
    """Processes whose argv names `script` (the MPI processes, on any node)."""
    needle = str(script).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
