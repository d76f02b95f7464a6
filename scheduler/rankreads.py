"""What a job's ranks say on their nodes, for the scheduler's callers: a rank's output.log (`logs`, followed as the
node pushes it), what it was started with (`launch_files`), and the evidence of a hang from every rank (`debug`,
`scheduler.evidence`). Each is read on the node as the job's user (the evidence's look at processes: as the SSH
account), after the same permission checks as the other job operations (`Scheduler`, which this is part of).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ftconsole.scheduler import evidence
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.loop import Loop
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import ClusterConfig, Node
from ftconsole.scheduler.ssh.channel import Followed
from ftconsole.scheduler.ssh.runs import follow_file, read_file, run_files
from ftconsole.scheduler.store.db import Store

LOG_POLL_S = 0.5
LOG_CHUNK = 1 << 20
# A running job's evidence is gathered at most once in this long (issue 40: each gather runs py-spy on every node
# of the job as the SSH account): a `debug` meanwhile, whoever asks, gets that gather's evidence, or waits for the
# one under way; the hang check gathers on its own.
DEBUG_EVERY_S = 5.0


DROPPED_LINE = b"== ftconsole: earlier output dropped"  # the node's own line (supervisor_output.py) starts so


def dropped_marker(data: bytes, *, mid_line: bool = False) -> bytes:
    """What goes before `data`, read from further on than asked for since the job's output_limit dropped the
    output between: nothing when it starts with the node's line that says so, else a line of ours; after a newline
    where what was shown last ended mid-line (its rest was dropped), so that the line saying so stands alone."""
    said = b"" if data.startswith(DROPPED_LINE) else DROPPED_LINE + b" (output_limit) ==\n"
    return b"\n" + said if mid_line else said


class RankReads:
    """Part of `Scheduler` (jobops.py): the operations that read what a job's ranks say on their nodes."""

    store: Store
    loop: Loop
    config: ClusterConfig
    clock: Callable[[], float]
    _nodes: dict[str, Node]
    _gathers: dict[int, tuple[float, asyncio.Task[dict[str, Any]]]]  # job -> its last debug gather (when, task)

    async def _job(self, caller: Caller, job_id: int | str, verb: str, *, write: bool) -> Job:
        raise NotImplementedError  # Scheduler's

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
        """output.log of one rank, as text chunks; with `follow`, until the run ends. The first chunk is always ""
        once the caller may read the logs: a caller that primes the stream to learn of refusals (the API) need not
        wait for the run's first output, during which it could not tell that its client has gone."""
        job = await self._job(caller, job_id, "read the logs of", write=False)
        run = await self._log_run(job, rank, attempt)
        node = self._node_of(run)
        path = f"{run.run_dir}/output.log"
        user = self.loop.executor.run_user(job)
        yield ""
        offset = 0
        if tail is not None:
            offset = await self._tail_offset(node, path, tail, user)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pushed: Followed | None = None  # once read to its end, the node pushes what is written (node channels)
        tried = False
        mid_line = False  # what was shown last ended mid-line
        try:
            while True:
                start, data = offset, b""
                if pushed is not None:
                    with contextlib.suppress(TimeoutError):
                        chunk = await pushed.next(LOG_POLL_S)
                        if chunk is None:
                            pushed = None  # the push ended: read by request from where it got to
                        elif chunk[0] <= offset:
                            data = chunk[1][offset - chunk[0] :]
                        else:
                            start, data = await self._log_read(node, path, offset, user)  # a gap: read it
                else:
                    start, data = await self._log_read(node, path, offset, user)
                shown = data
                if start > offset:  # its output_limit dropped what came next: a new start, said once
                    decoder = codecs.getincrementaldecoder("utf-8")("replace")
                    shown = dropped_marker(data, mid_line=mid_line) + data
                offset = start + len(data)
                text = decoder.decode(shown)
                if text:
                    mid_line = not text.endswith("\n")
                    yield text
                if data and (pushed is not None or len(data) == LOG_CHUNK):
                    continue
                if not follow:
                    return
                if not await self._running(job.id, run):
                    start, rest = await self._log_read(node, path, offset, user)
                    rest = rest if start <= offset else dropped_marker(rest, mid_line=mid_line) + rest
                    text = decoder.decode(rest, final=True)
                    if text:
                        yield text
                    return
                if pushed is None and not tried:
                    tried = True  # once: where the channel cannot follow, it is polled as before
                    pushed = await follow_file(self.loop.executor.transport, node, path, offset=offset, user=user,
                                               python=self._python)  # fmt: skip
                if pushed is None:
                    await asyncio.sleep(LOG_POLL_S)
        finally:
            if pushed is not None:
                await pushed.close(LOG_POLL_S)

    async def _running(self, job_id: int, run: Run) -> bool:
        """Whether the run followed is still active (its log may still grow)."""
        current = [r for r in await self.store.runs(job=job_id) if (r.attempt, r.rank) == (run.attempt, run.rank)]
        return bool(current) and current[0].active

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

    def _node_of(self, run: Run) -> Node:
        node = self._nodes.get(run.node)
        if node is None:
            raise NotFound(f"rank {run.rank} ran on {run.node}, which is no longer in the cluster config")
        return node

    async def _log_read(self, node: Node, path: str, offset: int, user: str | None) -> tuple[int, bytes]:
        """A chunk of a run's output.log, read on its node as the run's user (never with more rights): (where it
        starts, its bytes). It starts past `offset` where the job's output_limit dropped the output there."""
        got = await read_file(self.loop.executor.transport, node, path, offset=offset, limit=LOG_CHUNK, user=user,
                              python=self._python)  # fmt: skip
        return (offset, b"") if got is None else got

    async def launch_files(
        self, caller: Caller, job_id: int | str, *, rank: int = 0, attempt: int | None = None
    ) -> dict[str, Any]:
        """What one rank was started with, read back from its run folder: argv, env and hostfile."""
        job = await self._job(caller, job_id, "see the launch of", write=False)
        run = await self._log_run(job, rank, attempt)
        node = self._node_of(run)
        found = await run_files(self.loop.executor.transport, node, run.run_dir, user=self.loop.executor.run_user(job),
                                python=self._python)  # fmt: skip
        if found is None:
            raise NotFound(f"job {job.id} rank {run.rank}: no run folder {run.run_dir} on {run.node}")
        argv, env, hostfile = (found[name] for name in ("argv.json", "env.json", "hostfile"))
        return {
            "node": run.node,
            "rank": run.rank,
            "attempt": run.attempt,
            "run_dir": run.run_dir,
            "argv": json.loads(argv) if argv else None,
            "env": json.loads(env) if env else None,
            "hostfile": hostfile or None,
        }

    async def _tail_offset(self, node: Node, path: str, lines: int, user: str | None) -> int:
        """Where the last `lines` lines of the file start, in one round trip (0 when there is no file yet)."""
        got = await read_file(
            self.loop.executor.transport, node, path, limit=0, tail=lines, user=user, python=self._python
        )
        return 0 if got is None else got[0]

    @property
    def _python(self) -> str:
        return self.config.ssh.python

    async def debug(self, caller: Caller, job_id: int | str, *, stacks: bool = True) -> dict[str, Any]:
        """The evidence of every rank of a running job's current attempt, gathered now and kept with the job (an
        `Evidence` event); of a job not running, the last kept. Its owner's or an admin's: it reads the
        stacks and output of the job's processes. A gather under way or at most DEBUG_EVERY_S old is shared
        (`gathered_s_ago` says how old), so that asking again and again runs nothing more on the nodes."""
        job = await self._job(caller, job_id, "debug", write=True)
        if job.status is not JobStatus.RUNNING:
            last = await self.store.evidence(job.id)
            if last is None:
                raise UsageError(
                    f"job {job.id} is {job.status.value}: there is nothing to look at, and no evidence kept"
                )
            return dict(last, kept=True)
        now = asyncio.get_running_loop().time()
        for key, (at, task) in list(self._gathers.items()):  # forget the old ones (their jobs may be gone)
            if task.done() and now - at >= DEBUG_EVERY_S:
                del self._gathers[key]
        found = self._gathers.get(job.id)
        if found is None or (found[1].done() and now - found[0] >= DEBUG_EVERY_S) or not stacks:
            found = (now, asyncio.create_task(self._gather(job, stacks=stacks)))
            if stacks:
                self._gathers[job.id] = found
        try:
            doc = await asyncio.shield(found[1])
        except Exception:
            if self._gathers.get(job.id) is found:
                del self._gathers[job.id]  # a gather that failed is not shared: the next debug tries again
            raise
        return dict(doc, kept=False, gathered_s_ago=round(now - found[0], 1))

    async def _gather(self, job: Job, *, stacks: bool) -> dict[str, Any]:
        """The evidence of a running job, gathered now and kept with it (an `Evidence` event)."""
        runs = await self.store.runs(job=job.id)
        found = await evidence.gather(self.loop.executor, job, runs, stacks=stacks)
        doc = found.to_json()
        hung = [a for a in await self.store.alerts(job=job.id) if a.kind == "job_hung"]
        doc["suspected_hung"] = bool(hung)  # a job that moves: a rank between two collectives is no news
        async with self.store.jobs_tx(f"keep the evidence of job {job.id}") as tx:
            await evidence.record(tx, job.id, doc)
        return doc
