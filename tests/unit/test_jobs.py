"""Job decisions from tables (`jobs.settle`, `jobs.expired`), the jobs part of the store, and who may act."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import (
    AllRunning,
    Attempt,
    Finish,
    Job,
    JobStatus,
    Run,
    StopOthers,
    StopReason,
    expired,
    settle,
)
from ftconsole.scheduler.errors import NotFound, PermissionDenied
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import Conflict
from ftconsole.scheduler.store.schema import SCHEMA_VERSION
from tests.unit.conftest import StoreAt

SPEC = JobSpec.from_json({"name": "train", "command": "python3 train.py", "max_runtime": 60})


def make_job(**fields: Any) -> Job:
    base: dict[str, Any] = {
        "id": 1,
        "name": "train",
        "owner": "ann",
        "uid": 1000,
        "spec": SPEC,
        "status": JobStatus.RUNNING,
        "priority": "normal",
        "project": "default",
        "access": "none",
        "submitted": 0.0,
        "started": 100.0,
        "attempt": 1,
    }
    return Job(**{**base, **fields})


def run(rank: int, state: str, exit_code: int | None = None, *, launch: bool = True, **fields: Any) -> Run:
    return Run(
        job=1,
        attempt=1,
        rank=rank,
        node=f"n{rank}",
        gpus=(0,),
        run_dir=f"/r/1/1/{rank}",
        launch=launch,
        state=state,
        exit_code=exit_code,
        **fields,
    )


SETTLE_CASES = [
    ("all starting", make_job(), [run(0, "starting"), run(1, "running")], False, None),
    ("all running, first look", make_job(), [run(0, "running"), run(1, "running")], False, AllRunning()),
    ("all running, already said", make_job(), [run(0, "running"), run(1, "running")], True, None),
    (
        "every rank exit 0",
        make_job(),
        [run(0, "exited", 0), run(1, "exited", 0)],
        True,
        Finish(JobStatus.SUCCEEDED, "every rank exited with code 0", 0),
    ),
    (
        "a rank failed, the other runs: stop it",
        make_job(),
        [run(0, "running"), run(1, "exited", 3)],
        True,
        StopOthers("rank 1 on n1 exited with code 3"),
    ),
    (
        "a rank failed while stopping for it: wait",
        make_job(stop_reason=StopReason.ERROR, message="rank 1 on n1 exited with code 3"),
        [run(0, "running"), run(1, "exited", 3)],
        True,
        None,
    ),
    (
        "after the others are down: error with the first failure",
        make_job(stop_reason=StopReason.ERROR, message="rank 1 on n1 exited with code 3"),
        [run(0, "exited", None, signal="SIGTERM"), run(1, "exited", 3)],
        True,
        Finish(JobStatus.ERROR, "rank 1 on n1 exited with code 3", 3),
    ),
    (
        "could not start",
        make_job(),
        [run(0, "failed", error="cannot start pyhton3: No such file")],
        False,
        Finish(JobStatus.ERROR, "rank 0 on n0: cannot start pyhton3: No such file", None),
    ),
    (
        "supervisor lost",
        make_job(),
        [run(0, "lost")],
        True,
        Finish(
            JobStatus.ERROR,
            "rank 0 on n0 lost: its supervisor is gone without recording an end",
            None,
        ),
    ),
    (
        "stopped by a user: killed ranks do not make it an error",
        make_job(stop_reason=StopReason.STOPPED, stop_by="ann"),
        [run(0, "exited", None, signal="SIGTERM")],
        True,
        Finish(JobStatus.STOPPED, "stopped by ann", None),
    ),
    (
        "expired",
        make_job(stop_reason=StopReason.EXPIRED, stop_by="scheduler"),
        [run(0, "exited", 143)],
        True,
        Finish(JobStatus.EXPIRED, "max_runtime reached", 143),
    ),
    (
        "stopped before it started",
        make_job(stop_reason=StopReason.STOPPED, stop_by="ann"),
        [run(0, "cancelled")],
        False,
        Finish(JobStatus.STOPPED, "stopped by ann", None),
    ),
    (
        "ranks mpirun starts do not count",
        make_job(),
        [run(0, "exited", 0), run(1, "prepared", launch=False)],
        True,
        Finish(JobStatus.SUCCEEDED, "every rank exited with code 0", 0),
    ),
    (
        "two failures: the first to end is named",
        make_job(),
        [run(0, "exited", 1, ended=20.0), run(1, "exited", 2, ended=10.0)],
        True,
        Finish(JobStatus.ERROR, "rank 1 on n1 exited with code 2 (and 1 more rank(s))", 1),
    ),
]


@pytest.mark.parametrize(
    ("job", "runs", "was_running", "expected"), [c[1:] for c in SETTLE_CASES], ids=[c[0] for c in SETTLE_CASES]
)
def test_settle(job: Job, runs: list[Run], was_running: bool, expected: object) -> None:
    assert settle(job, runs, was_running=was_running) == expected


@pytest.mark.parametrize(
    ("job", "now", "expected"),
    [
        (make_job(), 159.9, False),
        (make_job(), 160.0, True),
        (make_job(extra_runtime=30), 170.0, False),
        (make_job(stop_reason=StopReason.STOPPED), 500.0, False),
        (make_job(status=JobStatus.QUEUED, started=None), 500.0, False),
        (make_job(spec=JobSpec.from_json({"name": "x", "command": "true"})), 1e9, False),
    ],
)
def test_expired(job: Job, now: float, expected: bool) -> None:
    assert expired(job, now) is expected


# -- store -----------------------------------------------------------------------------------------------------
# (on SQLite and on PostgreSQL: `store_at`, tests/unit/conftest.py)


async def test_store_jobs_round_trip_and_conditional_updates(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        assert await store.schema_version() == SCHEMA_VERSION
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(status=JobStatus.QUEUED, started=None))
            await tx.event(1.0, "Pending", "submitted", job=job_id)
        job = await store.job(job_id)
        assert job is not None and job.spec == SPEC and job.status is JobStatus.QUEUED
        attempt = Attempt(job=job_id, number=1, spec_name=None, gpus_per_node=1, master_port=29500, created=2.0)
        async with store.jobs_tx("place") as tx:
            await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING, started=2.0, attempt=1)
            await tx.add_attempt(attempt, [run(0, "intent"), run(1, "intent")])
        assert [r.state for r in await store.runs(held=True)] == ["intent", "intent"]
        assert await store.attempts(job_id) == [attempt]

        # a conditional update that finds the job changed rolls back everything in its transaction
        with pytest.raises(Conflict):
            async with store.jobs_tx("stop") as tx:
                await tx.event(3.0, "Stopped", "should vanish", job=job_id)
                await tx.update_job(job_id, expect=[JobStatus.QUEUED], status=JobStatus.STOPPED)
        assert [e.kind for e in await store.events(job=str(job_id))] == ["Pending"]
        assert (await store.job(job_id)).status is JobStatus.RUNNING  # type: ignore[union-attr]

        async with store.jobs_tx("finish") as tx:
            await tx.update_job(job_id, expect=[JobStatus.RUNNING], status=JobStatus.SUCCEEDED, ended=4.0)
            await tx.release_runs(job_id)
        assert await store.runs(held=True) == []
        assert [j.id for j in await store.jobs(statuses=[JobStatus.SUCCEEDED])] == [job_id]


async def test_a_requeue_cancels_what_never_started_and_never_undoes_a_users_stop(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("submit") as tx:
            job_id = await tx.add_job(make_job(attempt=1))
            attempt = Attempt(job=job_id, number=1, spec_name=None, gpus_per_node=1, master_port=1, created=2.0)
            await tx.add_attempt(attempt, [run(0, "intent"), run(1, "intent")])
            await tx.update_job(job_id, stop_requested=3.0, stop_reason=StopReason.STOPPED, stop_by="ann")
        runs = await store.runs(job=job_id)
        with pytest.raises(Conflict, match="being stopped"):
            async with store.jobs_tx("requeue") as tx:
                await tx.requeue(job_id, 1, runs, 4.0, result="requeued", cause="c", message="m")
        job = await store.job(job_id)
        assert job is not None and job.status is JobStatus.RUNNING and job.stop_reason is StopReason.STOPPED

        async with store.jobs_tx("a failure of ours instead") as tx:
            await tx.update_job(job_id, stop_reason=StopReason.ERROR, stop_by="scheduler")
        async with store.jobs_tx("requeue") as tx:
            await tx.requeue(job_id, 1, runs, 4.0, result="requeued", cause="gpu07 died", message="queued again")
        job = await store.job(job_id)
        assert job is not None and job.status is JobStatus.QUEUED and job.requeued and job.stop_reason is None
        assert [(r.state, r.error) for r in await store.runs(job=job_id)] == [("cancelled", "gpu07 died")] * 2
        assert await store.runs(held=True) == []
        (ended,) = await store.attempts(job_id)
        assert (ended.result, ended.message, ended.ended) == ("requeued", "gpu07 died", 4.0)


async def test_store_refuses_unknown_columns(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        with pytest.raises(ValueError, match="cannot set"):
            async with store.jobs_tx("bad") as tx:
                await tx.update_job(1, owner="mallory")


# -- who may act -----------------------------------------------------------------------------------------------


def scheduler_with(admins: list[str]) -> Scheduler:
    config = ClusterConfig.model_validate({"admins": admins})
    service = SimpleNamespace(store=None, transport=None, config=config, all_nodes=[])
    return Scheduler(service)  # type: ignore[arg-type]


ANN = Caller(uid=1000, gid=1000, pid=1, user="ann")
BOB = Caller(uid=1001, gid=1001, pid=2, user="bob")
ALICE = Caller(uid=1002, gid=1002, pid=3, user="alice")
ROOT = Caller(uid=0, gid=0, pid=4, user="root")


@pytest.mark.parametrize(
    ("caller", "access", "write", "refused"),
    [
        (ANN, "none", True, None),  # the owner
        (BOB, "none", False, NotFound),  # a job bob may not see is, to him, no job at all
        (BOB, "none", True, NotFound),
        (BOB, "read-only", False, None),
        (BOB, "read-only", True, PermissionDenied),
        (BOB, "read-write", True, None),
        (ALICE, "none", True, None),  # an admin by name
        (ROOT, "none", True, None),  # root
    ],
)
def test_who_may_act_on_a_job(caller: Caller, access: str, write: bool, refused: type[Exception] | None) -> None:
    scheduler = scheduler_with(["alice"])
    job = make_job(access=access)
    if refused is None:
        scheduler._check(caller, job, "stop", write=write)
    elif refused is NotFound:
        with pytest.raises(NotFound) as caught:
            scheduler._check(caller, job, "stop", write=write)
        assert str(caught.value) == "no job 1"  # as `_job` says of a job that does not exist: no owner, no access
    else:
        with pytest.raises(PermissionDenied, match=f"bob may not stop job 1: it belongs to ann .*'{access}'"):
            scheduler._check(caller, job, "stop", write=write)


@pytest.mark.parametrize(
    ("message", "cloned_from", "shown_message", "shown_from"),
    [
        ("waiting (position 2): blocked behind job 7 (head of queue)", 7,
         "waiting (position 2): blocked behind a job you cannot see", None),
        ("waiting (position 2): blocked behind job 8 (head of queue)", 8,
         "waiting (position 2): blocked behind job 8 (head of queue)", 8),
        ("", None, "", None),
    ],
)  # fmt: skip
def test_a_job_shown_names_no_job_the_caller_may_not_see(
    message: str, cloned_from: int | None, shown_message: str, shown_from: int | None
) -> None:
    job = make_job(id=9, message=message, cloned_from=cloned_from)
    shown = scheduler_with([]).redact_job(job, frozenset({7}))
    assert (shown.message, shown.cloned_from) == (shown_message, shown_from)
