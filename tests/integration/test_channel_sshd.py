"""Node channels on real sshd nodes (issue 28): a rank's exit pushed and acted on without waiting for a tick, a
quiet node left unread, a channel killed on its node reopened with nothing lost, a node frozen briefly costing
nothing and one frozen for good given up after node_timeout, and the per-command path where channels are off.

The first test's tick is an hour: the loop runs only when something wakes it (a submit, a node command that
finishes, a node's event), so a job that ends at all was ended by its node's event, not by a tick."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from typing import Any

import pytest

from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.ssh import channel as channel_module
from ftconsole.scheduler.ssh.runs import node_runs
from tests.integration.test_scheduler_sshd import WAIT, finished, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster, pid_alive

pytestmark = pytest.mark.sshd
LONG_TICK = {"tick": "1h", "stop_grace": "2s"}


def channel_pids(scheduler: Scheduler) -> dict[str, int]:
    """node -> the pid of its live channel (as its hello said)."""
    channels = scheduler.loop.executor.channels
    assert channels is not None
    return {key[0]: channel.pid for key, channel in channels.live().items()}


async def test_a_ranks_exit_is_acted_on_without_waiting_for_the_tick(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=LONG_TICK, probes={"interval": "1h"})
    async with running(loaded) as (scheduler, client):
        # the first tick places the job; the second starts it: a submit pokes the loop, so they follow at once
        submitted = await client.call("submit", spec=job("quick", "sh -c 'sleep 2; exit 3'", mode="pytorch", nodes=2))
        await ranks_running(client, submitted["id"], "both ranks running")
        assert set(channel_pids(scheduler)) == {n.name for n in cluster}  # the start went through them
        shown = await finished(client, submitted["id"])  # no tick comes within the wait: the exits woke the loop
        assert shown["status"] == "error" and "exited with code 3" in shown["message"], shown["message"]


async def test_a_channel_killed_on_its_node_is_opened_again_and_nothing_is_lost(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"tick": "0.5s", "stop_grace": "2s"})
    marker = tmp_path / "went-on"
    async with running(loaded) as (scheduler, client):
        command = f"sh -c 'sleep 4; touch {marker}'"
        submitted = await client.call("submit", spec=job("survivor", command))
        await ranks_running(client, submitted["id"], "the rank running")
        first = await poll(lambda: _async(channel_pids(scheduler)), bool, "a channel")
        ((node, pid),) = first.items()
        os.kill(pid, signal.SIGKILL)  # the node-side process of the channel (the nodes are this machine's)
        again = await poll(lambda: _async(channel_pids(scheduler)), lambda p: p.get(node) not in (None, pid),
                           "the channel opened again")  # fmt: skip
        assert again[node] != pid
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert marker.exists()  # the rank went on: it never depended on the channel
        assert len(shown["attempts"]) == 1  # no restart, nothing run twice


async def test_with_channels_off_every_command_is_a_process_of_its_own(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"tick": "0.3s", "node_channel": False})
    async with running(loaded) as (scheduler, client):
        assert scheduler.loop.executor.channels is None
        submitted = await client.call("submit", spec=job("by-command", "sh -c 'exit 0'", mode="pytorch", nodes=2))
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown["message"]


async def _async(value):  # type: ignore[no-untyped-def]
    return value


async def ranks_running(client: ApiClient, job_id: int, what: str) -> dict[str, Any]:
    """Until the job runs with every rank of its first attempt read `running`; the job as shown then."""
    return await until(client, job_id, lambda j: j["status"] == "running" and bool(j["attempts"]) and all(
        r["state"] == "running" for r in j["attempts"][0]["runs"]), what)  # fmt: skip


async def test_a_node_killed_is_given_up_at_once_and_a_frozen_one_is_not(sshd_cluster, tmp_path, sock_dir) -> None:
    """Its connection lost and its SSH port refusing: the node is down, and its runs are lost without waiting
    for node_timeout (10 minutes here, so only that evidence can end it within the wait). A node whose
    commands stall with sshd still answering is waited for: its run stays running meanwhile."""
    cluster: SshdCluster = sshd_cluster(3)
    timeout = {"tick": "0.3s", "stop_grace": "2s", "node_timeout": "10m"}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=timeout)
    async with running(loaded) as (_, client):
        submitted = await client.call(
            "submit", spec=job("pair", "sleep 300", mode="pytorch", nodes=2, node_names="node01,node02")
        )
        frozen = await client.call("submit", spec=job("alone", "sleep 300", node_names="node03"))
        for job_id in (submitted["id"], frozen["id"]):
            await ranks_running(client, job_id, "ranks running")
        shown = await client.call("show", job=submitted["id"])
        victim = shown["attempts"][0]["runs"][1]["node"]
        assert victim != "node03"
        cluster.hang("node03", sessions=True)  # frozen: sshd greets, its commands stall
        try:
            cluster.down(victim)
            shown = await until(client, submitted["id"], lambda j: any(
                r["state"] == "lost" for r in j["attempts"][0]["runs"]), "the dead node's rank lost")  # fmt: skip
            (lost,) = [r for r in shown["attempts"][0]["runs"] if r["state"] == "lost"]
            assert lost["node"] == victim and "refuses connections" in lost["error"], lost
            alone = await client.call("show", job=frozen["id"])
            assert alone["status"] == "running" and alone["attempts"][0]["runs"][0]["state"] == "running"
        finally:
            cluster.unhang("node03")
        await client.call("stop", jobs=[submitted["id"], frozen["id"]])
        for job_id in (submitted["id"], frozen["id"]):
            await finished(client, job_id)


async def test_a_quiet_node_is_not_asked_each_tick_and_its_runs_exit_still_is_acted_on(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Once its channel watches its runs, a node where nothing changes is not read each tick (its heartbeat says
    it is there); the safety-net read is turned off here, so the job can only end by its node's event."""
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"tick": "0.2s"}, probes={"interval": "1h"})
    marker = tmp_path / "go"
    async with running(loaded) as (scheduler, client):
        executor = scheduler.loop.executor
        executor.read_every = lambda runs: 3600.0
        command = f"sh -c 'while [ ! -e {marker} ]; do sleep 0.1; done; exit 3'"
        submitted = await client.call("submit", spec=job("quiet", command))
        await ranks_running(client, submitted["id"], "the rank running")
        assert executor.channels is not None
        (channel,) = await poll(lambda: _async([c for c in executor.channels.live().values() if c.watching]),
                                bool, "the channel watching the run")  # fmt: skip
        before = channel.asked
        await asyncio.sleep(3)  # 15 ticks
        assert channel.asked - before <= 1, channel.asked - before  # a read per tick would be 15
        assert "node01" not in executor.waiting  # its heartbeat answers for it
        marker.touch()
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "error" and "exited with code 3" in shown["message"], shown["message"]


async def test_a_node_frozen_for_5s_costs_nothing_and_one_frozen_for_good_is_given_up_after_node_timeout(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Two nodes with a job each, node_timeout 10 s: node01 freezes for 5.5 s (every process of it stopped, its
    channel's heartbeat too) and goes on; node02 freezes for good. node02's rank is lost once it was silent for
    node_timeout, counted from when it was last heard; node01's job never noticed."""
    cluster: SshdCluster = sshd_cluster(2)
    settings = {"tick": "0.3s", "stop_grace": "2s", "node_timeout": "10s"}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=settings, probes={"interval": "1h"})
    async with running(loaded) as (scheduler, client):
        ids = {}
        for name in ("node01", "node02"):
            ids[name] = (await client.call("submit", spec=job(f"on-{name}", "sleep 300", node_names=name)))["id"]
        for job_id in ids.values():
            await ranks_running(client, job_id, "ranks running")
        await poll(lambda: _async(sum(bool(c.watching) for c in scheduler.loop.executor.channels.live().values())),
                   lambda n: n == 2, "both channels watching")  # fmt: skip
        cluster.hang("node01", sessions=True)
        cluster.hang("node02", sessions=True)
        try:
            await asyncio.sleep(5.5)
            cluster.unhang("node01")
            shown = await until(client, ids["node02"], lambda j: j["attempts"][0]["runs"][0]["state"] == "lost",
                                "node02's rank lost")  # fmt: skip
            error = shown["attempts"][0]["runs"][0]["error"]
            waited = re.search(r"no answer for (\d+(?:\.\d+)?)s", error)
            assert waited is not None and float(waited.group(1)) >= 10, error
            alone = await client.call("show", job=ids["node01"])
            assert alone["status"] == "running" and len(alone["attempts"]) == 1, alone
            assert alone["attempts"][0]["runs"][0]["state"] == "running"
            events = await client.call("events", job=ids["node01"])
            assert not [e for e in events if e["kind"] == "RunLost"], events
        finally:
            cluster.unhang("node02")
        await client.call("stop", jobs=list(ids.values()))
        for job_id in ids.values():
            await finished(client, job_id)


async def test_logs_follow_takes_what_the_node_pushes_and_the_push_stops_with_the_reader(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    marker = tmp_path / "go"
    async with running(loaded) as (scheduler, client):
        command = f"sh -c 'echo first; while [ ! -e {marker} ]; do sleep 0.1; done; echo second; sleep 300'"
        submitted = await client.call("submit", spec=job("talker", command))
        await ranks_running(client, submitted["id"], "the rank running")
        channels = scheduler.loop.executor.channels
        assert channels is not None
        stream = client.stream("logs", job=submitted["id"], follow=True)
        got = ""
        while "first" not in got:
            got += await asyncio.wait_for(stream.__anext__(), WAIT)
        (pushing,) = await poll(lambda: _async([c for c in channels.live().values() if c._follows]), bool,
                                "the node pushing the log")  # fmt: skip
        marker.touch()
        while "second" not in got:
            got += await asyncio.wait_for(stream.__anext__(), WAIT)
        assert got == "first\nsecond\n"
        await stream.aclose()  # the reader goes: the node is told to stop
        await poll(lambda: _async(len(pushing._follows)), lambda n: n == 0, "the push stopped")
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])


async def test_a_node_whose_sshd_dies_is_given_up_early_and_its_rank_is_fenced_when_it_returns(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """The rule for a node given up early (docs/configuration.md): the new attempt does not wait for proof that
    the old rank is gone. Here the old rank does live on (only sshd died: connections reset, the port refusing),
    and is killed by the sweep once the node answers again; the job's new attempt runs elsewhere meanwhile."""
    cluster: SshdCluster = sshd_cluster(2)
    settings = {"tick": "0.3s", "stop_grace": "2s", "node_timeout": "10m"}  # only the early evidence can end it
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=settings, probes={"interval": "1h"})
    async with running(loaded) as (_, client):
        command = "sh -c 'echo $$ > $HOME/rank.$FT_JOB_ID.$FT_ATTEMPT; exec sleep 300'"
        spec = job("survivor", command, node_names="node01,node02", fault_tolerance={"retries": 1})
        submitted = await client.call("submit", spec=spec)
        shown = await ranks_running(client, submitted["id"], "the rank running")
        victim = shown["attempts"][0]["runs"][0]["node"]
        pid_file = cluster.node(victim).home / f"rank.{submitted['id']}.1"
        old = int(await poll(lambda: _async(pid_file.read_text() if pid_file.exists() else ""), bool, "its pid"))
        cluster.cut(victim)
        try:
            shown = await until(client, submitted["id"], lambda j: len(j["attempts"]) == 2 and all(
                r["state"] == "running" for r in j["attempts"][1]["runs"]), "the job running elsewhere")  # fmt: skip
            assert shown["attempts"][0]["runs"][0]["state"] == "lost"
            assert "refuses connections" in shown["attempts"][0]["runs"][0]["error"]
            assert shown["attempts"][1]["runs"][0]["node"] != victim
            assert pid_alive(old)  # its sshd died, not the rank: two copies live until the node answers
        finally:
            cluster.up(victim)
        events = await poll(lambda: client.call("events", job=submitted["id"]), lambda events: any(
            e["kind"] == "Fenced" and e["node"] == victim for e in events), "the old rank fenced")  # fmt: skip
        assert await poll(lambda: _async(pid_alive(old)), lambda alive: not alive, "the old rank gone") is False, events
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])


async def test_a_channel_with_nothing_to_watch_is_closed_and_opened_again_when_needed(
    sshd_cluster, tmp_path, sock_dir, monkeypatch
) -> None:
    monkeypatch.setattr(channel_module, "IDLE_S", 1.0)
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    async with running(loaded) as (scheduler, client):
        channels = scheduler.loop.executor.channels
        assert channels is not None
        first = await client.call("submit", spec=job("short", "true"))
        assert (await finished(client, first["id"]))["status"] == "succeeded"
        await poll(lambda: _async(channel_pids(scheduler)), lambda pids: pids == {}, "the idle channel closed")
        again = await client.call("submit", spec=job("again", "sleep 5"))
        await poll(lambda: _async(channel_pids(scheduler)), bool, "a channel opened again for the next job")
        assert (await finished(client, again["id"]))["status"] == "succeeded"


async def test_a_sweep_for_another_user_leaves_no_channel_behind(sshd_cluster, tmp_path, sock_dir) -> None:
    """A sweep lists the runs of each user who ran jobs lately, a node's first read removes their old run
    folders, a launch asks for a free port as the SSH account: one-off requests, answered by a channel where one
    is open for that user, else by one command, so that no channel per user and node is left heartbeating
    until it is found idle (the job's own channel is the only one)."""
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    async with running(loaded) as (scheduler, client):
        executor = scheduler.loop.executor
        channels = executor.channels
        assert channels is not None
        submitted = await client.call("submit", spec=job("watched", "sleep 30"))
        ran = lambda j: any(r["state"] == "running" for a in j["attempts"] for r in a["runs"])  # noqa: E731
        await until(client, submitted["id"], ran, "the rank read running")
        live = await poll(lambda: _async(channels.live()), bool, "the job's node channel")
        [(key, channel)] = live.items()
        node = executor.nodes[key[0]]
        other = None if key[1] is not None else "root"
        found = await node_runs(channels, node, root=executor.run_root, user=other, timeout=WAIT)
        assert list(channels.live()) == [key], "no channel opened for the other user's sweep"
        sweeps: list[dict[str, Any]] = []  # what the channel is asked beside the loop's own status reads (run_dirs)
        ask = channel.ask

        async def recorded(params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            if params.get("action") == "status" and params.get("run_dirs") is None:
                sweeps.append(params)
            return await ask(params, *args, **kwargs)

        channel.ask = recorded  # type: ignore[method-assign]
        mine = await node_runs(channels, node, root=executor.run_root, user=key[1], timeout=WAIT)
        assert len(sweeps) == 1, "the owner's sweep went through the channel open for that user"
        assert [(r.job, r.status.state) for r in mine] == [(str(submitted["id"]), "running")]
        assert [(r.job, r.status.state) for r in found] == [(str(submitted["id"]), "running")]  # both root's
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])
