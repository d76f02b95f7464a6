"""`run_on_all`: one node's trouble is that node's result, never the whole fan-out's."""

from __future__ import annotations

import asyncio

import pytest

from ftconsole.scheduler.errors import FtError, UnreachableError
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.transport import run_on_all

NODES = [Node(name=f"n{i}", host=f"10.0.0.{i}", port=22, user="root", pool="default", labels={}) for i in range(4)]


async def test_an_unexpected_error_on_one_node_is_that_nodes_result() -> None:
    async def action(node: Node) -> str:
        if node.name == "n1":
            raise KeyError("gpus")  # a bug, or a reply nobody foresaw
        if node.name == "n2":
            raise UnreachableError(node.name, "connection refused")
        await asyncio.sleep(0)
        return f"ok {node.name}"

    results = await run_on_all(NODES, action)
    assert results["n0"] == "ok n0" and results["n3"] == "ok n3"
    assert isinstance(results["n2"], UnreachableError)
    assert isinstance(results["n1"], FtError) and str(results["n1"]) == "n1: unexpected KeyError: 'gpus'"


async def test_cancellation_is_not_swallowed() -> None:
    async def action(node: Node) -> str:
        await asyncio.sleep(10)
        return node.name

    task = asyncio.ensure_future(run_on_all(NODES, action))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
