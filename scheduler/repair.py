"""The repair ladder (issue 42): bring an isolated node back to service without an operator where the fix is
routine, as NVIDIA's NVSentinel does under Kubernetes and Slurm's RebootProgram with `scontrol reboot
nextstate=RESUME` does by hand. Each node climbs it at most once at a time, step by step (`repair` in the config,
each step optional):

1. waiting: until no job holds the node (a run's GPUs, or a failed job's kept for debugging);
2. gpu-reset: `nvidia-smi -r -i N` on each GPU the isolation names (`gpu_reset`), then the node tests: a pass
   ends the climb there;
3. reboot: the configured command (`reboot`: `systemctl reboot` over the node's SSH, or a head-node command such
   as an IPMI tool); boot: until a probe reads a new boot id (`boot_timeout`);
4. tests: the node tests (`node_tests`, its pool's or the cluster's), else one probe that must read healthy;
5. the node is resumed, by whoever started the climb; at any failed step it stays isolated, with why.

Who starts a climb: an operator (`ftconsole repair NODES`, an isolated or drained node that no climb is on), or
the scheduler with `repair.auto`, for each node it isolated itself, at most `max_per_day` times in 24 hours per
node and never for a flaky node (one that waits for an operator). Every step is a `repair` event of its node,
with who and why; `ftconsole nodes` shows the step a node is on, and `ftconsole_node_repairs_total{step,result}`
counts them. Each climb is kept in the store as it goes (climbs.py): the next scheduler on the store (after a
restart, a config reload, or on a standby that takes the lead) picks it up where it was (`pick_up`), and the
automatic repairs of the last day are counted there too, so that `max_per_day` holds across restarts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState, set_admin
from ftconsole.scheduler import nodegate
from ftconsole.scheduler.climbs import Climb
from ftconsole.scheduler.errors import FtError, UsageError
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import Node

log = logging.getLogger("ftconsole.scheduler")

POLL_S = 2.0  # how often a climb looks again: for the jobs that hold its node, for the node's new boot
COMMAND_TIMEOUT_S = 120.0  # a reset, or a reboot command, that takes longer failed
# a GPU named in an isolation's reason: "gpu 3", "GPU 3:", "gpu3"
GPU_NAMED = re.compile(r"\bgpu ?(\d{1,2})\b", re.IGNORECASE)
# runs a command as root: itself where the SSH user is root, else through sudo without a password
AS_ROOT = 'if [ "$(id -u)" = 0 ]; then exec "$@"; else exec sudo -n "$@"; fi'


class Failed(FtError):
    """A step of the ladder failed: the node stays isolated."""

    title = "repair"

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


async def repair(service: ClusterService, nodeset: str, *, by: str) -> list[Climb]:
    """`ftconsole repair NODES`: start the ladder on each (isolated or drained, no climb on it yet); the climbs."""
    nodes = service.select(nodeset)
    healths = await service.store.all_node_health()
    repairs = service.repairs
    refused = {}
    for node in nodes:
        health = healths.get(node.name) or NodeHealth(node.name)
        if node.name in repairs.climbs:
            refused[node.name] = f"being repaired already ({repairs.climbs[node.name].step})"
        elif health.admin is None:
            refused[node.name] = "in service: drain or isolate it first, so that no new job lands on it"
    if refused:
        listed = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items())[:10])
        raise UsageError(f"repair: nothing started: {listed}")
    now = service.clock()
    for node in nodes:
        health = healths.get(node.name) or NodeHealth(node.name)
        climb = Climb(node.name, by, f"{health.state.value} by {health.admin_by}", now, since=now)
        repairs.start(climb, functools.partial(_climb, service, node))
    return [repairs.climbs[n.name] for n in nodes if n.name in repairs.climbs]


async def start_auto(service: ClusterService) -> list[str]:
    """`repair.auto`: start the ladder on each node the scheduler isolated, not flaky, not repaired `max_per_day`
    times in the last day (counted in the store), no climb or node test on it. Their names."""
    settings = service.config.repair
    if not settings.auto:
        return []
    healths = await service.store.all_node_health()
    now = service.clock()
    started = []
    for node in service.all_nodes:
        health = healths.get(node.name)
        if (
            health is None or health.admin is not NodeState.ISOLATED or not health.admin_by.startswith("scheduler")
            or health.needs_operator or node.name in service.repairs.climbs or node.name in service.tester.testing
        ):  # fmt: skip
            continue
        if not await service.repairs.auto_room(node.name, now, settings.max_per_day):
            continue
        climb = Climb(node.name, "scheduler (repair)", f"isolated by {health.admin_by}", now, since=now)
        service.repairs.start(climb, functools.partial(_climb, service, node))
        started.append(node.name)
    return started


async def pick_up(service: ClusterService) -> list[str]:
    """The climbs under way when the last scheduler on this store stopped (kept there: climbs.py), each picked up
    where it was, by whom it was started and why: not counted again against `max_per_day`. One of a node no longer
    in the config, or back in service meanwhile, is dropped (with a log line), as is a record that cannot be read.
    Their names. Never raises: the loop starts all the same."""
    repairs = service.repairs
    try:
        stored = await repairs.stored()
        healths = await service.store.all_node_health() if stored else {}
    except FtError as exc:
        log.warning("repair: cannot read the repairs under way when the scheduler last stopped: %s", exc)
        return []
    nodes = {n.name: n for n in service.all_nodes}
    picked = []
    for name, climb in sorted(stored.items()):
        node, health = nodes.get(name), healths.get(name)
        if name in repairs.climbs:
            continue  # climbing here already
        if climb is None:
            why = "its record in the store cannot be read"
        elif node is None:
            why = "the node is no longer in the config"
        elif health is None or health.admin is None:
            why = "the node was put back in service meanwhile"
        else:
            repairs.start(replace(climb, picked_up=True), functools.partial(_climb, service, node))
            picked.append(name)
            log.warning("%s: repair picked up after a restart, at %s (started by %s)", name, climb.step, climb.by)
            continue
        log.warning("%s: the repair under way when the scheduler stopped is dropped: %s", name, why)
        await repairs.forget(name)
    return picked


async def _climb(service: ClusterService, node: Node) -> None:
    """The whole climb of `node`, kept in the store as it goes; its record removed when it ends, not when the
    scheduler stops it (cancelled: the next scheduler picks it up)."""
    repairs = service.repairs
    climb = repairs.climbs[node.name]
    ended = True
    try:
        await repairs.save(node.name)
        if climb.picked_up:
            said = f"repair picked up after a restart, at {climb.step} (started by {climb.by}: {climb.why})"
            await _event(service, node, said, {"step": "picked-up", "at": climb.step, "by": climb.by})
        else:
            said = f"repair started by {climb.by} ({climb.why})"
            await _event(service, node, said, {"step": "start", "by": climb.by})
        await _ladder(service, node, climb)
    except asyncio.CancelledError:
        ended = False  # the scheduler stops (or no longer leads): the record stays for the next to pick up
        raise
    except Failed as exc:
        await _failed(service, node, exc.step, exc.message)
    except FtError as exc:
        await _failed(service, node, repairs.climbs[node.name].step, str(exc))
    finally:
        if ended:
            await repairs.forget(node.name)


async def _ladder(service: ClusterService, node: Node, climb: Climb) -> None:
    """The steps, from the first, or from where a climb picked up after a restart was: waiting waits again; a GPU
    reset under way goes on to the tests that follow a reset (it is not sent again: it may have been done); a reboot
    or a boot goes on waiting for a boot id other than the one before the reboot, for what is left of `boot_timeout`
    (the reboot is not asked again); tests run again."""
    repairs = service.repairs
    settings = service.config.repair
    at = climb.step if climb.picked_up else "waiting"
    done = list(climb.done)
    if at == "waiting":
        while await nodegate.busy(service, {node.name}):
            await _still_out(service, node, at)  # put back meanwhile (an operator's resume): nothing to repair
            await asyncio.sleep(POLL_S)
    health = await _health(service, node)
    gpus = sorted({int(g) for g in GPU_NAMED.findall(" ".join(health.all_reasons()))})
    # the tests that follow a GPU reset: a pass ends the climb there, a failure goes on to the reboot
    after_reset = at == "gpu-reset" or (at == "tests" and climb.reset and climb.boot_since is None)
    if at == "waiting" and settings.gpu_reset and gpus:
        await _step(service, node, "gpu-reset", reset=True)
        try:
            await _reset(service, node, gpus)
        except Failed as exc:  # a reset that fails is what a reboot is for
            if settings.reboot is None:
                raise
            await _failed(service, node, exc.step, exc.message, going_on=True)
        else:
            done.append(f"GPU {', '.join(map(str, gpus))} reset")
            repairs.counts["gpu-reset", "done"] += 1
            after_reset = True
    if after_reset:
        await repairs.step(node.name, "tests", service.clock(), done=tuple(done))
        failing = await _failing(service, node, climb.by)
        if failing is None:
            return await _resume(service, node, climb, done)
        if settings.reboot is None:
            raise Failed("tests", f"after the GPU reset: {failing}")
    if at in ("reboot", "boot") or (settings.reboot is not None and (at != "tests" or after_reset)):
        if at in ("reboot", "boot"):  # asked before the restart: its new boot is waited for
            was, since = climb.boot_id, climb.since if climb.boot_since is None else climb.boot_since
            await repairs.step(node.name, "boot", service.clock())
        else:
            was, since = (await _health(service, node)).boot_id, service.clock()
            await _step(service, node, "reboot", boot_id=was, boot_since=since)  # kept before it is asked
            await _reboot(service, node)
            since = service.clock()
            await repairs.step(node.name, "boot", since, boot_since=since)
        await _new_boot(service, node, was, since)
        done.append("rebooted")
        repairs.counts["reboot", "done"] += 1
    await repairs.step(node.name, "tests", service.clock(), done=tuple(done))
    failing = await _failing(service, node, climb.by)
    if failing is not None:
        raise Failed("tests", failing)
    await _resume(service, node, climb, done)


async def _step(service: ClusterService, node: Node, step: str, **changes: Any) -> None:
    """On to a step that would meet a job (a reset, a reboot), kept in the store first: the node must still be out
    of service."""
    await service.repairs.step(node.name, step, service.clock(), **changes)
    await _still_out(service, node, step)


async def _reset(service: ClusterService, node: Node, gpus: Sequence[int]) -> None:
    for index in gpus:
        argv = ["sh", "-c", AS_ROOT, "sh", "nvidia-smi", "-r", "-i", str(index)]
        try:
            result = await service.transport.run(node, argv, timeout=COMMAND_TIMEOUT_S)
        except FtError as exc:  # the node does not answer: a reboot may bring it back
            raise Failed("gpu-reset", str(exc)) from None
        if not result.ok:
            raise Failed("gpu-reset", f"nvidia-smi -r -i {index}: {result.describe_failure()}")


async def _reboot(service: ClusterService, node: Node) -> None:
    settings = service.config.repair
    if settings.reboot == "ssh":
        argv = ["sh", "-c", AS_ROOT, "sh", "systemctl", "reboot"]
        try:
            result = await service.transport.run(node, argv, timeout=COMMAND_TIMEOUT_S)
        except FtError:  # the connection went with the node: the boot's wait tells
            return
        if not result.ok:
            raise Failed("reboot", f"systemctl reboot: {result.describe_failure()}")
        return
    argv = settings.reboot_argv(node.name, node.host, node.port or 22)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as exc:
        raise Failed("reboot", f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise Failed("reboot", f"{argv[0]} took more than {COMMAND_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        tail = " / ".join(out.decode(errors="replace").strip().splitlines()[-3:])
        raise Failed("reboot", f"{argv[0]} exited {proc.returncode}" + (f": {tail}" if tail else ""))


async def _new_boot(service: ClusterService, node: Node, was: str | None, since: float) -> None:
    """Until a probe of the node reads a boot id other than `was` (its connections dropped first: the node's sshd
    went with the old boot), within `boot_timeout` from `since` (by the service's clock, which a scheduler that picks
    the climb up after a restart shares: what is left of it; none left, the step fails at once)."""
    timeout = service.config.repair.boot_timeout
    forget = getattr(service.transport, "forget", None)
    deadline = time.monotonic() + timeout - max(0.0, service.clock() - since)
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        if forget is not None:
            forget(node.name)
        (outcome,) = await service.probe(node.name)
        boot = outcome.report.facts.boot_id if outcome.report is not None else None
        if boot and boot != was:
            return
    raise Failed("boot", f"no new boot id within boot_timeout ({timeout:g} s)")


async def _failing(service: ClusterService, node: Node, by: str) -> str | None:
    """The node tests, where any are configured (their events recorded), else a probe that must read healthy:
    None on a pass, else what failed."""
    tests = service.config.node_tests_for(node.pool)
    if tests.any:
        report = await service.tester.test(node, service.config)
        service.tester.count(report, "repair")
        async with service._folding:
            await nodegate.save_changes(service, [(await _health(service, node), report.events(by))])
        failing = None if report.passed else f"node tests: {report.failing() or report.line()}"
    else:
        (outcome,) = await service.probe(node.name)
        healthy = outcome.report is not None and outcome.health.health is NodeState.HEALTHY
        failing = None if healthy else f"no node tests configured, and its probe reads {outcome.health.health.value}"
    if failing is None:
        service.repairs.counts["tests", "pass"] += 1  # a failure is counted where the climb stops (_failed)
    return failing


async def _resume(service: ClusterService, node: Node, climb: Climb, done: Sequence[str]) -> None:
    tested = "tested" if service.config.node_tests_for(node.pool).any else "probed healthy"
    what = ", ".join([*done, tested, *(["picked up after a restart"] if climb.picked_up else [])])
    async with service._folding:
        health = await _health(service, node)
        health, events = set_admin(health, None, "", f"{climb.by} after a repair ({what})", service.clock())
        await nodegate.save_changes(service, [(health, events)])
    service.repairs.counts["resume", "done"] += 1
    log.warning("%s: repaired (%s) and back in service", node.name, what)


async def _failed(service: ClusterService, node: Node, step: str, why: str, *, going_on: bool = False) -> None:
    service.repairs.counts[step, "fail"] += 1
    out = await _out_of_service(service, node)
    then = "the next step follows" if going_on else "it stays out of service" if out else "it is in service"
    await _event(service, node, f"repair failed at {step}: {why}; {then}", {"step": step, "result": "fail"})
    log.warning("%s: repair failed at %s: %s; %s", node.name, step, why, then)


async def _event(service: ClusterService, node: Node, message: str, data: dict[str, Any]) -> None:
    async with service._folding:
        health = await _health(service, node)
        event = NodeEvent(service.clock(), node.name, "repair", message, data)
        await nodegate.save_changes(service, [(health, [event])])


async def _health(service: ClusterService, node: Node) -> NodeHealth:
    return (await service.store.all_node_health()).get(node.name) or NodeHealth(node.name)


async def _out_of_service(service: ClusterService, node: Node) -> bool:
    return (await _health(service, node)).admin is not None


async def _still_out(service: ClusterService, node: Node, step: str) -> None:
    """Before a step that would meet a job (a reset, a reboot): the node must still be out of service; someone
    who put it back meanwhile ends the repair there."""
    if not await _out_of_service(service, node):
        raise Failed(step, "the node was put back in service meanwhile: nothing more is done to it")
