"""`topology.block_sizes` (Slurm's `BlockSizes`): a job of several nodes spans one group of blocks at most, the blocks
taken in their order `size / base` at a time. Table tests of the choice, a placement pass that waits rather than span
two groups (and its reservation's future), and the checks of the config and of a job at submit."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from ftconsole.scheduler.decide.placement import ClusterState, Place, Wait, _choose_future, plan
from ftconsole.scheduler.decide.topology import Fabric, placed_note
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.rules import Rules
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.spec.topologyspec import TopologySettings
from tests.unit.test_placement import alloc, job, node

# four blocks of four nodes, in their order A B C D; groups of 8: (A, B) and (C, D)
BLOCKS = {b: [f"{b.lower()}{i}" for i in range(1, 5)] for b in "ABCD"}
EVERY = [n for nodes in BLOCKS.values() for n in nodes]
SIZED = Fabric.of({}, {}, BLOCKS, (4, 8))


@pytest.mark.parametrize(
    ("fitting", "n", "chosen"),
    [
        (EVERY, 1, ["a1"]),  # one node: any block
        (EVERY, 3, ["a1", "a2", "a3"]),  # one block holds it
        (EVERY, 6, ["a1", "a2", "a3", "a4", "b1", "b2"]),  # A and B, a group of 8
        (["a1", "a2", "b1", "c1", "c2", "c3", "d1"], 4, ["c1", "c2", "c3", "d1"]),  # (A, B) has 3 fitting: (C, D)
        (["a1", "a2", "b1", "b2", "c1", "c2", "c3", "d1"], 4, ["a1", "a2", "b1", "b2"]),  # both hold 4: the first
        (["a1", "b2", "b3", "c1", "c2", "c3", "c4", "d1"], 3, ["c1", "c2", "c3"]),  # best fit: one block first
        (["a1", "b1", "c1", "d1"], 3, None),  # 4 nodes fit, but no group holds 3 of them: it waits
        (EVERY, 9, None),  # more than the largest group
    ],
)
def test_a_job_spans_one_group_of_blocks_at_most(fitting: list[str], n: int, chosen: list[str] | None) -> None:
    assert SIZED.choose(fitting, n) == chosen


def test_a_job_that_fits_one_block_goes_inside_one_whatever_the_sizes() -> None:
    """Blocks of 18 nodes, sizes [16, 32]: a 17-node job is larger than the base, but nvl3 holds it whole: it goes
    there, not across nvl1 and nvl2 (10 free each)."""
    blocks = {f"nvl{b}": [f"n{b}-{i:02d}" for i in range(1, 19)] for b in (1, 2, 3, 4)}
    fabric = Fabric.of({}, {}, blocks, (16, 32))
    fitting = blocks["nvl1"][:10] + blocks["nvl2"][:10] + blocks["nvl3"]
    picked = fabric.choose(fitting, 17)
    assert picked is not None and {fabric.block_of[n] for n in picked} == {"nvl3"}


def test_max_switches_picks_the_group_that_meets_it() -> None:
    """(A, B) holds 4 fitting nodes under two leaves, (C, D) 4 under one: with max_switches 1, (C, D), though the
    other group comes first."""
    leaves = {"l1": ["a1", "a2"], "l2": ["b1", "b2"], "l3": ["c1", "c2", "d1", "d2"]}
    fabric = Fabric.of(leaves, {}, BLOCKS, (4, 8))
    fitting = ["a1", "a2", "b1", "b2", "c1", "c2", "d1", "d2"]
    assert fabric.choose(fitting, 4) == ["a1", "a2", "b1", "b2"]
    assert fabric.choose(fitting, 4, max_leaves=1) == ["c1", "c2", "d1", "d2"]
    assert fabric.choose(fitting[:4], 4, max_leaves=1) == ["a1", "a2", "b1", "b2"]  # none meets it: the usual choice


def test_without_block_sizes_the_same_job_spans_any_blocks() -> None:
    plain = Fabric.of({}, {}, BLOCKS)
    assert plain.choose(["a1", "b1", "c1", "d1"], 3) == ["a1", "b1", "c1"]
    assert plain.choose(EVERY, 9) == EVERY[:9]


def test_segments_stay_inside_one_group_too() -> None:
    picked = SIZED.segments(EVERY, 8, 4)
    assert picked is not None and {SIZED.block_of[n] for n in picked} == {"A", "B"}
    assert SIZED.segments(["a1", "a2", "c1", "c2"], 4, 2) is None  # two pairs, but in two groups
    assert Fabric.of({}, {}, BLOCKS).segments(["a1", "a2", "c1", "c2"], 4, 2) == ["a1", "a2", "c1", "c2"]


def test_groups_and_what_is_said_of_a_placement() -> None:
    assert SIZED.groups == [(4, [("A",), ("B",), ("C",), ("D",)]), (8, [("A", "B"), ("C", "D")])]
    assert SIZED.group_size(["a1", "a2"]) == 4 and SIZED.group_size(["a1", "b1"]) == 8
    assert SIZED.group_size(["b1", "c1"]) is None  # two groups: never chosen
    note = placed_note(SIZED, None, ["a1", "b1"])
    assert note.endswith("inside one group of blocks of at most 8 nodes (topology.block_sizes))"), note
    odd = Fabric.of({}, {}, {"A": ["a1"], "B": ["b1"], "C": ["c1"]}, (1, 2))
    assert odd.groups[1] == (2, [("A", "B"), ("C",)])  # the last group has fewer blocks


def test_a_pass_waits_rather_than_span_two_groups_and_its_future_agrees() -> None:
    nodes = tuple(node(n) for n in EVERY)
    busy = tuple(
        alloc(f"x{n}", n, range(8)) for n in ("a3", "a4", "b2", "b3", "b4", "c2", "c3", "c4", "d2", "d3", "d4")
    )
    # free: a1, a2, b1 in (A, B); c1, d1 in (C, D): 5 nodes, but no group holds 4 of them
    (waits,) = plan(ClusterState(nodes, busy, SIZED), [job("four", 8, 4)], 0.0)
    assert isinstance(waits, Wait), waits
    assert "inside one group of blocks of at most 8 nodes (topology.block_sizes)" in waits.reason, waits.reason
    (placed,) = plan(ClusterState(nodes, busy, SIZED), [job("three", 8, 3)], 0.0)
    assert isinstance(placed, Place) and sorted(n for n, _ in placed.nodes) == ["a1", "a2", "b1"]
    free = {n: set(range(8)) for n in ("a1", "a2", "b1", "c1", "d1")}
    assert _choose_future(free, free, 4, job("four", 8, 4).candidates[0], SIZED) == {}
    assert len(_choose_future(free, free, 4, job("four", 8, 4).candidates[0], Fabric.of({}, {}, BLOCKS))) == 4


@pytest.mark.parametrize(
    ("sizes", "said"),
    [
        ([], "block_sizes is empty"),
        ([8, 4], "smallest (a block's) first"),
        ([4, 4], "give each size once"),
        ([4, 12], "12 is not a power-of-two multiple of the base size 4 (groups of 2, 4, 8... blocks: 8, 16, 32...)"),
        ([4, 10], "10 is not a power-of-two multiple"),
        ([0], "greater than or equal to 1"),
    ],
)
def test_block_sizes_are_checked(sizes: list[int], said: str) -> None:
    with pytest.raises(ValueError) as caught:
        TopologySettings.model_validate({"blocks": {"A": {"nodes": "a[1-4]"}}, "block_sizes": sizes})
    assert said in str(caught.value)


def test_block_sizes_need_blocks_that_hold_the_base() -> None:
    known = {f"a{i}" for i in range(1, 5)} | {"b1"}
    fine = TopologySettings.model_validate({"blocks": {"A": {"nodes": "a[1-4]"}}, "block_sizes": [4, 16]})
    assert fine.problems(known) == []
    small = TopologySettings.model_validate(
        {"blocks": {"A": {"nodes": "a[1-4]"}, "B": {"nodes": "b1"}}, "block_sizes": [4, 8]}
    )
    assert small.problems(known) == [
        (("topology", "blocks", "B", "nodes"), "block 'B' has 1 node(s), fewer than the base size 4 (the first of "
         "topology.block_sizes)"),
    ]  # fmt: skip
    none = TopologySettings.model_validate({"block_sizes": [4]})
    assert "none are declared (topology.blocks) or discovered" in none.problems(known)[0][1]
    assert TopologySettings.model_validate({"block_sizes": [4], "discover": "1h"}).problems(known) == []


def test_a_job_larger_than_the_largest_group_is_refused_at_submit() -> None:
    def rules(topology: dict[str, Any]) -> Rules:
        config = types.SimpleNamespace(topology=TopologySettings.model_validate(topology), scheduler=None, admins=[])
        return Rules(types.SimpleNamespace(store=None, config=config, all_nodes=[]), placer=None)  # type: ignore[arg-type]

    def spec(nodes: int, **extra: Any) -> JobSpec:
        return JobSpec.model_validate({"name": "j", "command": "x", "nodes": nodes, "mode": "pytorch", **extra})

    sized = rules({"blocks": {b: {"nodes": f"{b.lower()}[1-4]"} for b in "ABCD"}, "block_sizes": [4, 8]})
    with pytest.raises(UsageError) as caught:
        sized._topology_known(spec(9))
    assert str(caught.value) == (
        "nodes: 9: a job of this cluster spans at most 8 nodes, a group of blocks (topology.block_sizes [4, 8], as "
        "Slurm's BlockSizes): ask for fewer nodes"
    )
    sized._topology_known(spec(8))
    elastic = {"fault_tolerance": {"elastic": {"min_nodes": 6, "max_nodes": 12}}}
    sized._topology_known(spec(12, **elastic))  # it may run on 6 to 8
    with pytest.raises(UsageError, match="nodes: 9"):
        sized._topology_known(spec(12, fault_tolerance={"elastic": {"min_nodes": 9}}))


def test_a_head_no_group_can_ever_hold_waits_alone_and_holds_no_one() -> None:
    """The nodes 3 and 4 of every block are down: 8 healthy nodes, 4 in each group of 8, so a 6-node job can never
    run. It waits, saying why, and the 1-node job behind it runs on the idle cluster."""
    nodes = tuple(node(n, ok=not n.endswith(("3", "4"))) for n in EVERY)
    big, small = job("big", 8, 6, t=-2.0), job("small", 8, 1, t=-1.0)
    first, second = plan(ClusterState(nodes, (), SIZED), [big, small], 0.0)
    assert isinstance(first, Wait) and "no group holds that many nodes that could hold it" in first.reason
    assert "inside one group of blocks of at most 8 nodes (topology.block_sizes)" in first.reason
    assert isinstance(second, Place), second
    unknown = Fabric.of({}, {}, {}, (4, 8))  # topology.discover has found no blocks yet
    (waits,) = plan(ClusterState(nodes, (), unknown), [job("pair", 8, 2)], 0.0)
    assert isinstance(waits, Wait) and "no blocks are known (yet: topology.discover)" in waits.reason


def test_an_elastic_head_reserves_what_one_group_holds_and_jobs_run_behind_it() -> None:
    """An elastic job of up to 12 nodes (at least 6) at the head, every node busy until t=100: its reservation is
    one group's 8 nodes at t=100, not every node for ever, so a 10 s job behind it runs on a node it does not need."""
    nodes = tuple(node(n) for n in EVERY)
    busy = (*(alloc(f"x{n}", n, range(8), ends=100.0) for n in EVERY[:12]), alloc("xd4", "d4", range(8)))
    head = dataclasses.replace(job("elastic", 8, 12, t=-2.0), min_nodes=6)
    short = dataclasses.replace(job("short", 8, 1, t=-1.0), max_runtime=10.0)
    first, second = plan(ClusterState(nodes, busy, SIZED), [head, short], 0.0)
    assert isinstance(first, Wait) and first.earliest_start == 100.0, first
    assert isinstance(second, Place), second
