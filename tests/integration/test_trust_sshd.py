"""Runs you can trust, on real sshd nodes: identity, unknown outcomes, bad jobs and bad nodes that fail alone,
liveness, orphans, stops that get through, silent nodes, and fencing. Each test counts what is real after
the fault: processes on the nodes, rows in the store, what the job printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import NotFound
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from tests.integration.test_scheduler_sshd import WAIT, as_nobody, finished, job, log_of, poll, running, until
from tests.sshd_cluster import SshdCluster, pid_alive

pytestmark = pytest.mark.sshd


def config(cluster: SshdCluster, root: Path, sock_dir: Path, *, name: str = "ft", **overrides: Any) -> LoadedConfig:
    """A scheduler of its own (its own state_dir and socket) over the test cluster's nodes."""
    settings: dict[str, Any] = {
        "state_dir": str(root / f"state-{name}"),
        "ssh": {"python": sys.executable},
        "scheduler": {"tick": "0.3s", "stop_grace": "2s"},
        "api": {"socket": str(sock_dir / f"{name}.sock")},
    }
    for key, value in overrides.items():
        settings[key] = {**settings.get(key, {}), **value} if isinstance(value, dict) else value
    return load_config(cluster.write_config(root / f"{name}.yaml", **settings))


PIDFILE = 'echo $$ > "$HOME/pid.$FT_JOB_ID.$RANK"'


def sleeper(name: str, **fields: Any) -> dict[str, Any]:
    """A job whose rank(s) write their pid to ~/pid.<job>.<rank> on their node, then sleep."""
    return job(name, f"sh -c '{PIDFILE}; exec sleep 300'", **fields)


async def pid_on(cluster: SshdCluster, node: str, job_id: int, rank: str = "0") -> int:
    path = cluster.node(node).home / f"pid.{job_id}.{rank}"

    async def read() -> str:
        return path.read_text().strip() if path.exists() else ""

    return int(await poll(read, bool, f"{path} to be written"))


def running_condition(j: dict[str, Any]) -> bool:
    return any(c["type"] == "Running" for c in j["conditions"])


async def started_sleeper(client: Any, cluster: SshdCluster, name: str) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """A one-node sleeper submitted and running on node01: the job, its command's pid, its run."""
    submitted = await client.call("submit", spec=sleeper(name))
    await until(client, submitted["id"], running_condition, f"job {name} to run")
    pid = await pid_on(cluster, "node01", submitted["id"])
    run = (await client.call("show", job=submitted["id"]))["attempts"][0]["runs"][0]
    return submitted, pid, run


def events(shown: dict[str, Any], kind: str) -> list[str]:
    return [e["message"] for e in shown["events"] if e["kind"] == kind]


async def test_a_fresh_store_runs_its_own_job_1_never_an_old_folder(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect: job ids restart at 1 in every store; a new store's job 1 'adopted' the old job 1's status."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    first = config(cluster, tmp_path, sock_dir, name="a")
    async with running(first) as (scheduler, client):
        old = await client.call("submit", spec=job("old", "sh -c 'echo old; exit 3'"))
        assert (await finished(client, old["id"]))["status"] == "error"
        first_id = scheduler.store.cluster_id
    second = config(cluster, tmp_path, sock_dir, name="b")  # another state_dir: job ids start at 1 again
    async with running(second) as (scheduler, client):
        assert scheduler.store.cluster_id != first_id
        new = await client.call("submit", spec=job("new", "sh -c 'echo new'"))
        assert new["id"] == old["id"] == 1
        shown = await finished(client, new["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert await log_of(client, new["id"]) == "new\n"  # its own command ran
        run = shown["attempts"][0]["runs"][0]
        assert f"/.ftconsole/runs/{scheduler.store.cluster_id}/1/1/0" in run["run_dir"]
        assert shown["attempts"][0]["token"] and run["boot_id"] and run["pid_start"]


async def test_a_bad_job_fails_alone_and_the_queue_behind_it_starts(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect: a job that raises while it is planned (here a tensorflow job with ps_count >= nodes stored before
    the spec check refused it) blocked every job behind it, forever."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir)
    bad = JobSpec.from_stored(
        {"name": "bad", "mode": "tensorflow", "nodes": 2, "ps_count": 2, "command": "true", "priority": "urgent"}
    )
    async with await Store.open(loaded.state_dir / "state.db") as store, store.jobs_tx("old job") as tx:
        fields = {"owner": "root", "uid": 0, "priority": "urgent", "project": "default", "access": "none"}
        await tx.add_job(Job(id=0, name="bad", spec=bad, status=JobStatus.QUEUED, submitted=time.time(), **fields))
    async with running(loaded) as (_, client):
        good = await client.call("submit", spec=job("good", "true", mode="pytorch", nodes=2))
        assert (await finished(client, good["id"]))["status"] == "succeeded"
        shown = await finished(client, 1)
        assert shown["status"] == "error", json.dumps(shown, indent=1)[:3000]
        assert "ftconsole cannot" in shown["message"] and "parameter-server count 2" in shown["message"]
        alerts = await client.call("alerts")
        assert any(a["kind"] == "job_failed" and a["job"] == 1 for a in alerts)


async def test_a_node_gone_from_the_config_fails_its_jobs_alone(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect: a node removed from the config raised KeyError on every tick."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        on_two = await client.call("submit", spec=sleeper("on-two", node_names="node02"))
        await until(client, on_two["id"], lambda j: j["status"] == "running", "running")
        pid = await pid_on(cluster, "node02", on_two["id"])
    only_one = [n for n in cluster.config_data()["nodes"] if n["name"] == "node01"]
    smaller = config(cluster, tmp_path, sock_dir, nodes=only_one)  # the same state_dir: the same store
    async with running(smaller) as (_, client):
        shown = await finished(client, on_two["id"])
        assert shown["status"] == "error"
        assert "node node02 is no longer in the cluster config" in shown["message"]
        with pytest.raises(NotFound, match="ran on node02, which is no longer in the cluster config"):
            await log_of(client, on_two["id"])
        other = await client.call("submit", spec=job("other", "true"))
        assert (await finished(client, other["id"]))["status"] == "succeeded"
    assert pid_alive(pid)  # nothing could reach it: it is the operator's to clean up (docs/operations.md)
    os.kill(pid, signal.SIGKILL)


async def test_a_frozen_node_is_given_up_within_node_timeout_and_fenced_when_it_answers(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Defects: a node that stops answering held its jobs and GPUs forever, and one frozen node made every
    step wait for it. Its runs are lost after node_timeout, the job ends error with the reason, the other
    node's work goes on meanwhile; once it answers again, the run still there is killed (fencing), by its own
    node."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir, scheduler={"node_timeout": "5s"})
    async with running(loaded) as (_, client):
        two = await client.call("submit", spec=sleeper("two", mode="pytorch", nodes=2))
        await until(client, two["id"], running_condition, "Running")
        pids = {n: await pid_on(cluster, n, two["id"], r) for n, r in (("node01", "0"), ("node02", "1"))}
        cluster.hang("node02", sessions=True)  # the whole machine freezes: sshd, its connections, the job
        try:
            frozen_at = time.monotonic()
            shown = await finished(client, two["id"])
            given_up = time.monotonic() - frozen_at
            assert shown["status"] == "error"
            assert "node unreachable since" in shown["message"]
            assert given_up < WAIT
            assert not pid_alive(pids["node01"])  # the healthy rank was stopped
            # meanwhile the loop is not held up by the frozen node: a job on node01 runs to its end
            quick = await client.call("submit", spec=job("quick", "true", node_names="node01"))
            assert (await finished(client, quick["id"]))["status"] == "succeeded"
            assert pid_alive(pids["node02"])  # frozen, not dead
        finally:
            cluster.unhang("node02")
        await poll(lambda: _alive(pids["node02"]), lambda alive: not alive, "the fenced run to be killed")
        shown = await poll(
            lambda: client.call("show", job=two["id"]), lambda j: bool(events(j, "Fenced")), "the Fenced event"
        )
        assert [e for e in events(shown, "Fenced") if "was still running on node02" not in e] == []
        assert "was still running on node02" in events(shown, "Fenced")[0]


async def _alive(pid: int) -> bool:
    return pid_alive(pid)


async def test_a_killed_supervisor_leaves_nothing_running_before_the_gpus_are_free(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Defect: a dead supervisor left its process running while the run read lost and its GPUs were given away."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (scheduler, client):
        victim, pid, run = await started_sleeper(client, cluster, "victim")
        status = json.loads(Path(run["run_dir"], "status.json").read_text())
        os.kill(status["supervisor_pid"], signal.SIGKILL)
        shown = await finished(client, victim["id"])
        assert shown["status"] == "error" and "supervisor" in shown["message"]
        assert not pid_alive(pid)  # killed before the job ended and its GPU was released
        assert events(shown, "Killed") and "its supervisor is gone" in events(shown, "Killed")[0]
        held = [r for r in await scheduler.store.runs(held=True) if r.job == victim["id"]]
        assert held == []


async def test_after_a_reboot_a_run_reads_lost_and_its_job_ends(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect: liveness by PID alone; after a reboot a recycled pid kept a run running forever."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        rebooted, pid, run = await started_sleeper(client, cluster, "rebooted")
        path = Path(run["run_dir"], "status.json")
        path.write_text(json.dumps(dict(json.loads(path.read_text()), boot_id="the-boot-before")))
        try:
            shown = await finished(client, rebooted["id"])
            assert shown["status"] == "error"
            assert "the node rebooted since the run started" in shown["message"]
            assert pid_alive(pid)  # a process of 'another boot' is never signalled
        finally:
            os.kill(pid, signal.SIGKILL)


async def test_a_stop_the_supervisor_cannot_carry_out_ends_in_sigkill_from_the_scheduler(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Defect: stops were sent once; a supervisor that did not act on it (here: frozen) left the job running."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = config(cluster, tmp_path, sock_dir, scheduler={"stop_grace": "1s"})
    async with running(loaded) as (_, client):
        stuck, pid, run = await started_sleeper(client, cluster, "stuck")
        supervisor = json.loads(Path(run["run_dir"], "status.json").read_text())["supervisor_pid"]
        os.kill(supervisor, signal.SIGSTOP)
        await client.call("stop", jobs=[stuck["id"]])
        shown = await finished(client, stuck["id"])
        assert shown["status"] == "stopped"
        assert shown["attempts"][0]["runs"][0]["signal"] == "SIGKILL"
        assert not pid_alive(pid) and not pid_alive(supervisor)
        assert "the grace period is over" in events(shown, "Killed")[0]


SLOW_STARTS = """#!/bin/sh
# python for the supervisor, on a node that is slow to answer starts while $HOME/slow-starts exists: the start
# is carried out, but only after the scheduler stopped waiting for its answer
script=$(cat)
case "$script" in *'"action": "start"'*) [ -e "$HOME/slow-starts" ] && sleep 4 ;; esac
printf '%s\\n' "$script" | exec {python} "$@"
"""


async def test_a_start_with_no_answer_is_unknown_and_keeps_its_gpus(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect: a launch that timed out was recorded failed while its process could be running, and its GPUs
    were given to the next job. Here the start is carried out after the scheduler gave up waiting."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(SLOW_STARTS.format(python=sys.executable))
    wrapper.chmod(0o755)
    flag = cluster.node("node01").home / "slow-starts"
    flag.touch()
    loaded = config(
        cluster, tmp_path, sock_dir, scheduler={"node_timeout": "60s"},
        ssh={"command_timeout": "2s", "python": str(wrapper)},
    )  # fmt: skip
    async with running(loaded) as (_, client):
        first = await client.call("submit", spec=sleeper("first"))
        shown = await until(
            client, first["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["state"] == "unknown",
            "the unknown state",
        )  # fmt: skip
        assert "no answer" in shown["attempts"][0]["runs"][0]["error"]
        second = await client.call("submit", spec=job("second", "true"))
        pid = await pid_on(cluster, "node01", first["id"])  # it did start, on the node
        assert (await client.call("show", job=second["id"]))["status"] == "queued"  # its GPU is still held
        flag.unlink()  # the node answers in time again: the start sent again finds the run and adopts it
        await until(client, first["id"], lambda j: j["attempts"][0]["runs"][0]["state"] == "running", "running")
        await client.call("stop", jobs=[first["id"]])
        shown = await finished(client, first["id"])
        assert shown["status"] == "stopped"
        assert shown["attempts"][0]["runs"][0]["pid"] == pid  # the run adopted is the one the slow start began
        assert (await finished(client, second["id"]))["status"] == "succeeded"
        assert not pid_alive(pid)


# what a job of another user writes over its own status.json (issue 26, item 3): wrong types, not an object, a FIFO
HOSTILE_STATUS = {
    "types": '{"state": "running", "supervisor_pid": "x", "supervisor_start": 1, "boot_id": 5, "pgid": [1]}',
    "list": '["x"]',
    "fifo": "",
}
CORRUPT = (
    'sh -c \'d=$(dirname "$FT_HOSTFILE"); sleep 1; '
    'if [ -z "$BAD" ]; then rm -f "$d/status.json"; mkfifo "$d/status.json"; '
    'else printf %s "$BAD" > "$d/status.json"; fi; exec sleep 300\''
)


@pytest.mark.skipif(os.geteuid() != 0, reason="a job of another uid needs root")
async def test_a_status_file_its_user_corrupts_fails_that_run_alone(
    sshd_cluster, tmp_path, sock_dir, shared_run_root
) -> None:
    """Defect (issue 26): a job of uid 65534 that wrote wrong types, a list or a FIFO over its own status.json
    made the node's whole status read fail (or hang), so root's job on the same node read `running` forever.
    Now each such run reads lost (its status file is unreadable) and fails alone; root's job ends in time."""
    cluster: SshdCluster = sshd_cluster(1, gpus=4)
    sock_dir.chmod(0o755)  # uid 65534 reaches the socket
    loaded = config(cluster, tmp_path, sock_dir, scheduler={"run_root": shared_run_root})
    async with running(loaded) as (_, client):
        hostile = {}
        for name, bad in HOSTILE_STATUS.items():
            spec = job(f"hostile-{name}", CORRUPT, env={"BAD": bad}, gpus_per_node=1)
            hostile[name] = (await as_nobody(loaded.socket_path, "submit", spec=spec))["result"]["id"]
        for job_id in hostile.values():
            await until(client, job_id, running_condition, "the hostile jobs to run")
        await asyncio.sleep(1.5)  # they have corrupted their status files
        submitted_at = time.monotonic()
        mine = await client.call("submit", spec=job("roots", "sleep 3", gpus_per_node=1))
        shown = await finished(client, mine["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert time.monotonic() - submitted_at < 20
        for name, job_id in hostile.items():
            shown = await finished(client, job_id)
            assert shown["status"] == "error", (name, shown["message"])
            assert "lost: its status file is unreadable" in shown["message"], (name, shown["message"])


async def test_a_value_the_store_refuses_fails_that_job_alone_and_the_others_are_still_recorded(
    sshd_cluster, tmp_path, sock_dir, monkeypatch
) -> None:
    """Defect (issue 26): the loop wrote every job's run changes in one transaction, so one value the store
    refuses (here a pid past SQLite's INTEGER, as an unchecked status could carry) raised every tick, for all
    jobs: none was recorded, nothing ended. Now that job fails alone and the other is recorded and ends."""
    from ftconsole.scheduler import loop

    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = config(cluster, tmp_path, sock_dir)
    doomed: set[int] = set()
    armed = [True]

    def refused_pid(run: Any, status: Any, now: float, real: Any = loop.recorded) -> dict[str, Any]:
        fields: dict[str, Any] = real(run, status, now)
        if armed[0] and status.token in doomed:
            fields["pid"] = 2**70
        return fields

    monkeypatch.setattr(loop, "recorded", refused_pid)
    async with running(loaded) as (_, client):
        bad = await client.call("submit", spec=job("bad", "sleep 300", gpus_per_node=1))
        fine = await client.call("submit", spec=job("fine", "sleep 2", gpus_per_node=1))
        shown = await until(client, bad["id"], lambda j: j["attempts"] and j["attempts"][0]["token"], "a token")
        doomed.add(shown["attempts"][0]["token"])
        assert (await finished(client, fine["id"]))["status"] == "succeeded"
        shown = await until(client, bad["id"], lambda j: j["stop_requested"] is not None, "the bad job stopped")
        assert "ftconsole cannot record" in shown["message"] and "OverflowError" in shown["message"]
        armed[0] = False  # its run can be written again: it ends
        shown = await finished(client, bad["id"])
        assert shown["status"] == "error" and "OverflowError" in shown["message"], shown["message"]
