"""Node tests (issue 42) on real sshd nodes: a GPU that passes at rest and fails under load (a simulated GPU
with `diag_fault`: DCGM's diagnostics would fail it) is never returned to service, by the scheduler or by an
operator's `resume --test`; once it passes, it is. What is checked is what is real afterwards: the node's
state and reason, its `tested` events, where the queued job ran and when."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import nodegate
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import job, poll, running, until
from tests.integration.test_scheduler_sshd import write_config as scheduler_config
from tests.sshd_cluster import SshdCluster, gpu_data

pytestmark = pytest.mark.sshd

FAULT = "Memory: 4 double-bit errors under load"
GPU_TEST = {"gpu": {"level": 1, "timeout": "30s"}}


def faulty(cluster: SshdCluster, node: str, fault: bool) -> None:
    """GPU 1 of `node` fails under load (passing at rest), or no longer does."""
    data = gpu_data(2)
    if fault:
        data["gpus"][1]["diag_fault"] = FAULT
    cluster.set_gpus(node, data)


def config(cluster: SshdCluster, tmp_path: Path, **settings: Any) -> tuple[Path, LoadedConfig]:
    path = cluster.write_config(tmp_path / "cluster.yaml", ssh={"python": sys.executable}, **settings)
    return path, load_config(path)


async def node_tests_of(svc: ClusterService, node: str, count: int) -> list[Any]:
    """The node's `tested` events, once there are `count` of them."""

    async def read() -> list[Any]:
        return [e for e in await svc.events(node=node) if e.kind == "tested"]

    return await poll(read, lambda events: len(events) >= count, f"{count} node tests of {node}")


async def test_an_isolated_node_that_fails_under_load_stays_isolated_until_it_passes(
    sshd_cluster: Any, tmp_path: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    _, loaded = config(cluster, tmp_path, probes={"isolation_recover_after": 2}, node_tests=GPU_TEST)
    faulty(cluster, "node01", True)
    async with ClusterService.open(loaded) as svc:
        await svc.probe()
        await svc.isolate(["node01"], reason="job 4: rank 1 lost", by="scheduler")
        for _ in range(2):  # it passes its probes at rest: due for the tests, not resumed by the probes
            (outcome,) = await svc.probe("node01")
            assert outcome.health.state.value == "isolated"
        assert await nodegate.start_due(svc) == ["node01"]
        (failed,) = await node_tests_of(svc, "node01", 1)
        assert failed.data["result"] == "fail" and failed.data["failures"] == [f"GPU 1: {FAULT}"], failed.data
        assert failed.message.endswith("(tested by scheduler)")
        (view,) = [v.to_json() for v in await svc.nodes("node01")]
        assert (view["state"], view["isolated_passes"]) == ("isolated", 0)
        assert (
            view["admin_reason"].startswith("node tests failed: gpu (level 1): fail: ")
            and FAULT in view["admin_reason"]
        )
        assert view["tests"][0]["result"] == "fail"

        (outcome,) = await svc.probe("node01")  # one pass of two: not due yet
        assert await nodegate.start_due(svc) == []
        faulty(cluster, "node01", False)  # repaired
        (outcome,) = await svc.probe("node01")
        assert outcome.health.state.value == "isolated"
        assert await nodegate.start_due(svc) == ["node01"]
        passed = (await node_tests_of(svc, "node01", 2))[-1]
        assert passed.data["result"] == "pass", passed.data

        async def state() -> str:
            return str((await svc.nodes("node01"))[0].to_json()["state"])

        assert await poll(state, lambda s: s == "healthy", "node01 resumed") == "healthy"
        resumed = [e for e in await svc.events(node="node01") if e.kind == "resumed"]
        assert len(resumed) == 1 and "and the node tests (gpu (level 1): pass: " in resumed[0].message
        assert not [e for e in await svc.events(node="node02") if e.kind == "tested"]  # never isolated: never tested
        assert svc.returns.count["scheduler"] == 1 and svc.returns.out_s["scheduler"] > 0  # how long it was out
        assert [a.kind for a in await svc.store.alerts()] == []  # node_isolated resolved by the resume


async def test_resume_test_resumes_only_the_nodes_that_pass(sshd_cluster: Any, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    path, _ = config(cluster, tmp_path, node_tests=GPU_TEST)
    faulty(cluster, "node01", True)
    cli = Cli(path)
    cli("probe")
    cli("drain", "node[01-02]", "--reason", "new GPUs fitted")
    shown = cli("resume", "node[01-02]", "--test", check=1)
    assert "node01: drained (new GPUs fitted)" in shown.stdout, shown.stdout
    assert "gpu (level 1): fail: " in shown.stdout and f"GPU 1: {FAULT}" in shown.stdout
    assert "node01 did not pass the node tests: not resumed" in shown.stderr
    states = {n["name"]: n["state"] for n in cli.json("nodes")}
    assert states == {"node01": "drained", "node02": "healthy"}, states
    in_service = cli("resume", "node02", "--test", check=2)  # a test's load would meet the jobs placed there
    assert "node02: in service: drain it first" in in_service.stderr, in_service.stderr
    (node01,) = cli.json("nodes", "node01")
    assert [t["result"] for t in node01["tests"]] == ["fail"]
    assert "tested: gpu (level 1): fail: " in cli("nodes", "node01").stdout

    faulty(cluster, "node01", False)
    (view,) = cli.json("resume", "node01", "--test")
    assert view["state"] == "healthy" and [t["result"] for t in view["tests"]] == ["pass"]
    events = cli.json("events", "--node", "node01")
    assert any(e["kind"] == "resumed" and "after the node tests passed" in e["message"] for e in events), events

    (tmp_path / "plain").mkdir()
    plain, _ = config(cluster, tmp_path / "plain")
    refused = Cli(plain)("resume", "node01", "--test", check=2)
    assert "no node tests are configured" in refused.stderr


async def test_the_scheduler_keeps_a_node_that_fails_under_load_out_of_service(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """With `serve`: the job queued for the only node starts only once the node passed its tests, never on the
    node while its GPU failed them."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = scheduler_config(
        cluster, tmp_path, sock_dir, probes={"interval": "1s", "isolation_recover_after": 1}, node_tests=GPU_TEST
    )
    faulty(cluster, "node01", True)
    async with running(loaded) as (scheduler, client):
        svc = scheduler.service
        await svc.isolate(["node01"], reason="job 7: Xid 48", by="scheduler")
        submitted = await client.call("submit", spec=job("waits", "true", gpus_per_node=2))
        failed = (await node_tests_of(svc, "node01", 1))[0]
        assert failed.data["result"] == "fail"
        assert (await client.call("show", job=submitted["id"]))["status"] == "queued"
        faulty(cluster, "node01", False)
        shown = await until(client, submitted["id"], lambda j: j["status"] == "succeeded", "the job to run")
        resumed = [e for e in await svc.events(node="node01") if e.kind == "resumed"]
        assert len(resumed) == 1
        assert shown["attempts"][0]["runs"][0]["started"] >= resumed[0].time  # never on the node before
        results = [e.data["result"] for e in await svc.events(node="node01") if e.kind == "tested"]
        assert results[0] == "fail" and results[-1] == "pass" and "fail" not in results[results.index("pass") :]


async def test_burn_in_tests_idle_nodes_isolates_the_one_that_fails_and_holds_a_node_while_it_runs(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`probes.burn_in_interval`: idle nodes in service are tested while nothing is queued. node02's GPU fails under
    load: it is isolated. node01 passes; a job submitted while node01 is under test starts once the test ended,
    never beside it."""
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = scheduler_config(
        cluster, tmp_path, sock_dir, probes={"interval": "1s", "burn_in_interval": "2s"}, node_tests=GPU_TEST
    )
    faulty(cluster, "node02", True)
    cluster.set_gpus("node01", {**gpu_data(2), "diag_seconds": 3})  # its test takes 3 s
    async with running(loaded) as (scheduler, client):
        svc = scheduler.service

        async def node02() -> dict[str, Any]:
            return dict((await client.call("nodes", nodeset="node02"))[0])

        isolated = await poll(node02, lambda n: n["state"] == "isolated", "node02 isolated by its burn-in")
        assert isolated["admin_by"] == "scheduler", isolated
        reason = isolated["admin_reason"]
        assert reason.startswith("burn-in: node tests failed: gpu (level 1): fail: ") and FAULT in reason, reason

        async def node01() -> dict[str, Any]:
            return dict((await client.call("nodes", nodeset="node01"))[0])

        await poll(node01, lambda n: n["testing"], "node01 under its burn-in test, as `nodes` says")
        before = len(await node_tests_of(svc, "node01", 0))
        submitted = await client.call("submit", spec=job("after", "true", gpus_per_node=2))
        shown = await until(client, submitted["id"], lambda j: j["status"] == "succeeded", "the job to run")
        started = shown["attempts"][0]["runs"][0]["started"]
        assert shown["attempts"][0]["runs"][0]["node"] == "node01"
        tests = await node_tests_of(svc, "node01", before + 1)  # the one under way at the submit has ended
        assert all(e.data["result"] == "pass" for e in tests), [e.data for e in tests]
        for e in tests:  # no test was under way when the job started on the node
            assert not (e.time - e.data["took_s"] < started < e.time), (started, e.time, e.data["took_s"])
        assert any(e.time <= started for e in tests)  # it waited for the one under way at its submit
        counted = svc.tester.counts  # ftconsole_node_tests_total
        assert counted[("gpu", "fail", "burn-in")] >= 1 and counted[("gpu", "pass", "burn-in")] >= len(tests)
