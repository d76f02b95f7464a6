"""`ftconsole run JOB -- CMD` (Slurm's `srun` inside an allocation) end to end on real sshd nodes: steps run on the
allocation's nodes and GPUs as its user, in its run folders, with the launch mode's variables; their output comes
back and their exit status is the command's; steps side by side never share a GPU and one that finds none free
waits; Ctrl-C and the allocation's end stop a step's processes on the node; a scheduler restart leaves a step running
and its `ftconsole run` follows it again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_alloc_sshd import alive
from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import as_nobody, finished, poll, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

WAIT = 60.0


async def allocation(config: Path, *args: str) -> int:
    """A kept allocation's id (`alloc --keep` with a command that returns at once)."""
    code, _, err = await cli(config, "alloc", "--keep", "--command", "true", *args)
    assert code == 0, err
    return int(err.split("allocation ", 1)[1].split()[0])


async def started(config: Path, *args: str) -> asyncio.subprocess.Process:
    """`ftconsole run ARGS` in the background, its output piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ftconsole.cli", "run", *args, env={**os.environ, "FTCONSOLE_CONFIG": str(config)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def line(proc: asyncio.subprocess.Process) -> str:
    """The next line of its output (fails with what it said when it ended first)."""
    assert proc.stdout is not None and proc.stderr is not None
    text = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode().strip()
    if not text:
        said = await asyncio.wait_for(proc.stderr.read(), WAIT)
        raise AssertionError(f"ftconsole run ended (exit {await proc.wait()}) before its output: {said.decode()}")
    return text


async def ended(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    return proc.returncode or 0, out.decode(), err.decode()


def steps_of(shown: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["number"]: s for s in shown["steps"]}


async def test_steps_run_on_the_allocation_as_its_user_and_say_how_they_ended(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)  # another user reaches the socket
    config = loaded.file
    async with running(loaded) as (_, client):
        alloc = await allocation(config, "--nodes", "2", "--gpus-per-node", "2")
        shown = await client.call("show", job=alloc)
        runs = shown["attempts"][0]["runs"]
        # single (the default): the first node, all its GPUs, in the job's env and the user's home
        code, out, err = await cli(
            config, "run", str(alloc), "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $FT_STEP $FT_JOB_ID"; id -un; pwd'
        )
        assert code == 0, err
        gpus, user, folder = out.splitlines()
        assert gpus == f"{','.join(map(str, runs[0]['gpus']))} 1 {alloc}"
        assert user == shown["owner"] and folder.endswith(f"/{runs[0]['node']}/home")  # the node's home
        assert f"step {alloc}.1 on {runs[0]['node']}:" in err
        # pytorch over both nodes: every node its rank, the step's own port; output labelled by rank
        argv = ["sh", "-c", 'echo "$RANK/$WORLD_SIZE $MASTER_ADDR $MASTER_PORT $SLOTS"; cat "$FT_HOSTFILE" | wc -l']
        code, out, err = await cli(config, "run", str(alloc), "--mode", "pytorch", "--label", "--", *argv)
        assert code == 0, err
        lines = sorted(out.splitlines())
        assert [x.split()[0] for x in lines] == ["0:", "0:", "1:", "1:"]
        said = {x.split(": ", 1)[1] for x in lines}
        port = next(x.split()[2] for x in said if "/2 " in x)
        host = cluster.nodes[0].address
        assert said == {f"0/2 {host} {port} 2", f"1/2 {host} {port} 2", "2"}
        assert int(port) != (shown["attempts"][0]["master_port"] or 0)
        # the highest exit status of the ranks is ours, and the step's
        code, _, err = await cli(config, "run", str(alloc), "-N", "2", "--mode", "pytorch", "--", "sh", "-c",
                                 'exit $((RANK + 6))')  # fmt: skip
        assert code == 7, err
        # options after JOB end at --; a bad ask is refused, naming what is wrong
        code, _, err = await cli(config, "run", str(alloc), "--nodes", "3", "--mode", "pytorch", "--", "true")
        assert code == 2 and "a step runs on 1 to 2, not 3" in err
        code, _, err = await cli(config, "run", str(alloc), "--nodes", "2", "--", "true")
        assert code == 2 and "mode single runs on one node" in err
        # another user may not run anything as this job's user
        refused = await as_nobody(loaded.socket_path, "step", job=alloc, argv=["id"])
        assert refused["error"]["type"] in ("PermissionDenied", "NotFound"), refused
        steps = steps_of(await client.call("show", job=alloc))
        assert [steps[n]["state"] for n in (1, 2, 3)] == ["succeeded", "succeeded", "failed"]
        assert steps[3]["exit_code"] == 7 and steps[2]["mode"] == "pytorch" and len(steps[2]["ranks"]) == 2
        assert steps[1]["ranks"] == [{"node": runs[0]["node"], "gpus": runs[0]["gpus"]}]
        assert len(steps) == 3  # the refused asks recorded nothing
        await client.call("stop", jobs=[alloc])
        await finished(client, alloc)


async def test_steps_side_by_side_get_their_own_gpus_and_end_with_ctrl_c_or_the_allocation(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    config = loaded.file
    holder = ["sh", "-c", 'echo "$$ $CUDA_VISIBLE_DEVICES"; exec sleep 1000']
    async with running(loaded) as (_, client):
        alloc = await allocation(config, "--gpus-per-node", "2")
        first = await started(config, str(alloc), "--gpus-per-node", "1", "--", *holder)
        pid1, gpu1 = (await line(first)).split()
        second = await started(config, str(alloc), "--gpus-per-node", "1", "--", *holder)
        pid2, gpu2 = (await line(second)).split()
        assert {gpu1, gpu2} == {"0", "1"}  # never the same GPU
        assert alive(int(pid1)) and alive(int(pid2))
        # a third finds no GPU free: it waits, saying so, until one is
        third = await started(
            config, str(alloc), "--gpus-per-node", "1", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'
        )
        assert third.stderr is not None
        said = (await asyncio.wait_for(third.stderr.readline(), WAIT)).decode()
        assert "step waiting: waiting for 1 node(s) with 1 GPU(s) each free" in said
        # Ctrl-C: the step is cancelled and its process on the node stopped; its GPU goes to the one waiting
        first.send_signal(signal.SIGINT)
        code, _, err = await ended(first)
        assert code == 130 and "interrupted: cancelled" in err
        await poll(lambda: asyncio.sleep(0, not alive(int(pid1))), bool, "the first step's process to end")
        code, out, err = await ended(third)
        assert code == 0 and out.strip() == gpu1, err
        # the allocation's end ends the step still running, and its process
        await client.call("stop", jobs=[alloc])
        code, _, err = await ended(second)
        assert code != 0 and "cancelled" in err and "the step ended with it" in err
        await finished(client, alloc)
        assert not alive(int(pid2))
        steps = steps_of(await client.call("show", job=alloc))
        assert steps[1]["state"] == "cancelled" and "went away" in steps[1]["message"]
        assert steps[2]["state"] == "cancelled" and steps[3]["state"] == "succeeded"


async def test_a_step_outlives_a_restart_of_the_scheduler(sshd_cluster: Any, tmp_path: Path, sock_dir: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    config = loaded.file
    go = tmp_path / "go"
    waiting = ["sh", "-c", f'echo "$$"; while [ ! -e {go} ]; do sleep 0.1; done; echo finished']
    async with running(loaded) as (_, client):
        alloc = await allocation(config)
        step = await started(config, str(alloc), "--", *waiting)
        pid = int(await line(step))
    assert alive(pid)  # the scheduler stopped; the step did not
    async with running(loaded) as (_, client):
        assert step.stderr is not None
        said = (await asyncio.wait_for(step.stderr.readline(), WAIT)).decode()  # "step ... on ..."
        said += (await asyncio.wait_for(step.stderr.readline(), WAIT)).decode()
        assert "the scheduler went away" in said, said
        await poll(lambda: client.call("show", job=alloc), lambda j: j["status"] == "running", "the allocation")
        go.touch()
        code, out, err = await ended(step)
        assert code == 0 and out.strip() == "finished", err
        assert f"following step {alloc}.1 again" in err
        (only,) = (await client.call("show", job=alloc))["steps"]
        assert only["state"] == "succeeded"
        await client.call("stop", jobs=[alloc])
        await finished(client, alloc)


async def test_a_dead_node_ends_its_allocation_with_a_reason_and_its_step_with_it(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """No silent half-allocation: one of an allocation's two nodes dies (its sshd and everything it started are
    killed); the allocation ends `error` naming the node, its step running on both nodes ends with it, and the
    process on the living node is stopped. The nodes share one home (NFS), where both ranks' step folders are."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1, shared_home=True)
    loaded = write_config(cluster, tmp_path, sock_dir)
    config = loaded.file
    async with running(loaded) as (_, client):
        alloc = await allocation(config, "--nodes", "2")
        step = await started(config, str(alloc), "--mode", "pytorch", "--label", "--", "sh", "-c",
                             'echo "$$"; exec sleep 1000')  # fmt: skip
        pids = dict([(await line(step)).split(": "), (await line(step)).split(": ")])  # rank -> pid
        assert all(alive(int(p)) for p in pids.values())
        runs = (await client.call("show", job=alloc))["attempts"][0]["runs"]
        dead = runs[1]["node"]
        cluster.down(dead)
        over = await finished(client, alloc)
        assert over["status"] == "error" and dead in over["message"], over["message"]
        code, _, err = await ended(step)
        assert code != 0 and "cancelled" in err, err
        await poll(lambda: asyncio.sleep(0, not alive(int(pids["0"]))), bool, "the living node's step process to end")
        (only,) = (await client.call("show", job=alloc))["steps"]
        assert only["state"] == "cancelled" and "the step ended with it" in only["message"], only
