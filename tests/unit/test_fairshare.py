"""Fair share (decide/fairshare.py): the decayed usage, the factors, the queue's order, and the config's rules;
what a job counts under with and without declared projects (issue 40)."""

from __future__ import annotations

import math

import pytest

from ftconsole.scheduler.decide import fairshare
from ftconsole.scheduler.decide.fairshare import Factor, account, decayed_seconds, factors, usage
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.placement import queue_order
from ftconsole.scheduler.decide.placement_inputs import Candidate, JobRequest, Priority
from ftconsole.scheduler.spec.jobspec import parse_jobspec

HOUR = 3600.0
SPEC = parse_jobspec("name: t\ncommand: x\n")


def job(job_id: int, owner: str, project: str) -> Job:
    return Job(job_id, "t", owner, 1000, SPEC, JobStatus.SUCCEEDED, "normal", project, "none", 0.0)


def run(job_id: int, gpus: int, started: float, ended: float | None) -> Run:
    return Run(job_id, 1, 0, "gpu01", tuple(range(gpus)), "~/r", True, started=started, ended=ended)


def test_a_second_used_a_half_life_ago_counts_a_half() -> None:
    assert decayed_seconds(0, 1, now=1, half_life=HOUR) == pytest.approx(1, rel=1e-3)
    assert decayed_seconds(0, 1, now=1 + HOUR, half_life=HOUR) == pytest.approx(0.5, rel=1e-3)
    # an hour used, ending now, with a half-life of an hour: the integral of 2^(-t/h) over one h = h / (2 ln 2)
    assert decayed_seconds(0, HOUR, now=HOUR, half_life=HOUR) == pytest.approx(HOUR / (2 * math.log(2)))
    assert decayed_seconds(5, 5, now=9, half_life=HOUR) == 0


def test_usage_per_project_and_user_running_runs_to_now_old_ones_left_out() -> None:
    jobs = {1: job(1, "ann", "vision"), 2: job(2, "bob", "vision"), 3: job(3, "ann", "speech")}
    now = 100 * HOUR
    runs = [run(1, 2, now - 10, now), run(2, 1, now - 10, None), run(3, 8, 0, 1)]  # job 3: 100 half-lives ago
    used = usage(jobs, runs, now, half_life=HOUR, declared={"vision", "speech"})
    assert set(used) == {("vision", "ann"), ("vision", "bob")}
    assert used[("vision", "ann")] == pytest.approx(20, rel=1e-2) and used[("vision", "bob")] == pytest.approx(
        10, rel=1e-2
    )


def test_factors() -> None:
    none = factors({}, [("vision", "ann"), ("speech", "bob")], {}, 1.0)
    assert none == {("vision", "ann"): Factor(1.0, 0.0, 0.0), ("speech", "bob"): Factor(1.0, 0.0, 0.0)}
    # vision used everything, with half of the shares: twice its share; speech nothing
    used = {("vision", "ann"): 100.0}
    got = factors(used, [("vision", "ann"), ("speech", "bob")], {}, 1.0)
    assert got[("vision", "ann")] == Factor(2.0**-2 * 2.0**-1, 2.0, 1.0) and got[("speech", "bob")].value == 1.0
    # with three times the shares of speech, vision used 4/3 of its share
    weighted = factors(used, [("vision", "ann"), ("speech", "bob")], {"vision": 3}, 1.0)
    assert weighted[("vision", "ann")].project_ratio == pytest.approx(4 / 3)
    # within vision: ann used it all, bob nothing: bob goes first
    two = factors(used, [("vision", "ann"), ("vision", "bob")], {}, 1.0)
    assert two[("vision", "bob")].value > two[("vision", "ann")].value and two[("vision", "ann")].user_ratio == 2.0
    assert got[("vision", "ann")].describe("vision", "ann") == "fair share 0.12: project vision used 2.0x its share"
    assert two[("vision", "ann")].describe("vision", "ann").endswith("used 1.0x its share, ann 2.0x theirs in it")
    assert none[("vision", "ann")].describe("vision", "ann") == "fair share 1.00"


@pytest.mark.parametrize(
    ("project", "declared", "expected"),
    [
        ("vision", {"vision", "speech"}, ("vision", "ann")),  # declared: its own project
        ("default", {"vision"}, ("default", "ann")),
        ("fresh", {"vision"}, ("default", "ann")),  # queued before projects were declared: no project of its own
        ("vision", set(), ("default", "ann")),  # none declared: a label; every job counts per user
        ("fresh", set(), ("default", "ann")),
        ("default", set(), ("default", "ann")),
    ],
)
def test_a_job_counts_under_its_project_only_where_it_is_declared(
    project: str, declared: set[str], expected: tuple[str, str]
) -> None:
    assert account(project, "ann", declared) == expected


def test_without_declared_projects_usage_and_factors_are_per_user_whatever_project_a_job_names() -> None:
    jobs = {1: job(1, "ann", "vision"), 2: job(2, "bob", "speech"), 3: job(3, "bob", "fresh")}
    runs = [run(1, 1, 0, 100), run(2, 3, 0, 100), run(3, 2, 0, 100)]
    used = usage(jobs, runs, 100, half_life=1e9, declared=())
    assert used == {("default", "ann"): pytest.approx(100, rel=1e-3), ("default", "bob"): pytest.approx(500, rel=1e-3)}
    # bob names a fresh project: today's two levels would give it the top factor (a project with no usage)
    wanted = [account(p, u, ()) for p, u in [("vision", "ann"), ("brand-new", "bob"), ("speech", "bob")]]
    got = factors(used, wanted, {}, 1.0, by_user=True)
    assert set(got) == {("default", "ann"), ("default", "bob")}  # one key per user, whatever project was named
    ann, bob = got[("default", "ann")], got[("default", "bob")]
    # two users: an equal share is a half; ann used 1/6 of it all (ratio 1/3), bob 5/6 (ratio 5/3)
    assert (ann.user_ratio, bob.user_ratio) == (pytest.approx(1 / 3), pytest.approx(5 / 3))
    assert bob.value == pytest.approx(2.0 ** (-5 / 3)) and ann.value > bob.value and ann.project_ratio == 0.0
    assert bob.describe("default", "bob") == "fair share 0.31: bob used 1.7x their share"
    assert factors({}, [("default", "cy")], {}, 1.0, by_user=True)[("default", "cy")] == Factor(1.0, 0.0, 0.0, True)
    assert factors({}, [("default", "cy")], {}, 1.0, by_user=True)[("default", "cy")].describe("default", "cy") == (
        "fair share 1.00"
    )


def request(job_id: str, submitted: float, fair: float, priority: Priority = Priority.NORMAL) -> JobRequest:
    return JobRequest(id=job_id, submitted_at=submitted, fairshare=fair, priority=priority,
                      candidates=(Candidate(spec_name=None, gpus_per_node=1),))  # fmt: skip


def test_the_queue_orders_a_level_by_fair_share_then_age() -> None:
    queue = [request("old-heavy", 1, 0.1), request("new-light", 2, 0.9), request("urgent", 3, 0.01, Priority.URGENT),
             request("same-a", 4, 0.5), request("same-b", 3, 0.5)]  # fmt: skip
    assert [j.id for j in queue_order(queue)] == ["urgent", "new-light", "same-b", "same-a", "old-heavy"]


def test_standing_gives_each_account_its_due_its_use_and_its_factor() -> None:
    used = {("vision", "ann"): 3 * 3600.0, ("vision", "bob"): 1 * 3600.0, ("nlp", "cy"): 0.0}
    rows = {(r.project, r.user): r for r in fairshare.standing(used, [("nlp", "dee")], {"vision": 3.0}, 1.0)}
    assert set(rows) == {("vision", "ann"), ("vision", "bob"), ("nlp", "cy"), ("nlp", "dee")}
    # vision is due 3/4 of the cluster, split between its two users; nlp 1/4 between its two
    assert rows[("vision", "ann")].share == pytest.approx(0.375) and rows[("nlp", "dee")].share == pytest.approx(0.125)
    assert rows[("vision", "ann")].usage == pytest.approx(0.75) and rows[("vision", "ann")].seconds == 3 * 3600.0
    assert rows[("nlp", "dee")].factor.value == 1.0  # nothing used
    assert (
        rows[("vision", "ann")].factor
        == fairshare.factors(used, [("vision", "ann")], {"vision": 3.0}, 1.0)[("vision", "ann")]
    )  # the factor the queue weighs
    doc = rows[("vision", "ann")].to_json()
    assert doc["gpu_hours"] == 3.0 and doc["text"].startswith("fair share ")


def test_standing_per_user_splits_the_cluster_equally() -> None:
    d = fairshare.DEFAULT_PROJECT
    rows = fairshare.standing({(d, "ann"): 100.0}, [(d, "bob"), (d, "cy")], {}, 1.0, by_user=True)
    assert [(r.user, round(r.share, 3), r.usage) for r in rows] == [("ann", 0.333, 1.0), ("bob", 0.333, 0.0),
                                                                     ("cy", 0.333, 0.0)]  # fmt: skip
    assert rows[0].factor.by_user and rows[1].factor.value == 1.0
