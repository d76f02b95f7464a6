"""Benchmark: how long a command of the `ftconsole` CLI takes, end to end, against a running scheduler.

    .venv/bin/python bench/cli.py [--runs 15] [--jobs 200] [--against REV]

Starts the real scheduler (`ftconsole serve`, its own process) on a config of 64 nodes that are never reached,
submits `--jobs` jobs through its socket (they stay queued), then runs each command `--runs` times as a user or
a script runs it (`python -m ftconsole.cli ...`, a new process each time) and prints the median and the 90th
percentile of its wall time. `python -c pass` is the interpreter's own start, the floor of any command.

With `--against REV`, the same commands also run from that commit's sources (a `git worktree` of it, put first
on PYTHONPATH), against the same scheduler in the same run: before and after, side by side.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402

SPEC = {"name": "bench", "mode": "pytorch", "nodes": 2, "gpus_per_node": 8, "command": "python3 train.py --lr 3e-4"}
COMMANDS = [
    ("python -c pass", None),
    ("--help", ["--help"]),
    ("jobs --json", ["jobs", "--json"]),
    ("show 1 --json", ["show", "1", "--json"]),
    ("nodes --json", ["nodes", "--json"]),
    ("check job.yaml", ["check", "{job}"]),
    ("submit job.yaml", ["submit", "{job}"]),
]


def timed(argv: list[str], env: dict[str, str], runs: int, cwd: Path) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              check=False)  # fmt: skip
        out.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()[-500:]}")
    return sorted(out)


async def wait_ready(sock: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the scheduler exited"
        try:
            async with await ApiClient.connect(sock) as api:
                await api.call("jobs")
                return
        except OSError:
            await asyncio.sleep(0.2)
        except Exception:  # not ready yet (NotRunning while it starts)
            await asyncio.sleep(0.2)
    raise SystemExit("the scheduler did not answer in 60 s")


async def submit(sock: Path, jobs: int) -> None:
    async with await ApiClient.connect(sock) as api:
        for _ in range(jobs):
            await api.call("submit", spec=SPEC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--against", metavar="REV", help="also run the commands from this commit's sources")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftb-", dir="/tmp") as tmp:
        root = Path(tmp)
        config = {
            "state_dir": str(root / "state"),
            # never reached: each a loopback address whose port 1 refuses at once (no name to look up)
            "nodes": [{"name": f"gpu{i:04d}", "host": f"127.0.0.{i}", "port": 1} for i in range(1, 65)],
            "api": {"socket": str(root / "ft.sock")},
        }
        (root / "cluster.yaml").write_text(yaml.safe_dump(config))
        (root / "job.yaml").write_text(yaml.safe_dump(SPEC))
        env = {**os.environ, "FTCONSOLE_CONFIG": str(root / "cluster.yaml"), "TERM": "dumb"}
        sources = {"this tree": str(ROOT)}
        if args.against:
            tree = root / "against"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.against],
                           check=True)  # fmt: skip
            sources[args.against] = str(tree)
        log = open(root / "serve.log", "wb")  # noqa: SIM115 (open for the scheduler's whole life)
        serve = subprocess.Popen([sys.executable, "-m", "ftconsole.cli", "serve"], env=env, stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL)  # fmt: skip
        for path in sources.values():  # each source's byte code written first: the same start for both
            subprocess.run([sys.executable, "-m", "compileall", "-q", "ftconsole", "scheduler", "probes"], cwd=path,
                           stdout=subprocess.DEVNULL, check=True)  # fmt: skip
        try:
            asyncio.run(wait_ready(root / "ft.sock", serve))
            asyncio.run(submit(root / "ft.sock", args.jobs))
            rows = []
            for label, cli in COMMANDS:
                row: list[object] = [label]
                for path in sources.values():
                    if cli is None:
                        argv = [sys.executable, "-c", "pass"]
                    else:
                        argv = [sys.executable, "-m", "ftconsole.cli", *(a.format(job=root / "job.yaml") for a in cli)]
                    # from outside any source tree (`-m` puts the working directory first on the path)
                    took = timed(argv, {**env, "PYTHONPATH": path}, args.runs, root)
                    row += [f"{statistics.median(took) * 1000:.0f}", f"{took[int(len(took) * 0.9) - 1] * 1000:.0f}"]
                rows.append(row)
        finally:
            serve.terminate()
            serve.wait(60)
            log.close()
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(root / "against")],
                               check=False)  # fmt: skip
    head = ["COMMAND"]
    for name in sources:
        head += [f"MEDIAN MS ({name})", f"P90 MS ({name})"]
    print_table(head, rows)


if __name__ == "__main__":
    main()
