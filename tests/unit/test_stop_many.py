"""Stopping many jobs at once (stopping.py, sharing.targets_of): every one named is stopped with its event, in a
few transactions; a job the caller may not touch refuses the whole request before anything is stopped."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import PermissionDenied
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.store.db import Store

SPEC = parse_jobspec("name: t\ncommand: x\n")
ANN = Caller(uid=1000, gid=1000, pid=1, user="ann")
BOB = Caller(uid=1001, gid=1001, pid=2, user="bob")


async def _queued(store: Store, owner: Caller, count: int, access: str = "none") -> list[int]:
    ids = []
    async with store.jobs_tx("jobs") as tx:
        for _ in range(count):
            job = Job(0, "t", owner.user, owner.uid, SPEC, JobStatus.QUEUED, "normal", "p", access, 1.0)
            ids.append(await tx.add_job(job))
    return ids


async def test_a_thousand_queued_jobs_stop_in_a_few_transactions(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "s.db") as store:
        service = SimpleNamespace(store=store, transport=None, config=ClusterConfig(), all_nodes=[])
        scheduler = Scheduler(service)  # type: ignore[arg-type]
        ids = await _queued(store, ANN, 1200)
        transactions = 0
        real = store.jobs_tx

        def counted(what: str):  # type: ignore[no-untyped-def]
            nonlocal transactions
            transactions += 1
            return real(what)

        store.jobs_tx = counted  # type: ignore[method-assign]
        stopped = await scheduler.stop(ANN, [str(i) for i in ids])
        store.jobs_tx = real  # type: ignore[method-assign]
        assert [j.id for j in stopped] == ids and {j.status for j in stopped} == {JobStatus.STOPPED}
        assert transactions == 3  # 500 to a transaction
        assert all(j.status is JobStatus.STOPPED for j in await store.jobs_by_id(ids))
        assert len([e for e in await store.events(limit=5000) if e.kind == "Stopped"]) == 1200

        others = await _queued(store, BOB, 3, access="read-only")
        mine = await _queued(store, ANN, 2)
        with pytest.raises(PermissionDenied, match="may not stop job"):
            await scheduler.stop(ANN, [str(mine[0]), str(others[1]), str(mine[1])])
        assert {j.status for j in await store.jobs_by_id(mine + others)} == {JobStatus.QUEUED}  # none stopped
