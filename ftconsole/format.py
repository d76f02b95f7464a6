"""Small text formatters shared by the CLI and the console.

What they write is for a terminal: a text that came from the store (a job's message, an event, a run's error, a
node's reason) may hold a job user's words, so no control character of it is written (`printable`; the store
keeps them without, `scheduler.decide.usertext`: this is the second line of defence, for text stored by an
older ftconsole or gathered on the way)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ftconsole.probes.results import parse_runtimes
from ftconsole.scheduler.decide.usertext import clean
from ftconsole.scheduler.errors import ConfigError, FtError, Problem


def printable(value: Any) -> str:
    """`value` as text for a terminal: without control characters (newline and tab stay)."""
    return clean(str(value))


def node_count(job: Mapping[str, Any]) -> str:
    """A job's node count; `1/3` for a running elastic job on fewer nodes than it asks for (or being resized)."""
    held = len(job.get("node_names") or ())
    if job["status"] == "running" and held and held != job["nodes"]:
        return f"{held}/{job['nodes']}"
    return str(job["nodes"])


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def gpu_summary(gpus: Sequence[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    names = {g.get("name") or "?" for g in gpus}
    name = names.pop() if len(names) == 1 else "mixed"
    short = name.replace("NVIDIA ", "")
    return f"{len(gpus)}x {short}"


def test_line(test: Mapping[str, Any]) -> str:
    """One node test's result (a `tested` event's data): `gpu (dcgmi diag -r 1): pass: ... (12.3s)`, and when."""
    name = str(test.get("test") or "?")
    level = test.get("level")
    if name == "gpu" and isinstance(level, int):
        name = f"gpu (level {level})" if test.get("tool") == "simulated" else f"gpu (dcgmi diag -r {level})"
    took, when = test.get("took_s"), test.get("time")
    notes = [f"{took:.1f}s"] if isinstance(took, int | float) else []
    notes += [f"{age(time.time() - when)} ago"] if isinstance(when, int | float) else []
    noted = f" ({', '.join(notes)})" if notes else ""
    return f"{name}: {test.get('result')}: {test.get('summary') or ''}{noted}"


def runtime_lines(facts: Mapping[str, Any] | None) -> list[str]:
    """A line per container runtime of a node's facts ("podman 4.3.1, GPUs: CDI"); no line where they were not
    probed (no report yet, or one stored by an older ftconsole)."""
    if not facts or "runtimes" not in facts:
        return []
    runtimes = parse_runtimes(facts.get("runtimes"))
    if not runtimes:
        return ["container runtimes: none found"]
    return [f"container runtime {r.describe()}" for r in runtimes]


def problem_json(problem: Problem) -> dict[str, Any]:
    """A problem of a file in JSON, as `config check --json` lists them."""
    return {"file": problem.file, "line": problem.line, "key": problem.path, "message": problem.message}


def error_document(exc: FtError, **extra: Any) -> dict[str, Any]:
    """An error as `--json` prints it on stdout: {"error": {"title", "message", "exit_code"}}, with `problems` for
    an invalid file, then `extra` (a usage error's `usage`)."""
    body: dict[str, Any] = {"title": exc.title, "message": printable(exc.message), "exit_code": exc.exit_code}
    if isinstance(exc, ConfigError):
        body["problems"] = [problem_json(p) for p in exc.problems]
    return {"error": body | extra}


def error_text(exc: FtError) -> str:
    """An error as stderr shows it: `ftconsole: <title>: <message>`, or an invalid file's problems a line each. A
    message may quote what a job's user wrote (a run's error): no control character of it is written."""
    if isinstance(exc, ConfigError):
        return "\n".join([f"ftconsole: {exc.title}:", *(f"  {printable(p)}" for p in exc.problems)])
    return f"ftconsole: {exc.title}: {printable(exc)}"


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(format_table(headers, rows))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart, a line per row after the headers."""
    cells = [[str(h) for h in headers]] + [["" if c is None else printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def node_doing(view: Mapping[str, Any]) -> list[str]:
    """What is being done to a node now (its `nodes --json` view), said before its reasons: the step of its repair,
    its node tests."""
    climb = view.get("repair")
    repairing = [f"repair: {climb['step']} (by {climb['by']})"] if isinstance(climb, Mapping) else []
    return repairing + (["node tests running"] if view.get("testing") else [])


def step_line(step: Mapping[str, Any]) -> str:
    """One step of a job (`ftconsole run`): number, how it is, mode, nodes and GPUs, when, who, the command."""
    how = step["state"] + (f" (exit {step['exit_code']})" if step.get("exit_code") is not None else "")
    where = " ".join(f"{r['node']}:{','.join(map(str, r['gpus'])) or '-'}" for r in step["ranks"])
    when = time.strftime("%H:%M:%S", time.localtime(step["started"]))
    if step.get("ended"):
        when += time.strftime("-%H:%M:%S", time.localtime(step["ended"]))
    command = " ".join(str(a) for a in step["argv"])
    why = f" ({step['message']})" if step.get("message") else ""
    return f"{step['number']}  {how}{why}  {step['mode']}  {where}  {when}  by {step['run_by']}  {printable(command)}"
