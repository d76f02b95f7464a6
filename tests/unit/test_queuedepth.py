"""How much of the queue a placement pass takes (decide/queuedepth.py): the depth, what does not count towards it,
and an array's waiting tasks weighed once."""

from __future__ import annotations

import dataclasses

from ftconsole.scheduler.decide import arrays, queuedepth, quotas
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.spec.jobspec import parse_jobspec

SPEC = parse_jobspec("name: t\ncommand: x\ngpus_per_node: 2\n")


def job(job_id: int, owner: str = "ann", *, priority: str = "normal", submitted: float = 0.0,
        array_id: int | None = None, requeued: bool = False) -> Job:  # fmt: skip
    return Job(job_id, "t", owner, 1000, SPEC, JobStatus.QUEUED, priority, "p", "none", submitted or float(job_id),
               requeued=requeued, array_id=array_id)  # fmt: skip


def flat(runs: list[list[Job]]) -> list[int]:
    return [j.id for run in runs for j in run]


def test_the_queue_in_its_order_in_runs_of_an_arrays_tasks() -> None:
    queued = [job(1), job(2, priority="urgent"), job(3, requeued=True), job(4, "bob"),
              *(job(i, submitted=0.5, array_id=10) for i in range(10, 14))]  # fmt: skip
    runs = queuedepth.order(queued, {("p", "bob"): 2.0})  # bob: a higher fair-share value, ahead within its level
    assert flat(runs) == [2, 3, 4, 10, 11, 12, 13, 1]
    assert [len(r) for r in runs] == [1, 1, 1, 4, 1]


def test_a_pass_takes_the_first_depth_jobs_and_leaves_the_rest() -> None:
    ordered = queuedepth.order([job(i) for i in range(1, 11)], {})
    walk = queuedepth.walk(ordered, 3, gpus=lambda j: 2)
    assert [j.id for j in walk.taken] == [1, 2, 3] and [j.id for j in walk.beyond] == list(range(4, 11))
    assert walk.held == []


def test_jobs_a_quota_holds_back_do_not_count_so_the_others_behind_them_are_taken() -> None:
    limits = {("user", "ann"): quotas.Limits(gpus=2)}
    gate = quotas.Gate(limits.get, {})
    ordered = queuedepth.order([*(job(i) for i in range(1, 6)), job(6, "bob"), job(7, "bob")], {})
    walk = queuedepth.walk(ordered, 3, gpus=lambda j: 2, quota=gate)
    assert [j.id for j in walk.taken] == [1, 6, 7]  # ann's first fits her quota; bob's are not hidden behind hers
    assert [j.id for j, _ in walk.held] == [2, 3, 4, 5]
    assert "user ann is at its quota of 2 GPUs" in walk.held[0][1]


def test_an_arrays_tasks_past_its_limit_are_weighed_once() -> None:
    weighed: list[int] = []

    def gpus(j: Job) -> int:
        weighed.append(j.id)
        return 2

    tasks = [job(i, submitted=0.5, array_id=100) for i in range(100, 10_100)]
    gate = arrays.Gate({100: 3})  # three tasks running already
    walk = queuedepth.walk(queuedepth.order([*tasks, job(5, "bob")], {}), 500, gpus=gpus,
                           limit=lambda j: 4 if j.array_id else None, array_gate=gate)  # fmt: skip
    assert [j.id for j in walk.taken] == [100, 5]  # one slot left for the array; bob's job is not hidden
    assert len(walk.held) == 9999 and {why for _, why in walk.held} == {
        "array 100 runs at most 4 tasks at once (3 running)"
    }
    assert weighed == [100, 101, 5]  # the task past the limit was weighed; the 9,998 after it were not


def test_a_job_that_waits_for_something_else_is_taken_without_counting() -> None:
    ordered = queuedepth.order([job(i) for i in range(1, 6)], {})
    walk = queuedepth.walk(ordered, 2, gpus=lambda j: 2, counts=lambda j: j.id not in (1, 2))
    assert [j.id for j in walk.taken] == [1, 2, 3, 4] and [j.id for j in walk.beyond] == [5]
    assert queuedepth.beyond(500).startswith("waiting: behind the first 500 jobs of the queue")


def test_a_pass_looks_at_the_jobs_past_the_depth_only_while_some_note_is_not_written() -> None:
    """Placer._beyond_notes: the jobs past the depth whose note is not the one past the depth; none looked for
    again while the queue's order (the same list: no job written since) and the count past the depth are those
    of a pass that found every note written. A new order of the same length is looked at again."""
    from tests.unit.test_quotas import placer  # a Placer of a config alone

    found = placer({})
    later = queuedepth.beyond(2)
    ordered = queuedepth.order([job(i) for i in range(1, 6)], {})
    found._order = ((), ordered)
    beyond = [j for run in ordered for j in run][2:]
    assert [j.id for j, note in found._beyond_notes(beyond, later)] == [3, 4, 5]
    noted = [dataclasses.replace(j, message=later) for j in beyond]
    assert found._beyond_notes(noted, later) == []  # every note written: quiet from now on
    assert found._beyond_notes(beyond, later) == []  # the same order and count: not looked at
    again = queuedepth.order([job(i) for i in range(1, 6)], {})  # a job written since: a new order
    found._order = ((), again)
    assert [j.id for j, _ in found._beyond_notes(beyond, later)] == [3, 4, 5]
