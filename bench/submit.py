"""Benchmark: job submissions per second through the scheduler's API socket, and the tick's cost after them,
on each store side by side (SQLite, and PostgreSQL on a server of its own).

    .venv/bin/python bench/submit.py [--jobs 2000] [--clients 1,8] [--nodes 64] [--stores sqlite,postgresql]

Runs the real scheduler (`scheduler.daemon.serve`: state_dir lock, SQLite store, control loop ticking every
0.5 s, the Unix socket with SO_PEERCRED) in this process, on a config of `--nodes` nodes that are never
probed (so every job stays queued and each tick runs a full placement pass over the growing queue, as a busy
scheduler would), and submits `--jobs` jobs from `--clients` concurrent clients, each on its own connection.
Each submit is validated again by the scheduler and written with its event in one SQLite transaction
(WAL, synchronous FULL) before it is answered.

With `postgresql` in `--stores`, a PostgreSQL server is started for the run (tests/pg_server.py: `initdb` and
`pg_ctl` in a temporary folder, on 127.0.0.1, with fsync and synchronous commits on, as a real server) and each
round has a database of its own (`state: {url: ...}`).

Prints per store and client count: the wall time, submits/s, the median and p99 latency of one submit, then
TICK MS: the scheduler's CPU per tick (this process's, over 10 s after the submits, with every job queued: each
tick a full placement pass over the queue) and DB MS/S: the PostgreSQL server's CPU per second over the same
10 s (SQLite runs in the scheduler's process: its share is in TICK MS).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.serve.daemon import serve  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402

SPEC = {"name": "bench", "mode": "pytorch", "nodes": 2, "gpus_per_node": 8, "command": "python3 train.py --lr 3e-4"}


TICK_S = 0.5
TICKS_S = 10.0  # the window of TICK MS and DB MS/S
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (those gone count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


async def one_round(
    root: Path, jobs: int, clients: int, nodes: int, url: str | None, db: Callable[[], list[int]]
) -> list[object]:
    config: dict[str, object] = {
        "state_dir": str(root / "state"),
        # never reached: each a loopback address whose port 1 refuses at once (no name to look up)
        "nodes": [{"name": f"gpu{i:04d}", "host": f"127.0.{i >> 8}.{i & 255}", "port": 1} for i in range(1, nodes + 1)],
        "scheduler": {"tick": f"{TICK_S}s"},
        "api": {"socket": str(root / "ft.sock")},
    }
    if url is not None:
        config["state"] = {"url": url}
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
    server_pids = db()  # the server's processes now: this round's connections' included
    ours, theirs, t0 = time.process_time(), cpu_s(server_pids), time.perf_counter()
    await asyncio.sleep(TICKS_S)
    seconds = time.perf_counter() - t0
    tick_ms = (time.process_time() - ours) * 1000 / (seconds / TICK_S)
    db_ms = (cpu_s(server_pids) - theirs) * 1000 / seconds if server_pids else None
    stop.set()
    await asyncio.wait_for(server, 60)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return [
        "postgresql" if url else "sqlite",
        clients,
        jobs,
        f"{wall:.2f}",
        f"{jobs / wall:.0f}",
        f"{statistics.median(latencies) * 1000:.1f}",
        f"{p99 * 1000:.1f}",
        f"{tick_ms:.1f}",
        "-" if db_ms is None else f"{db_ms:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--stores", default="sqlite,postgresql", help="sqlite, postgresql or both")
    args = parser.parse_args()
    stores = args.stores.split(",")
    server = None
    if "postgresql" in stores:
        from tests.pg_server import PgServer  # only where a server is wanted

        server = PgServer.start(durable=True)
    rows = []
    try:
        for store in stores:
            for clients in [int(c) for c in args.clients.split(",")]:
                url = server.database() if store == "postgresql" and server is not None else None
                db = server.pids if url is not None and server is not None else list
                with tempfile.TemporaryDirectory(prefix="ftb-", dir="/tmp") as tmp:
                    rows.append(asyncio.run(one_round(Path(tmp), args.jobs, clients, args.nodes, url, db)))
    finally:
        if server is not None:
            server.stop()
    print_table(["STORE", "CLIENTS", "JOBS", "WALL S", "SUBMITS/S", "MEDIAN MS", "P99 MS", "TICK MS", "DB MS/S"],
                rows)  # fmt: skip


if __name__ == "__main__":
    main()
