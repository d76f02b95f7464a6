"""Benchmark: the queue's expected starts (`jobs --start`, the console's Timeline view) over a large cluster.

    .venv/bin/python bench/forecast.py [--nodes 1000] [--jobs 500] [--repeat 3] [--seed 1]

The cluster and queue of bench/placement.py (N nodes of 8 GPUs, about 40 % of them partly or fully used by running
jobs, most with an end time; mixed jobs, most with a max_runtime). The scheduler works out the expected starts of
the jobs one pass plans (`scheduler.queue_depth`, 500 by default), so `--jobs` is that depth. It times
`forecast` (the median of `--repeat`), and prints: the distinct start times it found, the jobs with an expected
start and those with none, how far ahead it worked out, and one pass of `plan` over the same queue for scale.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.placement import NOW, build_cluster, build_queue  # noqa: E402
from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.decide.forecast import forecast  # noqa: E402
from ftconsole.scheduler.decide.placement import plan  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    state = build_cluster(args.nodes, rng)
    queue = build_queue(args.jobs, rng)
    times = []
    found = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        found = forecast(state, queue, NOW, urgent_cap=3)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    plan(state, queue, NOW, urgent_cap=3)
    one_pass = time.perf_counter() - start
    assert found is not None
    starts = len({e.start for e in found.jobs if e.start is not None})
    known = sum(1 for e in found.jobs if e.start is not None)
    row = [args.nodes, args.jobs, f"{statistics.median(times):.3f}", f"{one_pass:.4f}", starts, known,
           len(found.jobs) - known, f"{(found.until - NOW) / 3600:.1f}", found.complete]  # fmt: skip
    headers = ["NODES", "QUEUED", "FORECAST S", "PASS S", "STARTS AT", "KNOWN", "N/A", "REACHED H", "COMPLETE"]
    print_table(headers, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
