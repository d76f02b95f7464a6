"""What the console knows about the cluster, and how it keeps it fresh through the client API.

`Feed.refresh` asks the scheduler (`scheduler.client.Client`: the API socket when attached, the same
operations in-process when embedded) for what the visible view needs: jobs incrementally (`jobs_changed`
with a cursor, so 10,000 jobs cost only what changed), nodes, open alerts, events, the cluster view. Each
source keeps the time it was last read and its last error, so every panel can show the age of its data, and
nodes whose data is too old read `unknown`, never healthy.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.serve.client import Client

UTIL_HISTORY = 12  # probes of GPU utilisation kept per node for the sparkline
STALE_AFTER_S = 15.0  # nodes data older than this (the scheduler is not answering) reads `unknown`
SOURCES = (
    "jobs", "nodes", "alerts", "events", "cluster", "reservations", "job_util", "forecast", "shares", "fabric"
)  # fmt: skip
# sources read less often than every refresh: the running jobs' utilisation moves once a probe at most, and the
# expected starts are worked out again at most every 15 s (scheduler.forecasting.KEEP_S), the shares every 30 s
JOB_LOG = 64  # the reads of the jobs whose changed ids are kept: a view that last looked further back reads them all
READ_EVERY_S = {"job_util": 5.0, "forecast": 10.0, "shares": 30.0, "fabric": 30.0}


@dataclass
class Source:
    fetched: float | None = None
    error: str | None = None


@dataclass
class ChangeLog:
    """The job ids each read changed, for the last JOB_LOG reads that changed some: a view
    that remembers `reads` at its update asks `since` for what changed after it."""

    reads: int = 0  # how many reads changed some
    _log: deque[tuple[int, list[Any]]] = field(default_factory=lambda: deque(maxlen=JOB_LOG))

    def note(self, keys: list[Any]) -> None:
        if keys:
            self.reads += 1
            self._log.append((self.reads, keys))

    def since(self, read: int) -> set[Any] | None:
        """The keys changed, added or gone since the `read`th read; None when that is too far back to say."""
        if read == self.reads:
            return set()
        if read > self.reads or not self._log or self._log[0][0] > read + 1:
            return None
        return {key for number, keys in self._log if number > read for key in keys}


@dataclass
class Feed:
    clock: Callable[[], float] = time.time
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    alerts: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    cluster: dict[str, Any] | None = None
    reservations: list[dict[str, Any]] = field(default_factory=list)
    job_util: dict[int, tuple[float | None, ...]] = field(default_factory=dict)  # running job -> its GPUs' %
    forecast: dict[str, Any] | None = None  # the queue's expected starts (the `forecast` op)
    shares: dict[str, Any] | None = None  # fair share, use and quotas per project and user (the `shares` op)
    fabric: dict[str, Any] | None = None  # the switches placement goes by, declared or found (the `fabric` op)
    util: dict[str, deque[float | None]] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=lambda: {s: Source() for s in SOURCES})
    events_limit: int = 500
    job_changes: ChangeLog = field(default_factory=ChangeLog)
    _cursor: float | None = None
    _node_cursor: str | None = None
    _nodes_whole: bool = False  # the scheduler is older than `nodes_changed`: every node at every read

    async def refresh(self, client: Client, wanted: Iterable[str]) -> set[str]:
        """Read the wanted sources; return those that changed. A failing source keeps its last data."""
        changed: set[str] = set()
        for name in wanted:
            source = self.sources[name]
            every = READ_EVERY_S.get(name)
            if every is not None and source.fetched is not None and self.clock() - source.fetched < every:
                continue
            try:
                if await getattr(self, f"_read_{name}")(client):
                    changed.add(name)
            except FtError as exc:
                if source.error != str(exc):
                    changed.add(name)
                source.error = str(exc)
                continue
            except OSError as exc:  # the socket went away under us
                source.error = f"scheduler not answering: {exc}"
                changed.add(name)
                continue
            source.error = None
            source.fetched = self.clock()
        return changed

    def age(self, name: str) -> float | None:
        fetched = self.sources[name].fetched
        return None if fetched is None else self.clock() - fetched

    # -- readers -------------------------------------------------------------------------------------------

    @property
    def jobs_read(self) -> int:
        """How many reads of the jobs changed some (`jobs_changed_since`)."""
        return self.job_changes.reads

    def jobs_changed_since(self, read: int) -> set[int] | None:
        """The ids of the jobs changed, added or gone since the `read`th read of them (`jobs_read`); None when
        that is too far back to say (read them all)."""
        return self.job_changes.since(read)

    async def _read_jobs(self, client: Client) -> bool:
        reply = await client.call("jobs_changed", since=self._cursor)
        self._cursor = reply["cursor"]
        changed: list[int] = []
        for job in reply["jobs"]:
            if job.get("deleted"):
                if self.jobs.pop(job["id"], None) is not None:
                    changed.append(job["id"])
            elif self.jobs.get(job["id"]) != job:
                self.jobs[job["id"]] = job
                changed.append(job["id"])
        self.job_changes.note(changed)
        return bool(changed)

    async def _read_nodes(self, client: Client) -> bool:
        """The nodes whose view changed (`nodes_changed` with a cursor): a node's view moves at its probe, when
        a job starts or ends on it, or when its state does; at 1,000 nodes, all of them were 1 MiB a second."""
        if self._nodes_whole:
            return self._take_nodes(await client.call("nodes", brief=True), None, whole=True)
        try:
            reply = await client.call("nodes_changed", since=self._node_cursor, patches=True)
        except FtError as exc:  # a scheduler from before the op: every node, every read
            if "unknown op" not in str(exc):
                raise
            self._nodes_whole = True
            return await self._read_nodes(client)
        self._node_cursor = reply["cursor"]
        nodes = reply["nodes"]
        for patch in reply.get("patches") or ():  # the keys that changed of a node held
            old = self.nodes.get(patch["name"])
            utilization = patch.get("gpus_utilization")
            if old is None or (utilization is not None and len(utilization) != len(old.get("gpus") or ())):
                self._node_cursor = None  # not as held after all: read every node again next time
                continue
            node = old | patch
            if utilization is not None:  # a probe: the GPUs as held, each with its new utilisation
                del node["gpus_utilization"]
                node["gpus"] = [{**g, "utilization": u} for g, u in zip(old["gpus"], utilization, strict=True)]
            nodes.append(node)
        return self._take_nodes(nodes, reply["names"], whole=False)

    def _take_nodes(self, nodes: list[dict[str, Any]], names: list[str] | None, *, whole: bool) -> bool:
        """Keep the nodes read (an unchanged one keeps its object, so views can tell by identity) and each new
        probe's mean GPU utilisation; `names`, when given, are all the nodes there are now. (A node patched
        shares its unchanged values with the one held: telling them apart stops at the first key changed.)"""
        changed: list[str] = []
        kept = self.nodes
        for node in nodes:
            name = node["name"]
            old = kept.get(name)
            if old == node:
                continue
            if old is None or old.get("last_probe") != node.get("last_probe"):
                history = self.util.setdefault(name, deque(maxlen=UTIL_HISTORY))
                utils = [g["utilization"] for g in node.get("gpus") or [] if g.get("utilization") is not None]
                history.append(sum(utils) / len(utils) if utils else None)
            kept[name] = node
            changed.append(name)
        if whole:
            names = [n["name"] for n in nodes]
        if names is not None and list(kept) != names:  # a node came or went: the scheduler's order, as listed
            gone = kept.keys() - set(names)
            self.nodes = {name: kept[name] for name in names if name in kept}
            for name in gone:
                self.util.pop(name, None)
            changed += gone
        return bool(changed)

    async def _read_alerts(self, client: Client) -> bool:
        alerts = {a["id"]: a for a in await client.call("alerts")}
        changed = alerts != self.alerts
        self.alerts = alerts
        return changed

    async def _read_events(self, client: Client) -> bool:
        events = await client.call("events", limit=self.events_limit)
        changed = events != self.events
        self.events = events
        return changed

    async def _read_cluster(self, client: Client) -> bool:
        cluster = await client.call("cluster")
        changed = cluster != self.cluster
        self.cluster = cluster
        return changed

    async def _read_reservations(self, client: Client) -> bool:
        reservations = await client.call("reservations")
        changed = reservations != self.reservations
        self.reservations = reservations
        return changed

    async def _read_job_util(self, client: Client) -> bool:
        try:
            reply = await client.call("job_util")
        except FtError as exc:  # a scheduler from before the op: no sparkline, and no error in the title
            if "unknown op" not in str(exc):
                raise
            reply = {}
        util = {int(job): tuple(values) for job, values in reply.items()}
        changed = util != self.job_util
        self.job_util = util
        return changed

    async def _read_forecast(self, client: Client) -> bool:
        reply = await _newer_op(client, "forecast", "expected starts")
        changed = reply != self.forecast
        self.forecast = reply
        return changed

    async def _read_shares(self, client: Client) -> bool:
        reply = await _newer_op(client, "shares", "shares")
        changed = reply != self.shares
        self.shares = reply
        return changed

    async def _read_fabric(self, client: Client) -> bool:
        try:
            reply = await client.call("fabric")
        except FtError as exc:  # a scheduler from before the op: the config's switches, as before
            if "unknown op" not in str(exc):
                raise
            reply = None
        changed = reply != self.fabric
        self.fabric = reply
        return changed

    # -- derived -------------------------------------------------------------------------------------------

    def node_views(self) -> list[dict[str, Any]]:
        """The nodes as last read; when that is too old, every node reads `unknown` with the reason."""
        age = self.age("nodes")
        if age is None or age <= STALE_AFTER_S:
            return list(self.nodes.values())
        why = f"no data from the scheduler for {age:.0f}s"
        return [{**n, "state": "unknown", "reasons": [why, *n.get("reasons", [])]} for n in self.nodes.values()]


async def _newer_op(client: Client, op: str, what: str) -> Any:
    """An op a scheduler older than this console does not know: said in the view's title, in words."""
    try:
        return await client.call(op)
    except FtError as exc:
        if "unknown op" not in str(exc):
            raise
        raise FtError(f"this scheduler has no {what} (it is older than this console)") from None
