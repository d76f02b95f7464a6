"""Every example job (config/jobs/, the lab's demo jobs) passes `ftconsole predict` against the example config.

The same path as the API's `predict`: the spec loaded as the CLI loads it, then `Scheduler.predict` (submit's
rules, then placement) on a store whose nodes are the example config's, probed healthy. The probes are stood in
for (no SSH): each node reports its pool's GPUs (8 H100 or 4 A100, as the example's pools say), a driver, and a
podman that gives GPUs to containers, with every check passing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.results import CheckResult, CheckStatus, ContainerRuntime, GPUInfo, NodeFacts, ProbeReport
from ftconsole.scheduler import nodeops as service_module
from ftconsole.scheduler.decide.placement import Place
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import LoadedConfig, Node, load_config
from ftconsole.scheduler.spec.jobspec import load_jobspec
from ftconsole.scheduler.store.db import Store

ROOT_DIR = Path(__file__).resolve().parents[2]
PACKAGED = ROOT_DIR / "ftconsole" / "data" / "cluster.example.yaml"
EXAMPLE_CONFIG = PACKAGED if PACKAGED.exists() else ROOT_DIR / "config" / "cluster.example.yaml"
EXAMPLE_JOBS = sorted((ROOT_DIR / "config" / "jobs").glob("*.yaml")) + sorted(
    (ROOT_DIR / "ftconsole" / "lab" / "demo_jobs").glob("*.yaml")
)
ANN = Caller(uid=1000, gid=1000, pid=os.getpid(), user="ann")  # a user, not an admin

# What the example config's pools describe: "8x H100 SXM" and "4x A100 40GB"
GPUS_BY_POOL = {"h100": (8, "NVIDIA H100 80GB HBM3"), "a100": (4, "NVIDIA A100-SXM4-40GB")}


def healthy_report(node: Node) -> ProbeReport:
    count, model = GPUS_BY_POOL[node.pool]
    podman = ContainerRuntime("podman", "/usr/bin/podman", "4.9.3", usable=True, gpus=True, gpus_via=("CDI",))
    facts = NodeFacts(
        hostname=node.name,
        boot_id=f"boot-{node.name}",
        os="Ubuntu 22.04",
        kernel="5.15.0",
        cpus=128,
        mem_total_mib=2_000_000,
        mem_available_mib=1_800_000,
        load1=1.0,
        python="3.10.12",
        driver_version="550.54.15",
        gpu_source="nvml",
        runtimes=(podman,),
    )
    gpus = tuple(GPUInfo(index=i, name=model, utilization=0.0, temperature=40.0, healthy=True) for i in range(count))
    return ProbeReport(facts=facts, gpus=gpus, checks=(CheckResult("gpu-check", CheckStatus.PASS, count, count),))


def example_config(tmp_path: Path) -> LoadedConfig:
    loaded = load_config(EXAMPLE_CONFIG)
    cluster = loaded.cluster.model_copy(update={"state_dir": str(tmp_path / "state")})
    return LoadedConfig(cluster=cluster, file=loaded.file)


def test_the_example_config_has_both_pools_the_reports_stand_in_for() -> None:
    assert {n.pool for n in load_config(EXAMPLE_CONFIG).cluster.node_list()} == set(GPUS_BY_POOL)


def test_there_are_example_jobs() -> None:
    names = [p.name for p in EXAMPLE_JOBS]
    assert "pytorch.yaml" in names and "1-train.yaml" in names, names


@pytest.mark.parametrize("path", EXAMPLE_JOBS, ids=[f"{p.parent.name}/{p.name}" for p in EXAMPLE_JOBS])
async def test_an_example_job_would_start_now_on_the_example_cluster(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_jobspec(path)  # as `ftconsole predict` loads it: every problem with its line
    loaded = example_config(tmp_path)

    async def healthy_sweep(_transport: Any, _config: Any, nodes: Sequence[Node], **_: Any) -> dict[str, Any]:
        return {n.name: healthy_report(n) for n in nodes}

    monkeypatch.setattr(service_module, "sweep", healthy_sweep)
    async with await Store.open(tmp_path / "state.db") as store:
        svc = ClusterService(loaded, store, transport=None)  # type: ignore[arg-type]  # no SSH: sweep is replaced
        outcomes = await svc.probe()
        assert all(o.ok for o in outcomes), [(o.node.name, o.health.state) for o in outcomes]
        decision = await Scheduler(svc).predict(ANN, spec)  # refusals raise, with submit's reason
    assert isinstance(decision, Place), f"{path.name}: would wait: {decision}"
    assert len(decision.nodes) == spec.nodes
