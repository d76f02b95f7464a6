"""Expected starts (Slurm's `squeue --start`): when each queued job would start, and on which nodes, if every
running job ran until its `max_runtime` and nothing else were submitted, stopped or failed. Pure.

It runs the placement passes themselves (decide/placement.py: queue order, best fit, the head's reservation and
backfill, the urgent cap) forward in time. The first pass is at `now`; each next one is at the next time an
allocation ends: a running job's, a debug hold's, a node test's, or one of a job started earlier in the
forecast. What a pass places starts then and ends `max_runtime` later. So the forecast is what the scheduler
itself would do, not a second model of it that could disagree.

A job that waits for its `begin:` time joins the queue then (`arrivals`): a pass is made at that time too.

A job without `max_runtime` never ends: a queued job that needs its GPUs has no expected start (`None`, as
Slurm's N/A), and neither has a job that can never fit the usable nodes or stays past the urgent cap.

Bounded: at most `passes` passes, over at most `horizon` seconds. Ends close together are taken in one pass, at
the last of them: those within `resolution` of the first, or within a twentieth of how far ahead it is (so a start
expected in 10 hours may be up to 30 minutes later than the exact one, and one in a minute, a minute). Preemption is
not foreseen: an urgent job that would preempt is shown starting when GPUs free up.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from ftconsole.scheduler.decide.placement import Allocation, ClusterState, JobRequest, Place, plan

HORIZON_S = 7 * 86400.0  # a week ahead at most
PASSES = 128
RESOLUTION_S = 60.0


@dataclass(frozen=True, slots=True)
class Expected:
    """A queued job's expected start, end (None: no max_runtime) and nodes; `start` None: not known, and
    `reason` is why it still waited at the last pass (placement's words)."""

    job_id: str
    start: float | None
    end: float | None = None
    nodes: tuple[str, ...] = ()
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "nodes": list(self.nodes)}


@dataclass(frozen=True, slots=True)
class Forecast:
    """Every job of the queue given, in queue order as first planned; `until`: the time the forecast reached
    (the last pass's), `complete`: every job placed, or nothing left to end that could place one."""

    jobs: tuple[Expected, ...]
    until: float
    complete: bool


def forecast(
    state: ClusterState,
    queue: Iterable[JobRequest],
    now: float,
    *,
    urgent_cap: Mapping[str, int] | int | None = None,
    allow_degraded: Collection[str] = (),
    horizon: float = HORIZON_S,
    passes: int = PASSES,
    resolution: float = RESOLUTION_S,
    arrivals: Mapping[str, float] | None = None,
) -> Forecast:
    """`arrivals`: the jobs of `queue` that join it later (their `begin:` time), by id: planned from then on."""
    queue = list(queue)
    requests = {job.id: job for job in queue}
    later = {i: t for i, t in (arrivals or {}).items() if t > now and i in requests}
    waiting = [job for job in queue if job.id not in later]
    pending = sorted(later, key=lambda i: (later[i], i))  # by when they join
    joined = 0  # of `pending`
    # one past its time limit is being stopped: it ends now, after the first pass (the scheduler's own)
    allocations = [a if a.ends_at is None or a.ends_at > now else replace(a, ends_at=now) for a in state.allocations]
    found: dict[str, Expected] = {}
    reasons: dict[str, str] = {}  # why each job still waited at the last pass
    order: list[str] = []
    when = now
    complete = False
    for count in range(passes):
        while joined < len(pending) and later[pending[joined]] <= when:
            waiting.append(requests[pending[joined]])
            joined += 1
        live = tuple(a for a in allocations if a.ends_at is None or a.ends_at > when or count == 0)
        decisions = plan(
            ClusterState(state.nodes, live, state.fabric),
            waiting,
            when,
            urgent_cap=urgent_cap,
            allow_degraded=allow_degraded,
        )
        if count == 0:
            order = [d.job_id for d in decisions] + pending
        for decision in decisions:
            if not isinstance(decision, Place):
                reasons[decision.job_id] = decision.reason
                continue
            job = requests[decision.job_id]
            end = None if job.max_runtime is None else when + job.max_runtime
            found[job.id] = Expected(job.id, when, end, tuple(name for name, _ in decision.nodes))
            allocations.extend(
                Allocation(job.id, name, gpus, end, job.project, job.priority) for name, gpus in decision.nodes
            )
        waiting = [job for job in waiting if job.id not in found]
        ends = sorted({a.ends_at for a in allocations if a.ends_at is not None and (a.ends_at > when or count == 0)}
                      | {later[i] for i in pending[joined:]})  # fmt: skip
        if (not waiting and joined == len(pending)) or not ends:
            complete = True
            break
        # ends close together are one pass: within `resolution`, or a twentieth of how far ahead they are
        within = max(resolution, (ends[0] - now) / 20)
        following = max(end for end in ends if end <= ends[0] + within)
        if following > now + horizon:
            complete = False
            break
        allocations = [a for a in allocations if a.ends_at is None or a.ends_at > when]
        when = following
    jobs = tuple(found.get(job_id) or Expected(job_id, None, reason=reasons.get(job_id, "")) for job_id in order)
    return Forecast(jobs, when, complete)
