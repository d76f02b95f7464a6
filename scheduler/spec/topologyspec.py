"""The `topology:` section of the cluster config: the switches the nodes hang under, as Slurm's topology.yaml (tree)
declares them, and a job's `topology:` key (Slurm's `--switches=N@TIME`). Validation only; placement reads the tree
through `scheduler.decide.topology.Fabric`.

    topology:
      switches:
        leaf1: {nodes: "gpu[01-16]"}      # a leaf switch: the nodes under it
        leaf2: {nodes: "gpu[17-32]"}
        spine: {switches: [leaf1, leaf2]}  # a switch above others
      blocks:
        nvl1: {nodes: "gpu[01-18]"}       # an NVLink domain: a job that fits one stays inside one
        nvl2: {nodes: "gpu[19-36]"}
      block_sizes: [16, 32]               # a job spans one block, or nvl1 and nvl2 together: never more (BlockSizes)
      discover: 6h                        # ask the nodes (at start, then every 6 h); what is not declared is found

A leaf names nodes, an upper switch names switches; each switch is under at most one other, each node under at most
one leaf, and the tree has no cycle. A node under no leaf is placed as if alone under a switch of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ftconsole.scheduler.spec.nodesets import expand_nodeset
from ftconsole.scheduler.spec.values import PositiveDuration

Loc = tuple[str | int, ...]
SwitchName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SwitchSettings(_Strict):
    """One switch: a leaf's nodes (a node set, as `gpu[01-16]`), or the switches under an upper one."""

    nodes: str | None = None
    switches: list[SwitchName] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> SwitchSettings:
        if (self.nodes is None) == (self.switches is None):
            raise ValueError("give either nodes (a leaf switch) or switches (a switch above others)")
        if self.switches is not None and not self.switches:
            raise ValueError("switches is empty: name the switches under it")
        return self


class BlockSettings(_Strict):
    """A block of nodes a job should stay inside when it fits: an NVLink domain (an NVL72 rack), as Slurm's
    topology/block."""

    nodes: str


class TopologySettings(_Strict):
    switches: dict[SwitchName, SwitchSettings] = {}
    blocks: dict[SwitchName, BlockSettings] = {}
    # ask the nodes what the fabric is (as `ftconsole topology --discover`) when the scheduler starts, then this
    # often; placement uses what they tell where `switches` (the leaves) or `blocks` (the NVLink domains) are not
    # declared, and compares it with what is declared
    discover: PositiveDuration | None = None
    # Slurm's BlockSizes: the node counts of the groups of blocks a job of several nodes may span, the first a
    # block's (the base); each next one a power-of-two multiple of it, a group being that many blocks in their order
    block_sizes: list[Annotated[int, Field(ge=1)]] | None = None

    @model_validator(mode="after")
    def _sizes(self) -> TopologySettings:
        sizes = self.block_sizes
        if sizes is None:
            return self
        if not sizes:
            raise ValueError("block_sizes is empty: give the node count of a block first, then of larger groups")
        if sizes != sorted(set(sizes)):
            raise ValueError(f"block_sizes {sizes}: give each size once, smallest (a block's) first")
        base = sizes[0]
        for size in sizes[1:]:
            blocks = size // base
            if size % base or blocks & (blocks - 1):
                allowed = ", ".join(str(base << i) for i in range(1, 4))
                raise ValueError(f"block_sizes: {size} is not a power-of-two multiple of the base size {base} "
                                 f"(groups of 2, 4, 8... blocks: {allowed}...)")  # fmt: skip
        return self

    def block_nodes(self) -> dict[str, list[str]]:
        """block -> its nodes (expanded)."""
        return {name: expand_nodeset(b.nodes) for name, b in self.blocks.items()}

    def leaves(self) -> dict[str, list[str]]:
        """leaf switch -> its nodes (expanded)."""
        return {name: expand_nodeset(s.nodes) for name, s in self.switches.items() if s.nodes is not None}

    def parents(self) -> dict[str, str]:
        """switch -> the switch above it (those under none are left out)."""
        return {child: name for name, s in self.switches.items() for child in s.switches or ()}

    def problems(self, known_nodes: Collection[str]) -> list[tuple[Loc, str]]:
        """Problems spanning switches: unknown switches and nodes, a switch or a node under two, a cycle."""
        out: list[tuple[Loc, str]] = []
        above: dict[str, str] = {}
        for name, switch in self.switches.items():
            for child in switch.switches or ():
                where: Loc = ("topology", "switches", name, "switches")
                if child not in self.switches:
                    out.append((where, f"switch {child!r} is not defined under topology.switches"))
                elif child in above:
                    out.append((where, f"switch {child!r} is already under {above[child]!r}: a switch has one parent"))
                else:
                    above[child] = name
        out += _node_groups(self.leaves(), known_nodes, "switches", "under leaf", "a node has one leaf")
        out += _node_groups(self.block_nodes(), known_nodes, "blocks", "in block", "a node is in one block")
        out += self._size_problems()
        for name in self.switches:
            seen, at = {name}, above.get(name)
            while at is not None and at not in seen:
                seen.add(at)
                at = above.get(at)
            if at is not None:
                out.append((("topology", "switches", name), f"switch {name!r} is under itself: the tree has a cycle"))
                break
        return out

    def _size_problems(self) -> list[tuple[Loc, str]]:
        """`block_sizes` needs blocks, each holding at least the base size (a smaller one could never fill it)."""
        if not self.block_sizes:
            return []
        where: Loc = ("topology", "block_sizes")
        if not self.blocks and self.discover is None:
            return [(where, "block_sizes groups blocks, and none are declared (topology.blocks) or discovered "
                            "(topology.discover)")]  # fmt: skip
        base = self.block_sizes[0]
        small = [(name, len(nodes)) for name, nodes in self.block_nodes().items() if len(nodes) < base]
        return [
            (("topology", "blocks", name, "nodes"), f"block {name!r} has {count} node(s), fewer than the base size "
             f"{base} (the first of topology.block_sizes)")
            for name, count in small
        ]  # fmt: skip


class TopologyRequest(_Strict):
    """A job's `topology:` (Slurm's `--switches=N@TIME`): at most `max_switches` leaf switches under its nodes,
    waited for at most `wait` after its submit; then it takes what is free. `segment` (Slurm's `--segment`): its
    nodes in groups of that many, each group inside one block (an NVLink domain), always."""

    max_switches: int | None = Field(default=None, ge=1)
    wait: PositiveDuration | None = None  # None: it waits as long as it takes
    segment: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _something(self) -> TopologyRequest:
        if self.max_switches is None and self.segment is None:
            raise ValueError("give max_switches (at most that many leaf switches), segment (groups of that many "
                             "nodes, each inside one block), or both")  # fmt: skip
        if self.wait is not None and self.max_switches is None:
            raise ValueError("wait is how long max_switches is waited for: give max_switches with it")
        return self


def _node_groups(
    groups: Mapping[str, list[str]], known_nodes: Collection[str], key: str, where_: str, rule: str
) -> list[tuple[Loc, str]]:
    """A grouping's nodes (leaves' or blocks'): unknown ones, and one in two groups."""
    out: list[tuple[Loc, str]] = []
    seen: dict[str, str] = {}
    for name, nodes in groups.items():
        where: Loc = ("topology", key, name, "nodes")
        unknown = [n for n in nodes if n not in known_nodes]
        if unknown:
            out.append((where, f"node(s) {', '.join(unknown[:4])}{'...' if len(unknown) > 4 else ''} not in nodes"))
        for node in nodes:
            if node in seen:
                out.append((where, f"node {node} is already {where_} {seen[node]!r}: {rule}"))
            else:
                seen[node] = name
    return out


def tree_problems(topology: TopologySettings | None, nodes: Mapping[str, object]) -> list[tuple[Loc, str]]:
    return [] if topology is None else topology.problems(nodes)
