"""The evidence of a hang (issue 29): what every rank of a job's current attempt is doing, gathered from all its
nodes at once over SSH, and the rank that stands out (`scheduler.decide.hangs`).

Per node, in parallel: the runs' status read as their user (which process runs each rank's step now, and when
its output.log was last written), then as the SSH account what those processes and their descendants are
doing (`supervisor_evidence.py`: state, wait channel, CPU time over a short sample, each Python process's stack
by py-spy), and the last lines of each run's output.log, as its user. Nothing is stopped or signalled.

A rank of the verdict is one training process: a launcher's worker (a Python process with RANK in its
environment and none under it; its rank is that RANK), else the run's first Python process, else the first of its
processes that started no other (a wrapper shell's command); its rank is then the run's. The
document (`Evidence.to_json`) keeps everything gathered, per run; `ftconsole debug JOB` shows it.

What the nodes said names the job user's processes (frame names and files, command lines, environments, torch's
op and group names, output): every text of it is kept without control characters (`usertext.clean_json`) before
it is parsed into the verdict's ranks, stored or shown.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ftconsole.scheduler.decide.hangs import Frame, Rank, Verdict, Xid, verdict
from ftconsole.scheduler.decide.jobs import Job, Run
from ftconsole.scheduler.decide.usertext import clean_json
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.executor import Executor
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.spec.containers import container_name
from ftconsole.scheduler.ssh.pyspy import can_run_on, local_py_spy, send_py_spy
from ftconsole.scheduler.ssh.runs import process_evidence, read_file, run_states
from ftconsole.scheduler.store.jobtx import JobTx

log = logging.getLogger("ftconsole.scheduler")

SAMPLE_S = 0.5  # between the two looks at the processes' CPU time
TAIL_LINES = 10
TAIL_BYTES = 8192
EVIDENCE = "Evidence"  # the event that keeps a job's evidence with it
KEPT_BYTES = 256 * 1024
KEEP_PER_JOB = 20  # evidence documents kept of one job (the newest)
STOPPED = frozenset({"T", "t"})


@dataclass(frozen=True)
class Evidence:
    job: int
    attempt: int
    time: float
    seconds: float  # how long gathering it took
    verdict: Verdict
    ranks: tuple[Rank, ...]
    runs: tuple[dict[str, Any], ...] = field(default=())  # per run: rank, node, processes or gone, output tail

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "job": self.job,
            "attempt": self.attempt,
            "time": self.time,
            "seconds": round(self.seconds, 2),
            "verdict": {
                "rank": v.rank,
                "node": v.node,
                "reason": v.reason,
                "rule": v.rule,
                "hardware": v.hardware,
                "ranks": list(v.ranks),
            },
            "ranks": [_rank_json(r) for r in self.ranks],
            "runs": list(self.runs),
        }


def kept(doc: dict[str, Any]) -> dict[str, Any]:
    """The evidence document as kept in the store: whole up to KEPT_BYTES, else without the full process lists
    (the ranks' own stacks stay)."""
    if len(json.dumps(doc)) <= KEPT_BYTES:
        return doc
    runs = [{k: v for k, v in run.items() if k != "processes"} for run in doc.get("runs", [])]
    return dict(doc, runs=runs, cut=f"the process lists were left out (over {KEPT_BYTES} bytes)")


async def record(tx: JobTx, job: int, doc: dict[str, Any]) -> None:
    """Keep the evidence with its job: the document in the store (the newest KEEP_PER_JOB of a job stay), and an
    Evidence event in its timeline with the verdict alone (listings of events stay small)."""
    kept_id = await tx.evidence(job, doc["attempt"], doc["time"], kept(doc), keep=KEEP_PER_JOB)
    text = f"attempt {doc['attempt']}: {doc['verdict']['reason']}"
    await tx.event(doc["time"], EVIDENCE, text, job=job, data={"verdict": doc["verdict"], "evidence": kept_id})


def _xid_json(x: Xid) -> dict[str, Any]:
    return {"code": x.code, "gpu": x.gpu, "time": x.time, "text": x.text, "hardware": x.hardware, "what": str(x)}


def _rank_json(r: Rank) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "node": r.node,
        "pid": r.pid,
        "state": r.state,
        "wchan": r.wchan,
        "cpu": r.cpu,
        "collective": r.collective,
        "where": r.where if r.gone is None else None,
        "stack": [{"name": f.name, "file": f.file, "line": f.line} for f in r.frames],
        "stack_error": r.stack_error,
        "moving": r.moving,
        "gone": r.gone,
        # torch's trace: its last collective in each process group
        "collectives": [{"group": g, "seq": seq, "op": op, "done": done} for g, seq, op, done in r.trace],
        "xids": [_xid_json(x) for x in r.xids],
    }


async def gather(executor: Executor, job: Job, runs: Sequence[Run], *, stacks: bool = True) -> Evidence:
    """The evidence of `job`'s current attempt (`runs`: its launching runs), from all its nodes at once."""
    started = time.monotonic()
    mine = [r for r in runs if r.attempt == job.attempt and r.run_dir]  # launched here, or by a launcher
    by_node: dict[str, list[Run]] = {}
    for r in mine:
        by_node.setdefault(r.node, []).append(r)
    starts = [r.started for r in mine if r.started is not None]
    since = min(starts) if starts else None  # the driver's Xids logged since the attempt started
    found = await asyncio.gather(
        *(_node(executor, job, name, rs, stacks, since) for name, rs in sorted(by_node.items()))
    )
    documents = sorted((clean_json(doc) for docs in found for doc in docs), key=lambda d: d["rank"])
    ranks = sorted((u for doc in documents for u in _units(doc)), key=lambda u: (u.rank, u.node))
    return Evidence(job.id, job.attempt, time.time(), time.monotonic() - started, verdict(ranks), tuple(ranks),
                    tuple(documents))  # fmt: skip


async def _node(
    executor: Executor, job: Job, name: str, runs: Sequence[Run], stacks: bool, since: float | None
) -> list[dict[str, Any]]:
    """One node's runs: [{rank, node, run_dir, gpus, status, processes | gone, output_tail, xids}]."""
    node = executor.nodes.get(name)
    out = [{"rank": r.rank, "node": name, "run_dir": r.run_dir, "gpus": list(r.gpus)} for r in runs]
    if node is None:
        return [dict(d, gone=f"node {name} is no longer in the cluster config") for d in out]
    user = executor.run_user(job)
    timeout = executor.config.ssh.command_timeout
    python = executor.config.ssh.python
    try:
        states = await run_states(executor.transport, node, [r.run_dir for r in runs],
                                  tokens={r.run_dir: r.token for r in runs if r.token},
                                  users=dict.fromkeys((r.run_dir for r in runs), user), python=python,
                                  timeout=timeout)  # fmt: skip
        # the ranks a launcher started over SSH (deepspeed's runner, mpirun) are found by the job's environment
        ours = {"FT_JOB_ID": str(job.id), "FT_ATTEMPT": str(job.attempt)}
        groups: list[dict[str, Any]] = []
        for r in runs:
            s = states.get(r.run_dir)
            if not r.launch:
                groups.append({"key": r.run_dir, "env": ours, "user": user})
            elif s is not None and s.state == "running":
                groups.append({"key": r.run_dir, "pgid": s.pid, "start": s.pid_start, "boot": s.boot_id,
                               "env": ours, "user": user})  # fmt: skip
                if job.spec.image is not None and r.token:  # its container's processes, apart from the step's
                    groups[-1]["container"] = container_name(r.token, r.rank)
        seen, kernel = await _processes(executor, node, groups, stacks, since)
    except FtError as exc:
        return [dict(d, gone=f"node {name} did not answer: {exc}") for d in out]
    tails = await asyncio.gather(*(_tail(executor, node, r, user) for r in runs))
    for doc, r, tail in zip(out, runs, tails, strict=True):
        if kernel is not None:  # the node's Xids on this run's GPUs (or on a GPU not known)
            doc["xids"] = [x for x in kernel.get("xids") or [] if x.get("gpu") is None or x.get("gpu") in r.gpus]
            if kernel.get("error"):
                doc["xids_error"] = kernel["error"]
        status = states.get(r.run_dir)
        doc["state"] = status.state if status is not None else None
        doc["output_at"] = status.output_at if status is not None else None
        doc["output_tail"] = tail
        got = seen.get(r.run_dir)
        if not r.launch:
            doc["state"] = "started by its launcher"
        if r.launch and (status is None or status.state != "running"):
            doc["gone"] = f"it is {status.state if status else 'not known there'}, not running"
        elif got is None:
            doc["gone"] = "the node did not say"
        elif "gone" in got:
            doc["gone"] = str(got["gone"])
        else:
            doc["processes"] = got.get("processes") or []
            doc["sample"] = got.get("sample")
    return out


async def _processes(
    executor: Executor, node: Node, groups: list[dict[str, Any]], stacks: bool, since: float | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The node's answer about the processes of `groups`, and its kernel log's Xids since `since`; where it has no
    py-spy, the scheduler's is sent first (same machine type) and it is asked again. Each group's stack_error
    says why a stack is missing."""
    local = await asyncio.to_thread(local_py_spy) if stacks else None  # hashes 8 MB the first time
    python, timeout = executor.config.ssh.python, executor.config.ssh.command_timeout + SAMPLE_S
    ask = functools.partial(process_evidence, executor.transport, node, groups, sample=SAMPLE_S, stacks=stacks,
                            py_spy=local.params() if local else None, kernel_since=since, python=python,
                            timeout=timeout)  # fmt: skip
    doc = await ask()
    pythons = any(p.get("python") for g in doc["groups"].values() for p in g.get("processes") or [])
    if not stacks or doc.get("py_spy") or not pythons:  # py-spy is sent only where a Python process lacks a stack
        return dict(doc["groups"]), doc.get("kernel")
    why = can_run_on(local, doc.get("machine"))
    if why is None and local is not None:
        try:
            await send_py_spy(executor.transport, node, local, python=python)
            log.info("%s: sent py-spy (%s)", node.name, local.sha256[:12])
            again = await ask()
            return dict(again["groups"]), again.get("kernel")
        except FtError as exc:
            why = str(exc)
    log.info("%s: no stacks: %s", node.name, why)
    for group in doc["groups"].values():
        for p in group.get("processes") or []:
            if p.get("stack_error"):
                p["stack_error"] = f"{p['stack_error']}: {why}"
    return dict(doc["groups"]), doc.get("kernel")


async def _tail(executor: Executor, node: Any, run: Run, user: str | None) -> str | None:
    try:
        got = await read_file(executor.transport, node, f"{run.run_dir}/output.log", limit=TAIL_BYTES,
                              tail=TAIL_LINES, user=user, python=executor.config.ssh.python,
                              timeout=executor.config.ssh.command_timeout)  # fmt: skip
    except FtError as exc:
        log.info("%s: cannot read the output of %s: %s", node.name, run.run_dir, exc)
        return None
    return None if got is None else got[1].decode("utf-8", "replace")


def _units(doc: dict[str, Any]) -> list[Rank]:
    """The training processes of one run (see the module's docstring), as the verdict's ranks."""
    node, run_rank = doc["node"], doc["rank"]
    if "gone" in doc:
        return [Rank(run_rank, node, gone=str(doc["gone"]), xids=_xids(doc, None))]
    procs: list[dict[str, Any]] = doc.get("processes") or []
    if not procs:
        return [Rank(run_rank, node, gone="no process of it is left", xids=_xids(doc, None))]
    by_pid = {p["pid"]: p for p in procs}
    ranked = [p for p in procs if p.get("python") and _env_rank(p) is not None]
    # a launcher's workers say which of its processes they are (LOCAL_RANK, MPI's rank): where some do, one with
    # only the run's RANK is a launcher whose workers are not below it (deepspeed's runner: pdsh starts them)
    started = [p for p in ranked if set(p.get("env") or {}) & WORKER_ENV]
    ranked = started or ranked
    parents = {p.get("ppid") for p in ranked}
    workers = [p for p in ranked if p["pid"] not in parents or not _below(p, ranked, by_pid)]
    if not workers:  # no launcher's worker: the run's first Python process, else the first that started nothing
        pythons = [p for p in procs if p.get("python")]
        leaves = [p for p in procs if p["pid"] not in {q.get("ppid") for q in procs}]  # a shell's command, say
        workers = [(pythons or leaves or procs)[0]]
        rank_of = {workers[0]["pid"]: run_rank}
    else:
        rank_of = {p["pid"]: _env_rank(p) for p in workers}
    sample = doc.get("sample") or 0.0
    out = []
    for p in workers:
        above = _ancestors(p, by_pid)  # its launcher(s) within the run: stopped there stops it too
        mine = [p, *above]
        frames, error = _main_frames(p)
        cpu = p.get("cpu_moved")
        out.append(Rank(
            rank=int(rank_of[p["pid"]] or 0),
            node=node,
            pid=p["pid"],
            state=p.get("state"),
            wchan=p.get("wchan"),
            cpu=round(cpu / sample, 2) if isinstance(cpu, (int, float)) and sample else None,
            frames=frames,
            stack_error=error,
            stopped=tuple(q["pid"] for q in mine if q.get("state") in STOPPED),
            blocked=tuple((q["pid"], q.get("wchan") or "") for q in mine if q.get("state") == "D"),
            moving=p.get("stack_moved") if isinstance(p.get("stack_moved"), bool) else None,
            trace=_trace(p),
            xids=_xids(doc, p),
        ))  # fmt: skip
    return out


def _xids(doc: dict[str, Any], p: dict[str, Any] | None) -> tuple[Xid, ...]:
    """The run's Xids that concern process `p`: a launcher's worker uses the run's GPU at its LOCAL_RANK (the
    CUDA device it picks among the run's), so an Xid on another GPU of the run is not its own; without a
    LOCAL_RANK, or on a GPU not known, every Xid of the run is."""
    gpus = doc.get("gpus") or []
    local = (p.get("env") or {}).get("LOCAL_RANK") if p is not None else None
    mine = gpus[int(local)] if isinstance(local, str) and local.isdigit() and int(local) < len(gpus) else None
    return tuple(
        Xid(int(x["code"]), x.get("gpu"), float(x.get("time") or 0.0), str(x.get("text") or ""))
        for x in doc.get("xids") or []
        if isinstance(x.get("code"), int) and (mine is None or x.get("gpu") in (None, mine))
    )


def _trace(p: dict[str, Any]) -> tuple[tuple[str, int, str, bool], ...]:
    """Its last collective per process group, from torch's trace (the node's "collectives"), as the verdict's."""
    groups = (p.get("collectives") or {}).get("groups") if isinstance(p.get("collectives"), dict) else None
    if not isinstance(groups, dict):
        return ()
    return tuple(
        (str(name), last["seq"], str(last.get("op") or "collective"), bool(last.get("done")))
        for name, last in sorted(groups.items())
        if isinstance(last, dict) and isinstance(last.get("seq"), int)
    )


WORKER_ENV = frozenset({"LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})


def _env_rank(p: dict[str, Any]) -> int | None:
    env = p.get("env") or {}
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = env.get(name)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def _below(p: dict[str, Any], ranked: Sequence[dict[str, Any]], by_pid: dict[int, dict[str, Any]]) -> bool:
    """Another ranked process runs under `p` (p is a launcher, not a worker)."""
    return any(p in _ancestors(q, by_pid) for q in ranked if q is not p)


def _ancestors(p: dict[str, Any], by_pid: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    out, seen = [], {p["pid"]}
    parent = by_pid.get(p.get("ppid"))  # type: ignore[arg-type]
    while parent is not None and parent["pid"] not in seen:
        out.append(parent)
        seen.add(parent["pid"])
        parent = by_pid.get(parent.get("ppid"))  # type: ignore[arg-type]
    return out


def _main_frames(p: dict[str, Any]) -> tuple[tuple[Frame, ...], str | None]:
    if not p.get("python"):
        return (), "not a Python process"
    threads = p.get("stack")
    if not isinstance(threads, list):
        return (), p.get("stack_error") or "no stack was read"
    main = next((t for t in threads if t.get("tid") == p["pid"]), threads[0] if threads else None)
    if main is None:
        return (), "py-spy found no thread"
    frames = tuple(
        Frame(str(f.get("name")), str(f.get("file")), f.get("line") if isinstance(f.get("line"), int) else None)
        for f in main.get("frames") or []
    )
    return frames, None
