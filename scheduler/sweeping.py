"""What is left on the nodes, for the executor (`Executor`, which this is part of): the sweep that fences runs the
store no longer counts as current (a node back after it was given up, runs left by a crash between a start and its
record, runs started after the backup a store was restored from: `stray_runs`), run retention (old ended
attempts' folders removed, for the users with runs on a node and for the others who ran jobs lately), and what an
ended attempt left running on the nodes where a launcher on another node started its ranks (`clear_leftovers`).
Each user's folders and processes are read and acted on as that user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import Any

from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide.jobs import Job, Run
from ftconsole.scheduler.decide.reconcile import READ_STATES
from ftconsole.scheduler.decide.runstatus import NodeRun
from ftconsole.scheduler.decide.stepplan import JobStep
from ftconsole.scheduler.decide.steps import user_root
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.node.supervisor import MAX_PRUNED
from ftconsole.scheduler.spec.config import ClusterConfig, Node, SchedulerSettings
from ftconsole.scheduler.ssh.runs import (
    CannotSwitch,
    NoAccount,
    Prune,
    free_port,
    node_runs,
    prune_runs,
    shell_ttys,
    signal_leftovers,
    stop_runs,
)
from ftconsole.scheduler.ssh.transport import Transport
from ftconsole.scheduler.store.db import Store

log = logging.getLogger("ftconsole.scheduler")


class Sweeping:
    """Part of `Executor` (executor.py): sweeps, fencing and run retention."""

    store: Store
    transport: Transport
    config: ClusterConfig
    settings: SchedulerSettings
    clock: Callable[[], float]
    _unswept: set[str]
    _given_up: set[str]
    _pruned_at: dict[str, float]
    nodes: dict[str, Node]
    _poke: Callable[[], None]

    @property
    def run_root(self) -> str:
        raise NotImplementedError  # Executor's

    @property
    def _python(self) -> str:
        raise NotImplementedError  # Executor's

    @property
    def _timeout(self) -> float:
        raise NotImplementedError  # Executor's

    async def _ask(self, node: Node, work: Coroutine[Any, Any, Any], *, heartbeat: bool = True) -> Any:
        raise NotImplementedError  # Executor's

    def _spawn(self, key: Hashable, work: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError  # Executor's

    def run_user(self, job: Job) -> str | None:
        raise NotImplementedError  # Executor's

    # -- what an attempt left on its nodes -----------------------------------------------------------------

    def clear_leftovers(self, job: Job, runs: Sequence[Run]) -> None:
        """Once an attempt has ended: what it left on the nodes where a launcher on another node started its ranks
        (its runs that launch nothing: DeepSpeed's runner over pdsh, mpirun's orted; a launching run's own node is
        cleared by its supervisor), in the background: SIGTERM, SIGKILL after the stop's grace period. A node that
        cannot be reached keeps what it has: its processes are its own trouble, as its runs are."""
        for run in runs:
            if not run.launch and run.node in self.nodes:
                self._spawn(("leftovers", run.job, run.attempt, run.node), self._clear(job, run.node, run.attempt))

    async def shells_on(self, job: Job, name: str, *, warn: str | None = None) -> dict[str, float] | None:
        """The terminals of the job's shells on a node and when each was last typed at, `warn` written on them first
        (idle reclaim, idling.py); None where the node cannot tell."""
        node = self.nodes[name]
        asked = shell_ttys(self.transport, node, job.id, job.attempt, warn=warn, user=self.run_user(job),
                           python=self._python, timeout=self._timeout)  # fmt: skip
        found: dict[str, float] | None = await self._ask(node, asked)
        return found

    async def free_port_on(self, node: Node) -> int:
        """A TCP port free on the node now (a step's MASTER_PORT)."""
        return int(await self._ask(node, free_port(self.transport, node, python=self._python, timeout=self._timeout)))

    def clear_step(self, job: Job, step: JobStep) -> None:
        """What a step (`ftconsole run`) left running on its nodes, once it is cancelled or lost: its processes
        (FT_STEP in their environment) end as an attempt's leftovers do, in the background."""
        for node, _ in step.ranks:
            if node in self.nodes:
                work = self._clear(job, node, step.attempt, step=step.number)
                self._spawn(("leftovers", job.id, step.attempt, node, step.number), work)

    async def _clear(self, job: Job, name: str, attempt: int, *, step: int | None = None) -> None:
        node = self.nodes[name]
        for sig, then in (("SIGTERM", self.settings.stop_grace), ("SIGKILL", 0.0)):
            asked = signal_leftovers(self.transport, node, job.id, attempt, sig, user=self.run_user(job),
                                     python=self._python, timeout=self._timeout, step=step)  # fmt: skip
            try:
                found = await self._ask(node, asked)
            except FtError as exc:
                log.warning("cannot stop what job %s left on %s: %s", job.id, name, exc)
                return
            if not found:
                return
            if sig == "SIGTERM":
                async with self.store.jobs_tx("record what an attempt left") as tx:
                    what = f"attempt {attempt}" if step is None else f"step {step}"
                    text = f"{found} process(es) {what} left on {name} stopped (SIGTERM)"
                    await tx.event(self.clock(), "Leftovers", text, job=job.id, node=name)
            await asyncio.sleep(then)

    async def _prune_others(self, node: Node, prune: Prune, pruned: list[str], users: set[str | None]) -> None:
        """Retention for users without a run on the node now; one who has no account there has no folders."""
        for user in sorted(users, key=str):
            try:
                await prune_runs(self.transport, node, prune, user=user, pruned=pruned, python=self._python,
                                 timeout=self._timeout)  # fmt: skip
            except (NoAccount, CannotSwitch):
                continue
            except FtError as exc:
                log.warning("%s: cannot remove old run folders of %s: %s", node.name, user, exc)
                return

    async def _recent_users(self) -> list[str | None]:
        """Whose run folders a sweep or a prune visits: the owners of jobs active or ended lately (within the
        run retention, else a week), as each job's runs are its owner's; None (the SSH account) under ssh_user."""
        if self.settings.run_as != "submitter":
            return [None]
        window = self.settings.run_retention or 7 * 86400.0
        return list(await self.store.owners(since=self.clock() - window - 86400.0))

    async def _prune(self) -> Prune | None:
        """Run retention for one node's next read or sweep (None when off): keep every held run's attempt, and
        the last attempt of each failed job within its debug retention (`debugenv`)."""
        if not self.settings.run_retention:
            return None
        held = await self.store.runs(held=True)
        failed = await debugenv.failed_lately(self.store, self.config.debug, self.clock())
        prune = Prune.keeping(self.settings.run_root, self.store.cluster_id, self.settings.run_retention, held)
        return dataclasses.replace(prune, keep=tuple(sorted({*prune.keep, *debugenv.kept_attempts(failed)})))

    def _was_pruned(self, node: Node, prune: Prune | None, pruned: Sequence[str]) -> None:
        if prune is None:
            return
        if len(pruned) < MAX_PRUNED:  # a full prune leaves more behind: the next read prunes again
            self._pruned_at[node.name] = self.clock()
        if pruned:
            log.info("%s: removed the folders of %d ended runs past run_retention: %s", node.name, len(pruned),
                     ", ".join(pruned))  # fmt: skip

    async def _sweep(self, node: Node) -> None:
        """Fencing: kill the runs of this cluster on the node that the store does not count as current (a
        node back after it was given up, or runs left by a crash between a start and its record); the run
        folders of each user who had jobs lately, read as that user."""
        prune = await self._prune()
        pruned: list[str] = []
        for user in await self._recent_users():
            try:
                listing = node_runs(self.transport, node, root=self.run_root, prune=prune, pruned=pruned, user=user,
                                    python=self._python, timeout=self._timeout)  # fmt: skip
                found = await self._ask(node, listing, heartbeat=False)
            except (NoAccount, CannotSwitch):
                continue  # no runs of that user here: none could have started
            except FtError as exc:
                log.warning("cannot sweep %s: %s", node.name, exc)
                return
            if not await self._fence(node, found, user):
                return
        self._was_pruned(node, prune, pruned)
        self._unswept.discard(node.name)
        self._given_up.discard(node.name)  # it answered: its work is waited for again
        self._poke()  # a start that waited for this sweep goes now

    async def _fence(self, node: Node, found: Sequence[NodeRun], user: str | None) -> bool:
        """Kill the runs `found` (one user's) that are not current; False when the node did not take it."""
        held = await self.store.runs(held=True)
        strays = stray_runs(found, held, node.name)
        if not strays:
            return True
        root = user_root(self.run_root, user)
        dirs = [f"{root}/{f.job}/{f.attempt}/{f.rank}" for f in strays]
        tokens = {d: f.status.token for d, f in zip(dirs, strays, strict=True) if f.status.token}
        try:
            killing = stop_runs(self.transport, node, dirs, tokens=tokens, users=dict.fromkeys(dirs, user),
                                force=True, python=self._python, timeout=self._timeout)  # fmt: skip
            await self._ask(node, killing, heartbeat=False)
        except FtError as exc:
            log.warning("cannot stop stray runs on %s: %s", node.name, exc)
            return False
        now = self.clock()
        known = [await self._known(f) for f in strays]
        async with self.store.jobs_tx("record fenced runs") as tx:
            for f, job in zip(strays, known, strict=True):
                if job is not None:
                    text = (
                        f"fenced: rank {f.rank} of attempt {f.attempt} was still running on {node.name}, which the "
                        "scheduler no longer counts as current; killed"
                    )
                else:  # its job id may be another job's in this store: the event names no job
                    text = (
                        f"fenced: a run this store does not know was running on {node.name} (run folder "
                        f"{f.job}/{f.attempt}/{f.rank}, attempt token {f.status.token}: started after the backup "
                        "this store was restored from?); killed"
                    )
                await tx.event(now, "Fenced", text, job=job, node=node.name)
                log.warning("job %s: %s", f.job, text)
        return True

    async def _known(self, found: NodeRun) -> int | None:
        """The job of a run found on a node when the store knows that run (its attempt, with its token), else
        None: a run started by another store of the same cluster id (restored from a backup older than it)."""
        if not (found.job.isdigit() and found.attempt.isdigit()):
            return None
        attempt = await self.store.attempt(int(found.job), int(found.attempt))
        if attempt is None:
            return None
        if attempt.token is not None and found.status.token is not None and attempt.token != found.status.token:
            return None
        return int(found.job)


def stray_runs(found: Sequence[NodeRun], held: Sequence[Run], node: str) -> list[NodeRun]:
    """The runs `found` on `node` that still run and are not the store's current ones there: no held active run
    of that job, attempt and rank on the node, or one claimed by another attempt token. The path alone is no
    identity: a store restored from a backup hands out again the job ids and attempt numbers of the runs started
    after the backup, and a new attempt's run must not shield an old one in the folder of the same name. A run
    without a token (an earlier ftconsole's) counts as current where its path does."""
    current = {(str(r.job), str(r.attempt), str(r.rank)): r.token for r in held if r.node == node and r.active}

    def is_current(f: NodeRun) -> bool:
        key = (f.job, f.attempt, f.rank)
        if key not in current:
            return False
        token = current[key]
        return token is None or f.status.token is None or f.status.token == token

    return [f for f in found if f.status.state in READ_STATES and not is_current(f)]
