"""Console side of the run supervisor: start, read and stop runs on a node, one SSH command each.

The supervisor (`scheduler/supervisor.py`, stdlib-only) is sent to `python3 -` with its parameters in a
prepended line, exactly like the probe agent; `status` reads every run of a node in one round trip. A run is
one command, or a sequence of `Step`s (hooks, batch tasks) that the supervisor runs in turn.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ftconsole.scheduler.config import Node
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.jobs import Run
from ftconsole.scheduler.ssh import Transport, python_stdin_script

log = logging.getLogger("ftconsole.scheduler")

SUPERVISOR_PROTOCOL = 2
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


@dataclass(frozen=True)
class Prune:
    """Run retention, sent along with a status read (no round trip of its own): the node removes the folders
    of this cluster's attempts that ended more than `retention` seconds ago (its own clock), but those in
    `keep` ("<job>/<attempt>") or claimed by one of `tokens`, and nothing outside <run_root>/<cluster>."""

    run_root: str
    cluster: str
    retention: float
    keep: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()

    @classmethod
    def keeping(cls, run_root: str, cluster: str, retention: float, current: Iterable[Run]) -> Prune:
        """Keep the attempts of `current` (the store's held runs, any node: each with job, attempt, token)."""
        runs = list(current)
        return cls(
            run_root=run_root,
            cluster=cluster,
            retention=retention,
            keep=tuple(sorted({f"{r.job}/{r.attempt}" for r in runs})),
            tokens=tuple(sorted({r.token for r in runs if r.token})),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_root": self.run_root,
            "cluster": self.cluster,
            "retention": self.retention,
            "keep": list(self.keep),
            "tokens": list(self.tokens),
        }


def _pruned(node: Node, doc: dict[str, Any], into: list[str] | None) -> None:
    """What a read's prune removed, appended to `into`; a prune that failed is logged (the read stands)."""
    if "prune_error" in doc:
        log.warning("%s: cannot remove old run folders: %s", node.name, doc["prune_error"])
    if into is not None:
        into.extend(str(p) for p in doc.get("pruned") or ())


@functools.cache
def supervisor_source() -> str:
    return (Path(__file__).parent / "supervisor.py").read_text(encoding="utf-8")


def supervisor_script(params: dict[str, Any]) -> str:
    return python_stdin_script(supervisor_source(), params)


@dataclass(frozen=True)
class RunStatus:
    """What status.json of one run says (see supervisor.py)."""

    # starting | running | exited | failed | lost | orphaned (supervisor dead, its processes alive) | absent (no
    # status.json in a run folder asked for) | foreign (another attempt's run) | refused (start: claimed by another)
    state: str
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
    token: str | None = None  # the attempt token the run folder is claimed by
    boot_id: str | None = None  # the node's boot when the run started
    supervisor_pid: int | None = None
    supervisor_start: int | None = None  # start time of the supervisor (clock ticks since boot)
    pid_start: int | None = None  # start time of the step's process (the leader of its process group)

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
            token=doc.get("token"),
            boot_id=doc.get("boot_id"),
            supervisor_pid=doc.get("supervisor_pid"),
            supervisor_start=doc.get("supervisor_start"),
            pid_start=doc.get("pid_start"),
        )

    @property
    def finished(self) -> bool:
        return self.state in ("exited", "failed", "lost", "absent", "foreign", "refused")

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
    token: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> tuple[bool, RunStatus]:
    """Start a detached run; (False, its status) when the run folder already had one (never twice).

    `argv`/`env` are the main command (argv.json, env.json); with `steps`, the run is those steps in turn.
    With `token` the folder is claimed for it first: a folder claimed by another token is refused (state
    `refused`, `error` says why), never adopted.
    """
    params: dict[str, Any] = {
        "action": "start",
        "token": token,
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
    if "refused" in doc:
        return False, RunStatus(state="refused", error=str(doc["refused"]), run_dir=doc.get("run_dir"))
    status = dataclasses.replace(RunStatus.from_json(doc["status"]), run_dir=doc.get("run_dir"))
    return bool(doc["started"]), status


async def node_runs(
    transport: Transport,
    node: Node,
    *,
    root: str = DEFAULT_RUN_ROOT,
    prune: Prune | None = None,
    pruned: list[str] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> list[NodeRun]:
    """Every run under `root` on the node. With `prune`, old ended attempts' folders are removed first, in
    the same round trip; their names ("<job>/<attempt>") are appended to `pruned`."""
    params: dict[str, Any] = {"action": "status", "root": root}
    if prune is not None:
        params["prune"] = prune.to_json()
    doc = await _call(transport, node, python, params, timeout)
    _pruned(node, doc, pruned)
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
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    *,
    tokens: dict[str, str] | None = None,
    prune: Prune | None = None,
    pruned: list[str] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> dict[str, RunStatus]:
    """The status of the given run folders of one node, in one round trip, keyed by run folder as given.

    With `tokens` (run folder -> attempt token), a folder claimed by another token reads state `foreign`.
    With `prune`, as `node_runs`."""
    params: dict[str, Any] = {"action": "status", "run_dirs": list(run_dirs), "tokens": tokens or {}}
    if prune is not None:
        params["prune"] = prune.to_json()
    doc = await _call(transport, node, python, params, timeout)
    _pruned(node, doc, pruned)
    return {r["run_dir"]: RunStatus.from_json(r["status"]) for r in doc["runs"]}


async def free_port(transport: Transport, node: Node, *, python: str = "python3", timeout: float = 30.0) -> int:
    """A TCP port free on the node now (for MASTER_PORT)."""
    doc = await _call(transport, node, python, {"action": "port"}, timeout)
    return int(doc["port"])


async def stop_runs(
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    *,
    tokens: dict[str, str] | None = None,
    force: bool = False,
    python: str = "python3",
    timeout: float = 30.0,
) -> list[dict[str, Any]]:
    """Stop runs (SIGTERM to their supervisors; `force`: SIGKILL to everything of them). Each answer has
    `signalled` and `alive` (something of the run may still run). Orphaned runs are always killed."""
    params = {"action": "stop", "run_dirs": list(run_dirs), "tokens": tokens or {}, "force": force}
    doc = await _call(transport, node, python, params, timeout)
    return list(doc["stopped"])
