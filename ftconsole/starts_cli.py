"""`ftconsole jobs --start` (Slurm's `squeue --start`): each queued job's expected start, as the scheduler's own
passes would make it if every running job ran until its time limit (docs/scheduling.md, "Expected starts")."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ClusterShell.NodeSet import NodeSet

from ftconsole.format import print_json, print_table, printable
from ftconsole.scheduler.serve.client import Client


def _at(ts: float | None, now: float) -> str:
    if ts is None:
        return "N/A"
    if ts <= now + 1:
        return "now"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


async def read(client: Client, filters: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The queued jobs `jobs`' options select, and the forecast."""
    return await client.call("jobs", **{**filters, "status": ["queued"]}), await client.call("forecast")


def print_starts(args: argparse.Namespace, jobs: list[dict[str, Any]], found: dict[str, Any]) -> int:
    if args.json:
        print_json(found)
        return 0
    by_id = {j["id"]: j for j in jobs}
    rows = []
    now = found["now"]
    listed = {e["id"] for e in found["queued"]}
    beyond = found.get("beyond") or {"message": "not worked out"}
    # the jobs the forecast counts but does not list last (past the queue depth: no pass looks at them), each
    # with its own message, which the pass wrote
    past = [{"id": j["id"], "start": None, "end": None, "nodes": [], "message": j["message"] or beyond["message"]}
            for j in jobs if j["id"] not in listed]  # fmt: skip
    for e in [*found["queued"], *past]:
        j = by_id.get(e["id"])
        if j is None:  # filtered out by the other options
            continue
        nodes = str(NodeSet.fromlist(e["nodes"])) if e["nodes"] else "-"
        why = "-" if e["start"] is not None else printable(e["message"] or "-")
        rows.append([j.get("ref") or j["id"], j["name"], j["owner"], j["priority"], _at(e["start"], now),
                     _at(e["end"], now) if e["end"] is not None else "-", nodes, why])  # fmt: skip
    print_table(["ID", "NAME", "OWNER", "PRIORITY", "START", "END", "NODES", "WHY N/A"], rows)
    if not found["complete"]:
        print(f"(expected starts after {_at(found['until'], now)} are not worked out: N/A)")
    return 0
