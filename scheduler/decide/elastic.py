"""Elastic jobs: resizing a job between its `min_nodes` and `max_nodes`. Pure decisions, no I/O.

An elastic job that cannot have all its nodes starts on as many as are free, down to `min_nodes` (placement),
and grows back to its size once the missing nodes are free, all at once, as a scale out (`grow`, on by
default). A job with `fault_tolerance.elastic` can also be scaled (`ftconsole scale JOB N`, the console's scale key) to
any size from `min_nodes` to `max_nodes` (default: its `nodes`). A queued job is then placed at the new size.
A running job gets a new attempt of the new size, which replaces the current one (seed 003: the job saves a
checkpoint when signalled and continues from it; seed 004's Scaling condition records each resize):

- scale in: the new attempt keeps the first N ranks' nodes and GPUs, so rank 0 (MASTER_ADDR) stays put;
- scale out: it keeps every node and adds the missing ones, placed like a job of the same priority
  submitted now (a resize never jumps the queue), with the attempt's node spec and GPU count, on nodes of
  rank 0's GPU model. While they are not free the job runs on at its size, says why it waits, and grows as
  soon as they are;
- the current attempt's ranks are stopped as on `stop` (SIGTERM, SIGKILL after the grace period); the new
  attempt's runs hold their GPUs meanwhile and are launched once every old rank is down, with the new
  WORLD_SIZE, hostfile, TF_CONFIG... of the new size. Every mode works this way, since each attempt is
  planned afresh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from ftconsole.scheduler.decide.jobs import Job, Run
from ftconsole.scheduler.decide.placement import Candidate, JobRequest, NodeGpus, Priority


def scale_problem(job: Job, nodes: int) -> str | None:
    """Why `job` cannot be scaled to `nodes` nodes now, or None when it can."""
    bounds = job.spec.elastic_range
    if bounds is None:
        return (
            f"job {job.id} is not elastic: only a job with fault_tolerance.elastic (min_nodes, max_nodes) in its "
            "spec can be scaled"
        )
    low, high = bounds
    if not low <= nodes <= high:
        return f"job {job.id} scales from {low} to {high} nodes (fault_tolerance.elastic), not to {nodes}"
    if not job.status.active:
        return f"job {job.id} is {job.status.value}: only a queued or running job can be scaled"
    if job.stop_reason is not None:
        return f"job {job.id} is being stopped ({job.stop_reason.value}): it cannot be scaled"
    return None


def resizes(job: Job) -> bool:
    """Whether the loop brings the job to its size: an elastic job that was scaled, or may grow back."""
    elastic = job.spec.fault_tolerance.elastic
    return elastic is not None and (job.scaled_to is not None or elastic.grow)


def placed_small(job: Job, nodes: int) -> str:
    """What the placement event adds when an elastic job starts on fewer nodes than its size."""
    if nodes >= job.size:
        return ""
    elastic = job.spec.fault_tolerance.elastic
    later = "grows to its size once nodes free up" if elastic is not None and elastic.grow else "scale it to grow"
    return f"; {nodes} of {job.size} nodes (elastic): {later}"


def direction(before: int, after: int) -> str:
    """Seed 004's words for a resize: "scale out 2 -> 3", "scale in 3 -> 2"."""
    return f"scale {'out' if after > before else 'in'} {before} -> {after}"


def kept_nodes(runs: Sequence[Run], size: int) -> list[NodeGpus]:
    """The nodes and GPUs a resized attempt keeps: those of the first `size` ranks, in rank order."""
    return [(r.node, r.gpus) for r in sorted(runs, key=lambda r: r.rank)[:size]]


def grow_request(
    base: JobRequest,
    *,
    count: int,
    spec_name: str | None,
    gpus_per_node: int,
    gpu_model: str,
    own: Collection[str],
    cluster: Collection[str],
    priority: Priority,
    now: float,
    remaining: float | None,
) -> JobRequest:
    """The placement request for the `count` nodes a scale out adds to a running job.

    `base` is the job's own request (pool, driver, node names); the result asks for the attempt's candidate
    only (`spec_name`, `gpus_per_node`), on `gpu_model` when the candidate names none (`""`: any), on the
    job's allowed nodes (`node_names`, else the whole `cluster`) minus the ones it holds (`own`), at the job's
    `priority` as if submitted `now`, for the `remaining` run time (None: no limit).
    """
    candidate = next(
        (c for c in base.candidates if (c.spec_name, c.gpus_per_node) == (spec_name, gpus_per_node)),
        Candidate(spec_name, gpus_per_node, None),
    )
    if not candidate.gpu_model and gpu_model:
        candidate = dataclasses.replace(candidate, gpu_model=gpu_model)
    allowed = base.node_names if base.node_names is not None else frozenset(cluster)
    return dataclasses.replace(
        base,
        id=f"{base.id}+{count}",
        nodes=count,
        min_nodes=None,  # the nodes a grow adds come all at once; the job's min_nodes is about the whole job
        candidates=(candidate,),
        node_names=frozenset(allowed) - frozenset(own),
        priority=priority,
        submitted_at=now,
        requeued=False,
        max_runtime=None if remaining is None else max(remaining, 0.0),
    )
