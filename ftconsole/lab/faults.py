"""Faults injected into a running lab node (pure): what to inject, the node's state, and what was done.

    kill      the node dies: its SSH server stops (connections dropped, new ones refused), its processes killed
    hang      the node freezes: its SSH server and its processes are stopped (connections stay open, silent)
    gpu-ecc   one GPU reports one more uncorrectable ECC error in gpus.json, from now on
    reboot    the node reboots: its SSH server stops, its processes are killed, it gets a new boot id (in
              gpus.json, which its probe reads) and its SSH server starts again; ECC errors are cleared
    heal      all of it undone: the server answers again, stopped processes continue, ECC errors are cleared

`LabCluster.fault` does them in the lab's process; `lab_fault` asks the background lab (``lab.sock``) to.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.errors import UsageError


class FaultKind(enum.Enum):
    KILL = "kill"
    HANG = "hang"
    GPU_ECC = "gpu-ecc"
    REBOOT = "reboot"
    HEAL = "heal"


class NodeState(enum.Enum):
    """How a lab node's SSH server is doing."""

    UP = "up"  # listening and answering
    HUNG = "hung"  # frozen: the port accepts TCP, nothing answers
    DOWN = "down"  # not listening: connections are refused


@dataclass(frozen=True)
class Fault:
    """One fault to inject into a node: ``Fault.kill()``, ``Fault.hang()``, ``Fault.gpu_ecc(2)``, ``Fault.heal()``."""

    kind: FaultKind
    gpu: int | None = None  # GPU_ECC only: the GPU's index

    def __post_init__(self) -> None:
        if (self.kind is FaultKind.GPU_ECC) != (self.gpu is not None):
            raise UsageError("a GPU index goes with gpu-ecc, and only with it")
        if self.gpu is not None and self.gpu < 0:
            raise UsageError(f"GPU index {self.gpu} is negative")

    @classmethod
    def kill(cls) -> Fault:
        return cls(FaultKind.KILL)

    @classmethod
    def hang(cls) -> Fault:
        return cls(FaultKind.HANG)

    @classmethod
    def gpu_ecc(cls, gpu: int) -> Fault:
        return cls(FaultKind.GPU_ECC, gpu)

    @classmethod
    def reboot(cls) -> Fault:
        return cls(FaultKind.REBOOT)

    @classmethod
    def heal(cls) -> Fault:
        return cls(FaultKind.HEAL)

    def __str__(self) -> str:
        return f"{self.kind.value} {self.gpu}" if self.gpu is not None else self.kind.value

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "gpu": self.gpu}

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        if not isinstance(data, Mapping):
            raise UsageError("a fault is an object with kind and gpu")
        try:
            kind = FaultKind(data.get("kind"))
        except ValueError:
            kinds = ", ".join(k.value for k in FaultKind)
            raise UsageError(f"unknown fault {data.get('kind')!r} (one of {kinds})") from None
        gpu = data.get("gpu")
        if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool)):
            raise UsageError(f"GPU index {gpu!r} is not a whole number")
        return cls(kind, gpu)


@dataclass(frozen=True)
class FaultReport:
    """What a fault did to a node, and the node's state after it."""

    node: str
    fault: Fault
    state: NodeState
    message: str  # one line for people: what was done
    processes: tuple[int, ...] = ()  # pids killed (kill), stopped (hang) or continued (heal)
    ecc_uncorrectable: tuple[int, ...] = ()  # each GPU's count in gpus.json afterwards

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "fault": self.fault.kind.value,
            "gpu": self.fault.gpu,
            "state": self.state.value,
            "message": self.message,
            "processes": list(self.processes),
            "ecc_uncorrectable": list(self.ecc_uncorrectable),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultReport:
        return cls(
            node=str(data["node"]),
            fault=Fault.from_json({"kind": data["fault"], "gpu": data.get("gpu")}),
            state=NodeState(data["state"]),
            message=str(data["message"]),
            processes=tuple(int(p) for p in data.get("processes", ())),
            ecc_uncorrectable=tuple(int(n) for n in data.get("ecc_uncorrectable", ())),
        )


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}es" if word.endswith("s") else f"{count} {word}s"
