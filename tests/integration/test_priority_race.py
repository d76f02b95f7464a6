"""A priority change that races the loop: a task of an array that starts between the change's read and its write
keeps its priority and the others change (Slurm's `scontrol update` of an array skips its running tasks); a
single job that started meanwhile is refused, naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftconsole.lab import LabCluster
from ftconsole.scheduler.decide.jobs import JobStatus
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.spec.jobspec import parse_jobspec

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), user="root")


def start_after_read(sched: Scheduler, job_id: int) -> None:
    """Let `job_id` start (as the loop would) right after the priority change read its targets."""
    read = sched.targets

    async def targets(*args, **kwargs):  # type: ignore[no-untyped-def]
        jobs = await read(*args, **kwargs)
        async with sched.store.jobs_tx("the loop starts a task") as tx:
            await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING, started=1.0)
        return jobs

    sched.targets = targets  # type: ignore[method-assign]


async def test_a_task_that_starts_meanwhile_keeps_its_priority_and_the_rest_change(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=1) as lab, ClusterService.open(load_config(lab.config_path)) as svc:
        sched = Scheduler(svc)
        spec = parse_jobspec("name: sweep\ncommand: sleep 1\narray: 0-2\n")
        first = await sched.submit(ROOT, spec)
        tasks = [t.id for t in await svc.store.array_tasks(first.id)]
        assert len(tasks) == 3
        start_after_read(sched, tasks[1])
        await sched.set_priority(ROOT, str(first.id), "urgent")
        after = {t.id: (t.status, t.priority) for t in await svc.store.array_tasks(first.id)}
        assert after == {
            tasks[0]: (JobStatus.QUEUED, "urgent"),
            tasks[1]: (JobStatus.RUNNING, "normal"),
            tasks[2]: (JobStatus.QUEUED, "urgent"),
        }
        assert [e.kind for e in await svc.store.events(job=str(tasks[1]))].count("Priority") == 0

        sched = Scheduler(svc)
        single = await sched.submit(ROOT, parse_jobspec("name: one\ncommand: sleep 1\n"))
        start_after_read(sched, single.id)
        with pytest.raises(UsageError, match=f"job {single.id} started meanwhile"):
            await sched.set_priority(ROOT, str(single.id), "urgent")
        job = await svc.store.job(single.id)
        assert job is not None and job.priority == "normal"
