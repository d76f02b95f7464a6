"""Job dependencies (`after:` in a job's spec, Slurm's --dependency): pure, from the statuses of the jobs named.

`after: {ok: [12], any: [13], failed: [14]}` (Slurm's afterok, afterany, afternotok): a job starts only once
every job named has ended, each as its list asks:

- ok: it succeeded;
- any: it ended, whatever its end (succeeded, error, stopped, expired);
- failed: it ended without succeeding (error, stopped, expired).

`state` says, for one queued job, whether it may be placed (None), waits (`Waits`, with what it waits for), or
can never start (`Never`: a job it needs ended the wrong way, or is unknown), which ends it `error` saying which.

An array's id (the id of its first task) stands for every task of it, as in Slurm (`array_status`): the array
has ended once every task has, succeeded when every task did, and failed when one did not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ftconsole.scheduler.decide.jobs import JobStatus

KINDS = ("ok", "any", "failed")
WANTS = {"ok": "to succeed", "any": "to end", "failed": "to fail"}


@dataclass(frozen=True)
class Waits:
    reason: str  # "waiting for job 12 to succeed (after.ok)"


@dataclass(frozen=True)
class Never:
    reason: str  # "job 12 ended error; after.ok needs it to succeed"


def met(kind: str, status: JobStatus) -> bool | None:
    """Whether a job of `status` meets a dependency of `kind`: True, False (never will), or None (not yet)."""
    if status.active:
        return None
    if kind == "ok":
        return status is JobStatus.SUCCEEDED
    if kind == "failed":
        return status is not JobStatus.SUCCEEDED
    return True


def state(after: Mapping[str, Sequence[int]], statuses: Mapping[int, JobStatus | None]) -> Waits | Never | None:
    """The dependency state of one job (`after`: kind -> job ids; `statuses`: job id -> its status, None where the
    store has no such job). A job that can never start says so first, then the first it still waits for."""
    waiting: list[str] = []
    for kind in KINDS:
        for job in after.get(kind, ()):
            status = statuses.get(job)
            if status is None:
                return Never(f"job {job} does not exist (after.{kind})")
            done = met(kind, status)
            if done is False:
                return Never(f"job {job} ended {status.value}; after.{kind} needs it {WANTS[kind]}")
            if done is None:
                waiting.append(f"job {job} {WANTS[kind]} (after.{kind})")
    if not waiting:
        return None
    more = f" and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    return Waits(f"waiting for {waiting[0]}{more}")


def array_status(tasks: Sequence[JobStatus]) -> JobStatus:
    """An array's status for its dependants, from its tasks': running (or queued) while one is, then succeeded
    when every task succeeded, else error (one ended without succeeding)."""
    if any(t is JobStatus.RUNNING for t in tasks):
        return JobStatus.RUNNING
    if any(t.active for t in tasks):
        return JobStatus.QUEUED
    return JobStatus.SUCCEEDED if all(t is JobStatus.SUCCEEDED for t in tasks) else JobStatus.ERROR
