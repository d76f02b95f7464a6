"""Fixed data for the console's snapshot tests: a small cluster as the scheduler's API gives it.

`FixedClient` answers the console's read ops from these documents, at a fixed time, so a snapshot never depends
on the clock or a probe. The live console is tested against a real scheduler on the lab (test_console.py);
this is only for pictures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.serve.nodelist import NodeChanges
from ftconsole.scheduler.spec.config import LoadedConfig, load_config

NOW = 1_800_000_000.0
GPU = "NVIDIA H100 80GB HBM3"


def _gpus(utils: list[int | None]) -> list[dict[str, Any]]:
    return [
        {"index": i, "name": GPU, "utilization": u, "memory_used_mib": 1000 * (u or 0), "memory_total_mib": 81559,
         "temperature": 40 + (u or 0) // 4, "ecc_uncorrectable": 0, "healthy": True}
        for i, u in enumerate(utils)
    ]  # fmt: skip


def _node(name: str, state: str, reasons: list[str], utils: list[int | None], held: dict[int, int], faults: int):
    return {
        "name": name, "host": "10.0.0." + name[-1], "port": 22, "pool": "h100", "labels": {},
        "state": state, "health": state, "reasons": reasons, "since": NOW - 3600, "admin": None,
        "admin_reason": None, "admin_by": None, "last_probe": NOW - 12, "last_probe_age_s": 12.0,
        "facts": {"os": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic", "cpus": 96, "mem_total_mib": 1031891,
                  "mem_available_mib": 900000, "driver_version": "550.54.15"},
        "gpus": _gpus(utils), "checks": [
            {"name": "gpu_count", "status": "pass", "value": len(utils), "unit": "", "threshold": "8",
             "message": "8 GPUs"},
            {"name": "gpu_temperature", "status": "warn" if state == "degraded" else "pass", "value": 88,
             "unit": "C", "threshold": "85", "message": "gpu3 88C" if state == "degraded" else "ok"},
        ],
        "last_error": None, "held": [{"gpu": g, "job": j} for g, j in sorted(held.items())], "faults": faults,
    }  # fmt: skip


NODES = [
    _node("gpu01", "healthy", [], [97, 98, 95, 99, 96, 97, 98, 99], {i: 101 for i in range(8)}, 0),
    _node("gpu02", "healthy", [], [96, 97, 99, 95, 98, 97, 96, 98], {i: 101 for i in range(8)}, 1),
    _node("gpu03", "degraded", ["gpu3: temperature 88C > 85C"], [12, 0, 0, 40, 0, 0, 0, 0], {0: 104, 3: 104}, 2),
    _node("gpu04", "unreachable", ["ssh: connection refused"], [], {}, 5),
    _node("gpu05", "drained", ["drained by ops: fan alarm"], [0] * 8, {}, 0),
]


def _job(id_: int, name: str, status: str, **over: Any) -> dict[str, Any]:
    base = {
        "id": id_, "name": name, "owner": "ana", "status": status, "priority": "normal", "project": "llm",
        "access": "read-only", "mode": "pytorch", "type": "regular", "nodes": 2, "gpus_per_node": 8, "specs": [],
        "output": None, "submitted": NOW - 7200, "started": None, "ended": None, "runtime_s": None,
        "max_runtime_s": 86400, "attempt": 0, "stop_requested": None, "stop_reason": None, "stop_by": None,
        "message": "", "exit_code": None, "cloned_from": None, "deleted": False, "last_output": None,
        "open_alerts": 0, "node_names": [], "updated": NOW - 60, "elastic": None, "preemptible": False,
    }  # fmt: skip
    return base | over


JOBS = [
    _job(101, "llama-70b-pretrain", "running", started=NOW - 5400, attempt=1, last_output=NOW - 3,
         node_names=["gpu01", "gpu02"]),
    _job(104, "eval-sweep", "running", started=NOW - 2 * 3600, attempt=2, last_output=NOW - 1500, nodes=1,
         gpus_per_node=2, node_names=["gpu03"], open_alerts=1, owner="bo", preemptible=True),
    _job(105, "rlhf-ppo", "queued", priority="urgent", submitted=NOW - 600, message="waits for 4 free nodes"),
    _job(106, "tokenizer", "queued", nodes=1, gpus_per_node=1, mode="single", submitted=NOW - 300),
    _job(103, "vit-finetune", "error", started=NOW - 4000, ended=NOW - 900, attempt=1, exit_code=1,
         message="rank 1 on gpu02: exit code 1", open_alerts=1, elastic={"min_nodes": 1, "max_nodes": 4}),
    _job(102, "bert-base", "succeeded", started=NOW - 9000, ended=NOW - 7000, attempt=1, exit_code=0),
]  # fmt: skip
ALERTS = [
    {"id": 1, "time": NOW - 900, "kind": "job_failed", "severity": "error", "job": 103, "node": None,
     "message": "job 103 (vit-finetune) failed: rank 1 on gpu02: exit code 1", "state": "open", "acked_by": None,
     "acked_at": None, "resolved_at": None, "resolved_by": None, "data": {}},
    {"id": 2, "time": NOW - 400, "kind": "node_unreachable", "severity": "error", "job": None, "node": "gpu04",
     "message": "gpu04 is unreachable: ssh: connection refused", "state": "acknowledged", "acked_by": "ops",
     "acked_at": NOW - 300, "resolved_at": None, "resolved_by": None, "data": {}},
]  # fmt: skip
EVENTS = [
    {"id": i + 1, "time": NOW - 1000 + 100 * i, "kind": kind, "node": node, "job": job, "message": msg, "data": {}}
    for i, (kind, node, job, msg) in enumerate(
        [
            ("Running", None, "101", "all 2 ranks running"),
            ("Failed", None, "103", "rank 1 on gpu02: exit code 1"),
            ("drained", "gpu05", None, "drained by ops: fan alarm"),
            ("unreachable", "gpu04", None, "ssh: connection refused"),
            ("degraded", "gpu03", None, "gpu3: temperature 88C > 85C"),
        ]
    )
]
RESERVATIONS = [
    {"name": "maint-gpu03", "nodes": ["gpu03"], "start": NOW - 600, "end": NOW + 3600, "user": None, "project": None,
     "maintenance": True, "reason": "fan swap", "by": "ops", "created": NOW - 900, "state": "active"},
]  # fmt: skip
FORECAST = {  # as the scheduler would work it out for JOBS: 106 fits gpu03 now, 105 takes 101's nodes after it
    "now": NOW, "until": NOW + 81000, "complete": True,
    "queued": [
        {"id": 105, "start": NOW + 81000, "end": NOW + 167400, "nodes": ["gpu01", "gpu02"], "message": ""},
        {"id": 106, "start": NOW, "end": NOW + 86400, "nodes": ["gpu03"], "message": ""},
    ],
    "running": [{"id": 101, "end": NOW + 81000}, {"id": 104, "end": NOW + 79200}],
    "nodes": {f"gpu0{i}": "h100" for i in range(1, 6)},
}  # fmt: skip
SHARES = {  # fair share on with projects llm (3 shares) and vision; ana used llm past its share, bo a little
    "now": NOW,
    "fairshare": {"half_life_s": 7 * 86400.0, "by_user": False, "accounts": [
        {"project": "llm", "user": "ana", "share": 0.375, "usage": 0.82, "gpu_hours": 410.0, "factor": 0.22,
         "project_ratio": 1.09, "user_ratio": 1.1, "text": "fair share 0.22: project llm used 1.1x its share"},
        {"project": "llm", "user": "cy", "share": 0.375, "usage": 0.0, "gpu_hours": 0.0, "factor": 0.47,
         "project_ratio": 1.09, "user_ratio": 0.0, "text": "fair share 0.47: project llm used 1.1x its share"},
        {"project": "vision", "user": "bo", "share": 0.25, "usage": 0.18, "gpu_hours": 90.0, "factor": 0.61,
         "project_ratio": 0.72, "user_ratio": 0.0, "text": "fair share 0.61: project vision used 0.7x its share"},
    ]},
    "day": {"project": {"llm": {"gpu_hours": 380.0, "jobs": 3, "goodput": 0.93},
                        "vision": {"gpu_hours": 48.0, "jobs": 5, "goodput": 0.71}},
            "user": {"ana": {"gpu_hours": 380.0, "jobs": 3, "goodput": 0.93},
                     "bo": {"gpu_hours": 48.0, "jobs": 5, "goodput": 0.71}}},
    "week": {"project": {"llm": {"gpu_hours": 2410.0, "jobs": 19, "goodput": 0.96},
                         "vision": {"gpu_hours": 530.0, "jobs": 41, "goodput": 0.78}},
             "user": {"ana": {"gpu_hours": 2410.0, "jobs": 19, "goodput": 0.96},
                      "bo": {"gpu_hours": 530.0, "jobs": 41, "goodput": 0.78}}},
    "quotas": {"project": {"vision": {"limits": {"gpus": 16, "gpu_hours": 600}, "in_use": {"gpus": 2,
                                      "running_jobs": 1, "queued_jobs": 0, "gpu_hours": 530.0}, "period_s": 604800}},
               "user": {}},
}  # fmt: skip
CLUSTER = {
    "nodes": [
        {"name": n["name"], "state": n["state"], "pool": "h100", "os": n["facts"]["os"], "kernel": n["facts"]["kernel"],
         "cpus": 96, "mem_total_mib": 1031891, "mem_available_mib": 900000, "driver_version": "550.54.15",
         "gpu_model": GPU, "gpus_total": len(n["gpus"]) or 8, "gpus_used": len(n["held"]),
         "gpus": [{"index": g["index"], "job": {h["gpu"]: h["job"] for h in n["held"]}.get(g["index"])}
                  for g in n["gpus"]]}
        for n in NODES
    ],
    "specs": [{"spec": "h100x8", "gpus_per_node": 8, "gpu_model": GPU, "pool": None, "nodes": 3, "nodes_free": 0,
               "gpus_free": 6, "state": "tight"}],
    "queued_demand": {GPU: 17},
}  # fmt: skip


FABRIC = None  # no topology: declared (the `fabric` op)


def node_jobs(node: str) -> dict[str, Any]:
    """The runs that held a node's GPUs, the newest job first (the `node_jobs` op): job 101 on gpu01 now, job 102
    before it, and a private job before that."""

    def run(job: int | None, name: str | None, owner: str | None, state: str, start: float, end: float | None,
            **over: Any) -> dict[str, Any]:  # fmt: skip
        return {"job": job, "ref": job, "attempt": 1, "rank": 0, "gpus": list(range(8)), "state": state,
                "exit_code": None, "signal": None, "started": start, "ended": end, "name": name, "owner": owner,
                "status": state, "array_id": None, "array_index": None, **over}  # fmt: skip

    runs = [
        run(101, "llama-70b-pretrain", "ann", "running", NOW - 5400, None),
        run(102, "bert-base", "bob", "exited", NOW - 9000, NOW - 7000, exit_code=0, gpus=[0, 1, 2, 3]),
        run(None, None, None, "exited", NOW - 12000, NOW - 10000, exit_code=1, gpus=[4, 5], private=True),
    ]
    return {"node": node, "runs": runs if node == "gpu01" else []}


class FixedClient:
    """The console's read ops over the documents above; anything that would change the cluster is refused."""

    embedded = True

    async def call(self, op: str, **args: Any) -> Any:
        if op == "jobs_changed":
            return {"cursor": NOW, "jobs": [] if args.get("since") else JOBS}
        if op == "show":
            job = next(j for j in JOBS if j["id"] == int(args["job"]))
            return job | {"spec": {"name": job["name"], "command": "python train.py"}, "attempts": [],
                          "conditions": [], "events": []}  # fmt: skip
        if op == "nodes" and args.get("nodeset"):
            return [n for n in NODES if n["name"] == args["nodeset"]]
        if op == "nodes_changed":  # the scheduler's own answer, over the nodes this client has
            changes = self.__dict__.setdefault("node_changes", NodeChanges())
            return changes.changed(None, await self.call("nodes"), args.get("since"), args.get("patches", False))
        if op == "job_util":  # running jobs: their GPUs at the last 12 probes
            return {"101": [80, 85, 90, 97, 97, 96, 98, 97, 99, 97, 96, 97], "104": [None, 40, 35, 20, 12, 6, 6, 6]}
        if op == "samples":
            return node_samples(args["node"]) if args.get("node") else job_samples(int(args["job"]))
        if op == "node_jobs":
            return node_jobs(args["node"])
        answers = {"nodes": NODES, "alerts": ALERTS, "events": EVENTS, "cluster": CLUSTER, "reservations": RESERVATIONS,
                   "forecast": FORECAST, "shares": SHARES, "fabric": FABRIC}  # fmt: skip
        if op not in answers:
            raise UsageError(f"fixed data: {op} is not answered here")
        return answers[op]

    async def stream(self, op: str, **args: Any) -> AsyncIterator[Any]:
        raise UsageError("fixed data: no streams")
        yield


def _series(index: int, utils: list[int | None]) -> dict[str, Any]:
    """An hour of one GPU's samples, a probe a minute: utilisation climbing to its current value, warming up."""
    times = [NOW - 3600 + 60 * k for k in range(61)]
    top = utils[index] if index < len(utils) else None
    util = [None if top is None else round(top * min(1.0, k / 30)) for k in range(61)]
    return {"index": index, "time": times, "utilization": util,
            "temperature": [None if u is None else 35 + u // 3 for u in util],
            "memory_used_mib": [None if u is None else 800 * u for u in util]}  # fmt: skip


def node_samples(name: str) -> dict[str, Any]:
    node = next(n for n in NODES if n["name"] == name)
    utils = [g["utilization"] for g in node["gpus"]]
    return {"node": name, "since": NOW - 3600, "gpus": [_series(i, utils) for i in range(len(utils))]}


def job_samples(job_id: int) -> dict[str, Any]:
    job = next(j for j in JOBS if j["id"] == job_id)
    ranks = []
    for rank, name in enumerate(job["node_names"]):
        node = next(n for n in NODES if n["name"] == name)
        gpus = [h["gpu"] for h in node["held"] if h["job"] == job_id]
        utils = [g["utilization"] for g in node["gpus"]]
        epochs = [[NOW - 3600 + 300 * k, 10 + k] for k in range(12)]
        ranks.append({"rank": rank, "node": name, "gpus": gpus, "series": [_series(g, utils) for g in gpus],
                      "epochs": epochs, "ratios": [1.1, 1.2, 1.1, 1.3]})  # fmt: skip
    return {"job": job_id, "attempt": job["attempt"], "since": NOW - 3600, "ranks": ranks}


def fixed_config(tmp_path: Path) -> LoadedConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\nssh:\n  user: root\n"
        "nodes:\n  - name: gpu[01-05]\n    host: 10.0.0.[1-5]\n    pool: h100\n"
    )
    return load_config(path)


def record_notices(app: Any) -> Any:
    """The app, with every notice it shows also kept in `app.said` (in order), for a test to read."""
    app.said = []
    notify = app.notify

    def said(message: str, **kwargs: Any) -> None:
        app.said.append(message)
        notify(message, **kwargs)

    app.notify = said
    return app


def _many_node(i: int, state: str) -> dict[str, Any]:
    utils = [float((i * 7 + g * 13) % 101) for g in range(8)] if state != "unreachable" else []
    return {
        "name": f"node{i:04d}", "pool": ("train", "infer")[i % 4 == 0], "state": state,
        "reasons": ["gpu2 temperature 88C > 85C"] if state in ("degraded", "unhealthy") else [],
        "gpus": [{"index": g, "name": GPU, "utilization": u} for g, u in enumerate(utils)],
        "held": [{"gpu": g, "job": i} for g in range(i % 9)], "held_for_debug": [],
    }  # fmt: skip


class ManyNodesClient(FixedClient):
    """`count` nodes of 8 GPUs in two pools, with something of every state (the map at scale)."""

    def __init__(self, count: int) -> None:
        states = ("healthy",) * 90 + ("degraded", "unhealthy", "unreachable", "drained", "isolated") * 2
        self.nodes = [_many_node(i, states[i % 100]) for i in range(count)]

    async def call(self, op: str, **args: Any) -> Any:
        if op == "nodes":
            return [n for n in self.nodes if n["name"] == args["nodeset"]] if args.get("nodeset") else self.nodes
        if op == "jobs_changed":
            return {"cursor": NOW, "jobs": []}
        return await super().call(op, **args)
