"""Simulated GPUs (pure): a node's gpus.json (DESIGN.md, "Simulated GPUs") rendered from its planned spec."""

from __future__ import annotations

from typing import Any

from ftconsole.lab.layout import DEFAULT_DRIVER_VERSION, EccFault, TemperatureFault
from ftconsole.lab.plan import NodeSpec


def render_gpus(spec: NodeSpec, driver_version: str = DEFAULT_DRIVER_VERSION) -> dict[str, Any]:
    """The node's gpus.json (DESIGN.md "Simulated GPUs"): idle, cool, healthy GPUs plus the node's faults."""
    gpus = [
        {
            "index": i,
            "name": spec.gpu_model,
            "memory_total_mib": spec.memory_mib,
            "utilization": 0,
            "temperature": 34 + (i * 3) % 8,
            "ecc_uncorrectable": 0,
            "healthy": True,
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
    return {"driver_version": driver_version, "gpus": gpus}
