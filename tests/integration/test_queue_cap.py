"""A user's queued jobs are capped even where no quota is configured (issue 40: Slurm's MaxSubmitJobs): at most
10,000, counted at each submit from an index, in the transaction that writes the jobs; another user is not held
by it. Where quotas are configured, `quotas.default_user.queued_jobs` says it (tests/unit/test_request_bounds.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftconsole.lab import LabCluster
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.spec.sharingspec import DEFAULT_QUEUED_JOBS

ANN = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), user="ann")
BOB = Caller(uid=os.getuid() + 1, gid=os.getgid(), pid=os.getpid(), user="bob")


async def test_a_users_queued_jobs_are_capped_without_quotas_and_another_user_is_not_held(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=1) as lab, ClusterService.open(load_config(lab.config_path)) as svc:
        assert svc.config.quotas is None
        sched = Scheduler(svc)  # no loop runs: everything stays queued
        last = DEFAULT_QUEUED_JOBS - 1
        await sched.submit(ANN, parse_jobspec(f"name: sweep\ncommand: sleep 1\narray: 0-{last - 1}\n"))
        await sched.submit(ANN, parse_jobspec("name: one\ncommand: sleep 1\n"))  # the last one that fits
        assert await svc.store.queued_count("ann") == DEFAULT_QUEUED_JOBS
        with pytest.raises(UsageError, match=r"job two refused: user ann is at its quota of 10,000 queued jobs"):
            await sched.submit(ANN, parse_jobspec("name: two\ncommand: sleep 1\n"))
        assert (await sched.submit(BOB, parse_jobspec("name: bobs\ncommand: sleep 1\n"))).owner == "bob"
        assert await svc.store.queued_count("ann") == DEFAULT_QUEUED_JOBS
