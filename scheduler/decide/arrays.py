"""Job arrays (spec/arrayspec.py): the throttle, and what a listing says of an array. Pure.

The throttle (`hold_back`): walking the queue in its order, the tasks of an array past its limit (its running
tasks and those placed ahead of them this pass) wait, holding no other job back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def summary(statuses: Iterable[str]) -> str:
    """'running 3, queued 15, succeeded 2': how many tasks are in each status, in the order of a job's life."""
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    order = ["queued", "running", "succeeded", "error", "stopped", "expired"]
    shown = sorted(counts, key=lambda s: order.index(s) if s in order else len(order))
    return ", ".join(f"{s} {counts[s]}" for s in shown)


@dataclass(frozen=True, slots=True)
class Task:
    """A queued task as the throttle sees it."""

    job_id: str
    array_id: int
    limit: int | None


class Gate:
    """The arrays' limits as a placement pass meets the queue, one task at a time in queue order: `running`
    (array id -> its running tasks) and the tasks ahead take the slots first."""

    def __init__(self, running: Mapping[int, int]) -> None:
        self.running = running
        self.taken = dict(running)

    def hold(self, task: Task) -> str | None:
        if task.limit is None:
            return None
        used = self.taken.get(task.array_id, 0)
        if used >= task.limit:
            return (
                f"array {task.array_id} runs at most {task.limit} task{'s' if task.limit > 1 else ''} at once "
                f"({self.running.get(task.array_id, 0)} running)"
            )
        self.taken[task.array_id] = used + 1
        return None


def hold_back(queue: Sequence[Task], running: Mapping[int, int]) -> dict[str, str]:
    """Job id -> why it waits, for the queued tasks (`queue`, in queue order) that their array's limit holds back:
    `running` (array id -> its running tasks) and the tasks ahead of them in the queue take the slots first."""
    gate = Gate(running)
    return {task.job_id: why for task in queue if (why := gate.hold(task)) is not None}
