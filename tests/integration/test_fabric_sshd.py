"""The bandwidth check of a job that asks for it (`preflight: {bandwidth: true}`), on real sshd nodes each in a
network namespace of its own behind a bridge, one of them with its link shaped by `tc` to 50 Mbit/s: the slow node
is found and the job runs on the fast ones. In a two-node job only one partner saw it slow (which a user's own
traffic could fake): it is left out of that job and stays in service. In a three-node job two partners each saw it
slow: it is isolated and swapped for a spare, and its own fabric test keeps it out until its link is mended. What
is checked: the attempts and their nodes, the node's state, the events' items, the node tests' results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import netns
from tests.integration.test_recovery_sshd import attempts_of, restarting, until_nodes
from tests.integration.test_scheduler_sshd import finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not netns.available(), reason=netns.MISSING)]


async def test_a_node_with_a_slow_link_is_swapped_out_of_a_job_and_kept_out_until_its_link_is_mended(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(4, gpus=2, netns=True)
    assert cluster.fabric is not None
    cluster.fabric.shape("node01", mbit=50)
    # the lab's streams run at several Gbit/s on a busy machine; 50 Mbit/s is far under 0.5 Gbit/s either way
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"},
                          node_tests={"fabric": {"seconds": "0.5s", "min_gbps": 0.5}})  # fmt: skip
    async with running(loaded) as (scheduler, client):
        await until_nodes(client, lambda ns: all(n["state"] == "healthy" for n in ns), "the first probe sweep")
        spec = job("wide", "sh -c 'echo rank $RANK ok'", mode="pytorch", nodes=2, preflight={"bandwidth": True},
                   fault_tolerance={"retries": 1})  # fmt: skip

        # node01 shared with another job: slow for this one, which goes elsewhere; no evidence of a fault
        other = await client.call("submit", spec=job("other", "sleep 600", node_names="node01"))
        await until(client, other["id"], lambda j: j["status"] == "running", "the other job running")
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [(1, "requeued", ["node01", "node02"]), (2, "succeeded", ["node02", "node03"])]
        assert shown["excluded"] == ["node01"]
        (why,) = restarting(shown)
        assert "not on node01 again (another job uses it: its traffic may be why)" in why and "isolated" not in why
        assert (await client.call("nodes", nodeset="node01"))[0]["state"] == "healthy"
        await client.call("stop", jobs=[other["id"]])
        await finished(client, other["id"])

        # node01 its own, in a two-node job: only node02 saw it slow, no evidence enough to take it out of service
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [(1, "requeued", ["node01", "node02"]), (2, "succeeded", ["node02", "node03"])]
        assert [r["state"] for r in shown["attempts"][0]["runs"]] == ["cancelled", "cancelled"]  # never started
        assert shown["excluded"] == ["node01"]
        one = "only node02 saw it slow: one partner is not enough to take a node in service out"
        (why,) = restarting(shown)
        assert why.startswith("attempt 1 failed: pre-flight failed: node01 item fabric: fail")
        assert f"not on node01 again ({one})" in why and "isolated" not in why
        notes = [(e["node"], e["message"]) for e in await client.call("events", job=shown["id"])
                 if e["kind"] == "Preflight" and not e["message"].startswith("item ")]  # fmt: skip
        assert notes == [("node01", f"node01 stays in service, left out of this job only: {one}")]
        assert (await client.call("nodes", nodeset="node01"))[0]["state"] == "healthy"

        # node01 in a three-node job: node02 and node03 each saw it slow; isolated and swapped for node04
        wide = {**spec, "nodes": 3}
        shown = await finished(client, (await client.call("submit", spec=wide))["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [
            (1, "requeued", ["node01", "node02", "node03"]),
            (2, "succeeded", ["node02", "node03", "node04"]),
        ]
        assert shown["excluded"] == []
        items = {(e["node"], e["message"].split(" (")[0]) for e in await client.call("events", job=shown["id"])
                 if e["kind"] == "Preflight" and e["message"].startswith("item fabric")}  # fmt: skip
        slow = [text for node, text in items if node == "node01"]
        assert len(slow) == 1 and slow[0].startswith("item fabric: fail 0.0") and slow[0].endswith(" 0.5 Gbit/s")
        assert {node for node, text in items if text.startswith("item fabric: pass")} == {"node02", "node03", "node04"}
        (why,) = restarting(shown)
        assert why.startswith("attempt 1 failed: pre-flight failed: node01 item fabric: fail")
        assert "isolated node01" in why and "not on" not in why
        (node01,) = await client.call("nodes", nodeset="node01")
        assert node01["state"] == "isolated" and "slow on its way out: sends node02 0.0" in node01["admin_reason"]
        counts = scheduler.service.tester.counts  # ftconsole_node_tests_total: slow links caught before a job met them
        assert counts[("fabric", "fail", "preflight")] == 3 and counts[("fabric", "pass", "preflight")] == 11

        # node_tests.fabric is a node test too: node01 streams with the two idle nodes, only its result counts
        (view,) = await client.call("resume", nodeset="node01", test=True)
        assert view["state"] == "isolated", view
        (test,) = view["tests"]
        assert test["result"] == "fail" and "slow on its way out: sends node02 0.0" in test["summary"], test
        assert test["summary"].endswith("(with node02, node03)")
        cluster.fabric.unshape("node01")  # the cable mended
        (view,) = await client.call("resume", nodeset="node01", test=True)
        assert view["state"] == "healthy" and [(t["test"], t["result"]) for t in view["tests"]] == [("fabric", "pass")]
