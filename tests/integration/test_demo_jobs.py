"""The demo's jobs (`ftconsole demo`, ftconsole/lab/demo.py) against a real lab and a real scheduler.

A 2-node lab in this process (lab01: 8 H100s, lab02: 4 A100s), the jobs queued through the client the CLI
uses (in-process on the store, as before the console's scheduler starts, then through the socket of a
running one), every wait bounded, the scheduler stopped and the lab's processes killed in `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from ftconsole.lab import LabCluster
from ftconsole.lab.demo import DEMO_PREFIX, demo_specs, queue_demo_jobs
from ftconsole.scheduler.serve.client import open_client, this_process
from ftconsole.scheduler.serve.daemon import serve
from ftconsole.scheduler.spec.config import LoadedConfig, load_config

TIMEOUT = 20.0


@contextlib.asynccontextmanager
async def lab(tmp_path: Path) -> AsyncIterator[LoadedConfig]:
    """A 2-node lab and its config, with a short socket path (AF_UNIX) and a fast scheduler tick."""
    sock_dir = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    try:
        async with LabCluster(tmp_path / "lab", nodes=2) as cluster:
            config = yaml.safe_load(cluster.config_path.read_text())
            config["api"] = {"socket": str(sock_dir / "ft.sock")}
            config["scheduler"] = {"tick": "0.3s", "stop_grace": "2s"}
            path = tmp_path / "cluster.yaml"
            path.write_text(yaml.safe_dump(config))
            yield load_config(path)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


async def jobs(loaded: LoadedConfig) -> list[dict[str, Any]]:
    async with open_client(loaded) as client:
        return list(await client.call("jobs"))


async def wait_for_jobs(loaded: LoadedConfig, done: Any, what: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + TIMEOUT
    while True:
        seen = await jobs(loaded)
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}: {seen}")
        await asyncio.sleep(0.2)


async def test_demo_jobs_are_queued_once_and_run(tmp_path: Path) -> None:
    names = [spec.name for spec in demo_specs()]
    assert len(names) >= 3 and all(name.startswith(DEMO_PREFIX) for name in names)
    async with lab(tmp_path) as loaded:
        # before the console's scheduler starts: queued in-process on the store
        first = await queue_demo_jobs(loaded)
        assert [j["name"] for j in first.submitted] == names, first.summary()
        assert first.refused == () and first.active == ()
        assert {j["owner"] for j in first.submitted} == {this_process().user}
        assert {j["status"] for j in await jobs(loaded)} == {"queued"}

        stop = asyncio.Event()
        server = asyncio.create_task(serve(loaded, stop))
        try:
            running = await wait_for_jobs(
                loaded, lambda js: any(j["status"] == "running" for j in js), "a demo job to run"
            )
            # a second demo on the same store (now through the scheduler's socket) submits nothing
            second = await queue_demo_jobs(loaded)
            assert second.submitted == () and second.active, second.summary()
            assert "not submitted again" in second.summary()
            after = await jobs(loaded)
            assert sorted(j["id"] for j in after) == sorted(j["id"] for j in running)
            assert len(after) == len(names)
        finally:
            stop.set()
            await asyncio.wait_for(server, 30)


async def test_a_new_set_is_queued_once_the_old_one_ended(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:  # no scheduler: the jobs stay queued, a stop ends them at once
        first = await queue_demo_jobs(loaded)
        async with open_client(loaded) as client:
            await client.call("stop", jobs=[j["id"] for j in first.submitted])
        assert {j["status"] for j in await jobs(loaded)} == {"stopped"}
        again = await queue_demo_jobs(loaded)
        assert [j["name"] for j in again.submitted] == [j["name"] for j in first.submitted]
        assert not {j["id"] for j in again.submitted} & {j["id"] for j in first.submitted}
