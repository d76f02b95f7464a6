"""The gate in front of service (issue 42): an isolated node takes work again only once it passed its node tests
(scheduler/nodetests.py), when `node_tests` names any. Two ways through it:

- the scheduler's own: the loop's probe pass (`start_due`) starts the tests of each isolated node that its probes
  would resume (`probes.isolation_recover_after` passes in a row, not held for an operator); the report resumes
  the node or keeps it isolated with the failing line (`decide`);
- an operator's `ftconsole resume --test NODES` (`operator_resume`): the nodes that pass are resumed, by them; the
  others stay as they were, drained or isolated. Only nodes out of service are tested (drained or isolated), and
  none that a job still holds: the test's load would meet the job (and the job the test's).

Every test is a `tested` event of its node, whoever asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence, Set

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState, due_for_tests, resume_tested, set_admin
from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide.topology import by_switch
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.fabric import check, for_node_in_service
from ftconsole.scheduler.nodealerts import isolation_alerts
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.nodetests import NodeTestReport, TestResult
from ftconsole.scheduler.spec.config import ClusterConfig, Node
from ftconsole.scheduler.spec.nodetestspec import FabricTest

PARALLEL = 64  # nodes an operator's `resume --test` tests at once
FABRIC_PARTNERS = 2  # idle nodes a node's fabric test streams with
BURN_IN_SHARE = 20  # burn-in tests at most one node in this many at once (and at least one)


def gated(service: ClusterService, node: Node) -> bool:
    """Whether the scheduler's resume of this isolated node waits for its node tests (its pool's, or the cluster's)."""
    tests = service.config.node_tests_for(node.pool)
    return tests.any and tests.before_resume and service.config.probes.isolation_recover_after is not None


async def start_due(service: ClusterService) -> list[str]:
    """Start the tests of the isolated nodes due for them (not already being tested); their names."""
    if not any(gated(service, n) for n in service.all_nodes):
        return []
    healths = await service.store.all_node_health()
    after = service.config.probes.isolation_recover_after
    tester = service.tester
    due = [
        n for n in service.all_nodes
        if n.name not in tester.testing and n.name not in service.repairs.climbs and gated(service, n)
        and due_for_tests(healths.get(n.name) or NodeHealth(n.name), after)
    ]  # fmt: skip
    held = await busy(service, {n.name for n in due})
    due = [n for n in due if n.name not in held]  # tested once no job holds it: the test's load would meet it
    for node in due:
        tester.start(node, service.config, lambda report: decide(service, report))
    return [n.name for n in due]


async def decide(service: ClusterService, report: NodeTestReport) -> None:
    """A node's tests, started by the scheduler, are done: it is resumed on a pass, else kept isolated."""
    service.tester.count(report, "resume")
    async with service._folding:
        health = (await service.store.all_node_health()).get(report.node) or NodeHealth(report.node)
        changed, events = resume_tested(health, report.passed, report.failing() or report.line(), report.time)
        await save_changes(service, [(changed, [*report.events("scheduler"), *events])])


async def operator_resume(service: ClusterService, nodeset: str, *, by: str) -> list[tuple[NodeHealth, NodeTestReport]]:
    """`ftconsole resume --test`: test the nodes (at most PARALLEL at once), resume those that pass, by `by`; the
    others stay drained or isolated. Each node's health after, with its report."""
    nodes = service.select(nodeset)
    untested = [n.name for n in nodes if not service.config.node_tests_for(n.pool).any]
    if untested:
        raise UsageError(
            f"resume --test: no node tests are configured for {', '.join(untested[:10])}: name one under node_tests "
            "in the cluster config (for instance node_tests: {gpu: {level: 1}}), or under its pool's, or resume "
            "without --test"
        )
    healths = await service.store.all_node_health()
    refused = {
        n.name: "in service: drain it first, so that no job meets the test's load"
        for n in nodes if (healths.get(n.name) or NodeHealth(n.name)).admin is None
    }  # fmt: skip
    refused.update(
        {n: f"{why} (wait until it ends)" for n, why in (await busy(service, {x.name for x in nodes})).items()}
    )
    if refused:
        listed = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items())[:10])
        more = f"; and {len(refused) - 10} more" if len(refused) > 10 else ""
        raise UsageError(f"resume --test: not tested, nothing changed: {listed}{more}")
    slots = asyncio.Semaphore(PARALLEL)

    async def one(node_name: str) -> NodeTestReport:
        async with slots:
            return await service.tester.test(service.select(node_name)[0], service.config)

    reports = await asyncio.gather(*(one(n.name) for n in nodes))
    for report in reports:
        service.tester.count(report, "operator")
    async with service._folding:
        current = await service.store.all_node_health()
        changes: list[tuple[NodeHealth, list[NodeEvent]]] = []
        for report in reports:
            health = current.get(report.node) or NodeHealth(report.node)
            events = report.events(by)
            if report.passed:
                health, resumed = set_admin(health, None, "", f"{by} after the node tests passed", service.clock())
                events += resumed
            changes.append((health, events))
        await save_changes(service, changes)
    return [(health, report) for (health, _), report in zip(changes, reports, strict=True)]


async def burn_in(service: ClusterService, queued: bool) -> list[str]:
    """`probes.burn_in_interval`: test the idle nodes in service not tested for that long, at most BURN_IN_SHARE
    of the nodes at once, and only while nothing is `queued` (no job waits for them). Called at the end of a
    placement pass, so no placement decided before it lands on a node it starts: the next pass reads the node's
    GPUs as held by the test (`Tester.holds`). Their names."""
    every = service.config.probes.burn_in_interval
    tester = service.tester
    if every is None or queued:
        return []
    now = service.clock()
    last = tester.last
    if last is None:  # once: when each node was last tested, as the store keeps it
        last = tester.last = {}
        for node in service.all_nodes:  # each by the events' node index (the events have no index by kind)
            for event in await service.store.events(node=node.name, kind="tested", limit=1):
                last[node.name] = event.time
    room = max(1, len(service.all_nodes) // BURN_IN_SHARE) - len(tester.testing)
    stale = [
        n for n in service.all_nodes
        if n.name not in tester.testing and n.name not in tester.lent and now - last.get(n.name, -math.inf) >= every
    ]  # fmt: skip
    if room <= 0 or not stale:
        return []
    healths = await service.store.all_node_health()
    ready = [
        n for n in stale
        if (healths.get(n.name) or NodeHealth(n.name)).state is NodeState.HEALTHY
        and service.config.node_tests_for(n.pool).any
    ]  # fmt: skip
    held = await busy(service, {n.name for n in ready})
    chosen = sorted((n for n in ready if n.name not in held), key=lambda n: last.get(n.name, 0.0))[:room]
    for node in chosen:
        tester.start(node, service.config, lambda report: burned(service, report))
    return [n.name for n in chosen]


async def burned(service: ClusterService, report: NodeTestReport) -> None:
    """A burn-in's tests are done: a failure isolates the node (the scheduler's own evidence), with the failing
    line; a pass, a skip or an error (no verdict) leaves it in service. Each test is an event either way. (A fabric
    test's fail of a node in service already rests on two partners: `fabric_test`.)"""
    service.tester.count(report, "burn-in")
    async with service._folding:
        health = (await service.store.all_node_health()).get(report.node) or NodeHealth(report.node)
        await save_changes(service, [(health, report.events("scheduler (burn-in)"))])
    if any(r.result == "fail" for r in report.results):
        failing = "; ".join(r.line() for r in report.results if r.result == "fail")
        await service.isolate([report.node], reason=f"burn-in: node tests failed: {failing}", by="scheduler")


async def fabric_test(service: ClusterService, node: Node, config: ClusterConfig) -> TestResult:
    """A node's fabric test: the node and up to FABRIC_PARTNERS idle nodes of its pool in service (healthy, no job
    and no debugging hold on them, not under test nor lent to another), borrowed for the test's time: placement
    holds them too. Only the node's own result counts; with no partner free, it is a skip. A node still in service
    when it ends (burn-in) fails only where two partners each saw it slow (`for_node_in_service`): a failure would
    take it out of service, and one partner's word is no evidence that the fault is its own. A node out of service
    is kept out on one partner's word."""
    settings = config.node_tests_for(node.pool).fabric or FabricTest()
    tester = service.tester
    healths = await service.store.all_node_health()
    candidates = [
        n for n in service.all_nodes
        if n.pool == node.pool and n.name != node.name and n.name not in tester.testing
        and n.name not in service.repairs.climbs
        and (healths.get(n.name) or NodeHealth(n.name)).state is NodeState.HEALTHY
    ]  # fmt: skip
    held = await busy(service, {n.name for n in candidates})
    free = {n.name: n for n in candidates if n.name not in held and n.name not in tester.lent}
    near = by_switch(list(free), service.fabric(), first=node.name)  # under its own leaf first
    partners = [free[name] for name in near][:FABRIC_PARTNERS]
    if not partners:
        why = f"no idle node of pool {node.pool} in service to test the fabric with"
        return TestResult("fabric", "skip", why, tool="tcp")
    names = [p.name for p in partners]
    tester.borrow(names, service.clock() + settings.deadline)  # no await since the choice: no one else took them
    try:
        report = await check(service.transport, config.ssh.python, [node, *partners], settings, node.pool,
                             service.baselines)  # fmt: skip
    finally:
        tester.give_back(names)
    result = report.results[node.name]
    if ((await service.store.all_node_health()).get(node.name) or NodeHealth(node.name)).admin is None:
        result = for_node_in_service(result)  # read at the verdict: a node drained meanwhile is out of service
    return dataclasses.replace(result, summary=f"{result.summary} (with {', '.join(names)})"[:300])


async def busy(service: ClusterService, names: Set[str]) -> dict[str, str]:
    """The nodes of `names` that a job still holds (a run's GPUs, or a failed job's kept for debugging): why."""
    out: dict[str, str] = {}
    for run in await service.store.runs(held=True):
        if run.node in names:
            out.setdefault(run.node, f"job {run.job} still holds GPUs there")
    for hold in await debugenv.holds(service.store, service.config.debug, service.clock()):
        if hold.run.node in names:
            out.setdefault(hold.run.node, f"failed job {hold.job.id} is kept there for debugging")
    return out


async def save_changes(service: ClusterService, changes: Sequence[tuple[NodeHealth, Sequence[NodeEvent]]]) -> None:
    """Nodes' health with their events, and the isolation alerts they open or resolve; resumes counted."""
    alerts, resolved = isolation_alerts([e for _, events in changes for e in events])
    await service.store.save_nodes(changes, alerts=alerts, resolve=resolved)
    service.returns.add(e for _, events in changes for e in events)
