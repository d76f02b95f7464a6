"""The scheduler end to end on real sshd nodes: `serve` with its socket, jobs placed, run, stopped, expired.

Every job here runs as real processes on the nodes through the run supervisor; the tests talk to the
scheduler only through its API socket, as the CLI does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ftconsole.scheduler import loop as loop_module
from ftconsole.scheduler.errors import AlreadyRunning, NotFound, UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.serve.daemon import serve
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from tests.sshd_cluster import SshdCluster, pid_alive

pytestmark = pytest.mark.sshd
WAIT = 60.0
T = TypeVar("T")


def write_config(cluster: SshdCluster, root: Path, sock_dir: Path, **overrides: Any) -> LoadedConfig:
    settings = {
        "ssh": {"python": sys.executable},
        "scheduler": {"tick": "0.3s", "stop_grace": "2s"},
        "api": {"socket": str(sock_dir / "ft.sock")},
    }
    for key, value in overrides.items():
        settings[key] = {**settings.get(key, {}), **value}
    return load_config(cluster.write_config(root / "cluster.yaml", **settings))


@contextlib.asynccontextmanager
async def running(loaded: LoadedConfig) -> AsyncIterator[tuple[Scheduler, ApiClient]]:
    """`serve` in this process (real lock, store, SSH pool and socket); a client connected to it."""
    stop = asyncio.Event()
    ready: asyncio.Future[Scheduler] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(loaded, stop, ready=ready.set_result))
    try:
        scheduler = await asyncio.wait_for(asyncio.shield(ready), WAIT)
        async with await ApiClient.connect(loaded.socket_path) as client:
            yield scheduler, client
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)


async def _async(value: T) -> T:
    return value


def job(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": command, **fields}


async def poll(fetch: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str) -> T:
    """`fetch()` every 0.1 s until `done` says yes (its last value), or fail after WAIT seconds."""
    value = await fetch()
    for _ in range(int(WAIT / 0.1)):
        if done(value):
            return value
        await asyncio.sleep(0.1)
        value = await fetch()
    raise AssertionError(f"timed out waiting for {what}: {json.dumps(value, indent=1, default=str)[:3000]}")


async def until(client: ApiClient, job_id: int, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    return await poll(lambda: client.call("show", job=job_id), done, what)


async def finished(client: ApiClient, job_id: int) -> dict[str, Any]:
    return await until(client, job_id, lambda j: j["status"] not in ("queued", "running"), f"job {job_id} to end")


async def log_of(client: ApiClient, job_id: int, rank: int = 0, attempt: int | None = None) -> str:
    return "".join([chunk async for chunk in client.stream("logs", job=job_id, rank=rank, attempt=attempt)])


async def test_two_node_pytorch_job_gets_env_and_hostfile_on_each_node(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=4)
    loaded = write_config(cluster, tmp_path, sock_dir)
    hosts = {n.name: n.address for n in cluster}
    command = "sh -c 'env | sort; echo HOSTFILE; cat \"$FT_HOSTFILE\"; echo; pwd'"
    async with running(loaded) as (scheduler, client):
        submitted = await client.call(
            "submit", spec=job("envdump", command, mode="pytorch", nodes=2, gpus_per_node=2, workdir="/tmp")
        )
        assert submitted["status"] == "queued"
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown["message"]
        runs = shown["attempts"][0]["runs"]
        port = shown["attempts"][0]["master_port"]
        assert [r["rank"] for r in runs] == [0, 1]
        assert sorted(r["node"] for r in runs) == sorted(hosts)
        master = hosts[runs[0]["node"]]
        for run in runs:
            text = await log_of(client, submitted["id"], run["rank"])
            env_part, hostfile = text.split("HOSTFILE\n", 1)
            env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
            node_home = cluster.node(run["node"]).home
            run_dir = f"{node_home}/.ftconsole/runs/{scheduler.store.cluster_id}/{submitted['id']}/1/{run['rank']}"
            assert run["run_dir"] == run_dir
            assert env["MASTER_ADDR"] == master
            assert env["MASTER_PORT"] == str(port)
            assert env["WORLD_SIZE"] == "2"
            assert env["RANK"] == str(run["rank"])
            assert env["SLOTS"] == "2"
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, run["gpus"]))
            assert env["FT_JOB_ID"] == str(submitted["id"])
            assert env["FT_ATTEMPT"] == "1"
            assert env["FT_HOSTFILE"] == f"{run_dir}/hostfile"
            assert env["FT_OUTPUT_DIR"] == f"{run_dir}/output"
            expected = "".join(f"{hosts[r['node']]} slots=2\n" for r in runs)
            assert hostfile.startswith(expected)
            assert hostfile.rstrip().endswith("/tmp")  # the workdir
        conditions = [c["type"] for c in shown["conditions"]]
        assert conditions[:2] == ["Pending", "Creating"] and conditions[-1] == "Succeeded"
        assert "Running" in conditions


async def test_wrong_command_ends_in_error_with_a_clear_message(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        missing = await client.call("submit", spec=job("typo", "pyhton3 train.py"))
        failing = await client.call("submit", spec=job("fails", "sh -c 'echo boom >&2; exit 7'"))
        shown = await finished(client, missing["id"])
        assert shown["status"] == "error"
        assert "cannot start pyhton3" in shown["message"] and "No such file" in shown["message"]
        assert shown["conditions"][-1]["type"] == "Failed"
        shown = await finished(client, failing["id"])
        assert (shown["status"], shown["exit_code"]) == ("error", 7)
        assert shown["message"].endswith("exited with code 7")
        assert "boom" in await log_of(client, failing["id"])
        # the GPUs are free again: a job needing both starts
        again = await client.call("submit", spec=job("after", "true", gpus_per_node=2))
        assert (await finished(client, again["id"]))["status"] == "succeeded"


async def test_stop_reaches_the_whole_process_group(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        submitted = await client.call("submit", spec=job("tree", "sh -c 'sleep 300 & echo child $!; wait'"))
        job_id = submitted["id"]
        await until(client, job_id, lambda j: any(c["type"] == "Running" for c in j["conditions"]), "Running")
        text = ""
        for _ in range(100):
            text = await log_of(client, job_id)
            if "child" in text:
                break
            await asyncio.sleep(0.1)
        child = int(text.split("child", 1)[1].split()[0])
        leader = (await client.call("show", job=job_id))["attempts"][0]["runs"][0]["pid"]
        assert pid_alive(child) and pid_alive(leader)
        stopped = await client.call("stop", jobs=[job_id])
        assert stopped[0]["stop_reason"] == "stopped"
        shown = await finished(client, job_id)
        assert shown["status"] == "stopped"
        assert shown["attempts"][0]["runs"][0]["signal"] == "SIGTERM"
        assert not pid_alive(child), "the command's child outlived the stop"
        assert not pid_alive(leader)
        assert [c["type"] for c in shown["conditions"]][-2:] == ["Stopping", "Stopped"]
        with pytest.raises(UsageError, match="only change while it is queued"):
            await client.call("priority", job=job_id, level="urgent")


async def test_max_runtime_expires_the_job_and_extend_lengthens_it(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        short = await client.call("submit", spec=job("short", "sleep 60", max_runtime="1s"))
        extended = await client.call("submit", spec=job("extended", "sleep 3", max_runtime="1s"))
        await client.call("extend", job=extended["id"], duration="30s")
        shown = await finished(client, short["id"])
        assert shown["status"] == "expired"
        assert shown["stop_by"] == "scheduler"
        assert any(c["type"] == "Stopping" and "max_runtime 1s reached" in c["message"] for c in shown["conditions"])
        shown = await finished(client, extended["id"])
        assert shown["status"] == "succeeded"
        assert shown["max_runtime_s"] == 31
        with pytest.raises(UsageError, match="no max_runtime"):
            await client.call(
                "extend", job=(await client.call("submit", spec=job("free", "true")))["id"], duration="1h"
            )


# A client as another user: the plain socket module, one request, prints the reply as one JSON line.
AS_OTHER_USER = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(30)
sock.connect(sys.argv[1])
sock.sendall(sys.argv[2].encode() + b"\\n")
print(sock.makefile("rb").readline().decode().strip())
"""


async def as_nobody(path: Path, op: str, **args: Any) -> dict[str, Any]:
    return await as_uid(65534, path, op, **args)


async def as_uid(uid: int, path: Path, op: str, **args: Any) -> dict[str, Any]:
    """One API request over the socket from a process of `uid` (gid 65534, and group 0 to reach the socket)."""
    request = json.dumps({"id": 1, "op": op, "args": args})
    for python in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]):
        try:
            proc = await asyncio.create_subprocess_exec(
                python, "-I", "-c", AS_OTHER_USER, str(path), request, stdout=asyncio.subprocess.PIPE,
                user=uid, group=65534, extra_groups=[0], cwd="/",
            )  # fmt: skip
        except (PermissionError, FileNotFoundError):
            continue
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
        assert proc.returncode == 0
        return dict(json.loads(out))
    pytest.skip(f"no Python interpreter that uid {uid} may run")


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_only_owner_admins_and_access_decide_who_acts(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        shared = await client.call("submit", spec=job("shared", "sleep 300", access="read-only"))
        private = await client.call("submit", spec=job("private", "sleep 300"))
        await until(client, shared["id"], lambda j: j["status"] == "running", "running")

        refused = await as_nobody(loaded.socket_path, "stop", jobs=[shared["id"]])
        assert refused["error"]["type"] == "PermissionDenied"
        assert f"may not stop job {shared['id']}: it belongs to root" in refused["error"]["message"]
        assert (await as_nobody(loaded.socket_path, "show", job=shared["id"]))["result"]["name"] == "shared"
        refused = await as_nobody(loaded.socket_path, "debug", job=shared["id"])  # read-only: its stacks are not
        assert f"may not debug job {shared['id']}: it belongs to root" in refused["error"]["message"]
        refused = await as_nobody(loaded.socket_path, "show", job=private["id"])  # as if it were not there
        assert refused["error"]["type"] == "NotFound" and refused["error"]["message"] == f"no job {private['id']}"
        refused = await as_nobody(loaded.socket_path, "submit", spec=job("vip", "true", priority="very-urgent"))
        assert "admins only" in refused["error"]["message"]
        assert (await client.call("show", job=shared["id"]))["status"] == "running"

        # nobody's own job: nobody may stop it
        own = (await as_nobody(loaded.socket_path, "submit", spec=job("mine", "sleep 300", gpus_per_node=2)))["result"]
        assert own["owner"] == pwd.getpwuid(65534).pw_name
        assert (await as_nobody(loaded.socket_path, "stop", jobs=[own["id"]]))["result"][0]["status"] == "stopped"

        # root is an admin: it may stop anyone's job
        await client.call("stop", jobs=[shared["id"], private["id"]])
        assert (await finished(client, shared["id"]))["status"] == "stopped"
        assert (await finished(client, private["id"]))["status"] == "stopped"


async def test_one_scheduler_per_state_dir_and_jobs_survive_its_restart(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        with pytest.raises(AlreadyRunning, match=r"another scheduler \(pid \d+\) already runs"):
            await asyncio.wait_for(serve(loaded, asyncio.Event()), WAIT)
        submitted = await client.call("submit", spec=job("survivor", "sh -c 'sleep 2; echo survived'"))
        await until(client, submitted["id"], lambda j: j["status"] == "running", "running")
    # the scheduler is down; the run goes on on its node, and the next scheduler reads it back
    await asyncio.sleep(2.5)
    async with running(loaded) as (scheduler, client):
        assert await poll(lambda: _async(scheduler.loop.adopted_s), lambda s: s is not None, "adoption") < WAIT
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded"
        assert "survived" in await log_of(client, submitted["id"])


async def test_logs_follow_streams_until_the_run_ends(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        command = "sh -c 'echo first; sleep 1.5; printf \"h\\303\\251llo\\n\"; echo last'"
        submitted = await client.call("submit", spec=job("chatty", command))
        await until(client, submitted["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "start")
        chunks = []
        stream = client.stream("logs", job=submitted["id"], follow=True)
        async for chunk in stream:
            chunks.append(chunk)
        assert "".join(chunks) == "first\nhéllo\nlast\n"
        assert len(chunks) >= 2  # it arrived while the run was going, not in one piece at the end
        tail = "".join([c async for c in client.stream("logs", job=submitted["id"], tail=1)])
        assert tail == "last\n"
        with pytest.raises(NotFound, match="has no rank 3"):
            async for _ in client.stream("logs", job=submitted["id"], rank=3):
                pass


async def test_last_output_advances_while_a_job_prints_and_the_feed_carries_it(
    sshd_cluster, tmp_path, sock_dir, monkeypatch
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    monkeypatch.setattr(loop_module, "OUTPUT_FLUSH_S", 2.0)  # written every 2 s, not 10: the same path, sooner
    async with running(loaded) as (_, client):
        start = await client.call("jobs_changed", since=None)
        assert start["jobs"] == [] and isinstance(start["cursor"], float)
        # output is pushed every 5 s, and written every 2 s here: it prints until stopped, once its output moved twice
        command = "sh -c 'for i in $(seq 300); do echo step $i; sleep 0.4; done'"
        submitted = await client.call("submit", spec=job("printer", command, mode="pytorch", nodes=2))
        assert (submitted["last_output"], submitted["open_alerts"], submitted["node_names"]) == (None, 0, [])
        first = await until(client, submitted["id"], lambda j: j["last_output"] is not None, "the first output")
        assert sorted(first["node_names"]) == ["node01", "node02"] and len(first["node_names"]) == 2
        assert first["node_names"] == [r["node"] for r in first["attempts"][0]["runs"]]  # in rank order
        assert max(r["output_at"] or 0 for r in first["attempts"][0]["runs"]) == first["last_output"]
        later = await until(
            client, submitted["id"], lambda j: (j["last_output"] or 0) > first["last_output"], "more output"
        )
        assert later["status"] == "running"

        # the feed: everything at first, then only what changed, the job each time its output moved
        feed = await client.call("jobs_changed", since=start["cursor"])
        assert [j["id"] for j in feed["jobs"]] == [submitted["id"]] and feed["cursor"] > start["cursor"]
        seen = feed["jobs"][0]["last_output"]
        for _ in range(int(WAIT / 0.2)):
            feed = await client.call("jobs_changed", since=feed["cursor"])
            moved = [j for j in feed["jobs"] if j["id"] == submitted["id"] and j["last_output"] != seen]
            if moved:
                break
            await asyncio.sleep(0.2)
        assert moved and moved[0]["last_output"] > seen and set(moved[0]) >= {"open_alerts", "node_names"}
        listed = {j["id"]: j for j in await client.call("jobs")}
        assert listed[submitted["id"]]["node_names"] == first["node_names"]

        await client.call("stop", jobs=[submitted["id"]])
        done = await finished(client, submitted["id"])
        assert done["status"] == "stopped"
        tail = await client.call("jobs_changed", since=feed["cursor"])
        assert [(j["id"], j["status"]) for j in tail["jobs"]] == [(submitted["id"], "stopped")]
        assert (await client.call("jobs_changed", since=tail["cursor"]))["jobs"] == []
        await client.call("delete", jobs=[submitted["id"]])
        gone = await client.call("jobs_changed", since=tail["cursor"])
        assert [(j["id"], j["deleted"]) for j in gone["jobs"]] == [(submitted["id"], True)]
        assert (await client.call("jobs_changed", since=None))["jobs"] == []
