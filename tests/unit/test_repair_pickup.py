"""Repairs survive a scheduler restart (issue 42, scheduler/repair.py and climbs.py): a climb stopped at any step is
kept in the store and picked up there by the next scheduler on the same store, by whom it was started, without
sending again what may have been done (a GPU reset, a reboot); the daily cap of automatic repairs is counted in the
store, and a pick-up is not counted again; a stored climb of a node put back in service (or gone from the config)
is dropped. The node is a double: no nvidia-smi (a reset fails), `systemctl reboot` over its SSH gives it a new
boot id, and it probes healthy; a scheduler is stopped at a step by making its commands and probes hang there."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.probes.results import NodeFacts, ProbeReport
from ftconsole.scheduler import nodegate, repair
from ftconsole.scheduler.climbs import CLIMB_KEY, DAY_S, Climb, Repairs
from ftconsole.scheduler.nodeops import ClusterService, ProbeOutcome
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node
from ftconsole.scheduler.ssh.transport import CommandResult
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt

NOW = 1_700_000_000.0
BOOT_TIMEOUT_S = 60.0
REASON = "job 4: GPU 1: Xid 79 (fallen off the bus)"


class Machine:
    """The node n1 itself, the same whichever scheduler reaches it: its boot id, and the commands it was sent."""

    def __init__(self) -> None:
        self.boot = "b1"
        self.sent: list[str] = []


class Reach:
    """One scheduler's way to the node (its transport, its probe, whether a job holds the node): every command
    and probe hangs once the climb is on step `hold` (the scheduler is stopped there)."""

    def __init__(self, machine: Machine, hold: str | None = None) -> None:
        self.machine, self.hold = machine, hold
        self.service: ClusterService | None = None
        self.sent: list[str] = []  # what this scheduler sent

    def step(self) -> str | None:
        assert self.service is not None
        climb = self.service.repairs.climbs.get("n1")
        return climb.step if climb is not None else None

    async def _held(self) -> None:
        if self.hold is not None and self.step() == self.hold:
            await asyncio.Event().wait()

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        said = " ".join(argv[4:])  # after `sh -c AS_ROOT sh`
        self.sent.append(said)
        self.machine.sent.append(said)
        if said == "systemctl reboot":
            self.machine.boot = f"b{int(self.machine.boot[1:]) + 1}"  # asked: the node reboots, whoever waits
        await self._held()
        if said.startswith("nvidia-smi"):
            return CommandResult(node.name, tuple(argv), 127, None, "", "sh: nvidia-smi: not found", 0.0)
        return CommandResult(node.name, tuple(argv), 0, None, "", "", 0.0)

    async def probe(self, nodeset: str | None = None, **_: Any) -> list[ProbeOutcome]:
        await self._held()
        assert self.service is not None
        (node,) = self.service.select(nodeset)
        report = ProbeReport(NodeFacts(boot_id=self.machine.boot), (), ())
        health = NodeHealth(node.name, NodeState.HEALTHY, (), since=NOW, boot_id=self.machine.boot)
        return [ProbeOutcome(node, report, None, health, NOW)]

    async def busy(self, names: set[str]) -> dict[str, str]:
        await asyncio.sleep(0)
        return {"n1": "job 4 still holds GPUs there"} if self.hold == "waiting" else {}

    async def close(self) -> None:
        pass


async def scheduler_on(
    path: Path, machine: Machine, monkeypatch: pytest.MonkeyPatch, *, hold: str | None = None, clock: float = NOW,
    per_day: int = 2,
) -> ClusterService:  # fmt: skip
    """A scheduler (its service) on the store at `path`, reaching n1 through `machine`."""
    config = ClusterConfig.model_validate({
        "nodes": [{"name": "n[1-2]", "host": "127.0.0.[1-2]"}],
        "repair": {"auto": True, "max_per_day": per_day, "reboot": "ssh", "boot_timeout": f"{BOOT_TIMEOUT_S:g}s"},
    })  # fmt: skip
    reach = Reach(machine, hold)
    service = ClusterService(LoadedConfig(config, path.parent / "cluster.yaml"), await Store.open(path), reach,
                             clock=lambda: clock)  # fmt: skip
    reach.service = service
    monkeypatch.setattr(service, "probe", reach.probe)
    return service


def reach(service: ClusterService) -> Reach:
    assert isinstance(service.transport, Reach)
    return service.transport


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair, "POLL_S", 0.01)

    async def busy(service: ClusterService, names: set[str]) -> dict[str, str]:
        return await reach(service).busy(names)

    monkeypatch.setattr(nodegate, "busy", busy)


async def until(what: Callable[[], Awaitable[bool]], said: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await what():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:g} s for {said}") from None


async def stored(service: ClusterService) -> Climb | None:
    text = await service.store.kept(CLIMB_KEY + "n1")
    return None if text is None else Climb.from_record("n1", text)


async def isolated(service: ClusterService) -> None:
    """n1 as the scheduler isolated it, its boot b1 probed."""
    health = NodeHealth("n1", NodeState.HEALTHY, (), since=NOW, boot_id="b1", last_probe=NOW)
    await service.store.save_nodes([(health, [])])
    await service.isolate(["n1"], reason=REASON, by="scheduler")


async def stopped_at(service: ClusterService, step: str) -> Climb:
    """Until the climb of n1 is on `step`, in memory and in the store; then the scheduler stops: its record."""

    async def there() -> bool:
        kept, climb = await stored(service), service.repairs.climbs.get("n1")
        return kept is not None and kept.step == step and climb is not None and climb.step == step

    await until(there, f"the climb at {step}")
    if step == "reboot":  # the reboot's command is on its way (hanging)
        await until(lambda: _true(reach(service).sent[-1:] == ["systemctl reboot"]), "the reboot asked")
    await service.repairs.close()
    kept = await stored(service)
    assert kept is not None and kept.step == step, kept
    await service.store.close()
    return kept


async def _true(value: bool) -> bool:
    return value


async def ended(service: ClusterService) -> None:
    async def gone() -> bool:
        return "n1" not in service.repairs.climbs

    await until(gone, "the climb to end")


async def repair_steps(service: ClusterService) -> list[tuple[Any, Any]]:
    events = await service.store.events(node="n1")
    return [(e.data.get("step"), e.data.get("result") or e.data.get("at")) for e in events if e.kind == "repair"]


# the step the first scheduler stops at -> what the second one sends n1, and what its resume says was done
PICKED_UP = [
    ("waiting", ["nvidia-smi -r -i 1", "systemctl reboot"], "rebooted, probed healthy"),
    ("gpu-reset", [], "probed healthy"),  # the reset may have been done: its tests follow, a pass ends it there
    ("reboot", [], "rebooted, probed healthy"),  # asked before the stop: only its new boot is waited for
    ("boot", [], "rebooted, probed healthy"),
    ("tests", [], "rebooted, probed healthy"),
]


@pytest.mark.parametrize(("step", "sends", "done"), PICKED_UP)
async def test_a_climb_stopped_at_any_step_is_picked_up_there_by_the_next_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, sends: list[str], done: str
) -> None:
    machine = Machine()
    first = await scheduler_on(tmp_path / "state.db", machine, monkeypatch, hold=step)
    await isolated(first)
    assert await repair.start_auto(first) == ["n1"]
    kept = await stopped_at(first, step)
    assert (kept.by, kept.why) == ("scheduler (repair)", "isolated by scheduler")
    if step in ("reboot", "boot"):
        assert kept.boot_id == "b1" and kept.boot_since == NOW
    sent_before = len(machine.sent)

    second = await scheduler_on(tmp_path / "state.db", machine, monkeypatch)
    async with second.store:
        assert await repair.pick_up(second) == ["n1"]
        (climb,) = second.repairs.climbs.values()
        assert (climb.by, climb.why, climb.picked_up) == ("scheduler (repair)", "isolated by scheduler", True)
        await ended(second)
        assert reach(second).sent == sends and len(machine.sent) == sent_before + len(sends)
        (health,) = [h for n, h in (await second.store.all_node_health()).items() if n == "n1"]
        assert health.admin is None, health  # back in service, with no operator
        assert await stored(second) is None  # the climb ended: its record is gone
        steps = await repair_steps(second)
        assert steps[0] == ("start", None) and ("picked-up", step) in steps, steps
        assert steps.count(("start", None)) == 1 and steps.count(("picked-up", step)) == 1, steps
        resumed = [e.message for e in await second.store.events(node="n1") if e.kind == "resumed"]
        (said,) = resumed
        assert said.startswith(f"resumed by scheduler (repair) after a repair ({done}, picked up after a "), said
        assert machine.sent.count("systemctl reboot") == (0 if step == "gpu-reset" else 1)  # never twice


async def test_a_boot_past_its_timeout_fails_at_once_and_a_pick_up_is_not_counted_against_the_daily_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next scheduler starts after `boot_timeout` has gone by since the reboot: the boot step fails as a
    timeout does, and the node stays isolated. Two automatic repairs a day: the pick-up was not the second."""
    machine = Machine()
    first = await scheduler_on(tmp_path / "state.db", machine, monkeypatch, hold="boot")
    await isolated(first)
    assert await repair.start_auto(first) == ["n1"]
    await stopped_at(first, "boot")
    machine.boot = "b1"  # the reboot did not happen after all

    later = NOW + BOOT_TIMEOUT_S + 1
    second = await scheduler_on(tmp_path / "state.db", machine, monkeypatch, clock=later)
    async with second.store:
        assert await repair.pick_up(second) == ["n1"]
        await ended(second)
        failed = [e.message for e in await second.store.events(node="n1") if e.kind == "repair"][-1]
        assert failed == (f"repair failed at boot: no new boot id within boot_timeout ({BOOT_TIMEOUT_S:g} s); it "
                          "stays out of service"), failed  # fmt: skip
        assert reach(second).sent == []
        assert (await second.store.all_node_health())["n1"].admin is NodeState.ISOLATED
        assert await stored(second) is None
        assert await repair.start_auto(second) == ["n1"]  # the second automatic repair of the day
        await second.repairs.close()
        assert not await Repairs(second.store).auto_room("n1", later + 10, 2)  # and no third


async def test_the_daily_cap_of_automatic_repairs_holds_across_a_restart(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        repairs = Repairs(store)
        assert [await repairs.auto_room("n1", t, 2) for t in (NOW, NOW + 10, NOW + 20)] == [True, True, False]
        assert await repairs.auto_room("n2", NOW + 20, 2)  # each node its own
    async with await Store.open(store_at()) as store:  # the scheduler restarted
        repairs = Repairs(store)
        assert not await repairs.auto_room("n1", NOW + DAY_S - 1, 2)
        assert await repairs.auto_room("n1", NOW + DAY_S + 1, 2)  # the first has aged out of the day
        assert not await repairs.auto_room("n1", NOW + DAY_S + 2, 2)


async def test_a_stored_climb_of_a_node_put_back_in_service_or_gone_from_the_config_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    service = await scheduler_on(tmp_path / "state.db", Machine(), monkeypatch)
    async with service.store:
        await isolated(service)
        await service.resume("n1", by="ann")  # an operator resumed it while no scheduler ran
        await service.isolate(["n2"], reason="fan", by="scheduler")
        for node, record in [
            ("n1", Climb("n1", "scheduler (repair)", "isolated by scheduler", NOW, "boot", NOW).to_record()),
            ("n7", Climb("n7", "ann", "drained by ann", NOW, "tests", NOW).to_record()),  # no longer configured
            ("n2", "{not json"),
        ]:
            await service.store.keep(CLIMB_KEY + node, record)
        with caplog.at_level(logging.WARNING, logger="ftconsole.scheduler"):
            assert await repair.pick_up(service) == []
        assert await service.store.kept_under(CLIMB_KEY) == {}
        dropped = "the repair under way when the scheduler stopped is dropped"
        said = sorted(r.getMessage() for r in caplog.records)
        assert said == [
            f"n1: {dropped}: the node was put back in service meanwhile",
            f"n2: {dropped}: its record in the store cannot be read",
            f"n7: {dropped}: the node is no longer in the config",
        ], said
        assert [e for e in await service.store.events(node="n1") if e.kind == "repair"] == []
        assert (await service.store.all_node_health())["n1"].admin is None


async def test_values_kept_under_a_prefix_are_listed_and_removed_on_both_engines(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        for key in ("repair.climb.n1", "repair.climb.gpu_7", "repair.climbing", "REPAIR.CLIMB.x", "repair.auto.n1"):
            await store.keep(key, key.upper())
        assert await store.kept_under("repair.climb.") == {"repair.climb.n1": "REPAIR.CLIMB.N1",
                                                           "repair.climb.gpu_7": "REPAIR.CLIMB.GPU_7"}  # fmt: skip
        assert await store.kept_under("repair.climb.gpu_") == {"repair.climb.gpu_7": "REPAIR.CLIMB.GPU_7"}
        await store.unkeep("repair.climb.n1")
        await store.unkeep("repair.climb.n1")  # none there: nothing to do
        assert await store.kept("repair.climb.n1") is None and await store.kept("repair.auto.n1") == "REPAIR.AUTO.N1"
