"""The local lab cluster: a fake GPU cluster of SSH servers on 127.0.0.1, for the demo, tests and benchmark.

Every lab node is an asyncssh server on its own loopback port, all of them served by one Python process and
event loop. A session on a node runs the requested command as a real local process
(``/bin/sh -c COMMAND`` in the node's home folder, in a new session), with the node's environment::

    HOME=<lab>/nodes/<name>/home               the node's home folder (with ``cache/``)
    FTCONSOLE_SIM_GPUS=<lab>/nodes/<name>/gpus.json   its simulated GPUs (DESIGN.md, "Simulated GPUs")
    FTCONSOLE_LAB_NODE=<name>
    FTCONSOLE_LAB_ROOT=<lab>                   (as tests/sshd_cluster.py sets it: finds a lab's processes)

plus PATH, LANG, USER and LOGNAME of the lab process, SSH_CLIENT/SSH_CONNECTION as sshd sets them, TERM under
a pty, and whatever environment the client sent. A session with a pty runs under a real pseudo-terminal
(``ssh -t node``, or a login shell for ``ssh node``); a session without a command and without a pty runs
``/bin/sh`` reading commands from stdin, as sshd does. Subsystems (sftp) are refused.

When a client goes away while its command still runs, the command's process group gets SIGHUP (as a pty
hangup would); a process that detached into its own session (a run supervisor) is left alone. When the lab
stops, every process of every node is killed: the tracked process groups and every process of our uid whose
environment names this lab (found in ``/proc/*/environ``).

The lab folder (default ``~/.local/state/ftconsole/lab`` or ``$FTCONSOLE_LAB_DIR``)::

    id_ed25519, id_ed25519.pub   the client key, authorized on every node (kept across restarts)
    known_hosts                  ``[127.0.0.1]:PORT ssh-ed25519 ...`` per node (rewritten at each start)
    cluster.yaml                 a ready-to-use ftconsole cluster config (rewritten at each start)
    state/                       the state_dir of that config
    ports.json                   the ports of the last run, reused when free so cluster.yaml stays stable
    lab.json                     the running background server: pid, start time, nodes and ports
    lab.lock                     pid-file lock (flock): one server per lab folder
    lab.log                      the background server's log
    nodes/<name>/host_key        the node's ed25519 host key (kept across restarts)
    nodes/<name>/home/           the node's home folder, with cache/
    nodes/<name>/gpus.json       its simulated GPUs, written from the layout when the node starts

In-process (tests)::

    async with LabCluster(tmp_path, nodes=3) as lab:
        async with asyncssh.connect(**lab.connect_options("lab01")) as conn:
            await conn.run("echo $HOME")

As a background process (``ftconsole lab up|down|status``, the demo, the benchmark): `lab_up`, `lab_status`,
`lab_down`, which run ``python -m ftconsole.lab serve``. The layout (nodes, GPUs, injected faults and cluster
settings) is a YAML file, by default ``config/lab.yaml``; see that file for its keys.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import pty
import re
import signal
import socket
import struct
import sys
import termios
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncssh
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler import yamlfile
from scheduler.config import ClusterConfig, expand_nodeset
from scheduler.errors import ConfigError, FtError, LabError, Problem
from scheduler.ssh import local_user

log = logging.getLogger("ftconsole.lab")

LAB_HOST = "127.0.0.1"
SHELL = "/bin/sh"
DEFAULT_DRIVER_VERSION = "550.54.15"
OUTPUT_GRACE_S = 2.0  # after a command exits, how long its output may stay open (a background child holds it)
KILL_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
STOP_TIMEOUT_S = 10.0
MAX_NODES = 4096
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_INHERITED_ENV = ("PATH", "LANG")
_PROTECTED_ENV = ("HOME", "USER", "LOGNAME", "FTCONSOLE_SIM_GPUS", "FTCONSOLE_LAB_NODE", "FTCONSOLE_LAB_ROOT")
# A pty session's child: become the controlling process of the pty (stdin), then exec the shell.
_CTTY_EXEC = (
    "import fcntl, os, sys, termios\nfcntl.ioctl(0, termios.TIOCSCTTY, 0)\nos.execv(sys.argv[1], sys.argv[1:])\n"
)

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


# -- paths ------------------------------------------------------------------------------------------------


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

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name


# -- the layout -------------------------------------------------------------------------------------------


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


# -- planning nodes, GPUs and the cluster config (pure) ---------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One lab node as planned from the layout."""

    name: str
    pool: str
    gpus: int
    gpu_model: str
    memory_mib: int
    faults: NodeFaults | None = None


def node_names(count: int, prefix: str = "lab") -> list[str]:
    """lab01..labNN (width 2 below 100 nodes, else 3 or more)."""
    if not 1 <= count <= MAX_NODES:
        raise LabError(f"the lab has 1 to {MAX_NODES} nodes, not {count}")
    width = 2 if count < 100 else max(3, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def _number_key(name: str) -> tuple[str, int] | str:
    """lab07 and lab007 are the same node number: faults follow the number when `--nodes` renames nodes."""
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else name


def _split(count: int, sizes: Sequence[int]) -> list[int]:
    """Share `count` nodes between groups in proportion to their sizes (contiguous blocks, in order)."""
    total, done, out, cum = sum(sizes), 0, [], 0
    for size in sizes:
        cum += size
        end = (count * cum + total // 2) // total
        out.append(end - done)
        done = end
    return out


def plan_nodes(layout: LabLayout, count: int | None = None) -> tuple[NodeSpec, ...]:
    """The nodes of the lab: the layout's own, or `count` nodes named prefix01.. in the layout's proportions."""
    groups = [(g, expand_nodeset(g.name)) for g in layout.nodes]
    if count is None:
        named = [(g, name) for g, names in groups for name in names]
    else:
        names = iter(node_names(count, layout.prefix))
        shares = _split(count, [len(n) for _, n in groups])
        named = [(g, next(names)) for (g, _), share in zip(groups, shares, strict=True) for _ in range(share)]
    faults = {_number_key(name): f for name, f in layout.faults.items()}
    faults.update(layout.faults)
    out = []
    for group, name in named:
        fault = faults.get(name) or faults.get(_number_key(name))
        out.append(NodeSpec(name, group.pool, group.gpus, group.gpu_model, group.memory_mib, fault))
    return tuple(out)


def render_gpus(spec: NodeSpec, driver_version: str = DEFAULT_DRIVER_VERSION) -> dict[str, Any]:
    """The node's gpus.json (DESIGN.md "Simulated GPUs"): idle, cool, healthy GPUs plus the node's faults."""
    gpus = [
        {
            "index": i,
            "name": spec.gpu_model,
            "memory_total_mib": spec.memory_mib,
            "utilization": 0,
            "temperature": 34 + (i * 3) % 8,
            "ecc_uncorrectable": 0,
            "healthy": True,
        }
        for i in range(spec.gpus)
    ]
    for kind, fault in spec.faults.gpu_faults() if spec.faults else []:
        if fault.gpu >= len(gpus):
            continue  # `--nodes N` may give the node fewer GPUs than the layout's node of that name
        gpu = gpus[fault.gpu]
        if isinstance(fault, EccFault):
            gpu["ecc_uncorrectable"] = fault.count
        elif isinstance(fault, TemperatureFault):
            gpu["temperature"] = fault.celsius
        elif kind == "unhealthy":
            gpu["healthy"] = False
    return {"driver_version": driver_version, "gpus": gpus}


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`; mappings are merged key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def render_cluster_config(
    layout: LabLayout, nodes: Sequence[tuple[NodeSpec, int]], paths: LabPaths, user: str
) -> dict[str, Any]:
    """The lab's cluster config: ssh settings and one entry per (node, port), merged with layout.cluster."""
    base: dict[str, Any] = {
        "state_dir": str(paths.state_dir),
        "ssh": {
            "user": user,
            "identity_file": str(paths.client_key),
            "known_hosts": str(paths.known_hosts),
            "config_file": None,
            "connect_timeout": "3s",
            "command_timeout": "20s",
        },
        "nodes": [{"name": spec.name, "host": LAB_HOST, "port": port, "pool": spec.pool} for spec, port in nodes],
        "pools": {group.pool: {} for group in layout.nodes},
        "admins": [user],
    }
    return deep_merge(base, layout.cluster)


def check_cluster_config(data: Mapping[str, Any], file: str) -> None:
    """Raise LabError when the generated config would not load (a layout's cluster settings at fault)."""
    try:
        cluster = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = yamlfile.problems_from_validation(exc, file, {})
        raise LabError("generated cluster config is invalid:\n" + "\n".join(map(str, problems))) from exc
    cross = cluster.cross_problems()
    if cross:
        raise LabError(
            "generated cluster config is invalid:\n" + "\n".join(f"{yamlfile.dotted(p)}: {m}" for p, m in cross)
        )


# -- records ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabNodeInfo:
    name: str
    host: str
    port: int
    pool: str
    gpus: int
    gpu_model: str
    up: bool | None = None  # None: not checked

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
            "config": str(self.config_path),
            "known_hosts": str(self.known_hosts_path),
            "identity_file": str(self.identity_file),
            "log": str(self.log_path),
            "nodes": [n.to_json() for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabInfo:
        nodes = tuple(
            LabNodeInfo(n["name"], n["host"], int(n["port"]), n["pool"], int(n["gpus"]), n["gpu_model"])
            for n in data["nodes"]
        )
        return cls(Path(data["lab_dir"]), int(data["pid"]), str(data["started"]), nodes, data.get("layout"))


# -- files and processes ----------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _load_or_create_key(path: Path, *, public: Path | None = None) -> asyncssh.SSHKey:
    """An ed25519 private key kept in `path` (0600); created (or recreated if unreadable) when needed."""
    if path.is_file():
        try:
            return asyncssh.read_private_key(str(path))
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            log.warning("%s is unreadable (%s); creating a new key", path, exc)
    key = asyncssh.generate_private_key("ssh-ed25519")
    _write_atomic(path, key.export_private_key(), 0o600)
    if public is not None:
        _write_atomic(public, key.export_public_key())
    return key


def _public_line(key: asyncssh.SSHKey) -> str:
    """'ssh-ed25519 AAAA...' without a comment."""
    return " ".join(key.export_public_key().decode().split()[:2])


def _proc_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not); reaps it when it is our exited child."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    if Path("/proc/self").exists():
        return _proc_state(pid) not in (None, "Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def find_lab_processes(lab_dir: Path | str, node: str | None = None) -> list[int]:
    """Pids of our uid whose environment names this lab (FTCONSOLE_LAB_ROOT), i.e. started on its nodes.

    With `node`, only those started on that node (FTCONSOLE_LAB_NODE).
    """
    marker = f"FTCONSOLE_LAB_ROOT={LabPaths.of(lab_dir).root}".encode()
    node_marker = f"FTCONSOLE_LAB_NODE={node}".encode() if node is not None else None
    uid, me, out = os.getuid(), os.getpid(), []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if marker in variables and (node_marker is None or node_marker in variables):
            out.append(int(entry.name))
    return out


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_lab_processes(lab_dir: Path | str, timeout: float = STOP_TIMEOUT_S) -> int:
    """Kill every process of the lab's nodes (SIGTERM, then SIGKILL); the number found. LabError if some stay."""
    found = set(find_lab_processes(lab_dir))
    if not found:
        return 0
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    term_until = time.monotonic() + KILL_GRACE_S
    while True:
        time.sleep(0.05)
        left = find_lab_processes(lab_dir)
        found.update(left)
        if not left:
            return len(found)
        if time.monotonic() > deadline:
            raise LabError(f"lab processes still running after {timeout:g}s: {' '.join(map(str, sorted(left)))}")
        if time.monotonic() > term_until:
            _signal_all(left, signal.SIGKILL)


class PidLock:
    """fcntl.flock on lab.lock, holding the owner's pid: one lab server per lab folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self.owner()
            who = f" (pid {owner})" if owner else ""
            raise LabError(f"{self.path.parent} is in use by another lab server{who}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def owner(self) -> int | None:
        """The pid written in the lock file, when some process holds the lock; else None."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 64).decode(errors="replace").strip()
                return int(text) if text.isdigit() else None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)


def _raise_nofile_limit() -> None:
    """256 nodes, their connections and sessions need more than the usual 1024 descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# -- one SSH session: a real local process behind a channel -----------------------------------------------

_PTY = -1  # the output "fd" of a pty session


def _signal_number(name: str) -> int | None:
    sig = getattr(signal, f"SIG{name}", None)
    return int(sig) if isinstance(sig, signal.Signals) else None


def _set_winsize(fd: int, size: tuple[int, int, int, int]) -> None:
    width, height, pixwidth, pixheight = size
    if width and height:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))


class _PtyOutput(asyncio.Protocol):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def data_received(self, data: bytes) -> None:
        self._child.output(data, stderr=False)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # EIO: every slave descriptor closed
        self._child.output_closed(_PTY)


class _PtyInput(asyncio.BaseProtocol):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def pause_writing(self) -> None:
        self._child.pause_writing()

    def resume_writing(self) -> None:
        self._child.resume_writing()


class _Child(asyncio.SubprocessProtocol):
    """The local process of one session: its output goes to the channel, its exit status back to the client.

    Finishes when the process has exited and its output is closed, or OUTPUT_GRACE_S after the exit when a
    background process still holds the output open.
    """

    def __init__(self, session: _Session, use_pty: bool) -> None:
        self._session = session
        self.use_pty = use_pty
        self.transport: asyncio.SubprocessTransport | None = None
        self.pid: int | None = None
        self.exited = False
        self._outputs = {_PTY} if use_pty else {1, 2}
        self._grace: asyncio.TimerHandle | None = None
        self._pty_out: asyncio.ReadTransport | None = None
        self._pty_in: asyncio.WriteTransport | None = None
        self.done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, size: tuple[int, int, int, int]
    ) -> None:
        loop = asyncio.get_running_loop()
        if not self.use_pty:
            pipe = asyncio.subprocess.PIPE
            await loop.subprocess_exec(
                lambda: self,
                *argv,
                stdin=pipe,
                stdout=pipe,
                stderr=pipe,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
            return
        master, slave = pty.openpty()
        try:
            _set_winsize(slave, size)
            argv = [sys.executable, "-I", "-S", "-c", _CTTY_EXEC, *argv]
            await loop.subprocess_exec(
                lambda: self,
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        # the transports own these files and close them
        writer = open(os.dup(master), "wb", buffering=0)  # noqa: SIM115
        self._pty_in, _ = await loop.connect_write_pipe(lambda: _PtyInput(self), writer)
        reader = open(master, "rb", buffering=0)  # noqa: SIM115
        self._pty_out, _ = await loop.connect_read_pipe(lambda: _PtyOutput(self), reader)

    # subprocess protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport
        self.pid = transport.get_pid()
        self._session.node.track(self)

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.output(data if isinstance(data, bytes) else data.encode(), stderr=fd == 2)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in (1, 2):
            self.output_closed(fd)

    def process_exited(self) -> None:
        self.exited = True
        if not self._outputs:
            self._finish()
        else:
            self._grace = asyncio.get_running_loop().call_later(OUTPUT_GRACE_S, self._output_timeout)

    def pause_writing(self) -> None:  # the process reads its stdin slower than the client sends
        self._session.pause_input()

    def resume_writing(self) -> None:
        self._session.resume_input()

    # output
    def output(self, data: bytes, *, stderr: bool) -> None:
        self._session.send(data, stderr=stderr)

    def output_closed(self, fd: int) -> None:
        self._outputs.discard(fd)
        if self.exited and not self._outputs:
            self._finish()

    def pause_output(self) -> None:
        for pipe in self._output_pipes():
            pipe.pause_reading()

    def resume_output(self) -> None:
        for pipe in self._output_pipes():
            pipe.resume_reading()

    def _output_pipes(self) -> list[asyncio.ReadTransport]:
        if self._pty_out is not None:
            return [self._pty_out] if not self._pty_out.is_closing() else []
        if self.transport is None:
            return []
        pipes = (self.transport.get_pipe_transport(fd) for fd in (1, 2))
        return [p for p in pipes if isinstance(p, asyncio.ReadTransport) and not p.is_closing()]

    def _output_timeout(self) -> None:
        name, grace = self._session.node.name, OUTPUT_GRACE_S
        log.warning("%s: output of pid %s still open %gs after it exited; closing the session", name, self.pid, grace)
        self._finish()

    # input and control
    def _stdin(self) -> asyncio.WriteTransport | None:
        pipe = self._pty_in if self.use_pty else (self.transport.get_pipe_transport(0) if self.transport else None)
        return pipe if isinstance(pipe, asyncio.WriteTransport) and not pipe.is_closing() else None

    def write(self, data: bytes) -> None:
        pipe = self._stdin()
        if pipe is not None:
            pipe.write(data)

    def write_eof(self) -> None:
        pipe = self._stdin()
        if pipe is not None and not self.use_pty and pipe.can_write_eof():
            pipe.write_eof()

    def resize(self, size: tuple[int, int, int, int]) -> None:
        if self._pty_in is not None and not self._pty_in.is_closing():
            _set_winsize(self._pty_in.get_extra_info("pipe").fileno(), size)

    def signal_group(self, sig: int) -> None:
        """Signal the command's process group (not processes that detached into their own session)."""
        if self.pid is not None and not self.exited:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    # the end
    def _finish(self) -> None:
        if self.done.done():
            return
        returncode = self.transport.get_returncode() if self.transport else None
        self.done.set_result(returncode)
        self._session.exited(returncode)
        self.close()

    def close(self) -> None:
        """Close every transport (a running process gets SIGKILL from asyncio: only at lab shutdown)."""
        if not self.done.done():
            self.done.set_result(None)
        if self._grace is not None:
            self._grace.cancel()
        for transport in (self._pty_out, self._pty_in, self.transport):
            if transport is not None and not transport.is_closing():
                transport.close()
        self._session.node.untrack(self)


class _Session(asyncssh.SSHServerSession[bytes]):
    """One session channel of a lab node; the process behind it is a `_Child`."""

    def __init__(self, node: LabNode, conn: asyncssh.SSHServerConnection) -> None:
        self.node = node
        self._conn = conn
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._child: _Child | None = None
        self._pending: list[bytes] = []
        self._eof = False
        self._closed = False

    # what the client may ask for
    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def session_started(self) -> None:
        self.node.start_task(self._start())

    async def _start(self) -> None:
        chan = self._chan
        assert chan is not None
        command, term = chan.get_command(), chan.get_terminal_type()
        argv = [SHELL, "-c", command] if command is not None else [SHELL, "-i"] if term else [SHELL]
        if self._closed:
            return  # the client went away before the command started
        child = _Child(self, use_pty=term is not None)
        try:
            await child.start(argv, self._env(term), self.node.home, chan.get_terminal_size())
        except OSError as exc:
            child.close()
            self._fail(f"lab node {self.node.name}: cannot start {SHELL}: {exc.strerror or exc}", 127)
            return
        except Exception as exc:
            log.exception("%s: cannot start a session", self.node.name)
            child.close()
            self._fail(f"lab node {self.node.name}: cannot start {SHELL}: {exc}", 255)
            return
        self._child = child
        for data in self._pending:
            child.write(data)
        self._pending.clear()
        if self._eof:
            child.write_eof()
        if self._closed:
            child.signal_group(signal.SIGHUP)

    def _env(self, term: str | None) -> dict[str, str]:
        env = self.node.session_env(self._chan.get_environment() if self._chan else {})
        peer = self._conn.get_extra_info("peername") or ("", 0)
        local = self._conn.get_extra_info("sockname") or ("", 0)
        env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {local[1]}"
        env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {local[0]} {local[1]}"
        if term:
            env["TERM"] = term
        return env

    def _fail(self, message: str, status: int) -> None:
        if self._chan is not None and not self._chan.is_closing():
            with contextlib.suppress(OSError):
                self._chan.write_stderr(f"{message}\n".encode())
            self._chan.exit(status)

    # data from the client
    def data_received(self, data: bytes, datatype: int | None) -> None:
        if self._child is not None:
            self._child.write(data)
        else:
            self._pending.append(data)

    def eof_received(self) -> bool:
        if self._child is not None:
            self._child.write_eof()
        else:
            self._eof = True
        return True  # stay half open: the output still flows

    def signal_received(self, signal: str) -> None:
        sig = _signal_number(signal)
        if self._child is not None and sig is not None:
            self._child.signal_group(sig)

    def break_received(self, msec: int) -> bool:
        if self._child is not None:
            self._child.signal_group(signal.SIGINT)
        return True

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self._child is not None:
            self._child.resize((width, height, pixwidth, pixheight))

    def connection_lost(self, exc: Exception | None) -> None:
        """The channel closed (the client went away): hang up on a command that still runs."""
        self._closed = True
        if self._child is not None:
            self._child.signal_group(signal.SIGHUP)

    # flow control
    def pause_writing(self) -> None:
        if self._child is not None:
            self._child.pause_output()

    def resume_writing(self) -> None:
        if self._child is not None:
            self._child.resume_output()

    def pause_input(self) -> None:
        if self._chan is not None and not self._closed:
            self._chan.pause_reading()

    def resume_input(self) -> None:
        # Not from inside the pipe's callback: resuming delivers the channel's buffered data (and EOF) at once,
        # which asyncio's pipe transport does not expect while it is finishing a write.
        asyncio.get_running_loop().call_soon(self._resume_input)

    def _resume_input(self) -> None:
        if self._chan is not None and not self._closed and not self._chan.is_closing():
            self._chan.resume_reading()

    # output and exit status to the client
    def send(self, data: bytes, *, stderr: bool) -> None:
        if self._chan is None or self._closed or self._chan.is_closing():
            return
        with contextlib.suppress(OSError):
            self._chan.write(data, asyncssh.EXTENDED_DATA_STDERR if stderr else None)

    def exited(self, returncode: int | None) -> None:
        chan = self._chan
        if chan is None or self._closed or chan.is_closing():
            return
        if returncode is None:
            chan.exit(255)
        elif returncode >= 0:
            chan.exit(returncode)
        else:
            try:
                chan.exit_with_signal(signal.Signals(-returncode).name.removeprefix("SIG"))
            except ValueError:
                chan.exit(128 - returncode)


class _NodeServer(asyncssh.SSHServer):
    """asyncssh's per-connection server object: tracks connections and opens sessions."""

    def __init__(self, node: LabNode) -> None:
        self._node = node
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._node.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._node.connections.discard(self._conn)

    def session_requested(self) -> _Session | bool:
        if self._node.stopping or self._conn is None:
            return False
        return _Session(self._node, self._conn)


# -- nodes and the cluster --------------------------------------------------------------------------------


class LabNode:
    """One lab node: a folder, a host key, simulated GPUs and an SSH server on its own port."""

    def __init__(self, spec: NodeSpec, paths: LabPaths, driver_version: str = DEFAULT_DRIVER_VERSION) -> None:
        self.spec = spec
        self.name = spec.name
        self.host = LAB_HOST
        self.port = 0
        self.dir = paths.node_dir(spec.name)
        self.home = self.dir / "home"
        self.gpus_path = self.dir / "gpus.json"
        self.host_key_path = self.dir / "host_key"
        self.driver_version = driver_version
        self.stopping = False
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._children: set[_Child] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._host_key: asyncssh.SSHKey | None = None
        self._env = {
            **{k: os.environ[k] for k in _INHERITED_ENV if k in os.environ},
            "USER": local_user(),
            "LOGNAME": local_user(),
            "HOME": str(self.home),
            "FTCONSOLE_SIM_GPUS": str(self.gpus_path),
            "FTCONSOLE_LAB_NODE": spec.name,
            "FTCONSOLE_LAB_ROOT": str(paths.root),
        }
        self._env.setdefault("PATH", os.defpath)

    @property
    def host_key(self) -> asyncssh.SSHKey:
        assert self._host_key is not None, "prepare() first"
        return self._host_key

    def prepare(self) -> None:
        """Create the folders, load (or create) the host key and write gpus.json from the layout."""
        (self.home / "cache").mkdir(parents=True, exist_ok=True)
        self._host_key = _load_or_create_key(self.host_key_path)
        self.write_gpus(render_gpus(self.spec, self.driver_version))

    async def start(self, authorized: asyncssh.SSHAuthorizedKeys, port: int = 0) -> None:
        self._acceptor = await asyncssh.listen(
            host=self.host,
            port=port,
            server_host_keys=[self.host_key],
            authorized_client_keys=authorized,
            server_factory=lambda: _NodeServer(self),
            encoding=None,
            agent_forwarding=False,
            allow_scp=False,
            gss_host=None,
            login_timeout=30,
            line_editor=False,  # a pty session gets a real pty, which edits lines itself
        )
        self.port = self._acceptor.get_port()

    @property
    def listening(self) -> bool:
        return self._acceptor is not None

    def session_env(self, client_env: Mapping[str, str]) -> dict[str, str]:
        """The environment of a session: the node's, plus what the client sent (never HOME or the lab's)."""
        env = dict(self._env)
        env.update((k, v) for k, v in client_env.items() if k not in _PROTECTED_ENV)
        return env

    # simulated GPUs: tests and the demo may change them while the lab runs
    def gpus(self) -> dict[str, Any]:
        return json.loads(self.gpus_path.read_text())

    def write_gpus(self, data: Mapping[str, Any]) -> None:
        _write_atomic(self.gpus_path, json.dumps(data, indent=1) + "\n")

    def update_gpu(self, index: int, **fields: Any) -> None:
        """Change fields of one GPU in gpus.json, e.g. ``update_gpu(2, ecc_uncorrectable=4)``."""
        data = self.gpus()
        data["gpus"][index].update(fields)
        self.write_gpus(data)

    # sessions and their processes
    def start_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def track(self, child: _Child) -> None:
        self._children.add(child)

    def untrack(self, child: _Child) -> None:
        self._children.discard(child)

    @property
    def processes(self) -> list[int]:
        """Pids of the commands of this node's sessions that are still running."""
        return [c.pid for c in self._children if c.pid is not None and not c.exited]

    def signal_sessions(self, sig: int) -> None:
        for child in list(self._children):
            child.signal_group(sig)

    async def close_listener(self) -> None:
        self.stopping = True
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_sessions(self, timeout: float) -> None:
        pending = [c.done for c in self._children if not c.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for child in list(self._children):
            child.close()

    async def close_connections(self, timeout: float) -> None:
        conns = list(self.connections)
        for conn in conns:
            conn.close()
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


class LabCluster:
    """The lab in this process: ``async with LabCluster(lab_dir, layout, nodes=N) as lab: ...``.

    `layout` is a LabLayout, a layout file, or None for the default (config/lab.yaml or the built-in one);
    `nodes` replaces the layout's nodes by N nodes named lab01.. in the layout's proportions.
    """

    def __init__(
        self, lab_dir: Path | str | None = None, layout: LabLayout | Path | str | None = None, nodes: int | None = None
    ) -> None:
        self.paths = LabPaths.of(lab_dir)
        self.layout_path = (
            None if isinstance(layout, LabLayout) else (Path(layout) if layout else default_layout_path())
        )
        self.layout = layout if isinstance(layout, LabLayout) else load_layout(self.layout_path)
        self.nodes = tuple(
            LabNode(spec, self.paths, self.layout.driver_version) for spec in plan_nodes(self.layout, nodes)
        )
        self.started = ""
        self.user = local_user()
        self._lock = PidLock(self.paths.lock)
        self._authorized: asyncssh.SSHAuthorizedKeys | None = None
        self._running = False

    async def __aenter__(self) -> LabCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def lab_dir(self) -> Path:
        return self.paths.root

    @property
    def config_path(self) -> Path:
        return self.paths.cluster_config

    def node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError(f"no node {name} in the lab")

    async def start(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock.acquire()
        try:
            _raise_nofile_limit()
            self._authorized = authorized = self._prepare()
            await self._listen(authorized)
            self._write_client_files()
        except BaseException:
            await self._shutdown()
            self._lock.release()
            raise
        self.started = datetime.now(UTC).isoformat(timespec="seconds")
        self._running = True
        log.info("lab up: %d nodes in %s", len(self.nodes), self.lab_dir)

    def _prepare(self) -> asyncssh.SSHAuthorizedKeys:
        self.paths.state_dir.mkdir(exist_ok=True)
        pub = self.paths.client_key.with_name("id_ed25519.pub")
        client = _load_or_create_key(self.paths.client_key, public=pub)
        if not pub.is_file() or pub.read_text().split()[:2] != _public_line(client).split():
            _write_atomic(pub, _public_line(client) + " ftconsole-lab\n")
        for node in self.nodes:
            node.prepare()
        return asyncssh.import_authorized_keys(_public_line(client) + "\n")

    def _wanted_ports(self) -> list[int]:
        if self.layout.base_port is not None:
            last = self.layout.base_port + len(self.nodes) - 1
            if last > 65535:
                raise LabError(f"base_port {self.layout.base_port} + {len(self.nodes)} nodes passes port 65535")
            return [self.layout.base_port + i for i in range(len(self.nodes))]
        try:
            previous = json.loads(self.paths.ports.read_text())
        except (OSError, ValueError):
            previous = {}
        return [int(previous.get(n.name, 0)) if isinstance(previous, dict) else 0 for n in self.nodes]

    async def _listen(self, authorized: asyncssh.SSHAuthorizedKeys) -> None:
        fixed = self.layout.base_port is not None

        async def one(node: LabNode, port: int) -> None:
            try:
                await node.start(authorized, port)
            except OSError as exc:
                if fixed or port == 0:
                    raise LabError(f"{node.name}: cannot listen on {LAB_HOST}:{port}: {exc.strerror or exc}") from exc
                await node.start(authorized, 0)  # the previous port is taken now

        results = await asyncio.gather(
            *(one(n, p) for n, p in zip(self.nodes, self._wanted_ports(), strict=True)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    def _write_client_files(self) -> None:
        lines = [f"[{n.host}]:{n.port} {_public_line(n.host_key)}" for n in self.nodes]
        _write_atomic(self.paths.known_hosts, "\n".join(lines) + "\n")
        _write_atomic(self.paths.ports, json.dumps({n.name: n.port for n in self.nodes}) + "\n")
        config = render_cluster_config(self.layout, [(n.spec, n.port) for n in self.nodes], self.paths, self.user)
        check_cluster_config(config, str(self.paths.cluster_config))
        header = (
            "# The ftconsole lab cluster: generated by `ftconsole lab up` (ftconsole/lab.py) from the lab layout\n"
            f"# {self.layout_path or '<built-in lab layout>'}; rewritten at every start of the lab.\n"
        )
        _write_atomic(self.paths.cluster_config, header + yaml.safe_dump(config, sort_keys=False, width=110))

    async def stop(self) -> None:
        """Stop listening, kill every process of every node, close the connections, release the lock."""
        if not self._running:
            return
        self._running = False
        try:
            await self._shutdown()
        finally:
            self._lock.release()
            log.info("lab stopped")

    async def _shutdown(self) -> None:
        await asyncio.gather(*(n.close_listener() for n in self.nodes))
        await self._kill_processes()
        await asyncio.gather(*(n.wait_sessions(2.0) for n in self.nodes))
        await asyncio.gather(*(n.close_connections(2.0) for n in self.nodes))

    async def _kill_processes(self, node: LabNode | None = None) -> None:
        """SIGTERM the sessions' process groups and every process of the lab (or of one node); then SIGKILL."""
        nodes = [node] if node is not None else list(self.nodes)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        term_until = time.monotonic() + KILL_GRACE_S
        sig = signal.SIGTERM
        while True:
            for n in nodes:
                n.signal_sessions(sig)
            found = find_lab_processes(self.lab_dir, node.name if node is not None else None)
            _signal_all(found, sig)
            if not found and not any(n.processes for n in nodes):
                return
            if time.monotonic() > deadline:
                log.warning("lab processes still running after %gs: %s", STOP_TIMEOUT_S, found)
                return
            if time.monotonic() > term_until:
                sig = signal.SIGKILL
            await asyncio.sleep(0.05)

    async def stop_node(self, name: str, *, kill: bool = False) -> None:
        """Take one node off the network: its SSH server stops and its connections drop.

        Commands of open sessions get SIGHUP; detached processes (run supervisors) keep running, as on a node
        that became unreachable. With kill=True every process of the node is killed too (a crashed node).
        """
        node = self.node(name)
        await node.close_listener()
        await node.close_connections(2.0)
        if kill:
            await self._kill_processes(node)
            await node.wait_sessions(2.0)

    async def start_node(self, name: str) -> None:
        """Bring a stopped node back on its port, with its host key."""
        node = self.node(name)
        if node.listening:
            return
        assert self._authorized is not None, "start() first"
        node.stopping = False
        try:
            await node.start(self._authorized, node.port)
        except OSError as exc:
            raise LabError(f"{name}: cannot listen on {node.host}:{node.port} again: {exc.strerror or exc}") from exc

    def info(self) -> LabInfo:
        nodes = tuple(
            LabNodeInfo(n.name, n.host, n.port, n.spec.pool, n.spec.gpus, n.spec.gpu_model, up=n.listening)
            for n in self.nodes
        )
        layout = str(self.layout_path) if self.layout_path else None
        return LabInfo(self.lab_dir, os.getpid(), self.started, nodes, layout)

    def connect_options(self, name: str) -> dict[str, Any]:
        """Keyword arguments for asyncssh.connect to one node, verifying its host key."""
        node = self.node(name)
        return {
            "host": node.host,
            "port": node.port,
            "username": self.user,
            "known_hosts": str(self.paths.known_hosts),
            "client_keys": [str(self.paths.client_key)],
            "agent_path": None,
            "config": [],
        }


# -- the background server --------------------------------------------------------------------------------


def _read_info(paths: LabPaths) -> LabInfo | None:
    try:
        return LabInfo.from_json(json.loads(paths.info.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"{paths.info} is unreadable: {exc}") from exc


def _is_lab_server(pid: int) -> bool:
    return pid_alive(pid) and (b"ftconsole.lab" in _cmdline(pid) or not Path("/proc/self").exists())


def _port_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """The port accepts TCP and sends an SSH banner (so its event loop is alive)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _check_ports(nodes: Sequence[LabNodeInfo]) -> tuple[LabNodeInfo, ...]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes)))) as pool:
        ups = list(pool.map(lambda n: _port_answers(n.host, n.port), nodes))
    return tuple(replace(n, up=up) for n, up in zip(nodes, ups, strict=True))


def lab_status(lab_dir: Path | str | None = None) -> LabInfo | None:
    """The running background lab (each node's `up`: its port answers with an SSH banner), or None."""
    paths = LabPaths.of(lab_dir)
    info = _read_info(paths)
    if info is None or not _is_lab_server(info.pid):
        return None
    return replace(info, nodes=_check_ports(info.nodes))


def _log_tail(path: Path, offset: int, lines: int = 12) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) if tail else "(log is empty)"


def _spawn_server(paths: LabPaths, layout_path: Path | None, nodes: int | None) -> int:
    """Start `python -m ftconsole.lab serve` detached (new session), its output appended to lab.log."""
    argv = [sys.executable, "-P", "-m", "ftconsole.lab", "serve", "--dir", str(paths.root)]
    if layout_path is not None:
        argv += ["--layout", str(layout_path)]
    if nodes is not None:
        argv += ["--nodes", str(nodes)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
    log_fd = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_pid(pid: int, timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL and wait a little more."""
    _signal_all([pid], signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        _signal_all([pid], signal.SIGKILL)
        if not _wait_gone(pid, 5.0):
            raise LabError(f"lab server pid {pid} does not stop")


def lab_up(
    lab_dir: Path | str | None = None,
    layout_path: Path | str | None = None,
    nodes: int | None = None,
    timeout: float = 30.0,
) -> LabInfo:
    """Start the lab in the background (idempotent) and return it once every node answers."""
    paths = LabPaths.of(lab_dir)
    running = lab_status(paths.root)
    if running is not None:
        if nodes is not None and nodes != len(running.nodes):
            raise LabError(
                f"the lab in {paths.root} runs {len(running.nodes)} nodes, not {nodes}; "
                "stop it first (ftconsole lab down)"
            )
        return running
    layout = Path(layout_path).expanduser().resolve() if layout_path is not None else default_layout_path()
    plan_nodes(load_layout(layout), nodes)  # bad layouts and node counts fail here, naming file and line
    paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths.info.unlink(missing_ok=True)  # stale: its server is gone
    offset = paths.log.stat().st_size if paths.log.exists() else 0
    pid = _spawn_server(paths, layout, nodes)
    try:
        return _wait_started(paths, pid, offset, timeout)
    except BaseException:
        with contextlib.suppress(LabError):
            _stop_pid(pid, 5.0)
        with contextlib.suppress(LabError):
            kill_lab_processes(paths.root)
        raise


def _wait_started(paths: LabPaths, pid: int, log_offset: int, timeout: float) -> LabInfo:
    deadline = time.monotonic() + timeout
    while True:
        if not pid_alive(pid):
            tail = _log_tail(paths.log, log_offset)
            raise LabError(f"lab server exited during start-up; see {paths.log}:\n{tail}")
        with contextlib.suppress(LabError):
            info = _read_info(paths)
            if info is not None and info.pid == pid:
                checked = replace(info, nodes=_check_ports(info.nodes))
                if checked.all_up:
                    return checked
        if time.monotonic() > deadline:
            tail = _log_tail(paths.log, log_offset)
            raise LabError(f"lab server did not start within {timeout:g}s; see {paths.log}:\n{tail}")
        time.sleep(0.05)


def lab_down(lab_dir: Path | str | None = None, timeout: float = 10.0) -> bool:
    """Stop the background lab and make sure no process of its nodes is left; whether anything ran."""
    paths = LabPaths.of(lab_dir)
    try:
        info = _read_info(paths)
    except LabError:
        info = None
    pid = info.pid if info is not None else PidLock(paths.lock).owner()
    if pid == os.getpid():
        raise LabError("this process serves the lab itself; stop its LabCluster instead")
    ran = False
    if pid is not None and _is_lab_server(pid):
        ran = True
        _stop_pid(pid, timeout)
    ran = kill_lab_processes(paths.root, timeout) > 0 or ran
    paths.info.unlink(missing_ok=True)
    return ran


async def serve(lab_dir: Path | str | None, layout: Path | str | None, nodes: int | None) -> None:
    """Run the lab until SIGTERM or SIGINT, with lab.json written while it serves."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set if sig != signal.SIGHUP else (lambda: None))
    try:
        async with LabCluster(lab_dir, layout, nodes) as lab:
            data = lab.info().to_json()
            _write_atomic(lab.paths.info, json.dumps(data, indent=1) + "\n")
            log.info("serving %d nodes (pid %d); config %s", len(lab.nodes), os.getpid(), lab.config_path)
            try:
                await stop.wait()
            finally:
                lab.paths.info.unlink(missing_ok=True)
                log.info("stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


# -- command line: python -m ftconsole.lab serve|up|down|status -------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ftconsole.lab", description="the ftconsole lab cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("serve", "up", "down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", help="lab folder (default: $FTCONSOLE_LAB_DIR or ~/.local/state/ftconsole/lab)")
        if name in ("serve", "up"):
            p.add_argument("--layout", help="lab layout file (default: config/lab.yaml)")
            p.add_argument("--nodes", type=int, help="N nodes named lab01.. instead of the layout's")
        if name in ("up", "status"):
            p.add_argument("--json", action="store_true")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        root = LabPaths.of(args.dir).root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chdir(root)
        asyncio.run(serve(root, args.layout, args.nodes))
        return 0
    if args.command == "down":
        print("lab stopped" if lab_down(args.dir) else "lab was not running")
        return 0
    info = lab_up(args.dir, args.layout, args.nodes) if args.command == "up" else lab_status(args.dir)
    if args.json:
        print(json.dumps(info.to_json() if info else {"running": False}, indent=1))
    elif info is None:
        print("lab is not running")
    else:
        print(f"lab running: pid {info.pid}, {len(info.nodes)} nodes, config {info.config_path}")
        for n in info.nodes:
            print(f"  {n.name:<8} {n.host}:{n.port:<6} {n.pool:<8} {'up' if n.up else 'DOWN'}")
    return 0 if info is not None else 3


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    try:
        return _run(args)
    except FtError as exc:
        print(f"{exc.title}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
