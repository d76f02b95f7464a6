"""`ftconsole alloc` (Slurm's `salloc`) end to end on real sshd nodes: an allocation is queued as a job, its command
(the shell's stand-in) runs on its first node as the user, in the run folder, with the allocation's GPUs and
hostfile, and leaving it ends the allocation: its ranks' processes gone on every node; `--keep` keeps it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import finished, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def alive(pid: int) -> bool:
    """Whether a process of the nodes runs (the test's nodes are sshd servers on this machine); a zombie, ended and
    not yet reaped by whoever it was left to, does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def test_an_allocation_over_two_nodes_runs_its_command_there_and_ends_with_it(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        blocker = await client.call(
            "submit", spec=job("blocker", "sleep 300", gpus_per_node=2, nodes=2, mode="pytorch")
        )
        await until(client, blocker["id"], lambda j: j["status"] == "running", "the blocker to run")
        command = 'echo "gpus=$CUDA_VISIBLE_DEVICES"; cat "$FT_HOSTFILE"; pwd; id -un'
        alloc = asyncio.create_task(
            cli(loaded.file, "alloc", "--nodes", "2", "--gpus-per-node", "1", "--time", "1h", "--command", command)
        )
        try:
            (waiting,) = await poll(
                lambda: client.call("jobs", name="alloc"), lambda js: bool(js and js[0]["message"]), "it to wait"
            )
            assert waiting["status"] == "queued"
            await client.call("stop", jobs=[blocker["id"]])
            code, out, err = await asyncio.wait_for(alloc, 120)
        finally:
            alloc.cancel()
        assert code == 0, err
        shown = await finished(client, waiting["id"])
    assert f"allocation {shown['id']} queued" in err and f"allocation {shown['id']} ended" in err
    assert f"allocation {shown['id']} running on " in err
    lines = out.splitlines()
    assert lines[0] in ("gpus=0", "gpus=1")  # one GPU of the node, as placed
    runs = shown["attempts"][0]["runs"]
    assert [len(r["gpus"]) for r in runs] == [1, 1] and lines[0] == f"gpus={runs[0]['gpus'][0]}"
    assert len([x for x in lines if "slots=1" in x]) == 2  # the hostfile: both nodes
    assert runs[0]["run_dir"] in lines  # the shell's folder: the first rank's run folder
    assert shown["status"] == "stopped" and shown["spec"]["hang_detect"] == 0  # off: a shell is quiet
    assert shown["max_runtime_s"] == 3600
    assert not any(alive(r["pid"]) for r in runs if r["pid"])  # what held the GPUs is gone on both nodes


async def test_keep_leaves_it_running_and_what_it_left_running_ends_with_it(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """--keep: the allocation runs on after its command, whose exit status is alloc's. A program the command left
    running on the node (started over SSH, outside the run's processes) is stopped when the allocation ends: it
    would hold the GPUs past it otherwise."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        left = "nohup sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > left.pid; exit 3"
        code, _, err = await cli(loaded.file, "alloc", "--keep", "--command", left)
        assert code == 3, err
        (kept,) = await client.call("jobs", status=["running"])
        assert kept["name"] == "alloc" and f"ftconsole stop {kept['id']} to end it" in err
        run = (await client.call("show", job=kept["id"]))["attempts"][0]["runs"][0]
        pid = int((Path(run["run_dir"]) / "left.pid").read_text())
        assert alive(pid)
        await client.call("stop", jobs=[kept["id"]])
        assert (await finished(client, kept["id"]))["status"] == "stopped"
        assert not alive(pid)  # stopped before the run's end was written
        log = (Path(run["run_dir"]) / "output.log").read_text()
        assert "1 process(es) started over SSH in this run's environment" in log
        code, _, err = await cli(loaded.file, "alloc", "--nodes", "0")
        assert code == 2 and "--nodes must be at least 1" in err
