"""Benchmark: a year of history. What the scheduler's reads and its tick cost with a store that keeps a busy
cluster's year of ended jobs, against the same on a store that holds only its last 30 days (what every default
read looks at) and on an empty one, side by side in one run.

    .venv/bin/python bench/history.py [--jobs 1000000] [--nodes 64] [--repeat 5] [--cache DIR]

For each store (empty; MONTH: the last 30 days of a year of `--jobs` ended jobs, at the same rate; YEAR: all of
them, spread over the last 360 days; each job with its attempt, two ranks' runs and three events, 50 users in 10
projects, as `history.jobs: 365d` keeps them), starts the real scheduler as its own process (`ftconsole serve`,
SQLite, tick 0.5 s, fair share and quotas on) on `--nodes` nodes that refuse connections, with 20 jobs queued,
and measures:

- START S: from the process's start until its socket answers `status` (a restart: the store opened, recovery);
- TICK MS/S: its CPU per second of wall time over 10 s once started (its ticks, with fair share and quotas on);
- JOBS S: `jobs` as the CLI asks it by default (the active jobs and those ended in the last day), median;
- USAGE S: `usage --since 30d --by user`, median; EVENTS S: `events` (the last 100); SHOW S: `show` of a job.

The rows are made with SQL in bulk (the store's own schema, migrated by the program), not through the API:
a million submits would take hours and measure the submit path, not the history. The usage ledger and the ended
jobs' day sums are then built as a scheduler that ran all along would have them (a restart, not an upgrade).
`--cache DIR` keeps the filled stores there and copies them for the next run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from deepqueue import cpu_s  # noqa: E402  (bench/ is the script's folder: on the path)

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.decide.ledger import slot_length  # noqa: E402
from ftconsole.scheduler.retention import ROLL_AFTER_S, day_sums  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.spec.jobspec import JobSpec  # noqa: E402
from ftconsole.scheduler.store.db import Store  # noqa: E402

DAY = 86400.0
TICK_S = 0.5
WINDOW_S = 10.0
SPEC = JobSpec.from_json(
    {
        "name": "train",
        "mode": "pytorch",
        "command": "python train.py --lr 3e-4",
        "gpus_per_node": 8,
        "nodes": 2,
        "max_runtime": "12h",
    }
).to_json()


def fill(path: Path, count: int, now: float, days: float) -> None:
    """`count` ended jobs over the last `days` days, with their attempts, runs and events, in bulk."""
    asyncio.run(_make(path))
    rng = random.Random(1)
    spec = json.dumps(SPEC)
    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous = OFF")
    batch = 20_000
    for start in range(0, count, batch):
        jobs, attempts, runs, events = [], [], [], []
        for i in range(start + 1, min(count, start + batch) + 1):
            ended = now - rng.uniform(0.05, days) * DAY
            began = ended - rng.uniform(600, 12 * 3600)
            user = f"user{rng.randrange(50):02d}"
            project = f"project{rng.randrange(10)}"
            status = "succeeded" if rng.random() < 0.9 else "error"
            jobs.append((i, "train", user, 1000, spec, status, "normal", project, "none", began - 60, began, ended, 1,
                         ended))  # fmt: skip
            attempts.append((i, 1, None, 8, 29500, began, began, ended, status, f"tok{i}"))
            for rank in (0, 1):
                runs.append((i, 1, rank, f"gpu{rng.randrange(64):04d}", "[0,1,2,3,4,5,6,7]", f"~/r/{i}/1/{rank}", 1,
                             "exited", began, ended, 1))  # fmt: skip
            events += [(began - 60, "Submitted", str(i), "submitted"), (began, "Started", str(i), "started"),
                       (ended, "Succeeded", str(i), "ended")]  # fmt: skip
        db.executemany(
            "INSERT INTO jobs (id, name, owner, uid, spec, status, priority, project, access, submitted, started, "
            "ended, attempt, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            jobs,
        )
        db.executemany(
            "INSERT INTO attempts (job, number, spec_name, gpus_per_node, master_port, created, started, ended, "
            "result, token) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            attempts,
        )
        db.executemany(
            "INSERT INTO runs (job, attempt, rank, node, gpus, run_dir, launch, state, started, ended, released) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            runs,
        )
        db.executemany("INSERT INTO events (time, kind, job, message) VALUES (?, ?, ?, ?)", events)
        db.commit()
    db.commit()  # no ANALYZE: the store never runs it, so a real one has no statistics
    db.close()
    asyncio.run(_ledger(path, now))


async def _make(path: Path) -> None:
    async with await Store.open(path):
        pass


async def _ledger(path: Path, now: float) -> None:
    """The usage ledger as the scheduler keeps it (for the config below: a 7-day half-life, a 30-day period), and
    the ended jobs' day sums (scheduler/retention.py's roll, in larger batches and without its pauses)."""
    async with await Store.open(path) as store:
        await store.fold_usage(now, half_life=7 * DAY, slot=slot_length(30 * DAY), since=now - 30 * DAY, kept=None)
        while (rolling := await store.rollable_jobs(now - ROLL_AFTER_S, 5000)).jobs:
            await store.roll_jobs(rolling, day_sums(rolling, now))


async def timed(call) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    await asyncio.wait_for(call, 600)
    return time.perf_counter() - t0


async def measure(sock: Path, pid: int, t_start: float, repeat: int, now: float) -> list[str]:
    deadline = time.monotonic() + 600
    while True:
        try:
            async with await ApiClient.connect(sock) as api:
                await api.call("status")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
        except Exception:  # not answering yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    start_s = time.perf_counter() - t_start
    async with await ApiClient.connect(sock) as api:
        for i in range(20):
            await api.call("submit", spec={"name": f"q{i}", "command": "sleep 1", "gpus_per_node": 8})
        await asyncio.sleep(2.0)
        c0, w0 = cpu_s(pid), time.perf_counter()
        await asyncio.sleep(WINDOW_S)
        tick = (cpu_s(pid) - c0) * 1000 / (time.perf_counter() - w0)
        jobs = [await timed(api.call("jobs", since=now - DAY)) for _ in range(repeat)]
        usage = [await timed(api.call("usage", since=now - 30 * DAY, by="user")) for _ in range(repeat)]
        events = [await timed(api.call("events", limit=100)) for _ in range(repeat)]
        shows = [await timed(api.call("show", job=1)) for _ in range(repeat)]
    return [
        f"{start_s:.2f}",
        f"{tick:.0f}",
        f"{statistics.median(jobs):.3f}",
        f"{statistics.median(usage):.3f}",
        f"{statistics.median(events):.3f}",
        f"{statistics.median(shows):.3f}",
    ]


def one(root: Path, label: str, count: int, days: float, nodes: int, repeat: int, cache: Path | None) -> list[str]:
    now = time.time()
    state = root / "state"
    state.mkdir(mode=0o700)
    if count:
        kept = cache / f"{label}-{count}.db" if cache is not None else None
        if kept is not None and kept.exists() and now - kept.stat().st_mtime < DAY:
            shutil.copyfile(kept, state / "state.db")
            asyncio.run(_ledger(state / "state.db", now))
        else:
            t0 = time.perf_counter()
            fill(state / "state.db", count, now, days)
            print(f"made {count:,} ended jobs in {time.perf_counter() - t0:.0f} s "
                  f"({(state / 'state.db').stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)  # fmt: skip
            if kept is not None:
                shutil.copyfile(state / "state.db", kept)
    config = {
        "state_dir": str(state),
        "nodes": [{"name": f"gpu{i:04d}", "host": f"127.0.{i >> 8}.{i & 255}", "port": 1} for i in range(nodes)],
        "scheduler": {"tick": f"{TICK_S}s", "fairshare": {"half_life": "7d"}},
        "quotas": {"period": "30d", "default_user": {"gpu_hours": 100000}},
        "api": {"socket": str(root / "ft.sock")},
    }
    (root / "cluster.yaml").write_text(yaml.safe_dump(config))
    with open(root / "serve.log", "w") as log:
        t_start = time.perf_counter()
        server = subprocess.Popen([str(ROOT / ".venv/bin/ftconsole"), "--config", str(root / "cluster.yaml"), "serve"],
                                  stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    try:
        return [label, f"{count:,}", *asyncio.run(measure(root / "ft.sock", server.pid, t_start, repeat, now))]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cache", type=Path, help="keep the filled stores here and reuse them (a day at most)")
    args = parser.parse_args()
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    month = round(args.jobs * 30 / 360)
    for label, count, days in (("empty", 0, 0.0), ("month", month, 30.0), ("year", args.jobs, 360.0)):
        with tempfile.TemporaryDirectory(prefix="fth-", dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
            rows.append(one(Path(tmp), label, count, days, args.nodes, args.repeat, args.cache))
    print_table(["STORE", "ENDED JOBS", "START S", "TICK MS/S", "JOBS S", "USAGE S", "EVENTS S", "SHOW S"], rows)


if __name__ == "__main__":
    main()
