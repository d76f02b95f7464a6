"""The API ops the console's pictures read: the nodes by change (the node list and the map), a node's or a job's
samples over time (its curves), each running job's recent GPU use (the Jobs view's sparkline), and the queue's
expected starts (the timeline, `jobs --start`). What a caller may not see is left out, as in every listing."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.forecasting import Forecaster
from ftconsole.scheduler.redaction import redact_json
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve.args import time_arg
from ftconsole.scheduler.serve.nodelist import NodeChanges, seen_by

if TYPE_CHECKING:
    from ftconsole.scheduler.jobops import Scheduler
    from ftconsole.scheduler.serve.daemon import Operations

SAMPLES_SPAN_S = 3600.0  # what `samples` answers unless asked for another span
JOB_UTIL_PROBES = 12  # the probes `job_util` draws each running job's GPUs over
NODE_JOBS = 200  # the runs `node_jobs` answers unless asked for another number
SHARES_KEEP_S = 30.0  # `shares` reads a week of runs: its answer is kept this long


class PictureOps:
    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self._forecaster = Forecaster(ops.scheduler)
        self._util_kept: tuple[Any, dict[int, list[float | None]]] = (None, {})
        self._shares_kept: tuple[float, dict[str, Any]] | None = None
        self._node_changes = NodeChanges()

    async def samples(self, caller: Caller, args: dict[str, Any]) -> Any:
        """A node's GPUs, or a job's ranks (its current attempt), over time since `since` (default: the last
        hour): what the probes read of each GPU (`samples.py`) and, for a job, each rank's epochs and iteration
        times as its log showed them. The console's curves."""
        s = self.scheduler
        since = time_arg(args, "since")
        since = s.clock() - SAMPLES_SPAN_S if since is None else since
        samples = await s.service.gpu_samples()
        if args.get("node") is not None:
            nodes = s.service.select(str(args["node"]))
            if len(nodes) != 1:
                raise UsageError(f"samples: name one node, not {args['node']!r}")
            return {"node": nodes[0].name, "since": since, "gpus": samples.node_json(nodes[0].name, since)}
        if args.get("job") is None:
            raise UsageError("samples needs node (a node's name) or job (a job id)")
        job = await s.visible(caller, args["job"])
        progress = s.loop.watchdog.logs.progress(job.id, job.attempt)
        runs = [r for r in await s.store.runs(job=job.id) if r.attempt == job.attempt]
        ranks = [
            {"rank": r.rank, "node": r.node, "gpus": list(r.gpus), "series": samples.node_json(r.node, since, r.gpus),
             "epochs": [], "ratios": [], **progress.get(r.rank, {})}
            for r in sorted(runs, key=lambda r: r.rank)
        ]  # fmt: skip
        return {"job": job.id, "attempt": job.attempt, "since": since, "ranks": ranks}

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler serving now (a reload or a new term as leader makes another)."""
        return self.ops.scheduler

    @property
    def forecaster(self) -> Forecaster:
        """The expected starts of the scheduler serving now."""
        if self._forecaster.scheduler is not self.ops.scheduler:
            self._forecaster = Forecaster(self.ops.scheduler)
        return self._forecaster

    async def nodes_changed(self, caller: Caller, args: dict[str, Any]) -> Any:
        """{"cursor", "nodes", "names"}: the nodes in brief whose view changed since `since` (a cursor this
        answered; none or an unknown one: every node), and every node's name when a node came or went since
        (else null). Call again with `since` = the cursor. The console's node list and map (`nodelist.py`).
        `patches: true`: the nodes the caller holds come in `patches`, only their keys that changed."""
        s = self.scheduler
        hidden = await self.ops._hidden(caller)
        views = [v.to_json() for v in await s.service.nodes()]
        patches = False if args.get("patches") is None else args["patches"]
        if not isinstance(patches, bool):
            raise UsageError(f"nodes_changed: patches must be true or false, not {patches!r:.40}")
        shown = functools.partial(seen_by, hidden=hidden) if hidden else None
        return self._node_changes.changed(caller.uid, views, args.get("since"), patches, shown)

    async def node_jobs(self, caller: Caller, args: dict[str, Any]) -> Any:
        """The jobs that held GPUs of one node, the newest first (`limit`, default NODE_JOBS): each run's job, rank,
        GPUs, state and times. A job the caller may not see shows as a private job, its GPUs and times only."""
        s = self.scheduler
        nodes = s.service.select(str(args.get("node") or ""))
        if len(nodes) != 1:
            raise UsageError(f"node_jobs: name one node, not {args.get('node')!r}")
        limit = NODE_JOBS if args.get("limit") is None else args["limit"]
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise UsageError(f"node_jobs: limit must be a whole number from 1 to 1,000, not {limit!r:.40}")
        runs = await s.store.node_runs(nodes[0].name, limit)
        hidden = await self.ops._hidden(caller)
        return {"node": nodes[0].name,
                "runs": [_private(r) if r["job"] in hidden else r for r in runs]}  # fmt: skip

    async def job_util(self, caller: Caller, args: dict[str, Any]) -> Any:
        """Each running job's GPU utilisation at its nodes' last JOB_UTIL_PROBES probes (`jobs_util`), by job id
        (as text: JSON's keys), oldest first; the jobs the caller may not see left out. The Jobs view's sparkline."""
        s = self.scheduler
        samples = await s.service.gpu_samples()
        runs = tuple((r.job, r.node, r.gpus) for r in await s.store.runs(held=True) if r.state == "running")
        key, util = self._util_kept
        if key != (samples.generation, runs):  # computed again only when a probe or a run moved
            util = samples.jobs_util(runs, JOB_UTIL_PROBES)
            self._util_kept = ((samples.generation, runs), util)
        hidden = await self.ops._hidden(caller)
        return {str(job): values for job, values in util.items() if job not in hidden}

    async def shares(self, caller: Caller, args: dict[str, Any]) -> Any:
        """How the cluster is shared (`Scheduler.shares`), worked out again at most every SHARES_KEEP_S: each
        project's and user's fair share, GPU-hours and goodput over the last day and week, quotas. Sums only."""
        now = self.scheduler.clock()
        kept = self._shares_kept
        if kept is None or now - kept[0] >= SHARES_KEEP_S:
            kept = self._shares_kept = (now, await self.scheduler.shares())
        return kept[1]

    async def forecast(self, caller: Caller, args: dict[str, Any]) -> Any:
        """When each queued job is expected to start and end, and on which nodes, and when each running job's
        time limit ends it (`Forecaster.starts`); the jobs the caller may not see left out, and named in no
        message."""
        found = await self.forecaster.starts()
        hidden = await self.ops._hidden(caller)
        beyond = found["beyond"]
        count = len([i for i in beyond["ids"] if i not in hidden]) if hidden else beyond["count"]
        answer = {**found, "beyond": {"count": count, "message": beyond["message"]}}  # counted, not listed
        if not hidden:
            return answer
        return {
            **answer,
            "queued": [redact_json(e, hidden) for e in found["queued"] if e["id"] not in hidden],
            "running": [e for e in found["running"] if e["id"] not in hidden],
        }


def _private(run: dict[str, Any]) -> dict[str, Any]:
    """A run of a job the caller may not see: which GPUs, when, and that it was a private job; nothing else."""
    return {key: run[key] if key in PRIVATE_KEEPS else None for key in run} | {"private": True}


PRIVATE_KEEPS = frozenset({"rank", "gpus", "started", "ended"})
