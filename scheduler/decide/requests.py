"""From what users and probes say to what placement reads (pure conversions).

`job_request` turns a job spec into a placement `JobRequest`, resolving named specs against the cluster
config; `node_slot` turns a node's stored view (state and last probe) into a `NodeSlot`.
"""

from __future__ import annotations

from typing import Any

from ftconsole.scheduler.decide.placement import Candidate, JobRequest, NodeSlot, Priority
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.containers import pick_runtime
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.spec.nodesets import expand_nodeset


def candidates(spec: JobSpec, config: ClusterConfig) -> tuple[Candidate, ...]:
    out = []
    for request in spec.gpu_request:
        if request.spec is None:
            gpus = request.gpus_per_node or 0
            if gpus < 1:
                raise UsageError(f"job {spec.name}: placement needs at least 1 GPU per node (gpus_per_node: {gpus})")
            out.append(Candidate(None, gpus, spec.gpu_model))
            continue
        named = config.specs.get(request.spec)
        if named is None:
            defined = ", ".join(sorted(config.specs)) or "none"
            raise UsageError(
                f"job {spec.name}: spec {request.spec!r} is not defined in the cluster config (defined: {defined})"
            )
        out.append(Candidate(request.spec, named.gpus_per_node, named.gpu_model or spec.gpu_model))
    return tuple(out)


def job_request(spec: JobSpec, config: ClusterConfig, *, job_id: str, now: float, requeued: bool = False) -> JobRequest:
    pool = spec.pool
    if pool is None and spec.spec is not None:
        pool = config.specs[spec.spec].pool if spec.spec in config.specs else None
    return JobRequest(
        id=job_id,
        priority=Priority.parse(spec.priority.value),
        submitted_at=now,
        requeued=requeued,
        project=spec.project,
        nodes=spec.nodes,
        candidates=candidates(spec, config),
        pool=pool,
        node_names=frozenset(expand_nodeset(spec.node_names)) if spec.node_names else None,
        driver_version=spec.driver_version,
        max_runtime=spec.max_runtime,
        min_nodes=None if spec.elastic_range is None else spec.elastic_range[0],
        image=spec.image is not None,
        max_switches=None if spec.topology is None else spec.topology.max_switches,
        switches_until=None if spec.topology is None or spec.topology.wait is None else now + spec.topology.wait,
        segment=None if spec.topology is None else spec.topology.segment,
    )


def node_slot(view: dict[str, Any], runtime: str = "auto") -> NodeSlot:
    """A node as placement sees it, from `NodeView.to_json()`: GPUs, driver and container runtimes from its last
    report; `runtime`: the one its pool runs images with (`ClusterConfig.runtime_for`)."""
    gpus = view.get("gpus") or []
    models = {g.get("name") for g in gpus if g.get("name")}
    facts = view.get("facts") or {}
    return NodeSlot(
        name=view["name"],
        pool=view["pool"],
        gpu_model=models.pop() if len(models) == 1 else "",
        driver_version=facts.get("driver_version") or "",
        gpus_total=len(gpus),
        state_ok=view["state"] == "healthy",
        labels=frozenset(f"{k}={v}" for k, v in (view.get("labels") or {}).items()),
        degraded=view["state"] == "degraded",
        images=pick_runtime(facts.get("runtimes") or (), runtime) is not None,
    )


def urgent_scope(config: ClusterConfig, owner: str, project: str) -> str:
    """What the urgent cap counts over: the project where projects are declared in the config (their members
    alone may name them), else the user, so that naming a new project never dodges the cap."""
    return f"project {project}" if config.projects else f"user {owner}"
