"""The lab folder: where each of its files lives, and writing them atomically."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def default_lab_dir() -> Path:
    """$FTCONSOLE_LAB_DIR, else ~/.local/state/ftconsole/lab."""
    env = os.environ.get("FTCONSOLE_LAB_DIR")
    return Path(env).expanduser() if env else Path("~/.local/state/ftconsole/lab").expanduser()


def default_layout_path() -> Path | None:
    """config/lab.yaml next to the package (a checkout or an editable install), else None (built-in)."""
    path = _PACKAGE_ROOT / "config" / "lab.yaml"
    return path if path.is_file() else None


@dataclass(frozen=True)
class LabPaths:
    """Where everything of one lab lives; `root` is absolute."""

    root: Path

    @classmethod
    def of(cls, lab_dir: Path | str | None) -> LabPaths:
        root = Path(lab_dir).expanduser() if lab_dir is not None else default_lab_dir()
        return cls(Path(os.path.abspath(root)))

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def cluster_config(self) -> Path:
        return self.root / "cluster.yaml"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def ports(self) -> Path:
        return self.root / "ports.json"

    @property
    def info(self) -> Path:
        return self.root / "lab.json"

    @property
    def lock(self) -> Path:
        return self.root / "lab.lock"

    @property
    def log(self) -> Path:
        return self.root / "lab.log"

    @property
    def control(self) -> Path:
        return self.root / "lab.sock"

    @property
    def shared_home(self) -> Path:
        """The home folder of every node when the nodes share one (the layout's `shared_home`)."""
        return self.root / "home"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name


def _write_atomic(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
