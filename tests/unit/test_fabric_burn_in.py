"""The fabric test as a node test (scheduler/nodegate.py `fabric_test`), on a real store: burn-in takes a node in
service out only where two partners each saw it slow; a node out of service is kept out on one partner's word.
The streams are scripted (`nodegate.check` replaced by the real judge over given rates), no node is reached."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler import nodegate
from ftconsole.scheduler.fabric import FabricReport, Stream, judge, shifts
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.nodetests import NodeTestReport
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node
from ftconsole.scheduler.store.db import Store
from tests.unit.test_metrics import NoTransport

NOW = 100_000.0
SLOW, FAST, MIN_GBPS = 0.05, 9.0, 0.5


class Scripted:
    """`nodegate.check`'s stand-in: every stream between the nodes at FAST, but those out of `slow_out` (a node
    whose link out is slow), and no stream at all to or from a node of `broken`."""

    def __init__(self, slow_out: set[str], broken: Sequence[str] = ()) -> None:
        self.slow_out, self.broken = slow_out, set(broken)
        self.sets: list[list[str]] = []

    async def __call__(self, transport: Any, python: str, nodes: Sequence[Node], *args: Any) -> FabricReport:
        names = [n.name for n in nodes]
        self.sets.append(names)
        found = [
            Stream(src, dst, None if {src, dst} & self.broken else SLOW if src in self.slow_out else FAST)
            for i, src in enumerate(names)
            for dst in (names[(i + s) % len(names)] for s in shifts(len(names)))
        ]
        broken = {n: f"cannot run on {n}: refused" for n in self.broken if n in names}
        results = judge(names, found, broken, MIN_GBPS, f"baseline {MIN_GBPS} Gbit/s (min_gbps)", 1.0)
        return FabricReport(tuple(names), tuple(found), MIN_GBPS, "", results)


@pytest.fixture
def burned(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.Event]:
    """Set once a burn-in's report is recorded (and the node isolated, where it failed)."""
    done = asyncio.Event()
    real = nodegate.burned

    async def burned(service: ClusterService, report: NodeTestReport) -> None:
        await real(service, report)
        done.set()

    monkeypatch.setattr(nodegate, "burned", burned)
    yield done


async def service_of(tmp_path: Path, store: Store, count: int, admin: dict[str, NodeState] | None = None
                     ) -> ClusterService:  # fmt: skip
    config = ClusterConfig.model_validate({
        "nodes": [{"name": f"n[1-{count}]", "host": f"127.0.0.[1-{count}]", "pool": "gpu"}],
        "node_tests": {"fabric": {"seconds": "1s", "min_gbps": MIN_GBPS}},
        "probes": {"burn_in_interval": "1d"},
    })  # fmt: skip
    healthy = [NodeHealth(f"n{i}", NodeState.HEALTHY, (), since=NOW) for i in range(1, count + 1)]
    await store.save_nodes([(h, []) for h in healthy])
    service = ClusterService(LoadedConfig(config, tmp_path / "cluster.yaml"), store, NoTransport(), clock=lambda: NOW)
    for name, state in (admin or {}).items():
        await service._set_admin(name, state, "by hand", "ann")
    return service


async def burn_in_n1(service: ClusterService, done: asyncio.Event) -> tuple[NodeHealth, str]:
    """Burn-in of n1 (the first of the least recently tested): its health after, and its fabric event's line."""
    assert await nodegate.burn_in(service, queued=False) == ["n1"]
    await asyncio.wait_for(done.wait(), 10)
    (event,) = await service.store.events(node="n1", kind="tested", limit=5)
    return (await service.store.all_node_health())["n1"], event.message


@pytest.mark.parametrize(
    ("count", "broken", "partners"),
    [(2, (), "n2"), (3, ("n3",), "n2, n3")],  # one partner only; two partners, one of which could not take part
)
async def test_burn_in_keeps_a_node_in_service_that_only_one_partner_saw_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, burned: asyncio.Event, count: int, broken: tuple[str, ...],
    partners: str,
) -> None:  # fmt: skip
    scripted = Scripted({"n1"}, broken)
    monkeypatch.setattr(nodegate, "check", scripted)
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, count)
        health, line = await burn_in_n1(service, burned)
        assert scripted.sets == [[f"n{i}" for i in range(1, count + 1)]]
        assert health.admin is None and health.state is NodeState.HEALTHY
        assert line.startswith(
            "fabric: skip: only n2 saw it slow: one partner is not enough to take a node in service out (slow on its "
            "way out: sends n2 0.05 Gbit/s"
        ), line
        assert line.endswith(f"(with {partners}) (tested by scheduler (burn-in))"), line
        assert service.tester.counts[("fabric", "skip", "burn-in")] == 1


async def test_burn_in_isolates_a_node_that_two_partners_each_saw_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, burned: asyncio.Event
) -> None:
    monkeypatch.setattr(nodegate, "check", Scripted({"n1"}))
    async with await Store.open(tmp_path / "state.db") as store:
        health, line = await burn_in_n1(await service_of(tmp_path, store, 3), burned)
    assert health.admin is NodeState.ISOLATED and health.admin_by == "scheduler"
    assert health.admin_reason.startswith(
        "burn-in: node tests failed: fabric: fail: slow on its way out: sends n2 0.05 Gbit/s, n3 0.05 Gbit/s"
    ), health.admin_reason
    assert line.startswith("fabric: fail: slow on its way out") and "(with n2, n3)" in line


@pytest.mark.parametrize("state", [NodeState.ISOLATED, NodeState.DRAINED])
async def test_a_node_out_of_service_is_kept_out_on_one_partner_s_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      state: NodeState) -> None:  # fmt: skip
    monkeypatch.setattr(nodegate, "check", Scripted({"n1"}))
    async with await Store.open(tmp_path / "state.db") as store:
        service = await service_of(tmp_path, store, 2, {"n1": state})
        ((health, report),) = await nodegate.operator_resume(service, "n1", by="ann")  # resume --test
    assert health.admin is state
    (result,) = report.results
    assert result.result == "fail" and result.summary.startswith("slow on its way out: sends n2 0.05 Gbit/s")
    assert result.summary.endswith("(with n2)")
