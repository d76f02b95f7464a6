"""`ftconsole topology`: the switches of the cluster config's `topology:`, as a tree, each leaf with its nodes, their
state and their free GPUs (from the scheduler's view when one serves, else the store's), and the nodes under no
leaf. What placement sees of the fabric (docs/configuration.md, "Topology")."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from ftconsole.format import print_json
from ftconsole.jobs_cli import loaded_config
from ftconsole.scheduler.decide.topology import Fabric
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.serve.client import open_client
from ftconsole.scheduler.spec.config import LoadedConfig


def topology_view(loaded: LoadedConfig, cluster: dict[str, Any]) -> dict[str, Any]:
    """{"switches": [{name, parent, depth, leaf, switches, nodes: [{name, state, gpus_total, free_gpus}]}] in tree
    order (each switch before those under it), "unplaced": nodes under no leaf, "blocks": {name: nodes}}, from the
    config and `cluster`."""
    tree = loaded.cluster.topology
    if tree is None:
        raise UsageError(f"{loaded.file} declares no topology: add a topology: section (docs/configuration.md); "
                         "ftconsole topology --discover asks the nodes")  # fmt: skip
    seen = {n["name"]: n for n in cluster.get("nodes") or []}
    leaves, parents, blocks = tree.leaves(), tree.parents(), tree.block_nodes()
    names: list[str] = list(tree.switches)
    fabric = cluster.get("fabric") or {}  # what the scheduler goes by: found where topology.discover asks
    source = fabric.get("source") or {"switches": "declared" if tree.switches else "none",
                                      "blocks": "declared" if tree.blocks else "none"}  # fmt: skip
    if source.get("switches") == "found":
        leaves, parents = fabric["leaves"], fabric["parents"]
        names = sorted({*leaves, *parents.values()})
    if source.get("blocks") == "found":
        blocks = fabric["blocks"]
    children: dict[str | None, list[str]] = {}
    for name in names:
        children.setdefault(parents.get(name), []).append(name)

    def node(name: str) -> dict[str, Any]:
        view = seen.get(name) or {}
        total = int(view.get("gpus_total") or 0)
        return {"name": name, "state": view.get("state", "unknown"), "gpus_total": total,
                "free_gpus": max(0, total - int(view.get("gpus_used") or 0))}  # fmt: skip

    out: list[dict[str, Any]] = []

    def walk(name: str, depth: int) -> None:
        out.append({"name": name, "parent": parents.get(name), "depth": depth, "leaf": name in leaves,
                    "switches": children.get(name, []), "nodes": [node(n) for n in leaves.get(name, [])]})  # fmt: skip
        for child in children.get(name, []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    placed = {n for nodes in leaves.values() for n in nodes}
    unplaced = [node(n.name) for n in loaded.cluster.node_list() if n.name not in placed]
    # the groups of blocks a job may span (topology.block_sizes), as placement forms them
    groups = Fabric.of({}, {}, blocks, tree.block_sizes or ()).groups
    return {"switches": out, "unplaced": unplaced, "blocks": blocks, "source": source,
            "found_at": fabric.get("found_at"),
            "block_groups": [{"size": size, "groups": [list(g) for g in gs]} for size, gs in groups]}  # fmt: skip


def cmd_topology(args: argparse.Namespace) -> int:
    loaded = loaded_config(args)

    async def go() -> dict[str, Any]:
        async with open_client(loaded) as client:
            return dict(await client.call("cluster"))

    if args.discover:
        return _discovered(loaded, args)
    view = topology_view(loaded, asyncio.run(go()))
    if args.json:
        print_json(view)
        return 0
    found = [what for what, key in (("switches", "switches"), ("blocks", "blocks")) if view["source"][key] == "found"]
    if found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(view["found_at"]))
        print(f"{' and '.join(found)} as the nodes told at {when} (topology.discover)")
    for switch in view["switches"]:
        indent = "  " * switch["depth"]
        nodes = switch["nodes"]
        if not switch["leaf"]:
            print(f"{indent}{switch['name']}")
            continue
        free = sum(1 for n in nodes if n["state"] == "healthy" and n["free_gpus"] == n["gpus_total"] > 0)
        print(f"{indent}{switch['name']}  ({len(nodes)} nodes, {free} whole and healthy)")
        for n in nodes:
            print(f"{indent}  {n['name']:<16} {n['state']:<10} {n['free_gpus']}/{n['gpus_total']} GPUs free")
    if view["unplaced"]:
        print("under no switch: " + ", ".join(n["name"] for n in view["unplaced"]))
    for name, nodes in view["blocks"].items():
        print(f"block {name}: {', '.join(nodes)}")
    for level in view["block_groups"][1:]:  # the first size is a block's own
        groups = "; ".join(" + ".join(group) for group in level["groups"])
        print(f"groups of at most {level['size']} nodes a job may span (topology.block_sizes): {groups}")
    return 0


def _discovered(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    """--discover: what the nodes' tools say of the fabric, and where it differs from topology: (exit 1 then)."""

    async def go() -> dict[str, Any]:
        async with open_client(loaded) as client:
            return dict(await client.call("topology_discover"))

    found = asyncio.run(go())
    if args.json:
        print_json(found)
    else:
        for leaf, nodes in found["found"]["leaves"].items():
            print(f"switch {leaf}: {', '.join(nodes)}")
        for domain, nodes in found["found"]["nvlink_domains"].items():
            print(f"NVLink domain {domain}: {', '.join(nodes)}")
        if not found["found"]["leaves"] and not found["found"]["nvlink_domains"]:
            print("the nodes' tools (ibnetdiscover, lldpctl, nvidia-smi) told nothing of the fabric")
        for text in found["mismatches"]:
            print(f"mismatch: {text}")
        for node, why in sorted(found["errors"].items()):
            print(f"{node}: not asked: {why}")
    return 1 if found["mismatches"] else 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "topology",
        parents=parents,
        help="the switches the nodes hang under (topology:), each leaf's nodes and free GPUs",
        description="Show the cluster config's topology: each switch, the leaves' nodes with their state and free "
        "GPUs, and the nodes under no leaf. Placement puts a multi-node job under the fewest leaf switches.",
    )
    p.add_argument(
        "--discover",
        action="store_true",
        help="ask the nodes' tools (ibnetdiscover, lldpctl, nvidia-smi) what the fabric is, and compare it with "
        "topology: (exit 1 on a mismatch, each an event)",
    )
    p.set_defaults(func=cmd_topology)
