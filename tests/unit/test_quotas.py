"""Quotas (decide/quotas.py): which queued jobs a quota holds back, in queue order, and a submit's refusal; which
project limits apply with and without declared projects (issue 40)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ftconsole.scheduler.decide.quotas import InUse, Key, Limits, Queued, applies, hold_back, submit_refusal
from ftconsole.scheduler.placing import Placer
from ftconsole.scheduler.spec.config import ClusterConfig

LIMITS = {
    ("project", "vision"): Limits(gpus=8, running_jobs=3),
    ("project", "speech"): Limits(gpu_hours=100.0),
    ("user", "ann"): Limits(gpus=4),
    ("user", "bob"): Limits(queued_jobs=2),
}


def limits_of(key: tuple[str, str]) -> Limits | None:
    return LIMITS.get(key)


def test_the_jobs_ahead_count_as_started_and_a_smaller_one_behind_a_held_one_may_go() -> None:
    queue = [
        Queued("1", "vision", "bob", 4),
        Queued("2", "vision", "bob", 4),
        Queued("3", "vision", "bob", 4),  # 12 of 8 GPUs: held
        Queued("4", "vision", "bob", 0),  # no GPU: the third running job
        Queued("5", "vision", "bob", 0),  # a fourth: held
        Queued("6", "other", "bob", 64),  # no quota there
    ]
    assert hold_back(queue, limits_of, {}) == {
        "3": "project vision is at its quota of 8 GPUs (8 for jobs ahead of it)",
        "5": "project vision is at its quota of 3 running jobs (3 for jobs ahead of it)",
    }
    # 6 GPUs in use: no 4-GPU job fits, the jobs without GPUs do (2 more running jobs)
    busy = hold_back(queue, limits_of, {("project", "vision"): InUse(gpus=6, running_jobs=1)})
    assert busy == dict.fromkeys("123", "project vision is at its quota of 8 GPUs (6 in use)")
    full = hold_back(queue, limits_of, {("project", "vision"): InUse(running_jobs=2)})
    assert full["2"] == "project vision is at its quota of 3 running jobs (2 in use, 1 for jobs ahead of it)"


def test_a_user_quota_holds_a_job_of_any_project_and_gpu_hours_hold_every_job() -> None:
    queue = [Queued("1", "free", "ann", 4), Queued("2", "free", "ann", 1), Queued("3", "speech", "cy", 1)]
    assert hold_back(queue, limits_of, {("project", "speech"): InUse(gpu_hours=100.0)}) == {
        "2": "user ann is at its quota of 4 GPUs (4 for jobs ahead of it)",
        "3": "project speech used its quota of 100 GPU-hours (100.0)",
    }
    assert hold_back(queue, lambda key: None, {}) == {}


def test_a_submit_past_the_queued_quota_is_refused() -> None:
    assert submit_refusal("x", "bob", limits_of, {("user", "bob"): 1}) is None
    assert submit_refusal("x", "bob", limits_of, {("user", "bob"): 2}) == "user bob is at its quota of 2 queued jobs"
    assert submit_refusal("vision", "ann", limits_of, {("user", "ann"): 50}) is None  # no queued limit there


def test_an_arrays_tasks_count_one_each_against_the_queued_quota() -> None:
    assert submit_refusal("x", "bob", limits_of, {("user", "bob"): 0}, count=2) is None
    assert submit_refusal("x", "bob", limits_of, {("user", "bob"): 1}, count=2) == (
        "user bob has a quota of 2 queued jobs (1 queued now): the array's 2 tasks would pass it"
    )


@pytest.mark.parametrize(
    ("key", "declared", "expected"),
    [
        (("user", "ann"), set(), True),
        (("user", "ann"), {"vision"}, True),
        (("project", "vision"), {"vision"}, True),
        (("project", "fresh"), {"vision"}, False),  # queued before the projects were declared
        (("project", "vision"), set(), False),  # none declared: a label anyone may write holds no limit
        (("project", "default"), set(), False),
    ],
)
def test_project_limits_apply_to_declared_projects_only(key: Key, declared: set[str], expected: bool) -> None:
    assert applies(key, declared) is expected


def placer(config: dict[str, Any], set_by_admin: dict[Key, dict[str, Any]] | None = None) -> Placer:
    service = SimpleNamespace(store=None, config=ClusterConfig.model_validate(config), all_nodes=[])
    found = Placer(service, clock=lambda: 0.0, poke=lambda: None, fail=None, run_root=lambda: "~")  # type: ignore[arg-type]
    found._set_quotas = {k: (v, "root", 0.0) for k, v in (set_by_admin or {}).items()}
    return found


@pytest.mark.parametrize(
    ("config", "set_by_admin", "key", "expected"),
    [
        # declared: the config's limits, the default's for a declared project not named, an admin's over them
        ({"projects": {"vision": {}, "speech": {}}, "quotas": {"projects": {"vision": {"gpus": 8}},
          "default_project": {"gpus": 2}}}, {}, ("project", "vision"), Limits(gpus=8)),
        ({"projects": {"vision": {}, "speech": {}}, "quotas": {"default_project": {"gpus": 2}}}, {},
         ("project", "speech"), Limits(gpus=2)),
        ({"projects": {"vision": {}}, "quotas": {"default_project": {"gpus": 2}}}, {}, ("project", "fresh"), None),
        ({"projects": {"vision": {}}}, {("project", "vision"): {"gpus": 1}}, ("project", "vision"), Limits(gpus=1)),
        # none declared: no project limit, whatever an admin set before; a user's still apply
        ({}, {("project", "vision"): {"gpus": 1}}, ("project", "vision"), None),
        ({"quotas": {"users": {"ann": {"gpus": 4}}}}, {}, ("project", "ann"), None),
        ({"quotas": {"users": {"ann": {"gpus": 4}}}}, {}, ("user", "ann"), Limits(gpus=4, queued_jobs=10_000)),
    ],
)  # fmt: skip
def test_the_limits_placement_applies(
    config: dict[str, Any], set_by_admin: dict[Key, dict[str, Any]], key: Key, expected: Limits | None
) -> None:
    assert placer(config, set_by_admin).quota_limits(key) == expected


def test_without_declared_projects_a_fresh_project_name_escapes_nothing_and_holds_nothing() -> None:
    """A user's quota holds their jobs whatever project each names; no project quota holds anyone."""
    limits_of = placer({"quotas": {"users": {"ann": {"gpus": 4, "queued_jobs": 1}}}}).quota_limits
    queue = [Queued("1", "vision", "ann", 4), Queued("2", "brand-new", "ann", 1), Queued("3", "vision", "bob", 64)]
    assert hold_back(queue, limits_of, {("project", "vision"): InUse(gpus=1000)}) == {
        "2": "user ann is at its quota of 4 GPUs (4 for jobs ahead of it)"
    }
    assert submit_refusal("brand-new", "ann", limits_of, {("user", "ann"): 1}) == (
        "user ann is at its quota of 1 queued job"
    )
