"""`ftconsole reservation create|list|delete`: nodes kept for a user, a project or maintenance over a window (like
Slurm's `scontrol create reservation`). Admins create and delete; anyone lists.

A time is a moment (`2026-11-27T14:00`, local time), `now`, or a time from now (`+2h`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ftconsole.format import print_json, print_table
from ftconsole.jobs_cli import _with_client
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.values import parse_duration
from ftconsole.usage_cli import parse_when


def when(text: str, now: float) -> float:
    """`now`, `+2h` (from now), or a date and time (local)."""
    if text.strip() == "now":
        return now
    if text.strip().startswith("+"):
        try:
            return now + parse_duration(text.strip()[1:])
        except ValueError:
            raise UsageError(f"{text!r}: after + comes a duration (+2h, +30m, +1d)") from None
    return parse_when(text, now)


def cmd_reservation(args: argparse.Namespace) -> int:
    if args.action == "list":
        doc: Any = _with_client(args, "reservations", lambda c: c.call("reservations"))
        if args.json:
            print_json(doc)
            return 0
        rows = [[r["name"], r["state"], _who(r), _local(r["start"]), _local(r["end"]), _nodes(r["nodes"]),
                 r["by"], r["reason"] or "-"] for r in doc]  # fmt: skip
        print_table(["NAME", "STATE", "FOR", "START", "END", "NODES", "BY", "REASON"], rows)
        return 0
    if not args.name:
        raise UsageError(f"reservation {args.action} needs the reservation's NAME")
    if args.action == "delete":
        doc = _with_client(args, "unreserve", lambda c: c.call("unreserve", name=args.name))
        if args.json:
            print_json(doc)
        else:
            print(f"reservation {doc['name']} deleted: {_nodes(doc['nodes'])} go back to every job")
        return 0
    now = time.time()
    start = when(args.start, now) if args.start else now
    if (args.end is None) == (args.duration is None):
        raise UsageError("reservation create needs its end: --end WHEN or --duration D")
    end = when(args.end, now) if args.end is not None else start + parse_duration(args.duration)
    wanted = {"name": args.name, "start": start, "end": end, "nodes": args.nodes, "spec": args.spec,
              "count": args.count, "user": args.user, "project": args.project, "maintenance": args.maintenance,
              "reason": args.reason or ""}  # fmt: skip
    doc = _with_client(args, "reserve", lambda c: c.call("reserve", **wanted))
    if args.json:
        print_json(doc)
        return 0
    print(f"reservation {doc['name']}: {_who(doc)}, {_local(doc['start'])} to {_local(doc['end'])} on "
          f"{_nodes(doc['nodes'])}")  # fmt: skip
    for job in doc["running"]:
        print(f"warning: job {job['id']} ({job['owner']}) runs on {job['node']} and may still run then ({job['why']})")
    return 0


def _who(r: dict[str, Any]) -> str:
    if r["maintenance"]:
        return "maintenance"
    return f"user {r['user']}" if r["user"] else f"project {r['project']}"


def _nodes(nodes: list[str]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(nodes)) if nodes else "-"


def _local(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reservation",
        parents=parents,
        help="keep nodes for a user, a project or maintenance over a window (admins); list them",
        description="Reserved nodes take only the jobs that name the reservation (`reservation: NAME`, of its user "
        "or project) within its window; other jobs keep off them while it runs, and do not start there if they "
        "would still run when it starts (a job without max_runtime never ends). A maintenance reservation takes no "
        "job. WHEN is a date and time (2026-11-27T14:00, local), now, or +2h from now.",
    )
    p.add_argument("action", choices=["create", "list", "delete"])
    p.add_argument("name", nargs="?", help="the reservation's name (create, delete)")
    p.add_argument("--nodes", metavar="NODESET", help="create: these nodes (gpu[01-04])")
    p.add_argument("--spec", help="create: --count nodes of this spec of the cluster config, chosen now")
    p.add_argument("--count", type=int, metavar="N", help="create: how many nodes of --spec")
    p.add_argument("--start", metavar="WHEN", help="create: when it begins (default: now)")
    p.add_argument("--end", metavar="WHEN", help="create: when it ends")
    p.add_argument("--duration", metavar="D", help="create: how long it lasts (8h), instead of --end")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", help="create: for this user's jobs")
    who.add_argument("--project", help="create: for this project's jobs")
    who.add_argument("--maintenance", action="store_true", help="create: for no job: the nodes are worked on")
    p.add_argument("--reason", help="create: why, for the next person on call")
    p.add_argument("--local", action="store_true", help="without a scheduler serving: write it to the store")
    p.set_defaults(func=cmd_reservation)
