"""Seed 001's hang detection on real sshd nodes with real processes: the I/O counters of each rank's processes
read in the status round trip, the simulated GPUs' utilisation from the probes; what is checked is the
conditions and alerts the scheduler writes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_scheduler_sshd import finished, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster, gpu_data, pci_bus_id, pid_alive

# quiet for 8 s (no I/O, the GPU flat at 97 %), then prints every 0.2 s
WAKES = "sh -c 'sleep 8; while true; do echo step; sleep 0.2; done'"
PRINTS = "sh -c 'while true; do echo step; sleep 0.2; done'"


def conditions(shown: dict[str, Any], kind: str) -> list[str]:
    return [c["message"] for c in shown["conditions"] if c["type"] == kind]


async def test_a_quiet_job_on_a_flat_gpu_is_suspected_hung_until_its_io_moves_and_a_printing_one_never(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    for node in cluster:
        cluster.set_gpus(node, gpu_data(1, utilization=97))
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    async with running(loaded) as (_, client):
        quiet = (await client.call("submit", spec=job("quiet", WAKES, hang_detect="3s")))["id"]
        busy = (await client.call("submit", spec=job("busy", PRINTS, hang_detect="3s")))["id"]
        shown = await until(client, quiet, lambda j: conditions(j, "SuspectedHung"), "the hang condition")
        (why,) = conditions(shown, "SuspectedHung")
        assert why.startswith("attempt 1 suspected hung: no I/O by any rank for 3s or more; GPU utilisation flat: ")
        assert "97%" in why and "(variance 0, median moved +0)" in why
        alerts = await client.call("alerts")
        (alert,) = [a for a in alerts if a["kind"] == "job_hung"]
        assert alert["job"] == quiet and alert["severity"] == "warning"
        assert "set hang_detect: off or a longer window" in alert["message"]

        # it wakes up and prints: the alert is resolved by ftconsole, the condition says why
        shown = await until(client, quiet, lambda j: len(conditions(j, "SuspectedHung")) == 2, "the hang to clear")
        assert conditions(shown, "SuspectedHung")[1].startswith("attempt 1 no longer suspected hung: I/O resumed at")
        resolved = await client.call("alerts", all=True)
        assert [a["state"] for a in resolved if a["kind"] == "job_hung"] == ["resolved"]

        # the job that printed all along was never flagged
        assert conditions(await client.call("show", job=busy), "SuspectedHung") == []
        await client.call("stop", jobs=[quiet, busy])
        await poll(lambda: client.call("jobs"), lambda js: all(j["status"] == "stopped" for j in js), "the stops")


async def test_hang_detect_off_and_a_working_gpu_are_never_flagged(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """A quiet job with `hang_detect: off`, and a quiet job whose GPU utilisation keeps changing (the probes
    read a new figure each time): neither is suspected hung, past several windows."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    async with running(loaded) as (_, client):
        off = (await client.call("submit", spec=job("off", "sleep 300", hang_detect="off")))["id"]
        working = (await client.call("submit", spec=job("working", "sleep 300", hang_detect="2s")))["id"]
        shown = await until(client, working, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
        node = shown["attempts"][0]["runs"][0]["node"]
        for step in range(16):  # 8 s: four windows, the GPU busy at a changing rate
            cluster.set_gpus(node, gpu_data(1, utilization=(step * 37) % 100))
            await asyncio.sleep(0.5)
        for job_id in (off, working):
            assert conditions(await client.call("show", job=job_id), "SuspectedHung") == []
        assert [a for a in await client.call("alerts") if a["kind"] == "job_hung"] == []
        await client.call("stop", jobs=[off, working])


async def test_hang_action_restart_restarts_a_hung_job_through_its_policy_then_gives_up(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`hang_action: restart` with `max_restarts: 1`: hung, stopped, restarted in place; hung again, and
    with its one restart used it ends `error,exiting`; no process is left."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    async with running(loaded) as (_, client):
        spec = job("stuck", "sleep 300", hang_detect="2s", hang_action="restart", fault_tolerance={"max_restarts": 1})
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await until(client, job_id, lambda j: j["status"] not in ("queued", "running"), "the end")
        assert shown["status"] == "error"
        assert shown["message"].startswith("error,exiting: suspected hung: no I/O by any rank for 2s or more")
        assert shown["message"].endswith("(restarted in place 1 of 1 times)")
        assert [a["result"] for a in shown["attempts"]] == ["restarted", "error"]
        flagged = [c for c in conditions(shown, "SuspectedHung") if "no longer" not in c]
        assert [f.split(" ")[1] for f in flagged] == ["1", "2"]  # each attempt
        assert all(f.endswith("; stopping it to restart (hang_action restart)") for f in flagged)
        pids = [r["pid"] for a in shown["attempts"] for r in a["runs"]]
        assert len(pids) == 2 and all(pid and not pid_alive(pid) for pid in pids)


KMSG_WRITABLE = os.access("/dev/kmsg", os.W_OK)


@pytest.mark.skipif(not KMSG_WRITABLE, reason="writing the driver's Xid into the kernel log needs root")
async def test_a_hung_rank_whose_gpu_logged_a_hardware_xid_has_its_node_isolated_and_the_job_runs_elsewhere(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Issue 29: the driver logs Xid 79 (GPU has fallen off the bus) for the GPU of rank 1 of a quiet two-node job
    (a line the test writes into the real kernel log, as the driver would). The hang's evidence names rank 1 and
    its node, `hang_action: restart` isolates that node, and the job, queued again (its retry), runs on the other
    two; the test nodes share one kernel, so the line names the GPU by its PCI address, which only rank 1's node
    has."""
    cluster: SshdCluster = sshd_cluster(3, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    async with running(loaded) as (_, client):
        spec = job("xid", "sleep 300", mode="pytorch", nodes=2, hang_detect="3s", hang_action="restart",
                   fault_tolerance={"retries": 1})  # fmt: skip
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and all(r["started"] for r in j["attempts"][0]
                            ["runs"]) and len(j["attempts"][0]["runs"]) == 2, "both ranks to start")  # fmt: skip
        runs = {r["rank"]: r for r in shown["attempts"][0]["runs"]}
        bad = cluster.node(runs[1]["node"])
        address = pci_bus_id(bad, runs[1]["gpus"][0])  # as NVML writes it; the driver's Xid line has it shorter
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<4>NVRM: Xid (PCI:{address[4:-2]}): 79, pid={runs[1]['pid']}, GPU has fallen off the bus.\n")
        shown = await until(client, job_id, lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["runs"] and
                            all(r["started"] for r in j["attempts"][1]["runs"]), "the second attempt")  # fmt: skip
        flagged = conditions(shown, "SuspectedHung")[0]
        assert f"rank 1 on {bad.name}: GPU 0 logged Xid 79 (GPU has fallen off the bus)" in flagged
        assert flagged.endswith(f"; {bad.name} isolated: the evidence points to its hardware")
        assert {r["node"] for r in shown["attempts"][1]["runs"]} == {n.name for n in cluster} - {bad.name}
        (node,) = await client.call("nodes", nodeset=bad.name)
        assert node["state"] == "isolated"
        pids = [r["pid"] for r in shown["attempts"][0]["runs"]]
        assert all(pid and not pid_alive(pid) for pid in pids)  # the first attempt's ranks are gone
        evidence = await client.call("debug", job=job_id, stacks=False)
        assert evidence["attempt"] == 2 and all(not r["xids"] for r in evidence["ranks"])  # the Xid was before it
        await client.call("stop", jobs=[job_id])
        await finished(client, job_id)
