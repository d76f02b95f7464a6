"""Goodput (decide/goodput.py): useful GPU time against the time lost to failures, per job and summed."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.decide.goodput import Goodput, checkpoint_times, goodput_by, job_goodput
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.jobtx import CheckpointSignal

NOW = 100_000.0


def attempt(number: int, result: str | None, job: int = 1) -> Attempt:
    return Attempt(job=job, number=number, spec_name=None, gpus_per_node=4, master_port=1, created=0.0, result=result)


def run(number: int, start: float | None, end: float | None, rank: int = 0, gpus: int = 4, job: int = 1) -> Run:
    return Run(job=job, attempt=number, rank=rank, node=f"n{rank}", gpus=tuple(range(gpus)), run_dir="/r", launch=True,
               started=start, ended=end, state="exited" if end is not None else "running")  # fmt: skip


H = 3600.0


@pytest.mark.parametrize(
    ("attempts", "runs", "checkpoints", "expected"),
    [
        # never failed: all useful (two ranks of 4 GPUs, an hour)
        ([attempt(1, "succeeded")], [run(1, 0, H), run(1, 0, H, rank=1)], {}, Goodput(8 * H)),
        # still running: useful up to now
        ([attempt(1, None)], [run(1, NOW - H, None)], {}, Goodput(4 * H)),
        # requeued after 2 h without a checkpoint, queued 30 min, then 1 h to success: 2 h redone, 30 min still
        (
            [attempt(1, "requeued"), attempt(2, "succeeded")],
            [run(1, 0, 2 * H), run(2, 2.5 * H, 3.5 * H)],
            {},
            Goodput(4 * H, 8 * H, 2 * H),
        ),
        # the same with a checkpoint at 1.5 h: only the last half hour is redone
        (
            [attempt(1, "requeued"), attempt(2, "succeeded")],
            [run(1, 0, 2 * H), run(2, 2.5 * H, 3.5 * H)],
            {1: 1.5 * H},
            Goodput(4 * H + 6 * H, 2 * H, 2 * H, 6 * H),
        ),
        # failed for good: its attempt is lost, nothing after it
        ([attempt(1, "error")], [run(1, 0, H)], {}, Goodput(0, 4 * H, 0)),
        # stopped by its user, or resized: its work counts
        ([attempt(1, "resized"), attempt(2, "stopped")], [run(1, 0, H), run(2, H, 2 * H, gpus=8)], {}, Goodput(12 * H)),
        # restarted in place at once (no gap), preempted with its checkpoint at its end
        (
            [attempt(1, "restarted"), attempt(2, "preempted"), attempt(3, None)],
            [run(1, 0, H), run(2, H, 2 * H), run(3, 3 * H, None)],
            {2: 2 * H},
            Goodput(4 * H + 4 * (NOW - 3 * H), 4 * H, 4 * H, 4 * H),
        ),
        # a run that never started used nothing; the next attempt still starting counts its wait up to now
        (
            [attempt(1, "requeued"), attempt(2, None)],
            [run(1, 0, H), run(2, None, None)],
            {},
            Goodput(0, 4 * H, 4 * (NOW - H)),
        ),
    ],
)
def test_a_jobs_goodput(attempts: list[Attempt], runs: list[Run], checkpoints: dict[int, float],
                        expected: Goodput) -> None:  # fmt: skip
    assert job_goodput(attempts, runs, checkpoints, 0, NOW + 1, NOW) == expected


def test_a_window_counts_only_what_falls_inside_it() -> None:
    found = job_goodput([attempt(1, "requeued"), attempt(2, "succeeded")], [run(1, 0, 2 * H), run(2, 3 * H, 4 * H)],
                        {}, H, 3.5 * H, NOW)  # fmt: skip
    assert found == Goodput(4 * 0.5 * H, 4 * H, 4 * H)


def test_ratio_and_text() -> None:
    g = Goodput(96 * H, 3 * H, 1 * H)
    assert g.ratio == pytest.approx(0.96) and g.lost == 4 * H
    assert g.describe() == "96.0% (useful 96.0 GPU-h; lost 4.0: 3.0 redone, 1.0 standing still)"
    kept = Goodput(96 * H, 3 * H, 1 * H, 10 * H).describe()
    assert kept == "96.0% (useful 96.0 GPU-h; lost 4.0: 3.0 redone, 1.0 standing still; 10.0 kept by checkpoints)"
    assert g.to_json()["goodput"] == 0.96 and g.to_json()["downtime_gpu_hours"] == 1.0
    assert Goodput().ratio is None and Goodput().describe() == "-"
    assert Goodput(H).describe() == "100.0% (useful 1.0 GPU-h; nothing lost)"


def test_per_user_and_for_the_cluster_from_the_stores_rows() -> None:
    spec = JobSpec.from_json({"name": "j", "command": "true"})
    jobs = {
        i: Job(
            id=i,
            name="j",
            owner=owner,
            uid=1,
            spec=spec,
            status=JobStatus.SUCCEEDED,
            priority="normal",
            project="p",
            access="none",
            submitted=0.0,
        )
        for i, owner in ((1, "ann"), (2, "bob"))
    }
    attempts = [attempt(1, "requeued"), attempt(2, "succeeded"), attempt(1, "succeeded", job=2)]
    runs = [run(1, 0, H), run(2, 2 * H, 3 * H), run(1, 0, H, job=2)]
    signals = [CheckpointSignal(1, 1, 0, "SIGUSR1", 0.5 * H, H, 1, "signalled", 0.5 * H),
               CheckpointSignal(1, 1, 1, "SIGUSR1", 0.5 * H, H, 1, "late", H)]  # fmt: skip
    marks = checkpoint_times(signals)
    assert marks == {(1, 1): 0.5 * H}
    rows, total = goodput_by(jobs, attempts, runs, marks, "user", 0, NOW, NOW)
    assert rows == {"ann": Goodput(4 * 0.5 * H + 4 * H, 4 * 0.5 * H, 4 * H, 4 * 0.5 * H), "bob": Goodput(4 * H)}
    assert total == rows["ann"] + rows["bob"]
    with pytest.raises(ValueError, match="by one of user, project"):
        goodput_by(jobs, attempts, runs, marks, "node", 0, NOW, NOW)


def test_the_text_shows_the_ratio_the_json_gives() -> None:
    """0.09854 rounds to 0.0985 in the JSON, which shows as 9.8%; the unrounded ratio would read 9.9%."""
    g = Goodput(9854.0, 90146.0)
    assert g.to_json()["goodput"] == 0.0985
    assert g.describe().startswith(f"{g.to_json()['goodput']:.1%} (useful ") and g.describe().startswith("9.8%")
