"""Prometheus metrics of `ftconsole serve`: node states, GPUs, the queue, jobs, restarts and open alerts.

With `metrics: {listen: HOST:PORT}` in the config, `serve` answers `GET /metrics` on that address. Nothing is
counted in memory: each scrape reads the store (`gather`) and renders what it read with prometheus_client's
own exposition (`render`), so the values are those `ftconsole nodes`, `jobs` and `alerts` show at that moment,
and a restarted scheduler loses nothing.

Why not prometheus_client's `start_http_server`: it serves from a thread, and the store is asyncio
(aiosqlite, asyncpg); a collector called in that thread would have to reach back into the event loop and
block on it. Here the HTTP server is a small asyncio server in the scheduler's loop instead: it awaits the
store like any other reader, then renders the immutable `Snapshot` it gathered in a worker thread. Scrapes are
taken one at a time (a snapshot younger than `REUSE_S` is served again), requests are bounded in size and time,
and a failure answers 500 to the scraper (so Prometheus marks the target down) without touching the scheduler.

The counts (jobs, queue, restarts, alerts) come from a read-only connection of the metrics' own (to the SQLite
file or the PostgreSQL database, `scheduler.store.engine`): it sees committed transactions only, reads each
scrape's counts from one snapshot, never waits behind the scheduler's writes, and cannot write. The nodes come from
`ClusterService.nodes`, so a node's state is the one every other view shows (stale probes included).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from ftconsole.probes.health import NodeState
from ftconsole.scheduler.decide import goodput
from ftconsole.scheduler.decide.goodput import Goodput
from ftconsole.scheduler.decide.jobs import Attempt, JobStatus, Run
from ftconsole.scheduler.decide.reconcile import PREEMPTED, REQUEUED, RESTARTED, SHRUNK
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.spec.config import MetricsSettings
from ftconsole.scheduler.spec.jobspec import Priority
from ftconsole.scheduler.store.db import OPEN_ALERT_STATES
from ftconsole.scheduler.store.engine import Engine, connect, is_postgres

if TYPE_CHECKING:
    from ftconsole.scheduler.jobops import Scheduler
    from ftconsole.scheduler.nodeops import ClusterService, NodeView

log = logging.getLogger("ftconsole.metrics")

RESTART_RESULTS = (RESTARTED, REQUEUED, SHRUNK, PREEMPTED)  # attempt results that led to a new attempt
REUSE_S = 1.0  # a snapshot this young is served again (several scrapers, or one retrying)
GOODPUT_WINDOW_S = 7 * 86400.0  # the goodput gauges cover this much of the past
GOODPUT_EVERY_S = 60.0  # and are summed again this often (every run of the window is read)
COLLECT_TIMEOUT_S = 10.0  # a scrape that cannot read the store within this answers 503
REQUEST_TIMEOUT_S = 10.0  # the request head must arrive, and the answer be taken, within this
MAX_HEAD = 16 * 1024  # bytes of request line and headers
MAX_CLIENTS = 16  # connections served at once; more are closed at once


# ================================================================ what a scrape reads


@dataclass(frozen=True)
class NodeSample:
    name: str
    pool: str
    state: str  # a NodeState value
    last_probe: float | None  # when it was last probed (the clock's epoch seconds)


@dataclass(frozen=True)
class GpuSample:
    """One GPU of a node as its latest probe report read it; None: the probe could not read that value.

    `healthy` is False where the node's gpu-health check fails on this GPU: the driver reports it unhealthy, or
    it has uncorrectable ECC errors (pending page retirement or row remapping only degrade a node)."""

    node: str
    index: int
    model: str | None = None
    utilization: float | None = None
    temperature: float | None = None
    ecc_uncorrectable: int | None = None
    healthy: bool = True


@dataclass(frozen=True)
class Counts:
    """The store's counts: jobs by status, queued jobs by priority, restarts by result, unresolved alerts by
    (kind, severity, state)."""

    jobs: Mapping[str, int] = field(default_factory=dict)
    queued: Mapping[str, int] = field(default_factory=dict)
    restarts: Mapping[str, int] = field(default_factory=dict)
    alerts: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    goodput: Goodput = field(default_factory=Goodput)  # the cluster's over the last GOODPUT_WINDOW_S
    pruned: Mapping[str, int] = field(default_factory=dict)  # history retention: jobs, events, alerts, restarts:<r>


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    counts: Counts = Counts()
    looping: bool = False
    collect_seconds: float = 0.0
    # (test, result, trigger) -> node tests run by this scheduler since it started (nodetests.Tester.counts)
    node_tests: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    # (step, result) -> steps of the repair ladder this scheduler climbed since it started (climbs.Repairs.counts)
    repairs: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # by whom (scheduler, operator): nodes put back in service, and the seconds they had been out, since it started
    returns: Mapping[str, int] = field(default_factory=dict)
    out_of_service_s: Mapping[str, float] = field(default_factory=dict)


def node_samples(views: Sequence[NodeView]) -> tuple[tuple[NodeSample, ...], tuple[GpuSample, ...]]:
    """Nodes and their GPUs from node views; a node whose latest probe got no report has no GPU samples."""
    nodes, gpus = [], []
    for view in views:
        health = view.health
        nodes.append(NodeSample(view.node.name, view.node.pool, health.state.value, health.last_probe))
        report = view.probe.report if view.probe is not None else None
        for gpu in (report or {}).get("gpus") or []:
            if isinstance(gpu, dict) and _int(gpu.get("index")) is not None:
                gpus.append(
                    GpuSample(
                        node=view.node.name,
                        index=int(gpu["index"]),
                        model=gpu.get("name") if isinstance(gpu.get("name"), str) else None,
                        utilization=_number(gpu.get("utilization")),
                        temperature=_number(gpu.get("temperature")),
                        ecc_uncorrectable=_int(gpu.get("ecc_uncorrectable")),
                        healthy=gpu.get("healthy") is not False and not (_int(gpu.get("ecc_uncorrectable")) or 0) > 0,
                    )
                )
    return tuple(nodes), tuple(gpus)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StoreCounts:
    """Counts over the store through a read-only connection of its own (see the module docstring)."""

    def __init__(self, db: Engine) -> None:
        self._db = db
        self._goodput = Goodput()
        self._goodput_at = -math.inf  # monotonic: when it was last summed (again every GOODPUT_EVERY_S)

    @classmethod
    async def open(cls, where: Path | str) -> StoreCounts:
        """`where`: the store's file (SQLite) or URL (PostgreSQL), as `Store.path`."""
        if not is_postgres(where) and not Path(where).is_file():  # said plainly (read-only SQLite makes none)
            raise StoreError(f"cannot open {where} for metrics: there is no store")
        return cls(await connect(where, read_only=True, purpose=" for metrics"))

    async def close(self) -> None:
        await self._db.close()

    async def counts(self) -> Counts:
        db = self._db
        try:
            if db.in_transaction:  # a scrape cancelled between BEGIN and COMMIT
                await db.rollback()
            await db.begin(read_only=True)  # the counts of one scrape from one snapshot
            try:
                return Counts(
                    jobs=dict(await self._rows("SELECT status, COUNT(*) FROM jobs WHERE deleted = 0 GROUP BY status")),
                    queued=dict(
                        await self._rows(
                            "SELECT priority, COUNT(*) FROM jobs WHERE deleted = 0 AND status = ? GROUP BY priority",
                            (JobStatus.QUEUED.value,),
                        )
                    ),
                    restarts=dict(
                        await self._rows(
                            f"SELECT result, COUNT(*) FROM attempts WHERE result IN ({_marks(RESTART_RESULTS)}) "
                            "GROUP BY result",
                            RESTART_RESULTS,
                        )
                    ),
                    alerts={
                        (kind, severity, state): n
                        for kind, severity, state, n in await self._rows(
                            "SELECT kind, severity, state, COUNT(*) FROM alerts "
                            f"WHERE state IN ({_marks(OPEN_ALERT_STATES)}) GROUP BY kind, severity, state",
                            OPEN_ALERT_STATES,
                        )
                    },
                    goodput=await self._cluster_goodput(),
                    pruned={str(k): int(n) for k, n in await self._rows("SELECT what, count FROM pruned")},
                )
            finally:
                await db.commit()
        except db.errors as exc:
            raise StoreError(f"cannot read the store for metrics: {exc}") from exc

    async def _cluster_goodput(self) -> Goodput:
        """The cluster's goodput over the last GOODPUT_WINDOW_S (decide/goodput.py), summed again at most every
        GOODPUT_EVERY_S: it reads every run of the window."""
        if time.monotonic() - self._goodput_at < GOODPUT_EVERY_S:
            return self._goodput
        now = time.time()
        since = now - GOODPUT_WINDOW_S
        runs = [
            Run(j, a, k, "", tuple(json.loads(g)), "", launch=True, started=s, ended=e)
            for j, a, k, g, s, e in await self._rows(
                "SELECT job, attempt, rank, gpus, started, ended FROM runs WHERE started IS NOT NULL "
                "AND (ended IS NULL OR ended >= ?)",
                (since - GOODPUT_WINDOW_S,),  # a failed attempt's downtime may run into the window
            )
        ]
        wanted = {r.job for r in runs}
        attempts = [
            Attempt(job=j, number=n, spec_name=None, gpus_per_node=0, master_port=0, created=0.0, result=result)
            for j, n, result in await self._rows(
                "SELECT job, number, result FROM attempts WHERE job IN (SELECT job FROM runs WHERE started IS NOT NULL "
                "AND (ended IS NULL OR ended >= ?))",  # those of the window's runs, not every attempt kept
                (since - GOODPUT_WINDOW_S,),
            )
            if j in wanted
        ]
        marks: dict[tuple[int, int], float] = {}
        for j, a, done in await self._rows(
            "SELECT job, attempt, MIN(done) FROM checkpoint_signals WHERE outcome = 'signalled' GROUP BY job, attempt"
        ):
            marks[(j, a)] = done
        per = await asyncio.to_thread(goodput.per_job, attempts, runs, marks, since, now, now)
        self._goodput, self._goodput_at = goodput.total(per), time.monotonic()
        return self._goodput

    async def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self._db.fetchall(sql, args)]


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


async def gather(service: ClusterService, counts: StoreCounts, *, looping: bool) -> Snapshot:
    """What one scrape shows, read now."""
    started = time.monotonic()
    nodes, gpus = node_samples(await service.nodes(extras=False))
    stored = await counts.counts()
    tests = dict(service.tester.counts)
    returns, out = dict(service.returns.count), dict(service.returns.out_s)
    took = time.monotonic() - started
    return Snapshot(nodes, gpus, stored, looping, took, node_tests=tests, returns=returns, out_of_service_s=out,
                    repairs=dict(service.repairs.counts))  # fmt: skip


# ================================================================ rendering (pure)


class SnapshotCollector(Collector):
    """A prometheus_client collector over one snapshot: the metric families, with every label documented in
    docs/operations.md (Metrics). Series that are always meaningful (every state, status and priority) are
    present with 0; a value a probe could not read is left out, not reported as 0."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        yield from self._nodes(s.nodes)
        yield from self._gpus(s.gpus)
        c = s.counts
        queue = GaugeMetricFamily("ftconsole_queue_length", "Queued jobs by priority.", labels=["priority"])
        for priority in Priority:
            queue.add_metric([priority.value], c.queued.get(priority.value, 0))
        yield queue
        jobs = GaugeMetricFamily("ftconsole_jobs", "Jobs by status (deleted jobs left out).", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], c.jobs.get(status.value, 0))
        yield jobs
        restarts = CounterMetricFamily(
            "ftconsole_restarts",
            "Attempts that ended restarted (in place), requeued (placed anew), shrunk (elastic) or preempted (for a "
            "job of a higher level), since the store was made.",
            labels=["result"],
        )
        for result in RESTART_RESULTS:  # with those of the attempts history retention pruned: it never goes down
            restarts.add_metric([result], c.restarts.get(result, 0) + c.pruned.get(f"restarts:{result}", 0))
        yield restarts
        pruned = CounterMetricFamily(
            "ftconsole_history_pruned",
            "Rows history retention removed from the store (history: in the config): ended jobs (with their runs, "
            "events and alerts), events of nodes, resolved alerts of nodes.",
            labels=["kind"],
        )
        for kind in ("jobs", "events", "alerts"):
            pruned.add_metric([kind], c.pruned.get(kind, 0))
        yield pruned
        tests = CounterMetricFamily(
            "ftconsole_node_tests",
            "Node tests run by this scheduler since it started, by test, result (pass, warn, skip, fail, error) and "
            "trigger (resume: before the scheduler resumes an isolated node; operator: resume --test; burn-in).",
            labels=["test", "result", "trigger"],
        )
        for (test, result, trigger), n in sorted(self.snapshot.node_tests.items()):
            tests.add_metric([test, result, trigger], n)
        yield tests
        repairs = CounterMetricFamily(
            "ftconsole_node_repairs",
            "Steps of the repair ladder climbed by this scheduler since it started, by step (gpu-reset, reboot, tests, "
            "resume; waiting, boot where one failed) and result (done, pass, fail).",
            labels=["step", "result"],
        )
        for (step, result), n in sorted(self.snapshot.repairs.items()):
            repairs.add_metric([step, result], n)
        yield repairs
        returns = CounterMetricFamily(
            "ftconsole_node_returns",
            "Drained or isolated nodes put back in service since this scheduler started, by who did (scheduler, "
            "operator).",
            labels=["by"],
        )
        out = CounterMetricFamily(
            "ftconsole_node_out_of_service_seconds",
            "The seconds those nodes had been out of service, summed: over ftconsole_node_returns_total, the mean "
            "time to return to service.",
            labels=["by"],
        )
        for who in ("scheduler", "operator"):
            returns.add_metric([who], self.snapshot.returns.get(who, 0))
            out.add_metric([who], self.snapshot.out_of_service_s.get(who, 0.0))
        yield returns
        yield out
        alerts = GaugeMetricFamily(
            "ftconsole_alerts", "Unresolved alerts by kind, severity and state.", labels=["kind", "severity", "state"]
        )
        for (kind, severity, state), n in sorted(c.alerts.items()):
            alerts.add_metric([kind, severity, state], n)
        yield alerts
        ratio = c.goodput.ratio
        if ratio is not None:
            yield GaugeMetricFamily(
                "ftconsole_goodput_ratio",
                "The share of the GPU time of the last 7 days that did useful work, against the time lost to "
                "failures (work redone after a failure, jobs standing still before their next attempt).",
                value=ratio,
            )
        seconds = GaugeMetricFamily(
            "ftconsole_goodput_gpu_seconds", "GPU-seconds of the last 7 days: useful, redone, standing still.",
            labels=["kind"],
        )  # fmt: skip
        # the same in hours: Prometheus wants base units (promtool flags it); kept one release so that dashboards
        # can move to the seconds, then removed
        hours = GaugeMetricFamily(
            "ftconsole_goodput_gpu_hours",
            "Deprecated, to be removed in the next release: ftconsole_goodput_gpu_seconds / 3600. GPU-hours of the "
            "last 7 days: useful, redone, standing still.",
            labels=["kind"],
        )
        for kind, value in (("useful", c.goodput.useful), ("rework", c.goodput.rework),
                            ("downtime", c.goodput.downtime)):  # fmt: skip
            seconds.add_metric([kind], value)
            hours.add_metric([kind], value / 3600)
        yield seconds
        yield hours
        yield GaugeMetricFamily(
            "ftconsole_scheduler_looping", "1 while the control loop runs (ticks and places jobs).", value=s.looping
        )
        yield GaugeMetricFamily(
            "ftconsole_metrics_collect_seconds", "How long this scrape took to read the store.", value=s.collect_seconds
        )

    @staticmethod
    def _nodes(nodes: Iterable[NodeSample]) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "ftconsole_node_state",
            "1 for the node's current state, 0 for the others.",
            labels=["node", "pool", "state"],
        )
        probed = GaugeMetricFamily(
            "ftconsole_node_last_probe_timestamp_seconds", "When the node was last probed.", labels=["node"]
        )
        for node in nodes:
            for each in NodeState:
                state.add_metric([node.name, node.pool, each.value], 1.0 if node.state == each.value else 0.0)
            if node.last_probe is not None:
                probed.add_metric([node.name], node.last_probe)
        yield state
        yield probed

    @staticmethod
    def _gpus(gpus: Iterable[GpuSample]) -> Iterator[Metric]:
        labels = ["node", "gpu"]
        info = GaugeMetricFamily("ftconsole_gpu_info", "The GPU's model (always 1).", labels=[*labels, "model"])
        healthy = GaugeMetricFamily(
            "ftconsole_gpu_healthy",
            "0: reported unhealthy or has uncorrectable ECC errors (gpu-health fails), else 1.",
            labels=labels,
        )
        util = GaugeMetricFamily("ftconsole_gpu_utilization_percent", "GPU utilisation, 0 to 100.", labels=labels)
        temp = GaugeMetricFamily("ftconsole_gpu_temperature_celsius", "GPU temperature.", labels=labels)
        ecc = GaugeMetricFamily(
            "ftconsole_gpu_ecc_uncorrectable_errors", "Uncorrectable ECC errors the driver reports.", labels=labels
        )
        for g in gpus:
            key = [g.node, str(g.index)]
            info.add_metric([*key, g.model or ""], 1.0)
            healthy.add_metric(key, 1.0 if g.healthy else 0.0)
            for family, value in ((util, g.utilization), (temp, g.temperature)):
                if value is not None:
                    family.add_metric(key, float(value))
            if g.ecc_uncorrectable is not None:
                ecc.add_metric(key, g.ecc_uncorrectable)
        yield from (info, healthy, util, temp, ecc)


def render(snapshot: Snapshot, accept: str = "") -> tuple[bytes, str]:
    """The exposition of a snapshot for an Accept header: (body, content type), text or OpenMetrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type


# ================================================================ the HTTP endpoint


@dataclass(frozen=True)
class Response:
    status: str  # "200 OK"
    content_type: str
    body: bytes
    encoding: str | None = None  # Content-Encoding


class MetricsServer:
    """GET /metrics over HTTP/1.1 on an asyncio server; one request per connection. `collect` gathers a
    snapshot (`gather` in `serve`); port 0 picks a free one (`port` says which)."""

    def __init__(self, host: str, port: int, collect: Callable[[], Awaitable[Snapshot]]) -> None:
        self.host = host
        self._port = port
        self._collect = collect
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._lock = asyncio.Lock()
        self._last: tuple[float, Snapshot] | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self._port, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=REQUEST_TIMEOUT_S)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=REQUEST_TIMEOUT_S)
            self._server = None

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def snapshot(self) -> Snapshot:
        """A snapshot gathered now, or one at most REUSE_S old: scrapes gather one at a time."""
        async with self._lock:
            if self._last is not None and time.monotonic() - self._last[0] < REUSE_S:
                return self._last[1]
            snapshot = await asyncio.wait_for(self._collect(), timeout=COLLECT_TIMEOUT_S)
            self._last = (time.monotonic(), snapshot)
            return snapshot

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._handlers) >= MAX_CLIENTS:
            writer.close()
            return
        self._handlers.add(task)
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
                response, head_only = _text("400 Bad Request", "no complete HTTP request\n"), False
            else:
                response, head_only = await self._respond(head)
            body = b"" if head_only else response.body
            writer.write(_head(response, len(response.body)) + body)
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await writer.drain()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or does not read: nothing to tell it
        except Exception:
            log.exception("metrics: request failed")
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _respond(self, head: bytes) -> tuple[Response, bool]:
        """(the response, whether only its head is sent)."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _text("400 Bad Request", "not an HTTP request line\n"), False
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return _text("405 Method Not Allowed", "only GET and HEAD\n"), False
        path = target.split("?", 1)[0]
        if path == "/":
            return _text("200 OK", "ftconsole: the metrics are at /metrics\n"), method == "HEAD"
        if path != "/metrics":
            return _text("404 Not Found", f"no {path}: the metrics are at /metrics\n"), method == "HEAD"
        try:
            snapshot = await self.snapshot()
            body, content_type = await asyncio.to_thread(render, snapshot, headers.get("accept", ""))
        except TimeoutError:
            log.warning("metrics: reading the store took over %gs", COLLECT_TIMEOUT_S)
            return _text("503 Service Unavailable", "the store did not answer in time\n"), False
        except Exception as exc:
            log.warning("metrics: collection failed: %s", exc, exc_info=not isinstance(exc, StoreError))
            return _text("500 Internal Server Error", f"metrics collection failed: {exc}\n"), False
        if "gzip" in headers.get("accept-encoding", "").lower():
            body = await asyncio.to_thread(gzip.compress, body)
            return Response("200 OK", content_type, body, encoding="gzip"), method == "HEAD"
        return Response("200 OK", content_type, body), method == "HEAD"


def _text(status: str, text: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", text.encode())


def _head(response: Response, length: int) -> bytes:
    encoding = f"Content-Encoding: {response.encoding}\r\n" if response.encoding else ""
    return (
        f"HTTP/1.1 {response.status}\r\nContent-Type: {response.content_type}\r\n{encoding}"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")


@contextlib.asynccontextmanager
async def serving(settings: MetricsSettings | None, scheduler: Scheduler) -> AsyncIterator[MetricsServer | None]:
    """The metrics endpoint of `serve` while inside; None when it is off, or could not start (logged: the
    scheduler runs on without it rather than leave the jobs unwatched)."""
    async with contextlib.AsyncExitStack() as stack:
        yield await _start(settings, scheduler, stack)


async def _start(
    settings: MetricsSettings | None, scheduler: Scheduler, stack: contextlib.AsyncExitStack
) -> MetricsServer | None:
    if settings is None:
        return None
    host, port = settings.address
    try:
        counts = await StoreCounts.open(scheduler.store.path)
        stack.push_async_callback(counts.close)
        server = MetricsServer(host, port, lambda: gather(scheduler.service, counts, looping=scheduler.looping))
        await stack.enter_async_context(server)
    except (StoreError, OSError) as exc:
        await stack.aclose()  # the store connection, if opened
        log.error("metrics: cannot listen on %s: %s; the scheduler runs without metrics", settings.listen, exc)
        return None
    log.info("metrics on http://%s/metrics", settings.listen)
    return server
