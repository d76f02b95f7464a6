"""The fabric as placement sees it (pure): each node's leaf switch and the switches above, from the config's
`topology:` (scheduler/spec/topologyspec.py), and the choice of a multi-node job's nodes under the fewest switches.

The rule, as Slurm's tree plugin: a job whose nodes fit under one leaf switch goes under one, the leaf with the
fewest fitting nodes that still holds it (best fit: big leaves stay whole for big jobs); otherwise under the lowest
switch whose leaves hold it, using as few of its leaves as it can (the fullest first); otherwise across the whole
fabric, the fullest leaves first. Ties, and the nodes within a leaf, keep the order they came in: placement's best
fit (fewest free GPUs, then name). A node under no leaf counts as a leaf of its own.

Blocks (NVLink domains) come first: a job that fits one block goes inside one. With `block_sizes` (Slurm's
`BlockSizes`), a job of several nodes never spans more than a group of blocks: the blocks in their order, taken
`size / base` at a time (the first size is the base), the smallest size that holds the job, best fit among the
groups of that size; a job that no group holds waits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fabric:
    leaf_of: Mapping[str, str]  # node -> its leaf switch
    parent: Mapping[str, str]  # switch -> the switch above it
    block_of: Mapping[str, str] = field(default_factory=dict)  # node -> its block (an NVLink domain)
    # the blocks in their order, and the node counts of the groups of blocks a job may span (the first: a block's)
    block_order: tuple[str, ...] = ()
    block_sizes: tuple[int, ...] = ()
    # switch -> the leaves under it (itself for a leaf), and its height (leaves 0); filled in from the two above
    under: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)
    height: dict[str, int] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for leaf in set(self.leaf_of.values()):
            self.under[leaf] = frozenset({leaf})
            self.height[leaf] = 0
            at, steps, seen = self.parent.get(leaf), 1, {leaf}
            while at is not None and at not in seen:  # a cycle is the config check's to refuse
                seen.add(at)
                self.under[at] = self.under.get(at, frozenset()) | {leaf}
                self.height[at] = max(self.height.get(at, 0), steps)
                at, steps = self.parent.get(at), steps + 1

    @classmethod
    def of(
        cls,
        leaves: Mapping[str, Iterable[str]],
        parents: Mapping[str, str],
        blocks: Mapping[str, Iterable[str]] | None = None,
        block_sizes: Sequence[int] = (),
    ) -> Fabric:
        block_of = {node: block for block, nodes in (blocks or {}).items() for node in nodes}
        leaf_of = {node: leaf for leaf, nodes in leaves.items() for node in nodes}
        return cls(leaf_of, dict(parents), block_of, tuple(blocks or ()), tuple(block_sizes))

    @functools.cached_property
    def groups(self) -> list[tuple[int, list[tuple[str, ...]]]]:
        """Each of `block_sizes` with its groups of blocks: `size / base` consecutive blocks each, in block order
        (the last group may have fewer)."""
        if not self.block_sizes:
            return []
        base, order = self.block_sizes[0], self.block_order
        out = []
        for size in self.block_sizes:
            k = max(1, size // base)
            out.append((size, [order[i : i + k] for i in range(0, len(order), k)]))
        return out

    def leaf(self, node: str) -> str:
        return self.leaf_of.get(node) or f"({node})"

    def leaves(self, nodes: Iterable[str]) -> list[str]:
        """The leaf switches under `nodes`, in name order."""
        return sorted({self.leaf(n) for n in nodes})

    def choose(self, fitting: Sequence[str], n: int, max_leaves: int | None = None) -> list[str] | None:
        """`n` of the `fitting` nodes (in placement's order of preference) under the fewest leaf switches; inside
        one block (an NVLink domain) where one holds them: the one with the fewest fitting nodes. With `max_leaves`
        (a job's `topology.max_switches`): under at most that many leaves where any choice allows it, the lowest
        switch and the block giving way to it; else the usual choice (which the caller then refuses)."""
        if len(fitting) < n:
            return None
        if self.block_sizes and n > 1:
            within = None if max_leaves is None else (lambda picked: len(self.leaves(picked)) <= max_leaves)
            return self._in_a_group(fitting, n, lambda inside: self._unconfined.choose(inside, n, max_leaves), within)
        if self.block_of:
            by_block = self._by_block(fitting)
            if (block := _fewest_holding(by_block, n)) is not None:
                inside = self._under_fewest(by_block[block], n)
                if max_leaves is None or len(self.leaves(inside)) <= max_leaves:
                    return inside
        picked = self._under_fewest(fitting, n)
        if max_leaves is not None and len(self.leaves(picked)) > max_leaves:
            return self.fullest(fitting, n, max_leaves) or picked
        return picked

    def segments(self, fitting: Sequence[str], n: int, size: int) -> list[str] | None:
        """`n` of the `fitting` nodes in groups of `size`, each group inside one block (Slurm's `--segment`), the
        groups one after the other (a job's ranks fill a group before the next); None: the blocks cannot hold them.
        The fewest blocks: one that holds them all where one does (the one with the fewest fitting nodes), else the
        blocks with the most groups free first; within a block, under the fewest leaf switches."""
        if n % size or not self.block_of:
            return None
        if self.block_sizes:
            return self._in_a_group(fitting, n, lambda inside: self._unconfined.segments(inside, n, size))
        by_block = self._by_block(fitting)
        if (block := _fewest_holding(by_block, n)) is not None:
            return self._under_fewest(by_block[block], n)
        order = {block: i for i, block in enumerate(by_block)}
        picked: list[str] = []
        for block in sorted(by_block, key=lambda b: (-(len(by_block[b]) // size), order[b])):
            groups = min(len(by_block[block]) // size, (n - len(picked)) // size)
            if groups:
                picked += self._under_fewest(by_block[block], groups * size)
            if len(picked) == n:
                return picked
        return None

    def group_nodes(self, nodes: Iterable[str]) -> frozenset[str] | None:
        """The nodes of the largest group of blocks that holds all of `nodes` (where a job of them may grow); None:
        no `block_sizes`; empty: no group holds them."""
        if not self.block_sizes:
            return None
        blocks = {self.block_of.get(n) for n in nodes}
        for _, groups in reversed(self.groups):
            for group in groups:
                if blocks <= set(group):
                    return frozenset(n for n, b in self.block_of.items() if b in group)
        return frozenset()

    def group_size(self, nodes: Iterable[str]) -> int | None:
        """The smallest of `block_sizes` with a group of blocks that holds all of `nodes`; None: no sizes, or none."""
        blocks = {self.block_of.get(n) for n in nodes}
        for size, groups in self.groups:
            if any(blocks <= set(group) for group in groups):
                return size
        return None

    @functools.cached_property
    def _unconfined(self) -> Fabric:
        """This fabric without `block_sizes`: the choice within one group of blocks."""
        return dataclasses.replace(self, block_sizes=(), under={}, height={})

    def _in_a_group(
        self,
        fitting: Sequence[str],
        n: int,
        pick: Callable[[list[str]], list[str] | None],
        within: Callable[[list[str]], bool] | None = None,
    ) -> list[str] | None:
        """`pick` within one block where one holds `n`, else within one group of blocks (`block_sizes`): of the
        smallest size that holds `n`, the group with the fewest fitting nodes first (best fit); the first pick that
        is `within` (a job's max_switches) where one is, else the first pick; None: no group can."""
        by_block = self._by_block(fitting)
        levels: list[tuple[int, list[tuple[str, ...]]]] = [(s, groups) for s, groups in self.groups if n <= s]
        if (block := _fewest_holding(by_block, n)) is not None:  # one block holds it: inside one, whatever the sizes
            levels.insert(0, (n, [(block,)]))
        first: list[str] | None = None
        for _, groups in levels:
            counts = sorted((sum(len(by_block.get(b, ())) for b in group), i) for i, group in enumerate(groups))
            for count, i in counts:
                if count < n:
                    continue
                inside = set(groups[i])
                picked = pick([node for node in fitting if self.block_of.get(node) in inside])
                if picked is not None and (within is None or within(picked)):
                    return picked
                first = first or picked
        return first

    def _by_block(self, fitting: Sequence[str]) -> dict[str, list[str]]:
        """The nodes in a block by block, in the order of each block's first node in `fitting` (ties go to it)."""
        by_block: dict[str, list[str]] = {}
        for node in fitting:
            if node in self.block_of:
                by_block.setdefault(self.block_of[node], []).append(node)
        return by_block

    def fullest(self, fitting: Sequence[str], n: int, max_leaves: int) -> list[str] | None:
        """`n` of the `fitting` nodes from the fullest `max_leaves` leaves, wherever they are; None: they cannot
        hold it."""
        by_leaf = self._by_leaf(fitting)
        first = {leaf: i for i, leaf in enumerate(by_leaf)}
        leaves = sorted(by_leaf, key=lambda leaf: (-len(by_leaf[leaf]), first[leaf]))[:max_leaves]
        picked = [node for leaf in leaves for node in by_leaf[leaf]][:n]
        return picked if len(picked) == n else None

    def _by_leaf(self, fitting: Sequence[str]) -> dict[str, list[str]]:
        """The nodes by leaf, in the order of each leaf's first node in `fitting` (ties go to it)."""
        by_leaf: dict[str, list[str]] = {}
        for node in fitting:
            by_leaf.setdefault(self.leaf(node), []).append(node)
        return by_leaf

    def _under_fewest(self, fitting: Sequence[str], n: int) -> list[str]:
        by_leaf = self._by_leaf(fitting)
        first = {leaf: i for i, leaf in enumerate(by_leaf)}
        if (leaf := _fewest_holding(by_leaf, n)) is not None:
            return by_leaf[leaf][:n]
        best: tuple[int, int, int, str] | None = None  # (height, leaves used, nodes there, switch)
        for switch, leaves in self.under.items():
            if self.height[switch] == 0:
                continue
            sizes = sorted((len(by_leaf.get(leaf, ())) for leaf in leaves), reverse=True)
            if sum(sizes) < n:
                continue
            used = next(i for i in range(1, len(sizes) + 1) if sum(sizes[:i]) >= n)
            key = (self.height[switch], used, sum(sizes), switch)
            best = key if best is None or key < best else best
        pool = by_leaf if best is None else {leaf: by_leaf.get(leaf, []) for leaf in self.under[best[3]]}
        picked: list[str] = []
        for leaf in sorted(pool, key=lambda leaf: (-len(pool[leaf]), first.get(leaf, len(first)), leaf)):
            picked += pool[leaf][: n - len(picked)]
            if len(picked) == n:
                return picked
        raise AssertionError("unreachable: the leaves counted held the nodes")

    def top(self, nodes: Iterable[str]) -> str | None:
        """The lowest switch above all of `nodes` (None: none holds them all)."""
        leaves = set(self.leaves(nodes))
        holding = [(self.height[s], s) for s, under in self.under.items() if leaves <= under]
        return min(holding)[1] if holding else None

    def describe(self, nodes: Iterable[str]) -> str:
        """'under leaf1' or 'under 2 leaf switches (leaf1, leaf2) below spine', and 'in block nvl1' where one
        holds them all."""
        names = list(nodes)
        blocks = {self.block_of.get(n) for n in names}
        inside = f" in block {blocks.pop()}" if len(blocks) == 1 and None not in blocks else ""
        if len(blocks) > 1 and None not in blocks:
            inside = f" in {len(blocks)} blocks ({', '.join(sorted(b for b in blocks if b is not None))})"
        leaves = self.leaves(names)
        if len(leaves) == 1:
            return f"under {leaves[0]}{inside}"
        top = self.top(names)
        below = f" below {top}" if top is not None else " (no one switch above them)"
        return f"under {len(leaves)} leaf switches ({', '.join(leaves)}){below}{inside}"


def _fewest_holding(groups: Mapping[str, Sequence[str]], n: int) -> str | None:
    """The group with the fewest nodes that still has `n` (best fit; ties: the first); None: none has."""
    holding = [(len(nodes), i, name) for i, (name, nodes) in enumerate(groups.items()) if len(nodes) >= n]
    return min(holding)[2] if holding else None


def placed_note(fabric: Fabric | None, want: Any, nodes: Sequence[str]) -> str:
    """Where a multi-node job went in the fabric, and why (its placement event): ', under leaf1 (within its
    max_switches 1)'; `want`: its spec's `topology` (a TopologyRequest) or None."""
    if fabric is None or len(nodes) < 2:
        return ""
    why = "the fewest switches free"
    most = None if want is None else want.max_switches
    if most is not None and len(fabric.leaves(nodes)) > most:
        why = f"more than its max_switches {most}: its topology.wait is over"
    elif most is not None:
        why = f"within its max_switches {most}"
    if want is not None and want.segment is not None:
        why += f"; segments of {want.segment} nodes, each inside one block"
    if (size := fabric.group_size(nodes)) is not None:
        why += f"; inside one group of blocks of at most {size} nodes (topology.block_sizes)"
    return f", {fabric.describe(nodes)} ({why})"


def fabric_of(tree: Any, found: Mapping[str, Any] | None = None) -> Fabric | None:
    """The fabric of a config's `topology:` (a TopologySettings, or None: none declared), and where it declares no
    leaves, or no blocks, those of `found` (`merged_fabric`)."""
    if tree is None:
        return None
    sizes = tree.block_sizes or ()
    if found is None:
        return Fabric.of(tree.leaves(), tree.parents(), tree.block_nodes(), sizes)
    merged = merged_fabric(tree, found)
    return Fabric.of(merged["leaves"], merged["parents"], merged["blocks"], sizes)


def merged_fabric(tree: Any, found: Mapping[str, Any] | None) -> dict[str, Any]:
    """What placement uses: the declared switches, else the leaves the nodes told (`found`: what discovery found,
    `Found.to_json`), each under the first switch it links up to (a leaf that links to several spines is under
    all of them; the first, by name, stands for them); the declared blocks, else the NVLink domains told. With
    `source` saying, for the leaves and the blocks, whether they are "declared", "found" or "none"."""
    found = found or {}
    leaves, parents, blocks = tree.leaves(), tree.parents(), tree.block_nodes()
    source = {"switches": "declared" if tree.switches else "none", "blocks": "declared" if tree.blocks else "none"}
    if not tree.switches and found.get("leaves"):
        leaves = {leaf: list(nodes) for leaf, nodes in found["leaves"].items()}
        uplinks = found.get("uplinks") or {}
        parents = {leaf: min(uplinks[leaf]) for leaf in leaves if uplinks.get(leaf)}
        source["switches"] = "found"
    if not tree.blocks and found.get("nvlink_domains"):
        blocks = {domain: list(nodes) for domain, nodes in sorted(found["nvlink_domains"].items())}  # by name
        source["blocks"] = "found"
    return {"leaves": leaves, "parents": parents, "blocks": blocks, "source": source}


def by_switch(names: Sequence[str], fabric: Fabric | None, first: str | None = None) -> list[str]:
    """`names` grouped by leaf switch (stable within a leaf): a fabric test's ring then crosses the fewest switches,
    so a node is judged on its own link more than on the spine's. With `first`: the nodes under its leaf first."""
    if fabric is None:
        return list(names)
    mine = None if first is None else fabric.leaf(first)
    return sorted(names, key=lambda n: (fabric.leaf(n) != mine, fabric.leaf(n)))
