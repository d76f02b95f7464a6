"""The scheduler as a service: the control loop plus the local API, one per state directory.

`serve` (behind `ftconsole serve`, and the console in embedded mode) takes the state_dir lock, opens the
store and the SSH pool, serves `Operations` on the API socket, and runs the loop until stopped. With the store on
PostgreSQL, several may share it: one leads and runs the loop, the others stand by (`scheduler.serve.leadership`).
Jobs keep running on their nodes while it is down: their supervisors are detached, and the next start reads them
back. A changed config file is applied without a restart (`reload` op, SIGHUP: `scheduler.serve.reload`).

`Operations` maps API ops to `Scheduler` methods and turns their results into JSON. The CLI uses the same
mapping in-process (`client.LocalClient`) when no scheduler runs, so a reply never depends on the path taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

from ftconsole.scheduler import debugenv, failpoints, gctune
from ftconsole.scheduler.decide import placement
from ftconsole.scheduler.decide.clusterview import cluster_view
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.decide.stepplan import StepAsk
from ftconsole.scheduler.discovery import discover
from ftconsole.scheduler.errors import NotLeader, PermissionDenied, UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.redaction import redact_json
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve import alertmanager, metrics, notify
from ftconsole.scheduler.serve.api import WRITE_OPS, ApiServer
from ftconsole.scheduler.serve.args import time_arg as _time
from ftconsole.scheduler.serve.lock import StateLock
from ftconsole.scheduler.serve.nodelist import brief_node, seen_by
from ftconsole.scheduler.serve.pictures import PictureOps
from ftconsole.scheduler.serve.reload import Reloader
from ftconsole.scheduler.spec.config import LoadedConfig, parse_duration
from ftconsole.scheduler.store.db import ALERT_STATES, Store
from ftconsole.scheduler.store.records import JobActivity

log = logging.getLogger("ftconsole.daemon")

# what a standby refuses (several schedulers on one PostgreSQL store: only the leader changes anything, and only
# the leader acts on the nodes: `debug` runs py-spy on them as the SSH account)
LEADER_OPS = WRITE_OPS | {"ack", "resolve", "probe", "drain", "resume", "repair", "debug", "topology_discover"}
# The most rows one `events` or `alerts` request returns (issue 26): a larger `limit` is refused, not read.
MAX_LIMIT = 10_000


class Operations:
    """The API handler: (caller, op, args) -> JSON, or an async iterator of JSON for `logs` and `wait`."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        # several schedulers on one PostgreSQL store: this one's side of the lease (`serve.leadership.Leadership`)
        self.leadership: Any = None
        self.reloader: Reloader | None = None  # `serve`'s: the config in use and the way to change it
        self.pictures = PictureOps(self)  # what the console draws
        self._ops: dict[str, Callable[[Caller, dict[str, Any]], Awaitable[Any]]] = {
            "whoami": self._whoami,
            "status": self._status,
            "submit": self._submit,
            "predict": self._predict,
            "jobs": self._jobs,
            "show": self._show,
            "stop": self._stop,
            "delete": self._delete,
            "clone": self._clone,
            "priority": self._priority,
            "extend": self._extend,
            "scale": self._scale,
            "hold": self._hold,
            "release": self._release,
            "step": self._step,
            "step_end": self._step_end,
            "logs": self._logs,
            "debug": self._debug,
            "wait": self._wait,
            "events": self._events,
            "alerts": self._alerts,
            "ack": self._ack,
            "resolve": self._resolve,
            "jobs_changed": self._jobs_changed,
            "launch": self._launch,
            "nodes": self._nodes,
            "probe": self._probe,
            "drain": self._drain,
            "resume": self._resume,
            "repair": self._repair,
            "cluster": self._cluster,
            "topology_discover": self._topology_discover,
            "fabric": lambda caller, args: self._fabric(),
            "usage": self._usage,
            "quota": self._quota,
            "reservations": self._reservations,
            "reserve": self._reserve,
            "unreserve": self._unreserve,
            "reload": self._reload,
            "samples": self.pictures.samples,
            "node_jobs": self.pictures.node_jobs,
            "nodes_changed": self.pictures.nodes_changed,
            "job_util": self.pictures.job_util,
            "forecast": self.pictures.forecast,
            "shares": self.pictures.shares,
        }

    async def __call__(self, caller: Caller, op: str, args: dict[str, Any]) -> Any:
        handler = self._ops.get(op)
        if handler is None:
            raise UsageError(f"unknown op {op!r} (known: {', '.join(sorted(self._ops))})")
        if self.leadership is not None and not self.leadership.leading():
            if op in LEADER_OPS:
                raise NotLeader(self.leadership.refusal(op))
            await self.scheduler.store.refresh()  # no loop here reads the leader's writes: the kept reads may be old
        try:
            return await handler(caller, args)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, UsageError):
                raise
            raise UsageError(f"bad arguments for {op}: {exc}") from None

    @property
    def now(self) -> float:
        return self.scheduler.clock()

    async def _json(self, jobs: Sequence[Job], activity: dict[int, JobActivity] | None = None) -> list[dict[str, Any]]:
        """Job JSON with its activity (`last_output`, `open_alerts`, `node_names`), two queries for all of them."""
        if activity is None:
            activity = await self.scheduler.store.job_activity([j.id for j in jobs])
        now, none = self.now, JobActivity()
        return [{**j.to_json(now), **activity.get(j.id, none).to_json()} for j in jobs]

    async def _one(self, job: Job) -> dict[str, Any]:
        return (await self._json([job]))[0]

    async def _whoami(self, caller: Caller, args: dict[str, Any]) -> Any:
        return {"user": caller.user, "uid": caller.uid, "pid": caller.pid, "admin": self.scheduler.is_admin(caller)}

    async def _status(self, caller: Caller, args: dict[str, Any]) -> Any:
        found = await self.scheduler.store.status_counts()  # counted by the store: no job is read
        counts = {s.value: found.get(s.value, 0) for s in JobStatus}
        return {"pid": os.getpid(), "looping": self.scheduler.looping, "jobs": counts, **self._leadership()}

    def _leadership(self) -> dict[str, Any]:
        """{"leadership": {"role": "leader" | "standby", "epoch", "leader": {"host", "socket", "epoch"} | None}}
        where several schedulers share a PostgreSQL store; nothing on SQLite."""
        return {} if self.leadership is None else {"leadership": self.leadership.to_json()}

    async def _submit(self, caller: Caller, args: dict[str, Any]) -> Any:
        job = await self.scheduler.submit(
            caller, args["spec"], hold=bool(args.get("hold")), allocation=bool(args.get("allocation"))
        )
        return {**job.to_json(self.now), **JobActivity().to_json()}

    async def _predict(self, caller: Caller, args: dict[str, Any]) -> Any:
        return decision_json(await self.scheduler.predict(caller, args["spec"]))

    async def _jobs(self, caller: Caller, args: dict[str, Any]) -> Any:
        jobs = await self.scheduler.jobs(
            caller,
            status=args.get("status"),
            name=args.get("name"),
            owner=args.get("owner"),
            spec=args.get("spec"),
            output=args.get("output"),
            since=_time(args, "since"),
            until=_time(args, "until"),
        )
        return await self._json(jobs)

    async def _quota(self, caller: Caller, args: dict[str, Any]) -> Any:
        limits = args.get("limits")
        if limits is not None and not isinstance(limits, dict):
            raise UsageError("quota: limits is an object {gpus, running_jobs, queued_jobs, gpu_hours}, or null")
        return await self.scheduler.set_quota(caller, str(args["kind"]), str(args["name"]), limits)

    async def _reservations(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self.scheduler.reservations()

    async def _reserve(self, caller: Caller, args: dict[str, Any]) -> Any:
        end = _time(args, "end")
        if end is None:
            raise UsageError("reserve needs end (seconds since the epoch)")
        count = args.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise UsageError(f"reserve: count is a whole number, not {count!r}")
        text = {key: None if args.get(key) is None else str(args[key]) for key in ("nodes", "spec", "user", "project")}
        return await self.scheduler.reserve(
            caller, str(args["name"]), start=_time(args, "start"), end=end, count=count,
            maintenance=args.get("maintenance") is True, reason=str(args.get("reason") or ""), **text,
        )  # fmt: skip

    async def _unreserve(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self.scheduler.unreserve(caller, str(args["name"]))

    async def _reload(self, caller: Caller, args: dict[str, Any]) -> Any:
        """Apply the config file as it is now (admins only): what changed, or why nothing did (`serve.reload`)."""
        if not self.scheduler.is_admin(caller):
            admins = ", ".join(["root", *self.scheduler.config.admins])
            raise PermissionDenied(f"{caller.user} may not reload the config: that is for admins ({admins})")
        if self.reloader is None:
            raise UsageError("no scheduler runs here to reload its config: the config is read when one starts")
        return (await self.reloader.reload(caller.user)).to_json()

    async def _usage(self, caller: Caller, args: dict[str, Any]) -> Any:
        since = _time(args, "since")
        if since is None:
            raise UsageError("usage needs since (seconds since the epoch)")
        return await self.scheduler.usage(caller, since=since, until=_time(args, "until"), by=args.get("by") or "user")

    async def _jobs_changed(self, caller: Caller, args: dict[str, Any]) -> Any:
        """{"cursor", "jobs"}: the jobs changed at or after `since` (deleted ones too), or all jobs for null;
        call again with `since` = the cursor (see `Store.jobs_changed`)."""
        since = args.get("since")
        cursor, jobs, activity = await self.scheduler.store.jobs_changed(None if since is None else float(since))
        hidden = await self._hidden(caller)
        seen = [self.scheduler.redact_job(j, hidden) for j in jobs if self.scheduler.may_see(caller, j)]
        return {"cursor": cursor, "jobs": await self._json(seen, activity)}

    async def _debug(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self.scheduler.debug(caller, args["job"], stacks=bool(args.get("stacks", True)))

    async def _show(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self.scheduler.show(caller, args["job"])

    async def _stop(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self._json(await self.scheduler.stop(caller, _ids(args)))

    async def _delete(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self._json(await self.scheduler.delete(caller, _ids(args)))

    async def _hold(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self._json(await self.scheduler.hold(caller, _ids(args)))

    async def _release(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self._json(await self.scheduler.release(caller, _ids(args)))

    async def _clone(self, caller: Caller, args: dict[str, Any]) -> Any:
        return {**(await self.scheduler.clone(caller, args["job"])).to_json(self.now), **JobActivity().to_json()}

    async def _priority(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self._one(await self.scheduler.set_priority(caller, args["job"], str(args["level"])))

    async def _extend(self, caller: Caller, args: dict[str, Any]) -> Any:
        seconds = parse_duration(args["duration"])
        return await self._one(await self.scheduler.extend(caller, args["job"], seconds))

    async def _scale(self, caller: Caller, args: dict[str, Any]) -> Any:
        nodes = args["nodes"]
        if isinstance(nodes, bool) or not isinstance(nodes, int | str) or not str(nodes).strip().isdigit():
            raise UsageError(f"scale needs a whole number of nodes, not {nodes!r}")
        return await self._one(await self.scheduler.scale(caller, args["job"], int(nodes)))

    async def _logs(self, caller: Caller, args: dict[str, Any]) -> AsyncIterator[str]:
        stream = self.scheduler.logs(
            caller,
            args["job"],
            rank=int(args.get("rank") or 0),
            attempt=args.get("attempt"),
            follow=bool(args.get("follow")),
            tail=args.get("tail"),
        )
        return await _primed(stream)

    async def _launch(self, caller: Caller, args: dict[str, Any]) -> Any:
        return await self.scheduler.launch_files(
            caller, args["job"], rank=int(args.get("rank") or 0), attempt=args.get("attempt")
        )

    async def _step(self, caller: Caller, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A step in a running job (`ftconsole run`): a stream, which the step lasts (see scheduler/stepping.py)."""
        attach = args.get("attach")
        ask = StepAsk(
            argv=tuple(str(a) for a in args.get("argv") or ()),
            mode=str(args.get("mode") or "single"),
            nodes=None if args.get("nodes") is None else int(args["nodes"]),
            gpus_per_node=None if args.get("gpus_per_node") is None else int(args["gpus_per_node"]),
            overlap=bool(args.get("overlap")),
        )
        stream = self.scheduler.step(caller, args["job"], ask, attach=None if attach is None else int(attach))
        return await _primed(stream)

    async def _step_end(self, caller: Caller, args: dict[str, Any]) -> Any:
        codes = args["codes"]
        if not isinstance(codes, list):
            raise UsageError(f"step_end's codes is a list of exit codes, not {codes!r}")
        return await self.scheduler.step_end(caller, args["job"], int(args["step"]), codes)

    async def _wait(self, caller: Caller, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return await _primed(self.scheduler.wait(caller, args["job"]))

    async def _events(self, caller: Caller, args: dict[str, Any]) -> Any:
        limit = _limit(args, 100)
        hidden = await self._hidden(caller)
        if args.get("job") is not None:
            events = await self.scheduler.job_events(caller, args["job"], limit=limit)
        else:
            events = await self.scheduler.service.events(node=args.get("node"), limit=limit)
            events = [e for e in events if e.job is None or not e.job.isdigit() or int(e.job) not in hidden]
        return redact_json([e.to_json() for e in events], hidden)  # a node's events name the job it failed under

    async def _alerts(self, caller: Caller, args: dict[str, Any]) -> Any:
        """Open and acknowledged alerts, oldest first; `all`: resolved ones too; `limit` (default 200) newest."""
        states = ALERT_STATES if args.get("all") else ("open", "acknowledged")
        alerts = await self.scheduler.store.alerts(states=states, limit=_limit(args, 200))
        hidden = await self._hidden(caller)
        return redact_json([a.to_json() for a in alerts if a.job not in hidden], hidden)  # node_isolated names a job

    async def _ack(self, caller: Caller, args: dict[str, Any]) -> Any:
        return [a.to_json() for a in await self.scheduler.ack(caller, _alert_ids(args))]

    async def _resolve(self, caller: Caller, args: dict[str, Any]) -> Any:
        return [a.to_json() for a in await self.scheduler.resolve(caller, _alert_ids(args))]

    async def _nodes(self, caller: Caller, args: dict[str, Any]) -> Any:
        hidden = await self._hidden(caller)
        views = [v.to_json() for v in await self.scheduler.service.nodes(args.get("nodeset"))]
        if args.get("brief"):  # made brief first: masking walks every value, and checks and facts are most of them
            views = [brief_node(v) for v in views]
        return [seen_by(v, hidden) for v in views]

    async def _probe(self, caller: Caller, args: dict[str, Any]) -> Any:
        checks = args.get("checks")
        outcomes = await self.scheduler.probe(caller, args.get("nodeset"), checks=checks)
        return [o.to_json() for o in outcomes]

    async def _drain(self, caller: Caller, args: dict[str, Any]) -> Any:
        views = await self.scheduler.drain(caller, str(args["nodeset"]), str(args.get("reason") or ""))
        return [v.to_json() for v in views]

    async def _resume(self, caller: Caller, args: dict[str, Any]) -> Any:
        views = await self.scheduler.resume(caller, str(args["nodeset"]), test=bool(args.get("test")))
        return [v.to_json() for v in views]

    async def _repair(self, caller: Caller, args: dict[str, Any]) -> Any:
        return [v.to_json() for v in await self.scheduler.repair(caller, str(args["nodeset"]))]

    async def _cluster(self, caller: Caller, args: dict[str, Any]) -> Any:
        s = self.scheduler
        views = [v.to_json() for v in await s.service.nodes()]
        queued = await s.store.jobs(statuses=[JobStatus.QUEUED])
        holds = await debugenv.holds(s.store, s.config.debug, s.clock())
        debug_held = [(h.run, h.until) for h in holds]
        view = cluster_view(s.config, views, await s.store.runs(held=True), queued, debug_held)
        hidden = await self._hidden(caller)
        for node in view.get("nodes") or []:
            for gpu in node.get("gpus") or []:
                if gpu.get("job") in hidden:
                    gpu.update(job=None, private=True)
        fabric = s.service.fabric_view()  # what placement goes by, declared or found (`ftconsole topology`)
        return {**view, "goodput": await s.cluster_goodput(), "fabric": fabric, **self._leadership()}  # no job named

    async def _fabric(self) -> Any:
        """What placement goes by of the fabric (`ClusterService.fabric_view`; None: nothing declared)."""
        return self.scheduler.service.fabric_view()

    async def _topology_discover(self, caller: Caller, args: dict[str, Any]) -> Any:
        """What the nodes' tools say of the fabric, compared with `topology:` (scheduler/discovery.py): admins only,
        as it runs ibnetdiscover and nvidia-smi on every node and records events."""
        if not self.scheduler.is_admin(caller):
            raise PermissionDenied(
                f"{caller.user} may not run the fabric's discovery on every node: that is for admins"
            )
        return await discover(self.scheduler.service, self.scheduler.clock)

    async def _hidden(self, caller: Caller) -> frozenset[int]:
        """The jobs this caller may not see (`Scheduler.may_see`): left out of listings, events and alerts; the
        GPUs they hold show as held by a private job."""
        if self.scheduler.is_admin(caller):
            return frozenset()
        return await self.scheduler.store.private_jobs(except_uid=caller.uid)


async def _primed(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Run a stream up to its first item now, so refusals (no such job, no permission) come back as errors. A
    first item "" (`Scheduler.logs`: the checks passed) is not sent: the stream goes on in the API's hands, which
    end it when the client goes."""
    iterator = aiter(stream)
    try:
        first = await anext(iterator)
    except StopAsyncIteration:
        first = _EMPTY

    async def rest() -> AsyncIterator[Any]:
        try:
            if first is not _EMPTY:
                if first != "":
                    yield first
                async for item in iterator:
                    yield item
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    return rest()


_EMPTY = object()


def _limit(args: dict[str, Any], default: int) -> int:
    """A listing's `limit`: 1 to MAX_LIMIT rows (0 or none: `default`); anything else is refused."""
    value = args.get("limit") or default
    if isinstance(value, str) and value.strip().isdecimal() and len(value) < 20:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise UsageError(f"limit must be a whole number from 1 to {MAX_LIMIT:,}, not {value!r:.40}")
    return value


def _ids(args: dict[str, Any]) -> list[Any]:
    ids = args["jobs"]
    if not isinstance(ids, list) or not ids:
        raise UsageError("give at least one job id")
    return ids


def _alert_ids(args: dict[str, Any]) -> list[Any]:
    ids = args["alerts"]
    if not isinstance(ids, list) or not ids:
        raise UsageError("give at least one alert id")
    return ids


def decision_json(decision: placement.Decision) -> dict[str, Any]:
    if isinstance(decision, placement.Place):
        return {"starts_now": True, "nodes": [{"node": n, "gpus": list(g)} for n, g in decision.nodes]}
    return {
        "starts_now": False,
        "reason": decision.reason,
        "cause": decision.cause.value,
        "position": decision.position,
        "ahead": list(decision.ahead),
        "earliest_start": decision.earliest_start,
    }


class _Answering:
    """The scheduler that answers the API now, as the metrics endpoint reads it at each scrape: a reload puts a new
    one in place while the endpoint stays up."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops

    @property
    def store(self) -> Store:
        return self._ops.scheduler.store

    @property
    def service(self) -> ClusterService:
        return self._ops.scheduler.service

    @property
    def looping(self) -> bool:
        return self._ops.scheduler.looping


async def _outward(stack: contextlib.AsyncExitStack, loaded: LoadedConfig, store: Store, leadership: Any) -> None:
    """New alerts to the notify targets and the Alertmanager sync, in tasks of their own (they never hold up the
    loop), for as long as `stack` is open; with several head nodes, only while this one leads."""
    dispatcher = await stack.enter_async_context(notify.running(loaded.cluster.notify, store))
    if dispatcher is not None and leadership is not None:
        dispatcher.may_send = leadership.leading
    sync = await stack.enter_async_context(alertmanager.running(loaded.cluster, store))
    if sync is not None and leadership is not None:
        sync.may_send = leadership.leading


async def serve(
    loaded: LoadedConfig,
    stop: asyncio.Event,
    *,
    ready: Callable[[Scheduler], None] | None = None,
    probe: bool = True,
    service: ClusterService | None = None,
    answering: Callable[[Operations], None] | None = None,
) -> None:
    """Run the scheduler with its API until `stop` is set. AlreadyRunning when another one holds state_dir.

    `service`: an open ClusterService to share (the console's); by default one is opened and closed here.
    `answering`: told the operations that answer its API (a console in this process calls the same: on a
    standby, they refuse a change naming the leader; `ops.reloader` applies a changed config file).
    """
    with StateLock(loaded.state_dir):
        async with contextlib.AsyncExitStack() as stack:
            if service is None:
                service = await stack.enter_async_context(ClusterService.open(loaded))
            scheduler = Scheduler(service)
            ops = Operations(scheduler)
            reloader = ops.reloader = Reloader(loaded, service, ops, Scheduler)
            if answering is not None:
                answering(ops)
            await stack.enter_async_context(ApiServer(loaded.socket_path, ops, group=loaded.cluster.api.group))
            log.info(
                "serving %s on %s (cluster id %s, run folders %s)",
                loaded.state_dir,
                loaded.socket_path,
                service.store.cluster_id,
                scheduler.loop.run_root,
            )
            if failpoints.active():
                log.warning("failpoints active: %s", failpoints.active())
            readied = False

            def mark_ready() -> None:  # once: when it first leads, or first looked at the lease (two head nodes)
                nonlocal readied
                if ready is not None and not readied:
                    readied = True
                    ready(scheduler)

            async def lead(scheduler: Scheduler, stop: asyncio.Event, leadership: Any = None) -> None:
                """The loop with what follows the leader: notifications, the Alertmanager sync, metrics; a reload
                in between restarts the loop (and the notifications where their keys changed), not the rest."""
                store = reloader.service.store
                async with contextlib.AsyncExitStack() as term:
                    # Prometheus metrics on metrics.listen, read from the store at each scrape (off without it)
                    current = cast(Scheduler, _Answering(ops))  # what the endpoint reads of it, of the current one
                    await term.enter_async_context(metrics.serving(reloader.loaded.cluster.metrics, current))
                    outward = contextlib.AsyncExitStack()
                    term.push_async_callback(lambda: outward.aclose())  # the last one opened

                    async def restart_outward(now: LoadedConfig) -> None:
                        nonlocal outward
                        await outward.aclose()
                        outward = contextlib.AsyncExitStack()
                        await _outward(outward, now, store, leadership)

                    await restart_outward(reloader.loaded)
                    mark_ready()
                    await reloader.run(
                        scheduler, stop, probe=probe, leadership=leadership, restart_outward=restart_outward
                    )

            # the API closes after this: the steps its streams follow go on, for the next scheduler (stepping.py)
            stack.callback(lambda: setattr(ops.scheduler.steps_book, "stopping", True))
            if loaded.cluster.state is None:  # SQLite: one scheduler per state_dir, its lock says so
                await lead(scheduler, stop)
                return
            from ftconsole.scheduler.serve import leadership  # loads asyncpg: PostgreSQL only

            # ready once the lease was first looked at: leading or not, its API serves
            await leadership.serve(loaded, service, ops, stop, lead, ready=mark_ready)


async def serve_until_signalled(loaded: LoadedConfig) -> None:
    """`ftconsole serve`: SIGTERM or SIGINT stops it cleanly (jobs keep running on their nodes); SIGHUP applies the
    config file as it is now (`systemctl reload`), as `ftconsole config reload` does, and logs what changed."""
    import signal

    gctune.serving()  # a deep queue's heap: full collections far less often; requests answered between threads
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    answering: list[Operations] = []
    reloads: set[asyncio.Task[Any]] = set()

    def hang_up() -> None:
        reloader = answering[0].reloader if answering else None
        if reloader is None:
            log.warning("SIGHUP: not serving yet; the config file is read as it starts")
            return
        log.info("SIGHUP: reloading the config from %s", reloader.loaded.file)
        task = asyncio.ensure_future(reloader.reload("SIGHUP"))  # it logs what changed, or every problem
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hang_up)
    try:
        await serve(loaded, stop, answering=answering.append)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
