"""Benchmark: the console on a big cluster: 1000 nodes, 10,000 jobs, updates once a second.

    .venv/bin/python bench/console.py [--nodes 1000] [--jobs 10000] [--updates 60] [--seed 1]
                                      [--probe-every 60] [--profile [VIEW]] [--tracemalloc]

The data source is SYNTHETIC and IN-PROCESS: `SyntheticCluster` serves the console's client protocol
(`call(op, **args)`: jobs_changed, nodes_changed, alerts, events, cluster; `stream` refuses) from data generated with a
seeded random (about 20% of the jobs running, 60% queued, 20% ended; a few dozen alerts; 8 GPUs per node),
in the shapes of the scheduler's JSON (`Job.to_json` plus its activity and `updated`; `NodeView.to_json`
with the probe report's facts, GPUs and checks). Each simulated second it changes what a live cluster
changes: about 1% of the jobs (new output of running jobs, queued jobs starting, running jobs ending, a few
submitted, deleted, stopping or re-prioritised), and one node in `--probe-every` (60: the default
`probes.interval`) gets a new probe (time, GPU utilisation, memory, temperature; now and then a node changes
state); `--probe-every 1` probes every node every second, the worst case. `jobs_changed` returns only the jobs
changed since the cursor, and `nodes_changed` (the scheduler's own code) only the nodes. Each reply is
encoded to JSON (the scheduler's side: not counted) and decoded (the console's side: counted), as over the API
socket.

So this measures the console's own cost, not the scheduler's (bench/submit.py measures that side): the feed,
the rows, the table diff and Textual's render, in the real `ConsoleApp` run headless (`App.run_test`, 200x50)
with a fake clock. Times are CPU time of the console's thread (the only one), so other load on the machine
does not count; the wall time of `refresh_data` is printed too. It prints:

- first frame: from entering `run_test` until the Jobs view holds every job and a frame was rendered; the
  same for the first switch to the Nodes view and to the Map view (every GPU a cell; whether it fits the screen
  is printed at the end);
- per update, for each view, median, p99 and the slowest over `--updates` simulated seconds (of 60, the p99 is
  the slowest; of 300, the third slowest):
  read (the reply's decode and the feed), apply (the view's `update_view`: rows and table diff),
  `refresh_data` (both), render (the next frame: `pilot.pause()`), one update (all of it), and how much of
  it the cyclic GC took; at one update a second, the mean of one update is the share of a core it needs; for
  the Map and Timeline views also an arrow key pressed after each update, to its frame; and the collector's
  work the app does after each update's frame, between two updates (`ConsoleApp.between_updates`: nobody waits
  for it, but it is a share of a core too, and a key pressed meanwhile waits for it);
- memory: RSS before the app (imports and the data source), after the first frame, after the Nodes view,
  the peak; with `--tracemalloc`, the peak of traced allocations up to the first frame (slows that phase).

`--profile` prints a cProfile of the update loops (of every view; `--profile map`: of the Map's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from textual.widgets import ContentSwitcher  # noqa: E402

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.errors import UsageError  # noqa: E402
from ftconsole.scheduler.serve.nodelist import NodeChanges, brief_node  # noqa: E402
from ftconsole.scheduler.spec.config import load_config  # noqa: E402
from ftconsole.tui.app import ConsoleApp  # noqa: E402
from ftconsole.tui.mapview import ClusterMap  # noqa: E402
from ftconsole.tui.timelineview import TimelineChart  # noqa: E402

T0 = 1_750_000_000.0  # the simulated wall clock starts here
SIZE = (200, 50)
GPUS_PER_NODE = 8
POOLS = ("train", "train", "train", "research", "infer")
MODELS = {"train": "NVIDIA H100 80GB HBM3", "research": "NVIDIA A100-SXM4-80GB", "infer": "NVIDIA H200"}
USERS = [f"user{i:02d}" for i in range(40)]
PROJECTS = ("llm", "vision", "speech", "rl", "infra", "eval")
WORDS = ("sft", "pretrain", "dpo", "eval", "sweep", "ablation", "distill", "finetune", "bench", "export")
MODES = ("pytorch", "pytorch", "pytorch", "single", "pytorch-deepspeed")
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8))  # (nodes, GPUs per node)
SHAPE_WEIGHTS = (45, 25, 15, 10, 4, 1)
CHECKS = ("gpu_count", "ecc", "xid", "nvlink", "disk", "memory", "driver")
BAD_STATES = (("degraded", "gpu3 temperature 87C > 85C"), ("unhealthy", "gpu5: 2 uncorrectable ECC errors"))


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()  # as scheduler.serve.api frames a reply


class SyntheticCluster:
    """The client protocol over generated data; `tick()` moves the simulated cluster on by one second."""

    embedded = False

    def __init__(self, nodes: int, jobs: int, seed: int, probe_every: int = 60) -> None:
        self.rng = random.Random(seed)
        self.probe_every = probe_every  # simulated seconds between two probes of a node
        self.seconds = 0
        self.node_changes = NodeChanges()  # the scheduler's own `nodes_changed`
        self.now = T0
        self.server_s = 0.0  # CPU time spent building and encoding replies (the scheduler's side)
        self.bytes = 0  # JSON sent
        self.nodes: dict[str, dict[str, Any]] = {}
        self.free: dict[str, list[int]] = {}  # node -> free GPU indexes
        self.holders: dict[str, dict[int, int]] = {}  # node -> GPU -> job
        self.jobs: dict[int, dict[str, Any]] = {}
        self.activity: dict[int, dict[str, Any]] = {}  # last_output, open_alerts, node_names
        self.updated: dict[int, float] = {}
        self.alerts: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._next_job = 1
        self._next_alert = 1
        self._next_event = 1
        self._changed: set[int] = set()
        for i in range(nodes):
            self._add_node(f"gpu{i + 1:04d}")
        self._populate(jobs)

    # -- building ------------------------------------------------------------------------------------------

    def _add_node(self, name: str) -> None:
        rng = self.rng
        pool = rng.choice(POOLS)
        roll = rng.random()
        state, reasons, admin = "healthy", [], None
        if roll < 0.02:
            state, reasons = "degraded", [BAD_STATES[0][1]]
        elif roll < 0.03:
            state, reasons = "unhealthy", [BAD_STATES[1][1]]
        elif roll < 0.035:
            state, reasons = "unreachable", ["connect: timed out after 10s"]
        elif roll < 0.045:
            state, reasons, admin = "drained", ["drained by ops: fan alarm, ticket #4411"], "drained"
        gpus = [
            {
                "index": g,
                "name": MODELS[pool],
                "uuid": f"GPU-{name}-{g}",
                "memory_total_mib": 81559,
                "memory_used_mib": 0,
                "utilization": 0.0,
                "temperature": 35.0,
                "ecc_uncorrectable": 0,
                "retired_pages_pending": False,
                "remapped_rows_pending": False,
                "nvlink_down": 0,
                "healthy": True,
                "processes": [],
            }
            for g in range(GPUS_PER_NODE)
        ]
        self.nodes[name] = {
            "name": name,
            "host": f"10.{len(self.nodes) // 250}.{len(self.nodes) % 250}.1",
            "port": 22,
            "pool": pool,
            "labels": {"rack": f"r{len(self.nodes) // 32:02d}", "fabric": "ib"},
            "state": state,
            "health": state if state != "drained" else "healthy",
            "reasons": reasons,
            "since": T0 - rng.uniform(3600, 30 * 86400),
            "admin": admin,
            "admin_reason": reasons[0] if admin else None,
            "admin_by": "ops" if admin else None,
            "last_probe": None if state == "unreachable" else T0 - rng.uniform(0, 30),
            "last_probe_age_s": None,
            "facts": {
                "hostname": name,
                "boot_id": f"boot-{name}",
                "os": "Ubuntu 22.04.4 LTS",
                "kernel": "5.15.0-105-generic",
                "cpus": 224,
                "mem_total_mib": 2_063_000,
                "mem_available_mib": 1_900_000,
                "load1": 3.5,
                "python": "3.10.12",
                "driver_version": "550.54.15",
                "gpu_source": "nvml",
                "infiniband": True,
            },
            "gpus": gpus if state != "unreachable" else [],
            "checks": [
                {"name": c, "status": "pass", "value": None, "threshold": None, "unit": None, "message": ""}
                for c in CHECKS
            ],
            "last_error": "connect: timed out after 10s" if state == "unreachable" else None,
            "held": [],
            "faults": rng.choice((0, 0, 0, 0, 1, 2)),
        }
        usable = state in ("healthy", "degraded")
        self.free[name] = list(range(GPUS_PER_NODE)) if usable else []
        self.holders[name] = {}

    def _populate(self, count: int) -> None:
        rng = self.rng
        ended = int(count * 0.2)
        running = int(count * 0.2)
        for _ in range(ended):  # oldest first
            self._new_job(rng.choices(("succeeded", "error", "stopped"), (80, 12, 8))[0])
        started = 0
        for _ in range(count - ended):
            job = self._new_job("queued")
            if started < running and self._start(job["id"]):
                started += 1
        for _ in range(30):  # a few dozen alerts: failed jobs and bad nodes
            errored = [j["id"] for j in self.jobs.values() if j["status"] == "error"]
            if errored and rng.random() < 0.7:
                self._alert_job(rng.choice(errored))
            else:
                self._alert_node()
        self._changed.clear()

    def _new_job(self, status: str) -> dict[str, Any]:
        rng = self.rng
        job_id = self._next_job
        self._next_job += 1
        nodes, gpus = rng.choices(SHAPES, SHAPE_WEIGHTS)[0]
        project = rng.choice(PROJECTS)
        submitted = self.now - rng.uniform(60, 3 * 86400) if self.now == T0 else self.now
        job = {
            "id": job_id,
            "name": f"{project}-{rng.choice(WORDS)}-{rng.randrange(1000):03d}",
            "owner": rng.choice(USERS),
            "status": status,
            "priority": rng.choices(("normal", "urgent", "very-urgent"), (90, 8, 2))[0],
            "project": project,
            "access": "project",
            "mode": rng.choice(MODES),
            "type": "regular",
            "nodes": nodes,
            "gpus_per_node": gpus,
            "specs": [],
            "preemptible": job_id % 7 == 0,  # no draw from rng: the data stays what earlier runs measured
            "output": f"/shared/{project}/runs/{job_id}",
            "submitted": submitted,
            "started": None,
            "ended": None,
            "runtime_s": None,
            "max_runtime_s": rng.choice((None, 3600.0, 4 * 3600.0, 24 * 3600.0, 72 * 3600.0)),
            "attempt": 0,
            "stop_requested": None,
            "stop_reason": None,
            "stop_by": None,
            "message": "",
            "exit_code": None,
            "cloned_from": None,
            "deleted": False,
        }
        activity = {"last_output": None, "open_alerts": 0, "node_names": []}
        if status != "queued":
            job["started"] = submitted + rng.uniform(1, 3600)
            job["ended"] = job["started"] + rng.uniform(60, 86400)
            job["attempt"] = 1
            job["exit_code"] = {"succeeded": 0, "error": 1, "stopped": None}[status]
            job["message"] = {"succeeded": "", "error": "rank 0 on gpu0007 exited with code 1", "stopped": ""}[status]
            if status == "stopped":
                job["stop_reason"], job["stop_by"] = "stopped", job["owner"]
                job["message"] = f"stopped by {job['owner']}"
            activity["last_output"] = job["ended"] - rng.uniform(0, 30)
            first = rng.randrange(len(self.nodes))
            names = list(self.nodes)
            activity["node_names"] = [names[(first + k) % len(names)] for k in range(nodes)]
        self.jobs[job_id] = job
        self.activity[job_id] = activity
        self._touch(job_id)
        return job

    # -- what a live cluster changes -----------------------------------------------------------------------

    def _touch(self, job_id: int) -> None:
        self.updated[job_id] = self.now
        self._changed.add(job_id)

    def _start(self, job_id: int) -> bool:
        """Hold GPUs for a queued job (first fit over the nodes); False when it does not fit now."""
        job = self.jobs[job_id]
        want, gpus = job["nodes"], job["gpus_per_node"]
        chosen: list[str] = []
        for name in self._fit_order():
            if len(self.free[name]) >= gpus:
                chosen.append(name)
                if len(chosen) == want:
                    break
        if len(chosen) < want:
            return False
        for name in chosen:
            taken, self.free[name] = self.free[name][:gpus], self.free[name][gpus:]
            for g in taken:
                self.holders[name][g] = job_id
            self._held_json(name)
        start = self.now - (self.rng.uniform(60, 2 * 86400) if self.now == T0 else self.rng.uniform(0, 1))
        job.update(status="running", started=start, attempt=job["attempt"] + 1, runtime_s=round(self.now - start, 3))
        self.activity[job_id].update(last_output=self.now - self.rng.uniform(0, 120), node_names=chosen)
        self._touch(job_id)
        return True

    def _fit_order(self) -> list[str]:
        names = list(self.nodes)
        first = self.rng.randrange(len(names))
        return names[first:] + names[:first]

    def _finish(self, job_id: int, status: str) -> None:
        job = self.jobs[job_id]
        if job["stop_requested"] is not None:
            status = "stopped"
        for name in self.activity[job_id]["node_names"]:
            mine = [g for g, j in self.holders[name].items() if j == job_id]
            for g in mine:
                del self.holders[name][g]
                gpu = self.nodes[name]["gpus"][g]
                gpu.update(utilization=0.0, memory_used_mib=0)
            if self.nodes[name]["state"] in ("healthy", "degraded"):
                self.free[name] = sorted(self.free[name] + mine)
            self._held_json(name)
        job.update(status=status, ended=self.now, runtime_s=round(self.now - job["started"], 3))
        job["exit_code"] = {"succeeded": 0, "error": 137, "stopped": None}[status]
        if status == "error":
            job["message"] = f"rank 0 on {self.activity[job_id]['node_names'][0]} killed by SIGKILL (out of memory?)"
            self._alert_job(job_id)
        if status == "stopped":
            job.update(stop_reason="stopped", stop_by=job["owner"], message=f"stopped by {job['owner']}")
        self._touch(job_id)

    def _held_json(self, name: str) -> None:
        self.nodes[name]["held"] = [{"gpu": g, "job": j} for g, j in sorted(self.holders[name].items())]

    def _alert_job(self, job_id: int) -> None:
        job = self.jobs[job_id]
        self._add_alert("job_failed", "error", f"job {job_id} {job['name']} failed: {job['message']}", job=job_id)
        self.activity[job_id]["open_alerts"] += 1
        self._touch(job_id)

    def _alert_node(self) -> None:
        name = self.rng.choice(list(self.nodes))
        self._add_alert("node_unhealthy", "error", f"{name} is unhealthy: {BAD_STATES[1][1]}", node=name)

    def _add_alert(self, kind: str, severity: str, message: str, *, job: int | None = None, node: str | None = None):
        alert_id = self._next_alert
        self._next_alert += 1
        self.alerts[alert_id] = {
            "id": alert_id,
            "time": self.now - (self.rng.uniform(0, 86400) if self.now == T0 else 0),
            "kind": kind,
            "severity": severity,
            "job": job,
            "node": node,
            "message": message,
            "state": "open",
            "acked_by": None,
            "acked_at": None,
            "resolved_at": None,
            "resolved_by": None,
            "data": {},
        }
        self._event(kind, message, job=job, node=node)

    def _event(self, kind: str, message: str, *, job: int | None = None, node: str | None = None) -> None:
        self.events.append(
            {
                "id": self._next_event,
                "time": self.now,
                "kind": kind,
                "node": node,
                "job": job,
                "message": message,
                "data": {},
            }
        )
        self._next_event += 1
        del self.events[:-1000]

    def tick(self) -> None:
        """One simulated second: about 1% of the jobs change, and one node in `probe_every` is probed."""
        rng = self.rng
        self.now += 1.0
        total = max(1, len(self.jobs))
        by_status: dict[str, list[int]] = {}
        for job_id, job in self.jobs.items():
            by_status.setdefault(job["status"], []).append(job_id)
        running, queued = by_status.get("running", []), by_status.get("queued", [])
        ended = [j for s in ("succeeded", "error", "stopped") for j in by_status.get(s, [])]
        share = total / 10_000  # the counts below are for 10,000 jobs
        for job_id in rng.sample(running, min(len(running), round(70 * share))):  # new output
            self.activity[job_id]["last_output"] = self.now - rng.uniform(0, 1)
            self.jobs[job_id]["runtime_s"] = round(self.now - self.jobs[job_id]["started"], 3)
            self._touch(job_id)
        for job_id in rng.sample(running, min(len(running), round(10 * share))):  # runs end
            self._finish(job_id, rng.choices(("succeeded", "error", "stopped"), (80, 12, 8))[0])
        ordered = sorted(queued, key=lambda j: (self.jobs[j]["priority"] != "very-urgent", j))
        starts = round(10 * share)
        for job_id in ordered[: starts * 20]:  # queued jobs start where they fit (backfill included)
            if starts and self._start(job_id):
                starts -= 1
        for _ in range(round(5 * share)):
            self._new_job("queued")
        for job_id in rng.sample(ended, min(len(ended), round(3 * share))):  # deleted
            self.jobs.pop(job_id)
            self.activity.pop(job_id)
            self._touch(job_id)
        for job_id in rng.sample(running, min(len(running), round(1 * share))):  # someone stops one
            if self.jobs[job_id]["status"] == "running":
                self.jobs[job_id]["stop_requested"] = self.now
                self._touch(job_id)
        for job_id in rng.sample(queued, min(len(queued), round(2 * share))):  # re-prioritised
            if job_id in self.jobs and self.jobs[job_id]["status"] == "queued":
                self.jobs[job_id]["priority"] = rng.choice(("normal", "urgent"))
                self._touch(job_id)
        if self.alerts and rng.random() < 0.3:  # someone acknowledges one
            alert = self.alerts[rng.choice(list(self.alerts))]
            alert.update(state="acknowledged", acked_by="ops", acked_at=self.now)
        while len(self.alerts) > 40:  # and the oldest are resolved (they leave the list)
            alert = self.alerts.pop(min(self.alerts))
            if alert["job"] in self.activity:
                self.activity[alert["job"]]["open_alerts"] -= 1
                self._touch(alert["job"])
        self.seconds += 1
        self._probe_all()

    def _probe_all(self) -> None:
        """A node's probe every `probe_every` seconds, each at its own second (as `probes.interval` spreads them)."""
        rng = self.rng
        if rng.random() < 0.2:  # now and then a node goes bad or comes back
            node = self.nodes[rng.choice(list(self.nodes))]
            if node["state"] == "healthy":
                state, reason = rng.choice(BAD_STATES)
                node.update(state=state, health=state, reasons=[reason], since=self.now)
                if state == "unhealthy":
                    self.free[node["name"]] = []
            elif node["state"] in ("degraded", "unhealthy"):
                node.update(state="healthy", health="healthy", reasons=[], since=self.now)
        for i, (name, node) in enumerate(self.nodes.items()):
            if node["state"] == "unreachable" or i % self.probe_every != self.seconds % self.probe_every:
                continue
            node["last_probe"] = self.now - rng.uniform(0, 1)
            node["last_probe_age_s"] = round(self.now - node["last_probe"], 1)
            held = self.holders[name]
            for gpu in node["gpus"]:
                if gpu["index"] in held:
                    gpu["utilization"] = float(min(100, max(0, round(gpu["utilization"] or 85) + rng.randint(-8, 8))))
                    gpu["memory_used_mib"] = rng.randrange(40_000, 80_000)
                    gpu["temperature"] = float(rng.randint(55, 80))
                else:
                    gpu["temperature"] = float(rng.randint(30, 40))
            node["facts"]["load1"] = round(rng.uniform(0, 40), 2)

    # -- the client protocol -------------------------------------------------------------------------------

    def _job_json(self, job_id: int) -> dict[str, Any]:
        if job_id not in self.jobs:
            return {"id": job_id, "deleted": True, "updated": self.updated[job_id]}
        return {**self.jobs[job_id], **self.activity[job_id], "updated": self.updated[job_id]}

    async def call(self, op: str, **args: Any) -> Any:
        started = time.thread_time()
        if op == "jobs_changed":
            since = args.get("since")
            if since is None:
                ids = sorted(self.jobs)
            else:
                ids = sorted(j for j, stamp in self.updated.items() if stamp >= since)
            reply: Any = {"cursor": self.now + 1e-6, "jobs": [self._job_json(j) for j in ids]}
        elif op == "nodes_changed":  # as the scheduler answers the console's list (scheduler.serve.nodelist)
            reply = self.node_changes.changed(None, self.nodes.values(), args.get("since"), args.get("patches", False))
        elif op == "nodes" and args.get("brief"):  # every node, as read by a console from before nodes_changed
            reply = [brief_node(n) for n in self.nodes.values()]
        elif op == "alerts":
            reply = sorted(self.alerts.values(), key=lambda a: a["id"])
        elif op == "events":
            reply = self.events[-int(args.get("limit") or 100) :]
        elif op == "cluster":
            reply = self._cluster()
        elif op == "job_util":  # the running jobs' GPUs, the mean at each of the last probes (one here)
            reply = {}
            for name, held in self.holders.items():
                for gpu, job in held.items():
                    util = self.nodes[name]["gpus"][gpu]["utilization"]
                    reply.setdefault(str(job), []).append(util)
            reply = {job: [round(sum(u) / len(u), 1)] for job, u in reply.items()}
        elif op == "forecast":
            reply = self._forecast()
        elif op == "shares":
            reply = self._shares()
        elif op == "reservations":  # one maintenance window over the first rack, under way
            rack = sorted(self.nodes)[:32]
            reply = [{"name": "maint-r00", "nodes": rack, "start": T0 - 600, "end": T0 + 7200, "user": None,
                      "project": None, "maintenance": True, "reason": "firmware", "by": "ops", "created": T0 - 900,
                      "state": "active"}]  # fmt: skip
        elif op == "fabric":  # no topology: declared
            reply = None
        else:
            raise UsageError(f"the synthetic cluster does not serve {op!r}")
        data = _json(reply)
        self.server_s += time.thread_time() - started
        self.bytes += len(data)
        return json.loads(data)  # the console's side, as `scheduler.api.ApiClient` decodes a reply

    def _shares(self) -> dict[str, Any]:
        """Fair share per project and user as the scheduler answers it: the running jobs' GPUs for usage (each
        project due an equal share), the ended jobs' runtimes for the day's and week's GPU-hours."""
        held: dict[tuple[str, str], float] = {}
        hours: dict[str, dict[str, dict[str, float]]] = {"project": {}, "user": {}}
        for job in self.jobs.values():
            gpus = job["nodes"] * job["gpus_per_node"]
            if job["status"] == "running":
                key = (job["project"], job["owner"])
                held[key] = held.get(key, 0.0) + gpus
            if job["started"] is not None:
                spent = gpus * ((job["ended"] or self.now) - job["started"]) / 3600.0
                for by, name in (("project", job["project"]), ("user", job["owner"])):
                    row = hours[by].setdefault(name, {"gpu_hours": 0.0, "jobs": 0, "goodput": 0.95})
                    row["gpu_hours"] += spent
                    row["jobs"] += 1
        total = sum(held.values()) or 1.0
        users = {p: sum(1 for q, _ in held if q == p) for p in PROJECTS}
        accounts = [
            {"project": p, "user": u, "share": 1 / len(PROJECTS) / users[p], "usage": g / total, "gpu_hours": g,
             "factor": 2 ** -(g / total * len(PROJECTS)), "project_ratio": 1.0, "user_ratio": 1.0, "text": ""}
            for (p, u), g in sorted(held.items())
        ]  # fmt: skip
        fair = {"half_life_s": 7 * 86400.0, "by_user": False, "accounts": accounts}
        return {"now": self.now, "fairshare": fair, "day": hours, "week": hours, "quotas": {"project": {}, "user": {}}}

    def _forecast(self) -> dict[str, Any]:
        """Expected starts as the scheduler answers them: the first 500 queued jobs (the queue depth), in queue
        order, ten more starting each 10 minutes; the others counted past the depth."""
        levels = {"very-urgent": 0, "urgent": 1, "normal": 2}
        queued = sorted((j for j in self.jobs.values() if j["status"] == "queued"),
                        key=lambda j: (levels[j["priority"]], j["submitted"], j["id"]))  # fmt: skip
        names = list(self.nodes)
        entries = []
        for i, job in enumerate(queued):
            if i < 500:
                start = self.now + (i // 10) * 600
                limit = job["max_runtime_s"]
                nodes = [names[(job["id"] * 7 + k) % len(names)] for k in range(job["nodes"])]
                entries.append({"id": job["id"], "start": start, "end": start + limit if limit else None,
                                "nodes": nodes, "message": ""})  # fmt: skip
            else:
                break
        running = [
            {"id": j["id"], "end": j["started"] + j["max_runtime_s"] if j["max_runtime_s"] else None}
            for j in self.jobs.values() if j["status"] == "running"
        ]  # fmt: skip
        pools = {name: node["pool"] for name, node in self.nodes.items()}
        beyond = {"count": max(0, len(queued) - 500), "message": "waiting: behind the first 500 jobs of the queue"}
        return {"now": self.now, "until": self.now + 86400, "complete": True, "queued": entries, "running": running,
                "nodes": pools, "beyond": beyond}  # fmt: skip

    def stream(self, op: str, **args: Any) -> AsyncIterator[Any]:
        raise UsageError(f"the synthetic cluster does not stream ({op})")

    def _cluster(self) -> dict[str, Any]:
        nodes = []
        for name, n in self.nodes.items():
            facts = n["facts"]
            nodes.append(
                {
                    "name": name,
                    "state": n["state"],
                    "pool": n["pool"],
                    **{k: facts.get(k) for k in ("os", "kernel", "cpus", "mem_total_mib", "mem_available_mib")},
                    "driver_version": facts.get("driver_version"),
                    "gpu_model": MODELS[n["pool"]],
                    "gpus_total": len(n["gpus"]),
                    "gpus_used": len(n["held"]),
                    "gpus": [{"index": g["index"], "job": self.holders[name].get(g["index"])} for g in n["gpus"]],
                }
            )
        return {"nodes": nodes, "specs": [], "queued_demand": {}}


# -- measuring ---------------------------------------------------------------------------------------------


def rss_mib() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def median_p99(values: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile (of fewer than 100 values, the largest: `--updates 300` for a p99 that
    is not the one slowest update)."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class GcClock:
    """CPU time spent in the cyclic garbage collector (all generations), and in full (generation 2) runs."""

    def __init__(self) -> None:
        self.total = self.full = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            spent = time.thread_time() - self._started
            self.total += spent
            if info["generation"] == 2:
                self.full += spent


GC = GcClock()


class Timed:
    """Wraps a view's `update_view` to time it (CPU) where `refresh_data` calls it."""

    def __init__(self, method: Callable[..., None]) -> None:
        self.method = method
        self.last = 0.0

    def __call__(self, *args: Any) -> None:
        started = time.thread_time()
        self.method(*args)
        self.last = time.thread_time() - started


async def updates(
    app: ConsoleApp, pilot: Any, source: SyntheticCluster, count: int, keys: tuple[str, ...] = ()
) -> dict[str, list[float]]:
    """`count` simulated seconds on the visible view; CPU seconds of this (the only) thread per part. With `keys`,
    after each update's frame one key (in turn) is pressed, and its handling and next frame are timed."""
    view = app.view
    timed = Timed(view.update_view)
    view.update_view = timed  # type: ignore[method-assign]
    parts = ("refresh", "read", "apply", "render", "total", "gc", "wall", "bytes", "key", "between")
    out: dict[str, list[float]] = {p: [] for p in parts}
    try:
        for _ in range(count):
            source.tick()  # the scheduler's side: not measured
            server, sent, collecting = source.server_s, source.bytes, GC.total
            wall, cpu = time.perf_counter(), time.thread_time()
            await app.refresh_data()
            server = source.server_s - server
            refresh = time.thread_time() - cpu - server
            wall = time.perf_counter() - wall - server
            cpu = time.thread_time()
            await pilot.pause()  # the next frame (Textual's idle wait sleeps; its CPU time is the render)
            render = time.thread_time() - cpu
            out["refresh"].append(refresh)
            out["apply"].append(timed.last)
            out["read"].append(refresh - timed.last)
            out["render"].append(render)
            out["total"].append(refresh + render)
            out["gc"].append(GC.total - collecting)
            out["wall"].append(wall)
            out["bytes"].append(source.bytes - sent)
            if keys:
                cpu = time.thread_time()
                await pilot.press(keys[len(out["key"]) % len(keys)])  # handled, then a frame
                out["key"].append(time.thread_time() - cpu)
            cpu = time.thread_time()  # what the app's poll does after an update's frame (ConsoleApp.poll)
            getattr(app, "between_updates", lambda: None)()  # (a console from before it: its collector's own)
            out["between"].append(time.thread_time() - cpu)
    finally:
        del view.update_view
    return out


async def settled(pilot: Any) -> None:
    """A frame, and the frames a switch of view still asks for: the focus moves to the new view's table, and the
    footer lists that table's keys after a refresh, then lays itself out after another (Textual's
    `refresh_bindings`, then `Footer.recompose`). Part of the switch: a key press `2`, not the next update."""
    for _ in range(3):
        await pilot.pause()


async def first_frame(
    app: ConsoleApp, source: SyntheticCluster, results: dict[str, Any], then: Callable[[ConsoleApp, Any], Any]
) -> None:
    """Start the app, time its first frame with every job, then run `then(app, pilot)` in the same session."""
    wall, cpu, collecting = time.perf_counter(), time.thread_time(), GC.total
    async with app.run_test(size=SIZE) as pilot:
        table = app.view.table
        while table.row_count < len(source.jobs):  # the poll worker's first read and apply
            await asyncio.sleep(0.002)
        await settled(pilot)  # a frame, and those the focus's first keys ask for
        results["first_wall"] = time.perf_counter() - wall
        results["first_cpu"] = time.thread_time() - cpu - source.server_s
        results["first_gc"] = GC.total - collecting
        results["rss_jobs"] = rss_mib()[0]
        results["tracked"] = len(gc.get_objects())
        if tracemalloc.is_tracing():
            results["traced_peak"] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        await then(app, pilot)


async def run(args: argparse.Namespace, profiler: cProfile.Profile | None) -> dict[str, Any]:
    source = SyntheticCluster(args.nodes, args.jobs, args.seed, args.probe_every)
    results: dict[str, Any] = {"jobs": len(source.jobs), "nodes": len(source.nodes)}
    gc.collect()
    results["source_objects"] = len(gc.get_objects())

    async def measure(app: ConsoleApp, pilot: Any) -> None:
        if profiler and args.profile in ("all", "jobs"):
            profiler.enable()
        results["jobs_view"] = await updates(app, pilot, source, args.updates)
        if profiler:
            profiler.disable()
        assert app.feed.jobs.keys() == source.jobs.keys(), "the feed lost track of the jobs"
        assert app.view.table.row_count == len(source.jobs)
        results["jobs_end"] = len(source.jobs)

        app.query_one("#views", ContentSwitcher).current = "nodes"  # what `2` does, without its worker
        server = source.server_s
        wall, cpu, collecting = time.perf_counter(), time.thread_time(), GC.total
        await app.refresh_data()
        await settled(pilot)  # the switch's frames: the footer's keys follow the focus
        results["nodes_first_gc"] = GC.total - collecting
        results["nodes_first_wall"] = time.perf_counter() - wall - (source.server_s - server)
        results["nodes_first_cpu"] = time.thread_time() - cpu - (source.server_s - server)
        assert app.view.table.row_count == len(source.nodes)
        if profiler and args.profile in ("all", "nodes"):
            profiler.enable()
        results["nodes_view"] = await updates(app, pilot, source, args.updates)
        if profiler:
            profiler.disable()
        results["rss_nodes"] = rss_mib()[0]

        app.query_one("#views", ContentSwitcher).current = "map"  # what `6` does, without its worker
        app.view.table.focus()
        server = source.server_s
        wall, cpu = time.perf_counter(), time.thread_time()
        await app.refresh_data()
        await settled(pilot)  # the switch's frames: the footer's keys follow the focus
        results["map_first_wall"] = time.perf_counter() - wall - (source.server_s - server)
        results["map_first_cpu"] = time.thread_time() - cpu - (source.server_s - server)
        cluster_map = app.view.table
        assert isinstance(cluster_map, ClusterMap) and cluster_map.layout_ is not None
        results["map_fit"] = (len(cluster_map.layout_.lines), cluster_map.size.height, cluster_map.layout_.dense)
        assert len(cluster_map.layout_.where) == len(source.nodes), "the map lost nodes"
        if profiler and args.profile in ("all", "map"):
            profiler.enable()
        results["map_view"] = await updates(app, pilot, source, args.updates, keys=("right", "down", "left", "up"))
        if profiler:
            profiler.disable()
        results["rss_map"] = rss_mib()[0]

        app.query_one("#views", ContentSwitcher).current = "timeline"  # what `7` does, without its worker
        app.view.table.focus()
        server = source.server_s
        wall, cpu = time.perf_counter(), time.thread_time()
        await app.refresh_data()
        await settled(pilot)  # the switch's frames: the footer's keys follow the focus
        results["timeline_first_wall"] = time.perf_counter() - wall - (source.server_s - server)
        results["timeline_first_cpu"] = time.thread_time() - cpu - (source.server_s - server)
        chart = app.view.table
        assert isinstance(chart, TimelineChart) and len(chart.keys) > 500, "the timeline lost jobs"
        if profiler and args.profile in ("all", "timeline"):
            profiler.enable()
        keys = ("down", "left_square_bracket", "up", "right_square_bracket")  # the cursor, and zoom out and in
        results["timeline_view"] = await updates(app, pilot, source, args.updates, keys=keys)
        if profiler:
            profiler.disable()
        results["rss_timeline"], results["rss_peak"] = rss_mib()

    with tempfile.TemporaryDirectory(prefix="ftb-", dir="/tmp") as tmp:
        config = {
            "state_dir": str(Path(tmp) / "state"),
            "nodes": [{"name": f"gpu[0001-{args.nodes:04d}]", "port": 1}],  # never contacted
            "api": {"socket": str(Path(tmp) / "ft.sock")},
        }
        (Path(tmp) / "cluster.yaml").write_text(yaml.safe_dump(config))
        loaded = load_config(Path(tmp) / "cluster.yaml")
        app = ConsoleApp(loaded, client=source, clock=lambda: source.now, refresh_s=1e9)  # no poll after the first
        results["rss_before"] = rss_mib()[0]
        source.server_s = 0.0
        if args.tracemalloc:
            tracemalloc.start()
        await first_frame(app, source, results, measure)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=60, help="simulated seconds per view (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--probe-every", type=int, default=60, metavar="S",
        help="seconds between two probes of a node (default 60: probes.interval's default); 1: every node's "
        "data changes every second, the worst case",
    )  # fmt: skip
    parser.add_argument(
        "--profile", nargs="?", const="all", choices=("all", "jobs", "nodes", "map", "timeline"),
        help="print a cProfile of the update loops (of all views, or of the one named)",
    )  # fmt: skip
    parser.add_argument(
        "--tracemalloc", action="store_true", help="trace allocations up to the first frame (slows that phase down)"
    )
    args = parser.parse_args()

    profiler = cProfile.Profile() if args.profile else None
    r = asyncio.run(run(args, profiler))
    print(
        f"SYNTHETIC in-process data source: {r['nodes']} nodes, {r['jobs']} jobs ({r['jobs_end']} after the updates), "
        "about 1% of the jobs and every node changing each simulated second.\n"
        "No scheduler and no socket (bench/submit.py measures that side): this is the console's own cost, "
        f"headless {SIZE[0]}x{SIZE[1]}, {args.updates} updates per view. Times are CPU time of the console's "
        "thread (the replies' JSON encoding, the scheduler's side, excluded; their decoding included)."
    )
    if profiler is not None or args.tracemalloc:
        print("(--profile slows the updates down, --tracemalloc the first frame: those figures are not the console's)")
    print()
    print_table(
        ["FIRST FRAME", "WALL S", "CPU S", "OF WHICH GC S"],
        [
            ["jobs view, from start", f"{r['first_wall']:.2f}", f"{r['first_cpu']:.2f}", f"{r['first_gc']:.2f}"],
            [
                "nodes view, first switch",
                f"{r['nodes_first_wall']:.2f}",
                f"{r['nodes_first_cpu']:.2f}",
                f"{r['nodes_first_gc']:.2f}",
            ],
            ["map view, first switch", f"{r['map_first_wall']:.2f}", f"{r['map_first_cpu']:.2f}", ""],
            ["timeline view, first switch", f"{r['timeline_first_wall']:.2f}", f"{r['timeline_first_cpu']:.2f}", ""],
        ],
    )
    print()
    labels = {
        "read": "read (reply decode, feed)",
        "apply": "apply (rows, table diff)",
        "refresh": "refresh_data (read + apply)",
        "render": "render (next frame)",
        "total": "one update (refresh + render)",
        "gc": "of which cyclic GC",
        "wall": "refresh_data, wall clock",
        "between": "collector, after the frame",
    }
    rows = []
    for view, key in (("jobs", "jobs_view"), ("nodes", "nodes_view"), ("map", "map_view"),
                      ("timeline", "timeline_view")):  # fmt: skip
        t = r[key]
        for part, label in {**labels, **({"key": "key press to its frame"} if t["key"] else {})}.items():
            median, p99 = median_p99(t[part])
            share = f"{statistics.fmean(t[part]) * 100:.1f}%" if part in ("total", "gc", "between") else ""
            rows.append([view, label, f"{median * 1000:.1f}", f"{p99 * 1000:.1f}", f"{max(t[part]) * 1000:.1f}", share])
        rows.append([view, "reply JSON read per update", f"{statistics.median(t['bytes']) / 1024:.0f} KiB", "", "", ""])
    print_table(["VIEW", "PER UPDATE", "MEDIAN MS", "P99 MS", "MAX MS", "CORE AT 1 HZ (MEAN)"], rows)
    print()
    memory = [
        ["before the app (data source built)", f"{r['rss_before']:.0f}"],
        ["after the jobs view's first frame", f"{r['rss_jobs']:.0f}"],
        ["after the nodes view", f"{r['rss_nodes']:.0f}"],
        ["after the map view", f"{r['rss_map']:.0f}"],
        ["after the timeline view", f"{r['rss_timeline']:.0f}"],
        ["peak", f"{r['rss_peak']:.0f}"],
    ]
    if "traced_peak" in r:
        memory.append(["tracemalloc peak up to the first frame", f"{r['traced_peak']:.0f}"])
    print_table(["MEMORY", "RSS MIB"], memory)
    lines, height, dense = r["map_fit"]
    fits = "fits" if lines <= height else "does NOT fit"
    cells = "half blocks, two GPUs a cell" if dense else "a cell per GPU"
    print(f"the map: {lines} lines ({cells}) in {height} lines of a {SIZE[0]}x{SIZE[1]} terminal: it {fits}")
    print(
        f"objects the cyclic GC tracks after the first frame: {r['tracked']:,}, of which {r['source_objects']:,} "
        "before the app (the imported modules and the data source, which lives in the scheduler in real life)"
    )
    if profiler is not None:
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
