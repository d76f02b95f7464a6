"""The cluster view of seed 003: what each node is and holds, which specs are idle or tight, what the queue wants.

Pure: node views (as `ClusterService.nodes` gives them), the runs holding GPUs and the queued jobs in, one
JSON-ready document out.

- nodes: OS and kernel, CPUs, memory, driver, GPUs used/total, which job holds each GPU, and the container
  runtime that runs jobs with an image there (`image_runtime`, as "podman (cdi)");
- specs: per named spec of the config (and per GPU model present), how many usable nodes could take one more
  job of that shape now: `idle` when at least one, else `tight`;
- demand: GPUs asked for by queued jobs, per GPU model (`any` when the job does not name one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ftconsole.scheduler.decide.jobs import Job, Run
from ftconsole.scheduler.decide.requests import candidates, node_slot
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.containers import pick_runtime


def cluster_view(
    config: ClusterConfig,
    views: Sequence[dict[str, Any]],
    held: Iterable[Run],
    queued: Iterable[Job],
    debug_held: Iterable[tuple[Run, float]] = (),
) -> dict[str, Any]:
    """`debug_held`: the runs of failed jobs whose GPUs stay held for debugging, with until when."""
    holders: dict[str, dict[int, int]] = defaultdict(dict)
    debug_until: dict[str, dict[int, float]] = defaultdict(dict)
    for run in held:
        for gpu in run.gpus:
            holders[run.node][gpu] = run.job
    for run, until in debug_held:
        for gpu in run.gpus:
            holders[run.node][gpu] = run.job
            debug_until[run.node][gpu] = until
    degraded_ok = {name for name, pool in config.pools.items() if pool.schedule_degraded}
    nodes, free = [], {}
    for view in views:
        wanted = config.runtime_for(view["pool"])
        slot = node_slot(view, wanted)
        held_here = holders.get(view["name"], {})
        facts = view.get("facts") or {}
        runtime = pick_runtime(facts.get("runtimes") or (), wanted)
        usable = slot.state_ok or (slot.degraded and slot.pool in degraded_ok)
        free[view["name"]] = (slot, slot.gpus_total - len(held_here) if usable else 0)
        nodes.append(
            {
                "name": view["name"],
                "state": view["state"],
                "pool": view["pool"],
                "os": facts.get("os"),
                "kernel": facts.get("kernel"),
                "cpus": facts.get("cpus"),
                "mem_total_mib": facts.get("mem_total_mib"),
                "mem_available_mib": facts.get("mem_available_mib"),
                "driver_version": facts.get("driver_version"),
                "gpu_model": slot.gpu_model or None,
                "gpus_total": slot.gpus_total,
                "gpus_used": len(held_here),
                # the runtime that runs jobs with an image here, and how it gives GPUs (None: no image job here)
                "image_runtime": None if runtime is None else f"{runtime.runtime} ({runtime.gpu_via})",
                "gpus": [
                    _gpu(g.get("index", i), held_here, debug_until.get(view["name"], {}))
                    for i, g in enumerate(view.get("gpus") or [])
                ],
            }
        )
    shapes: dict[str, tuple[int, str | None, str | None]] = {
        name: (spec.gpus_per_node, spec.gpu_model, spec.pool) for name, spec in config.specs.items()
    }
    for slot, _ in free.values():
        if slot.gpu_model and slot.gpus_total and slot.gpu_model not in shapes:
            shapes[slot.gpu_model] = (slot.gpus_total, slot.gpu_model, None)
    specs = []
    for name, (gpus, model, pool) in shapes.items():
        matching = [
            (slot, left)
            for slot, left in free.values()
            if slot.gpus_total >= gpus and (model is None or slot.gpu_model == model) and (pool in (None, slot.pool))
        ]
        can_take = sum(1 for _, left in matching if left >= gpus)
        specs.append(
            {
                "spec": name,
                "gpus_per_node": gpus,
                "gpu_model": model,
                "pool": pool,
                "nodes": len(matching),
                "nodes_free": can_take,
                "gpus_free": sum(left for _, left in matching),
                "state": "idle" if can_take else "tight",
            }
        )
    demand: dict[str, int] = defaultdict(int)
    for job in queued:
        try:
            first = candidates(job.spec, config)[0]
        except FtError:
            continue
        demand[first.gpu_model or "any"] += first.gpus_per_node * job.spec.nodes
    return {"nodes": nodes, "specs": specs, "queued_demand": dict(demand)}


def _gpu(index: int, held: dict[int, int], debug_until: dict[int, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "job": held.get(index)}
    if index in debug_until:
        out["held_for_debug_until"] = debug_until[index]
    return out
