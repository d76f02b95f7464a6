"""The executor: carries out what `reconcile` decided, on the nodes, and writes each outcome with its event.

Every piece of node work is a task keyed by what it does (launch an attempt, stop then read one node's runs,
sweep a node), never started twice at once; each talks to one node with its own deadline (the smaller of
`ssh.command_timeout` and `scheduler.node_timeout`), so a node that hangs holds up only its own work. The loop
waits for the tasks at most `ACT_WAIT_S` per tick; later outcomes are written when they come and wake the
loop. Each node command goes through `NodeSilence` (silence.py), which keeps count of the node's answers: since
when the loop waits for one (the clock of `node_timeout`, which wakes the loop when it runs out), when it last
answered, and why it is silent. Nodes met for the first time, and nodes given up, are swept once they answer:
every run of this cluster there that the store does not count as current is killed (fencing).

Run retention rides on those round trips: each sweep, and a node's run read at most every `PRUNE_EVERY_S`,
asks the node to remove the folders of this cluster's attempts that ended more than `scheduler.run_retention`
ago, but those of the attempts the store holds (the node's supervisor decides and checks; see supervisor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from typing import Any

from ftconsole.scheduler.checkpoints import CheckpointSignals
from ftconsole.scheduler.decide.jobplan import Images, JobLaunch, plan_attempt
from ftconsole.scheduler.decide.jobs import Attempt, Condition, Job, Run
from ftconsole.scheduler.decide.launcher import RankLaunch
from ftconsole.scheduler.decide.reconcile import Actions, Launch, Read, Stop
from ftconsole.scheduler.decide.runrecord import recorded
from ftconsole.scheduler.decide.steps import user_root
from ftconsole.scheduler.errors import CommandTimeout, Fenced, FtError, SSHError, UnreachableError
from ftconsole.scheduler.failpoints import afailpoint
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.spec.containers import pick_runtime, why_not
from ftconsole.scheduler.ssh.channel import PING_S, Channels
from ftconsole.scheduler.ssh.runs import (
    CannotSwitch,
    NoAccount,
    RunStatus,
    account,
    free_port,
    prepare_run,
    run_states,
    signal_runs,
    start_run,
    stop_runs,
)
from ftconsole.scheduler.ssh.silence import NodeSilence
from ftconsole.scheduler.ssh.transport import SSHPool, Transport
from ftconsole.scheduler.store.jobtx import CheckpointSignal, Conflict
from ftconsole.scheduler.sweeping import Sweeping

log = logging.getLogger("ftconsole.scheduler")

ACT_WAIT_S = 2.0  # how long a tick waits for the node commands it started; slower ones finish in the background
SWEEP_RETRY_S = 5.0  # how often a node still to be swept is tried while it does not answer
QUIET_READ_S = 30.0  # a quiet node with channels is read this often (the safety net; Watchdog.read_every)
PRUNE_EVERY_S = 3600.0  # run retention along with a node's reads at most this often (and with every sweep)
ACCOUNT_OK_S = 600.0  # a user's account found on a node is not asked for again before a launch for this long
NO_ACCOUNT_S = 3600.0  # a node where a user has no account is left out of that user's placements this long


class Executor(Sweeping):
    def __init__(
        self,
        service: ClusterService,
        *,
        clock: Callable[[], float],
        poke: Callable[[], None],
        fail: Callable[[Job, str], Awaitable[None]],
    ) -> None:
        self.store = service.store
        self.transport: Transport = service.transport
        self.channels: Channels | None = None
        if service.config.scheduler.node_channel and isinstance(service.transport, SSHPool):
            self.channels = Channels(service.transport, on_event=self._event, clock=clock)
            self.transport = self.channels  # the supervisor's calls ask a node's channel first
        self.config = service.config
        self.settings = service.config.scheduler
        self.clock = clock
        self._poke = poke
        self._fail = fail
        self.nodes = {n.name: n for n in service.all_nodes}
        self._tasks: dict[Hashable, asyncio.Task[None]] = {}
        self._in_tick = False
        self._observed: dict[str, list[tuple[Run, RunStatus]]] = {}  # node -> what its last read said
        self._outputs: dict[tuple[str, str], float] = {}  # (node, run folder) -> output.log written, as pushed
        self.tracker = NodeSilence(self.transport, clock=clock, poke=poke, node_timeout=self.settings.node_timeout)
        # the tracker's own dicts (the loop reads them for its Snapshot); see silence.py
        self.waiting, self.answered = self.tracker.waiting, self.tracker.answered
        self.silence, self.knocked = self.tracker.silence, self.tracker.knocked
        # run folder -> what to scan its output.log for in this read (the watchdog's, see runs.run_states)
        self.scans: Callable[[Sequence[Run]], dict[str, Any]] = lambda runs: {}
        # how often a quiet node with channels is read all the same (the watchdog's samples: `Watchdog.read_every`)
        self.read_every: Callable[[Sequence[Run]], float] = lambda runs: QUIET_READ_S
        self._unswept: set[str] = set(self.nodes)  # nodes to sweep for runs that are no longer current
        self._given_up: set[str] = set()  # nodes whose runs were written lost, until they answer again
        self._swept_at: dict[str, float] = {}  # node -> the last try
        self._pruned_at: dict[str, float] = {}  # node -> when its old run folders were last pruned
        # the environment pre-check before an attempt's first start (`Recoverer.preflight`, set by the loop)
        self.gate: Callable[[Job, Attempt, Callable[[Job, str], Awaitable[None]]], Awaitable[bool]] | None = None
        self._owners: dict[int, str] = {}  # job -> its owner (never changes)
        self._accounts: dict[tuple[str, str], float] = {}  # (user, node) -> when its account was last found
        # (user, node) -> (when, what the user lacks there: "no account", "no home folder")
        self.no_account: dict[tuple[str, str], tuple[float, str]] = {}
        self.checkpoints = CheckpointSignals(self.store, clock=clock, send=self._signal)
        # whether this scheduler may act on the nodes now: False once its lease may have run out (several schedulers
        # on one PostgreSQL store: scheduler.serve.leadership); every node command of the loop asks it first
        self.may_act: Callable[[], bool] = lambda: True

    def avoided(self, user: str) -> dict[str, str]:
        """The nodes where `user` was lately found to have no account (or no home folder for its run folders),
        each with what it lacks there: placement leaves them out for that user."""
        now = self.clock()
        return {
            node: lacks
            for (who, node), (at, lacks) in self.no_account.items()
            if who == user and now - at < NO_ACCOUNT_S
        }

    def run_user(self, job: Job) -> str | None:
        """Whom a job's runs run as on the nodes: its owner (run_as: submitter), or None: the SSH account."""
        return job.owner if self.settings.run_as == "submitter" else None

    async def _users(self, runs: Sequence[Run]) -> dict[str, str | None]:
        """Run folder -> whom it belongs to on its node (`run_user` of its job)."""
        if self.settings.run_as != "submitter":
            return {}
        for job_id in {r.job for r in runs} - self._owners.keys():
            job = await self.store.job(job_id)
            if job is not None:
                self._owners[job_id] = job.owner
        return {r.run_dir: self._owners.get(r.job) for r in runs}

    @property
    def run_root(self) -> str:
        """Where this cluster's run folders are on the nodes: keyed by the store's cluster id, so a scheduler
        with another store never meets them (job ids restart at 1 in every store)."""
        return f"{self.settings.run_root.rstrip('/')}/{self.store.cluster_id}"

    def carry_out(self, actions: Actions, *, sweep: bool = True) -> None:
        """Start the work `reconcile` asked for (what is still under way from an earlier tick is not doubled),
        and with `sweep` the sweeps of the nodes still to be swept; and the checkpoint signals owed."""
        self._spawn(("checkpoints",), self.checkpoints.carry_out())
        if self.channels is not None:
            wanted = {r.run_dir for read in actions.read for r in read.runs}
            self.channels.close_idle(wanted | {r.run_dir for stop in actions.stop for r in stop.runs})
        for launch in actions.launch:
            self._spawn(("launch", launch.job, launch.attempt), self._launch(launch))
        stops: dict[str, list[Stop]] = defaultdict(list)
        for stop in actions.stop:
            stops[stop.node].append(stop)
        reads = {read.node: read for read in actions.read if not self._quiet_now(read)}
        for name in sorted(stops.keys() | reads.keys()):
            self._spawn(("node", name), self._tend(stops.get(name, []), reads.get(name)))
        now = self.clock()
        for name in self.tracker.to_knock(now):
            if name in self.nodes:
                self._spawn(("knock", name), self.tracker.knock(self.nodes[name]))
        for name in sorted(self._unswept & set(self.nodes) if sweep else ()):
            if now - self._swept_at.get(name, -SWEEP_RETRY_S) >= SWEEP_RETRY_S:
                self._swept_at[name] = now
                self._spawn(("sweep", name), self._sweep(self.nodes[name]))

    def given_up(self, nodes: Sequence[str]) -> None:
        """Nodes whose runs were written lost: their silence clock starts again with the next ask, and they are
        swept once they answer."""
        for name in nodes:
            self._unswept.add(name)
            self._given_up.add(name)
            self.tracker.forget(name)

    async def wait(self) -> None:
        """Wait for the work under way, at most `ACT_WAIT_S`; not for the work on a node already late (given up,
        or silent for longer than that): its answer, if it comes, wakes the loop. (A frozen node's read held each
        tick for its whole wait: the stop of its job's other ranks came a tick after the node was given up.)"""
        waited = [task for key, task in self._tasks.items() if not self._late(key) and not _pinging(key)]
        if not waited:
            return
        self._in_tick = True
        try:
            await asyncio.wait(waited, timeout=ACT_WAIT_S)
        finally:
            self._in_tick = False

    def _late(self, key: Hashable) -> bool:
        """Whether `key` is work on one node that is already late: given up and not answered since, or silent
        for longer than a tick waits."""
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] in ("node", "knock", "sweep")):
            return False
        since = self.tracker.waiting.get(key[1])
        return key[1] in self._given_up or (since is not None and self.clock() - since > ACT_WAIT_S)

    def observations(self) -> dict[str, list[tuple[Run, RunStatus]]]:
        """What the reads said since the last call, per node (each read is handed out once)."""
        observed, self._observed = self._observed, {}
        return observed

    async def close(self) -> None:
        """Cancel the node commands still under way (their outcome is read again by the next scheduler)."""
        self.tracker.close()
        if self.channels is not None:
            await self.channels.close()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _event(self, node: str, event: dict[str, Any]) -> None:
        """What a node's channel pushed: a run's change wakes the loop, which reads the node at once; output
        written is kept for the next tick (`outputs`), like a read's, and wakes nobody."""
        if event.get("event") == "run":
            log.debug("%s: %s is %s (was %s)", node, event.get("run_dir"), event.get("state"), event.get("was"))
            self._poke()
        elif event.get("event") == "output":
            self._outputs.update(((node, run_dir), at) for run_dir, at in event["runs"].items())
        elif event.get("event") == "closed":  # a broken channel: the next tick reads the node by command
            log.info("%s: node channel ended: %s", node, event.get("why"))
            self._poke()

    def outputs(self) -> dict[tuple[str, str], float]:
        """(node, run folder) -> when its output.log was last written, as the channels pushed since the last call."""
        outputs, self._outputs = self._outputs, {}
        return outputs

    # -- tasks ------------------------------------------------------------------------------------------

    def _spawn(self, key: Hashable, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background unless the same work (`key`) is still under way."""
        if key in self._tasks:
            work.close()
            return
        task = asyncio.create_task(work)
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._done(key, t))

    def _done(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._tasks.pop(key, None)
        if not task.cancelled() and isinstance(task.exception(), Fenced):
            log.info("%s not done: %s", key, task.exception())
        elif not task.cancelled() and task.exception() is not None:
            log.error("%s failed", key, exc_info=task.exception())
        if not self._in_tick:
            self._poke()  # finished after its tick stopped waiting: the next tick reads what it wrote

    async def _ask(self, node: Node, work: Coroutine[Any, Any, Any], *, heartbeat: bool = True) -> Any:
        """One command on a node, its answer or silence counted (`NodeSilence.ask`); none once this scheduler may
        no longer lead (`Fenced`: the command is not sent, and nothing is recorded of it)."""
        if not self.may_act():
            work.close()
            raise Fenced(f"{node.name}: not sent, this scheduler's lease may have run out")
        return await self.tracker.ask(node.name, work, heartbeat=heartbeat)

    @property
    def _timeout(self) -> float:
        """The deadline of one node command of the loop: never longer than it takes to call a node silent."""
        return min(self.config.ssh.command_timeout, self.settings.node_timeout)

    # -- launch -----------------------------------------------------------------------------------------

    async def _launch(self, launch: Launch) -> None:
        """Start the runs of an attempt (its port first, when it has none yet); each outcome written as it comes."""
        job = await self.store.job(launch.job)
        attempt = await self.store.attempt(launch.job, launch.attempt)
        if job is None or attempt is None:
            return
        if job.stop_reason is not None:  # stopped before it started: start nothing, find what is there
            await asyncio.gather(*(self._find(job, run) for run in launch.runs))
            return
        try:
            if not await self._preflight(job, attempt, launch.runs):
                return
            if self.gate is not None and not await self.gate(job, attempt, self._fail):
                return
            attempt = await self._port(job, attempt)
            all_runs = [r for r in await self.store.runs(job=job.id) if r.attempt == attempt.number]
            plan = self._plan(job, attempt, all_runs, await self._images(job, attempt, all_runs))
        except ImageError as exc:  # the node changed since placement: this attempt fails, the node is not blamed
            await self._fail(job, str(exc))
            return
        except FtError as exc:
            log.warning("job %s: cannot launch attempt %s yet: %s", job.id, launch.attempt, exc)
            return  # the node did not answer: asked again next tick (node_timeout decides when to give up)
        except Fenced:
            raise  # not this job's fault: this scheduler may no longer act (scheduler.serve.leadership)
        except Exception as exc:  # a bug or a spec we cannot plan: this job fails, the others go on
            log.exception("job %s: cannot plan its launch", job.id)
            await self._fail(job, f"ftconsole cannot plan its launch: {type(exc).__name__}: {exc}")
            return
        by_rank = {r.rank: r for r in plan.plan.ranks}
        await asyncio.gather(*(self._start_rank(job, attempt, run, by_rank[run.rank], plan) for run in launch.runs))

    async def _preflight(self, job: Job, attempt: Attempt, runs: Sequence[Run]) -> bool:
        """Before anything of an attempt starts: does the job's user have an account on each of its nodes, one
        the SSH account may become? A node where it has none sends the job back to the queue (that node left
        out for the user); an SSH account that may not switch fails the job, saying what it needs."""
        user = self.run_user(job)
        if user is None:
            return True
        now = self.clock()
        nodes = sorted(
            {r.node for r in runs if now - self._accounts.get((user, r.node), -ACCOUNT_OK_S) >= ACCOUNT_OK_S}
        )
        found = await asyncio.gather(*(self._account(user, self.nodes[n]) for n in nodes), return_exceptions=True)
        missing: list[NoAccount] = []
        for name, outcome in zip(nodes, found, strict=True):
            if isinstance(outcome, NoAccount):
                missing.append(outcome)
                self.no_account[(user, name)] = (now, outcome.lacks)
            elif isinstance(outcome, CannotSwitch):
                await self._fail(job, str(outcome))
                return False
            elif isinstance(outcome, BaseException):
                raise outcome  # no answer: asked again next tick
            else:
                self._accounts[(user, name)] = now
        if missing:
            mine = [r for r in await self.store.runs(job=job.id) if r.attempt == attempt.number]
            if all(r.state == "intent" for r in mine):
                await self._requeue(job, attempt, missing, user)
            else:  # some rank was sent already (its account went away since): this attempt fails as a whole
                await self._fail(job, "; ".join(str(m) for m in missing))
            return False
        return True

    async def _account(self, user: str, node: Node) -> None:
        needs_home = user_root(self.run_root, user).startswith("~")  # its run folders would be in its home
        await self._ask(node, account(self.transport, node, user, needs_home=needs_home, python=self._python,
                                      timeout=self._timeout), heartbeat=False)  # fmt: skip

    async def _requeue(self, job: Job, attempt: Attempt, missing: Sequence[NoAccount], user: str) -> None:
        """Nothing of the attempt started: cancel it and queue the job again, at the front of its priority."""
        now = self.clock()
        text = "; ".join(str(m) for m in missing)
        with contextlib.suppress(Conflict):
            async with self.store.jobs_tx("queue a job again") as tx:
                runs = await self.store.runs(job=job.id)
                await tx.requeue(job.id, attempt.number, runs, now, result="not started", cause=text,
                                 message=f"queued again: {text} (placed elsewhere from now on)")  # fmt: skip
                for lack in missing:
                    await tx.event(now, Condition.PENDING, f"attempt {attempt.number} not started: {lack}; queued "
                                   "again without it", job=job.id, node=lack.node)  # fmt: skip
        log.warning("job %s: %s; queued again", job.id, text)
        self._poke()

    async def _port(self, job: Job, attempt: Attempt) -> Attempt:
        """The attempt with its master port: chosen now on its first node when it has none yet."""
        if attempt.master_port:
            return attempt
        first = min((r for r in await self.store.runs(job=job.id) if r.attempt == attempt.number), key=_rank)
        node = self.nodes[first.node]
        port = await self._ask(node, free_port(self.transport, node, python=self._python, timeout=self._timeout))
        async with self.store.jobs_tx("record a master port") as tx:
            await tx.update_attempt(job.id, attempt.number, master_port=port)
        return dataclasses.replace(attempt, master_port=port)

    async def _start_rank(self, job: Job, attempt: Attempt, run: Run, rank: RankLaunch, plan: JobLaunch) -> None:
        node = self.nodes[run.node]
        try:
            await afailpoint("launch.before_send")
            if not rank.launch:
                prepared = prepare_run(self.transport, node, **_rank_args(rank), user=self.run_user(job),
                                       python=self._python, timeout=self._timeout)  # fmt: skip
                path = await self._ask(node, prepared)
                fields: dict[str, Any] = {"state": "prepared", "run_dir": path}
            else:
                sent = self.clock()
                started = start_run(
                    self.transport,
                    node,
                    **_rank_args(rank),
                    steps=plan.steps[run.rank],
                    workdir=rank.workdir,
                    grace=self.settings.stop_grace,
                    output_limit=job.spec.output_cap(self.settings.output_limit),
                    token=attempt.token,
                    user=self.run_user(job),
                    python=self._python,
                    timeout=self._timeout,
                )
                _, status = await self._ask(node, started)
                await afailpoint("launch.after_send")
                fields = recorded(run, status, self.clock(), sent=sent)
                if status.state == "refused":
                    fields.update(state="failed", error=f"cannot start: {status.error}", ended=self.clock())
                    log.error("job %s rank %s: %s", job.id, run.rank, status.error)
                if status.run_dir:
                    fields["run_dir"] = status.run_dir
        except SSHError as exc:  # sent, maybe: the node may be running it. Held, and asked again
            fields = {"state": "unknown", "error": f"start sent, no answer yet: {exc}"}
        except FtError as exc:
            fields = {"state": "failed", "error": f"cannot start: {exc}", "ended": self.clock()}
        with contextlib.suppress(Conflict):
            async with self.store.jobs_tx("record a started run") as tx:
                await tx.update_run(run, **fields)
        await afailpoint("launch.after_record")
        self._poke()

    async def _find(self, job: Job, run: Run) -> None:
        """A run of a job stopped before its start was answered: what is on the node (absent: cancelled)."""
        node = self.nodes[run.node]
        try:
            states = run_states(self.transport, node, [run.run_dir], tokens=_tokens([run]),
                                users={run.run_dir: self.run_user(job)}, python=self._python,
                                timeout=self._timeout)  # fmt: skip
            status = (await self._ask(node, states))[run.run_dir]
        except FtError as exc:
            log.warning("job %s rank %s: cannot read its run: %s", job.id, run.rank, exc)
            return
        fields = (
            {"state": "cancelled"} if status.state in ("absent", "foreign") else recorded(run, status, self.clock())
        )
        async with self.store.jobs_tx("record a cancelled run") as tx:
            await tx.update_run(run, **fields)
        self._poke()

    def _plan(self, job: Job, attempt: Attempt, runs: Sequence[Run], images: Images | None = None) -> JobLaunch:
        return plan_attempt(
            job, attempt, runs, nodes=self.nodes, run_root=self.run_root, data_prep=self.config.data_prep,
            images=images,
        )  # fmt: skip

    async def _images(self, job: Job, attempt: Attempt, runs: Sequence[Run]) -> Images | None:
        """For a job with `image`: the runtime of each of its nodes, from their last probe (as placement saw)."""
        if job.spec.image is None:
            return None
        probes = await self.store.latest_probes()
        runtimes = {}
        for run in runs:
            probe = probes.get(run.node)
            found = ((probe.report if probe is not None else None) or {}).get("facts", {}).get("runtimes") or []
            wanted = self.config.runtime_for(self.nodes[run.node].pool)
            choice = pick_runtime(found, wanted)
            if choice is None:
                raise ImageError(f"{run.node} cannot run image {job.spec.image} now "
                                 f"(containers.runtime {wanted}): {why_not(found, wanted)}")  # fmt: skip
            runtimes[run.node] = choice
        token = attempt.token or f"{job.id}-{attempt.number}"
        return Images(runtimes, self.config.containers, token, self._python)

    # -- stop -------------------------------------------------------------------------------------------

    async def _tend(self, stops: Sequence[Stop], read: Read | None) -> None:
        """One node's stops, then the read of its runs: one after the other, so a read never sees a run half
        way through its kill (its supervisor gone, its end not written yet) and takes it for lost."""
        for stop in stops:
            await self._stop(stop)
        if read is not None:
            await self._read(read)

    async def _stop(self, stop: Stop) -> None:
        """Stop runs on one node; a stop counts as sent once the node confirms it (until then: again)."""
        node = self.nodes[stop.node]
        sent = stop_runs(self.transport, node, [r.run_dir for r in stop.runs], tokens=_tokens(stop.runs),
                         users=await self._users(stop.runs), force=stop.force, python=self._python,
                         timeout=self._timeout)  # fmt: skip
        try:
            answers = await self._ask(node, sent)
        except FtError as exc:
            log.warning("cannot stop runs on %s: %s", stop.node, exc)
            return
        await afailpoint("stop.after_send")
        now = self.clock()
        async with self.store.jobs_tx("record stops sent") as tx:
            for run, answer in zip(stop.runs, answers, strict=True):
                if stop.force and answer.get("signalled"):
                    await tx.update_run(run, kill_sent=now, **({"stop_sent": now} if run.stop_sent is None else {}))
                    text = f"rank {run.rank} on {run.node}: SIGKILL from the scheduler"
                    why = "its supervisor is gone" if run.state == "orphaned" else "the grace period is over"
                    await tx.event(now, "Killed", f"{text} ({why})", job=run.job, node=run.node)
                elif run.stop_sent is None:
                    await tx.update_run(run, stop_sent=now)

    # -- the checkpoint signal ----------------------------------------------------------------------------

    async def _signal(self, job: Job, owed: CheckpointSignal, run: Run) -> str | None:
        """One owed signal to its rank: None when the node says the rank got it, else why not."""
        node = self.nodes.get(run.node)
        if node is None:
            return f"node {run.node} is no longer in the cluster config"
        sent = signal_runs(self.transport, node, [run.run_dir], owed.signal, tokens=_tokens([run]),
                           users={run.run_dir: self.run_user(job)}, python=self._python,
                           timeout=self._timeout)  # fmt: skip
        try:
            count = await self._ask(node, sent)
        except FtError as exc:
            return str(exc)
        return None if count == 1 else "its node says it is not running"

    # -- read -------------------------------------------------------------------------------------------

    async def _read(self, read: Read) -> None:
        node = self.nodes[read.node]
        dirs = [r.run_dir for r in read.runs]
        users = await self._users(read.runs)
        if self._quiet(read, users):
            return
        due = self.clock() - self._pruned_at.get(read.node, float("-inf")) >= PRUNE_EVERY_S
        prune = await self._prune() if due else None
        pruned: list[str] = []
        states = run_states(self.transport, node, dirs, tokens=_tokens(read.runs), users=users, prune=prune,
                            pruned=pruned, scan=self.scans(read.runs), python=self._python,
                            timeout=self._timeout)  # fmt: skip
        try:
            answer = await self._ask(node, states)
        except FtError as exc:
            log.warning("cannot read runs on %s: %s", read.node, exc)
            if isinstance(exc, UnreachableError) and read.node not in self.knocked:  # dead, or cut off? asked now
                self._spawn(("knock", node.name), self.tracker.knock(node))
            return
        await afailpoint("observe.after_read")
        # a user whose runs could not be read this time is left out (run_states): unknown, asked again
        self._observed[read.node] = [(r, answer[r.run_dir]) for r in read.runs if r.run_dir in answer]
        if prune is not None:  # users with no run here now may have old run folders here too
            await self._prune_others(node, prune, pruned, set(await self._recent_users()) - set(users.values()))
            self._was_pruned(node, prune, pruned)

    def _quiet_now(self, read: Read) -> bool:
        """`_quiet`, where whom the runs belong to is known without asking the store (no task for a quiet node)."""
        if self.channels is None:
            return False
        if self.settings.run_as != "submitter":
            return self._quiet(read, {})
        if any(r.job not in self._owners for r in read.runs):
            return False
        return self._quiet(read, {r.run_dir: self._owners[r.job] for r in read.runs})

    def _quiet(self, read: Read, users: dict[str, str | None]) -> bool:
        """The node's read may be left out this tick: its channels watch these runs and nothing changed (see
        `Channels.quiet`; the read is made at least every `read_every`). A channel's heartbeat that is late starts
        the node's silence clock at when the node was last heard, and the node is read."""
        if self.channels is None:
            return False
        groups: dict[str | None, set[str]] = defaultdict(set)
        for r in read.runs:
            groups[users.get(r.run_dir)].add(r.run_dir)
        heard = self.channels.quiet(read.node, groups, self.read_every(read.runs))
        if heard is not None:
            self.tracker.heard(read.node, at=heard)
            return True
        heard = self.channels.overdue(read.node)
        if heard is not None and read.node in self.nodes:
            self._spawn(("ping", read.node), self._late_heartbeat(self.nodes[read.node], heard))
        return False

    async def _late_heartbeat(self, node: Node, heard: float) -> None:
        """A heartbeat of a channel of `node` is late: the node may be frozen, or that channel alone is stuck
        (its process is its user's, who may SIGSTOP it: their claim, never the node's silence). The node's sshd
        is asked on the connection: where it answers, the late channels are closed (the read goes by command or
        a new channel); where it does not, the node's silence counts from when it was last heard."""
        assert self.channels is not None
        alive = await self.channels.alive(node)
        if alive:
            for user in self.channels.drop_late(node.name):
                log.info("%s: the channel of %s missed its heartbeat while the node answers: closed", node.name,
                         user or "the SSH account")  # fmt: skip
            return
        self.tracker.awaited(node.name, heard)
        if alive is False and node.name in self.tracker.waiting:  # why, until a command or a knock says more
            why = f"its connection did not answer a keepalive within {PING_S:g}s"
            self.tracker.silence.setdefault(node.name, CommandTimeout(node.name, why))

    @property
    def _python(self) -> str:
        return self.config.ssh.python


# ================================================================ helpers


class ImageError(Exception):
    """A node of an attempt cannot run the job's image (its runtime changed since placement)."""


def _pinging(key: Hashable) -> bool:
    """Whether `key` is a keepalive to a node whose heartbeat is late: a tick never waits for it (it answers on
    its own time, at most `PING_S`, and wakes the loop)."""
    return isinstance(key, tuple) and key[:1] == ("ping",)


def _rank(run: Run) -> int:
    return run.rank


def _tokens(runs: Sequence[Run]) -> dict[str, str]:
    return {r.run_dir: r.token for r in runs if r.token}


def _rank_args(rank: RankLaunch) -> dict[str, Any]:
    return {"run_dir": rank.run_dir, "argv": rank.argv, "env": rank.env, "files": rank.files}
