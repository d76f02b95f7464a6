"""Benchmark: how long a node is out of service after it dies under a job, with the repair ladder and without.

    .venv/bin/python bench/repair.py [--nodes 4] [--repeats 3] [--probe-interval 5s]

A lab of `--nodes` nodes of 4 GPUs and `ftconsole serve` (its own state_dir; `probes.interval` as given, the
other settings the scheduler's defaults; the GPU node test at level 1, which the lab's simulated GPUs pass). Each
round submits a one-node job (`sleep 3600`, `fault_tolerance: {retries: 3}`) to the nodes no round killed yet (a
node killed twice is flaky, and waits for an operator by design), waits until it runs, and kills its node
(`ftconsole lab fault NODE --kill`: SSH refused, its processes SIGKILLed). The scheduler finds the rank lost,
isolates the node and runs the job elsewhere. Then, in the same run, side by side:

- `repair`: `repair.auto: true`, `repair.reboot` the lab's reboot (`lab fault NODE --reboot`, as an IPMI power
  cycle): the scheduler waits until no job holds the node, reboots it, waits for its new boot id, runs the node
  test and resumes it, with no operator;
- `none`: no repair: the node stays isolated until an operator acts (the round waits `--wait` seconds, then
  reboots the node by hand and resumes it, as an operator would; OUT S is then at least that wait).

The times come from the node's events (`events --node`), on this machine's clock:

    ISOLATED S  the kill -> the node `isolated` (the rank lost after node_timeout, the job requeued)
    STARTED S   isolated -> `repair started` (the next probe pass: up to probes.interval)
    BOOTED S    started -> `rebooted` (the reboot command, and the probe that reads the new boot id)
    TESTED S    rebooted -> the node test's `tested`
    OUT S       isolated -> `resumed`: how long the node was out of service
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from recovery import Serve, connect, write_layout  # noqa: E402  (bench/ is the script's folder: on the path)

from ftconsole.format import print_table  # noqa: E402
from ftconsole.lab import Fault, lab_down, lab_fault, lab_up  # noqa: E402
from ftconsole.scheduler.serve.api import ApiClient  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402

JOB = {"name": "victim", "command": "sleep 3600", "gpus_per_node": 4, "fault_tolerance": {"retries": 3}}
WAIT_S = 180.0  # the most a step may take


async def until(what: str, check: Any, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


async def event_time(api: ApiClient, node: str, kind: str, after: float, text: str = "") -> float | None:
    for e in await api.call("events", node=node, limit=200):
        if e["kind"] == kind and e["time"] >= after and text in e["message"]:
            return float(e["time"])
    return None


async def one_round(
    api: ApiClient, lab_dir: Path, repair: bool, manual_wait: float, fresh: list[str]
) -> dict[str, float]:
    """One round on the nodes not killed yet (`fresh`): a node killed twice within probes.flaky_window is flaky,
    and a flaky node waits for an operator, by design."""
    job = (await api.call("submit", spec={**JOB, "node_names": ",".join(fresh)}))["id"]

    async def running() -> dict[str, Any] | None:
        shown = await api.call("show", job=job)
        runs = shown["attempts"][-1]["runs"] if shown["attempts"] else []
        return shown if runs and all(r["state"] == "running" and r["pid"] for r in runs) else None

    shown = await until("the job to run", running)
    node = shown["attempts"][-1]["runs"][0]["node"]
    fresh.remove(node)
    print(f"  {'repair' if repair else 'none'}: job {job} runs on {node}: killing it", file=sys.stderr)
    killed = time.time()
    await asyncio.to_thread(lab_fault, lab_dir, node, Fault.kill())
    isolated = await until(f"{node} isolated", lambda: event_time(api, node, "isolated", killed))
    if not repair:
        await asyncio.sleep(manual_wait)  # an operator notices, power-cycles it, resumes it
        await asyncio.to_thread(lab_fault, lab_dir, node, Fault.reboot())
        await api.call("resume", nodeset=node)
    resumed = await until(f"{node} resumed", lambda: event_time(api, node, "resumed", isolated))
    started = await event_time(api, node, "repair", isolated, "repair started")
    booted = await event_time(api, node, "rebooted", isolated)
    tested = await event_time(api, node, "tested", isolated)
    await api.call("stop", jobs=[job])
    out = {"isolated": isolated - killed, "out": resumed - isolated}
    if started is not None and booted is not None and tested is not None:
        out.update(started=started - isolated, booted=booted - started, tested=tested - booted)
    return out


async def one_lab(root: Path, nodes: int, repeats: int, repair: bool, interval: str, wait: float) -> list[dict]:
    layout = root / "layout.yaml"
    write_layout(layout, nodes, nodes * 4)
    lab_dir = root / "lab"
    info = lab_up(lab_dir, layout, None, timeout=120)
    config = yaml.safe_load(Path(info.config_path).read_text())
    config.update(state_dir=str(root / "state"), api={"socket": str(root / "ft.sock")},
                  node_tests={"gpu": {"level": 1, "timeout": "60s"}})  # fmt: skip
    config["ssh"]["python"] = sys.executable
    config["probes"]["interval"] = interval
    config["repair"] = {**config.get("repair", {}), "auto": repair, "max_per_day": 10}
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    serve = Serve(path, root / "serve.log")
    try:
        api = await connect(load_config(path))
        try:
            fresh = [n.name for n in info.nodes]
            return [await one_round(api, lab_dir, repair, wait, fresh) for _ in range(repeats)]
        finally:
            await api.close()
    finally:
        serve.stop()
        lab_down(lab_dir, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-interval", default="5s")
    parser.add_argument("--wait", type=float, default=60.0, help="without repair: when the operator acts (s)")
    parser.add_argument("--keep", type=Path, help="keep each lab's serve.log in this folder")
    args = parser.parse_args()
    if args.repeats > args.nodes - 1:
        raise SystemExit("each round needs a node for the job to run on again: --repeats below --nodes")
    rows = []
    for repair in (True, False):
        with tempfile.TemporaryDirectory(prefix="ftr-", dir="/tmp") as tmp:
            try:
                samples = asyncio.run(one_lab(Path(tmp), args.nodes, args.repeats, repair, args.probe_interval,
                                              args.wait))  # fmt: skip
            finally:
                if args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(tmp) / "serve.log", args.keep / f"serve-{'repair' if repair else 'none'}.log")

        def med(key: str, samples: list[dict] = samples) -> str:
            values = [s[key] for s in samples if key in s]
            return f"{statistics.median(values):.1f}" if values else "-"

        rows.append(["repair" if repair else "none", len(samples), *(med(k) for k in
                     ("isolated", "started", "booted", "tested", "out"))])  # fmt: skip
    print_table(["LADDER", "ROUNDS", "ISOLATED S", "STARTED S", "BOOTED S", "TESTED S", "OUT S"], rows)


if __name__ == "__main__":
    main()
