"""What the loop does with the runs of running jobs, decided from one snapshot (pure: no I/O, no clock).

`reconcile(snapshot)` sorts the held runs (those whose GPUs are not released) into sets by run state, node
state and whether their attempt is still current, as Nomad's reconciler does, and returns the actions for
each set. The executor (`scheduler.executor`) carries them out, concurrently per node, and writes each
outcome with its event. Settling what a job's runs mean (all running, a rank failed, all done) is
`scheduler.jobs.settle`; this module decides what to ask the nodes and what to write without asking.

The sets, in the order a run is checked:
- gone: its node left the config -> `Lose` (nothing can reach it; its job settles `error`);
- silent: the loop has waited `node_timeout` for its node to answer, or its node is proven down sooner (its
  connection was lost and its SSH port refuses: `Snapshot.dead`) -> `Lose` "node unreachable since T"; the
  node is swept once it answers again (fencing); a node nobody asks anything is never silent;
- to launch: `intent` or `unknown` (a start sent with no answer) -> `Launch` of its attempt; the start is
  idempotent on the node (one claim per attempt token), so sending it again only reads what happened. A
  resized job's new attempt waits until every run of the old one is down;
- to stop: the job is being stopped, or the attempt is no longer current (a resize replaced it), or the run
  is `orphaned` (its supervisor died, its processes run on) -> `Stop` until the node confirms (`stop_sent`),
  then `Stop(force)` once the grace period and `KILL_MARGIN_S` are over and it still runs; orphans always;
- to read: `starting`, `running`, `orphaned` -> `Read` of its node (one command for all of them).

`recover(...)` decides what a failed attempt leads to, once every rank of it is down (seeds 000, 002, 004):
- a hardware fault on one of its nodes (a rank lost with its node: unreachable, rebooted, supervisor gone;
  or a node the checks now read unhealthy or unreachable) -> `Requeue`: those nodes isolated, the job queued
  again at the front, while `retries` allow (scenario 3); then `GiveUp` ("error,exiting");
- no hardware fault seen yet, `retries` set, and a node not probed since the failure -> `ProbeFirst` (the
  exit may be the first sign of a failing GPU), for at most `PROBE_WAIT_S`;
- healthy hardware and an exit the restart policy covers (`max_restarts` set; `restart_exit_codes`, by default
  128 and above: killed by a signal, as Kubeflow's ExitCode policy) -> `RestartInPlace` on the same nodes,
  while `max_restarts` allow, once `restart_backoff` (doubled each restart) has passed since the failure
  (`Hold` until then); then `GiveUp`;
- restarts past `restart_time_limit` after the first failure -> `GiveUp`;
- anything else -> None: the job ends `error` (scenario 4).
An elastic job with a hardware fault goes on at once on the nodes left, while they are at least its
`min_nodes` -> `Shrink` (no limit: each one isolates a node). A `checkpoint_resume` job counts like `retries`
with `max_resumes`; one stopped to be rescheduled (a hardware
fault while it ran: it got its checkpoint signal and `grace_period`, see `scheduler.recovery`) -> `Requeue`.
A job stopped for a waiting job of a higher level (preempted, decide/preemption.py) -> `Preempted`: queued again
at the front, with no retry or restart spent.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ftconsole.scheduler.decide.jobs import Attempt, Job, Run, StopReason
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.faultspec import Strategy

KILL_MARGIN_S = 5.0  # past the grace period, before the scheduler SIGKILLs what the supervisor did not
READ_STATES = frozenset({"starting", "running", "orphaned"})


@dataclass(frozen=True)
class Snapshot:
    """The running jobs (deleted ones too), their held runs, and when each node last answered."""

    now: float
    jobs: Mapping[int, Job]
    runs: Sequence[Run]
    nodes: frozenset[str]  # the nodes in the config
    waiting: Mapping[str, float]  # node -> since when the loop waits for an answer (its first unanswered ask)
    answered: Mapping[str, float]  # node -> when it last answered an SSH command of the loop
    node_timeout: float
    stop_grace: float
    silence: Mapping[str, str] = field(default_factory=dict)  # node -> why its last ask got no answer
    # nodes proven down before node_timeout: their connection was lost and their SSH port refuses (no sshd)
    dead: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Launch:
    job: int
    attempt: int
    runs: tuple[Run, ...]  # its runs in state intent or unknown


@dataclass(frozen=True)
class Read:
    node: str
    runs: tuple[Run, ...]


@dataclass(frozen=True)
class Stop:
    node: str
    runs: tuple[Run, ...]
    force: bool  # SIGKILL everything of the runs (grace period over, or orphaned processes)


@dataclass(frozen=True)
class Lose:
    run: Run
    reason: str


@dataclass(frozen=True)
class Actions:
    lose: list[Lose] = field(default_factory=list)
    launch: list[Launch] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    read: list[Read] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)  # nodes past node_timeout with runs on them


def reconcile(snap: Snapshot) -> Actions:
    out = Actions()
    launch: dict[tuple[int, int], list[Run]] = defaultdict(list)
    stop: dict[tuple[str, bool], list[Run]] = defaultdict(list)
    read: dict[str, list[Run]] = defaultdict(list)
    silent: set[str] = set()
    up = {(r.job, r.attempt) for r in snap.runs if r.active and r.state != "intent"}
    for run in snap.runs:
        job = snap.jobs.get(run.job)
        if job is None or not run.active:
            continue
        if run.node not in snap.nodes:
            out.lose.append(Lose(run, f"node {run.node} is no longer in the cluster config"))
            continue
        asked = snap.waiting.get(run.node)
        if asked is not None and (snap.now - asked >= snap.node_timeout or run.node in snap.dead):
            silent.add(run.node)
            out.lose.append(Lose(run, _silence(snap, run.node, asked)))
            continue
        if run.state in ("intent", "unknown"):
            if not any(j == run.job and a < run.attempt for j, a in up):  # a resize: the old attempt first
                launch[(run.job, run.attempt)].append(run)
            continue
        if not run.launch or run.state not in READ_STATES:
            continue  # prepared (mpirun starts it), or known ended: nothing to ask
        read[run.node].append(run)
        force = _stop(job, run, snap)
        if force is not None:
            stop[(run.node, force)].append(run)
    out.launch.extend(Launch(j, a, tuple(rs)) for (j, a), rs in sorted(launch.items()))
    out.stop.extend(Stop(n, tuple(rs), force) for (n, force), rs in sorted(stop.items()))
    out.read.extend(Read(n, tuple(rs)) for n, rs in sorted(read.items()))
    out.silent.extend(sorted(silent))
    return out


def _stop(job: Job, run: Run, snap: Snapshot) -> bool | None:
    """None: leave it; False: ask its supervisor to stop (SIGTERM, grace); True: kill it (SIGKILL)."""
    if run.state == "orphaned":
        return True  # no supervisor to ask: what is left of it holds the GPUs
    if job.stop_reason is None and run.attempt >= job.attempt:
        return None
    if run.stop_sent is None and run.attempt >= job.attempt and dumps(job):
        resume = job.spec.fault_tolerance.checkpoint_resume
        if snap.now < (job.stop_requested or snap.now) + (resume.grace_period if resume else 0.0):
            return None  # it saves its checkpoint (the signal went out): stopped once its grace period is over
    if run.stop_sent is None:
        return False  # not confirmed by the node yet: (again)
    if snap.now >= run.stop_sent + snap.stop_grace + KILL_MARGIN_S:
        return True  # the supervisor should have killed it by now
    return None


def dumps(job: Job) -> bool:
    """The ranks of this job still running when its attempt fails (a rank failed, or a node under it) get the
    checkpoint signal and `grace_period` before they are stopped: `checkpoint_resume` with `dump` in its
    strategies (the default with `checkpoint_resume`)."""
    ft = job.spec.fault_tolerance
    if ft.checkpoint_resume is None:
        return False
    if job.stop_reason in (StopReason.RESCHEDULE, StopReason.PREEMPTED):
        return True
    return job.stop_reason is StopReason.ERROR and Strategy.DUMP in ft.plan


def _silence(snap: Snapshot, node: str, asked: float) -> str:
    since = snap.answered.get(node, asked)
    waited = format_duration(round(snap.now - asked, 1))
    text = f"node unreachable since {time.strftime('%H:%M:%S', time.localtime(since))} (no answer for {waited})"
    why = snap.silence.get(node)
    return f"{text}: {why}" if why else text


# ================================================================ recovery

PROBE_WAIT_S = 20.0  # how long a decision waits for a probe of the job's nodes newer than its failure
FAULTY = frozenset({"unhealthy", "unreachable"})  # node states that make a failure the hardware's
DEFAULT_RESTART_CODES = frozenset(range(128, 256))  # killed by a signal (128 + its number): Kubeflow's retryable
REQUEUED, RESTARTED, SHRUNK = "requeued", "restarted", "shrunk"  # results of attempts that led to a new one
PREEMPTED = "preempted"  # the result of an attempt stopped for a job of a higher level: counts as no retry
MAX_BACKOFF_S = 600.0  # a restart in place never waits longer than this


@dataclass(frozen=True)
class Health:
    """A node as the loop last knew it: its state, why, and when it was last probed."""

    state: str
    reasons: tuple[str, ...] = ()
    last_probe: float | None = None
    boot_id: str | None = None  # the boot its last probe saw (the scheduler's own reading)


@dataclass(frozen=True)
class Requeue:
    """Isolate `faulty`, queue the job again at the front of its priority; resubmit `number` of `limit`."""

    faulty: tuple[str, ...]
    cause: str
    number: int
    limit: int


@dataclass(frozen=True)
class Preempted:
    """Stopped for a job of a higher level (`cause`): queued again at the front; no retry or restart spent."""

    cause: str


@dataclass(frozen=True)
class RestartInPlace:
    """A new attempt on the same nodes and GPUs (healthy hardware, an exit the policy restarts)."""

    cause: str
    number: int
    limit: int


@dataclass(frozen=True)
class Shrink:
    """An elastic job goes on at once on the nodes that are left (`keep`, rank order), `faulty` isolated; it
    grows back to its size once nodes are free, as any elastic job."""

    keep: tuple[str, ...]
    faulty: tuple[str, ...]
    cause: str


@dataclass(frozen=True)
class ProbeFirst:
    """Probe these nodes before deciding: no check of theirs is newer than the failure."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Hold:
    """A restart in place waits for its backoff (`restart_backoff`) until `until`; the job keeps its GPUs."""

    until: float
    message: str


@dataclass(frozen=True)
class GiveUp:
    """The policy allowed restarts and they are used up: the job ends `error` with this message."""

    message: str


Recovery = Requeue | Preempted | RestartInPlace | Shrink | ProbeFirst | Hold | GiveUp | None


def recover(
    job: Job, runs: Sequence[Run], attempts: Sequence[Attempt], health: Mapping[str, Health], now: float
) -> Recovery:
    """What the failed current attempt of `job` (every rank down: `runs`) leads to; see the module docstring."""
    ft = job.spec.fault_tolerance
    limit = max(ft.retries, ft.checkpoint_resume.max_resumes if ft.checkpoint_resume else 0)
    resubmits = sum(a.result == REQUEUED for a in attempts)
    if job.stop_reason is StopReason.RESCHEDULE:  # checkpointed after a hardware fault (nodes isolated then)
        if resubmits < limit:
            return Requeue((), job.message or "rescheduled after a hardware fault", resubmits + 1, limit)
        return GiveUp(f"error,exiting: {job.message or 'hardware fault'} (resumed {resubmits} of {limit} times)")
    if job.stop_reason is StopReason.PREEMPTED:
        return Preempted(job.message or "preempted")
    if job.stop_reason is StopReason.HUNG:  # hang_action restart: stopped as suspected hung
        return _hang_restart(job, runs, attempts, health, resubmits, limit, now)
    if job.stop_reason not in (None, StopReason.ERROR):
        return None  # stopped by a user, or past its max_runtime: never restarted
    failed = sorted((r for r in runs if r.launch and r.failed), key=lambda r: (r.ended or now, r.rank))
    if not failed:
        return None
    first = failed[0]
    failed_at = first.ended or now
    nodes = sorted({r.node for r in runs})
    # A node is sick on the scheduler's own evidence only (DESIGN.md, "Claims and evidence"): a run it lost itself
    # (no answer, refused), a boot its probe read that is not the run's, or a state its checks gave. A loss the
    # node reports (the supervisor gone, status.json unreadable) is the run's user's to cause: the job's own.
    sick = {r.node: r.describe() for r in failed if r.state == "lost" and r.node in health and _node_lost(r, health)}
    for name in nodes:
        h = health.get(name)
        if name not in sick and h is not None and h.state in FAULTY:
            sick[name] = f"{name} {h.state}: {'; '.join(h.reasons) or 'no reason given'}"
    restarts = sum(a.result == RESTARTED for a in attempts)
    earlier = [a.ended for a in attempts if a.result in (REQUEUED, RESTARTED) and a.ended is not None]
    if ft.restart_time_limit is not None and earlier and now - min(earlier) > ft.restart_time_limit:
        allowed = format_duration(ft.restart_time_limit)
        return GiveUp(
            f"error,exiting: {first.describe()} (restarts are allowed for {allowed} after the first failure, "
            f"{format_duration(round(now - min(earlier)))} ago; restart_time_limit)"
        )
    claimed = any(r.state == "lost" for r in failed)  # by the node: a check of ours tells whose trouble it is
    if (limit or (claimed and Strategy.RECOVER in ft.plan)) and not sick:
        stale = [n for n in nodes if n in health and (health[n].last_probe or 0) < failed_at]
        if stale and now - failed_at < PROBE_WAIT_S:
            return ProbeFirst(tuple(stale))
    plan = ft.plan
    if sick:
        cause = "hardware fault: " + "; ".join(sick[n] for n in sorted(sick))
        if Strategy.RECOVER not in plan:
            return None  # strategies without recover: a hardware fault ends the job as any failure
        elastic = ft.elastic
        keep = tuple(dict.fromkeys(r.node for r in sorted(runs, key=lambda r: r.rank) if r.node not in sick))
        if elastic is not None and len(keep) >= elastic.min_nodes:
            return Shrink(keep, tuple(sorted(sick)), cause)
        if resubmits < limit:
            return Requeue(tuple(sorted(sick)), cause, resubmits + 1, limit)
        if limit:
            return GiveUp(f"error,exiting: {cause} (resubmitted {resubmits} of {limit} times)")
        return None
    code = _exit_code(first)
    explicit = ft.strategies is not None
    if code is None or code not in _restart_codes(job) or (ft.max_restarts is None and not explicit):
        return None  # the exit-code policy does not cover it: the program's own failure (scenario 4)
    cause = f"{first.describe()}: exit code {code} restarts"
    return _escalate(job, cause, first.describe(), restarts, resubmits, limit, failed_at, now, requeue=explicit)


def _escalate(
    job: Job,
    cause: str,
    what: str,
    restarts: int,
    resubmits: int,
    limit: int,
    failed_at: float,
    now: float,
    *,
    requeue: bool,
) -> Recovery:
    """The job's strategies in order for a failure on healthy hardware: the first with a restart left wins;
    GiveUp once they are used up; None when no strategy listed restarts anything. `requeue`: `recover` may
    take it (listed in `strategies`, or a hang restart)."""
    ft = job.spec.fault_tolerance
    tried: list[str] = []
    for strategy in ft.plan:
        if strategy is Strategy.EXIT:
            break
        if strategy is Strategy.RECOVER_IN_PLACE and ft.max_restarts is not None:
            tried.append(f"restarted in place {restarts} of {ft.max_restarts} times")
            if restarts < ft.max_restarts:
                wait = min(ft.restart_backoff * 2**restarts, MAX_BACKOFF_S)
                if now < failed_at + wait:
                    until = failed_at + wait
                    when = time.strftime("%H:%M:%S", time.localtime(until))
                    backoff = format_duration(ft.restart_backoff)
                    text = f"restart {restarts + 1} of {ft.max_restarts} at {when} (restart_backoff {backoff}, doubled)"
                    return Hold(until, text)
                return RestartInPlace(f"{cause} (max_restarts {ft.max_restarts})", restarts + 1, ft.max_restarts)
        elif strategy is Strategy.RECOVER and requeue and limit:  # without strategies: hardware faults only
            tried.append(f"resubmitted {resubmits} of {limit} times")
            if resubmits < limit:
                return Requeue((), cause, resubmits + 1, limit)
    if not tried:
        return None
    return GiveUp(f"error,exiting: {what} ({', '.join(tried)})")


MAX_HANG_RESTARTS = 3  # hang restarts in a row (seed 001's platform); then a hang is only reported


def hang_restarts(attempts: Sequence[Attempt]) -> int:
    """How many attempts in a row, the latest ended first, ended as suspected hung."""
    count = 0
    for a in sorted((a for a in attempts if a.ended is not None), key=lambda a: a.number, reverse=True):
        if not (a.message or "").startswith(HUNG_PREFIX):
            break
        count += 1
    return count


HUNG_PREFIX = "suspected hung"


def _hang_restart(
    job: Job,
    runs: Sequence[Run],
    attempts: Sequence[Attempt],
    health: Mapping[str, Health],
    resubmits: int,
    limit: int,
    now: float,
) -> Recovery:
    """A suspected hung job stopped to restart: through its policy, as an exit that restarts; but never again on a
    node that is faulty or isolated now (the hang's evidence pointed to its hardware: the watchdog isolated it)
    where the policy may place it anew, else as the policy says when it runs out."""
    restarts = sum(a.result == RESTARTED for a in attempts)
    cause = job.message or HUNG_PREFIX
    sick = sorted({r.node for r in runs if r.node in health and health[r.node].state in FAULTY | {"isolated"}})
    if sick:
        where = ", ".join(sick)
        if Strategy.RECOVER in job.spec.fault_tolerance.plan and resubmits < limit:
            return Requeue(tuple(sick), f"{cause}; placed away from {where}", resubmits + 1, limit)
        return GiveUp(f"error,exiting: {cause} ({where} isolated: not restarted there; resubmitted {resubmits} of "
                      f"{limit} times)")  # fmt: skip
    stopped = job.stop_requested or now
    found = _escalate(job, cause, cause, restarts, resubmits, limit, stopped, now, requeue=True)
    return found if found is not None else GiveUp(f"error,exiting: {cause} (no restart left in its policy)")


def _node_lost(run: Run, health: Mapping[str, Health]) -> bool:
    """Whether a lost run was lost with its node, on what the scheduler saw itself: it lost the run (`fault`), or
    its probe read another boot than the run's (a reboot; the run's boot id is the launch's, see loop.py)."""
    if run.fault is not None:
        return True
    boot = health[run.node].boot_id
    return boot is not None and run.boot_id is not None and boot != run.boot_id


def _exit_code(run: Run) -> int | None:
    """A run's exit as a shell reports it: its code, or 128 + the signal's number when a signal ended it."""
    if run.state != "exited":
        return None
    if run.signal:
        try:
            return 128 + int(signal.Signals[run.signal])
        except KeyError:
            return None
    return run.exit_code


def _restart_codes(job: Job) -> frozenset[int]:
    codes = job.spec.fault_tolerance.restart_exit_codes
    return DEFAULT_RESTART_CODES if codes is None else frozenset(codes)
