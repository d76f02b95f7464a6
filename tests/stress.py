"""Run the suite under load, in a random order, a few times: what `make test-stress` runs.

Every run keeps each CPU busy with a spinning process of the same priority as the tests (a CI machine shared
with other jobs), and puts the tests in a new random order (pytest-randomly) whose seed it prints before and
after, so that a failure can be run again exactly as it happened:

    python tests/stress.py                    # 3 runs, a new seed each, every CPU kept busy
    python tests/stress.py --runs 1 --seed 1234 -- tests/integration/test_lab.py
    make test-stress RUNS=5 LOAD=2            # the same from make

It stops at the first run that fails and exits with its status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

_SPIN = "while True: pass"


@contextlib.contextmanager
def busy(cpus: int) -> Iterator[None]:
    """`cpus` processes that spin until the block ends (killed with it, whatever happens)."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(cpus)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="how many runs (default 3)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="spinning processes (default: CPUs)")
    parser.add_argument("--seed", type=int, help="the first run's order (default: a new one); later runs add 1")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (tests to run, -x, ...)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.load < 0:
        parser.error("--runs must be at least 1 and --load at least 0")
    first = args.seed if args.seed is not None else random.randrange(1 << 31)
    for n in range(args.runs):
        seed = first + n
        command = [sys.executable, "-m", "pytest", "-q", "-p", "randomly", f"--randomly-seed={seed}", *args.pytest_args]
        shown = " ".join(command[1:])
        print(f"stress run {n + 1}/{args.runs}: seed {seed}, {args.load} busy CPUs: {shown}", flush=True)
        started = time.monotonic()
        with busy(args.load):
            code = subprocess.call(command)
        took = time.monotonic() - started
        print(f"stress run {n + 1}/{args.runs}: seed {seed}: exit {code} in {took / 60:.1f} min", flush=True)
        if code != 0:
            print(f"run it again as it happened: python tests/stress.py --runs 1 --seed {seed}", flush=True)
            return code
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the spinners go with us (busy's finally)
    sys.exit(main())
