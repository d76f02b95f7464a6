"""A 2-node `mode: pytorch` job whose ranks run in real podman containers (issue 17 with the real launcher).

The ranks run in the podman lab's image (tests/podman_lab.py: a root file system with a marker file and empty
mount points) with the peer environment's Python (.venv-peers, torch CPU) mounted read-only through the lab's
`host_mounts`. The scheduler wraps ``python rank_in_image.py`` in ``python -m torch.distributed.run`` (one per
node, static rendezvous on node01); each worker all-reduces with gloo across the two nodes through
tests/peers/rank_allreduce.py, which writes what it saw to the job's output folder.

Inside a container `labnode.lab_node` cannot walk up to the node's sshd (the container has its own PID
namespace), and FTCONSOLE_LAB_NODE, set by the node's sshd, is not among the env podman passes in (only the
job's own names are). So a shim, written here into the job's workdir, names the node from FT_HOSTFILE (the run
folder, under the node's own home, ``<lab>/nodes/nodeNN/home/...``, expanded on the node by its supervisor),
records what only the image has (/etc/ftlab-image) and what started it, then runs rank_allreduce.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_containers_sshd import image_job, lab_config
from tests.integration.test_scheduler_sshd import log_of, running
from tests.peers.test_launchers import MARK, PEERS, RANK, finished, records
from tests.podman_lab import PodmanLab, podman_lab_fixture  # noqa: F401  (the fixture)
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

HERE = Path(__file__).resolve().parent

# run by torch.distributed.run in the container; rank_allreduce.py does the all-reduce and its record
# (<rank>.json); the shim's own record is image-<rank>.txt, apart from the *.json that `records` reads
SHIM = r"""
import json, os, re, runpy, sys
node = re.search(r"/nodes/(node\d+)/home/", os.environ["FT_HOSTFILE"]).group(1)
os.environ["FTCONSOLE_LAB_NODE"] = node
with open("/etc/ftlab-image") as fh:
    marker = fh.read()
with open("/proc/1/cmdline", "rb") as fh:
    init = fh.read().split(b"\0")[0].decode()
seen = {
    "rank": int(os.environ["RANK"]), "node": node, "marker": marker, "pid1": init,
    "torchrun": "TORCHELASTIC_RUN_ID" in os.environ, "group_rank": os.environ.get("GROUP_RANK"),
    "executable": sys.executable,
}
with open(os.path.join(os.environ["PEER_RESULTS"], "image-%s.txt" % os.environ["RANK"]), "w") as fh:
    json.dump(seen, fh)
sys.path.insert(0, PEERS_DIR)
sys.argv = [RANK_SCRIPT]
runpy.run_path(RANK_SCRIPT, run_name="__main__")
"""


async def test_pytorch_ranks_all_reduce_with_gloo_across_two_nodes_in_podman_containers(
    sshd_cluster, podman_lab, tmp_path: Path, sock_dir: Path
) -> None:
    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    results.mkdir()
    (work / "rank_in_image.py").write_text(f"PEERS_DIR = {str(HERE)!r}\nRANK_SCRIPT = {RANK!r}\n{SHIM}")
    loaded = lab_config(cluster, lab, tmp_path, sock_dir)
    env = {
        "PATH": f"{PEERS / 'bin'}:/usr/bin:/bin",
        "PEER_RESULTS": str(results),
        "PEER_MARK": MARK,  # quotes, $, backquotes: podman's `--env NAME` must pass the value as it is
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    spec = image_job(
        "torch-image", f"{PEERS / 'bin' / 'python'} rank_in_image.py", lab, mode="pytorch", nodes=2,
        gpus_per_node=1, workdir=str(work), output=str(results), env=env,
        mounts=[{"from": str(HERE), "to": str(HERE), "readonly": True}],
    )  # fmt: skip
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await finished(client, job_id)
        logs = [await log_of(client, job_id, rank=rank) for rank in (0, 1)]
    ended = (shown["status"], shown["exit_code"])
    assert ended == ("succeeded", 0), (shown["message"], logs[0][-6000:], logs[1][-6000:])
    placed = [run["node"] for run in shown["attempts"][0]["runs"]]
    assert sorted(placed) == ["node01", "node02"], shown["attempts"][0]["runs"]

    got = records(results)
    assert [r["rank"] for r in got] == [0, 1], logs
    assert [r["node"] for r in got] == placed  # each rank ran on the node the scheduler placed it on
    for r in got:
        assert r["world"] == 2
        assert r["sum"] == [2.0, 1.0, 3.0]  # (1, rank, node number) summed over both ranks: gloo across the nodes
        assert r["env"]["PEER_MARK"] == MARK, r
        assert r["env"]["FT_JOB_ID"] == str(job_id) and r["env"]["FT_ATTEMPT"] == "1", r
        assert r["env"]["FT_OUTPUT_DIR"] == str(results), r
    for rank, log in enumerate(logs):
        assert f"image {lab.image} is on this node: not pulled" in log, log
        assert f"rank {rank}/2 on node0" in log and ": sum [2.0, 1.0, 3.0]" in log, log  # rank_allreduce's line

    for rank in (0, 1):
        seen = json.loads((results / f"image-{rank}.txt").read_text())
        assert seen["marker"] == lab.marker, seen  # the image's own file: the rank ran in the image
        assert seen["pid1"] == "/run/podman-init", seen  # podman's --init (catatonit) is PID 1 there
        assert seen["torchrun"] and seen["group_rank"] == str(rank), seen  # torch.distributed.run started it
        assert seen["executable"] == str(PEERS / "bin" / "python"), seen
    assert lab.containers("ft-") == []  # each container was removed when its rank ended


async def test_debug_names_the_rank_behind_from_the_trace_of_ranks_in_containers(
    sshd_cluster, podman_lab, tmp_path: Path, sock_dir: Path
) -> None:
    """Two ranks in podman containers (mode pytorch, an image): rank 1 sleeps in its data loader while rank 0 waits
    in all_reduce. `debug` finds the containers' processes (FT_CONTAINER: the runtime's monitor started them, not
    the step), their stacks, and torch's trace of each (the hook's folder shared with the container, its socket
    reached through the process's own root): rank 1 is named behind."""
    from tests.peers.test_hang_evidence import HANG, verdict_naming

    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    results.mkdir()
    loaded = lab_config(cluster, lab, tmp_path, sock_dir)
    env = {"PATH": f"{PEERS / 'bin'}:/usr/bin:/bin", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PEER_HANG": "load:1"}  # fmt: skip
    spec = image_job(
        "hang-in-image", f"{PEERS / 'bin' / 'python'} {HANG}", lab, mode="pytorch", nodes=2, gpus_per_node=1,
        workdir=str(work), output=str(results), env=env,
        mounts=[{"from": str(HERE), "to": str(HERE), "readonly": True}],
    )  # fmt: skip
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        doc = await verdict_naming(client, job_id, "behind", world=2)
        await client.call("stop", jobs=[job_id])
        await finished(client, job_id)
    verdict = doc["verdict"]
    assert (verdict["rank"], verdict["rule"]) == (1, "behind"), verdict
    assert verdict["reason"].startswith(f"rank 1 on {verdict['node']} is behind: its last collective is all_reduce #")
    assert " in load_batch; rank 0 is in all_reduce #" in verdict["reason"], verdict
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert all(r["collectives"] for r in ranks.values()), doc["ranks"]  # the trace of both, read in their container
    assert ranks[1]["stack"][0]["name"] == "load_batch", ranks[1]
    assert lab.containers("ft-") == []
