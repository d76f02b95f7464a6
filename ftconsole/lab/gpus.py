"""Simulated GPUs (pure): a node's gpus.json (DESIGN.md, "Simulated GPUs") rendered from its planned spec, and
the uncorrectable ECC errors that the gpu-ecc fault adds to it and heal clears."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ftconsole.lab.layout import DEFAULT_DRIVER_VERSION, EccFault, TemperatureFault
from ftconsole.lab.plan import NodeSpec


def pci_bus_id(node: str, index: int) -> str:
    """GPU `index` of lab node `node`'s PCI address, as NVML writes it: the node's number is its PCI domain, so no
    two lab nodes' GPUs share one (the lab's nodes share one kernel log, where the driver's Xids name a GPU by it)."""
    digits = node[len(node.rstrip("0123456789")) :]
    return f"{int(digits or 0):08x}:{0x18 + index:02x}:00.0"


def render_gpus(spec: NodeSpec, driver_version: str = DEFAULT_DRIVER_VERSION) -> dict[str, Any]:
    """The node's gpus.json (DESIGN.md "Simulated GPUs"): idle, cool, healthy GPUs plus the node's faults, under
    the load of the node's jobs."""
    gpus = [
        {
            "index": i,
            "name": spec.gpu_model,
            "memory_total_mib": spec.memory_mib,
            "utilization": 0,
            "temperature": 34 + (i * 3) % 8,
            "ecc_uncorrectable": 0,
            "healthy": True,
            "pci_bus_id": pci_bus_id(spec.name, i),
        }
        for i in range(spec.gpus)
    ]
    for kind, fault in spec.faults.gpu_faults() if spec.faults else []:
        if fault.gpu >= len(gpus):
            continue  # `--nodes N` may give the node fewer GPUs than the layout's node of that name
        gpu = gpus[fault.gpu]
        if isinstance(fault, EccFault):
            gpu["ecc_uncorrectable"] = fault.count
        elif isinstance(fault, TemperatureFault):
            gpu["temperature"] = fault.celsius
        elif kind == "unhealthy":
            gpu["healthy"] = False
    # "load": a GPU a job of the node holds reads a moving utilisation (the agent's _sim_load), so the console's
    # map and curves move in the demo as on a busy cluster
    return {"driver_version": driver_version, "load": "jobs", "gpus": gpus}


def with_ecc_error(data: Mapping[str, Any], index: int) -> dict[str, Any]:
    """gpus.json with one more uncorrectable ECC error on GPU `index` (an IndexError when there is no such GPU)."""
    gpus = [dict(g) for g in data["gpus"]]
    if not 0 <= index < len(gpus):
        raise IndexError(index)
    gpus[index]["ecc_uncorrectable"] = int(gpus[index].get("ecc_uncorrectable") or 0) + 1
    return {**data, "gpus": gpus}


def without_ecc_errors(data: Mapping[str, Any]) -> dict[str, Any]:
    """gpus.json with every GPU's uncorrectable ECC count back to 0 (as a GPU reset clears the volatile count)."""
    return {**data, "gpus": [{**g, "ecc_uncorrectable": 0} for g in data["gpus"]]}


def ecc_counts(data: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(g.get("ecc_uncorrectable") or 0) for g in data["gpus"])
