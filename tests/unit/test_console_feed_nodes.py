"""The console reads the nodes by change (`nodes_changed`): an unchanged node keeps its object, a new probe adds
to the node's utilisation history, a node that goes is dropped, and a scheduler from before the op is read whole
every time."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.serve.nodelist import NodeChanges, brief_node
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
            nodes = [dict(n) for n in self.nodes]
            return self.changes.changed(None, nodes, args.get("since"), args.get("patches", False))
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


def test_patches_merged_by_the_console_make_the_schedulers_views() -> None:
    """The console asks for patches: after each read, its nodes are the scheduler's brief views, key for key, over
    random probes, state changes, held GPUs and nodes that come and go; a node not changed keeps its object."""
    rng = random.Random(7)
    client, feed = Nodes(), Feed(clock=lambda: 0.0)
    client.nodes = [node(f"n{i}", 1.0) for i in range(12)]
    sent: list[Any] = []
    call = client.call

    async def recording(op: str, **args: Any) -> Any:
        reply = await call(op, **args)
        sent.append(json.loads(json.dumps(reply)))  # as over the socket
        return sent[-1]

    client.call = recording  # type: ignore[method-assign]
    patched = 0
    for step in range(200):
        for i, n in enumerate(client.nodes):
            roll = rng.random()
            if roll < 0.3:
                client.nodes[i] = n | {
                    "last_probe": 2.0 + step,
                    "gpus": [n["gpus"][0] | {"utilization": rng.randint(0, 100)}],
                }
            elif roll < 0.35:
                client.nodes[i] = n | {"state": rng.choice(["healthy", "drained", "degraded"])}
            elif roll < 0.4:
                client.nodes[i] = n | {"held": [{"gpu": 0, "job": rng.randint(1, 3)}] if not n["held"] else []}
        if rng.random() < 0.05:
            client.nodes.pop(rng.randrange(len(client.nodes)))
        if rng.random() < 0.05:
            client.nodes.append(node(f"m{step}", 2.0 + step))
        before = dict(feed.nodes)
        read(feed, client)
        patched += len(sent[-1].get("patches") or ())
        assert feed.nodes == {n["name"]: brief_node(n) for n in client.nodes}, step
        assert list(feed.nodes) == [n["name"] for n in client.nodes]
        moved = {n["name"] for n in sent[-1]["nodes"]} | {p["name"] for p in sent[-1].get("patches") or ()}
        assert all(feed.nodes[k] is before[k] for k in before.keys() & feed.nodes.keys() - moved)
    assert patched > 500  # most changes came as patches, a probe's as its GPUs' utilisation
    assert sum("gpus_utilization" in p for r in sent for p in r.get("patches") or ()) > 300
    keys = set(brief_node(client.nodes[0])) | {"gpus_utilization"}
    assert all(set(p) < keys for r in sent for p in r.get("patches") or ())  # never a whole view


def test_a_patch_for_a_node_not_held_reads_everything_again() -> None:
    client, feed = Nodes(), Feed(clock=lambda: 0.0)
    read(feed, client)
    del feed.nodes["b"]  # as if the console had lost it
    client.nodes[1] = node("b", 2.0, util=90.0)
    read(feed, client)
    assert "b" not in feed.nodes and feed._node_cursor is None
    read(feed, client)
    assert feed.nodes["b"]["gpus"][0]["utilization"] == 90.0 and feed._node_cursor is not None


def test_a_node_answered_whole_but_as_held_keeps_its_object() -> None:
    """A reply lost on the way: the next read's cursor is not the newest, so the nodes changed since come whole,
    and one that changed and changed back is the same as held: it keeps its object (views do nothing for it)."""
    client, feed = Nodes(), Feed(clock=lambda: 0.0)
    read(feed, client)
    held, cursor = dict(feed.nodes), feed._node_cursor
    client.nodes[1] = node("b", 2.0, util=90.0)
    asyncio.run(client.call("nodes_changed", since=cursor, patches=True))  # answered, never received
    client.nodes[1] = node("b", 1.0)  # and back
    assert read(feed, client) == set()
    assert all(feed.nodes[n] is held[n] for n in held)
