"""`ftconsole debug JOB`: what every rank of a running job is doing, and the rank that stands out (issue 29).

Gathered by the scheduler from all the job's nodes at once (see docs/jobs.md, "Which rank hangs"); of a job
that is not running, the evidence kept from the last time. The stacks of ranks whose main threads are at the
same place are shown once.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ftconsole.format import format_table, print_json, printable
from ftconsole.jobs_cli import _with_client


def cmd_debug(args: argparse.Namespace) -> int:
    doc = _with_client(args, "debug", lambda c: c.call("debug", job=args.job, stacks=not args.no_stacks))
    if args.json:
        print_json(doc)
    else:
        print(evidence_text(doc))
    return 0


def _last_collective(rank: dict[str, Any]) -> str:
    """Its last collective in torch's trace (the first process group's): "all_reduce #42" (", done" once retired)."""
    if not rank.get("collectives"):
        return "-"
    last = rank["collectives"][0]
    return f"{last['op']} #{last['seq']}{', done' if last['done'] else ''}"


def evidence_text(doc: dict[str, Any]) -> str:
    """The evidence as people read it (the CLI's output, the console's Debug tab): the verdict, a table of the
    ranks, then each distinct main-thread stack once with the ranks at it; no control character (its frame names,
    command lines and output are a job user's words)."""
    when = time.strftime("%H:%M:%S", time.localtime(doc["time"]))
    kept = " (kept: the job is not running)" if doc.get("kept") else ""
    lines = [f"job {doc['job']}, attempt {doc['attempt']}, at {when} ({doc['seconds']:.1f} s to gather){kept}",
             f"verdict: {doc['verdict']['reason']}"]  # fmt: skip
    if doc.get("suspected_hung") is False and doc["verdict"]["rank"] is not None:
        lines.append("(the job is not suspected hung: a rank of a job that moves is often between two collectives)")
    lines.append("")
    rows = []
    traced = any(r.get("collectives") for r in doc["ranks"])  # torch's trace (older documents have none)
    for r in doc["ranks"]:
        cpu = "-" if r["cpu"] is None else f"{r['cpu']:.0%}"
        where = r["gone"] or (f"in {r['collective']}" if r["collective"] else r["where"])
        row = [r["rank"], r["node"], r["pid"] or "-", r["state"] or "-", r["wchan"] or "-", cpu]
        rows.append([*row, _last_collective(r), where] if traced else [*row, where])
    head = ["RANK", "NODE", "PID", "STATE", "WAITS IN", "CPU"]
    lines.append(format_table([*head, "LAST COLLECTIVE", "WHERE"] if traced else [*head, "WHERE"], rows))
    lines += _kernel_lines(doc)
    for ranks, stack in _folded(doc["ranks"]):
        lines += ["", f"ranks {ranks}:" if "," in ranks or "-" in ranks else f"rank {ranks}:"]
        lines += [f"    {frame['name']} ({frame['file']}:{frame['line']})" for frame in stack]
    return printable("\n".join(lines))


def _kernel_lines(doc: dict[str, Any]) -> list[str]:
    """The driver's Xids on the ranks' GPUs since the attempt started, once per node and Xid; and the nodes
    whose kernel log could not be read."""
    seen: dict[tuple[str, float, int], str] = {}
    for r in doc["ranks"]:
        for x in r.get("xids") or []:
            when = time.strftime("%H:%M:%S", time.localtime(x["time"]))
            hardware = " [hardware]" if x.get("hardware") else ""
            seen[(r["node"], x["time"], x["code"])] = f"  {r['node']}: {x['what']} at {when}{hardware}: {x['text']}"
    unread = sorted({f"  {run['node']}: {run['xids_error']}" for run in doc.get("runs") or [] if run.get("xids_error")})
    lines = []
    if seen:
        lines += ["", "kernel log (NVIDIA Xids since the attempt started):", *(seen[k] for k in sorted(seen))]
    if unread:
        lines += ["", "kernel log not read:", *unread]
    return lines


def _folded(ranks: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The main-thread stacks, each once with the ranks at it ("0-2, 4-7"), most shared first."""
    from ftconsole.scheduler.decide.hangs import ranges

    groups: dict[str, tuple[list[int], list[dict[str, Any]]]] = {}
    for r in ranks:
        if r["stack"]:
            key = "\n".join(f"{f['name']}:{f['file']}:{f['line']}" for f in r["stack"])
            groups.setdefault(key, ([], r["stack"]))[0].append(r["rank"])
    ordered = sorted(groups.values(), key=lambda g: (-len(g[0]), g[0][0]))
    return [(ranges(numbers), stack) for numbers, stack in ordered]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "debug",
        parents=parents,
        help="what every rank of a running job is doing (states, stacks) and the rank that stands out",
        description="Gathers, from all the job's nodes at once, what each rank's processes are doing (state, "
        "what they wait in, CPU time moving, the Python stack of each by py-spy where the node has it) and the "
        "last lines of output, names the rank that stands out and why, and keeps it with the job. Nothing is "
        "stopped. Of a job that is not running, shows the evidence kept last.",
    )
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--no-stacks", action="store_true", help="leave out the Python stacks (no py-spy on the nodes)")
    p.set_defaults(func=cmd_debug)
