"""The notes of jobs past the queue depth (`scheduler.queue_depth`): each says why it waits, and a job that moves
across the depth (a job ahead of it stopped, a job submitted behind it) gets the note of where it is now, while a
pass that finds every note written looks at none of them (bench/deepqueue.py: 100,000 queued). On nodes that
refuse connections (loopback, port 1): nothing starts, every pass meets the whole queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ftconsole.scheduler.decide import queuedepth
from ftconsole.scheduler.spec.config import load_config
from tests.integration.test_scheduler_sshd import poll, running

LATER = queuedepth.beyond(2)


async def test_a_job_that_moves_across_the_queue_depth_gets_the_note_of_where_it_is(
    tmp_path: Path, sock_dir: Path
) -> None:
    config = {
        "state_dir": str(tmp_path / "state"),
        "nodes": [{"name": "gone", "host": "127.0.0.9", "port": 1}],
        "scheduler": {"tick": "0.2s", "queue_depth": 2},
        "api": {"socket": str(sock_dir / "ft.sock")},
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config))
    async with running(load_config(tmp_path / "cluster.yaml")) as (_, client):
        ids = [(await client.call("submit", spec={"name": f"j{i}", "command": "true"}))["id"] for i in range(4)]

        async def notes() -> dict[int, str]:
            return {j["id"]: j["message"] for j in await client.call("jobs") if j["status"] == "queued"}

        def past(shown: dict[int, Any]) -> list[int]:
            return sorted(i for i, message in shown.items() if message == LATER)

        await poll(notes, lambda n: past(n) == ids[2:] and all(n[i] for i in ids[:2]), "notes past the depth")
        await client.call("stop", jobs=[ids[0]])  # the third moves within the depth
        shown = await poll(notes, lambda n: past(n) == ids[3:], "the third job's note of its place")
        assert shown[ids[2]].startswith("waiting (position"), shown
        late = (await client.call("submit", spec={"name": "late", "command": "true"}))["id"]
        await poll(notes, lambda n: past(n) == [ids[3], late], "the note of a job submitted past the depth")
