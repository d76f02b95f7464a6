"""Placement that knows the fabric on real sshd nodes: a declared topology of 3 leaf switches puts each 2-node job
under one switch while one exists, and says so; a job that asks for one switch waits within its `wait`, saying why,
then takes what is free and says that too; `ftconsole topology` shows the tree with each node's state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

TOPOLOGY = {
    "switches": {
        "leaf1": {"nodes": "node[01-02]"},
        "leaf2": {"nodes": "node[03-04]"},
        "leaf3": {"nodes": "node[05-06]"},
        "spine": {"switches": ["leaf1", "leaf2", "leaf3"]},
    }
}


def tool_on(node: Any, name: str, prints: str, first: str = "") -> None:
    """A tool on the node's PATH (its bin_dir, first there) that prints what the real one printed."""
    node.bin_dir.mkdir(exist_ok=True)
    tool = node.bin_dir / name
    tool.write_text(f"#!/bin/sh\n{first}\ncat <<'END'\n{prints}\nEND\n")
    tool.chmod(0o755)


async def of_kind(client: Any, kind: str) -> list[dict[str, Any]]:
    return [e for e in await client.call("events", limit=1000) if e["kind"] == kind]


def placed(shown: dict[str, Any]) -> str:
    return next(e["message"] for e in shown["events"] if " placed on " in e["message"])


async def test_two_node_jobs_go_under_one_switch_and_one_that_asks_waits_within_its_wait(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(6, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, topology=TOPOLOGY)
    async with running(loaded) as (_, client):
        for name in ("node01", "node03"):  # one node taken under leaf1 and under leaf2
            taken = await client.call("submit", spec=job(f"on-{name}", "sleep 300", node_names=name))
            await until(client, taken["id"], lambda j: j["status"] == "running", f"the job on {name}")
        pair = await client.call("submit", spec=job("pair", "sleep 300", nodes=2, mode="pytorch"))
        pair = await until(client, pair["id"], lambda j: j["status"] == "running", "the pair")
        assert sorted(pair["node_names"]) == ["node05", "node06"]  # best fit alone: node02 and node04
        assert "under leaf3 (the fewest switches free)" in placed(await client.call("show", job=pair["id"]))
        # one switch asked for, none has two nodes free: it waits, saying so, until its wait is over
        strict = job("strict", "sleep 300", nodes=2, mode="pytorch", topology={"max_switches": 1, "wait": "15s"})
        strict = await client.call("submit", spec=strict)
        waiting = await poll(lambda: client.call("show", job=strict["id"]),
                             lambda j: "under at most 1 leaf switch" in j["message"] or j["status"] != "queued",
                             "the strict job's reason")  # fmt: skip
        assert waiting["status"] == "queued", waiting["message"]
        assert "topology.max_switches, waited for until" in waiting["message"]
        shown = await until(client, strict["id"], lambda j: j["status"] == "running", "the strict job, its wait over")
        assert sorted(shown["node_names"]) == ["node02", "node04"]
        shown = await client.call("show", job=strict["id"])
        assert shown["started"] - shown["submitted"] >= 15 - 0.5
        said = placed(shown)
        assert "under 2 leaf switches (leaf1, leaf2) below spine" in said
        assert "more than its max_switches 1: its topology.wait is over" in said
        code, out, err = await cli(loaded.file, "topology", "--json")
        assert code == 0, err
        tree = json.loads(out)
        assert [s["name"] for s in tree["switches"]] == ["spine", "leaf1", "leaf2", "leaf3"]
        leaf3 = next(s for s in tree["switches"] if s["name"] == "leaf3")
        assert [n["name"] for n in leaf3["nodes"]] == ["node05", "node06"] and leaf3["parent"] == "spine"
        assert all(n["free_gpus"] == 0 for n in leaf3["nodes"])
        code, out, err = await cli(loaded.file, "topology")
        assert code == 0 and "spine" in out and "  leaf3" in out and "node05" in out, err


LLDP = '{"lldp": {"interface": {"eth0": {"via": "LLDP", "chassis": {"%s": {"id": {"type": "mac", "value": "x"}}}}}}}'


async def test_discovery_reads_the_nodes_tools_and_says_where_they_differ_from_the_config(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Each node's lldpctl (a script on its PATH that prints what lldpd prints) names its switch: node05 and node06
    say sw-a, where node01 and node02 are, and the config puts them under leaf3 alone. node01 and node02 have an
    nvidia-smi that prints an NVLink fabric section (the recorded one)."""
    cluster: SshdCluster = sshd_cluster(6, gpus=1)
    switch = {
        "node01": "sw-a",
        "node02": "sw-a",
        "node03": "sw-b",
        "node04": "sw-b",
        "node05": "sw-a",
        "node06": "sw-a",
    }
    nvsmi = (Path(__file__).parent.parent / "unit" / "golden" / "topology" / "nvidia-smi-q-nvl72.txt").read_text()
    for node in cluster.nodes:
        tool_on(node, "lldpctl", LLDP % switch[node.name])
        if node.name in ("node01", "node02"):
            tool_on(node, "nvidia-smi", nvsmi)
    loaded = write_config(cluster, tmp_path, sock_dir, topology=TOPOLOGY)
    async with running(loaded) as (_, client):
        code, out, err = await cli(loaded.file, "topology", "--discover", "--json")
        assert code == 1, err  # mismatches
        found = json.loads(out)
        assert found["found"]["leaves"] == {"sw-a": ["node01", "node02", "node05", "node06"],
                                            "sw-b": ["node03", "node04"]}  # fmt: skip
        assert found["found"]["nvlink_domains"] == {"8c4a3f02-6b1e-4e0a-9d55-0f2b7e13a0c4/32766": ["node01", "node02"]}
        assert found["tools"]["node01"] == ["lldpctl", "nvidia-smi"] and found["tools"]["node03"] == ["lldpctl"]
        assert found["errors"] == {}
        said = found["mismatches"]
        assert any(m.startswith("node05 is declared under leaf3 but found under switch sw-a (lldp)") for m in said)
        assert not any(m.startswith("node03") for m in said)  # leaf2 is what sw-b is: another name, same nodes
        events = await client.call("events", node="node05")
        assert any(e["kind"] == "TopologyMismatch" for e in events)
        code, out, err = await cli(loaded.file, "topology", "--discover")
        assert code == 1 and "switch sw-b: node03, node04" in out and "mismatch: node05 is declared" in out, err


async def test_a_fabric_found_by_discovery_places_jobs_where_the_config_declares_no_switches(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`topology: {discover: 1h}` and no switches: the scheduler asks the nodes' lldpctl at its start; each pair of
    nodes says its own switch, and a 2-node job goes under the one switch with two nodes free, as with a declared
    topology; nothing found is a mismatch, and `ftconsole topology` shows the switches found."""
    cluster: SshdCluster = sshd_cluster(6, gpus=1)
    switch = {"node01": "sw-a", "node02": "sw-a", "node03": "sw-b", "node04": "sw-b", "node05": "sw-c",
              "node06": "sw-c"}  # fmt: skip
    for node in cluster.nodes:
        tool_on(node, "lldpctl", LLDP % switch[node.name])
    loaded = write_config(cluster, tmp_path, sock_dir, topology={"discover": "1h"})
    async with running(loaded) as (_, client):
        found = await poll(lambda: of_kind(client, "TopologyFound"), bool, "the fabric found")
        assert (
            "3 leaf switches (sw-a: node01, node02; sw-b: node03, node04; sw-c: node05, node06)" in found[0]["message"]
        )
        for name in ("node01", "node03"):  # one node taken under sw-a and under sw-b
            taken = await client.call("submit", spec=job(f"on-{name}", "sleep 300", node_names=name))
            await until(client, taken["id"], lambda j: j["status"] == "running", f"the job on {name}")
        pair = await client.call("submit", spec=job("pair", "sleep 300", nodes=2, mode="pytorch"))
        pair = await until(client, pair["id"], lambda j: j["status"] == "running", "the pair")
        assert sorted(pair["node_names"]) == ["node05", "node06"]  # blind to the fabric: node02 and node04
        assert "under sw-c (the fewest switches free)" in placed(await client.call("show", job=pair["id"]))
        assert not await of_kind(client, "TopologyMismatch")
        code, out, err = await cli(loaded.file, "topology", "--json")
        assert code == 0, err
        tree = json.loads(out)
        assert tree["source"] == {"switches": "found", "blocks": "none"} and tree["found_at"] is not None
        assert [(s["name"], [n["name"] for n in s["nodes"]]) for s in tree["switches"]] == [
            ("sw-a", ["node01", "node02"]), ("sw-b", ["node03", "node04"]), ("sw-c", ["node05", "node06"])]  # fmt: skip
        code, out, err = await cli(loaded.file, "topology")
        assert code == 0 and "switches as the nodes told at" in out and "sw-c" in out, err


async def test_a_job_in_segments_has_each_group_of_ranks_inside_one_block(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Blocks that interleave the nodes' names (node01 and node03 in one, node02 and node04 in the other): a 4-node
    job in segments of 2 has ranks 0 and 1 in one block and ranks 2 and 3 in the other, where placement's usual order
    (by name) would have put ranks 0 and 1 across both; the real ranks start there."""
    cluster: SshdCluster = sshd_cluster(4, gpus=1)
    blocks = {"blocks": {"nvl-a": {"nodes": "node[01,03]"}, "nvl-b": {"nodes": "node[02,04]"}}}
    loaded = write_config(cluster, tmp_path, sock_dir, topology=blocks)
    async with running(loaded) as (_, client):
        spec = job("groups", "sleep 300", nodes=4, mode="pytorch", topology={"segment": 2})
        shown = await client.call("submit", spec=spec)
        shown = await until(client, shown["id"], lambda j: j["status"] == "running", "the job in segments")
        ranks = shown["node_names"]  # in rank order
        assert {frozenset(ranks[:2]), frozenset(ranks[2:])} == {frozenset({"node01", "node03"}),
                                                                  frozenset({"node02", "node04"})}  # fmt: skip
        said = placed(await client.call("show", job=shown["id"]))
        assert "in 2 blocks (nvl-a, nvl-b)" in said and "segments of 2 nodes, each inside one block" in said
        on = await client.call("node_jobs", node=ranks[3])  # the node screen's jobs on its GPUs
        assert [(r["job"], r["name"], r["rank"], r["gpus"]) for r in on["runs"]] == [(shown["id"], "groups", 3, [0])]
        odd = await client.call("submit", spec=job("odd", "sleep 1", nodes=4, mode="pytorch", topology={"segment": 4}))
        waiting = await poll(lambda: client.call("show", job=odd["id"]), lambda j: "topology.segment" in j["message"],
                             "the job no block can hold")  # fmt: skip
        assert "the blocks do not hold that many nodes" in waiting["message"] and waiting["status"] == "queued"


async def test_ibnetdiscover_runs_on_one_node_and_its_leaves_place_jobs(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """node02 and node03 have ibnetdiscover (the recorded output, with the lab's names): only node02 runs it (one
    sweep of the fabric, not one per node), and its two leaves are what placement goes by."""
    cluster: SshdCluster = sshd_cluster(4, gpus=1)
    golden = Path(__file__).parent.parent / "unit" / "golden" / "topology" / "ibnetdiscover.txt"
    recorded = golden.read_text().replace('"gpu0', '"node0')
    ran = tmp_path / "ran"
    ran.mkdir()
    for node in cluster.nodes[1:3]:
        tool_on(node, "ibnetdiscover", recorded, first=f"touch {ran}/{node.name}")
    loaded = write_config(cluster, tmp_path, sock_dir, topology={"discover": "1h"})
    async with running(loaded) as (_, client):
        (event,) = await poll(lambda: of_kind(client, "TopologyFound"), bool, "the fabric found")
        assert "2 leaf switches (leaf01: node01, node02; leaf02: node03, node04)" in event["message"]
        assert sorted(p.name for p in ran.iterdir()) == ["node02"]
        fabric = await client.call("fabric")
        assert fabric["parents"] == {"leaf01": "spine01", "leaf02": "spine01"}


async def test_block_sizes_keep_a_job_inside_one_group_of_blocks(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Four blocks of one node, grouped two by two (`block_sizes: [1, 2]`: (A, B) and (C, D)). With node02 and node03
    busy, node01 and node04 are free but in two groups: a 2-node job waits, saying why, until node03 frees its group
    whole; then it runs on node03 and node04 and says so. A job of 3 nodes is refused at submit."""
    cluster: SshdCluster = sshd_cluster(4, gpus=1)
    blocks = {f"nvl-{b}": {"nodes": f"node0{i}"} for i, b in enumerate("abcd", start=1)}
    loaded = write_config(cluster, tmp_path, sock_dir, topology={"blocks": blocks, "block_sizes": [1, 2]})
    async with running(loaded) as (_, client):
        busy = {}
        for name in ("node02", "node03"):
            busy[name] = await client.call("submit", spec=job(f"on-{name}", "sleep 300", node_names=name))
            await until(client, busy[name]["id"], lambda j: j["status"] == "running", f"the job on {name}")
        pair = await client.call("submit", spec=job("pair", "sleep 300", nodes=2, mode="pytorch"))
        waiting = await poll(
            lambda: client.call("show", job=pair["id"]), lambda j: "block_sizes" in (j["message"] or ""), "its note"
        )
        assert waiting["status"] == "queued" and "2 available" in waiting["message"], waiting["message"]
        assert "inside one group of blocks of at most 2 nodes (topology.block_sizes)" in waiting["message"]
        await client.call("stop", jobs=[busy["node03"]["id"]])
        shown = await until(client, pair["id"], lambda j: j["status"] == "running", "the pair to run")
        assert sorted(shown["node_names"]) == ["node03", "node04"]
        assert "inside one group of blocks of at most 2 nodes (topology.block_sizes)" in placed(shown)
        code, out, err = await cli(loaded.file, "topology")
        assert code == 0, err
        assert "groups of at most 2 nodes a job may span (topology.block_sizes): nvl-a + nvl-b; nvl-c + nvl-d" in out
        code, out, _ = await cli(loaded.file, "topology", "--json")
        assert json.loads(out)["block_groups"][1] == {"size": 2, "groups": [["nvl-a", "nvl-b"], ["nvl-c", "nvl-d"]]}
        spec = tmp_path / "three.yaml"
        spec.write_text("name: three\ncommand: 'true'\nnodes: 3\nmode: pytorch\n")
        code, _, err = await cli(loaded.file, "submit", str(spec))
        assert code == 2 and "nodes: 3: a job of this cluster spans at most 2 nodes" in err, err
        await client.call("stop", jobs=[pair["id"], busy["node02"]["id"]])
