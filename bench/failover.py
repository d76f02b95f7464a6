"""Benchmark: a standby scheduler taking over from a leader killed -9, with jobs running (issue 31).

    .venv/bin/python bench/failover.py [--nodes 8] [--jobs 20] [--repeats 3]

A lab cluster of `--nodes` nodes (SSH servers in a separate process, run processes real and local) and a
PostgreSQL server of its own (tests/pg_server.py: `initdb` and `pg_ctl` in a temporary folder on 127.0.0.1,
fsync on); two `ftconsole serve` processes on the same `state.url`, each with its own state_dir and socket, the
scheduler's defaults otherwise (`state.lease` 10 s). `--jobs` jobs (`sleep 3600`, one GPU) run, every rank
read running. Then, `--repeats` times: the leader is killed -9 and, on the standby's socket:

    TAKEOVER S   kill -> the standby says it leads (`status`: leadership.role, polled every 0.1 s)
    ADOPTED S    kill -> its log line `adopted N running run(s)`: every run read again from the nodes, the loop
                 going on (the goal: 15 s at the defaults)
    UNTOUCHED    jobs still running with the same attempt and the same rank pids as before the kill

The killed one is started again, as a standby, before the next round (the two swap roles each round). All
times on this machine's clock. Everything it starts is stopped at the end (both serve processes, the lab and
any `sleep 3600` of it, the PostgreSQL server).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from recovery import SPEC, Serve, connect, shut_down, wait_all_running, write_layout  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import lab_up  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402
from tests.pg_server import PgServer  # noqa: E402

ADOPTED = re.compile(r"adopted (\d+) running run\(s\)")
TAKEOVER_TIMEOUT_S = 60.0
RUNNING_TIMEOUT_S = 300.0


def head_config(root: Path, lab_config: Path, name: str, url: str) -> Path:
    """Head node `name`'s config: the lab's, with its own state_dir and socket, and the shared store."""
    config = yaml.safe_load(lab_config.read_text())
    config["state_dir"] = str(root / name / "state")
    config["api"] = {"socket": str(root / name / "ft.sock")}
    config["ssh"]["python"] = sys.executable
    config["probes"]["interval"] = "300s"  # no probe sweep on the 2 shared CPUs during the rounds
    config["state"] = {"url": url}
    (root / name).mkdir(exist_ok=True)
    path = root / name / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def role(socket: Path) -> str | None:
    try:
        api = await asyncio.wait_for(ApiClient.connect(socket), 2)
    except (OSError, TimeoutError, Exception):  # not up yet, or gone
        return None
    try:
        status = await asyncio.wait_for(api.call("status"), 5)
        return str((status.get("leadership") or {}).get("role"))
    except Exception:
        return None
    finally:
        await api.close()


async def pids(api: ApiClient) -> dict[int, tuple[int, list[int | None]]]:
    """job -> (attempt, its runs' pids), of the running jobs."""
    out = {}
    for job in await api.call("jobs"):
        if job["status"] == "running":
            shown = await api.call("show", job=job["id"])
            attempt = shown["attempts"][-1]
            out[job["id"]] = (attempt["number"], [r["pid"] for r in attempt["runs"]])
    return out


async def rounds(root: Path, nodes: int, jobs: int, repeats: int, url: str) -> list[list[object]]:
    layout = root / "layout.yaml"
    write_layout(layout, nodes, jobs)
    lab_dir = root / "lab"
    serves: dict[str, Serve] = {}
    all_serves: list[Serve] = []
    try:
        info = lab_up(lab_dir, layout, None, timeout=120)
        configs = {name: head_config(root, Path(info.config_path), name, url) for name in ("head-a", "head-b")}
        sockets = {name: load_config(path).socket_path for name, path in configs.items()}
        for name in ("head-a", "head-b"):  # head-a first: it takes the lease
            serves[name] = Serve(configs[name], root / f"{name}.log")
            all_serves.append(serves[name])
            await wait_role(sockets[name], ("leader",) if name == "head-a" else ("standby",))
        api = await connect(load_config(configs["head-a"]))
        for _ in range(jobs):
            await api.call("submit", spec=SPEC)
        await wait_all_running(api, jobs, RUNNING_TIMEOUT_S)
        before = await pids(api)
        await api.close()
        rows: list[list[object]] = []
        leader, standby = "head-a", "head-b"
        for number in range(1, repeats + 1):
            killed = time.perf_counter()
            serves[leader].kill9()
            await wait_role(sockets[standby], ("leader",))
            takeover = time.perf_counter() - killed
            at, _ = serves[standby].wait_line(ADOPTED, TAKEOVER_TIMEOUT_S)  # a standby's Serve: no loop before
            adopted = at - killed
            api = await connect(load_config(configs[standby]))
            after = await pids(api)
            await api.close()
            untouched = sum(1 for job, was in before.items() if after.get(job) == was)
            rows.append([number, jobs, f"{takeover:.1f}", f"{adopted:.1f}", f"{untouched}/{len(before)}"])
            print(f"  round {number}: takeover {takeover:.1f} s, adopted {adopted:.1f} s, untouched "
                  f"{untouched}/{len(before)}", file=sys.stderr)  # fmt: skip
            serves[leader] = Serve(configs[leader], root / f"{leader}.log")  # back, as a standby
            all_serves.append(serves[leader])
            await wait_role(sockets[leader], ("standby",))
            leader, standby = standby, leader
        return rows
    finally:
        shut_down(lab_dir, all_serves)


async def wait_role(socket: Path, wanted: tuple[str, ...]) -> None:
    deadline = time.monotonic() + TAKEOVER_TIMEOUT_S
    while (got := await role(socket)) not in wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"{socket}: role {got}, not {' or '.join(wanted)}, after {TAKEOVER_TIMEOUT_S:g} s")
        await asyncio.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with PgServer.start(durable=True) as server, tempfile.TemporaryDirectory(prefix="ftfo-", dir="/tmp") as tmp:
        table = asyncio.run(rounds(Path(tmp), args.nodes, args.jobs, args.repeats, server.database()))
    print_table(["ROUND", "JOBS", "TAKEOVER S", "ADOPTED S", "UNTOUCHED"], table)


if __name__ == "__main__":
    main()
