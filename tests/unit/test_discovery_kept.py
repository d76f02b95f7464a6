"""What discovery found is used where the config declares nothing (`topology.discover`): kept in the store for the
next start, and a node that could not be asked keeps what was found of it before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler import discovery
from ftconsole.scheduler.decide.topology import fabric_of
from ftconsole.scheduler.spec.topologyspec import TopologySettings
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt

FOUND = {"leaves": {"sw-a": ["n1", "n2"], "sw-b": ["n3", "n4"]}, "nvlink_domains": {}, "uplinks": {"sw-a": ["sp"]},
         "source": {}}  # fmt: skip


@dataclass
class Config:
    topology: TopologySettings


@dataclass
class Service:
    config: Config
    store: Store
    found_fabric: tuple[dict[str, Any], float] | None = None


async def test_what_was_found_is_kept_for_the_next_start_and_said_once(store_at: StoreAt) -> None:
    config = Config(TopologySettings.model_validate({"discover": "1h"}))
    async with await Store.open(store_at()) as store:
        service = Service(config, store)
        await discovery._adopt(service, FOUND, 100.0)
        await discovery._adopt(service, FOUND, 200.0)  # the same again: no second event
        events = [e for e in await store.events(limit=100) if e.kind == "TopologyFound"]
        assert [e.message for e in events] == [
            "placement goes by the fabric the nodes told: 2 leaf switches (sw-a: n1, n2; sw-b: n3, n4)"
        ]
        later = Service(config, store)  # the next start
        await discovery.recall(later)
        assert later.found_fabric == (FOUND, 200.0)
        fabric = fabric_of(config.topology, later.found_fabric[0])
        assert fabric is not None and fabric.leaf("n3") == "sw-b" and fabric.parent == {"sw-a": "sp"}


def test_a_node_that_could_not_be_asked_keeps_its_leaf_and_one_that_told_nothing_loses_it() -> None:
    now = {"leaves": {"sw-a": ["n1"], "sw-b": ["n3"]}, "nvlink_domains": {}, "uplinks": {}, "source": {}}
    kept = discovery.kept_for(now, (FOUND, 1.0), {"n2": "connection refused"})
    assert kept["leaves"] == {"sw-a": ["n1", "n2"], "sw-b": ["n3"]}  # n4 was asked and said nothing
    assert kept["uplinks"] == {"sw-a": ["sp"]}
    assert discovery.kept_for(now, None, {"n2": "refused"}) == now


async def test_a_malformed_value_in_the_store_is_not_used(store_at: StoreAt) -> None:
    config = Config(TopologySettings.model_validate({"discover": "1h"}))
    async with await Store.open(store_at()) as store:
        for bad in ('{"found": {"leaves": ["l1"]}, "at": 1}', '{"found": {"leaves": {"l1": [1]}}, "at": 1}',
                    '{"found": {"nvlink_domains": {"d": null}}, "at": 1}', "not json", '{"at": 1}'):  # fmt: skip
            await store.keep(discovery.KEPT, bad)
            service = Service(config, store)
            await discovery.recall(service)
            assert service.found_fabric is None, bad


def test_leaves_from_ibnetdiscover_stay_when_it_told_nothing_this_time() -> None:
    before = {"leaves": {"ib-1": ["n1", "n2"]}, "nvlink_domains": {}, "uplinks": {},
              "source": {"n1": "ibnetdiscover", "n2": "ibnetdiscover"}}  # fmt: skip
    unasked = dict.fromkeys(discovery.nodes_told_by((before, 1.0), "ibnetdiscover"), "no ibnetdiscover")
    now = {"leaves": {}, "nvlink_domains": {}, "uplinks": {}, "source": {}}
    kept = discovery.kept_for(now, (before, 1.0), unasked)
    assert kept["leaves"] == {"ib-1": ["n1", "n2"]} and kept["source"] == before["source"]


async def test_a_fabric_that_is_gone_is_said(store_at: StoreAt) -> None:
    config = Config(TopologySettings.model_validate({"discover": "1h"}))
    async with await Store.open(store_at()) as store:
        service = Service(config, store)
        await discovery._adopt(service, FOUND, 1.0)
        await discovery._adopt(service, {"leaves": {}, "nvlink_domains": {}, "uplinks": {}, "source": {}}, 2.0)
        said = [e.message for e in await store.events(limit=100) if e.kind == "TopologyFound"]
        assert len(said) == 2 and said[1].startswith("the nodes tell no fabric now")
