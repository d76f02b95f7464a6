"""The store's active jobs read incrementally (store/activejobs.py), on both engines: after any mix of submits,
status changes, deletions, transactions rolled back, a read in the middle of an open transaction and another
process's writes, what it answers is what a whole read of the table answers; callers asking at once share one
read."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt

SPEC = parse_jobspec("name: t\ncommand: x\ngpus_per_node: 1\n")
ACTIVE = [JobStatus.QUEUED, JobStatus.RUNNING]


def _job() -> Job:
    return Job(0, "t", "ann", 1000, SPEC, JobStatus.QUEUED, "normal", "default", "none", 0.0)


async def _whole(store: Store, *, deleted: bool = True) -> list[tuple[int, str, bool]]:
    """What the table holds, read as it is."""
    rows = await store._db.fetchall(
        "SELECT id, status, deleted FROM jobs WHERE status IN ('queued', 'running') AND deleted <= ? ORDER BY id",
        (1 if deleted else 0,),
    )
    return [(int(r[0]), str(r[1]), bool(r[2])) for r in rows]


async def _seen(store: Store, *, deleted: bool = True) -> list[tuple[int, str, bool]]:
    return [(j.id, j.status.value, j.deleted) for j in await store.jobs(statuses=ACTIVE, deleted=deleted)]


class Boom(Exception):
    pass


def test_the_active_jobs_read_by_their_changes_are_those_the_table_holds(store_at: StoreAt) -> None:
    rng = random.Random(11)

    async def main() -> None:
        async with await Store.open(store_at()) as store:
            ids: list[int] = []
            for step in range(120):
                what = rng.random()
                if what < 0.3 or not ids:
                    async with store.jobs_tx("submit") as tx:
                        for _ in range(rng.randint(1, 5)):
                            ids.append(await tx.add_job(_job()))
                elif what < 0.55:
                    async with store.jobs_tx("start or end") as tx:
                        job_id = rng.choice(ids)
                        status = rng.choice([JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.QUEUED])
                        await tx.update_job(job_id, status=status)
                elif what < 0.65:
                    async with store.jobs_tx("delete") as tx:
                        await tx.update_job(rng.choice(ids), deleted=True)
                elif what < 0.75:
                    with pytest.raises(Boom):  # rolled back: nothing of it stays
                        async with store.jobs_tx("rolled back") as tx:
                            await tx.update_job(rng.choice(ids), status=JobStatus.STOPPED)
                            await tx.add_job(_job())
                            raise Boom
                elif what < 0.85:
                    async with store.jobs_tx("stop many") as tx:
                        queued = [i for i, s, _ in await _whole(store) if s == "queued"][:10]
                        await tx.update_jobs(queued, expect=[JobStatus.QUEUED], status=JobStatus.STOPPED)
                else:  # a read while a transaction is open, half written
                    async with store.jobs_tx("half written") as tx:
                        await tx.update_job(rng.choice(ids), status=JobStatus.RUNNING)
                        await store.jobs(statuses=ACTIVE, deleted=True)
                        ids.append(await tx.add_job(_job()))
                        await tx.update_job(rng.choice(ids), status=JobStatus.ERROR)
                if rng.random() < 0.6:
                    assert await _seen(store) == await _whole(store), f"step {step}"
                    assert await _seen(store, deleted=False) == await _whole(store, deleted=False), f"step {step}"
                    queued = [j.id for j in await store.jobs(statuses=[JobStatus.QUEUED])]
                    assert queued == [i for i, s, _ in await _whole(store, deleted=False) if s == "queued"], step
            # the view is read by its changes, not whole, once it has been read (a whole read is of every row)
            whole_at = store._active_whole_at
            async with store.jobs_tx("one more") as tx:
                ids.append(await tx.add_job(_job()))
            assert await _seen(store) == await _whole(store) and store._active_whole_at == whole_at

    asyncio.run(main())


def test_another_process_writes_are_read_whole_at_the_next_refresh(store_at: StoreAt) -> None:
    async def main() -> None:
        where = store_at()
        async with await Store.open(where) as ours, await Store.open(where) as theirs:
            async with ours.jobs_tx("submit") as tx:
                first = await tx.add_job(_job())
            assert [j.id for j in await ours.jobs(statuses=ACTIVE)] == [first]
            async with theirs.jobs_tx("another process") as tx:  # stamped by its own clock
                await tx.update_job(first, status=JobStatus.SUCCEEDED)
                second = await tx.add_job(_job())
            await ours.refresh()
            assert [j.id for j in await ours.jobs(statuses=ACTIVE)] == [second]

    asyncio.run(main())


def test_callers_asking_at_once_after_a_write_share_one_read(store_at: StoreAt) -> None:
    """A placement pass and requests ask for the active jobs at the same time, right after a write to 1,000 jobs:
    the table is read once, and each gets what it holds."""

    async def main() -> None:
        async with await Store.open(store_at()) as store:
            async with store.jobs_tx("submit") as tx:
                ids = [await tx.add_job(_job()) for _ in range(1000)]
            await store.jobs(statuses=ACTIVE)
            async with store.jobs_tx("start them") as tx:
                await tx.update_jobs(ids, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING)
            reads: list[str] = []
            fetchall = store._db.fetchall

            async def counted(sql: str, args: Any = ()) -> list[Any]:
                if sql.startswith("SELECT * FROM jobs WHERE"):
                    reads.append(sql)
                return await fetchall(sql, args)

            store._db.fetchall = counted  # type: ignore[method-assign]
            async with asyncio.timeout(30):
                seen = await asyncio.gather(*(_seen(store) for _ in range(5)))
            assert len(reads) == 1
            assert seen == [await _whole(store)] * 5 and {s for _, s, _ in seen[0]} == {"running"}

    asyncio.run(main())


def test_a_caller_waiting_for_a_read_that_is_cancelled_never_gets_what_a_transaction_read_inside_it(
    store_at: StoreAt,
) -> None:
    """Read A (outside any transaction) is in its merge; caller C waits for it; transaction T writes a job and reads
    the active jobs inside itself; A's client goes away. C gets the committed jobs, never T's job, which T then
    rolls back. Found by a review: C was handed T's read."""

    async def main() -> None:
        async with await Store.open(store_at()) as store:
            async with store.jobs_tx("submit") as tx:
                committed = await tx.add_job(_job())
            entered, go = threading.Event(), threading.Event()
            merged = store._merged
            calls = 0

            def first_slow(rows: list[Any], found: dict[int, Job] | None) -> tuple[dict[int, Job], list[Job]]:
                nonlocal calls
                calls += 1
                if calls == 1:  # read A, held in its worker thread
                    entered.set()
                    go.wait(10)
                return merged(rows, found)

            store._merged = first_slow  # type: ignore[method-assign]
            inside, end = asyncio.Event(), asyncio.Event()
            seen_inside: list[int] = []

            async def transaction() -> None:
                with pytest.raises(Boom):
                    async with store.jobs_tx("written, read, rolled back") as tx:
                        await tx.add_job(_job())
                        seen_inside.extend(j.id for j in await store.active_jobs())
                        inside.set()
                        await end.wait()
                        raise Boom

            async with asyncio.timeout(30):
                a = asyncio.create_task(store.active_jobs())
                while not entered.is_set():
                    await asyncio.sleep(0.001)
                c = asyncio.create_task(store.active_jobs())
                await asyncio.sleep(0.01)
                t = asyncio.create_task(transaction())
                await inside.wait()
                a.cancel()
                go.set()
                await asyncio.sleep(0.2)  # C's turn to answer, were it allowed to before T ends
                assert not c.done()
                end.set()
                await t
                assert [j.id for j in await c] == [committed] and len(seen_inside) == 2

    asyncio.run(main())
