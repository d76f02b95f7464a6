"""Jobs with `image` on real sshd nodes, in real Docker containers (issue 17).

The nodes' docker client talks to the lab's private dockerd (tests/docker_lab.py: vfs, no iptables or bridge, a
runtime named "nvidia" that is plain runc, so the probe says docker gives GPUs and `--runtime nvidia --env
NVIDIA_VISIBLE_DEVICES=N` runs with simulated GPUs). The image holds only a marker file: the job's program is
this machine's Python, mounted read-only through the job's own `mounts`. What is checked is what exists: files
the ranks wrote from inside their containers, the containers docker lists, the processes left on the nodes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.config import LoadedConfig
from tests.docker_lab import DockerLab, docker_lab_fixture  # noqa: F401  (the fixture)
from tests.integration.test_containers_sshd import _marked
from tests.integration.test_scheduler_sshd import finished, job, log_of, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

# what each rank reports from inside its container
PROBE = r"""
import errno, json, os
keys = ("FT_", "CUDA_", "NVIDIA_", "RANK", "WORLD")
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(keys)}}
out["marker"] = open("/etc/ftlab-image").read()
out["data"] = open("/data/input.txt").read()
try:
    open("/data/written-from-the-container", "w").write("x")
    out["write"] = "written"
except OSError as exc:
    out["write"] = errno.errorcode.get(exc.errno, str(exc.errno))
out["cwd"] = os.getcwd()
out["uid"] = os.getuid()
path = os.path.join(os.environ["FT_OUTPUT_DIR"], "rank%s.json" % os.environ["RANK"])
json.dump(out, open(path, "w"))
print("rank", os.environ["RANK"], "reported")
"""


def docker_config(cluster: SshdCluster, lab: DockerLab, root: Path, sock_dir: Path) -> LoadedConfig:
    return write_config(
        cluster, root, sock_dir,
        ssh={"python": str(lab.python_wrapper(root))},
        containers={"runtime": "docker", "ulimits": lab.ulimits},
        probes={"interval": "30s"},
    )  # fmt: skip


def docker_job(name: str, command: str, lab: DockerLab, **fields: Any) -> dict[str, Any]:
    mounts = [*lab.host_mounts, *fields.pop("mounts", [])]
    return job(name, command, image=fields.pop("image", lab.image), mounts=mounts, **fields)


async def test_ranks_run_in_the_docker_image_with_their_env_gpus_and_mounts(
    sshd_cluster, docker_lab, tmp_path, sock_dir
) -> None:
    lab: DockerLab = docker_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    data, out, work = tmp_path / "data", tmp_path / "out", tmp_path / "work"
    for folder in (data, out, work):
        folder.mkdir()
    (data / "input.txt").write_text("the data set\n")
    (work / "probe.py").write_text(PROBE)
    loaded = docker_config(cluster, lab, tmp_path, sock_dir)
    spec = docker_job(
        "in-docker", f"sh -c 'exec {sys.executable} probe.py'", lab, mode="pytorch", nodes=2, workdir=str(work),
        output=str(out), mounts=[{"from": str(data), "to": "/data", "readonly": True}],
    )  # fmt: skip
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        ended = await finished(client, job_id)
        logs = [await log_of(client, job_id, rank=rank) for rank in (0, 1)]
    assert ended["status"] == "succeeded", (ended, logs)
    assert all(f"image {lab.image} is on this node: not pulled" in log for log in logs), logs
    for rank, run in enumerate(ended["attempts"][0]["runs"]):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen["marker"] == lab.marker  # the image's own file: the rank ran in the image
        assert seen["data"] == "the data set\n" and seen["write"] == "EROFS"  # the read-only mount
        assert seen["cwd"] == str(work) and seen["uid"] == 0  # --workdir, --user 0:0
        env = seen["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["FT_JOB_ID"]) == (str(rank), "2", str(job_id))
        (gpu,) = run["gpus"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == str(gpu)  # --runtime nvidia: the rank's GPU by its host index
        assert env["CUDA_VISIBLE_DEVICES"] == "0"  # its one GPU, numbered from 0 inside
    assert not (data / "written-from-the-container").exists()
    assert lab.containers("ft-") == []  # each container was removed when its rank ended


async def test_a_stop_removes_the_docker_containers_and_their_processes(
    sshd_cluster, docker_lab, tmp_path, sock_dir
) -> None:
    lab: DockerLab = docker_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = docker_config(cluster, lab, tmp_path, sock_dir)
    mark = f"docker-sleeper-{os.getpid()}-{tmp_path.name}"
    spec = docker_job("sleeper", "sleep 300", lab, mode="pytorch", nodes=2, env={"FTLAB_TEST_MARK": mark})
    try:
        async with running(loaded) as (_, client):
            job_id = (await client.call("submit", spec=spec))["id"]
            await until(client, job_id, lambda j: j["status"] == "running" and len(lab.containers("ft-")) == 2,
                        "2 containers")  # fmt: skip
            names = sorted(lab.containers("ft-"))
            assert [n.rsplit("-", 1)[1] for n in names] == ["r0", "r1"]  # ft-<attempt token>-r<rank>
            assert len({n.rsplit("-", 1)[0] for n in names}) == 1
            assert len(await poll(lambda: _now(_marked(mark)), lambda p: len(p) == 2, "a sleep per rank")) == 2
            await client.call("stop", jobs=[job_id])
            ended = await finished(client, job_id)
            assert ended["status"] == "stopped", ended
            left = await poll(lambda: _now(lab.containers("ft-")), lambda v: v == [], "containers removed")
            assert left == []
        assert await poll(lambda: _now(_marked(mark)), lambda p: p == [], "the ranks' processes gone") == []
    finally:
        if leftover := lab.containers("ft-"):
            lab.docker("rm", "--force", *leftover, check=False)


async def test_a_failed_docker_pull_fails_the_job_with_dockers_words(
    sshd_cluster, docker_lab, tmp_path, sock_dir
) -> None:
    lab: DockerLab = docker_lab
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = docker_config(cluster, lab, tmp_path, sock_dir)
    # no registry answers at localhost:1: the pull fails on the node, and says why
    missing = docker_job("nopull", "true", lab, image="localhost:1/ftlab/missing:1")
    async with running(loaded) as (_, client):
        bad = (await client.call("submit", spec=missing))["id"]
        failed = await finished(client, bad)
        log = await log_of(client, bad)
        nodes = {n["name"]: n for n in await client.call("nodes")}
    assert failed["status"] in ("failed", "error"), failed
    assert "pull image exited with code" in failed["message"], failed["message"]
    assert "localhost:1" in failed["message"], failed["message"]  # docker's own words name the registry
    # docker names the registry only ("Get "http://localhost:1/v2/": ... connection refused"), not the image
    assert "ftconsole: pulling image localhost:1/ftlab/missing:1" in log, log  # docker does not name it
    assert "ftconsole: pull image exited with code" in log, log
    assert nodes["node01"]["state"] == "healthy"  # the node is fine: a bad image is the job's trouble
    assert lab.containers("ft-") == []


async def _now(value: Any) -> Any:
    return value
