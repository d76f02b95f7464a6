"""`scheduler.reconcile`: what the loop asks the nodes, and what it writes without asking, from one snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.jobs import Job, JobStatus, Run, StopReason
from ftconsole.scheduler.jobspec import JobSpec
from ftconsole.scheduler.reconcile import KILL_MARGIN_S, Actions, Launch, Lose, Read, Snapshot, Stop, reconcile

NOW = 1000.0
GRACE = 30.0


def job(id: int = 1, attempt: int = 1, **fields: Any) -> Job:
    spec = JobSpec.from_json({"name": f"j{id}", "command": "train", "nodes": 2, "mode": "pytorch"})
    return Job(
        id=id, name=spec.name, owner="ann", uid=1000, spec=spec, status=JobStatus.RUNNING, priority="normal",
        project="default", access="none", submitted=0.0, attempt=attempt, **fields,
    )  # fmt: skip


def run(rank: int, state: str, *, job: int = 1, attempt: int = 1, node: str | None = None, **fields: Any) -> Run:
    where = f"/r/{job}/{attempt}/{rank}"
    return Run(job=job, attempt=attempt, rank=rank, node=node or f"n{rank}", gpus=(0,), run_dir=where,
               launch=fields.pop("launch", True), state=state, token="tok", **fields)  # fmt: skip


def snap(jobs: list[Job], runs: list[Run], **fields: Any) -> Snapshot:
    base: dict[str, Any] = {
        "now": NOW,
        "jobs": {j.id: j for j in jobs},
        "runs": runs,
        "nodes": frozenset({"n0", "n1", "n2"}),
        "waiting": {},
        "answered": {},
        "node_timeout": 10.0,
        "stop_grace": GRACE,
    }
    return Snapshot(**{**base, **fields})


def lost(r: Run, reason: str) -> Lose:
    return Lose(r, reason)


R0, R1 = run(0, "running"), run(1, "running")
CASES: list[tuple[str, Snapshot, Actions]] = [
    (
        "running runs are read, one command per node",
        snap([job()], [R0, R1]),
        Actions(read=[Read("n0", (R0,)), Read("n1", (R1,))]),
    ),
    (
        "intents are launched, per attempt",
        snap([job()], [run(0, "intent"), run(1, "intent")]),
        Actions(launch=[Launch(1, 1, (run(0, "intent"), run(1, "intent")))]),
    ),
    (
        "a start with no answer is sent again (idempotent: it reads what happened)",
        snap([job()], [run(0, "unknown"), R1]),
        Actions(launch=[Launch(1, 1, (run(0, "unknown"),))], read=[Read("n1", (R1,))]),
    ),
    (
        "a resize's new attempt waits while the old one is up",
        snap([job(attempt=2)], [run(0, "running", attempt=1), run(0, "intent", attempt=2)]),
        Actions(
            stop=[Stop("n0", (run(0, "running", attempt=1),), False)],
            read=[Read("n0", (run(0, "running", attempt=1),))],
        ),
    ),
    (
        "a resize's new attempt starts once the old one is down",
        snap([job(attempt=2)], [run(0, "exited", attempt=1), run(0, "intent", attempt=2)]),
        Actions(launch=[Launch(1, 2, (run(0, "intent", attempt=2),))]),
    ),
    (
        "a stopping job: stop sent until the node confirms it",
        snap([job(stop_reason=StopReason.STOPPED)], [R0]),
        Actions(stop=[Stop("n0", (R0,), False)], read=[Read("n0", (R0,))]),
    ),
    (
        "confirmed, within the grace period: nothing more",
        snap([job(stop_reason=StopReason.STOPPED)], [run(0, "running", stop_sent=NOW - GRACE)]),
        Actions(read=[Read("n0", (run(0, "running", stop_sent=NOW - GRACE),))]),
    ),
    (
        "grace and margin over and still running: the scheduler kills it",
        snap([job(stop_reason=StopReason.STOPPED)], [run(0, "running", stop_sent=NOW - GRACE - KILL_MARGIN_S)]),
        Actions(
            stop=[Stop("n0", (run(0, "running", stop_sent=NOW - GRACE - KILL_MARGIN_S),), True)],
            read=[Read("n0", (run(0, "running", stop_sent=NOW - GRACE - KILL_MARGIN_S),))],
        ),
    ),
    (
        "an orphaned run (supervisor dead, processes alive) is killed at once",
        snap([job()], [run(0, "orphaned")]),
        Actions(stop=[Stop("n0", (run(0, "orphaned"),), True)], read=[Read("n0", (run(0, "orphaned"),))]),
    ),
    (
        "a node that left the config: its runs are lost, nothing is sent there",
        snap([job()], [run(0, "running", node="gone"), R1]),
        Actions(
            lose=[lost(run(0, "running", node="gone"), "node gone is no longer in the cluster config")],
            read=[Read("n1", (R1,))],
        ),
    ),
    (
        "a node silent for node_timeout: its runs are lost, an unknown start too",
        snap([job()], [run(0, "running"), run(1, "unknown")], waiting={"n0": NOW - 10.0, "n1": NOW - 10.0}),
        Actions(lose=[lost(run(0, "running"), "SILENT"), lost(run(1, "unknown"), "SILENT")], silent=["n0", "n1"]),
    ),
    (
        "a stall shorter than node_timeout costs nothing",
        snap([job()], [R0], waiting={"n0": NOW - 9.9}),
        Actions(read=[Read("n0", (R0,))]),
    ),
    (
        "ended, prepared and released runs ask for nothing",
        snap([job()], [run(0, "exited", exit_code=0), run(1, "prepared", launch=False)]),
        Actions(),
    ),
    ("runs of jobs not running are not this table's", snap([], [R0]), Actions()),
]


@pytest.mark.parametrize(("name", "snapshot", "expected"), CASES, ids=[c[0] for c in CASES])
def test_reconcile(name: str, snapshot: Snapshot, expected: Actions) -> None:
    actions = reconcile(snapshot)
    if any(lose.reason == "SILENT" for lose in expected.lose):
        assert all(lose.reason.startswith("node unreachable since ") for lose in actions.lose)
        assert all("(no answer for 10s)" in lose.reason for lose in actions.lose)
        actions = Actions(
            lose=[Lose(lose.run, "SILENT") for lose in actions.lose],
            launch=actions.launch, stop=actions.stop, read=actions.read, silent=actions.silent,
        )  # fmt: skip
    assert actions == expected


def test_reconcile_is_the_same_twice() -> None:
    """Level-triggered: the same snapshot gives the same actions (safe to run again after a crash)."""
    s = snap([job(stop_reason=StopReason.ERROR)], [run(0, "intent"), run(1, "running"), run(2, "orphaned", node="n2")])
    assert reconcile(s) == reconcile(s)
