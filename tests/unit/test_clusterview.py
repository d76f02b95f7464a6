"""The cluster view (seed 003): GPUs held per node with their jobs, specs idle or tight, queued demand."""

from __future__ import annotations

from typing import Any

from ftconsole.scheduler.decide.clusterview import cluster_view
from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.jobspec import JobSpec

H100 = "NVIDIA H100 80GB HBM3"


def view(name: str, state: str, gpus: int, model: str = H100, pool: str = "default") -> dict[str, Any]:
    return {
        "name": name,
        "state": state,
        "pool": pool,
        "labels": {},
        "facts": {"os": "Debian 12", "kernel": "6.1", "cpus": 96, "mem_total_mib": 1024, "driver_version": "550"},
        "gpus": [{"index": i, "name": model} for i in range(gpus)],
    }


def queued(job_id: int, spec: dict[str, Any]) -> Job:
    return Job(
        id=job_id,
        name="q",
        owner="ann",
        uid=1,
        spec=JobSpec.from_json({"name": "q", "command": "true", **spec}),
        status=JobStatus.QUEUED,
        priority="normal",
        project="default",
        access="none",
        submitted=0.0,
    )


def test_cluster_view() -> None:
    config = ClusterConfig.model_validate({"specs": {"h100-8": {"gpus_per_node": 8, "gpu_model": H100}}})
    views = [
        view("a", "healthy", 8),
        view("b", "healthy", 8),
        view("c", "unhealthy", 8),
        view("d", "healthy", 4, "A100"),
    ]
    held = [Run(job=7, attempt=1, rank=0, node="a", gpus=(0, 1), run_dir="/r", launch=True, state="running")]
    jobs = [queued(8, {"gpus_per_node": 4, "nodes": 2, "mode": "pytorch"}), queued(9, {"spec": "h100-8"})]
    doc = cluster_view(config, views, held, jobs)
    a = doc["nodes"][0]
    assert (a["gpus_used"], a["gpus_total"], a["os"], a["driver_version"]) == (2, 8, "Debian 12", "550")
    assert [g["job"] for g in a["gpus"]] == [7, 7, None, None, None, None, None, None]
    specs = {s["spec"]: s for s in doc["specs"]}
    # only b can take a whole-node H100 job: a has 2 GPUs held, c is unhealthy
    assert (specs["h100-8"]["nodes_free"], specs["h100-8"]["gpus_free"], specs["h100-8"]["state"]) == (1, 14, "idle")
    assert specs["A100"]["state"] == "idle"
    held.append(Run(job=10, attempt=1, rank=0, node="d", gpus=(0,), run_dir="/r", launch=True, state="running"))
    assert {s["spec"]: s["state"] for s in cluster_view(config, views, held, jobs)["specs"]}["A100"] == "tight"
    assert doc["queued_demand"] == {"any": 8, H100: 8}
