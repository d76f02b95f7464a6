"""Placement that knows the fabric (decide/topology.py, the `topology:` config section and a job's `topology:` key):
table tests of the choice of nodes under the fewest switches, of placement passes with and without a fabric, of a
job that waits for fewer switches within its `wait`, and of the config's checks of the tree."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ftconsole.scheduler.decide.placement import ClusterState, Place, Wait, _choose_future, plan
from ftconsole.scheduler.decide.topology import Fabric, by_switch, fabric_of, placed_note
from ftconsole.scheduler.spec.topologyspec import TopologyRequest, TopologySettings
from tests.unit.test_placement import alloc, job, node, outcomes

# leaf1: n01-n04, leaf2: n05-n08 (both under spineA), leaf3: n09-n10; core above spineA and leaf3
FABRIC = Fabric.of(
    {"leaf1": ["n01", "n02", "n03", "n04"], "leaf2": ["n05", "n06", "n07", "n08"], "leaf3": ["n09", "n10"]},
    {"leaf1": "spineA", "leaf2": "spineA", "spineA": "core", "leaf3": "core"},
)
ALL = [f"n{i:02d}" for i in range(1, 11)]


@pytest.mark.parametrize(
    ("fitting", "n", "chosen"),
    [
        (ALL, 1, ["n09"]),  # the smallest leaf that holds it
        (ALL, 2, ["n09", "n10"]),
        (ALL, 3, ["n01", "n02", "n03"]),  # leaf1 and leaf2 tie: by name
        (ALL, 4, ["n01", "n02", "n03", "n04"]),
        (ALL, 6, ["n01", "n02", "n03", "n04", "n05", "n06"]),  # under spineA, two leaves, the fullest first
        (ALL, 9, ALL[:9]),  # under core
        (["n04", "n05", "n06", "n09"], 2, ["n05", "n06"]),  # one leaf over fewer-free nodes of two
        (["n01", "n05", "n09", "n10"], 3, ["n09", "n10", "n01"]),  # core: leaf3 whole, then one more leaf
        (["n01", "n05", "n06", "n02", "n03"], 4, ["n01", "n02", "n03", "n05"]),  # spineA: fullest leaf first
        (["n01", "x1", "x2"], 2, ["n01", "x1"]),  # nodes under no leaf: each its own; no switch holds them
        (["n01"], 2, None),
    ],
)
def test_the_fewest_switches_best_fit_within(fitting: list[str], n: int, chosen: list[str] | None) -> None:
    assert FABRIC.choose(fitting, n) == chosen


def test_where_it_went_is_said() -> None:
    assert FABRIC.describe(["n01", "n02"]) == "under leaf1"
    assert FABRIC.describe(["n01", "n05"]) == "under 2 leaf switches (leaf1, leaf2) below spineA"
    assert FABRIC.describe(["n01", "n10"]) == "under 2 leaf switches (leaf1, leaf3) below core"
    assert FABRIC.describe(["n01", "x1"]) == "under 2 leaf switches ((x1), leaf1) (no one switch above them)"
    assert placed_note(FABRIC, None, ["n01", "n02"]) == ", under leaf1 (the fewest switches free)"
    assert placed_note(FABRIC, TopologyRequest(max_switches=1), ["n01", "n02"]).endswith("(within its max_switches 1)")
    late = placed_note(FABRIC, TopologyRequest(max_switches=1, wait=60), ["n01", "n05"])
    assert late.endswith("(more than its max_switches 1: its topology.wait is over)")
    assert placed_note(None, None, ["n01", "n05"]) == placed_note(FABRIC, None, ["n01"]) == ""


# three leaves of two 8-GPU nodes each; n01 and n03 have 4 GPUs taken
SIX = tuple(node(f"n{i:02d}") for i in range(1, 7))
TREE = Fabric.of({"leaf1": ["n01", "n02"], "leaf2": ["n03", "n04"], "leaf3": ["n05", "n06"]}, {})
BUSY = (alloc("a", "n01", range(4)), alloc("b", "n03", range(4)))


def test_a_pass_puts_each_two_node_job_under_one_switch_while_one_exists() -> None:
    queue = [job("j1", 4, 2, t=1), job("j2", 4, 2, t=2), job("j3", 8, 2, t=3), job("j4", 4, 2, t=4)]
    blind = outcomes(plan(ClusterState(SIX, BUSY), queue, 0.0))
    assert blind["j1"] == "n01[4-7] n03[4-7]"  # best fit alone spans two switches
    placed = outcomes(plan(ClusterState(SIX, BUSY, TREE), queue, 0.0))
    assert placed == {"j1": "n01[4-7] n02[0-3]", "j2": "n03[4-7] n04[0-3]", "j3": "n05[0-7] n06[0-7]",
                      "j4": "n02[4-7] n04[4-7]"}  # fmt: skip  # the last one: no switch has two nodes free


def test_max_switches_waits_within_its_wait_then_takes_what_is_free() -> None:
    full = (*BUSY, alloc("c", "n02", range(8)), alloc("d", "n04", range(8)), alloc("e", "n06", range(8)))
    strict = dataclasses.replace(job("j", 4, 2), max_switches=1, switches_until=100.0)
    (waits,) = plan(ClusterState(SIX, full, TREE), [strict], 50.0)
    assert isinstance(waits, Wait) and "under at most 1 leaf switch (topology.max_switches" in waits.reason
    (placed,) = plan(ClusterState(SIX, full, TREE), [strict], 100.0)  # its wait is over
    assert isinstance(placed, Place) and [n for n, _ in placed.nodes] == ["n01", "n03"]
    forever = dataclasses.replace(strict, switches_until=None)
    assert isinstance(plan(ClusterState(SIX, full, TREE), [forever], 1e9)[0], Wait)
    two = dataclasses.replace(strict, max_switches=2)
    assert isinstance(plan(ClusterState(SIX, full, TREE), [two], 50.0)[0], Place)


def test_the_heads_reservation_is_under_one_switch_too() -> None:
    """The nodes the head is kept (backfill keeps off them): under one leaf where the free nodes allow it."""
    free = {"n01": set(range(8)), "n03": set(range(8)), "n04": set(range(8))}
    cand = job("head", 8, 2).candidates[0]
    assert sorted(_choose_future(free, free, 2, cand)) == ["n01", "n03"]
    assert sorted(_choose_future(free, free, 2, cand, TREE)) == ["n03", "n04"]
    # a head that waits for one switch is kept the nodes of the first leaf that frees whole, not the first two nodes
    ends = {"n01": 10.0, "n03": 20.0, "n02": 30.0, "n04": 40.0, "n05": 40.0, "n06": 40.0}
    running = tuple(alloc(f"r{name}", name, range(8), when) for name, when in ends.items())
    head = job("head", 8, 2, t=1)
    assert outcomes(plan(ClusterState(SIX, running, TREE), [head], 0.0))["head"] == "capacity@20"
    strict = dataclasses.replace(head, max_switches=1)
    assert outcomes(plan(ClusterState(SIX, running, TREE), [strict], 0.0))["head"] == "capacity@30"


@pytest.mark.parametrize(
    ("switches", "said"),
    [
        ({"l1": {"nodes": "n[01-02]"}, "s": {"switches": ["l1", "l9"]}}, "switch 'l9' is not defined"),
        ({"l1": {"nodes": "n[01-02]"}, "l2": {"nodes": "n02"}}, "node n02 is already under leaf 'l1'"),
        ({"l1": {"nodes": "n[01-03]"}}, "node(s) n03 not in nodes"),
        ({"l1": {"nodes": "n01"}, "a": {"switches": ["l1"]}, "b": {"switches": ["l1"]}}, "already under 'a'"),
        ({"l1": {"nodes": "n01"}, "a": {"switches": ["b"]}, "b": {"switches": ["a"]}}, "the tree has a cycle"),
    ],
)
def test_the_tree_is_checked(switches: dict[str, Any], said: str) -> None:
    found = TopologySettings.model_validate({"switches": switches}).problems({"n01", "n02"})
    assert any(said in message for _, message in found), found


def test_a_switch_has_nodes_or_switches() -> None:
    for bad in ({}, {"nodes": "n01", "switches": ["x"]}, {"switches": []}):
        with pytest.raises(ValueError, match=r"either nodes|switches is empty"):
            TopologySettings.model_validate({"switches": {"s": bad}})


def test_a_job_that_fits_one_block_stays_inside_one() -> None:
    """Blocks (NVLink domains) first, then the fewest leaves inside: leaf1 holds 2 fitting nodes of two blocks;
    the block nvl-b holds 2 under two leaves; it wins, as NVLink beats the switch."""
    fabric = Fabric.of(
        {"leaf1": ["n01", "n02", "n03"], "leaf2": ["n04", "n05", "n06"]},
        {"leaf1": "spine", "leaf2": "spine"},
        {"nvl-a": ["n01"], "nvl-b": ["n02", "n04", "n05"]},
    )
    assert fabric.choose(["n01", "n02", "n04", "n05"], 2) == ["n04", "n05"]  # inside nvl-b, under one leaf
    assert fabric.choose(["n01", "n02", "n04"], 2) == ["n02", "n04"]  # nvl-b, across the leaves
    assert fabric.choose(["n01", "n02", "n04"], 3) == ["n01", "n02", "n04"]  # no block holds it: leaves rule
    assert fabric.describe(["n04", "n05"]) == "under leaf2 in block nvl-b"
    found = TopologySettings.model_validate(
        {"blocks": {"a": {"nodes": "n[01-02]"}, "b": {"nodes": "n[02-03]"}}}
    ).problems({"n01", "n02"})
    assert [m for _, m in found] == [
        "node(s) n03 not in nodes",
        "node n02 is already in block 'a': a node is in one block",
    ]


def test_a_fabric_tests_nodes_go_by_switch_its_own_leaf_first() -> None:
    names = ["n05", "n01", "n09", "n02", "x1", "n06"]
    assert by_switch(names, FABRIC) == ["x1", "n01", "n02", "n05", "n06", "n09"]  # "(x1)" sorts first: its own
    assert by_switch(names, FABRIC, first="n06") == ["n05", "n06", "x1", "n01", "n02", "n09"]
    assert by_switch(names, None) == names
    assert fabric_of(None) is None


def test_max_switches_takes_the_fewest_leaves_over_the_lowest_switch_and_the_block() -> None:
    """(review) A low switch needing many leaves, or a block spanning leaves, gives way to a placement under the
    leaves asked for, where one exists."""
    fabric = Fabric.of(
        {"a": ["a1"], "b": ["b1", "b2"], "c": ["c1", "c2"], "d": ["d1"]},
        {"a": "spine1", "d": "spine1", "b": "spine2", "c": "spine2", "spine1": "core", "spine2": "core"},
    )
    fitting = ["a1", "d1", "b1", "b2", "c1", "c2"]
    assert len(fabric.leaves(fabric.choose(fitting, 4) or [])) == 2  # spine2: b and c
    blocked = Fabric.of({"L1": ["a1", "a2", "a3"], "L2": ["b1"]}, {}, {"nvl": ["a1", "b1"]})
    assert blocked.choose(["a1", "b1", "a2", "a3"], 2) == ["a1", "b1"]  # the block holds it: NVLink first
    assert blocked.choose(["a1", "b1", "a2", "a3"], 2, max_leaves=1) == ["a1", "a2"]  # one leaf asked for
    assert blocked.fullest(["a1", "b1"], 2, 1) is None


def test_a_head_whose_switches_can_never_be_met_waits_alone_and_holds_no_one() -> None:
    """(review) Three leaves of one node: 2 nodes under 1 switch can never be; the job says so and blocks nothing."""
    three = Fabric.of({"l1": ["n01"], "l2": ["n02"], "l3": ["n03"]}, {})
    nodes = tuple(node(f"n{i:02d}") for i in range(1, 4))
    head = dataclasses.replace(job("head", 8, 2, t=1), max_switches=1)
    small = job("small", 8, 1, t=2)
    decisions = {d.job_id: d for d in plan(ClusterState(nodes, (), three), [head, small], 0.0)}
    assert isinstance(decisions["head"], Wait) and "no 1 leaf switch of the fabric hold" in decisions["head"].reason
    assert isinstance(decisions["small"], Place)
    # feasible later but at no known time (what runs has no end): it holds no one back either
    tree = Fabric.of({"l1": ["n01", "n02"], "l2": ["n03"]}, {})
    running = (alloc("r", "n01", range(8)),)
    decisions = {d.job_id: d for d in plan(ClusterState(nodes, running, tree), [head, small], 0.0)}
    assert isinstance(decisions["head"], Wait) and isinstance(decisions["small"], Place)


def test_what_placement_goes_by_is_the_declared_fabric_and_what_was_found_where_nothing_is_declared() -> None:
    from ftconsole.scheduler.decide.topology import fabric_of, merged_fabric
    from ftconsole.scheduler.spec.topologyspec import TopologySettings

    found = {"leaves": {"sw-a": ["n1", "n2"], "sw-b": ["n3", "n4"]}, "uplinks": {"sw-a": ["spine2", "spine1"]},
             "nvlink_domains": {"clique-1": ["n1", "n2"]}}  # fmt: skip
    bare = TopologySettings.model_validate({"discover": "1h"})
    merged = merged_fabric(bare, found)
    assert merged["source"] == {"switches": "found", "blocks": "found"}
    assert merged["leaves"] == found["leaves"] and merged["blocks"] == {"clique-1": ["n1", "n2"]}
    assert merged["parents"] == {"sw-a": "spine1"}  # the first of its uplinks stands for them
    fabric = fabric_of(bare, found)
    assert fabric is not None and fabric.choose(["n1", "n3", "n4"], 2) == ["n3", "n4"]
    declared = TopologySettings.model_validate({"switches": {"l1": {"nodes": "n[1-4]"}}, "discover": "1h"})
    merged = merged_fabric(declared, found)
    assert merged["source"] == {"switches": "declared", "blocks": "found"} and merged["leaves"] == {
        "l1": ["n1", "n2", "n3", "n4"]
    }
    assert merged_fabric(bare, None)["source"] == {"switches": "none", "blocks": "none"}


def test_segments_fill_whole_groups_each_inside_one_block() -> None:
    from ftconsole.scheduler.decide.topology import Fabric

    fabric = Fabric.of({"l1": ["a1", "a2", "a3", "b1"], "l2": ["b2", "b3", "c1", "c2"]}, {},
                       {"A": ["a1", "a2", "a3"], "B": ["b1", "b2", "b3"], "C": ["c1", "c2"]})  # fmt: skip
    every = ["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"]
    assert fabric.segments(every, 3, 3) == ["a1", "a2", "a3"]  # one block holds it: the first of the fullest fit
    picked = fabric.segments(every, 4, 2)
    assert picked is not None and len(picked) == 4
    for group in (picked[:2], picked[2:]):  # each group of 2 inside one block
        assert len({fabric.block_of[n] for n in group}) == 1
    six = fabric.segments(every, 6, 3)
    assert six is not None and six[:3] == ["a1", "a2", "a3"] and sorted(six[3:]) == ["b1", "b2", "b3"]
    assert fabric.segments(every, 8, 4) is None  # no block holds 4
    assert fabric.segments(every, 5, 2) is None  # 2 does not divide 5
    assert fabric.segments(["a1", "b1", "c1", "c2"], 2, 2) == ["c1", "c2"]  # a1 and b1 are in two blocks
    assert Fabric.of({"l1": every}, {}).segments(every, 2, 2) is None  # no blocks


def test_a_job_in_segments_is_placed_in_blocks_and_one_that_never_fits_says_why() -> None:
    nodes = tuple(node(n) for n in ("n1", "n2", "n3", "n4", "n5", "n6"))  # n6 in no block
    fabric = Fabric.of({}, {}, {"A": ["n1", "n2"], "B": ["n3", "n4", "n5"]})
    pairs = dataclasses.replace(job("pairs", 8, 4), segment=2)
    one = job("one", 8, 1)
    triples = dataclasses.replace(job("triples", 8, 6), segment=3)
    pairs, one = dataclasses.replace(pairs, submitted_at=-2.0), dataclasses.replace(one, submitted_at=-1.0)
    first, second, third = plan(ClusterState(nodes, (), fabric), [pairs, one, triples], 0.0)  # in submit order
    assert isinstance(first, Place) and first.job_id == "pairs"
    placed = [n for n, _ in first.nodes]
    assert [{fabric.block_of[n] for n in pair} for pair in (placed[:2], placed[2:])] == [{"A"}, {"B"}]
    assert isinstance(second, Place) and second.nodes[0][0] == "n5"  # the first left, after the pairs
    assert isinstance(third, Wait) and "2 groups of 3 nodes, each inside one block (topology.segment)" in third.reason
    assert "the blocks do not hold that many nodes" in third.reason
    (blind,) = plan(ClusterState(nodes, ()), [pairs], 0.0)  # no fabric: never
    assert isinstance(blind, Wait) and "the cluster has no blocks" in blind.reason


@pytest.mark.parametrize(
    ("topology", "extra", "said"),
    [
        ({"segment": 3}, {}, "topology.segment: segment 3 does not divide nodes: 4"),
        ({"segment": 2}, {"fault_tolerance": {"elastic": {"min_nodes": 2}}}, "an elastic job's count changes"),
        ({}, {}, "give max_switches (at most that many leaf switches), segment"),
        ({"segment": 2, "wait": "1m"}, {}, "wait is how long max_switches is waited for"),
    ],
)
def test_a_segment_that_cannot_group_the_nodes_is_refused(
    topology: dict[str, Any], extra: dict[str, Any], said: str
) -> None:
    from ftconsole.scheduler.spec.jobspec import JobSpec

    with pytest.raises(ValueError) as caught:
        JobSpec.model_validate(
            {"name": "j", "command": "x", "nodes": 4, "mode": "pytorch", "topology": topology, **extra}
        )
    assert said in str(caught.value)
    assert JobSpec.model_validate({"name": "j", "command": "x", "nodes": 4, "mode": "pytorch",
                                   "topology": {"segment": 2}}).topology == TopologyRequest(segment=2)  # fmt: skip


def test_a_segment_of_zero_is_refused_in_words(tmp_path: Any) -> None:
    """From a file, as `submit` and `check` read it: the problem with its line, not a ZeroDivisionError."""
    from ftconsole.scheduler.errors import ConfigError
    from ftconsole.scheduler.spec.jobspec import load_jobspec

    path = tmp_path / "job.yaml"
    path.write_text("name: j\ncommand: x\nnodes: 4\nmode: pytorch\ntopology: {segment: 0}\n")
    with pytest.raises(ConfigError) as caught:
        load_jobspec(path)
    assert "job.yaml:5: topology.segment: must be at least 1, not 0" in str(caught.value)


def test_a_topology_the_cluster_cannot_give_is_refused_at_submit() -> None:
    import types

    from ftconsole.scheduler.errors import UsageError
    from ftconsole.scheduler.rules import Rules
    from ftconsole.scheduler.spec.jobspec import JobSpec

    def rules(topology: dict[str, Any] | None) -> Rules:
        tree = None if topology is None else TopologySettings.model_validate(topology)
        config = types.SimpleNamespace(topology=tree, scheduler=None, admins=[])
        return Rules(types.SimpleNamespace(store=None, config=config, all_nodes=[]), placer=None)  # type: ignore[arg-type]

    def spec(topology: dict[str, Any]) -> JobSpec:
        return JobSpec.model_validate(
            {"name": "j", "command": "x", "nodes": 2, "mode": "pytorch", "topology": topology}
        )

    with pytest.raises(UsageError, match="this cluster declares no topology"):
        rules(None)._topology_known(spec({"max_switches": 1}))
    with pytest.raises(UsageError, match=r"declares no blocks \(topology.blocks\) and does not discover them"):
        rules({"switches": {"l1": {"nodes": "n1"}}})._topology_known(spec({"segment": 2}))
    rules({"switches": {"l1": {"nodes": "n1"}}})._topology_known(spec({"max_switches": 1}))
    rules({"discover": "1h"})._topology_known(spec({"segment": 2}))  # blocks may be found
    rules({"blocks": {"b": {"nodes": "n1"}}})._topology_known(spec({"segment": 2}))
