"""The Cluster view's rows (seed 003's resource view): each node's make-up and load, the job on each GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ftconsole.tui.rows import NODE_STATE_STYLE, Column, Row, styled

CLUSTER_NODE_COLUMNS = (
    Column("node", "NODE"),
    Column("state", "STATE", 11),
    Column("os", "OS"),
    Column("kernel", "KERNEL"),
    Column("cpus", "CPUS"),
    Column("mem", "MEMORY"),
    Column("driver", "DRIVER"),
    Column("model", "GPU"),
    Column("used", "USED/TOTAL"),
    Column("holders", "JOBS ON GPUS"),
    Column("images", "IMAGES"),
)


def cluster_node_cells(node: Mapping[str, Any]) -> Row:
    mem = node.get("mem_total_mib")
    avail = node.get("mem_available_mib")
    memory = "?" if mem is None else f"{(avail or 0) // 1024}/{mem // 1024} GiB free"
    holders = " ".join(_holder(g) for g in node.get("gpus") or [])
    state = str(node["state"])
    return (
        str(node["name"]),
        styled(state, NODE_STATE_STYLE.get(state)),
        str(node.get("os") or "?"),
        str(node.get("kernel") or "?"),
        str(node.get("cpus") or "?"),
        memory,
        str(node.get("driver_version") or "?"),
        str(node.get("gpu_model") or "-").replace("NVIDIA ", ""),
        f"{node.get('gpus_used', 0)}/{node.get('gpus_total', 0)}",
        holders,
        str(node.get("image_runtime") or "-"),
    )


def _holder(gpu: Mapping[str, Any]) -> str:
    """`0:12`, `1:-`, or `0:12(debug)` for a GPU a failed job holds for debugging."""
    job = gpu.get("job")
    debug = "(debug)" if gpu.get("held_for_debug_until") is not None else ""
    return f"{gpu['index']}:{job if job is not None else '-'}{debug}"
