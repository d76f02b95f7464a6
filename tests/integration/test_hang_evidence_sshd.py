"""`ftconsole debug JOB` on real sshd nodes (issue 29): the evidence of every rank, gathered from both nodes at
once, with each rank's Python stack by py-spy, which the nodes lack and the scheduler sends them (kept by its
hash in the SSH account's ~/.ftconsole/lib, not sent again); the verdict, the table and the stacks folded by
sameness in the CLI's output; the same as JSON; and the evidence kept with the job once it ended. The torch
jobs that hang for real are tests/peers/test_hang_evidence.py's."""

from __future__ import annotations

import asyncio

import pytest

from ftconsole.scheduler import rankreads
from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import finished, job, log_of, poll, running, until, write_config
from tests.sshd_cluster import HOME_LAYOUTS, SshdCluster

pytestmark = pytest.mark.sshd

WAITER = "import time\ndef wait_for_peer():\n    time.sleep(600)\nprint('waiting', flush=True)\nwait_for_peer()\n"


@pytest.mark.parametrize("layout", HOME_LAYOUTS)
async def test_debug_gathers_every_ranks_stack_and_keeps_the_evidence(
    sshd_cluster, tmp_path, sock_dir, layout, monkeypatch
) -> None:
    """With a shared home (NFS), both nodes store the same py-spy at once: one copy, each node's own temporary.
    A gather is shared by the debug requests that come while it is recent (here: for the whole test)."""
    monkeypatch.setattr(rankreads, "DEBUG_EVERY_S", 3600.0)
    cluster: SshdCluster = sshd_cluster(2, shared_home=layout == "shared-home")
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    cli = Cli(loaded.file)
    async with running(loaded) as (_, client):
        command = f"sh -c 'exec python3 {script}'"  # as is: no launcher (a `python X` would be wrapped in torchrun)
        submitted = await client.call("submit", spec=job("waiter", command, mode="pytorch", nodes=2))
        await until(client, submitted["id"], lambda j: j["status"] == "running", "the job running")
        job_id = submitted["id"]

        async def printed() -> list[str]:
            shown = await client.call("show", job=job_id)
            if any(r["state"] != "running" for r in shown["attempts"][-1]["runs"]):
                return []
            return [await log_of(client, job_id, rank) for rank in (0, 1)]

        await poll(printed, lambda logs: bool(logs) and all("waiting" in t for t in logs), "both in wait_for_peer")
        doc = await asyncio.to_thread(cli.json, "debug", str(job_id))
        assert doc["verdict"] == {
            "rank": None,
            "node": None,
            "rule": "none",
            "hardware": False,
            "ranks": [],
            "reason": "no rank stands out: ranks 0-1 are at waiter.py:3 in wait_for_peer",
        }
        assert [(r["rank"], r["node"], r["state"]) for r in doc["ranks"]] == [(0, "node01", "S"), (1, "node02", "S")]
        assert [r["output_tail"] for r in doc["runs"]] == ["waiting\n", "waiting\n"]
        assert doc["suspected_hung"] is False and doc["kept"] is False
        kept = [list((n.home / ".ftconsole" / "lib").glob("py-spy-*")) for n in cluster]
        assert all(len(copies) == 1 for copies in kept), kept
        stamps = [copies[0].stat().st_mtime_ns for copies in kept]

        # asked again at once, and twice at the same time: the gather just made is shared (nothing more is run on
        # the nodes, no new Evidence event)
        again = await asyncio.gather(client.call("debug", job=job_id), client.call("debug", job=job_id))
        assert [(d["time"], d["verdict"]) for d in again] == [(doc["time"], doc["verdict"])] * 2, again
        text = (await asyncio.to_thread(cli, "debug", str(job_id))).stdout
        assert "verdict: no rank stands out: ranks 0-1 are at waiter.py:3 in wait_for_peer" in text, text
        assert "\nranks 0-1:\n    wait_for_peer (" in text, text  # two identical stacks shown once
        assert [c[0].stat().st_mtime_ns for c in kept] == stamps, "py-spy was not sent again"

        await client.call("stop", jobs=[job_id])
        await finished(client, job_id)
        after = await asyncio.to_thread(cli.json, "debug", str(job_id))
        assert after["kept"] and after["verdict"] == doc["verdict"]
        events = await client.call("events", job=job_id)
        kept_events = [e for e in events if e["kind"] == "Evidence"]
        assert len(kept_events) == 1 and all(set(e["data"]) == {"verdict", "evidence"} for e in kept_events)


async def test_a_job_without_python_gets_its_evidence_and_no_py_spy_is_sent(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    async with running(loaded) as (_, client):
        submitted = await client.call("submit", spec=job("sleeper", "sh -c 'sleep 300; true'"))  # sh waits for it
        ran = lambda j: any(r["state"] == "running" for a in j["attempts"] for r in a["runs"])  # noqa: E731
        await until(client, submitted["id"], ran, "the rank read running")
        doc = await client.call("debug", job=submitted["id"])
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])
    [rank] = doc["ranks"]
    assert (rank["state"], rank["stack"], rank["stack_error"]) == ("S", [], "not a Python process"), rank
    assert doc["verdict"]["reason"] == "no rank stands out: rank 0 has no stack (not a Python process)"
    [processes] = [run["processes"] for run in doc["runs"]]
    assert sorted(p["comm"] for p in processes) == ["sh", "sleep"], processes
    [sleeper] = [p for p in processes if p["comm"] == "sleep"]
    assert rank["pid"] == sleeper["pid"] and sleeper["wchan"], (rank, processes)  # the command, not its shell
    assert not list((cluster.nodes[0].home / ".ftconsole" / "lib").glob("py-spy-*"))
