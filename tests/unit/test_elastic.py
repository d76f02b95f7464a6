"""Elastic resizing decisions from tables: who may be scaled to what, which nodes a resize keeps, and what a
scale out asks placement for."""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.decide.elastic import direction, grow_request, kept_nodes, scale_problem
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.placement import Candidate, JobRequest, Priority
from ftconsole.scheduler.spec.jobspec import JobSpec


def spec(**fields: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "train", "command": "python3 train.py", "mode": "pytorch", "nodes": 2}
    return JobSpec.from_json({**base, **fields})


ELASTIC = spec(fault_tolerance={"elastic": {"min_nodes": 1, "max_nodes": 4}})


def make_job(job_spec: JobSpec = ELASTIC, **fields: Any) -> Job:
    base: dict[str, Any] = {
        "id": 7,
        "name": "train",
        "owner": "ann",
        "uid": 1000,
        "spec": job_spec,
        "status": JobStatus.RUNNING,
        "priority": "normal",
        "project": "default",
        "access": "none",
        "submitted": 0.0,
    }
    return Job(**{**base, **fields})


SCALE_CASES = [
    ("within the range", make_job(), 4, None),
    ("down to min_nodes", make_job(), 1, None),
    ("queued", make_job(status=JobStatus.QUEUED), 3, None),
    ("not elastic", make_job(spec()), 1, "job 7 is not elastic"),
    ("above max_nodes", make_job(), 5, "job 7 scales from 1 to 4 nodes (fault_tolerance.elastic), not to 5"),
    ("below min_nodes", make_job(), 0, "scales from 1 to 4 nodes"),
    (
        "max_nodes defaults to nodes",
        make_job(spec(nodes=3, fault_tolerance={"elastic": {"min_nodes": 2}})),
        4,
        "scales from 2 to 3 nodes",
    ),
    ("ended", make_job(status=JobStatus.SUCCEEDED), 2, "job 7 is succeeded: only a queued or running job"),
    ("being stopped", make_job(stop_reason=StopReason.STOPPED), 2, "job 7 is being stopped (stopped)"),
]


@pytest.mark.parametrize(("case", "job", "nodes", "problem"), SCALE_CASES, ids=[c[0] for c in SCALE_CASES])
def test_scale_problem(case: str, job: Job, nodes: int, problem: str | None) -> None:
    found = scale_problem(job, nodes)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_size_is_the_spec_until_scaled_and_json_shows_the_range() -> None:
    job = make_job()
    assert job.size == 2 and job.to_json(0)["nodes"] == 2
    scaled = make_job(scaled_to=3)
    assert scaled.size == 3
    assert scaled.to_json(0)["nodes"] == 3 and scaled.to_json(0)["elastic"] == {"min_nodes": 1, "max_nodes": 4}
    assert make_job(spec()).to_json(0)["elastic"] is None


@pytest.mark.parametrize(("before", "after", "text"), [(2, 3, "scale out 2 -> 3"), (4, 1, "scale in 4 -> 1")])
def test_direction(before: int, after: int, text: str) -> None:
    assert direction(before, after) == text


def run(rank: int, node: str, gpus: tuple[int, ...]) -> Run:
    return Run(job=7, attempt=1, rank=rank, node=node, gpus=gpus, run_dir=f"/r/7/1/{rank}", launch=True)


def test_a_resize_keeps_the_first_ranks_in_rank_order() -> None:
    runs = [run(2, "c", (0,)), run(0, "a", (2, 3)), run(1, "b", (1,))]
    assert kept_nodes(runs, 2) == [("a", (2, 3)), ("b", (1,))]
    assert kept_nodes(runs, 3) == [("a", (2, 3)), ("b", (1,)), ("c", (0,))]
    assert kept_nodes(runs, 5) == kept_nodes(runs, 3)  # a scale out keeps them all


BASE = JobRequest(
    id="7",
    submitted_at=1.0,
    requeued=True,
    nodes=2,
    candidates=(Candidate("big", 8, None), Candidate("small", 4, "A100")),
    pool="train",
)
GROW: dict[str, Any] = {
    "count": 2,
    "spec_name": "small",
    "gpus_per_node": 4,
    "gpu_model": "H100",
    "own": {"a", "b"},
    "cluster": {"a", "b", "c", "d"},
    "priority": Priority.URGENT,
    "now": 50.0,
    "remaining": 300.0,
}


def test_a_scale_out_asks_for_the_missing_nodes_like_a_new_job_of_its_priority() -> None:
    request = grow_request(BASE, **GROW)
    assert request.id == "7+2" and request.nodes == 2
    assert request.candidates == (Candidate("small", 4, "A100"),)  # the attempt's candidate, its model kept
    assert request.node_names == frozenset({"c", "d"})  # never a node it holds
    assert (request.priority, request.submitted_at, request.requeued) == (Priority.URGENT, 50.0, False)
    assert (request.pool, request.max_runtime) == ("train", 300.0)


GROW_CASES = [
    ("a candidate without a model gets rank 0's", {"spec_name": "big", "gpus_per_node": 8}, "H100", None),
    ("an unknown model stays any", {"spec_name": "big", "gpus_per_node": 8, "gpu_model": ""}, None, None),
    ("a candidate no longer in the spec", {"spec_name": None, "gpus_per_node": 2}, "H100", None),
    ("past its deadline", {"remaining": -5.0}, "A100", 0.0),
]


@pytest.mark.parametrize(("case", "changes", "model", "runtime"), GROW_CASES, ids=[c[0] for c in GROW_CASES])
def test_grow_request_cases(case: str, changes: dict[str, Any], model: str | None, runtime: float | None) -> None:
    request = grow_request(BASE, **{**GROW, **changes})
    (candidate,) = request.candidates
    assert candidate.gpu_model == model
    if "remaining" in changes:
        assert request.max_runtime == runtime


def test_a_scale_out_stays_within_the_jobs_node_names() -> None:
    named = JobRequest(id="7", submitted_at=0, nodes=2, candidates=(Candidate(None, 1),), node_names=frozenset("abc"))
    assert grow_request(named, **GROW).node_names == frozenset({"c"})
    no_limit = grow_request(named, **{**GROW, "remaining": None})
    assert no_limit.max_runtime is None
