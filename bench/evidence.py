"""Benchmark: how long `ftconsole debug JOB` takes to gather the evidence of a hung job's ranks (issue 29).

    .venv/bin/python bench/evidence.py [--nodes 8] [--repeats 5]

A lab cluster of `--nodes` nodes (one GPU each, SSH servers in a separate process, processes real and local) and
an `ftconsole serve` with the scheduler's defaults. One job of `--nodes` ranks, one per node, in pytorch mode:
tests/peers/hang_rank.py under torch.distributed.run with the peer environment's torch (.venv-peers, gloo on
loopback; `make test-peers` makes it), rank 5 stopping itself (SIGSTOP) after three all-reduces, so that the
others wait in all_reduce. Once every rank runs, `debug` is called through the API:

    FIRST       the first call: on nodes without py-spy, the scheduler's own is sent first (8 MB each)
    AGAIN       `--repeats` more calls (median and max): py-spy kept on the nodes
    NO STACKS   `--repeats` calls with `stacks: false` (states, wait channels, CPU, output only)

Each call gathers from every node at once: the runs' status, then the processes (two looks 0.5 s apart for the
CPU time, and py-spy on each Python process: torch.distributed.run and its worker on each node), then the last
lines of output. The table also says how many ranks had their stack and torch's trace (the stopped rank's is
not asked for: its server is stopped with it), and whether the verdict named rank 5. Everything started is
stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recovery import Serve, connect, shut_down, write_config, write_layout  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import lab_up  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402

PEERS = ROOT / ".venv-peers" / "bin"
HANG = ROOT / "tests" / "peers" / "hang_rank.py"
STOPPED = 5
WAIT_S = 300.0


async def timed(api: Any, job: int, stacks: bool) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    doc = await api.call("debug", job=job, stacks=stacks)
    return time.perf_counter() - started, doc


async def hung(api: Any, job: int) -> None:
    """Until the job's every rank runs and the stopped one has stopped (its verdict names it)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        shown = await api.call("show", job=job)
        if shown["status"] not in ("queued", "running"):
            raise SystemExit(f"the job ended: {shown['message']}")
        runs = [r for a in shown["attempts"] for r in a["runs"]]
        if shown["status"] == "running" and runs and all(r["state"] == "running" for r in runs):
            doc = await api.call("debug", job=job, stacks=False)
            if doc["verdict"]["rank"] == STOPPED:
                return
        await asyncio.sleep(1.0)
    raise SystemExit(f"rank {STOPPED} not seen stopped within {WAIT_S:g}s")


async def run(args: argparse.Namespace) -> None:
    if not (PEERS / "python").exists():
        raise SystemExit(f"no peer environment at {PEERS.parent}: `make test-peers` makes it")
    root = Path(tempfile.mkdtemp(prefix="ftbench-evidence-"))
    layout = root / "layout.yaml"
    write_layout(layout, args.nodes, args.nodes)
    lab_dir = root / "lab"
    try:
        info = lab_up(lab_dir, layout, None, timeout=180)
        config = write_config(root, Path(info.config_path), None)
        serve = Serve(config, root / "serve.log")
        try:
            api = await connect(load_config(config))
            env = {"PATH": f"{PEERS}:/usr/bin:/bin", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                   "PEER_HANG": f"stop:{STOPPED}"}  # fmt: skip
            spec = {"name": "bench-evidence", "mode": "pytorch", "nodes": args.nodes, "gpus_per_node": 1,
                    "command": f"python {HANG}", "workdir": str(root), "env": env}  # fmt: skip
            job = (await api.call("submit", spec=spec))["id"]
            await hung(api, job)
            first, doc = await timed(api, job, True)
            again = [(await timed(api, job, True))[0] for _ in range(args.repeats)]
            bare = [(await timed(api, job, False))[0] for _ in range(args.repeats)]
            await api.call("stop", jobs=[job])
            await api.close()
        finally:
            serve.stop()
    finally:
        shut_down(lab_dir, [])
    stacks = sum(1 for r in doc["ranks"] if r["stack"])
    traces = sum(1 for r in doc["ranks"] if r.get("collectives"))
    row = [
        len(doc["ranks"]), args.nodes, f"{first:.2f}", f"{statistics.median(again):.2f}", f"{max(again):.2f}",
        f"{statistics.median(bare):.2f}", f"{max(bare):.2f}", f"{stacks}/{len(doc['ranks'])}",
        f"{traces}/{len(doc['ranks'])}", "yes" if doc["verdict"]["rank"] == STOPPED else "no",
    ]  # fmt: skip
    headers = ["RANKS", "NODES", "FIRST S", "AGAIN S (MED)", "(MAX)", "NO STACKS S (MED)", "(MAX)", "STACKS"]
    print_table([*headers, "TRACES", "NAMED"], [row])
    print(f"\nverdict: {doc['verdict']['reason']}")
    print(f"(folder kept: {root})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
