"""The control loop: each tick reads a snapshot, decides, records intent, acts, and records the outcome.

Level-triggered (DESIGN.md, "The control loop"). A tick is, in order:

1. act: `reconcile` (pure, `scheduler.decide.reconcile`) decides from the store's held runs and what the nodes
   last said: runs whose node left the config or stopped answering for `scheduler.node_timeout` are
   written `lost`; attempts with runs to start (or whose start had no answer: `unknown`) are launched;
   runs being stopped get their stop until the node confirms it, then SIGKILL once the grace period is
   over; the runs of each node are read with one command. The executor (`scheduler.executor`) carries
   these out, concurrently, each node with its own deadline, and fences nodes that come back.
2. observe: what the reads said is written, and `jobs.settle` decides what it means per job (all running,
   a rank failed, every rank done); a job that ends `error` raises a `job_failed` alert.
3. expire: running jobs past their max_runtime are asked to stop.
4. resize and 5. place (`scheduler.placing`, once the first probe sweep is in): elastic jobs scaled to a new
   size get their new attempt; one placement pass over the queue writes each placed job's attempt and runs
   as intents (job `running`, condition Creating), launched by the next tick's act.

Errors stay where they belong: an exception planning, placing or launching one job fails that job with a
clear message, and the tick goes on; an unexpected error in one node's task is that node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ftconsole.scheduler import discovery, evidence, nodegate, repair
from ftconsole.scheduler.decide.jobplan import PULL_STEP
from ftconsole.scheduler.decide.jobs import (
    FINAL_CONDITION,
    AllRunning,
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
from ftconsole.scheduler.decide.reconcile import READ_STATES, Actions, Snapshot, reconcile
from ftconsole.scheduler.decide.runrecord import recorded
from ftconsole.scheduler.decide.runstatus import missing
from ftconsole.scheduler.errors import Fenced, FtError, silence_text
from ftconsole.scheduler.executor import Executor
from ftconsole.scheduler.failpoints import FailpointError, afailpoint
from ftconsole.scheduler.idling import IdleReclaim
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.placing import Placer
from ftconsole.scheduler.recovery import Outcome, Recoverer
from ftconsole.scheduler.retention import Pruner
from ftconsole.scheduler.spec import dataprep
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.containers import pulling
from ftconsole.scheduler.ssh.runs import RunStatus
from ftconsole.scheduler.store.jobtx import Conflict, JobTx
from ftconsole.scheduler.watchdog import Watchdog, same_records

log = logging.getLogger("ftconsole.scheduler")

MIN_TICK_GAP_S = 0.2
# a run whose output.log moved and nothing else: written with the next other write, or all together this often
# (a write each tick for each printing rank made every tick read the store afresh: bench/channel.py --printing)
OUTPUT_FLUSH_S = 10.0


class Loop:
    def __init__(self, service: ClusterService, *, clock: Callable[[], float], poke: Callable[[], None]) -> None:
        self.service = service
        self.store = service.store
        self.transport = service.transport
        self.config = service.config
        self.settings = service.config.scheduler
        self.clock = clock
        self._poke = poke
        self.looping = False  # True while `run` drives ticks (else jobs only change on request)
        self.ran = False  # `run` was called: a loop runs once (a standby's next term has a new one)
        self.wake = asyncio.Event()
        self._nodes = {n.name: n for n in service.all_nodes}
        self.executor = Executor(service, clock=clock, poke=poke, fail=self._fail)
        self.idle = IdleReclaim(service.store, service, self.executor, clock)
        self.placer = Placer(
            service,
            clock=clock,
            poke=poke,
            fail=self._fail,
            run_root=lambda: self.run_root,
            avoided=self.executor.avoided,
        )
        self.recoverer = Recoverer(service, self.placer, clock=clock, poke=poke)
        self.watchdog = Watchdog(service, clock=clock)
        self.pruner = Pruner(self.store, service.config.history, clock=clock)
        self.watchdog.gather = lambda job, runs: evidence.gather(self.executor, job, runs)
        self.watchdog.poke = poke
        self.executor.scans = self.watchdog.logs.scans
        self.executor.read_every = self.watchdog.read_every
        self.watchdog.logs.reschedule = self.recoverer.reschedule_slow
        self.executor.gate = self.recoverer.preflight
        self._started = time.monotonic()
        self._read_since_start: set[tuple[int, int, int]] = set()
        self.adopted_s: float | None = None  # seconds from start until every running run was read once
        self._first_probe: asyncio.Future[None] | None = None  # the first probe sweep, while `run` drives
        self._prepared: set[tuple[int, int, str]] = set()  # (job, attempt, step) whose Pulling/Preparing is written
        self._steps: dict[tuple[int, int, int], str | None] = {}  # (job, attempt, rank) read running -> its step
        self._outputs: dict[tuple[int, int, int], float] = {}  # output.log's mtime read or pushed, not yet written
        self._outputs_written = float("-inf")
        # the running jobs and held runs (as the store gave them) of the last observe pass that had nothing to
        # decide, write or wait for: the next pass with nothing read or pushed since skips them
        self._settled: tuple[list[Job], list[Run]] | None = None
        self._owed = False  # the current pass decided something (or waits for a backoff)

    # ============================================================ driving

    async def run(self, stop: asyncio.Event, *, probe: bool = True) -> None:
        """Tick until `stop` is set; probe the nodes every `probes.interval` alongside.

        The runs already on the nodes are read from the first tick on; nothing is placed or resized before the
        first probe sweep has said which nodes are healthy (or `probes.timeout` + 5 s have gone by)."""
        self.looping = self.ran = True
        self._started = time.monotonic()
        await repair.pick_up(self.service)  # the repairs under way when the last scheduler stopped (before a probe)
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        prober = asyncio.create_task(self._probe_loop(stop, first)) if probe else None
        self._first_probe = first if probe else None
        pruner = asyncio.create_task(self.pruner.run(stop))  # history retention, alongside (scheduler/retention.py)
        finder = asyncio.create_task(discovery.watch(self.service, self.clock, stop, first if probe else None))
        try:
            while not stop.is_set():
                self.wake.clear()  # before the tick: a poke made during it brings the next one forward
                await self.tick()
                # a poke (submit, stop, a probe) brings the next tick forward, but ticks stay MIN_TICK_GAP_S
                # apart: a burst of submissions is placed in one pass, not one pass each
                gap = min(MIN_TICK_GAP_S, self.settings.tick)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=gap)
                waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
                try:
                    await asyncio.wait(waits, timeout=self.settings.tick - gap, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            self.looping = False
            for task in (pruner, finder):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if prober is not None:
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober
            await self.close()

    async def close(self) -> None:
        await self.watchdog.close()
        await self.executor.close()
        await self.recoverer.close()
        await self.service.tester.close()
        await self.service.repairs.close()

    async def _probe_loop(self, stop: asyncio.Event, first: asyncio.Future[None]) -> None:
        while not stop.is_set():
            try:
                await self.service.probe()
                await nodegate.start_due(self.service)  # isolated nodes that passed their probes: tested next
                await repair.start_auto(self.service)  # isolated nodes the scheduler may repair (repair.auto)
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
        """One pass of the control loop (see the module docstring); a step that fails does not stop the others."""
        await self.store.refresh()  # another process may have written: the store's kept reads start afresh
        steps = [self._act, self._observe, self._expire]
        if self._probed():
            steps += [self.placer.resize, self.placer.place]
        for step in steps:
            try:
                await step()
            except FtError as exc:
                log.warning("tick %s: %s", step.__name__.strip("_"), exc)
            except Exception:
                log.exception("tick %s failed", step.__name__.strip("_"))

    def _probed(self) -> bool:
        """Placement may go on: the first probe sweep is done (or late), or no probe loop runs (a direct tick)."""
        first = self._first_probe
        late = time.monotonic() - self._started > self.config.probes.timeout + 5
        return first is None or first.done() or late

    # ============================================================ 1. act

    async def _act(self) -> None:
        running = {j.id: j for j in await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)}
        held = [r for r in await self.store.runs(held=True) if r.job in running]
        snap = Snapshot(
            now=self.clock(),
            jobs=running,
            runs=held,
            nodes=frozenset(self._nodes),
            waiting=dict(self.executor.waiting),
            answered=dict(self.executor.answered),
            silence=self._silence(),
            dead=frozenset(self.executor.tracker.dead),
            node_timeout=self.settings.node_timeout,
            stop_grace=self.settings.stop_grace,
        )
        actions = reconcile(snap)
        await afailpoint("tick.after_snapshot")
        await self._lose(actions, snap.now)
        # nodes are swept for stray runs once the running ones are read back, so a restart reads them first
        settled = self.adopted_s is not None or time.monotonic() - self._started > self.settings.node_timeout
        self.executor.carry_out(actions, sweep=settled)
        await self.executor.wait()

    def _silence(self) -> dict[str, str]:
        """Why each silent node gives no answer: what a fresh connection found, else its last SSH error."""
        out = {name: silence_text(exc) for name, exc in self.executor.silence.items()}
        out.update((name, text) for name, text in self.executor.knocked.items() if text)
        return out

    async def _lose(self, actions: Actions, now: float) -> None:
        """Runs nothing can reach: written `lost` with why, their jobs settle on the next observe."""
        if not actions.lose:
            return
        self.executor.given_up(actions.silent)  # when they answer again, whatever still runs there is stopped
        async with self.store.jobs_tx("record lost runs") as tx:
            for lose in actions.lose:
                await tx.update_run(lose.run, state="lost", error=lose.reason, ended=now, fault=lose.reason)
                text = f"rank {lose.run.rank} of attempt {lose.run.attempt} on {lose.run.node} lost: {lose.reason}"
                await tx.event(now, "RunLost", text, job=lose.run.job, node=lose.run.node)
        for lose in actions.lose:
            log.warning("job %s: rank %s on %s lost: %s", lose.run.job, lose.run.rank, lose.run.node, lose.reason)
        self._poke()

    # ============================================================ 2. observe

    async def _observe(self) -> None:
        listing = await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
        running = {j.id: j for j in listing}
        observed = self.executor.observations()
        self.watchdog.observe(observed, self.clock())
        every = await self.store.runs(held=True)
        held = [r for r in every if r.job in running]
        self._adopting(held, observed)
        pushed = self.executor.outputs()  # output written, as the channels pushed
        settled, self._settled = self._settled, None
        if not running:
            return
        if (
            settled is not None
            and not (observed or pushed or self._outputs)
            and same_records(listing, settled[0])
            and same_records(every, settled[1])
        ):
            self._settled = settled  # nothing read, pushed or written since a pass that had nothing to decide
            return
        self._owed = False  # a pass that decides, writes or waits for its time sets it
        now = self.clock()
        self._prepared = {k for k in self._prepared if k[0] in running}
        self._steps = {k: step for k, step in self._steps.items() if k[0] in running}
        key = {(r.job, r.attempt, r.rank): r for r in held}
        by_dir = {(r.node, r.run_dir): r for r in held if r.run_dir}
        updated: dict[tuple[int, int, int], Run] = {}
        changes: list[tuple[Run, dict[str, Any]]] = []
        moved = False  # a run changed more than its output heartbeat
        for pairs in observed.values():
            for seen, status in pairs:
                self._steps.pop((seen.job, seen.attempt, seen.rank), None)
                if status.state == "running":
                    self._steps[(seen.job, seen.attempt, seen.rank)] = status.step
                r = key.get((seen.job, seen.attempt, seen.rank))
                if r is None or r.state not in READ_STATES:
                    continue  # written since it was read (lost, stopped...): the newer word stands
                fields = recorded(r, status, now)
                if status.state in ("absent", "foreign"):
                    fields.update(state="failed", ended=now, error=missing(r, status))
                if status.output_at is not None and status.output_at != r.output_at:
                    fields["output_at"] = status.output_at  # written only when it moved
                new = dataclasses.replace(r, **{k: v for k, v in fields.items() if k != "run_dir"})
                updated[(r.job, r.attempt, r.rank)] = new
                if dataclasses.replace(new, output_at=r.output_at) == r:  # its output moved, nothing else
                    if new.output_at is not None and new.output_at != r.output_at:
                        self._outputs[(r.job, r.attempt, r.rank)] = new.output_at
                    continue
                changes.append((r, fields))
                moved = True
        for (node, run_dir), at in pushed.items():
            r = by_dir.get((node, run_dir))
            if r is None or (r.job, r.attempt, r.rank) in updated or r.state != "running" or r.output_at == at:
                continue
            self._outputs[(r.job, r.attempt, r.rank)] = at
        changes = self._with_outputs(changes, key, now)
        attempts = await self.store.running_attempts()
        quiet: list[tuple[Run, dict[str, Any]]] = []  # run changes of jobs with nothing to decide
        drained: list[tuple[Job, list[int]]] = []  # resized jobs whose earlier attempts are down
        by_job: dict[int, list[Run]] = {}  # one pass over the runs, not one per job
        for r in held:
            by_job.setdefault(r.job, []).append(updated.get((r.job, r.attempt, r.rank), r))
        changed: dict[int, list[tuple[Run, dict[str, Any]]]] = {}
        for r, f in changes:
            changed.setdefault(r.job, []).append((r, f))
        for job in running.values():  # one job's trouble is that job's alone: the others' are still written
            try:
                mine = changed.get(job.id, [])
                quiet.extend(await self._observe_job(job, by_job.get(job.id, []), mine, attempts, drained, now))
            except Exception as exc:
                await self._observing_failed(job, "record what its runs said", exc)
        if quiet:  # one transaction for all of them: nothing there can conflict
            try:
                await self._record_quiet(quiet)
            except Exception:  # a value the store refuses: each job's alone, so that one fails, the others go on
                log.exception("recording run states in one transaction failed: one transaction per job")
                by_quiet: dict[int, list[tuple[Run, dict[str, Any]]]] = {}
                for r, f in quiet:
                    by_quiet.setdefault(r.job, []).append((r, f))
                for job_id, own in by_quiet.items():
                    try:
                        await self._record_quiet(own)
                    except Exception as exc:
                        await self._observing_failed(running[job_id], "record its run states", exc)
            if moved:  # a heartbeat alone wakes nobody: a printing job would otherwise make the loop spin
                self._poke()
        for job, numbers in drained:
            try:
                async with self.store.jobs_tx(f"release the resized attempt of job {job.id}") as tx:
                    for number in numbers:
                        await tx.release_runs(job.id, attempt=number)
                        await tx.update_attempt(job.id, number, ended=now, result="resized")
                    down = ", ".join(map(str, numbers))
                    text = f"attempt {down} is down: attempt {job.attempt} starts"
                    await tx.event(now, Condition.SCALING, text, job=job.id)
            except Exception as exc:
                await self._observing_failed(job, "release its resized attempt", exc)
                continue
            self._poke()
        if not (self._owed or changes or quiet or drained):
            self._settled = (listing, every)  # the next pass, with nothing new, would find nothing to decide

    async def _observe_job(
        self,
        job: Job,
        mine_now: Sequence[Run],
        mine: list[tuple[Run, dict[str, Any]]],
        attempts: dict[int, Any],
        drained: list[tuple[Job, list[int]]],
        now: float,
    ) -> list[tuple[Run, dict[str, Any]]]:
        """Settle one running job from its runs as read (`mine_now`; `mine`: its run changes): write the decision
        with the changes; the changes to write with the others' when there is nothing to decide."""
        runs = [r for r in mine_now if r.attempt == job.attempt]
        earlier = [r for r in mine_now if r.attempt < job.attempt]  # a resize's old attempt: never settles the job
        if earlier and not any(r.active for r in earlier):
            drained.append((job, sorted({r.attempt for r in earlier})))
        if not runs:
            return []
        attempt = attempts.get(job.id)
        was_running = attempt is not None and attempt.started is not None
        decision = await self._preparing(job, runs, settle(job, runs, was_running=was_running), now)
        if decision is not None:
            self._owed = True  # decided (or waiting for its time to): the next pass must look again
        if isinstance(decision, Finish) and decision.status is JobStatus.ERROR:
            outcome = await self.recoverer.after_failure(job, runs, mine, decision)
            if outcome is Outcome.WAIT:  # decided on a later tick: the runs are stored as read
                return mine
            if outcome is Outcome.DONE:  # requeued or restarted, the runs written with it
                self.executor.clear_leftovers(job, runs)
                return []
            decision = outcome
        if decision is None:
            return mine
        try:
            async with self.store.jobs_tx(f"record job {job.id}") as tx:
                for r, fields in mine:
                    await tx.update_run(r, **fields)
                await self._apply(tx, job, decision, now, runs, was_running=was_running)
        except Conflict:
            return []
        await afailpoint("observe.after_record")
        if isinstance(decision, Finish):
            self.executor.clear_leftovers(job, runs)
        if isinstance(decision, StopOthers):
            self.recoverer.dump(job, runs)
        self._poke()
        return []

    def _with_outputs(
        self, changes: list[tuple[Run, dict[str, Any]]], runs: Mapping[tuple[int, int, int], Run], now: float
    ) -> list[tuple[Run, dict[str, Any]]]:
        """`changes` with the output moves held back, when there is another write to make anyway or the last were
        written `OUTPUT_FLUSH_S` ago (a run's `output_at` in the store is at most that late)."""
        if not self._outputs or (not changes and now - self._outputs_written < OUTPUT_FLUSH_S):
            return changes
        fields_of = {(r.job, r.attempt, r.rank): fields for r, fields in changes}
        for k, at in self._outputs.items():
            r = runs.get(k)
            if r is None or r.state != "running" or r.output_at == at:
                continue
            if k in fields_of:
                fields_of[k].setdefault("output_at", at)
            else:
                changes.append((r, {"output_at": at}))
        self._outputs.clear()
        self._outputs_written = now
        return changes

    async def _record_quiet(self, quiet: Sequence[tuple[Run, dict[str, Any]]]) -> None:
        async with self.store.jobs_tx("record run states") as tx:
            for r, fields in quiet:
                await tx.update_run(r, **fields)

    async def _observing_failed(self, job: Job, doing: str, exc: Exception) -> None:
        """An unexpected error observing one job (a bug, a value the store refuses): logged, and that job fails
        alone with the reason; the other jobs' observations are written as usual."""
        if isinstance(exc, FailpointError | Fenced):
            raise exc  # a test's error stands for the whole step's (scheduler.failpoints); Fenced: not the job's
        log.exception("job %s: cannot %s", job.id, doing)
        try:
            await self._fail(job, f"ftconsole cannot {doing}: {type(exc).__name__}: {exc}")
        except Exception:
            log.exception("job %s: cannot fail it either", job.id)

    async def _preparing(self, job: Job, runs: Sequence[Run], decision: Any, now: float) -> Any:
        """A job with an image or data_prep: ranks last read in their pull or data step make a Pulling or Preparing
        condition (each once per attempt; after a scheduler restart it may come once more), and Running waits until
        every rank was read past them."""
        first = {PULL_STEP: Condition.PULLING} if job.spec.image is not None else {}
        if job.spec.data_prep:
            first[dataprep.DATA_STEP] = Condition.PREPARING
        if not first:
            return decision
        steps = [(r, self._steps.get((r.job, r.attempt, r.rank))) for r in runs if r.launch]
        if isinstance(decision, AllRunning) and any(step is None or step in first for _, step in steps):
            decision = None  # started, but not yet known to run the command
        for name, condition in first.items():
            where = [(r.rank, r.node) for r, step in steps if step == name]
            if name == PULL_STEP:
                text = pulling(job.spec.image or "", job.attempt, where)
            else:
                text = dataprep.preparing(job.attempt, where)
            if text is not None and (job.id, job.attempt, name) not in self._prepared:
                self._prepared.add((job.id, job.attempt, name))
                async with self.store.jobs_tx(f"record job {job.id} {condition.lower()}") as tx:
                    await tx.event(now, condition, text, job=job.id)
        return decision

    async def _apply(
        self, tx: JobTx, job: Job, decision: Any, now: float, runs: Sequence[Run], *, was_running: bool
    ) -> None:
        if isinstance(decision, AllRunning):
            if job.message:  # e.g. a resize's "scaling 2 -> 3 nodes", now done
                await tx.update_job(job.id, message="")
            await tx.update_attempt(job.id, job.attempt, started=now)
            await tx.event(now, Condition.RUNNING, f"every rank of attempt {job.attempt} is running", job=job.id)
        elif isinstance(decision, StopOthers):
            stopping = f"{decision.message}; {self.recoverer.stopping_others(job)}"
            await request_stop(tx, job, now, StopReason.ERROR, "scheduler", stopping, message=decision.message)
        elif isinstance(decision, Finish):
            starts = [r.started for r in runs if r.started is not None]
            if not was_running and starts:  # it ran and ended between two looks: the timeline still says so
                await tx.update_attempt(job.id, job.attempt, started=min(starts))
                await tx.event(min(starts), Condition.RUNNING, f"attempt {job.attempt} ran", job=job.id)
            await self._finish(tx, job, decision, now)

    async def _finish(self, tx: JobTx, job: Job, decision: Finish, now: float) -> None:
        await tx.update_job(
            job.id,
            expect=[JobStatus.RUNNING, JobStatus.QUEUED],
            status=decision.status,
            ended=now,
            message=decision.message,
            exit_code=decision.exit_code,
        )
        if job.attempt and job.status is JobStatus.RUNNING:  # a queued job's last attempt ended already
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

    async def _fail(self, job: Job, message: str) -> None:
        """A job that cannot be planned, placed or launched fails alone: a queued one (or one whose runs never
        started) ends `error` at once; a running one is stopped and ends `error` with this message."""
        now = self.clock()
        runs = [r for r in await self.store.runs(job=job.id) if r.active]
        dump = False
        try:
            async with self.store.jobs_tx(f"fail job {job.id}") as tx:
                if job.status is JobStatus.RUNNING and any(r.state != "intent" for r in runs):
                    if job.stop_reason is None:
                        await request_stop(tx, job, now, StopReason.ERROR, "scheduler", message, message=message)
                        dump = True
                else:
                    for r in runs:
                        await tx.update_run(r, state="cancelled", ended=now)
                    await self._finish(tx, job, Finish(JobStatus.ERROR, message, None), now)
        except Conflict:
            return
        if dump:
            self.recoverer.dump(job, runs)
        self._poke()

    def _adopting(self, held: Sequence[Run], observed: dict[str, list[tuple[Run, RunStatus]]]) -> None:
        """Once after a start: when every run that was running has been read from its node (or has ended),
        log how long that took and keep it in `adopted_s` (bench/recovery.py measures it)."""
        if self.adopted_s is not None:
            return
        self._read_since_start.update((r.job, r.attempt, r.rank) for pairs in observed.values() for r, _ in pairs)
        waiting = [
            r for r in held if r.state in READ_STATES and (r.job, r.attempt, r.rank) not in self._read_since_start
        ]
        if waiting:
            return
        self.adopted_s = time.monotonic() - self._started
        count, nodes = len(self._read_since_start), len({r.node for r in held if r.state in READ_STATES})
        log.info("adopted %d running run(s) on %d node(s) %.2fs after start", count, nodes, self.adopted_s)

    # ============================================================ 3. expire

    async def _expire(self) -> None:
        await self.recoverer.expire_requeued(self._fail)
        await self.recoverer.watch()
        await self.watchdog.check()
        running = await self.store.jobs(statuses=[JobStatus.RUNNING], deleted=True)
        await self.idle.check(running, await self.store.runs(held=True))
        now = self.clock()
        for job in running:
            if not expired(job, now):
                continue
            limit = format_duration(job.max_runtime or 0)
            try:
                async with self.store.jobs_tx("expire a job") as tx:
                    stopping = f"max_runtime {limit} reached; stopping"
                    await request_stop(tx, job, now, StopReason.EXPIRED, "scheduler", stopping)
            except Conflict:
                continue

    @property
    def run_root(self) -> str:
        return self.executor.run_root


# ================================================================ helpers


async def request_stop(tx: JobTx, job: Job, now: float, reason: StopReason, by: str, event: str, **fields: Any) -> None:
    """Record that a running job is to be stopped, with its Stopping condition; the loop sends the signals."""
    await tx.update_job(
        job.id, expect=[JobStatus.RUNNING], stop_requested=now, stop_reason=reason, stop_by=by, **fields
    )
    await tx.event(now, Condition.STOPPING, event, job=job.id)


def _rank(run: Run) -> int:
    return run.rank
