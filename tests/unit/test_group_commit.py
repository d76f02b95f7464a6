"""Group commit (scheduler/submitting.py) on both stores: concurrent writes share transactions, each part sees
those before it, a part that fails rolls back alone, a caller that went away is left out."""

from __future__ import annotations

import asyncio
import time

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import JobTx
from ftconsole.scheduler.submitting import GroupCommit
from tests.unit.conftest import StoreAt

SPEC = JobSpec.from_json({"name": "j", "command": "true"})


def job(name: str) -> Job:
    return Job(id=0, name=name, owner="ann", uid=1000, spec=SPEC, status=JobStatus.QUEUED, priority="normal",
               project="default", access="none", submitted=time.time())  # fmt: skip


def adding(store: Store, name: str, *, refuse: bool = False):  # type: ignore[no-untyped-def]
    async def part(tx: JobTx) -> tuple[int, int]:
        before = len(await store.jobs())  # what the parts before it wrote, in the same transaction
        job_id = await tx.add_job(job(name))
        await tx.event(time.time(), "Pending", f"submitted {name}", job=job_id)
        if refuse:
            raise UsageError(f"{name}: over the cap")
        return job_id, before

    return part


async def test_concurrent_writes_share_transactions_and_a_refused_one_fails_alone(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        group: GroupCommit[tuple[int, int]] = GroupCommit(store, "submit a job")
        names = [f"j{i}" for i in range(10)]
        results = await asyncio.gather(
            *(group.write(adding(store, n, refuse=n == "j4")) for n in names), return_exceptions=True
        )
        assert isinstance(results[4], UsageError) and str(results[4]) == "j4: over the cap"
        written = [r for r in results if not isinstance(r, BaseException)]
        assert [before for _, before in written] == list(range(9))  # each saw the ones written before it
        assert group.transactions < 10  # j0 alone at once, the others together
        jobs = await store.jobs()
        assert [j.name for j in jobs] == [n for n in names if n != "j4"]  # j4's row rolled back, nothing else
        assert sorted(j.id for j in jobs) == sorted(job_id for job_id, _ in written)
        events = [e.message for e in await store.events(limit=100)]
        assert "submitted j4" not in events and "submitted j9" in events


async def test_a_caller_gone_before_its_write_is_left_out(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        group: GroupCommit[tuple[int, int]] = GroupCommit(store, "submit a job")
        first = asyncio.ensure_future(group.write(adding(store, "first")))
        gone = asyncio.ensure_future(group.write(adding(store, "gone")))
        kept = asyncio.ensure_future(group.write(adding(store, "kept")))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(first, kept)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert [j.name for j in await store.jobs()] == ["first", "kept"]


async def test_a_part_the_database_refuses_fails_alone(store_at: StoreAt) -> None:
    """A statement the database refuses aborts a PostgreSQL transaction: the others are written again without
    it, in a transaction of their own."""
    async with await Store.open(store_at()) as store:
        group: GroupCommit[tuple[int, int]] = GroupCommit(store, "submit a job")

        async def clash(tx: JobTx) -> tuple[int, int]:
            await tx.add_job(job("clash"))
            await store._db.execute("INSERT INTO meta (key, value) VALUES ('cluster_id', 'taken')")  # its key is
            raise AssertionError("the database took a second cluster_id")

        parts = [adding(store, "a"), adding(store, "b"), clash, adding(store, "c")]
        results = await asyncio.gather(*(group.write(p) for p in parts), return_exceptions=True)
        assert isinstance(results[2], store._db.errors) and not isinstance(results[2], AssertionError)
        assert [j.name for j in await store.jobs()] == ["a", "b", "c"]
        assert [before for _, before in results[:2] + results[3:]] == [0, 1, 2]  # type: ignore[misc]
