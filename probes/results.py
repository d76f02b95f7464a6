"""Console side of the probes: the agent's JSON document parsed into typed results.

The agent (`scheduler/node/agent.py`, node side) prints one JSON document per run; `parse_report` turns it into a
`ProbeReport`. A value the agent could not read is ``None`` ("not available") and never fails the parse;
a document that is not the agent's at all raises `AgentOutputError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ftconsole.scheduler.errors import FtError

AGENT_PROTOCOL = 1


class AgentOutputError(FtError):
    title = "probe output"


class CheckStatus(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {CheckStatus.SKIP: 0, CheckStatus.PASS: 0, CheckStatus.WARN: 1, CheckStatus.FAIL: 2}

# Check names. The pre-flight ones are seed 000's `item` names, spelled as the seed spells them.
PREFLIGHT_CHECKS = ("dns", "disk-size root", "disk-size shm", "disk-size cache", "ulimit", "gpu-check")
HARDWARE_CHECKS = ("gpu-health", "gpu-temperature", "nvlink", "infiniband", "memory", "load")
ALL_CHECKS = PREFLIGHT_CHECKS + HARDWARE_CHECKS


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: CheckStatus
    value: float | str | None = None
    threshold: float | str | None = None
    unit: str = ""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "value": self.value,
            "threshold": self.threshold,
            "unit": self.unit,
            "message": self.message,
        }


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization: float | None = None
    temperature: float | None = None
    ecc_uncorrectable: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    nvlink_down: int | None = None
    healthy: bool | None = None
    processes: tuple[int, ...] = ()
    pcie_width: int | None = None  # the PCIe link's lanes now, and the most the GPU and its slot can have
    pcie_width_max: int | None = None
    pcie_gen: int | None = None  # its generation now (lower while the GPU idles), and the most it can have
    pcie_gen_max: int | None = None
    slowdown: tuple[str, ...] | None = None  # hardware slowdowns in force: hw_slowdown, sw_thermal, hw_thermal, ...
    retired_pages: int | None = None  # memory pages retired for ECC errors (GPUs before A100)
    nvlink_errors: int | None = None  # NVLink replays, recoveries and CRC errors since the driver loaded
    nvlink_error_rate: float | None = None  # of those, per second since the node's last probe (None: no earlier one)

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["processes"] = list(self.processes)
        d["slowdown"] = None if self.slowdown is None else list(self.slowdown)
        return d


@dataclass(frozen=True)
class ContainerRuntime:
    """A container runtime found on a node's PATH (podman, docker, apptainer, singularity, enroot)."""

    name: str
    path: str | None = None
    version: str | None = None  # parsed from `--version`; its first line as it is when no number is in it
    usable: bool = False  # docker: `docker info` reaches the daemon; podman: `podman info` works; else it runs
    problem: str | None = None  # why it is not usable
    gpus: bool = False  # usable, and it can give GPUs to a container
    gpus_via: tuple[str, ...] = ()  # how: "CDI", "nvidia runtime", "--gpus (toolkit)", "OCI hook", "--nv", ...

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["gpus_via"] = list(self.gpus_via)
        return d

    def describe(self) -> str:
        """One line for people: "podman 4.3.1, GPUs: CDI" or "docker 28.2.2: daemon not reachable: ..."."""
        named = f"{self.name} {self.version}" if self.version else self.name
        if not self.usable:
            return f"{named}: {self.problem or 'not usable'}"
        return f"{named}, GPUs: {', '.join(self.gpus_via)}" if self.gpus else f"{named}, no GPUs"


@dataclass(frozen=True)
class NodeFacts:
    hostname: str | None = None
    boot_id: str | None = None
    os: str | None = None
    kernel: str | None = None
    cpus: int | None = None
    mem_total_mib: int | None = None
    mem_available_mib: int | None = None
    load1: float | None = None
    python: str | None = None
    driver_version: str | None = None
    gpu_source: str | None = None  # nvml | nvidia-smi | sim | none
    infiniband: bool | None = None
    runtimes: tuple[ContainerRuntime, ...] = ()  # container runtimes on PATH, in the agent's order

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["runtimes"] = [r.to_json() for r in self.runtimes]
        return d


@dataclass(frozen=True)
class ProbeReport:
    facts: NodeFacts
    gpus: tuple[GPUInfo, ...]
    checks: tuple[CheckResult, ...]
    duration_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def check(self, name: str) -> CheckResult | None:
        for c in self.checks:
            if c.name == name:
                return c
        return None

    @property
    def worst(self) -> CheckStatus:
        worst = CheckStatus.PASS
        for c in self.checks:
            if c.status.rank > worst.rank:
                worst = c.status
        return worst

    def to_json(self) -> dict[str, Any]:
        return {
            "facts": self.facts.to_json(),
            "gpus": [g.to_json() for g in self.gpus],
            "checks": [c.to_json() for c in self.checks],
            "duration_s": self.duration_s,
        }


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return v
    return None


def _int(v: Any) -> int | None:
    n = _num(v)
    return int(n) if n is not None else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _names(v: Any) -> tuple[str, ...] | None:
    """A list of short names (a GPU's slowdowns); None: not read."""
    if not isinstance(v, list):
        return None
    return tuple(n for n in v if isinstance(n, str) and len(n) <= 40)


def _value(v: Any) -> float | str | None:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float | str):
        return v
    return None


def parse_runtimes(value: Any) -> tuple[ContainerRuntime, ...]:
    """The runtimes of the facts (the agent's list, or a stored report's); an entry without a name is left
    out, wrong types read as not available."""
    out = []
    for r in value if isinstance(value, list) else []:
        if not isinstance(r, dict) or not _str(r.get("name")):
            continue
        via = r.get("gpus_via")
        out.append(
            ContainerRuntime(
                name=r["name"],
                path=_str(r.get("path")),
                version=_str(r.get("version")),
                usable=_bool(r.get("usable")) is True,
                problem=_str(r.get("problem")),
                gpus=_bool(r.get("gpus")) is True,
                gpus_via=tuple(v for v in (via if isinstance(via, list) else []) if isinstance(v, str)),
            )
        )
    return tuple(out)


def parse_report(text: str) -> ProbeReport:
    """Parse the agent's stdout. The document is the last line that starts with '{' (ignoring login noise)."""
    doc = None
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise AgentOutputError(f"agent printed invalid JSON: {exc}") from exc
            break
    if not isinstance(doc, dict):
        snippet = text.strip()[-200:] or "(nothing)"
        raise AgentOutputError(f"agent printed no JSON document; output was: {snippet}")
    return parse_document(doc)


def parse_document(doc: dict[str, Any]) -> ProbeReport:
    if doc.get("agent") != AGENT_PROTOCOL:
        raise AgentOutputError(f"unknown agent protocol {doc.get('agent')!r} (expected {AGENT_PROTOCOL})")
    raw_facts = doc.get("facts")
    f: dict[str, Any] = raw_facts if isinstance(raw_facts, dict) else {}
    facts = NodeFacts(
        hostname=_str(f.get("hostname")),
        boot_id=_str(f.get("boot_id")),
        os=_str(f.get("os")),
        kernel=_str(f.get("kernel")),
        cpus=_int(f.get("cpus")),
        mem_total_mib=_int(f.get("mem_total_mib")),
        mem_available_mib=_int(f.get("mem_available_mib")),
        load1=_num(f.get("load1")),
        python=_str(f.get("python")),
        driver_version=_str(f.get("driver_version")),
        gpu_source=_str(f.get("gpu_source")),
        infiniband=_bool(f.get("infiniband")),
        runtimes=parse_runtimes(f.get("runtimes")),
    )
    gpus = []
    for i, g in enumerate(doc.get("gpus") or []):
        if not isinstance(g, dict):
            continue
        procs = g.get("processes") or []
        gpus.append(
            GPUInfo(
                index=_int(g.get("index")) if _int(g.get("index")) is not None else i,  # type: ignore[arg-type]
                name=_str(g.get("name")),
                uuid=_str(g.get("uuid")),
                memory_total_mib=_int(g.get("memory_total_mib")),
                memory_used_mib=_int(g.get("memory_used_mib")),
                utilization=_num(g.get("utilization")),
                temperature=_num(g.get("temperature")),
                ecc_uncorrectable=_int(g.get("ecc_uncorrectable")),
                retired_pages_pending=_bool(g.get("retired_pages_pending")),
                remapped_rows_pending=_bool(g.get("remapped_rows_pending")),
                nvlink_down=_int(g.get("nvlink_down")),
                healthy=_bool(g.get("healthy")),
                processes=tuple(p for p in procs if isinstance(p, int) and not isinstance(p, bool)),
                pcie_width=_int(g.get("pcie_width")),
                pcie_width_max=_int(g.get("pcie_width_max")),
                pcie_gen=_int(g.get("pcie_gen")),
                pcie_gen_max=_int(g.get("pcie_gen_max")),
                slowdown=_names(g.get("slowdown")),
                retired_pages=_int(g.get("retired_pages")),
                nvlink_errors=_int(g.get("nvlink_errors")),
                nvlink_error_rate=_num(g.get("nvlink_error_rate")),
            )
        )
    checks = []
    for c in doc.get("checks") or []:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            continue
        try:
            status = CheckStatus(str(c.get("status")))
        except ValueError:
            status = CheckStatus.FAIL
            c = {**c, "message": f"agent reported unknown status {c.get('status')!r}: {c.get('message', '')}"}
        checks.append(
            CheckResult(
                name=c["name"],
                status=status,
                value=_value(c.get("value")),
                threshold=_value(c.get("threshold")),
                unit=_str(c.get("unit")) or "",
                message=_str(c.get("message")) or "",
            )
        )
    return ProbeReport(
        facts=facts,
        gpus=tuple(gpus),
        checks=tuple(checks),
        duration_s=_num(doc.get("duration_s")),
    )
