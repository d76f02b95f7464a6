"""Planning the lab's nodes from its layout (pure): names, pools, GPU models and the faults of each node."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ftconsole.lab.layout import LabLayout, NodeFaults
from ftconsole.scheduler.errors import LabError
from ftconsole.scheduler.spec.nodesets import expand_nodeset

LAB_HOST = "127.0.0.1"
MAX_NODES = 4096


@dataclass(frozen=True)
class NodeSpec:
    """One lab node as planned from the layout."""

    name: str
    pool: str
    gpus: int
    gpu_model: str
    memory_mib: int
    faults: NodeFaults | None = None


def node_names(count: int, prefix: str = "lab") -> list[str]:
    """lab01..labNN (width 2 below 100 nodes, else 3 or more)."""
    if not 1 <= count <= MAX_NODES:
        raise LabError(f"the lab has 1 to {MAX_NODES} nodes, not {count}")
    width = 2 if count < 100 else max(3, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def _number_key(name: str) -> tuple[str, int] | str:
    """lab07 and lab007 are the same node number: faults follow the number when `--nodes` renames nodes."""
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else name


def _split(count: int, sizes: Sequence[int]) -> list[int]:
    """Share `count` nodes between groups in proportion to their sizes (contiguous blocks, in order)."""
    total, done, out, cum = sum(sizes), 0, [], 0
    for size in sizes:
        cum += size
        end = (count * cum + total // 2) // total
        out.append(end - done)
        done = end
    return out


def plan_nodes(layout: LabLayout, count: int | None = None) -> tuple[NodeSpec, ...]:
    """The nodes of the lab: the layout's own, or `count` nodes named prefix01.. in the layout's proportions."""
    groups = [(g, expand_nodeset(g.name)) for g in layout.nodes]
    if count is None:
        named = [(g, name) for g, names in groups for name in names]
    else:
        names = iter(node_names(count, layout.prefix))
        shares = _split(count, [len(n) for _, n in groups])
        named = [(g, next(names)) for (g, _), share in zip(groups, shares, strict=True) for _ in range(share)]
    faults = {_number_key(name): f for name, f in layout.faults.items()}
    faults.update(layout.faults)
    out = []
    for group, name in named:
        fault = faults.get(name) or faults.get(_number_key(name))
        out.append(NodeSpec(name, group.pool, group.gpus, group.gpu_model, group.memory_mib, fault))
    return tuple(out)
