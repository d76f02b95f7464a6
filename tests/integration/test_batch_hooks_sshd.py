"""Batch jobs and lifecycle hooks end to end on real sshd nodes, through the scheduler's API socket.

A batch job's tasks run one after another in one run per rank; hooks run on rank 0 around the command. The
last test drives the supervisor's steps directly, for what the scheduler cannot easily provoke.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.steps import Step, StepKind
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.ssh.runs import RunStatus, run_states, start_run, stop_runs
from ftconsole.scheduler.ssh.transport import SSHPool
from tests.integration.test_scheduler_sshd import WAIT, finished, job, log_of, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

ECHO = "sh -c 'echo \"$FT_TASK $FT_TASK_INDEX $FT_OUTPUT_DIR\"'"


def batch(name: str, *commands: str, **fields: Any) -> dict[str, Any]:
    tasks = [{"name": f"t{i}", "command": c, "output": f"out/t{i}"} for i, c in enumerate(commands)]
    return {"name": name, "type": "batch", "tasks": tasks, **fields}


def run_dir(cluster: SshdCluster, shown: dict[str, Any], rank: int = 0) -> str:
    run = shown["attempts"][0]["runs"][rank]
    root, cluster_id, rest = run["run_dir"].rsplit("/", 4)[0], *run["run_dir"].rsplit("/", 4)[1:2], None
    assert root == f"{cluster.node(run['node']).home}/.ftconsole/runs" and len(cluster_id) == 12, rest
    return f"{root}/{cluster_id}/{shown['id']}/1/{rank}"


async def test_batch_tasks_run_in_order_and_a_failing_task_ends_the_batch(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        ok = await client.call("submit", spec=batch("ok", ECHO, ECHO, ECHO))
        bad = await client.call("submit", spec=batch("bad", ECHO, "sh -c 'echo failing; exit 4'", ECHO))

        shown = await finished(client, ok["id"])
        assert shown["status"] == "succeeded", shown["message"]
        folder = f"{run_dir(cluster, shown)}/output/out"
        assert await log_of(client, ok["id"]) == "".join(
            f"== ftconsole: task t{i} ({i + 1}/3) ==\nt{i} {i} {folder}/t{i}\n" for i in range(3)
        )

        shown = await finished(client, bad["id"])
        assert (shown["status"], shown["exit_code"]) == ("error", 4)
        assert shown["message"].endswith("exited with code 4")
        text = await log_of(client, bad["id"])
        assert text.endswith("== ftconsole: task t1 (2/3) ==\nfailing\nftconsole: task t1 exited with code 4\n")
        assert "task t2" not in text and "t2 2 " not in text  # the third task never ran


async def test_hooks_run_on_rank_0_around_the_command(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    hooks = {"before": 'echo "before on rank $RANK in $(pwd)"', "after": "echo after on rank $RANK; exit 9"}
    command = "sh -c 'echo command on rank $RANK'"
    async with running(loaded) as (_, client):
        both = await client.call(
            "submit", spec=job("hooked", command, mode="pytorch", nodes=2, workdir="/tmp", hooks=hooks)
        )
        failing = await client.call(
            "submit", spec=job("unprepared", command, hooks={"before": "echo preparing; exit 5", "after": "echo bye"})
        )

        shown = await finished(client, both["id"])
        assert shown["status"] == "succeeded", shown["message"]  # the after hook's failure does not count
        assert await log_of(client, both["id"], 0) == (
            "== ftconsole: before hook ==\nbefore on rank 0 in /tmp\n"
            "== ftconsole: command ==\ncommand on rank 0\n"
            "== ftconsole: after hook ==\nafter on rank 0\nftconsole: after hook exited with code 9\n"
        )
        assert await log_of(client, both["id"], 1) == "command on rank 1\n"  # no hooks, no headers
        folder = run_dir(cluster, shown)
        status = json.loads(Path(folder, "status.json").read_text())
        assert (status["step"], status["exit_code"]) == ("after hook", 0)
        kinds = [s["kind"] for s in json.loads(Path(folder, "steps.json").read_text())]
        assert kinds == ["before", "command", "after"]

        shown = await finished(client, failing["id"])
        assert (shown["status"], shown["exit_code"]) == ("error", 5)
        text = await log_of(client, failing["id"])
        assert "preparing\nftconsole: before hook exited with code 5\n" in text
        assert "command on rank" not in text and "== ftconsole: command ==" not in text
        assert text.endswith("== ftconsole: after hook ==\nbye\n")  # the after hook runs whatever the outcome


async def test_stopping_a_batch_job_stops_the_current_task_and_runs_no_other(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    spec = batch("long", ECHO, "sh -c 'echo started; sleep 300'", ECHO, hooks={"after": "echo cleaned up"})
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        await until(client, job_id, lambda j: any(c["type"] == "Running" for c in j["conditions"]), "Running")
        text = ""
        for _ in range(600):
            text = await log_of(client, job_id)
            if "started" in text:
                break
            await asyncio.sleep(0.1)
        assert "started" in text, text
        await client.call("stop", jobs=[job_id])
        shown = await finished(client, job_id)
        assert shown["status"] == "stopped"
        assert shown["attempts"][0]["runs"][0]["signal"] == "SIGTERM"
        text = await log_of(client, job_id)
        assert text.endswith(
            "== ftconsole: task t1 (2/3) ==\nstarted\nftconsole: task t1 killed by SIGTERM\n"
            "== ftconsole: after hook ==\ncleaned up\n"
        )
        assert "task t2" not in text and "t2 2 " not in text


async def test_supervisor_steps_cannot_start_and_sigkill_escalation(sshd_cluster, tmp_path) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    loaded = load_config(cluster.write_config(tmp_path / "cluster.yaml"))
    pool = SSHPool.from_config(loaded)
    node, home = loaded.cluster.node_list()[0], cluster["node01"].home
    after = Step(StepKind.AFTER, "after hook", ("sh", "-c", "echo after"), {})

    def task(i: int, *argv: str) -> Step:
        return Step(StepKind.TASK, f"t{i}", argv, {}, i, 2)

    async def start(name: str, *steps: Step, grace: float = 30.0) -> None:
        await start_run(pool, node, run_dir=f"~/.ftconsole/runs/{name}/0/0", argv=steps[0].argv, env={}, workdir="~",
                        steps=steps, grace=grace, python=sys.executable)  # fmt: skip

    async def final(name: str) -> RunStatus:
        for _ in range(int(WAIT / 0.05)):
            (status,) = (
                await run_states(pool, node, [f"~/.ftconsole/runs/{name}/0/0"], python=sys.executable)
            ).values()
            if status.finished:
                return status
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {name} did not end")

    try:
        await start("typo", task(0, "no-such-program"), task(1, "echo", "second"), after)
        status = await final("typo")
        assert status.state == "failed" and status.error is not None and "cannot start no-such-program" in status.error
        text = (home / ".ftconsole/runs/typo/0/0/output.log").read_text()
        assert "second" not in text and text.endswith("== ftconsole: after hook ==\nafter\n")

        await start(
            "stubborn", task(0, "sh", "-c", "trap '' TERM; echo up; sleep 300"), task(1, "true"), after, grace=0.5
        )
        for _ in range(int(WAIT / 0.05)):
            if "up" in (home / ".ftconsole/runs/stubborn/0/0/output.log").read_text():
                break
            await asyncio.sleep(0.05)
        await stop_runs(pool, node, ["~/.ftconsole/runs/stubborn/0/0"], python=sys.executable)
        status = await final("stubborn")
        assert (status.signal, status.step) == ("SIGKILL", "t0")
        text = (home / ".ftconsole/runs/stubborn/0/0/output.log").read_text()
        assert text.endswith("ftconsole: task t0 killed by SIGKILL\n")  # no further task, no after hook
    finally:
        await pool.close()
