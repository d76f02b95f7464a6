"""Benchmark: re-adoption after a scheduler kill -9, and the cost of one tick with running jobs; or the time from
a node's death to its job running again elsewhere (`--what node-death`).

    .venv/bin/python bench/recovery.py [--nodes 8,64] [--jobs 1,200] [--ticks 20]
    .venv/bin/python bench/recovery.py --what node-death [--nodes 8,64] [--repeats 5] [--layout own-home,shared-home]
                                       [--modes channel|command|command,channel] [--fault kill|hang]

Re-adoption (`--what adoption`, the default):

For each node count N it starts a lab cluster of N nodes (SSH servers in a separate process, run processes
real and local) whose GPUs add up to the largest job count, so that with that many one-GPU jobs every node
holds runs (8 nodes: 25 GPUs each; 64 nodes: 8 with 4 GPUs and 56 with 3). Then, with `ftconsole serve` as
a subprocess (its own state_dir, `probes.interval` 300 s so no periodic probe runs during the measurements):

1. Re-adoption, for each job count J (in increasing order): submit jobs (`sleep 3600`, single mode, one GPU)
   through the API until J run, wait until every one is `running` with its attempt started (every rank read
   `running`; TO RUNNING S: from the submits' end, polled each second), kill -9 the serve process and start
   a new one at once. SCHEDULER S is the scheduler's own figure, its log line `adopted N running run(s) on M
   node(s) X.XXs after start`: from the loop's creation (store and API open) to the end of the first tick
   that has read every running run (the first probe sweep runs alongside; only placement waits for it).
   FROM KILL S is the wall time from the kill to that line, which adds the new process's start
   (interpreter, imports, config, store).
2. With the largest J still running, the serve process is stopped (SIGTERM) and the scheduler runs in this
   process on the same store (`ClusterService` + `Scheduler`, no API), for the breakdown of the adoption
   figure: a cold probe sweep (connects included) and the first tick are timed, with the SSH commands of
   that tick (a read per node with runs; the start-up sweep for runs to fence waits until they are back), and
   whether its reads all came back within the tick's wait for them (`executor.ACT_WAIT_S`, 2 s).
3. Then `--ticks` steady-state ticks (nothing changes), each timed with `time.process_time()` (CPU of this
   process, user + system) and `time.perf_counter()`, and each SSH command counted (a wrapper around
   `transport.run`). LAST ANSWER MS: from the tick's start to the last answer of its commands (the part of
   the wall time spent on the nodes). Commands still under way when a tick returns (LATE: ticks where any
   were) are waited for before the next tick; that wait is counted in CPU MS and ANSWERED MS, not WALL MS.

Node death (`--what node-death`): for each node count N and each `--layout` (`own-home`: every node has a
home folder of its own; `shared-home`: every node's HOME is the same folder, as with an NFS /home, the lab
layout's `shared_home: true`), and each of `--modes` (`channel`: node channels, the default; `command`:
`scheduler.node_channel: false`, a command per node per tick), a lab of N nodes of 8 GPUs and `ftconsole serve` with
the scheduler's default settings (`tick` 2 s, `node_timeout` 10 s; only `probes.interval` 300 s, as above: a
lab probe sweep loads the 2 shared CPUs, and `ssh.python`). Each of `--repeats` rounds submits a 2-node
pytorch-mode job (`sleep 3600`, one GPU per node, `fault_tolerance: {retries: 3}`), waits until its attempt is
started, kills the node of one rank (`lab_fault(..., Fault.kill())`, as `ftconsole lab fault NODE --kill`:
SSH refused, the node's processes SIGKILLed; ranks 1 and 0 in turn), and waits until a new attempt is started
with every rank `running`. With `--fault hang` the node freezes instead (`Fault.hang()`, `lab fault --hang`: its
SSH server and processes stopped, connections open and silent: nothing tells the scheduler but the silence), and
once the job runs again elsewhere it is healed, so that it answers and its stopped rank is fenced. With `--fault
pause` the node freezes the same way for PAUSE_S (5 s) and is healed: that must cost nothing (no stop, no new
attempt, the node in service, no warning in the log); the table counts what it cost. `--fault hang,pause` runs
both, one lab each, side by side. Then the job
is stopped; the dead node stays dead (isolated), so a round needs two healthy nodes besides the dead ones
(repeats <= N - 2). The times come from the store (`show`, and the runs'
`stop_sent` read from state.db), all on this machine's clock:

    DETECT    kill -> the dead rank written `lost` (its run's `ended`): bounded by `scheduler.node_timeout`
    DECIDE    lost -> the attempt ended `requeued` (the other rank stopped first: its process must be down)
    RELAUNCH  requeued -> the new attempt `started` (placement, pre-flight probe, starts, the read that sees
              every rank running)

and the steps inside them (second table). Each round also counts what exists afterwards and reports what is
wrong (CHECKS: the rounds with a problem; each problem is printed, with the job's `show`): the dead rank not
`lost` or its attempt not `requeued`, a rank on a live node (the old attempt's other rank, the new attempt's)
that did not end `exited` by the stop's SIGTERM (a fence SIGKILLs), a new rank on a dead node, a Fenced event,
the job not `stopped` after its stop, a `sleep 3600` of the lab still alive 10 s after the stop; and at the
end the serve log's WARNING and ERROR lines that name no dead node, or speak of fencing, strays, foreign runs
or a traceback. A round whose job ends or does
not run again ends the bench, with the job's `show`; the folder (serve.log, lab/lab.log) is kept.

The steps inside the parts (second table): lost -> Stopping event, Stopping -> the other rank's stop confirmed
by its node (`stop_sent`), -> its process ended (node's time), -> requeued; requeued -> new attempt created
(placed), -> last new rank started (node's time), -> attempt `started`.

Everything it starts is stopped at the end: the serve process, the lab (`lab down` kills every process of
its nodes), and any `sleep 3600` of this lab still left (it says so if it had to).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import Fault, lab_down, lab_fault, lab_up  # noqa: E402
from ftconsole.scheduler.errors import FtError  # noqa: E402
from ftconsole.scheduler.jobops import Scheduler  # noqa: E402
from ftconsole.scheduler.nodeops import ClusterService  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.spec.config import LoadedConfig, load_config  # noqa: E402
from ftconsole.scheduler.store.db import STORE_FILE  # noqa: E402

SPEC = {"name": "bench-recovery", "command": "sleep 3600", "gpus_per_node": 1}
SLEEP_ARGV = b"sleep\x003600\x00"
ADOPTED = re.compile(r"adopted (\d+) running run\(s\) on (\d+) node\(s\) ([0-9.]+)s after start")
RUNNING_TIMEOUT_S = 300.0
ADOPT_TIMEOUT_S = 180.0
SERVE_STOP_TIMEOUT_S = 30.0
TICK_DRAIN_TIMEOUT_S = 60.0

ADOPTION_SCHEDULER = {"tick": "2s", "node_timeout": "60s"}  # 2 shared CPUs: see docs/benchmarks.md

# node death: a 2-node job that a node's death sends back to the queue (docs/jobs.md, "When a job fails")
DEATH_SPEC = {
    "name": "bench-node-death",
    "mode": "pytorch",
    "nodes": 2,
    "gpus_per_node": 1,
    "command": "sleep 3600",
    "fault_tolerance": {"retries": 3},
}
DEATH_GPUS_PER_NODE = 8
LAYOUTS = ("own-home", "shared-home")  # --layout: the lab layout's shared_home false / true
STOPPED_TIMEOUT_S = 60.0
LEFTOVER_TIMEOUT_S = 10.0  # after the job's stop, until none of its processes is left
DEATH_TIMEOUT_S = 120.0  # from the kill until the job runs again
FAULT = "kill"  # --fault: what befalls the node (kill: it dies; hang: it freezes)
POLL_S = 0.5
PAUSE_S = 5.0  # --fault pause: how long the node freezes (less than node_timeout less a heartbeat: free)
PAUSE_WATCH_S = 15.0  # then watched this long (past node_timeout) for anything it cost

# the lab layout's `cluster:` section: BUILTIN_LAYOUT's probe thresholds (so lab nodes probe healthy)
CLUSTER = {
    "probes": {
        "interval": "300s",
        "timeout": "20s",
        "cache_dir": "~/cache",
        "thresholds": {
            "disk_root_gb": 1,
            "disk_shm_gb": 0.01,
            "disk_cache_gb": 1,
            "ulimit_memlock_kb": 32,
            "ulimit_nofile": 512,
            "ulimit_stack_kb": 1024,
            "ulimit_nproc": 256,
            "load_warn_per_cpu": 8,
        },
    },
}


# ------------------------------------------------------------------------------------------------ the lab


def node_groups(nodes: int, gpus: int) -> list[tuple[str, int]]:
    """`gpus` GPUs shared over `nodes` nodes as evenly as possible: [(node set, GPUs per node)]."""
    each, extra = divmod(gpus, nodes)
    if each > 64 or (each == 64 and extra):
        raise SystemExit(f"{gpus} GPUs do not fit on {nodes} nodes of at most 64 GPUs")
    width = 2 if nodes < 100 else len(str(nodes))
    out = []
    if extra:
        out.append((f"lab[{1:0{width}d}-{extra:0{width}d}]", each + 1))
    if nodes > extra:
        out.append((f"lab[{extra + 1:0{width}d}-{nodes:0{width}d}]", max(each, 1)))
    return out


def write_layout(path: Path, nodes: int, gpus: int, *, shared_home: bool = False) -> None:
    groups = node_groups(nodes, gpus)
    layout: dict[str, Any] = {
        "shared_home": shared_home,
        "nodes": [
            {"name": name, "pool": f"g{n}", "gpus": n, "gpu_model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
            for name, n in groups
        ],
        "cluster": {
            **CLUSTER,
            "pools": {f"g{n}": {"thresholds": {"gpus_expected": n}, "schedule_degraded": True} for _, n in groups},
        },
    }
    path.write_text(yaml.safe_dump(layout, sort_keys=False))


def write_config(root: Path, lab_config: Path, scheduler: dict[str, Any] | None = ADOPTION_SCHEDULER) -> Path:
    """The lab's cluster.yaml with the scheduler's own state_dir, a short socket path and the bench's settings
    (`scheduler`: its section; None: the defaults)."""
    config = yaml.safe_load(lab_config.read_text())
    config["state_dir"] = str(root / "state")
    config["api"] = {"socket": str(root / "ft.sock")}
    config["ssh"]["python"] = sys.executable  # not a pyenv shim: each node command starts this interpreter
    config["probes"]["interval"] = "300s"
    if scheduler is not None:
        config["scheduler"] = scheduler
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def leftover_sleeps(lab_dir: Path) -> list[int]:
    """Pids of `sleep 3600` started on this lab's nodes (their environment or folder names the lab)."""
    out = []
    mark = str(lab_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != SLEEP_ARGV:
                continue
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd").encode()
        except OSError:
            continue
        if mark in environ or cwd.startswith(mark):
            out.append(int(entry.name))
    return out


# ------------------------------------------------------------------------------------------- serve process


class Serve:
    """`ftconsole serve` as a subprocess; its output lines, each with the time it was read, also go to `log`."""

    def __init__(self, config: Path, log: Path) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("FTCONSOLE_FAILPOINTS", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "serve"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(log,), daemon=True)
        self._reader.start()

    def _read(self, log: Path) -> None:
        assert self.proc.stdout is not None
        with open(log, "a") as out:
            for raw in self.proc.stdout:
                now = time.perf_counter()
                line = raw.decode(errors="replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                with self._cond:
                    self.lines.append((now, line))
                    self._cond.notify_all()

    def wait_line(self, pattern: re.Pattern[str], timeout: float) -> tuple[float, re.Match[str]]:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for at, line in self.lines[seen:]:
                    if match := pattern.search(line):
                        return at, match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(line for _, line in self.lines[-15:])
                    raise SystemExit(f"serve (pid {self.proc.pid}) printed no {pattern.pattern!r}:\n{tail}")
                self._cond.wait(min(left, 1.0))

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(SERVE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._reader.join(5)


async def connect(loaded: LoadedConfig, timeout: float = 60.0) -> ApiClient:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await ApiClient.connect(loaded.socket_path)
        except (FtError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def wait_all_running(api: ApiClient, count: int, timeout: float) -> None:
    """Until `count` jobs run with their attempt started (every rank read `running`); any other end fails."""
    deadline = time.monotonic() + timeout
    confirmed: set[int] = set()
    while True:
        jobs = await api.call("jobs")
        bad = [j for j in jobs if j["status"] not in ("queued", "running")]
        if bad:
            raise SystemExit(f"job {bad[0]['id']} is {bad[0]['status']}: {bad[0]['message']}")
        for job in jobs:
            if job["status"] != "running" or job["id"] in confirmed:
                continue
            shown = await api.call("show", job=job["id"])
            attempt = shown["attempts"][-1] if shown["attempts"] else None
            if attempt and attempt["started"] and all(r["state"] == "running" for r in attempt["runs"]):
                confirmed.add(job["id"])
        if len(confirmed) >= count:
            return
        if time.monotonic() > deadline:
            waiting = [j for j in jobs if j["id"] not in confirmed][:3]
            raise SystemExit(f"{len(confirmed)} of {count} jobs running after {timeout:g}s; e.g. {waiting}")
        await asyncio.sleep(1.0)


# -------------------------------------------------------------------------------------------- measurements


async def adoption_rounds(
    root: Path, config: Path, loaded: LoadedConfig, nodes: int, counts: Sequence[int], serves: list[Serve]
) -> list[list[object]]:
    """The re-adoption rows; each serve process started is appended to `serves` (the caller stops them)."""
    rows: list[list[object]] = []
    generation = 0
    serve = Serve(config, root / f"serve-{generation}.log")
    serves.append(serve)
    submitted = 0
    for count in counts:
        api = await connect(loaded)
        try:
            for _ in range(count - submitted):
                await api.call("submit", spec=SPEC)
            submitted = max(submitted, count)
            started = time.perf_counter()
            await wait_all_running(api, count, RUNNING_TIMEOUT_S)
            to_running = time.perf_counter() - started
        finally:
            await api.close()
        killed = time.perf_counter()
        serve.kill9()
        generation += 1
        serve = Serve(config, root / f"serve-{generation}.log")
        serves.append(serve)
        at, match = serve.wait_line(ADOPTED, ADOPT_TIMEOUT_S)
        adopted, on_nodes, own = int(match.group(1)), int(match.group(2)), float(match.group(3))
        if adopted != count:
            print(f"warning: {nodes} nodes: adopted {adopted} runs, expected {count}", file=sys.stderr)
        rows.append([nodes, count, on_nodes, adopted, f"{own:.2f}", f"{at - killed:.2f}", f"{to_running:.1f}"])
        print(f"  {nodes} nodes, {count} jobs: adopted {adopted} on {on_nodes} nodes, {own:.2f}s", file=sys.stderr)
    return rows


async def tick_cost(loaded: LoadedConfig, nodes: int, jobs: int, ticks: int) -> tuple[list[object], list[object]]:
    """The in-process breakdown (cold probe, first tick) and the steady-state tick's CPU, wall and commands."""
    async with ClusterService.open(loaded) as svc:
        commands: list[str] = []
        answers: list[float] = []  # when each command's answer came (perf_counter)
        run = svc.transport.run

        async def counted(node: Any, argv: Sequence[str], **kwargs: Any) -> Any:
            commands.append(node.name)
            try:
                return await run(node, argv, **kwargs)
            finally:
                answers.append(time.perf_counter())

        svc.transport.run = counted  # type: ignore[method-assign]
        sched = Scheduler(svc)
        executor = sched.loop.executor

        async def drain() -> None:
            if executor._tasks:
                await asyncio.wait(list(executor._tasks.values()), timeout=TICK_DRAIN_TIMEOUT_S)

        try:
            t0 = time.perf_counter()
            await svc.probe()
            probe_s = time.perf_counter() - t0
            del commands[:]
            t0 = time.perf_counter()
            await sched.tick()
            first_s = time.perf_counter() - t0
            first_cmds = len(commands)
            in_first = sched.loop.adopted_s is not None
            # a read that outlasts the tick's wait (ACT_WAIT_S) is observed by a later tick: tick until adopted
            for _ in range(10):
                await drain()
                await sched.tick()
                if sched.loop.adopted_s is not None:
                    break
            await drain()
            await sched.tick()  # one more before measuring: the start-up sweeps are done by now
            await drain()
            cpu, wall, last, answered, cmds, late = [], [], [], [], [], []
            for _ in range(ticks):
                del commands[:], answers[:]
                c0, w0 = time.process_time(), time.perf_counter()
                await sched.tick()
                w1 = time.perf_counter()
                late.append(len(executor._tasks))
                await drain()
                w2 = time.perf_counter()
                cpu.append(time.process_time() - c0)
                wall.append(w1 - w0)
                last.append(max(answers, default=w0) - w0)
                answered.append(w2 - w0)
                cmds.append(len(commands))
        finally:
            await sched.loop.close()
    ms = lambda xs: f"{statistics.mean(xs) * 1000:.0f} / {max(xs) * 1000:.0f}"  # noqa: E731
    breakdown = [
        nodes,
        jobs,
        f"{probe_s:.2f}",
        f"{first_s:.2f}",
        first_cmds,
        "yes" if in_first else "no",
    ]
    cost = [
        nodes,
        jobs,
        ticks,
        ms(cpu),
        ms(wall),
        ms(last),
        ms(answered),
        f"{statistics.mean(cmds):.1f} / {max(cmds)}",
        sum(1 for n in late if n),
    ]
    return breakdown, cost


async def one_cluster(
    root: Path, nodes: int, counts: Sequence[int], ticks: int
) -> tuple[list[list[object]], list[object], list[object]]:
    layout = root / "layout.yaml"
    write_layout(layout, nodes, max(counts))
    lab_dir = root / "lab"
    serves: list[Serve] = []
    try:
        info = lab_up(lab_dir, layout, None, timeout=120)
        config = write_config(root, Path(info.config_path))
        loaded = load_config(config)
        rows = await adoption_rounds(root, config, loaded, nodes, counts, serves)
        serves[-1].stop()  # the store is the in-process scheduler's now
        breakdown, cost = await tick_cost(loaded, nodes, max(counts), ticks)
        return rows, breakdown, cost
    finally:
        shut_down(lab_dir, serves)


def shut_down(lab_dir: Path, serves: Sequence[Serve]) -> None:
    """Kill the serve processes still running, stop the lab, and any `sleep 3600` of it that is left."""
    for serve in serves:
        if serve.proc.poll() is None:
            serve.kill9()
    before = leftover_sleeps(lab_dir)  # the check below finds what lab down should end
    print(f"  {len(before)} `sleep 3600` of this lab before lab down", file=sys.stderr)
    lab_down(lab_dir)
    left = leftover_sleeps(lab_dir)
    if left:
        print(f"warning: {len(left)} `sleep 3600` left after lab down; killing {left[:10]}", file=sys.stderr)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ node death

# (part, step, start, end): durations between the timestamps `death_times` collects, in order
PARTS = ["DETECT", "DECIDE", "RELAUNCH", "TOTAL"]
STEPS = [
    ("DETECT", "kill (freeze) -> rank lost", "killed", "lost"),
    ("DECIDE", "lost -> Stopping (other ranks)", "lost", "stopping"),
    ("DECIDE", "Stopping -> stop confirmed", "stopping", "stop_sent"),
    ("DECIDE", "stop confirmed -> rank ended (node)", "stop_sent", "other_ended"),
    ("DECIDE", "rank ended -> requeued", "other_ended", "requeued"),
    ("RELAUNCH", "requeued -> placed", "requeued", "placed"),
    ("RELAUNCH", "placed -> pre-flight done", "placed", "preflight"),
    ("RELAUNCH", "pre-flight -> ranks started (node)", "preflight", "ranks_started"),
    ("RELAUNCH", "ranks started -> attempt started", "ranks_started", "running"),
]
BOUNDS = {
    "DETECT": "a node proven down (its connection lost, its SSH port refusing) at once: with channels when the "
    "connection drops, else at the first read (one a scheduler.tick, 2 s); one that hangs after scheduler.node_timeout",
    "DECIDE": "the stop sent at once (the loop is poked); the "
    "other rank's exit after SIGTERM (scheduler.stop_grace, 30 s, then SIGKILL)",
    "RELAUNCH": "the pre-flight probe (probes.timeout), the starts (ssh.command_timeout)",
}


class RoundFailed(SystemExit):
    """A node-death round that cannot go on: the job ended, or did not run again; with the job's `show`."""

    def __init__(self, message: str, shown: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.shown = shown


def dump_show(shown: dict[str, Any]) -> str:
    """The parts of a job's `show` that tell what happened to it: status, message, attempts with runs, events."""
    lines = [f"job {shown['id']} {shown['status']}: {shown.get('message')}"]
    for attempt in shown["attempts"]:
        lines.append(
            f"  attempt {attempt['number']} result={attempt.get('result')} created={attempt.get('created')} "
            f"started={attempt.get('started')} ended={attempt.get('ended')}"
        )
        for r in attempt["runs"]:
            lines.append(
                f"    rank {r['rank']} on {r['node']}: {describe_run(r)} "
                f"started={r.get('started')} ended={r.get('ended')}"
            )
    for e in shown["events"]:
        lines.append(f"  event {e['time']:.3f} {e['kind']} {e.get('node') or ''}: {e.get('message')}")
    return "\n".join(lines)


async def wait_attempt_running(api: ApiClient, job: int, after: int, timeout: float) -> dict[str, Any]:
    """`show` of `job` once an attempt numbered above `after` is started with every rank read `running`."""
    deadline = time.monotonic() + timeout
    while True:
        shown = await api.call("show", job=job)
        if shown["status"] not in ("queued", "running"):
            raise RoundFailed(f"job {job} is {shown['status']}: {shown.get('message')}", shown)
        attempt = shown["attempts"][-1] if shown["attempts"] else None
        if (
            attempt is not None
            and attempt["number"] > after
            and attempt["started"]
            and all(r["state"] == "running" for r in attempt["runs"])
        ):
            return shown
        if time.monotonic() > deadline:
            message = f"job {job}: no attempt after {after} running within {timeout:g}s: {shown.get('message')}"
            raise RoundFailed(message, shown)
        await asyncio.sleep(POLL_S)


async def wait_status(api: ApiClient, job: int, statuses: Sequence[str], timeout: float) -> dict[str, Any]:
    """`show` of `job` once its status is one of `statuses`; RoundFailed when it is not within `timeout`."""
    deadline = time.monotonic() + timeout
    while (shown := await api.call("show", job=job))["status"] not in statuses:
        if time.monotonic() > deadline:
            raise RoundFailed(f"job {job} not {' or '.join(statuses)} within {timeout:g}s", shown)
        await asyncio.sleep(POLL_S)
    return dict(shown)


def stop_sent(db: Path, job: int, attempt: int, rank: int) -> float | None:
    """A run's `stop_sent` (when its node confirmed the stop), which `show` does not give; read-only."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT stop_sent FROM runs WHERE job = ? AND attempt = ? AND rank = ?", (job, attempt, rank)
        ).fetchone()
    return row[0] if row else None


def death_times(shown: dict[str, Any], before: int, victim: str, killed: float, db: Path) -> dict[str, Any]:
    """The timestamps of one node death (see STEPS), from the job's `show` after it runs again."""
    attempts = {a["number"]: a for a in shown["attempts"]}
    old, new = attempts[before], shown["attempts"][-1]
    lost = next(r for r in old["runs"] if r["node"] == victim)
    others = [r for r in old["runs"] if r["node"] != victim]
    if lost["state"] != "lost" or old["result"] != "requeued":
        message = f"job {shown['id']}: rank on {victim} {lost['state']}, attempt {before} {old['result']}"
        raise RoundFailed(message, shown)
    t_lost = lost["ended"]
    events = shown["events"]
    stopping = min((e["time"] for e in events if e["kind"] == "Stopping" and e["time"] >= t_lost), default=None)
    sent = [t for r in others if (t := stop_sent(db, shown["id"], before, r["rank"])) is not None]
    preflight = [e["time"] for e in events if e["kind"] == "Preflight" and e["time"] >= new["created"]]
    times = {
        "killed": killed,
        "lost": t_lost,
        "stopping": stopping,
        "stop_sent": max(sent) if len(sent) == len(others) else None,
        "other_ended": max(r["ended"] for r in others),
        "requeued": old["ended"],
        "placed": new["created"],
        "preflight": max(preflight, default=new["created"]),
        "ranks_started": max(r["started"] for r in new["runs"]),
        "running": new["started"],
    }
    missing = [k for k, v in times.items() if v is None]
    if missing:
        raise RoundFailed(f"job {shown['id']}: no time for {missing}", shown)
    return times


def stopped_by_us(run: dict[str, Any]) -> bool:
    """A rank the scheduler stopped: its `sleep` ended by the SIGTERM of the stop (a fence would SIGKILL it)."""
    return run["state"] == "exited" and run.get("signal") == "SIGTERM"


def round_problems(shown: dict[str, Any], before: int, victim: str, dead: set[str]) -> list[str]:
    """What is wrong in a job's `show` after its round (stopped): see the docstring's list."""
    out = []
    attempts = {a["number"]: a for a in shown["attempts"]}
    old, new = attempts[before], shown["attempts"][-1]
    for r in old["runs"]:
        if r["node"] != victim and not stopped_by_us(r):
            out.append(f"rank {r['rank']} of attempt {before} on {r['node']} (alive) ended {describe_run(r)}")
    for r in new["runs"]:
        if r["node"] in dead:
            out.append(f"rank {r['rank']} of attempt {new['number']} placed on dead node {r['node']}")
        if not stopped_by_us(r):
            out.append(f"rank {r['rank']} of attempt {new['number']} on {r['node']} ended {describe_run(r)}")
    for e in shown["events"]:
        if e["kind"] == "Fenced" and not (FAULT == "hang" and e.get("node") == victim):  # a frozen node's: meant
            out.append(f"Fenced event on {e.get('node')}: {e.get('message')}")
    if shown["status"] != "stopped":
        out.append(f"job {shown['status']} after its stop: {shown.get('message')}")
    return out


def describe_run(r: dict[str, Any]) -> str:
    return f"{r['state']} exit={r.get('exit_code')} signal={r.get('signal')} error={r.get('error')!r}"


async def wait_no_leftovers(lab_dir: Path, timeout: float) -> list[int]:
    """Until no `sleep 3600` of the lab is left; those still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := leftover_sleeps(lab_dir)) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return left


async def one_death(
    api: ApiClient, lab_dir: Path, db: Path, label: str, round_: int, dead: set[str]
) -> tuple[dict[str, float], list[str]]:
    """Submit the job, kill the node of one of its ranks once it runs, wait until it runs again elsewhere, stop it;
    its times and what went wrong. `dead` (the nodes killed so far) gets the node killed."""
    job = (await api.call("submit", spec=DEATH_SPEC))["id"]
    shown = await wait_attempt_running(api, job, 0, RUNNING_TIMEOUT_S)
    attempt = shown["attempts"][-1]
    ranks = sorted(attempt["runs"], key=lambda r: r["rank"])
    victim = ranks[(round_ + 1) % len(ranks)]["node"]  # rank 1, then rank 0, ...
    await asyncio.sleep(1.0)  # a tick or so of steady state
    killed = time.time()
    report = await asyncio.to_thread(lab_fault, lab_dir, victim, Fault.hang() if FAULT == "hang" else Fault.kill())
    kill_s = time.time() - killed
    dead.add(victim)
    shown = await wait_attempt_running(api, job, attempt["number"], DEATH_TIMEOUT_S)
    if FAULT == "hang":  # it answers again: its stopped rank is fenced, and it stays isolated
        await asyncio.to_thread(lab_fault, lab_dir, victim, Fault.heal())
    times = death_times(shown, attempt["number"], victim, killed, db)
    new_nodes = ",".join(r["node"] for r in shown["attempts"][-1]["runs"])
    total = times["running"] - killed
    print(
        f"  {label}, round {round_ + 1}: job {job} killed {victim} ({report.message}; {kill_s:.2f}s), "
        f"running again on {new_nodes} {total:.2f}s after",
        file=sys.stderr,
    )
    await api.call("stop", jobs=[job])
    shown = await wait_status(api, job, ["stopped", "error", "succeeded", "expired"], STOPPED_TIMEOUT_S)
    problems = round_problems(shown, attempt["number"], victim, dead)
    left = await wait_no_leftovers(lab_dir, LEFTOVER_TIMEOUT_S)
    if left:
        problems.append(f"{len(left)} `sleep 3600` of the lab alive {LEFTOVER_TIMEOUT_S:g}s after the stop: {left}")
    if problems:
        print(f"  {label}, round {round_ + 1}: PROBLEMS:\n" + "\n".join(f"    {p}" for p in problems), file=sys.stderr)
        print(dump_show(shown), file=sys.stderr)
    return times, problems


async def one_pause(api: ApiClient, lab_dir: Path, label: str, round_: int) -> tuple[dict[str, float], list[str]]:
    """Submit the job, freeze the node of one of its ranks for PAUSE_S once it runs, heal it, watch PAUSE_WATCH_S
    more; what it cost (as `times`: new attempts, stops, the node out of service) and what went wrong."""
    job = (await api.call("submit", spec=DEATH_SPEC))["id"]
    shown = await wait_attempt_running(api, job, 0, RUNNING_TIMEOUT_S)
    attempt = shown["attempts"][-1]
    victim = sorted(attempt["runs"], key=lambda r: r["rank"])[(round_ + 1) % len(attempt["runs"])]["node"]
    await asyncio.sleep(1.0)
    frozen = time.time()
    await asyncio.to_thread(lab_fault, lab_dir, victim, Fault.hang())
    await asyncio.sleep(max(0.0, frozen + PAUSE_S - time.time()))
    await asyncio.to_thread(lab_fault, lab_dir, victim, Fault.heal())
    healed = time.time()
    out_of_service = 0.0
    while time.time() < healed + PAUSE_WATCH_S:
        (node,) = await api.call("nodes", nodeset=victim)
        out_of_service += POLL_S if node["state"] not in ("healthy", "degraded") else 0.0
        await asyncio.sleep(POLL_S)
    shown = await api.call("show", job=job)
    kinds = [e["kind"] for e in shown["events"]]
    cost = {
        "frozen_s": healed - frozen,
        "attempts": float(len(shown["attempts"]) - 1),
        "stops": float(kinds.count("Stopping") + kinds.count("Restarting")),
        "out_of_service_s": out_of_service,
    }
    print(f"  {label}, round {round_ + 1}: job {job}, {victim} frozen {cost['frozen_s']:.2f}s: {cost}", file=sys.stderr)
    problems = [f"{k} {v:g}" for k, v in cost.items() if k != "frozen_s" and v]
    if shown["status"] != "running":
        problems.append(f"job {shown['status']}: {shown.get('message')}")
    await api.call("stop", jobs=[job])
    await wait_status(api, job, ["stopped", "error", "succeeded", "expired"], STOPPED_TIMEOUT_S)
    left = await wait_no_leftovers(lab_dir, LEFTOVER_TIMEOUT_S)
    if left:
        problems.append(f"{len(left)} `sleep 3600` of the lab alive {LEFTOVER_TIMEOUT_S:g}s after the stop: {left}")
    if problems:
        print(f"  {label}, round {round_ + 1}: PROBLEMS:\n" + "\n".join(f"    {p}" for p in problems), file=sys.stderr)
    return cost, problems


SUSPECT = re.compile(r"(?i:fenc|stray|foreign)|Traceback| ERROR ")


def log_problems(log: Path, dead: set[str]) -> list[str]:
    """The serve log's WARNING and ERROR lines that a node death does not explain: those that name no dead node,
    and any about fencing, strays, other nodes' runs (foreign) or a traceback."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError as exc:
        return [f"cannot read {log}: {exc}"]
    named = re.compile(r"\b(" + "|".join(map(re.escape, sorted(dead))) + r")\b") if dead else None
    out = []
    for line in lines:
        if not (" WARNING " in line or " ERROR " in line or "Traceback" in line):
            continue
        frozen_fenced = FAULT == "hang" and "fenced:" in line and named is not None and named.search(line)
        if (SUSPECT.search(line) and not frozen_fenced) or named is None or not named.search(line):
            out.append(line)
    return out


async def death_cluster(
    root: Path, nodes: int, repeats: int, layout_name: str, channel: bool = True
) -> tuple[list[dict[str, float]], int, list[str]]:
    """The rounds on one lab: their times, how many had a problem, and the serve log's warnings."""
    if repeats > nodes - 2:
        raise SystemExit(f"{repeats} repeats need {repeats + 2} nodes: each kills one, and the job needs 2")
    layout = root / "layout.yaml"
    write_layout(layout, nodes, nodes * DEATH_GPUS_PER_NODE, shared_home=layout_name == "shared-home")
    lab_dir = root / "lab"
    label = f"{layout_name}, {nodes} nodes, {'channel' if channel else 'command'}"
    serves: list[Serve] = []
    samples: list[dict[str, float]] = []
    bad_rounds = 0
    dead: set[str] = set()
    try:
        info = lab_up(lab_dir, layout, None, timeout=120)
        if info.shared_home != (layout_name == "shared-home"):
            raise SystemExit(f"the lab in {lab_dir} has shared_home {info.shared_home}, not as {layout_name} asks")
        config = write_config(root, Path(info.config_path), scheduler=None if channel else {"node_channel": False})
        loaded = load_config(config)
        serves.append(Serve(config, root / "serve.log"))
        api = await connect(loaded)
        try:
            db = loaded.state_dir / STORE_FILE
            for i in range(repeats):
                try:
                    if FAULT == "pause":
                        times, problems = await one_pause(api, lab_dir, label, i)
                    else:
                        times, problems = await one_death(api, lab_dir, db, label, i, dead)
                except RoundFailed as exc:
                    print(f"  {label}, round {i + 1}: {exc}", file=sys.stderr)
                    if exc.shown is not None:
                        print(dump_show(exc.shown), file=sys.stderr)
                    raise
                samples.append(times)
                bad_rounds += bool(problems)
        finally:
            await api.close()
    finally:
        for serve in serves:
            serve.stop()
        shut_down(lab_dir, serves)
    warnings = log_problems(root / "serve.log", dead)
    for line in warnings:
        print(f"  {label}: serve log: {line}", file=sys.stderr)
    return samples, bad_rounds, warnings


def med_max(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.2f} / {max(xs):.2f}"


DeathResult = tuple[list[dict[str, float]], int, list[str]]  # samples, rounds with a problem, serve log warnings


def pause_table(results: dict[tuple[str, int], DeathResult]) -> None:
    rows = []
    for (layout, nodes), (samples, bad_rounds, warnings) in results.items():
        checks = "ok" if not bad_rounds else f"{bad_rounds} of {len(samples)} rounds cost something"
        if warnings:
            checks += f", {len(warnings)} log warnings"
        rows.append(
            [
                layout, nodes, len(samples), med_max([t["frozen_s"] for t in samples]),
                int(sum(t["attempts"] for t in samples)), int(sum(t["stops"] for t in samples)),
                med_max([t["out_of_service_s"] for t in samples]), checks,
            ]
        )  # fmt: skip
    print_table(["LAYOUT", "NODES", "REPEATS", "FROZEN S", "NEW ATTEMPTS", "STOPS", "OUT OF SERVICE S", "CHECKS"], rows)
    print(f"\n(the node frozen {PAUSE_S:g} s, then watched {PAUSE_WATCH_S:g} s more; median / max over the repeats)")


def death_tables(results: dict[tuple[str, int], DeathResult]) -> None:
    rows = []
    for (layout, nodes), (samples, bad_rounds, warnings) in results.items():
        parts = {
            "DETECT": [t["lost"] - t["killed"] for t in samples],
            "DECIDE": [t["requeued"] - t["lost"] for t in samples],
            "RELAUNCH": [t["running"] - t["requeued"] for t in samples],
            "TOTAL": [t["running"] - t["killed"] for t in samples],
        }
        checks = "ok" if not bad_rounds else f"{bad_rounds} of {len(samples)} rounds wrong"
        if warnings:
            checks += f", {len(warnings)} unexplained log warnings"
        rows.append([layout, nodes, len(samples), *(med_max(parts[p]) for p in PARTS), checks])
    print_table(["LAYOUT", "NODES", "REPEATS", *(f"{p} S" for p in PARTS), "CHECKS"], rows)
    print()
    rows = []
    for part, step, start, end in STEPS:
        cells = [med_max([t[end] - t[start] for t in samples]) for samples, _, _ in results.values()]
        rows.append([part, step, *cells])
    print_table(["PART", "STEP", *(f"{layout.upper()} {n} S" for layout, n in results)], rows)
    print("\n(median / max over the repeats; (node): a time the node's supervisor wrote)")
    for part in PARTS[:-1]:
        print(f"{part}: {BOUNDS[part]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="8,64")
    parser.add_argument("--jobs", default="1,200")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--what", choices=["adoption", "node-death"], default="adoption")
    parser.add_argument("--repeats", type=int, default=5, help="node deaths per node count (--what node-death)")
    parser.add_argument(
        "--modes",
        default=None,
        help="node-death: channel (the default), command (scheduler.node_channel: false), or both",
    )
    parser.add_argument(
        "--layout",
        help=f"lab layouts, comma-separated, of {', '.join(LAYOUTS)} (--what node-death; default: both)",
    )
    parser.add_argument(
        "--fault",
        help="node-death: the node dies (kill), freezes (hang) or freezes for 5 s (pause); comma-separated: each",
    )
    args = parser.parse_args()
    if args.what == "node-death":
        global FAULT
        faults = [f.strip() for f in (args.fault or "kill").split(",") if f.strip()]
        if not faults or any(f not in ("kill", "hang", "pause") for f in faults):
            parser.error(f"--fault: {args.fault!r}: kill, hang, pause, or several of them")
        for fault in faults:
            FAULT = fault
            if len(faults) > 1:
                print(f"\n--fault {fault}")
            node_death(args)
        return
    if args.fault is not None:
        parser.error("--fault goes with --what node-death")
    if args.layout is not None:
        parser.error("--layout goes with --what node-death")
    if args.modes is not None:
        parser.error("--modes goes with --what node-death")
    counts = sorted({int(j) for j in args.jobs.split(",")})
    adoption: list[list[object]] = []
    breakdowns: list[list[object]] = []
    costs: list[list[object]] = []
    for nodes in [int(n) for n in args.nodes.split(",")]:
        root = Path(tempfile.mkdtemp(prefix="ftr-", dir="/tmp"))  # short: the API socket path is AF_UNIX
        try:
            rows, breakdown, cost = asyncio.run(one_cluster(root, nodes, counts, args.ticks))
        except BaseException:
            print(f"kept {root} (serve-*.log, lab/lab.log)", file=sys.stderr)
            raise
        adoption.extend(rows)
        breakdowns.append(breakdown)
        costs.append(cost)
        shutil.rmtree(root, ignore_errors=True)
    command = " ".join([".venv/bin/python", "bench/recovery.py", *sys.argv[1:]])
    print(f"{command}\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; seconds unless marked\n")
    print_table(["NODES", "JOBS", "ON NODES", "ADOPTED", "SCHEDULER S", "FROM KILL S", "TO RUNNING S"], adoption)
    print()
    headers = ["NODES", "JOBS", "COLD PROBE S", "FIRST TICK S", "FIRST TICK CMDS", "ALL READ BY IT"]
    print_table(headers, breakdowns)
    print()
    headers = ["NODES", "JOBS", "TICKS", "CPU MS", "WALL MS", "LAST ANSWER MS", "ANSWERED MS", "CMDS", "LATE"]
    print_table(headers, costs)
    print("\n(MS columns: mean / max per tick; CMDS: SSH commands per tick, mean / max)")


def node_death(args: argparse.Namespace) -> None:
    layouts = [name.strip() for name in (args.layout or ",".join(LAYOUTS)).split(",") if name.strip()]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or not layouts:
        raise SystemExit(f"--layout: {', '.join(unknown) or 'none given'}: not one of {', '.join(LAYOUTS)}")
    modes = [name.strip() for name in (args.modes or "channel").split(",") if name.strip()]
    if not modes or any(m not in ("command", "channel") for m in modes):
        raise SystemExit(f"--modes: {args.modes!r}: command, channel or both")
    results: dict[tuple[str, int], DeathResult] = {}
    for nodes in [int(n) for n in args.nodes.split(",")]:
        for layout in layouts:
            for mode in modes:
                name = layout if modes == ["channel"] else f"{layout} {mode}"
                root = Path(tempfile.mkdtemp(prefix="ftd-", dir="/tmp"))  # short: the API socket path is AF_UNIX
                try:
                    run = death_cluster(root, nodes, args.repeats, layout, channel=mode == "channel")
                    results[(name, nodes)] = asyncio.run(run)
                except BaseException:
                    print(f"kept {root} (serve.log, lab/lab.log)", file=sys.stderr)
                    raise
                if results[(name, nodes)][1] or results[(name, nodes)][2]:
                    print(f"kept {root} (serve.log, lab/lab.log): {name}, {nodes} nodes had problems", file=sys.stderr)
                else:
                    shutil.rmtree(root, ignore_errors=True)
    command = " ".join([".venv/bin/python", "bench/recovery.py", *sys.argv[1:]])
    print(f"{command}\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; scheduler defaults; seconds\n")
    if FAULT == "pause":
        pause_table(results)
    else:
        death_tables(results)


if __name__ == "__main__":
    main()
