"""The bandwidth check of a job that asks for it (`preflight: {bandwidth: true}`), on real sshd nodes each in a
network namespace of its own behind a bridge, one of them with its link shaped by `tc` to 50 Mbit/s: the slow node
is found, isolated and swapped for a spare, and the job runs on the fast ones. What is checked: the attempts and
their nodes, the node's state, the events' items.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests import netns
from tests.cli_runner import Cli
from tests.integration.test_recovery_sshd import attempts_of, restarting, until_nodes
from tests.integration.test_scheduler_sshd import finished, job, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not netns.available(), reason=netns.MISSING)]


async def test_a_node_with_a_slow_link_is_swapped_out_of_a_job_that_asks_for_the_bandwidth_check(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=1, netns=True)
    assert cluster.fabric is not None
    cluster.fabric.shape("node01", mbit=50)
    # the lab's streams run at several Gbit/s on a busy machine; 50 Mbit/s is far under 0.5 Gbit/s either way
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"},
                          node_tests={"fabric": {"seconds": "1s", "min_gbps": 0.5}})  # fmt: skip
    async with running(loaded) as (_, client):
        await until_nodes(client, lambda ns: all(n["state"] == "healthy" for n in ns), "the first probe sweep")
        spec = job("wide", "sh -c 'echo rank $RANK ok'", mode="pytorch", nodes=2, preflight={"bandwidth": True},
                   fault_tolerance={"retries": 1})  # fmt: skip
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [(1, "requeued", ["node01", "node02"]), (2, "succeeded", ["node02", "node03"])]
        assert [r["state"] for r in shown["attempts"][0]["runs"]] == ["cancelled", "cancelled"]  # never started
        items = {(e["node"], e["message"].split(" (")[0]) for e in await client.call("events", job=shown["id"])
                 if e["kind"] == "Preflight" and e["message"].startswith("item fabric")}  # fmt: skip
        slow = [text for node, text in items if node == "node01"]
        assert len(slow) == 1 and slow[0].startswith("item fabric: fail 0.0") and slow[0].endswith(" 0.5 Gbit/s")
        assert {node for node, text in items if text.startswith("item fabric: pass")} == {"node02", "node03"}
        (why,) = restarting(shown)
        assert why.startswith("attempt 1 failed: pre-flight failed: node01 item fabric: fail")
        assert "isolated node01" in why
        (node01,) = await client.call("nodes", nodeset="node01")
        assert node01["state"] == "isolated" and "slow on its way out" in node01["admin_reason"]


def test_a_drained_node_with_a_slow_link_fails_its_fabric_test_and_passes_once_mended(
    sshd_cluster: Any, tmp_path: Path
) -> None:
    """`node_tests.fabric` is a node test too: `resume --test` streams between the node and two idle partners
    of its pool, and only the node's own result counts."""
    cluster: SshdCluster = sshd_cluster(3, gpus=1, netns=True)
    assert cluster.fabric is not None
    path = cluster.write_config(tmp_path / "cluster.yaml", ssh={"python": sys.executable},
                                node_tests={"fabric": {"seconds": "1s", "min_gbps": 0.5}})  # fmt: skip
    cli = Cli(path)
    cli("probe")
    cli("drain", "node01", "--reason", "new cable")
    cluster.fabric.shape("node01", mbit=50)
    shown = cli("resume", "node01", "--test", check=1)
    assert "fabric: fail: slow on its way out: sends node02 0.0" in shown.stdout, shown.stdout
    assert "(with node02, node03)" in shown.stdout
    assert {n["name"]: n["state"] for n in cli.json("nodes")} == {"node01": "drained", "node02": "healthy",
                                                                  "node03": "healthy"}  # fmt: skip

    cluster.fabric.unshape("node01")
    (view,) = cli.json("resume", "node01", "--test")
    assert view["state"] == "healthy", view
    (test,) = view["tests"]
    assert test["test"] == "fabric" and test["result"] == "pass" and test["tool"] == "tcp", test
