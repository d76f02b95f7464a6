"""Preemption: which running jobs a waiting job of a higher priority level stops, so that it can start.

Pure code: the inputs are placement's (`ClusterState`, the queue, the pass's decisions) and what the scheduler
knows of the running jobs (`Running`); the output is a list of `Preempt`.

Who preempts
    A queued job that waits for capacity (`WaitCause.CAPACITY`: not enough free GPUs now), in queue order, the
    first `DEPTH` such jobs of a pass (as Slurm's default_queue_depth bounds its scheduling loop). A job held by
    a quota, a dependency or the urgent cap, or blocked behind the head, preempts no one.
Who may be preempted
    A running job whose spec says `preemptible: true`, of a lower priority level than the waiting job, whose
    current attempt has run at least `min_runtime` (`scheduler.preempt_min_runtime`) and which is not being
    stopped already.
Which ones
    The set that loses the fewest GPU-seconds. A job's loss is its GPUs times the time its attempt has run (the
    work since it started), or times its grace period when it saves a checkpoint on the signal
    (`checkpoint_resume`: it loses only the time it takes to save). Chosen greedily: the smallest losses first
    until the waiting job fits, then each chosen job (largest loss first) dropped again if the job still fits
    without it.
Jobs already being preempted
    Their GPUs count as free: a waiting job that fits once they are down takes no new victim, and it claims the
    GPUs it would take, so that the next waiting job does not count them again. The waiting job then starts
    through placement, once the preempted jobs are down; it is ahead of them in the queue (a higher level).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from ftconsole.scheduler.decide.placement import queue_key
from ftconsole.scheduler.decide.placement_index import Catalog, FreeView, fit_job
from ftconsole.scheduler.decide.placement_inputs import (
    Allocation,
    ClusterState,
    Decision,
    JobRequest,
    Place,
    Priority,
    Wait,
    WaitCause,
)

DEPTH = 100  # the waiting jobs a pass considers for preemption, first in queue order (Slurm's default_queue_depth)


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as preemption sees it."""

    job_id: str
    priority: Priority
    gpus: int  # GPUs it holds, all nodes together
    started: float  # when its current attempt started
    preemptible: bool = False
    grace: float | None = None  # it saves a checkpoint on the signal within this grace period (checkpoint_resume)
    stopping: bool = False  # being preempted already: its GPUs are as good as free

    def lost(self, now: float) -> float:
        """The GPU-seconds it loses if preempted now."""
        return self.gpus * (self.grace if self.grace is not None else max(0.0, now - self.started))


@dataclass(frozen=True, slots=True)
class Preempt:
    """`job_id` starts once `victims` are down: `new` ones are to be stopped now (`lost`: their GPU-seconds lost);
    `stopping` ones, being preempted already, make room for it too."""

    job_id: str
    new: tuple[str, ...]
    stopping: tuple[str, ...] = ()
    lost: float = 0.0

    @property
    def victims(self) -> tuple[str, ...]:
        return self.new + self.stopping


def choose(
    state: ClusterState,
    queue: Sequence[JobRequest],
    decisions: Sequence[Decision],
    running: Mapping[str, Running],
    now: float,
    *,
    min_runtime: float,
    allow_degraded: Collection[str] = (),
) -> list[Preempt]:
    """The preemptions that this placement pass (`decisions` for `queue` on `state`) leads to; see the module
    docstring. `running`: the running jobs by id (those not there are never preempted)."""
    stopping = {i for i, r in running.items() if r.stopping}
    eligible = [r for r in running.values() if _may_go(r, now, min_runtime)]
    waiting = {d.job_id for d in decisions if isinstance(d, Wait) and d.cause is WaitCause.CAPACITY}
    lowest = min((r.priority for r in eligible), default=None)
    preemptors = [j for j in queue if j.id in waiting and ((lowest is not None and j.priority > lowest) or stopping)]
    if not preemptors:
        return []
    held: dict[str, list[Allocation]] = defaultdict(list)
    for a in state.allocations:
        held[a.job_id].append(a)
    placed = [Allocation(d.job_id, node, gpus) for d in decisions if isinstance(d, Place) for node, gpus in d.nodes]
    catalog = Catalog(state.nodes, allow_degraded)
    view = FreeView.current(catalog, [a for a in (*state.allocations, *placed) if a.job_id not in stopping])
    out: list[Preempt] = []
    taken: set[str] = set()
    usable: dict[tuple[object, ...], set[str]] = {}  # by the job's constraints: the nodes that could hold it
    for job in sorted(preemptors, key=queue_key)[:DEPTH]:
        least = replace(job, nodes=job.min_nodes) if job.min_nodes is not None else job
        new: list[Running] = []
        if fit_job(least, catalog, view) is None:
            shape = (job.pool, job.driver_version, job.labels, job.image, job.node_names, job.candidates)
            where = usable.get(shape)
            if where is None:
                where = usable[shape] = _usable(job, catalog)
            options = sorted(
                (
                    r
                    for r in eligible
                    if r.priority < job.priority
                    and r.job_id not in taken
                    and any(a.node in where for a in held[r.job_id])  # frees GPUs it could use
                ),
                key=lambda r: (r.lost(now), r.job_id),
            )
            new = _fewest(least, options, held, catalog, view, now)
            if not new:
                continue  # preempting every job it may does not make room either: it waits as it would
        fit = fit_job(least, catalog, view)
        assert fit is not None
        for name, gpus in fit[1]:
            view.take(name, gpus)
        taken.update(r.job_id for r in new)
        used = {name for name, _ in fit[1]}
        covering = tuple(sorted((i for i in stopping if any(a.node in used for a in held[i])), key=_number))
        if new or covering:
            ids = tuple(sorted((r.job_id for r in new), key=_number))
            out.append(Preempt(job.id, ids, covering, sum(r.lost(now) for r in new)))
    return out


def _usable(job: JobRequest, catalog: Catalog) -> set[str]:
    """The usable nodes that could hold the job (any candidate), were they free."""
    return {name for cand in job.candidates for name in catalog.eligible(job, cand)}


def _may_go(r: Running, now: float, min_runtime: float) -> bool:
    return r.preemptible and not r.stopping and now - r.started >= min_runtime


def _fewest(
    job: JobRequest,
    options: Sequence[Running],
    held: Mapping[str, Sequence[Allocation]],
    catalog: Catalog,
    view: FreeView,
    now: float,
) -> list[Running]:
    """The victims (of `options`, smallest loss first) whose GPUs, freed in `view`, let `job` fit: the shortest
    run of the smallest losses that makes room (found by halving: more victims never make less room), then each
    dropped again (largest loss first) that it fits without. [] when even all of them do not: the view is then
    as it was."""
    if not options:
        return []
    freed = len(options)  # options[:freed] are freed in the view
    for r in options:
        _free(view, held[r.job_id])
    if fit_job(job, catalog, view) is None:
        for r in options:
            _hold(view, held[r.job_id])
        return []

    def free_first(count: int) -> None:
        nonlocal freed
        for r in options[count:freed]:
            _hold(view, held[r.job_id])
        for r in options[freed:count]:
            _free(view, held[r.job_id])
        freed = count

    low, high = 1, len(options)  # it fits with the first `high`
    while low < high:
        middle = (low + high) // 2
        free_first(middle)
        if fit_job(job, catalog, view) is None:
            low = middle + 1
        else:
            high = middle
    free_first(high)
    dropped = set()
    for r in sorted(options[:high], key=lambda r: r.lost(now), reverse=True):
        _hold(view, held[r.job_id])
        if fit_job(job, catalog, view) is None:
            _free(view, held[r.job_id])
        else:
            dropped.add(r.job_id)
    return [r for r in options[:high] if r.job_id not in dropped]


def _free(view: FreeView, allocations: Sequence[Allocation]) -> None:
    for a in allocations:
        view.give(a.node, a.gpus)


def _hold(view: FreeView, allocations: Sequence[Allocation]) -> None:
    for a in allocations:
        view.take(a.node, a.gpus)


def _number(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (0, job_id)
