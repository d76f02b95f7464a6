"""Finding the fabric (`ftconsole topology --discover`, API op `topology_discover`): each node is asked, over SSH as
the SSH account, what its tools say: `lldpctl -f json` (its Ethernet neighbours, for RoCE: on the interfaces that
carry RDMA, /sys/class/infiniband/*/device/net, where there are some), `nvidia-smi -q` (its
NVLink domain), and `ibnetdiscover` (the InfiniBand fabric, run on one node only: the first that has it, the next
where that one fails). Each tool runs
only where installed, under a time bound. What they say is read (`decide.fabricfind`) and compared with the config's
`topology:`; each mismatch is a `TopologyMismatch` event of its node. What the config declares stays the truth until
an operator edits it.

Where `topology.discover` is set, the scheduler asks at its start (once the first probe sweep is done) and then every
`discover`, and placement uses what the nodes told for what the config leaves out: the leaves where it declares no
`switches`, the NVLink domains where it declares no `blocks` (`decide.topology.merged_fabric`); those are not
mismatches. What was found is kept in the store, so a restart places by it at once; each change of the fabric
placement uses is a `TopologyFound` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ftconsole.scheduler.decide.fabricfind import (
    compare,
    found_fabric,
    read_ibnetdiscover,
    read_lldp,
    read_nvlink_domain,
)
from ftconsole.scheduler.decide.topology import merged_fabric
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.ssh.transport import run_on_all

log = logging.getLogger("ftconsole.scheduler")

MARK = "== ftconsole: "  # starts the line before each tool's output
# POSIX sh, no value from anyone: each tool where installed, bounded by `timeout` (coreutils) where that exists
SCRIPT = """\
bound() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
echo "== ftconsole: rdma-netdevs"
for netdev in /sys/class/infiniband/*/device/net/*; do [ -e "$netdev" ] && echo "${netdev##*/}"; done
for tool in lldpctl nvidia-smi; do
  echo "== ftconsole: $tool"
  command -v "$tool" >/dev/null 2>&1 || continue
  case $tool in
    lldpctl) bound 10 lldpctl -f json 2>/dev/null ;;
    nvidia-smi) bound 30 nvidia-smi -q 2>/dev/null ;;
  esac
done
echo "== ftconsole: has-ibnetdiscover"
command -v ibnetdiscover >/dev/null 2>&1 && echo yes
exit 0
"""
# the whole InfiniBand fabric, from one node (every node sweeping it at once would be as many sweeps of the fabric)
IB_SCRIPT = """\
if command -v timeout >/dev/null 2>&1; then timeout 60 ibnetdiscover 2>/dev/null; else ibnetdiscover 2>/dev/null; fi
"""
IB_TRIES = 3  # the nodes that have ibnetdiscover asked in turn, until one answers
TIMEOUT_S = 120.0
KEPT = "topology.found"  # the store's meta key of what was last found, and when
GROUPS = ("leaves", "nvlink_domains")  # what was found groups the nodes by (`Found.to_json`)


def sections(text: str) -> dict[str, str]:
    """tool -> what it printed (a tool not installed: absent)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARK):
            current = out.setdefault(line[len(MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {tool: "\n".join(lines) for tool, lines in out.items() if any(x.strip() for x in lines)}


async def discover(service: Any, clock: Callable[[], float]) -> dict[str, Any]:
    """Ask every node, read what they say, compare it with the config; the mismatches as events."""
    nodes = list(service.all_nodes)
    results = await run_on_all(nodes, lambda node: service.transport.run(node, ["sh", "-c", SCRIPT], timeout=TIMEOUT_S))
    said: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    for node in nodes:
        result = results[node.name]
        if isinstance(result, FtError):
            errors[node.name] = str(result)
        elif not result.ok:
            errors[node.name] = result.describe_failure()
        else:
            said[node.name] = sections(result.stdout)
    await _ask_ib(service, [n for n in nodes if said.get(n.name, {}).pop("has-ibnetdiscover", "") == "yes"], said)
    ib = None
    lldp: dict[str, dict[str, str]] = {}
    rdma: dict[str, list[str]] = {}  # node -> its network interfaces that carry RDMA (RoCE)
    nvlink: dict[str, str] = {}
    for name, told in said.items():
        try:  # what one node's tools print is that node's: a shape nobody foresaw is its error alone
            if ib is None and "ibnetdiscover" in told:
                ib = read_ibnetdiscover(told["ibnetdiscover"])
            if "lldpctl" in told:
                lldp[name] = read_lldp(told["lldpctl"])
                rdma[name] = told.get("rdma-netdevs", "").split()
            if "nvidia-smi" in told and (domain := read_nvlink_domain(told["nvidia-smi"])):
                nvlink[name] = domain
        except Exception as exc:
            log.warning("topology: cannot read what %s's tools said: %s: %s", name, type(exc).__name__, exc)
            errors[name] = f"cannot read what its tools said: {type(exc).__name__}: {exc}"
    found = found_fabric({n.name: n.host for n in nodes}, ib, lldp, nvlink, rdma)
    tree = service.config.topology
    declared = {} if tree is None else {node: leaf for leaf, names in tree.leaves().items() for node in names}
    blocks = {} if tree is None else {node: block for block, names in tree.block_nodes().items() for node in names}
    compared = found
    if tree is not None and tree.discover is not None:  # what the config leaves out is found, not a mismatch
        unasked = dict(errors)
        if ib is None:  # no ibnetdiscover read this time: the leaves it gave before are not taken back
            unasked.update(dict.fromkeys(nodes_told_by(service.found_fabric, "ibnetdiscover"), "no ibnetdiscover"))
        await _adopt(service, kept_for(found.to_json(), service.found_fabric, unasked), clock())
        if not tree.switches:
            compared = dataclasses.replace(compared, leaf_of={}, source={})
        if not tree.blocks:
            compared = dataclasses.replace(compared, nvlink={})
    mismatches = compare(declared, compared, [n.name for n in nodes], blocks)
    if mismatches:
        now = clock()
        async with service.store.jobs_tx("record what the fabric discovery found") as tx:
            for text in mismatches:
                await tx.event(now, "TopologyMismatch", text, node=text.split()[0])
        for text in mismatches:
            log.warning("topology: %s", text)
    return {
        "found": found.to_json(),
        "mismatches": mismatches,
        "errors": errors,
        "tools": {name: sorted(s) for name, s in said.items()},
    }


async def _ask_ib(service: Any, having: list[Any], said: dict[str, dict[str, str]]) -> None:
    """ibnetdiscover on the first of `having` (the nodes that have it) that answers, at most IB_TRIES of them."""
    for node in having[:IB_TRIES]:
        try:
            result = await service.transport.run(node, ["sh", "-c", IB_SCRIPT], timeout=TIMEOUT_S)
        except FtError as exc:
            log.warning("topology: ibnetdiscover on %s: %s", node.name, exc)
            continue
        if result.ok and result.stdout.strip():
            said[node.name]["ibnetdiscover"] = result.stdout
            return
        log.warning("topology: ibnetdiscover on %s told nothing: %s", node.name, result.describe_failure())


def nodes_told_by(found: tuple[dict[str, Any], float] | None, tool: str) -> list[str]:
    """The nodes whose leaf `tool` gave, in what was found before."""
    return [] if found is None else [node for node, source in (found[0].get("source") or {}).items() if source == tool]


def kept_for(
    found: dict[str, Any], before: tuple[dict[str, Any], float] | None, unasked: Mapping[str, str]
) -> dict[str, Any]:
    """What was found, and for each node that could not be asked (`unasked`: node -> why) what was found of it
    before: an SSH failure during a discovery does not take a node out of its leaf, while a node that was asked and
    told nothing leaves it."""
    if before is None:
        return found
    merged = {**found, **{key: {k: list(v) for k, v in found.get(key, {}).items()} for key in GROUPS}}
    for key in GROUPS:
        told = {node for nodes in merged[key].values() for node in nodes}
        for group, nodes in before[0].get(key, {}).items():
            kept = [node for node in nodes if node in unasked and node not in told]
            if kept:
                merged[key][group] = sorted({*merged[key].get(group, []), *kept})
    uplinks = dict(found.get("uplinks") or {})
    for leaf, above in (before[0].get("uplinks") or {}).items():
        if leaf in merged["leaves"] and leaf not in uplinks:
            uplinks[leaf] = above
    source = dict(found.get("source") or {})
    for node, how in (before[0].get("source") or {}).items():
        if node in unasked and node not in source:
            source[node] = how
    return {**merged, "uplinks": uplinks, "source": source}


async def _adopt(service: Any, found: dict[str, Any], now: float) -> None:
    """Use what was found where the config leaves it out; a `TopologyFound` event when that changes what placement
    goes by; kept in the store for the next start."""
    tree = service.config.topology
    before = merged_fabric(tree, None if service.found_fabric is None else service.found_fabric[0])
    service.found_fabric = (found, now)
    after = merged_fabric(tree, found)
    await service.store.keep(KEPT, json.dumps({"found": found, "at": now}))
    if before == after:
        return
    if "found" in after["source"].values():
        text = "placement goes by the fabric the nodes told: " + describe_found(after)
    elif "found" in before["source"].values():  # what they told before is gone: said, never silent
        text = "the nodes tell no fabric now: placement goes by what topology: declares, and no more by what they told"
    else:
        return
    async with service.store.jobs_tx("record the fabric found") as tx:
        await tx.event(now, "TopologyFound", text)
    log.info("topology: %s", text)


def describe_found(merged: dict[str, Any]) -> str:
    """`3 leaf switches (sw-a: node01, node02; ...), 1 NVLink domain (...)`: what was found, of what placement uses."""
    parts = []
    for key, what in (("leaves", "leaf switch"), ("blocks", "NVLink domain")):
        source = merged["source"]["switches" if key == "leaves" else "blocks"]
        groups = merged[key]
        if source == "found" and groups:
            listed = "; ".join(f"{name}: {', '.join(nodes)}" for name, nodes in sorted(groups.items()))
            plural = "es" if what.endswith("switch") else "s"
            parts.append(f"{len(groups)} {what}{plural if len(groups) != 1 else ''} ({listed})")
    return ", ".join(parts)


async def recall(service: Any) -> None:
    """What the last discovery found, from the store (a restart places by it before it asks again)."""
    if service.found_fabric is not None:
        return
    kept = await service.store.kept(KEPT)
    if kept is None:
        return
    with contextlib.suppress(ValueError, KeyError, TypeError):
        value = json.loads(kept)
        found, at = value["found"], float(value["at"])
        if well_formed(found):  # anything else (a store edited by hand, an older shape) is not used
            service.found_fabric = (found, at)


def well_formed(found: Any) -> bool:
    """Whether `found` has the shape `Found.to_json` gives: groups of node names, each name a string."""

    def groups(value: Any) -> bool:
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v) for k, v in value.items()
        )

    return (
        isinstance(found, dict)
        and all(groups(found.get(key, {})) for key in (*GROUPS, "uplinks"))
        and isinstance(found.get("source", {}), dict)
    )


async def watch(service: Any, clock: Callable[[], float], stop: asyncio.Event, first: Awaitable[Any] | None) -> None:
    """`topology.discover`: ask the nodes once the first probe sweep is done, then every `discover`."""
    tree = service.config.topology
    if tree is None or tree.discover is None:
        return
    try:
        await recall(service)
    except Exception:  # a store not answering yet: the first discovery finds it all again
        log.exception("topology: cannot read what the last discovery found")
    if first is not None:
        await first
    while not stop.is_set():
        try:
            await discover(service, clock)
        except FtError as exc:
            log.warning("topology: the discovery failed: %s", exc)
        except Exception:
            log.exception("topology: the discovery failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=tree.discover)
