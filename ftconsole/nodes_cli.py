"""`ftconsole probe`, `nodes`, `drain`, `resume` and `repair`: the nodes' commands of the CLI, through the
scheduler's API (in-process when no scheduler serves; `repair` only through a running one)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from ftconsole.format import (
    age,
    gpu_summary,
    node_doing,
    print_json,
    print_table,
    printable,
    runtime_lines,
    test_line,
)
from ftconsole.jobs_cli import loaded_config
from ftconsole.probes.health import NodeState
from ftconsole.scheduler.errors import NotRunning, UsageError
from ftconsole.scheduler.serve.client import open_client
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.nodetestspec import PASSING

PROG = "ftconsole"
WAIT_POLL_S = 1.0  # repair --wait looks again this often


def cmd_probe(args: argparse.Namespace) -> int:
    loaded = loaded_config(args)
    checks = [c.strip() for c in args.checks.split(",")] if args.checks else None

    async def go() -> list[dict[str, Any]]:
        async with open_client(loaded) as client:  # the scheduler's probe when one serves
            return list(await client.call("probe", nodeset=args.nodeset, checks=checks))

    results = asyncio.run(go())
    if args.json:
        print_json(results)
    else:
        rows = []
        for r in results:
            if r["error"]:
                detail = f"{r['error']['kind']}: {r['error']['message']}"
            else:
                bad = [c for c in r["checks"] if c["status"] in ("fail", "warn")]
                detail = "; ".join(f"{c['name']} {c['status']}: {c['message']}" for c in bad) or "all checks pass"
            rows.append(
                [r["name"], r["state"], gpu_summary(r["gpus"]), f"{(r['duration_s'] or 0) * 1000:.0f}ms", detail]
            )
        print_table(["NODE", "STATE", "GPUS", "AGENT", "DETAIL"], rows)
    return 0 if all(r["state"] == "healthy" for r in results) else 1


def cmd_nodes(args: argparse.Namespace) -> int:
    states = [state.value for state in NodeState]
    if any(state not in states for state in args.state or ()):  # refused, as `jobs --status` refuses a status
        raise UsageError(f"unknown state in {', '.join(args.state)} (one of {', '.join(states)})")
    loaded = loaded_config(args)

    async def go() -> list[dict[str, Any]]:
        async with open_client(loaded) as client:  # the scheduler's view when one serves
            return list(await client.call("nodes", nodeset=args.nodeset))

    views = asyncio.run(go())
    if args.state:
        views = [v for v in views if v["state"] in args.state]
    if args.json:
        print_json(views)
        return 0
    rows = [
        [
            v["name"],
            f"{v['state']} (flaky)" if v.get("flaky") else v["state"],
            v["pool"],
            gpu_summary(v["gpus"]),
            age(v["last_probe_age_s"]),
            "; ".join(node_doing(v) + v["reasons"]) or "-",
        ]
        for v in views
    ]
    print_table(["NODE", "STATE", "POOL", "GPUS", "PROBED", "REASONS"], rows)
    if args.nodeset:  # named nodes: what the table has no room for, a block per node
        for v in views:
            lines = runtime_lines(v.get("facts")) + [f"tested: {test_line(t)}" for t in v.get("tests") or []]
            if lines:
                print(f"\n{v['name']}:")
                print("\n".join(f"  {line}" for line in lines))
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    return _admin(args, "drain", nodeset=args.node, reason=args.reason or "")


def cmd_resume(args: argparse.Namespace) -> int:
    if args.test:
        return _admin(args, "resume", nodeset=args.node, test=True)
    return _admin(args, "resume", nodeset=args.node)


def cmd_repair(args: argparse.Namespace) -> int:
    """Start the repair ladder on drained or isolated nodes; it climbs in the running scheduler. `--wait`: until
    each climb ends, then exit 1 unless every node is back in service."""
    loaded = loaded_config(args)

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with open_client(loaded) as client:
            if client.embedded:  # the climb goes on after this command: only a running scheduler can carry it
                raise NotRunning("repair needs the scheduler running (ftconsole serve): a repair takes minutes")
            started = list(await client.call("repair", nodeset=args.node))
            names = ",".join(v["name"] for v in started)
            ended = started
            while args.wait and any(v.get("repair") for v in ended):
                await asyncio.sleep(WAIT_POLL_S)
                ended = list(await client.call("nodes", nodeset=names))
            return started, ended

    started, ended = asyncio.run(go())
    if args.json:
        print_json([{"name": v["name"], "state": v["state"], "repair": v.get("repair")} for v in ended])
    else:
        for v in started:
            step = (v.get("repair") or {}).get("step", "ended")
            print(printable(f"{v['name']}: repair started ({step})"))
        for v in ended if args.wait else []:
            print(printable(f"{v['name']}: {v['state']}" + (f" ({v['admin_reason']})" if v["admin_reason"] else "")))
    if args.wait and any(v["state"] in ("isolated", "drained") for v in ended):
        out = [v["name"] for v in ended if v["state"] in ("isolated", "drained")]
        print(f"{PROG}: {', '.join(out)} not back in service: `{PROG} events --node NODE` says why", file=sys.stderr)
        return 1
    return 0


def _admin(args: argparse.Namespace, op: str, **call: Any) -> int:
    """drain and resume, through the scheduler's API (in-process when none runs): admins only."""
    loaded = loaded_config(args)

    async def go() -> list[dict[str, Any]]:
        async with open_client(loaded) as client:
            return list(await client.call(op, **call))

    views = asyncio.run(go())
    tested = bool(call.get("test"))
    if args.json:
        print_json(
            [{"name": v["name"], "state": v["state"], "reasons": v["reasons"], "flaky": v.get("flaky", False),
              "faults_in_window": v.get("faults_in_window", 0), **({"tests": v["tests"]} if tested else {})}
             for v in views]
        )  # fmt: skip
    else:
        for v in views:
            print(printable(f"{v['name']}: {v['state']}" + (f" ({v['admin_reason']})" if v["admin_reason"] else "")))
            for t in v.get("tests") or [] if tested else []:
                print(printable(f"  {test_line(t)}"))
    if op == "resume":
        for v in views:
            if v.get("flaky"):
                window = format_duration(float(v.get("faults_window_s") or 0))
                print(
                    f"{PROG}: warning: {v['name']} is flaky ({v['faults_in_window']} faults within {window}): it takes "
                    f"work again; `{PROG} events --node {v['name']}` lists its faults",
                    file=sys.stderr,
                )
    failed = [v["name"] for v in views if any(t["result"] not in PASSING for t in v.get("tests") or [])]
    if tested and failed:
        print(f"{PROG}: {', '.join(failed)} did not pass the node tests: not resumed", file=sys.stderr)
        return 1
    return 0
