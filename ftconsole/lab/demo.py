"""The demo's jobs: a few small jobs queued when `ftconsole demo` opens the console, so its first screen is alive.

The specs are the YAML files of ``demo_jobs/`` (package data), submitted in file-name order, each as any
``ftconsole submit`` is: through `scheduler.serve.client` (the API socket of a running scheduler, else in-process on
the store, where they wait queued until the console's embedded scheduler starts and places them). They are
owned by whoever runs the demo.

They do not pile up: the lab's store persists between demos, so nothing is submitted while any job of this
user named ``demo-...`` is still queued or running. Once all of them have ended, the next demo queues a fresh
set. A spec the cluster refuses (``--nodes 1`` has no A100 pool) is reported and skipped; the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.serve.client import Client, open_client
from ftconsole.scheduler.spec.config import LoadedConfig
from ftconsole.scheduler.spec.jobspec import JobSpec, load_jobspec

DEMO_JOBS_DIR = Path(__file__).resolve().parent / "demo_jobs"
DEMO_PREFIX = "demo-"
ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class DemoJobs:
    """What `submit_demo_jobs` did: the jobs it queued, the active demo jobs that made it skip, the refusals."""

    submitted: tuple[dict[str, Any], ...] = ()
    active: tuple[dict[str, Any], ...] = ()
    refused: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.active:
            names = ", ".join(f"{j['name']} ({j['id']}, {j['status']})" for j in self.active)
            return f"demo jobs not submitted again: still active: {names}"
        lines = []
        if self.submitted:
            names = ", ".join(f"{j['name']} ({j['id']})" for j in self.submitted)
            lines.append(f"demo jobs submitted: {names}")
        lines.extend(f"demo job refused: {problem}" for problem in self.refused)
        return "\n".join(lines) or "no demo jobs"


def demo_specs(folder: Path = DEMO_JOBS_DIR) -> list[JobSpec]:
    """The demo's job specs, in file-name order (each checked as `ftconsole submit` checks a file)."""
    return [load_jobspec(path) for path in sorted(folder.glob("*.yaml"))]


async def submit_demo_jobs(client: Client, specs: list[JobSpec] | None = None) -> DemoJobs:
    """Submit the demo jobs as the client's user, unless a demo job of that user is still queued or running."""
    me = (await client.call("whoami"))["user"]
    mine = await client.call("jobs", status=list(ACTIVE), name=DEMO_PREFIX, owner=me)
    active = tuple(j for j in mine if j["name"].startswith(DEMO_PREFIX))
    if active:
        return DemoJobs(active=active)
    submitted, refused = [], []
    for spec in demo_specs() if specs is None else specs:
        try:
            submitted.append(await client.call("submit", spec=spec.to_json()))
        except FtError as exc:
            refused.append(f"{spec.name}: {exc}")
    return DemoJobs(submitted=tuple(submitted), refused=tuple(refused))


async def queue_demo_jobs(loaded: LoadedConfig) -> DemoJobs:
    """`submit_demo_jobs` through the client the CLI uses on this config (socket, else in-process)."""
    async with open_client(loaded) as client:
        return await submit_demo_jobs(client)
