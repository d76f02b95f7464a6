"""The scheduler: the control loop over jobs, and the job operations callers ask for.

Level-triggered (DESIGN.md, "The control loop"): each tick reads the desired state (the store) and the
observed state (the run supervisors' status files, one SSH command per node), and acts on the difference:

1. launch: runs recorded as intent are started (`start` is idempotent on the node, so an intent left by a
   crash is resolved by starting it: an already started run is found, never started twice); a run is the
   job's command, or a batch job's tasks one after another, between its hooks on rank 0 (`plan_job`);
2. observe: the runs of running jobs are read, and `jobs.settle` decides what that means (all running,
   a rank failed, every rank done; a job that ends `error` raises a `job_failed` alert); each run's
   output.log mtime comes along (the progress heartbeat), written only when it moved;
3. stop: stop requests (users, `max_runtime`, a failed rank) are sent once to the runs still up;
4. place: one placement pass over the queue; each placed job gets a free port on its first node, then its
   attempt and runs are written as intent (job `running`, condition Creating) and launched.

Every change is written with its event in one transaction before anything acts on it. Job operations
(submit, stop, delete, ...) check the caller against the job's owner, its `access` and the admins.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import dataclasses
import json
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from pydantic import ValidationError

from scheduler import elastic, placement
from scheduler.api import Caller
from scheduler.config import Node, format_duration
from scheduler.errors import FtError, NotFound, PermissionDenied, UsageError
from scheduler.jobplan import JobLaunch, plan_job
from scheduler.jobs import (
    FINAL_CONDITION,
    TERMINAL,
    AllRunning,
    Attempt,
    Condition,
    Finish,
    Job,
    JobStatus,
    Run,
    StopOthers,
    StopReason,
    expired,
    settle,
)
from scheduler.jobspec import Access, JobSpec
from scheduler.launcher import LaunchInput, NodeAssignment, RankLaunch
from scheduler.requests import job_request, node_slot
from scheduler.runs import RunStatus, free_port, prepare_run, run_states, start_run, stop_runs
from scheduler.service import ClusterService, NodeView, ProbeOutcome
from scheduler.ssh import run_on_all
from scheduler.store import Conflict, JobActivity, JobTx, StoredAlert, StoredEvent

log = logging.getLogger("ftconsole.scheduler")

LOG_POLL_S = 0.5
MIN_TICK_GAP_S = 0.2
LOG_CHUNK = 1 << 20


class Scheduler:
    def __init__(self, service: ClusterService, *, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.store = service.store
        self.transport = service.transport
        self.config = service.config
        self.settings = service.config.scheduler
        self.clock = clock
        self.looping = False  # True while `run` drives ticks (else jobs only change on request)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._nodes = {n.name: n for n in service.all_nodes}

    # ============================================================ permissions

    def is_admin(self, caller: Caller) -> bool:
        return caller.uid == 0 or caller.user in self.config.admins

    def _check(self, caller: Caller, job: Job, verb: str, *, write: bool) -> None:
        if self.is_admin(caller) or caller.uid == job.uid:
            return
        if job.access == Access.READ_WRITE.value or (job.access == Access.READ_ONLY.value and not write):
            return
        allowed = {"none": "nothing", "read-only": "read only"}.get(job.access, job.access)
        raise PermissionDenied(
            f"{caller.user} may not {verb} job {job.id}: it belongs to {job.owner} and its access for others is "
            f"{job.access!r} ({allowed}); ask {job.owner} or an admin"
        )

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        job = await self.store.job(_job_id(job_id))
        if job is None or (job.deleted and write):  # a deleted job can still be looked at, not acted on
            raise NotFound(f"no job {job_id}")
        self._check(caller, job, verb, write=write)
        return job

    # ============================================================ operations

    async def submit(self, caller: Caller, spec: JobSpec | dict[str, Any], *, cloned_from: int | None = None) -> Job:
        spec = _spec(spec)
        now = self.clock()
        await self._admissible(caller, spec, spec.priority.value)
        job = Job(
            id=0,
            name=spec.name,
            owner=caller.user,
            uid=caller.uid,
            spec=spec,
            status=JobStatus.QUEUED,
            priority=spec.priority.value,
            project=spec.project,
            access=spec.access.value,
            submitted=now,
            cloned_from=cloned_from,
        )
        async with self.store.jobs_tx("submit a job") as tx:
            job_id = await tx.add_job(job)
            how = f"cloned from job {cloned_from}" if cloned_from else "submitted"
            await tx.event(now, Condition.PENDING, f"{how} by {caller.user}", job=job_id)
        self._poke()
        return dataclasses.replace(job, id=job_id)

    async def _admissible(self, caller: Caller, spec: JobSpec, priority: str) -> None:
        """Refuse what can never be scheduled as asked: unknown specs or nodes, very-urgent, the urgent cap."""
        job_request(spec, self.config, job_id=spec.name, now=0)  # UsageError for specs not in the config
        unknown = [n for n in spec.node_list() if n not in self._nodes]
        if unknown:
            raise UsageError(f"job {spec.name}: node_names not in the cluster config: {', '.join(unknown)}")
        if priority == "very-urgent" and not self.is_admin(caller):
            raise PermissionDenied(f"priority very-urgent is for admins only ({', '.join(self.config.admins)})")
        cap = self.settings.urgent_cap
        if priority == "urgent" and cap is not None:
            active = await self.store.jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING])
            count = sum(1 for j in active if j.project == spec.project and j.priority == "urgent")
            if count >= cap:
                raise UsageError(
                    f"project {spec.project} already has {count} urgent job(s) running or queued (cap {cap}); "
                    "submit it as normal, or wait for one to finish"
                )

    async def jobs(
        self,
        caller: Caller,
        *,
        status: Sequence[str] | None = None,
        name: str | None = None,
        owner: str | None = None,
        spec: str | None = None,
        output: str | None = None,
    ) -> list[Job]:
        """Every job, newest last; filters combine (status: any of; name, output: substring)."""
        statuses = None
        if status:
            try:
                statuses = [JobStatus(s) for s in status]
            except ValueError:
                raise UsageError(
                    f"unknown status in {', '.join(status)} (one of {', '.join(s.value for s in JobStatus)})"
                ) from None
        out = []
        for job in await self.store.jobs(statuses=statuses):
            if name and name not in job.name:
                continue
            if owner and job.owner != owner:
                continue
            if spec and spec not in [r.spec for r in job.spec.gpu_request]:
                continue
            if output and output not in (job.spec.output or ""):
                continue
            out.append(job)
        return out

    async def show(self, caller: Caller, job_id: int | str) -> dict[str, Any]:
        job = await self._job(caller, job_id, "see", write=False)
        now = self.clock()
        attempts = await self.store.attempts(job.id)
        runs = await self.store.runs(job=job.id)
        events = await self.store.events(job=str(job.id), limit=1000)
        activity = (await self.store.job_activity([job.id])).get(job.id, JobActivity())
        conditions = {c.value for c in Condition}
        return {
            **job.to_json(now),
            **activity.to_json(),
            "spec": job.spec.to_json(),
            "attempts": [
                {**a.to_json(), "runs": [r.to_json() for r in runs if r.attempt == a.number]} for a in attempts
            ],
            "conditions": [
                {"type": e.kind, "time": e.time, "message": e.message} for e in events if e.kind in conditions
            ],
            "events": [e.to_json() for e in events],
        }

    async def stop(self, caller: Caller, job_ids: Iterable[int | str]) -> list[Job]:
        jobs = [await self._job(caller, j, "stop", write=True) for j in job_ids]
        return [await self._stop(caller, job, StopReason.STOPPED) for job in jobs]

    async def _stop(self, caller: Caller, job: Job, reason: StopReason, *, delete: bool = False) -> Job:
        now = self.clock()
        try:
            async with self.store.jobs_tx("stop a job") as tx:
                if job.status is JobStatus.QUEUED:
                    await tx.update_job(
                        job.id,
                        expect=[JobStatus.QUEUED],
                        status=JobStatus.STOPPED,
                        ended=now,
                        stop_requested=now,
                        stop_reason=reason,
                        stop_by=caller.user,
                        message=f"stopped by {caller.user} before it started",
                        **({"deleted": True} if delete else {}),
                    )
                    await tx.event(now, Condition.STOPPED, f"stopped by {caller.user} while queued", job=job.id)
                elif job.status is JobStatus.RUNNING and job.stop_reason is None:
                    grace = format_duration(self.settings.stop_grace)
                    await _request_stop(
                        tx,
                        job,
                        now,
                        reason,
                        caller.user,
                        f"stop requested by {caller.user}; SIGKILL after {grace}",
                        **({"deleted": True} if delete else {}),
                    )
                elif delete:
                    await tx.update_job(job.id, deleted=True)
                if delete:
                    await tx.event(now, "Deleted", f"deleted by {caller.user}", job=job.id)
        except Conflict:  # it changed state meanwhile (placed, or finished): act on what it is now
            fresh = await self.store.job(job.id)
            assert fresh is not None
            return await self._stop(caller, fresh, reason, delete=delete)
        self._poke()
        fresh = await self.store.job(job.id)
        assert fresh is not None
        return fresh

    async def delete(self, caller: Caller, job_ids: Iterable[int | str]) -> list[Job]:
        """Hide jobs from every listing; a queued or running one is stopped first (its record and events stay)."""
        jobs = [await self._job(caller, j, "delete", write=True) for j in job_ids]
        return [await self._stop(caller, job, StopReason.STOPPED, delete=True) for job in jobs]

    async def clone(self, caller: Caller, job_id: int | str) -> Job:
        job = await self._job(caller, job_id, "clone", write=False)
        return await self.submit(caller, job.spec, cloned_from=job.id)

    async def set_priority(self, caller: Caller, job_id: int | str, level: str) -> Job:
        try:
            label = placement.Priority.parse(level).label
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        job = await self._job(caller, job_id, "change the priority of", write=True)
        if job.status is not JobStatus.QUEUED:
            raise UsageError(f"job {job.id} is {job.status.value}: the priority can only change while it is queued")
        if label != job.priority:
            await self._admissible(caller, job.spec, label)
        now = self.clock()
        try:
            async with self.store.jobs_tx("change a priority") as tx:
                await tx.update_job(job.id, expect=[JobStatus.QUEUED], priority=label)
                await tx.event(now, "Priority", f"priority {job.priority} -> {label} by {caller.user}", job=job.id)
        except Conflict:
            raise UsageError(
                f"job {job.id} started meanwhile: the priority can only change while it is queued"
            ) from None
        self._poke()
        return await self._fresh(job.id)

    async def extend(self, caller: Caller, job_id: int | str, seconds: float) -> Job:
        if seconds <= 0:
            raise UsageError("extend needs a positive duration, such as 30m or 2h")
        job = await self._job(caller, job_id, "extend", write=True)
        if job.spec.max_runtime is None:
            raise UsageError(f"job {job.id} has no max_runtime: there is nothing to extend")
        if not job.status.active or job.stop_reason is not None:
            raise UsageError(f"job {job.id} is {job.status.value}{' and stopping' if job.stop_reason else ''}")
        now = self.clock()
        limit = format_duration((job.max_runtime or 0) + seconds)
        async with self.store.jobs_tx("extend a job") as tx:
            await tx.update_job(
                job.id, expect=[JobStatus.QUEUED, JobStatus.RUNNING], extra_runtime=job.extra_runtime + seconds
            )
            await tx.event(
                now, "Extended", f"max_runtime +{format_duration(seconds)} (now {limit}) by {caller.user}", job=job.id
            )
        return await self._fresh(job.id)

    async def scale(self, caller: Caller, job_id: int | str, nodes: int) -> Job:
        """Resize an elastic job to `nodes` nodes (see `scheduler.elastic`): a queued one is placed at that size,
        a running one gets a new attempt of that size once the nodes are there (the loop does it)."""
        job = await self._job(caller, job_id, "scale", write=True)
        problem = elastic.scale_problem(job, nodes)
        if problem is not None:
            raise UsageError(problem)
        if nodes == job.size:
            return job
        now = self.clock()
        how = elastic.direction(job.size, nodes)
        queued = job.status is JobStatus.QUEUED
        when = "it is placed at that size" if queued else "a new attempt replaces the current one"
        try:
            async with self.store.jobs_tx("scale a job") as tx:
                # a running job's message is about the size it asked for until now (e.g. why it waits to grow)
                cleared = {} if queued else {"message": ""}
                await tx.update_job(job.id, expect=[JobStatus.QUEUED, JobStatus.RUNNING], scaled_to=nodes, **cleared)
                await tx.event(
                    now,
                    Condition.SCALING,
                    f"{how} by {caller.user}: {when}",
                    job=job.id,
                    data={"from": job.size, "to": nodes, "by": caller.user},
                )
        except Conflict:
            raise UsageError(f"job {job.id} ended meanwhile: it cannot be scaled") from None
        self._poke()
        return await self._fresh(job.id)

    async def job_events(self, caller: Caller, job_id: int | str, *, limit: int = 100) -> list[StoredEvent]:
        job = await self._job(caller, job_id, "see", write=False)
        return await self.store.events(job=str(job.id), limit=limit)

    # -- alerts -----------------------------------------------------------------------------------------------

    async def ack(self, caller: Caller, alert_ids: Iterable[int | str]) -> list[StoredAlert]:
        """Acknowledge alerts: someone is on it (they stay listed until resolved)."""
        alerts = await self._alerts_for(caller, alert_ids, "acknowledge")
        return await self.store.ack_alerts([a.id for a in alerts], by=caller.user, now=self.clock())

    async def resolve(self, caller: Caller, alert_ids: Iterable[int | str]) -> list[StoredAlert]:
        """Resolve alerts: the problem is over (node alerts also resolve themselves once the node is well)."""
        alerts = await self._alerts_for(caller, alert_ids, "resolve")
        return await self.store.resolve_alerts([a.id for a in alerts], by=caller.user, now=self.clock())

    async def _alerts_for(self, caller: Caller, alert_ids: Iterable[int | str], verb: str) -> list[StoredAlert]:
        """The alerts, once the caller may act on every one of them (else nothing is changed).

        Admins may act on any alert; on a job's alert, whoever may change the job; node alerts are for admins.
        """
        alerts = await self.store.alerts_by_id(alert_ids)
        if self.is_admin(caller):
            return alerts
        for alert in alerts:
            if alert.job is None:
                raise PermissionDenied(
                    f"{caller.user} may not {verb} alert {alert.id} ({alert.kind} on {alert.node}): alerts about "
                    f"nodes are for admins ({self._admins()})"
                )
            job = await self.store.job(alert.job)
            if job is None:
                raise NotFound(f"alert {alert.id} is about job {alert.job}, which does not exist")
            self._check(caller, job, f"{verb} alert {alert.id} of", write=True)
        return alerts

    def _admins(self) -> str:
        return ", ".join(["root", *self.config.admins])

    # -- nodes ------------------------------------------------------------------------------------------------

    async def probe(
        self, caller: Caller, nodeset: str | None, *, checks: Sequence[str] | None = None
    ) -> list[ProbeOutcome]:
        """Probe nodes now (anyone may: it changes nothing a probe on its own would not)."""
        outcomes = await self.service.probe(nodeset, checks=checks)
        self._poke()
        return outcomes

    async def drain(self, caller: Caller, nodeset: str, reason: str) -> list[NodeView]:
        """Take nodes out of scheduling (admins only); the running jobs there go on."""
        self._admin_only(caller, "drain")
        healths = await self.service.drain(nodeset, reason=reason, by=caller.user)
        return await self.service.nodes([h.node for h in healths])

    async def resume(self, caller: Caller, nodeset: str) -> list[NodeView]:
        """Put drained or isolated nodes back (admins only)."""
        self._admin_only(caller, "resume")
        healths = await self.service.resume(nodeset, by=caller.user)
        self._poke()
        return await self.service.nodes([h.node for h in healths])

    def _admin_only(self, caller: Caller, verb: str) -> None:
        if not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} may not {verb} nodes: that is for admins ({self._admins()})")

    async def wait(self, caller: Caller, job_id: int | str) -> AsyncIterator[dict[str, Any]]:
        """The job now, then each time its status changes, until it ends."""
        job = await self._job(caller, job_id, "see", write=False)
        last: tuple[str, str] | None = None
        while True:
            key = (job.status.value, job.message)
            if key != last:
                yield job.to_json(self.clock())
                last = key
            if job.status in TERMINAL:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=self.settings.tick)
            job = await self._fresh(job.id)

    async def logs(
        self,
        caller: Caller,
        job_id: int | str,
        *,
        rank: int = 0,
        attempt: int | None = None,
        follow: bool = False,
        tail: int | None = None,
    ) -> AsyncIterator[str]:
        """output.log of one rank, as text chunks; with `follow`, until the run ends."""
        job = await self._job(caller, job_id, "read the logs of", write=False)
        run = await self._log_run(job, rank, attempt)
        node = self._nodes[run.node]
        path = f"{run.run_dir}/output.log"
        offset = 0
        if tail is not None:
            offset = await self._tail_offset(node, path, tail)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            data = await self._log_read(node, path, offset)
            offset += len(data)
            text = decoder.decode(data)
            if text:
                yield text
            if len(data) == LOG_CHUNK:
                continue
            if not follow:
                return
            current = [r for r in await self.store.runs(job=job.id) if (r.attempt, r.rank) == (run.attempt, run.rank)]
            if not current or not current[0].active:
                rest = await self._log_read(node, path, offset)
                text = decoder.decode(rest, final=True)
                if text:
                    yield text
                return
            await asyncio.sleep(LOG_POLL_S)

    async def _log_run(self, job: Job, rank: int, attempt: int | None) -> Run:
        runs = await self.store.runs(job=job.id)
        number = attempt if attempt is not None else job.attempt
        if not runs:
            raise UsageError(f"job {job.id} is {job.status.value} and has not started: no logs yet")
        match = [r for r in runs if r.attempt == number and r.rank == rank]
        if not match:
            ranks = sorted({r.rank for r in runs if r.attempt == number})
            raise NotFound(f"job {job.id} attempt {number} has no rank {rank} (ranks: {ranks})")
        run = match[0]
        if run.state == "intent":
            raise UsageError(f"job {job.id} rank {rank} is being started: try again in a moment")
        if not run.launch:
            raise UsageError(
                f"rank {rank} of job {job.id} runs under mpirun started from rank 0: its output is in rank 0's log"
            )
        return run

    async def _log_read(self, node: Node, path: str, offset: int) -> bytes:
        script = 'test -e "$2" || exit 3; tail -c +"$1" "$2" | head -c "$3" | base64'
        result = await self.transport.run(node, ["sh", "-c", script, "sh", str(offset + 1), path, str(LOG_CHUNK)])
        if result.exit_status == 3:
            return b""
        if not result.ok:
            raise FtError(f"{node.name}: cannot read {path}: {result.describe_failure()}")
        return base64.b64decode(result.stdout)

    async def launch_files(
        self, caller: Caller, job_id: int | str, *, rank: int = 0, attempt: int | None = None
    ) -> dict[str, Any]:
        """What one rank was started with, read back from its run folder: argv, env and hostfile."""
        job = await self._job(caller, job_id, "see the launch of", write=False)
        run = await self._log_run(job, rank, attempt)
        script = (
            'cd "$1" 2>/dev/null || exit 3; for f in argv.json env.json hostfile; do '
            'if [ -e "$f" ]; then base64 < "$f" | tr -d "\\n"; fi; echo; done'
        )
        result = await self.transport.run(self._nodes[run.node], ["sh", "-c", script, "sh", run.run_dir])
        if result.exit_status == 3:
            raise NotFound(f"job {job.id} rank {run.rank}: no run folder {run.run_dir} on {run.node}")
        if not result.ok:
            raise FtError(f"{run.node}: cannot read {run.run_dir}: {result.describe_failure()}")
        argv, env, hostfile = (
            base64.b64decode(part).decode(errors="replace") for part in result.stdout.split("\n")[:3]
        )
        return {
            "node": run.node,
            "rank": run.rank,
            "attempt": run.attempt,
            "run_dir": run.run_dir,
            "argv": json.loads(argv) if argv else None,
            "env": json.loads(env) if env else None,
            "hostfile": hostfile or None,
        }

    async def _tail_offset(self, node: Node, path: str, lines: int) -> int:
        """Where the last `lines` lines of the file start, in one round trip (0 when there is no file yet)."""
        script = 'test -e "$2" || { echo 0; exit; }; echo $(( $(wc -c < "$2") - $(tail -n "$1" "$2" | wc -c) ))'
        result = await self.transport.run(node, ["sh", "-c", script, "sh", str(lines), path])
        return max(0, int(result.stdout.strip() or 0))

    async def _fresh(self, job_id: int) -> Job:
        job = await self.store.job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def _poke(self) -> None:
        """Something changed: wake the loop now and whoever waits on a job."""
        self._wake.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ============================================================ the loop

    async def run(self, stop: asyncio.Event, *, probe: bool = True) -> None:
        """Tick until `stop` is set; probe the nodes every `probes.interval` alongside (first before placing)."""
        self.looping = True
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        prober = asyncio.create_task(self._probe_loop(stop, first)) if probe else None
        try:
            if prober is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(first), timeout=self.config.probes.timeout + 5)
            while not stop.is_set():
                try:
                    await self.tick()
                except FtError as exc:
                    log.warning("tick: %s", exc)
                except Exception:
                    log.exception("tick failed")
                self._wake.clear()
                # a poke (submit, stop, a probe) brings the next tick forward, but ticks stay MIN_TICK_GAP_S
                # apart: a burst of submissions is placed in one pass, not one pass each
                gap = min(MIN_TICK_GAP_S, self.settings.tick)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=gap)
                waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
                try:
                    await asyncio.wait(waits, timeout=self.settings.tick - gap, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            self.looping = False
            if prober is not None:
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober

    async def _probe_loop(self, stop: asyncio.Event, first: asyncio.Future[None]) -> None:
        while not stop.is_set():
            try:
                await self.service.probe()
            except FtError as exc:
                log.warning("probe: %s", exc)
            except Exception:
                log.exception("probe failed")
            if not first.done():
                first.set_result(None)
            self._poke()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.probes.interval)

    async def tick(self) -> None:
        """One pass of the control loop (see the module docstring)."""
        await self._launch_intents()
        await self._observe()
        await self._expire()
        await self._resize()
        await self._send_stops()
        await self._place()

    # -- 1. launch ------------------------------------------------------------------------------------------

    async def _launch_intents(self) -> None:
        held = await self.store.runs(held=True)
        by_job: dict[int, list[Run]] = defaultdict(list)
        for r in held:
            if r.state == "intent":
                by_job[r.job].append(r)
        up = [(r.job, r.attempt) for r in held if r.active and r.state != "intent"]
        for job_id, runs in by_job.items():
            if any(job == job_id and attempt < runs[0].attempt for job, attempt in up):
                continue  # a resized elastic job: its new attempt starts once every rank of the old one is down
            job = await self.store.job(job_id)
            if job is None:
                continue
            await self._launch(job, runs)

    async def _launch(self, job: Job, intents: Sequence[Run]) -> None:
        attempt = await self.store.attempt(job.id, intents[0].attempt)
        assert attempt is not None
        all_runs = [r for r in await self.store.runs(job=job.id) if r.attempt == attempt.number]
        plan = self._plan(job, attempt, all_runs)
        by_rank = {r.rank: r for r in plan.plan.ranks}
        python = self.config.ssh.python

        async def one(run: Run) -> tuple[Run, dict[str, Any]]:
            node = self._nodes[run.node]
            rank = by_rank[run.rank]
            try:
                if job.stop_reason is not None:  # stopped before it started: start nothing, find what is there
                    status = (await run_states(self.transport, node, [run.run_dir], python=python))[run.run_dir]
                    if status.state == "absent":
                        return run, {"state": "cancelled"}
                    return run, _status_fields(status)
                if not rank.launch:
                    path = await prepare_run(self.transport, node, **_rank_args(rank), python=python)
                    return run, {"state": "prepared", "run_dir": path}
                _, status = await start_run(
                    self.transport,
                    node,
                    **_rank_args(rank),
                    steps=plan.steps[run.rank],
                    workdir=rank.workdir,
                    grace=self.settings.stop_grace,
                    python=python,
                )
                fields = _status_fields(status)
                if status.run_dir:
                    fields["run_dir"] = status.run_dir
                return run, fields
            except FtError as exc:
                return run, {"state": "failed", "error": f"cannot start: {exc}", "ended": self.clock()}

        results = await asyncio.gather(*(one(r) for r in intents))
        async with self.store.jobs_tx("record started runs") as tx:
            for run, fields in results:
                await tx.update_run(run, **fields)
        self._poke()

    def _plan(self, job: Job, attempt: Attempt, runs: Sequence[Run]) -> JobLaunch:
        ordered = sorted(runs, key=lambda r: r.rank)
        spec = job.spec
        base = LaunchInput(
            job_id=str(job.id),
            attempt=attempt.number,
            mode=spec.mode.value,
            argv=(),
            env=dict(spec.env),
            workdir=spec.workdir,
            nodes=tuple(NodeAssignment(r.node, self._nodes[r.node].host, r.gpus) for r in ordered),
            master_port=attempt.master_port,
            run_root=self.settings.run_root,
            ps_count=spec.ps_count or 0,
            max_restarts=spec.fault_tolerance.max_restarts,
            output_dir=spec.output,
        )
        return plan_job(spec, base)

    # -- 2. observe -----------------------------------------------------------------------------------------

    async def _observe(self) -> None:
        running = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)}
        if not running:
            return
        held = [r for r in await self.store.runs(held=True) if r.job in running]
        to_read: dict[str, list[Run]] = defaultdict(list)
        for r in held:
            if r.launch and r.state in ("starting", "running"):
                to_read[r.node].append(r)
        python = self.config.ssh.python

        async def read(node: Node) -> dict[str, RunStatus]:
            return await run_states(self.transport, node, [r.run_dir for r in to_read[node.name]], python=python)

        answers = await run_on_all([self._nodes[n] for n in to_read], read)
        now = self.clock()
        updated: dict[tuple[int, int, int], Run] = {}
        changes: list[tuple[Run, dict[str, Any]]] = []
        moved = False  # a run changed more than its output heartbeat
        for name, answer in answers.items():
            if isinstance(answer, FtError):
                log.warning("cannot read runs on %s: %s", name, answer)
                continue  # unreachable node: its runs keep their last state (recovery decides, not this loop)
            for r in to_read[name]:
                status = answer[r.run_dir]
                fields = _status_fields(status)
                if fields["state"] == "absent":
                    fields["ended"] = now
                if status.output_at is not None and status.output_at != r.output_at:
                    fields["output_at"] = status.output_at  # written only when it moved
                new = dataclasses.replace(r, **{k: v for k, v in fields.items() if k != "run_dir"})
                updated[(r.job, r.attempt, r.rank)] = new
                if new != r:
                    changes.append((r, fields))
                    moved = moved or dataclasses.replace(new, output_at=r.output_at) != r
        attempts = await self.store.running_attempts()
        quiet: list[tuple[Run, dict[str, Any]]] = []  # run changes of jobs with nothing to decide
        drained: list[tuple[Job, list[int]]] = []  # resized jobs whose earlier attempts are down
        for job in running.values():
            mine_now = [updated.get((r.job, r.attempt, r.rank), r) for r in held if r.job == job.id]
            runs = [r for r in mine_now if r.attempt == job.attempt]
            earlier = [r for r in mine_now if r.attempt < job.attempt]  # a resize's old attempt: never settles the job
            if earlier and not any(r.active for r in earlier):
                drained.append((job, sorted({r.attempt for r in earlier})))
            if not runs:
                continue
            attempt = attempts.get(job.id)
            was_running = attempt is not None and attempt.started is not None
            decision = settle(job, runs, was_running=was_running)
            mine = [(r, f) for r, f in changes if r.job == job.id]
            if decision is None:
                quiet.extend(mine)
                continue
            try:
                async with self.store.jobs_tx(f"record job {job.id}") as tx:
                    for r, fields in mine:
                        await tx.update_run(r, **fields)
                    await self._apply(tx, job, decision, now, runs, was_running=was_running)
            except Conflict:
                continue
            self._poke()
        if quiet:  # one transaction for all of them: nothing there can conflict
            async with self.store.jobs_tx("record run states") as tx:
                for r, fields in quiet:
                    await tx.update_run(r, **fields)
            if moved:  # a heartbeat alone wakes nobody: a printing job would otherwise make the loop spin
                self._poke()
        for job, numbers in drained:
            async with self.store.jobs_tx(f"release the resized attempt of job {job.id}") as tx:
                for number in numbers:
                    await tx.release_runs(job.id, attempt=number)
                    await tx.update_attempt(job.id, number, ended=now, result="resized")
                down = ", ".join(map(str, numbers))
                text = f"attempt {down} is down: attempt {job.attempt} starts"
                await tx.event(now, Condition.SCALING, text, job=job.id)
            self._poke()

    async def _apply(
        self, tx: JobTx, job: Job, decision: Any, now: float, runs: Sequence[Run], *, was_running: bool
    ) -> None:
        if isinstance(decision, AllRunning):
            if job.message:  # e.g. a resize's "scaling 2 -> 3 nodes", now done
                await tx.update_job(job.id, message="")
            await tx.update_attempt(job.id, job.attempt, started=now)
            await tx.event(now, Condition.RUNNING, f"every rank of attempt {job.attempt} is running", job=job.id)
        elif isinstance(decision, StopOthers):
            stopping = f"{decision.message}; stopping the other ranks"
            await _request_stop(tx, job, now, StopReason.ERROR, "scheduler", stopping, message=decision.message)
        elif isinstance(decision, Finish):
            starts = [r.started for r in runs if r.started is not None]
            if not was_running and starts:  # it ran and ended between two looks: the timeline still says so
                await tx.update_attempt(job.id, job.attempt, started=min(starts))
                await tx.event(min(starts), Condition.RUNNING, f"attempt {job.attempt} ran", job=job.id)
            await tx.update_job(
                job.id,
                expect=[JobStatus.RUNNING],
                status=decision.status,
                ended=now,
                message=decision.message,
                exit_code=decision.exit_code,
            )
            await tx.update_attempt(
                job.id, job.attempt, ended=now, result=decision.status.value, message=decision.message
            )
            await tx.release_runs(job.id)
            await tx.event(now, FINAL_CONDITION[decision.status], decision.message, job=job.id)
            if decision.status is JobStatus.ERROR:
                await tx.alert(
                    now,
                    "job_failed",
                    "error",
                    f"job {job.id} ({job.name}, {job.owner}) failed: {decision.message}",
                    job=job.id,
                )

    # -- 3. expire and stop ---------------------------------------------------------------------------------

    async def _expire(self) -> None:
        now = self.clock()
        for job in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True):
            if not expired(job, now):
                continue
            limit = format_duration(job.max_runtime or 0)
            try:
                async with self.store.jobs_tx("expire a job") as tx:
                    stopping = f"max_runtime {limit} reached; stopping"
                    await _request_stop(tx, job, now, StopReason.EXPIRED, "scheduler", stopping)
            except Conflict:
                continue

    async def _send_stops(self) -> None:
        """Stop, once, the runs of jobs being stopped and those of attempts a resize replaced."""
        running = await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
        stopping = {j.id for j in running if j.stop_reason is not None}
        current = {j.id: j.attempt for j in running}
        pending: dict[str, list[Run]] = defaultdict(list)
        for r in await self.store.runs(held=True):
            if not (r.launch and r.state in ("starting", "running") and r.stop_sent is None):
                continue
            if r.job in stopping or (r.job in current and r.attempt < current[r.job]):
                pending[r.node].append(r)
        if not pending:
            return
        python = self.config.ssh.python

        async def send(node: Node) -> list[dict[str, Any]]:
            return await stop_runs(self.transport, node, [r.run_dir for r in pending[node.name]], python=python)

        answers = await run_on_all([self._nodes[n] for n in pending], send)
        now = self.clock()
        async with self.store.jobs_tx("record stops sent") as tx:
            for name, answer in answers.items():
                if isinstance(answer, FtError):
                    log.warning("cannot stop runs on %s: %s", name, answer)
                    continue
                for r in pending[name]:
                    await tx.update_run(r, stop_sent=now)

    # -- 4. place -------------------------------------------------------------------------------------------

    async def _place(self) -> None:
        queued = await self.store.jobs(statuses=[JobStatus.QUEUED])
        if not queued:
            return
        now = self.clock()
        state, requests, by_id, notes = await self._placement_inputs(queued)
        decisions = placement.plan(
            state, requests, now, urgent_cap=self.settings.urgent_cap, allow_degraded=self._degraded_ok
        )
        for decision in decisions:
            job, request = by_id[decision.job_id]
            if isinstance(decision, placement.Wait):
                notes.append((job, f"waiting (position {decision.position}): {decision.reason}"))
            else:
                await self._start(job, request.candidates[decision.candidate_index], decision, now)
        await self._notes(notes)

    async def predict(self, spec: JobSpec | dict[str, Any]) -> placement.Decision:
        """Would this job start now, on which nodes and GPUs; or its queue position, why, and the jobs ahead."""
        spec = _spec(spec)
        queued = await self.store.jobs(statuses=[JobStatus.QUEUED])
        state, requests, _, _ = await self._placement_inputs(queued)
        now = self.clock()
        job = job_request(spec, self.config, job_id="(this job)", now=now)
        return placement.predict(
            state, requests, job, now, urgent_cap=self.settings.urgent_cap, allow_degraded=self._degraded_ok
        )

    @property
    def _degraded_ok(self) -> list[str]:
        return [name for name, pool in self.config.pools.items() if pool.schedule_degraded]

    async def _placement_inputs(
        self, queued: Sequence[Job]
    ) -> tuple[
        placement.ClusterState,
        list[placement.JobRequest],
        dict[str, tuple[Job, placement.JobRequest]],
        list[tuple[Job, str]],
    ]:
        """The nodes as last probed, the GPUs the running jobs hold, and the queue, as placement reads them;
        with the queued jobs that cannot be placed at all, and why."""
        views = await self.service.nodes(extras=False)
        active = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)}
        allocations = []
        for r in await self.store.runs(held=True):
            holder = active.get(r.job)
            allocations.append(
                placement.Allocation(
                    job_id=str(r.job),
                    node=r.node,
                    gpus=r.gpus,
                    ends_at=holder.deadline if holder else None,
                    project=holder.project if holder else "",
                    priority=placement.Priority.parse(holder.priority) if holder else placement.Priority.NORMAL,
                )
            )
        state = placement.ClusterState(
            nodes=tuple(node_slot(v.to_json()) for v in views), allocations=tuple(allocations)
        )
        requests, by_id, unplaceable = [], {}, []
        for job in queued:
            try:
                request = job_request(job.spec, self.config, job_id=str(job.id), now=job.submitted)
            except FtError as exc:  # the config changed under a queued job (spec removed): say so, keep it
                unplaceable.append((job, str(exc)))
                continue
            request = dataclasses.replace(
                request,
                priority=placement.Priority.parse(job.priority),
                requeued=job.requeued,
                nodes=job.size,
                min_nodes=None if request.min_nodes is None else min(request.min_nodes, job.size),
            )
            requests.append(request)
            by_id[str(job.id)] = (job, request)
        return state, requests, by_id, unplaceable

    async def _notes(self, notes: Sequence[tuple[Job, str]], *, status: JobStatus = JobStatus.QUEUED) -> None:
        """Why jobs wait (their message): queued ones to start, running ones to be resized; in one transaction,
        only the ones that changed."""
        changed = [(job, text) for job, text in notes if job.message != text]
        if not changed:
            return
        async with self.store.jobs_tx("note why jobs wait") as tx:
            for job, text in changed:
                with contextlib.suppress(Conflict):  # its status changed meanwhile
                    await tx.update_job(job.id, expect=[status], message=text)

    async def _start(self, job: Job, candidate: placement.Candidate, decision: placement.Place, now: float) -> None:
        first = self._nodes[decision.nodes[0][0]]
        try:
            port = await free_port(self.transport, first, python=self.config.ssh.python)
        except FtError as exc:
            await self._notes([(job, f"placed, but cannot get a port on {first.name}: {exc}; retrying")])
            return
        number = job.attempt + 1
        spec_name, gpus = candidate.spec_name, candidate.gpus_per_node
        attempt, runs = self._new_attempt(job, number, spec_name, gpus, decision.nodes, port, now)
        where = _where(decision.nodes)
        try:
            async with self.store.jobs_tx("place a job") as tx:
                await tx.update_job(
                    job.id, expect=[JobStatus.QUEUED], status=JobStatus.RUNNING, started=now, attempt=number, message=""
                )
                await tx.add_attempt(attempt, runs)
                await tx.event(
                    now,
                    Condition.CREATING,
                    f"attempt {number} placed on {where}"
                    + (f" (spec {candidate.spec_name})" if candidate.spec_name else "")
                    + elastic.placed_small(job, len(decision.nodes)),
                    job=job.id,
                    data={"nodes": _nodes_json(decision.nodes), "port": port},
                )
        except Conflict:
            return  # stopped or changed while we asked for a port
        self._poke()
        fresh = await self._fresh(job.id)
        await self._launch(fresh, runs)

    def _new_attempt(
        self,
        job: Job,
        number: int,
        spec_name: str | None,
        gpus_per_node: int,
        nodes: Sequence[placement.NodeGpus],
        port: int,
        now: float,
    ) -> tuple[Attempt, list[Run]]:
        """Attempt `number` of the job on these nodes (rank order), with its runs as intents."""
        attempt = Attempt(
            job=job.id,
            number=number,
            spec_name=spec_name,
            gpus_per_node=gpus_per_node,
            master_port=port,
            created=now,
        )
        root = self.settings.run_root.rstrip("/")
        runs = [
            Run(
                job=job.id,
                attempt=number,
                rank=rank,
                node=node,
                gpus=tuple(gpus),
                run_dir=f"{root}/{job.id}/{number}/{rank}",
                launch=True,
            )
            for rank, (node, gpus) in enumerate(nodes)
        ]
        launching = {r.rank for r in self._plan(job, attempt, runs).launching}
        return attempt, [dataclasses.replace(r, launch=r.rank in launching) for r in runs]

    # -- elastic resizing -----------------------------------------------------------------------------------

    async def _resize(self) -> None:
        """Running elastic jobs scaled to a new size get a new attempt of that size (see `scheduler.elastic`);
        `_send_stops` then stops the old attempt, and `_launch_intents` starts the new one once it is down."""
        jobs = [
            j
            for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
            if j.stop_reason is None and elastic.resizes(j)
        ]
        if not jobs:
            return
        held = await self.store.runs(held=True)
        cluster: list[tuple[placement.ClusterState, list[placement.JobRequest]]] = []  # read once, until a resize
        for job in jobs:
            mine = [r for r in held if r.job == job.id]
            current = [r for r in mine if r.attempt == job.attempt]
            if not current or len(current) == job.size or any(r.attempt < job.attempt for r in mine):
                continue  # at its size, or a resize still under way
            try:
                if await self._resize_one(job, current, cluster):
                    cluster.clear()  # it holds more GPUs now
            except FtError as exc:
                await self._notes(
                    [(job, f"cannot scale to {job.size} nodes now: {exc}; retrying")], status=JobStatus.RUNNING
                )

    async def _resize_one(
        self,
        job: Job,
        current: Sequence[Run],
        cluster: list[tuple[placement.ClusterState, list[placement.JobRequest]]],
    ) -> bool:
        """Record the new attempt of a job being resized (True), or say why it waits (False)."""
        now = self.clock()
        attempt = await self.store.attempt(job.id, job.attempt)
        assert attempt is not None
        how = elastic.direction(len(current), job.size)
        nodes = elastic.kept_nodes(current, job.size)
        if job.size > len(current):
            if not cluster:
                state, requests, _, _ = await self._placement_inputs(await self.store.jobs(statuses=[JobStatus.QUEUED]))
                cluster.append((state, requests))
            decision = self._grow(job, attempt, current, job.size - len(current), now, *cluster[0])
            if isinstance(decision, placement.Wait):
                await self._notes([(job, f"{how} waits for nodes: {decision.reason}")], status=JobStatus.RUNNING)
                return False
            nodes += decision.nodes
        port = await free_port(self.transport, self._nodes[nodes[0][0]], python=self.config.ssh.python)
        number = job.attempt + 1
        new, runs = self._new_attempt(job, number, attempt.spec_name, attempt.gpus_per_node, nodes, port, now)
        try:
            async with self.store.jobs_tx("resize a job") as tx:
                await tx.update_job(
                    job.id,
                    expect=[JobStatus.RUNNING],
                    attempt=number,
                    message=f"{how}: attempt {number} starts once attempt {job.attempt} is down",
                )
                await tx.update_attempt(job.id, job.attempt, message=f"replaced by attempt {number} ({how})")
                for r in current:
                    if r.state == "intent":  # never launched: nothing to stop
                        await tx.update_run(r, state="cancelled", ended=now)
                await tx.add_attempt(new, runs)
                await tx.event(
                    now,
                    Condition.SCALING,
                    f"{how}: attempt {number} on {_where(nodes)}; stopping attempt {job.attempt}",
                    job=job.id,
                    data={"nodes": _nodes_json(nodes), "port": port, "from": len(current), "to": job.size},
                )
        except Conflict:
            return False  # it ended meanwhile
        self._poke()
        return True

    def _grow(
        self,
        job: Job,
        attempt: Attempt,
        current: Sequence[Run],
        count: int,
        now: float,
        state: placement.ClusterState,
        requests: list[placement.JobRequest],
    ) -> placement.Decision:
        """Where the `count` nodes a scale out adds would go now, or why they wait (placement's `predict`)."""
        rank0 = min(current, key=lambda r: r.rank).node
        deadline = job.deadline
        request = elastic.grow_request(
            job_request(job.spec, self.config, job_id=str(job.id), now=now),
            count=count,
            spec_name=attempt.spec_name,
            gpus_per_node=attempt.gpus_per_node,
            gpu_model=next((n.gpu_model for n in state.nodes if n.name == rank0), ""),
            own={r.node for r in current},
            cluster=self._nodes,
            priority=placement.Priority.parse(job.priority),
            now=now,
            remaining=None if deadline is None else deadline - now,
        )
        return placement.predict(state, requests, request, now, allow_degraded=self._degraded_ok)


# ================================================================ helpers


def _where(nodes: Sequence[placement.NodeGpus]) -> str:
    return ", ".join(f"{n}[{','.join(map(str, g))}]" for n, g in nodes)


def _nodes_json(nodes: Sequence[placement.NodeGpus]) -> list[dict[str, Any]]:
    return [{"node": n, "gpus": list(g)} for n, g in nodes]


def _job_id(value: int | str) -> int:
    try:
        return int(str(value).strip().removeprefix("#"))
    except ValueError:
        raise UsageError(f"not a job id: {value!r} (job ids are numbers, as `ftconsole jobs` shows)") from None


async def _request_stop(
    tx: JobTx, job: Job, now: float, reason: StopReason, by: str, event: str, **fields: Any
) -> None:
    """Record that a running job is to be stopped, with its Stopping condition; the loop sends the signals."""
    await tx.update_job(
        job.id, expect=[JobStatus.RUNNING], stop_requested=now, stop_reason=reason, stop_by=by, **fields
    )
    await tx.event(now, Condition.STOPPING, event, job=job.id)


def _spec(spec: JobSpec | dict[str, Any]) -> JobSpec:
    if isinstance(spec, JobSpec):
        return spec
    try:
        return JobSpec.from_json(spec)
    except ValidationError as exc:
        raise UsageError(f"invalid job spec: {exc}") from None


def _rank_args(rank: RankLaunch) -> dict[str, Any]:
    return {"run_dir": rank.run_dir, "argv": rank.argv, "env": rank.env, "files": rank.files}


def _status_fields(status: RunStatus) -> dict[str, Any]:
    return {
        "state": status.state,
        "pid": status.pid,
        "exit_code": status.exit_code,
        "signal": status.signal,
        "started": status.started,
        "ended": status.ended,
        "error": status.error,
    }
