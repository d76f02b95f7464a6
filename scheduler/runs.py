"""Console side of the run supervisor: start, read and stop runs on a node, one SSH command each.

The supervisor (`scheduler/supervisor.py`, stdlib-only) is sent to `python3 -` with its parameters in a
prepended line, exactly like the probe agent; `status` reads every run of a node in one round trip. A run is
one command, or a sequence of `Step`s (hooks, batch tasks) that the supervisor runs in turn.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from scheduler.config import Node
from scheduler.errors import FtError
from scheduler.ssh import Transport, python_stdin_script

SUPERVISOR_PROTOCOL = 1
DEFAULT_RUN_ROOT = "~/.ftconsole/runs"


class SupervisorError(FtError):
    title = "run supervisor"


class StepKind(StrEnum):
    BEFORE = "before"  # hooks.before: its failure ends the run before the command
    COMMAND = "command"  # a regular job's command
    TASK = "task"  # one task of a batch job
    AFTER = "after"  # hooks.after: runs whatever the outcome (not after a SIGKILL); its failure is only logged


@dataclass(frozen=True)
class Step:
    """One command of a run's sequence (the supervisor's `steps`); `index` of `count` for a batch task."""

    kind: StepKind
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    index: int | None = None
    count: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {"kind": self.kind.value, "name": self.name, "argv": list(self.argv), "env": self.env}
        return doc if self.index is None else {**doc, "index": self.index, "count": self.count}


@functools.cache
def supervisor_source() -> str:
    return (Path(__file__).parent / "supervisor.py").read_text(encoding="utf-8")


def supervisor_script(params: dict[str, Any]) -> str:
    return python_stdin_script(supervisor_source(), params)


@dataclass(frozen=True)
class RunStatus:
    """What status.json of one run says (see supervisor.py)."""

    state: str  # starting | running | exited | failed | lost | absent (no status.json in a run folder asked for)
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    stop_requested: float | None = None
    error: str | None = None
    step: str | None = None  # the step running (at the end: the last one run), for a run of several steps
    run_dir: str | None = None  # the run folder's absolute path on the node, where the supervisor said it
    output_at: float | None = None  # output.log's mtime (status action only; None before it exists)
    output_size: int | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunStatus:
        return cls(
            state=str(doc.get("state", "lost")),
            pid=doc.get("pid"),
            started=doc.get("started"),
            ended=doc.get("ended"),
            exit_code=doc.get("exit_code"),
            signal=doc.get("signal"),
            stop_requested=doc.get("stop_requested"),
            error=doc.get("error"),
            step=doc.get("step"),
            output_at=doc.get("output_mtime"),
            output_size=doc.get("output_size"),
        )

    @property
    def finished(self) -> bool:
        return self.state in ("exited", "failed", "lost", "absent")

    @property
    def succeeded(self) -> bool:
        return self.state == "exited" and self.exit_code == 0


@dataclass(frozen=True)
class NodeRun:
    job: str
    attempt: str
    rank: str
    status: RunStatus


async def _call(
    transport: Transport, node: Node, python: str, params: dict[str, Any], timeout: float
) -> dict[str, Any]:
    result = await transport.run(node, [python, "-"], input=supervisor_script(params), timeout=timeout)
    line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise SupervisorError(f"{node.name}: supervisor printed nothing ({result.describe_failure()})")
    doc: dict[str, Any] = json.loads(line)
    if doc.get("supervisor") != SUPERVISOR_PROTOCOL:
        raise SupervisorError(f"{node.name}: unknown supervisor protocol {doc.get('supervisor')!r}")
    if "error" in doc:
        raise SupervisorError(f"{node.name}: {params['action']} failed: {doc['error']}")
    return doc


async def start_run(
    transport: Transport,
    node: Node,
    *,
    run_dir: str,
    argv: Sequence[str],
    env: dict[str, str],
    workdir: str,
    files: dict[str, bytes] | None = None,
    steps: Sequence[Step] | None = None,
    grace: float = 30.0,
    python: str = "python3",
    timeout: float = 30.0,
) -> tuple[bool, RunStatus]:
    """Start a detached run; (False, its status) when the run folder already had one (never twice).

    `argv`/`env` are the main command (argv.json, env.json); with `steps`, the run is those steps in turn.
    """
    params: dict[str, Any] = {
        "action": "start",
        "run_dir": run_dir,
        "argv": list(argv),
        "env": env,
        "workdir": workdir,
        "files": {name: data.decode("utf-8") for name, data in (files or {}).items()},
        "grace": grace,
    }
    if steps is not None:
        params["steps"] = [s.to_json() for s in steps]
    doc = await _call(transport, node, python, params, timeout)
    status = dataclasses.replace(RunStatus.from_json(doc["status"]), run_dir=doc.get("run_dir"))
    return bool(doc["started"]), status


async def node_runs(
    transport: Transport, node: Node, *, root: str = DEFAULT_RUN_ROOT, python: str = "python3", timeout: float = 30.0
) -> list[NodeRun]:
    doc = await _call(transport, node, python, {"action": "status", "root": root}, timeout)
    return [
        NodeRun(job=r["job"], attempt=r["attempt"], rank=r["rank"], status=RunStatus.from_json(r["status"]))
        for r in doc["runs"]
    ]


async def prepare_run(
    transport: Transport,
    node: Node,
    *,
    run_dir: str,
    argv: Sequence[str],
    env: dict[str, str],
    files: dict[str, bytes] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> str:
    """Write a run folder without starting anything (a rank that mpirun starts); its absolute path."""
    params = {
        "action": "prepare",
        "run_dir": run_dir,
        "argv": list(argv),
        "env": env,
        "files": {name: data.decode("utf-8") for name, data in (files or {}).items()},
    }
    doc = await _call(transport, node, python, params, timeout)
    return str(doc["run_dir"])


async def run_states(
    transport: Transport, node: Node, run_dirs: Sequence[str], *, python: str = "python3", timeout: float = 30.0
) -> dict[str, RunStatus]:
    """The status of the given run folders of one node, in one round trip, keyed by run folder as given."""
    doc = await _call(transport, node, python, {"action": "status", "run_dirs": list(run_dirs)}, timeout)
    return {r["run_dir"]: RunStatus.from_json(r["status"]) for r in doc["runs"]}


async def free_port(transport: Transport, node: Node, *, python: str = "python3", timeout: float = 30.0) -> int:
    """A TCP port free on the node now (for MASTER_PORT)."""
    doc = await _call(transport, node, python, {"action": "port"}, timeout)
    return int(doc["port"])


async def stop_runs(
    transport: Transport, node: Node, run_dirs: Sequence[str], *, python: str = "python3", timeout: float = 30.0
) -> list[dict[str, Any]]:
    doc = await _call(transport, node, python, {"action": "stop", "run_dirs": list(run_dirs)}, timeout)
    return list(doc["stopped"])
