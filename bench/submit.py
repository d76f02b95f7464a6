"""Benchmark: job submissions per second through the scheduler's API socket.

    .venv/bin/python bench/submit.py [--jobs 2000] [--clients 1,8] [--nodes 64]

Runs the real scheduler (`scheduler.daemon.serve`: state_dir lock, SQLite store, control loop ticking every
0.5 s, the Unix socket with SO_PEERCRED) in this process, on a config of `--nodes` nodes that are never
probed (so every job stays queued and each tick runs a full placement pass over the growing queue, as a busy
scheduler would), and submits `--jobs` jobs from `--clients` concurrent clients, each on its own connection.
Each submit is validated again by the scheduler and written with its event in one SQLite transaction
(WAL, synchronous FULL) before it is answered.

Prints per client count: the wall time, submits/s, and the median and p99 latency of one submit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.serve.daemon import serve  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402

SPEC = {"name": "bench", "mode": "pytorch", "nodes": 2, "gpus_per_node": 8, "command": "python3 train.py --lr 3e-4"}


async def one_round(root: Path, jobs: int, clients: int, nodes: int) -> list[object]:
    config = {
        "state_dir": str(root / "state"),
        "nodes": [{"name": f"gpu[0001-{nodes:04d}]", "port": 1}],  # never contacted
        "scheduler": {"tick": "0.5s"},
        "api": {"socket": str(root / "ft.sock")},
    }
    (root / "cluster.yaml").write_text(yaml.safe_dump(config))
    loaded = load_config(root / "cluster.yaml")
    stop = asyncio.Event()
    ready = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(loaded, stop, ready=ready.set_result, probe=False))
    await asyncio.wait_for(asyncio.shield(ready), 30)
    latencies: list[float] = []

    async def client(count: int) -> None:
        async with await ApiClient.connect(loaded.socket_path) as api:
            for _ in range(count):
                t0 = time.perf_counter()
                await api.call("submit", spec=SPEC)
                latencies.append(time.perf_counter() - t0)

    shares = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client(n) for n in shares)), 600)
    wall = time.perf_counter() - started
    stop.set()
    await asyncio.wait_for(server, 60)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return [
        clients,
        jobs,
        f"{wall:.2f}",
        f"{jobs / wall:.0f}",
        f"{statistics.median(latencies) * 1000:.1f}",
        f"{p99 * 1000:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--nodes", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for clients in [int(c) for c in args.clients.split(",")]:
        with tempfile.TemporaryDirectory(prefix="ftb-", dir="/tmp") as tmp:
            rows.append(asyncio.run(one_round(Path(tmp), args.jobs, clients, args.nodes)))
    print_table(["CLIENTS", "JOBS", "WALL S", "SUBMITS/S", "MEDIAN MS", "P99 MS"], rows)


if __name__ == "__main__":
    main()
