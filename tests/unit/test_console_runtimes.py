"""The console's node detail: a line per container runtime of the node, from its last report's facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import Static

from ftconsole.tui.app import ConsoleApp
from tests.console_data import NODES, NOW, FixedClient, fixed_config

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
RUNTIMES = [
    {"name": "podman", "path": "/usr/bin/podman", "version": "4.3.1", "usable": True, "problem": None,
     "gpus": True, "gpus_via": ["CDI"]},
    {"name": "docker", "path": "/usr/local/bin/docker", "version": "28.2.2", "usable": False,
     "problem": f"daemon not reachable: {NO_DAEMON}", "gpus": False, "gpus_via": []},
]  # fmt: skip


class RuntimesClient(FixedClient):
    async def call(self, op: str, **args: Any) -> Any:
        if op == "nodes" and args.get("nodeset"):
            node = next(n for n in NODES if n["name"] == args["nodeset"])
            return [{**node, "facts": {**node["facts"], "runtimes": RUNTIMES}}]
        return await super().call(op, **args)


async def node_facts(tmp_path: Path, client: FixedClient, awaited: str) -> str:
    """The facts of the first node's screen, opened as a user would (`:` NAME, Enter), once they say `awaited`."""
    console = ConsoleApp(fixed_config(tmp_path), client=client, clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(160, 40)) as pilot:
        await console.refresh_data("jobs", "nodes", "alerts", "events", "cluster")
        await pilot.pause()
        await pilot.press("colon", *NODES[0]["name"])
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert type(console.screen).__name__ == "NodeScreen"
        text = ""
        for _ in range(50):  # the screen reads the node in a worker
            text = str(console.screen.query_one("#facts", Static).content)
            if awaited in text:
                break
            await pilot.pause(0.1)
        return text


async def test_the_node_detail_has_a_line_per_runtime(tmp_path: Path) -> None:
    text = await node_facts(tmp_path, RuntimesClient(), "container runtime")
    assert "container runtime podman 4.3.1, GPUs: CDI" in text.splitlines()
    assert f"container runtime docker 28.2.2: daemon not reachable: {NO_DAEMON}" in text.splitlines()


TESTS = [
    {"test": "gpu", "result": "fail", "summary": "dcgmi diag -r 2: 1 failure: GPU 3: Memory: 4 errors", "level": 2,
     "failures": ["GPU 3: Memory: 4 errors"], "warnings": [], "tool": "dcgmi", "took_s": 95.2, "time": NOW - 3600},
]  # fmt: skip


class TestedClient(FixedClient):
    async def call(self, op: str, **args: Any) -> Any:
        if op == "nodes" and args.get("nodeset"):
            node = next(n for n in NODES if n["name"] == args["nodeset"])
            return [{**node, "tests": TESTS}]
        return await super().call(op, **args)


async def test_the_node_detail_shows_its_last_node_test(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("ftconsole.format.time.time", lambda: NOW)
    text = await node_facts(tmp_path, TestedClient(), "tested:")
    line = "tested: gpu (dcgmi diag -r 2): fail: dcgmi diag -r 2: 1 failure: GPU 3: Memory: 4 errors (95.2s, 1.0h ago)"
    assert line in text.splitlines(), text
