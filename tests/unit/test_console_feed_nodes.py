"""The console reads the nodes by change (`nodes_changed`): an unchanged node keeps its object, a new probe adds
to the node's utilisation history, a node that goes is dropped, and a scheduler from before the op is read whole
every time."""

from __future__ import annotations

import asyncio
from typing import Any

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.serve.nodelist import NodeChanges
from ftconsole.tui.feed import Feed


def node(name: str, probe: float, util: float = 50.0, state: str = "healthy") -> dict[str, Any]:
    return {"name": name, "state": state, "last_probe": probe, "last_probe_age_s": 0.5, "held": [],
            "gpus": [{"index": 0, "name": "H100", "utilization": util}]}  # fmt: skip


class Nodes:
    """A scheduler's node ops over `self.nodes`; `old`: from before `nodes_changed`."""

    def __init__(self, old: bool = False) -> None:
        self.old = old
        self.nodes = [node("a", 1.0), node("b", 1.0), node("c", 1.0)]
        self.changes = NodeChanges()
        self.calls: list[str] = []

    async def call(self, op: str, **args: Any) -> Any:
        self.calls.append(op)
        if op == "nodes_changed" and not self.old:
            return self.changes.changed(None, [dict(n) for n in self.nodes], args.get("since"))
        if op == "nodes" and args.get("brief"):
            return [{k: v for k, v in n.items() if k != "last_probe_age_s"} for n in self.nodes]
        raise UsageError(f"unknown op {op!r}")


def read(feed: Feed, client: Nodes) -> set[str]:
    return asyncio.run(feed.refresh(client, ["nodes"]))  # type: ignore[arg-type]


def changed(feed: Feed, before: dict[str, Any]) -> set[str]:
    """The nodes another object than `before` held (an unchanged node keeps its object: what views go by)."""
    return {n for n in before.keys() | feed.nodes.keys() if feed.nodes.get(n) is not before.get(n)}


def test_the_nodes_are_read_by_change() -> None:
    client, feed = Nodes(), Feed(clock=lambda: 0.0)
    assert read(feed, client) == {"nodes"} and list(feed.nodes) == ["a", "b", "c"]
    first = dict(feed.nodes)

    assert read(feed, client) == set()  # nothing changed: no node sent again, every object kept
    assert all(feed.nodes[n] is first[n] for n in first) and changed(feed, first) == set()

    client.nodes[1] = node("b", 2.0, util=90.0)  # b's next probe
    assert read(feed, client) == {"nodes"}
    assert changed(feed, first) == {"b"}
    assert feed.nodes["a"] is first["a"] and feed.nodes["b"]["gpus"][0]["utilization"] == 90.0
    assert list(feed.util["b"]) == [50.0, 90.0] and list(feed.util["a"]) == [50.0]

    first = dict(feed.nodes)
    del client.nodes[0]  # a is removed from the config
    client.nodes.append(node("d", 2.0))
    read(feed, client)
    assert list(feed.nodes) == ["b", "c", "d"] and "a" not in feed.util
    assert changed(feed, first) == {"a", "d"}
    assert client.calls == ["nodes_changed"] * 4


def test_a_scheduler_from_before_the_op_is_read_whole() -> None:
    client, feed = Nodes(old=True), Feed(clock=lambda: 0.0)
    read(feed, client)
    assert list(feed.nodes) == ["a", "b", "c"] and feed.sources["nodes"].error is None
    client.nodes[2] = node("c", 2.0, state="drained")
    first = dict(feed.nodes)
    assert read(feed, client) == {"nodes"} and changed(feed, first) == {"c"}
    assert client.calls == ["nodes_changed", "nodes", "nodes"]  # asked once, then whole every time
