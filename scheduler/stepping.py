"""Steps in a running job (`ftconsole run JOB -- CMD`, Slurm's `srun` inside an allocation): part of
`jobops.Scheduler`.

The scheduler decides and records; it runs nothing of the step. `step` (a stream) picks the step's nodes and GPUs
(`decide.stepplan`: never a GPU another running step holds, unless `overlap`; too few free and it waits, saying so),
takes a port free on its first node, records the step (a `Step` event) and hands `ftconsole run` the plan, which it
runs over SSH as the job's user, as the debug terminal does. The stream stays open while the step runs: the step is
the client's for as long as its connection lives. `step_end` records how it ended (the exit codes `ftconsole run`
saw: the job's user's claim about their own step, which changes nothing else). A client that goes away without it
(interrupted, killed) cancels the step: what it left on its nodes (FT_STEP in their environment) is stopped as an
attempt's leftovers are. A job that ends ends its steps; its runs' end stops their processes.

Across a restart of the scheduler the steps go on (their processes and their `ftconsole run` do not need it): a
client whose stream broke comes back (`attach`) and follows its step again. A step whose client has not come back
by two checks `STEP_ATTACH_S` apart is lost, and what it left is stopped.

Who: the job's owner, or root. A step runs as the job's user on its nodes, so nobody else's `ftconsole run`
could start it, and an admin's is refused rather than run as someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.decide.stepplan import JobStep, StepAsk, StepRank, busy_gpus, pick, plan_step
from ftconsole.scheduler.errors import NotFound, PermissionDenied, UsageError
from ftconsole.scheduler.loop import Loop
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.store.db import Store

log = logging.getLogger("ftconsole.scheduler")

STEP_ATTACH_S = 60.0  # how long a step without its `ftconsole run` waits for it to come back, at least
STEP_CHECK_S = 1.0  # how often a step's stream looks at its job (its end ends the step)
MAX_EXIT = 1 << 16  # an exit code past this is no exit code


@dataclass
class StepBook:
    """What a scheduler knows of steps beyond its own term of the loop (a reload makes a new scheduler, which takes
    the book over: `Reloader`): the steps whose `ftconsole run` follows them now in this process, and whether the
    process is stopping (then a stream that ends leaves its step to the next scheduler)."""

    attached: set[tuple[int, int]] = field(default_factory=set)
    stopping: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def poke(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)


class Stepping:
    """Part of `Scheduler` (jobops.py): the steps of running jobs."""

    store: Store
    clock: Callable[[], float]
    loop: Loop
    _nodes: dict[str, Node]
    steps_book: StepBook

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        raise NotImplementedError  # Scheduler's

    async def _step_job(self, caller: Caller, ref: int | str) -> Job:
        job = await self._job(caller, ref, "run a step in", write=True)
        if caller.uid not in (job.uid, 0):
            raise PermissionDenied(
                f"{caller.user} may not run a step in job {job.ref}: a step runs as the job's user, {job.owner}, on "
                "its nodes; only they (or root) run steps in it"
            )
        return job

    async def step(
        self, caller: Caller, ref: int | str, ask: StepAsk, *, attach: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """A new step of a running job (`ask`), or one begun before (`attach`, its number): first the waits (a
        `waiting` item each time the reason changes), then `{"step", "attempt", "owner", "ranks"}` (new) or
        `{"step", "attached"}`, then `{"ended": the step}` once it has ended. The step is the stream's: closing it
        before the step has ended cancels the step."""
        job = await self._step_job(caller, ref)
        step: JobStep | None = None
        gone = True  # the stream ends with its client gone (a cancellation, a close), not by an error of ours
        try:
            if attach is None:
                said = None
                while True:
                    began = await self._begin_step(caller, job, ask)
                    if not isinstance(began, str):
                        break
                    if began != said:
                        yield {"waiting": began}
                        said = began
                    await self.steps_book.wait(STEP_CHECK_S)
                    job = await self._step_job(caller, ref)
                step, ranks = began
                yield {"step": step.number, "attempt": step.attempt, "owner": job.owner,
                       "ranks": [r.to_json() for r in ranks]}  # fmt: skip
            else:
                step = await self._attach(job, attach)
                yield {"step": step.number, "attempt": step.attempt, "attached": True}
            while (ended := await self._step_over(job, step)) is None:
                await self.steps_book.wait(STEP_CHECK_S)
            yield {"ended": ended.to_json()}
        except Exception:
            gone = False  # a store error, say: the step goes on, and its `ftconsole run` follows it again (attach)
            raise
        finally:
            if step is not None:
                self.steps_book.attached.discard((job.id, step.number))
                if gone and not self.steps_book.stopping:  # the scheduler's own stop leaves it to the next one
                    why = "its ftconsole run went away (interrupted)"
                    self._in_background(self._cancel_step(job, step.number, why))

    async def _begin_step(self, caller: Caller, job: Job, ask: StepAsk) -> tuple[JobStep, tuple[StepRank, ...]] | str:
        """Record a new step and plan it, or why it waits."""
        if job.status is not JobStatus.RUNNING:
            raise UsageError(f"job {job.ref} is {job.status.value}: a step runs in a running job")
        runs = [r for r in await self.store.runs(job=job.id) if r.attempt == job.attempt]
        if not runs or any(r.state != "running" for r in runs if r.launch):
            return f"job {job.ref} attempt {job.attempt} is starting: waiting for its ranks to run"
        ask.check(job, runs)
        picked = pick(ask, runs, busy_gpus(await self.store.steps(job.id)))
        if isinstance(picked, str):
            return picked
        first = picked[0][0].node
        port = await self.loop.executor.free_port_on(self._nodes[first])
        now = self.clock()
        async with self.store.jobs_tx("begin a step") as tx:
            steps = await tx.steps_of(job.id)
            picked = pick(ask, runs, busy_gpus(steps))  # again: another step may have begun meanwhile
            if isinstance(picked, str) or picked[0][0].node != first:
                return "another step began meanwhile: choosing again"
            number = max((s.number for s in steps), default=0) + 1
            ranks = plan_step(job, number, ask, picked, hosts={n: self._nodes[n].host for n in self._nodes},
                              master_port=port)  # fmt: skip
            step = JobStep(job=job.id, number=number, attempt=job.attempt, argv=ask.argv, mode=ask.mode,
                           ranks=tuple((r.node, g) for r, g in picked), run_by=caller.user, started=now,
                           overlap=ask.overlap)  # fmt: skip
            await tx.add_step(step)
            where = ", ".join(f"{r.node}:{','.join(map(str, g)) or '-'}" for r, g in picked)
            text = f"step {number} started by {caller.user} on {where} ({ask.mode}): {shlex.join(ask.argv)}"
            await tx.event(now, "Step", text[:1000], job=job.id)
        self.steps_book.attached.add((job.id, number))
        log.info("job %s: %s", job.id, text)
        return step, ranks

    async def _attach(self, job: Job, number: int) -> JobStep:
        """Follow again a step begun before (its `ftconsole run` lost the scheduler: a restart)."""
        step = next((s for s in await self.store.steps(job.id) if s.number == number), None)
        if step is None:
            raise NotFound(f"job {job.ref} has no step {number}")
        if step.state != "running":
            raise UsageError(f"step {number} of job {job.ref} is {step.state}: {step.message or 'ended'}")
        if (job.id, number) in self.steps_book.attached:
            raise UsageError(f"step {number} of job {job.ref} is followed by another ftconsole run already")
        self.steps_book.attached.add((job.id, number))
        return step

    async def _step_over(self, job: Job, step: JobStep) -> JobStep | None:
        """The step once it has ended (by `step_end`, or with its job now); None while it runs."""
        now = next((s for s in await self.store.steps(job.id) if s.number == step.number), None)
        if now is None or now.state != "running":
            return now or step
        fresh = await self.store.job(job.id)
        if (
            fresh is None
            or fresh.status is not JobStatus.RUNNING
            or fresh.attempt != step.attempt
            or (fresh.stop_requested is not None)
        ):
            status = "gone" if fresh is None else _ending(fresh)
            await self._end_step(job, step.number, "cancelled", f"job {job.ref} {status}: the step ended with it")
            return next((s for s in await self.store.steps(job.id) if s.number == step.number), step)
        return None

    async def step_end(self, caller: Caller, ref: int | str, number: int, codes: list[int]) -> dict[str, Any]:
        """Record how a step ended: the exit status of each of its launching ranks, as `ftconsole run` saw them.
        Succeeded when each is 0; its exit code the highest (srun's)."""
        job = await self._step_job(caller, ref)
        if not codes or not all(isinstance(c, int) and -MAX_EXIT < c < MAX_EXIT for c in codes):
            raise UsageError(f"step_end takes the exit codes of the step's ranks, a list of integers, not {codes!r}")
        state, why = ("succeeded" if all(c == 0 for c in codes) else "failed"), ""
        if job.status is not JobStatus.RUNNING or job.stop_requested is not None:  # its ranks ended as the job did
            state, why = "cancelled", f"job {job.ref} {_ending(job)}: the step ended with it"
        await self._end_step(job, number, state, why, exit_code=max(codes))
        step = next((s for s in await self.store.steps(job.id) if s.number == number), None)
        if step is None:
            raise NotFound(f"job {job.ref} has no step {number}")
        return step.to_json()

    async def _end_step(self, job: Job, number: int, state: str, message: str, *, exit_code: int | None = None) -> bool:
        now = self.clock()
        async with self.store.jobs_tx("end a step") as tx:
            ended = await tx.end_step(job.id, number, state, now, exit_code=exit_code, message=message)
            if ended:
                how = "; ".join(x for x in (f"exit code {exit_code}" if exit_code is not None else "", message) if x)
                await tx.event(now, "Step", f"step {number} {state}: {how}"[:1000], job=job.id)
        if ended:
            self.steps_book.poke()
        return ended

    async def _cancel_step(self, job: Job, number: int, why: str, *, state: str = "cancelled") -> None:
        """End a step that still runs and stop what it left on its nodes."""
        step = next((s for s in await self.store.steps(job.id) if s.number == number), None)
        if step is None or step.state != "running":
            return
        if await self._end_step(job, number, state, why):
            fresh = await self.store.job(job.id)
            if fresh is not None and fresh.status is JobStatus.RUNNING and fresh.attempt == step.attempt:
                self.loop.executor.clear_step(fresh, step)  # an ended attempt's processes end with its runs

    def _in_background(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.steps_book.tasks.add(task)
        task.add_done_callback(self.steps_book.tasks.discard)

    async def keep_steps(self, stop: asyncio.Event) -> None:
        """Until `stop`: the steps no `ftconsole run` follows (this scheduler started after them, and theirs did
        not come back) are lost after two looks `STEP_ATTACH_S` apart, and what they left is stopped."""
        seen: set[tuple[int, int]] = set()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STEP_ATTACH_S)
            if stop.is_set() or not self.loop.executor.may_act():
                continue
            alone = {(s.job, s.number): s for s in await self.store.running_steps()}
            alone = {k: s for k, s in alone.items() if k not in self.steps_book.attached}
            for key in alone.keys() & seen:
                job = await self.store.job(key[0])
                if job is not None:
                    why = f"its ftconsole run did not come back within {STEP_ATTACH_S:.0f} s"
                    await self._cancel_step(job, key[1], why, state="lost")
            seen = set(alone) - seen


def _ending(job: Job) -> str:
    """How a job that ends its steps is: its status, or "stopping" while a stop is under way."""
    return "stopping" if job.status is JobStatus.RUNNING else job.status.value
