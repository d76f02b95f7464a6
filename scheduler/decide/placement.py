"""The queue and the placement engine: which queued jobs start now, on which nodes and GPUs, and why the others wait.

Pure code (sans-I/O): the inputs are frozen dataclasses of this module (`ClusterState`, `JobRequest`), the
output is a list of decisions (`Place`, `Wait`). There is no clock: `now` is a parameter, and every time is a
float in the caller's unit (seconds since the epoch in the daemon). The daemon records a `Place` as an intent
in the store before it launches anything.

Queue order
    priority (very-urgent, urgent, normal), then requeued jobs first (recovery resubmits go to the front of
    their level), then the higher fair-share factor (`fairshare`, decide/fairshare.py; 1 for every job where
    fair share is off), then FIFO by `submitted_at`, then by id in number order for determinism. `plan` decides
    jobs in that order and returns its decisions in that order.

What a job may use
    A node is usable when `state_ok` (healthy), or when it is `degraded` and its pool is in `allow_degraded`.
    A candidate spec fits a node when the node matches the job's `pool`, `driver_version`, `node_names` and
    `labels` (all of them, when set), the candidate's `gpu_model` (exact string; callers pass normalised names
    such as "H100"), and the node has `gpus_per_node` free GPUs. A job lists one or several equivalent
    candidate specs; the first that can start wins, in the job's order.

Placement
    GPU granularity: a node can hold several jobs; each job gets its own GPU indexes, lowest free first, so the
    CUDA devices of two jobs on a node never overlap. Gang placement: all `nodes` nodes of a job start
    together, on distinct nodes, or none does. Best fit against fragmentation: among nodes that can hold the
    job, those with the fewest free GPUs are taken first, then by name (plain string order), so small jobs
    fill partly used nodes and whole nodes stay free for whole-node jobs.

Urgent cap (`urgent_cap`: one number for every project, a number per project, or None for no cap)
    The cap counts a project's urgent jobs, running and queued. Running ones (allocations with priority
    urgent, counted once per job) take their slots first, then queued ones in queue order; an urgent job past
    the cap waits ("urgent cap of project p reached (3/3)") and blocks no one. Rejecting such a submission is
    the submit path's job; placement only never starts one beyond the cap. very-urgent is for admins and has
    no cap.

Elastic jobs (`min_nodes`)
    A job that cannot have all its `nodes` now starts on as many as it can have, down to `min_nodes`, by the
    same rules (outside the head's reservation, best fit); only when not even `min_nodes` fit does it wait
    as any job would. The scheduler grows it back later (`scheduler.decide.elastic`).

Jobs that can never start with the usable nodes (more nodes than match, more GPUs than a node has) wait
with a reason and block no one: they would otherwise hold the whole queue.

Backfill (one reservation, for the head)
    The head is the first job in queue order that may start (not capped, not impossible) but cannot start now.
    Its earliest start is computed by releasing running allocations (and those placed earlier in this pass) in
    order of `ends_at` until one of its candidates fits; the nodes and GPUs it would take at that time, by the
    same best fit, are its reservation. After the head, a lower job may start now only
      - on GPUs outside the reservation, or
      - anywhere, when it ends (now + max_runtime) no later than the reservation's start.
    A job without max_runtime never ends, so it may only use GPUs outside the reservation.
    When the earliest start is unknown (the head fits only once an allocation without `ends_at` ends), the
    reservation is every GPU of every node the head could use (any candidate): lower jobs may start only
    outside those nodes, whatever their max_runtime. Conservative on purpose: the head is never delayed by
    a job started after it. Jobs after the head that fit the free GPUs but not outside the reservation wait
    with "blocked behind job J (head of queue)". Only the head gets a reservation and an `earliest_start`;
    other waiting jobs have `earliest_start` None.

Performance: nodes are indexed per group (pool, GPU model, driver, labels) and, in each group, by free GPU count,
with a running count of nodes having at least k free GPUs, so a job that cannot fit is refused without
looking at nodes. A pass over 1000 nodes and 10,000 queued jobs takes a fraction of a second
(`bench/placement.py`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from operator import itemgetter

from ftconsole.scheduler.decide.placement_index import Catalog, FreeView, available, fit_job
from ftconsole.scheduler.decide.placement_inputs import Allocation as Allocation
from ftconsole.scheduler.decide.placement_inputs import Candidate as Candidate
from ftconsole.scheduler.decide.placement_inputs import ClusterState as ClusterState
from ftconsole.scheduler.decide.placement_inputs import Decision as Decision
from ftconsole.scheduler.decide.placement_inputs import JobRequest as JobRequest
from ftconsole.scheduler.decide.placement_inputs import NodeGpus as NodeGpus
from ftconsole.scheduler.decide.placement_inputs import NodeSlot as NodeSlot
from ftconsole.scheduler.decide.placement_inputs import Place as Place
from ftconsole.scheduler.decide.placement_inputs import Priority as Priority
from ftconsole.scheduler.decide.placement_inputs import Wait as Wait
from ftconsole.scheduler.decide.placement_inputs import WaitCause as WaitCause
from ftconsole.scheduler.decide.topology import Fabric

# --------------------------------------------------------------------------------------------- public API


def queue_key(job: JobRequest) -> tuple[int, bool, float, float, int, str]:
    """Sort key of the queue: priority desc, requeued first, fair share desc (all 1 without it), FIFO, id (in
    number order: job 10 after job 9, as an array's tasks, submitted at one time, start in index order)."""
    return (-job.priority, not job.requeued, -job.fairshare, job.submitted_at, len(job.id), job.id)


def queue_order(queue: Iterable[JobRequest]) -> list[JobRequest]:
    return sorted(queue, key=queue_key)


def plan(
    state: ClusterState,
    queue: Iterable[JobRequest],
    now: float,
    *,
    urgent_cap: Mapping[str, int] | int | None = None,
    allow_degraded: Collection[str] = (),
) -> list[Decision]:
    """One full placement pass: a decision for every queued job, in queue order."""
    return list(_decisions(state, queue, now, urgent_cap, allow_degraded))


def predict(
    state: ClusterState,
    queue: Iterable[JobRequest],
    job: JobRequest,
    now: float,
    *,
    urgent_cap: Mapping[str, int] | int | None = None,
    allow_degraded: Collection[str] = (),
) -> Decision:
    """What a pass would decide for `job` if it were queued now (replacing a queued job of the same id).

    A `Wait` comes back with `ahead`: the ids of the jobs that would still wait before it.
    """
    jobs = [queued for queued in queue if queued.id != job.id]
    jobs.append(job)
    ahead: list[str] = []
    for decision in _decisions(state, jobs, now, urgent_cap, allow_degraded):
        if decision.job_id == job.id:
            return replace(decision, ahead=tuple(ahead)) if isinstance(decision, Wait) else decision
        if isinstance(decision, Wait):
            ahead.append(decision.job_id)
    raise AssertionError("unreachable: the job is in the queue")


def _decisions(
    state: ClusterState,
    queue: Iterable[JobRequest],
    now: float,
    urgent_cap: Mapping[str, int] | int | None,
    allow_degraded: Collection[str],
) -> Iterator[Decision]:
    pass_ = _Pass(state, now, _UrgentCaps(urgent_cap, state.allocations), allow_degraded)
    for job in queue_order(queue):
        yield pass_.decide(job)


# --------------------------------------------------------------------------------------------- reservation


@dataclass(frozen=True, slots=True)
class _Reservation:
    """What the head will take and when; `start` None: unknown, and `gpus` is all it could use."""

    job_id: str
    start: float | None
    gpus: Mapping[str, frozenset[int]]


def _reserve(
    job: JobRequest, catalog: Catalog, view: FreeView, running: Iterable[Allocation], now: float
) -> _Reservation:
    """Release allocations in `ends_at` order until a candidate of the job fits: its earliest start."""
    fabric = catalog.fabric
    if fabric is not None and fabric.block_sizes and job.nodes > fabric.block_sizes[-1]:
        job = replace(job, nodes=max(fabric.block_sizes[-1], job.min_nodes or 1))  # an elastic job: what a group holds
    eligible = [frozenset(catalog.eligible(job, cand)) for cand in job.candidates]
    nodes: frozenset[str] = frozenset[str]().union(*eligible)
    free = {name: set(view.free[name]) for name in nodes}
    fitting = [
        sum(1 for name in el if len(free[name]) >= c.gpus_per_node)
        for el, c in zip(eligible, job.candidates, strict=True)
    ]
    releases = sorted(
        ((max(a.ends_at, now), a.node, a.gpus) for a in running if a.ends_at is not None and a.node in nodes),
        key=itemgetter(0),
    )
    for when, batch in groupby(releases, key=itemgetter(0)):
        for _, name, gpus in batch:
            _release(name, gpus, free, catalog, job.candidates, eligible, fitting)
        for index, cand in enumerate(job.candidates):
            if fitting[index] >= job.nodes:
                chosen = _choose_future(eligible[index], free, job.nodes, cand, catalog.fabric, job.segment)
                if chosen and _within_switches(job, chosen, catalog.fabric):
                    return _Reservation(job.id, when, chosen)
    if job.max_switches is not None and catalog.fabric is not None:  # no known time gives it its switches: it
        return _Reservation(job.id, None, {})  # holds no one back (it starts when a pass finds them free)
    everything = {name: frozenset(range(catalog.nodes[name].gpus_total)) for name in nodes}
    return _Reservation(job.id, None, everything)


def _release(
    name: str,
    gpus: Iterable[int],
    free: dict[str, set[int]],
    catalog: Catalog,
    candidates: Sequence[Candidate],
    eligible: Sequence[frozenset[str]],
    fitting: list[int],
) -> None:
    """Free the GPUs of an ended allocation in the simulated future; keep the per-candidate counts."""
    before = len(free[name])
    free[name].update(i for i in gpus if 0 <= i < catalog.nodes[name].gpus_total)
    after = len(free[name])
    for index, cand in enumerate(candidates):
        if before < cand.gpus_per_node <= after and name in eligible[index]:
            fitting[index] += 1


def _within_switches(job: JobRequest, nodes: Iterable[str], fabric: Fabric | None) -> bool:
    """Whether these nodes are under no more leaf switches than the job waits for (`topology.max_switches`)."""
    return job.max_switches is None or fabric is None or len(fabric.leaves(nodes)) <= job.max_switches


def _choose_future(
    eligible: Iterable[str],
    free: Mapping[str, set[int]],
    n: int,
    cand: Candidate,
    fabric: Fabric | None = None,
    segment: int | None = None,
) -> dict[str, frozenset[int]]:
    """The nodes and GPUs the job would take from `free`; empty where its segments (`segment`) do not fit."""
    g = cand.gpus_per_node
    names = sorted((name for name in eligible if len(free[name]) >= g), key=lambda name: (len(free[name]), name))
    if segment is not None:
        chosen = [] if fabric is None else fabric.segments(names, n, segment) or []
    elif fabric is None or n == 1:
        chosen = names[:n]
    else:  # within a group of blocks, where the fabric has block_sizes: else none
        picked = fabric.choose(names, n)
        chosen = picked if picked is not None else [] if fabric.block_sizes else names[:n]
    return {name: frozenset(sorted(free[name])[:g]) for name in chosen}


# --------------------------------------------------------------------------------------------- urgent cap


class _UrgentCaps:
    """Slots of the per-project urgent cap, taken by running urgent jobs, then queued ones in queue order."""

    def __init__(self, cap: Mapping[str, int] | int | None, allocations: Iterable[Allocation]) -> None:
        self.cap = cap
        running = {(a.job_id, a.project) for a in allocations if a.priority is Priority.URGENT}
        self.used: dict[str, int] = {}
        for _, project in running:
            self.used[project] = self.used.get(project, 0) + 1

    def limit(self, project: str) -> int | None:
        if self.cap is None or isinstance(self.cap, int):
            return self.cap
        return self.cap.get(project)

    def refuse(self, job: JobRequest) -> str | None:
        """None when the job may go on (and then it takes a slot), else the reason it waits."""
        if job.priority is not Priority.URGENT:
            return None
        limit = self.limit(job.project)
        if limit is None:
            return None
        used = self.used.get(job.project, 0)
        if used >= limit:
            return f"urgent cap of project {job.project} reached ({used}/{limit})"
        self.used[job.project] = used + 1
        return None


# --------------------------------------------------------------------------------------------- reasons


def _clock(t: float) -> str:
    return time.strftime("%H:%M", time.localtime(t))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _shape(job: JobRequest, cand: Candidate) -> str:
    """'2 nodes with 8 free H100 GPUs in pool x'."""
    model = f"{cand.gpu_model} " if cand.gpu_model else ""
    gpus = "GPU" if cand.gpus_per_node == 1 else "GPUs"
    text = f"{_plural(job.nodes, 'node')} with {cand.gpus_per_node} free {model}{gpus}"
    if job.min_nodes is not None and job.min_nodes < job.nodes:
        text = f"{_plural(job.nodes, 'node')} (at least {job.min_nodes}) with {cand.gpus_per_node} free {model}{gpus}"
    if job.pool is not None:
        text += f" in pool {job.pool}"
    if job.driver_version is not None:
        text += f" with driver {job.driver_version}"
    if job.labels:
        text += f" labelled {','.join(sorted(job.labels))}"
    if job.image:
        text += " whose container runtime can run its image with GPUs"
    if job.node_names is not None:
        text += f" among {_names(job.node_names)}"
    return text


def _names(names: Collection[str], most: int = 4) -> str:
    if not names:
        return "none (no node left to it)"
    shown = sorted(names)
    text = ",".join(shown[:most])
    return text + f",... ({len(shown)} nodes)" if len(shown) > most else text


# --------------------------------------------------------------------------------------------- the pass


class _Pass:
    """The state of one placement pass; `decide` is called for each job in queue order."""

    def __init__(self, state: ClusterState, now: float, caps: _UrgentCaps, allow_degraded: Collection[str]) -> None:
        self.now = now
        self.caps = caps
        self.catalog = Catalog(state.nodes, allow_degraded, state.fabric)
        self.view = FreeView.current(self.catalog, state.allocations)
        self.running = list(state.allocations)
        self.reservation: _Reservation | None = None
        self.outside: FreeView | None = None  # the free GPUs outside the reservation
        self.waiting = 0

    def decide(self, job: JobRequest) -> Decision:
        if job.max_switches is not None and job.switches_until is not None and self.now >= job.switches_until:
            job = replace(job, max_switches=None)  # it waited its `topology.wait`: what is free now
        refusal = self.caps.refuse(job)
        if refusal is not None:
            return self._wait(job, refusal, WaitCause.URGENT_CAP)
        least = job.min_nodes or job.nodes
        if not any(self.catalog.can_ever_fit(job, c) >= least for c in job.candidates):
            return self._wait(job, self._too_few_nodes(job), WaitCause.TOO_FEW_NODES)
        if (never := self._never_within_switches(job, least) or self._never_in_segments(job)) is not None:
            return self._wait(job, never, WaitCause.TOO_FEW_NODES)
        view = self._view_for(job)
        fit = fit_job(job, self.catalog, view)
        for smaller in range(job.nodes - 1, least - 1, -1):  # elastic: the most nodes it can have now
            if fit is not None:
                break
            fit = fit_job(replace(job, nodes=smaller), self.catalog, view)
        if fit is not None:
            return self._place(job, *fit)
        if self.reservation is None:
            return self._block_head(job)
        if self._fits_now(job):
            return self._wait(job, f"blocked behind job {self.reservation.job_id} (head of queue)", WaitCause.BLOCKED)
        return self._wait(job, self._needs(job), WaitCause.CAPACITY)

    def _never_within_switches(self, job: JobRequest, least: int) -> str | None:
        """Why no placement could ever meet the job's `topology.max_switches` (the fullest leaves of the nodes that
        could hold it, even empty, hold too few), or None."""
        fabric, most = self.catalog.fabric, job.max_switches
        if fabric is None or most is None:
            return None
        if any(fabric.fullest(self.catalog.eligible(job, c), least, most) is not None for c in job.candidates):
            return None
        switches = _plural(most, "leaf switch").replace("switchs", "switches")
        until = "" if job.switches_until is None else f", until {_clock(job.switches_until)}"
        return (f"needs {_plural(least, 'node')} under at most {switches} (topology.max_switches{until}), and no "
                f"{switches} of the fabric hold that many nodes that could hold it")  # fmt: skip

    def _never_in_segments(self, job: JobRequest) -> str | None:
        """Why the job's `topology.segment` could never be met (no blocks, or too few nodes in them even empty)."""
        fabric, size = self.catalog.fabric, job.segment
        if size is None:
            return None
        groups = f"{job.nodes // size} groups of {_plural(size, 'node')}, each inside one block (topology.segment)"
        if fabric is None or not fabric.block_of:
            return f"needs {groups}, and the cluster has no blocks (topology.blocks, or topology.discover)"
        if any(fabric.segments(sorted(self.catalog.eligible(job, c)), job.nodes, size) for c in job.candidates):
            return None
        return f"needs {groups}, and the blocks do not hold that many nodes that could hold it"

    def _never_in_groups(self, job: JobRequest) -> str | None:
        """Why no group of blocks could ever hold the job (`topology.block_sizes`): the nodes that could hold it,
        even empty, are spread over the groups (nodes down, or of another spec), or no blocks are known yet."""
        fabric, least = self.catalog.fabric, job.min_nodes or job.nodes
        if fabric is None or not fabric.block_sizes or least < 2 or job.segment is not None:
            return None  # segments: `_never_in_segments`, whose choice stays inside one group as well
        if any(fabric.choose(sorted(self.catalog.eligible(job, c)), least) is not None for c in job.candidates):
            return None
        inside = f"inside one group of blocks of at most {fabric.block_sizes[-1]} nodes (topology.block_sizes)"
        if not fabric.block_order:
            return f"needs {_plural(least, 'node')} {inside}, and no blocks are known (yet: topology.discover)"
        return f"needs {_plural(least, 'node')} {inside}, and no group holds that many nodes that could hold it"

    def _view_for(self, job: JobRequest) -> FreeView:
        """All free GPUs, or those outside the reservation for a job that would still run at its start."""
        if self.reservation is None or self.outside is None:
            return self.view
        start = self.reservation.start
        if start is not None and job.max_runtime is not None and self.now + job.max_runtime <= start:
            return self.view
        return self.outside

    def _fits_now(self, job: JobRequest) -> bool:
        return any(available(job, c, self.catalog, self.view) >= job.nodes for c in job.candidates)

    def _place(self, job: JobRequest, index: int, nodes: tuple[NodeGpus, ...]) -> Place:
        for name, gpus in nodes:
            self.view.take(name, gpus)
            if self.outside is not None:
                self.outside.take(name, gpus)
        if self.reservation is None:  # the head's reservation will need to know when these end
            ends_at = None if job.max_runtime is None else self.now + job.max_runtime
            self.running.extend(Allocation(job.id, name, gpus, ends_at) for name, gpus in nodes)
        return Place(job.id, index, nodes)

    def _block_head(self, job: JobRequest) -> Wait:
        # asked of the head alone (once a pass, not of every job of the queue): a head no group of blocks could ever
        # hold waits alone, holding no one back
        if (never := self._never_in_groups(job)) is not None:
            return self._wait(job, never, WaitCause.TOO_FEW_NODES)
        self.reservation = _reserve(job, self.catalog, self.view, self.running, self.now)
        self.outside = self.view.without(self.reservation.gpus)
        return self._wait(job, self._needs(job), WaitCause.CAPACITY, self.reservation.start)

    def _wait(self, job: JobRequest, reason: str, cause: WaitCause, earliest_start: float | None = None) -> Wait:
        self.waiting += 1
        return Wait(job.id, reason, self.waiting, earliest_start, cause)

    def _needs(self, job: JobRequest) -> str:
        parts = [f"{_shape(job, c)}; {available(job, c, self.catalog, self.view)} available" for c in job.candidates]
        text = "needs " + ", or ".join(parts)
        if job.max_switches is not None and self.catalog.fabric is not None:
            switches = _plural(job.max_switches, "leaf switch").replace("switchs", "switches")
            text += f", under at most {switches} (topology.max_switches"
            text += ")" if job.switches_until is None else f", waited for until {_clock(job.switches_until)})"
        if job.segment is not None:
            text += f", in groups of {_plural(job.segment, 'node')} each inside one block (topology.segment)"
        fabric = self.catalog.fabric
        if fabric is not None and fabric.block_sizes and job.nodes > 1:
            text += f", inside one group of blocks of at most {fabric.block_sizes[-1]} nodes (topology.block_sizes)"
        return text

    def _too_few_nodes(self, job: JobRequest) -> str:
        parts = [
            f"{_shape(job, c)}; only {_plural(self.catalog.can_ever_fit(job, c), 'usable node')} can hold it"
            for c in job.candidates
        ]
        return "needs " + ", or ".join(parts)
