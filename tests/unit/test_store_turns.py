"""The store's one connection, shared by the scheduler's tasks (store/turns.py), on both engines: a task reading
while another's transaction is half written sees all of it once it commits, or none of it when it is rolled back;
a task's write made meanwhile is not taken back with the other's rollback; the tasks a transaction starts read
inside it; a task cancelled while waiting for its turn, or while its BEGIN or COMMIT runs, leaves the connection to
the others; readers waiting for a transaction go before the next one.

Found by the suite on a busy machine: `show` of a two-node job read it running on one node, between the inserts of
its two runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt

SPEC = parse_jobspec("name: pair\ncommand: x\nmode: pytorch\nnodes: 2\ngpus_per_node: 1\n")
ACTIVE = [JobStatus.QUEUED, JobStatus.RUNNING]
T = TypeVar("T")
PAUSE_S = 0.2  # what a reader is given to read a transaction half written, were it let


class Boom(Exception):
    pass


def _job() -> Job:
    return Job(0, "pair", "ann", 1000, SPEC, JobStatus.QUEUED, "normal", "default", "none", time.time())


def _runs(job_id: int) -> list[Run]:
    return [Run(job_id, 1, rank, node, (0,), f"/tmp/r{rank}", True) for rank, node in enumerate(("n1", "n2"))]


def later(go: asyncio.Event, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of its own, begun now (outside the transaction to come: a task begun inside one is part of it), that
    runs `coro` once `go` is set."""

    async def run() -> T:
        await go.wait()
        return await coro

    return asyncio.create_task(run())


async def _what_a_client_reads(store: Store, job_id: int) -> tuple[str, list[str], list[str]]:
    """The job's status in the list of active jobs, its nodes as a job listing says, its runs' nodes."""
    (job,) = [j for j in await store.jobs(statuses=ACTIVE) if j.id == job_id]
    activity = (await store.job_activity([job_id])).get(job_id)
    runs = await store.runs(job=job_id)
    return job.status.value, list(activity.node_names) if activity else [], [r.node for r in runs]


async def test_a_read_while_another_task_writes_sees_the_transaction_whole_once_committed(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(_job())
        assert await _what_a_client_reads(store, job_id) == ("queued", [], [])  # kept reads made before
        go = asyncio.Event()
        reader = later(go, _what_a_client_reads(store, job_id))
        async with asyncio.timeout(30), store.jobs_tx("start the pair") as tx:
            await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=1)
            go.set()
            await asyncio.sleep(PAUSE_S)
            assert not reader.done()  # it waits for the transaction: the job is running on no node yet
            await tx.add_attempt(Attempt(job_id, 1, None, 1, 29500, time.time()), _runs(job_id))
        async with asyncio.timeout(30):
            assert await reader == ("running", ["n1", "n2"], ["n1", "n2"])


async def test_a_read_while_another_task_writes_sees_nothing_of_it_once_rolled_back(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(_job())
        go = asyncio.Event()
        reader = later(go, _what_a_client_reads(store, job_id))
        with pytest.raises(Boom):
            async with asyncio.timeout(30), store.jobs_tx("start the pair, then fail") as tx:
                await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=1)
                await tx.add_attempt(Attempt(job_id, 1, None, 1, 29500, time.time()), _runs(job_id))
                go.set()
                await asyncio.sleep(PAUSE_S)
                assert not reader.done()
                raise Boom
        async with asyncio.timeout(30):
            assert await reader == ("queued", [], [])
        assert await _what_a_client_reads(store, job_id) == ("queued", [], [])


async def test_a_write_of_another_task_is_not_taken_back_by_a_transaction_rolled_back(store_at: StoreAt) -> None:
    """A statement of the engine's own, sent outside any transaction (each is a transaction of its own)."""
    async with await Store.open(store_at()) as store:
        db = store._db
        outside = "INSERT INTO meta (key, value) VALUES ('written.outside', 'kept')"
        go = asyncio.Event()
        writer = later(go, db.execute(outside))
        with pytest.raises(Boom):
            async with asyncio.timeout(30), store._transaction("a write, then a failure"):
                await db.execute("INSERT INTO meta (key, value) VALUES ('written.inside', 'gone')")
                go.set()
                await asyncio.sleep(PAUSE_S)
                assert not writer.done()
                raise Boom
        async with asyncio.timeout(30):
            assert await writer == 1
        assert await store.kept("written.outside") == "kept" and await store.kept("written.inside") is None


async def test_the_tasks_a_transaction_starts_read_inside_it(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(_job())
        async with asyncio.timeout(30), store.jobs_tx("start the pair") as tx:
            await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=1)
            await tx.add_attempt(Attempt(job_id, 1, None, 1, 29500, time.time()), _runs(job_id))
            read = await asyncio.gather(*(_what_a_client_reads(store, job_id) for _ in range(3)))
            assert read == [("running", ["n1", "n2"], ["n1", "n2"])] * 3  # its own writes, not yet committed


async def test_a_task_cancelled_while_waiting_for_its_turn_leaves_the_connection_to_the_others(
    store_at: StoreAt,
) -> None:
    async with await Store.open(store_at()) as store:
        db = store._db
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(_job())
        go = asyncio.Event()
        waiting = [
            later(go, db.begin()),  # a transaction of its own, as the metrics' scrape begins one
            later(go, _what_a_client_reads(store, job_id)),
            later(go, db.fetchall("SELECT * FROM jobs")),
        ]
        async with asyncio.timeout(30):
            async with store.jobs_tx("held a while") as tx:
                await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=1)
                go.set()
                await asyncio.sleep(PAUSE_S)
                assert not any(t.done() for t in waiting)
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)
            assert not db.turns.held and not db.in_transaction
            assert await _what_a_client_reads(store, job_id) == ("running", [], [])
            async with store.jobs_tx("another") as tx:
                await tx.update_job(job_id, status=JobStatus.QUEUED)
            assert (await _what_a_client_reads(store, job_id))[0] == "queued"


async def test_readers_waiting_for_a_transaction_go_before_the_next_one_of_the_same_task(store_at: StoreAt) -> None:
    """A placement pass starts its jobs one transaction each, back to back: a read waits for one of them only."""
    async with await Store.open(store_at()) as store:
        db = store._db
        first = asyncio.Event()
        begun = 0

        async def writer() -> None:
            nonlocal begun
            for i in range(20):
                async with store._transaction(f"start job {i}"):
                    begun += 1
                    first.set()
                    await db.execute("INSERT INTO meta (key, value) VALUES (?, 'v')", (f"k{i}",))
                    await asyncio.sleep(0.005)

        async def reader() -> int:
            await first.wait()
            await db.fetchall("SELECT * FROM meta")
            return begun  # the transactions begun by the time it was answered

        async with asyncio.timeout(30):
            writing = asyncio.create_task(writer())
            assert await reader() == 1
            await writing


# a read that keeps SQLite's one thread busy a while (100s of ms), sent as a read whose caller went away still runs
# there: a statement queued behind it has not run when a cancellation comes
SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000) SELECT count(*) FROM c"


async def test_a_write_cancelled_twice_while_it_begins_leaves_no_transaction_open(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        db = store._db

        async def write() -> None:
            async with store._transaction("a write cancelled"):
                await db.execute("INSERT INTO meta (key, value) VALUES ('cancelled', 'x')")

        async with asyncio.timeout(60):
            slow = asyncio.ensure_future(db._db.execute_fetchall(SLOW))  # type: ignore[attr-defined]
            writing = asyncio.create_task(write())
            await asyncio.sleep(0.02)  # its BEGIN sent, queued behind the slow read
            writing.cancel()  # the loop stopping
            await asyncio.sleep(0.02)
            writing.cancel()  # and a timeout around the stop
            assert not slow.done()  # the cancellations came before the BEGIN ran (else this tests nothing)
            with pytest.raises(asyncio.CancelledError):
                await writing
            await slow
            assert not db.in_transaction and not db.turns.held
            await store.keep("after", "y")  # the next write
        assert await store.kept("after") == "y" and await store.kept("cancelled") is None


async def test_a_read_only_transaction_cancelled_while_it_commits_gives_its_turn_back(tmp_path: Path) -> None:
    """As the metrics' scrape, cut short by its timeout, reads its counts from one snapshot."""
    async with await Store.open(tmp_path / "state.db") as store:
        db = store._db
        async with asyncio.timeout(60):
            await db.begin(read_only=True)
            slow = asyncio.ensure_future(db._db.execute_fetchall(SLOW))  # type: ignore[attr-defined]
            committing = asyncio.create_task(db.commit())
            await asyncio.sleep(0.02)
            committing.cancel()
            assert not slow.done()  # the cancellation came before the COMMIT ran
            with pytest.raises(asyncio.CancelledError):
                await committing
            await slow
            assert not db.in_transaction and not db.turns.held
            await store.keep("after", "y")  # a write transaction: its turn comes
        assert await store.kept("after") == "y"
