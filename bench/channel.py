"""Benchmark: node channels against one command per node per tick, side by side in one run (issue 28).

    .venv/bin/python bench/channel.py [--nodes 64] [--jobs 200] [--window 20] [--repeats 5] [--lines 20]
                                      [--modes command channel] [--profile] [--printing S]

One lab cluster of `--nodes` nodes (SSH servers in a separate process, run processes real and local, GPUs
enough for `--jobs` one-GPU jobs), then for each mode, `command` (`scheduler.node_channel: false`: a
``python3 -`` on the node for each command) and `channel` (the default), an `ftconsole serve` subprocess with
the scheduler's default `tick` (2 s) and its own state_dir:

1. WATCHING: `--jobs` jobs (`sleep 3600`, one GPU) on the nodes, all running; then for `--window` seconds,
   while nothing changes, the CPU time of the serve process (SCHEDULER MS/S: /proc/PID/stat, user + system)
   and of everything else on this machine (NODES MS/S: /proc/stat, all CPUs, minus the serve process: the
   lab's SSH servers, the supervisors started per command or the channels, the run processes), each per
   second of the window; PER NODE divides the latter by the node count. The jobs are stopped after. With
   `--printing S`, each job prints a line every S seconds instead (`while :; do echo step; sleep S; done`), as a
   training job logs its steps: its output moving is what the node pushes then, instead of heartbeats.
2. EXIT -> DECIDED: `--repeats` times, a one-rank job `sh -c 'sleep S; exit 3'` (S from 2 s to 4 s in even
   steps, so that the exits fall all over a tick); from the rank's end (its run's `ended`, written by its
   supervisor on the node) to the job's end (`ended`, written by the scheduler once it decided): how long a
   rank's exit waits before the scheduler acts on it. Nothing else runs.
3. LINE -> FOLLOW: a one-rank job prints its clock (`date +%s.%N`) every 0.37 s, `--lines` times, while
   `logs --follow` reads it: from each line's time to the moment the follower has it (only the lines written
   after the follower had read the log to its end).

With more than 64 nodes, `ssh.connect_timeout` is 30 s and `probes.timeout` 120 s: the lab's one SSH server
process greets hundreds of first connections (the start-up sweep, the first probes) slowly on 2 CPUs.

Both modes run on the same lab, one after the other; each mode's jobs are stopped before the next starts.
Everything it starts is stopped at the end (serve, the lab, any `sleep 3600` of it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recovery import (  # noqa: E402
    Serve,
    connect,
    shut_down,
    wait_all_running,
    write_config,
    write_layout,
)

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import lab_up  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402

WATCH_SPEC = {"name": "bench-watch", "command": "sleep 3600", "gpus_per_node": 1}
EXIT_SPEC = {"name": "bench-exit", "gpus_per_node": 1}  # command: exit_command(round)
FOLLOW_SPEC = {"name": "bench-follow", "gpus_per_node": 1}  # command: follow_lags
MODES = {"command": False, "channel": True}
TICKS = os.sysconf("SC_CLK_TCK")
RUNNING_TIMEOUT_S = 600.0
END_TIMEOUT_S = 60.0


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_cpu() -> float:
    """Seconds of CPU used so far by everything on this machine, all CPUs (not idle, not iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICKS


def exit_command(n: int, repeats: int) -> str:
    """Round n's rank: it exits 3 after 2 s plus a part of a tick (2 s), so the exits fall all over the tick."""
    return f"sh -c 'sleep {2 + 2 * n / repeats:.2f}; exit 3'"


async def exit_rounds(api: Any, repeats: int) -> list[float]:
    """Seconds from a rank's exit to its job ended, `repeats` times."""
    out = []
    for n in range(repeats):
        job = (await api.call("submit", spec={**EXIT_SPEC, "command": exit_command(n, repeats)}))["id"]
        deadline = time.monotonic() + END_TIMEOUT_S
        while True:
            shown = await api.call("show", job=job)
            if shown["status"] not in ("queued", "running"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job} did not end in {END_TIMEOUT_S:g}s: {shown['status']}")
            await asyncio.sleep(0.2)
        ended = [r["ended"] for a in shown["attempts"] for r in a["runs"] if r["ended"]]
        if shown["status"] != "error" or not ended:
            raise SystemExit(f"job {job} ended {shown['status']}: {shown['message']}")
        out.append(shown["ended"] - max(ended))
    return out


async def follow_lags(api: Any, lines: int) -> list[float]:
    """Seconds from a line written by a rank (its time, printed) to `logs --follow` handing it over, `lines`
    lines (the lab's nodes are this machine: one clock)."""
    command = f"sh -c 'for i in $(seq {lines + 10}); do date +%s.%N; sleep 0.37; done; sleep 30'"
    job = (await api.call("submit", spec={**FOLLOW_SPEC, "command": command}))["id"]
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while True:
        shown = await api.call("show", job=job)
        if shown["status"] not in ("queued", "running"):
            raise SystemExit(f"job {job} ended {shown['status']}: {shown['message']}")
        if shown["attempts"] and all(r["state"] == "running" for r in shown["attempts"][-1]["runs"]):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} not running after {RUNNING_TIMEOUT_S:g}s")
        await asyncio.sleep(0.2)
    lags: list[float] = []
    buffered = ""
    caught_up: float | None = None  # when the follower had read what was written before it began
    stream = api.stream("logs", job=job, follow=True)
    try:
        while len(lags) < lines:
            chunk = await asyncio.wait_for(stream.__anext__(), END_TIMEOUT_S)
            now = time.time()
            buffered += chunk
            *done, buffered = buffered.split("\n")
            if caught_up is not None:
                lags.extend(now - float(line) for line in done if line.strip() and float(line) > caught_up)
            elif done:
                caught_up = now
    finally:
        await stream.aclose()
    await api.call("stop", jobs=[job])
    return lags


async def watch_cost(
    api: Any, serve: Serve, jobs: int, window: float, profile: Path | None = None, printing: float | None = None
) -> tuple[float, float]:
    """(scheduler, everything else) CPU ms per second while `jobs` jobs run and nothing changes (with `printing`,
    each job prints a line every so many seconds, as a training job logs its steps)."""
    spec = WATCH_SPEC
    if printing is not None:
        spec = {**WATCH_SPEC, "command": f"sh -c 'while :; do echo step; sleep {printing:g}; done'"}
    for _ in range(jobs):
        await api.call("submit", spec=spec)
    await wait_all_running(api, jobs, RUNNING_TIMEOUT_S)
    await asyncio.sleep(5)  # the last starts' reads settle
    pid = serve.proc.pid
    spy = None
    if profile is not None:  # py-spy's samples of the serve process during the window (its own CPU counts too)
        argv = [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(window)),
            "-r",
            "400",
            "--nonblocking",
            "-f",
            "raw",
            "-o",
            str(profile),
        ]
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    own0, all0, t0 = process_cpu(pid), machine_cpu(), time.perf_counter()
    await asyncio.sleep(window)
    if spy is not None:
        spy.wait(30)
    own1, all1, t1 = process_cpu(pid), machine_cpu(), time.perf_counter()
    spent = t1 - t0
    return (own1 - own0) / spent * 1000, ((all1 - all0) - (own1 - own0)) / spent * 1000


async def stop_all(api: Any) -> None:
    ids = [j["id"] for j in await api.call("jobs") if j["status"] in ("queued", "running")]
    if ids:
        await api.call("stop", jobs=ids)
    deadline = time.monotonic() + 120
    while any(j["status"] in ("queued", "running") for j in await api.call("jobs")):
        if time.monotonic() > deadline:
            raise SystemExit("jobs still running 120 s after their stop")
        await asyncio.sleep(1)


async def one_mode(root: Path, lab_config: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = root / mode
    folder.mkdir()
    # node_timeout as in recovery.py: 2 shared CPUs run the lab, the nodes and the scheduler
    config = write_config(folder, lab_config, {"node_channel": MODES[mode], "node_timeout": "60s"})
    if args.nodes > 64:  # the lab's one SSH server process greets hundreds of first connections slowly on 2 CPUs
        data = yaml.safe_load(config.read_text())
        data["ssh"]["connect_timeout"] = "30s"
        data["probes"]["timeout"] = "120s"
        config.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_config(config)
    serve = Serve(config, folder / "serve.log")
    try:
        api = await connect(loaded)
        try:
            profile = folder / "py-spy.txt" if args.profile else None
            own, others = await watch_cost(api, serve, args.jobs, args.window, profile, args.printing)
            print(f"  {mode}: scheduler {own:.1f} ms/s, nodes {others:.0f} ms/s", file=sys.stderr)
            await stop_all(api)
            exits = await exit_rounds(api, args.repeats)
            lags = await follow_lags(api, args.lines)
            await stop_all(api)
        finally:
            await api.close()
    finally:
        serve.stop()
    print(f"  {mode}: exit -> decided {statistics.median(exits):.2f}s; scheduler {own:.1f} ms/s", file=sys.stderr)
    return {"exits": exits, "own": own, "others": others, "lags": lags}


async def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="ftbench-channel-"))
    layout = root / "layout.yaml"
    write_layout(layout, args.nodes, args.jobs)
    lab_dir = root / "lab"
    results: dict[str, dict[str, Any]] = {}
    try:
        info = lab_up(lab_dir, layout, None, timeout=180)
        for mode in args.modes:
            results[mode] = await one_mode(root, Path(info.config_path), mode, args)
    finally:
        shut_down(lab_dir, [])
    rows = []
    for mode, r in results.items():
        exits = r["exits"]
        rows.append([
            mode, f"{statistics.median(exits):.2f}", f"{max(exits):.2f}", args.nodes, args.jobs,
            f"{r['own']:.1f}", f"{r['others']:.0f}", f"{r['others'] / args.nodes:.1f}",
            f"{statistics.median(r['lags']):.2f}", f"{max(r['lags']):.2f}",
        ])  # fmt: skip
    print_table(
        [
            "MODE",
            "EXIT->DECIDED S (MED)",
            "(MAX)",
            "NODES",
            "JOBS",
            "SCHEDULER MS/S",
            "NODES MS/S",
            "PER NODE",
            "LINE->FOLLOW S (MED)",
            "(MAX)",
        ],
        rows,
    )
    print(f"\n(folder kept: {root})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20, help="lines timed through logs --follow")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="which modes, in order")
    parser.add_argument(
        "--printing", type=float, default=None, help="the watched jobs print a line every so many seconds"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the scheduler in the window (MODE/py-spy.txt)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
