"""A job's bandwidth check (`preflight: {bandwidth: true}`, `Recoverer.preflight`) on a real store: a slow node in
service is isolated only where two partners each saw it slow; on one partner's word (a two-node job, or a partner
that could not take part) it stays in service, and the job is queued again without it, as with a node another job
uses too. The streams are scripted (`recovery.check` replaced by the real judge over given rates, as in
test_fabric_burn_in), no node is reached; the probe before it finds nothing wrong."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler import recovery
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.placing import Placer
from ftconsole.scheduler.recovery import Recoverer
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from tests.unit.test_fabric_burn_in import NOW, Scripted, service_of

ONE_PARTNER = "one partner is not enough to take a node in service out"


@dataclass
class Checked:
    """What one pre-flight left: whether the job goes on, the job, n1's health, the job's Preflight lines that
    are no item, its Restarting line, and how it ended where its retries were used up."""

    went_on: bool
    job: Job
    n1: NodeHealth
    notes: list[str]
    restarting: list[str]
    failed: list[str]


def spec(nodes: int) -> JobSpec:
    return JobSpec.from_json({"name": "wide", "command": "true", "mode": "pytorch", "nodes": nodes,
                              "preflight": {"bandwidth": True}, "fault_tolerance": {"retries": 1}})  # fmt: skip


def new_job(given: JobSpec) -> Job:
    return Job(0, given.name, "ann", 1000, given, JobStatus.RUNNING, "normal", "default", "none", 1.0)


def runs_of(job_id: int, attempt: int, names: list[str]) -> list[Run]:
    return [Run(job=job_id, attempt=attempt, rank=i, node=name, gpus=(0,), run_dir=f"/r/{job_id}/{attempt}/{i}",
                launch=i == 0) for i, name in enumerate(names)]  # fmt: skip


async def place(store: Store, given: JobSpec, names: list[str], used_retries: int = 0) -> Job:
    """A job of `given` running on `names` (attempt 1 + used_retries: its runs not started yet), its earlier
    attempts ended `requeued`."""
    number = 1 + used_retries
    async with store.jobs_tx("place") as tx:
        job_id = await tx.add_job(new_job(given))
        await tx.update_job(job_id, started=2.0, attempt=number)
        for n in range(1, number):
            await tx.add_attempt(Attempt(job_id, n, None, 1, 29500, 2.0), [])
            await tx.update_attempt(job_id, n, ended=3.0, result="requeued", message="pre-flight failed")
        await tx.add_attempt(Attempt(job_id, number, None, 1, 29500, 4.0), runs_of(job_id, number, names))
    placed = await store.job(job_id)
    assert placed is not None
    return placed


async def preflight(service: ClusterService, monkeypatch: pytest.MonkeyPatch, job: Job, scripted: Scripted
                    ) -> Checked:  # fmt: skip
    async def probe(*args: Any, **kwargs: Any) -> list[Any]:
        return []  # nothing wrong with the hardware: on to the bandwidth check

    async def fail(job: Job, message: str) -> None:
        failed.append(message)

    failed: list[str] = []
    monkeypatch.setattr(service, "probe", probe)
    monkeypatch.setattr(recovery, "check", scripted)
    placer = Placer(service, clock=lambda: NOW, poke=lambda: None, fail=fail, run_root=lambda: "/r")
    recoverer = Recoverer(service, placer, clock=lambda: NOW, poke=lambda: None)
    attempt = await service.store.attempt(job.id, job.attempt)
    assert attempt is not None
    went_on = await recoverer.preflight(job, attempt, fail)
    after = await service.store.job(job.id)
    assert after is not None
    events = await service.store.events(job=str(job.id))
    notes = [e.message for e in events if e.kind == "Preflight" and not e.message.startswith("item ")]
    restarting = [e.message for e in events if e.kind == "Restarting"]
    return Checked(went_on, after, (await service.store.all_node_health())["n1"], notes, restarting, failed)


@pytest.mark.parametrize(
    ("count", "names", "broken", "saw"),
    [
        (3, ["n1", "n2"], (), "n2"),  # a two-node job: n1 has one partner
        (4, ["n1", "n2", "n3"], ("n3",), "n2"),  # three nodes, but n3 could not take part
    ],
)
async def test_a_slow_node_that_only_one_partner_saw_stays_in_service_and_the_job_goes_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, names: list[str], broken: tuple[str, ...], saw: str
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, count)
        job = await place(store, spec(len(names)), names)
        checked = await preflight(service, monkeypatch, job, Scripted({"n1"}, broken))
    assert not checked.went_on and not checked.failed
    assert checked.n1.admin is None and checked.n1.state is NodeState.HEALTHY
    assert checked.job.status is JobStatus.QUEUED and checked.job.requeued
    assert checked.job.excluded == ("n1",)  # placement leaves it out of this job's next attempt
    why = f"only {saw} saw it slow: {ONE_PARTNER}"
    assert checked.notes == [f"n1 stays in service, left out of this job only: {why}"]
    (text,) = checked.restarting
    assert text.startswith("attempt 1 failed: pre-flight failed: n1 item fabric: fail 0.05 Gbit/s 0.5 Gbit/s")
    assert text.endswith(f"; not on n1 again ({why}); queued again at the front (resubmit 1 of 1)"), text
    assert "isolated" not in text
    assert service.tester.counts[("fabric", "fail", "preflight")] == 1


async def test_a_slow_node_that_two_partners_each_saw_is_isolated_and_the_job_queued_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 4)
        job = await place(store, spec(3), ["n1", "n2", "n3"])
        checked = await preflight(service, monkeypatch, job, Scripted({"n1"}))
    assert not checked.went_on and checked.job.status is JobStatus.QUEUED
    assert checked.n1.admin is NodeState.ISOLATED and checked.n1.admin_by == "scheduler"
    assert checked.n1.admin_reason.startswith(
        f"job {job.id} attempt 1: pre-flight failed: n1 item fabric: fail 0.05 Gbit/s 0.5 Gbit/s (slow on its way "
        "out: sends n2 0.05 Gbit/s, n3 0.05 Gbit/s"
    ), checked.n1.admin_reason
    assert checked.job.excluded == () and checked.notes == []
    (text,) = checked.restarting
    assert text.endswith("; isolated n1; queued again at the front (resubmit 1 of 1)"), text


async def test_a_slow_node_another_job_uses_is_left_out_as_before_whatever_the_partners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 4)
        await place(store, JobSpec.from_json({"name": "other", "command": "sleep 600"}), ["n1"])
        job = await place(store, spec(3), ["n1", "n2", "n3"])
        checked = await preflight(service, monkeypatch, job, Scripted({"n1"}))
    assert checked.n1.admin is None and checked.job.excluded == ("n1",) and checked.notes == []
    (text,) = checked.restarting
    assert text.endswith(
        "; not on n1 again (another job uses it: its traffic may be why); queued again at the front (resubmit 1 of 1)"
    ), text


async def test_with_its_retries_used_up_the_job_fails_and_a_node_one_partner_saw_slow_stays_in_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 3)
        job = await place(store, spec(2), ["n1", "n2"], used_retries=1)
        checked = await preflight(service, monkeypatch, job, Scripted({"n1"}))
    assert not checked.went_on and checked.n1.admin is None
    (message,) = checked.failed
    assert message.startswith("error,exiting: pre-flight failed: n1 item fabric: fail")
    assert message.endswith("(resubmitted 1 of 1 times)"), message
    assert checked.notes == [f"n1 stays in service, left out of this job only: only n2 saw it slow: {ONE_PARTNER}"]


async def test_a_node_out_of_service_meanwhile_is_kept_out_on_one_partner_s_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 3)
        job = await place(store, spec(2), ["n1", "n2"])
        await service.drain("n1", reason="by hand", by="ann")  # after its placement, before its pre-flight
        checked = await preflight(service, monkeypatch, job, Scripted({"n1"}))
    assert checked.n1.admin is NodeState.DRAINED  # isolating a drained node keeps it drained, with the fault
    assert checked.job.excluded == () and checked.notes == []
    (text,) = checked.restarting
    assert "; isolated n1; queued again" in text, text


async def test_two_nodes_both_slow_with_no_sender_standing_out_are_both_left_out_and_stay_in_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 4)
        job = await place(store, spec(2), ["n1", "n2"])
        checked = await preflight(service, monkeypatch, job, Scripted({"n1", "n2"}))
        healths = await store.all_node_health()
    assert healths["n1"].admin is None and healths["n2"].admin is None
    assert checked.job.excluded == ("n1", "n2")
    assert checked.notes == [
        f"n1 stays in service, left out of this job only: only n2 saw it slow: {ONE_PARTNER}",
        f"n2 stays in service, left out of this job only: only n1 saw it slow: {ONE_PARTNER}",
    ]
    (text,) = checked.restarting
    assert f"; not on n1, n2 again (only n1 saw it slow: {ONE_PARTNER}); not on" not in text  # one reason each
    assert f"; not on n1 again (only n2 saw it slow: {ONE_PARTNER}); not on n2 again (only n1" in text, text
