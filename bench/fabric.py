"""Benchmark: the fabric check of a job's nodes (`preflight: {bandwidth: true}`) against iperf3, on one link shaped
to a known rate.

    .venv/bin/python bench/fabric.py [--nodes 3] [--seconds 2] [--rates none,1000,200,50] [--repeats 2]

Root only: `--nodes` real sshd nodes, each in a network namespace of its own behind a bridge (tests/netns.py),
node01's way out shaped with `tc` (a token bucket) to each rate of `--rates` in Mbit/s in turn (`none`: not
shaped). For each rate, in the same run, side by side:

- `ftconsole`: the check the scheduler runs before such a job starts (`scheduler.fabric.check`: every node sends a
  timed TCP stream to its two ring neighbours, over SSH, with nothing installed on the nodes), with the baseline
  `--min-gbps`: node01's slowest stream out, its verdict, and how long the whole check took (what it adds to the
  job's start);
- `iperf3`: `iperf3 -c` from node01's namespace to an `iperf3 -s` in node02's, for the same `--seconds`: the rate a
  person checking the link by hand would read (what ftconsole's figure should agree with).

Columns: SHAPED (Mbit/s), FTCONSOLE (node01 out, Gbit/s), IPERF3 (Gbit/s), VERDICT (node01's), CHECK S (the
check's wall time, median of `--repeats`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.fabric import Baselines, check  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402
from ftconsole.scheduler.spec.nodetestspec import FabricTest  # noqa: E402
from ftconsole.scheduler.ssh.transport import SSHPool  # noqa: E402
from tests import netns  # noqa: E402
from tests.sshd_cluster import SshdCluster  # noqa: E402

IPERF_PORT = 5211


def iperf3(cluster: SshdCluster, seconds: float) -> float | None:
    """node01 -> node02 with iperf3, Gbit/s (None where iperf3 is missing or failed)."""
    fabric = cluster.fabric
    if fabric is None or shutil.which("iperf3") is None:
        return None
    server = subprocess.Popen([*fabric.exec("node02"), "iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(50):
            done = subprocess.run(
                [*fabric.exec("node01"), "iperf3", "-c", cluster.node("node02").address, "-p", str(IPERF_PORT),
                 "-t", f"{seconds:g}", "-J"], capture_output=True, text=True, timeout=seconds + 30,
            )  # fmt: skip
            received = json.loads(done.stdout or "{}").get("end", {}).get("sum_received") if done.stdout else None
            if done.returncode == 0 and received:
                return float(received["bits_per_second"]) / 1e9
            time.sleep(0.1)  # the server is not listening yet
        print(f"iperf3 failed: {done.stdout[-300:]} {done.stderr[-300:]}", file=sys.stderr)
        return None
    finally:
        server.kill()
        server.wait(10)


async def ours(cluster: SshdCluster, root: Path, seconds: float, min_gbps: float) -> tuple[float | None, str, float]:
    loaded = load_config(cluster.write_config(root / "cluster.yaml", ssh={"python": sys.executable}))
    pool = SSHPool.from_config(loaded)
    kept: dict[str, str] = {}

    async def read(key: str) -> str | None:
        return kept.get(key)

    async def write(key: str, value: str) -> None:
        kept[key] = value

    try:
        started = time.monotonic()
        report = await check(pool, sys.executable, loaded.cluster.node_list(), FabricTest(seconds=seconds,
                             min_gbps=min_gbps), "default", Baselines(read, write))  # fmt: skip
        took = time.monotonic() - started
    finally:
        await pool.close()
    out = [s.gbps for s in report.streams if s.src == "node01" and s.gbps is not None]
    return (min(out) if out else None), report.results["node01"].result, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rates", default="none,1000,200,50", help="node01's way out, Mbit/s, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--min-gbps", type=float, default=0.5)
    args = parser.parse_args()
    if not netns.available():
        print(f"bench/fabric.py: {netns.MISSING}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp, SshdCluster(Path(tmp), args.nodes, 1, netns=True) as cluster:
        assert cluster.fabric is not None
        for rate in args.rates.split(","):
            if rate == "none":
                cluster.fabric.unshape("node01")
            else:
                cluster.fabric.shape("node01", mbit=float(rate))
            found = [asyncio.run(ours(cluster, Path(tmp), args.seconds, args.min_gbps)) for _ in range(args.repeats)]
            theirs = [iperf3(cluster, args.seconds) for _ in range(args.repeats)]
            rates = [f[0] for f in found if f[0] is not None]
            known = [t for t in theirs if t is not None]
            rows.append([
                rate, f"{statistics.median(rates):.3f}" if rates else "-",
                f"{statistics.median(known):.3f}" if known else "-", "/".join(sorted({f[1] for f in found})),
                f"{statistics.median(f[2] for f in found):.2f}",
            ])  # fmt: skip
    print(f"{args.nodes} nodes in network namespaces, {args.seconds:g} s streams, baseline {args.min_gbps:g} Gbit/s, "
          f"median of {args.repeats}")  # fmt: skip
    print_table(["SHAPED", "FTCONSOLE", "IPERF3", "VERDICT", "CHECK S"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
