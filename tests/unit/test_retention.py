"""History retention (scheduler/retention.py, store/history.py) on a real store, on both engines: what goes, what
stays, and what outlives the pruned jobs (the per-day usage sums, the restart counts, the pruned counts)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.decide.reconcile import REQUEUED
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.retention import Pruner, day_sums
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import ClusterConfig, HistorySettings
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.history import DAY_S
from ftconsole.scheduler.store.records import NewAlert
from tests.unit.conftest import StoreAt

SPEC = parse_jobspec("name: t\ncommand: x\ngpus_per_node: 2\n")
NOW = 400 * DAY_S  # day 400 of the epoch, at midnight
YEAR = 365 * DAY_S


async def _job(store: Store, owner: str, ended: float | None, *, hours: float = 2.0, requeued: bool = False,
               array_id: int | None = None, status: JobStatus = JobStatus.SUCCEEDED) -> int:  # fmt: skip
    """A job that ran 2 GPUs for `hours` up to `ended` (None: still running), with an event; its first attempt
    requeued (a second attempt ran) when `requeued`."""
    end = ended if ended is not None else NOW - 60
    start = end - hours * 3600
    async with store.jobs_tx("test job") as tx:
        job_id = await tx.add_job(
            Job(0, "t", owner, 1000, SPEC, JobStatus.QUEUED, "normal", "vision", "none", start - 10, array_id=array_id)
        )
        numbers = [1, 2] if requeued else [1]
        for n in numbers:
            await tx.add_attempt(
                Attempt(job_id, n, None, 2, 29500, start, token=f"t{job_id}-{n}"),
                [Run(job_id, n, 0, "gpu01", (0, 1), f"~/r/{job_id}/{n}/0", True)],
            )
            await tx.update_run(Run(job_id, n, 0, "gpu01", (0, 1), "", True), state="exited", started=start,
                                ended=end if ended is not None else None, released=ended is not None)  # fmt: skip
        if requeued:
            await tx.update_attempt(job_id, 1, started=start, ended=start, result=REQUEUED)
        await tx.update_job(job_id, status=status if ended is not None else JobStatus.RUNNING, started=start,
                            ended=ended, attempt=numbers[-1])  # fmt: skip
        await tx.event(start, "Started", "started", job=job_id)
    return job_id


async def _usage(
    store: Store, since: float = 0, until: float | None = NOW, by: str = "user", now: float = NOW
) -> dict[str, Any]:
    """`ftconsole usage --by user` over everything up to NOW, as the scheduler answers it."""
    service = SimpleNamespace(store=store, transport=None, config=ClusterConfig(), all_nodes=[])
    scheduler = Scheduler(service, clock=lambda: now)  # type: ignore[arg-type]
    return await scheduler.usage(Caller(uid=0, gid=0, pid=1, user="root"), since=since, until=until, by=by)


def test_ended_jobs_past_the_age_go_with_all_of_theirs_and_their_usage_stays_per_day(
    store_at: StoreAt, tmp_path: Path
) -> None:
    async def main() -> None:
        async with await Store.open(store_at()) as store:
            old = await _job(store, "ann", NOW - YEAR - 5 * DAY_S, hours=30, requeued=True)  # spans two days
            recent = await _job(store, "ann", NOW - 10 * DAY_S)
            running = await _job(store, "bob", None)
            watched = await _job(store, "bob", NOW - YEAR - 3 * DAY_S, status=JobStatus.ERROR)
            async with store.jobs_tx("alert") as tx:  # an open alert keeps its job
                await tx.alert(NOW - YEAR, "job_failed", "error", "failed", job=watched)
            async with store.jobs_tx("node event") as tx:
                await tx.event(NOW - YEAR - DAY_S, "state-changed", "gpu01 unhealthy", node="gpu01")
                await tx.event(NOW - DAY_S, "state-changed", "gpu01 healthy", node="gpu01")
            before = await _usage(store)
            pruner = Pruner(store, HistorySettings(), clock=lambda: NOW)
            done = await pruner.prune()
            assert done == {"jobs": 1, "events": 1, "alerts": 0}  # events: a node's (a job's go with it, uncounted)
            assert await store.job(old) is None
            assert {j.id for j in await store.jobs(deleted=True)} == {recent, running, watched}
            assert await store.runs(job=old) == [] and await store.attempts(old) == []
            assert await store.events(job=str(old)) == []
            assert [e.message for e in await store.events(node="gpu01")] == ["gpu01 healthy"]  # the old one went
            # what the pruned job used is still in the reports, to the GPU-second
            after = await _usage(store)
            assert after["rows"]["ann"]["gpu_seconds"] == before["rows"]["ann"]["gpu_seconds"]
            assert after["total"]["gpu_seconds"] == before["total"]["gpu_seconds"]
            # the pruned job's days (every ended job is rolled: the kept ones' too)
            days = [d for d in await store.history_days(0, NOW - 300 * DAY_S) if d.owner == "ann"]
            assert len(days) == 2 and sum(d.gpu_seconds for d in days) == 2 * 2 * 30 * 3600  # 2 attempts
            assert [d.jobs for d in days] == [1, 0]  # counted once, on its first day
            # counters never go down: the pruned attempt's restart is counted apart
            assert (await store.pruned_counts())["restarts:requeued"] == 1
            assert (await store.pruned_counts())["jobs"] == 1
            assert await pruner.prune() == {"jobs": 0, "events": 0, "alerts": 0}  # nothing twice

    asyncio.run(main())


def test_an_array_goes_whole_and_off_keeps_everything(store_at: StoreAt, tmp_path: Path) -> None:
    async def main() -> None:
        async with await Store.open(store_at()) as store:
            first = await _job(store, "ann", NOW - YEAR - 9 * DAY_S, array_id=1)  # a new store's first job: id 1
            assert first == 1
            second = await _job(store, "ann", NOW - DAY_S, array_id=first)  # ended lately: the array stays
            assert (await Pruner(store, HistorySettings(), clock=lambda: NOW).prune())["jobs"] == 0
            async with store.jobs_tx("end") as tx:
                await tx.update_job(second, ended=NOW - YEAR - DAY_S)
            assert (await Pruner(store, HistorySettings(jobs=0, events=0), clock=lambda: NOW).prune()) == {
                "jobs": 0, "events": 0, "alerts": 0}  # fmt: skip
            assert (await Pruner(store, HistorySettings(), clock=lambda: NOW).prune())["jobs"] == 2

    asyncio.run(main())


def test_a_backlog_goes_in_batches(tmp_path: Path) -> None:
    async def main() -> None:
        async with await Store.open(tmp_path / "s.db") as store:
            for i in range(450):
                async with store.jobs_tx("job") as tx:
                    await tx.add_job(Job(0, "t", "ann", 1000, SPEC, JobStatus.SUCCEEDED, "normal", "p", "none", 1.0))
                    await tx.event(1.0 + i, "Submitted", "submitted", job=i + 1)
            async with store.jobs_tx("end") as tx:
                for i in range(450):
                    await tx.update_job(i + 1, ended=2.0)
            alerts = [NewAlert(1.0, "node_unhealthy", "error", "x", node="gpu01") for _ in range(3)]
            await store.save_nodes([], alerts=alerts)
            async with store.jobs_tx("resolve one") as tx:
                await tx.set_alert_state((await store.alerts(states=("open",), limit=10))[0].id, "resolved",
                                         by="ann", now=2.0)  # fmt: skip
            of_nodes = len([e for e in await store.events(limit=1000) if e.job is None])
            assert of_nodes >= 1  # the alert's, its resolution's
            done = await Pruner(store, HistorySettings(), clock=lambda: NOW).prune()
            assert done == {"jobs": 450, "events": of_nodes, "alerts": 1}, done
            assert await store.events(limit=1000) == [] and await store.alerts(states=("resolved",), limit=10) == []
            assert await store.jobs(deleted=True) == []

    asyncio.run(main())


def test_day_sums_split_a_run_at_midnight() -> None:
    from ftconsole.scheduler.store.history import Pruning

    job = Job(1, "t", "ann", 1000, SPEC, JobStatus.SUCCEEDED, "normal", "vision", "none", 0.0, ended=DAY_S + 3600)
    run = Run(1, 1, 0, "gpu01", (0, 1), "~/r", True, started=DAY_S - 3600, ended=DAY_S + 3600)
    attempt = Attempt(1, 1, None, 2, 29500, 0.0, started=DAY_S - 3600, ended=DAY_S + 3600, result="succeeded")
    sums = day_sums(Pruning([job], [attempt], [run], []), now=NOW)
    assert [(d.day, d.gpu_seconds, d.jobs) for d in sums] == [(0.0, 7200.0, 1), (DAY_S, 7200.0, 0)]


def test_usage_reads_the_same_before_and_after_the_jobs_are_rolled_into_day_sums(store_at: StoreAt) -> None:
    """Whole days from the day sums, the edges and the jobs not rolled from their runs: every window, cut
    mid-day or on midnights, a day or less, to now, reads the same GPU-seconds, jobs and goodput either way."""
    windows = [
        (0, None),  # everything, to now
        (NOW - 20 * DAY_S + 5 * 3600, NOW - 2 * DAY_S + 7 * 3600),  # cut mid-day at both ends
        (NOW - 20 * DAY_S, NOW - 2 * DAY_S),  # midnights
        (NOW - 11 * DAY_S + 3600, NOW - 10 * DAY_S - 3600),  # less than a day, inside one
        (NOW - 15 * DAY_S + 12 * 3600, NOW - 14 * DAY_S + 2 * 3600),  # across one midnight, no whole day
        (NOW - 3 * DAY_S - 1800, None),  # to now, with the running job
        (NOW - 12 * DAY_S - 3600, NOW - 11 * DAY_S + 3600),  # a job ran across it, ending after it
    ]

    async def main() -> None:
        async with await Store.open(store_at()) as store:
            for days_ago, hours, owner, requeued in [
                (15, 30.0, "ann", True),  # across two midnights, its first attempt requeued
                (14, 2.0, "bob", False),
                (10.5, 50.0, "ann", False),  # across two midnights
                (10, 0.5, "bob", True),
                (2.9, 4.0, "cid", False),
                (1.8, 10.0, "dan", False),  # from a whole day of a window into its last edge: counted once
                (0.01, 1.0, "cid", False),  # ended lately: never rolled in this test
            ]:
                await _job(store, owner, NOW - days_ago * DAY_S, hours=hours, requeued=requeued)
            await _job(store, "bob", None, hours=40)  # still running, since before 3 days ago
            before = {(w, by): await _usage(store, *w, by=by) for w in windows for by in ("user", "project")}
            rolled = await Pruner(store, HistorySettings(), clock=lambda: NOW).roll()
            assert rolled == 6  # the ended jobs, but the one that ended within the hour
            assert await Pruner(store, HistorySettings(), clock=lambda: NOW).roll() == 0  # once
            assert await store.rolled_span() == 50 * 3600
            for (window, by), was in before.items():
                now = await _usage(store, *window, by=by)
                assert now["rows"] == was["rows"] and now["total"] == was["total"], (window, by)
            assert before[(windows[0], "user")]["total"]["jobs"] == 8
            assert before[(windows[1], "user")]["rows"]["ann"]["jobs"] == 2
            assert before[(windows[1], "user")]["rows"]["dan"]["jobs"] == 1

    asyncio.run(main())
