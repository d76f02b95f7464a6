"""The scheduler's client interface for nodes: what the CLI and the console call.

`ClusterService` runs in the caller's process (embedded). Every method returns plain records with a
`to_json`, so the same calls can later travel over the daemon's socket unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.probes.health import (
    NodeEvent,
    NodeHealth,
    NodeState,
    Observation,
    Returns,
    faults_in_window,
    is_fault,
    merge_partial,
    observe,
    set_admin,
    stale,
)
from ftconsole.probes.results import AGENT_PROTOCOL, ALL_CHECKS, ProbeReport, parse_document
from ftconsole.scheduler import debugenv
from ftconsole.scheduler.climbs import Climb, Repairs
from ftconsole.scheduler.decide.topology import Fabric, fabric_of, merged_fabric
from ftconsole.scheduler.errors import FtError, NotFound, UsageError
from ftconsole.scheduler.fabric import Baselines
from ftconsole.scheduler.nodealerts import flaky_alert, isolation_alerts, node_alerts
from ftconsole.scheduler.nodetests import Tester, TestResult
from ftconsole.scheduler.samples import GpuSamples
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node, NodeTests
from ftconsole.scheduler.spec.nodesets import MAX_NODESET, expand_nodeset, nodeset_size
from ftconsole.scheduler.ssh.probing import ProbeFailure, sweep
from ftconsole.scheduler.ssh.transport import SSHPool, Transport
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.files import secure_state, store_location
from ftconsole.scheduler.store.records import AutoResolve, NewAlert, StoredEvent, StoredProbe

STALE_AFTER_INTERVALS = 3
# A node set in a request may name at most this many times the cluster's nodes (and at least NODESET_FLOOR): more
# must repeat names; the bound is checked before the set is expanded (nodesets.nodeset_size).
NODESET_SLACK = 4
NODESET_FLOOR = 1024
# A probe on demand by someone who is not an admin (issue 26): a node probed less than this ago answers with that
# probe's result, and a node a sweep is probing now with that sweep's; only the rest are probed, in one sweep.
PROBE_REUSE_S = 30.0


def _tests_first(tests: NodeTests) -> bool:
    """Whether the scheduler's resume of an isolated node waits for these node tests (nodegate.py)."""
    return tests.any and tests.before_resume


def _node_json(node: Node) -> dict[str, Any]:
    return {"name": node.name, "host": node.host, "port": node.port, "pool": node.pool, "labels": node.labels}


def _health_json(h: NodeHealth, now: float) -> dict[str, Any]:
    return {
        "state": h.state.value,
        "health": h.health.value,
        "reasons": list(h.all_reasons()),
        "since": h.since,
        "admin": h.admin.value if h.admin else None,
        "admin_reason": h.admin_reason or None,
        "admin_by": h.admin_by or None,
        "last_probe": h.last_probe,
        "last_probe_age_s": round(now - h.last_probe, 1) if h.last_probe is not None else None,
        "isolated_passes": h.isolated_passes,
    }


@dataclass(frozen=True)
class ProbeOutcome:
    node: Node
    report: ProbeReport | None
    failure: ProbeFailure | None
    health: NodeHealth
    time: float
    reused: bool = False  # the node's last probe, less than PROBE_REUSE_S old, not a probe made for this request

    @property
    def ok(self) -> bool:
        return self.report is not None and self.health.state is NodeState.HEALTHY

    def to_json(self) -> dict[str, Any]:
        out = {**_node_json(self.node), **_health_json(self.health, self.time)}
        out["reachable"] = self.report is not None
        out["reused"] = self.reused
        out["error"] = None if self.failure is None else {"kind": self.failure.kind, "message": self.failure.message}
        if self.report is not None:
            out.update(self.report.to_json())
        else:
            out.update({"facts": None, "gpus": [], "checks": [], "duration_s": None})
        return out


@dataclass(frozen=True)
class NodeView:
    node: Node
    health: NodeHealth
    probe: StoredProbe | None
    now: float
    held: tuple[tuple[int, int], ...] = ()  # (GPU index, job id) for each GPU a run holds
    faults: int = 0  # how many times it became unhealthy, unreachable or isolated
    faults_in_window: int = 0  # how many of them within probes.flaky_window
    flaky: bool = False  # faults_in_window reached probes.flaky_faults
    faults_window: float = 0.0  # probes.flaky_window, in seconds
    # (GPU index, job id, until) for each GPU a failed job holds for debugging (debug.hold_nodes)
    held_for_debug: tuple[tuple[int, int, float], ...] = ()
    # its last node test of each kind (a `tested` event's data, with its time), where asked for (nodegate.py)
    tests: tuple[Mapping[str, Any], ...] = ()
    testing: bool = False  # its node tests are running now (placement counts its GPUs as the test's)
    repair: Climb | None = None  # its repair under way (repair.py)

    def to_json(self) -> dict[str, Any]:
        out = {**_node_json(self.node), **_health_json(self.health, self.now)}
        report = self.probe.report if self.probe else None
        out["facts"] = report.get("facts") if report else None
        out["gpus"] = report.get("gpus", []) if report else []
        out["checks"] = report.get("checks", []) if report else []
        out["last_error"] = self.probe.error if self.probe else None
        out["held"] = [{"gpu": gpu, "job": job} for gpu, job in self.held]
        out["held_for_debug"] = [{"gpu": gpu, "job": job, "until": until} for gpu, job, until in self.held_for_debug]
        out.update(faults=self.faults, faults_in_window=self.faults_in_window, faults_window_s=self.faults_window,
                   flaky=self.flaky, tests=[dict(t) for t in self.tests], testing=self.testing)  # fmt: skip
        out["repair"] = self.repair.to_json() if self.repair is not None else None
        return out


def _checks(checks: Sequence[str] | None) -> tuple[str, ...] | None:
    """The check names a probe runs (None: all), refused unless every one is known."""
    if checks is None:
        return None
    if isinstance(checks, str) or not all(isinstance(c, str) for c in checks):
        raise UsageError(f"checks must be a list of check names, not {checks!r:.80}")
    unknown = sorted(set(checks) - set(ALL_CHECKS))
    if unknown or not checks:
        problem = f"unknown checks {', '.join(map(repr, unknown[:10]))}" if unknown else "no checks named"
        raise UsageError(f"{problem} (known: {', '.join(ALL_CHECKS)})")
    return None if set(ALL_CHECKS) <= set(checks) else tuple(dict.fromkeys(checks))


def _stored_report(probe: StoredProbe | None) -> ProbeReport | None:
    """The report of a stored probe (None: none, or the probe failed); one that no longer reads counts as none."""
    if probe is None or probe.report is None:
        return None
    try:
        return parse_document({**probe.report, "agent": AGENT_PROTOCOL})
    except FtError:
        return None


def _stored_outcome(node: Node, probe: StoredProbe, health: NodeHealth, now: float) -> ProbeOutcome:
    failure = None
    if probe.error is not None:
        kind, _, message = probe.error.partition(": ")
        failure = ProbeFailure(kind, message) if message else ProbeFailure("unreachable", probe.error)
    report = _stored_report(probe)
    return ProbeOutcome(node=node, report=report, failure=failure, health=health, time=now, reused=True)


async def _join(task: asyncio.Task[list[ProbeOutcome]]) -> list[ProbeOutcome]:
    """The outcomes of a sweep that others may wait on too: leaving early does not stop it."""
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if task.cancelled() and (me is None or not me.cancelling()):
            raise FtError("the probe sweep this request waited on was stopped (the scheduler is stopping)") from None
        raise


TESTS_SHOWN = 64  # nodes whose last node tests a listing that names nodes shows


class ClusterService:
    def __init__(
        self,
        loaded: LoadedConfig,
        store: Store,
        transport: Transport,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.loaded = loaded
        self.config = loaded.cluster
        self.store = store
        self.transport = transport
        self.clock = clock
        self._nodes = {n.name: n for n in self.config.node_list()}
        # each GPU's utilisation, temperature and memory as the probes read them (the hang detector, the console)
        self._util = GpuSamples()
        self._util_seeded = False
        # node -> (the checks it runs, None for all; the sweep) for each node a sweep is probing now
        self._sweeps: dict[str, tuple[frozenset[str] | None, asyncio.Task[list[ProbeOutcome]]]] = {}
        # one change at a time reads and writes the nodes' health: a sweep's fold, or an admin state set (an
        # isolation written while a fold was between its read and its write was lost, the node read unreachable)
        self._folding = asyncio.Lock()
        self.tester = Tester(transport, clock)  # the node tests under way (nodegate.py)
        self.tester.fabric = self._fabric_test
        # the fabric's learnt rates per pool (fabric.py), read from the store when first needed
        self.baselines = Baselines(lambda key: self.store.kept(key), lambda key, value: self.store.keep(key, value))
        self.returns = Returns()  # nodes put back in service, by whom, and how long they were out
        self.repairs = Repairs(store)  # the repairs under way, kept in the store as they go (repair.py)
        # what the nodes last told of the fabric (discovery.py: `Found.to_json`, and when), used where `topology:`
        # declares no leaves or no blocks and asks to `discover`
        self.found_fabric: tuple[dict[str, Any], float] | None = None
        self._fabric: tuple[Any, Any, Fabric | None] | None = None  # (the tree, what was found, their fabric)

    def fabric(self) -> Fabric | None:
        """The fabric placement and the fabric tests go by: `topology:`, and what was found where it asks; made
        again only when either changes (a pass asks for it once per job it places)."""
        tree = self.config.topology
        found = self.found_fabric if tree is not None and tree.discover is not None else None
        kept = self._fabric
        if kept is None or kept[0] is not tree or kept[1] is not found:
            kept = self._fabric = (tree, found, fabric_of(tree, None if found is None else found[0]))
        return kept[2]

    def fabric_view(self) -> dict[str, Any] | None:
        """What `fabric` goes by (`merged_fabric`: leaves, parents, blocks and where each came from) and when the
        nodes last told; None where `topology:` declares nothing."""
        tree = self.config.topology
        if tree is None:
            return None
        found = self.found_fabric if tree.discover is not None else None
        merged = merged_fabric(tree, None if found is None else found[0])
        return {**merged, "found_at": None if found is None else found[1]}

    async def _fabric_test(self, node: Node, config: ClusterConfig) -> TestResult:
        from ftconsole.scheduler import nodegate  # it imports this module

        return await nodegate.fabric_test(self, node, config)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, loaded: LoadedConfig) -> AsyncIterator[ClusterService]:
        # private; looser modes tightened
        secure_state(loaded.state_dir, group=loaded.cluster.api.group, sqlite=loaded.cluster.state is None)
        store = await Store.open(store_location(loaded))
        service = cls(loaded, store, pool := SSHPool.from_config(loaded))
        try:
            yield service
        finally:
            await service.repairs.close()  # a repair under way stops with the service (picked up by the next)
            await pool.close()
            await store.close()

    def reconfigured(self, loaded: LoadedConfig) -> ClusterService:
        """This service under a changed config (`ftconsole config reload`): the same store and SSH connections,
        the same GPU samples and probe sweeps under way, and the same lock on the nodes' health, so that a fold
        of this service and one of the new never interleave."""
        other = ClusterService(loaded, self.store, self.transport, clock=self.clock)
        other._util, other._util_seeded, other._sweeps = self._util, self._util_seeded, self._sweeps
        other._folding, other.tester = self._folding, self.tester
        other.returns, other.repairs, other.baselines = self.returns, self.repairs, self.baselines
        other.found_fabric = self.found_fabric  # the fabric itself does not change with the config
        other.tester.fabric = other._fabric_test  # partners from the new config's nodes
        return other

    # -- selecting nodes ---------------------------------------------------------------------------------

    @property
    def all_nodes(self) -> list[Node]:
        return list(self._nodes.values())

    @property
    def nodeset_limit(self) -> int:
        """The most names a node set in a request may expand to, all its expressions together."""
        return min(MAX_NODESET, max(NODESET_FLOOR, NODESET_SLACK * len(self._nodes)))

    def select(self, nodeset: str | Sequence[str] | None) -> list[Node]:
        """Nodes named by a node set expression (or a list of them); every name must be configured. The size of
        each is checked against `nodeset_limit` before it is expanded."""
        if nodeset is None:
            return self.all_nodes
        exprs = [nodeset] if isinstance(nodeset, str) else list(nodeset)
        limit = self.nodeset_limit
        why = f"a request may name {NODESET_SLACK} nodes per node of the cluster, and at least {NODESET_FLOOR:,}"
        size = sum(nodeset_size(e) if isinstance(e, str) else 0 for e in exprs)
        if len(exprs) > 1 and size > limit:
            raise UsageError(f"node sets naming up to {size:,} nodes, over the limit of {limit:,} ({why})")
        names: list[str] = []
        for expr in exprs:
            try:
                names.extend(expand_nodeset(expr, limit=limit))
            except ValueError as exc:
                raise UsageError(f"{exc} ({why})" if "over the limit" in str(exc) else str(exc)) from None
        unknown = [n for n in names if n not in self._nodes]
        if unknown:
            more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
            raise NotFound(f"not in the cluster config: {', '.join(unknown[:20])}{more}")
        return [self._nodes[n] for n in dict.fromkeys(names)]

    # -- probing -----------------------------------------------------------------------------------------

    async def probe(
        self, nodeset: str | None = None, *, checks: Sequence[str] | None = None, fresh: bool = False
    ) -> list[ProbeOutcome]:
        """Probe nodes now; fold the results into their health and persist both, with the events. `fresh`: an
        operator's probe, which reads the container runtimes anew (see probing.agent_params). `checks`: some
        checks only, a partial probe (see probes.health: it never makes a node's health better)."""
        nodes = self.select(nodeset)
        return await self._start(nodes, _checks(checks), fresh)

    async def probe_shared(
        self, nodeset: str | None = None, *, checks: Sequence[str] | None = None, reuse_s: float = PROBE_REUSE_S
    ) -> list[ProbeOutcome]:
        """A probe on demand by someone who is not an admin, merged with the others: a node probed less than
        `reuse_s` ago answers with that probe's result (`reused`), a node a sweep is probing now (the loop's, or
        another request's) with that sweep's, and the rest are probed in one sweep of their own. So a node is
        probed for such requests at most once per `reuse_s`, however many ask."""
        nodes = self.select(nodeset)
        wanted = _checks(checks)
        now = self.clock()
        latest = await self.store.latest_probes()
        recent = {n.name for n in nodes if n.name in latest and now - latest[n.name].time < reuse_s}
        sweeps: dict[asyncio.Task[list[ProbeOutcome]], None] = {}
        todo: list[Node] = []
        for node in nodes:  # no await from here to _start: a sweep is found, or started and registered, at once
            if node.name in recent:
                continue
            running = self._sweeps.get(node.name)
            if running is not None and (running[0] is None or (wanted is not None and set(wanted) <= running[0])):
                sweeps[running[1]] = None
            else:
                todo.append(node)
        if todo:
            sweeps[self._start(todo, wanted, fresh=True)] = None
        found: dict[str, ProbeOutcome] = {}
        for task in sweeps:
            found.update((o.node.name, o) for o in await _join(task))
        if recent:
            healths = await self.store.all_node_health()
            for node in nodes:
                if node.name in recent:
                    health = healths.get(node.name) or NodeHealth(node.name)
                    found[node.name] = _stored_outcome(node, latest[node.name], health, now)
        return [found[n.name] for n in nodes]

    def _start(
        self, nodes: Sequence[Node], checks: Sequence[str] | None, fresh: bool
    ) -> asyncio.Task[list[ProbeOutcome]]:
        """A sweep of `nodes` as a task, known in `_sweeps` until it ends (requests of others may join it)."""
        task = asyncio.ensure_future(self._sweep(nodes, checks, fresh))
        ran = None if checks is None else frozenset(checks)
        for node in nodes:
            self._sweeps[node.name] = (ran, task)

        def done(_: asyncio.Task[list[ProbeOutcome]]) -> None:
            for node in nodes:
                if node.name in self._sweeps and self._sweeps[node.name][1] is task:
                    del self._sweeps[node.name]

        task.add_done_callback(done)
        return task

    async def _sweep(self, nodes: Sequence[Node], checks: Sequence[str] | None, fresh: bool) -> list[ProbeOutcome]:
        results = await sweep(self.transport, self.config, nodes, checks=checks, fresh=fresh)
        async with self._folding:  # what the fold reads (health, the last reports) no other sweep changes meanwhile
            return await self._fold(nodes, results, partial=checks is not None)

    async def _fold(
        self, nodes: Sequence[Node], results: Mapping[str, ProbeReport | ProbeFailure], *, partial: bool
    ) -> list[ProbeOutcome]:
        now = self.clock()
        settings = self.config.probes
        current = await self.store.all_node_health()
        open_alerts = await self.store.open_node_alerts()
        history = await self.store.fault_events(since=now - settings.flaky_window)
        last = await self.store.latest_probes() if partial else {}
        changes: list[tuple[NodeHealth, Sequence[NodeEvent]]] = []
        stored: list[StoredProbe] = []
        outcomes: list[ProbeOutcome] = []
        raised: list[NewAlert] = []
        resolved: list[AutoResolve] = []
        for node in nodes:
            result = results[node.name]
            if isinstance(result, ProbeReport):
                # a partial report is folded, and kept, with the node's last result of the checks it did not run
                known = merge_partial(result, _stored_report(last.get(node.name))) if partial else result
                obs = Observation(now, report=known, partial=partial)
                stored.append(StoredProbe(node.name, now, None, known.to_json()))
                self._keep_util(node.name, now, result.to_json())
            else:
                obs = Observation(now, error=f"{result.kind}: {result.message}")
                stored.append(StoredProbe(node.name, now, obs.error, None))
            before = current.get(node.name) or NodeHealth(node.name)
            past = history.get(node.name, [])
            health, events = observe(
                before,
                obs,
                recover_after=settings.recover_after,
                resume_isolated_after=settings.isolation_recover_after,
                flaky=faults_in_window((e.time for e in past), now, settings.flaky_window) >= settings.flaky_faults,
                tests_first=_tests_first(self.config.node_tests_for(node.pool)),
            )
            changes.append((health, events))
            failure = result if isinstance(result, ProbeFailure) else None
            up, down = node_alerts(before, health, failure, open_alerts.get(node.name, set()), now)
            raised.extend(up)
            flaky = flaky_alert(node.name, past, events, now, settings)
            if flaky is not None:
                raised.append(flaky)
            resolved.extend(down)
            up, down = isolation_alerts(events)
            raised.extend(up)
            resolved.extend(down)
            outcomes.append(
                ProbeOutcome(
                    node=node,
                    report=result if isinstance(result, ProbeReport) else None,
                    failure=result if isinstance(result, ProbeFailure) else None,
                    health=health,
                    time=now,
                )
            )
        await self.store.save_nodes(changes, stored, alerts=raised, resolve=resolved)
        self.returns.add(e for _, events in changes for e in events)
        return outcomes

    def _keep_util(self, node: str, when: float, report: Mapping[str, Any]) -> None:
        self._util.add(node, when, report)

    async def gpu_samples(self) -> GpuSamples:
        """Each GPU's samples as the probes read them (as a mapping, "node:index" -> (time, utilisation %),
        oldest first): those the store keeps from before this process started, then this process's."""
        if not self._util_seeded:
            self._util_seeded = True
            newer, self._util = self._util, GpuSamples()
            for p in await self.store.probe_history():
                if p.report is not None:
                    self._keep_util(p.node, p.time, p.report)
            self._util.merge(newer)
        return self._util

    # -- listing -----------------------------------------------------------------------------------------

    async def nodes(self, nodeset: str | Sequence[str] | None = None, *, extras: bool = True) -> list[NodeView]:
        """The nodes as last probed; with `extras`, the GPUs runs hold, the fault counts and which nodes are flaky
        (three queries)."""
        nodes = self.select(nodeset)
        now = self.clock()
        healths = await self.store.all_node_health()
        probes = await self.store.latest_probes()
        stale_after = self.config.probes.interval * STALE_AFTER_INTERVALS
        held: dict[str, list[tuple[int, int]]] = {}
        debug_held: dict[str, list[tuple[int, int, float]]] = {}
        faults: dict[str, int] = {}
        recent: dict[str, int] = {}
        window, threshold = self.config.probes.flaky_window, self.config.probes.flaky_faults
        if extras:
            for r in await self.store.runs(held=True):
                held.setdefault(r.node, []).extend((gpu, r.job) for gpu in r.gpus)
            for h in await debugenv.holds(self.store, self.config.debug, now):
                debug_held.setdefault(h.run.node, []).extend((gpu, h.job.id, h.until) for gpu in h.run.gpus)
            faults = await self.store.node_faults()
            history = await self.store.fault_events(since=now - window)
            recent = {name: faults_in_window((e.time for e in evs), now, window) for name, evs in history.items()}
        tests = await self._last_tests(nodes) if extras and nodeset is not None else {}
        testing, climbs = self.tester.testing, self.repairs.climbs
        return [
            NodeView(
                node=n,
                health=stale(healths.get(n.name) or NodeHealth(n.name), now, stale_after),
                probe=probes.get(n.name),
                now=now,
                held=tuple(sorted(held.get(n.name, ()))),
                held_for_debug=tuple(sorted(debug_held.get(n.name, ()))),
                faults=faults.get(n.name, 0),
                faults_in_window=recent.get(n.name, 0),
                flaky=recent.get(n.name, 0) >= threshold,
                faults_window=window,
                tests=tests.get(n.name, ()),
                testing=n.name in testing,
                repair=climbs.get(n.name),
            )
            for n in nodes
        ]

    async def _last_tests(self, nodes: Sequence[Node]) -> dict[str, tuple[Mapping[str, Any], ...]]:
        """The last node test of each kind of each node named (at most TESTS_SHOWN nodes: a request names them)."""
        out: dict[str, tuple[Mapping[str, Any], ...]] = {}
        for node in nodes[:TESTS_SHOWN]:
            last: dict[str, Mapping[str, Any]] = {}
            for event in await self.store.events(node=node.name, kind="tested", limit=16):
                last[str(event.data.get("test"))] = {**event.data, "time": event.time}  # oldest first: newest wins
            out[node.name] = tuple(last.values())
        return out

    async def events(self, *, node: str | None = None, limit: int = 100) -> list[StoredEvent]:
        if node is not None:
            self.select(node)
        return await self.store.events(node=node, limit=limit)

    # -- admin -------------------------------------------------------------------------------------------

    async def drain(self, nodeset: str, *, reason: str, by: str) -> list[NodeHealth]:
        if not reason.strip():
            raise UsageError("drain needs a reason (--reason), so the next person on call knows why")
        return await self._set_admin(nodeset, NodeState.DRAINED, reason.strip(), by)

    async def resume(self, nodeset: str, *, by: str) -> list[NodeHealth]:
        return await self._set_admin(nodeset, None, "", by)

    async def isolate(self, names: Sequence[str], *, reason: str, by: str) -> list[NodeHealth]:
        """Keep faulty nodes out of placement (the recovery policy's state) until an operator resumes them, or with
        probes.isolation_recover_after N, until they pass the checks N times in a row. A drained node stays
        drained. The isolation counts as a fault: it may make the node flaky (node_flaky alert)."""
        return await self._set_admin(",".join(names), NodeState.ISOLATED, reason, by)

    async def _set_admin(self, nodeset: str, state: NodeState | None, reason: str, by: str) -> list[NodeHealth]:
        nodes = self.select(nodeset)
        async with self._folding:
            return await self._write_admin(nodes, state, reason, by)

    async def _write_admin(
        self, nodes: Sequence[Node], state: NodeState | None, reason: str, by: str
    ) -> list[NodeHealth]:
        now = self.clock()
        current = await self.store.all_node_health()
        changes = [set_admin(current.get(n.name) or NodeHealth(n.name), state, reason, by, now) for n in nodes]
        alerts: list[NewAlert] = []
        resolved: list[AutoResolve] = []
        for _, events in changes:
            up, down = isolation_alerts(events)
            alerts.extend(up)
            resolved.extend(down)
        if any(is_fault(e.kind, e.data) for _, events in changes for e in events):
            history = await self.store.fault_events(since=now - self.config.probes.flaky_window)
            for h, events in changes:
                flaky = flaky_alert(h.node, history.get(h.node, []), events, now, self.config.probes)
                if flaky is not None:
                    alerts.append(flaky)
        await self.store.save_nodes(changes, alerts=alerts, resolve=resolved)
        self.returns.add(e for _, events in changes for e in events)
        return [h for h, _ in changes]
