"""Jobs as the scheduler keeps them: records, statuses, conditions, and the pure decisions about them.

A job is `queued` until placement gives it nodes; from then on it is `running` (its first attempt's runs
are being created, then run) until every launching rank has finished, when it becomes `succeeded`,
`error`, `stopped` or `expired`. Conditions (seed 004) are the job's timeline, recorded as events:
Pending, Creating, Preparing (data_prep), Running, Stopping, Succeeded, Failed, Stopped, Expired.

`settle` decides, from a running job and the last observed state of its runs, what happens next; it reads
no clock and does no I/O, so it is tested from tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ftconsole.scheduler.spec.jobspec import JobSpec


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    ERROR = "error"
    STOPPED = "stopped"
    EXPIRED = "expired"
    SUCCEEDED = "succeeded"

    @property
    def active(self) -> bool:
        return self in (JobStatus.QUEUED, JobStatus.RUNNING)


TERMINAL = frozenset(s for s in JobStatus if not s.active)


class Condition(StrEnum):
    """A job's timeline entries (seed 004's conditions); stored as events of this kind."""

    PENDING = "Pending"
    CREATING = "Creating"
    PULLING = "Pulling"  # ranks pull the job's image (the nodes that lack it) before its command
    PREPARING = "Preparing"  # ranks copy the job's data sets to node-local storage (data_prep) before its command
    RUNNING = "Running"
    STOPPING = "Stopping"
    SCALING = "Scaling"  # an elastic job resized (`scale`): its attempt is replaced by one of the new size
    RESTARTING = "Restarting"
    SUSPECTED_HUNG = "SuspectedHung"  # no I/O and flat GPUs for the hang window (seed 001); ends when I/O resumes
    STRAGGLING = "Straggling"  # ranks epochs apart for the progress window (seed 001)
    SLOW = "Slow"  # iterations over the performance ratio K times in a row (seed 003)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    EXPIRED = "Expired"


class StopReason(StrEnum):
    """Why the scheduler stops a running job; it decides the final status once the runs are down."""

    STOPPED = "stopped"  # a user asked
    EXPIRED = "expired"  # max_runtime is over
    ERROR = "error"  # a rank failed: the others are stopped
    RESCHEDULE = "reschedule"  # a hardware fault under a running checkpoint_resume job: checkpoint, stop, requeue
    HUNG = "hung"  # suspected hung, with hang_action restart: stopped, then restarted by its policy
    PREEMPTED = "preempted"  # for a waiting job of a higher level: checkpoint, stop, requeue (no retry spent)
    IDLE = "idle"  # idle past its idle_timeout (an allocation: idling.py); ends stopped


FINAL_STATUS = {
    StopReason.STOPPED: JobStatus.STOPPED,
    StopReason.EXPIRED: JobStatus.EXPIRED,
    StopReason.IDLE: JobStatus.STOPPED,
}
FINAL_CONDITION = {
    JobStatus.SUCCEEDED: Condition.SUCCEEDED,
    JobStatus.ERROR: Condition.FAILED,
    JobStatus.STOPPED: Condition.STOPPED,
    JobStatus.EXPIRED: Condition.EXPIRED,
}


# slots: from 30 attributes on, CPython 3.11 gives each instance a dict of its own (1.6 KB, against 0.3 KB for the 27
# it had): a queue of 100,000 jobs held 190 MB more when holds brought the count to 30
@dataclass(frozen=True, slots=True)
class Job:
    id: int
    name: str
    owner: str
    uid: int
    spec: JobSpec
    status: JobStatus
    priority: str
    project: str
    access: str
    submitted: float
    started: float | None = None
    ended: float | None = None
    attempt: int = 0
    requeued: bool = False
    extra_runtime: float = 0.0
    stop_requested: float | None = None
    stop_reason: StopReason | None = None
    stop_by: str | None = None
    message: str = ""
    exit_code: int | None = None
    deleted: bool = False
    cloned_from: int | None = None
    scaled_to: int | None = None  # an elastic job's size once scaled (`scale`); None: the spec's `nodes`
    debug_released: float | None = None  # when its hold for debugging was given up (`release`)
    excluded: tuple[str, ...] = ()  # nodes it is not placed on again (rescheduled as slow without them)
    array_id: int | None = None  # a task of an array: the id of its first task, which names the array
    array_index: int | None = None  # its index in the array (FT_ARRAY_INDEX)
    held_by: str | None = None  # a queued job held (`hold`): who held it; not placed until released
    held_at: float | None = None
    held_admin: bool = False  # held by an admin: only an admin releases it

    @property
    def size(self) -> int:
        """How many nodes the job asks for now: the spec's `nodes`, or what it was scaled to."""
        return self.scaled_to if self.scaled_to is not None else self.spec.nodes

    @property
    def max_runtime(self) -> float | None:
        """The spec's max_runtime plus every `extend`; None when the job has no limit."""
        base = self.spec.max_runtime
        return None if base is None else base + self.extra_runtime

    @property
    def deadline(self) -> float | None:
        limit = self.max_runtime
        return None if limit is None or self.started is None else self.started + limit

    @property
    def ref(self) -> str:
        """How users name it: `12`, or a task of an array `12[7]`."""
        return str(self.id) if self.array_id is None else f"{self.array_id}[{self.array_index}]"

    def held_note(self) -> str | None:
        """Why a held job is not placed (None: it is not held)."""
        if self.held_by is None:
            return None
        by = f"{self.held_by}, an admin" if self.held_admin else self.held_by
        return f"held by {by}: not placed until released (ftconsole release {self.ref})"

    def held_json(self) -> dict[str, Any] | None:
        return None if self.held_by is None else {"by": self.held_by, "at": self.held_at, "admin": self.held_admin}

    def to_json(self, now: float) -> dict[str, Any]:
        runtime = None
        if self.started is not None:
            runtime = (self.ended or now) - self.started
        return {
            "id": self.id,
            "array_id": self.array_id,
            "array_index": self.array_index,
            "array": self.spec.array,
            "ref": self.ref,
            "name": self.name,
            "owner": self.owner,
            "status": self.status.value,
            "priority": self.priority,
            "project": self.project,
            "access": self.access,
            "mode": self.spec.mode.value,
            "type": self.spec.type.value,
            "nodes": self.size,
            "elastic": _elastic_json(self.spec),
            "gpus_per_node": self.spec.gpus_per_node,
            "specs": [r.spec for r in self.spec.gpu_request if r.spec],
            "preemptible": self.spec.preemptible,
            "output": self.spec.output,
            "submitted": self.submitted,
            "started": self.started,
            "ended": self.ended,
            "runtime_s": None if runtime is None else round(runtime, 3),
            "max_runtime_s": self.max_runtime,
            "attempt": self.attempt,
            "stop_requested": self.stop_requested,
            "stop_reason": self.stop_reason.value if self.stop_reason else None,
            "stop_by": self.stop_by,
            "message": self.message,
            "exit_code": self.exit_code,
            "cloned_from": self.cloned_from,
            "excluded": list(self.excluded),
            "deleted": self.deleted,
            "held": self.held_json(),
        }


@dataclass(frozen=True)
class Attempt:
    job: int
    number: int
    spec_name: str | None
    gpus_per_node: int
    master_port: int
    created: float
    started: float | None = None
    ended: float | None = None
    result: str | None = None
    message: str = ""
    token: str | None = None  # claims its run folders on the nodes (None: started before tokens existed)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "token": self.token,
            "spec": self.spec_name,
            "gpus_per_node": self.gpus_per_node,
            "master_port": self.master_port,
            "created": self.created,
            "started": self.started,
            "ended": self.ended,
            "result": self.result,
            "message": self.message,
        }


def _elastic_json(spec: JobSpec) -> dict[str, int] | None:
    bounds = spec.elastic_range
    return None if bounds is None else {"min_nodes": bounds[0], "max_nodes": bounds[1]}


# states of a run as the store keeps them: intent (recorded, not yet sent), unknown (a start was sent and no
# answer came: it may run; asked again), prepared (folder only, nothing started: a rank that mpirun starts),
# cancelled (never started), then the supervisor's starting | running | orphaned (its supervisor died, its
# processes still run) | exited | failed | lost. Active runs may have processes on their node: their GPUs
# stay held.
RUN_ACTIVE = frozenset({"intent", "unknown", "starting", "running", "orphaned"})


@dataclass(frozen=True)
class Run:
    """One rank of an attempt: the node and GPUs it holds, and what its supervisor last said."""

    job: int
    attempt: int
    rank: int
    node: str
    gpus: tuple[int, ...]
    run_dir: str
    launch: bool
    state: str = "intent"
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    started: float | None = None
    ended: float | None = None
    error: str | None = None
    stop_sent: float | None = None
    released: bool = False
    output_at: float | None = None  # mtime of its output.log when last read (the progress heartbeat)
    token: str | None = None  # its attempt's token, which claims the run folder on the node
    boot_id: str | None = None  # the node's boot the run started in
    supervisor_pid: int | None = None
    supervisor_start: int | None = None  # with the pid, what proves the supervisor is the one started
    pid_start: int | None = None
    kill_sent: float | None = None  # when the scheduler last sent SIGKILL (the grace period was over)
    # lost on the scheduler's own evidence that its node failed (no answer for node_timeout, refused, left the
    # config): the only loss that is the node's. A loss the node reports (supervisor gone, status unreadable) is
    # the run's user's claim: it ends the job, never a node's service (DESIGN.md, "Claims and evidence")
    fault: str | None = None

    @property
    def active(self) -> bool:
        return self.state in RUN_ACTIVE

    @property
    def failed(self) -> bool:
        """Finished without success: a non-zero exit, a signal, could not start, or its supervisor vanished."""
        if self.state == "exited":
            return self.exit_code != 0
        return self.state in ("failed", "lost", "absent", "orphaned")

    def describe(self) -> str:
        where = f"rank {self.rank} on {self.node}"
        if self.state == "exited":
            how = f"killed by {self.signal}" if self.signal else f"exited with code {self.exit_code}"
            return f"{where} {how}" + (f" ({self.error})" if self.error else "")
        if self.state == "lost":
            return f"{where} lost: {self.error or 'its supervisor is gone without recording an end'}"
        if self.state == "orphaned":
            return f"{where}: its supervisor died while its processes still run"
        if self.state == "absent":
            return f"{where}: its run folder has no status (removed on the node?)"
        return f"{where}: {self.error or self.state}"

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "rank": self.rank,
            "node": self.node,
            "gpus": list(self.gpus),
            "run_dir": self.run_dir,
            "launch": self.launch,
            "state": self.state,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "started": self.started,
            "ended": self.ended,
            "error": self.error,
            "output_at": self.output_at,
            "boot_id": self.boot_id,
            "pid_start": self.pid_start,
        }


# -- decisions -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finish:
    """Every launching rank is down: the job ends with this status."""

    status: JobStatus
    message: str
    exit_code: int | None


@dataclass(frozen=True)
class StopOthers:
    """A rank failed while others still run: stop them; the job will end in `error` with this message."""

    message: str


@dataclass(frozen=True)
class AllRunning:
    """Every launching rank has started (the Running condition)."""


Settlement = Finish | StopOthers | AllRunning | None


def settle(job: Job, runs: Sequence[Run], *, was_running: bool) -> Settlement:
    """What a running job's runs mean now. `was_running`: the Running condition is already recorded."""
    launching = [r for r in runs if r.launch]
    failed = [r for r in launching if r.failed]
    if any(r.active for r in launching):
        if failed and job.stop_reason is None:
            return StopOthers(_failure_message(failed))
        if not was_running and all(r.state == "running" for r in launching):
            return AllRunning()
        return None
    if job.stop_reason is StopReason.PREEMPTED and all(r.exit_code == 0 and r.stop_sent is None for r in launching):
        return Finish(JobStatus.SUCCEEDED, "every rank exited with code 0 (before its preemption)", 0)
    if job.stop_reason in (StopReason.ERROR, StopReason.RESCHEDULE, StopReason.HUNG, StopReason.PREEMPTED):
        return Finish(JobStatus.ERROR, job.message or _failure_message(failed), _exit_code(failed))
    if job.stop_reason is not None:
        reason = {StopReason.EXPIRED: "max_runtime reached", StopReason.IDLE: f"ended as idle: {job.message}"}.get(
            job.stop_reason, f"stopped by {job.stop_by}"
        )
        return Finish(FINAL_STATUS[job.stop_reason], reason, _exit_code(failed))
    if failed:
        return Finish(JobStatus.ERROR, _failure_message(failed), _exit_code(failed))
    return Finish(JobStatus.SUCCEEDED, "every rank exited with code 0", 0)


def _failure_message(failed: Sequence[Run]) -> str:
    first = min(failed, key=lambda r: (r.ended or float("inf"), r.rank))
    more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
    return first.describe() + more


def _exit_code(failed: Sequence[Run]) -> int | None:
    codes = [r.exit_code for r in sorted(failed, key=lambda r: r.rank) if r.exit_code]
    return codes[0] if codes else None


def expired(job: Job, now: float) -> bool:
    """A running job past its max_runtime (with extensions) and not already being stopped."""
    deadline = job.deadline
    return job.status is JobStatus.RUNNING and job.stop_reason is None and deadline is not None and now >= deadline
