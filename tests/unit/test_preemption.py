"""Preemption (decide/preemption.py): who a waiting job of a higher level stops, and who it never stops."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.decide import placement
from ftconsole.scheduler.decide.placement import Allocation, Candidate, ClusterState, JobRequest, NodeSlot, Priority
from ftconsole.scheduler.decide.preemption import Preempt, Running, choose

NOW = 10_000.0
N, U, V = Priority.NORMAL, Priority.URGENT, Priority.VERY_URGENT


def cluster(*held: tuple[str, str, tuple[int, ...]], nodes: int = 2, gpus: int = 4) -> ClusterState:
    """`nodes` nodes of `gpus` GPUs; `held`: (job, node, GPUs) running."""
    slots = tuple(NodeSlot(f"n{i}", "default", "H100", "550", gpus) for i in range(1, nodes + 1))
    return ClusterState(slots, tuple(Allocation(job, node, gpus) for job, node, gpus in held))


def wanting(job: str, gpus: int, *, nodes: int = 1, priority: Priority = U, min_nodes: int | None = None) -> JobRequest:
    return JobRequest(id=job, priority=priority, submitted_at=1.0, nodes=nodes, min_nodes=min_nodes,
                      candidates=(Candidate(None, gpus),))  # fmt: skip


def run(job: str, gpus: int, *, ran: float = 3600, priority: Priority = N, preemptible: bool = True,
        grace: float | None = None, stopping: bool = False) -> Running:  # fmt: skip
    return Running(job, priority, gpus, NOW - ran, preemptible, grace, stopping)


def preemptions(state: ClusterState, queue: list[JobRequest], running: list[Running], **kw: float) -> list[Preempt]:
    decisions = placement.plan(state, queue, NOW)
    return choose(state, queue, decisions, {r.job_id: r for r in running}, NOW,
                  min_runtime=kw.get("min_runtime", 600))  # fmt: skip


FULL = cluster(("1", "n1", (0, 1)), ("2", "n1", (2, 3)), ("3", "n2", (0, 1, 2, 3)))


@pytest.mark.parametrize(
    ("running", "queue", "expected"),
    [
        # the fewest GPU-seconds lost: two 2-GPU jobs of an hour (14,400) rather than the 4-GPU one of two (28,800)
        ([run("1", 2), run("2", 2), run("3", 4, ran=7200)], [wanting("9", 4)], [Preempt("9", ("1", "2"), (), 14400)]),
        # one of them is enough for 2 GPUs: the younger one
        ([run("1", 2, ran=900), run("2", 2), run("3", 4)], [wanting("9", 2)], [Preempt("9", ("1",), (), 1800)]),
        # a job that saves a checkpoint loses only its grace period: the old one that checkpoints goes
        (
            [run("1", 2), run("2", 2), run("3", 4, ran=86400, grace=60)],
            [wanting("9", 4)],
            [Preempt("9", ("3",), (), 240)],
        ),
        # greedy, then pruned: the small one taken first is not needed once the big one is
        ([run("1", 2, ran=600), run("3", 4, ran=700)], [wanting("9", 4)], [Preempt("9", ("3",), (), 2800)]),
        # too young (preempt_min_runtime), not preemptible, or not of a lower level: never
        ([run("1", 2, ran=599), run("2", 2, preemptible=False), run("3", 4, priority=U)], [wanting("9", 2)], []),
        # a very-urgent job preempts urgent and normal ones
        (
            [run("1", 2, priority=U), run("2", 2, priority=U), run("3", 4, ran=7200)],
            [wanting("9", 4, priority=V)],
            [Preempt("9", ("1", "2"), (), 14400)],
        ),
        # a normal job preempts no one
        ([run("1", 2), run("2", 2), run("3", 4)], [wanting("9", 2, priority=N)], []),
        # even every preemptible job would not make room: no one is stopped
        ([run("1", 2), run("2", 2)], [wanting("9", 4, nodes=2)], []),
        # an elastic job preempts for its min_nodes, not more
        (
            [run("1", 2), run("2", 2), run("3", 4, ran=7200)],
            [wanting("9", 4, nodes=2, min_nodes=1)],
            [Preempt("9", ("1", "2"), (), 14400)],
        ),
    ],
)
def test_who_is_preempted(running: list[Running], queue: list[JobRequest], expected: list[Preempt]) -> None:
    assert preemptions(FULL, queue, running) == expected


def test_jobs_being_preempted_count_as_free_and_are_claimed_once() -> None:
    running = [run("1", 2, stopping=True), run("2", 2, stopping=True), run("3", 4, ran=7200)]
    # the first waiting job fits once 1 and 2 are down: no new victim; the second one needs job 3
    queue = [wanting("8", 4), wanting("9", 4)]
    assert preemptions(FULL, queue, running) == [Preempt("8", (), ("1", "2")), Preempt("9", ("3",), (), 28800)]


def test_a_job_placed_in_the_same_pass_is_not_counted_free_and_waits_for_no_one() -> None:
    state = cluster(("3", "n2", (0, 1, 2, 3)))  # n1 is free: job 8 takes it in this pass
    queue = [wanting("8", 4, priority=V), wanting("9", 4)]
    assert preemptions(state, queue, [run("3", 4)]) == [Preempt("9", ("3",), (), 14400)]
    assert preemptions(state, [wanting("8", 4)], [run("3", 4)]) == []  # it fits: it is placed, nobody stopped


def test_only_a_job_waiting_for_capacity_preempts() -> None:
    queue = [wanting("9", 8)]  # more GPUs than any node has: it can never start, and stops no one for that
    assert preemptions(FULL, queue, [run("1", 2), run("2", 2), run("3", 4)]) == []


def test_losses_are_the_gpus_times_the_run_or_the_grace_period() -> None:
    assert run("1", 4, ran=100).lost(NOW) == 400
    assert run("1", 4, ran=100, grace=30).lost(NOW) == 120
    assert Running("1", N, 4, NOW + 5).lost(NOW) == 0  # a clock a little ahead


def test_the_queue_order_decides_who_preempts_first_not_the_order_given() -> None:
    running = [run("1", 2), run("2", 2), run("3", 4, ran=7200)]
    queue = [wanting("7", 4), wanting("8", 4, priority=V)]  # 8 is very-urgent: it goes first, and takes the cheap
    assert preemptions(FULL, queue, running) == [Preempt("8", ("1", "2"), (), 14400), Preempt("7", ("3",), (), 28800)]


def test_many_victims_are_found_by_halving_and_the_fewest_losses_kept() -> None:
    slots = 16  # one GPU each: 16 one-GPU jobs on a 16-GPU node, ran 1..16 minutes
    held = tuple(("x" + str(i), "n1", (i,)) for i in range(slots))
    state = cluster(*held, nodes=1, gpus=slots)
    running = [Running("x" + str(i), N, 1, NOW - 60 * (i + 1), True) for i in range(slots)]
    (chosen,) = choose(state, [wanting("9", 5)], placement.plan(state, [wanting("9", 5)], NOW),
                       {r.job_id: r for r in running}, NOW, min_runtime=0)  # fmt: skip
    assert sorted(chosen.new) == ["x0", "x1", "x2", "x3", "x4"] and chosen.lost == 60 * (1 + 2 + 3 + 4 + 5)
