"""The usage ledger (decide/ledger.py, store/ledger.py): fair share's decayed usage and the quotas' GPU-hours
kept by folding each ended run in once, against the same summed from every run; on a real store, on both engines,
across folds, restarts and a changed half-life."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftconsole.scheduler.decide import fairshare
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.decide.ledger import Ledger, slot_length
from ftconsole.scheduler.decide.usage import overlap
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt

DAY = 86400.0
HALF = 7 * DAY
PERIOD = 30 * DAY
SLOT = slot_length(PERIOD)
SPEC = parse_jobspec("name: t\ncommand: x\ngpus_per_node: 2\n")


def decayed(runs: list[SimpleNamespace], now: float, half_life: float = HALF) -> dict[tuple[str, str], float]:
    """Each (owner, project)'s decayed GPU-seconds at `now`, summed from every run."""
    out: dict[tuple[str, str], float] = {}
    for r in runs:
        end = now if r.ended is None else min(r.ended, now)
        out[(r.owner, r.project)] = out.get((r.owner, r.project), 0.0) + r.gpus * fairshare.decayed_seconds(
            r.started, end, now, half_life
        )
    return out


def hours(runs: list[SimpleNamespace], since: float, now: float) -> dict[tuple[str, str], float]:
    """Each quota key's GPU-hours in [since, now), summed from every run."""
    out: dict[tuple[str, str], float] = {}
    for r in runs:
        seconds = r.gpus * overlap(r.started, now if r.ended is None else r.ended, since, now)
        for key in (("user", r.owner), ("project", r.project)):
            if seconds > 0:
                out[key] = out.get(key, 0.0) + seconds / 3600
    return out


def close(got: dict[tuple[str, str], float], want: dict[tuple[str, str], float], *, within: float = 1e-6) -> None:
    assert set(got) == {k for k, v in want.items() if v > 0}
    for key, value in want.items():
        assert got.get(key, 0.0) == pytest.approx(value, rel=within, abs=1e-6), key


def test_the_slot_is_a_720th_of_the_period_in_whole_minutes() -> None:
    assert slot_length(30 * DAY) == 3600
    assert slot_length(DAY) == 120
    assert slot_length(3600) == 60  # a minute at least


runs_strategy = st.lists(
    st.tuples(
        st.integers(0, 3),  # owner
        st.integers(0, 2),  # project
        st.integers(1, 8),  # gpus
        st.floats(0, 80 * DAY),  # start
        st.floats(1, 3 * DAY),  # length
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(runs_strategy, st.integers(1, 5))
def test_folding_runs_as_they_end_keeps_what_summing_every_run_gives(spec: list[tuple], folds: int) -> None:
    runs = [SimpleNamespace(owner=f"u{o}", project=f"p{p}", gpus=g, started=s, ended=s + n) for o, p, g, s, n in spec]
    now = 90 * DAY
    times = sorted({now - DAY * k for k in range(folds)})  # folds over the last days, the last one now
    ledger = Ledger(at=0.0, half_life=HALF, slot=SLOT, since=0.0)
    done: set[int] = set()
    for at in times:
        ended = [i for i, r in enumerate(runs) if r.ended <= at and i not in done]
        ledger.fold([runs[i] for i in ended], at, at - PERIOD)
        done.update(ended)
    # what was not ended by the last fold still runs: added fresh
    running = [SimpleNamespace(**{**vars(runs[i]), "ended": None}) for i in range(len(runs)) if i not in done]
    whole = [runs[i] for i in done] + running
    close(ledger.usage(running, now, declared={"p0", "p1", "p2"}), _by_account(decayed(whole, now)), within=1e-9)
    # a window that starts at a slot's start: exact; any other: off by at most what its first slot held
    close(ledger.hours(running, now - PERIOD, now), hours(whole, now - PERIOD, now), within=1e-9)
    since = now - PERIOD + 0.4 * SLOT
    got, want = ledger.hours(running, since, now), hours(whole, since, now)
    edge = hours(whole, since - 0.4 * SLOT, since + 0.6 * SLOT)
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) <= edge.get(key, 0.0) + 1e-9


def test_accounts_follow_the_declared_projects_and_slots_out_of_the_period_go() -> None:
    ledger = Ledger(at=0.0, half_life=HALF, slot=SLOT, since=0.0)
    old = SimpleNamespace(owner="ann", project="vision", gpus=8, started=0.0, ended=DAY)
    new = SimpleNamespace(owner="ann", project="scratch", gpus=8, started=40 * DAY, ended=41 * DAY)
    ledger.fold([old, new], 41 * DAY, 41 * DAY - PERIOD)
    used = ledger.usage([], 41 * DAY, declared={"vision"})
    assert set(used) == {("vision", "ann"), ("default", "ann")}  # an undeclared project counts as the default
    assert set(ledger.hours([], 41 * DAY - PERIOD, 41 * DAY)) == {("user", "ann"), ("project", "scratch")}
    assert all(start + SLOT > 41 * DAY - PERIOD for kept in ledger.slots.values() for start in kept)


# -- on a store ---------------------------------------------------------------------------------------------------


async def _job(store: Store, owner: str, started: float, ended: float | None, *, gpus: int = 2) -> int:
    async with store.jobs_tx("test job") as tx:
        job_id = await tx.add_job(Job(0, "t", owner, 1000, SPEC, JobStatus.QUEUED, "normal", "vision", "none", 0.0))
        run = Run(job_id, 1, 0, "gpu01", tuple(range(gpus)), "~/r", True)
        await tx.add_attempt(Attempt(job_id, 1, None, gpus, 29500, started, token=f"t{job_id}"), [run])
        await tx.update_run(run, state="exited" if ended else "running", started=started, ended=ended)
    return job_id


async def _end(store: Store, job_id: int, ended: float, *, gpus: int = 2) -> None:
    async with store.jobs_tx("end") as tx:
        await tx.update_run(Run(job_id, 1, 0, "gpu01", tuple(range(gpus)), "", True), state="exited", ended=ended)


async def _folds(store: Store) -> int:
    row = await store._db.fetchone("SELECT folds FROM ledger")
    return -1 if row is None else int(row[0])


def test_a_store_folds_each_ended_run_once_and_goes_on_from_its_ledger_after_a_restart(store_at: StoreAt) -> None:
    rng = random.Random(7)
    now = 100 * DAY

    async def main() -> None:
        spans: list[SimpleNamespace] = []
        async with await Store.open(store_at()) as store:
            for i in range(30):
                start = now - rng.uniform(1, 70) * DAY
                end = start + rng.uniform(0.1, 2) * DAY
                await _job(store, f"u{i % 3}", start, end)
                spans.append(SimpleNamespace(owner=f"u{i % 3}", project="vision", gpus=2, started=start, ended=end))
            running = await _job(store, "u0", now - DAY, None)
            ledger = await store.fold_usage(now, half_life=HALF, slot=SLOT, since=now - PERIOD, kept=None)
            first = await _folds(store)
            live = await store.unsettled_usage()
            assert [(r.owner, r.gpus, r.started) for r in live] == [("u0", 2, now - DAY)]
            close(ledger.usage(live, now, declared={"vision"}), _by_account(decayed([*spans, *_as_running(live)], now)))
            # nothing ended since: what it had, nothing written
            again = await store.fold_usage(now + 60, half_life=HALF, slot=SLOT, since=now + 60 - PERIOD, kept=ledger)
            assert again is ledger and await _folds(store) == first
            # the running job ends: folded in once, however often it is asked
            await _end(store, running, now + 120)
            spans.append(SimpleNamespace(owner="u0", project="vision", gpus=2, started=now - DAY, ended=now + 120))
            for at in (now + 180, now + 240):
                ledger = await store.fold_usage(at, half_life=HALF, slot=SLOT, since=at - PERIOD, kept=ledger)
            assert await _folds(store) == first + 1
            assert await store.unsettled_usage() == []
            close(ledger.usage([], now + 240, declared={"vision"}), _by_account(decayed(spans, now + 240)))
            close(ledger.hours([], now + 240 - PERIOD, now + 240), hours(spans, now + 240 - PERIOD, now + 240))
        # a restart: the ledger is read back, not built again from the runs
        async with await Store.open(store_at()) as store:
            await store._db.execute("UPDATE runs SET gpus = '[0,1,2,3,4,5,6,7]'")  # were it read again, it would show
            later = now + DAY
            read = await store.fold_usage(later, half_life=HALF, slot=SLOT, since=later - PERIOD, kept=None)
            close(read.usage([], later, declared={"vision"}), _by_account(decayed(spans, later)))
            # another half-life: built again from the runs (now of 8 GPUs each)
            other = await store.fold_usage(later, half_life=2 * DAY, slot=SLOT, since=later - PERIOD, kept=read)
            eight = [SimpleNamespace(**{**vars(s), "gpus": 8}) for s in spans]
            close(other.usage([], later, declared={"vision"}), _by_account(decayed(eight, later, 2 * DAY)), within=2e-3)

    asyncio.run(main())


def test_a_run_ended_before_it_started_is_folded_again_once_it_starts(store_at: StoreAt) -> None:
    now = 10 * DAY

    async def main() -> None:
        async with await Store.open(store_at()) as store:
            job_id = await _job(store, "ann", now - 3600, None)
            run = Run(job_id, 1, 0, "gpu01", (0, 1), "", True)
            async with store.jobs_tx("a second run, cancelled before its start") as tx:
                second = Run(job_id, 2, 0, "gpu02", (0, 1), "", True)
                await tx.add_attempt(Attempt(job_id, 2, None, 2, 29500, now), [second])
                await tx.update_run(second, state="cancelled", ended=now - 60)
            ledger = await store.fold_usage(now, half_life=HALF, slot=SLOT, since=now - PERIOD, kept=None)
            assert ledger.hours([], now - PERIOD, now) == {}  # the first still runs; the second never started
            async with store.jobs_tx("its start is read late") as tx:
                await tx.update_run(second, started=now - 120)
                await tx.update_run(run, ended=now, state="exited")
                await tx.update_run(run, ended=now + 999)  # an end is written once
            ledger = await store.fold_usage(now + 1, half_life=HALF, slot=SLOT, since=now + 1 - PERIOD, kept=ledger)
            assert ledger.hours([], now + 1 - PERIOD, now + 1)[("user", "ann")] == pytest.approx(2 * (3600 + 60) / 3600)

    asyncio.run(main())


def _as_running(rows: list) -> list[SimpleNamespace]:
    return [SimpleNamespace(owner=r.owner, project=r.project, gpus=r.gpus, started=r.started, ended=None) for r in rows]


def _by_account(used: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """(owner, project) -> (project, owner), as fair share's accounts are keyed (the project declared)."""
    return {(project, owner): v for (owner, project), v in used.items()}
