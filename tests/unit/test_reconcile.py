"""`scheduler.decide.reconcile`: what the loop asks the nodes, and what it writes without asking, from one snapshot."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Attempt, Finish, Job, JobStatus, Run, StopReason, settle
from ftconsole.scheduler.decide.reconcile import (
    KILL_MARGIN_S,
    PROBE_WAIT_S,
    Actions,
    GiveUp,
    Health,
    Hold,
    Launch,
    Lose,
    Preempted,
    ProbeFirst,
    Read,
    Recovery,
    Requeue,
    RestartInPlace,
    Shrink,
    Snapshot,
    Stop,
    dumps,
    hang_restarts,
    reconcile,
    recover,
)
from ftconsole.scheduler.spec.jobspec import JobSpec

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


def test_a_node_proven_down_is_lost_before_node_timeout_and_only_while_it_is_asked() -> None:
    why = "down or rebooting: 127.0.0.9:22 refuses connections (no sshd)"
    actions = reconcile(snap([job()], [R0, R1], waiting={"n0": NOW - 2.0}, silence={"n0": why}, dead={"n0"}))
    (lose,) = actions.lose
    assert lose.run == R0 and lose.reason.endswith(f"(no answer for 2s): {why}") and actions.silent == ["n0"]
    assert actions.read == [Read("n1", (R1,))]
    answered = reconcile(snap([job()], [R0], dead={"n0"}))  # it answered since: no longer waited for
    assert answered.lose == [] and answered.read == [Read("n0", (R0,))]


def test_a_silent_node_is_lost_with_why_it_gives_no_answer() -> None:
    why = "hung: 127.0.0.9:22 takes TCP connections, SSH does not answer"
    actions = reconcile(snap([job()], [R0], waiting={"n0": NOW - 10}, silence={"n0": why}))
    (lose,) = actions.lose
    assert lose.reason.startswith("node unreachable since ") and lose.reason.endswith(f"(no answer for 10s): {why}")


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


# -- recover: what a failed attempt leads to --------------------------------------------------------------------


def ft_job(attempt: int = 1, stop_reason: StopReason | None = StopReason.ERROR, **ft: Any) -> Job:
    spec = JobSpec.from_json({"name": "j", "command": "train", "nodes": 2, "mode": "pytorch", "fault_tolerance": ft})
    return Job(
        id=1, name="j", owner="ann", uid=1000, spec=spec, status=JobStatus.RUNNING, priority="normal",
        project="default", access="none", submitted=0.0, attempt=attempt, stop_reason=stop_reason,
    )  # fmt: skip


def ended(rank: int, state: str = "exited", code: int | None = 1, at: float = NOW - 5, **fields: Any) -> Run:
    return run(rank, state, exit_code=code, ended=at, **fields)


def attempts(*results: str | None) -> list[Attempt]:
    return [Attempt(job=1, number=i + 1, spec_name=None, gpus_per_node=1, master_port=1, created=0.0, result=r)
            for i, r in enumerate(results)]  # fmt: skip


FRESH = {"n0": Health("healthy", (), NOW - 1), "n1": Health("healthy", (), NOW - 1)}
OLD = {"n0": Health("healthy", (), NOW - 60), "n1": Health("healthy", (), NOW - 60)}
ECC = {**FRESH, "n1": Health("unhealthy", ("gpu 0: 2 uncorrectable ECC errors",), NOW - 1)}
STOPPED_BY_US = ended(0, signal="SIGTERM", code=None, at=NOW - 4)  # a rank the scheduler stopped
STOPPED_1 = ended(1, signal="SIGTERM", code=None, at=NOW - 4)
UNREACHABLE = "node unreachable since 10:00:00 (no answer for 10s)"
LOST = ended(1, "lost", None, error=UNREACHABLE, fault=UNREACHABLE)  # lost by the scheduler: its node is silent
# lost as the node says: what the run's user can cause (pkill of the supervisor, a status.json rewritten)
GONE = ended(1, "lost", None, error="its supervisor died without recording an end", boot_id="b1")
FAKED_REBOOT = ended(1, "lost", None, error="the node rebooted since the run started", boot_id="b1")
BOOT_1 = {name: dataclasses.replace(h, boot_id="b1") for name, h in FRESH.items()}  # the run's boot, probed now
REBOOTED = {**BOOT_1, "n1": dataclasses.replace(BOOT_1["n1"], boot_id="b2")}
RECOVERY: list[tuple[str, Job, list[Run], list[Attempt], dict[str, Health], Recovery]] = [
    ("no policy, healthy: error", ft_job(), [ended(0), ended(1, code=0)], attempts(None), OLD, None),
    (
        "retries, exit 1, no probe since the failure: probe first",
        ft_job(retries=1),
        [ended(0), STOPPED_1],
        attempts(None),
        OLD,
        ProbeFirst(("n0", "n1")),
    ),
    (
        "retries, probes waited for too long: decided on what is known (healthy: error)",
        ft_job(retries=1),
        [ended(0, at=NOW - PROBE_WAIT_S - 1), STOPPED_1],
        attempts(None),
        OLD,
        None,
    ),
    (
        "retries, exit 1, fresh probes say healthy: error (scenario 4)",
        ft_job(retries=1),
        [ended(0), STOPPED_1],
        attempts(None),
        FRESH,
        None,
    ),
    (
        "retries, a node unhealthy: isolate it, requeue (scenario 3)",
        ft_job(retries=2),
        [STOPPED_BY_US, ended(1)],
        attempts(None),
        ECC,
        Requeue(("n1",), "hardware fault: n1 unhealthy: gpu 0: 2 uncorrectable ECC errors", 1, 2),
    ),
    (
        "retries, a rank lost with its node: requeue without probing",
        ft_job(retries=1),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        Requeue(("n1",), f"hardware fault: {LOST.describe()}", 1, 1),
    ),
    (
        "retries used up: error,exiting",
        ft_job(attempt=3, retries=2),
        [STOPPED_BY_US, LOST],
        attempts("requeued", "requeued", None),
        OLD,
        GiveUp(f"error,exiting: hardware fault: {LOST.describe()} (resubmitted 2 of 2 times)"),
    ),
    ("no retries: a lost node ends the job as before", ft_job(), [STOPPED_BY_US, LOST], attempts(None), OLD, None),
    (
        "max_restarts, 137 (the default codes): restart in place",
        ft_job(max_restarts=2),
        [ended(0, code=137), STOPPED_1],
        attempts(None),
        OLD,
        RestartInPlace(f"{ended(0, code=137).describe()}: exit code 137 restarts (max_restarts 2)", 1, 2),
    ),
    (
        "max_restarts, killed by SIGKILL counts as 137",
        ft_job(max_restarts=1),
        [ended(0, code=None, signal="SIGKILL"), STOPPED_1],
        attempts(None),
        OLD,
        RestartInPlace(
            f"{ended(0, code=None, signal='SIGKILL').describe()}: exit code 137 restarts (max_restarts 1)", 1, 1
        ),
    ),
    (
        "max_restarts, exit 1 is the user's failure",
        ft_job(max_restarts=2),
        [ended(0), STOPPED_1],
        attempts(None),
        OLD,
        None,
    ),
    (
        "restart_exit_codes lists 1: restart",
        ft_job(max_restarts=1, restart_exit_codes=[1]),
        [ended(0), STOPPED_1],
        attempts(None),
        OLD,
        RestartInPlace(f"{ended(0).describe()}: exit code 1 restarts (max_restarts 1)", 1, 1),
    ),
    (
        "max_restarts used up: error,exiting",
        ft_job(attempt=3, max_restarts=2),
        [ended(0, code=137), STOPPED_1],
        attempts("restarted", "restarted", None),
        OLD,
        GiveUp(f"error,exiting: {ended(0, code=137).describe()} (restarted in place 2 of 2 times)"),
    ),
    (
        "stopped by a user: never restarted",
        ft_job(stop_reason=StopReason.STOPPED, max_restarts=2, retries=2),
        [ended(0, code=137), LOST],
        attempts(None),
        ECC,
        None,
    ),
    (
        "past max_runtime: never restarted",
        ft_job(stop_reason=StopReason.EXPIRED, max_restarts=2),
        [ended(0, code=137), STOPPED_1],
        attempts(None),
        OLD,
        None,
    ),
]


def attempts_ended(*results: tuple[str | None, float | None]) -> list[Attempt]:
    return [Attempt(job=1, number=i + 1, spec_name=None, gpus_per_node=1, master_port=1, created=0.0, result=r,
                    ended=e) for i, (r, e) in enumerate(results)]  # fmt: skip


RECOVERY += [
    (
        "backoff: the first restart waits restart_backoff after the failure",
        ft_job(max_restarts=2, restart_backoff=10),
        [ended(0, code=137), STOPPED_1],
        attempts(None),
        OLD,
        Hold(
            NOW + 5,
            f"restart 1 of 2 at {time.strftime('%H:%M:%S', time.localtime(NOW + 5))} (restart_backoff 10s, doubled)",
        ),
    ),
    (
        "backoff: the second one waits twice as long (4 s: over)",
        ft_job(attempt=2, max_restarts=2, restart_backoff=2),
        [ended(0, code=137), STOPPED_1],
        attempts("restarted", None),
        OLD,
        RestartInPlace(f"{ended(0, code=137).describe()}: exit code 137 restarts (max_restarts 2)", 2, 2),
    ),
    (
        "backoff: the second one waits twice as long (6 s: not over)",
        ft_job(attempt=2, max_restarts=2, restart_backoff=3),
        [ended(0, code=137), STOPPED_1],
        attempts("restarted", None),
        OLD,
        Hold(
            NOW + 1,
            f"restart 2 of 2 at {time.strftime('%H:%M:%S', time.localtime(NOW + 1))} (restart_backoff 3s, doubled)",
        ),
    ),
    (
        "restart_time_limit over since the first failure: error,exiting",
        ft_job(attempt=2, max_restarts=5, restart_time_limit=60),
        [ended(0, code=137), STOPPED_1],
        attempts_ended(("restarted", NOW - 61), (None, None)),
        OLD,
        GiveUp(
            f"error,exiting: {ended(0, code=137).describe()} (restarts are allowed for 1m after the first "
            "failure, 61s ago; restart_time_limit)"
        ),
    ),
    (
        "restart_time_limit not over yet: restart",
        ft_job(attempt=2, max_restarts=5, restart_time_limit=60),
        [ended(0, code=137), STOPPED_1],
        attempts_ended(("restarted", NOW - 30), (None, None)),
        OLD,
        RestartInPlace(f"{ended(0, code=137).describe()}: exit code 137 restarts (max_restarts 5)", 2, 5),
    ),
]


def resumable(attempt: int = 1, stop_reason: StopReason | None = StopReason.RESCHEDULE) -> Job:
    job = ft_job(attempt=attempt, stop_reason=stop_reason, checkpoint_resume={"max_resumes": 1})
    return dataclasses.replace(job, message="hardware fault: n1 gpu 0: 1 uncorrectable ECC errors")


RECOVERY += [
    (
        "checkpoint resume: stopped to be rescheduled -> requeued (its nodes were isolated then)",
        resumable(),
        [ended(0, code=None, signal="SIGTERM"), STOPPED_1],
        attempts(None),
        ECC,
        Requeue((), "hardware fault: n1 gpu 0: 1 uncorrectable ECC errors", 1, 1),
    ),
    (
        "checkpoint resume: resumes used up -> error,exiting",
        resumable(attempt=2),
        [ended(0, code=None, signal="SIGTERM"), STOPPED_1],
        attempts("requeued", None),
        ECC,
        GiveUp("error,exiting: hardware fault: n1 gpu 0: 1 uncorrectable ECC errors (resumed 1 of 1 times)"),
    ),
    (
        "checkpoint resume: a node failure counts like retries (max_resumes)",
        resumable(stop_reason=StopReason.ERROR),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        Requeue(("n1",), f"hardware fault: {LOST.describe()}", 1, 1),
    ),
]


def preempted(**ft: Any) -> Job:
    return dataclasses.replace(ft_job(stop_reason=StopReason.PREEMPTED, **ft), message="preempted by job 9 (urgent)")


RECOVERY += [
    (
        "preempted: queued again at the front, whatever its retries (none here, none spent)",
        preempted(),
        [ended(0, code=None, signal="SIGTERM"), STOPPED_1],
        attempts("requeued", None),
        OLD,
        Preempted("preempted by job 9 (urgent)"),
    ),
    (
        "preempted with its resumes used up: still queued again (a preemption spends none)",
        preempted(checkpoint_resume={"max_resumes": 1}),
        [ended(0, code=None, signal="SIGTERM"), STOPPED_1],
        attempts("requeued", "preempted", None),
        OLD,
        Preempted("preempted by job 9 (urgent)"),
    ),
]


def stretchy(min_nodes: int) -> Job:
    return ft_job(elastic={"min_nodes": min_nodes})


# Claims and evidence (issue 40): a loss the node reports is the run's user's claim; a node leaves service only on
# what the scheduler saw itself (no answer, another boot read by its own probe, its checks)
RECOVERY += [
    (
        "retries, the supervisor gone (a pkill of one's own), no probe since: probe first",
        ft_job(retries=1),
        [STOPPED_BY_US, GONE],
        attempts(None),
        OLD,
        ProbeFirst(("n0", "n1")),
    ),
    (
        "retries, the supervisor gone, fresh probes say healthy: the job's own failure, no node isolated",
        ft_job(retries=1),
        [STOPPED_BY_US, GONE],
        attempts(None),
        BOOT_1,
        None,
    ),
    (
        "retries, status.json says rebooted but the probe reads the run's boot: the job's own failure",
        ft_job(retries=2),
        [STOPPED_BY_US, FAKED_REBOOT],
        attempts(None),
        BOOT_1,
        None,
    ),
    (
        "retries, the probe reads another boot than the run's: the node rebooted, isolate and requeue",
        ft_job(retries=2),
        [STOPPED_BY_US, FAKED_REBOOT],
        attempts(None),
        REBOOTED,
        Requeue(("n1",), f"hardware fault: {FAKED_REBOOT.describe()}", 1, 2),
    ),
    (
        "retries, the supervisor gone on a node the probe reads unhealthy: the node's",
        ft_job(retries=1),
        [STOPPED_BY_US, GONE],
        attempts(None),
        ECC,
        Requeue(("n1",), "hardware fault: n1 unhealthy: gpu 0: 2 uncorrectable ECC errors", 1, 1),
    ),
    (
        "elastic, the supervisor gone, no probe since: probe first (never shrink on a claim)",
        stretchy(1),
        [STOPPED_BY_US, GONE],
        attempts(None),
        OLD,
        ProbeFirst(("n0", "n1")),
    ),
    (
        "elastic, the supervisor gone, fresh probes say healthy: no shrink",
        stretchy(1),
        [STOPPED_BY_US, GONE],
        attempts(None),
        BOOT_1,
        None,
    ),
    (
        "no retries, the supervisor gone: the job ends, nothing probed",
        ft_job(),
        [STOPPED_BY_US, GONE],
        attempts(None),
        OLD,
        None,
    ),
]


RECOVERY += [
    (
        "elastic, a node lost, enough left: go on at once on the others",
        stretchy(1),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        Shrink(("n0",), ("n1",), f"hardware fault: {LOST.describe()}"),
    ),
    (
        "elastic, too few left: as any job (no retries: error)",
        stretchy(2),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        None,
    ),
    (
        "elastic, a program failure on healthy nodes: no shrink",
        stretchy(1),
        [ended(0), STOPPED_1],
        attempts(None),
        FRESH,
        None,
    ),
]


K137 = ended(0, code=137)
RECOVERY += [
    (
        "strategies recover-in-place, recover: in place first",
        ft_job(max_restarts=1, retries=1, strategies=["recover-in-place", "recover"]),
        [K137, STOPPED_1],
        attempts(None),
        FRESH,
        RestartInPlace(f"{K137.describe()}: exit code 137 restarts (max_restarts 1)", 1, 1),
    ),
    (
        "strategies recover-in-place, recover: in place used up, then a new placement (nothing isolated)",
        ft_job(attempt=2, max_restarts=1, retries=1, strategies=["recover-in-place", "recover"]),
        [K137, STOPPED_1],
        attempts("restarted", None),
        FRESH,
        Requeue((), f"{K137.describe()}: exit code 137 restarts", 1, 1),
    ),
    (
        "strategies recover, recover-in-place: a new placement first",
        ft_job(max_restarts=1, retries=1, strategies=["recover", "recover-in-place"]),
        [K137, STOPPED_1],
        attempts(None),
        FRESH,
        Requeue((), f"{K137.describe()}: exit code 137 restarts", 1, 1),
    ),
    (
        "strategies recover, recover-in-place: both used up, error,exiting says so",
        ft_job(attempt=3, max_restarts=1, retries=1, strategies=["recover", "recover-in-place"]),
        [K137, STOPPED_1],
        attempts("requeued", "restarted", None),
        FRESH,
        GiveUp(f"error,exiting: {K137.describe()} (resubmitted 1 of 1 times, restarted in place 1 of 1 times)"),
    ),
    (
        "strategies recover-in-place, exit: a hardware fault is not restarted in place, the job ends",
        ft_job(max_restarts=2, strategies=["recover-in-place", "exit"]),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        None,
    ),
    (
        "strategies recover with retries: a hardware fault requeues as without strategies",
        ft_job(retries=1, strategies=["recover"]),
        [STOPPED_BY_US, LOST],
        attempts(None),
        OLD,
        Requeue(("n1",), f"hardware fault: {LOST.describe()}", 1, 1),
    ),
    (
        "strategies recover: an exit outside restart_exit_codes is the user's failure",
        ft_job(retries=1, strategies=["recover"], restart_exit_codes=[137]),
        [ended(0), STOPPED_1],
        attempts(None),
        FRESH,
        None,
    ),
    (
        "without strategies, retries alone never requeue an exit on healthy hardware (seed 000)",
        ft_job(retries=1),
        [K137, STOPPED_1],
        attempts(None),
        FRESH,
        None,
    ),
]


def hung_job(attempt: int = 1, **ft: Any) -> Job:
    job = ft_job(attempt=attempt, stop_reason=StopReason.HUNG, **ft)
    return dataclasses.replace(job, message="suspected hung: no I/O", stop_requested=NOW - 1)


RECOVERY += [
    (
        "hang_action restart, max_restarts left: in place",
        hung_job(max_restarts=1),
        [STOPPED_BY_US, STOPPED_1],
        attempts(None),
        FRESH,
        RestartInPlace("suspected hung: no I/O (max_restarts 1)", 1, 1),
    ),
    (
        "hang_action restart, only retries: placed anew (nothing isolated)",
        hung_job(retries=1),
        [STOPPED_BY_US, STOPPED_1],
        attempts(None),
        FRESH,
        Requeue((), "suspected hung: no I/O", 1, 1),
    ),
    (
        "hang_action restart, the node isolated for its hardware: placed anew away from it, not in place",
        hung_job(max_restarts=1, retries=1),
        [STOPPED_BY_US, STOPPED_1],
        attempts(None),
        {**FRESH, "n1": Health("isolated", ("job 1: the hang's evidence points to its hardware",), NOW - 1)},
        Requeue(("n1",), "suspected hung: no I/O; placed away from n1", 1, 1),
    ),
    (
        "hang_action restart, the node isolated, no retry left: error,exiting, saying where",
        hung_job(max_restarts=1),
        [STOPPED_BY_US, STOPPED_1],
        attempts(None),
        {**FRESH, "n1": Health("isolated", (), NOW - 1)},
        GiveUp("error,exiting: suspected hung: no I/O (n1 isolated: not restarted there; resubmitted 0 of 0 times)"),
    ),
    (
        "hang_action restart, restarts used up: error,exiting",
        hung_job(attempt=2, max_restarts=1),
        [STOPPED_BY_US, STOPPED_1],
        attempts("restarted", None),
        FRESH,
        GiveUp("error,exiting: suspected hung: no I/O (restarted in place 1 of 1 times)"),
    ),
]


def test_hang_restarts_count_the_latest_attempts_that_ended_hung_in_a_row() -> None:
    def ended(*messages: str) -> list[Attempt]:
        return [Attempt(job=1, number=i + 1, spec_name=None, gpus_per_node=1, master_port=1, created=0.0,
                        ended=1.0, message=m) for i, m in enumerate(messages)]  # fmt: skip

    assert hang_restarts([]) == 0
    assert hang_restarts(ended("suspected hung: a", "suspected hung: b")) == 2
    assert hang_restarts(ended("suspected hung: a", "rank 0 exited with code 137", "suspected hung: c")) == 1
    assert hang_restarts(ended("suspected hung: a", "rank 0 exited with code 137")) == 0


@pytest.mark.parametrize(("what", "the_job", "runs", "history", "health", "expected"), RECOVERY,
                         ids=[c[0] for c in RECOVERY])  # fmt: skip
def test_recover(
    what: str, the_job: Job, runs: list[Run], history: list[Attempt], health: dict[str, Health], expected: Recovery
) -> None:
    assert recover(the_job, runs, history, health, NOW) == expected


def test_a_preempted_job_gets_the_checkpoint_signal_and_is_requeued_unless_it_had_ended_by_itself() -> None:
    saving = preempted(checkpoint_resume={"max_resumes": 1})
    assert dumps(saving) and not dumps(preempted())  # the checkpoint signal first, with checkpoint_resume
    done = [ended(0, code=0), ended(1, code=0)]  # both ranks ended by themselves before any stop was sent
    assert settle(saving, done, was_running=True) == Finish(
        JobStatus.SUCCEEDED, "every rank exited with code 0 (before its preemption)", 0
    )
    stopped = [ended(0, code=0, stop_sent=NOW - 9), ended(1, code=0, stop_sent=NOW - 9)]  # exit 0 on our SIGTERM
    finish = settle(saving, stopped, was_running=True)
    assert isinstance(finish, Finish) and finish.status is JobStatus.ERROR  # recovery requeues it (above)
