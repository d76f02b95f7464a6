"""Jobs with `image` on real sshd nodes, in real Docker containers (issue 17).

The nodes' docker client talks to the lab's private dockerd (tests/docker_lab.py: vfs, no iptables or bridge, a
runtime named "nvidia" that is plain runc, so the probe says docker gives GPUs and `--runtime nvidia --env
NVIDIA_VISIBLE_DEVICES=N` runs with simulated GPUs). The image holds only a marker file: the job's program is
this machine's Python, mounted read-only through the job's own `mounts`. What is checked is what exists: files
the ranks wrote from inside their containers, the containers docker lists, the processes left on the nodes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.spec.config import LoadedConfig
from tests.docker_lab import DockerLab, docker_lab_fixture  # noqa: F401  (the fixture)
from tests.integration.test_containers_sshd import _marked, image_job, lab_config, ranks_report_from_the_image
from tests.integration.test_scheduler_sshd import finished, log_of, poll, running, until
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def docker_config(cluster: SshdCluster, lab: DockerLab, root: Path, sock_dir: Path) -> LoadedConfig:
    return lab_config(cluster, lab, root, sock_dir, runtime="docker")


async def test_ranks_run_in_the_docker_image_with_their_env_gpus_and_mounts(
    sshd_cluster, docker_lab, tmp_path, sock_dir
) -> None:
    for run, env in await ranks_report_from_the_image(sshd_cluster, docker_lab, tmp_path, sock_dir, "docker"):
        (gpu,) = run["gpus"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == str(gpu)  # --runtime nvidia: the rank's GPU by its host index


async def test_a_stop_removes_the_docker_containers_and_their_processes(
    sshd_cluster, docker_lab, tmp_path, sock_dir
) -> None:
    lab: DockerLab = docker_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = docker_config(cluster, lab, tmp_path, sock_dir)
    mark = f"docker-sleeper-{os.getpid()}-{tmp_path.name}"
    spec = image_job("sleeper", "sleep 300", lab, mode="pytorch", nodes=2, env={"FTLAB_TEST_MARK": mark})
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
    missing = image_job("nopull", "true", lab, image="localhost:1/ftlab/missing:1")
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
