"""How much of the queue one placement pass looks at (Slurm's `default_queue_depth`). Pure.

A pass orders the queued jobs by the queue's own key (priority, requeued first, fair share, submit time, id:
`placement.queue_key`), read off each job's record with no request built, and walks them in that order. On the
way it meets the quotas and the arrays' limits (`quotas.Gate`, `arrays.Gate`): a job past one waits and says
why, holding no one back. It stops once `depth` jobs are taken: those are planned (placed, or ranked with a
reason and a position); the jobs after them wait for a later pass, told so, and cost nothing more.

An array's queued tasks are alike (one spec, one owner, one priority): once one of them is past a quota or its
array's limit, the tasks after it are too, for the same reason, and are not weighed again. So a deep queue of
arrays costs a pass one look per task at most, and the work of a placement decision for `depth` jobs only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ftconsole.scheduler.decide import arrays, quotas
from ftconsole.scheduler.decide.jobs import Job
from ftconsole.scheduler.decide.placement import Priority


def beyond(depth: int) -> str:
    """What a queued job past the depth says of why it waits."""
    return (
        f"waiting: behind the first {depth:,} jobs of the queue, which each pass considers first "
        "(scheduler.queue_depth)"
    )


_PRIORITIES: dict[str, int] = {}


def alike(job: Job) -> tuple[int, str, int, int] | None:
    """What the queued tasks of one array that wait alike share (None: no array's task)."""
    return None if job.array_id is None else (job.array_id, job.priority, job.requeued, job.size)


def order(queued: Sequence[Job], fair: Mapping[tuple[str, str], float]) -> list[list[Job]]:
    """The queue in the order placement takes it (`placement.queue_key` of each job's request, from the record;
    `fair`: (project, user) -> its fair-share value, absent: 1), in runs of an array's tasks alike (`alike`):
    one list per run, a job of no array alone."""

    def key(job: Job) -> tuple[int, bool, float, float, int]:
        level = _PRIORITIES.get(job.priority)
        if level is None:
            level = _PRIORITIES[job.priority] = int(Priority.parse(job.priority))
        return (-level, not job.requeued, -fair.get((job.project, job.owner), 1.0), job.submitted, job.id)

    runs: list[list[Job]] = []
    last: tuple[int, str, int, int] | None = None
    for job in sorted(queued, key=key):
        this = alike(job)
        if this is not None and this == last:
            runs[-1].append(job)
        else:
            runs.append([job])
        last = this
    return runs


@dataclass
class Walk:
    """What a pass takes of the queue."""

    taken: list[Job] = field(default_factory=list)  # planned this pass, in queue order
    held: list[tuple[Job, str]] = field(default_factory=list)  # past a quota or an array's limit, and why
    beyond: list[Job] = field(default_factory=list)  # after the depth: not looked at


def walk(
    ordered: Sequence[Sequence[Job]],
    depth: int,
    *,
    gpus: Callable[[Job], int | None],
    quota: quotas.Gate | None = None,
    limit: Callable[[Job], int | None] = lambda job: None,
    array_gate: arrays.Gate | None = None,
    counts: Callable[[Job], bool] = lambda job: True,
) -> Walk:
    """The first `depth` jobs of `ordered` (queue order, as `order` gives it) that no quota or array limit holds
    back, the held ones on the way, and the rest.

    `gpus`: what a job holds once started (None: no request can be made of it: it is taken, and planning it says
    why); `limit`: its array's most tasks at once (None: none); `counts`: whether it counts towards the depth and
    the quotas (False: it waits for something else, such as its reservation's start, and planning says so)."""
    out = Walk()
    kept_back: dict[tuple[int, str, int, int], str] = {}  # an array's tasks alike -> why they wait
    counted = 0
    for run in ordered:
        if counted >= depth:
            out.beyond.extend(run)
            continue
        same = alike(run[0])
        if same is not None and (why := kept_back.get(same)) is not None:
            out.held.extend((job, why) for job in run)
            continue
        for i, job in enumerate(run):
            if counted >= depth:
                out.beyond.extend(run[i:])
                break
            if not counts(job) or (held := gpus(job)) is None:
                out.taken.append(job)  # planned so that it says why it waits; it takes no quota and no slot
                continue
            why = None
            if quota is not None:
                why = quota.hold(quotas.Queued(str(job.id), job.project, job.owner, held))
            if why is None and array_gate is not None and job.array_id is not None:
                why = array_gate.hold(arrays.Task(str(job.id), job.array_id, limit(job)))
            if why is not None:
                if same is None:
                    out.held.append((job, why))
                    continue
                out.held.extend((task, why) for task in run[i:])  # the tasks after it wait alike
                kept_back[same] = why
                break
            out.taken.append(job)
            counted += 1
    return out
