"""A cluster of real OpenSSH sshd processes on loopback addresses, for integration tests.

Node i (1-based) is named ``nodeNN``, listens on 127.0.0.(10+i) and a free high port (kept across restarts),
and has its own ed25519 host key, sshd_config, log, home folder and simulated-GPU file; with
``shared_home=True`` every node has the same home folder, ``<root>/home`` (an NFS ``/home``, as on most real
clusters; the nodes share a kernel too, as containers on one host do). One client key in
``root`` is authorized on every node and ``root/known_hosts`` holds every node's host key.

Every SSH session on a node gets, through ``SetEnv`` in that node's sshd_config::

    HOME=<root>/nodes/nodeNN/home      (shared_home: <root>/home)
    FTCONSOLE_SIM_GPUS=<root>/nodes/nodeNN/gpus.json
    FTCONSOLE_LAB_NODE=nodeNN
    FTCONSOLE_LAB_ROOT=<root>
    PATH=<root>/nodes/nodeNN/bin:<the usual PATH>   (the node's own tools: a test writes them there)

(``SetEnv`` is applied after sshd sets HOME from the password database, so it overrides it; the session's
working directory is still the account's real home, as sshd ``chdir``s to ``pw_dir`` -- use ``$HOME``.)
The last two variables let ``down()`` find and kill every process started through a node, detached or not.

Works as root and as an ordinary user (then sshd can only log in that same user; ports are high anyway and
``UsePAM no`` needs no privilege). Every wait has a timeout.

    with SshdCluster(tmp_path, 3, gpus=8) as cluster:
        cluster.write_config(tmp_path / "cluster.yaml")
        cluster.down("node02")
        cluster.run("node01", ["sh", "-c", "echo $HOME"])

Or, in a test, the ``sshd_cluster`` fixture (``tests/conftest.py`` imports ``sshd_cluster_fixture``)::

    @pytest.mark.sshd
    def test_x(sshd_cluster):
        cluster = sshd_cluster(count=2, gpus=4)
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftconsole.lab import deep_merge
from tests.netns import Fabric

SSHD = "/usr/sbin/sshd"
SSHD_MISSING = "OpenSSH sshd not installed (/usr/sbin/sshd); apt-get install openssh-server"
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81559
DRIVER_VERSION = "550.54.15"

START_TIMEOUT = 10.0  # sshd up and answering with its banner
STOP_TIMEOUT = 5.0  # a terminated process gone, a port closed
KEYGEN_TIMEOUT = 30.0
RUN_TIMEOUT = 30.0
NETNS_PORT = 2222  # each node's sshd port in its own network namespace
# the two layouts of the nodes' homes a test may run in: each node with its own, or one shared by every node
HOME_LAYOUTS = ("own-home", "shared-home")


class SshdClusterError(RuntimeError):
    """An sshd did not start or stop as expected; the message carries its log."""


def sshd_available() -> bool:
    """True where an OpenSSH server and ssh-keygen are installed, so the cluster can start."""
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None and shutil.which("ssh") is not None


def pci_bus_id(node: SshdNode, index: int) -> str:
    """The PCI address of GPU `index` of `node`, as NVML writes it: the node's number is its PCI domain, so that no
    two test nodes' GPUs share one (the nodes share one kernel log, where the driver's Xids name a GPU by it)."""
    return f"{int(node.name.removeprefix('node')):08x}:{0x18 + index:02x}:00.0"


def gpu_data(count: int, *, driver_version: str = DRIVER_VERSION, **fields: Any) -> dict[str, Any]:
    """The simulated-GPU file content of DESIGN.md ("Simulated GPUs"): `count` healthy, idle H100s.

    Keyword arguments override the fields of every GPU (e.g. ``temperature=90``).
    """
    gpus = []
    for index in range(count):
        gpu = {
            "index": index,
            "name": GPU_NAME,
            "memory_total_mib": GPU_MEMORY_MIB,
            "utilization": 0,
            "temperature": 35,
            "ecc_uncorrectable": 0,
            "healthy": True,
        }
        gpu.update(fields)
        gpus.append(gpu)
    return {"driver_version": driver_version, "gpus": gpus}


# sshd's own PATH for a session (Debian's, root's), after the node's bin folder
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


# -- /proc helpers ----------------------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process now."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) >= 2:
            table[int(entry.name)] = (int(rest[1]), rest[0].decode())
    return table


def pid_alive(pid: int) -> bool:
    """Running or stopped, not gone and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[:1] not in ([b"Z"], [b"X"])


def lab_processes(root: Path | str) -> dict[int, list[bytes]]:
    """The processes still alive that were started through a node of the test cluster at `root` (its sshd's
    SetEnv marks them with FTCONSOLE_LAB_ROOT): pid -> argv."""
    mark = f"FTCONSOLE_LAB_ROOT={root}".encode()
    found: dict[int, list[bytes]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or not pid_alive(int(entry.name)):
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                found[int(entry.name)] = f.read().split(b"\0")
        except OSError:
            continue
    return found


def _descendants(roots: set[int], table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = [p for p in roots if p in table]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def _environ_matches(marks: set[bytes], table: dict[int, tuple[int, str]]) -> set[int]:
    """Processes whose initial environment holds every one of `marks` (b"NAME=value").

    Only the current user's processes are readable unless we are root; the others are skipped.
    """
    out = set()
    for pid, (_ppid, state) in table.items():
        if state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if marks <= env:
            out.add(pid)
    return out


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever their environment says."""
    table = _proc_table()
    out = set()
    pid = os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        pid = table.get(pid, (0, ""))[0]
    return out


def _comm(pid: int) -> str:
    """The process's command name ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if pid_alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = {p for p in left if pid_alive(p)}
    return left


# -- sockets ----------------------------------------------------------------------------------------------


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _banner(address: str, port: int, timeout: float) -> bytes | None:
    """The first bytes an SSH server sends on (address, port), or None if it refuses or says nothing."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64)
    except OSError:
        return None


def _port_open(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _keygen(path: Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=KEYGEN_TIMEOUT,
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _quote(value: str | Path) -> str:
    """A value for sshd_config: double-quoted (sshd splits arguments on spaces outside quotes)."""
    text = str(value)
    if '"' in text or "\n" in text:
        raise ValueError(f"cannot put {text!r} in an sshd_config")
    return f'"{text}"'


# -- the cluster ------------------------------------------------------------------------------------------


@dataclass
class SshdNode:
    """One node: a fixed address and port, its files under ``<root>/nodes/<name>``, and its sshd."""

    name: str
    address: str
    port: int
    dir: Path
    shared_home: Path | None = None  # the home every node shares (SshdCluster's shared_home), else its own
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    stopped: bool = False  # SIGSTOPped by hang()
    frozen: set[int] = field(default_factory=set, repr=False)  # processes SIGSTOPped by hang(sessions=True)

    @property
    def home(self) -> Path:
        return self.shared_home or self.dir / "home"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def bin_dir(self) -> Path:
        """First on the PATH of the node's sessions (empty: a test puts the node's own tools there)."""
        return self.dir / "bin"

    @property
    def gpus_file(self) -> Path:
        return self.dir / "gpus.json"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def stderr_log(self) -> Path:
        return self.dir / "sshd.stderr"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def host_key_line(self) -> str:
        """This node's known_hosts line, current host key: ``[127.0.0.X]:PORT ssh-ed25519 AAAA...``."""
        kind, blob = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {blob}"

    def logs(self) -> str:
        parts = []
        for p in (self.log, self.stderr_log):
            with contextlib.suppress(OSError):
                text = p.read_text(errors="replace").strip()
                if text:
                    parts.append(f"--- {p.name} ---\n{text}")
        return "\n".join(parts) or "(sshd logged nothing)"


class SshdCluster:
    """`count` real sshd processes on 127.0.0.11, 127.0.0.12, ...; started by the constructor.

    `gpus` is the number of simulated GPUs of every node, or a list with one number per node. With
    `shared_home`, every node's HOME is the same folder (`homes` lists each home once).
    """

    def __init__(
        self, root: Path, count: int, gpus: Sequence[int] | int = 8, *, shared_home: bool = False, netns: bool = False
    ) -> None:
        if not sshd_available():
            raise SshdClusterError(SSHD_MISSING)
        if not 1 <= count <= 200:
            raise ValueError("count must be between 1 and 200 (addresses 127.0.0.11 to 127.0.0.210)")
        per_node = [gpus] * count if isinstance(gpus, int) else list(gpus)
        if len(per_node) != count:
            raise ValueError(f"gpus lists {len(per_node)} node(s) but count is {count}")
        self.root = Path(root).resolve()
        self.user = current_user()
        self.guests: list[str] = []  # other accounts let in with their own keys (`admit`)
        self.key = self.root / "client_key"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.state_dir = self.root / "state"
        self.shared_home = self.root / "home" if shared_home else None
        self.nodes: list[SshdNode] = []
        self._closed = False
        # with netns, each node in a network namespace of its own behind a bridge (tests/netns.py): its link can
        # be shaped (`fabric.shape`)
        self.fabric: Fabric | None = None
        try:
            if netns:
                self.fabric = Fabric()
            self._setup(per_node)
            for node in self.nodes:
                self._spawn(node)
            for node in self.nodes:
                self._await_first_start(node)
            self.known_hosts.write_text("".join(n.host_key_line() + "\n" for n in self.nodes))
        except BaseException:
            self.stop()
            raise

    # -- setup ---------------------------------------------------------------------------------------------

    def _setup(self, per_node: list[int]) -> None:
        if os.geteuid() == 0:
            # sshd run as root wants its privilege separation folder; a clean machine may not have it
            # (systemd's tmpfiles usually create it at boot)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(exist_ok=True)
        if not self.key.exists():
            _keygen(self.key, f"ftconsole-test-client@{self.root}")
        pub = self.key.with_name(self.key.name + ".pub").read_text().strip()
        self.authorized_keys.write_text(pub + "\n")
        for i, gpu_count in enumerate(per_node, start=1):
            name = f"node{i:02d}"
            address = f"127.0.0.{10 + i}" if self.fabric is None else self.fabric.address(i)
            if self.fabric is not None:
                self.fabric.add(name, i)
            port = _free_port(address) if self.fabric is None else NETNS_PORT  # a namespace's ports are its own
            node = SshdNode(name=name, address=address, port=port, dir=self.root / "nodes" / name,
                            shared_home=self.shared_home)  # fmt: skip
            node.dir.mkdir(parents=True, exist_ok=True)
            node.cache_dir.mkdir(parents=True, exist_ok=True)
            _keygen(node.host_key, f"{name}@ftconsole-test")
            self._write_sshd_config(node)
            self.set_gpus(node, gpu_data(gpu_count))
            self.nodes.append(node)

    def _await_first_start(self, node: SshdNode, attempts: int = 3) -> None:
        """Wait for a new node; if another process took its port since we picked it, pick another one."""
        for attempt in range(attempts):
            try:
                self._await_ready(node)
                return
            except SshdClusterError:
                if attempt + 1 == attempts or node.running or "already in use" not in node.logs():
                    raise
            node.port = _free_port(node.address)
            self._write_sshd_config(node)
            node.log.unlink(missing_ok=True)
            self._spawn(node)

    def _write_sshd_config(self, node: SshdNode) -> None:
        lines = [
            f"ListenAddress {node.address}",
            f"Port {node.port}",
            f"HostKey {_quote(node.host_key)}",
            f"PidFile {_quote(node.pid_file)}",
            f"AuthorizedKeysFile {_quote(self.authorized_keys)}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {' '.join([self.user, *self.guests])}",
            "PermitUserRC no",
            "PermitUserEnvironment no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "UseDNS no",
            "LoginGraceTime 30",
            "MaxStartups 100:30:200",
            "MaxSessions 64",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
        ]
        lab = [
            ("FTCONSOLE_SIM_GPUS", node.gpus_file),
            ("FTCONSOLE_LAB_NODE", node.name),
            ("FTCONSOLE_LAB_ROOT", self.root),
        ]
        # SetEnv is applied after sshd sets HOME, USER, PATH..., so it overrides them
        ours = [("HOME", node.home), *lab, ("PATH", f"{node.bin_dir}:{SESSION_PATH}")]
        mine = "SetEnv " + " ".join(_quote(f"{k}={v}") for k, v in ours)
        if not self.guests:
            lines.append(mine)
        else:  # a guest's session is a plain login (its home, sshd's PATH), still told which node it is on
            # (and its own keys are in its home, as on a cluster's nodes: `admit`)
            lines += [f"Match User {self.user}", mine, f"Match User {','.join(self.guests)}",
                      "AuthorizedKeysFile .ssh/authorized_keys",
                      "SetEnv " + " ".join(_quote(f"{k}={v}") for k, v in lab)]  # fmt: skip
        node.sshd_config.write_text("\n".join(lines) + "\n")

    # -- lookup --------------------------------------------------------------------------------------------

    def node(self, node: str | SshdNode) -> SshdNode:
        if isinstance(node, SshdNode):
            return node
        for n in self.nodes:
            if n.name == node:
                return n
        raise KeyError(f"no node {node!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    __getitem__ = node

    def __iter__(self) -> Iterator[SshdNode]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def homes(self) -> list[Path]:
        """Each home folder of the nodes once (one for all of them with shared_home)."""
        return sorted({n.home for n in self.nodes})

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    # -- sshd processes ------------------------------------------------------------------------------------

    def _spawn(self, node: SshdNode) -> None:
        if self._closed:
            raise SshdClusterError("the cluster is stopped")
        if node.running:
            return
        self._reap(node)
        node.pid_file.unlink(missing_ok=True)
        with open(node.stderr_log, "ab") as err:
            inside = self.fabric.exec(node.name) if self.fabric is not None else []
            node.proc = subprocess.Popen(
                [*inside, SSHD, "-D", "-f", str(node.sshd_config), "-E", str(node.log)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        node.stopped = False

    def _await_ready(self, node: SshdNode, timeout: float = START_TIMEOUT) -> None:
        """Until the node answers with an SSH banner; raise with its log if it exits or stays silent."""
        deadline = time.monotonic() + timeout
        while True:
            assert node.proc is not None
            if node.proc.poll() is not None:
                raise SshdClusterError(
                    f"sshd of {node.name} ({node.address}:{node.port}) exited with status "
                    f"{node.proc.returncode}:\n{node.logs()}"
                )
            banner = _banner(node.address, node.port, timeout=1.0)
            if banner and banner.startswith(b"SSH-"):
                return
            if time.monotonic() >= deadline:
                raise SshdClusterError(
                    f"sshd of {node.name} did not answer on {node.address}:{node.port} within {timeout:g}s"
                    f" (got {banner!r}):\n{node.logs()}"
                )
            time.sleep(0.02)

    def _reap(self, node: SshdNode, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the listener (not the sessions it started) and wait for it; a no-op when there is none."""
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)  # a stopped process holds SIGTERM until continued
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        node.proc = None
        node.stopped = False
        node.frozen.clear()

    def _wait_port_closed(self, node: SshdNode, timeout: float = STOP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while _port_open(node.address, node.port, timeout=0.2):
            if time.monotonic() >= deadline:
                raise SshdClusterError(f"{node.address}:{node.port} of {node.name} still open after {timeout:g}s")
            time.sleep(0.02)

    def _node_processes(self, node: SshdNode) -> set[int]:
        """The listener, everything under it, and every process started in a session of this node."""
        table = _proc_table()
        roots = set()
        if node.proc is not None and node.proc.poll() is None:
            roots.add(node.proc.pid)
            # the listener's process group (start_new_session: its pgid is its pid)
            for pid in table:
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == node.proc.pid:
                        roots.add(pid)
        marks = {f"FTCONSOLE_LAB_NODE={node.name}".encode(), f"FTCONSOLE_LAB_ROOT={self.root}".encode()}
        pids = _descendants(roots, table) | _environ_matches(marks, table)
        pids |= _descendants(pids, table)
        return pids - _protected()

    def _stop_all(self, node: SshdNode, deadline: float) -> set[int]:
        """SIGSTOP every process of the node, scanning again until a scan finds no new one; return them.

        A process forked between a scan and its parent's SIGSTOP is caught by the next scan; once all parents
        are stopped nothing new appears.
        """
        seen: set[int] = set()
        while time.monotonic() < deadline:
            found = self._node_processes(node) - seen
            if not found:
                break
            _signal(found, signal.SIGSTOP)
            seen |= found
        return seen

    def _kill_node_processes(self, node: SshdNode, timeout: float = STOP_TIMEOUT) -> None:
        """SIGSTOP the whole tree (so nothing forks or reparents meanwhile), then SIGKILL it all.

        Per-connection sshd processes and sessions run in their own sessions (setsid), so the listener's
        process group alone is not enough; they are found as its descendants (before it dies, while their
        parent links still lead to it) and by their environment.
        """
        deadline = time.monotonic() + timeout
        seen = self._stop_all(node, deadline)
        _signal(seen, signal.SIGKILL)
        if node.proc is not None:
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise SshdClusterError(f"sshd of {node.name} survived SIGKILL for {timeout:g}s") from None
            node.proc = None
        node.stopped = False
        node.frozen.clear()
        # anything started between the scans and the kill
        late = self._node_processes(node)
        _signal(late, signal.SIGKILL)
        left = _wait_gone(seen | late, max(0.5, deadline - time.monotonic()))
        if left:
            raise SshdClusterError(f"processes of {node.name} still alive after SIGKILL: {sorted(left)}")

    # -- faults --------------------------------------------------------------------------------------------

    def hang(self, node: str | SshdNode, *, sessions: bool = False) -> None:
        """SIGSTOP the node's listener: TCP connects still succeed (kernel backlog) but no banner comes.

        Connections already open keep working (they are separate processes) unless `sessions` is true:
        then every process of the node is stopped too (its connections and what runs in them), as if the
        whole machine froze.
        """
        n = self.node(node)
        if not n.running:
            raise SshdClusterError(f"sshd of {n.name} is not running")
        assert n.proc is not None
        if sessions:
            n.frozen |= self._stop_all(n, time.monotonic() + STOP_TIMEOUT)
        n.proc.send_signal(signal.SIGSTOP)
        n.stopped = True

    def unhang(self, node: str | SshdNode) -> None:
        """Continue what hang() stopped."""
        n = self.node(node)
        _signal(n.frozen, signal.SIGCONT)
        n.frozen.clear()
        if n.proc is not None and n.proc.poll() is None:
            n.proc.send_signal(signal.SIGCONT)
        n.stopped = False

    def down(self, node: str | SshdNode) -> None:
        """Kill the node's sshd and every process started through it (detached too); wait for the port."""
        n = self.node(node)
        self._kill_node_processes(n)
        self._wait_port_closed(n)

    def cut(self, node: str | SshdNode) -> None:
        """Kill the node's sshd, its listener and every SSH session, but not what the sessions left running
        detached (the runs' supervisors and their processes): a node whose sshd died while its work goes on.
        Its connections are reset and new ones refused until `up`."""
        n = self.node(node)
        table = _proc_table()
        sessions = {pid for pid in self._node_processes(n) if _comm(pid) in ("sshd", "sshd-session", "sshd-auth")}
        self._reap(n)
        _signal(sessions, signal.SIGKILL)
        self._wait_port_closed(n)
        left = _wait_gone(sessions & set(table), STOP_TIMEOUT)
        if left:
            raise SshdClusterError(f"sshd sessions of {n.name} still alive after SIGKILL: {sorted(left)}")

    def up(self, node: str | SshdNode) -> None:
        """Start the node's sshd again on the same address, port and host key; returns once it answers."""
        n = self.node(node)
        if n.running:
            if n.stopped:
                self.unhang(n)
            return
        self._spawn(n)
        self._await_ready(n)

    def restart(self, node: str | SshdNode) -> None:
        """Restart the listener only: sessions and processes already running on the node go on."""
        n = self.node(node)
        self._reap(n)
        self._wait_port_closed(n)
        self._spawn(n)
        self._await_ready(n)

    def admit(self, user: str) -> None:
        """Let another account log in to every node with the keys of its own home's `.ssh/authorized_keys`, as
        a cluster's users reach its nodes: its sessions are plain logins (its home, sshd's PATH), without the
        lab's environment. Each node's sshd restarts (sessions already open go on)."""
        if user not in self.guests:
            self.guests.append(user)
        for n in self.nodes:
            self._write_sshd_config(n)
            self.restart(n)

    def change_host_key(self, node: str | SshdNode) -> None:
        """A new host key for the node and a restart of its sshd; `known_hosts` keeps the old key."""
        n = self.node(node)
        _keygen(n.host_key, f"{n.name}@ftconsole-test-rekeyed")
        self.restart(n)

    def reboot(self, node: str | SshdNode) -> str:
        """The node "reboots": every process started through it dies (as `down`), it gets a new boot id (in its
        simulated-GPU file, which the probe reads it from), and its sshd starts again. The new boot id."""
        n = self.node(node)
        self.down(n)
        data = json.loads(n.gpus_file.read_text())
        data["boot_id"] = str(uuid.uuid4())
        _write_atomic(n.gpus_file, json.dumps(data, indent=1) + "\n")
        self.up(n)
        return str(data["boot_id"])

    def set_gpus(self, node: str | SshdNode, data: Mapping[str, Any]) -> None:
        """Atomically replace the node's simulated-GPU file (a reader never sees a half-written file). A GPU
        without a `pci_bus_id` gets the node's (`pci_bus_id`): the driver's Xid lines name a GPU by it."""
        n = self.node(node)
        gpus = [dict(g, pci_bus_id=g.get("pci_bus_id") or pci_bus_id(n, i)) for i, g in enumerate(data["gpus"])]
        with contextlib.suppress(OSError, ValueError):  # the boot id of the node's last reboot stays
            booted = json.loads(n.gpus_file.read_text()).get("boot_id")
            data = {**({"boot_id": booted} if booted else {}), **data}
        _write_atomic(n.gpus_file, json.dumps({**data, "gpus": gpus}, indent=1) + "\n")

    # -- use -----------------------------------------------------------------------------------------------

    def ssh_argv(self, node: str | SshdNode, *, connect_timeout: float = 3) -> list[str]:
        """The system ssh client's argv up to the remote command (append ``--`` and the command)."""
        n = self.node(node)
        return [
            "ssh",
            "-F",
            "none",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={connect_timeout:g}",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-i",
            str(self.key),
            "-p",
            str(n.port),
            f"{self.user}@{n.address}",
        ]

    def run(
        self,
        node: str | SshdNode,
        argv: Sequence[str] | str,
        *,
        timeout: float = RUN_TIMEOUT,
        connect_timeout: float = 3,
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on the node over the system ssh client; text output captured.

        `argv` is quoted with shlex.join; a plain string is sent as a remote shell command as it is.
        Raises subprocess.TimeoutExpired after `timeout` seconds (the ssh client is killed).
        """
        command = argv if isinstance(argv, str) else shlex.join(argv)
        return subprocess.run(
            [*self.ssh_argv(node, connect_timeout=connect_timeout), "--", command],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def config_data(self, **overrides: Any) -> dict[str, Any]:
        """The ftconsole cluster config (scheduler.config.ClusterConfig) of this cluster, as a dict."""
        data: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "ssh": {
                "user": self.user,
                "identity_file": str(self.key),
                "known_hosts": str(self.known_hosts),
                "config_file": None,
                "connect_timeout": "2s",
                "command_timeout": "10s",
                "max_parallel": 32,
            },
            "nodes": [{"name": n.name, "host": n.address, "port": n.port} for n in self.nodes],
            "probes": {
                # expanded by the agent on the node, with the node's HOME
                "cache_dir": "~/cache",
                "thresholds": _lab_thresholds(),
            },
        }
        return deep_merge(data, overrides)

    def write_config(self, path: Path, **overrides: Any) -> Path:
        """Write the cluster config YAML to `path` (overrides are merged in, nested); return `path`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.config_data(**overrides), sort_keys=False))
        return path

    # -- teardown ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every sshd and kill every process started through the nodes; safe to call again."""
        self._closed = True
        errors = []
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGCONT)
        for node in self.nodes:
            try:
                self._reap(node)
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{node.name}: {exc}")
        for node in self.nodes:
            try:
                self._kill_node_processes(node)
            except SshdClusterError as exc:
                errors.append(str(exc))
        if self.fabric is not None:
            self.fabric.close()
        if errors:
            raise SshdClusterError("; ".join(errors))

    def __enter__(self) -> SshdCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SshdCluster({str(self.root)!r}, {len(self.nodes)} nodes)"


def _lab_thresholds() -> dict[str, Any]:
    """Thresholds every lab node passes: small disks, any load, ulimits no higher than what sessions inherit here.

    Sessions inherit sshd's limits, which are this process's (no PAM, so no limits.conf), so a threshold
    above them would fail every node on a machine with lower limits (containers often have them).
    """
    # every "node" shares this machine's load: a busy 2-core CI box must not read all of them degraded
    out: dict[str, Any] = {"disk_root_gb": 1, "disk_shm_gb": 0.01, "disk_cache_gb": 1, "load_warn_per_cpu": 1000.0}
    defaults = {
        "ulimit_memlock_kb": (resource.RLIMIT_MEMLOCK, 16000, 1024),
        "ulimit_nofile": (resource.RLIMIT_NOFILE, 1_000_000, 1),
        "ulimit_stack_kb": (resource.RLIMIT_STACK, 8000, 1024),
        "ulimit_nproc": (resource.RLIMIT_NPROC, 1_000_000, 1),
    }
    for key, (limit, default, unit) in defaults.items():
        soft, _hard = resource.getrlimit(limit)
        out[key] = default if soft == resource.RLIM_INFINITY else min(default, soft // unit)
    return out


# -- pytest fixture ---------------------------------------------------------------------------------------


@pytest.fixture(name="sshd_cluster")
def sshd_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshdCluster]]:
    """Fixture ``sshd_cluster``: a factory ``make(count=4, gpus=8, shared_home=False) -> SshdCluster``; every
    cluster it made is stopped at teardown, whatever the test did. (Named apart from the fixture so that importing
    it does not clash with the test arguments: ``from tests.sshd_cluster import sshd_cluster_fixture``.)

    Skips the test where /usr/sbin/sshd is missing.
    """
    if not sshd_available():
        pytest.skip(SSHD_MISSING)
    made: list[SshdCluster] = []

    def make(
        count: int = 4, gpus: Sequence[int] | int = 8, *, shared_home: bool = False, netns: bool = False
    ) -> SshdCluster:
        cluster = SshdCluster(tmp_path_factory.mktemp("sshd"), count, gpus, shared_home=shared_home, netns=netns)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        errors = []
        for cluster in reversed(made):
            try:
                cluster.stop()
            except SshdClusterError as exc:
                errors.append(str(exc))
        if errors:
            raise SshdClusterError("; ".join(errors))
