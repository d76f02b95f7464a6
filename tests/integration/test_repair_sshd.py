"""The repair ladder (issue 42) on real sshd nodes: an isolated node is reset, rebooted, tested and resumed with no
operator; one that still fails under load stays isolated, and the scheduler does not climb for it again within
`max_per_day`; an operator's `repair` brings it back once it is fixed. The reboot is a head-node command (as an
IPMI tool would be) that asks the test to "reboot" the node: every process started through it killed, a new boot
id, its sshd started again (`SshdCluster.reboot`). What is checked is what is real afterwards: the node's state,
its boot id as the probe reads it, the reboots asked for, the node's events."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import repair
from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.climbs import CLIMB_KEY
from ftconsole.scheduler.errors import PermissionDenied, UsageError
from ftconsole.scheduler.nodeops import ClusterService
from tests.cli_runner import Cli
from tests.integration.test_nodetests_sshd import FAULT, GPU_TEST, config, faulty
from tests.integration.test_scheduler_sshd import poll, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

# a head-node command that appends the node's name to a file: the test reboots what is named there
ASK = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10))"


@contextlib.asynccontextmanager
async def rebooter(cluster: SshdCluster, asked: Path) -> Any:
    """Reboots each node named in `asked` once its name is written there (as a BMC would power-cycle it); the
    boot ids given, in order."""
    booted: list[str] = []

    async def watch() -> None:
        done = 0
        while True:
            names = asked.read_text().split() if asked.exists() else []
            for name in names[done:]:
                booted.append(await asyncio.to_thread(cluster.reboot, name))
            done = len(names)
            await asyncio.sleep(0.2)

    task = asyncio.create_task(watch())
    try:
        yield booted
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def climbed(svc: ClusterService, node: str) -> None:
    """Until the node's repair has ended."""

    async def on() -> bool:
        return node in svc.repairs.climbs

    await poll(on, lambda climbing: not climbing, f"the repair of {node} to end")


async def test_an_isolated_node_is_rebooted_tested_and_resumed_or_stays_out_while_it_fails(
    sshd_cluster: Any, tmp_path: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2, shared_home=True)  # one home for both nodes, as on most clusters
    asked = tmp_path / "reboots"
    path, loaded = config(
        cluster, tmp_path, node_tests=GPU_TEST,
        repair={"auto": True, "max_per_day": 1, "reboot": [sys.executable, "-c", ASK, str(asked), "{node}"],
                "boot_timeout": "60s"},
    )  # fmt: skip
    faulty(cluster, "node01", True)  # GPU 1 passes at rest and fails under load
    async with ClusterService.open(loaded) as svc, rebooter(cluster, asked) as booted:
        await svc.probe()
        (before,) = await svc.nodes("node01")
        old_boot = before.probe.report["facts"]["boot_id"] if before.probe and before.probe.report else None
        await svc.isolate(["node01"], reason="job 4: GPU 1: Xid 79 (fallen off the bus)", by="scheduler")
        assert await repair.start_auto(svc) == ["node01"]
        (view,) = [v.to_json() for v in await svc.nodes("node01")]
        assert view["repair"]["by"] == "scheduler (repair)" and view["repair"]["why"] == "isolated by scheduler"
        await climbed(svc, "node01")

        # the reset (no nvidia-smi on these nodes) failed, the reboot came, the tests failed: still isolated
        assert asked.read_text().split() == ["node01"] and len(booted) == 1
        (view,) = [v.to_json() for v in await svc.nodes("node01")]
        assert view["state"] == "isolated" and view["repair"] is None
        assert view["facts"]["boot_id"] == booted[0] != old_boot  # the probe read the new boot
        steps = [(e.data.get("step"), e.data.get("result")) for e in await svc.events(node="node01")
                 if e.kind == "repair"]  # fmt: skip
        assert steps == [("start", None), ("gpu-reset", "fail"), ("tests", "fail")], steps
        failed = [e.message for e in await svc.events(node="node01") if e.kind == "repair"][-1]
        assert failed.startswith("repair failed at tests: node tests: ") and FAULT in failed, failed
        assert svc.repairs.counts == {("gpu-reset", "fail"): 1, ("reboot", "done"): 1, ("tests", "fail"): 1}
        assert await repair.start_auto(svc) == []  # max_per_day: not again by itself today
        with pytest.raises(UsageError, match="node02: in service: drain or isolate it first"):
            await repair.repair(svc, "node[01-02]", by="ann")

        faulty(cluster, "node01", False)  # the GPU is replaced; an operator repairs the node
        (climb,) = await repair.repair(svc, "node01", by="ann")
        assert climb.by == "ann"
        await climbed(svc, "node01")
        (view,) = [v.to_json() for v in await svc.nodes("node01")]
        assert view["state"] == "healthy" and len(booted) == 2 and view["facts"]["boot_id"] == booted[1]
        resumed = [e for e in await svc.events(node="node01") if e.kind == "resumed"]
        assert len(resumed) == 1 and "resumed by ann after a repair (rebooted, tested)" in resumed[0].message
        assert svc.repairs.counts[("resume", "done")] == 1 and svc.returns.count["operator"] == 1
        assert [a.kind for a in await svc.store.alerts()] == []  # node_isolated resolved by the resume

    cli = Cli(path)  # no scheduler runs: a repair, which takes minutes, needs one
    cli("drain", "node02", "--reason", "fan")
    refused = cli("repair", "node02", check=3)
    assert "repair needs the scheduler running (ftconsole serve)" in refused.stderr, refused.stderr


async def test_repair_wait_follows_a_drained_node_through_the_running_scheduler(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`ftconsole repair NODE --wait` as an operator types it, against `serve`: a drained node waits until its job
    is gone (no reboot meanwhile, the step shown in `nodes`), then, with no node tests configured, is rebooted,
    must probe healthy, and is resumed by the operator."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    asked = tmp_path / "reboots"
    loaded = write_config(cluster, tmp_path, sock_dir, repair={"reboot": [sys.executable, "-c", ASK, str(asked),
                                                               "{node}"], "boot_timeout": "60s"})  # fmt: skip
    cli = Cli(loaded.file)
    async with running(loaded) as (scheduler, client), rebooter(cluster, asked) as booted:
        held = (await client.call("submit", spec={"name": "held", "command": "sleep 600", "gpus_per_node": 1}))["id"]
        await poll(lambda: client.call("show", job=held), lambda j: j["status"] == "running", "the job to run")

        async def repair_events() -> list[str]:
            return [e["message"] for e in await client.call("events", node="node01") if e["kind"] == "repair"]

        await client.call("drain", nodeset="node01", reason="fan")  # repaired, then put back by hand meanwhile
        await client.call("repair", nodeset="node01")
        await client.call("resume", nodeset="node01")
        (ended,) = (await poll(repair_events, lambda said: len(said) == 2, "the repair to end"))[1:]
        assert ended == ("repair failed at waiting: the node was put back in service meanwhile: nothing more is "
                         "done to it; it is in service"), ended  # fmt: skip
        await client.call("drain", nodeset="node01", reason="new power supply")
        repairing = asyncio.create_task(asyncio.to_thread(cli, "repair", "node01", "--wait"))

        async def step() -> Any:
            return (await client.call("nodes", nodeset="node01"))[0]["repair"]

        assert (await poll(step, lambda climb: climb is not None, "the repair"))["step"] == "waiting"
        await asyncio.sleep(1.5)  # its job holds it: no reboot
        assert (await step())["step"] == "waiting" and not asked.exists() and not repairing.done()
        await client.call("stop", jobs=[held])
        done = await repairing
        assert done.stdout.splitlines() == ["node01: repair started (waiting)", "node01: healthy"], done.stdout
        assert len(booted) == 1
        (view,) = await client.call("nodes", nodeset="node01")
        assert view["state"] == "healthy" and view["facts"]["boot_id"] == booted[0] and view["repair"] is None
        events = await client.call("events", node="node01")
        said = [e["message"] for e in events if e["kind"] in ("repair", "resumed")]
        assert any(m.startswith("repair started by root (drained by root)") for m in said), said
        assert any("after a repair (rebooted, probed healthy)" in m for m in said), said
        assert scheduler.service.repairs.counts[("tests", "pass")] == 1
        with pytest.raises(PermissionDenied, match="mallory may not repair nodes"):  # admins only
            await scheduler.repair(Caller(uid=4242, gid=4242, pid=1, user="mallory"), "node01")
        again = await asyncio.to_thread(cli, "repair", "node01", check=2)  # in service now
        assert "node01: in service: drain or isolate it first" in again.stderr, again.stderr


async def test_a_repair_stopped_in_the_middle_of_a_reboot_is_picked_up_by_the_next_scheduler(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`serve` stops while the node it isolated reboots (the reboot asked, its new boot not seen yet); the node
    reboots while no scheduler runs; the next `serve` on the same state picks the repair up where it was (not asking
    for another reboot), sees the new boot, probes it healthy and resumes it with no operator. The daily cap is
    counted across the restart: the node isolated again is not repaired a second time today."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    asked = tmp_path / "reboots"
    loaded = write_config(cluster, tmp_path, sock_dir, repair={
        "auto": True, "max_per_day": 1, "reboot": [sys.executable, "-c", ASK, str(asked), "{node}"],
        "boot_timeout": "60s"})  # fmt: skip
    async with running(loaded) as (scheduler, client):

        async def boot() -> Any:
            return ((await client.call("nodes", nodeset="node01"))[0].get("facts") or {}).get("boot_id")

        old_boot = await poll(boot, bool, "a probe")
        await scheduler.service.isolate(["node01"], reason="job 4: GPU 1: Xid 79 (fallen off the bus)", by="scheduler")
        await repair.start_auto(scheduler.service)  # (or the loop's probe pass did, just before)

        async def step() -> Any:
            return (await client.call("nodes", nodeset="node01"))[0]["repair"]

        await poll(step, lambda climb: climb is not None and climb["step"] == "boot", "the repair to wait for a boot")
        assert asked.read_text().split() == ["node01"]
    # no scheduler runs: the node reboots now (its BMC was asked)
    async with rebooter(cluster, asked) as booted, running(loaded) as (scheduler, client):

        async def view() -> Any:
            return (await client.call("nodes", nodeset="node01"))[0]

        done = await poll(view, lambda v: v["state"] == "healthy" and v["repair"] is None, "the repair to end")
        assert len(booted) == 1 and done["facts"]["boot_id"] == booted[0] != old_boot
        assert asked.read_text().split() == ["node01"]  # the reboot was not asked again
        events = await client.call("events", node="node01")
        steps = [(e["data"].get("step"), e["data"].get("result") or e["data"].get("at")) for e in events
                 if e["kind"] == "repair"]  # fmt: skip
        assert steps == [("start", None), ("gpu-reset", "fail"), ("picked-up", "boot")], steps
        resumed = [e["message"] for e in events if e["kind"] == "resumed"]
        assert len(resumed) == 1 and "after a repair (rebooted, probed healthy, picked up after a restart)" in \
            resumed[0], resumed  # fmt: skip
        store = scheduler.service.store
        assert await store.kept_under(CLIMB_KEY) == {}  # the climb ended: its record is gone
        assert (await store.all_node_health())["node01"].admin is None

        await scheduler.service.isolate(["node01"], reason="job 5: GPU 0: Xid 79", by="scheduler")
        assert await repair.start_auto(scheduler.service) == []  # max_per_day 1: counted before the restart
        assert (await view())["repair"] is None
