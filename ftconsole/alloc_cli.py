"""`ftconsole alloc`: an allocation to work in, as Slurm's `salloc` gives one. It is queued as a job (priority, fair
share, quotas, reservations and preemption apply as to any job), whose ranks hold the GPUs (`sleep infinity` on
each node: the scheduler's run supervisor starts and stops it as any rank); once it runs, the debug terminal opens
on its first node (`ftconsole shell`: as the user, in the rank's run folder, with its env: the visible GPUs, the
hostfile, `FT_*`). Leaving the shell ends the allocation, unless `--keep`. With `--command`, the command runs
there instead of a shell and its exit status is this command's.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from typing import Any

from ftconsole.format import printable
from ftconsole.scheduler.errors import FtError, UsageError
from ftconsole.scheduler.serve.client import SocketClient, connect
from ftconsole.scheduler.spec.config import LoadedConfig, find_config, format_duration, load_config

HOLDER = "sleep infinity"  # what each rank of an allocation runs: it holds the GPUs until the allocation ends
POLL_S = 0.5


class AllocationEnded(FtError):
    title = "alloc"


def allocation_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The job an allocation is: its ranks hold the GPUs, nothing watches them for hangs (a shell is quiet)."""
    spec: dict[str, Any] = {
        "name": args.name,
        "command": HOLDER,
        "mode": "single" if args.nodes == 1 else "pytorch",  # pytorch: every node runs its rank (not Python: as is)
        "nodes": args.nodes,
        "hang_detect": "off",
        "priority": args.priority,
        "project": args.project,
    }
    if args.spec is not None:
        spec["spec"] = args.spec
    if args.gpus_per_node is not None:
        spec["gpus_per_node"] = args.gpus_per_node
    for key in ("time", "pool", "reservation", "idle_timeout"):
        if getattr(args, key) is not None:
            spec["max_runtime" if key == "time" else key] = getattr(args, key)
    return spec


async def _client(loaded: LoadedConfig) -> SocketClient:
    client = await connect(loaded)
    if client is None:
        raise UsageError(
            "alloc needs a running scheduler (ftconsole serve, or an open console): an allocation is placed and held "
            "by it"
        )
    return client


async def _wait_running(client: SocketClient, job_id: int) -> dict[str, Any]:
    """The allocation once its first rank runs; its waiting messages on stderr as they change."""
    said = None
    while True:
        job = await client.call("show", job=job_id)
        runs = [r for a in job["attempts"] if a["number"] == job["attempt"] for r in a["runs"]]
        if job["status"] == "running" and runs and all(r["state"] == "running" for r in runs if r["launch"]):
            return job
        if job["status"] not in ("queued", "running"):
            raise AllocationEnded(f"allocation {job_id} {job['status']} before it started: {job['message']}")
        text = f"allocation {job_id} {job['status']}: {job['message']}" if job["message"] else None
        if text and text != said:
            print(printable(text), file=sys.stderr, flush=True)
            said = text
        await asyncio.sleep(POLL_S)


async def _stop(loaded: LoadedConfig, job_id: int) -> None:
    client = await _client(loaded)
    try:
        await client.call("stop", jobs=[job_id])
    finally:
        await client.close()


def cmd_alloc(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.ssh.shell import shell_target  # asyncssh: only for this command

    loaded = load_config(find_config(args.config))
    said = "the allocation was stopped"  # what an interruption left (Ctrl-C's message)

    async def give_up(client: SocketClient, job_id: int) -> None:
        """Stop the allocation nobody will use; if that fails too, say so and how, and keep the first error."""
        nonlocal said
        try:
            await client.call("stop", jobs=[job_id])
        except Exception as exc:  # the connection that broke, often: the first error is the one to see
            said = f"allocation {job_id} could not be stopped ({exc}): ftconsole stop {job_id}"
            print(f"ftconsole: alloc: {said}", file=sys.stderr, flush=True)

    async def start() -> tuple[int, list[str]]:
        nonlocal said
        client = await _client(loaded)
        try:
            job = await client.call("submit", spec=allocation_spec(args), allocation=True)
            job_id = int(job["id"])
            idle = (await client.call("show", job=job_id))["spec"].get("idle_timeout")
            ends = f" (it ends once idle {format_duration(idle)})" if idle and idle > 0 else ""
            print(f"allocation {job_id} queued{ends}", file=sys.stderr, flush=True)
            try:
                shown = await _wait_running(client, job_id)
            except (KeyboardInterrupt, asyncio.CancelledError):
                await give_up(client, job_id)  # never used: given up, as salloc's Ctrl-C does
                raise
            nodes = ", ".join(shown.get("node_names") or [])
            print(f"allocation {job_id} running on {nodes}", file=sys.stderr, flush=True)
            try:
                target = await shell_target(client, loaded, str(job_id), command=args.command)
            except BaseException:
                if args.keep:
                    said = f"allocation {job_id} kept: ftconsole shell {job_id} to go back, ftconsole stop {job_id}"
                else:  # no shell, no allocation: nobody would use it
                    await give_up(client, job_id)
                raise
            return job_id, target.argv
        finally:
            await client.close()

    try:
        job_id, argv = asyncio.run(start())
    except KeyboardInterrupt:
        print(f"alloc: interrupted; {said}", file=sys.stderr)
        return 130
    try:
        code = subprocess.run(argv, check=False).returncode  # the terminal is ours and the shell's
    except OSError as exc:
        code = 1
        print(f"ftconsole: alloc: cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    if args.keep:
        print(f"allocation {job_id} kept: ftconsole shell {job_id} to go back, ftconsole stop {job_id} to end it",
              file=sys.stderr)  # fmt: skip
        return code
    asyncio.run(_stop(loaded, job_id))
    print(f"allocation {job_id} ended", file=sys.stderr)
    return code


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "alloc",
        parents=[common],
        help="an allocation to work in (salloc): queued as a job, then a shell on its first node",
        description="Queue an allocation of GPUs as a job (priority, fair share, quotas and reservations apply), "
        "wait for it, then open a shell on its first node as you, in its run folder with its env (the visible GPUs, "
        "the hostfile, FT_*). Leaving the shell ends the allocation, unless --keep.",
    )
    p.add_argument("--nodes", "-N", type=int, default=1, help="how many nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs on each node")
    p.add_argument("--spec", metavar="SPEC", help="a node spec of the cluster config, as a job's spec: key")
    p.add_argument("--time", metavar="DURATION", help="its max_runtime, e.g. 4h: it ends then")
    p.add_argument("--name", default="alloc", help="its name in the job list (default alloc)")
    p.add_argument("--project", default="default", help="the project it counts for")
    p.add_argument("--priority", default="normal", choices=["normal", "urgent", "very-urgent"])
    p.add_argument("--pool", help="only nodes of this pool")
    p.add_argument("--reservation", help="inside this reservation")
    p.add_argument(
        "--idle-timeout",
        metavar="DURATION",
        help="end it once idle this long: no step, no typing in its shells, its GPUs unused (default: the "
        "cluster's scheduler.idle_timeout); off: never",
    )
    p.add_argument("--keep", action="store_true", help="keep the allocation when the shell ends")
    p.add_argument("--command", metavar="CMD", help="run CMD there with sh -c instead of a shell; its status is ours")
    p.set_defaults(func=cmd_alloc)
