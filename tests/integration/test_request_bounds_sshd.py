"""Oversized requests against a running scheduler (issue 40), through its real Unix socket: a huge `after:`, a huge
node set, an array of many tasks times a large spec. Each is refused at once, naming the key at fault, before it
costs anything (nothing is written), and another client's `jobs` is answered within a second meanwhile: the event
loop the scheduler shares with this test is never held."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_scheduler_sshd import job, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

REFUSED_WITHIN = 5.0  # "at once": before these bounds, the first took 61 s and the last wrote some 150 MB
ANSWERED_WITHIN = 1.0  # another client's request, while the bad ones are in flight

# op, spec, the key the refusal names first, and what it says
OVERSIZED: list[tuple[str, dict[str, Any], str, str]] = [
    ("predict", job("deps", "true", after={"ok": list(range(1, 80_001))}), "after", "over the limit of 65,536"),
    ("submit", job("deps", "true", after={"any": list(range(1, 5_001))}), "after.any", "5,000 job ids, over the"),
    ("predict", job("pin", "true", node_names="n" * 100_000 + "[1-10000]"), "node_names", "over the limit of 65,536"),
    ("submit", job("pin", "true", node_names="n" * 60_000 + "[1-10000]"), "node_names", "makes names of up to 60,"),
    ("submit", job("many", "true", array="0-9999", env={"BLOB": "x" * 15_000}), "array", "10,000 tasks of a spec"),
    ("predict", job("many", "true", array="0-9999%4", env={"BLOB": "x" * 15_000}), "array", "over the limit of 67,"),
]


async def refuse_over_and_over(path: Path, op: str, spec: dict[str, Any], key: str, said: str) -> int:
    """Send the same oversized request on one connection until cancelled; each must be refused, naming `key`.
    How many were refused."""
    line = json.dumps({"id": 1, "op": op, "args": {"spec": spec}}).encode() + b"\n"
    reader, writer = await asyncio.open_unix_connection(str(path), limit=2**20)
    refused = 0
    try:
        while True:
            writer.write(line)
            await writer.drain()
            async with asyncio.timeout(REFUSED_WITHIN):
                reply = json.loads(await reader.readline())
            error = reply.get("error")
            assert error is not None, f"{op} {key}: not refused: {str(reply)[:300]}"
            message = error["message"]
            assert error["type"] == "UsageError" and error["exit_code"] == 2, error
            assert message.startswith("invalid job spec: ") and f"{key}" in message and said in message, message
            refused += 1
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        return refused
    finally:
        writer.close()


async def test_oversized_requests_are_refused_at_once_while_others_are_answered(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        bad = [asyncio.create_task(refuse_over_and_over(loaded.socket_path, *case)) for case in OVERSIZED]
        try:
            for _ in range(10):  # answered while the bad requests keep coming
                async with asyncio.timeout(ANSWERED_WITHIN):
                    assert await client.call("jobs") == []
                for task in bad:  # each still in flight (a failed one says why)
                    if task.done():
                        task.result()
                        raise AssertionError("a bad client stopped")
                await asyncio.sleep(0.05)
        finally:
            for task in bad:
                task.cancel()
            counts = await asyncio.gather(*bad)
        assert all(n >= 1 for n in counts), counts
        # nothing was written; and a spec within the bounds is still taken
        assert await client.call("jobs") == []
        within = job("many", "true", array="0-99%4", env={"BLOB": "x" * 15_000}, after={"any": [1]})
        with pytest.raises(Exception, match=r"after\.any: no job 1"):  # past the bounds: the usual checks
            await client.call("submit", spec=within)
        taken = await client.call("submit", spec=job("many", "true", array="0-99%4", env={"BLOB": "x" * 15_000}))
        assert taken["ref"] == f"{taken['id']}[0]"
