"""Benchmark: a deep queue. Requests answered while the scheduler holds a very long queue of jobs it cannot
place yet (arrays of thousands of tasks on a full or unreachable cluster).

    .venv/bin/python bench/deepqueue.py [--arrays 8] [--tasks 10000] [--nodes 64] [--stop 1000] [--profile FILE]
                                        [--window-profile FILE]

Starts the real scheduler as its own process (`ftconsole serve`: state_dir lock, SQLite store, the control loop
ticking every 0.5 s, the Unix socket), on `--nodes` nodes that refuse connections (loopback addresses, port 1:
every probe fails at once, so every node is unreachable and nothing can be placed: each tick's placement pass
sees the whole queue and no free GPU). It submits `--arrays` arrays of `--tasks` tasks each (one request per
array), then measures, while the loop keeps ticking:

- READ S: `jobs --status running` (median of 5), the read an operator's console makes every few seconds;
- SHOW S: `show` of one queued task, median of 25: 5 right after the submits, 20 in the steady state (spaced out
  of step with the tick, so some land during a placement pass); SHOW MAX: the slowest of the 20, SHOW 1ST: the
  slowest of the 5 (while the passes still write the new tasks' wait notes);
- STOP S: one `stop` of `--stop` queued tasks;
- TICK MS/S: the scheduler's CPU per second of wall time over 10 s with the queue full (its placement passes),
  once every task's wait note is written (the passes right after the submits write them all);
- RSS MB: the scheduler's resident memory then.

`--profile FILE` runs the scheduler under py-spy (if installed) and writes its stacks there (raw, for a flame
graph); `--window-profile FILE` attaches py-spy for the TICK window alone: what the idle ticks cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402

TICK_S = 0.5
WINDOW_S = 10.0
SHOWS = 20  # shows in the steady state, after the 5 right after the submits
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def timed(call) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    await call
    return time.perf_counter() - t0


async def measure(
    sock: Path, pid: int, arrays: int, tasks: int, stop_n: int, window_profile: str | None = None
) -> list[object]:
    async with await ApiClient.connect(sock) as api:
        t0 = time.perf_counter()
        first_ids = []
        for i in range(arrays):
            spec = {"name": f"sweep{i}", "command": "sleep 600", "gpus_per_node": 1, "array": f"0-{tasks - 1}"}
            job = await asyncio.wait_for(api.call("submit", spec=spec), 600)
            first_ids.append(int(job["id"]))
        submit_s = time.perf_counter() - t0
        await asyncio.sleep(3 * TICK_S)  # a few passes over the full queue
        reads = [await timed(asyncio.wait_for(api.call("jobs", status=["running"]), 600)) for _ in range(5)]
        shows = [await timed(asyncio.wait_for(api.call("show", job=first_ids[-1] + 5), 600)) for _ in range(5)]
        # the steady state: once the last task says why it waits, every task's wait note is written (the first
        # passes after the submits write them, a cost of the submits, not of the idle ticks)
        last = first_ids[-1] + tasks - 1
        deadline = time.monotonic() + 300
        while not str((await api.call("show", job=last))["message"] or "").startswith("waiting"):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {last} never said why it waits")
            await asyncio.sleep(TICK_S)
        await asyncio.sleep(2 * TICK_S)
        # and in the steady state, with passes ticking: a show that lands during a pass waits for it
        later: list[float] = []
        for _ in range(SHOWS):
            later.append(await timed(asyncio.wait_for(api.call("show", job=first_ids[-1] + 5), 600)))
            await asyncio.sleep(TICK_S / 7)  # not in step with the tick: some land during a pass
        shows += later
        first = max(shows[:5])
        spy = None
        if window_profile:  # the steady state alone: py-spy attached for the window
            spy = await asyncio.create_subprocess_exec(
                str(ROOT / ".venv/bin/py-spy"), "record", "--pid", str(pid), "--duration", str(int(WINDOW_S)),
                "--format", "raw", "-o", window_profile, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        c0, w0 = cpu_s(pid), time.perf_counter()
        await asyncio.sleep(WINDOW_S)
        tick = (cpu_s(pid) - c0) * 1000 / (time.perf_counter() - w0)
        if spy is not None:
            await asyncio.wait_for(spy.wait(), 60)
        rss = rss_mb(pid)
        victims = [str(first_ids[0] + 100 + i) for i in range(stop_n)]
        stop_s = await timed(asyncio.wait_for(api.call("stop", jobs=victims), 600))
    return [
        arrays * tasks,
        f"{submit_s:.1f}",
        f"{statistics.median(reads):.3f}",
        f"{statistics.median(shows):.3f}",
        f"{max(later):.3f}",
        f"{first:.3f}",
        f"{stop_s:.2f}",
        f"{tick:.0f}",
        f"{rss:.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--stop", type=int, default=1000)
    parser.add_argument("--profile", help="write a py-spy flame graph of the scheduler here")
    parser.add_argument(
        "--window-profile", help="write py-spy's raw stacks of the scheduler's steady state (the TICK window) here"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftq-", dir="/tmp") as tmp:
        root = Path(tmp)
        config = {
            "state_dir": str(root / "state"),
            "nodes": [
                {"name": f"gpu{i:04d}", "host": f"127.0.{i >> 8}.{i & 255}", "port": 1}
                for i in range(1, args.nodes + 1)
            ],
            "scheduler": {"tick": f"{TICK_S}s"},
            "api": {"socket": str(root / "ft.sock")},
            # every task queued at once: over the default cap of 10,000 queued jobs per user
            "quotas": {"default_user": {"queued_jobs": args.arrays * args.tasks + 1}},
        }
        (root / "cluster.yaml").write_text(yaml.safe_dump(config))
        program = [str(ROOT / ".venv/bin/ftconsole"), "--config", str(root / "cluster.yaml"), "serve"]
        if args.profile and (spy := shutil.which("py-spy") or str(ROOT / ".venv/bin/py-spy")):
            program = [spy, "record", "--format", "raw", "-o", args.profile, "--", *program]
        with open(root / "serve.log", "w") as log:
            server = subprocess.Popen(program, stdout=subprocess.DEVNULL, stderr=log)
        try:
            sock = root / "ft.sock"
            deadline = time.monotonic() + 60
            while not sock.exists():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"serve did not start: {(root / 'serve.log').read_text()[-2000:]}")
                time.sleep(0.1)
            pid = server.pid
            if args.profile:  # py-spy's child: the scheduler
                pid = int(subprocess.check_output(["pgrep", "-P", str(server.pid)]).split()[0])
            row = asyncio.run(measure(sock, pid, args.arrays, args.tasks, args.stop, args.window_profile))
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
    columns = ["QUEUED", "SUBMIT S", "READ S", "SHOW S", "SHOW MAX", "SHOW 1ST", "STOP S", "TICK MS/S", "RSS MB"]
    print_table(columns, [row])


if __name__ == "__main__":
    main()
