"""Isolation (issue 12) on real sshd nodes: an isolated node that passes its checks N times in a row is resumed by
the scheduler (a drained one is not); a node whose GPU keeps failing its ECC check becomes flaky (node_flaky
alert, `flaky` in the node JSON and in `ftconsole nodes`), is then held for an operator however often it passes,
and `ftconsole resume` still lifts it, with a warning."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from tests.cli_runner import Cli
from tests.sshd_cluster import SshdCluster, gpu_data

pytestmark = pytest.mark.sshd

MAX_PROBES = 8  # every loop below probes at most this often: each wait is bounded


def config(cluster: SshdCluster, tmp_path: Path, **probes: Any) -> tuple[Path, LoadedConfig]:
    path = cluster.write_config(tmp_path / "cluster.yaml", ssh={"python": sys.executable}, probes=probes)
    return path, load_config(path)


def ecc(cluster: SshdCluster, node: str, errors: int) -> None:
    """GPU 1 of `node` reports `errors` uncorrectable ECC errors (0: healthy again)."""
    gpus = gpu_data(2)["gpus"]
    gpus[1]["ecc_uncorrectable"] = errors
    cluster.set_gpus(node, {**gpu_data(2), "gpus": gpus})


async def test_an_isolated_node_is_resumed_after_passing_the_checks_n_times(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    _, loaded = config(cluster, tmp_path, isolation_recover_after=3)
    async with ClusterService.open(loaded) as svc:
        assert {o.node.name: o.health.state.value for o in await svc.probe()} == {
            "node01": "healthy",
            "node02": "healthy",
        }
        await svc.isolate(["node01"], reason="job 4 attempt 1: rank 0 lost with its node", by="scheduler")
        await svc.drain("node02", reason="fan alarm", by="root")

        states = []
        for _ in range(MAX_PROBES):
            outcomes = {o.node.name: o for o in await svc.probe()}
            states.append(outcomes["node01"].health.state.value)
            assert outcomes["node02"].health.state.value == "drained"  # an operator's decision: never lifted
            if states[-1] != "isolated":
                break
        assert states == ["isolated", "isolated", "healthy"], states

        (node01, node02) = [v.to_json() for v in await svc.nodes()]
        assert (node01["state"], node01["admin"], node01["isolated_passes"]) == ("healthy", None, 0)
        assert (node01["faults"], node01["faults_in_window"], node01["flaky"]) == (1, 1, False)  # the isolation
        assert (node02["state"], node02["admin_by"]) == ("drained", "root")

        events = await svc.events(node="node01")
        kinds = [(e.kind, e.message) for e in events if not e.kind.startswith("alert-")]
        resumed = (
            "resumed by scheduler: passed the checks 3 times in a row since it was isolated "
            "(isolated by scheduler: job 4 attempt 1: rank 0 lost with its node)"
        )
        assert kinds[-2][0] == "isolated" and kinds[-1] == ("resumed", resumed)
        # the node_isolated alert was raised with the isolation and resolved by the resume; no flaky node
        assert [a.kind for a in await svc.store.alerts()] == []
        (alert,) = await svc.store.alerts(states=("resolved",))
        assert (alert.kind, alert.node, alert.resolved_by) == ("node_isolated", "node01", "ftconsole")
        assert alert.message == "node01 isolated by scheduler: job 4 attempt 1: rank 0 lost with its node"


async def test_an_isolation_while_a_probe_folds_its_results_is_kept(sshd_cluster, tmp_path: Path) -> None:
    """A probe reads the nodes' health, then writes what it found; an isolation that lands in between is not
    overwritten (it was: the crash test's lost node then read `unreachable`, not `isolated`)."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    _, loaded = config(cluster, tmp_path)
    async with ClusterService.open(loaded) as svc:
        await svc.probe()
        between, go_on = asyncio.Event(), asyncio.Event()
        read_alerts = svc.store.open_node_alerts

        async def held_read() -> Any:  # the fold has read the health; it waits here before writing it
            between.set()
            await asyncio.wait_for(go_on.wait(), 10)
            return await read_alerts()

        svc.store.open_node_alerts = held_read  # type: ignore[method-assign]
        probing = asyncio.create_task(svc.probe())
        await asyncio.wait_for(between.wait(), 10)
        isolating = asyncio.create_task(svc.isolate(["node01"], reason="job 3: rank 0 lost", by="scheduler"))
        await asyncio.sleep(0.3)  # time for the isolation to be written, if it does not wait for the fold
        go_on.set()
        await asyncio.wait_for(asyncio.gather(probing, isolating), 10)
        svc.store.open_node_alerts = read_alerts  # type: ignore[method-assign]
        (view,) = [v.to_json() for v in await svc.nodes()]
        assert (view["state"], view["admin_by"]) == ("isolated", "scheduler"), view


async def test_repeated_ecc_faults_make_a_node_flaky(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    path, loaded = config(cluster, tmp_path, recover_after=1, isolation_recover_after=1, flaky_faults=3,
                          flaky_window="1h")  # fmt: skip
    async with ClusterService.open(loaded) as svc:
        await svc.probe()
        for fault in range(3):  # ECC errors come and go: each time the node reads unhealthy is a fault
            ecc(cluster, "node01", 2)
            (bad,) = await svc.probe("node01")
            assert bad.health.state.value == "unhealthy" and "gpu" in bad.health.reasons[0]
            if fault < 2:
                assert [a.kind for a in await svc.store.alerts()] == ["node_unhealthy"]
                ecc(cluster, "node01", 0)
                (good,) = await svc.probe("node01")
                assert good.health.state.value == "healthy"

        alerts = {a.kind: a for a in await svc.store.alerts()}
        flaky = alerts["node_flaky"]
        assert (flaky.severity, flaky.node, flaky.state) == ("warning", "node01", "open")
        assert flaky.message.startswith("node01 is flaky: 3 faults within 1h (the last: ")
        assert flaky.message.count("healthy -> unhealthy: gpu") == 3
        node01, node02 = [v.to_json() for v in await svc.nodes()]
        assert (node01["flaky"], node01["faults_in_window"], node01["faults"], node01["faults_window_s"]) == (
            True,
            3,
            3,
            3600.0,
        )
        assert (node02["flaky"], node02["faults_in_window"]) == (False, 0)

        # isolated now, it passes every check again and again: a flaky node waits for an operator
        await svc.isolate(["node01"], reason="job 9 attempt 2: ECC error", by="scheduler")
        ecc(cluster, "node01", 0)
        for _ in range(4):
            (outcome,) = await svc.probe("node01")
            assert outcome.health.state.value == "isolated" and outcome.health.needs_operator
        assert [a.kind for a in await svc.store.alerts()].count("node_flaky") == 1  # still the one open
        assert "resumed" not in [e.kind for e in await svc.events(node="node01")]

    cli = Cli(path)
    listed = cli("nodes")
    assert "isolated (flaky)" in listed.stdout and "node02  healthy " in listed.stdout
    resumed = cli("resume", "node01")
    assert resumed.stdout.strip() == "node01: healthy"
    assert "warning: node01 is flaky (4 faults within 1h)" in resumed.stderr
    (view,) = cli.json("nodes", "node01")
    assert (view["state"], view["flaky"], view["faults_in_window"]) == ("healthy", True, 4)
    assert "warning" not in cli("resume", "node02").stderr
