"""Benchmark: how soon a hung job and a slow job are flagged, and what watching running jobs costs (issue 13).

    .venv/bin/python bench/detection.py --what hang [--hang 10:15,10:25,10:60,60:60,60:180] [--repeats 3]
    .venv/bin/python bench/detection.py --what slow [--iterations 1,5,10,20] [--every 1] [--repeats 3]
    .venv/bin/python bench/detection.py --what cost [--nodes 64] [--jobs 500] [--ticks 30]

(`--node-channel off`, with hang and slow: `scheduler.node_channel: false`, every node read by a command each
tick, as before node channels; the default is on.)

(`--what` takes a list: `hang,slow,cost`, the default, runs all three.) Each part starts its own lab cluster
(bench/recovery.py's: SSH servers in a separate process, run processes real and local) and `ftconsole serve`
as a subprocess with the scheduler's defaults (`scheduler.tick` 2 s), its own state_dir, `ssh.python` the
venv's interpreter and `probes.interval` as said below. All times are time.time() on this one machine: the
scheduler's (an alert's `time`: the `now` of the check that stored it) and the nodes' (a rank's `started`,
written by its supervisor).

Hang (`--what hang`): each PROBE:WINDOW pair of `--hang` is `probes.interval` PROBE seconds and a job spec
with `hang_detect: WINDOW s`. The pairs with the same PROBE share one serve process on a lab of 2 nodes whose
simulated GPUs all read a flat `--util` % (97: a stuck NCCL collective; each node's gpus.json rewritten
after `lab up`, which is what the probes read). Each pair gets `--repeats` jobs (`sleep 3600`, one GPU, no
I/O after its start: its last I/O is its start), submitted one after the other spread over one probe
interval, so that they meet the probe sweeps at different phases. For each job:

    LATENCY   the rank's `started` (its last I/O) -> the job's `job_hung` alert
    OVER      LATENCY - WINDOW: what the detection adds to the window

A job gets WINDOW + 2 x PROBE + 20 s from its submit; one with no alert by then counts as not flagged.
A WINDOW under 3 x PROBE is refused at submit (it could never flag: see docs/benchmarks.md) and is shown so,
without running.

Slow (`--what slow`): for each K of `--iterations`, `--repeats` jobs (one GPU, `performance: {ratio: 1.5,
iterations: K}`) that print seed 003's line `this iteration hardware time is 10.0 and e2e time is 20.0 ms`
(ratio 2) at once and then every `--every` seconds; all of them in one serve process on 2 nodes (probes
300 s: they play no part). The first line is printed as the rank starts, so:

    LATENCY   the rank's `started` (its first slow line) -> the job's `job_slow` alert
    K-TH      when its K-th slow line was printed: (K - 1) x EVERY after the first
    OVER      LATENCY - K-TH: what the detection adds to the K iterations it needs

A job gets (K - 1) x EVERY + 3 x logwatch.SCAN_EVERY_S + 20 s from its submit.

Cost (`--what cost`): the scheduler's added cost per running job per tick, two arms with `--jobs` one-GPU
`sleep 3600` jobs on a lab of `--nodes` nodes whose GPUs add up to `--jobs` (bench/recovery.py's layout):

    on    the defaults (progress on, hang_detect on: 30 minutes), plus `performance: {}`
    off   hang_detect: off, progress: off, no performance

Each arm has its own lab and state: the jobs are submitted through the serve process's API (`scheduler`
section as bench/recovery.py's: tick 2 s, node_timeout 60 s), and once every one runs with its attempt
started, serve is stopped (SIGTERM) and the scheduler runs in this process on the same store
(`ClusterService` + `Scheduler`, as recovery.py's `tick_cost`): a probe sweep, ticks until every run is
read, then 2 ticks to settle, then `--ticks` measured ticks. Ticks are spaced as `Loop.run` spaces them when
nothing pokes it: each starts `scheduler.tick` (2 s) after the previous one ended (commands still under way
when a tick returns are waited for first, and counted in its CPU). Per tick:

    CPU MS       time.process_time() of this process (user + system): the scheduler alone (the lab and its
                 node-side Python run in other processes)
    SENT KB      what the scheduler sends over SSH: each command line plus its stdin (a status read ships the
                 node-side supervisor's source, 43-48 kB, plus its parameters: the runs, and the scans due)
    RECEIVED KB  each command's stdout plus stderr (a status read answers with every run's status, its I/O
                 counters, and what the scans found)
    IO FIELD B   of RECEIVED, the bytes of the runs' `,"io":N` fields (the hang detector's I/O counters)
    SCANS        output.log scans asked for (logwatch: at most one per run every SCAN_EVERY_S, 10 s)
    CHECK MS     after the ticks, `Watchdog.check` alone (the hang, straggler, error and slow verdicts of
                 every running job, `CHECK_CALLS` times with nothing else under way): the detectors' share

Bytes are the commands' payload as the scheduler hands it to asyncssh and gets it back (characters, all ASCII
here), before SSH's own framing, encryption and compression: a wrapper around `transport.run` counts them.
The difference of the means (on - off) divided by the number of jobs is the added cost per running job per
tick; the mean is over whole ticks, scans included (SCANS says how many). `--profile DIR` writes a cProfile
of each arm's measured ticks there (and inflates their CPU).

Everything it starts is stopped at the end, also on failure: the jobs (hang, slow), the serve processes, the
lab (`lab down` kills every process of its nodes), and any `sleep 3600` of the lab still left.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import math
import os
import pstats
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# bench/recovery.py: the lab, serve process and waits this benchmark shares (bench/ is on sys.path when run)
from recovery import (
    ADOPTION_SCHEDULER,
    TICK_DRAIN_TIMEOUT_S,
    Serve,
    connect,
    shut_down,
    wait_all_running,
    write_config,
    write_layout,
)

from ftconsole.format import print_table
from ftconsole.lab import LabPaths, lab_up
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.logwatch import SCAN_EVERY_S
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.scheduler.ssh.transport import remote_command

SMALL_LAB_NODES = 2  # hang and slow: a few jobs, 1 GPU each
API_TIMEOUT_S = 60.0  # one API call
LAB_UP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0  # the jobs' stops at the end of a part
POLL_S = 1.0  # alerts are polled this often (their time is the scheduler's, not the poll's)
COST_RUNNING_TIMEOUT_S = 900.0  # until every cost job runs (500 launches on 2 CPUs)
SETTLE_TICKS = 2
CHECK_CALLS = 20  # Watchdog.check alone, after the ticks

HANG_COMMAND = "sleep 3600"
SLOW_LINE = "this iteration hardware time is 10.0 and e2e time is 20.0 ms"  # ratio 2
SLOW_RATIO = 1.5
IO_FIELD = re.compile(r',"io":\d+')  # a run's I/O counters in a status answer (supervisor `_with_io`)

COST_ARMS: dict[str, dict[str, Any]] = {
    "on": {"performance": {}},  # progress and hang_detect: the defaults
    "off": {"hang_detect": "off", "progress": "off"},
}


async def call(api: ApiClient, op: str, **args: Any) -> Any:
    return await asyncio.wait_for(api.call(op, **args), API_TIMEOUT_S)


def med(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.1f}" if xs else "-"


def spread(xs: Sequence[float]) -> str:
    """min / median / max"""
    return f"{min(xs):.1f} / {statistics.median(xs):.1f} / {max(xs):.1f}" if xs else "-"


# ------------------------------------------------------------------------------------------------ the lab


def hold_gpus(lab_dir: Path, util: float) -> int:
    """Every simulated GPU of the lab reads `util` % from now on: each node's gpus.json (which the probe agent
    reads at each probe) rewritten atomically, without the lab's moving load. Returns the number of GPUs."""
    count = 0
    for path in sorted((LabPaths.of(lab_dir).root / "nodes").glob("*/gpus.json")):
        data = json.loads(path.read_text())
        data.pop("load", None)
        for gpu in data["gpus"]:
            gpu["utilization"] = util
            count += 1
        tmp = path.with_name(f".{path.name}.bench")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    return count


NODE_CHANNEL = True  # --node-channel off: hang and slow with `scheduler.node_channel: false` (a command per read)


def serve_config(root: Path, lab_config: Path, probe_interval: float | None) -> Path:
    """recovery.write_config with the scheduler's defaults, in `root` (its own state and socket), and
    `probes.interval` set (None: recovery's 300 s)."""
    root.mkdir(parents=True, exist_ok=True)
    path = write_config(root, lab_config, scheduler=None if NODE_CHANNEL else {"node_channel": False})
    if probe_interval is not None:
        config = yaml.safe_load(path.read_text())
        config["probes"]["interval"] = f"{probe_interval:g}s"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def with_lab(root: Path, nodes: int, gpus: int, work: Callable[[Path, Path, list[Serve]], Awaitable[Any]]) -> Any:
    """Start a lab of `nodes` nodes with `gpus` GPUs in all, run `work(lab_dir, lab_config, serves)`, and stop
    everything whatever happens: the serve processes `work` appended to `serves`, the lab, its sleeps."""
    layout = root / "layout.yaml"
    write_layout(layout, nodes, gpus)
    lab_dir = root / "lab"
    serves: list[Serve] = []
    try:
        info = await asyncio.to_thread(lab_up, lab_dir, layout, None, LAB_UP_TIMEOUT_S)
        return await work(lab_dir, Path(info.config_path), serves)
    finally:
        for serve in serves:
            serve.stop()
        shut_down(lab_dir, serves)


async def stop_jobs(api: ApiClient, jobs: Sequence[int]) -> None:
    """Stop the jobs and wait (bounded) until none runs; the lab's `down` ends whatever is left anyway."""
    if not jobs:
        return
    await call(api, "stop", jobs=list(jobs))
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        shown = [j for j in await call(api, "jobs") if j["id"] in jobs]
        if all(j["status"] not in ("queued", "running") for j in shown):
            return
        await asyncio.sleep(POLL_S)
    print(f"warning: jobs not stopped within {STOP_TIMEOUT_S:g}s; lab down ends them", file=sys.stderr)


async def started_at(api: ApiClient, job: int, timeout: float) -> float:
    """When the job's (single) rank started on its node; waits until it has."""
    deadline = time.monotonic() + timeout
    while True:
        shown = await call(api, "show", job=job)
        if shown["status"] not in ("queued", "running"):
            raise SystemExit(f"job {job} is {shown['status']}: {shown.get('message')}")
        runs = shown["attempts"][-1]["runs"] if shown["attempts"] else []
        if runs and all(r["started"] for r in runs):
            return float(min(r["started"] for r in runs))
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} not started within {timeout:g}s")
        await asyncio.sleep(0.5)


async def first_alerts(api: ApiClient, kind: str, deadlines: dict[int, float]) -> dict[int, dict[str, Any]]:
    """The first `kind` alert of each job (open or not), polling until every job has one or is past its
    deadline (time.time())."""
    found: dict[int, dict[str, Any]] = {}
    while True:
        for alert in await call(api, "alerts", all=True, limit=1000):
            if alert["kind"] == kind and alert["job"] in deadlines and alert["job"] not in found:
                found[alert["job"]] = alert
        now = time.time()
        if all(job in found or now > deadline for job, deadline in deadlines.items()):
            return found
        await asyncio.sleep(POLL_S)


async def submit_spread(api: ApiClient, specs: Sequence[dict[str, Any]], over: float) -> list[tuple[int, float]]:
    """Submit the specs one after the other, evenly spread over `over` seconds: [(job id, submit time)]."""
    out = []
    t0 = time.monotonic()
    for i, spec in enumerate(specs):
        await asyncio.sleep(max(0.0, t0 + i * over / len(specs) - time.monotonic()))
        out.append(((await call(api, "submit", spec=spec))["id"], time.time()))
    return out


# ------------------------------------------------------------------------------------------------- hang


@dataclass
class HangResult:
    probe: float
    window: float
    latencies: list[float] = field(default_factory=list)  # started -> alert, of the flagged jobs
    missed: int = 0
    waited: float = 0.0  # how long an unflagged job was given
    example: str = ""
    refused: bool = False  # under 3 probe intervals: refused at submit (it could never flag)


async def hang_group(
    root: Path,
    lab_dir: Path,
    lab_config: Path,
    serves: list[Serve],
    probe: float,
    windows: Sequence[float],
    repeats: int,
) -> list[HangResult]:
    """One serve process with `probes.interval` `probe`; `repeats` quiet jobs for each window, submitted
    interleaved and spread over one probe interval."""
    config = serve_config(root / f"p{probe:g}", lab_config, probe)
    loaded = load_config(config)
    serves.append(Serve(config, config.parent / "serve.log"))
    api = await connect(loaded)
    jobs: list[int] = []
    try:
        specs, windows_of = [], []
        for r in range(repeats):
            for w in windows:
                name = f"bench-hang-{w:g}s-{r + 1}"
                specs.append({"name": name, "command": HANG_COMMAND, "gpus_per_node": 1, "hang_detect": f"{w:g}s"})
                windows_of.append(w)
        submitted = await submit_spread(api, specs, probe)
        jobs = [job for job, _ in submitted]
        deadlines = {job: at + w + 2 * probe + 20 for (job, at), w in zip(submitted, windows_of, strict=True)}
        starts = {job: await started_at(api, job, 120.0) for job in jobs}
        alerts = await asyncio.wait_for(
            first_alerts(api, "job_hung", deadlines), max(deadlines.values()) - time.time() + API_TIMEOUT_S
        )
        results = {w: HangResult(probe, w) for w in windows}
        for job, w in zip(jobs, windows_of, strict=True):
            res = results[w]
            if job in alerts:
                res.latencies.append(alerts[job]["time"] - starts[job])
                res.example = res.example or alerts[job]["message"]
            else:
                res.missed += 1
                res.waited = max(res.waited, deadlines[job] - starts[job])
            got = f"{alerts[job]['time'] - starts[job]:.1f}s" if job in alerts else "none"
            print(f"  probe {probe:g}s, window {w:g}s: job {job} flagged: {got}", file=sys.stderr)
        return list(results.values())
    finally:
        try:
            await stop_jobs(api, jobs)
        finally:
            await api.close()
            serves[-1].stop()


def hang_pairs(text: str) -> dict[float, list[float]]:
    groups: dict[float, list[float]] = {}
    for pair in text.split(","):
        probe, _, window = pair.partition(":")
        groups.setdefault(float(probe), []).append(float(window))
    return groups


async def hang_part(root: Path, groups: dict[float, list[float]], repeats: int, util: float) -> list[HangResult]:
    most = max(len(ws) for ws in groups.values()) * repeats

    async def work(lab_dir: Path, lab_config: Path, serves: list[Serve]) -> list[HangResult]:
        print(f"  {hold_gpus(lab_dir, util)} GPUs held at a flat {util:g} %", file=sys.stderr)
        out: list[HangResult] = []
        for probe, windows in sorted(groups.items()):
            out.extend(HangResult(probe, w, refused=True) for w in windows if w < 3 * probe)
            allowed = [w for w in windows if w >= 3 * probe]
            if allowed:
                out.extend(await hang_group(root, lab_dir, lab_config, serves, probe, allowed, repeats))
        return sorted(out, key=lambda r: (r.probe, r.window))

    results: list[HangResult] = await with_lab(root, SMALL_LAB_NODES, most, work)
    return results


def hang_table(results: Sequence[HangResult], repeats: int, util: float) -> None:
    rows = []
    for r in results:
        flagged = "refused" if r.refused else f"{len(r.latencies)} of {len(r.latencies) + r.missed}"
        over = spread([x - r.window for x in r.latencies]) if r.latencies else f"none within {r.waited:.0f}"
        if r.refused:
            over = "- (under 3 probe intervals: refused at submit)"
        rows.append([f"{r.probe:g}", f"{r.window:g}", f"{r.window / r.probe:.1f}", flagged, med(r.latencies), over])
    print_table(
        ["PROBE S", "WINDOW S", "WINDOW/PROBE", "FLAGGED", "LATENCY S (MEDIAN)", "OVER S (MIN / MED / MAX)"], rows
    )
    print(f"\n(GPUs flat at {util:g} %; {repeats} jobs per row, `sleep 3600`; LATENCY: rank started -> job_hung alert)")
    for r in results:
        if r.example:
            print(f"\nwindow {r.window:g}s, probe {r.probe:g}s: {r.example}")
            break


# ------------------------------------------------------------------------------------------------- slow


@dataclass
class SlowResult:
    iterations: int
    every: float
    latencies: list[float] = field(default_factory=list)  # first slow line -> alert
    missed: int = 0


async def slow_part(root: Path, counts: Sequence[int], every: float, repeats: int) -> list[SlowResult]:
    command = f"sh -c 'while :; do echo \"{SLOW_LINE}\"; sleep {every:g}; done'"

    async def work(lab_dir: Path, lab_config: Path, serves: list[Serve]) -> list[SlowResult]:
        config = serve_config(root / "slow", lab_config, None)
        loaded = load_config(config)
        serves.append(Serve(config, config.parent / "serve.log"))
        api = await connect(loaded)
        jobs: list[int] = []
        try:
            specs, k_of = [], []
            for r in range(repeats):
                for k in counts:
                    perf = {"ratio": SLOW_RATIO, "iterations": k}
                    specs.append({"name": f"bench-slow-{k}-{r + 1}", "command": command, "performance": perf})
                    k_of.append(k)
            submitted = await submit_spread(api, specs, SCAN_EVERY_S)
            jobs = [job for job, _ in submitted]
            deadlines = {
                job: at + (k - 1) * every + 3 * SCAN_EVERY_S + 20 for (job, at), k in zip(submitted, k_of, strict=True)
            }
            starts = {job: await started_at(api, job, 120.0) for job in jobs}
            alerts = await asyncio.wait_for(
                first_alerts(api, "job_slow", deadlines), max(deadlines.values()) - time.time() + API_TIMEOUT_S
            )
            results = {k: SlowResult(k, every) for k in counts}
            for job, k in zip(jobs, k_of, strict=True):
                if job in alerts:
                    results[k].latencies.append(alerts[job]["time"] - starts[job])
                else:
                    results[k].missed += 1
                got = f"{alerts[job]['time'] - starts[job]:.1f}s" if job in alerts else "none"
                print(f"  K {k}: job {job} flagged (from its first slow line): {got}", file=sys.stderr)
            return list(results.values())
        finally:
            try:
                await stop_jobs(api, jobs)
            finally:
                await api.close()
                serves[-1].stop()

    results: list[SlowResult] = await with_lab(root, SMALL_LAB_NODES, len(counts) * repeats, work)
    return results


def slow_table(results: Sequence[SlowResult], repeats: int) -> None:
    rows = []
    for r in results:
        kth = (r.iterations - 1) * r.every
        over = spread([x - kth for x in r.latencies])
        flagged = f"{len(r.latencies)} of {len(r.latencies) + r.missed}"
        rows.append([r.iterations, f"{r.every:g}", flagged, f"{kth:g}", med(r.latencies), over])
    print_table(["K", "EVERY S", "FLAGGED", "K-TH LINE S", "LATENCY S (MEDIAN)", "OVER S (MIN / MED / MAX)"], rows)
    print(
        f"\n({repeats} jobs per row, ratio 2 against performance.ratio {SLOW_RATIO:g}; LATENCY: first slow line -> "
        f"job_slow alert; logwatch.SCAN_EVERY_S {SCAN_EVERY_S:g} s)"
    )


# ------------------------------------------------------------------------------------------------- cost


@dataclass
class Tick:
    cpu: float
    wall: float  # the tick, commands waited for
    commands: int = 0
    sent: int = 0
    received: int = 0
    io_field: int = 0
    scans: int = 0


def size(text: str | None) -> int:
    if not text:
        return 0
    return len(text) if text.isascii() else len(text.encode())


@dataclass
class Arm:
    ticks: list[Tick]
    checks: list[float]  # CPU of Watchdog.check alone, each call


async def measure_ticks(loaded: LoadedConfig, ticks: int, profile: Path | None) -> Arm:
    """In this process, on the store serve left: the steady-state ticks, each with its CPU, SSH commands and
    bytes, and the scans it asked for; then the watchdog's check alone, `CHECK_CALLS` times."""
    async with ClusterService.open(loaded) as svc:
        current = Tick(0.0, 0.0)
        run = svc.transport.run

        async def counted(node: Any, argv: Sequence[str], **kwargs: Any) -> Any:
            current.commands += 1
            current.sent += size(remote_command(argv)) + size(kwargs.get("input"))
            result = await run(node, argv, **kwargs)
            current.received += size(result.stdout) + size(result.stderr)
            current.io_field += sum(len(m) for m in IO_FIELD.findall(result.stdout))
            return result

        svc.transport.run = counted  # type: ignore[method-assign]
        sched = Scheduler(svc)
        executor = sched.loop.executor
        scans = executor.scans

        def counted_scans(runs: Any) -> dict[str, Any]:
            out = scans(runs)
            current.scans += len(out)
            return out

        executor.scans = counted_scans

        async def drain() -> None:
            if executor._tasks:
                await asyncio.wait(list(executor._tasks.values()), timeout=TICK_DRAIN_TIMEOUT_S)

        period = loaded.cluster.scheduler.tick
        out: list[Tick] = []
        profiler = cProfile.Profile() if profile is not None else None
        try:
            await svc.probe()  # as serve's start: which nodes are healthy
            for _ in range(10):  # until every run has been read once (recovery.tick_cost)
                await sched.tick()
                await drain()
                if sched.loop.adopted_s is not None:
                    break
            for i in range(SETTLE_TICKS + ticks):
                await asyncio.sleep(period)  # Loop.run: the next tick `scheduler.tick` after this one ended
                current = Tick(0.0, 0.0)
                if profiler is not None and i >= SETTLE_TICKS:
                    profiler.enable()
                c0, w0 = time.process_time(), time.perf_counter()
                await sched.tick()
                await drain()
                current.cpu, current.wall = time.process_time() - c0, time.perf_counter() - w0
                if profiler is not None:
                    profiler.disable()
                if i >= SETTLE_TICKS:
                    out.append(current)
            checks = []
            for _ in range(CHECK_CALLS):  # nothing under way: the drain above waited for every command
                c0 = time.process_time()
                await sched.loop.watchdog.check()
                checks.append(time.process_time() - c0)
        finally:
            await sched.loop.close()
        if profiler is not None and profile is not None:
            profiler.dump_stats(profile)
            pstats.Stats(str(profile), stream=sys.stderr).sort_stats("cumulative").print_stats(r"scheduler/", 25)
        return Arm(out, checks)


async def cost_arm(root: Path, arm: str, nodes: int, jobs: int, ticks: int, profile: Path | None) -> Arm:
    spec = {"name": f"bench-cost-{arm}", "command": HANG_COMMAND, "gpus_per_node": 1, **COST_ARMS[arm]}

    async def work(lab_dir: Path, lab_config: Path, serves: list[Serve]) -> Arm:
        config = write_config(root, lab_config, scheduler=ADOPTION_SCHEDULER)
        loaded = load_config(config)
        serves.append(Serve(config, root / "serve.log"))
        api = await connect(loaded)
        try:
            t0 = time.perf_counter()
            for _ in range(jobs):
                await call(api, "submit", spec=spec)
            await asyncio.wait_for(
                wait_all_running(api, jobs, COST_RUNNING_TIMEOUT_S), COST_RUNNING_TIMEOUT_S + API_TIMEOUT_S
            )
            print(
                f"  {arm}: {jobs} jobs running {time.perf_counter() - t0:.0f}s after the first submit", file=sys.stderr
            )
        finally:
            await api.close()
        serves[-1].stop()  # the store is this process's now
        return await measure_ticks(loaded, ticks, profile)

    result: Arm = await with_lab(root, nodes, jobs, work)
    return result


def cost_table(arms: dict[str, Arm], nodes: int, jobs: int) -> None:
    def mean(ts: Sequence[Tick], what: Callable[[Tick], float]) -> float:
        return statistics.mean(what(t) for t in ts)

    def mm(ts: Sequence[Tick], what: Callable[[Tick], float], scale: float = 1.0) -> str:
        xs = [what(t) * scale for t in ts]
        return f"{statistics.mean(xs):.0f} / {max(xs):.0f}" if xs else "-"

    def cpu(t: Tick) -> float:
        return t.cpu

    rows = []
    for name, arm in arms.items():
        ts = arm.ticks
        scanning = [t for t in ts if t.scans]
        rows.append(
            [
                name,
                nodes,
                jobs,
                len(ts),
                mm(ts, cpu, 1000),
                mm(scanning, cpu, 1000),
                mm([t for t in ts if not t.scans], cpu, 1000),
                f"{statistics.mean(arm.checks) * 1000:.1f}",
                mm(ts, lambda t: t.wall, 1000),
                f"{mean(ts, lambda t: t.commands):.1f}",
                f"{mean(ts, lambda t: t.sent) / 1000:.1f}",
                f"{mean(ts, lambda t: t.received) / 1000:.1f}",
                f"{mean(ts, lambda t: t.io_field):.0f}",
                f"{mean(ts, lambda t: t.scans):.0f} ({len(scanning)})",
            ]
        )
    headers = ["ARM", "NODES", "JOBS", "TICKS", "CPU MS", "CPU MS SCAN TICKS", "CPU MS OTHERS", "CHECK MS"]
    print_table([*headers, "WALL MS", "CMDS", "SENT KB", "RECEIVED KB", "IO FIELD B", "SCANS (TICKS)"], rows)
    print(
        "\n(MS: mean / max per tick; CHECK MS: Watchdog.check alone, mean of "
        f"{CHECK_CALLS}; KB, B, CMDS, SCANS: mean per tick; (TICKS): ticks with scans)"
    )
    if "on" in arms and "off" in arms:
        on, off = arms["on"].ticks, arms["off"].ticks
        diff = (mean(on, cpu) - mean(off, cpu)) / jobs * 1e6
        error = math.hypot(*(statistics.stdev(t.cpu for t in ts) / math.sqrt(len(ts)) for ts in (on, off)))
        check = (statistics.mean(arms["on"].checks) - statistics.mean(arms["off"].checks)) / jobs * 1e6
        sent = (mean(on, lambda t: t.sent) - mean(off, lambda t: t.sent)) / jobs
        got = (mean(on, lambda t: t.received) - mean(off, lambda t: t.received)) / jobs
        io = mean(on, lambda t: t.io_field) / jobs
        print(
            f"\nadded per running job per tick (on - off, / {jobs}): CPU {diff:.0f} +- {error / jobs * 1e6:.0f} us "
            f"(+- one standard error), of it Watchdog.check {check:.0f} us; SSH sent {sent:.1f} B, received "
            f"{got:.1f} B; the I/O counters ({io:.1f} B a job received) are read in both arms"
        )


# ------------------------------------------------------------------------------------------------- main


def temp_root(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: the API socket path is AF_UNIX


def in_root(prefix: str, run: Callable[[Path], Coroutine[Any, Any, Any]]) -> Any:
    root = temp_root(prefix)
    try:
        result = asyncio.run(run(root))
    except BaseException:
        print(f"kept {root} (serve logs, lab/lab.log)", file=sys.stderr)
        raise
    shutil.rmtree(root, ignore_errors=True)
    return result


def cost_run(arm: str, args: argparse.Namespace) -> Callable[[Path], Coroutine[Any, Any, Arm]]:
    profile = args.profile / f"cost-{arm}.pstats" if args.profile is not None else None
    return lambda root: cost_arm(root, arm, args.nodes, args.jobs, args.ticks, profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", default="hang,slow,cost", help="hang, slow, cost, or a list of them")
    parser.add_argument("--repeats", type=int, default=3, help="jobs per row (hang, slow)")
    parser.add_argument("--hang", default="10:15,10:25,10:60,60:60,60:180", help="PROBE:WINDOW seconds, ...")
    parser.add_argument("--util", type=float, default=97.0, help="the flat GPU utilisation, % (hang)")
    parser.add_argument("--iterations", default="1,5,10,20", help="performance.iterations K, ... (slow)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between slow lines (slow)")
    parser.add_argument("--nodes", type=int, default=64, help="lab nodes (cost)")
    parser.add_argument("--jobs", type=int, default=500, help="running jobs (cost)")
    parser.add_argument("--ticks", type=int, default=30, help="measured ticks per arm (cost)")
    parser.add_argument("--profile", type=Path, help="a folder for cProfile stats of the ticks (cost)")
    parser.add_argument(
        "--node-channel",
        choices=["on", "off"],
        default="on",
        help="hang, slow: node channels (the default) or a command per node per tick",
    )
    args = parser.parse_args()
    global NODE_CHANNEL
    NODE_CHANNEL = args.node_channel == "on"
    if not NODE_CHANNEL and "cost" in args.what:
        parser.error("--node-channel off goes with --what hang,slow")
    what = [w.strip() for w in args.what.split(",")]
    unknown = set(what) - {"hang", "slow", "cost"}
    if unknown:
        parser.error(f"--what: unknown {', '.join(sorted(unknown))}")

    hang: list[HangResult] = []
    slow: list[SlowResult] = []
    cost: dict[str, Arm] = {}
    if "hang" in what:
        groups = hang_pairs(args.hang)
        hang = in_root("ftdh-", lambda root: hang_part(root, groups, args.repeats, args.util))
    if "slow" in what:
        counts = [int(k) for k in args.iterations.split(",")]
        slow = in_root("ftds-", lambda root: slow_part(root, counts, args.every, args.repeats))
    if "cost" in what:
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        for arm in ("off", "on"):
            cost[arm] = in_root(f"ftdc{arm}-", cost_run(arm, args))

    command = " ".join([".venv/bin/python", "bench/detection.py", *sys.argv[1:]])
    print(f"{command}\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; seconds unless marked")
    if hang:
        print()
        hang_table(hang, args.repeats, args.util)
    if slow:
        print()
        slow_table(slow, args.repeats)
    if cost:
        print()
        cost_table(cost, args.nodes, args.jobs)


if __name__ == "__main__":
    main()
