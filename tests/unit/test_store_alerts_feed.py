"""The store's alerts (raised once, acknowledged, resolved, by whom, with events), the job feed
(`jobs_changed`: cursor, stamps, deleted jobs, never half a transaction), job activity and node fault counts."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store import db as store_mod
from ftconsole.scheduler.store.db import ALERT_STATES, Store
from ftconsole.scheduler.store.records import AutoResolve, JobActivity, NewAlert
from tests.unit.conftest import StoreAt

SPEC = JobSpec.from_json({"name": "train", "command": "python3 train.py"})
WAIT = 10.0


def new_job(name: str = "train", **fields: Any) -> Job:
    base: dict[str, Any] = {
        "id": 0,
        "name": name,
        "owner": "ann",
        "uid": 1000,
        "spec": SPEC,
        "status": JobStatus.QUEUED,
        "priority": "normal",
        "project": "default",
        "access": "none",
        "submitted": 1.0,
    }
    return Job(**{**base, **fields})


def runs_of(job_id: int, attempt: int, nodes: list[str]) -> list[Run]:
    return [
        Run(job=job_id, attempt=attempt, rank=i, node=n, gpus=(i,), run_dir=f"/r/{job_id}/{attempt}/{i}", launch=True)
        for i, n in enumerate(nodes)
    ]


@pytest.fixture
async def store(store_at: StoreAt) -> AsyncIterator[Store]:
    """A new store, on SQLite and on PostgreSQL (tests/unit/conftest.py)."""
    async with await Store.open(store_at()) as s:
        yield s


async def add_jobs(store: Store, *names: str) -> list[int]:
    async with store.jobs_tx("submit") as tx:
        return [await tx.add_job(new_job(n)) for n in names]


async def place(store: Store, job_id: int, attempt: int, nodes: list[str]) -> list[Run]:
    runs = runs_of(job_id, attempt, nodes)
    async with store.jobs_tx("place") as tx:
        await tx.update_job(job_id, status=JobStatus.RUNNING, attempt=attempt)
        await tx.add_attempt(Attempt(job_id, attempt, None, 1, 29500, 2.0), runs)
    return runs


async def changed(store: Store, since: float | None) -> tuple[float, dict[int, Job]]:
    cursor, jobs, _ = await store.jobs_changed(since)
    return cursor, {j.id: j for j in jobs}


# -- alerts ---------------------------------------------------------------------------------------------------


async def test_ack_then_resolve_records_who_when_and_an_event_each(store: Store) -> None:
    (job_id,) = await add_jobs(store, "train")
    async with store.jobs_tx("fail") as tx:
        await tx.alert(5.0, "job_failed", "error", "job 1 failed", job=job_id)
    await store.save_nodes(
        [], alerts=[NewAlert(6.0, "node_unreachable", "error", "gpu01 is unreachable", node="gpu01")]
    )
    job_alert, node_alert = await store.alerts()
    assert (job_alert.kind, job_alert.job, job_alert.state, job_alert.acked_by) == ("job_failed", job_id, "open", None)
    assert (node_alert.node, node_alert.job, node_alert.severity) == ("gpu01", None, "error")

    (acked,) = await store.ack_alerts([job_alert.id], by="bob", now=10.0)
    assert (acked.state, acked.acked_by, acked.acked_at, acked.resolved_at) == ("acknowledged", "bob", 10.0, None)
    assert (await store.ack_alerts([str(job_alert.id)], by="eve", now=11.0))[0].acked_by == "bob"  # no change
    (resolved,) = await store.resolve_alerts([job_alert.id], by="carol", now=12.0)
    assert (resolved.state, resolved.resolved_by, resolved.resolved_at) == ("resolved", "carol", 12.0)
    assert (resolved.acked_by, resolved.acked_at) == ("bob", 10.0)
    assert resolved.to_json()["resolved_by"] == "carol" and set(resolved.to_json()) >= {"acked_at", "resolved_at"}
    # a resolved alert stays resolved: acking it changes nothing
    assert (await store.ack_alerts([job_alert.id], by="eve", now=13.0))[0].state == "resolved"

    events = [(e.kind, e.message) for e in await store.events(job=str(job_id))]
    assert events == [
        ("alert-acknowledged", f"alert {job_alert.id} (job_failed, job {job_id}) acknowledged by bob"),
        ("alert-resolved", f"alert {job_alert.id} (job_failed, job {job_id}) resolved by carol"),
    ]
    assert [a.id for a in await store.alerts()] == [node_alert.id]
    everything = await store.alerts(states=ALERT_STATES)
    assert [(a.id, a.state) for a in everything] == [(job_alert.id, "resolved"), (node_alert.id, "open")]
    assert [a.id for a in await store.alerts(states=ALERT_STATES, limit=1)] == [node_alert.id]


async def test_unknown_or_bad_alert_ids_change_nothing(store: Store) -> None:
    await store.save_nodes([], alerts=[NewAlert(1.0, "node_unhealthy", "error", "x", node="gpu01")])
    (alert,) = await store.alerts()
    with pytest.raises(NotFound, match="no alert 98, 99"):
        await store.ack_alerts([alert.id, 98, 99], by="bob", now=2.0)
    with pytest.raises(UsageError, match="not an alert id: 'x1'"):
        await store.resolve_alerts(["x1"], by="bob", now=2.0)
    assert (await store.alerts())[0].state == "open"
    assert await store.events() == []


async def test_node_alerts_are_raised_once_while_open_and_resolved_by_ftconsole(store: Store) -> None:
    down = NewAlert(1.0, "node_unreachable", "error", "gpu01 is unreachable: refused", node="gpu01")
    await store.save_nodes([], alerts=[down])
    await store.save_nodes([], alerts=[dataclasses.replace(down, time=2.0)])  # still open: not again
    (first,) = await store.alerts()
    await store.ack_alerts([first.id], by="bob", now=3.0)
    await store.save_nodes([], alerts=[dataclasses.replace(down, time=4.0)])  # acknowledged is still open
    assert len(await store.alerts(states=ALERT_STATES)) == 1
    # the same kind on another node is another alert
    await store.save_nodes([], alerts=[dataclasses.replace(down, node="gpu02", message="gpu02 ...")])
    assert [a.node for a in await store.alerts()] == ["gpu01", "gpu02"]

    await store.save_nodes([], resolve=[AutoResolve(5.0, "gpu01", "node_unreachable", "gpu01 is healthy again")])
    resolved = (await store.alerts(states=ALERT_STATES))[0]
    assert (resolved.state, resolved.resolved_by, resolved.resolved_at) == ("resolved", "ftconsole", 5.0)
    (event,) = [e for e in await store.events(node="gpu01") if e.kind == "alert-resolved"]
    assert event.message.endswith("resolved by ftconsole: gpu01 is healthy again")
    assert event.data == {"alert": first.id, "kind": "node_unreachable", "by": "ftconsole"}
    # over: the next time it goes down is a new alert
    await store.save_nodes([], alerts=[dataclasses.replace(down, time=6.0)])
    assert [(a.node, a.state) for a in await store.alerts(states=ALERT_STATES)][-1] == ("gpu01", "open")
    assert await store.open_node_alerts() == {"gpu01": {"node_unreachable"}, "gpu02": {"node_unreachable"}}


async def test_faults_count_node_events_into_unhealthy_unreachable_or_isolated(store: Store) -> None:
    def changed_to(node: str, to: str) -> NodeEvent:
        return NodeEvent(1.0, node, "state-changed", f"x -> {to}", {"from": "healthy", "to": to})

    a, b = NodeHealth("a", health=NodeState.HEALTHY), NodeHealth("b")
    await store.save_nodes([(a, [changed_to("a", "unreachable")]), (b, [changed_to("b", "healthy")])])
    await store.save_nodes([(a, [changed_to("a", "degraded"), changed_to("a", "unhealthy")])])
    await store.save_nodes(
        [(a, [NodeEvent(2.0, "a", "isolated", "isolated by x"), NodeEvent(3.0, "a", "rebooted", "")])]
    )
    assert await store.node_faults() == {"a": 3, "b": 0}


# -- the job feed ---------------------------------------------------------------------------------------------


async def test_jobs_changed_returns_each_change_after_the_cursor(store: Store) -> None:
    first, second, third = await add_jobs(store, "a", "b", "c")
    cursor, jobs = await changed(store, None)
    assert sorted(jobs) == [first, second, third]
    assert (await changed(store, cursor))[1] == {}  # nothing changed since

    runs = await place(store, second, 1, ["gpu01"])
    cursor, jobs = await changed(store, cursor)
    assert list(jobs) == [second] and jobs[second].status is JobStatus.RUNNING

    async with store.jobs_tx("heartbeat") as tx:  # a run's output moved: its job changed
        await tx.update_run(runs[0], output_at=42.0)
    cursor, listed, activity = await store.jobs_changed(cursor)
    assert [j.id for j in listed] == [second] and activity[second].last_output == 42.0

    async with store.jobs_tx("fail") as tx:  # an alert about a job changes its open_alerts
        await tx.alert(7.0, "job_failed", "error", "failed", job=first)
    cursor, jobs = await changed(store, cursor)
    assert list(jobs) == [first]
    (alert,) = await store.alerts()
    await store.ack_alerts([alert.id], by="ann", now=8.0)
    cursor, jobs = await changed(store, cursor)
    assert list(jobs) == [first]

    async with store.jobs_tx("delete") as tx:
        await tx.update_job(third, status=JobStatus.STOPPED, deleted=True)
    cursor, jobs = await changed(store, cursor)
    assert list(jobs) == [third] and jobs[third].deleted  # the client learns it is gone
    assert sorted((await changed(store, None))[1]) == [first, second]  # a fresh listing has no deleted jobs


async def test_a_clock_stepping_back_does_not_hide_changes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    (job_id,) = await add_jobs(store, "a")
    cursor, _ = await changed(store, None)
    monkeypatch.setattr(store_mod.time, "time", lambda: 1000.0)  # far in the past
    async with store.jobs_tx("priority") as tx:
        await tx.update_job(job_id, priority="urgent")
    later, jobs = await changed(store, cursor)
    assert list(jobs) == [job_id] and later > cursor


async def test_a_failed_transaction_leaves_no_stamp(store: Store) -> None:
    (job_id,) = await add_jobs(store, "a")
    cursor, _ = await changed(store, None)
    with pytest.raises(store_mod.Conflict):
        async with store.jobs_tx("stop") as tx:
            await tx.update_job(job_id, priority="urgent")
            await tx.update_job(job_id, expect=[JobStatus.RUNNING], status=JobStatus.STOPPED)
    assert (await changed(store, cursor))[1] == {}


async def test_jobs_changed_never_reads_half_a_transaction(store: Store) -> None:
    first, second = await add_jobs(store, "a", "b")
    cursor, _ = await changed(store, None)
    inside, release = asyncio.Event(), asyncio.Event()

    async def slow_write() -> None:
        async with store.jobs_tx("two steps") as tx:
            await tx.update_job(first, priority="urgent")
            inside.set()
            await release.wait()
            await tx.update_job(second, priority="urgent")

    writer = asyncio.create_task(slow_write())
    await asyncio.wait_for(inside.wait(), WAIT)
    reader = asyncio.create_task(changed(store, cursor))
    await asyncio.sleep(0.05)
    assert not reader.done()  # it waits for the transaction to end
    release.set()
    await asyncio.wait_for(writer, WAIT)
    _, jobs = await asyncio.wait_for(reader, WAIT)
    assert sorted(jobs) == [first, second] and all(j.priority == "urgent" for j in jobs.values())


# -- activity -------------------------------------------------------------------------------------------------


async def test_job_activity_reads_the_current_attempt(store: Store) -> None:
    busy, idle = await add_jobs(store, "busy", "idle")
    old = await place(store, busy, 1, ["gpu09"])
    runs = await place(store, busy, 2, ["gpu02", "gpu01", "gpu02"])
    async with store.jobs_tx("heartbeats") as tx:
        await tx.update_run(old[0], output_at=99.0)  # an earlier attempt: not what runs now
        await tx.update_run(runs[0], output_at=10.0)
        await tx.update_run(runs[2], output_at=12.5)
        await tx.alert(1.0, "job_failed", "error", "x", job=busy)
        await tx.alert(2.0, "job_failed", "error", "y", job=busy)
    resolved = (await store.alerts())[0]
    await store.resolve_alerts([resolved.id], by="ann", now=3.0)

    activity = await store.job_activity()
    assert activity[busy] == JobActivity(last_output=12.5, open_alerts=1, node_names=("gpu02", "gpu01"))
    assert idle not in activity  # nothing yet: the defaults
    assert JobActivity().to_json() == {"last_output": None, "open_alerts": 0, "node_names": []}
    assert await store.job_activity([idle]) == {}
    assert (await store.job_activity([busy]))[busy].to_json() == {
        "last_output": 12.5,
        "open_alerts": 1,
        "node_names": ["gpu02", "gpu01"],
    }


async def test_private_jobs_are_the_access_none_jobs_of_other_uids(store: Store) -> None:
    async with store.jobs_tx("add") as tx:
        mine = await tx.add_job(new_job("mine", uid=1000))
        theirs = await tx.add_job(new_job("theirs", uid=2000))
        shared = await tx.add_job(new_job("shared", uid=2000, access="read-only"))
    assert await store.private_jobs(except_uid=1000) == {theirs}
    assert await store.private_jobs(except_uid=2000) == {mine}
    assert shared not in await store.private_jobs(except_uid=3000)
