"""Records of a running lab (lab.json and `ftconsole lab status --json`): `LabInfo` and its `LabNodeInfo`s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftconsole.lab.files import LabPaths
from ftconsole.scheduler.errors import LabError


@dataclass(frozen=True)
class LabNodeInfo:
    name: str
    host: str
    port: int
    pool: str
    gpus: int
    gpu_model: str
    up: bool | None = None  # None: not checked
    state: str | None = None  # "up", "hung" or "down" as the lab server last wrote it (NodeState); None: not known

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class LabInfo:
    """A running lab: who serves it, since when, its nodes (with `up` where checked) and its files."""

    lab_dir: Path
    pid: int
    started: str  # ISO 8601, UTC
    nodes: tuple[LabNodeInfo, ...]
    layout: str | None = None
    shared_home: bool = False  # every node's HOME is <lab>/home (else <lab>/nodes/<name>/home)

    @property
    def paths(self) -> LabPaths:
        return LabPaths(self.lab_dir)

    @property
    def config_path(self) -> Path:
        return self.paths.cluster_config

    @property
    def known_hosts_path(self) -> Path:
        return self.paths.known_hosts

    @property
    def identity_file(self) -> Path:
        return self.paths.client_key

    @property
    def log_path(self) -> Path:
        return self.paths.log

    @property
    def all_up(self) -> bool:
        return all(n.up for n in self.nodes)

    def node(self, name: str) -> LabNodeInfo:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LabError(f"no node {name} in the lab")

    def to_json(self) -> dict[str, Any]:
        return {
            "running": True,
            "lab_dir": str(self.lab_dir),
            "pid": self.pid,
            "started": self.started,
            "layout": self.layout,
            "shared_home": self.shared_home,
            "config": str(self.config_path),
            "known_hosts": str(self.known_hosts_path),
            "identity_file": str(self.identity_file),
            "log": str(self.log_path),
            "nodes": [n.to_json() for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabInfo:
        nodes = tuple(
            LabNodeInfo(
                n["name"], n["host"], int(n["port"]), n["pool"], int(n["gpus"]), n["gpu_model"], state=n.get("state")
            )
            for n in data["nodes"]
        )
        return cls(
            Path(data["lab_dir"]),
            int(data["pid"]),
            str(data["started"]),
            nodes,
            data.get("layout"),
            shared_home=bool(data.get("shared_home", False)),
        )
