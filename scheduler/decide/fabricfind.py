"""The fabric as the nodes tell it (pure): what `ibnetdiscover`, `lldpctl -f json` and `nvidia-smi -q` print, read
into each node's leaf switch and NVLink domain, and compared with the config's `topology:`.

- `ibnetdiscover` (infiniband-diags, run on one node of the fabric) prints every switch and channel adapter with its
  links. A switch with hosts' adapters on its ports is a leaf; its hosts are named by their adapters' node
  descriptions ("gpu01 HCA-1": the host name comes first). The switch is named by its node description (as
  "MF0;leaf1:MSB7700/U1", read as "leaf1"), else by its GUID.
- `lldpctl -f json` (lldpd, on each node) names the switch at the far end of each Ethernet link (RoCE fabrics): the
  chassis name of the neighbour on the node's first interface that has one.
- `nvidia-smi -q` prints, per GPU of an NVLink fabric (NVL72 and the like), a `Fabric` section with the
  `ClusterUUID` and `CliqueId` its GPU belongs to: GPUs of one cluster and clique share one NVLink domain.

A mismatch between what is found and what is declared is said (`compare`), never applied: the config stays the
truth until an operator changes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_SWITCH = re.compile(r'^Switch\s+\d+\s+"S-([0-9a-fA-F]+)"\s*#\s*"([^"]*)"')
_PORT = re.compile(r'^\[\d+\]\S*\s+"([SH])-([0-9a-fA-F]+)"\[\d+\]\S*\s*#\s*"([^"]*)"')
_CA = re.compile(r'^Ca\s+\d+\s+"H-([0-9a-fA-F]+)"\s*#\s*"([^"]*)"')


def _switch_name(description: str, guid: str) -> str:
    """A switch's name from its node description: Mellanox's "MF0;NAME:MODEL/U1" gives NAME; else the description
    itself, or the GUID where it says nothing."""
    text = description.strip()
    if text.startswith("MF0;") and ":" in text:
        return text[4:].split(":", 1)[0] or guid
    return text or guid


def _host(description: str) -> str:
    """The host of a channel adapter's node description ("gpu01 HCA-1" -> "gpu01")."""
    words = description.split()
    return words[0] if words else ""


@dataclass(frozen=True)
class IbFabric:
    leaf_of: dict[str, str]  # host -> the leaf switch its adapter is cabled to (the first one, by port order)
    uplinks: dict[str, set[str]]  # switch -> the switches its ports are cabled to


def read_ibnetdiscover(text: str) -> IbFabric:
    """Hosts and switches of an `ibnetdiscover` topology."""
    leaf_of: dict[str, str] = {}
    uplinks: dict[str, set[str]] = {}
    names: dict[str, str] = {}  # switch guid -> name
    links: list[tuple[str, str]] = []  # (switch guid, the switch guid at the far end)
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if (found := _SWITCH.match(line)) is not None:
            current = found.group(1).lower()
            names[current] = _switch_name(found.group(2), current)
            continue
        if line.startswith(("Ca", "Rt", "vendid", "devid", "sysimgguid", "switchguid", "caguid")):
            current = None if line.startswith(("Ca", "Rt")) else current
            continue
        port = _PORT.match(line)
        if current is None or port is None:
            continue
        kind, guid, description = port.group(1), port.group(2).lower(), port.group(3)
        if kind == "H":
            host = _host(description)
            if host:
                leaf_of.setdefault(host, current)
        else:
            links.append((current, guid))
    # a name two switches share (unnamed switches all say "Quantum Mellanox Technologies") gets each one's GUID
    shared = {name for name in names.values() if list(names.values()).count(name) > 1}
    named = {guid: f"{name} ({guid})" if name in shared else name for guid, name in names.items()}
    for host, guid in leaf_of.items():
        leaf_of[host] = named.get(guid, guid)
    for a, b in links:
        uplinks.setdefault(named.get(a, a), set()).add(named.get(b, b))
    return IbFabric(leaf_of, uplinks)


def read_lldp(text: str) -> dict[str, str]:
    """interface -> the chassis name of its LLDP neighbour, from `lldpctl -f json` (one interface: an object; more:
    a list of one-key objects)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    lldp = doc.get("lldp") if isinstance(doc, dict) else None
    interfaces = (lldp.get("interface") if isinstance(lldp, dict) else None) or {}
    items: list[tuple[str, Any]] = []
    if isinstance(interfaces, list):
        for entry in interfaces:
            if isinstance(entry, dict):
                items += list(entry.items())
    elif isinstance(interfaces, dict):
        items = list(interfaces.items())
    out: dict[str, str] = {}
    for name, info in items:
        chassis = (info or {}).get("chassis") if isinstance(info, dict) else None
        if isinstance(chassis, dict) and chassis:
            first = next(iter(chassis))
            value = chassis[first]
            if first == "id" or not isinstance(value, dict):  # an unnamed neighbour: {"id": {...}}
                named = chassis.get("name")
                first = named.get("value") if isinstance(named, dict) else named
            if isinstance(first, str) and first:
                out[str(name)] = first
    return out


def read_nvlink_domain(text: str) -> str | None:
    """The NVLink domain of a node's GPUs, "CLUSTER_UUID/CLIQUE", from `nvidia-smi -q`'s Fabric sections (None: no
    GPU in an NVLink fabric; several domains on one node: the first GPU's)."""
    uuid = clique = None
    in_fabric = False
    for raw in text.splitlines():
        line = raw.strip()
        if line == "Fabric":
            in_fabric, uuid, clique = True, None, None
            continue
        if not in_fabric or ":" not in line:
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "ClusterUUID":
            uuid = value
        elif key == "CliqueId":
            clique = value
        if uuid and clique:
            if uuid.upper() in ("N/A", "00000000-0000-0000-0000-000000000000"):
                in_fabric, uuid, clique = False, None, None
                continue
            return f"{uuid}/{clique}"
    return None


@dataclass(frozen=True)
class Found:
    """What the nodes told: each node's leaf switch (InfiniBand, else LLDP) and NVLink domain, where known."""

    leaf_of: dict[str, str]
    nvlink: dict[str, str]
    uplinks: dict[str, set[str]]
    source: dict[str, str]  # node -> how its leaf was found: "ibnetdiscover" | "lldp"

    def to_json(self) -> dict[str, Any]:
        leaves: dict[str, list[str]] = {}
        for node, leaf in sorted(self.leaf_of.items()):
            leaves.setdefault(leaf, []).append(node)
        domains: dict[str, list[str]] = {}
        for node, domain in sorted(self.nvlink.items()):
            domains.setdefault(domain, []).append(node)
        return {"leaves": leaves, "nvlink_domains": domains, "uplinks": {k: sorted(v) for k, v in self.uplinks.items()},
                "source": dict(sorted(self.source.items()))}  # fmt: skip


def found_fabric(
    hosts: Mapping[str, str],
    ib: IbFabric | None,
    lldp: Mapping[str, Mapping[str, str]],
    nvlink: Mapping[str, str],
    rdma: Mapping[str, Sequence[str]] | None = None,
) -> Found:
    """Each node's leaf from InfiniBand (its host's, or its name's, adapter) or else from LLDP: the neighbour of its
    first interface that carries RDMA (`rdma`: node -> such interfaces; a RoCE fabric's, not the management
    network's), else of its first interface in name order. `hosts`: node -> the address it is reached at (adapters
    name hosts, which may be either)."""
    leaf_of: dict[str, str] = {}
    source: dict[str, str] = {}
    for node, host in hosts.items():
        leaf = (
            None if ib is None else ib.leaf_of.get(node) or ib.leaf_of.get(host) or ib.leaf_of.get(host.split(".")[0])
        )
        if leaf is not None:
            leaf_of[node], source[node] = leaf, "ibnetdiscover"
            continue
        neighbours = lldp.get(node) or {}
        if neighbours:
            roce = [i for i in (rdma or {}).get(node, ()) if i in neighbours]
            leaf_of[node], source[node] = neighbours[(roce or sorted(neighbours))[0]], "lldp"
    return Found(leaf_of, dict(nvlink), dict(ib.uplinks) if ib is not None else {}, source)


def compare(
    declared: Mapping[str, str], found: Found, nodes: list[str], blocks: Mapping[str, str] | None = None
) -> list[str]:
    """What the nodes told that the config does not say: a node found under another leaf than declared (leaves are
    compared by the nodes they hold, so names may differ), or under a leaf where none is declared; the same for
    NVLink domains and the declared `blocks` (node -> block)."""
    out = _grouping(declared, found.leaf_of, nodes, found.source, "under", "switch", "leaf")
    nvidia = dict.fromkeys(found.nvlink, "nvidia-smi")
    return out + _grouping(blocks or {}, found.nvlink, nodes, nvidia, "in", "NVLink domain", "block")


def _grouping(
    declared: Mapping[str, str],
    seen: Mapping[str, str],
    nodes: list[str],
    source: Mapping[str, str],
    word: str,
    kind: str,
    key: str,
) -> list[str]:
    out: list[str] = []
    groups_declared: dict[str, set[str]] = {}
    for node, group in declared.items():
        groups_declared.setdefault(group, set()).add(node)
    groups_found: dict[str, set[str]] = {}
    for node, group in seen.items():
        groups_found.setdefault(group, set()).add(node)
    for node in nodes:
        found = seen.get(node)
        if found is None:
            continue
        said = declared.get(node)
        if said is None:
            out.append(f"{node} is {word} {kind} {found} ({source[node]}) and {word} no {key} in topology:")
            continue
        mates_found = groups_found[found] & set(nodes)
        mates_declared = groups_declared[said] & set(nodes)
        if mates_found != mates_declared:
            extra = sorted(mates_found - mates_declared)
            missing = sorted(mates_declared - mates_found)
            detail = "; ".join(x for x in (f"with {', '.join(extra)}" if extra else "",
                                           f"not with {', '.join(missing)}" if missing else "") if x)  # fmt: skip
            out.append(f"{node} is declared {word} {said} but found {word} {kind} {found} ({source[node]}): {detail}")
    return out
