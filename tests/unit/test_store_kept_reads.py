"""The store keeps its reads of jobs, runs and running attempts until the next write (issue 17's debt: a tick
asked for the running jobs and the held runs in each of its steps, and rebuilding the records was most of its
CPU). What must hold: a read after any write, committed or rolled back, sees the store as it is; a read kept
is the same data, as a list of its own; another process's write is seen after `refresh` (each tick), which
keeps the reads where nobody else wrote. Each runs on SQLite and on PostgreSQL (tests/unit/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest

from ftconsole.scheduler.decide.jobs import Attempt, JobStatus
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict
from tests.unit.conftest import StoreAt
from tests.unit.test_jobs import make_job, run


def counted(monkeypatch, store: Store, name: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    """The queries of the store's `name` read from now on (each call's arguments), by a wrapper that counts."""
    queries: list[tuple] = []
    real = getattr(store, name)

    async def counting(*args):  # type: ignore[no-untyped-def]
        queries.append(args)
        return await real(*args)

    monkeypatch.setattr(store, name, counting)
    return queries


async def test_reads_are_kept_until_a_write_and_each_caller_gets_its_own_list(store_at: StoreAt, monkeypatch) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(attempt=1))
            attempt = Attempt(job=job_id, number=1, spec_name=None, gpus_per_node=1, master_port=1, created=2.0)
            await tx.add_attempt(attempt, [run(0, "intent"), run(1, "intent")])
        queries = counted(monkeypatch, store, "_runs")
        first = await store.runs(held=True)
        second = await store.runs(held=True)
        assert first == second and first is not second and len(queries) == 1  # kept: one query
        first.clear()  # a caller's list is its own
        assert len(await store.runs(held=True)) == 2 and len(queries) == 1
        await store.runs(job=job_id)
        assert len(queries) == 2  # another question is another query

        async with store.jobs_tx("start") as tx:
            await tx.update_run(second[0], state="running")
        assert [r.state for r in await store.runs(held=True)] == ["running", "intent"]  # read again
        assert len(queries) == 3

        with pytest.raises(Conflict):  # a transaction rolled back: its writes gone, and so are the kept reads
            async with store.jobs_tx("stop") as tx:
                await tx.update_run(second[1], state="running")
                assert [r.state for r in await store.runs(held=True)] == ["running", "running"]  # inside: its own
                await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.STOPPED)
        assert [r.state for r in await store.runs(held=True)] == ["running", "intent"]


async def test_jobs_and_running_attempts_are_kept_and_forget_reads_another_processs_write(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(attempt=1))
            attempt = Attempt(job=job_id, number=1, spec_name=None, gpus_per_node=1, master_port=1, created=2.0)
            await tx.add_attempt(attempt, [run(0, "running")])
            await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=1)
        assert [j.status for j in await store.jobs(statuses=[JobStatus.RUNNING])] == [JobStatus.RUNNING]
        assert list(await store.running_attempts()) == [job_id]
        # another process (a CLI) writes behind this store's back
        async with await Store.open(store_at()) as other, other.jobs_tx("finish") as tx:
            await tx.update_job(job_id, status=JobStatus.SUCCEEDED)
        assert [j.id for j in await store.jobs(statuses=[JobStatus.RUNNING])] == [job_id]  # kept
        await store.refresh()  # what each tick does first
        assert await store.jobs(statuses=[JobStatus.RUNNING]) == []
        assert await store.running_attempts() == {}


async def test_refresh_keeps_the_reads_where_no_other_process_wrote(store_at: StoreAt, monkeypatch) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            await tx.add_job(make_job())
        await store.refresh()
        queries = counted(monkeypatch, store, "_jobs")
        assert len(await store.jobs()) == 1
        for _ in range(3):  # quiet ticks: nothing written anywhere
            await store.refresh()
            assert len(await store.jobs()) == 1
        assert len(queries) == 1
        async with await Store.open(store_at()) as other, other.jobs_tx("urgent") as tx:
            await tx.update_job(1, priority="urgent")
        await store.refresh()
        assert [j.priority for j in await store.jobs()] == ["urgent"] and len(queries) == 2


async def test_a_read_under_way_when_a_write_begins_is_not_kept(store_at: StoreAt, monkeypatch) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(attempt=1))
            attempt = Attempt(job=job_id, number=1, spec_name=None, gpus_per_node=1, master_port=1, created=2.0)
            await tx.add_attempt(attempt, [run(0, "intent")])
        gate = asyncio.Event()
        real = store._runs

        async def slow(*args):
            got = await real(*args)
            await gate.wait()  # the write below begins and ends while this read is under way
            return got

        monkeypatch.setattr(store, "_runs", slow)
        reading = asyncio.create_task(store.runs(held=True))
        await asyncio.sleep(0)
        (old,) = await real(None, True)
        async with store.jobs_tx("start") as tx:
            await tx.update_run(old, state="running")
        gate.set()
        assert [r.state for r in await asyncio.wait_for(reading, 10)] == ["intent"]  # what it read, before
        monkeypatch.setattr(store, "_runs", real)
        assert [r.state for r in await store.runs(held=True)] == ["running"]  # not kept: read again


async def test_a_write_keeps_the_reads_of_the_tables_it_does_not_write(store_at: StoreAt, monkeypatch) -> None:
    """A submit writes jobs and events: the quota limits read before it are kept (one query per submit fewer),
    the jobs read again; a quota set is read again; and so is all of it after a rollback."""
    async with await Store.open(store_at()) as store:
        await store.refresh()  # as a tick does first: from now on this store knows who else wrote
        limits = counted(monkeypatch, store, "_quota_limits")
        jobs = counted(monkeypatch, store, "_jobs")
        assert await store.quota_limits() == {} and await store.jobs() == []
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job())
            await tx.event(1.0, "Pending", "submitted", job=job_id)
            assert [j.id for j in await store.jobs()] == [job_id]  # inside: its own write, read again
            assert await store.quota_limits() == {}
        assert await store.quota_limits() == {} and len(limits) == 1  # kept through the submit
        assert [j.id for j in await store.jobs()] == [job_id] and len(jobs) == 2
        async with store.jobs_tx("set a quota") as tx:
            await tx.quota("project", "vision", {"gpus": 8}, "root", 2.0)
        assert list(await store.quota_limits()) == [("project", "vision")] and len(limits) == 2
        await store.refresh()  # our own writes are not another process's: the kept reads stay
        await store.quota_limits()
        await store.jobs()
        assert (len(limits), len(jobs)) == (2, 2)
        with pytest.raises(RuntimeError):
            async with store.jobs_tx("set a quota") as tx:
                await tx.quota("project", "vision", None, "root", 3.0)
                raise RuntimeError("changed my mind")
        assert list(await store.quota_limits()) == [("project", "vision")] and len(limits) == 3


async def test_another_processs_write_is_seen_when_a_write_begins(store_at: StoreAt, monkeypatch) -> None:
    """Kept reads are used inside write transactions (a submit checks the quotas it read before): each write
    transaction asks, under the store's write lock, whether another process wrote meanwhile, without a tick's
    `refresh` in between (a standby that has just taken over, a CLI on the store)."""
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            await tx.add_job(make_job())
        await store.refresh()
        assert await store.quota_limits() == {}
        async with await Store.open(store_at()) as other, other.jobs_tx("set a quota") as tx:
            await tx.quota("user", "ann", {"gpus": 1}, "root", 2.0)
        async with store.jobs_tx("submit") as tx:
            assert list(await store.quota_limits()) == [("user", "ann")]
            await tx.add_job(make_job())
        assert len(await store.jobs()) == 2
        # and after our own commit, the other's write again
        async with await Store.open(store_at()) as other, other.jobs_tx("drop a quota") as tx:
            await tx.quota("user", "ann", None, "root", 3.0)
        async with store.jobs_tx("submit") as tx:
            assert await store.quota_limits() == {}


async def test_wait_reasons_are_written_in_one_statement_to_the_jobs_that_still_wait(store_at: StoreAt) -> None:
    """A placement pass notes why each queued job waits (`JobTx.note`, one statement for all of them): a job
    that started meanwhile keeps its message and its stamp."""
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            ids = [await tx.add_job(make_job(status=JobStatus.QUEUED, started=None)) for _ in range(3)]
            await tx.update_job(ids[1], status=JobStatus.RUNNING, message="")
        stamps = "SELECT id, updated FROM jobs ORDER BY id"
        before = dict(await store._db.fetchall(stamps))
        async with store.jobs_tx("note why jobs wait") as tx:
            await tx.note([(i, f"waits {i}") for i in ids], status=JobStatus.QUEUED)
        after = dict(await store._db.fetchall(stamps))
        assert [j.message for j in await store.jobs()] == [f"waits {ids[0]}", "", f"waits {ids[2]}"]
        assert after[ids[1]] == before[ids[1]] and after[ids[0]] == after[ids[2]] == tx.stamp > before[ids[0]]


async def test_kept_reads_of_a_table_written_are_dropped_not_left_to_pile_up(store_at: StoreAt) -> None:
    """A read asked once with a time in its key (the jobs ended since a moment) is gone at the next write to its
    table: a scheduler that runs for weeks keeps no more reads than it asks between two writes."""
    async with await Store.open(store_at()) as store:
        await store.refresh()
        for since in range(50):
            await store.jobs(ended_since=float(since))
        await store.quota_limits()
        assert len(store._kept) == 51
        async with store.jobs_tx("submit") as tx:
            await tx.add_job(make_job())
        assert list(store._kept) == [("quota_limits",)]


async def test_callers_of_one_read_under_way_share_it_and_a_cancelled_reader_cancels_nobody_else(
    store_at: StoreAt,
) -> None:
    """Many asking the same at once read once (64 nodes' sweeps); when the caller whose read it is goes away
    (an API client that disconnects), the others still get an answer, not its cancellation."""
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("job") as tx:
            await tx.add_job(make_job())
        reads = 0
        release = asyncio.Event()

        async def slow() -> list[str]:
            nonlocal reads
            reads += 1
            await release.wait()
            return ["ann"]

        first = asyncio.ensure_future(store._kept_read(("k",), frozenset({"jobs"}), slow))
        await asyncio.sleep(0)
        others = [asyncio.ensure_future(store._kept_read(("k",), frozenset({"jobs"}), slow)) for _ in range(3)]
        await asyncio.sleep(0)
        assert reads == 1  # the others wait for the read under way
        first.cancel()
        await asyncio.sleep(0.01)
        release.set()
        assert await asyncio.wait_for(asyncio.gather(*others), 10) == [["ann"]] * 3
        assert first.cancelled() and reads == 2  # the first waiter read again; the rest shared that
