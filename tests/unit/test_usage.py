"""GPU usage over a period (decide/usage.py) and the times the history commands take (ftconsole/usage_cli.py)."""

from __future__ import annotations

import datetime

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.usage import Usage, overlap, run_gpu_seconds, usage_by
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.usage_cli import parse_when

SPEC = parse_jobspec("name: t\ncommand: x\n")


def job(job_id: int, owner: str, project: str = "default") -> Job:
    return Job(job_id, "t", owner, 1000, SPEC, JobStatus.SUCCEEDED, "normal", project, "none", 0.0)


def run(job_id: int, gpus: int, started: float | None, ended: float | None, attempt: int = 1) -> Run:
    return Run(job_id, attempt, 0, "gpu01", tuple(range(gpus)), "~/r", True, started=started, ended=ended)


def test_overlap() -> None:
    assert overlap(0, 10, 5, 20) == 5 and overlap(0, 10, 10, 20) == 0 and overlap(3, 4, 0, 100) == 1
    assert overlap(5, 1, 0, 10) == 0  # nothing, never less


def test_a_runs_gpu_seconds_inside_the_window() -> None:
    assert run_gpu_seconds(run(1, 8, 100, 200), 0, 1000, now=1000) == 800
    assert run_gpu_seconds(run(1, 8, 100, 200), 150, 1000, now=1000) == 400  # cut by since
    assert run_gpu_seconds(run(1, 2, 100, None), 0, 1000, now=400) == 600  # running: to now
    assert run_gpu_seconds(run(1, 2, None, None), 0, 1000, now=400) == 0  # never started


def test_usage_by_user_and_project_every_attempt_most_used_first() -> None:
    jobs = {1: job(1, "ann", "vision"), 2: job(2, "bob", "speech"), 3: job(3, "ann", "speech")}
    runs = [run(1, 4, 0, 100), run(1, 4, 200, 300, attempt=2), run(2, 8, 0, 100), run(3, 1, 0, 50),
            run(9, 8, 0, 100)]  # fmt: skip  # job 9: not in the store any more
    by_user = usage_by(jobs, runs, "user", 0, 1000, now=1000)
    assert list(by_user) == ["ann", "bob"] and by_user["ann"] == Usage(850, 2) and by_user["bob"] == Usage(800, 1)
    by_project = usage_by(jobs, runs, "project", 0, 1000, now=1000)
    assert list(by_project) == ["speech", "vision"] and by_project["speech"] == Usage(850, 2)
    assert usage_by(jobs, runs, "user", 2000, 3000, now=3000) == {}
    assert Usage(7200, 1).to_json() == {"gpu_hours": 2.0, "gpu_seconds": 7200.0, "jobs": 1}
    with pytest.raises(ValueError, match="by one of user, project"):
        usage_by(jobs, runs, "node", 0, 1, now=1)


def test_a_time_is_a_date_or_a_time_ago() -> None:
    now = 1_800_000_000.0
    assert parse_when("7d", now) == now - 7 * 86400 and parse_when("90m", now) == now - 5400
    assert parse_when("2026-11-01", now) == datetime.datetime(2026, 11, 1).timestamp()
    assert parse_when("2026-11-01T14:30", now) == datetime.datetime(2026, 11, 1, 14, 30).timestamp()
    with pytest.raises(UsageError, match="'last week' is not a time"):
        parse_when("last week", now)
