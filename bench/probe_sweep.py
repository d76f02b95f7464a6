"""Benchmark: a probe sweep over N lab nodes, side by side with pdsh and clush running `true`.

    .venv/bin/python bench/probe_sweep.py [--nodes 8,64,256] [--repeat 5] [--fanout 64]

For each N it starts a lab cluster of N nodes (SSH servers in a separate process), then times, as medians
of `--repeat` runs:
- ftconsole cold: the first full probe sweep (agent on every node), including the SSH connects;
- ftconsole warm: later sweeps over the persistent connections (what the scheduler does every interval);
- ftconsole true: `true` on every node over the persistent connections (like for like with pdsh/clush);
- pdsh / clush: `true` on every node, each run opening new connections (that is how they work);
and the console's own CPU time per node for a warm agent sweep (user + system of this process; the lab's SSH
servers run in another process and are not counted). pdsh and clush use the system ssh with an ssh_config
that points at the lab's ports, key and known_hosts, and the same fan-out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import LabInfo, lab_down, lab_up  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402
from ftconsole.scheduler.spec.nodesets import fold_nodeset  # noqa: E402
from ftconsole.scheduler.ssh.probing import ProbeFailure, sweep  # noqa: E402
from ftconsole.scheduler.ssh.transport import SSHPool, run_on_all  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Row:
    nodes: int
    cold_s: float
    warm_s: float
    true_s: float
    cpu_ms_per_node: float
    pdsh_s: float | None
    clush_s: float | None
    failures: int


def ssh_config(info: LabInfo, path: Path) -> None:
    lines = []
    for node in info.nodes:
        lines += [
            f"Host {node.name}",
            f"  HostName {node.host}",
            f"  Port {node.port}",
            f"  IdentityFile {info.identity_file}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {info.known_hosts_path}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  ConnectTimeout 10",
            "",
        ]
    path.write_text("\n".join(lines))


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return statistics.median(times)


async def ftconsole_sweeps(info: LabInfo, repeat: int, fanout: int) -> tuple[float, float, float, float, int]:
    loaded = load_config(info.config_path)
    nodes = loaded.cluster.node_list()
    async with SSHPool.from_config(loaded) as pool:
        started = time.perf_counter()
        results = await sweep(pool, loaded.cluster, nodes, limit=fanout)
        cold = time.perf_counter() - started
        failures = sum(isinstance(r, ProbeFailure) for r in results.values())
        warm, cpu = [], []
        for _ in range(repeat):
            cpu0, started = cpu_seconds(), time.perf_counter()
            await sweep(pool, loaded.cluster, nodes, limit=fanout)
            warm.append(time.perf_counter() - started)
            cpu.append(cpu_seconds() - cpu0)
        trues = []
        for _ in range(repeat):
            started = time.perf_counter()
            await run_on_all(nodes, lambda n: pool.run(n, ["true"]), limit=fanout)
            trues.append(time.perf_counter() - started)
    return cold, statistics.median(warm), statistics.median(trues), statistics.median(cpu) / len(nodes), failures


def bench(count: int, repeat: int, fanout: int, work: Path) -> Row:
    lab_dir = work / f"lab{count}"
    info = lab_up(lab_dir, None, nodes=count, timeout=120)
    try:
        cold, warm, true_s, cpu_per_node, failures = asyncio.run(ftconsole_sweeps(info, repeat, fanout))
        cfg = work / f"ssh_config{count}"
        ssh_config(info, cfg)
        hosts = fold_nodeset([n.name for n in info.nodes])
        env = {**os.environ, "PDSH_SSH_ARGS": f"-F {cfg} %h", "PDSH_RCMD_TYPE": "ssh"}
        pdsh = timed(["pdsh", "-f", str(fanout), "-w", hosts, "true"], env, repeat) if shutil.which("pdsh") else None
        clush = (
            timed(["clush", "-f", str(fanout), "-o", f"-F {cfg}", "-w", hosts, "true"], env, repeat)
            if shutil.which("clush")
            else None
        )
    finally:
        lab_down(lab_dir)
    return Row(count, cold, warm, true_s, cpu_per_node * 1000, pdsh, clush, failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="8,64,256", help="comma-separated node counts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fanout", type=int, default=64, help="concurrent nodes, for every tool")
    args = parser.parse_args()
    counts = [int(c) for c in args.nodes.split(",")]
    missing = [tool for tool in ("pdsh", "clush") if not shutil.which(tool)]
    if missing:
        print(f"note: {', '.join(missing)} not installed (apt-get install pdsh clustershell); column left empty")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ftbench-") as tmp:
        for count in counts:
            rows.append(bench(count, args.repeat, args.fanout, Path(tmp)))

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def ratio(a: float | None, b: float) -> str:
        return "-" if a is None else f"{a / b:.1f}x"

    print(f"\nmedian of {args.repeat} runs, fan-out {args.fanout}, {os.cpu_count()} CPUs; seconds")
    print_table(
        [
            "NODES",
            "FT COLD",
            "FT WARM",
            "FT TRUE",
            "PDSH TRUE",
            "CLUSH TRUE",
            "PDSH/FT",
            "CLUSH/FT",
            "CPU MS/NODE",
            "FAILED",
        ],
        [
            [
                r.nodes,
                s(r.cold_s),
                s(r.warm_s),
                s(r.true_s),
                s(r.pdsh_s),
                s(r.clush_s),
                ratio(r.pdsh_s, r.true_s),
                ratio(r.clush_s, r.true_s),
                f"{r.cpu_ms_per_node:.2f}",
                r.failures,
            ]
            for r in rows
        ],
    )
    print("PDSH/FT, CLUSH/FT: their `true` time over ftconsole's `true` (same work; >1x means ftconsole is faster).")
    print("FT COLD/WARM run the whole probe agent (a python3 start on each node, on this machine's shared CPUs).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
