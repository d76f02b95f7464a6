"""The lab layout (config/lab.yaml, else BUILTIN_LAYOUT): its model, loading and validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ftconsole.lab.files import default_layout_path
from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.nodesets import expand_nodeset

DEFAULT_DRIVER_VERSION = "550.54.15"


# The layout used when config/lab.yaml is not there (a non-editable install); keep in step with that file.
BUILTIN_LAYOUT = """\
nodes:
  - {name: "lab[01-04]", pool: h100, gpus: 8, gpu_model: NVIDIA H100 80GB HBM3, memory_mib: 81559}
  - {name: "lab[05-08]", pool: a100, gpus: 4, gpu_model: NVIDIA A100-SXM4-40GB, memory_mib: 40960}
faults:
  lab07: {ecc_uncorrectable: {gpu: 2, count: 3}}
cluster:
  probes:
    interval: 30s
    timeout: 20s
    cache_dir: ~/cache
    thresholds:
      disk_root_gb: 1
      disk_shm_gb: 0.01
      disk_cache_gb: 1
      ulimit_memlock_kb: 32
      ulimit_nofile: 512
      ulimit_stack_kb: 1024
      ulimit_nproc: 256
      load_warn_per_cpu: 8
  pools:
    h100: {description: "lab: 8 x H100 80GB per node", thresholds: {gpus_expected: 8}}
    a100: {description: "lab: 4 x A100 40GB per node", thresholds: {gpus_expected: 4}}
"""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeGroupLayout(_Strict):
    """Nodes that share a pool and a GPU model."""

    name: str  # a node set expression: lab[01-04]
    pool: str = Field(min_length=1)
    gpus: int = Field(ge=0, le=64)
    gpu_model: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)

    @field_validator("name")
    @classmethod
    def _nodeset(cls, value: str) -> str:
        expand_nodeset(value)
        return value


class GpuFault(_Strict):
    gpu: int = Field(0, ge=0)


class EccFault(GpuFault):
    count: int = Field(1, ge=1)


class TemperatureFault(GpuFault):
    celsius: float = Field(ge=-40, le=200)


class NodeFaults(_Strict):
    """Faults injected into one node's gpus.json when the node starts."""

    ecc_uncorrectable: EccFault | None = None
    temperature: TemperatureFault | None = None
    unhealthy: GpuFault | None = None

    def gpu_faults(self) -> list[tuple[str, GpuFault]]:
        return [(kind, f) for kind in ("ecc_uncorrectable", "temperature", "unhealthy") if (f := getattr(self, kind))]


class LabLayout(_Strict):
    """config/lab.yaml: the lab's nodes, their GPUs, injected faults and cluster-config settings."""

    prefix: str = Field("lab", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")  # node names of `--nodes N`
    base_port: int | None = Field(None, ge=1024, le=65535)  # fixed ports base_port + i; default: free ports
    driver_version: str = DEFAULT_DRIVER_VERSION
    shared_home: bool = False  # every node's HOME is <lab>/home (an NFS /home); false: <lab>/nodes/<name>/home
    nodes: list[NodeGroupLayout] = Field(min_length=1)
    faults: dict[str, NodeFaults] = {}
    cluster: dict[str, Any] = {}

    def cross_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """Problems spanning several keys, as (key path, message)."""
        out: list[tuple[tuple[Any, ...], str]] = []
        gpus: dict[str, int] = {}
        for i, group in enumerate(self.nodes):
            for name in expand_nodeset(group.name):
                if name in gpus:
                    out.append((("nodes", i, "name"), f"node {name} is already in an earlier group"))
                gpus.setdefault(name, group.gpus)
        for name, faults in self.faults.items():
            if name not in gpus:
                out.append((("faults", name), f"no node {name} in nodes"))
                continue
            for kind, fault in faults.gpu_faults():
                if fault.gpu >= gpus[name]:
                    out.append((("faults", name, kind, "gpu"), f"{name} has {gpus[name]} GPUs (0-{gpus[name] - 1})"))
        if "nodes" in self.cluster:
            out.append(
                (("cluster", "nodes"), "the lab generates the nodes of its cluster config; list them under nodes")
            )
        return out


def load_layout(path: Path | str | None = None) -> LabLayout:
    """Read and validate a lab layout (default: config/lab.yaml, else the built-in one); ConfigError names lines."""
    path = Path(path) if path is not None else default_layout_path()
    if path is None:
        data, marks = yamlfile.parse(BUILTIN_LAYOUT, "<built-in lab layout>")
        return _validate_layout(data, marks, "<built-in lab layout>")
    data, marks = yamlfile.load(path)
    return _validate_layout(data, marks, str(path))


def parse_layout(text: str, file: str = "<lab layout>") -> LabLayout:
    data, marks = yamlfile.parse(text, file)
    return _validate_layout(data, marks, file)


def _validate_layout(data: Any, marks: yamlfile.Marks, file: str) -> LabLayout:
    layout = yamlfile.validate(LabLayout, data, file, marks)
    problems = [
        Problem(file, yamlfile.line_of(marks, loc), yamlfile.dotted(loc), msg) for loc, msg in layout.cross_problems()
    ]
    cluster = {k: v for k, v in layout.cluster.items() if k != "nodes"}
    try:
        ClusterConfig.model_validate(cluster)
    except ValidationError as exc:
        sub = {key[1:]: line for key, line in marks.items() if key[:1] == ("cluster",)}
        for p in yamlfile.problems_from_validation(exc, file, sub):
            problems.append(Problem(p.file, p.line, f"cluster.{p.path}" if p.path else "cluster", p.message))
    if problems:
        raise ConfigError(problems)
    return layout
